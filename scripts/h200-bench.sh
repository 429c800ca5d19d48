#!/usr/bin/env bash
# The WebGPU backend on the lent H200 (Vulkan through wgpu): writes a
# Llama-3.1-8B-shaped Q4_K_M model with `hearth synth` on the machine,
# benchmarks it with `hearth bench --backend webgpu` (decode at batch 1,
# prefill), and compares its logits with the CPU backend's on a short
# prompt.
#
# Two halves:
#   bash scripts/h200-bench.sh prepare
#       here: builds target/release/hearth, copies it to .h200/, and
#       downloads the Vulkan loader debs into .gl/ (both ignored by git).
#   bash scripts/h200-bench.sh device
#       there, in ONE device call that carries `.gl` and `.h200`:
#       run(command="bash scripts/h200-bench.sh device", carry=[".gl", ".h200"])
#       Results land in $OUT (bench.txt, bench.json, logits.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

prepare() {
  cargo build --release -p hearth-cli
  mkdir -p .h200
  cp target/release/hearth .h200/hearth
  grep -qx '/.gl/' .git/info/exclude 2>/dev/null || echo /.gl/ >> "$(git rev-parse --git-common-dir)/info/exclude"
  grep -qx '/.h200/' .git/info/exclude 2>/dev/null || echo /.h200/ >> "$(git rev-parse --git-common-dir)/info/exclude"
  if ! ls .gl/libvulkan1_*.deb >/dev/null 2>&1; then
    mkdir -p .gl /tmp/amd64/partial
    o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    # shellcheck disable=SC2086
    apt-get $o update
    # shellcheck disable=SC2086
    (cd .gl && apt-get $o download libvulkan1)
  fi
  echo "ready: run 'bash scripts/h200-bench.sh device' on the device carrying .gl and .h200"
}

device() {
  local out="${OUT:-/tmp/out}" hearth=.h200/hearth model=/root/llama-3.1-8b-q4_k_m.gguf
  mkdir -p "$out"
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  if [ ! -e /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] || ls /etc/vulkan/icd.d/*nvidia* >/dev/null 2>&1; then :; else
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  fi
  nvidia-smi --query-gpu=name,memory.total,clocks.max.mem --format=csv | tee "$out/gpu.txt"
  # /root survives a warm follow-up call: write the model once.
  [ -s "$model" ] || "$hearth" synth "$model" --shape llama-3.1-8b --type Q4_K_M --seed 1
  "$hearth" info "$model" | head -20 | tee "$out/info.txt"
  # Decode at batch 1 (tg128) and prefill (pp512) on the GPU.
  "$hearth" bench -m "$model" --backend webgpu -p 512 -n 128 -r 3 | tee "$out/bench.txt"
  "$hearth" bench -m "$model" --backend webgpu -p 512 -n 128 -r 3 --json > "$out/bench.json"
  # Logits of a short prompt on both backends.
  local toks=1,450,7347,315,9822,374,12366,13,578,6864,315,9635
  "$hearth" logits -m "$model" --backend webgpu --tokens "$toks" --out /tmp/gpu.f32
  "$hearth" logits -m "$model" --backend cpu --tokens "$toks" --out /tmp/cpu.f32
  python3 - /tmp/cpu.f32 /tmp/gpu.f32 <<'PY' | tee "$out/logits.txt"
import sys, struct, math
a = open(sys.argv[1], 'rb').read(); b = open(sys.argv[2], 'rb').read()
n = len(a) // 4
x = struct.unpack(f'<{n}f', a); y = struct.unpack(f'<{n}f', b)
num = sum((p - q) ** 2 for p, q in zip(x, y)); den = sum(p * p for p in x)
mx = max(abs(p - q) for p, q in zip(x, y))
print(f"cpu vs webgpu logits: nrmse {math.sqrt(num / den):.3e}, max |diff| {mx:.4f}, values {n}")
PY
}

case "${1:-}" in
  prepare) prepare ;;
  device) device ;;
  *) echo "usage: $0 prepare|device" >&2; exit 2 ;;
esac

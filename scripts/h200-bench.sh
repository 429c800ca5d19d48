#!/usr/bin/env bash
# The WebGPU backend on the lent H200 (Vulkan through wgpu): writes a
# Llama-3.1-8B-shaped Q4_K_M model with `hearth synth` on the machine,
# benchmarks it with `hearth bench --backend webgpu` (prefill, decode at
# batch 1 and at 4 sequences), and compares its logits with the CPU
# backend's and the CPU's exact-f32 mode's on a short prompt.
#
# Two halves:
#   bash scripts/h200-bench.sh prepare
#       here: builds target/release/hearth, copies it to .h200/, and
#       downloads the Vulkan loader debs into .gl/ (both ignored by git).
#   bash scripts/h200-bench.sh device
#       there, in ONE device call that carries `.gl` and `.h200`:
#       run(command="bash scripts/h200-bench.sh device", carry=[".gl", ".h200"])
#       Results land in $OUT (bench.txt, bench.json, profile.txt, logits.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

prepare() {
  cargo build --release -p hearth-cli
  mkdir -p .h200
  # Without debug info: a device call carries at most 64 MiB.
  strip -o .h200/hearth target/release/hearth
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
  # Prefill (pp512), decode at batch 1 (tg128) and 4 sequences together
  # (tg128x4, aggregate tokens/s) on the GPU; then the CPU path, for scale.
  "$hearth" bench -m "$model" --backend webgpu -p 512 -n 128 --seqs 1,4 -r 3 | tee "$out/bench.txt"
  "$hearth" bench -m "$model" --backend webgpu -p 512 -n 128 --seqs 1,4 -r 3 --json > "$out/bench.json"
  # Where a step's time goes: host record / encode / wait, and GPU time per
  # kernel kind from timestamps (HEARTH_PROFILE=gpu; the table prints when
  # the backend drops, the per-step lines are left out).
  HEARTH_PROFILE=gpu "$hearth" bench -m "$model" --backend webgpu -p 512 -n 32 --seqs 1,4 -r 1 \
    2>&1 >/dev/null | grep -v '^gpu step (' | tee "$out/profile.txt"
  # Logits of a short prompt: the GPU, the CPU path (int8 activations, as
  # llama.cpp) and the CPU's exact-f32 mode, the reference of both.
  local toks=1,450,7347,315,9822,374,12366,13,578,6864,315,9635
  "$hearth" logits -m "$model" --backend webgpu --tokens "$toks" --out /tmp/gpu.f32
  "$hearth" logits -m "$model" --backend cpu --tokens "$toks" --out /tmp/cpu.f32
  "$hearth" logits -m "$model" --backend cpu --exact --tokens "$toks" --out /tmp/exact.f32
  python3 - /tmp/cpu.f32 /tmp/gpu.f32 /tmp/exact.f32 <<'PY' | tee "$out/logits.txt"
import sys, struct, math
def load(path):
    b = open(path, 'rb').read()
    return struct.unpack(f'<{len(b) // 4}f', b)
cpu, gpu, exact = (load(p) for p in sys.argv[1:4])
def nrmse(x, ref):
    # Error over the spread of the reference (as the model tests measure it).
    mean = sum(ref) / len(ref)
    var = sum((r - mean) ** 2 for r in ref)
    return math.sqrt(sum((a - r) ** 2 for a, r in zip(x, ref)) / var)
print(f"logits nrmse, {len(cpu)} values: cpu vs webgpu {nrmse(gpu, cpu):.3e}; "
      f"vs cpu exact-f32: webgpu {nrmse(gpu, exact):.3e}, cpu {nrmse(cpu, exact):.3e}")
PY
}

case "${1:-}" in
  prepare) prepare ;;
  device) device ;;
  *) echo "usage: $0 prepare|device" >&2; exit 2 ;;
esac

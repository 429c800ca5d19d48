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
#   The working tree that travels with a device call holds at most 64 MiB;
#   the tracked test fixtures alone are ~100 MB, so move tests/fixtures out
#   of the tree for the call (nothing there reads them) and back after it.
#   .gl needs the Vulkan loader and the GL vendor libraries the NVIDIA ICD
#   links (libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2).
#   bash scripts/h200-bench.sh device
#       there, in ONE device call that carries `.gl` and `.h200`:
#       run(command="bash scripts/h200-bench.sh device", carry=[".gl", ".h200"])
#       Results land in $OUT (bench.txt, bench.json, profile.txt, logits.txt).
#   bash scripts/h200-bench.sh sweep
#       there, likewise: one `hearth bench` per kernel variant listed in
#       .h200/sweep.txt (one HEARTH_WEBGPU_KERNELS value per line, `default`
#       for none), each with its logits' nrmse against the CPU's exact-f32
#       mode, so that a fast but wrong variant shows. Results in $OUT/sweep.txt.
#   BINS="hearth-base hearth" bash scripts/h200-bench.sh compare
#       there, likewise: several builds side by side in one call (each a
#       stripped binary under .h200/, ~10 MB; a call carries 64 MiB), each
#       with its logits' nrmse, a bench and the GPU profile of decode; then
#       the variants of .h200/sweep.txt (if any) on the first. Results in
#       $OUT/compare-<bin>.txt and $OUT/sweep.txt.
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
    (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
  fi
  echo "ready: run 'bash scripts/h200-bench.sh device' on the device carrying .gl and .h200"
}

out="${OUT:-/tmp/out}" hearth=.h200/hearth model=/root/llama-3.1-8b-q4_k_m.gguf
toks=1,450,7347,315,9822,374,12366,13,578,6864,315,9635

# The Vulkan loader, the NVIDIA ICD and the model, on the device machine.
setup_device() {
  mkdir -p "$out"
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  # The driver's ICD is not where the loader looks by default.
  if [ -e /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  fi
  nvidia-smi --query-gpu=name,memory.total,clocks.max.mem --format=csv | tee "$out/gpu.txt"
  # /root survives a warm follow-up call: write the model once.
  [ -s "$model" ] || "$hearth" synth "$model" --shape llama-3.1-8b --type Q4_K_M --seed 1
}

# nrmse of each f32 file after the first against the first (the reference),
# over the reference's spread, as the model tests measure it.
nrmse() {
  python3 scripts/nrmse.py "$@"
}

sweep() {
  setup_device
  "$hearth" logits -m "$model" --backend cpu --exact --tokens "$toks" --out /tmp/exact.f32
  sweep_variants
}

# The variants of .h200/sweep.txt on $hearth, against /tmp/exact.f32.
sweep_variants() {
  while read -r spec; do
    [ -n "$spec" ] || continue
    local env=""
    [ "$spec" = default ] || env="$spec"
    echo "== HEARTH_WEBGPU_KERNELS=$env" | tee -a "$out/sweep.txt"
    HEARTH_WEBGPU_KERNELS="$env" "$hearth" logits -m "$model" --backend webgpu --tokens "$toks" \
      --out /tmp/gpu.f32 2>&1 | tail -2
    echo "logits nrmse vs cpu exact-f32: $(nrmse /tmp/exact.f32 /tmp/gpu.f32)" | tee -a "$out/sweep.txt"
    HEARTH_WEBGPU_KERNELS="$env" "$hearth" bench -m "$model" --backend webgpu -p 512 -n 128 \
      --seqs 1,4 -r 2 2>&1 | grep -E '^\|' | tee -a "$out/sweep.txt"
  done < .h200/sweep.txt
}

compare() {
  hearth=.h200/${BINS:?list the binaries under .h200/ to compare}
  hearth=${hearth%% *}
  setup_device
  "$hearth" logits -m "$model" --backend cpu --exact --tokens "$toks" --out /tmp/exact.f32
  local b
  for b in $BINS; do
    echo "== $b" | tee "$out/compare-$b.txt"
    ".h200/$b" logits -m "$model" --backend webgpu --tokens "$toks" --out /tmp/gpu.f32 2>&1 | tail -1
    echo "logits nrmse vs cpu exact-f32: $(nrmse /tmp/exact.f32 /tmp/gpu.f32)" | tee -a "$out/compare-$b.txt"
    ".h200/$b" bench -m "$model" --backend webgpu -p 512 -n 128 --seqs 1,4 -r 3 2>&1 \
      | grep -E '^\|' | tee -a "$out/compare-$b.txt"
    HEARTH_PROFILE=gpu ".h200/$b" bench -m "$model" --backend webgpu -p 0 -n 128 --seqs 1,4 -r 1 \
      2>&1 >/dev/null | grep -v '^gpu step (' | tee -a "$out/compare-$b.txt"
  done
  [ ! -s .h200/sweep.txt ] || sweep_variants
}

device() {
  setup_device
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
  "$hearth" logits -m "$model" --backend webgpu --tokens "$toks" --out /tmp/gpu.f32
  "$hearth" logits -m "$model" --backend cpu --tokens "$toks" --out /tmp/cpu.f32
  "$hearth" logits -m "$model" --backend cpu --exact --tokens "$toks" --out /tmp/exact.f32
  local e
  e=$(nrmse /tmp/exact.f32 /tmp/gpu.f32 /tmp/cpu.f32 | tr '\n' ' ')
  read -r e_gpu e_cpu <<< "$e"
  echo "logits nrmse, $(($(stat -c %s /tmp/exact.f32) / 4)) values: cpu vs webgpu $(nrmse /tmp/cpu.f32 /tmp/gpu.f32);" \
    "vs cpu exact-f32: webgpu $e_gpu, cpu $e_cpu" | tee "$out/logits.txt"
}

case "${1:-}" in
  prepare) prepare ;;
  device) device ;;
  sweep) sweep ;;
  compare) compare ;;
  *) echo "usage: $0 prepare|device|sweep|compare" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# The CUDA backend on the lent GPU beside llama.cpp's CUDA build of the
# pinned source, on Llama-3.1-8B-shaped models that `hearth synth` writes
# on the machine.
#
#   bash scripts/cuda-bench.sh prepare
#       here: builds hearth with --features cuda into .cuda/hearth and packs
#       the llama.cpp sources (ggml CPU + CUDA, llama-bench,
#       llama-batched-bench) into .cuda/llama.cpp.tar.xz (ignored by git).
#   Then, there, in one call carrying .cuda (move tests/fixtures out of the
#   tree for it: a call carries 64 MiB):
#   bash scripts/cuda-bench.sh build-start; bash scripts/cuda-bench.sh synth-start
#       start llama.cpp's CUDA build and the 8B model in the background
#       (they outlive a call while the machine stays warm);
#   bash scripts/cuda-bench.sh against
#       the card's read bandwidth, llama-bench -fa 1 (pp512, tg128),
#       llama-batched-bench (4 and 16 sequences) and hearth bench on the
#       same file, one after the other, twice; report.txt has the table and
#       a JSON line {"bench": "cuda", ...} (TYPE=Q4_0 etc. for other files);
#   SHAPE=... LAYERS=N SWEEP="default A=1 ..." bash scripts/cuda-bench.sh sweep
#       Hearth's settings side by side on a smaller model, with per-kernel
#       profiles of decode and prefill and logits against the CPU;
#   bash scripts/cuda-bench.sh mv
#       the decode matrix-vector kernels alone (scripts/mv-bench.cu) on
#       the 8B shapes, every variant beside the backend's, in GB/s;
#   bash scripts/cuda-bench.sh device
#       Hearth alone on the 8B model: bench and logits against the CPU.
#   SEQS="1 16" VARIANTS="A=1 ..." bash scripts/cuda-bench.sh profiles
#       Hearth alone on the 8B model: per-kernel device time of decode at
#       each SEQS and of prefill, then decode with each variant.
#   bash scripts/cuda-bench.sh split
#       the 8B model split with the CPU (llama.cpp -ngl N+1 beside Hearth's
#       --gpu-layers N), then Hearth's --stream-layers, copies beside the
#       work or on the compute stream; report in split.txt.
#   bash scripts/cuda-bench.sh tp
#       on a machine of several GPUs (after build-start): the 8B model's
#       logits with --tensor-parallel 2 against 1, then llama.cpp's
#       -sm layer and -sm row beside Hearth's --tensor-parallel N for each
#       N of TP (default "1 2 4", capped at the GPUs present): pp512,
#       decode of 1 and 16 sequences; report in tp.txt.
#   bash scripts/cuda-bench.sh moe-synth-start; ... moe
#       the expert cache beside llama.cpp's --n-cpu-moe on a
#       Qwen3-30B-A3B-shaped Q4_K_M file (SKEW: --router-skew, 1; embeddings
#       of std 1, without which a random model's deep layers route every
#       token to the same few experts, see examples/expert_policies.rs): llama.cpp
#       with the first NCMOE (28) layers' experts on the CPU, then Hearth
#       with --gpu-mem set to the device memory llama.cpp used (sampled
#       with nvidia-smi), every miss copied and one-token misses on the
#       host; report in moe.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

prepare() {
  cargo build --release -p hearth-cli --features cuda
  mkdir -p .cuda
  strip -o .cuda/hearth target/release/hearth
  # Compressed for the trip (a call carries 64 MiB); unpacked there.
  xz -T0 -f .cuda/hearth
  [ -s .cuda/llama.cpp.tar.xz ] || pack_llamacpp
  ls -la .cuda | head
}

# The pinned llama.cpp (the llama-cpp-python 0.3.36 sdist, as
# scripts/build-llamacpp.sh) cut to what llama-bench with the CPU and CUDA
# backends builds from, into .cuda/llama.cpp.tar.xz (~4 MB).
pack_llamacpp() {
  local ver=0.3.36 cache=${CACHE:-$HOME/.cache/hearth-llamacpp}
  local sdist=$cache/sdist/llama_cpp_python-$ver.tar.gz tmp
  [ -f "$sdist" ] || python3 -m pip download -q --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$ver" -d "$cache/sdist"
  tmp=$(mktemp -d)
  tar -C "$tmp" -xzf "$sdist" "llama_cpp_python-$ver/vendor/llama.cpp"
  local src=$tmp/llama_cpp_python-$ver/vendor/llama.cpp dst=$tmp/mini
  mkdir -p "$dst/ggml/src" "$dst/tools"
  cp -r "$src"/{CMakeLists.txt,cmake,include,src,common,vendor,licenses,LICENSE} "$dst/"
  cp -r "$src"/ggml/{CMakeLists.txt,cmake,include} "$dst/ggml/"
  find "$src/ggml/src" -maxdepth 1 -type f -exec cp {} "$dst/ggml/src/" \;
  cp -r "$src/ggml/src/ggml-cpu" "$src/ggml/src/ggml-cuda" "$dst/ggml/src/"
  cp -r "$src/tools/llama-bench" "$src/tools/batched-bench" "$dst/tools/"
  printf 'find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(llama-bench)\nadd_subdirectory(batched-bench)\n' \
    > "$dst/tools/CMakeLists.txt"
  tar -C "$dst" -cJf .cuda/llama.cpp.tar.xz .
  rm -rf "$tmp"
}

out="${OUT:-/tmp/out}" hearth=.cuda/hearth model=/root/llama-3.1-8b-q4_k_m.gguf
toks=1,450,7347,315,9822,374,12366,13,578,6864,315,9635

nrmse() {
  python3 scripts/nrmse.py "$@"
}

# llama.cpp's CUDA build of the pinned source, in /root (kept for a warm
# follow-up call); prints its bin dir.
llamacpp() {
  local src=/root/llama.cpp bin=/root/llama.cpp/build/bin
  if [ ! -x "$bin/llama-bench" ]; then
    mkdir -p "$src"
    tar -C "$src" -xJf .cuda/llama.cpp.tar.xz
    cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON >"$out/llamacpp-build.log" 2>&1
    cmake --build "$src/build" --target llama-bench llama-batched-bench -j 16 >>"$out/llamacpp-build.log" 2>&1
  fi
  echo "$bin"
}

# Starts llama.cpp's build in its own session (it outlives this call while
# the machine stays warm): `against` waits for it.
build_start() {
  mkdir -p "$out"
  setsid bash -c "OUT=/root bash scripts/cuda-bench.sh build >/root/build.out 2>&1; touch /root/build.done" </dev/null >/dev/null 2>&1 &
}

build_only() {
  llamacpp >/dev/null
}

# Writes the 8B model of `against` (TYPE) in the background, so that it
# and llama.cpp's build overlap the tests of the same call.
synth_start() {
  local ty=${TYPE:-Q4_K_M}
  local m=/root/llama-3.1-8b-${ty,,}.gguf
  [ -s "$m" ] && return
  touch "$m.writing"
  setsid bash -c "'$hearth' synth '$m' --shape llama-3.1-8b --type '$ty' --seed 1 >/root/synth.out 2>&1; rm -f '$m.writing'" \
    </dev/null >/dev/null 2>&1 &
}

# The Qwen3-30B-A3B-shaped file of `moe`, written in the background.
moe_model() {
  echo "/root/qwen3-30b-a3b-skew${SKEW:-1}.gguf"
}

moe_synth_start() {
  local m
  m=$(moe_model)
  [ -s "$m" ] && return
  touch "$m.writing"
  setsid bash -c "'$hearth' synth '$m' --shape qwen3-30b-a3b --type Q4_K_M --seed 1 --embd-std 1 --router-skew ${SKEW:-1} >/root/moe-synth.out 2>&1; rm -f '$m.writing'" \
    </dev/null >/dev/null 2>&1 &
}

# Runs "$@" with stdout to the terminal, and prints the peak device memory
# in MiB it used (nvidia-smi every 0.2 s, less what was in use before) to fd 3.
peak_mib() {
  local f base pid
  f=$(mktemp)
  base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  (while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1 >>"$f"; sleep 0.2; done) &
  pid=$!
  "$@"
  kill "$pid" 2>/dev/null || true
  echo $(( $(sort -n "$f" | tail -1) - base )) >&3
}

moe() {
  mkdir -p "$out"
  export HEARTH_CUDA_CACHE=/root/hearth-cuda-cache
  local m ncmoe=${NCMOE:-28} reps=${REPS:-2} bin=/root/llama.cpp/build/bin r mib
  m=$(moe_model)
  while [ -e "$m.writing" ]; do sleep 5; done
  [ -s "$m" ] || { cat /root/moe-synth.out; exit 1; }
  while [ ! -e /root/build.done ]; do sleep 5; done
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/moe.txt"
  ls -la "$m" | tee -a "$out/moe.txt"
  for r in $(seq "${ROUNDS:-2}"); do
    { peak_mib "$bin/llama-bench" -m "$m" -p 512 -n 128 -ngl 99 -fa 1 -ncmoe "$ncmoe" -r "$reps" 2>&1 \
        | grep -E '^\|' | tee -a "$out/moe.txt"; } 3>"$out/llama-mib"
    mib=$(cat "$out/llama-mib")
    echo "llama.cpp -ncmoe $ncmoe: peak device memory $mib MiB" | tee -a "$out/moe.txt"
    "$bin/llama-batched-bench" -m "$m" -c 4096 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 4 -ngl 99 -fa on \
      -ncmoe "$ncmoe" 2>&1 | grep -E '^\|' | tee -a "$out/moe.txt"
    local ht
    for ht in ${HOST_TOKENS:-0 1}; do
      { peak_mib "$hearth" bench -m "$m" --backend cuda -p 512 -n 128 --seqs 1,4 -r "$reps" \
          --gpu-mem "${mib}M" --moe-host-tokens "$ht" 2>&1 | tee -a "$out/moe.txt"; } 3>"$out/hearth-mib"
      echo "hearth --gpu-mem ${mib}M --moe-host-tokens $ht: peak device memory $(cat "$out/hearth-mib") MiB" \
        | tee -a "$out/moe.txt"
    done
  done
}

# The expert cache on the 30B-A3B shape cut to 12 layers (written here in
# about two minutes): llama.cpp with the experts of NCMOE (7) layers on the
# CPU when its build is done (its peak device memory then the budget, else
# GPU_MEM, 3G), beside Hearth by default (slot fills on the copy stream),
# with every fill on the compute stream and waited for
# (HEARTH_CUDA_BATCHED_UPLOADS=0), and with the prefetch; prefill and a
# short decode. Report in moe-quick.txt.
moe_quick_synth() {
  local m=/root/qwen3-30b-a3b-12.gguf
  [ -s "$m" ] || "$hearth" synth "$m.tmp" --shape qwen3-30b-a3b --layers 12 --type Q4_K_M --seed 1 \
    --embd-std 1 --router-skew 1 | tail -1
  [ -s "$m" ] || mv "$m.tmp" "$m"
}

moe_quick() {
  mkdir -p "$out"
  export HEARTH_CUDA_CACHE=/root/hearth-cuda-cache
  local m=/root/qwen3-30b-a3b-12.gguf v bin=/root/llama.cpp/build/bin mem=${GPU_MEM:-3G}
  while [ -e /root/moe-quick-synth.running ]; do sleep 3; done
  moe_quick_synth
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$out/moe-quick.txt"
  if [ -e /root/build.done ] && [ -x "$bin/llama-bench" ]; then
    { peak_mib "$bin/llama-bench" -m "$m" -p 512 -n 32 -ngl 99 -fa 1 -ncmoe "${NCMOE:-7}" -r 2 2>&1 \
        | grep -E '^\|' | tee -a "$out/moe-quick.txt"; } 3>"$out/llama-mib"
    mem="$(cat "$out/llama-mib")M"
    echo "llama.cpp -ncmoe ${NCMOE:-7}: peak device memory $mem" | tee -a "$out/moe-quick.txt"
  fi
  for v in default HEARTH_CUDA_BATCHED_UPLOADS=0 --moe-prefetch; do
    echo "== ${v} --gpu-mem $mem" | tee -a "$out/moe-quick.txt"
    local env=() flags=()
    case "$v" in
      default) ;;
      --*) flags=("$v") ;;
      *) env=("$v") ;;
    esac
    env "${env[@]}" "$hearth" bench -m "$m" --backend cuda -p 512 -n 32 -r 2 --gpu-mem "$mem" "${flags[@]}" 2>&1 \
      | grep -E 'expert cache|(pp|tg)[0-9]' | tee -a "$out/moe-quick.txt"
  done
}

# The 8B model larger than its share of the device: llama.cpp with -ngl
# N+1 (it counts the head as a layer) beside Hearth's --gpu-layers N, the
# other blocks on the CPU (GPU_LAYERS, "16 8"); then Hearth's streamed
# blocks, copies on the copy stream from page-locked memory against
# HEARTH_CUDA_BATCHED_UPLOADS=0 (each copy on the compute stream, waited
# for); the resident model first as the ceiling. Report in split.txt.
split() {
  mkdir -p "$out"
  export HEARTH_CUDA_CACHE=/root/hearth-cuda-cache
  local bin=/root/llama.cpp/build/bin reps=${REPS:-2} n v
  while [ -e "$model.writing" ]; do sleep 5; done
  [ -s "$model" ] || "$hearth" synth "$model" --shape llama-3.1-8b --type Q4_K_M --seed 1
  while [ ! -e /root/build.done ]; do sleep 5; done
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/split.txt"
  nproc | sed 's/^/host cores: /' | tee -a "$out/split.txt"
  for n in ${GPU_LAYERS:-16 8}; do
    "$bin/llama-bench" -m "$model" -p 512 -n 32 -ngl $((n + 1)) -fa 1 -r "$reps" 2>&1 \
      | grep -E '^\|' | tee -a "$out/split.txt"
    echo "== hearth --gpu-layers $n" | tee -a "$out/split.txt"
    "$hearth" bench -m "$model" --backend cuda -p 512 -n 32 -r "$reps" --gpu-layers "$n" 2>&1 \
      | grep -E '(pp|tg)[0-9]' | tee -a "$out/split.txt"
  done
  for v in resident default HEARTH_CUDA_BATCHED_UPLOADS=0; do
    echo "== hearth ${v}" | tee -a "$out/split.txt"
    if [ "$v" = resident ]; then
      "$hearth" bench -m "$model" --backend cuda -p 512 -n 16 -r "$reps" 2>&1 \
        | grep -E '(pp|tg)[0-9]' | tee -a "$out/split.txt"
      continue
    fi
    [ "$v" != default ] || v=""
    env $v "$hearth" bench -m "$model" --backend cuda -p 512 -n 8 -r "$reps" --stream-layers 2>&1 \
      | grep -E '(pp|tg)[0-9]' | tee -a "$out/split.txt"
  done
}

tp() {
  mkdir -p "$out"
  export HEARTH_CUDA_CACHE=/root/hearth-cuda-cache
  local bin=/root/llama.cpp/build/bin reps=${REPS:-3} gpus n devs
  gpus=$(nvidia-smi --list-gpus | wc -l)
  while [ -e "$model.writing" ]; do sleep 5; done
  [ -s "$model" ] || "$hearth" synth "$model" --shape llama-3.1-8b --type Q4_K_M --seed 1
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/tp.txt"
  if [ "$gpus" -ge 2 ]; then
    "$hearth" logits -m "$model" --backend cuda --tokens "$toks" --out /tmp/tp1.f32
    "$hearth" logits -m "$model" --backend cuda --tensor-parallel 2 --tokens "$toks" --out /tmp/tp2.f32
    echo "logits nrmse, 2 shards against 1: $(nrmse /tmp/tp1.f32 /tmp/tp2.f32)" | tee -a "$out/tp.txt"
  fi
  while [ ! -e /root/build.done ]; do sleep 5; done
  for n in ${TP:-1 2 4}; do
    [ "$n" -le "$gpus" ] || continue
    devs=$(seq -s, 0 $((n - 1)))
    for sm in layer row; do
      echo "== llama.cpp -sm $sm on $n GPUs" | tee -a "$out/tp.txt"
      CUDA_VISIBLE_DEVICES=$devs "$bin/llama-bench" -m "$model" -p 512 -n 128 -ngl 99 -fa 1 \
        -sm "$sm" -r "$reps" 2>&1 | grep -E '^\|' | tee -a "$out/tp.txt"
    done
    echo "== hearth --tensor-parallel $n" | tee -a "$out/tp.txt"
    "$hearth" bench -m "$model" --backend cuda -p 512 -n 128 --seqs 1,16 -r "$reps" \
      --tensor-parallel "$n" 2>&1 | grep -E '(pp|tg)[0-9]' | tee -a "$out/tp.txt"
  done
}

device() {
  mkdir -p "$out"
  nvidia-smi --query-gpu=name,memory.total,clocks.max.mem --format=csv | tee "$out/gpu.txt"
  export HEARTH_CUDA_CACHE=/root/hearth-cuda-cache
  [ -s "$model" ] || "$hearth" synth "$model" --shape llama-3.1-8b --type Q4_K_M --seed 1
  "$hearth" bench -m "$model" --backend cuda -p 512 -n 128 --seqs 1,4 -r 3 | tee "$out/bench.txt"
  "$hearth" logits -m "$model" --backend cuda --tokens "$toks" --out /tmp/cuda.f32
  "$hearth" logits -m "$model" --backend cpu --exact --tokens "$toks" --out /tmp/exact.f32
  echo "logits nrmse vs cpu exact-f32: cuda $(nrmse /tmp/exact.f32 /tmp/cuda.f32)" | tee "$out/logits.txt"
}

# After `build-start` (llama.cpp builds while the machine stays warm):
# the card's read bandwidth, then llama.cpp CUDA (llama-bench -fa 1,
# llama-batched-bench at 4 and 16 sequences) and Hearth CUDA on the same
# file, one after the other, twice; the table and one JSON line
# {"bench": "cuda", ...} (report.txt). TYPE picks the file type (Q4_K_M).
against() {
  mkdir -p "$out"
  export HEARTH_CUDA_CACHE=/root/hearth-cuda-cache
  local ty=${TYPE:-Q4_K_M} r
  local m=/root/llama-3.1-8b-${ty,,}.gguf
  while [ -e "$m.writing" ]; do sleep 5; done
  [ -s "$m" ] || "$hearth" synth "$m" --shape llama-3.1-8b --type "$ty" --seed 1
  nvcc -O2 -o /root/copy-bandwidth scripts/copy-bandwidth.cu && /root/copy-bandwidth | tee "$out/bandwidth.txt"
  while [ ! -e /root/build.done ]; do sleep 5; done
  cp /root/llamacpp-build.log "$out/" 2>/dev/null || true
  local bin=/root/llama.cpp/build/bin
  local reps=${REPS:-3}
  for r in $(seq "${ROUNDS:-2}"); do
    "$bin/llama-bench" -m "$m" -p 512 -n 128 -ngl 99 -fa 1 -r "$reps" 2>&1 | grep -E '^\|' | tee -a "$out/llamacpp.txt"
    "$bin/llama-batched-bench" -m "$m" -c 8192 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 4,16 -ngl 99 -fa on 2>&1 \
      | grep -E '^\|' | tee -a "$out/batched.txt"
    "$hearth" bench -m "$m" --backend cuda -p 512 -n 128 --seqs 1,4,16 -r "$reps" | tee -a "$out/bench.txt"
    # VARIANTS="A=1 B=2": Hearth's settings beside it in the same rounds (variants.txt).
    local v
    for v in ${VARIANTS:-}; do
      echo "== $v" | tee -a "$out/variants.txt"
      env "$v" "$hearth" bench -m "$m" --backend cuda -p 512 -n 128 --seqs 1,4,16 -r "$reps" 2>&1 \
        | grep -E '(pp|tg)[0-9]' | tee -a "$out/variants.txt"
    done
  done
  python3 scripts/cuda-report.py "$ty" "$out" | tee "$out/report.txt"
}

# The decode matrix-vector kernels alone (scripts/mv-bench.cu), every
# variant beside the backend's on the 8B shapes; FILTER picks shapes.
mv_bench() {
  mkdir -p "$out"
  nvcc -O3 -arch=sm_90 -o /root/mv-bench scripts/mv-bench.cu 2>&1 | { grep -v "warning #" || true; } | head -30
  /root/mv-bench "${FILTER:-}" | tee "$out/mv.txt"
}

# Hearth alone on the 8B model (TYPE), without llama.cpp: device time per
# kernel (HEARTH_PROFILE=cuda) of decode at each of SEQS (1,16) and of a
# 512-token prefill, then `hearth bench` of decode at SEQS for the default
# and each of VARIANTS, one after the other (profiles.txt, variants.txt).
profiles() {
  mkdir -p "$out"
  export HEARTH_CUDA_CACHE=/root/hearth-cuda-cache
  local ty=${TYPE:-Q4_K_M} s v
  local m=/root/llama-3.1-8b-${ty,,}.gguf
  while [ -e "$m.writing" ]; do sleep 5; done
  [ -s "$m" ] || "$hearth" synth "$m" --shape llama-3.1-8b --type "$ty" --seed 1
  for s in ${SEQS:-1 16}; do
    echo "== decode, $s sequences" | tee -a "$out/profiles.txt"
    HEARTH_PROFILE=cuda "$hearth" bench -m "$m" --backend cuda -p 0 -n 32 --seqs "$s" -r 1 2>&1 >/dev/null \
      | head -16 | tee -a "$out/profiles.txt"
  done
  echo "== prefill 512" | tee -a "$out/profiles.txt"
  HEARTH_PROFILE=cuda "$hearth" bench -m "$m" --backend cuda -p 512 -n 0 -r 1 2>&1 >/dev/null \
    | head -12 | tee -a "$out/profiles.txt"
  for v in default ${VARIANTS:-}; do
    echo "== $v" | tee -a "$out/variants.txt"
    [ "$v" != default ] || v=""
    env $v "$hearth" bench -m "$m" --backend cuda -p 0 -n 128 --seqs "$(echo ${SEQS:-1 16} | tr ' ' ,)" -r 2 2>&1 \
      | grep -E 'tg[0-9]' | tee -a "$out/variants.txt"
  done
}

# The backend's settings side by side on a smaller model (SHAPE, default
# llama-3.2-1b, Q4_K_M, written here in seconds; LAYERS cuts it): the default, graphs off,
# prefill on the matrix-vector kernels instead of the tiles; then where decode and prefill spend their
# device time (HEARTH_PROFILE=cuda), and the logits of a short prompt
# against the CPU's int8 path and its exact-f32 mode.
sweep() {
  mkdir -p "$out"
  export HEARTH_CUDA_CACHE=/root/hearth-cuda-cache
  local shape=${SHAPE:-llama-3.2-1b} v
  # LAYERS=N: the shape cut to N blocks (per-layer kernels as the full
  # model's, written in a fraction of the time).
  local m=/root/sweep-$shape${LAYERS:+-$LAYERS}.gguf
  [ -s "$m" ] || "$hearth" synth "$m" --shape "$shape" --type Q4_K_M --seed 1 ${LAYERS:+--layers $LAYERS}
  local variants=(default HEARTH_CUDA_GRAPHS=0 HEARTH_CUDA_TILE_TOKENS=100000 default)
  # SWEEP="A=1 B=2 default" replaces the list (one setting a run, `default` for none);
  # SEQS=1,4,16 the decode batches (1,4).
  [ -z "${SWEEP:-}" ] || read -r -a variants <<< "$SWEEP"
  for v in "${variants[@]}"; do
    [ "$v" != default ] || v=""
    echo "== $shape ${v:-default}" | tee -a "$out/sweep.txt"
    env $v "$hearth" bench -m "$m" --backend cuda -p 512 -n 128 --seqs "${SEQS:-1,4}" -r 3 2>&1 \
      | grep -E '(pp|tg)[0-9]' | tee -a "$out/sweep.txt"
  done
  HEARTH_PROFILE=cuda "$hearth" bench -m "$m" --backend cuda -p 0 -n 64 -r 1 2>&1 >/dev/null \
    | head -25 | tee "$out/profile-decode.txt"
  HEARTH_PROFILE=cuda "$hearth" bench -m "$m" --backend cuda -p 512 -n 0 -r 1 2>&1 >/dev/null \
    | head -25 | tee "$out/profile-prefill.txt"
  "$hearth" logits -m "$m" --backend cuda --tokens "$toks" --out /tmp/cuda.f32 >/dev/null
  "$hearth" logits -m "$m" --backend cpu --tokens "$toks" --out /tmp/cpu.f32 >/dev/null
  "$hearth" logits -m "$m" --backend cpu --exact --tokens "$toks" --out /tmp/exact.f32 >/dev/null
  local e
  e=$(nrmse /tmp/exact.f32 /tmp/cuda.f32 /tmp/cpu.f32 | tr '\n' ' ')
  echo "$shape logits nrmse vs cpu exact-f32 (cuda, cpu int8): $e; cuda vs cpu int8: $(nrmse /tmp/cpu.f32 /tmp/cuda.f32)" \
    | tee "$out/logits.txt"
}

# The binary travels compressed (`prepare`).
if [ -e .cuda/hearth.xz ]; then
  xz -d -f .cuda/hearth.xz
  chmod +x .cuda/hearth
fi

case "${1:-}" in
  prepare) prepare ;;
  device) device ;;
  build-start) build_start ;;
  build) build_only ;;
  synth-start) synth_start ;;
  against) against ;;
  moe-synth-start) moe_synth_start ;;
  moe) moe ;;
  moe-quick) moe_quick ;;
  moe-quick-synth-start)
    touch /root/moe-quick-synth.running
    setsid bash -c "bash scripts/cuda-bench.sh moe-quick-synth >/root/moe-quick-synth.out 2>&1; rm -f /root/moe-quick-synth.running" \
      </dev/null >/dev/null 2>&1 & ;;
  moe-quick-synth) moe_quick_synth ;;
  split) split ;;
  tp) tp ;;
  sweep) sweep ;;
  mv) mv_bench ;;
  profiles) profiles ;;
  *) echo "usage: $0 prepare|device|build-start|synth-start|moe-synth-start|against|moe|moe-quick|sweep" >&2; exit 2 ;;
esac

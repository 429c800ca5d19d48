#!/usr/bin/env bash
# Decode and prefill tokens/s of the fast vs the scalar CPU attention
# (HEARTH_ATTN=scalar), interleaved in one run, on synthetic models of
# SmolLM2-135M (Q4_1) and Gemma-3-270M (Q4_K_M) shapes, at 1 and 2 threads,
# after a short (8-token) and a long (300-token) prompt; then the per-op
# profile (HEARTH_PROFILE=1) of each at 1 thread and the long context.
# Usage: scripts/bench_cpu_ops.sh [hearth binary] [work dir]
set -eu
BIN=${1:-target/release/hearth}
D=${2:-/tmp/hearth-bench}
mkdir -p "$D"
PIN="taskset -c 0,1"
$PIN true 2>/dev/null || PIN=""
[ -f "$D/smol.gguf" ] || "$BIN" synth --shape smollm2-135m --type Q4_1 "$D/smol.gguf" >/dev/null
[ -f "$D/gemma.gguf" ] || "$BIN" synth --shape gemma3-270m --type Q4_K_M "$D/gemma.gguf" >/dev/null
short=$(seq -s, 100 107)
long=$(seq -s, 100 399)
run() { # model threads prompt attn
  HEARTH_ATTN=$4 $PIN "$BIN" run -m "$D/$1.gguf" --prompt-tokens "$3" -n 64 --temp 0 \
    --ignore-eos --json -t "$2" 2>/dev/null | tail -1 |
    python3 -c 'import json,sys; s=json.load(sys.stdin)["summary"]; print("%.1f %.1f" % (s["decode_tps"], s["prefill_tps"]))'
}
echo "model threads ctx attn decode_tps prefill_tps"
for rep in 1 2; do
  for m in smol gemma; do for t in 1 2; do for c in short long; do for a in fast scalar; do
    eval p=\$$c
    echo "$m $t $c $a $(run "$m" "$t" "$p" "$a")"
  done; done; done; done
done
for m in smol gemma; do for a in fast scalar; do
  echo "== profile $m attn=$a, 1 thread, 300-token prompt + 64"
  HEARTH_PROFILE=1 HEARTH_ATTN=$a $PIN "$BIN" run -m "$D/$m.gguf" --prompt-tokens "$long" -n 64 \
    --temp 0 --ignore-eos --json -t 1 2>&1 >/dev/null | grep -v '^{' || true
done; done

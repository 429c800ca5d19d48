#!/usr/bin/env bash
# Native A/B of the CPU worker pools: rayon (HEARTH_POOL=rayon) against the
# purpose-built pool (the default), at 1 and 2 threads, decode and prefill,
# on a quiet machine and with one core kept busy by a competing process
# (`yes > /dev/null`). The pools alternate within each round, so background
# load drifts hit both alike.
# Usage: scripts/bench-threads.sh [MODEL.gguf ...]
# Env: ROUNDS (default 3), PP (64), TG (64), REPS (2), HEARTH (the binary,
# default target/release/hearth; build it with `cargo build --release -p hearth-cli`).
set -euo pipefail
cd "$(dirname "$0")/.."
hearth=${HEARTH:-target/release/hearth}
rounds=${ROUNDS:-3}
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf)
[ -x "$hearth" ] || { echo "no $hearth: run cargo build --release -p hearth-cli" >&2; exit 2; }

hog=
stop_hog() { [ -z "$hog" ] || { kill "$hog" 2>/dev/null || true; wait "$hog" 2>/dev/null || true; hog=; }; }
trap stop_hog EXIT

for load in quiet loaded; do
  if [ "$load" = loaded ]; then
    yes > /dev/null &
    hog=$!
  fi
  for model in "${models[@]}"; do
    for round in $(seq "$rounds"); do
      for pool in rayon spin; do
        HEARTH_POOL=$pool "$hearth" bench -m "$model" -p "${PP:-64}" -n "${TG:-64}" -t 1,2 \
          -r "${REPS:-2}" --json 2>/dev/null | grep '^{' |
          sed "s/^{/{\"load\": \"$load\", \"pool\": \"$pool\", \"round\": $round, /"
      done
    done
  done
  stop_hog
done

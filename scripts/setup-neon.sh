#!/usr/bin/env bash
# Installs what `make test-neon` (part of `make test`) needs: the aarch64
# Rust target, a cross linker and qemu-user. Idempotent.
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
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  pkgs=(qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
  $SUDO apt-get install -y "${pkgs[@]}" >/dev/null \
    || { $SUDO apt-get update >/dev/null && $SUDO apt-get install -y "${pkgs[@]}" >/dev/null; }
fi


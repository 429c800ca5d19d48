#!/usr/bin/env bash
# Copied from the project's anchor scripts (anchors/build-llamacpp.sh, the one that builds
# the llama.cpp used for the reference data in tests/fixtures/llamacpp), for `make bench`.
# Changes from the original: the step compiling refdump (a reference-dump tool whose source
# is not in this repository) is left out; everything else is as it was.
# It builds outside the tracked files, in ~/.cache/hearth-llamacpp (CACHE), and reuses
# that build when present.
#
# build-llamacpp.sh — build the reference llama.cpp from the llama-cpp-python 0.3.36 sdist.
#
#   bash build-llamacpp.sh            # -> prints BIN=<dir with libllama.so, llama-bench, llama-quantize, ...>
#
# Pinned source: PyPI llama-cpp-python==0.3.36 sdist, vendor/llama.cpp = ggml-org/llama.cpp@0c1e57098.
# Idempotent: the sdist, the source tree and the build are reused when present.
# env: CACHE (default ~/.cache/hearth-llamacpp), JOBS (default nproc), LLAMACPP_DIR (use an existing
#      source tree instead of extracting the sdist), NATIVE (ON|OFF, default ON).
# Needs: python3 + pip (PyPI access on first run), cmake >= 3.14 (pip-installed if missing), gcc/g++ >= 11.
set -euo pipefail
VER=0.3.36
CACHE=${CACHE:-$HOME/.cache/hearth-llamacpp}
JOBS=${JOBS:-$(nproc)}
NATIVE=${NATIVE:-ON}
mkdir -p "$CACHE"
log() { echo "[build-llamacpp $(date +%H:%M:%S)] $*" >&2; }

if ! command -v cmake >/dev/null; then
  log "installing cmake + ninja from PyPI"
  python3 -m pip install -q cmake ninja
fi
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

if [ -n "${LLAMACPP_DIR:-}" ]; then
  SRC=$LLAMACPP_DIR
else
  SRC=$CACHE/llama.cpp-$VER
  if [ ! -f "$SRC/CMakeLists.txt" ]; then
    SDIST=$CACHE/sdist/llama_cpp_python-$VER.tar.gz
    if [ ! -f "$SDIST" ]; then
      log "downloading llama-cpp-python==$VER sdist"
      # The literal `--no-binary :all:` also makes pip build the sdist's build requirements
      # (scikit-build-core, cmake, ...) from source while preparing metadata, which takes very long;
      # restricting --no-binary to the package itself fetches the same sdist file.
      python3 -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VER" -d "$CACHE/sdist" \
        || python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$CACHE/sdist"
    fi
    log "extracting vendor/llama.cpp"
    rm -rf "$CACHE/x" && mkdir -p "$CACHE/x"
    tar -C "$CACHE/x" -xzf "$SDIST" "llama_cpp_python-$VER/vendor/llama.cpp"
    rm -rf "$SRC" && mv "$CACHE/x/llama_cpp_python-$VER/vendor/llama.cpp" "$SRC" && rm -rf "$CACHE/x"
  fi
fi
BUILD=$SRC/build
BIN=$BUILD/bin

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  log "configuring ($SRC)"
  cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE="$NATIVE" \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_COMMIT=0c1e57098 -DLLAMA_BUILD_NUMBER=0 >&2
fi
need=()
for t in llama-quantize llama-bench llama-simple; do [ -x "$BIN/$t" ] || need+=("$t"); done
[ -e "$BIN/libllama.so" ] || need+=(llama)
if [ ${#need[@]} -gt 0 ]; then
  log "building ${need[*]} (-j $JOBS; ~5+ min on 2 cores)"
  cmake --build "$BUILD" -j "$JOBS" --target "${need[@]}" >&2
fi

echo "BIN=$BIN"
echo "LLAMA_QUANTIZE=$BIN/llama-quantize"

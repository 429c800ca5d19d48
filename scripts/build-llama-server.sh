#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the same pinned source as
# scripts/build-llamacpp.sh (llama-cpp-python 0.3.36's vendor/llama.cpp), in
# its own build directory beside that script's, for `make bench-serve`.
# Prints LLAMA_SERVER=<path>. Idempotent; ~10 min on 2 cores the first time.
set -euo pipefail
VER=0.3.36
CACHE=${CACHE:-$HOME/.cache/hearth-llamacpp}
JOBS=${JOBS:-$(nproc)}
SRC=$CACHE/llama.cpp-$VER
log() { echo "[build-llama-server $(date +%H:%M:%S)] $*" >&2; }
command -v cmake >/dev/null || python3 -m pip install -q cmake ninja
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  SDIST=$CACHE/sdist/llama_cpp_python-$VER.tar.gz
  mkdir -p "$CACHE/sdist"
  [ -f "$SDIST" ] || python3 -m pip download -q --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$VER" -d "$CACHE/sdist"
  log "extracting vendor/llama.cpp"
  rm -rf "$CACHE/x" && mkdir -p "$CACHE/x"
  tar -C "$CACHE/x" -xzf "$SDIST" "llama_cpp_python-$VER/vendor/llama.cpp"
  rm -rf "$SRC" && mv "$CACHE/x/llama_cpp_python-$VER/vendor/llama.cpp" "$SRC" && rm -rf "$CACHE/x"
fi
BUILD=$SRC/build-server
if [ ! -x "$BUILD/bin/llama-server" ]; then
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    log "configuring ($BUILD)"
    cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
      -DLLAMA_BUILD_COMMIT=0c1e57098 -DLLAMA_BUILD_NUMBER=0 >&2
  fi
  log "building llama-server (-j $JOBS)"
  cmake --build "$BUILD" -j "$JOBS" --target llama-server >&2
fi
echo "LLAMA_SERVER=$BUILD/bin/llama-server"

#!/usr/bin/env bash
# Builds the browser engine (www/wasm) into the npm package's dist/:
#   st  single-thread, SIMD128, stable Rust          -> www/package/dist/wasm-st/
#   mt  threaded (atomics, shared memory), nightly    -> www/package/dist/wasm-mt/
#       with -Z build-std and wasm-bindgen-rayon
# then runs wasm-bindgen (the pinned CLI in .cache/tools) and wasm-opt (npm
# binaryen; Debian's is broken). Usage: scripts/build-wasm.sh st|mt
# Env: HEARTH_WASM_TARGET: where the cargo target dirs go (default target/),
# e.g. an empty folder to time a cold build; HEARTH_WASM_OPT=0 skips wasm-opt.
set -euo pipefail
cd "$(dirname "$0")/.."

kind=${1:?usage: build-wasm.sh st|mt}
root=$PWD
out=$root/www/package/dist/wasm-$kind
export PATH="$root/.cache/tools/bin:$root/www/package/node_modules/.bin:$PATH"
command -v wasm-bindgen >/dev/null || { echo "wasm-bindgen is missing; run \`make setup\`" >&2; exit 1; }

case $kind in
  st)
    export CARGO_TARGET_DIR=${HEARTH_WASM_TARGET:-$root/target}/wasm-st
    RUSTFLAGS='-C target-feature=+simd128' \
      cargo build --release --target wasm32-unknown-unknown --manifest-path www/wasm/Cargo.toml
    features=(--enable-simd --enable-bulk-memory --enable-mutable-globals --enable-nontrapping-float-to-int
              --enable-sign-ext --enable-reference-types --enable-multivalue)
    ;;
  mt)
    export CARGO_TARGET_DIR=${HEARTH_WASM_TARGET:-$root/target}/wasm-mt
    # The linker flags make the memory shared and export the TLS symbols
    # wasm-bindgen-rayon's workers need (without them initThreadPool fails
    # with DataCloneError).
    RUSTFLAGS='-C target-feature=+atomics,+bulk-memory,+mutable-globals,+simd128
      -C link-arg=--shared-memory -C link-arg=--max-memory=4294967296
      -C link-arg=--import-memory -C link-arg=--export=__wasm_init_tls
      -C link-arg=--export=__tls_size -C link-arg=--export=__tls_align
      -C link-arg=--export=__tls_base' \
      cargo +nightly build --release --target wasm32-unknown-unknown --manifest-path www/wasm/Cargo.toml \
        -Z build-std=panic_abort,std
    features=(--enable-simd --enable-threads --enable-bulk-memory --enable-mutable-globals
              --enable-nontrapping-float-to-int --enable-sign-ext --enable-reference-types --enable-multivalue)
    ;;
  *) echo "unknown build '$kind': use st or mt" >&2; exit 2 ;;
esac

raw=$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/hearth_wasm.wasm
if [ "$out/hearth_wasm_bg.wasm" -nt "$raw" ] && [ "$out/hearth_wasm_bg.wasm" -nt "$0" ]; then
  echo "wasm-$kind: up to date"
  exit 0
fi
rm -rf "$out"
wasm-bindgen --target web --out-dir "$out" --out-name hearth_wasm \
  "$raw"
if [ "$kind" = mt ]; then
  # wasm-bindgen-rayon's worker imports the package as `import('../../..')`,
  # which only a bundler resolves; point it at the module file instead.
  helper=$(find "$out/snippets" -name workerHelpers.js | head -n1)
  [ -n "$helper" ] || { echo "wasm-bindgen-rayon's workerHelpers.js is missing from $out/snippets" >&2; exit 1; }
  sed -i "s#import('../../..')#import('../../../hearth_wasm.js')#" "$helper"
  grep -q "hearth_wasm.js" "$helper" || { echo "could not patch $helper" >&2; exit 1; }
fi
if [ "${HEARTH_WASM_OPT:-1}" = 0 ]; then
  echo "wasm-opt skipped (HEARTH_WASM_OPT=0)" >&2
elif command -v wasm-opt >/dev/null; then
  wasm-opt -O3 "${features[@]}" "$out/hearth_wasm_bg.wasm" -o "$out/hearth_wasm_bg.wasm"
else
  echo "wasm-opt not found (npm binaryen in www/package): the module is not optimized" >&2
fi
rm -f "$out/.gitignore" "$out/package.json"
printf '%s: %s bytes (%s gzip)\n' "wasm-$kind" "$(stat -c %s "$out/hearth_wasm_bg.wasm")" \
  "$(gzip -9c "$out/hearth_wasm_bg.wasm" | wc -c)"

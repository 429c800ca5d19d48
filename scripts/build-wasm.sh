#!/usr/bin/env bash
# Builds the browser engine (www/wasm) into the npm package's dist/:
#   st  single-thread, SIMD128, stable Rust          -> www/package/dist/wasm-st/
#   mt  threaded (atomics, shared memory), nightly    -> www/package/dist/wasm-mt/
#       with -Z build-std and wasm-bindgen-rayon
# then runs wasm-bindgen (native/wasm-bindgen: the pinned library, built here
# into target/tools) and wasm-opt (npm binaryen; Debian's is broken).
# Usage: scripts/build-wasm.sh st|mt
# Env: HEARTH_WASM_TARGET: where the cargo target dirs go (default target/),
# e.g. an empty folder to time a cold build; HEARTH_WASM_OPT=0 skips wasm-opt;
# HEARTH_WASM_PROFILE: `release` (default: fat LTO, one codegen unit, then
# wasm-opt; what `make package` and the demo ship) or `browser-test` (no LTO,
# 16 codegen units, no wasm-opt: what `make test-browser` runs; no serial LTO
# or wasm-opt pass, so both cores stay busy to the end of a cold build).
set -euo pipefail
cd "$(dirname "$0")/.."

kind=${1:?usage: build-wasm.sh st|mt}
root=$PWD
out=$root/www/package/dist/wasm-$kind
profile=${HEARTH_WASM_PROFILE:-release}
export PATH="$root/www/package/node_modules/.bin:$PATH"

# wasm-bindgen: built on first use, then a no-op for cargo (under a second).
wasm_bindgen=$root/target/tools/release/hearth-wasm-bindgen
[ -x "$wasm_bindgen" ] || echo "building native/wasm-bindgen into target/tools (once)" >&2
cargo build --release --quiet --locked --manifest-path native/wasm-bindgen/Cargo.toml \
  --target-dir "$root/target/tools"

# The test profile is defined here rather than in www/wasm/Cargo.toml: it only
# concerns this script. Each profile has its own output dir under the target.
case $profile in
  release) profile_args=(--release) ;;
  browser-test)
    profile_args=(--profile browser-test --config 'profile.browser-test.inherits="release"'
                  --config 'profile.browser-test.lto=false' --config 'profile.browser-test.codegen-units=16')
    HEARTH_WASM_OPT=0
    ;;
  *) echo "unknown HEARTH_WASM_PROFILE '$profile': use release or browser-test" >&2; exit 2 ;;
esac

case $kind in
  st)
    export CARGO_TARGET_DIR=${HEARTH_WASM_TARGET:-$root/target}/wasm-st
    RUSTFLAGS='-C target-feature=+simd128' \
      cargo build "${profile_args[@]}" --target wasm32-unknown-unknown --manifest-path www/wasm/Cargo.toml
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
      cargo +nightly build "${profile_args[@]}" --target wasm32-unknown-unknown --manifest-path www/wasm/Cargo.toml \
        -Z build-std=panic_abort,std
    features=(--enable-simd --enable-threads --enable-bulk-memory --enable-mutable-globals
              --enable-nontrapping-float-to-int --enable-sign-ext --enable-reference-types --enable-multivalue)
    ;;
  *) echo "unknown build '$kind': use st or mt" >&2; exit 2 ;;
esac

raw=$CARGO_TARGET_DIR/wasm32-unknown-unknown/$profile/hearth_wasm.wasm
# dist/ holds one profile's build at a time; .profile says which.
if [ "$out/hearth_wasm_bg.wasm" -nt "$raw" ] && [ "$out/hearth_wasm_bg.wasm" -nt "$0" ] \
   && [ "$(cat "$out/.profile" 2>/dev/null)" = "$profile" ]; then
  echo "wasm-$kind ($profile): up to date"
  exit 0
fi
rm -rf "$out"
"$wasm_bindgen" --target web --out-dir "$out" --out-name hearth_wasm "$raw"
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
echo "$profile" >"$out/.profile"
printf '%s (%s): %s bytes (%s gzip)\n' "wasm-$kind" "$profile" "$(stat -c %s "$out/hearth_wasm_bg.wasm")" \
  "$(gzip -9c "$out/hearth_wasm_bg.wasm" | wc -c)"

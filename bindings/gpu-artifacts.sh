#!/usr/bin/env bash
# Prepares, on the development machine, what the bindings' GPU tests need on a GPU machine that
# has no swig, Go or Rust toolchain (docs/bindings.md says how to run them there):
#   .carry/bindings/python-swig/   flashattn_wrap.c + flashattn_swig.py as the build made them
#                                  (for cmake -DFLASHATTN_SWIG_DIR=...)
#   .carry/bindings/flashattn_go.test         go test -c of package flashattn (CPU and GPU tests)
#   .carry/bindings/flashattn_rust_gpu.test   cargo test --no-run of flashattn's tests/gpu.rs
# The binaries link libflashattn.so.0 dynamically (no run path): on the GPU machine they load the
# library built there through LD_LIBRARY_PATH. BUILD_DIR (default: build) is any build of the
# library here configured with -DFLASHATTN_BUILD_PYTHON=ON (scripts/steps/10-build.sh does); a
# CUDA-enabled one is not needed to link.
set -euo pipefail
cd "$(dirname "$0")/.."
. bindings/env.sh
out=.carry/bindings
rm -rf "$out"
mkdir -p "$out/python-swig"

cmake --build "$BUILD_DIR" --target flashattn_python >/dev/null
cp "$BUILD_DIR"/bindings/python/swig/flashattn_wrap.c "$BUILD_DIR"/bindings/python/swig/flashattn_swig.py \
  "$out/python-swig/"

(cd bindings/go && GOCACHE=$FLASHATTN_BINDINGS_OUT/go-cache GOFLAGS=-mod=mod GOPROXY=off \
   go test -c -o "../../$out/flashattn_go.test" .)  # GOCACHE: see scripts/steps/50-go.sh

export CARGO_TARGET_DIR="$FLASHATTN_BINDINGS_OUT/cargo"
exe=$(cargo test --offline --no-run --release --manifest-path bindings/rust/Cargo.toml \
        -p flashattn --test gpu --message-format=json |
      python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "gpu" and m.get("executable"):
        print(m["executable"])')
cp "$exe" "$out/flashattn_rust_gpu.test"
ls -l "$out" "$out/python-swig"

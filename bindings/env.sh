# Sourced by the Go and Rust test steps (scripts/steps/50-go.sh, 60-rust.sh) and
# bindings/gpu-artifacts.sh, from the repository root. Installs the library built in $BUILD_DIR
# (default: build) into $BUILD_DIR/install and exports what the bindings need to find it:
#   PKG_CONFIG_PATH   so that `pkg-config flashattn` (Go's #cgo pkg-config, the Rust -sys
#                     crate's build script) answers with that install
#   LD_LIBRARY_PATH   so that Go and Rust test binaries load libflashattn.so
#   FLASHATTN_PREFIX  the install, FLASHATTN_BINDINGS_OUT a folder for the bindings' build outputs
# and FLASHATTN_INCLUDEDIR (its include folder) for generators (swig, bindgen).

: "${BUILD_DIR:=build}"
case "$BUILD_DIR" in
  /*) ;;
  *) BUILD_DIR="$PWD/$BUILD_DIR" ;;
esac
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  echo "bindings: $BUILD_DIR is not a CMake build of flashattn (build it first)" >&2
  return 1 2>/dev/null || exit 1
fi

FLASHATTN_PREFIX="$BUILD_DIR/install"
FLASHATTN_BINDINGS_OUT="$BUILD_DIR/bindings"
mkdir -p "$FLASHATTN_BINDINGS_OUT"
cmake --install "$BUILD_DIR" --prefix "$FLASHATTN_PREFIX" >/dev/null

_fa_pc=$(find "$FLASHATTN_PREFIX" -path '*/pkgconfig/flashattn.pc' | head -n 1)
if [ -z "$_fa_pc" ]; then
  echo "bindings: no flashattn.pc under $FLASHATTN_PREFIX" >&2
  return 1 2>/dev/null || exit 1
fi
export PKG_CONFIG_PATH="$(dirname "$_fa_pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
unset _fa_pc

_fa_libdir=$(pkg-config --variable=libdir flashattn)
export LD_LIBRARY_PATH="$_fa_libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset _fa_libdir
FLASHATTN_INCLUDEDIR=$(pkg-config --variable=includedir flashattn)
export FLASHATTN_PREFIX FLASHATTN_BINDINGS_OUT FLASHATTN_INCLUDEDIR BUILD_DIR

#!/usr/bin/env bash
# The bindings' GPU tests on a GPU machine without swig, Go or Rust: run after
# run-gpu-suite.sh has built build-gpu/, with .carry/bindings/ made on the development machine
# by bindings/gpu-artifacts.sh (and carried along). Log: $OUT/bindings.log; one line per
# language last.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
log=$out/bindings.log
build=${BUILD:-build-gpu}
carry=.carry/bindings
: > "$log"

cmake --install "$build" --prefix "$root/$build/install" >> "$log" 2>&1
libdir=$(dirname "$(ls "$root/$build"/install/lib*/libflashattn.so | head -n 1)")
export PKG_CONFIG_PATH=$libdir/pkgconfig LD_LIBRARY_PATH=$libdir

declare -A verdict
run() {  # run NAME COMMAND...
  local name=$1
  shift
  echo "== $name: $*" >> "$log"
  if timeout 240 "$@" >> "$log" 2>&1; then verdict[$name]=passed; else verdict[$name]="FAILED ($?)"; fi
}
# The Python package, staged in $build/python, from the SWIG output made on the development machine.
py_build() {
  cmake -S "$root" -B "$root/$build" -DFLASHATTN_BUILD_PYTHON=ON \
    -DFLASHATTN_SWIG_DIR="$root/$carry/python-swig" -DPython_EXECUTABLE="$(command -v python3)" &&
    cmake --build "$root/$build" --target flashattn_python
}
export -f py_build
export root build carry
run python-build bash -c py_build
PYTHONPATH=$root/$build/python run python python3 -m pytest bindings/python/tests -q -rs
run go "$carry/flashattn_go.test" -test.v -test.run GPU
# The Rust GPU tests are #[ignore]d where no GPU is meant to be: --ignored runs just them.
run rust "$carry/flashattn_rust_gpu.test" --ignored --nocapture
for name in python-build python go rust; do
  printf 'bindings %-12s %s\n' "$name" "${verdict[$name]:-not run}"
done
grep -E "passed|skipped|SKIP|PASS|ok |test result" "$log" | tail -n 8

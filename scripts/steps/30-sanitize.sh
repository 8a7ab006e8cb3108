#!/usr/bin/env bash
# The whole CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer
# included). A separate build dir, CUDA off: the sanitized build tests the CPU paths and the C
# API layer; the GPU suite gets compute-sanitizer instead (scripts/gpu/compute-sanitizer.sh).
# clang is used when present: its UBSan also checks enum loads and calls through function
# pointers, which gcc's does not.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# Beside BUILD_DIR (build-asan/ by default), so that moving BUILD_DIR moves this build too.
build=${FLASHATTN_ASAN_BUILD_DIR:-${BUILD_DIR:-$root/build}-asan}
jobs=${JOBS:-2}

if [[ -z "${CC:-}" && -z "${CXX:-}" ]] && command -v clang >/dev/null && command -v clang++ >/dev/null; then
  export CC=clang CXX=clang++
fi

start=$SECONDS
cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFLASHATTN_ENABLE_CUDA=OFF \
  -DFLASHATTN_SANITIZE=address,undefined \
  -DFLASHATTN_BUILD_TESTS=ON \
  -DFLASHATTN_BUILD_EXAMPLES=ON >/dev/null
ninja -C "$build" -j"$jobs"
echo "30-sanitize: build took $((SECONDS - start)) s"

# halt/abort on the first report so that CTest sees a failure, never a warning in a log.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=${LSAN_OPTIONS:-}

start=$SECONDS
ctest --test-dir "$build" -LE gpu --output-on-failure -j"$jobs" --timeout 900
echo "30-sanitize: tests took $((SECONDS - start)) s (ASan + UBSan, CUDA off)"

#!/usr/bin/env bash
# Valgrind memcheck over the main build (BUILD_DIR, as step 10 built it; the same library that
# ships, CUDA compiled in when a toolkit is there):
#   - examples/c's attention_c, the smallest complete use of the API: create, compute, destroy;
#   - fuzz_replay, every fuzzer regression input and seed through the whole C API (contexts and
#     buffers created and destroyed in every order, rejected calls, absurd allocations).
# Any invalid access, use of uninitialized memory, or memory definitely or indirectly lost
# after the handles are destroyed fails the step. ("Still reachable" is allowed: the registry of
# live buffer ranges is a process-lifetime object, on purpose.)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-$root/build}

command -v valgrind >/dev/null || { echo "70-valgrind: valgrind is not installed" >&2; exit 1; }
[ -f "$build/CMakeCache.txt" ] || { echo "70-valgrind: $build is not configured (run 10-build)" >&2; exit 1; }
cmake --build "$build" --target attention_c fuzz_replay -j "${JOBS:-2}" >/dev/null

logs=$build/valgrind
mkdir -p "$logs"
status=0
run() {
  local name=$1
  shift
  local start=$SECONDS
  if valgrind --quiet --leak-check=full --show-leak-kinds=definite,indirect \
       --errors-for-leak-kinds=definite,indirect --error-exitcode=1 \
       --log-file="$logs/$name.log" "$@" >"$logs/$name.out" 2>&1; then
    echo "70-valgrind: $name clean ($((SECONDS - start)) s)"
  else
    echo "70-valgrind: $name FAILED ($((SECONDS - start)) s); valgrind log:" >&2
    cat "$logs/$name.log" >&2
    tail -n 20 "$logs/$name.out" >&2
    status=1
  fi
}
run attention_c "$build/examples/attention_c"
run fuzz_replay "$build/tests/fuzz/fuzz_replay"
exit $status

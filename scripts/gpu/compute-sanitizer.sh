#!/usr/bin/env bash
# Runs the GPU test executables under NVIDIA compute-sanitizer, one pass per tool: memcheck
# (out-of-bounds and misaligned device accesses, device memory leaks), racecheck (shared-memory
# hazards), initcheck (reads of uninitialized device memory) and synccheck (invalid
# __syncthreads / warp synchronization). Needs a GPU; run it on the GPU machine.
#
#   scripts/gpu/compute-sanitizer.sh [EXECUTABLE...] [-- TEST_ARGS...]
#
# EXECUTABLE  test programs to check (default: the gpu-labelled test executables of BUILD_DIR,
#             tests/gpu/gpu_tests and tests/api/api_gpu_tests, those that exist)
# TEST_ARGS   arguments for every executable (default: --test-case-exclude=*large*, which leaves
#             out the long-sequence cases: the same kernels as the rest, 10-100x slower under
#             racecheck)
#
# Environment:
#   BUILD_DIR              build folder (default build-gpu/ in the repository, else build/)
#   FLASHATTN_CS_TOOLS     tools to run (default "memcheck racecheck initcheck synccheck")
#   FLASHATTN_CS_BUDGET    seconds for all tools together (default 380); each tool gets an even
#                          share of what is left, and a tool cut off by it counts as not clean
#   FLASHATTN_CS_LOG_DIR   where each tool's full log goes (default BUILD_DIR/compute-sanitizer)
#   COMPUTE_SANITIZER      the compute-sanitizer binary (default: PATH, then the CUDA toolkit)
#
# Prints one verdict line per tool and executable, then the overall verdict; exit status 0 only
# when every run is clean (no sanitizer error and the tests passed), 77 when there is no GPU.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [ -z "${BUILD_DIR:-}" ]; then
  if [ -d "$root/build-gpu" ]; then BUILD_DIR=$root/build-gpu; else BUILD_DIR=$root/build; fi
fi
tools=${FLASHATTN_CS_TOOLS:-memcheck racecheck initcheck synccheck}
budget=${FLASHATTN_CS_BUDGET:-380}
logs=${FLASHATTN_CS_LOG_DIR:-$BUILD_DIR/compute-sanitizer}

exes=()
test_args=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then
    shift
    test_args=("$@")
    break
  fi
  exes+=("$1")
  shift
done
if [ ${#exes[@]} -eq 0 ]; then
  for e in "$BUILD_DIR/tests/gpu/gpu_tests" "$BUILD_DIR/tests/api/api_gpu_tests"; do
    [ -x "$e" ] && exes+=("$e")
  done
fi
[ ${#test_args[@]} -eq 0 ] && test_args=("--test-case-exclude=*large*")
if [ ${#exes[@]} -eq 0 ]; then
  echo "compute-sanitizer.sh: no GPU test executable under $BUILD_DIR (build it, or name it)" >&2
  exit 2
fi

cs=${COMPUTE_SANITIZER:-}
if [ -z "$cs" ]; then
  cs=$(command -v compute-sanitizer 2>/dev/null)
  for c in "${CUDA_HOME:-/usr/local/cuda}/compute-sanitizer/compute-sanitizer" \
           "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer"; do
    [ -z "$cs" ] && [ -x "$c" ] && cs=$c
  done
fi
if [ -z "$cs" ]; then
  echo "compute-sanitizer.sh: compute-sanitizer not found (set COMPUTE_SANITIZER)" >&2
  exit 2
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "compute-sanitizer.sh: no GPU here (nvidia-smi -L failed); nothing checked" >&2
  exit 77
fi

mkdir -p "$logs"
echo "compute-sanitizer.sh: $("$cs" --version 2>/dev/null | tail -n 1)"
echo "compute-sanitizer.sh: $(nvidia-smi -L | head -n 1)"
echo "compute-sanitizer.sh: tools: $tools; test arguments: ${test_args[*]}; logs in $logs"

# Per-tool options. Every error fails the run (--error-exitcode). memcheck also reports device
# allocations still live at exit (the library must free what it allocates); it does not count
# failing CUDA API calls, which the tests provoke on purpose (a huge cudaMalloc must come back as
# FLASHATTN_ERROR_DEVICE_OUT_OF_MEMORY) and check through the library's statuses.
tool_options() {
  case "$1" in
    memcheck) echo "--leak-check full --report-api-errors no" ;;
    racecheck) echo "" ;;
    initcheck) echo "--nvtx yes" ;;  # reads the library's NVTX marks of cuBLAS-written memory
    synccheck) echo "" ;;
    *) echo "unknown" ;;
  esac
}

# Each run's share of the budget left is its weight over the weights still to run: racecheck
# runs the suite several times slower than the other tools (measured on the H200: the whole
# gpu_tests suite in about 65 s under racecheck, under 10 s under each of the others).
weight_of() { [ "$1" = racecheck ] && echo 6 || echo 1; }

start=$SECONDS
read -r -a tool_list <<<"$tools"
weight_left=0
for tool in "${tool_list[@]}"; do
  weight_left=$((weight_left + $(weight_of "$tool") * ${#exes[@]}))
done
verdicts=()
failed=0
for tool in "${tool_list[@]}"; do
  opts=$(tool_options "$tool")
  if [ "$opts" = unknown ]; then
    echo "compute-sanitizer.sh: unknown tool $tool" >&2
    exit 2
  fi
  for exe in "${exes[@]}"; do
    name=$(basename "$exe")
    log="$logs/$tool-$name.log"
    left=$((budget - (SECONDS - start)))
    weight=$(weight_of "$tool")
    limit=$((left * weight / weight_left))
    [ "$limit" -lt 10 ] && limit=10
    weight_left=$((weight_left - weight))
    t0=$SECONDS
    # shellcheck disable=SC2086  # opts is a list of options
    timeout --kill-after=10 "$limit" "$cs" --tool "$tool" $opts --error-exitcode 1 \
      --print-limit 50 "$exe" "${test_args[@]}" >"$log" 2>&1
    rc=$?
    took=$((SECONDS - t0))
    summary=$(grep -E '^========= ERROR SUMMARY' "$log" | tail -n 1 | sed 's/^========= //')
    cases=$(grep -E 'test cases:' "$log" | tail -n 1 | sed 's/^\[doctest\] //; s/ *|/,/g; s/  */ /g')
    if [ $rc -eq 0 ]; then
      verdict="clean"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      verdict="NOT CHECKED: cut off after ${limit} s (raise FLASHATTN_CS_BUDGET or narrow TEST_ARGS)"
      failed=1
    elif [ $rc -eq 77 ]; then
      verdict="skipped: the test program found no GPU"
      failed=1
    elif grep -qE '^========= ERROR SUMMARY: [1-9]' "$log"; then
      verdict="FAILED: sanitizer errors"
      failed=1
    else
      verdict="FAILED: the tests failed (exit $rc)"
      failed=1
    fi
    line="compute-sanitizer $tool $name: $verdict (${summary:-no summary}; ${cases:-no doctest summary}; ${took} s)"
    verdicts+=("$line")
    echo "$line"
    if [ "$verdict" != clean ]; then
      # The first reports, for the log of whoever ran this.
      grep -E '^========= ' "$log" | head -n 40 | sed 's/^/    /'
    fi
  done
done

echo
echo "== compute-sanitizer verdicts =="
printf '%s\n' "${verdicts[@]}"
if [ $failed -eq 0 ]; then
  echo "compute-sanitizer.sh: all clean ($((SECONDS - start)) s)"
else
  echo "compute-sanitizer.sh: NOT clean ($((SECONDS - start)) s); full logs in $logs"
fi
exit $failed

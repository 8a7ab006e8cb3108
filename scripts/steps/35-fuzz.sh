#!/usr/bin/env bash
# Fuzzes the C ABI (CPU backend) with libFuzzer for a bounded time: tests/fuzz/fuzz_api.cpp,
# built with clang, ASan + UBSan (+ LeakSanitizer), CUDA off, in its own build dir.
#   1. every regression input (tests/fuzz/regressions/) and seed (tests/fuzz/corpus/) once;
#   2. fuzzing for FLASHATTN_FUZZ_SECONDS (default 60) on a temporary copy of the seed corpus
#      (the checked-in corpus is read, never written).
# Any crash, sanitizer report, leak, timeout (> 10 s per input) or violated harness invariant
# fails the step; the input that caused it is kept under $build/fuzz-findings/ and printed in
# base64, ready to become a regression input (tests/fuzz/regressions/, see docs/reliability.md).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# Beside BUILD_DIR (build-fuzz/ by default), so that moving BUILD_DIR moves this build too.
build=${FLASHATTN_FUZZ_BUILD_DIR:-${BUILD_DIR:-$root/build}-fuzz}
seconds=${FLASHATTN_FUZZ_SECONDS:-60}
jobs=${JOBS:-2}

if ! command -v clang >/dev/null || ! command -v clang++ >/dev/null; then
  echo "35-fuzz: clang not found; libFuzzer needs clang" >&2
  exit 1
fi

start=$SECONDS
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFLASHATTN_ENABLE_CUDA=OFF \
  -DFLASHATTN_SANITIZE=address,undefined \
  -DFLASHATTN_BUILD_FUZZER=ON \
  -DFLASHATTN_BUILD_TESTS=ON \
  -DFLASHATTN_BUILD_EXAMPLES=OFF >/dev/null
ninja -C "$build" -j"$jobs" fuzz_api
echo "35-fuzz: build took $((SECONDS - start)) s"

fuzzer=$build/tests/fuzz/fuzz_api
work=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/artifacts"
cp "$root"/tests/fuzz/corpus/* "$work/corpus/"

export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:${ASAN_OPTIONS:-}
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}

report_findings() {
  local kept=$build/fuzz-findings
  mkdir -p "$kept"
  shopt -s nullglob
  for f in "$work"/artifacts/*; do
    cp "$f" "$kept/"
    echo "35-fuzz: finding $(basename "$f") (kept in $kept), base64: $(base64 -w0 "$f")" >&2
  done
  echo "35-fuzz: FAILED. Reproduce: $fuzzer <input>; trace: FLASHATTN_FUZZ_TRACE=1 $fuzzer <input>" >&2
}

# 1. Regressions and seeds, each once.
shopt -s nullglob
inputs=("$root"/tests/fuzz/regressions/* "$root"/tests/fuzz/corpus/*)
shopt -u nullglob
if ! "$fuzzer" -rss_limit_mb=4096 -timeout=10 -artifact_prefix="$work/artifacts/" "${inputs[@]}" \
     >"$work/replay.log" 2>&1; then
  tail -n 60 "$work/replay.log" >&2
  report_findings
  exit 1
fi
echo "35-fuzz: ${#inputs[@]} regression and seed inputs replayed cleanly"

# 2. Fuzzing. New inputs go to the temporary copy (the first corpus directory) only.
start=$SECONDS
status=0
"$fuzzer" -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" "$work/corpus" "$root/tests/fuzz/corpus" \
  >"$work/fuzz.log" 2>&1 || status=$?
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log" | tail -n 1)
if [[ $status -ne 0 || -n "$(ls -A "$work/artifacts")" ]]; then
  grep -v -E '^#[0-9]+ +(NEW|REDUCE|pulse|RELOAD)' "$work/fuzz.log" | tail -n 80 >&2
  echo "35-fuzz: after ${execs:-?} executions, libFuzzer exited with status $status" >&2
  report_findings
  exit 1
fi
echo "35-fuzz: ${execs:-?} executions in $((SECONDS - start)) s, no finding" \
     "(corpus grew to $(ls "$work/corpus" | wc -l) inputs)"

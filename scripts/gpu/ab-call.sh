#!/usr/bin/env bash
# One device call for a kernel change: the GPU tests on the change and its A/B timings, the
# A/B's variants built in the background while the tests run, every table cut to the call's
# limit so that what was measured comes back.
#
#   scripts/gpu/ab-call.sh [--apply] PATCH_DIR [--suite "ARGS"] -- BENCH_ARGS [-- BENCH_ARGS ...]
#
# PATCH_DIR holds NN.patch files as for ab-bench.sh: v0 is the tree without them, the last
# variant the tree itself. --apply: the patches are not in the tree yet (a change prepared in
# docs/ for a later call): they are applied first, in name order, to the device's copy.
# --suite: run-gpu-suite.sh's arguments (default "--tests --budget 300"); "" runs no suite.
# Each "-- BENCH_ARGS" is one table: ab-bench.sh with those cuda_benchmark arguments, in the
# order given (put the one wanted most first). VARIANTS, REPS and BENCH pass through to every
# table. A table starts only before STOP_AT seconds (default 500) and is cut at LIMIT (default
# 570, under a 600 s call).
#
# Output under $OUT (default ./gpu-out): summary.txt and flex.* (the suite's), ab-1.txt,
# ab-2.txt, ... (one a table), logs.tgz (the suite's logs and every build and timing log); the
# tables and the summary's tail are printed last.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
usage() { sed -n '2,20p' "${BASH_SOURCE[0]}"; exit 2; }

apply=0
if [ "${1:-}" = "--apply" ]; then apply=1; shift; fi
if [ $# -lt 1 ] || [ ! -d "$1" ]; then usage; fi
patch_dir=$(cd "$1" && pwd); shift
suite_args="--tests --budget 300"
if [ "${1:-}" = "--suite" ]; then
  [ $# -ge 2 ] || usage
  suite_args=$2; shift 2
fi
# The tables, each its arguments quoted into one string.
tables=()
[ "${1:-}" = "--" ] || usage
while [ $# -gt 0 ]; do
  shift  # the "--"
  table=""
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do table+="$(printf '%q ' "$1")"; shift; done
  [ -n "$table" ] || usage
  tables+=("$table")
done

out=${OUT:-$root/gpu-out}
mkdir -p "$out"
t0=$SECONDS
elapsed() { echo $((SECONDS - t0)); }
stop_at=${STOP_AT:-500}
limit=${LIMIT:-570}
work=/tmp/ab-call
rm -rf "$work"
mkdir -p "$work"

if [ "$apply" = 1 ]; then
  applied=0
  shopt -s nullglob
  for p in "$patch_dir"/*.patch; do
    patch -s -p1 < "$p" || { echo "ab-call: applying $p failed"; exit 1; }
    applied=$((applied + 1))
  done
  shopt -u nullglob
  echo "ab-call: applied $applied patches"
fi

(BUILD_ONLY=1 OUT="$work/build" scripts/gpu/ab-bench.sh "$patch_dir" > "$work/ab-build.log" 2>&1) &
builder=$!
if [ -n "$suite_args" ]; then
  suite=()
  eval "suite=($suite_args)"  # a shell-quoted list: --flex-args "--dims 128" stays one word
  OUT="$work/suite" scripts/gpu/run-gpu-suite.sh "${suite[@]}"
  cp "$work"/suite/summary.txt "$work"/suite/flex.json "$work"/suite/flex.log "$out/" 2>/dev/null
fi
wait "$builder" || echo "ab-call: the variants' build failed ($work/ab-build.log):"
tail -3 "$work/ab-build.log"
echo "== variants built at $(elapsed) s =="

i=0
for table in "${tables[@]}"; do
  i=$((i + 1))
  if [ "$(elapsed)" -ge "$stop_at" ]; then
    echo "ab-call: table $i not started (${stop_at} s passed): $table"
    continue
  fi
  args=()
  eval "args=($table)"
  OUT="$work/t$i" timeout $((limit - $(elapsed))) scripts/gpu/ab-bench.sh "$patch_dir" -- \
    "${args[@]}" > "$work/table-$i.log" 2>&1 || echo "ab-call: table $i cut or failed"
  cp "$work/t$i/ab.txt" "$out/ab-$i.txt" 2>/dev/null
  echo "== table $i at $(elapsed) s: $table =="
done

cp /tmp/ab-build-v*.log "$work/" 2>/dev/null  # ab-bench.sh's build logs of the variants
tar -czf "$out/logs.tgz" -C "$work" .
echo "== ab-call: $(elapsed) s =="
for f in "$out"/ab-*.txt; do [ -f "$f" ] && { echo "-- $(basename "$f")"; cat "$f"; }; done
[ -f "$out/summary.txt" ] && tail -22 "$out/summary.txt"
exit 0

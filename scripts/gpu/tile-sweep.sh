#!/usr/bin/env bash
# Times the Hopper forward with tile shapes other than the kernel table's, in one call: for each
# variant, writes the generated kernel files with `lib/cuda/generate.py --sm90-fwd-tiles VARIANT`
# (the word `table` means the table's own), rebuilds the library and cuda_benchmark
# incrementally, and runs `cuda_benchmark --fwd --algo flash`. The table's files are written
# back at the end. Run on the GPU machine after a build (scripts/gpu/run-gpu-suite.sh):
#
#   scripts/gpu/tile-sweep.sh [--build DIR] [--bench-args "..."] VARIANT...
#   scripts/gpu/tile-sweep.sh table 128=176x2 64=192x2,128=176x2
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=build-gpu
bench_args="--dims 64,128 --seqlens 1024,4096,16384 --no-gpt2"
variants=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift ;;
    --bench-args) bench_args=$2; shift ;;
    -h|--help) sed -n '2,11p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) variants+=("$1") ;;
  esac
  shift
done
[ ${#variants[@]} -gt 0 ] || { echo "tile-sweep: name at least one variant" >&2; exit 2; }
restore() { python3 lib/cuda/generate.py; }
trap restore EXIT
rc=0
for v in "${variants[@]}"; do
  echo "== variant $v =="
  if [ "$v" = table ]; then python3 lib/cuda/generate.py; else python3 lib/cuda/generate.py --sm90-fwd-tiles "$v"; fi || { rc=1; continue; }
  ninja -C "$build" flashattn cuda_benchmark >/dev/null || { echo "build failed"; rc=1; continue; }
  # shellcheck disable=SC2086
  "$build/examples/cuda/cuda_benchmark" --fwd --algo flash $bench_args | grep -E '^b[0-9]|shape'
done
exit $rc

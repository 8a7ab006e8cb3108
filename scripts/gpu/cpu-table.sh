#!/usr/bin/env bash
# The CPU backend beside PyTorch's CPU SDPA on the device machine's host (issue #17), in one
# call: a CPU-only Release build with every core, what the CPU is (model, flags that pick the
# ISA paths: avx512_bf16, amx_bf16, amx_tile, avx512_fp16), then bench/compare_cpu.py.
#
#   scripts/gpu/cpu-table.sh [COMPARE_CPU_ARGS...]
#
# Default arguments: --threads 2,all --dtypes bf16,fp32 --dims 64,128 --seqlens 1024,4096
# --repeats 5. Output under $OUT (default ./gpu-out): cpu.txt (lscpu and the ISA flags),
# cpu-table.md, cpu-table.json, cpu-build.log; the table is printed last.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
build=/tmp/bcpu
args=("$@")
if [ ${#args[@]} -eq 0 ]; then
  args=(--threads 2,all --dtypes bf16,fp32 --dims 64,128 --seqlens 1024,4096 --repeats 5)
fi
{
  lscpu
  echo "ISA flags of interest:"
  grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512f|avx512_bf16|avx512_fp16|amx_bf16|amx_tile|amx_fp16|avx2|fma)$' | sort | tr '\n' ' '
  echo
  echo "load average: $(cat /proc/loadavg)"
} > "$out/cpu.txt" 2>&1
if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_ENABLE_CUDA=OFF \
         -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF &&
       cmake --build "$build" -j "$(nproc)"; } > "$out/cpu-build.log" 2>&1; then
  tail -30 "$out/cpu-build.log"
  echo "cpu-table: the CPU-only build failed"
  exit 1
fi
python3 bench/compare_cpu.py --lib "$build/lib/libflashattn.so" --json "$out/cpu-table.json" \
  "${args[@]}" > "$out/cpu-table.md"
rc=$?
tail -3 "$out/cpu.txt"
cat "$out/cpu-table.md"
exit $rc

#!/usr/bin/env bash
# The CPU suite on the amx copy of the kernels (lib/cpu/kernels_amx.cpp) where the CPU has no
# AMX: a CPU-only build with FLASHATTN_CPU_AMX_EMULATION runs the copy's tile instructions in
# software (lib/cpu/amx_tiles.hpp) and picks the copy wherever AVX-512 BF16 is, so its layouts,
# tails, masks and non-finite rules are tested on every run. The copy's other instructions are
# AVX-512 BF16's: on a CPU without those the step says so and passes without running.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# Beside BUILD_DIR (build-amx-emulated/ by default), so that moving BUILD_DIR moves this build too.
build=${FLASHATTN_AMX_BUILD_DIR:-${BUILD_DIR:-$root/build}-amx-emulated}
jobs=${JOBS:-2}

if ! grep -qw avx512_bf16 /proc/cpuinfo; then
  echo "25-amx-emulated: skipped: this CPU has no AVX-512 BF16, which the amx copy runs beside its tiles"
  exit 0
fi
start=$SECONDS
cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DFLASHATTN_ENABLE_CUDA=OFF \
  -DFLASHATTN_CPU_AMX_EMULATION=ON \
  -DFLASHATTN_BUILD_TESTS=ON \
  -DFLASHATTN_BUILD_EXAMPLES=OFF >/dev/null
ninja -C "$build" -j"$jobs" cpu_tests
echo "25-amx-emulated: build took $((SECONDS - start)) s"
start=$SECONDS
FLASHATTN_TEST_EXPECT_CPU_KERNELS=amx "$build/tests/cpu/cpu_tests"
echo "25-amx-emulated: the CPU suite on the amx copy, tiles emulated, took $((SECONDS - start)) s"

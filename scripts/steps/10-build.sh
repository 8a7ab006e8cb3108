#!/usr/bin/env bash
# Configures BUILD_DIR (Ninja, Release; CUDA on when a toolkit is installed, kernels for
# FLASHATTN_CUDA_ARCHS, default "80;90a"; the Python package staged in BUILD_DIR/python for the
# python3 on PATH) and builds everything, or the targets given, on all cores.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-$root/build}

cuda=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then cuda=ON; fi
echo "10-build: $build (CUDA $cuda, archs ${FLASHATTN_CUDA_ARCHS:-80;90a}, $(nproc) jobs)"

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DFLASHATTN_ENABLE_CUDA="$cuda" -DFLASHATTN_CUDA_ARCHS="${FLASHATTN_CUDA_ARCHS:-80;90a}" \
  -DFLASHATTN_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)"
targets=()
[ $# -gt 0 ] && targets=(--target "$@")
cmake --build "$build" -j "$(nproc)" "${targets[@]}"

#!/usr/bin/env bash
# Runs every test that needs no GPU, then the `gpu`-labelled ones: without a usable GPU those
# exit 77 and CTest lists them as skipped, which is not a failure.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-$root/build}

ctest --test-dir "$build" --output-on-failure -j "$(nproc)" --timeout 900 -LE gpu
echo
echo "20-ctest: tests labelled gpu (skipped when there is no GPU)"
ctest --test-dir "$build" --output-on-failure --timeout 900 -L gpu

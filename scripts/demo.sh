#!/usr/bin/env bash
# The demo command: installs what is missing, builds the library (Release; the CUDA backend and
# its kernels whenever a CUDA toolkit is installed, GPU or not) and the demo, then runs
# attention on the GPU when there is one, else on the CPU, flash beside standard.
# Arguments go to the demo (e.g. --seqlen 4096, --causal, --cpu).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

"$root/scripts/install-deps.sh"
export BUILD_DIR=${BUILD_DIR:-$root/build}
bash -euo pipefail "$root/scripts/steps/10-build.sh" flashattn_demo
echo
exec "$BUILD_DIR/examples/flashattn_demo" "$@"

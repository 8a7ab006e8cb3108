#!/usr/bin/env bash
# Python binding: the package that step 10 staged in BUILD_DIR/python (its extension over the
# library built there, CUDA compiled in when a toolkit is there): the pytest suite (numerics
# against numpy float64 on the CPU backend, the bad-input catalogue, torch autograd where torch
# is installed; the GPU file skips without a device, saying why) and the example. Then the
# benchmark scripts' parts that need no GPU: compare_sdpa.py's ctypes layer on the CPU backend,
# plot_peers.py drawing every recorded run, and targets.py reading the latest records (which must
# hold each kind of target). Step 45 tests what `pip install .` makes.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
cd "$root"

cmake --build "$build" --target flashattn_python >/dev/null
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
python3 -m pytest -q -p no:cacheprovider -rs bindings/python/tests
python3 examples/python/attention.py

python3 bench/compare_sdpa.py --lib "$build/lib/libflashattn.so" --selftest-cpu
plots=$(mktemp -d)
trap 'rm -rf "$plots"' EXIT
# Every recorded run with a peers.json is drawn (into a scratch folder): the script must read
# them all.
for run in $(ls docs/perf/h200-*/peers.json docs/perf/h200-*/*/peers.json 2>/dev/null); do
  python3 bench/plot_peers.py "$(dirname "$run")" --out "$plots/$(dirname "$run" | tr / _)"
done
# The targets against the latest records of each kind: every kind checked, nothing unreadable.
targets=$(python3 bench/targets.py --peers docs/perf/h200-2026-12-02/forward/peers-af1f770.json \
  --flex docs/perf/h200-2026-12-02/variants/flex-9556d9d.json)
for kind in forward: backward: "GPT-2 medium" decode: variants:; do
  grep -q "^$kind" <<< "$targets" || { echo "targets.py printed no $kind targets"; exit 1; }
done
tail -1 <<< "$targets"

#!/usr/bin/env bash
# Runs every test that needs no GPU, then the `gpu`-labelled ones: without a usable GPU those
# exit 77 and CTest lists them as skipped, which is not a failure; each skipped test's reason
# (the first line it printed, e.g. "no CUDA device: ...") is printed after CTest's summary.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-$root/build}

ctest --test-dir "$build" --output-on-failure -j "$(nproc)" --timeout 900 -LE gpu
echo
echo "20-ctest: tests labelled gpu (skipped when there is no GPU)"
junit=$build/Testing/gpu-tests.xml
ctest --test-dir "$build" --output-on-failure --timeout 900 -L gpu --output-junit "$junit"
python3 - "$junit" <<'PY'
import sys
import xml.etree.ElementTree as ET

for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    if case.find("skipped") is not None:
        printed = (case.findtext("system-out") or "").strip().splitlines()
        print(f"skipped {case.get('name')}: {printed[0] if printed else 'it printed no reason'}")
PY

#!/usr/bin/env bash
# What `pip install .` makes, as a user gets it: in a new virtual environment (pip fetches the
# build tools and numpy from PyPI), `pip wheel` of this checkout, the wheel installed, then the
# README's Python lines (the block marked <!-- checked: wheel/... -->) and examples/python run
# from a folder outside the checkout with no PYTHONPATH or LD_LIBRARY_PATH: the package must
# carry its own library, and the process must load that one.
# The wheel is CPU-only unless FLASHATTN_WHEEL_CUDA=ON: step 10 compiles and links every CUDA
# kernel with the same CMake code already, and compiling them again here would double the time
# of the whole test command; the wheel's packaging does not depend on the backends in it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
work=$build/wheel
cuda=${FLASHATTN_WHEEL_CUDA:-OFF}
unset PYTHONPATH LD_LIBRARY_PATH

rm -rf "$work"
mkdir -p "$work/dist" "$work/run"
python3 -m venv "$work/venv"
python=$work/venv/bin/python
pip=("$python" -m pip --disable-pip-version-check --quiet)

start=$SECONDS
"${pip[@]}" wheel --no-deps --wheel-dir "$work/dist" \
  --config-settings=cmake.define.FLASHATTN_ENABLE_CUDA="$cuda" "$root"
wheel=$(ls "$work"/dist/flashattn-*.whl)
echo "45-wheel: built $(basename "$wheel") (CUDA $cuda) in $((SECONDS - start)) s"
"${pip[@]}" install "$wheel"

cd "$work/run"
python3 "$root/tests/docs/doc_blocks.py" "$root/README.md" wheel . >/dev/null
"$python" - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
print("45-wheel: the wheel holds", " ".join(sorted(n for n in names if n.startswith("flashattn/"))))
for need in ("flashattn/libflashattn.so.0", "flashattn/flashattn_swig.py"):
    assert need in names, f"{need} is not in the wheel"
PY
"$python" readme.py
"$python" "$root/examples/python/attention.py"
"$python" - <<'PY'
import os
import flashattn
package = os.path.dirname(os.path.realpath(flashattn.__file__))
with open("/proc/self/maps") as maps:
    loaded = {line.split()[-1] for line in maps if "libflashattn" in line}
assert loaded and all(os.path.dirname(os.path.realpath(p)) == package for p in loaded), loaded
print(f"45-wheel: flashattn {flashattn.version()} (CUDA compiled in: {flashattn.has_cuda()}) "
      f"from {package}, its library from there too")
PY

#!/usr/bin/env bash
# Python binding: pip-installs bindings/python (SWIG runs during the build) into a folder of the
# build rather than the system, then runs its pytest suite (numerics against numpy float64 on the
# CPU backend, the bad-input catalogue, torch autograd where torch is installed; the GPU file skips
# without a device) and the example.
set -euo pipefail
cd "$(dirname "$0")/../.."
. bindings/env.sh

site="$FLASHATTN_BINDINGS_OUT/python"
rm -rf "$site"
# Building in the current environment needs setuptools and wheel there; without them pip sets up
# an isolated build environment from the package index instead.
isolation=--no-build-isolation
python3 -c 'import setuptools, wheel' 2>/dev/null || isolation=
PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps $isolation \
  --target "$site" ./bindings/python

export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
python3 -m pytest -q -p no:cacheprovider -rs bindings/python/tests
python3 examples/python/attention.py

#!/usr/bin/env bash
# Installs what building and testing flashattn needs, and only what is missing: Debian packages
# through apt-get (as root, sudo when not root; never a prompt), Python modules through pip.
# Safe to run again: with everything present it changes nothing.
set -euo pipefail

# The one list of Debian packages. Add new needs here.
APT_PACKAGES=(
  cmake ninja-build g++ clang pkg-config   # build
  doctest-dev valgrind                     # tests
  swig golang-go                           # Python and Go bindings
  bindgen libclang-dev                     # Rust bindings (bindgen needs libclang)
)
# Python modules (import name = pip name).
PIP_PACKAGES=(numpy pytest matplotlib)  # matplotlib: bench/plot_peers.py, checked in step 40

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo -n "$@"
  else
    echo "install-deps: need root (or sudo) to run: $*" >&2
    return 1
  fi
}

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  installed "$p" || missing+=("$p")
done
# Rust: a rustup toolchain on PATH (or in ~/.cargo/bin) is as good as Debian's.
if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  for p in cargo rustc; do installed "$p" || missing+=("$p"); done
fi
# Python: the python3 on PATH needs its headers (for the bindings) and pip.
if ! command -v python3 >/dev/null 2>&1; then
  missing+=(python3 python3-dev python3-pip python3-venv)
else
  if ! python3 - <<'PY' 2>/dev/null
import os, sysconfig, sys
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)
PY
  then
    installed python3-dev || missing+=(python3-dev)
  fi
  python3 -m pip --version >/dev/null 2>&1 || { installed python3-pip || missing+=(python3-pip); }
  # Virtual environments (the wheel and install checks make new ones): Debian's python3 has
  # ensurepip only with python3-venv.
  python3 -c 'import ensurepip, venv' 2>/dev/null || { installed python3-venv || missing+=(python3-venv); }
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

missing_py=()
for m in "${PIP_PACKAGES[@]}"; do
  python3 -c "import $m" 2>/dev/null || missing_py+=("$m")
done
if [ ${#missing_py[@]} -gt 0 ]; then
  echo "install-deps: pip installing ${missing_py[*]}"
  # A Debian system python refuses pip without --break-system-packages (PEP 668).
  python3 -m pip install -q "${missing_py[@]}" ||
    python3 -m pip install -q --break-system-packages "${missing_py[@]}"
fi

if [ ${#missing[@]} -eq 0 ] && [ ${#missing_py[@]} -eq 0 ]; then
  echo "install-deps: everything is present"
fi

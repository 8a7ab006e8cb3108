#!/usr/bin/env bash
# A user's install, as the README says it: `cmake --install` of BUILD_DIR into a new prefix, then
# for C, CMake, Go, Rust and Python the README's lines for a prefix (the blocks marked
# <!-- checked: NAME -->) run as written, each in a new folder and a clean environment that holds
# only PREFIX (the prefix) and FLASHATTN (this checkout) besides PATH and HOME: the lines must set
# everything else themselves. Python's run in a new virtual environment; Go's get a build cache
# of their own (GOCACHE: see 50-go.sh). (45-wheel checks the `pip install .` lines.)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
work=$build/install-check
checks=(c cmake go rust python)

rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
echo "80-install: installed to $prefix"

status=0
for check in "${checks[@]}"; do
  dir=$work/$check
  mkdir -p "$dir"
  path=$PATH
  if [ "$check" = python ]; then
    python3 -m venv "$dir/venv"
    path=$dir/venv/bin:$PATH
  fi
  start=$SECONDS
  script=$(cd "$dir" && python3 "$root/tests/docs/doc_blocks.py" "$root/README.md" "$check" .)
  if (cd "$dir" && env -i PATH="$path" HOME="$HOME" GOCACHE="$dir/go-cache" PREFIX="$prefix" \
        FLASHATTN="$root" bash -euo pipefail -c "$script") >"$dir/log" 2>&1; then
    echo "80-install: $check ok ($((SECONDS - start)) s): $(tail -n 1 "$dir/log")"
  else
    echo "80-install: $check FAILED ($((SECONDS - start)) s); the lines, then their output:" >&2
    echo "$script" | sed 's/^/  | /' >&2
    cat "$dir/log" >&2
    status=1
  fi
done
exit $status

#!/usr/bin/env bash
# Regenerates capi/capi.go and capi/capi_wrap.c from capi/capi.i (which includes the shared
# bindings/flashattn.i) by running swig as the Go toolchain would (-go -cgo -intgosize 64).
# With --check, changes nothing and fails when the checked-in files differ from what swig makes.
# Needs swig and the headers of an installed libflashattn: FLASHATTN_INCLUDEDIR, or else
# `pkg-config --variable=includedir flashattn`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
inc=${FLASHATTN_INCLUDEDIR:-$(pkg-config --variable=includedir flashattn)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
(cd "$here/capi" && swig -go -cgo -intgosize 64 -I"$inc" -outdir "$out" -o "$out/capi_wrap.c" capi.i)
if [ "${1:-}" = "--check" ]; then
  status=0
  for f in capi.go capi_wrap.c; do
    if ! diff -u "$here/capi/$f" "$out/$f" >"$out/$f.diff"; then
      echo "bindings/go/capi/$f is not what bindings/go/generate.sh makes (run it and commit):" >&2
      head -n 40 "$out/$f.diff" >&2
      status=1
    fi
  done
  exit $status
fi
cp "$out/capi.go" "$out/capi_wrap.c" "$here/capi/"

#!/usr/bin/env bash
# Regenerates src/bindings.rs from include/flashattn/flashattn.h with bindgen (the CLI), limited
# to flashattn_* / FLASHATTN_*. FLASHATTN_HAS_CUDA is left out: it depends on how the library was
# built (callers ask flashattn_has_cuda()). With --check, changes nothing and fails when the
# checked-in file differs from what bindgen makes. version.h comes from an installed or built
# library: FLASHATTN_INCLUDEDIR, or else `pkg-config --variable=includedir flashattn`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
inc=${FLASHATTN_INCLUDEDIR:-$(pkg-config --variable=includedir flashattn)}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
(cd "$repo" && bindgen include/flashattn/flashattn.h \
  --allowlist-function 'flashattn_.*' --allowlist-type 'flashattn_.*' --allowlist-var 'FLASHATTN_.*' \
  --blocklist-item FLASHATTN_HAS_CUDA --size_t-is-usize \
  -- -I include -I "$inc") >"$out"
if [ "${1:-}" = "--check" ]; then
  if ! diff -u "$here/src/bindings.rs" "$out"; then
    echo "bindings/rust/flashattn-sys/src/bindings.rs is not what generate.sh makes (run it and commit)" >&2
    exit 1
  fi
  exit 0
fi
cp "$out" "$here/src/bindings.rs"

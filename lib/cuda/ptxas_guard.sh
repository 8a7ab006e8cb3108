#!/usr/bin/env bash
# The CUDA compiler launcher of the library's own sources: runs one compile as CMake gives it
# and fails it when ptxas reports that it serialized a kernel's wgmma instructions (C7520, a
# warpgroup wait it had to insert in a divergent path). Such a kernel still computes the right
# result, so no test would notice; it runs at a fraction of its speed (the Hopper forward at
# 458 TFLOP/s instead of 690, H200).
log=$(mktemp "${TMPDIR:-/tmp}/flashattn-ptxas.XXXXXX") || exit 1
"$@" 2>"$log"
rc=$?
cat "$log" >&2
if [ "$rc" -eq 0 ] && grep -q "C7520" "$log"; then
  echo "error: ptxas serialized the wgmma instructions of a kernel (C7520 above): a branch the" \
       "compiler cannot prove uniform across a warpgroup sits between its GEMMs" >&2
  rc=1
fi
rm -f "$log"
exit "$rc"

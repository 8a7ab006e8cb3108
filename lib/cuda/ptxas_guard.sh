#!/usr/bin/env bash
# The CUDA compiler launcher of the library's own sources: runs one compile as CMake gives it
# and fails it when ptxas reports that it serialized a kernel's wgmma instructions. Such a
# kernel still computes the right result, so no test would notice; it runs at a fraction of its
# speed (the Hopper forward at 458 TFLOP/s instead of 690, H200). ptxas says so in two ways:
#   C7520  a warpgroup wait it had to insert in a divergent path (a branch it cannot prove
#          uniform across a warpgroup between the GEMMs);
#   C7515  "non wgmma instructions defining accumulator registers" while a group may still run
#          (a group in flight across a branch join, or an accumulator written by plain code
#          before the group that uses it was waited for): every wgmma of the kernel waited for.
log=$(mktemp "${TMPDIR:-/tmp}/flashattn-ptxas.XXXXXX") || exit 1
"$@" 2>"$log"
rc=$?
cat "$log" >&2
if [ "$rc" -eq 0 ] && grep -q "C7520" "$log"; then
  echo "error: ptxas serialized the wgmma instructions of a kernel (C7520 above): a branch the" \
       "compiler cannot prove uniform across a warpgroup sits between its GEMMs" >&2
  rc=1
fi
if [ "$rc" -eq 0 ] && grep -q "C7515" "$log"; then
  echo "error: ptxas serialized the wgmma instructions of a kernel (C7515 above): plain code" \
       "writes an accumulator register while a wgmma group may still be running" >&2
  rc=1
fi
rm -f "$log"
exit "$rc"

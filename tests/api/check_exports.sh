#!/usr/bin/env bash
# check_exports.sh LIBRARY MAJOR
# The shared library exports flashattn_* and nothing else, is named libflashattn.so.MAJOR
# (SONAME), and does not need the CUDA driver to load (libcuda is opened lazily, if at all).
set -euo pipefail
lib=$1
major=$2
status=0

symbols=$(nm -D --defined-only "$lib" | awk 'NF >= 3 { print $3 }')
[ -n "$symbols" ] || { echo "FAIL: $lib exports no symbol at all"; exit 1; }
stray=$(printf '%s\n' "$symbols" | grep -v '^flashattn_' || true)
if [ -n "$stray" ]; then
  echo "FAIL: symbols exported besides flashattn_*:"
  printf '  %s\n' $stray
  status=1
fi
echo "exported: $(printf '%s\n' "$symbols" | wc -l) symbols, all flashattn_*"

soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
if [ "$soname" != "libflashattn.so.$major" ]; then
  echo "FAIL: SONAME is '$soname', expected libflashattn.so.$major"
  status=1
else
  echo "SONAME: $soname"
fi

needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "NEEDED: $(echo $needed)"
if printf '%s\n' "$needed" | grep -q '^libcuda\.so'; then
  echo "FAIL: libcuda is a load-time dependency; the library must load on a machine without a GPU driver"
  status=1
fi
exit $status

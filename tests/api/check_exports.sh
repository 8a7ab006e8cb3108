#!/usr/bin/env bash
# check_exports.sh LIBRARY MAJOR
# The shared library exports flashattn_* and nothing else, is named libflashattn.so.MAJOR
# (SONAME), and loads without any CUDA library installed: the driver (libcuda) is opened by the
# statically linked runtime on first use, cuBLAS is dlopen'ed when a CUDA context is created.
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
cuda_needed=$(printf '%s\n' "$needed" | grep -E '^lib(cuda|cudart|cublas|cublasLt)\.so' || true)
if [ -n "$cuda_needed" ]; then
  echo "FAIL: load-time dependencies on $(echo $cuda_needed); the library must load on a machine" \
    "without a GPU driver or CUDA libraries"
  status=1
fi
exit $status

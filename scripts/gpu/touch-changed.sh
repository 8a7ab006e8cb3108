#!/usr/bin/env bash
# Before an incremental build on the GPU machine: touches every source file whose content is not
# what the build folder last saw, so that ninja rebuilds what depends on it.
#
#   scripts/gpu/touch-changed.sh BUILD_DIR
#
# Why: each device call sends the tree with its files' own timestamps, while a warm machine keeps
# its build folders. A file that an earlier call changed (a patch applied for an A/B) and that
# this call sends back as it was carries an older timestamp than the objects built from the
# changed version, so ninja would keep those objects (kernel log, run 124: a peers call timed a
# forward kernel built from the previous call's patch). The build folder keeps a checksum per
# file (.source-md5); a file whose checksum differs, or that is new, is touched.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:?usage: touch-changed.sh BUILD_DIR}
case "$build" in /*) ;; *) build=$root/$build ;; esac
mkdir -p "$build"
record=$build/.source-md5
cd "$root" || exit 1
now=$(mktemp)
find lib include tests examples bench cmake CMakeLists.txt -type f \
  \( -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.hpp' -o -name '*.c' \
     -o -name '*.cpp' -o -name '*.inc' -o -name '*.cmake' -o -name 'CMakeLists.txt' \
     -o -name '*.in' -o -name '*.sh' -o -name '*.py' \) -print0 2>/dev/null |
  sort -z | xargs -0 md5sum > "$now"
touched=0
if [ -f "$record" ]; then
  # Lines of now that the record lacks: files new or changed since the last build.
  while read -r _ file; do
    touch "$file" && touched=$((touched + 1))
  done < <(comm -13 <(sort "$record") <(sort "$now"))
fi
mv "$now" "$record"
[ "$touched" -gt 0 ] && echo "touch-changed: $touched files differ from what $build last saw: touched"
exit 0

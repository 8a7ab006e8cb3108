#!/usr/bin/env bash
# check_readme.sh README CC INCLUDE_DIRS... -- LIBDIR [CFLAGS...]
# The README's C example (its first ```c block) compiles as strict C99, links and runs.
set -euo pipefail
readme=$1 cc=$2
shift 2
includes=()
while [ "$1" != "--" ]; do includes+=("-I$1"); shift; done
shift
libdir=$1
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
awk '/^```c$/ { on = 1; next } on && /^```/ { exit } on { print }' "$readme" > "$work/readme.c"
[ -s "$work/readme.c" ] || { echo "FAIL: no \`\`\`c block in $readme"; exit 1; }
echo "README example: $(wc -l < "$work/readme.c") lines"
"$cc" -std=c99 -pedantic -Wall -Wextra -Werror "${includes[@]}" "$work/readme.c" \
  -o "$work/readme" -L"$libdir" -lflashattn "$@"
LD_LIBRARY_PATH=$libdir "$work/readme"

#!/usr/bin/env bash
# check_install.sh BUILD_DIR SOURCE_DIR WORK_DIR CC VERSION [EXTRA_CFLAGS]
# Installs the build into a fresh prefix, then builds every examples/c/*.c the way a user would,
# with nothing but `cc $(pkg-config --cflags --libs flashattn)`, and runs it against the
# installed library. Also checks what was installed, and that a CMake project finds the package.
set -euo pipefail
build=$1 src=$2 work=$3 cc=$4 version=$5 extra_cflags=${6:-}
major=${version%%.*}
prefix=$work/prefix
rm -rf "$work"
mkdir -p "$work"

cmake --install "$build" --prefix "$prefix" > "$work/install.log"

fail() { echo "FAIL: $*"; exit 1; }
[ -f "$prefix/include/flashattn/flashattn.h" ] || fail "flashattn.h not installed"
[ -f "$prefix/include/flashattn/version.h" ] || fail "version.h not installed"
# GNUInstallDirs may choose lib, lib64 or lib/<multiarch>.
pcdir=$(ls -d "$prefix"/lib*/pkgconfig "$prefix"/lib/*/pkgconfig 2>/dev/null | head -n 1 || true)
[ -n "$pcdir" ] && [ -f "$pcdir/flashattn.pc" ] || fail "flashattn.pc not installed under $prefix/lib*"
libdir=$(dirname "$pcdir")
for f in libflashattn.so libflashattn.so.$major libflashattn.so.$version; do
  [ -e "$libdir/$f" ] || fail "$libdir/$f not installed"
done
echo "installed: $(cd "$prefix" && find . -type f -o -type l | sort | tr '\n' ' ')"

export PKG_CONFIG_PATH=$pcdir
[ "$(pkg-config --modversion flashattn)" = "$version" ] ||
  fail "pkg-config --modversion says $(pkg-config --modversion flashattn), expected $version"
flags=$(pkg-config --cflags --libs flashattn)
echo "pkg-config --cflags --libs flashattn: $flags"
case " $flags " in
  *" -I$prefix/include "*) ;;
  *) fail "the .pc file does not point at the prefix it was installed to ($prefix)" ;;
esac

# Sanitizer flags of a sanitized build, ';'-separated as CMake passes a list.
IFS=';' read -r -a extra <<< "$extra_cflags"
n=0
for example in "$src"/examples/c/*.c; do
  name=$(basename "$example" .c)
  # shellcheck disable=SC2086  # pkg-config output is a list of flags
  "$cc" -std=c99 -pedantic -Wall -Wextra -Werror "$example" -o "$work/$name" $flags -lm "${extra[@]}"
  LD_LIBRARY_PATH=$libdir "$work/$name"
  # The program ran against the installed library, not the build tree's.
  resolved=$(LD_LIBRARY_PATH=$libdir ldd "$work/$name" | awk '/libflashattn/ { print $3 }')
  [ "$(readlink -f "$resolved")" = "$(readlink -f "$libdir/libflashattn.so.$major")" ] ||
    fail "$name resolved libflashattn to $resolved"
  n=$((n + 1))
done
[ $n -gt 0 ] || fail "no example found in $src/examples/c"

# The CMake package: find_package(flashattn MAJOR.MINOR) and link flashattn::flashattn.
[ -f "$libdir/cmake/flashattn/flashattnConfigVersion.cmake" ] || fail "no flashattnConfigVersion.cmake"
major_minor=${version%.*}
consumer=$work/consumer
mkdir -p "$consumer"
cat > "$consumer/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.16)
project(consumer C)
# The version file is read: the next major version is not this one.
find_package(flashattn $((major + 1)) QUIET CONFIG)
if(flashattn_FOUND)
  message(FATAL_ERROR "find_package(flashattn $((major + 1))) accepted version \${flashattn_VERSION}")
endif()
find_package(flashattn $major_minor REQUIRED CONFIG)
add_executable(consumer "$src/examples/c/attention.c")
target_link_libraries(consumer PRIVATE flashattn::flashattn m)
CMAKE
cflags="${extra[*]}"  # also passed to the link: the sanitizer runtimes
cmake -S "$consumer" -B "$consumer/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_C_FLAGS="$cflags" > "$work/consumer.log" 2>&1 || { cat "$work/consumer.log"; fail "find_package(flashattn) failed"; }
cmake --build "$consumer/build" >> "$work/consumer.log" 2>&1 || { cat "$work/consumer.log"; fail "building against flashattn::flashattn failed"; }
LD_LIBRARY_PATH=$libdir "$consumer/build/consumer" > /dev/null || fail "the CMake consumer failed"
echo "find_package(flashattn $major_minor) + flashattn::flashattn: ok"
echo "install check: ok ($n example(s) built with pkg-config from $prefix)"

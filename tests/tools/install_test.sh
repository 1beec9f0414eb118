#!/usr/bin/env bash
# install_test.sh BUILD_DIR: `cmake --install` puts exactly what design §2 promises under a
# prefix (libkvshim.so, the kvshim tool, the public headers kvshim/kvshim.h and kvshim/kvo.h, the
# CMake package and kvshim.pc) and nothing else; both headers compile on their own as strict C11
# and C++; pkg-config and find_package(kvshim) find them; the header's version is the tool's.
set -uo pipefail
B=${1:?usage: install_test.sh BUILD_DIR}
T=$(mktemp -d "${TMPDIR:-/tmp}/kvshim-install.XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

cmake --install "$B" --prefix "$T/p" >"$T/install.log" 2>&1 || { cat "$T/install.log"; echo "FAIL: cmake --install"; exit 1; }
pc=$(cd "$T/p" && find . -name kvshim.pc | sed "s|^\./||")
libdir=${pc%/pkgconfig/kvshim.pc}
(cd "$T/p" && find . -type f -o -type l | sed 's|^\./||' | sort) >"$T/got"
sort >"$T/want" <<LIST
bin/kvshim
include/kvshim/kvo.h
include/kvshim/kvshim.h
$libdir/cmake/kvshim/kvshimConfig.cmake
$libdir/cmake/kvshim/kvshimConfigVersion.cmake
$libdir/cmake/kvshim/kvshimTargets.cmake
$libdir/libkvshim.so
$libdir/pkgconfig/kvshim.pc
LIST
diff -u "$T/want" "$T/got" >"$T/diff" || fail "installed files differ from the promise: $(cat "$T/diff")"

# Each public header on its own, strict: it must need nothing but itself.
for h in kvshim.h kvo.h; do
  printf '#include <kvshim/%s>\nint main(void) { return 0; }\n' "$h" >"$T/one.c"
  cc -std=c11 -pedantic -Wall -Wextra -Werror -I"$T/p/include" "$T/one.c" -o "$T/one" 2>"$T/cc.err" ||
    fail "kvshim/$h alone does not compile as C11: $(head -c 400 "$T/cc.err")"
  if command -v c++ >/dev/null; then
    cp "$T/one.c" "$T/one.cc"
    c++ -std=c++11 -Wall -Wextra -Werror -I"$T/p/include" "$T/one.cc" -o "$T/one" 2>"$T/cc.err" ||
      fail "kvshim/$h alone does not compile as C++: $(head -c 400 "$T/cc.err")"
  fi
done

# pkg-config gives the include directory; the header's version is the installed tool's.
cflags=$(PKG_CONFIG_PATH="$T/p/$libdir/pkgconfig" pkg-config --cflags kvshim 2>"$T/pc.err") ||
  fail "pkg-config --cflags kvshim: $(cat "$T/pc.err")"
cat >"$T/ver.c" <<'C'
#include <stdio.h>
#include <kvshim/kvshim.h>
#include <kvshim/kvo.h>
int main(void) { printf("kvshim %s\n", KVSHIM_VERSION_STRING); return KVSHIM_VERSION_NUMBER < 1; }
C
# shellcheck disable=SC2086
if cc -std=c11 $cflags "$T/ver.c" -o "$T/ver" 2>"$T/cc.err"; then
  "$T/ver" >"$T/ver.out" || fail "KVSHIM_VERSION_NUMBER < 1"
  "$T/p/bin/kvshim" --version >"$T/tool.out" || fail "installed kvshim --version exited $?"
  cmp -s "$T/ver.out" "$T/tool.out" ||
    fail "header says '$(cat "$T/ver.out")', the tool '$(cat "$T/tool.out")'"
else
  fail "a program with pkg-config's flags does not compile: $(head -c 400 "$T/cc.err")"
fi
pc_version=$(PKG_CONFIG_PATH="$T/p/$libdir/pkgconfig" pkg-config --modversion kvshim)
grep -qx "kvshim $pc_version" "$T/tool.out" 2>/dev/null || fail "kvshim.pc version '$pc_version' is not the tool's"

# find_package(kvshim) gives kvshim::headers.
mkdir -p "$T/app"
cp "$T/ver.c" "$T/app/ver.c"
cat >"$T/app/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(app C)
find_package(kvshim REQUIRED)
add_executable(ver ver.c)
target_link_libraries(ver PRIVATE kvshim::headers)
CM
if cmake -S "$T/app" -B "$T/app/b" -DCMAKE_PREFIX_PATH="$T/p" >"$T/app.log" 2>&1 &&
   cmake --build "$T/app/b" >>"$T/app.log" 2>&1; then
  "$T/app/b/ver" | cmp -s - "$T/tool.out" || fail "find_package build prints another version"
else
  fail "find_package(kvshim) project: $(tail -n 20 "$T/app.log")"
fi

if [ "$fails" -ne 0 ]; then echo "install_test: $fails failure(s)"; exit 1; fi
echo "install_test: all passed"

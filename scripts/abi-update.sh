#!/bin/sh
# SPDX-License-Identifier: MIT
# Writes the ABI dump of libpinbroker that the abi_check test (tests/lint/check-abi.sh) compares every build
# against: abi/<SONAME>.abi, made by libabigail's abidw from a RelWithDebInfo build (the types come from its
# DWARF). Run it after an intended change of the library's interface and commit the dump with the change;
# docs/hacking.md says when such a change also bumps the SONAME.
#
# usage: scripts/abi-update.sh [BUILD_DIR]     build libpinbroker in BUILD_DIR (default build-abi) and write
#                                              abi/<its SONAME>.abi
#        scripts/abi-update.sh --dump LIB OUT  only write LIB's dump to OUT (what the test does with the build's)
# needs: abigail-tools (abidw), binutils (readelf); scripts/deps.sh --test installs them.
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)

# One dump, the same options for the committed file and the test's: the interface of pinbroker.h's types only
# (--headers-dir, --drop-private-types), without anything that depends on the build tree or the toolchain's
# libraries (paths, locations, DT_NEEDED: a sanitizer build needs libasan, which is no ABI change). Paths
# that remain (each translation unit's) are made relative to the source tree, so the file is the same from
# any checkout.
dump() {
	lib=$1 out=$2
	command -v abidw >/dev/null || { echo "abi-update.sh: abidw not found (apt-get install abigail-tools)" >&2; exit 2; }
	abidw --no-corpus-path --no-comp-dir-path --no-show-locs --no-elf-needed --no-architecture \
		--type-id-style hash --headers-dir "$SRC/client/lib" --drop-private-types --out-file "$out.tmp" "$lib"
	bdir=$(cd "$(dirname "$lib")/.." && pwd)
	sed -e "s|path='$bdir/|path='BUILD/|" -e "s|path='$SRC/|path='|" "$out.tmp" >"$out"
	rm -f "$out.tmp"
}

if [ "${1:-}" = --dump ]; then
	[ $# = 3 ] || { echo "usage: $0 --dump LIB OUT" >&2; exit 2; }
	dump "$2" "$3"
	exit 0
fi

B=$(realpath -m "${1:-$SRC/build-abi}")
# RelWithDebInfo: -g, so abidw sees the types; no tests, nothing but the library.
cmake -S "$SRC" -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF -DPINBROKER_GPU_TESTS=OFF \
	-DPINBROKER_SANITIZE=OFF -DPINBROKER_TORCH_EXT=OFF >/dev/null
cmake --build "$B" -j"$(nproc)" --target pinbroker >/dev/null
soname=$(readelf -d "$B/client/libpinbroker.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ -n "$soname" ] || { echo "abi-update.sh: $B/client/libpinbroker.so has no SONAME" >&2; exit 1; }
mkdir -p "$SRC/abi"
dump "$B/client/$soname" "$SRC/abi/$soname.abi"
echo "wrote abi/$soname.abi ($(grep -c "<elf-symbol name=" "$SRC/abi/$soname.abi") symbols): commit it with the change"
# The Debian symbols file lists the same symbols (ctest symbols_check compares them): name what it lacks.
syms=$SRC/debian/lib$(echo "$soname" | sed 's/^lib\(.*\)\.so\.\([0-9]*\)$/\1\2/').symbols
sed -n "s/.*<elf-symbol name='\([^']*\)' version='\([^']*\)'.*/\1@\2/p" "$SRC/abi/$soname.abi" | while read -r s; do
	grep -q "^ $s " "$syms" 2>/dev/null ||
		echo "add to ${syms#"$SRC"/}: ' $s VERSION' (VERSION: debian/changelog's next upstream version)"
done

#!/bin/sh
# SPDX-License-Identifier: MIT
# The abi_check test (label lint): the built libpinbroker against the ABI dump committed for its SONAME
# (abi/<SONAME>.abi), with libabigail's abidiff, as Debian's library packages are checked. Any difference
# fails: an incompatible one (a struct that grew, a changed return type, a removed function) needs a SONAME
# bump, a compatible one (an added function) still needs the dump refreshed, so that the next change is
# measured from the interface that shipped. Either way scripts/abi-update.sh writes the new dump.
# usage: check-abi.sh SOURCE_DIR LIBRARY   (LIBRARY: the build's libpinbroker.so, built with -g)
# Exits 0 when the ABI is the dump's, 1 when it differs, 77 (skip) without abidiff or debug info.
set -u
SRC=$1 LIB=$2
for t in abidw abidiff; do
	command -v $t >/dev/null || { echo "SKIP: $t not found (apt-get install abigail-tools; scripts/deps.sh --test)"; exit 77; }
done
command -v readelf >/dev/null || { echo "SKIP: readelf not found (apt-get install binutils)"; exit 77; }
# Without DWARF abidw sees symbols only, not the types whose layout is the point.
if ! readelf -S "$LIB" | grep -q '\.debug_info'; then
	echo "SKIP: $LIB has no debug info: configure with -DCMAKE_BUILD_TYPE=RelWithDebInfo (or Debug) to check its ABI"
	exit 77
fi
soname=$(readelf -d "$LIB" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
DUMP=$SRC/abi/$soname.abi
if [ ! -f "$DUMP" ]; then
	echo "FAIL: no ABI dump for $soname (abi/$soname.abi): after a SONAME bump, write it with scripts/abi-update.sh" \
		"and commit it (docs/hacking.md, \"The library's ABI\")"
	exit 1
fi
tmp=$(mktemp -d /tmp/pb-abi.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
sh "$SRC/scripts/abi-update.sh" --dump "$LIB" "$tmp/built.abi" || { echo "FAIL: abidw could not read $LIB"; exit 1; }
abidiff "$DUMP" "$tmp/built.abi" >"$tmp/diff.txt" 2>&1
rc=$?
cat "$tmp/diff.txt"
# abidiff's exit status is a bit field: 1 error, 2 usage error, 4 ABI change, 8 incompatible ABI change.
if [ $rc = 0 ]; then
	echo "ok: $soname's ABI is abi/$soname.abi's ($(grep -c '<elf-symbol name=' "$DUMP") symbols)"
	exit 0
elif [ $((rc & 3)) != 0 ]; then
	echo "FAIL: abidiff failed (exit $rc)"
elif [ $((rc & 8)) != 0 ]; then
	echo "FAIL: an INCOMPATIBLE change of $soname's ABI against abi/$soname.abi (above). Programs built against the"
	echo "  old pinbroker.h would misbehave: keep the old layout, or bump the SONAME (PINBROKER_SOVERSION in"
	echo "  client/lib/CMakeLists.txt, the libpinbroker<N> package in debian/) and then run scripts/abi-update.sh."
else
	echo "FAIL: a change of $soname's ABI against abi/$soname.abi (above) that abidiff rates compatible (exit $rc)."
	echo "  Added functions are. A struct grown at its end is rated so too, but is NOT compatible where programs"
	echo "  allocate it or index arrays of it (pb_lease_info, pb_client_info in pb_status): then bump the SONAME"
	echo "  (docs/hacking.md). If the change is intended, run scripts/abi-update.sh and commit abi/$soname.abi."
fi
exit 1

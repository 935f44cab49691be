#!/bin/sh
# SPDX-License-Identifier: MIT
# The symbols_check test (labels lint, abi, package): debian/libpinbroker1.symbols, the Debian symbols file
# dpkg-gensymbols checks the library package against (debian/rules: dh_makeshlibs -- -c4, any difference
# fails the package build), against the built libpinbroker and the committed ABI dump (abi/<SONAME>.abi).
#  - every pb_* symbol the library exports is listed (one added without updating the file fails);
#  - every listed symbol is exported (one removed fails: that is a SONAME bump), except one pinbroker.h
#    declares that no source defines yet, which is reported as pending (a call another change is adding);
#  - every symbol of the ABI dump is listed (scripts/abi-update.sh and this file agree);
#  - dpkg-gensymbols -c4, where installed, finds the file and the library equal (its syntax, versions).
# usage: check-symbols.sh SOURCE_DIR LIBRARY   (LIBRARY: the build's libpinbroker.so)
# Exits 0 when they agree, 1 when not, 77 (skip) without nm.
set -u
SRC=$1 LIB=$2
SYMS=$SRC/debian/libpinbroker1.symbols
command -v nm >/dev/null || { echo "SKIP: nm not found (apt-get install binutils)"; exit 77; }
tmp=$(mktemp -d /tmp/pb-symbols.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# NAME@VERSION of each defined dynamic symbol (nm -D writes NAME@@VERSION for a default version).
nm -D --defined-only "$LIB" | awk '$2 != "A" { sub(/@@/, "@", $3); print $3 }' | grep '^pb_' | sort -u >"$tmp/exported"
[ -s "$tmp/exported" ] || { echo "FAIL: nm -D found no pb_ symbol in $LIB"; exit 1; }
sed -n 's/^ \([^ ]*\) .*/\1/p' "$SYMS" | grep '^pb_' | sort -u >"$tmp/listed"
# The functions pinbroker.h declares: a line that starts a declaration (not a comment) naming pb_x(.
sed -n 's/^[a-z].*[ *]\(pb_[a-z0-9_]*\)(.*/\1/p' "$SRC/client/lib/pinbroker.h" | sort -u >"$tmp/declared"
sed -n "s/.*<elf-symbol name='\([^']*\)' version='\([^']*\)'.*/\1@\2/p" "$SRC"/abi/libpinbroker.so.*.abi | sort -u >"$tmp/abi"

for s in $(comm -23 "$tmp/exported" "$tmp/listed"); do
	bad "$s is exported by $LIB but not listed in debian/libpinbroker1.symbols: add the line ' $s VERSION'" \
		"(VERSION: the first release that has it, debian/changelog's next) with the change that added it"
done
for s in $(comm -13 "$tmp/exported" "$tmp/listed"); do
	if grep -qx "${s%@*}" "$tmp/declared"; then
		echo "pending: $s is listed and pinbroker.h declares it, but no source defines it yet"
		echo "$s" >>"$tmp/pending"
	else
		bad "$s is listed in debian/libpinbroker1.symbols but $LIB no longer exports it, nor does pinbroker.h" \
			"declare it: removing a symbol breaks every program that uses it (bump the SONAME: docs/hacking.md)"
	fi
done
for s in $(comm -23 "$tmp/abi" "$tmp/listed"); do
	bad "$s is in the ABI dump (abi/) but not in debian/libpinbroker1.symbols: update both together" \
		"(scripts/abi-update.sh writes the dump)"
done

if command -v dpkg-gensymbols >/dev/null; then
	# The file as the package build would read it, less the pending lines (their library is not built yet).
	if [ -s "$tmp/pending" ]; then
		grep -v -F -f "$tmp/pending" "$SYMS" >"$tmp/libpinbroker1.symbols"
	else
		cp "$SYMS" "$tmp/libpinbroker1.symbols"
	fi
	mkdir -p "$tmp/pkg/DEBIAN"
	if (cd "$SRC" && dpkg-gensymbols -plibpinbroker1 -v0.2.0-1 -P"$tmp/pkg" -e"$LIB" -I"$tmp/libpinbroker1.symbols" \
		-O"$tmp/out.symbols" -c4) >"$tmp/gensymbols.log" 2>&1; then
		echo "ok: dpkg-gensymbols -c4 finds debian/libpinbroker1.symbols and $LIB equal"
	else
		cat "$tmp/gensymbols.log"
		bad "dpkg-gensymbols -c4 (what the package build runs) rejects debian/libpinbroker1.symbols against $LIB"
	fi
else
	echo "note: dpkg-gensymbols not found (apt-get install dpkg-dev): the package build's own check not run here"
fi
[ $fail = 0 ] && echo "ok: debian/libpinbroker1.symbols lists the $(wc -l <"$tmp/exported") exported pb_ symbols" \
	"and the ABI dump's $(wc -l <"$tmp/abi")"
exit $fail

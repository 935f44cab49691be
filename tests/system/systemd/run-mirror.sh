#!/bin/bash
# SPDX-License-Identifier: MIT
# nspawn_mirror (tests/system/lib/nspawn-lib.sh) on fixture apt configurations: the mirror comes from apt's own
# configuration (deb822 .sources and one-line sources.list), never from a host named in this tree, and a
# configuration without one gives no mirror (the caller then fails and says to set PINBROKER_NSPAWN_MIRROR).
set -u
SRC=$(cd "$(dirname "$0")/../../.." && pwd)
# shellcheck source=tests/system/lib/nspawn-lib.sh
. "$SRC/tests/system/lib/nspawn-lib.sh"
T=$(mktemp -d /tmp/pbmirror.XXXXXX)
trap 'rm -rf "$T"' EXIT
n=0
bad=0
expect() { # NAME WANT (empty: none)
	local got rc=0
	got=$(nspawn_mirror "$T/$1") || rc=$?
	n=$((n + 1))
	# A mirror with status 0, or none with a failing status.
	if [ "$got" = "$2" ] && { [ -n "$2" ] && [ $rc = 0 ]; } || { [ -z "$got$2" ] && [ $rc != 0 ]; }; then
		echo "ok - $1: ${2:-no mirror}"
	else
		echo "not ok - $1: want '${2:-no mirror}', got '$got' (status $rc)"
		bad=$((bad + 1))
	fi
}
mk() { mkdir -p "$T/$1/sources.list.d"; }

# deb822: the bookworm stanza, not -security, with a comment line inside.
mk deb822
cat >"$T/deb822/sources.list.d/debian.sources" <<'X'
Types: deb
URIs: http://sec.mirror.test/debian-security
Suites: bookworm-security
Components: main

Types: deb
# a snapshot, commented out
URIs: http://mirror.test/debian
Suites: bookworm bookworm-updates
Components: main
X
expect deb822 http://mirror.test/debian
# deb822: deb-src only, disabled and -security stanzas are not mirrors; another suite's is, failing bookworm.
mk deb822-other
cat >"$T/deb822-other/sources.list.d/x.sources" <<'X'
Types: deb-src
URIs: http://src.mirror.test/debian
Suites: bookworm

Types: deb
Enabled: no
URIs: http://off.mirror.test/debian
Suites: bookworm

Types: deb
URIs: http://trixie.mirror.test/debian http://second.mirror.test/debian
Suites: trixie
X
expect deb822-other http://trixie.mirror.test/debian
# One-line format, with options in brackets; comments and deb-src lines skipped.
mk oneline
printf '# c\ndeb-src http://src.mirror.test/debian bookworm main\ndeb [arch=amd64 signed-by=/k.gpg] http://one.mirror.test/debian bookworm main\n' \
	>"$T/oneline/sources.list"
expect oneline http://one.mirror.test/debian
# Only a security archive, or nothing at all: no mirror (and no host assumed).
mk security-only
echo 'deb http://sec.mirror.test/debian-security bookworm-security main' >"$T/security-only/sources.list"
expect security-only ""
mk empty
expect empty ""
echo "$((n - bad)) passed, $bad failed"
[ $bad = 0 ] || fail "nspawn_mirror"

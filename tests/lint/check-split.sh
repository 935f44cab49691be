#!/bin/sh
# SPDX-License-Identifier: MIT
# After README.md was split into docs/: every heading and every table row of an old README
# (outside code blocks) must still be somewhere in README.md or docs/*.md. Headings are compared by
# their text, whatever their level. For the lead, when a branch that edited the old README merges:
#   sh tests/lint/check-split.sh OLD_README [SOURCE_DIR]      (e.g. git show main~1:README.md > /tmp/r)
# exit 0: nothing lost; 1: prints each heading or row that is missing.
set -u
OLD=${1:?usage: check-split.sh OLD_README [SOURCE_DIR]}
SRC=${2:-$(dirname "$0")/../..}
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
# Headings as "H text", table rows as "R row", from markdown outside ``` fences.
items() {
	awk '/^```/ { code = !code; next } code { next }
	/^#+ / { sub(/^#+ +/, ""); print "H " $0; next }
	/^\|/ { print "R " $0 }' "$@"
}
items "$OLD" | sort -u >"$T/old"
items "$SRC/README.md" "$SRC"/docs/*.md | sort -u >"$T/new"
missing=$(comm -23 "$T/old" "$T/new")
if [ -n "$missing" ]; then
	echo "missing from README.md and docs/ (H: heading, R: table row):"
	echo "$missing"
	exit 1
fi
echo "ok: all $(wc -l <"$T/old") headings and table rows of $OLD are in README.md or docs/"

#!/bin/sh
# SPDX-License-Identifier: MIT
# Every relative link in the project's markdown (README.md, docs/, and the other *.md files git
# tracks) names a file that exists, and a #anchor names a heading of that file, slugged as GitHub
# slugs them (lower case; letters, digits, '-', '_' and spaces kept; spaces become '-'; a repeated
# heading gets -1, -2, ...). Links inside code blocks and to URLs are not checked.
# usage: check-links.sh [SOURCE_DIR]       exit 0: every link resolves; 1: lists the broken ones
set -u
SRC=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
cd "$SRC" || exit 1
if command -v git >/dev/null && git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	files=$(git ls-files -co --exclude-standard '*.md' | grep -v '^build')
else
	files=$(find . -name '*.md' ! -path './build*' | sed 's|^\./||')
fi
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT

# The anchors of one markdown file, one a line.
anchors() {
	awk '/^```/ { code = !code; next } code { next }
	/^#+ / {
		h = $0; sub(/^#+ +/, "", h); h = tolower(h)
		gsub(/[^a-z0-9 _-]/, "", h); gsub(/ /, "-", h)
		if (h in seen) { seen[h]++; print h "-" seen[h] - 1 } else { seen[h] = 1; print h }
	}' "$1"
}

bad=0
for f in $files; do
	[ -f "$f" ] || continue
	dir=$(dirname "$f")
	# Each link target as "LINE TARGET", outside code blocks and inline code.
	awk '/^```/ { code = !code; next } code { next }
	{
		line = $0; gsub(/`[^`]*`/, "", line)
		while (match(line, /\]\([^) ]+\)/)) {
			t = substr(line, RSTART + 2, RLENGTH - 3)
			print NR " " t
			line = substr(line, RSTART + RLENGTH)
		}
	}' "$f" >"$T/links"
	while read -r n target; do
		case $target in
		http://* | https://* | mailto:*) continue ;;
		esac
		path=${target%%#*}
		anchor=
		case $target in *'#'*) anchor=${target#*#} ;; esac
		if [ -z "$path" ]; then
			dest=$f
		else
			dest=$dir/$path
		fi
		if [ ! -e "$dest" ]; then
			echo "$f:$n: $target: no such file ($dest)"
			bad=1
			continue
		fi
		if [ -n "$anchor" ]; then
			case $dest in
			*.md)
				anchors "$dest" | grep -qxF "$anchor" || {
					echo "$f:$n: $target: $dest has no heading with the anchor #$anchor"
					bad=1
				}
				;;
			esac
		fi
	done <"$T/links"
done
[ "$bad" = 0 ] || { echo "FAIL: broken links above"; exit 1; }
echo "ok: every relative link in $(echo "$files" | wc -l) markdown files resolves"

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
# One awk over every file: the anchors of each (outside code blocks), then each link checked.
# Paths are normalised (a/b/../c is a/c) so that a link from docs/ to ../README.md finds README.md's
# anchors.
# shellcheck disable=SC2086 # the file list is split on purpose (git's names have no blanks here)
awk '
function norm(p,    n, i, k, parts, out) {
	n = split(p, parts, "/"); k = 0
	for (i = 1; i <= n; i++) {
		if (parts[i] == "" || parts[i] == ".") continue
		if (parts[i] == ".." && k > 0 && out[k] != "..") { k--; continue }
		out[++k] = parts[i]
	}
	p = ""
	for (i = 1; i <= k; i++) p = p (i > 1 ? "/" : "") out[i]
	return p
}
function slug(h) {
	h = tolower(h); gsub(/[^a-z0-9 _-]/, "", h); gsub(/ /, "-", h); return h
}
FNR == 1 { code = 0; file = FILENAME; nfiles++; files[nfiles] = file; is_md[norm(file)] = 1 }
/^```/ { code = !code; next }
code { next }
/^#+ / {
	h = $0; sub(/^#+ +/, "", h); h = slug(h)
	key = norm(file) SUBSEP h
	if (key in seen) { seen[key]++; anchor[norm(file) SUBSEP h "-" (seen[key] - 1)] = 1 }
	else { seen[key] = 1; anchor[key] = 1 }
}
{
	line = $0; gsub(/`[^`]*`/, "", line)
	while (match(line, /\]\([^) ]+\)/)) {
		nl++; lfile[nl] = file; lline[nl] = FNR; ltarget[nl] = substr(line, RSTART + 2, RLENGTH - 3)
		line = substr(line, RSTART + RLENGTH)
	}
}
END {
	for (i = 1; i <= nl; i++) {
		t = ltarget[i]
		if (t ~ /^(https?|mailto):/) continue
		path = t; frag = ""
		if (index(t, "#")) { path = substr(t, 1, index(t, "#") - 1); frag = substr(t, index(t, "#") + 1) }
		dir = lfile[i]; sub(/[^\/]*$/, "", dir)
		dest = path == "" ? norm(lfile[i]) : norm(dir path)
		if (!(dest in is_md) && system("test -e \"" dest "\"") != 0) {
			printf "%s:%d: %s: no such file (%s)\n", lfile[i], lline[i], t, dest; bad = 1; continue
		}
		if (frag != "" && dest ~ /\.md$/ && !((dest SUBSEP frag) in anchor)) {
			if (!(dest in is_md)) { printf "%s:%d: %s: %s is not a tracked markdown file\n", lfile[i], lline[i], t, dest; bad = 1; continue }
			printf "%s:%d: %s: %s has no heading with the anchor #%s\n", lfile[i], lline[i], t, dest, frag; bad = 1
		}
	}
	printf "%d links in %d markdown files\n", nl, nfiles
	exit bad
}' $files || { echo "FAIL: broken links above"; exit 1; }
echo "ok: every relative link resolves"

#!/bin/sh
# SPDX-License-Identifier: MIT
# Rewrite the generated regions of README.md and docs/*.md from the built binaries, so the tables
# that code can make are never pasted by hand:
#   <!-- BEGIN generated: NAME ... -->  ...  <!-- END generated: NAME -->
# NAME is one of:
#   config-table      pinbrokerd --config-doc (the key table in daemon/config/config-keys.c, as the man page is)
#   pinctl-usage      pinctl --help
#   pinctl-commands   pinctl help COMMAND for every command that pinctl --help lists
# usage: gen-docs.sh [--check] [BUILD_DIR | PINBROKERD PINCTL]     (default BUILD_DIR: build)
# --check writes nothing: exit 1, with a diff, when a committed region differs from what this
# script would write (the ctest docs_generated); exit 0 when all match.
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
check=0
[ "${1:-}" = --check ] && { check=1; shift; }
case $# in
0 | 1)
	B=${1:-$SRC/build}
	PINBROKERD=$B/daemon/pinbrokerd
	PINCTL=$B/client/pinctl
	;;
2)
	PINBROKERD=$1
	PINCTL=$2
	;;
*)
	echo "usage: gen-docs.sh [--check] [BUILD_DIR | PINBROKERD PINCTL]" >&2
	exit 2
	;;
esac
for b in "$PINBROKERD" "$PINCTL"; do
	[ -x "$b" ] || { echo "gen-docs: $b is not built (cmake --build BUILD --target pinbrokerd pinctl)" >&2; exit 2; }
done

T=$(mktemp -d /tmp/pinbroker-gen-docs.XXXXXX)
trap 'rm -rf "$T"' EXIT
mkdir "$T/gen" "$T/out"

"$PINBROKERD" --config-doc >"$T/gen/config-table"
{
	echo '```text'
	"$PINCTL" --help
	echo '```'
} >"$T/gen/pinctl-usage"
# The commands, as the install test reads them for pinctl(8): the first word of each line of
# "Commands:". Each one's help without the options every command shares (pinctl-usage has them).
cmds=$("$PINCTL" --help | awk '/^Commands:/ { on = 1; next } on && /^[^ ]/ { exit } on && /^  [a-z]/ { print $1 }')
[ -n "$cmds" ] || { echo "gen-docs: $PINCTL --help lists no command under \"Commands:\"" >&2; exit 1; }
for c in $cmds; do
	echo '```text'
	"$PINCTL" help "$c" | awk '/^Options every command takes/ { exit } { print }' |
		awk '{ l[n++] = $0 } END { while (n > 0 && l[n - 1] == "") n--; for (i = 0; i < n; i++) print l[i] }'
	echo '```'
	echo
done >"$T/gen/pinctl-commands"
# The last command's blank line would end the region with an empty line: drop it.
awk '{ l[n++] = $0 } END { while (n > 0 && l[n - 1] == "") n--; for (i = 0; i < n; i++) print l[i] }' \
	"$T/gen/pinctl-commands" >"$T/gen/pinctl-commands.tmp" && mv "$T/gen/pinctl-commands.tmp" "$T/gen/pinctl-commands"

stale=0
found=0
for f in "$SRC/README.md" "$SRC"/docs/*.md; do
	grep -q '^<!-- BEGIN generated: ' "$f" || continue
	found=1
	out=$T/out/$(basename "$f")
	awk -v gen="$T/gen" -v file="$f" '
		/^<!-- BEGIN generated: / {
			name = $4
			src = gen "/" name
			if ((getline line < src) < 0) { printf "%s:%d: unknown generated region %s\n", file, NR, name > "/dev/stderr"; bad = 1; exit 1 }
			print
			do print line; while ((getline line < src) > 0)
			close(src)
			skip = 1
			next
		}
		skip && /^<!-- END generated: / {
			if ($4 != name) { printf "%s:%d: END of %s inside %s\n", file, NR, $4, name > "/dev/stderr"; bad = 1; exit 1 }
			skip = 0
		}
		!skip { print }
		END { if (!bad && skip) { printf "%s: region %s has no END line\n", file, name > "/dev/stderr"; exit 1 } }
	' "$f" >"$out"
	if ! cmp -s "$f" "$out"; then
		if [ "$check" = 1 ]; then
			stale=1
			echo "${f#"$SRC"/} differs from what scripts/gen-docs.sh writes:"
			diff -u "$f" "$out" | sed -n '3,$p' | head -60
		else
			cat "$out" >"$f"
			echo "gen-docs: rewrote ${f#"$SRC"/}"
		fi
	fi
done
[ "$found" = 1 ] || { echo "gen-docs: no generated region found in README.md or docs/*.md" >&2; exit 1; }
if [ "$stale" = 1 ]; then
	echo "FAIL: generated docs are stale; run: scripts/gen-docs.sh BUILD_DIR, and commit the result"
	exit 1
fi
[ "$check" = 1 ] && echo "ok: the generated regions of README.md and docs/ match $PINBROKERD and $PINCTL"
exit 0

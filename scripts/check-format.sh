#!/bin/sh
# SPDX-License-Identifier: MIT
# The house style, applied: every tracked C, header and CUDA file is as clang-format (the repo's
# .clang-format) would write it. `scripts/check-format.sh --fix` rewrites the ones that are not.
# Exit 0 clean, 1 a file differs, 77 (skip) where clang-format 14 (Debian 12's, what CI runs) is missing:
# other major versions lay some constructs out differently, so their verdict would not be CI's.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
fix=no
case ${1:-} in
--fix) fix=yes ;;
"") ;;
*) echo "usage: scripts/check-format.sh [--fix]" >&2; exit 2 ;;
esac
cf=${CLANG_FORMAT:-clang-format}
if ! command -v "$cf" >/dev/null 2>&1; then
	echo "check-format: $cf not found: apt-get install clang-format (scripts/deps.sh --test installs it); skipped" >&2
	exit 77
fi
major=$("$cf" --version | sed -n 's/.*version \([0-9][0-9]*\)\..*/\1/p')
if [ "$major" != 14 ]; then
	echo "check-format: $cf is version $major, the check is pinned to 14 (Debian 12's, CI's); skipped" >&2
	exit 77
fi
cd "$root"
# git knows the tracked files; a tarball without .git checks every file it has.
if git rev-parse --git-dir >/dev/null 2>&1; then
	files=$(git ls-files '*.c' '*.h' '*.cu')
else
	files=$(find . -path ./build\* -prune -o \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) -print)
fi
# One clang-format process for all the files: its warnings name each file, line and column.
# shellcheck disable=SC2086
if [ $fix = yes ]; then
	"$cf" -i $files
elif ! "$cf" --dry-run --Werror --ferror-limit=3 $files; then
	echo "check-format: the files above differ from .clang-format: scripts/check-format.sh --fix" \
		"(or git clang-format for a change)"
	exit 1
fi
echo "check-format: $(echo "$files" | wc -w) files as .clang-format writes them"

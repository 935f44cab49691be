#!/bin/sh
# SPDX-License-Identifier: MIT
# Builds the Debian packages with Debian's own tools: `dpkg-buildpackage -us -uc -b` (debhelper, debian/)
# on a copy of the tree in BUILD_DIR/src (default build-deb/src), so the checkout gets no debian/tmp or
# obj-* folder; the packages land in BUILD_DIR: pinbroker, libpinbroker1, libpinbroker-dev,
# python3-pinbroker, pinbroker-slurm and the -dbgsym packages (docs/install.md says what each holds).
# With --lintian, lintian checks them too. The build dependencies: debian/control's Build-Depends
# (scripts/deps.sh --test installs them; `dpkg-checkbuilddeps` names any missing).
# usage: scripts/build-deb.sh [--lintian] [BUILD_DIR]
set -eu
cd "$(dirname "$0")/.."
LINTIAN=0
if [ "${1:-}" = --lintian ]; then
	LINTIAN=1
	shift
fi
B=$(realpath -m "${1:-build-deb}")
command -v dpkg-buildpackage >/dev/null || { echo "build-deb.sh: dpkg-buildpackage not found (apt-get install dpkg-dev debhelper)" >&2; exit 1; }
dpkg-checkbuilddeps || { echo "build-deb.sh: install the build dependencies above (scripts/deps.sh --test)" >&2; exit 1; }

# The copy: git's files where this is a checkout (tracked ones and new ones not ignored, so uncommitted
# work is packaged as it stands), else everything but build trees.
rm -rf "$B/src"
mkdir -p "$B/src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	# --ignore-failed-read: a tracked file deleted in the work tree is left out, not an error.
	git ls-files -z --cached --others --exclude-standard |
		tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$B/src"
else
	tar --exclude='./build*' --exclude='./obj-*' --exclude=./.cache --exclude=./.git -cf - . | tar -xf - -C "$B/src"
fi
# Stale packages of an older version must not be mistaken for these.
rm -f "$B"/*.deb "$B"/*.ddeb "$B"/*.buildinfo "$B"/*.changes
(cd "$B/src" && DEB_BUILD_OPTIONS="parallel=$(nproc) ${DEB_BUILD_OPTIONS:-}" dpkg-buildpackage -us -uc -b)
# dpkg-buildpackage writes beside the tree it built: BUILD_DIR.
ls -1 "$B"/*.deb
if [ $LINTIAN = 1 ]; then
	lintian --tag-display-limit 0 --info "$B"/*.changes
fi

#!/bin/sh
# SPDX-License-Identifier: MIT
# Builds the Debian packages: a Release build for prefix /usr in BUILD_DIR (default build-deb),
# then `cpack -G DEB` there, which writes pinbroker_<version>_<arch>.deb, libpinbroker0_... and
# libpinbroker-dev_... into BUILD_DIR (cmake/Packaging.cmake says what goes where). With
# --lintian, lintian checks them too (apt-get install lintian).
# usage: scripts/build-deb.sh [--lintian] [BUILD_DIR]
set -eu
cd "$(dirname "$0")/.."
LINTIAN=0
if [ "${1:-}" = --lintian ]; then
	LINTIAN=1
	shift
fi
B=${1:-build-deb}
# Only what the packages hold: no tests, benchmarks' GPU parts, sanitizers or debug hooks.
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr -DBUILD_TESTING=OFF \
	-DPINBROKER_GPU_TESTS=OFF -DPINBROKER_SANITIZE=OFF -DPINBROKER_FUZZ=OFF -DPINBROKER_DEBUG_HOOKS=OFF \
	-DPINBROKER_INSTALL_PYTHON=OFF >/dev/null
cmake --build "$B" -j"$(nproc)" --target pinbrokerd pinctl pinbroker pinbroker_static pinbroker_preload \
	pinbroker_man pinbroker_sample_config
# Stale packages of an older version must not be mistaken for these.
rm -f "$B"/pinbroker_*.deb "$B"/libpinbroker0_*.deb "$B"/libpinbroker-dev_*.deb
(cd "$B" && cpack -G DEB)
ls -1 "$B"/*.deb
if [ $LINTIAN = 1 ]; then
	lintian --no-tag-display-limit "$B"/*.deb
fi

#!/bin/sh
# SPDX-License-Identifier: MIT
# Build with ASan + UBSan (PINBROKER_SANITIZE=ON) and run the whole ctest suite under them.
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$src/build-asan}
jobs=${JOBS:-$(nproc)}
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DPINBROKER_SANITIZE=ON >/dev/null
cmake --build "$build" -j"$jobs"
# halt_on_error: the first report fails the test. detect_leaks covers the daemon too (it exits 0 only clean).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=0:exitcode=86}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
cd "$build"
ctest --output-on-failure -j"${CTEST_JOBS:-1}" -E "${CTEST_EXCLUDE:-^systemd_nspawn$}" "$@"

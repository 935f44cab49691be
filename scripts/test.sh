#!/bin/sh
# SPDX-License-Identifier: MIT
# Build with -Werror and run every test: unit, integration, systemd (nspawn), fuzz corpus replay,
# then the whole suite again under ASan+UBSan, and the integration suites once under valgrind.
set -eu
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || echo "test: not root: tests that switch uids, lock memory or boot systemd will skip" >&2
[ "$(id -u)" = 0 ] && ./scripts/deps.sh --test
JOBS=$(nproc)
fail=0

step() { echo; echo "==== $*"; }

step "build (-Werror)"
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPINBROKER_WERROR=ON >/dev/null
cmake --build build-test -j"$JOBS"
step "ctest"
(cd build-test && ctest --output-on-failure -j2 --timeout 900) || fail=1

step "ASan + UBSan build"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DPINBROKER_WERROR=ON -DPINBROKER_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$JOBS"
step "ctest under ASan + UBSan"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	ctest --output-on-failure -j2 --timeout 900 -E systemd_nspawn) || fail=1

step "fuzzers: corpus replay plus a 60 s run each"
fuzz/run-ci.sh 60 || fail=1
step "integration suites under valgrind memcheck"
tests/hardening/run-valgrind.sh build-valgrind || fail=1

echo
if [ "$fail" = 0 ]; then echo "test: ALL PASSED"; else echo "test: FAILURES (see above)"; fi
exit $fail

#!/bin/sh
# SPDX-License-Identifier: MIT
# Build with -Werror and run every test: unit, integration, systemd (nspawn), fuzz corpus replay,
# scripts/demo.sh (it must return), then the whole suite again under ASan+UBSan, and the
# integration suites once under valgrind.
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

step "demo.sh returns, leaving its daemon running, and prints the stop command"
if [ "$(id -u)" = 0 ]; then
	# A temp socket and log folder of its own, and the build above: nothing clashes with a real daemon.
	demo=$(mktemp -d /tmp/pbdemo.XXXXXX)
	if PINBROKER_SOCKET=$demo/pb.sock DEMO_DIR=$demo DEMO_BUILD=build-test timeout 300 ./scripts/demo.sh \
		>"$demo/out" 2>&1; then
		pid=$(cat "$demo/pinbrokerd-demo.pid")
		if kill -0 "$pid" 2>/dev/null && PINBROKER_SOCKET=$demo/pb.sock build-test/client/pinctl status >/dev/null &&
			grep -q "stop it with: kill" "$demo/out"; then
			echo "demo.sh: returned; its daemon (pid $pid) answers"
		else
			echo "demo.sh: returned, but its daemon is not running or no stop command was printed:"
			cat "$demo/out"
			fail=1
		fi
	else
		echo "demo.sh: failed or hung (exit $?; 124 = still running after 300 s):"
		cat "$demo/out"
		fail=1
	fi
	# Stop the daemon it left, and wait until it is gone.
	if [ -s "$demo/pinbrokerd-demo.pid" ]; then
		pid=$(cat "$demo/pinbrokerd-demo.pid")
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	fi
	rm -rf "$demo"
else
	echo "demo.sh: skipped (it needs root)"
fi

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

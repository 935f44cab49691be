#!/bin/sh
# SPDX-License-Identifier: MIT
# Build with -Werror and run every test: unit, integration, systemd (nspawn), the Debian packages, fuzz corpus replay,
# scripts/demo.sh (it must return), then the whole suite again under ASan+UBSan (less the two booted-root tests), and the
# integration suites once under valgrind.
set -eu
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || echo "test: not root: tests that switch uids, lock memory or boot systemd will skip" >&2
[ "$(id -u)" = 0 ] && ./scripts/deps.sh --test
JOBS=$(nproc)
fail=0
failed_steps=""
summary=$(mktemp /tmp/pbtest-summary.XXXXXX)
trap 'rm -f "$summary"' EXIT

step() { echo; echo "==== $*"; current_step="$*"; }
# Record the current step as failed; CI shows only the tail of the output, so the summary at the end names it.
failed() { fail=1; failed_steps="$failed_steps
  - $current_step"; }
# After a ctest run in $1 failed: the failed tests' names and the last lines of each one's output,
# kept for the summary (ctest's --output-on-failure prints them mid-run, out of CI's sight).
ctest_failures() {
	log="$1/Testing/Temporary/LastTest.log"
	[ -s "$1/Testing/Temporary/LastTestsFailed.log" ] || return 0
	for name in $(cut -d: -f2 "$1/Testing/Temporary/LastTestsFailed.log"); do
		echo "---- $1: $name (last 30 lines of its output)"
		awk -v t="$name" '
			/^[0-9]+\/[0-9]+ Testing: / { on = ($3 == t); if (on) n = 0; next }
			on && /^Test (Passed|Failed)|^"[^"]*" end time/ { on = 0 }
			on { buf[n++ % 30] = $0 }
			END { s = n > 30 ? n - 30 : 0; for (i = s; i < n; i++) print buf[i % 30] }' "$log"
	done >>"$summary"
}

step "build (-Werror)"
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPINBROKER_WERROR=ON >/dev/null
cmake --build build-test -j"$JOBS"
step "ctest"
(cd build-test && ctest --output-on-failure -j2 --timeout 900) || { failed; ctest_failures build-test; }

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
			failed
		fi
	else
		echo "demo.sh: failed or hung (exit $?; 124 = still running after 300 s):"
		cat "$demo/out"
		failed
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
	ctest --output-on-failure -j2 --timeout 900 -E "systemd_nspawn|package_deb") || { failed; ctest_failures build-asan; }

step "fuzzers: corpus replay plus a 60 s run each"
fuzz/run-ci.sh 60 || failed
step "integration suites under valgrind memcheck"
tests/hardening/run-valgrind.sh build-valgrind || failed

echo
if [ "$fail" = 0 ]; then
	echo "test: ALL PASSED"
else
	echo "==== summary of failures"
	cat "$summary"
	echo "test: FAILURES in these steps:$failed_steps"
fi
exit $fail

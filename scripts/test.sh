#!/bin/sh
# SPDX-License-Identifier: MIT
# Build with -Werror and run every test: unit, integration, systemd (nspawn), the Debian packages, fuzz corpus replay,
# scripts/demo.sh (it must return), then the whole suite again under ASan+UBSan (less the two booted-root tests), and the
# integration suites once under valgrind.
#
# Every skipped test is listed at the end with the reason it printed. A promised suite (PROMISED below) that skips
# for a missing package (its reason says "not found", "not installed", "apt-get install" or "deps.sh") fails the
# run: deps.sh --test should have installed it. With CI=true, a promised suite may not skip at all in the plain run.
set -eu
cd "$(dirname "$0")/.."
# shellcheck source=scripts/progress.sh
. ./scripts/progress.sh
[ "$(id -u)" = 0 ] || echo "test: not root: tests that switch uids, lock memory or boot systemd will skip" >&2
if [ "$(id -u)" = 0 ]; then
	say "deps: scripts/deps.sh --test"
	./scripts/deps.sh --test
fi
JOBS=$(nproc)
fail=0
failed_steps=""
summary=$(mktemp /tmp/pbtest-summary.XXXXXX)
skips=$(mktemp /tmp/pbtest-skips.XXXXXX)
trap 'rm -f "$summary" "$skips" "$summary.ctest" "$summary.rc"' EXIT
# Suites the README promises run on a Debian 12 root once deps.sh --test installed their packages. gpu_lease (no
# GPU) and deploy_slurm_real (no Slurm cluster) are not among them; they say why they skip.
PROMISED="systemd_nspawn package_deb python_pinbroker completion_bash completion_zsh install_prefix deploy_k8s_*
	deploy_slurm check_itest_pinctl check_itest_pinctl_ux check_itest_metrics"

step() { echo; say "==== $*"; current_step="$*"; }
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

# ctest_skips DIR OUT PASS: for each test that ctest (its output in OUT) reports skipped, "PASS name: reason" into
# $skips; the reason is the test's last output line starting with SKIP (Check suites and scripts print one), else
# its last line saying "skipped".
ctest_skips() {
	for name in $(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (Skipped)$/\1/p' "$2"); do
		reason=$(awk -v t="$name" '
			/^[0-9]+\/[0-9]+ Testing: / { on = ($3 == t); next }
			on && /^<end of output>/ { on = 0 }
			on && /^SKIP/ { s = $0 }
			on && tolower($0) ~ /skipped/ { k = $0 }
			END { print s != "" ? s : k }' "$1/Testing/Temporary/LastTest.log" | cut -c1-300)
		echo "$3 $name: ${reason:-(it printed no reason)}" >>"$skips"
	done
}

# promised NAME: whether NAME is in PROMISED (which holds shell patterns).
promised() {
	for p in $PROMISED; do
		# shellcheck disable=SC2254
		case "$1" in $p) return 0 ;; esac
	done
	return 1
}

# ctest_heartbeat OUT: while ctest runs (its output going to OUT), a line every PB_HEARTBEAT_S seconds in which it
# printed nothing, naming the tests still running: ctest prints a test only when it ends, and the booted-root
# tests take minutes.
ctest_heartbeat() {
	while sleep "$PB_HEARTBEAT_S"; do
		if [ $(($(date +%s) - $(stat -c %Y "$1"))) -ge "$PB_HEARTBEAT_S" ]; then
			running=$(awk '$1 == "Start" { s[$3] = 1 } $2 == "Test" && $3 ~ /^#/ { delete s[$4] }
				END { for (t in s) printf "%s ", t }' "$1")
			say "ctest: still running: ${running:-(starting)}"
		fi
	done
}

# run_ctest DIR PASS [ctest args]: ctest in DIR, its failures and skips kept for the summary.
run_ctest() {
	dir=$1
	pass=$2
	shift 2
	rm -f "$summary.rc"
	: >"$summary.ctest"
	ctest_heartbeat "$summary.ctest" &
	hb=$!
	# Shown as it runs, and kept for the skip list.
	{ (cd "$dir" && ctest --output-on-failure -j2 --timeout 900 "$@") 2>&1 || echo "$?" >"$summary.rc"; } |
		tee "$summary.ctest"
	kill "$hb" 2>/dev/null || true
	wait "$hb" 2>/dev/null || true
	[ ! -e "$summary.rc" ] || { failed; ctest_failures "$dir"; }
	ctest_skips "$dir" "$summary.ctest" "$pass"
}

step "build (-Werror)"
mkdir -p build-test build-asan
if quietly "build: configure build-test" build-test/build.log \
	cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPINBROKER_WERROR=ON &&
	quietly "build: compile build-test with $JOBS jobs (log: build-test/build.log)" build-test/build.log \
		cmake --build build-test -j"$JOBS"; then
	step "ctest"
	run_ctest build-test plain
else
	failed
fi

step "demo.sh returns, leaving its daemon running, and prints the stop command"
if [ "$(id -u)" = 0 ]; then
	# A temp socket and log folder of its own, and the build above: nothing clashes with a real daemon.
	demo=$(mktemp -d /tmp/pbdemo.XXXXXX)
	if PINBROKER_SOCKET=$demo/pb.sock DEMO_DIR=$demo DEMO_BUILD=build-test timeout 300 ./scripts/demo.sh \
		>"$demo/out" 2>&1; then
		pid=$(cat "$demo/pinbrokerd-demo.pid")
		if kill -0 "$pid" 2>/dev/null && PINBROKER_SOCKET=$demo/pb.sock build-test/client/pinctl status >/dev/null &&
			grep -q "stop it with: kill" "$demo/out" && grep -q "export PATH=$PWD/build-test/client:" "$demo/out"; then
			echo "demo.sh: returned; its daemon (pid $pid) answers"
		else
			echo "demo.sh: returned, but its daemon is not running, or no stop command or pinctl's folder was printed:"
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
if quietly "build: configure build-asan" build-asan/build.log \
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DPINBROKER_WERROR=ON -DPINBROKER_SANITIZE=ON &&
	quietly "build: compile build-asan with $JOBS jobs (log: build-asan/build.log)" build-asan/build.log \
		cmake --build build-asan -j"$JOBS"; then
	step "ctest under ASan + UBSan"
	# Check's per-case timeouts are set for the plain build; ASan runs the daemon and the suites 2-3x slower
	# (the daemon start waits are x4 already: itest.c), and a 2-core machine under load more: x3, as the
	# valgrind run's x10 (tests/hardening/run-valgrind.sh). ctest's --timeout stays the outer bound.
	export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
	export CK_TIMEOUT_MULTIPLIER=${CK_TIMEOUT_MULTIPLIER:-3}
	run_ctest build-asan asan -E "systemd_nspawn|package_deb"
	unset ASAN_OPTIONS UBSAN_OPTIONS CK_TIMEOUT_MULTIPLIER
else
	failed
fi

# The fuzzers' and valgrind's builds and runs print thousands of lines (make, libFuzzer's NEW cov:): they go to a
# log, and each prints one summary line; a failure prints the log's last 60 lines (quietly).
step "fuzzers: corpus replay plus a 60 s run each"
mkdir -p build-fuzz
if quietly "fuzz: build, replay the corpora, fuzz each harness 60 s (log: build-fuzz/fuzz.log)" build-fuzz/fuzz.log \
	tests/fuzz/run-ci.sh 60; then
	say "fuzz: $(awk '/^== .*: fuzzing for/ { h = $2; sub(/:$/, "", h) }
		/^stat::number_of_executed_units:/ { printf "%s %s runs, ", h, $2 }
		/^stat::new_units_added:/ { printf "%s new inputs; ", $2 }
		/^fuzzing: / { print substr($0, 10) }' build-fuzz/fuzz.log)"
else
	failed
fi
step "integration suites under valgrind memcheck"
mkdir -p build-valgrind
if quietly "valgrind: build build-valgrind, run 5 integration suites under memcheck (log: build-valgrind/valgrind.log)" \
	build-valgrind/valgrind.log tests/hardening/run-valgrind.sh build-valgrind; then
	say "$(grep -E '^valgrind: ' build-valgrind/valgrind.log | tail -n 1); ctest: $(grep -E 'tests passed' build-valgrind/valgrind.log | tail -n 1)"
else
	failed
fi

# Skips: each with its reason; a promised suite skipped for a missing package (or, with CI=true, at all in the
# plain run) fails the run.
if [ -s "$skips" ]; then
	echo
	say "==== skipped tests ($(wc -l <"$skips")), with the reason each printed"
	while read -r pass name reason; do
		name=${name%:}
		note=""
		if promised "$name"; then
			if echo "$reason" | grep -qiE 'not found|not installed|apt-get install|deps\.sh'; then
				note="  <- FAILS the run: a package scripts/deps.sh --test installs is missing"
			elif [ "${CI:-}" = true ] && [ "$pass" = plain ]; then
				note="  <- FAILS the run: CI=true and this suite is promised to run"
			fi
		fi
		echo "  $pass: $name: $reason$note"
		if [ -n "$note" ]; then
			fail=1
			failed_steps="$failed_steps
  - $name skipped in the $pass run ($reason)"
		fi
	done <"$skips"
fi

echo
if [ "$fail" = 0 ]; then
	echo "test: ALL PASSED"
else
	echo "==== summary of failures"
	cat "$summary"
	echo "test: FAILURES in these steps:$failed_steps"
fi
exit $fail

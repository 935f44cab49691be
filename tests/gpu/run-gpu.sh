#!/bin/bash
# SPDX-License-Identifier: MIT
# The one command for a GPU host: starts pinbrokerd on temp sockets, runs the GPU tests with several processes
# (4 KiB pages, then hugetlb), then the benchmark; full results go to $OUT, a short table is printed last.
#
# usage: tests/gpu/run-gpu.sh [PINBROKERD | BUILD_DIR]   (default: build-gpu, then build)
# env:   OUT             results folder (default: a temp dir)
#        PB_HUGEPAGES    as root, raise /proc/sys/vm/nr_hugepages to this for the hugetlb runs (default 1100;
#                        0 leaves it alone). Huge pages taken here are given back at the end.
#        PB_TEST_PROCS   processes per test run (default 4)
#        PB_SKIP_BENCH=1 tests only
# Exits 0 when the tests passed (the benchmark reports, it does not fail), 1 when one failed, 77 without a GPU.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
ARG=${1:-}
if [ -n "$ARG" ] && [ -f "$ARG" ]; then
	BUILD=$(realpath -m "$(dirname "$ARG")/..")
	DAEMON=$(realpath "$ARG")
else
	BUILD=$ARG
	if [ -z "$BUILD" ]; then
		for b in "$SRC/build-gpu" "$SRC/build"; do [ -x "$b/tests/gpu/test_gpu_lease" ] && BUILD=$b && break; done
	fi
	BUILD=$(realpath -m "${BUILD:-$SRC/build-gpu}")
	DAEMON=$BUILD/daemon/pinbrokerd
fi
TEST=$BUILD/tests/gpu/test_gpu_lease
BENCH=$BUILD/bench/gpu/pb_gpu_bench
PINCTL=$BUILD/client/pinctl
for f in "$DAEMON" "$TEST" "$BENCH" "$PINCTL"; do
	[ -x "$f" ] || { echo "missing $f (cmake -S . -B build-gpu -DPINBROKER_STATIC_DEPS=ON && cmake --build build-gpu)"; exit 2; }
done
export OUT=${OUT:-$(mktemp -d /tmp/pb-gpu-out.XXXXXX)}
mkdir -p "$OUT"
TLOG=$OUT/gpu-tests.log
DLOG=$OUT/daemons.log
TMP=$(mktemp -d /tmp/pb-gpu.XXXXXX)
PROCS=${PB_TEST_PROCS:-4}
: >"$TLOG"

# Pressure thresholds sit low: the tests check CUDA behaviour, and a VM's MemAvailable may start small.
DARGS=(--lock-memory yes --tight-mem-available-pct 3 --critical-mem-available-pct 1)
# The daemons and huge pages this takes, given back at exit (shared with run-preload.sh).
# shellcheck source=tests/gpu/gpu-lib.sh
. "$SRC/tests/gpu/gpu-lib.sh"
cleanup() {
	gpu_cleanup
	rm -rf "$TMP"
}
trap cleanup EXIT

# Skip before touching anything when there is no GPU.
"$BENCH" info >"$TMP/info" 2>&1
rc=$?
if [ $rc = 77 ]; then cat "$TMP/info"; exit 77; fi
cat "$TMP/info"

gpu_take_hugepages
echo "huge pages: $(cat /proc/sys/vm/nr_hugepages) total, $(awk '/HugePages_Free/ {print $2}' /proc/meminfo) free" | tee -a "$TLOG"

start_daemon() { # label socket args...
	local label=$1 sock=$2
	shift 2
	echo "--- pinbrokerd $label: $*" >>"$DLOG"
	"$BENCH" start-daemon --label "$label" --socket "$sock" --log "$DLOG" --pidfile "$TMP/$label.pid" \
		-- "$DAEMON" --socket "$sock" "${DARGS[@]}" "$@" >>"$TLOG" 2>&1 || return 1
	PIDS+=("$(cat "$TMP/$label.pid")")
}
stop_last() { gpu_stop_last "$TLOG"; }

SUMMARY=()
FAILED=0
run_tests() { # label socket expect-hugetlb
	local t0 rc line
	t0=$(date +%s%N)
	echo "=== gpu tests: $1, $PROCS processes" | tee -a "$TLOG"
	PINBROKER_SOCKET=$2 "$TEST" --socket "$2" --pinctl "$PINCTL" --procs "$PROCS" --expect-hugetlb "$3" >"$TMP/run.log" 2>&1
	rc=$?
	cat "$TMP/run.log" >>"$TLOG"
	line=$(grep -E '^gpu_lease:' "$TMP/run.log" | tail -1)
	grep -E '^(\[w[0-9]+\] )?FAIL' "$TMP/run.log" | head -20
	SUMMARY+=("| $1 | ${line#gpu_lease: } | $([ $rc = 0 ] && echo pass || echo "FAIL ($rc)") | $(( ($(date +%s%N) - t0) / 1000000 )) ms |")
	[ $rc = 0 ] || FAILED=1
}

if start_daemon test4k "$TMP/t4k.sock" --budget 24G --prewarm 4G --hugetlb no; then
	run_tests "4 KiB pages" "$TMP/t4k.sock" 0
	stop_last || FAILED=1
else
	echo "FAIL: pinbrokerd (4 KiB) did not start; see $DLOG" | tee -a "$TLOG"
	FAILED=1
fi
if [ "$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)" -ge 1024 ] 2>/dev/null; then
	if start_daemon testhuge "$TMP/thuge.sock" --budget 2G --prewarm 2G --hugetlb yes; then
		run_tests "hugetlb 2 MiB pages" "$TMP/thuge.sock" 1
		stop_last || FAILED=1
	else
		echo "FAIL: pinbrokerd (hugetlb) did not start; see $DLOG" | tee -a "$TLOG"
		FAILED=1
	fi
else
	SUMMARY+=("| hugetlb 2 MiB pages | not run: no free huge pages | skipped | |")
fi
# The ctest entry point too (it starts its own daemon).
echo "=== ctest-style run (own daemon)" | tee -a "$TLOG"
"$TEST" --daemon "$DAEMON" --pinctl "$PINCTL" --procs 2 --daemon-arg=--tight-mem-available-pct \
	--daemon-arg=3 --daemon-arg=--critical-mem-available-pct --daemon-arg=1 >"$TMP/run.log" 2>&1
rc=$?
cat "$TMP/run.log" >>"$TLOG"
grep -E '^(\[w[0-9]+\] )?FAIL' "$TMP/run.log" | head -20
SUMMARY+=("| own daemon (ctest form), 2 processes | $(grep -E '^gpu_lease:' "$TMP/run.log" | tail -1 | sed 's/^gpu_lease: //') | $([ $rc = 0 ] && echo pass || echo "FAIL ($rc)") | |")
[ $rc = 0 ] || FAILED=1

if [ "${PB_SKIP_BENCH:-0}" != 1 ]; then
	echo "=== benchmark"
	"$SRC/bench/gpu/run-bench.sh" "$BUILD" >"$OUT/bench-console.log" 2>&1
	echo "benchmark exit $?"
	tail -5 "$OUT/bench-console.log"
fi

# The LD_PRELOAD interposer, when this build has it: its own daemons, checks and benchmark (tests/gpu/run-preload.sh).
if [ -e "$BUILD/client/libpinbroker-preload.so" ]; then
	echo "=== preload interposer tests" | tee -a "$TLOG"
	bash "$SRC/tests/gpu/run-preload.sh" "$BUILD" >"$OUT/preload-console.log" 2>&1
	rc=$?
	grep -E '^FAIL' "$OUT/preload-console.log" | head -20
	SUMMARY+=("| preload interposer (run-preload.sh) | $(grep -E '^preload:' "$OUT/preload-console.log" | tail -1 | sed 's/^preload: //; s/ (log .*//') | $([ $rc = 0 ] && echo pass || echo "FAIL ($rc)") | |")
	[ $rc = 0 ] || FAILED=1
else
	SUMMARY+=("| preload interposer | not run: no $BUILD/client/libpinbroker-preload.so | skipped | |")
fi

echo
echo "## GPU tests"
echo
echo "| run | checks | result | time |"
echo "|---|---|---|---|"
printf '%s\n' "${SUMMARY[@]}"
[ -f "$OUT/bench-raw.txt" ] && python3 "$SRC/bench/gpu/report.py" --short "$OUT/bench-raw.txt"
[ -f "$OUT/preload-bench.md" ] && { echo; cat "$OUT/preload-bench.md"; }
exit $FAILED

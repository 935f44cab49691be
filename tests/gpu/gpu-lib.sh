# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# Sourced (bash) by run-gpu.sh, run-preload.sh and run-cudapaths.sh: the daemons a script starts (their pids
# in PIDS) and the huge pages it takes, both given back by gpu_cleanup when it exits; and, for the scripts that
# count checks (run-preload.sh, run-cudapaths.sh), finding the build, the output folders, the GPU probe, a daemon
# per section, and the tally of checks with its summary table.
PIDS=()
HUGE_BEFORE=
PASSED=0
FAILED=0
SUMMARY=()

# gpu_find_build BUILD_DIR PROGRAM...: set BUILD to BUILD_DIR or, when it is empty, to the first of
# $SRC/build-gpu and $SRC/build where the first PROGRAM (a path under the build) is built, else
# $SRC/build-gpu; set DAEMON, PINCTL and PRELOAD under it and export PINBROKER_PRELOAD_LIB. Exits 2, naming the
# missing file and how to build it, when one of those or a PROGRAM is missing.
gpu_find_build() {
	local b f
	BUILD=$1
	shift
	if [ -z "$BUILD" ]; then
		for b in "$SRC/build-gpu" "$SRC/build"; do [ -x "$b/$1" ] && BUILD=$b && break; done
	fi
	BUILD=$(realpath -m "${BUILD:-$SRC/build-gpu}")
	DAEMON=$BUILD/daemon/pinbrokerd
	PINCTL=$BUILD/client/pinctl
	PRELOAD=$BUILD/client/libpinbroker-preload.so
	for f in "$DAEMON" "$PINCTL" "$PRELOAD" "${@/#/$BUILD/}"; do
		[ -e "$f" ] || { echo "missing $f (cmake -S . -B build-gpu -DPINBROKER_STATIC_DEPS=ON && cmake --build build-gpu)"; exit 2; }
	done
	# pinctl run looks for the interposer next to the libpinbroker.so it runs with; a statically linked pinctl
	# has none.
	export PINBROKER_PRELOAD_LIB=$PRELOAD
}

# gpu_out_dirs NAME: OUT (exported; a temp dir unless set) with NAME-tests.log (LOG, emptied) and
# NAME-daemons.log (DLOG) in it, and a scratch folder TMP for the script's cleanup to remove.
gpu_out_dirs() {
	export OUT=${OUT:-$(mktemp -d "/tmp/pb-$1-out.XXXXXX")}
	mkdir -p "$OUT"
	LOG=$OUT/$1-tests.log
	# shellcheck disable=SC2034 # the sourcing script's daemons log there
	DLOG=$OUT/$1-daemons.log
	TMP=$(mktemp -d "/tmp/pb-$1.XXXXXX")
	: >"$LOG"
}

# gpu_probe PROG: run `PROG probe` (its first line heads the summary: gpu_summary_head), its output into LOG;
# exit 77 when it finds no GPU, 1 when it fails otherwise.
gpu_probe() {
	local rc
	"$1" probe >"$TMP/probe" 2>&1
	rc=$?
	tee -a "$LOG" <"$TMP/probe"
	[ $rc = 77 ] && exit 77
	[ $rc = 0 ] || { echo "FAIL: ${1##*/} probe exited $rc"; exit 1; }
}

# gpu_status_field FIELD: its value in `pinctl status --json` ("missing" when absent); read with python3,
# as the GPU host has no jq.
gpu_status_field() {
	"$PINCTL" status --json 2>>"$LOG" |
		python3 -c 'import json,sys; print(json.load(sys.stdin).get(sys.argv[1], "missing"))' "$1"
}

# The tally: gpu_ok and gpu_bad count a check (a FAIL is also printed), gpu_section NAME COMMAND... runs
# COMMAND and adds a row with the checks it counted to SUMMARY, which gpu_summary_head prints.
gpu_ok() { PASSED=$((PASSED + 1)); echo "PASS $*" >>"$LOG"; }
gpu_bad() { FAILED=$((FAILED + 1)); echo "FAIL $*" | tee -a "$LOG"; }
gpu_section() {
	local name=$1 p0=$PASSED f0=$FAILED t0 res
	shift
	t0=$(date +%s%N)
	echo "=== $name" | tee -a "$LOG"
	"$@"
	res=$([ $FAILED = "$f0" ] && echo pass || echo FAIL)
	SUMMARY+=("| $name | $((PASSED - p0)) passed, $((FAILED - f0)) failed | $res | $(( ($(date +%s%N) - t0) / 1000000 )) ms |")
}

# gpu_summary_head TITLE: the summary's title, the probe's first line and the table of SUMMARY's rows.
gpu_summary_head() {
	echo
	echo "## $1"
	echo
	head -1 "$TMP/probe"
	echo
	echo "| run | checks | result | time |"
	echo "|---|---|---|---|"
	printf '%s\n' "${SUMMARY[@]}"
}

# gpu_cleanup: TERM each daemon in PIDS and wait up to 5 s for it; give back the huge pages taken.
gpu_cleanup() {
	local p
	for p in "${PIDS[@]}"; do
		kill -TERM "$p" 2>/dev/null
		for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
	done
	[ -n "$HUGE_BEFORE" ] && echo "$HUGE_BEFORE" >/proc/sys/vm/nr_hugepages 2>/dev/null
}

# gpu_take_hugepages: as root, raise /proc/sys/vm/nr_hugepages to PB_HUGEPAGES (default 1100; 0 leaves it
# alone); gpu_cleanup gives back what this took.
gpu_take_hugepages() {
	local want=${PB_HUGEPAGES:-1100} cur
	if [ "$want" = 0 ] || [ ! -w /proc/sys/vm/nr_hugepages ]; then
		return 0
	fi
	cur=$(cat /proc/sys/vm/nr_hugepages)
	if [ "$cur" -lt "$want" ]; then
		HUGE_BEFORE=$cur
		echo "$want" >/proc/sys/vm/nr_hugepages
	fi
}

# gpu_start_daemon LABEL SOCKET [ARG...]: start pinbrokerd on SOCKET with DARGS and the ARGs, its output in DLOG,
# its pid in PIDS; wait (60 s at most) until it answers and its pool is warm (a prewarm above 1 GiB goes on warming
# beside the loop: pool_warming), then export PINBROKER_SOCKET=SOCKET. Else say so in LOG and return 1.
gpu_start_daemon() {
	local label=$1 sock=$2 pid
	shift 2
	echo "--- pinbrokerd $label: $*" >>"$DLOG"
	setsid "$DAEMON" --socket "$sock" "${DARGS[@]}" "$@" >>"$DLOG" 2>&1 </dev/null &
	pid=$!
	PIDS+=("$pid")
	for _ in $(seq 1 1200); do
		if "$PINCTL" --socket "$sock" status -o pool_warming --no-headers 2>/dev/null | grep -q false; then
			export PINBROKER_SOCKET=$sock
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.05
	done
	echo "FAIL: pinbrokerd $label did not answer on $sock; see $DLOG" | tee -a "$LOG"
	return 1
}

# gpu_daemon_section LABEL NAME FUNCTION [ARG...]: a daemon of its own on $TMP/LABEL.sock (gpu_start_daemon with
# the ARGs) for FUNCTION, run as gpu_section NAME; the daemon stopped after. A daemon that does not start or stop
# counts as a failed check.
gpu_daemon_section() {
	local label=$1 name=$2 fn=$3
	shift 3
	if gpu_start_daemon "$label" "$TMP/$label.sock" "$@"; then
		gpu_section "$name" "$fn"
		gpu_stop_last "$LOG" || FAILED=$((FAILED + 1))
	else
		FAILED=$((FAILED + 1))
	fi
}

# gpu_stop_last LOG: TERM the daemon started last and wait up to 10 s for it; else say so in LOG, KILL it
# and fail.
gpu_stop_last() {
	local p=${PIDS[-1]}
	unset 'PIDS[-1]'
	kill -TERM "$p" 2>/dev/null
	for _ in $(seq 1 200); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.05; done
	echo "FAIL: pinbrokerd $p did not stop" | tee -a "$1"
	kill -KILL "$p"
	return 1
}

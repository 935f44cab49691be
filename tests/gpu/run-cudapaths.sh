#!/bin/bash
# SPDX-License-Identifier: MIT
# GPU-host checks of the host memory the CUDA driver owns itself (issue 26, item 3): an unmodified program per path
# (tests/gpu/cudapaths_prog.cu: VMM with a host location, a host pool, CUDA 13's default host pool, a graph memory
# node with a host location) under `pinctl run`, step by step, against what `pinctl status` says: the VMM and pool
# bytes charged as registrations (what the driver says the pool reserves), graph nodes reported as unbrokered, and
# over the budget the fallback policy's answer (error: the out-of-memory error; cuda: pinned, reported unbrokered).
# The same program bare is the control: the broker sees none of it.
#
# usage: tests/gpu/run-cudapaths.sh [BUILD_DIR]   (default: build-gpu, then build)
# env:   OUT  results folder (default: a temp dir)
# Exits 0 when every check passed, 1 when one failed, 2 when a binary is missing, 77 without a GPU.
set -u
# A step's "go" may reach a program that already exited after its last step: a write to its fifo must
# fail (EPIPE), not kill this script with SIGPIPE (it did, on the H200, after the VMM steps).
trap '' PIPE
SRC=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/gpu/gpu-lib.sh
. "$SRC/tests/gpu/gpu-lib.sh"
gpu_find_build "${1:-}" tests/gpu/cudapaths_prog
PROG=$BUILD/tests/gpu/cudapaths_prog
gpu_out_dirs cudapaths
MIB=1048576
SIZE=$((256 * MIB))
DARGS=(--lock-memory yes --tight-mem-available-pct 3 --critical-mem-available-pct 1 --max-no-revoke-per-uid 100%)
RUN_PID=
cleanup() {
	[ -n "$RUN_PID" ] && kill -TERM "$RUN_PID" 2>/dev/null
	exec 9>&- 2>/dev/null
	gpu_cleanup
	rm -rf "$TMP"
}
trap cleanup EXIT

gpu_probe "$PROG"

figures() { echo "registered=$(gpu_status_field registered_bytes) unbrokered=$(gpu_status_field unbrokered_bytes)"; }

# The daemon sees a release a moment after the program makes it: retry for up to 3 s.
eventually_figures() { # what want ("registered=R unbrokered=U")
	local got end=$(($(date +%s%N) + 3000000000))
	while :; do
		got=$(figures)
		[ "$got" = "$2" ] && { gpu_ok "$1 ($got)"; return 0; }
		[ "$(date +%s%N)" -lt $end ] || break
		sleep 0.05
	done
	gpu_bad "$1: pinctl status shows $got, want $2"
	return 1
}

# Run the program (under pinctl run with a fallback, or bare) with its stdin on a fifo: each step is a line in
# $TMP/run.out, the next taken once the script writes a line.
run_start() { # fallback|bare path size
	local fb=$1
	shift
	rm -f "$TMP/run.fifo"
	mkfifo "$TMP/run.fifo"
	: >"$TMP/run.out"
	RUN_LINES=0
	local run=("$PINCTL" run --fallback "$fb" --label "pb-cudapaths-$$" --)
	[ "$fb" = bare ] && run=()
	echo "\$ ${run[*]} $PROG $*" >>"$LOG"
	"${run[@]}" "$PROG" "$@" <"$TMP/run.fifo" >"$TMP/run.out" 2>>"$LOG" &
	RUN_PID=$!
	exec 9>"$TMP/run.fifo"
}
# Wait for the next step line (60 s at most); sets STEP, RC, BYTES. Returns 1 when the program ended without it.
run_next() { # expected step name
	local line
	RUN_LINES=$((RUN_LINES + 1))
	for _ in $(seq 1 1200); do
		[ "$(wc -l <"$TMP/run.out")" -ge $RUN_LINES ] && break
		kill -0 "$RUN_PID" 2>/dev/null || break
		sleep 0.05
	done
	line=$(sed -n "${RUN_LINES}p" "$TMP/run.out")
	echo "  | $line" >>"$LOG"
	STEP=${line%% *}
	RC=$(sed -n 's/.* rc=\([0-9-]*\).*/\1/p' <<<"$line")
	BYTES=$(sed -n 's/.* bytes=\([0-9]*\).*/\1/p' <<<"$line")
	[ "$STEP" = "$1" ] && [ -n "$RC" ] && return 0
	gpu_bad "expected step $1, got '${line:-nothing}'"
	return 1
}
run_go() { echo >&9 2>/dev/null || true; }
run_end() { # -> the program's exit status
	local rc
	exec 9>&-
	for _ in $(seq 1 600); do kill -0 "$RUN_PID" 2>/dev/null || break; sleep 0.05; done
	kill -0 "$RUN_PID" 2>/dev/null && kill -TERM "$RUN_PID"
	wait "$RUN_PID"
	rc=$?
	RUN_PID=
	return $rc
}

# Each step's figure: VMM and pools are registrations of what the driver holds, nothing unbrokered.
charged_steps() { # path steps...
	local path=$1 s
	shift
	run_start cuda "$path" $SIZE
	for s in "$@"; do
		run_next "$s" || break
		if [ "$RC" != 0 ]; then
			gpu_bad "$path $s: the CUDA call failed (error $RC)"
			break
		fi
		eventually_figures "$path $s: charged what the driver holds, $((BYTES / MIB)) MiB" \
			"registered=$BYTES unbrokered=0"
		run_go
	done
	if run_end; then gpu_ok "$path: exit 0"; else gpu_bad "$path: exit $?"; fi
	eventually_figures "$path: nothing left after exit" "registered=0 unbrokered=0"
}

charged() {
	charged_steps vmm created released unmapped
	charged_steps pool created alloc2 freed trimmed destroyed gone
	charged_steps default-pool created alloc2 freed trimmed 'done'
	# Graph memory nodes: reported as unbrokered while their graph lives.
	run_start cuda graph $SIZE
	if run_next created; then
		if [ "$RC" = 0 ]; then
			eventually_figures "graph created: its host memory node reported unbrokered" "registered=0 unbrokered=$BYTES"
			run_go
			run_next destroyed && eventually_figures "graph destroyed: nothing reported" "registered=0 unbrokered=0"
		else
			echo "SKIP graph: the driver refuses a memory node with a host location (error $RC)" | tee -a "$LOG"
			run_go
		fi
	fi
	run_end
	# The control: bare, the broker sees nothing of the same VMM allocation.
	run_start bare vmm $SIZE
	run_next created && [ "$RC" = 0 ] && eventually_figures "vmm bare (control): the broker sees none of it" \
		"registered=0 unbrokered=0"
	run_end
}

# 256 MiB against a 16 MiB budget.
over_budget() {
	local path
	for path in vmm pool default-pool; do
		run_start error "$path" $SIZE
		if run_next created; then
			if [ "$RC" = 2 ]; then
				gpu_ok "$path --fallback error: the out-of-memory error"
			else
				gpu_bad "$path --fallback error: error $RC, want 2 (out of memory)"
			fi
			eventually_figures "$path --fallback error: nothing charged or pinned" "registered=0 unbrokered=0"
		fi
		run_end
		run_start cuda "$path" $SIZE
		if run_next created; then
			if [ "$RC" = 0 ]; then
				eventually_figures "$path --fallback cuda: pinned by the driver, reported unbrokered" \
					"registered=0 unbrokered=$BYTES"
			else
				gpu_bad "$path --fallback cuda: error $RC"
			fi
		fi
		run_end
		eventually_figures "$path --fallback cuda: nothing reported after exit" "registered=0 unbrokered=0"
	done
}

gpu_daemon_section checks "driver-owned host memory charged (VMM, host pool, default host pool, graph node)" charged \
	--budget 4G --prewarm 0 --hugetlb no
gpu_daemon_section small "over the budget: 256 MiB against 16 MiB" over_budget \
	--budget 16M --prewarm 0 --hugetlb no --max-pending-acquires 0

gpu_summary_head "Driver-owned host memory under the interposer" | tee "$OUT/cudapaths-summary.md"
echo "cudapaths: $PASSED passed, $FAILED failed (log $LOG)"
[ $FAILED = 0 ]

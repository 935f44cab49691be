#!/bin/bash
# SPDX-License-Identifier: MIT
# GPU-host run of staged copies (issue 39), in one visit of under 8 minutes on an H100:
#   1. tests/gpu/staging_prog (shared cudart + driver API) bare, under `pinctl run` with the default settings and with
#      a small slot (1M slot, 4M ring, 256K threshold: many boundaries), its INFO lines compared bare/interposed;
#   2. the ring as a lease: one "staging ring" lease of at most the ring's size while a program copies, none for a
#      program whose copies all go to the driver (pinned, managed, registered, small), nothing left after exit;
#   3. bench/bench_staging: pinned / stock / staged rates 256 KiB .. 1 GiB beside the host's memcpy ceiling;
#   4. bench/bench_staging_torch.py: torch stock against staged (pinbroker.torch's patch in one process, the
#      interposer under `pinctl run --no-torch` in alternated processes);
#   5. bench_staging --sweep (threads x slot x ring) when time is left (PB_SKIP_SWEEP=1: never).
# Raw output under $OUT; the tables last.
#
# usage: tests/gpu/run-staging.sh [BUILD_DIR]   (default: build-gpu, then build)
# env:   OUT              results folder (default: a temp dir)
#        PB_SKIP_SWEEP=1  no sweep;  PB_SKIP_TORCH=1  no torch benchmark;  PB_TORCH_ROUNDS  process pairs (default 2)
# Exits 0 when every check passed (the benchmarks report, they do not fail unless a copy's bytes differ), 1 when one
# failed, 2 when a binary is missing, 77 without a GPU.
set -u
T0=$(date +%s)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/gpu/gpu-lib.sh
. "$SRC/tests/gpu/gpu-lib.sh"
gpu_find_build "${1:-}" tests/gpu/staging_prog bench/bench_staging
PROG=$BUILD/tests/gpu/staging_prog
BENCH=$BUILD/bench/bench_staging
gpu_out_dirs staging
trap 'gpu_cleanup; rm -rf "$TMP"' EXIT

# No driver: the program cannot even start (it links libcuda.so.1).
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
	echo "SKIP run-staging: no libcuda.so.1 on this host (needs the GPU host)"
	exit 77
fi
gpu_probe "$PROG"

MIB=1048576
DARGS=(--lock-memory yes --tight-mem-available-pct 3 --critical-mem-available-pct 1 --max-no-revoke-per-uid 100%
	--budget 24G --prewarm 256M)
gpu_start_daemon staging "$TMP/staging.sock" || exit 1
# The build's libraries, also for Python (pinbroker.torch's patched side loads libpinbroker with ctypes).
export PINBROKER_LIBRARY=$BUILD/client/libpinbroker.so.1
export PYTHONPATH=$SRC/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
elapsed() { echo $(($(date +%s) - T0)); }

check() { # description command...
	local what=$1
	shift
	if "$@"; then gpu_ok "$what"; else gpu_bad "$what"; fi
}
# JSON from pinctl, read with python3 (no jq on the GPU host).
ring_leases() { # pid -> "bytes label" per staging ring lease of that pid
	"$PINCTL" leases --json 2>>"$LOG" | python3 -c '
import json, sys
for l in json.load(sys.stdin)["leases"]:
    if l.get("pid") == int(sys.argv[1]) and "staging ring" in (l.get("label") or ""):
        print(l["bytes"], l.get("label"))' "$1"
}
leased() { gpu_status_field leased_bytes; }

# --- 1. the correctness program: bare, interposed, interposed with a small slot
prog_run() { # tag seconds env... command...: run, keep its output, count its PASS/FAIL lines
	local tag=$1 limit=$2 out=$OUT/staging-prog-$1.txt rc
	shift 2
	echo "\$ $*" >>"$LOG"
	timeout "$limit" env "$@" >"$out" 2>&1 </dev/null
	rc=$?
	PASSED=$((PASSED + $(grep -c '^PASS' "$out")))
	grep '^FAIL' "$out" | sed "s/^/[$tag] /" | tee -a "$LOG" | head -20
	FAILED=$((FAILED + $(grep -c '^FAIL' "$out")))
	[ "$rc" = 0 ] || gpu_bad "staging_prog $tag: exit $rc ($(tail -1 "$out"))"
	echo "  $(tail -1 "$out")" >>"$LOG"
}
info_lines() { grep '^INFO' "$1" | grep -v '^INFO slot '; }
progs() {
	prog_run bare 100 PINBROKER_STAGING=0 "$PROG" check
	prog_run interposed 100 "$PINCTL" run --no-torch --label staging-check -- "$PROG" check
	prog_run small-slot 60 PINBROKER_STAGING_SLOT=1M PINBROKER_STAGING_RING=4M PINBROKER_STAGING_THRESHOLD=256K \
		"$PINCTL" run --no-torch --label staging-small -- "$PROG" check
	check "INFO lines (driver results) the same bare and interposed" \
		diff <(info_lines "$OUT/staging-prog-bare.txt") <(info_lines "$OUT/staging-prog-interposed.txt")
	check "INFO lines the same bare and interposed with a small slot" \
		diff <(info_lines "$OUT/staging-prog-bare.txt") <(info_lines "$OUT/staging-prog-small-slot.txt")
}
gpu_section "staging_prog: bare, interposed, small slot" progs

# --- 2. the ring as a lease
hold() { # mode label ring: run `staging_prog hold MODE` under pinctl run; check its ring leases while it holds
	local mode=$1 label=$2 ring=$3 out=$TMP/hold-$1-$2.out rel=$TMP/hold-$1-$2.release pid rows before
	before=$(leased)
	PB_HOLD_RELEASE=$rel PINBROKER_STAGING_RING=$ring "$PINCTL" run --no-torch --label "$label" -- \
		"$PROG" hold "$mode" >"$out" 2>&1 </dev/null &
	pid=$!
	for _ in $(seq 1 600); do grep -q '^hold' "$out" && break; kill -0 $pid 2>/dev/null || break; sleep 0.05; done
	if ! grep -q '^hold' "$out"; then
		gpu_bad "hold $mode: never reached hold ($(tail -1 "$out"))"
		touch "$rel"
		wait $pid
		return
	fi
	# pinctl run execs the program: the pid is the program's.
	rows=$(ring_leases $pid)
	"$PINCTL" leases >>"$LOG" 2>&1
	"$PINCTL" status --json >"$OUT/status-hold-$mode.json" 2>>"$LOG"
	echo "  hold $mode ring leases: ${rows:-none}" >>"$LOG"
	if [ "$mode" = staged ]; then
		check "hold staged: one staging ring lease while copying (${rows:-none})" \
			test "$(printf '%s\n' "$rows" | grep -c .)" = 1
		check "hold staged: the ring is at most PINBROKER_STAGING_RING=$ring bytes" \
			test "${rows%% *}" -gt 0 -a "${rows%% *}" -le "$ring" 2>/dev/null
	else
		check "hold passthrough: no staging ring for pinned, managed, registered and small copies" test -z "$rows"
	fi
	touch "$rel"
	wait $pid
	local rc=$?
	check "hold $mode: exit $rc ($(tail -1 "$out"))" test $rc = 0
	grep -E '^(PASS|FAIL)' "$out" >>"$LOG"
	FAILED=$((FAILED + $(grep -c '^FAIL' "$out")))
	for _ in $(seq 1 40); do [ "$(leased)" = "$before" ] && break; sleep 0.05; done
	check "hold $mode: leased bytes back to $before after exit (now $(leased))" test "$(leased)" = "$before"
}
leases() {
	hold staged staging-hold $((64 * MIB))
	hold staged staging-hold-32m $((32 * MIB))
	hold passthrough staging-pass $((64 * MIB))
}
gpu_section "the ring as a lease" leases

# --- 3. the C benchmark
bench() {
	echo "\$ $BENCH" >>"$LOG"
	timeout 180 "$BENCH" --raw "$OUT/bench-staging-raw.txt" >"$OUT/bench-staging.txt" 2>&1
	local rc=$?
	check "bench_staging: exit $rc, bytes exact at every size" test $rc = 0
	grep -q DIFFER "$OUT/bench-staging.txt" && gpu_bad "bench_staging: a staged copy's bytes differ"
}
gpu_section "bench_staging" bench

# --- 4. torch
torchbench() {
	if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>>"$LOG"; then
		echo "SKIP torch benchmark: python3 has no torch with CUDA" | tee -a "$LOG"
		return
	fi
	local left=$((440 - $(elapsed)))
	[ $left -gt 300 ] && left=300
	if [ $left -lt 90 ]; then
		gpu_bad "torch benchmark: not run, $(elapsed) s of the 8 minutes gone"
		return
	fi
	echo "\$ bench_staging_torch.py (${left}s left)" >>"$LOG"
	timeout $left python3 "$SRC/bench/bench_staging_torch.py" --out "$OUT" --pinctl "$PINCTL" \
		--rounds "${PB_TORCH_ROUNDS:-2}" --timeout 150 >"$OUT/torch-stdout.txt" 2>&1
	local rc=$?
	check "bench_staging_torch.py: exit $rc (every staged result equals the stock one)" test $rc = 0
}
[ "${PB_SKIP_TORCH:-0}" = 1 ] || gpu_section "torch: stock against staged" torchbench

# --- 5. the sweep, with the time left
sweep() {
	local left=$((465 - $(elapsed)))
	if [ $left -lt 60 ]; then
		echo "SKIP sweep: $(elapsed) s gone, $left s left of the 8 minutes" | tee -a "$LOG"
		return
	fi
	timeout $left "$BENCH" --sweep --reps 3 --raw "$OUT/bench-sweep-raw.txt" >"$OUT/bench-sweep.txt" 2>&1
	echo "  sweep exit $? after $(elapsed) s" >>"$LOG"
}
[ "${PB_SKIP_SWEEP:-0}" = 1 ] || gpu_section "bench_staging --sweep" sweep

gpu_stop_last "$DLOG" || FAILED=$((FAILED + 1))
{
	gpu_summary_head "Staged copies (issue 39), $(elapsed) s"
	echo
	[ -f "$OUT/bench-staging.txt" ] && cat "$OUT/bench-staging.txt"
	echo
	[ -f "$OUT/torch-table.md" ] && cat "$OUT/torch-table.md"
	echo
	[ -f "$OUT/bench-sweep.txt" ] && cat "$OUT/bench-sweep.txt"
	echo
	echo "checks: $PASSED passed, $FAILED failed; raw output in $OUT"
} | tee "$OUT/staging-summary.md"
[ "$FAILED" = 0 ]

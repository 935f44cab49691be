#!/bin/bash
# SPDX-License-Identifier: MIT
# GPU-host tests of libpinbroker-preload.so: unmodified CUDA programs (static and shared cudart, driver API) under
# `pinctl run`, checked against what pinbrokerd says (leases, status), the fallback policies, then a benchmark.
#
# usage: tests/gpu/run-preload.sh [BUILD_DIR]   (default: build-gpu, then build)
# env:   OUT             results folder (default: a temp dir)
#        PB_HUGEPAGES    as root, raise /proc/sys/vm/nr_hugepages to this for the benchmark's hugetlb pool (default
#                        1100; 0 leaves it alone). Huge pages taken here are given back at the end.
#        PB_SKIP_BENCH=1 tests only
# Exits 0 when every check passed (the benchmark reports, it does not fail), 1 when one failed, 2 when a binary is
# missing, 77 without a GPU.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
# The build, the output folders, the tally of checks; the daemons and huge pages this takes, given back at exit
# (shared with run-gpu.sh and run-cudapaths.sh).
# shellcheck source=tests/gpu/gpu-lib.sh
. "$SRC/tests/gpu/gpu-lib.sh"
gpu_find_build "${1:-}" tests/gpu/preload_prog_static tests/gpu/preload_prog_shared tests/gpu/preload_driver
declare -A PROG=([static]=$BUILD/tests/gpu/preload_prog_static [shared]=$BUILD/tests/gpu/preload_prog_shared
	[driver]=$BUILD/tests/gpu/preload_driver)
KINDS=(static shared driver)
gpu_out_dirs preload

MIB=1048576
PAGE=4096
HOLD_SIZES=(1 4097 $((64 * MIB + 123)))
FALLBACK_BYTES=$((64 * MIB))
# As run-gpu.sh: pressure thresholds sit low (a VM's MemAvailable may start small). Preloaded allocations are
# never-revoked leases, which max-no-revoke-per-uid caps at 50% of the uid quota by default: allow all of it.
DARGS=(--lock-memory yes --tight-mem-available-pct 3 --critical-mem-available-pct 1 --max-no-revoke-per-uid 100%)
HOLDS=()
cleanup() {
	local p
	for p in "${HOLDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
	gpu_cleanup
	rm -rf "$TMP"
}
trap cleanup EXIT

# Skip before touching anything when there is no GPU.
gpu_probe "${PROG[static]}"

[ "${PB_SKIP_BENCH:-0}" = 1 ] || gpu_take_hugepages

# JSON from pinctl, read with python3 (on the GPU host; no jq there).
leases_of() { # label -> one line per lease: "bytes registration no_revoke" (sorted by bytes)
	"$PINCTL" leases --json 2>>"$LOG" | python3 -c '
import json, sys
rows = [l for l in json.load(sys.stdin)["leases"] if l.get("label") == sys.argv[1]]
for l in sorted(rows, key=lambda l: l["bytes"]):
    print(l["bytes"], int(bool(l.get("registration"))), int(bool(l.get("no_revoke"))))' "$1"
}
counters() { # the budget figures a finished program must leave as it found them
	"$PINCTL" status --json 2>>"$LOG" | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(" ".join("%s=%s" % (k, d.get(k)) for k in ("leased_bytes", "registered_bytes", "no_revoke_bytes", "unbrokered_bytes")))'
}

check() { # description command...: PASS when the command succeeds
	local what=$1
	shift
	if "$@"; then gpu_ok "$what"; else gpu_bad "$what"; fi
}

# Run a program's `hold` under pinctl run in the background; sets HOLD_PID and HOLD_OUT. Returns 1 when it did not
# reach "hold" (its output is in the log then).
HOLD_N=0
hold_start() { # fallback label kind prog sizes...
	local fb=$1 label=$2 kind=$3 prog=$4
	shift 4
	HOLD_N=$((HOLD_N + 1))
	HOLD_OUT=$TMP/hold$HOLD_N.out
	HOLD_REL=$TMP/hold$HOLD_N.release
	HOLD_EXIT=$TMP/hold$HOLD_N.exit
	local run=("$PINCTL" run --fallback "$fb" --label "$label" --)
	[ "$fb" = bare ] && run=() # fallback "bare": the program alone, not interposed (a baseline)
	echo "\$ ${run[*]} $prog hold $* (PB_HOLD_KIND=$kind)" >>"$LOG"
	local start=()
	[ -n "${HOLD_START:-}" ] && start=("PB_HOLD_START=$HOLD_START")
	env "${start[@]}" PB_HOLD_RELEASE="$HOLD_REL" PB_HOLD_EXIT="$HOLD_EXIT" PB_HOLD_KIND="$kind" PB_HOLD_TIMEOUT_S=120 \
		"${run[@]}" "$prog" hold "$@" >"$HOLD_OUT" 2>&1 </dev/null &
	HOLD_PID=$!
	HOLDS+=("$HOLD_PID")
	if [ -n "${HOLD_START:-}" ]; then
		wait_line '^ready' || return 1
		"${HOLD_AT_READY[@]}"
		touch "$HOLD_START"
	fi
	wait_line '^hold ' || return 1
}
wait_line() { # regex: wait for it in HOLD_OUT while the hold process lives (60 s at most)
	for _ in $(seq 1 1200); do
		grep -qE "$1" "$HOLD_OUT" && return 0
		kill -0 "$HOLD_PID" 2>/dev/null || break
		sleep 0.05
	done
	grep -qE "$1" "$HOLD_OUT" && return 0
	echo "  hold output (wanted /$1/):" >>"$LOG"
	sed 's/^/  | /' "$HOLD_OUT" >>"$LOG"
	return 1
}
hold_free() { touch "$HOLD_REL"; wait_line '^released'; }
hold_end() { # -> the hold process's exit status (through pinctl run); TERM after 60 s
	local rc
	touch "$HOLD_REL" "$HOLD_EXIT"
	for _ in $(seq 1 1200); do kill -0 "$HOLD_PID" 2>/dev/null || break; sleep 0.05; done
	kill -0 "$HOLD_PID" 2>/dev/null && { echo "  hold $HOLD_PID did not exit: TERM" >>"$LOG"; kill -TERM "$HOLD_PID"; }
	wait "$HOLD_PID"
	rc=$?
	sed 's/^/  | /' "$HOLD_OUT" >>"$LOG"
	return $rc
}
expect_eq() { # what got want
	[ "$2" = "$3" ] && return 0
	echo "  $1: got '$2', want '$3'" >>"$LOG"
	return 1
}
# The daemon sees a free or an exit a moment later than the program makes it: retry for up to 2 s.
eventually_eq() { # what command want: the command's output must become want
	local what=$1 cmd=$2 want=$3 got end=$(($(date +%s%N) + 2000000000))
	while :; do
		got=$($cmd)
		[ "$got" = "$want" ] && return 0
		[ "$(date +%s%N)" -lt $end ] || break
		sleep 0.05
	done
	expect_eq "$what" "$got" "$want"
}
eventually_ge() { # what command min
	local got end=$(($(date +%s%N) + 2000000000))
	while :; do
		got=$($2)
		[ "$got" -ge "$3" ] 2>/dev/null && return 0
		[ "$(date +%s%N)" -lt $end ] || break
		sleep 0.05
	done
	echo "  $1: got '$got', want >= $3" >>"$LOG"
	return 1
}
unbrokered() { gpu_status_field unbrokered_bytes; }
round_page() { echo $(( ($1 + PAGE - 1) / PAGE * PAGE )); }

# hold: a lease per allocation, of the page-rounded size and the label, gone again after the free.
hold_test() { # prog-kind hold-kind
	local k=$1 hk=$2 label="pb-$1-$2-$$" want="" s start got reg
	reg=$([ "$hk" = alloc ] || [ "$hk" = mapped ] && echo 0 || echo 1)
	for s in "${HOLD_SIZES[@]}"; do want+="$(round_page "$s") $reg"$'\n'; done
	want=$(printf '%s' "$want" | sort -n)
	start=$(counters)
	if ! hold_start cuda "$label" "$hk" "${PROG[$k]}" "${HOLD_SIZES[@]}"; then
		gpu_bad "$k hold ($hk): did not start"
		hold_end
		return
	fi
	got=$(leases_of "$label" | cut -d' ' -f1,2)
	check "$k hold ($hk): one lease per allocation, page-rounded, label $label, registration=$reg" \
		expect_eq "leases" "$got" "$want"
	if [ "$hk" = alloc ] || [ "$hk" = mapped ]; then
		got=$(leases_of "$label" | awk '$3 != 1' | wc -l)
		check "$k hold ($hk): the leases are never-revoked" expect_eq "leases not no_revoke" "$got" 0
	fi
	if hold_free; then
		check "$k hold ($hk): no lease left after the free" expect_eq "leases" "$(leases_of "$label")" ""
		check "$k hold ($hk): budget counters back after the free (process alive)" \
			eventually_eq "counters" counters "$start"
	else
		gpu_bad "$k hold ($hk): never said released"
	fi
	check "$k hold ($hk): exit 0" hold_end
	check "$k hold ($hk): budget counters back after exit" eventually_eq "counters" counters "$start"
}

run_check() { # prog-kind bare|interposed: bare is the baseline (a FAIL there is the test's or the host's, not the
	# interposer's); the INFO lines of both land in the log for a line-by-line comparison
	local k=$1 mode=$2 rc line start
	local cmd=("${PROG[$k]}" check)
	[ "$mode" = interposed ] && cmd=("$PINCTL" run --label "pb-$k-check-$$" -- "${PROG[$k]}" check)
	start=$(counters)
	echo "\$ ${cmd[*]}" >>"$LOG"
	"${cmd[@]}" >"$TMP/check.out" 2>&1 </dev/null
	rc=$?
	sed 's/^/  | /' "$TMP/check.out" >>"$LOG"
	cp "$TMP/check.out" "$OUT/preload-check-$k-$mode.txt"
	grep -E '^FAIL' "$TMP/check.out" | head -10
	line=$(grep -E '^preload_(prog|driver):' "$TMP/check.out" | tail -1)
	check "$k check ($mode): exit 0 (${line:-no summary line})" expect_eq "check exit" "$rc" 0
	check "$k check ($mode): budget counters back after exit" eventually_eq "counters" counters "$start"
	CHECK_LINE[$k-$mode]="${line#*: }, exit $rc"
}

declare -A CHECK_LINE
# A plugin dlopen()ed with RTLD_DEEPBIND binds cuMemHostAlloc to libcuda.so.1 itself (issue 22, finding 6): under
# pinctl run the interposer must still see it, so the 64 MiB is a lease of the program's label, freed at exit.
deepbind() {
	local label=pb-deep-$$ out=$TMP/deep.out fifo=$TMP/deep.fifo pid got=
	local prog=$BUILD/tests/gpu/deepbind_prog plugin=$BUILD/tests/gpu/libdeepbind_plugin.so
	[ -x "$prog" ] && [ -e "$plugin" ] || { gpu_bad "deep-bound plugin: $prog or $plugin missing"; return; }
	mkfifo "$fifo"
	"$PINCTL" run --label "$label" -- "$prog" "$plugin" $((64 * MIB)) <"$fifo" >"$out" 2>&1 &
	pid=$!
	exec 9>"$fifo"
	for _ in $(seq 1 600); do grep -q '^hold' "$out" && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
	grep -q '^hold' "$out" && got=$(leases_of "$label" | awk '{s += $1} END {print s + 0}')
	cat "$out" >>"$LOG"
	check "deep-bound plugin: its cuMemHostAlloc of 64 MiB is a lease of the program's label (${got:-none} bytes)" \
		test "${got:-0}" -ge $((64 * MIB))
	exec 9>&-
	wait $pid
	check "deep-bound plugin: freed, the program exited 0 ($(tail -1 "$out"))" grep -q '^freed 0' "$out"
	check "deep-bound plugin: nothing of its label left leased" test -z "$(leases_of "$label")"
}

programs() {
	local k hk
	for k in "${KINDS[@]}"; do
		run_check "$k" bare
		run_check "$k" interposed
		for hk in alloc mapped register wc; do hold_test "$k" "$hk"; done
	done
}

# A budget smaller than the request: each fallback policy.
fallbacks() {
	local k label start u
	for k in "${KINDS[@]}"; do
		start=$(unbrokered)
		label="pb-$k-fb-cuda-$$"
		if hold_start cuda "$label" alloc "${PROG[$k]}" "$FALLBACK_BYTES"; then
			check "$k --fallback cuda: allocation served, unbrokered >= $FALLBACK_BYTES while held" \
				eventually_ge "unbrokered" unbrokered $((start + FALLBACK_BYTES))
			check "$k --fallback cuda: no lease" expect_eq "leases" "$(leases_of "$label")" ""
			hold_free || gpu_bad "$k --fallback cuda: never said released"
			check "$k --fallback cuda: unbrokered back after the free" \
				eventually_eq "unbrokered" unbrokered "$start"
		else
			gpu_bad "$k --fallback cuda: the allocation failed"
		fi
		check "$k --fallback cuda: exit 0" hold_end
		check "$k --fallback cuda: unbrokered back after exit" eventually_eq "unbrokered" unbrokered "$start"

		echo "\$ pinctl run --fallback error -- ${PROG[$k]} expect-oom $FALLBACK_BYTES" >>"$LOG"
		"$PINCTL" run --fallback error --label "pb-$k-fb-error-$$" -- "${PROG[$k]}" expect-oom "$FALLBACK_BYTES" \
			>"$TMP/oom.out" 2>&1 </dev/null
		u=$?
		sed 's/^/  | /' "$TMP/oom.out" >>"$LOG"
		grep -E '^FAIL' "$TMP/oom.out" | head -5
		check "$k --fallback error: the allocation fails with out-of-memory" expect_eq "expect-oom exit" "$u" 0

		label="pb-$k-fb-pageable-$$"
		if hold_start pageable "$label" alloc "${PROG[$k]}" "$FALLBACK_BYTES"; then
			check "$k --fallback pageable: no lease" expect_eq "leases" "$(leases_of "$label")" ""
			check "$k --fallback pageable: nothing unbrokered" expect_eq "unbrokered" "$(unbrokered)" "$start"
		else
			gpu_bad "$k --fallback pageable: the allocation failed"
		fi
		check "$k --fallback pageable: exit 0" hold_end
	done
}

# The host's memory while a program pins more than the budget, against what pinctl status accounts for. CUDA's pinned
# pages are in no /proc counter, so this reads MemAvailable: what a program takes beyond its CUDA context (a 4 KiB
# hold's figure) must be what the daemon reports as unbrokered, the leased bytes coming from the pool, which stays
# within the budget. The same program not interposed is the control: there the whole request shows as taken.
#
# MemAvailable also moves by itself (page cache reclaimed or refilled, other processes, the kernel's own
# allocations), and one reading of it once failed the control (592 MiB seen of 704 MiB pinned, passing in the next
# run). So each figure is read once it has settled (two medians within MEM_SETTLE_BYTES), each run is made three times
# and its median taken, and the context is measured the way the run it is subtracted from is made: bare for the
# control, interposed for the interposed run (the interposer and its lease cost a context something of their own).
# The spread of the three runs is logged with each figure: a failure beyond it is the program's, not the noise's.
MEM_SETTLE_BYTES=$((8 * MIB))
mem_avail() { # MemAvailable in bytes, the median of five reads 100 ms apart
	# kB times 1024 in the shell: mawk (Debian's and Ubuntu's awk) prints a product past 2^31 as 2.44159e+10.
	for _ in 1 2 3 4 5; do
		echo $(($(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) * 1024))
		sleep 0.1
	done | sort -n | sed -n 3p
}
mem_settled() { # MemAvailable once two medians in a row agree within MEM_SETTLE_BYTES (ten tries at most)
	local a b d
	a=$(mem_avail)
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		b=$(mem_avail)
		d=$((a > b ? a - b : b - a))
		[ $d -le $MEM_SETTLE_BYTES ] && break
		a=$b
	done
	echo "$b"
}
at_ready_mem() { M0=$(mem_settled); P0=$(gpu_status_field pool_bytes); }
taken_by() { # fallback label sizes...: bytes of MemAvailable a held program takes by its pins alone (sets TAKEN_U,
	# the unbrokered bytes, and TAKEN_L, the leased bytes, while it holds). The program makes its CUDA context
	# first and pins only once measured with it: a context's few hundred MiB vary from run to run, and
	# subtracting another run's context left a spread of 400 MiB on an H100 host.
	local fb=$1 label=$2 m1
	shift 2
	HOLD_START=$TMP/hold-start.$((HOLD_N + 1))
	HOLD_AT_READY=(at_ready_mem)
	if ! hold_start "$fb" "$label" alloc "${PROG[static]}" "$@"; then
		HOLD_START=
		hold_end
		return 1
	fi
	HOLD_START=
	m1=$(mem_settled)
	TAKEN_U=$(unbrokered)
	TAKEN_L=$(gpu_status_field leased_bytes)
	# Beyond the pool: a lease the pool lacks the chunks for makes them (and may drop idle ones of other
	# sizes), so the pool's own resident bytes move while the program holds; bare runs leave it alone.
	TAKEN=$((M0 - m1 - ($(gpu_status_field pool_bytes) - P0)))
	hold_end
}
taken_median() { # fallback label sizes...: taken_by three times; TAKEN the median, SPREAD max - min
	local v=()
	for _ in 1 2 3; do
		taken_by "$@" || return 1
		v+=("$TAKEN")
		# The program's leases and reports are gone before the next run measures.
		eventually_eq "unbrokered" unbrokered 0 >/dev/null
	done
	mapfile -t v < <(printf '%s\n' "${v[@]}" | sort -n)
	TAKEN=${v[1]}
	SPREAD=$((v[2] - v[0]))
}
host_total() {
	local small=$((192 * MIB)) big=$((512 * MIB)) bare inter budget pool tol spread_bare
	budget=$(gpu_status_field budget_bytes)
	taken_median bare "pb-host-bare-$$" $small $big || { gpu_bad "host total: the bare hold failed"; return; }
	bare=$TAKEN
	spread_bare=$SPREAD
	taken_median cuda "pb-host-$$" $small $big || { gpu_bad "host total: the interposed hold failed"; return; }
	inter=$TAKEN
	pool=$(gpu_status_field pool_bytes)
	tol=$((64 * MIB))
	HOST_LINE="not interposed: $((bare / MIB)) MiB taken beside its CUDA context for $(((small + big) / MIB)) MiB pinned \
(median of 3, spread $((spread_bare / MIB)) MiB); interposed: $((inter / MIB)) MiB taken (spread $((SPREAD / MIB)) MiB), \
$((TAKEN_U / MIB)) MiB reported unbrokered, $((TAKEN_L / MIB)) MiB leased from a pool of $((pool / MIB)) MiB (budget \
$((budget / MIB)) MiB)"
	echo "  host total: $HOST_LINE" >>"$LOG"
	check "host total: the control (not interposed) shows its pinned bytes taken ($((bare / MIB)) MiB >= 90% of \
$(((small + big) / MIB)) MiB)" [ "$bare" -ge $(((small + big) * 9 / 10)) ]
	check "host total: interposed, the over-budget part is reported unbrokered ($((TAKEN_U / MIB)) MiB >= $((big / MIB)))" \
		[ "$TAKEN_U" -ge $big ]
	check "host total: interposed, what the host lost beyond the pool is the unbrokered figure, within 64 MiB \
($((inter / MIB)) MiB against $((TAKEN_U / MIB)) MiB)" [ "$inter" -le $((TAKEN_U + tol)) -a "$inter" -ge $((TAKEN_U - tol)) ]
	check "host total: leased within the pool and the pool within the budget ($((TAKEN_L / MIB)) <= $((pool / MIB)) \
<= $((budget / MIB)) MiB)" [ "$TAKEN_L" -le "$pool" -a "$pool" -le "$budget" ]
}

gpu_daemon_section checks "preloaded programs (check, hold: alloc, mapped, register, wc)" programs \
	--budget 8G --prewarm 512M --hugetlb no
gpu_daemon_section small "fallbacks: 64 MiB against a 16 MiB budget" fallbacks \
	--budget 16M --prewarm 0 --hugetlb no --max-pending-acquires 0
gpu_daemon_section host "host total: pinned memory within the budget plus unbrokered" host_total \
	--budget 256M --prewarm 256M --hugetlb no --max-pending-acquires 0 --pool-shrink-delay-ms 3600000
gpu_daemon_section deep "deep-bound plugin (RTLD_DEEPBIND) under pinctl run" deepbind \
	--budget 256M --prewarm 0 --hugetlb no

# Benchmark: the same binary bare and under pinctl run, one after the other, against a warm pool.
BENCH_MD=$OUT/preload-bench.md
if [ "${PB_SKIP_BENCH:-0}" != 1 ]; then
	if [ "$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)" -ge 1024 ] 2>/dev/null; then huge=yes; else huge=no; fi
	echo "=== benchmark (hugetlb $huge)" | tee -a "$LOG"
	if gpu_start_daemon bench "$TMP/bench.sock" --budget 4G --prewarm 2G --hugetlb "$huge" \
		--pool-shrink-delay-ms 3600000; then
		for k in static shared; do
			"${PROG[$k]}" bench >"$OUT/preload-bench-$k-real.txt" 2>&1
			echo "$k real: exit $?" >>"$LOG"
			"$PINCTL" run --label "pb-bench-$k-$$" -- "${PROG[$k]}" bench >"$OUT/preload-bench-$k-interposed.txt" 2>&1
			echo "$k interposed: exit $?" >>"$LOG"
			# Whether the interposer was reached at all: the daemon logs every lease it grants, with its label.
			grep -c "label pb-bench-$k-$$\$" "$DLOG" >"$OUT/preload-bench-$k-leases.txt"
		done
		gpu_stop_last "$LOG"
		python3 - "$OUT" "$huge" >"$BENCH_MD" <<'EOF'
import os, sys
out, huge = sys.argv[1], sys.argv[2]
def load(path):
    r = {}
    if os.path.exists(path):
        for line in open(path):
            f = line.split()
            if len(f) == 4 and f[0] == "bench":
                r[(f[1], int(f[2]))] = float(f[3])
    return r
def size(b):
    return "%d GiB" % (b >> 30) if b >= 1 << 30 else "%d MiB" % (b >> 20)
print("## Preload interposer benchmark (pool hugetlb %s)" % huge)
print()
print("| program | figure | size | real | interposed | interposed/real | target |")
print("|---|---|---|---:|---:|---:|---|")
for k in ("static", "shared"):
    real = load(os.path.join(out, "preload-bench-%s-real.txt" % k))
    pre = load(os.path.join(out, "preload-bench-%s-interposed.txt" % k))
    try:
        leases = int(open(os.path.join(out, "preload-bench-%s-leases.txt" % k)).read().split()[0])
    except (OSError, ValueError, IndexError):
        leases = 0
    prog = "%s cudart (%s)" % (k, "%d leases" % leases if leases else "NOT interposed: no lease")
    for (fig, b) in sorted(real, key=lambda x: (x[0] != "h2d_gbps", x[0], x[1])):
        r, p = real[(fig, b)], pre.get((fig, b))
        if fig == "h2d_gbps":
            ratio = "%.3f" % (p / r) if p and r else "-"
            target = ">= 0.98: %s" % ("met" if p and r and p / r >= 0.98 else "MISSED")
            unit = "GB/s"
        elif fig == "alloc_ms":
            ratio = "%.1fx faster" % (r / p) if p and r else "-"
            target = ">= 10x (warm pool): %s" % ("met" if p and r and r / p >= 10 else "MISSED")
            unit = "ms"
        else:
            ratio = "%.1fx faster" % (r / p) if p and r else "-"
            target = ""
            unit = "ms"
        print("| %s | %s %s | %s | %.3g | %s | %s | %s |" % (prog, fig, unit, size(b), r,
              "%.3g" % p if p is not None else "-", ratio, target))
EOF
	else
		echo "benchmark not run: its pinbrokerd did not start" >"$BENCH_MD"
	fi
fi

{
	gpu_summary_head "Preload interposer tests"
	echo "- host total: ${HOST_LINE:-not measured}"
	for k in "${KINDS[@]}"; do
		echo "- $k check: bare ${CHECK_LINE[$k-bare]:-not run}; interposed ${CHECK_LINE[$k-interposed]:-not run}"
	done
	[ -f "$BENCH_MD" ] && { echo; cat "$BENCH_MD"; }
} | tee "$OUT/preload-summary.md"
echo "preload: $PASSED passed, $FAILED failed (log $LOG)"
[ $FAILED = 0 ]

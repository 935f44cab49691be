#!/bin/bash
# SPDX-License-Identifier: MIT
# The pinned DataLoader on a GPU host: starts pinbrokerd on a temp socket (huge pages when root can have them),
# runs python/bench/gpu_loader_check.py, python/bench/h2d_after_cpu.py (a probe: it reports) and
# python/bench/bench_loader.py against it, writes everything to $OUT and prints the benchmark table last.
#
# usage: python/bench/run-gpu.sh [BUILD_DIR]   (default: build-gpu, then build)
# env:   OUT            results folder (default: a temp dir)
#        PYTHON         the interpreter with a CUDA torch (default python3)
#        PB_HUGEPAGES   as root, raise /proc/sys/vm/nr_hugepages to this for the daemon's pool (default 1100,
#                       2.2 GiB; 0 leaves it alone and uses 4 KiB pages). Given back at the end.
#        PB_BUDGET      the daemon's budget (default 8G: the largest ring, 20 slots of 38.5 MB x 1.25, is ~1 GB)
#        PB_PREWARM     the pool kept warm without huge pages (default 2G)
#        BENCH_ARGS     extra arguments for bench_loader.py (e.g. "--repeats 5")
#        PB_LOADER_BENCH 0 runs the checks only, not bench_loader.py
#        PB_H2D_PROBE   0 leaves out h2d_after_cpu.py (about 40 s)
# Exits 0 when the checks passed (the benchmark reports, it does not fail), 1 when one failed, 77 without a GPU.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-}
export OUT=${OUT:-$(mktemp -d /tmp/pb-loader-out.XXXXXX)}
mkdir -p "$OUT"
# shellcheck source=python/bench/bench-lib.sh
. "$SRC/python/bench/bench-lib.sh"
bench_need_torch cuda

WANT_HUGE=${PB_HUGEPAGES:-1100}
HUGE=no
if [ "$WANT_HUGE" != 0 ] && [ -w /proc/sys/vm/nr_hugepages ]; then
	cur=$(cat /proc/sys/vm/nr_hugepages)
	if [ "$cur" -lt "$WANT_HUGE" ]; then
		HUGE_BEFORE=$cur
		echo "$WANT_HUGE" >/proc/sys/vm/nr_hugepages
	fi
	[ "$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)" -ge 1024 ] 2>/dev/null && HUGE=yes
fi
# With huge pages the pool is them (2 GiB of them: enough for the largest ring); else 4 KiB pages.
if [ $HUGE = yes ]; then
	DARGS=(--budget 2G --prewarm 2G --hugetlb yes)
else
	DARGS=(--budget "${PB_BUDGET:-8G}" --prewarm "${PB_PREWARM:-2G}" --hugetlb no)
fi
echo "pinbrokerd: ${DARGS[*]} --lock-memory $LOCK (huge pages: $(awk '/HugePages_Free/ {print $2}' /proc/meminfo) free)" | tee "$OUT/setup.txt"
bench_start_daemon "${DARGS[@]}" --lock-memory $LOCK

echo "=== gpu_loader_check"
"$PY" "$SRC/python/bench/gpu_loader_check.py" --out "$OUT" 2>&1 | tee "$OUT/gpu_loader_check.log"
CHECK=${PIPESTATUS[0]}

PROBE=skipped
if [ "${PB_H2D_PROBE:-1}" != 0 ]; then
	echo "=== h2d_after_cpu"
	timeout 180 "$PY" "$SRC/python/bench/h2d_after_cpu.py" --out "$OUT" >"$OUT/h2d_after_cpu.log" 2>&1
	PROBE=$?
fi

BENCH=skipped
if [ "${PB_LOADER_BENCH:-1}" != 0 ]; then
	echo "=== bench_loader"
	# shellcheck disable=SC2086
	timeout 420 "$PY" "$SRC/python/bench/bench_loader.py" --out "$OUT" ${BENCH_ARGS:-} >"$OUT/bench_loader.log" 2>&1
	BENCH=$?
	grep -E '^ +' "$OUT/bench_loader.log" | tail -20
fi
"$PINCTL" --socket "$SOCK" status >"$OUT/pinctl-status.txt" 2>&1

echo
echo "## pinned DataLoader on $(hostname) ($(date -u +%FT%TZ)); results in $OUT"
echo
grep -E '^(PASS|FAIL)' "$OUT/gpu_loader_check.log"
echo "gpu_loader_check exit $CHECK, h2d_after_cpu exit $PROBE, bench_loader exit $BENCH"
echo
[ -f "$OUT/h2d_after_cpu.md" ] && cat "$OUT/h2d_after_cpu.md" && echo
if [ -f "$OUT/bench_loader.md" ]; then cat "$OUT/bench_loader.md"; else tail -20 "$OUT/bench_loader.log"; fi
[ "$CHECK" = 0 ] || exit 1
exit 0

#!/bin/bash
# SPDX-License-Identifier: MIT
# Issue 25's benchmark of torch's pinned memory on a GPU host: starts pinbrokerd on a temp socket, runs
# python/bench/torch_alloc_bench.py (stock torch against pinbroker.torch.install(), side by side, rows a-e) and
# then python/bench/h2d_probe.py (H2D from pinbroker memory against torch's pinned tensor, and why), writes
# everything to $OUT and prints both tables last. About 3-5 minutes.
#
# usage: python/bench/run-torch-bench.sh [BUILD_DIR]   (default: build-gpu, then build)
# env:   OUT          results folder (default: a temp dir)
#        PYTHON       the interpreter with a CUDA torch (default python3)
#        PB_BUDGET    the daemon's budget (default 24G); PB_PREWARM its warm pool (default 2G)
#        PB_HUGETLB   the daemon's --hugetlb (default no: 4 KiB pages, THP where shmem allows, as run-torch.sh)
#        BENCH_ARGS   extra arguments for torch_alloc_bench.py (e.g. "--rounds 3 --total-s 400")
#        PROBE_ARGS   extra arguments for h2d_probe.py; PB_PROBE=0 skips it (e.g. a run of row c alone)
#        PB_CPU_DRY   1: a smoke test on a CPU host (--cpu-dry: no pinning, no copies; the numbers mean nothing)
# Exits 0 when both ran (a benchmark reports, it does not fail), 1 when one crashed or timed out, 77 without CUDA.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-}
export OUT=${OUT:-$(mktemp -d /tmp/pb-torchbench-out.XXXXXX)}
mkdir -p "$OUT"
# shellcheck source=python/bench/bench-lib.sh
. "$SRC/python/bench/bench-lib.sh"

# PB_CPU_DRY=1: a smoke test of this script on a CPU host (both scripts with --cpu-dry: no pinning, no copies).
DRY=()
if [ "${PB_CPU_DRY:-0}" = 1 ]; then
	DRY=(--cpu-dry --workers 2)
	bench_need_torch any
else
	bench_need_torch cuda
fi

DARGS=(--budget "${PB_BUDGET:-24G}" --prewarm "${PB_PREWARM:-2G}" --hugetlb "${PB_HUGETLB:-no}"
	--max-no-revoke-per-uid 100% --lock-memory "$LOCK")
echo "pinbrokerd: ${DARGS[*]}" | tee "$OUT/setup.txt"
bench_start_daemon "${DARGS[@]}"
export PYTHONPATH=$SRC/python${PYTHONPATH:+:$PYTHONPATH}
unset PINBROKER_TORCH
{
	echo "torch: $("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))' 2>&1)"
	echo "host: $(hostname), $(nproc) CPUs, $(uname -r), $(date -u +%FT%TZ)"
	command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader 2>&1
} | tee -a "$OUT/setup.txt"

echo "=== torch_alloc_bench (stock, pinbroker, pinbroker, stock)"
# Its --total-s (default 240) bounds the sides it starts, and each side the time left: a minute past it is a hang.
# (A fixed 300 s killed a --total-s 340 run before it wrote its table.)
TOTAL_S=$(echo " ${BENCH_ARGS:-} " | sed -n 's/.* --total-s[ =]\([0-9]*\).*/\1/p')
# shellcheck disable=SC2086 # BENCH_ARGS is split on purpose
timeout $((${TOTAL_S:-240} + 60)) "$PY" "$SRC/python/bench/torch_alloc_bench.py" --out "$OUT" "${DRY[@]}" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/torch_alloc_bench.log"
BENCH=${PIPESTATUS[0]}
[ "$BENCH" = 77 ] && { echo "SKIP: torch_alloc_bench found no CUDA"; exit 77; }
"$PINCTL" --socket "$SOCK" status >"$OUT/pinctl-status-after-bench.txt" 2>&1

PROBE=0
if [ "${PB_PROBE:-1}" != 0 ]; then
	echo "=== h2d_probe"
	# shellcheck disable=SC2086 # PROBE_ARGS is split on purpose
	timeout 120 "$PY" "$SRC/python/bench/h2d_probe.py" --out "$OUT" "${DRY[@]}" ${PROBE_ARGS:-} >"$OUT/h2d_probe.log" 2>&1
	PROBE=$?
fi
"$PINCTL" --socket "$SOCK" status >"$OUT/pinctl-status.txt" 2>&1

echo
echo "## torch's pinned memory on $(hostname) ($(date -u +%FT%TZ)); results in $OUT"
echo
if [ "${PB_PROBE:-1}" != 0 ]; then
	echo "torch_alloc_bench exit $BENCH, h2d_probe exit $PROBE"
else
	echo "torch_alloc_bench exit $BENCH, h2d_probe not run (PB_PROBE=0)"
fi
echo
if [ -f "$OUT/torch_alloc_bench.md" ]; then cat "$OUT/torch_alloc_bench.md"; else tail -20 "$OUT/torch_alloc_bench.log"; fi
echo
if [ -f "$OUT/h2d_probe.md" ]; then
	cat "$OUT/h2d_probe.md"
elif [ -f "$OUT/h2d_probe.log" ]; then
	tail -20 "$OUT/h2d_probe.log"
fi
[ "$BENCH" = 0 ] && [ "$PROBE" = 0 ] && exit 0
exit 1

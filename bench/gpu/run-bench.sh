#!/bin/bash
# SPDX-License-Identifier: MIT
# Runs every GPU benchmark section (pool warm-up, many jobs, set-up time, bandwidth, PyTorch) against freshly started
# pinbrokerd instances on temp sockets, and writes the raw RESULT lines plus markdown tables.
#
# usage: bench/gpu/run-bench.sh [BUILD_DIR]      (default: build-gpu, then build)
# env:   OUT                  where results go (default: a temp dir, printed)
#        PB_WARMUP_BYTES      pool warm-up size (default 16G)
#        PB_JOBS PB_JOB_BYTES many-jobs processes and bytes each (default 8 and 2G)
#        PB_HUGEPAGES_BIG     as root, raise nr_hugepages to this for a hugetlb pool as large as the warm-up
#                             (default 8400; 0 = use the huge pages already free, if any); restored at the end
#        PB_WARMUP_SCAN=0     skip the prewarm-threads scan (1, 4, 16 threads, 4 GiB, 4 KiB pages)
# Needs a GPU; root (or CAP_IPC_LOCK) to lock the pool. Exits 77 without a GPU.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-}
if [ -z "$BUILD" ]; then
	for b in "$SRC/build-gpu" "$SRC/build"; do [ -x "$b/bench/gpu/pb_gpu_bench" ] && BUILD=$b && break; done
fi
BUILD=$(realpath -m "${BUILD:-$SRC/build-gpu}")
BENCH=$BUILD/bench/gpu/pb_gpu_bench
DAEMON=$BUILD/daemon/pinbrokerd
PINCTL=$BUILD/client/pinctl
LIB=$BUILD/client/libpinbroker.so
for f in "$BENCH" "$DAEMON" "$PINCTL" "$LIB"; do
	[ -e "$f" ] || { echo "missing $f (build with: cmake -S . -B build-gpu && cmake --build build-gpu)"; exit 2; }
done
OUTDIR=${OUT:-$(mktemp -d /tmp/pb-bench-out.XXXXXX)}
mkdir -p "$OUTDIR"
RAW=$OUTDIR/bench-raw.txt
DLOG=$OUTDIR/daemons.log
TMP=$(mktemp -d /tmp/pb-bench.XXXXXX)
WARM=${PB_WARMUP_BYTES:-16G}
JOBS=${PB_JOBS:-8}
JOB_BYTES=${PB_JOB_BYTES:-2G}
HUGE_BIG=${PB_HUGEPAGES_BIG:-8400}
: >"$RAW"

# The benchmark measures copies and set-up, not pressure policy: thresholds sit low so a VM whose memory grows on
# demand (MemAvailable starts small) does not make the daemon refuse or revoke mid-run. The pool never shrinks.
DARGS=(--lock-memory yes --log-level info --pool-shrink-delay-ms 3600000
	--tight-mem-available-pct 3 --critical-mem-available-pct 1)

log() { echo "== $*" | tee -a "$RAW"; }
run() { echo "\$ $*" >>"$RAW"; "$@" 2>&1 | tee -a "$RAW"; return "${PIPESTATUS[0]}"; }

PIDS=()
start_daemon() { # label socket args...
	local label=$1 sock=$2
	shift 2
	echo "--- pinbrokerd $label: $*" >>"$DLOG"
	run "$BENCH" start-daemon --label "$label" --socket "$sock" --log "$DLOG" --pidfile "$TMP/$label.pid" \
		-- "$DAEMON" --socket "$sock" "${DARGS[@]}" "$@" || return 1
	PIDS+=("$(cat "$TMP/$label.pid")")
}
# The warm pool taken whole by one job, in 1 GiB leases mapped and CUDA-registered: what makes a warm-up
# comparable with cudaHostAlloc, whose memory is registered when it returns (report.py adds the two).
BENCH_FAILED=0
warm_register() { # label socket
	run "$BENCH" warm-register --label "$1" --socket "$2" --size "$WARM" --chunk 1G || {
		echo "FAIL: warm-register $1: the warm pool could not be taken and registered whole" | tee -a "$RAW"
		BENCH_FAILED=1
	}
}
stop_pid() {
	local pid=$1
	kill -TERM "$pid" 2>/dev/null || return 0
	for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.05; done
	echo "pinbrokerd $pid did not stop in 10 s; SIGKILL" | tee -a "$RAW"
	kill -KILL "$pid" 2>/dev/null
}
HUGE_BEFORE=
cleanup() {
	local p
	for p in "${PIDS[@]}"; do stop_pid "$p"; done
	[ -n "$HUGE_BEFORE" ] && echo "$HUGE_BEFORE" >/proc/sys/vm/nr_hugepages 2>/dev/null
	rm -rf "$TMP"
}
trap cleanup EXIT

"$BENCH" info >"$TMP/info" 2>&1
rc=$?
cat "$TMP/info" | tee -a "$RAW"
[ $rc = 77 ] && exit 77
[ $rc = 0 ] || exit 1
{
	echo "META date=$(date -u '+%Y-%m-%d %H:%M UTC')"
	if command -v nvidia-smi >/dev/null; then
		echo "META nvidia_smi=$(nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max \
			--format=csv,noheader 2>/dev/null | head -1)"
		echo "META driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
	fi
	echo "META kernel=$(uname -r)"
	echo "META cpus=$(nproc)"
	echo "META memtotal=$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
	echo "META hugepages=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null) total, $(awk '/HugePages_Free/ {print $2}' /proc/meminfo) free"
	echo "META python_torch=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"
} | tee -a "$RAW"

# ---- Pool warm-up: daemon start to READY (first in a fresh VM, which pays first touch), cudaHostAlloc of the same
# total, then the daemon again (the one the other sections use).
log "pool warm-up: $WARM"
# Huge pages are reserved first, so that every warm-up below has a first start (which, in a VM whose memory grows on
# demand, pays the VM's first touch) and a second start on memory the VM has already backed.
free_huge() { awk '/HugePages_Free/ {print $2}' /proc/meminfo; }
if [ "$HUGE_BIG" != 0 ] && [ -w /proc/sys/vm/nr_hugepages ] && [ "$(cat /proc/sys/vm/nr_hugepages)" -lt "$HUGE_BIG" ]; then
	HUGE_BEFORE=$(cat /proc/sys/vm/nr_hugepages)
	t0=$(date +%s%N)
	echo "$HUGE_BIG" >/proc/sys/vm/nr_hugepages
	echo "META hugepages_big=nr_hugepages $HUGE_BEFORE -> $(cat /proc/sys/vm/nr_hugepages) in $(( ($(date +%s%N) - t0) / 1000000 )) ms, $(free_huge) free" | tee -a "$RAW"
fi
S4K=$TMP/pb4k.sock
SHUGE=$TMP/pbhuge.sock
STHP=$TMP/pbthp.sock
start_daemon cold "$TMP/cold.sock" --budget 24G --prewarm "$WARM" --hugetlb no --thp no &&
	{ warm_register cold "$TMP/cold.sock"; stop_pid "${PIDS[-1]}"; unset 'PIDS[-1]'; }
run "$BENCH" hostalloc-total --size "$WARM" --chunk 1G
start_daemon 4k "$S4K" --budget 24G --prewarm "$WARM" --hugetlb no --thp no || { echo "FAIL: pinbrokerd did not start"; exit 1; }
warm_register 4k "$S4K"
# THP-collapsed 4 KiB chunks (thp = yes: the kernel must be able to), started twice like the others.
THP_OK=0
start_daemon thp-cold "$STHP" --budget 24G --prewarm "$WARM" --hugetlb no --thp yes &&
	{ warm_register thp-cold "$STHP"; stop_pid "${PIDS[-1]}"; unset 'PIDS[-1]'; }
start_daemon thp "$STHP" --budget 24G --prewarm "$WARM" --hugetlb no --thp yes && THP_OK=1 && warm_register thp "$STHP"
HUGE_OK=0
WARM_BYTES=$(python3 -c "import sys; s=sys.argv[1].upper(); m={'K':1<<10,'M':1<<20,'G':1<<30}
print(int(float(s[:-1])*m[s[-1]]) if s[-1] in m else int(s))" "$WARM")
WARM_PAGES=$((WARM_BYTES / 2097152))
if [ "$(free_huge)" -ge "$WARM_PAGES" ] 2>/dev/null; then
	start_daemon hugetlb-cold "$SHUGE" --budget 24G --prewarm "$WARM" --hugetlb yes &&
		{ warm_register hugetlb-cold "$SHUGE"; stop_pid "${PIDS[-1]}"; unset 'PIDS[-1]'; }
	start_daemon hugetlb "$SHUGE" --budget 24G --prewarm "$WARM" --hugetlb yes && HUGE_OK=1 &&
		warm_register hugetlb "$SHUGE"
elif [ "$(free_huge)" -ge 1024 ] 2>/dev/null; then
	start_daemon hugetlb-2g "$SHUGE" --budget 2G --prewarm 2G --hugetlb yes && HUGE_OK=1
else
	echo "no free huge pages (echo 1100 > /proc/sys/vm/nr_hugepages as root): hugetlb rows skipped" | tee -a "$RAW"
fi
if [ "${PB_WARMUP_SCAN:-1}" != 0 ]; then
	log "prewarm threads scan: 4G, 4 KiB pages"
	for th in 1 4 16; do
		start_daemon "4k-4G-${th}threads" "$TMP/scan.sock" --budget 8G --prewarm 4G --hugetlb no --thp no \
			--prewarm-threads "$th" &&
			{ stop_pid "${PIDS[-1]}"; unset 'PIDS[-1]'; }
	done
fi
HUGEARG=()
[ $HUGE_OK = 1 ] && HUGEARG=(--socket-huge "$SHUGE")
[ $THP_OK = 1 ] && HUGEARG+=(--socket-thp "$STHP")

# ---- Many jobs: JOBS processes each take JOB_BYTES and stream it to the GPU.
if [ "${PB_SKIP_MANY:-0}" != 1 ]; then
log "many jobs: $JOBS x $JOB_BYTES"
run "$BENCH" many --mode broker --label broker-4k --socket "$S4K" --procs "$JOBS" --size "$JOB_BYTES" --passes 4
[ $HUGE_OK = 1 ] && run "$BENCH" many --mode broker --label broker-hugetlb --socket "$SHUGE" --procs "$JOBS" \
	--size "$JOB_BYTES" --passes 4
run "$BENCH" many --mode cudaHostAlloc --procs "$JOBS" --size "$JOB_BYTES" --passes 4
fi

# ---- Time to a usable pinned buffer.
log "set-up time"
run "$BENCH" setup --socket "$S4K" "${HUGEARG[@]}" --sizes 2M,64M,1G --reps 11 --reps-large 5 --cached-reps 201

# ---- Bandwidth.
log "bandwidth"
run "$BENCH" bandwidth --socket "$S4K" "${HUGEARG[@]}" --sizes 64M,1G --reps 11

# ---- PyTorch: its own pinned allocation, and a broker lease as a tensor.
log "pytorch"
PYTHONUNBUFFERED=1 run python3 "$SRC/bench/gpu/torch_check.py" --lib "$LIB" --socket "$S4K" --sizes 2M,64M,1G \
	--bw-size 1G --reps 9

log "daemon status at the end"
run "$PINCTL" --socket "$S4K" status
[ $HUGE_OK = 1 ] && run "$PINCTL" --socket "$SHUGE" status
[ $THP_OK = 1 ] && run "$PINCTL" --socket "$STHP" status

for p in "${PIDS[@]}"; do stop_pid "$p"; done
PIDS=()
# report.py exits 1 when a target is not met: so does this script (the targets are printed here too).
python3 "$SRC/bench/gpu/report.py" "$RAW" >"$OUTDIR/bench.md"
rc=$?
python3 "$SRC/bench/gpu/report.py" --short "$RAW"
echo "results: $RAW, $OUTDIR/bench.md"
[ "$BENCH_FAILED" = 0 ] || rc=1
exit "$rc"

#!/bin/bash
# SPDX-License-Identifier: MIT
# Many jobs starting at once (issue 13's item 3, on whatever GPUs the host has: jobs go round them):
# PB_JOBS processes each lease PB_JOB_BYTES from one warm pool and stream it to their GPU, against
# PB_JOBS concurrent cudaHostAlloc calls of the same size, which serialise on the driver's lock.
# The daemon is stopped before the cudaHostAlloc run, so the host never holds both sets of pages.
#
# usage: bench/gpu/run-many.sh [BUILD_DIR]      (default: build-gpu)
# env:   OUT            where results go (default: a temp dir, printed)
#        PB_JOBS        processes (default 8)
#        PB_JOB_BYTES   bytes each (default 8G)
#        PB_PASSES      H2D copies of the whole buffer per job (default 2)
#        PB_THP         the pool's thp setting (default yes; no for 4 KiB pages)
#        PB_CHUNK       the pool's chunk-size (default 16M: 8 x 8 GiB of 2 MiB chunks would pass a 20,000-fd limit)
# Needs a GPU and root (the pool is locked). Exits 77 without a GPU.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(realpath -m "${1:-$SRC/build-gpu}")
BENCH=$BUILD/bench/gpu/pb_gpu_bench
DAEMON=$BUILD/daemon/pinbrokerd
for f in "$BENCH" "$DAEMON"; do
	[ -x "$f" ] || { echo "missing $f (build with: cmake -S . -B build-gpu && cmake --build build-gpu)"; exit 2; }
done
if ! nvidia-smi -L >/dev/null 2>&1; then echo "no GPU (nvidia-smi -L failed): skipped"; exit 77; fi
OUTDIR=${OUT:-$(mktemp -d /tmp/pb-many-out.XXXXXX)}
mkdir -p "$OUTDIR"
RAW=$OUTDIR/many-raw.txt
TMP=$(mktemp -d /tmp/pb-many.XXXXXX)
JOBS=${PB_JOBS:-8}
JOB_BYTES=${PB_JOB_BYTES:-8G}
PASSES=${PB_PASSES:-2}
TOTAL_GIB=$(python3 -c "import sys; s=sys.argv[1].upper(); m={'M':1/1024,'G':1,'T':1024}
print(max(1, round(float(s[:-1])*m[s[-1]]*int(sys.argv[2]))))" "$JOB_BYTES" "$JOBS")
trap 'rm -rf "$TMP"' EXIT

{
	echo "META date=$(date -u '+%Y-%m-%d %H:%M UTC')"
	echo "META gpus=$(nvidia-smi -L | wc -l) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sort | uniq -c | tr -s ' ')"
	echo "META memtotal_kib=$(awk '/MemTotal/ {print $2}' /proc/meminfo) shmem_thp=$(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled)"
} | tee "$RAW"

SOCK=$TMP/pb.sock
"$BENCH" start-daemon --label "many-pool" --socket "$SOCK" --log "$OUTDIR/daemon.log" --pidfile "$TMP/pid" \
	-- "$DAEMON" --socket "$SOCK" --lock-memory yes --budget "$((TOTAL_GIB + 1))G" --prewarm "${TOTAL_GIB}G" \
	--hugetlb no --thp "${PB_THP:-yes}" --chunk-size "${PB_CHUNK:-16M}" --pool-shrink-delay-ms 3600000 \
	--tight-mem-available-pct 3 --critical-mem-available-pct 1 2>&1 | tee -a "$RAW"
[ -s "$TMP/pid" ] || { echo "FAIL: pinbrokerd did not start (see $OUTDIR/daemon.log)"; exit 1; }
# The pool as the daemon reports it (page kind, THP collapses checked in smaps, huge pages) and its warnings.
"$BUILD/client/pinctl" --socket "$SOCK" status >"$OUTDIR/many-status.txt" 2>&1
grep -iE 'warn|not PMD' "$OUTDIR/daemon.log" >>"$OUTDIR/many-status.txt"
# One GPU streaming 2 GiB each way: pageable, cudaHostAlloc and a lease from this pool, in one run.
"$BENCH" bandwidth --socket-thp "$SOCK" --sizes 2G 2>&1 | tee -a "$RAW"
"$BENCH" many --mode broker --label "broker-thp-${PB_THP:-yes}" --socket "$SOCK" --procs "$JOBS" --size "$JOB_BYTES" \
	--passes "$PASSES" 2>&1 | tee -a "$RAW"
rc_broker=${PIPESTATUS[0]}
kill -TERM "$(cat "$TMP/pid")"
for _ in $(seq 1 400); do kill -0 "$(cat "$TMP/pid")" 2>/dev/null || break; sleep 0.05; done
"$BENCH" many --mode cudaHostAlloc --procs "$JOBS" --size "$JOB_BYTES" --passes "$PASSES" 2>&1 | tee -a "$RAW"
rc_cuda=${PIPESTATUS[0]}

# The table: set-up wall time (first job starting to last job holding its memory) and copies.
python3 - "$RAW" <<'EOF' | tee "$OUTDIR/many.md"
import sys
rows = []
for line in open(sys.argv[1]):
    if line.startswith("RESULT many "):
        rows.append(dict(kv.split("=", 1) for kv in line.split()[2:]))
base = next((r for r in rows if r["mode"] == "cudaHostAlloc"), None)
print("| jobs at once | GPUs | set-up wall | set-up median / max | × cudaHostAlloc | H2D aggregate | per job | pinned |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    wall = float(r["setup_wall_ms"])
    ratio = f"{float(base['setup_wall_ms']) / wall:.1f}× faster" if base and r is not base else "1.0×"
    print(f"| {r['mode']}: {r['procs']} × {r['size']} | {r['gpus']} | {wall / 1000:.2f} s | "
          f"{float(r['setup_median_ms']) / 1000:.2f} / {float(r['setup_max_ms']) / 1000:.2f} s | {ratio} | "
          f"{float(r['h2d_aggregate_gbs']):.1f} GB/s | {float(r['h2d_per_job_median_gbs']):.1f} GB/s | "
          f"{r['pinned']}/{r['procs']} |")
EOF
echo "results: $RAW, $OUTDIR/many.md"
[ "$rc_broker" = 0 ] && [ "$rc_cuda" = 0 ]

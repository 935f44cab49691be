#!/bin/bash
# SPDX-License-Identifier: MIT
# Staged copies with streaming stores against plain memcpy (PINBROKER_STAGING_STREAM_STORES=1 / 0), in one run with
# the sides alternated: bench_staging (malloc'ed memory through pb_copy_*, beside the host's memcpy and streaming
# ceilings) 1, 0, 0, 1; then bench/gpu/held_copy_probe.py (torch's held.copy_ D2H and its variants) under
# `pinctl run --no-torch` 1, 0, 0, 1 when python3 has torch with CUDA. A table of the 1 GiB and 64 MiB rates per
# side (median over that side's runs) last; the raw outputs in OUT.
#
# usage: bench/gpu/run-staging-ab.sh [BUILD_DIR]   (default: build-gpu, then build)
# env:   OUT  results folder (default: a temp dir)
# Exits 0 when every run finished with exact bytes, 1 otherwise, 2 when a binary is missing, 77 without a GPU.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/gpu/gpu-lib.sh
. "$SRC/tests/gpu/gpu-lib.sh"
gpu_find_build "${1:-}" bench/bench_staging
BENCH=$BUILD/bench/bench_staging
gpu_out_dirs staging-ab
PIDS=()
HUGE_BEFORE=
trap 'gpu_cleanup; rm -rf "$TMP"' EXIT
if ! nvidia-smi -L >/dev/null 2>&1; then echo "SKIP run-staging-ab: no GPU (nvidia-smi -L failed)"; exit 77; fi
DARGS=(--lock-memory yes --tight-mem-available-pct 3 --critical-mem-available-pct 1 --max-no-revoke-per-uid 100%
	--budget 24G --prewarm 256M)
gpu_start_daemon staging-ab "$TMP/ab.sock" || exit 1
export PINBROKER_LIBRARY=$BUILD/client/libpinbroker.so.1 PYTHONPATH=$SRC/python${PYTHONPATH:+:$PYTHONPATH}
FAILED=0
k=0
for v in 1 0 0 1; do
	k=$((k + 1))
	PINBROKER_STAGING_STREAM_STORES=$v timeout 120 "$BENCH" >"$OUT/bench-$k-stream$v.txt" 2>&1 ||
		{ echo "FAIL bench_staging run $k (stream stores $v): exit $?"; FAILED=1; }
	grep -q DIFFER "$OUT/bench-$k-stream$v.txt" && { echo "FAIL bench_staging run $k: bytes differ"; FAILED=1; }
done
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
	k=0
	for v in 1 0 0 1; do
		k=$((k + 1))
		REPS=3 PINBROKER_STAGING_STREAM_STORES=$v timeout 120 "$PINCTL" run --no-torch -- \
			python3 "$SRC/bench/gpu/held_copy_probe.py" >"$OUT/probe-$k-stream$v.txt" 2>&1 ||
			{ echo "FAIL held_copy_probe run $k (stream stores $v): exit $?"; FAILED=1; }
	done
else
	echo "SKIP held_copy_probe.py: python3 has no torch with CUDA"
fi
python3 - "$OUT" <<'PY'
import glob, os, re, statistics, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "bench-*-stream*.txt"))):
    side = "streaming" if f.endswith("stream1.txt") else "memcpy"
    for line in open(f):
        m = re.match(r"\| (1 GiB|64 MiB) \| (H2D|D2H) \|[^|]*\|[^|]*\| *([0-9.]+) \|", line)
        if m:
            rows.setdefault(f"bench_staging {m[1]} {m[2]}, GB/s", {}).setdefault(side, []).append(float(m[3]))
for f in sorted(glob.glob(os.path.join(out, "probe-*-stream*.txt"))):
    side = "streaming" if f.endswith("stream1.txt") else "memcpy"
    for line in open(f):
        m = re.match(r"([A-H]) (.*?) +([0-9.]+) GB/s", line)
        if m and m[1] in "BCF":
            rows.setdefault(f"{m[1]} {m[2]}, GB/s", {}).setdefault(side, []).append(float(m[3]))
print("| what | memcpy | streaming stores | streaming / memcpy |")
print("|---|---:|---:|---:|")
for k, v in rows.items():
    a, b = statistics.median(v.get("memcpy", [0])), statistics.median(v.get("streaming", [0]))
    print(f"| {k} | {a:.1f} | {b:.1f} | {b / a if a else 0:.2f}x |")
PY
grep -h "host" "$OUT"/bench-1-stream1.txt 2>/dev/null
exit $FAILED

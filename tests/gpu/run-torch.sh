#!/bin/bash
# SPDX-License-Identifier: MIT
# GPU-host tests of pinbroker's torch host allocator and of `pinctl run` on torch programs: starts pinbrokerd on a
# temp socket, runs python/bench/torch_alloc_check.py (pinned bytes per request, stock torch against the
# allocator), then a torch program under `pinctl run` (the allocator installed through sitecustomize) and under
# `pinctl run --no-torch` (torch's own allocator, interposed). Results go to $OUT; a table is printed last.
#
# usage: tests/gpu/run-torch.sh [BUILD_DIR]   (default: build-gpu)
# BUILD_DIR configured where python3 has torch >= 2.8 with CUDA, so cmake --build prebuilt the extension
# (PINBROKER_TORCH_EXT, BUILD_DIR/client/pinbroker-torch): the first row checks that install() loads it.
# Exits 0 when every check passed, 1 when one failed, 77 without CUDA in torch.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(realpath -m "${1:-$SRC/build-gpu}")
export OUT=${OUT:-$(mktemp -d /tmp/pb-torch-out.XXXXXX)}
mkdir -p "$OUT"
T=$(mktemp -d /tmp/pb-torch.XXXXXX)
export PINBROKER_SOCKET=$T/pb.sock PINBROKER_LIBRARY=$BUILD/client/libpinbroker.so.1
export TORCH_EXTENSIONS_DIR=$T/ext PYTHONPATH=$SRC/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PINCTL=$BUILD/client/pinctl
python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 77)' || { echo "torch has no CUDA here"; exit 77; }
"$BUILD/daemon/pinbrokerd" --socket "$T/pb.sock" --config /dev/null --budget 24G --prewarm 1G --hugetlb no \
	--max-no-revoke-per-uid 100% --tight-mem-available-pct 3 --critical-mem-available-pct 1 --log-level info \
	>"$OUT/torch-daemon.log" 2>&1 &
DPID=$!
trap 'kill $DPID 2>/dev/null; wait $DPID 2>/dev/null; rm -rf "$T"' EXIT
for _ in $(seq 1 100); do "$PINCTL" status >/dev/null 2>&1 && break; sleep 0.1; done
ROWS=()
FAILED=0
row() { ROWS+=("| $1 | $2 | $([ "$3" = 0 ] && echo pass || echo "FAIL ($3)") |"); [ "$3" = 0 ] || FAILED=1; }
# The extension cmake --build prebuilt (PINBROKER_TORCH_EXT: $BUILD/client/pinbroker-torch, beside
# $PINBROKER_LIBRARY): install() in a fresh process loads it, no compiler (the JIT is forbidden), within 1 s.
PINBROKER_TORCH_JIT=0 timeout 120 python3 -c '
import sys, time, torch
t = time.monotonic()
import pinbroker.torch as pbt
a = pbt.install()
dt = time.monotonic() - t
print(f"{a.built} in {dt:.2f} s (extension {a.extension_load_s:.3f} s): {a.extension_path}")
sys.exit(0 if a.built == "prebuilt" and dt <= 1.0 else 1)' >"$OUT/torch-ext-load.log" 2>&1
row "install() in a fresh process: the prebuilt extension, ≤ 1 s" "$(tail -1 "$OUT/torch-ext-load.log" | cut -c1-160)" $?

timeout 400 python3 "$SRC/python/bench/torch_alloc_check.py" --out "$OUT" >"$OUT/torch-alloc-check.log" 2>&1
rc=$?
row "torch_alloc_check.py (allocator installed in-process)" "$(grep -E "checks passed" "$OUT/torch-alloc-check.log" | tail -1)" $rc
timeout 300 "$PINCTL" run --label torchjob -- python3 "$SRC/python/bench/pinctl_run_torch.py" --expect exact \
	--label torchjob >"$OUT/pinctl-run-torch.log" 2>&1
rc=$?
row "pinctl run -- torch program (allocator through sitecustomize)" "$(tail -1 "$OUT/pinctl-run-torch.log" | cut -c1-160)" $rc
timeout 300 "$PINCTL" run --no-torch --label stock -- python3 "$SRC/python/bench/pinctl_run_torch.py" --expect pow2 \
	--label stock >"$OUT/pinctl-run-notorch.log" 2>&1
rc=$?
row "pinctl run --no-torch -- torch program (torch's allocator, interposed)" "$(tail -1 "$OUT/pinctl-run-notorch.log" | cut -c1-160)" $rc
# A budget too small for the 129.5 MB tensor: the allocator falls back to torch's, and under --no-torch the
# interposer's fallback=cuda pins it through the driver and reports it as unbrokered.
SMALL=$T/small.sock
"$BUILD/daemon/pinbrokerd" --socket "$SMALL" --config /dev/null --budget 64M --prewarm 16M --hugetlb no \
	--max-no-revoke-per-uid 100% --tight-mem-available-pct 3 --critical-mem-available-pct 1 \
	>"$OUT/torch-daemon-small.log" 2>&1 &
SPID=$!
for _ in $(seq 1 100); do "$PINCTL" --socket "$SMALL" status >/dev/null 2>&1 && break; sleep 0.1; done
PINBROKER_SOCKET=$SMALL timeout 300 "$PINCTL" --socket "$SMALL" run --label small -- python3 \
	"$SRC/python/bench/pinctl_run_torch.py" --expect fallback --label small >"$OUT/pinctl-run-torch-small.log" 2>&1
rc=$?
row "budget 64M: pinctl run -- torch (allocator falls back to torch's)" "$(tail -1 "$OUT/pinctl-run-torch-small.log" | cut -c1-160)" $rc
PINBROKER_SOCKET=$SMALL timeout 300 "$PINCTL" --socket "$SMALL" run --no-torch --label small -- python3 \
	"$SRC/python/bench/pinctl_run_torch.py" --expect unbrokered --label small >"$OUT/pinctl-run-notorch-small.log" 2>&1
rc=$?
row "budget 64M: pinctl run --no-torch -- torch (driver pins it, reported unbrokered)" "$(tail -1 "$OUT/pinctl-run-notorch-small.log" | cut -c1-160)" $rc
kill $SPID 2>/dev/null
wait $SPID 2>/dev/null
sleep 1
lent=$("$PINCTL" status --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["leased_bytes"], s.get("unbrokered_bytes", 0))')
[ "$lent" = "0 0" ]
row "everything back after the programs exit (leased, unbrokered)" "$lent" $?

echo
echo "## torch on the GPU host"
echo
echo "| run | result | verdict |"
echo "|---|---|---|"
printf '%s\n' "${ROWS[@]}"
echo
sed -n "/^## pinned bytes/,/checks passed/p" "$OUT/torch-alloc-check.log"
exit $FAILED

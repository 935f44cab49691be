#!/bin/bash
# SPDX-License-Identifier: MIT
# One device visit: the chosen GPU scripts, one after another, each with its own results folder, packed into
# $OUT/results.tar.gz (the device tool brings back a few files only), and each one's summary printed last.
#
# usage: tests/gpu/run-all.sh BUILD_DIR STEP...
# steps: gpu (tests/gpu/run-gpu.sh), gpu-tests (the same, PB_SKIP_BENCH=1), preload, cudapaths, torch, bench (bench/gpu/run-bench.sh),
#        many (bench/gpu/run-many.sh), staging (tests/gpu/run-staging.sh)
# Exits 1 when a step failed, else 0 (a step that skipped, exit 77, is reported as skipped).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(realpath -m "$1")
shift
DEST=${OUT:-$(mktemp -d /tmp/pb-all-out.XXXXXX)}
WORK=$(mktemp -d /tmp/pb-all.XXXXXX)
ROWS=()
fail=0
for step in "$@"; do
	case $step in
	gpu) cmd=("$SRC/tests/gpu/run-gpu.sh" "$BUILD") ;;
	gpu-tests) cmd=(env PB_SKIP_BENCH=1 "$SRC/tests/gpu/run-gpu.sh" "$BUILD") ;;
	preload) cmd=("$SRC/tests/gpu/run-preload.sh" "$BUILD") ;;
	cudapaths) cmd=("$SRC/tests/gpu/run-cudapaths.sh" "$BUILD") ;;
	torch) cmd=("$SRC/tests/gpu/run-torch.sh" "$BUILD") ;;
	bench) cmd=("$SRC/bench/gpu/run-bench.sh" "$BUILD") ;;
	many) cmd=("$SRC/bench/gpu/run-many.sh" "$BUILD") ;;
	staging) cmd=("$SRC/tests/gpu/run-staging.sh" "$BUILD") ;;
	*) echo "run-all: unknown step $step (gpu, gpu-tests, preload, cudapaths, torch, bench, many, staging)"; exit 2 ;;
	esac
	mkdir -p "$WORK/$step"
	t0=$(date +%s)
	OUT=$WORK/$step "${cmd[@]}" >"$WORK/$step/stdout.txt" 2>&1
	rc=$?
	case $rc in 0) res=pass ;; 77) res=skipped ;; *) res="FAIL (exit $rc)"; fail=1 ;; esac
	ROWS+=("| $step | $res | $(($(date +%s) - t0)) s |")
	echo "==== $step: $res"
	tail -40 "$WORK/$step/stdout.txt"
done
tar -C "$WORK" -czf "$DEST/results.tar.gz" .
rm -rf "$WORK"
echo
echo "| step | result | time |"
echo "|---|---|---|"
printf '%s\n' "${ROWS[@]}"
exit $fail

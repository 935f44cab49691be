# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# Sourced (bash) by run-gpu.sh and run-torch-bench.sh: the build they use, the CUDA torch they need, and
# the one pinbrokerd they start on a temp socket (stopped, with its temp folder removed, when they exit).
# Before sourcing: SRC (the source tree), and BUILD (the script's argument, may be empty).
# After bench_start_daemon: SOCK, DLOG, DPID; PINBROKER_SOCKET, PINBROKER_LIBRARY, LD_LIBRARY_PATH exported.

if [ -z "$BUILD" ]; then
	for b in "$SRC/build-gpu" "$SRC/build"; do [ -x "$b/daemon/pinbrokerd" ] && BUILD=$b && break; done
fi
BUILD=$(realpath -m "${BUILD:-$SRC/build-gpu}")
DAEMON=$BUILD/daemon/pinbrokerd
PINCTL=$BUILD/client/pinctl
LIB=$BUILD/client/libpinbroker.so.1
for f in "$DAEMON" "$PINCTL" "$LIB"; do
	[ -e "$f" ] || { echo "missing $f (cmake -S . -B build-gpu && cmake --build build-gpu)"; exit 2; }
done
PY=${PYTHON:-python3}
TMP=$(mktemp -d /tmp/pb-bench.XXXXXX)
SOCK=$TMP/pb.sock
DPID=
HUGE_BEFORE=
# The pool is locked as root; elsewhere mlock would fail past RLIMIT_MEMLOCK.
LOCK=yes
# shellcheck disable=SC2034 # read by the scripts that source this
[ "$(id -u)" = 0 ] || LOCK=no

# shellcheck disable=SC2317 # called through the EXIT trap
bench_cleanup() {
	if [ -n "$DPID" ]; then
		kill -TERM "$DPID" 2>/dev/null
		for _ in $(seq 1 200); do kill -0 "$DPID" 2>/dev/null || break; sleep 0.05; done
		kill -0 "$DPID" 2>/dev/null && kill -KILL "$DPID"
	fi
	[ -n "$HUGE_BEFORE" ] && echo "$HUGE_BEFORE" >/proc/sys/vm/nr_hugepages 2>/dev/null
	rm -rf "$TMP"
}
trap bench_cleanup EXIT

# bench_need_torch cuda|any: exit 77 (skip) unless $PY imports torch with a CUDA device (any: any torch).
bench_need_torch() {
	local probe='import sys, torch; sys.exit(0 if torch.cuda.is_available() else 77)'
	[ "$1" = any ] && probe='import torch'
	"$PY" -c "$probe" 2>"$TMP/torch.err"
	local rc=$?
	if [ $rc = 77 ]; then
		echo "SKIP: $PY has no CUDA device (torch.cuda.is_available() is False)"
		exit 77
	elif [ $rc != 0 ]; then
		cat "$TMP/torch.err"
		echo "FAIL: $PY cannot import torch (set PYTHON to an interpreter with a CUDA torch)"
		exit 1
	fi
}

# bench_start_daemon ARGS...: start pinbrokerd with ARGS (plus low pressure thresholds: the run measures
# the client, and a VM's MemAvailable may start small), log to $DLOG, and wait up to 60 s for it to answer.
bench_start_daemon() {
	DLOG=$OUT/pinbrokerd.log
	"$DAEMON" --socket "$SOCK" --config /dev/null "$@" --tight-mem-available-pct 3 \
		--critical-mem-available-pct 1 --log-level info >"$DLOG" 2>&1 &
	DPID=$!
	for _ in $(seq 1 600); do
		"$PINCTL" --socket "$SOCK" status >/dev/null 2>&1 && break
		kill -0 "$DPID" 2>/dev/null || { echo "FAIL: pinbrokerd exited; see $DLOG"; tail -20 "$DLOG"; DPID=; exit 1; }
		sleep 0.1
	done
	"$PINCTL" --socket "$SOCK" status >/dev/null 2>&1 || { echo "FAIL: pinbrokerd did not answer in 60 s"; exit 1; }
	export PINBROKER_SOCKET=$SOCK PINBROKER_LIBRARY=$LIB
	export LD_LIBRARY_PATH=$BUILD/client${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	export PYTHONUNBUFFERED=1
}

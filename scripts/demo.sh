#!/bin/sh
# SPDX-License-Identifier: MIT
# Install dependencies, build, start pinbrokerd on its embedded defaults, and show it lending memory.
# It returns and leaves the daemon running. CI (scripts/test.sh) points it elsewhere:
# PINBROKER_SOCKET (the socket), DEMO_DIR (log and pid file, default /tmp), DEMO_BUILD (default build).
set -eu
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "demo: run as root (it installs packages and locks memory)" >&2; exit 1; }
BUILD=${DEMO_BUILD:-build}
DIR=${DEMO_DIR:-/tmp}
LOG=$DIR/pinbrokerd-demo.log
PIDFILE=$DIR/pinbrokerd-demo.pid
SOCK=${PINBROKER_SOCKET:-/run/pinbroker/pinbroker.sock}
# The daemon and pinctl both take the socket from here.
export PINBROKER_SOCKET="$SOCK"
PINCTL=$BUILD/client/pinctl

# One line per phase, with the time since the start ([  12s] ...), and a line every 15 s while one runs.
# shellcheck source=scripts/progress.sh
. ./scripts/progress.sh
say "demo: packages (scripts/deps.sh)"
./scripts/deps.sh
buildlog=$(mktemp /tmp/pbdemo-build.XXXXXX)
quietly "build: configure $BUILD (cmake)" "$buildlog" cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo
quietly "build: compile with $(nproc) jobs (cmake --build $BUILD)" "$buildlog" cmake --build "$BUILD" -j"$(nproc)"
rm -f "$buildlog"
echo "== built: $BUILD/daemon/pinbrokerd, $BUILD/client/pinctl, $BUILD/client/libpinbroker.so"

started=0
if "$PINCTL" status >/dev/null 2>&1; then
	echo "== pinbrokerd is already running on $SOCK"
else
	# Embedded defaults: no config file, no options. Nothing of this script's terminal or
	# pipes stays open in it, so the script (and a CI step reading its output) can end.
	"$BUILD/daemon/pinbrokerd" --config /dev/null </dev/null >"$LOG" 2>&1 &
	echo $! >"$PIDFILE"
	started=1
	# Up to 30 s: a loaded machine can take seconds to start it and lock its warm pool.
	for _ in $(seq 300); do "$PINCTL" status >/dev/null 2>&1 && break; sleep 0.1; done
	if ! "$PINCTL" status >/dev/null 2>&1; then
		echo "demo: pinbrokerd did not answer on $SOCK within 30 s; its log ($LOG):" >&2
		sed 's/^/   /' "$LOG" >&2
		exit 1
	fi
	echo "== pinbrokerd started (pid $(cat "$PIDFILE")), log $LOG:"
	sed 's/^/   /' "$LOG"
fi
echo "== pinctl acquire 256M --hold 2 --label demo  (in the background)"
"$PINCTL" acquire 256M --hold 2 --label demo &
holder=$!
sleep 1
echo "== pinctl status, while the lease is held"
"$PINCTL" status
# Wait for the lease holder only: a bare `wait` would also wait for the daemon, forever.
wait "$holder"
echo "== pinctl status, after release"
"$PINCTL" status
if [ "$started" = 1 ]; then
	echo "== pinbrokerd keeps running; stop it with: kill \$(cat $PIDFILE)"
else
	echo "== pinbrokerd keeps running as before (this demo did not start it)"
fi
# Nothing was installed: pinctl is in the build tree, not on PATH (issue 41: "pinctl: command not found").
bindir=$(cd "$(dirname "$PINCTL")" && pwd)
echo "== pinctl is $bindir/pinctl (not on your PATH); to type just pinctl in this shell:"
echo "   export PATH=$bindir:\$PATH"
if [ "$SOCK" != /run/pinbroker/pinbroker.sock ]; then
	echo "   export PINBROKER_SOCKET=$SOCK"
fi
echo "   pinctl status; pinctl doctor; pinctl --help   (installing it: docs/install.md)"

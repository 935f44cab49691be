#!/bin/sh
# SPDX-License-Identifier: MIT
# Install dependencies, build, start pinbrokerd on its embedded defaults, and show it lending memory.
set -eu
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "demo: run as root (it installs packages and locks memory)" >&2; exit 1; }
./scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
echo "== built: build/daemon/pinbrokerd, build/client/pinctl, build/client/libpinbroker.so"

SOCK=/run/pinbroker/pinbroker.sock
if build/client/pinctl status >/dev/null 2>&1; then
	echo "== pinbrokerd is already running on $SOCK"
else
	# Embedded defaults: no config file, no options.
	build/daemon/pinbrokerd --config /dev/null >/tmp/pinbrokerd-demo.log 2>&1 &
	echo $! >/tmp/pinbrokerd-demo.pid
	for _ in $(seq 100); do build/client/pinctl status >/dev/null 2>&1 && break; sleep 0.1; done
	echo "== pinbrokerd started (pid $(cat /tmp/pinbrokerd-demo.pid)), log /tmp/pinbrokerd-demo.log:"
	sed 's/^/   /' /tmp/pinbrokerd-demo.log
fi
echo "== pinctl acquire 256M --hold 2 --label demo  (in the background)"
build/client/pinctl acquire 256M --hold 2 --label demo &
sleep 1
echo "== pinctl status, while the lease is held"
build/client/pinctl status
wait
echo "== pinctl status, after release"
build/client/pinctl status
echo "== pinbrokerd keeps running; stop it with: kill \$(cat /tmp/pinbrokerd-demo.pid)"

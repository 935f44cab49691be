#!/bin/bash
# SPDX-License-Identifier: MIT
# Tests pinbrokerd under a real booted systemd: debootstraps a minimal Debian bookworm (cached),
# installs the daemon, library, pinctl and units into a throwaway copy, boots it with
# systemd-nspawn, runs tests/system/systemd/in-guest.sh there, and reports "N passed, N failed".
#
# usage: run-nspawn.sh [BUILD_DIR]     (BUILD_DIR only hosts the /usr-prefixed build and results)
# env:   PINBROKER_NSPAWN_CACHE   root cache (default /var/cache/pinbroker-test/bookworm-root; nspawn-lib.sh)
#        PINBROKER_NSPAWN_MIRROR  Debian mirror (default: apt's own, nspawn_mirror in nspawn-lib.sh; none: it fails)
#        PINBROKER_NSPAWN_TIMEOUT seconds the booted guest may take (default 300)
#        PINBROKER_NSPAWN_KEEP=1  keep the per-run root copy for debugging
# Exits 0 when every check passed, 1 when one failed, 77 (skip) where nspawn cannot run.
set -u
SRC=$(cd "$(dirname "$0")/../../.." && pwd)
BUILD=$(realpath -m "${1:-$SRC/build}")
TIMEOUT=${PINBROKER_NSPAWN_TIMEOUT:-300}
MAX_EXPOSURE=2.0

# The root cache, its copies and booting them: shared with tests/system/package/run-deb.sh.
. "$SRC/tests/system/lib/nspawn-lib.sh"
nspawn_require
for t in cmake bc; do command -v $t >/dev/null || skip "$t not found (apt-get install $t; scripts/deps.sh --test installs it)"; done

# --- host: every shipped service's security exposure, straight from the committed units ---
# (sockets have no score: systemd-analyze security rates services only)
for unit in "$SRC"/systemd/*.service; do
	name=${unit##*/}
	score=$(systemd-analyze security --offline=true --no-pager "$unit" 2>&1 |
		sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
	echo "systemd-analyze security --offline=true systemd/$name: exposure ${score:-?}"
	if [ -n "$score" ] && awk -v s="$score" -v m=$MAX_EXPOSURE 'BEGIN { exit !(s <= m) }'; then
		host_ok "$name: security exposure $score <= $MAX_EXPOSURE"
	else
		host_notok "$name: security exposure '${score}' <= $MAX_EXPOSURE" \
			"systemd-analyze security --offline=true systemd/$name lists what counts"
	fi
done

# --- the cached root, built once (a stamp names what it was built with) ---
nspawn_cached_root

# --- a /usr-prefixed build with the debug hooks (the watchdog check needs SIGUSR2) ---
# Only what gets installed: a half-written benchmark elsewhere must not fail this test.
mkdir -p "$BUILD"
IB=$BUILD/nspawn-build
t=$(date +%s.%N)
cmake -S "$SRC" -B "$IB" -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	-DBUILD_TESTING=OFF -DPINBROKER_DEBUG_HOOKS=ON -DPINBROKER_GPU_TESTS=OFF \
	-DPINBROKER_SANITIZE=OFF -DPINBROKER_FUZZ=OFF >"$BUILD/nspawn-cmake.log" 2>&1 &&
	cmake --build "$IB" -j"$(nproc)" --target pinbrokerd pinctl pinbroker pinbroker_static pinbroker_preload pinbroker-metrics-http pinbroker_man \
		pinbroker_sample_config >>"$BUILD/nspawn-cmake.log" 2>&1 ||
	{ tail -n 30 "$BUILD/nspawn-cmake.log"; fail "cannot build pinbroker for /usr (log: $BUILD/nspawn-cmake.log)"; }
lap "build" "$t"

# --- a throwaway copy of the root per run ---
WORK=$(mktemp -d /var/tmp/pinbroker-nspawn.XXXXXX)
ROOT=$WORK/root
cleanup() {
	if [ "${PINBROKER_NSPAWN_KEEP:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf --one-file-system "$WORK"; fi
}
trap cleanup EXIT
nspawn_copy_root "$ROOT"

# --- probe: can this host boot a container at all? ---
nspawn_probe "$ROOT" "$WORK/probe.log"

# --- install into the root, as an admin would: cmake --install, enable the socket ---
DESTDIR=$ROOT cmake --install "$IB" >"$WORK/install.log" 2>&1 ||
	{ cat "$WORK/install.log"; fail "cmake --install into the root failed"; }
chroot "$ROOT" /sbin/ldconfig
# Small numbers keep prewarm quick; in-guest.sh changes the budget to test reload.
cat >"$ROOT/etc/pinbroker/pinbrokerd.conf" <<'EOF'
# written by tests/system/systemd/run-nspawn.sh
budget = 512M
prewarm = 64M
log-level = debug
redeclare-grace-ms = 3000
EOF
systemctl --root="$ROOT" enable pinbrokerd.socket >/dev/null 2>&1 ||
	fail "systemctl --root enable pinbrokerd.socket failed"

# --- boot and run the checks ---
nspawn_run_guest "$ROOT" pinbroker-test "$SRC/tests/system/systemd/in-guest.sh" "$TIMEOUT" "$BUILD/nspawn-results" \
	"$WORK/install.log"

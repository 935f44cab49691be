#!/bin/sh
# SPDX-License-Identifier: MIT
# The DaemonSet's conditions for pinbrokerd, emulated without a cluster: the base's pinbrokerd.conf
# (its socket moved to a temp folder), uid 0 with only the container's capabilities (IPC_LOCK,
# SYS_RESOURCE, KILL, as far as this host's bounding set has them), RLIMIT_MEMLOCK at 64 KiB (what a
# pod gets when the runtime sets nothing), in a memory cgroup limited to 2 GiB (the base's 20 GiB,
# scaled down). Checks: budget = 75% resolves to 75% of the cgroup limit; the pool locks far past
# RLIMIT_MEMLOCK (CAP_IPC_LOCK, no ulimit needed); a lease of 90% of the budget, charged to the
# daemon's cgroup, leaves the pressure state normal.
# usage: run-daemon-limits.sh SOURCE_DIR BUILD_DIR      exit 0 pass, 1 fail, 77 skip
set -u
SRC=${1:?usage: run-daemon-limits.sh SOURCE_DIR BUILD_DIR}
BUILD=${2:?usage: run-daemon-limits.sh SOURCE_DIR BUILD_DIR}
PINBROKERD=$BUILD/daemon/pinbrokerd
PINCTL=$BUILD/client/pinctl
LIMIT=2147483648

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }
. "$SRC/tests/deploy/answering.sh"

[ "$(id -u)" = 0 ] || skip "needs root (a memory cgroup and capabilities)"
command -v setpriv >/dev/null || skip "setpriv not found (util-linux)"
command -v jq >/dev/null || skip "jq not found"
[ -x "$PINBROKERD" ] || fail "no $PINBROKERD: build first"
[ "$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)" -gt 4194304 ] || skip "under 4 GiB available"

# A child of this process's memory cgroup: v2, or v1's memory hierarchy.
CG=''
v2=$(sed -n 's/^0:://p' /proc/self/cgroup)
v1=$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup)
if [ -n "$v1" ] && [ -d "/sys/fs/cgroup/memory$v1" ]; then
	CG=/sys/fs/cgroup/memory${v1%/}/pinbroker-k8s-$$
	LIMIT_FILE=memory.limit_in_bytes
elif [ -n "$v2" ] && [ -f /sys/fs/cgroup/cgroup.controllers ]; then
	CG=/sys/fs/cgroup${v2%/}/pinbroker-k8s-$$
	LIMIT_FILE=memory.max
fi
if [ -z "$CG" ] || ! mkdir "$CG" 2>/dev/null; then
	skip "cannot make a memory cgroup here"
fi
T=$(mktemp -d /tmp/pinbroker-k8s-limits.XXXXXX) || fail "cannot create a temp directory"
chmod 0755 "$T"
DPID=''
cleanup() {
	[ -n "$DPID" ] && kill "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null
	rmdir "$CG" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
if ! echo "$LIMIT" >"$CG/$LIMIT_FILE" 2>/dev/null || [ ! -f "$CG/$LIMIT_FILE" ]; then
	skip "cannot set $CG/$LIMIT_FILE (memory controller not enabled here)"
fi

SOCK=$T/pinbroker.sock
sed "s#^socket = .*#socket = $SOCK#" "$SRC/deploy/kubernetes/pinbrokerd.conf" >"$T/pinbrokerd.conf"
chmod 0644 "$T/pinbrokerd.conf"
caps=-all
for c in ipc_lock sys_resource kill; do
	setpriv --bounding-set=-all,+$c true 2>/dev/null && caps="$caps,+$c"
done
case $caps in *ipc_lock*) ;; *) skip "CAP_IPC_LOCK is not in this host's bounding set" ;; esac
# shellcheck disable=SC2016
sh -c 'echo $$ >"$1/cgroup.procs" && ulimit -l 64 && exec setpriv --inh-caps=-all --bounding-set="$2" "$3" --config "$4"' \
	sh "$CG" "$caps" "$PINBROKERD" "$T/pinbrokerd.conf" </dev/null >"$T/daemon.log" 2>&1 &
DPID=$!
wait_answering "$SOCK" "$T/daemon.log" "pinbrokerd did not answer in its cgroup"
grep -q "^Max locked memory *65536 " "/proc/$DPID/limits" || fail "the daemon's RLIMIT_MEMLOCK is not 64 KiB: $(grep locked "/proc/$DPID/limits")"
eff=$(sed -n 's/^CapEff:\t//p' "/proc/$DPID/status")
# IPC_LOCK 14, KILL 5, SYS_RESOURCE 24: nothing else may be effective.
if [ $((0x$eff & ~((1 << 14) | (1 << 5) | (1 << 24)))) != 0 ] || [ $((0x$eff & (1 << 14))) = 0 ]; then
	fail "the daemon's effective capabilities are $eff"
fi
echo "ok: uid 0, capabilities $eff ($caps), RLIMIT_MEMLOCK 64 KiB, memory limit $LIMIT bytes"

budget=$("$PINCTL" --socket "$SOCK" status --json | jq .budget_bytes)
[ "$budget" = $((LIMIT * 3 / 4)) ] || fail "budget is $budget bytes, expected 75% of the cgroup limit ($((LIMIT * 3 / 4)))"
echo "ok: budget = 75% resolved to $budget bytes (75% of the container's limit, not of MemTotal)"

want=$((budget * 9 / 10 / 1048576))M
"$PINCTL" --socket "$SOCK" acquire "$want" --hold 5 >"$T/acquire.log" 2>&1 &
APID=$!
# Read while the lease is held: status polled until it shows the lease (a 30 s bound), within the 5 s hold.
n=0
until st=$("$PINCTL" --socket "$SOCK" status --json 2>/dev/null) &&
	[ "$(printf '%s' "$st" | jq .leased_bytes)" -ge $((budget * 9 / 10 / 1048576 * 1048576)) ]; do
	n=$((n + 1))
	[ $n -lt 300 ] || { cat "$T/acquire.log"; fail "the $want lease never showed in pinctl status"; }
	sleep 0.1
done
locked_kb=$(sed -n 's/^VmLck:[^0-9]*\([0-9]*\).*/\1/p' "/proc/$DPID/status")
wait "$APID" || { cat "$T/acquire.log"; fail "pinctl acquire $want failed in the DaemonSet's conditions"; }
grep -q ", locked," "$T/acquire.log" || fail "the lease was not locked: $(cat "$T/acquire.log")"
[ "$(printf '%s' "$st" | jq -r .pressure_state)" = normal ] ||
	fail "pressure went $(printf '%s' "$st" | jq -r .pressure_state) with $want leased: $(printf '%s' "$st" | jq -c .signals)"
if [ "${PINBROKER_SANITIZED:-0}" = 1 ]; then
	# ASan's runtime makes mlock and mlockall no-ops, so VmLck says nothing there.
	echo "ok: a $want lease, pressure normal (sanitized build: VmLck not checked, ASan turns mlock into a no-op)"
else
	[ $((locked_kb * 1024)) -ge $((budget * 9 / 10)) ] || fail "the daemon locked only $locked_kb kB for a $want lease"
	echo "ok: a $want lease: locked by the daemon ($locked_kb kB past a 64 KiB RLIMIT_MEMLOCK), pressure normal"
fi
echo "PASS: pinbrokerd under the DaemonSet's limits"

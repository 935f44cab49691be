#!/bin/sh
# SPDX-License-Identifier: MIT
# deploy/overlays/node-patcher/node-patcher.sh against a real pinbrokerd and a stand-in API server (HTTPS
# with a throw-away certificate, fake-apiserver.py): the PATCH's path, content type, token and
# JSON-patch body (/status/capacity/pinbroker.io~1pinned-gib, whole GiB rounded down); no PATCH
# while the value is unchanged; a PATCH after `pinctl set budget` and after the resource is
# dropped from the node; clear errors for a refused token, RBAC, a wrong CA, an unknown node,
# no daemon and no NODE_NAME; a prompt exit on SIGTERM; as the pods mount it, pinctl reaching the
# socket through a read-only bind mount of its folder; and why the DaemonSet has hostPID: a
# daemon in a pid namespace of its own sees a client in another one as pid 0.
# usage: run-patcher.sh SOURCE_DIR BUILD_DIR      exit 0 pass, 1 fail, 77 skip
set -u
SRC=${1:?usage: run-patcher.sh SOURCE_DIR BUILD_DIR}
BUILD=${2:?usage: run-patcher.sh SOURCE_DIR BUILD_DIR}
PATCHER=$SRC/deploy/overlays/node-patcher/node-patcher.sh
PINBROKERD=$BUILD/daemon/pinbrokerd
PINCTL_BIN=$BUILD/client/pinctl

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }

[ "$(id -u)" = 0 ] || skip "needs root: pinctl set budget is an admin request, and the read-only mount check mounts"
for t in curl jq openssl python3; do
	command -v $t >/dev/null || skip "$t not found (apt-get install curl jq openssl python3)"
done
[ -x "$PINBROKERD" ] || fail "no $PINBROKERD: build first"
[ -x "$PINCTL_BIN" ] || fail "no $PINBROKERD or $PINCTL_BIN: build first"

T=$(mktemp -d /tmp/pinbroker-k8s.XXXXXX) || fail "cannot create a temp directory"
chmod 0755 "$T"
DPID='' SPID='' LPID='' NPID='' CPID=''
cleanup() {
	# unshare -f ignores SIGTERM; SIGKILL takes it and, by --kill-child, what runs under it.
	for p in $CPID $NPID; do kill -KILL "$p" 2>/dev/null; done
	for p in $LPID $SPID $DPID; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Wait up to $1 tenths of a second for the command after it to succeed.
wait_for() {
	n=$1
	shift
	while [ "$n" -gt 0 ]; do
		"$@" && return 0
		sleep 0.1
		n=$((n - 1))
	done
	return 1
}

# The daemon, on a socket folder of its own.
mkdir -m 0755 "$T/run"
SOCK=$T/run/pinbroker.sock
"$PINBROKERD" --config /dev/null --socket "$SOCK" --budget 2G --prewarm 4M </dev/null >"$T/daemon.log" 2>&1 &
DPID=$!
wait_for 100 "$PINCTL_BIN" --socket "$SOCK" status >/dev/null 2>&1 || { cat "$T/daemon.log"; fail "pinbrokerd did not answer on $SOCK"; }

# The API server, with a self-signed certificate for 127.0.0.1.
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$T/key.pem" -out "$T/ca.crt" -days 1 -subj /CN=127.0.0.1 \
	-addext subjectAltName=IP:127.0.0.1 >"$T/openssl.log" 2>&1 || { cat "$T/openssl.log"; fail "openssl could not make a certificate"; }
TOKEN=fake-token-$$
printf '%s' "$TOKEN" >"$T/token"
NODE=gpu-node-1
REQ=$T/requests.log
: >"$REQ"
python3 "$SRC/tests/deploy/fake-apiserver.py" "$T/ca.crt" "$T/key.pem" "$TOKEN" "$NODE" "$T/port" "$REQ" 2>"$T/server.log" &
SPID=$!
wait_for 100 test -s "$T/port" || { cat "$T/server.log"; fail "the fake API server did not start"; }
API=https://127.0.0.1:$(cat "$T/port")

export NODE_NAME="$NODE" PATCHER_API_URL="$API" PATCHER_TOKEN_FILE="$T/token" PATCHER_CA_FILE="$T/ca.crt" \
	PINCTL="$PINCTL_BIN" PINBROKER_SOCKET="$SOCK" PATCHER_INTERVAL_S=1
unset KUBERNETES_SERVICE_HOST KUBERNETES_SERVICE_PORT PATCHER_ONCE

npatch() { jq -s '[.[] | select(.method == "PATCH")] | length' "$REQ"; }
nget() { jq -s '[.[] | select(.method == "GET")] | length' "$REQ"; }
patches_are() { [ "$(npatch)" -ge "$1" ]; }
# The Nth PATCH (from 1) must carry value $2 at the resource's path, with the token and content type.
check_patch() {
	p=$(jq -sc --argjson n "$1" '[.[] | select(.method == "PATCH")][$n - 1]' "$REQ")
	[ "$(printf '%s' "$p" | jq -r .path)" = "/api/v1/nodes/$NODE/status" ] || fail "PATCH $1 went to $(printf '%s' "$p" | jq -r .path)"
	[ "$(printf '%s' "$p" | jq -r .content_type)" = application/json-patch+json ] || fail "PATCH $1's content type: $p"
	[ "$(printf '%s' "$p" | jq -r .auth)" = "Bearer $TOKEN" ] || fail "PATCH $1 did not carry the token: $p"
	body=$(printf '%s' "$p" | jq -c '.body | fromjson')
	[ "$body" = "[{\"op\":\"add\",\"path\":\"/status/capacity/pinbroker.io~1pinned-gib\",\"value\":\"$2\"}]" ] ||
		fail "PATCH $1's body is $body, expected pinbroker.io~1pinned-gib = \"$2\""
	echo "ok: PATCH $1: $body"
}

# 1. A first round patches the budget in: 2 GiB.
sh "$PATCHER" 2>"$T/patcher.log" &
LPID=$!
wait_for 100 patches_are 1 || { cat "$T/patcher.log"; fail "no PATCH within 10 s"; }
check_patch 1 2
grep -q "patched node $NODE: pinbroker.io/pinned-gib=2 (was none" "$T/patcher.log" || fail "no log line for the patch: $(cat "$T/patcher.log")"

# Whether the fake server has answered at least $1 GETs.
gets_reach() {
	[ "$(nget)" -ge "$1" ]
}

# 2. Unchanged: rounds go on (GETs) but nothing is patched again: two more rounds, waited for (1 s apart; 10 s bound).
g0=$(nget)
wait_for 100 gets_reach $((g0 + 2)) || fail "the patcher stopped looking: $g0 GETs, then $(nget) within 10 s at 1 s intervals"
g1=$(nget)
[ "$(npatch)" = 1 ] || fail "an unchanged budget was patched again ($(npatch) PATCHes)"
echo "ok: unchanged budget: $((g1 - g0)) more rounds, no PATCH"

# 3. A new budget, rounded down: 3.5 GiB is 3.
"$PINCTL_BIN" --socket "$SOCK" set budget 3584M >/dev/null || fail "pinctl set budget 3584M failed"
wait_for 50 patches_are 2 || { cat "$T/patcher.log"; fail "no PATCH within 5 s of pinctl set budget 3584M"; }
check_patch 2 3

# 4. The resource dropped from the node (a kubelet re-registering it) is put back.
curl -sS --cacert "$T/ca.crt" -X POST "$API/_test/drop/pinbroker.io/pinned-gib" >/dev/null || fail "the fake server's drop failed"
wait_for 50 patches_are 3 || { cat "$T/patcher.log"; fail "the dropped resource was not patched back within 5 s"; }
check_patch 3 3
g2=$(nget)
wait_for 100 gets_reach $((g2 + 2)) || fail "the patcher stopped looking after the repair: $g2 GETs, then $(nget)"
[ "$(npatch)" = 3 ] || fail "patched again after repairing ($(npatch) PATCHes)"

# 5. SIGTERM ends the loop at once (it sleeps in the background) with status 0.
kill -TERM "$LPID"
wait_for 20 sh -c "! kill -0 $LPID 2>/dev/null" || fail "the patcher is still running 2 s after SIGTERM"
wait "$LPID"
rc=$?
LPID=
[ "$rc" = 0 ] || fail "the patcher exited $rc on SIGTERM, expected 0"
echo "ok: SIGTERM: exited 0 at once"

# 6. Errors: one round each (PATCHER_ONCE=1), exit 1 or 2 with a message that says what is wrong.
once() {
	want_rc=$1 want_msg=$2
	shift 2
	env PATCHER_ONCE=1 "$@" sh "$PATCHER" >"$T/once.out" 2>&1
	rc=$?
	[ "$rc" = "$want_rc" ] || { cat "$T/once.out"; fail "$*: exit $rc, expected $want_rc"; }
	grep -q -- "$want_msg" "$T/once.out" || { cat "$T/once.out"; fail "$*: no '$want_msg' in the output"; }
	echo "ok: $*: exit $rc, $(grep -- "$want_msg" "$T/once.out" | head -n 1)"
}
once 0 "already has pinbroker.io/pinned-gib=3" PATCHER_ONCE=1
printf 'wrong' >"$T/bad-token"
once 1 "HTTP 401" PATCHER_TOKEN_FILE="$T/bad-token"
once 1 "cannot read the service account token" PATCHER_TOKEN_FILE="$T/no-such-token"
once 1 "HTTP 404: nodes \"other-node\" not found" NODE_NAME=other-node
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$T/key2.pem" -out "$T/other-ca.crt" -days 1 -subj /CN=other \
	>/dev/null 2>&1 || fail "openssl could not make a second certificate"
once 1 "curl exit 60" PATCHER_CA_FILE="$T/other-ca.crt"
once 1 "pinctl status failed" PINBROKER_SOCKET="$T/run/nothing.sock"
once 2 "NODE_NAME is not set" NODE_NAME=
once 2 "KUBERNETES_SERVICE_HOST/PORT are not set" PATCHER_API_URL=
once 2 "PATCHER_INTERVAL_S must be" PATCHER_INTERVAL_S=soon
once 2 "nope not found in PATH" PINCTL=nope
"$PINCTL_BIN" --socket "$SOCK" set budget 1G >/dev/null || fail "pinctl set budget 1G failed"
curl -sS --cacert "$T/ca.crt" -X POST "$API/_test/forbid" >/dev/null || fail "the fake server's forbid failed"
once 1 "cannot patch resource \"nodes/status\"" PATCHER_ONCE=1
grep -q "rbac.yaml" "$T/once.out" || fail "a 403 does not point at rbac.yaml"
# IPv6 service address: bracketed in the URL.
once 1 "https://\[fd00::1\]:443/api/v1/nodes/$NODE" PATCHER_API_URL= KUBERNETES_SERVICE_HOST=fd00::1 \
	KUBERNETES_SERVICE_PORT=443 PATCHER_CA_FILE="$T/ca.crt"

# 7. The socket folder mounted read-only, as the client pod and the patcher mount it.
if command -v unshare >/dev/null && unshare -m true 2>/dev/null; then
	mkdir "$T/ro"
	# shellcheck disable=SC2016
	unshare -m sh -c 'mount --bind "$1" "$2" && mount -o remount,bind,ro "$2" && ! touch "$2/x" 2>/dev/null &&
		"$3" --socket "$2/pinbroker.sock" status >/dev/null' sh "$T/run" "$T/ro" "$PINCTL_BIN" ||
		fail "pinctl could not reach the daemon through a read-only bind mount of its socket folder"
	echo "ok: pinctl status through a read-only bind mount of the socket folder"
else
	echo "note: no mount namespace here: the read-only mount check did not run"
fi
# 8. hostPID: the daemon in the host's pid namespace sees a client's real pid; one in a pid
# namespace of its own (a pod without hostPID) sees a client pod's process as pid 0.
"$PINCTL_BIN" --socket "$SOCK" acquire 4M --hold 3 --label host-ns >/dev/null 2>&1 &
CPID=$!
lease_pid() { "$PINCTL_BIN" --socket "$1" status --json | jq -e --arg l "$2" '.leases[] | select(.label == $l) | .pid'; }
wait_for 50 lease_pid "$SOCK" host-ns >/dev/null || fail "no lease from the host-namespace client"
[ "$(lease_pid "$SOCK" host-ns)" = "$CPID" ] || fail "the daemon saw pid $(lease_pid "$SOCK" host-ns) for client $CPID"
kill "$CPID" 2>/dev/null
wait "$CPID" 2>/dev/null
CPID=''

if unshare -p -f --mount-proc --kill-child true 2>/dev/null; then
	mkdir -m 0755 "$T/ns"
	unshare -p -f --mount-proc --kill-child "$PINBROKERD" --config /dev/null --socket "$T/ns/pb.sock" --budget 1G \
		--prewarm 4M </dev/null >"$T/ns.log" 2>&1 &
	NPID=$!
	wait_for 100 "$PINCTL_BIN" --socket "$T/ns/pb.sock" status >/dev/null 2>&1 || { cat "$T/ns.log"; fail "no daemon in a pid namespace"; }
	unshare -p -f --mount-proc --kill-child "$PINCTL_BIN" --socket "$T/ns/pb.sock" acquire 4M --hold 3 --label pod \
		>/dev/null 2>&1 &
	CPID=$!
	# Only an admin sees another pid namespace's rows, and root is one only from the daemon's own pid
	# namespace (issue 38): the look is taken from there (nsenter into the daemon's, pid 1 of it).
	NSDPID=$(cut -d' ' -f1 "/proc/$NPID/task/$NPID/children" 2>/dev/null)
	[ -n "$NSDPID" ] || fail "cannot find the daemon started in a pid namespace (child of $NPID)"
	ns_lease_pid() { nsenter -t "$NSDPID" -p "$PINCTL_BIN" --socket "$1" status --json | jq -e --arg l "$2" '.leases[] | select(.label == $l) | .pid'; }
	wait_for 50 ns_lease_pid "$T/ns/pb.sock" pod >/dev/null || fail "no lease from the client in another pid namespace"
	p=$(ns_lease_pid "$T/ns/pb.sock" pod)
	[ "$p" = 0 ] || fail "a daemon in its own pid namespace saw the other namespace's client as pid $p, expected 0"
	echo "ok: hostPID: the host-namespace daemon sees the client's pid ($CPID); one in its own pid namespace sees pid 0"
else
	echo "note: no pid namespaces here: the hostPID check did not run"
fi
echo "PASS: node-patcher.sh"

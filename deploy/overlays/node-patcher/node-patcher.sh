#!/bin/sh
# SPDX-License-Identifier: MIT
# Advertise this node's pinbroker budget to Kubernetes as the extended resource
# pinbroker.io/pinned-gib (whole GiB, rounded down), patched into the Node's status.capacity
# through the API server; the kubelet copies it into allocatable. Runs as a sidecar of the
# pinbrokerd DaemonSet: every PATCHER_INTERVAL_S it reads `pinctl status --json` (budget_bytes)
# and the Node's current capacity, and patches only when the two differ (so a kubelet that
# drops the resource, or an edit by hand, is repaired, and an unchanged value is never sent).
# Needs sh, curl and jq, and pinctl reaching the daemon's socket.
#
# Environment (the defaults are what a pod has):
#   NODE_NAME            the node to patch (required; the downward API's spec.nodeName)
#   PINBROKER_SOCKET     the daemon's socket (pinctl's default: /run/pinbroker/pinbroker.sock)
#   PATCHER_API_URL      default https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
#   PATCHER_TOKEN_FILE   default /var/run/secrets/kubernetes.io/serviceaccount/token (re-read
#                        for every request: projected tokens are rotated)
#   PATCHER_CA_FILE      default /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
#   PATCHER_RESOURCE     default pinbroker.io/pinned-gib
#   PATCHER_INTERVAL_S   default 60
#   PATCHER_ONCE         1: one round, then exit 0 if it succeeded, 1 if not
#   PINCTL               default pinctl
set -u

SA=/var/run/secrets/kubernetes.io/serviceaccount
TOKEN_FILE=${PATCHER_TOKEN_FILE:-$SA/token}
CA_FILE=${PATCHER_CA_FILE:-$SA/ca.crt}
RESOURCE=${PATCHER_RESOURCE:-pinbroker.io/pinned-gib}
INTERVAL=${PATCHER_INTERVAL_S:-60}
ONCE=${PATCHER_ONCE:-0}
PINCTL=${PINCTL:-pinctl}
GIB=1073741824

log() { echo "node-patcher: $*" >&2; }
die() { log "$*"; exit 2; }

[ -n "${NODE_NAME:-}" ] || die "NODE_NAME is not set (give the container env NODE_NAME from fieldRef spec.nodeName)"
case $INTERVAL in '' | *[!0-9]* | 0) die "PATCHER_INTERVAL_S must be a whole number of seconds above 0, not '$INTERVAL'" ;; esac
for tool in curl jq "$PINCTL"; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool not found in PATH (the image needs curl, jq and pinctl)"
done
if [ -n "${PATCHER_API_URL:-}" ]; then
	API=${PATCHER_API_URL%/}
else
	if [ -z "${KUBERNETES_SERVICE_HOST:-}" ] || [ -z "${KUBERNETES_SERVICE_PORT:-}" ]; then
		die "KUBERNETES_SERVICE_HOST/PORT are not set (not in a pod?); set PATCHER_API_URL"
	fi
	host=$KUBERNETES_SERVICE_HOST
	case $host in *:*) host="[$host]" ;; esac # an IPv6 address
	API="https://$host:$KUBERNETES_SERVICE_PORT"
fi
NODE_URL="$API/api/v1/nodes/$NODE_NAME"
# The resource name as one JSON-pointer token (RFC 6901): ~ is ~0, / is ~1.
POINTER="/status/capacity/$(printf '%s' "$RESOURCE" | sed 's/~/~0/g; s#/#~1#g')"

trap 'log "stopping"; exit 0' TERM INT

# api METHOD URL [BODY]: the response body on stdout; returns 1 with a message naming the HTTP
# status and the API server's own message on any failure. The token goes to curl on its stdin
# (--config -), never on a command line another process could read.
api() {
	method=$1 url=$2 body=${3:-}
	[ -r "$TOKEN_FILE" ] || { log "cannot read the service account token $TOKEN_FILE"; return 1; }
	[ -r "$CA_FILE" ] || { log "cannot read the API server's CA certificate $CA_FILE"; return 1; }
	token=$(cat "$TOKEN_FILE") || return 1
	set -- --config - --silent --show-error --cacert "$CA_FILE" --connect-timeout 5 --max-time 20 \
		-X "$method" -H 'Accept: application/json' -w '\n%{http_code}'
	[ -z "$body" ] || set -- "$@" -H 'Content-Type: application/json-patch+json' --data-binary "$body"
	out=$(printf 'header = "Authorization: Bearer %s"\n' "$token" | curl "$@" "$url" 2>&1)
	rc=$?
	if [ $rc -ne 0 ]; then
		# curl's own one-line error ("curl: (60) SSL certificate problem: ..."), not its advice
		log "$method $url failed: curl exit $rc: $(printf '%s\n' "$out" | grep -m 1 '^curl: ' || printf '%s' "$out" | head -n 1)"
		return 1
	fi
	code=$(printf '%s' "$out" | tail -n 1)
	resp=$(printf '%s' "$out" | sed '$d')
	case $code in
	2??) printf '%s\n' "$resp" ;;
	*)
		msg=$(printf '%s' "$resp" | jq -r '.message // empty' 2>/dev/null)
		log "$method $url: HTTP $code: ${msg:-$(printf '%s' "$resp" | head -c 300)}"
		[ "$code" = 401 ] && log "  (the token in $TOKEN_FILE was not accepted)"
		[ "$code" = 403 ] && log "  (the service account needs get on nodes and patch on nodes/status: deploy/overlays/node-patcher/rbac.yaml)"
		return 1
		;;
	esac
}

# One round: 0 when the node carries the budget (already, or patched now), 1 on any failure.
round() {
	status=$("$PINCTL" status --json 2>&1) || {
		log "pinctl status failed (is pinbrokerd up on ${PINBROKER_SOCKET:-its default socket}?): $(printf '%s' "$status" | head -n 3 | tr '\n' ' ')"
		return 1
	}
	want=$(printf '%s' "$status" | jq -er --argjson g "$GIB" \
		'.budget_bytes | select(type == "number" and . >= 0) | (. / $g) | floor') || {
		log "pinctl status --json has no budget_bytes number: $(printf '%s' "$status" | head -c 200)"
		return 1
	}
	node=$(api GET "$NODE_URL") || return 1
	have=$(printf '%s' "$node" | jq -r --arg r "$RESOURCE" '.status.capacity[$r] // "none"') || {
		log "GET $NODE_URL: the answer is not a Node object"
		return 1
	}
	if [ "$have" = "$want" ]; then
		[ "$have" = "${last_seen:-}" ] || log "node $NODE_NAME already has $RESOURCE=$want"
		last_seen=$have
		return 0
	fi
	body=$(jq -cn --arg p "$POINTER" --arg v "$want" '[{op: "add", path: $p, value: $v}]')
	api PATCH "$NODE_URL/status" "$body" >/dev/null || return 1
	log "patched node $NODE_NAME: $RESOURCE=$want (was $have; budget $(printf '%s' "$status" | jq -r .budget_bytes) bytes)"
	last_seen=$want
	return 0
}

log "advertising pinbroker's budget on node $NODE_NAME as $RESOURCE through $API every ${INTERVAL}s"
while :; do
	round
	r=$?
	[ "$ONCE" = 1 ] && exit $r
	# sleep in the background, so SIGTERM ends the wait at once
	sleep "$INTERVAL" &
	wait $! || true
done

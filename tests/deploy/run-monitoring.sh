#!/bin/sh
# SPDX-License-Identifier: MIT
# deploy/monitoring against promtool and the real daemon: `promtool check rules` and `promtool test rules`
# on the alert rules; `promtool check metrics` on what the daemon really serves (`pinctl metrics` and its
# metrics-path file, holding a lease so the per-uid and per-cgroup rows are there), once on this host's /proc
# and once on a crafted proc root with swap, PSI and a cgroup limit, so that every conditional metric
# (the swap counters, the PSI and cgroup ratios) shows; then check-monitoring.py on the Grafana dashboard
# and the rules: every metric name they query is one of those the daemon emitted.
# usage: run-monitoring.sh SOURCE_DIR BUILD_DIR      exit 0 pass, 1 fail, 77 skip
set -u
SRC=${1:?usage: run-monitoring.sh SOURCE_DIR BUILD_DIR}
BUILD=${2:?usage: run-monitoring.sh SOURCE_DIR BUILD_DIR}
PINBROKERD=$BUILD/daemon/pinbrokerd
PINCTL=$BUILD/client/pinctl
MON=$SRC/deploy/monitoring

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }
. "$SRC/tests/deploy/answering.sh"

command -v promtool >/dev/null || skip "promtool not found (Debian package prometheus)"
python3 -c 'import yaml' 2>/dev/null || skip "python3 yaml not found (Debian package python3-yaml)"
if [ ! -x "$PINBROKERD" ] || [ ! -x "$PINCTL" ]; then fail "no $PINBROKERD or $PINCTL: build first"; fi

if command -v yamllint >/dev/null; then
	# The style of deploy/kubernetes (tests/deploy/run-k8s.sh): two spaces, lines up to 120.
	rules='line-length: {max: 120}, document-start: disable, comments: {min-spaces-from-content: 1}'
	yamllint -s -d "{extends: default, rules: {$rules}}" "$MON" || fail "yamllint found problems (above)"
else
	echo "note: yamllint not found (apt-get install yamllint): not linted"
fi
promtool check rules "$MON/pinbroker-alerts.yml" || fail "promtool check rules"
# promtool resolves rule_files relative to the test file.
promtool test rules "$MON/pinbroker-alerts.test.yml" || fail "promtool test rules"

T=$(mktemp -d /tmp/pinbroker-monitoring.XXXXXX) || fail "cannot create a temp directory"
chmod 0755 "$T"
DPID='' HPID=''
cleanup() {
	[ -n "$HPID" ] && kill "$HPID" 2>/dev/null && wait "$HPID" 2>/dev/null
	[ -n "$DPID" ] && kill "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Start a daemon (extra arguments after the name), wait until it answers; $DPID is its pid. Its quota rule "/"
# covers every cgroup, the root one included (a container's, where the holder may sit), so the per-cgroup quota
# row is always there for the dashboard's check.
start_daemon() {
	name=$1
	shift
	"$PINBROKERD" --socket "$T/$name.sock" --budget 64M --prewarm 4M --metrics-path "$T/$name.prom" \
		--metrics-interval-ms 1000 --job-quota '/:32M' "$@" </dev/null >"$T/$name.log" 2>&1 &
	DPID=$!
	wait_answering "$T/$name.sock" "$T/$name.log" "pinbrokerd ($name) did not answer"
}

stop_daemon() {
	kill "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null
	DPID=''
}

# Take the daemon's metrics both ways and check them. With "lease", first hold a lease so that the per-uid and
# per-cgroup rows exist (the crafted root's pressure is tight: it lends nothing there).
scrape() {
	name=$1
	want='^pinbroker_leases 0$'
	if [ "$2" = lease ]; then
		"$PINCTL" --socket "$T/$name.sock" acquire 4M --hold 60 >"$T/$name.hold" 2>&1 &
		HPID=$!
		want='^pinbroker_leases 1$'
	fi
	n=0
	until "$PINCTL" --socket "$T/$name.sock" metrics >"$T/$name.txt" 2>&1 && grep -q "$want" "$T/$name.txt" &&
		{ [ "$2" != lease ] || grep -q '^pinbroker_job_leased_bytes{cgroup="' "$T/$name.txt"; } &&
		grep -q "$want" "$T/$name.prom" 2>/dev/null; do
		n=$((n + 1))
		[ $n -lt 100 ] || { cat "$T/$name.txt" "$T/$name.hold"; fail "$name: the metrics do not show the lease"; }
		sleep 0.1
	done
	cp "$T/$name.prom" "$T/$name.file.txt"
	for f in "$T/$name.txt" "$T/$name.file.txt"; do
		promtool check metrics <"$f" || fail "$name: promtool check metrics on $(basename "$f")"
	done
	grep -q 'pinbroker_signal\|{job=' "$T/$name.txt" && fail "$name: the old pinbroker_signal or job label is still there"
	[ -n "$HPID" ] && kill "$HPID" 2>/dev/null && wait "$HPID" 2>/dev/null
	HPID=''
	echo "ok: $name: promtool check metrics passes on pinctl metrics and the metrics-path file"
}

start_daemon host
scrape host lease
stop_daemon

# cgroup-v2's limit and PSI, with swapping's meminfo and vmstat: swap in use and swap traffic.
mkdir -p "$T/root"
cp -r "$SRC/tests/fixtures/proc/cgroup-v2/." "$T/root/"
cp "$SRC/tests/fixtures/proc/swapping/proc/meminfo" "$SRC/tests/fixtures/proc/swapping/proc/vmstat" "$T/root/proc/"
start_daemon crafted --proc-root "$T/root" --lock-memory no
scrape crafted none
stop_daemon
for m in pinbroker_swap_free_ratio pinbroker_swap_in_bytes_total pinbroker_swap_out_bytes_total \
	pinbroker_psi_some_avg10_ratio pinbroker_psi_full_avg10_ratio pinbroker_cgroup_usage_ratio; do
	grep -q "^$m " "$T/crafted.txt" || fail "crafted proc root: no $m"
done

python3 "$SRC/tests/deploy/check-monitoring.py" "$MON/pinbroker-dashboard.json" "$MON/pinbroker-alerts.yml" \
	"$T/host.txt" "$T/crafted.txt" || fail "check-monitoring.py"
echo "ok: deploy/monitoring"

# SPDX-License-Identifier: MIT
# Sourced (bash) by the check scripts that run inside an nspawn-booted guest (systemd/in-guest.sh,
# package/in-guest-deb.sh; nspawn_run_guest installs this file beside them): TAP lines to
# $OUT/result.tap, everything else to $OUT/detail.log, and the helpers both use. The caller sets
# UNIT (the service prop reads by default) and PLAN, and calls guest_tap_start OUT first.

# guest_tap_start OUT: results go to OUT; from here on stdout and stderr go to the detail log.
guest_tap_start() {
	OUT=$1
	mkdir -p "$OUT"
	TAP=$OUT/result.tap
	LOG=$OUT/detail.log
	: >"$TAP"
	: >"$LOG"
	exec 3>>"$LOG"
	exec >&3 2>&3
	N=0
}

log() { printf '# %s\n' "$*"; }
ok() { N=$((N + 1)); echo "ok $N - $1" >>"$TAP"; log "ok $N - $1"; }
notok() {
	N=$((N + 1))
	echo "not ok $N - $1${2:+ ($2)}" >>"$TAP"
	log "not ok $N - $1${2:+ ($2)}"
}
# check DESC CMD...: one TAP line from a command's exit status; its output goes to the log.
check() {
	local desc=$1
	shift
	log "check: $desc: $*"
	if "$@"; then ok "$desc"; else notok "$desc" "command failed: $*"; fi
}
# prop NAME [UNIT]: a property of UNIT (default $UNIT).
prop() { systemctl show -p "$1" --value "${2:-$UNIT}"; }
# The number after "KEY": in pinctl's JSON; empty when the key is missing.
json_num() { grep -o "\"$1\" *: *[0-9.]*" | head -n1 | sed 's/.*: *//'; }
status_num() { pinctl status --json 2>/dev/null | json_num "$1"; }
# wait_for SECONDS CMD...: poll every 0.2 s until CMD succeeds.
wait_for() {
	local deadline=$((SECONDS + $1))
	shift
	while ! "$@"; do
		[ $SECONDS -ge $deadline ] && return 1
		sleep 0.2
	done
}
svc_active() { [ "$(prop ActiveState)" = active ]; }
# new_mainpid OLD: the service runs again, under a main pid other than OLD.
new_mainpid() { local p; p=$(prop MainPID); [ "$p" != 0 ] && [ "$p" != "$1" ] && svc_active; }
# Resident bytes of pinbroker chunk memfds mapped by processes other than the daemon: a holder's
# pages, which stay in memory across a restart or an upgrade whatever the daemon counts.
outside_rss() {
	local d p
	d=$(prop MainPID)
	for p in /proc/[0-9]*; do
		[ "${p#/proc/}" = "$d" ] && continue
		awk '/^[0-9a-f]+-[0-9a-f]+ / { m = ($0 ~ /\/memfd:pinbroker-chunk/) } m && /^(Rss|Shared_Hugetlb|Private_Hugetlb):/ { s += $2 }
			END { print s * 1024 + 0 }' "$p/smaps" 2>/dev/null
	done | awk '{ s += $1 } END { print s + 0 }'
}

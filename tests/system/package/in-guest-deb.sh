#!/bin/bash
# SPDX-License-Identifier: MIT
# Runs inside the nspawn-booted Debian (from pinbroker-deb-test.service) that run-deb.sh
# installed the packages into with `dpkg -i` in a chroot: checks what the postinst left at boot,
# socket activation and a lease, the journal catalog; then, with systemd running, a reinstall
# (the upgrade path), `dpkg -r`, `dpkg -P`, and a fresh `dpkg -i` that starts the socket at once.
# Writes TAP lines to $1/result.tap, details to $1/detail.log.
set -u
# The TAP output and the helpers shared with the other guest script (installed beside this one).
# shellcheck source=tests/system/lib/guest-lib.sh
. "$(dirname "$0")/guest-lib.sh"
guest_tap_start "${1:-/pinbroker-results}"

DEBS=/var/tmp/pinbroker-debs
CONF=/etc/pinbroker/pinbrokerd.conf
SOCK=/run/pinbroker/pinbroker.sock
UNIT=pinbrokerd.service
CATALOG=/usr/lib/systemd/catalog/pinbroker.catalog
PLAN=37

svc_inactive() { [ "$(prop ActiveState)" = inactive ]; }
sock_active() { [ "$(prop ActiveState pinbrokerd.socket)" = active ]; }
pkg_status() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null; }
# A listening AF_UNIX socket bound to the broker's path (/proc/net/unix: flags 00010000 =
# listening) that a process of this guest holds. The guest shares the host's network namespace,
# so /proc/net/unix also lists other containers' sockets of the same path (run-nspawn.sh's).
listening() {
	local ino
	for ino in $(awk -v p="$SOCK" '$NF == p && $4 == "00010000" { print $7 }' /proc/net/unix); do
		find /proc/[0-9]*/fd -lname "socket:\[$ino\]" 2>/dev/null | grep -q . && return 0
	done
	return 1
}
sock_ok() { listening && [ "$(stat -c '%a %U %G' "$SOCK")" = '660 root pinbroker' ]; }
not_listening() { ! listening; }
not_started() { svc_inactive && ! pgrep -x pinbrokerd; }
leased_at_least() { [ "$(status_num leased_bytes)" -ge "$1" ] 2>/dev/null; }
# Every MESSAGE_ID of the catalog file, read before `dpkg -r` takes the file away.
IDS=$(sed -n 's/^-- \([0-9a-f]\{32\}\)$/\1/p' "$CATALOG" 2>/dev/null)
catalog_lists() {
	local list id
	list=$(journalctl --list-catalog 2>/dev/null)
	for id in $IDS; do grep -q "^$id " <<<"$list" || return 1; done
}
catalog_lists_none() {
	local list id
	list=$(journalctl --list-catalog 2>/dev/null)
	for id in $IDS; do grep -q "^$id " <<<"$list" && return 1; done
	return 0
}
DEB=$(ls "$DEBS"/pinbroker_*.deb)
LIBDEB=$(ls "$DEBS"/libpinbroker1_*.deb)

log "guest: $(uname -r), $(systemctl --version | head -n1)"
log "system state: $(systemctl is-system-running)"
log "packages: $DEB $LIBDEB; catalog ids: $(echo $IDS)"

# --- installed before boot (dpkg -i in a chroot, no systemd running) ---
check "dpkg: pinbroker and libpinbroker1 are installed" \
	sh -c '[ "$(dpkg-query -W -f="\${Status}" pinbroker)" = "install ok installed" ] &&
		[ "$(dpkg-query -W -f="\${Status}" libpinbroker1)" = "install ok installed" ]'
check "sysusers: system group and user pinbroker (uid < 1000, primary group pinbroker)" \
	sh -c 'getent group pinbroker && u=$(id -u pinbroker) && [ "$u" -lt 1000 ] &&
		[ "$(id -gn pinbroker)" = pinbroker ]'
check "tmpfiles: /run/pinbroker is a root-owned 0755 directory" \
	sh -c '[ "$(stat -c "%a %U %G" /run/pinbroker)" = "755 root root" ]'
check "pinbrokerd.socket is enabled and active" \
	sh -c '[ "$(systemctl is-enabled pinbrokerd.socket)" = enabled ] && systemctl is-active pinbrokerd.socket'
check "the socket listens at $SOCK, 0660 root:pinbroker" sock_ok
check "pinbrokerd.service is not enabled (only the socket is)" \
	sh -c '[ "$(systemctl is-enabled pinbrokerd.service)" = disabled ]'
check "the service is not running before the first client" not_started

# --- the first client starts it ---
log "pinctl status (root):"
if pinctl status && wait_for 10 svc_active; then ok "pinctl status connects and socket-activates the daemon"
else notok "pinctl status connects and socket-activates the daemon" "state $(prop ActiveState)"; fi
systemctl status --no-pager "$UNIT" pinbrokerd.socket
pid=$(prop MainPID)
check "the daemon runs as user pinbroker, with the packaged config" \
	sh -c "[ \"\$(awk '/^Uid:/ { print \$2 }' /proc/$pid/status)\" = \"\$(id -u pinbroker)\" ] &&
		tr '\\0' ' ' </proc/$pid/cmdline | grep -q -- '--config $CONF'"
useradd -M -G pinbroker alice
t=$(date +%s)
sleep 1
log "pinctl acquire 16M as alice (group pinbroker):"
if runuser -u alice -- pinctl acquire 16M --label deb-test; then ok "a client in group pinbroker acquires a lease (pinctl acquire 16M)"
else notok "a client in group pinbroker acquires a lease (pinctl acquire 16M)"; fi

# --- the journal catalog the postinst registered ---
if [ -n "$IDS" ] && catalog_lists; then ok "journalctl --list-catalog lists all $(echo $IDS | wc -w) pinbroker message ids"
else notok "journalctl --list-catalog lists all pinbroker message ids" "ids '$(echo $IDS)'"; fi
# The id whose entry says "granted": the lease-granted event, which the acquire above logged.
granted=$(awk '/^-- [0-9a-f]+$/ { id = $2 } /^Subject:.* granted/ { print id; exit }' "$CATALOG")
# MESSAGE_ID alone: only pinbrokerd logs these ids.
explained() {
	journalctl -q --no-pager -x --since "@$t" MESSAGE_ID="$granted" >"$OUT/granted.txt" 2>&1
	grep -q 'Subject: Pinned-memory lease .* granted' "$OUT/granted.txt"
}
wait_for 5 explained
cat "$OUT/granted.txt"
if explained; then
	ok "journalctl -x explains the lease-granted event with the catalog text"
else notok "journalctl -x explains the lease-granted event with the catalog text"; fi

# --- reinstall with systemd running: the upgrade path (postinst configure with a version) ---
echo "# admin's edit, kept across upgrades" >>"$CONF"
runuser -u alice -- pinctl acquire 16M --hold 120 --label deb-holder >"$OUT/holder.log" 2>&1 &
holder=$!
wait_for 10 leased_at_least $((16 << 20)) || log "the holder's lease did not show: $(pinctl status 2>&1)"
pid0=$(prop MainPID)
l0=$(status_num leased_bytes)
r0=$(outside_rss)
log "before the reinstall: MainPID=$pid0 leased_bytes=$l0 holder memfd rss=$r0"
# Issue 38, finding 2: a job's quota rule, as a Slurm prolog sets it, set before the upgrade.
QJOB=/system.slice/slurmstepd.scope/job_77
pinctl quota set "$QJOB" 8G || log "pinctl quota set $QJOB 8G failed"
dpkg -i "$DEB" >"$OUT/dpkg-reinstall.log" 2>&1
rc=$?
cat "$OUT/dpkg-reinstall.log"
check "dpkg -i of the installed version again (upgrade path) succeeds" [ $rc = 0 ]
if wait_for 20 new_mainpid "$pid0"; then ok "the upgrade restarted the running daemon (MainPID $pid0 -> $(prop MainPID))"
else notok "the upgrade restarted the running daemon" "state $(prop ActiveState) MainPID $(prop MainPID)"; fi
check "the socket stayed enabled and active, and the new daemon answers" \
	sh -c 'systemctl is-active pinbrokerd.socket && [ "$(systemctl is-enabled pinbrokerd.socket)" = enabled ] &&
		pinctl status >/dev/null'
check "the lease holder outlived the restart (its mapping stays valid)" kill -0 "$holder"
check "the admin's edit of pinbrokerd.conf (a conffile) was kept" grep -q "admin's edit" "$CONF"
# Issue 22, finding 7: the upgrade's restart empties systemd's fd store; the new daemon still counts
# the holder's 16M, which it still maps (resident), as orphaned until it exits.
l1=$(status_num leased_bytes)
o1=$(status_num orphaned_bytes)
r1=$(outside_rss)
log "after the upgrade: leased_bytes=$l1 orphaned_bytes=$o1 holder memfd rss=$r1 (before: $l0, $r0)"
pinctl status
if [ "$l0" = $((16 << 20)) ] && [ "$r0" = $((16 << 20)) ] && [ "$l1" = $((16 << 20)) ] && [ "$o1" = $((16 << 20)) ] &&
	[ "$r1" = $((16 << 20)) ]; then
	ok "the upgrade keeps the holder's 16M counted (leased_bytes $l0 -> $l1, orphaned $o1, still resident)"
else
	notok "the upgrade keeps the holder's 16M counted" "leased_bytes $l0 -> '$l1', orphaned '$o1', memfd rss $r0 -> $r1"
fi
# Issue 38, finding 2: the upgrade's restart keeps the quota rule (/run/pinbrokerd/quota-rules).
PLAN=$((PLAN + 1))
pinctl quota list
if pinctl quota list --json | grep -q "\"pattern\":\"$QJOB\",\"bytes\":8589934592,\"source\":\"set\""; then
	ok "the upgrade keeps the job's 8G quota rule set before it (pinctl quota list)"
else
	notok "the upgrade keeps the job's 8G quota rule set before it" "$(pinctl quota list 2>&1 | tr '\n' ' ')"
fi
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
leased_zero() { [ "$(status_num leased_bytes)" = 0 ]; }
if wait_for 20 leased_zero; then ok "the holder exits: its 16M is no longer counted (leased_bytes 0)"
else notok "the holder exits: its 16M is no longer counted" "leased_bytes '$(status_num leased_bytes)'"; fi

# --- dpkg -r: stops and removes the units, keeps the conffiles ---
dpkg -r pinbroker >"$OUT/dpkg-remove.log" 2>&1
rc=$?
cat "$OUT/dpkg-remove.log"
check "dpkg -r pinbroker succeeds" [ $rc = 0 ]
check "after dpkg -r: service and socket are stopped" \
	sh -c '[ "$(systemctl show -p ActiveState --value pinbrokerd.service)" != active ] &&
		[ "$(systemctl show -p ActiveState --value pinbrokerd.socket)" != active ] && ! pgrep -x pinbrokerd'
check "after dpkg -r: nothing listens at $SOCK" not_listening
check "after dpkg -r: the unit files, pinctl and pinbrokerd are gone" \
	sh -c '! ls /lib/systemd/system/pinbrokerd.* /usr/lib/systemd/system/pinbrokerd.* 2>/dev/null &&
		[ ! -e /usr/bin/pinctl ] && [ ! -e /usr/sbin/pinbrokerd ]'
check "after dpkg -r: the conffiles stay (status deinstall ok config-files)" \
	sh -c "[ -f $CONF ] && [ \"\$(dpkg-query -W -f='\${Status}' pinbroker)\" = 'deinstall ok config-files' ]"
if catalog_lists_none; then ok "after dpkg -r: journalctl --list-catalog no longer lists pinbroker's ids"
else notok "after dpkg -r: journalctl --list-catalog no longer lists pinbroker's ids"; fi

# --- dpkg -i over the config files dpkg -r left (the postinst gets the old version as $2) ---
dpkg -i "$DEB" >"$OUT/dpkg-reinstall-removed.log" 2>&1
rc=$?
cat "$OUT/dpkg-reinstall-removed.log"
check "dpkg -i after dpkg -r: the socket is enabled and listening again" \
	sh -c "[ $rc = 0 ] && [ \"\$(systemctl is-enabled pinbrokerd.socket)\" = enabled ] && systemctl is-active pinbrokerd.socket"
check "dpkg -i after dpkg -r: a client starts the daemon" sh -c 'pinctl status >/dev/null'

# --- dpkg -P (of the installed package: prerm and postrm remove, then postrm purge) ---
dpkg -P pinbroker >"$OUT/dpkg-purge.log" 2>&1
rc=$?
cat "$OUT/dpkg-purge.log"
check "dpkg -P pinbroker succeeds" [ $rc = 0 ]
check "after dpkg -P: /etc/pinbroker, /run/pinbroker and /run/pinbrokerd are gone" \
	sh -c '[ ! -e /etc/pinbroker ] && [ ! -e /run/pinbroker ] && [ ! -e /run/pinbrokerd ]'
left=$(find /etc/systemd /var/lib/systemd/deb-systemd-helper-enabled /var/lib/systemd/deb-systemd-helper-masked \
	-name '*pinbroker*' ! -name 'pinbroker-deb-test.service' 2>/dev/null)
log "left under /etc/systemd and deb-systemd-helper's state: '$left'"
check "after dpkg -P: no enable link, mask or deb-systemd-helper state left" [ -z "$left" ]
check "after dpkg -P: dpkg no longer knows pinbroker; libpinbroker1 stays installed" \
	sh -c '[ -z "$(dpkg-query -W -f="\${Status}" pinbroker 2>/dev/null | grep -v "not-installed")" ] &&
		[ "$(dpkg-query -W -f="\${Status}" libpinbroker1)" = "install ok installed" ]'
check "after dpkg -P: the pinbroker user and group stay (Debian leaves system users)" \
	sh -c 'getent passwd pinbroker && getent group pinbroker'

# --- dpkg -i with systemd running: the socket starts at once ---
dpkg -i "$DEB" >"$OUT/dpkg-live.log" 2>&1
rc=$?
cat "$OUT/dpkg-live.log"
check "dpkg -i on the running system succeeds" [ $rc = 0 ]
check "the postinst enabled and started the socket; the service waits for a client" \
	sh -c '[ "$(systemctl is-enabled pinbrokerd.socket)" = enabled ] && systemctl is-active pinbrokerd.socket &&
		[ "$(systemctl show -p ActiveState --value pinbrokerd.service)" = inactive ]'
if pinctl acquire 4M --label deb-live && wait_for 10 svc_active; then
	ok "pinctl acquire socket-activates the freshly installed daemon"
else notok "pinctl acquire socket-activates the freshly installed daemon" "state $(prop ActiveState)"; fi
journalctl -q --no-pager -b -u pinbrokerd.service -u pinbrokerd.socket >"$OUT/journal.txt"
dpkg -P pinbroker libpinbroker1 >"$OUT/dpkg-purge-all.log" 2>&1
rc=$?
cat "$OUT/dpkg-purge-all.log"
check "dpkg -P pinbroker libpinbroker1 leaves no pinbroker file but the user" \
	sh -c "[ $rc = 0 ] && ! dpkg -S pinbroker 2>/dev/null && [ ! -e /etc/pinbroker ] &&
		! ls /usr/lib/*/libpinbroker* 2>/dev/null && ! pgrep -x pinbrokerd"
if ! systemctl is-active --quiet pinbrokerd.socket && ! systemctl is-active --quiet pinbrokerd.service; then
	ok "after the last purge no pinbroker unit is active"
else notok "after the last purge no pinbroker unit is active"; fi

echo "1..$PLAN" >>"$TAP"
log "done: $N checks"

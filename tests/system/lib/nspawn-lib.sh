# SPDX-License-Identifier: MIT
# Sourced by tests/system/systemd/run-nspawn.sh and tests/system/package/run-deb.sh (bash): the cached
# pristine Debian bookworm root (debootstrapped once, stamped with what it was built from), a
# throwaway copy of it per run, booting a copy with systemd-nspawn, and a probe that skips
# where this host cannot boot one, and running a check script in it (nspawn_run_guest). The caller
# defines SRC (the source tree), and may set PINBROKER_NSPAWN_CACHE / PINBROKER_NSPAWN_MIRROR first.

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
# lap NAME START: how long NAME took since START (date +%s.%N); t_start is when the caller sourced this.
t_start=$(date +%s.%N)
lap() { printf '%s: %.1f s\n' "$1" "$(echo "$(date +%s.%N) - $2" | bc)"; }

NSPAWN_CACHE=${PINBROKER_NSPAWN_CACHE:-/var/cache/pinbroker-test/bookworm-root}
NSPAWN_SUITE=bookworm
# procps: /bin/kill for ExecReload=; passwd/login/util-linux (useradd, runuser) are in minbase.
# libev4, libprotobuf-c1, libsystemd0: what the packages depend on, so `dpkg -i` needs no network.
NSPAWN_PACKAGES=systemd,systemd-sysv,dbus,libev4,libprotobuf-c1,libsystemd0,procps
NSPAWN_STAMP="$NSPAWN_SUITE minbase $NSPAWN_PACKAGES v1"

# nspawn_require: skips unless this runs as root with debootstrap and systemd-nspawn.
nspawn_require() {
	[ "$(id -u)" = 0 ] || skip "needs root (debootstrap and systemd-nspawn --boot)"
	command -v systemd-nspawn >/dev/null || skip "systemd-nspawn not found (apt-get install systemd-container)"
	command -v debootstrap >/dev/null || skip "debootstrap not found (apt-get install debootstrap)"
}

# nspawn_mirror [APT_DIR]: the Debian mirror apt is configured with (APT_DIR, default /etc/apt): deb822 stanzas in
# sources.list.d/*.sources and one-line entries in sources.list and sources.list.d/*.list, of Types deb and not
# disabled. A source of the suite $NSPAWN_SUITE first, else one of any suite but -security (the security archive
# holds no base system). Prints nothing and returns 1 where there is none: no host is assumed; the caller says
# to set PINBROKER_NSPAWN_MIRROR.
nspawn_mirror() {
	local apt=${1:-/etc/apt} want
	for want in "$NSPAWN_SUITE" any; do
		# shellcheck disable=SC2016 # awk's own $fields
		{
			for f in "$apt"/sources.list.d/*.sources; do
				[ -f "$f" ] && awk -v want="$want" '
					BEGIN { RS = ""; FS = "\n" }
					{
						uris = ""; suites = ""; types = ""; on = 1
						for (i = 1; i <= NF; i++) {
							if ($i ~ /^[ \t]*#/) continue
							if (match($i, /^URIs:[ \t]*/)) uris = substr($i, RLENGTH + 1)
							else if (match($i, /^Suites:[ \t]*/)) suites = substr($i, RLENGTH + 1)
							else if (match($i, /^Types:[ \t]*/)) types = substr($i, RLENGTH + 1)
							else if ($i ~ /^Enabled:[ \t]*[Nn][Oo]/) on = 0
						}
						if (!on || (" " types " ") !~ / deb /) next
						n = split(suites, s, /[ \t]+/)
						for (k = 1; k <= n; k++)
							if (s[k] != "" && (want == "any" ? s[k] !~ /-security$/ : s[k] == want)) {
								split(uris, u, /[ \t]+/); print u[1]; exit
							}
					}' "$f"
			done
			for f in "$apt/sources.list" "$apt"/sources.list.d/*.list; do
				[ -f "$f" ] && awk -v want="$want" '
					$1 == "deb" {
						i = 2
						if ($i ~ /^\[/) while (i <= NF && $i !~ /\]$/) i++
						if ($i ~ /^\[/ || $i ~ /\]$/) i++
						uri = $i; suite = $(i + 1)
						if (want == "any" ? suite !~ /-security$/ : suite == want) { print uri; exit }
					}' "$f"
			done
		} | grep -m1 . && return 0
	done
	return 1
}

# nspawn_cached_root: makes $NSPAWN_CACHE unless it holds a root of $NSPAWN_STAMP already; under
# a lock, so that two tests started together debootstrap once. Skips when debootstrap fails.
nspawn_cached_root() {
	local M t
	mkdir -p "$(dirname "$NSPAWN_CACHE")"
	exec 9>"$NSPAWN_CACHE.lock"
	flock 9
	if [ "$(cat "$NSPAWN_CACHE/.pinbroker-root" 2>/dev/null)" != "$NSPAWN_STAMP" ]; then
		M=${PINBROKER_NSPAWN_MIRROR:-$(nspawn_mirror /etc/apt)} ||
			fail "no Debian mirror in apt's configuration (/etc/apt/sources.list.d/*.sources, /etc/apt/sources.list): set PINBROKER_NSPAWN_MIRROR to one"
		echo "debootstrap $NSPAWN_SUITE from $M into $NSPAWN_CACHE ..."
		t=$(date +%s.%N)
		rm -rf --one-file-system "$NSPAWN_CACHE.new"
		if ! debootstrap --variant=minbase --include=$NSPAWN_PACKAGES $NSPAWN_SUITE "$NSPAWN_CACHE.new" "$M" \
			>"$NSPAWN_CACHE.debootstrap.log" 2>&1; then
			tail -n 15 "$NSPAWN_CACHE.debootstrap.log"
			flock -u 9
			skip "debootstrap of $NSPAWN_SUITE from $M failed (no route to the mirror?); log: $NSPAWN_CACHE.debootstrap.log"
		fi
		rm -f "$NSPAWN_CACHE.new"/var/cache/apt/archives/*.deb
		echo "$NSPAWN_STAMP" >"$NSPAWN_CACHE.new/.pinbroker-root"
		rm -rf --one-file-system "$NSPAWN_CACHE"
		mv "$NSPAWN_CACHE.new" "$NSPAWN_CACHE"
		lap "debootstrap" "$t"
	fi
	flock -u 9
}

# nspawn_copy_root DIR: a throwaway copy of the cached root at DIR.
nspawn_copy_root() {
	local t
	t=$(date +%s.%N)
	cp -a --reflink=auto "$NSPAWN_CACHE" "$1" || fail "cannot copy $NSPAWN_CACHE"
	lap "copy root" "$t"
}

# nspawn_boot ROOT SECONDS [MACHINE]: boots ROOT until it powers off, at most SECONDS.
nspawn_boot() {
	# CAP_IPC_LOCK and CAP_SYS_RESOURCE are not in nspawn's default bounding set, and systemd
	# silently masks AmbientCapabilities= by it.
	timeout -k 10 "$2" systemd-nspawn --boot --register=no --keep-unit --console=pipe \
		--capability=CAP_IPC_LOCK,CAP_SYS_RESOURCE --machine="${3:-pinbroker-test}" -D "$1" </dev/null
}

# nspawn_probe ROOT LOG: boots ROOT once with a unit that only powers it off again, and skips
# unless that reached multi-user.target. Leaves ROOT as it found it.
nspawn_probe() {
	local root=$1 t
	cat >"$root/etc/systemd/system/pinbroker-probe.service" <<-'EOF'
		[Unit]
		After=multi-user.target
		[Service]
		Type=oneshot
		ExecStart=/bin/touch /pinbroker-probe-booted
		ExecStopPost=/bin/systemctl poweroff --no-block
	EOF
	ln -s ../pinbroker-probe.service "$root/etc/systemd/system/multi-user.target.wants/pinbroker-probe.service"
	t=$(date +%s.%N)
	nspawn_boot "$root" 60 >"$2" 2>&1
	if [ ! -e "$root/pinbroker-probe-booted" ]; then
		tail -n 15 "$2"
		skip "systemd-nspawn --boot of a minimal $NSPAWN_SUITE did not reach multi-user.target here"
	fi
	lap "probe boot" "$t"
	rm -f "$root/pinbroker-probe-booted" "$root/etc/systemd/system/pinbroker-probe.service" \
		"$root/etc/systemd/system/multi-user.target.wants/pinbroker-probe.service"
}

# nspawn_guest_unit ROOT NAME SCRIPT TIMEOUT: a oneshot unit NAME.service in ROOT, enabled, that
# runs SCRIPT (already in ROOT) with /pinbroker-results as its argument after boot, then powers
# the guest off. HOST_CAPBND tells the script which capabilities the guest can have at most.
nspawn_guest_unit() {
	cat >"$1/etc/systemd/system/$2.service" <<-EOF
		[Unit]
		Description=pinbroker checks under systemd ($2)
		After=multi-user.target

		[Service]
		Type=oneshot
		ExecStart=/bin/bash $3 /pinbroker-results
		TimeoutStartSec=$(($4 - 30))
		# The guest can only have capabilities this host's bounding set still holds.
		Environment=HOST_CAPBND=$(awk '/^CapBnd:/ { print $2 }' /proc/self/status)
		# Not SuccessAction=poweroff: on this 252 guest it left the container running.
		ExecStopPost=/bin/systemctl poweroff --no-block

		[Install]
		WantedBy=multi-user.target
	EOF
	systemctl --root="$1" enable "$2.service" >/dev/null 2>&1 || fail "systemctl --root enable $2.service failed"
}

# The host's own checks, counted with the guest's: "ok - host: ..." lines and PASS/FAIL.
PASS=0
FAIL=0
host_ok() { PASS=$((PASS + 1)); echo "ok - host: $1"; }
host_notok() { FAIL=$((FAIL + 1)); echo "not ok - host: $1${2:+ ($2)}"; }
host_check() {
	local desc=$1
	shift
	if "$@"; then host_ok "$desc"; else host_notok "$desc"; fi
}

# nspawn_run_guest ROOT NAME SCRIPT TIMEOUT RESULTS LOG...: installs SCRIPT and the guest's helpers
# (tests/system/lib/guest-lib.sh) into ROOT, boots ROOT as machine NAME with SCRIPT run by NAME.service,
# copies what the guest wrote and each LOG to RESULTS, counts the guest's TAP lines into PASS/FAIL and
# prints "N passed, N failed". Returns 0 when nothing failed.
nspawn_run_guest() {
	local root=$1 name=$2 script=$3 timeout=$4 res=$5 dir=/usr/local/libexec/pinbroker-test rc t tap plan ran
	shift 5
	install -D -m 0755 "$script" "$root$dir/${script##*/}"
	install -D -m 0644 "$SRC/tests/system/lib/guest-lib.sh" "$root$dir/guest-lib.sh"
	nspawn_guest_unit "$root" "$name" "$dir/${script##*/}" "$timeout"

	t=$(date +%s.%N)
	nspawn_boot "$root" "$timeout" "$name" >"$WORK/console.log" 2>&1
	rc=$?
	lap "nspawn boot + guest checks" "$t"
	rm -rf "$res"
	mkdir -p "$res"
	cp -a "$root/pinbroker-results/." "$res/" 2>/dev/null
	cp "$WORK/console.log" "$@" "$res/"
	[ $rc = 124 ] && host_notok "guest powered off within ${timeout}s (timed out)"

	tap=$res/result.tap
	if [ ! -s "$tap" ]; then
		tail -n 30 "$WORK/console.log"
		host_notok "guest wrote results"
	else
		grep -E '^(not )?ok ' "$tap" | sed 's/^/guest: /'
		PASS=$((PASS + $(grep -c '^ok ' "$tap")))
		FAIL=$((FAIL + $(grep -c '^not ok ' "$tap")))
		plan=$(sed -n 's/^1\.\.\([0-9]*\)$/\1/p' "$tap")
		ran=$(grep -cE '^(not )?ok ' "$tap")
		[ -n "$plan" ] && [ "$plan" = "$ran" ] || host_notok "guest ran all its checks (ran $ran, plan '${plan:-none: it stopped early}')"
	fi
	[ $FAIL = 0 ] || echo "details: $res/detail.log, $res/journal.txt, $res/console.log"
	lap "total" "$t_start"
	echo "$PASS passed, $FAIL failed"
	[ $FAIL = 0 ]
}

#!/bin/sh
# SPDX-License-Identifier: MIT
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/pinbroker-epilog.sh), run by slurmd as root on each
# node of the job when it ends: revokes every pinned lease still charged to the job's cgroup and
# clears the quota pinbroker-prolog.sh gave it:
#   pinctl quota clear CGROUP --revoke --deadline PINBROKER_SLURM_DEADLINE_MS (default 2000)
# The job's processes are being killed anyway; the deadline only bounds how long a holder that
# survives has before pinbrokerd enforces the revoke. It runs for jobs without a quota as well (any
# lease of their cgroup still goes), and clearing a rule that is gone already is no error.
#
# Settings: the environment, else /etc/pinbroker/slurm.conf (deploy/slurm/README.md lists them).
# Exit status: 0, also when the broker is unreachable (logged), unless PINBROKER_SLURM_STRICT=1:
# then 1, and slurmd drains the node.
set -u
pb_script=epilog

# ---- shared: begin (identical in pinbroker-prolog.sh and pinbroker-epilog.sh; tests/deploy/run-slurm.sh checks) ----
# slurmd gives these scripts no PATH: add the usual places after any the caller set.
PATH=${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH

pb_log() { # PRIORITY MESSAGE...: stderr, and syslog through logger where present
	pb_prio=$1
	shift
	printf 'pinbroker-slurm %s job %s: %s\n' "$pb_script" "${SLURM_JOB_ID:-?}" "$*" >&2
	if [ "${PINBROKER_SLURM_SYSLOG:-1}" != 0 ] && command -v logger >/dev/null 2>&1; then
		logger -t pinbroker-slurm -p "daemon.$pb_prio" -- "$pb_script job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null || :
	fi
}

# KEY=VALUE lines of /etc/pinbroker/slurm.conf (PINBROKER_SLURM_CONF); never sourced, and a
# variable already in the environment wins (slurmd passes none of these: its scripts get a fresh one).
pb_load_conf() {
	pb_conf=${PINBROKER_SLURM_CONF:-/etc/pinbroker/slurm.conf}
	[ -r "$pb_conf" ] || return 0
	while IFS= read -r pb_line || [ -n "$pb_line" ]; do
		pb_line=${pb_line#"${pb_line%%[! 	]*}"}
		case $pb_line in '' | '#'*) continue ;; esac
		pb_line=${pb_line#export }
		pb_name=${pb_line%%=*}
		pb_val=${pb_line#*=}
		case $pb_name in
		*[!A-Z0-9_]* | '') pb_ok=0 ;;
		PINBROKER_SLURM_CONF) pb_ok=0 ;;
		PINBROKER_SLURM_* | PINBROKER_SOCKET) pb_ok=1 ;;
		*) pb_ok=0 ;;
		esac
		if [ "$pb_ok" = 0 ] || [ "$pb_line" = "$pb_name" ]; then
			pb_log warning "$pb_conf: ignoring '$pb_line' (only PINBROKER_SLURM_*=VALUE and PINBROKER_SOCKET=PATH)"
			continue
		fi
		case $pb_val in
		\"*\") pb_val=${pb_val#\"}; pb_val=${pb_val%\"} ;;
		\'*\') pb_val=${pb_val#\'}; pb_val=${pb_val%\'} ;;
		esac
		eval "pb_isset=\${$pb_name+x}"
		[ -n "$pb_isset" ] || eval "$pb_name=\$pb_val; export $pb_name"
	done <"$pb_conf"
}

# Run a command under timeout(1) where present, so a hung broker or slurmctld cannot hold the job
# past PrologEpilogTimeout (which would drain the node).
pb_run() {
	if [ "${PINBROKER_SLURM_TIMEOUT:-5}" != 0 ] && command -v timeout >/dev/null 2>&1; then
		timeout -k 2 "${PINBROKER_SLURM_TIMEOUT:-5}" "$@"
	else
		"$@"
	fi
}

# A setting of a Slurm-style config file (keys case-insensitive, the last one wins): KEY FILE.
pb_slurm_conf_get() {
	[ -r "$2" ] || return 0
	awk -v k="$1" 'BEGIN { k = tolower(k) }
		{ l = $0; sub(/#.*/, "", l); n = index(l, "="); if (!n) next
		  key = substr(l, 1, n - 1); val = substr(l, n + 1)
		  gsub(/[ \t]/, "", key); gsub(/^[ \t]+|[ \t]+$/, "", val)
		  if (tolower(key) == k) v = val }
		END { if (v != "") print v }' "$2"
}

# The job's cgroup path as the broker sees it (the v1 memory controller's, else the unified one).
pb_cgroup_path() {
	pb_uid=${SLURM_JOB_UID:-}
	pb_job=${SLURM_JOB_ID:-}
	if [ -n "${PINBROKER_SLURM_CGROUP_PATH:-}" ]; then
		printf '%s\n' "$PINBROKER_SLURM_CGROUP_PATH" | sed "s/{uid}/$pb_uid/g; s/{job}/$pb_job/g"
		return 0
	fi
	pb_cgconf=${SLURM_CONF:-/etc/slurm/slurm.conf}
	pb_cgconf=${pb_cgconf%/*}/cgroup.conf
	pb_mode=${PINBROKER_SLURM_CGROUP:-auto}
	if [ "$pb_mode" = auto ]; then
		case $(pb_slurm_conf_get CgroupPlugin "$pb_cgconf") in
		cgroup/v1) pb_mode=v1 ;;
		cgroup/v2) pb_mode=v2 ;;
		*) # autodetect, as Slurm does: a hybrid host (v1 controllers, cgroup2 beside them) is v1.
			if [ "$(stat -f -c %T /sys/fs/cgroup/memory 2>/dev/null)" = cgroupfs ]; then
				pb_mode=v1
			else
				pb_mode=v2
			fi
			;;
		esac
	fi
	case $pb_mode in
	v1)
		# CgroupPrepend, else the build's default: "/slurm", or "/slurm_%n" where slurmd was built
		# for multiple slurmds per host (Debian's is): a cgroup already there, else libslurm says.
		pb_pre=${PINBROKER_SLURM_CGROUP_PREPEND:-$(pb_slurm_conf_get CgroupPrepend "$pb_cgconf")}
		if [ -z "$pb_pre" ]; then
			if [ -d "/sys/fs/cgroup/memory/slurm_${SLURMD_NODENAME:-}" ]; then
				pb_pre=/slurm_%n
			elif [ -d /sys/fs/cgroup/memory/slurm ]; then
				pb_pre=/slurm
			else
				pb_pre=/slurm
				for pb_lib in /usr/lib/*/slurm-wlm/libslurmfull.so /usr/lib*/slurm/libslurmfull.so \
					/usr/local/lib*/slurm/libslurmfull.so; do
					[ -r "$pb_lib" ] || continue
					grep -q -a '/slurm_%n' "$pb_lib" && pb_pre=/slurm_%n
					break
				done
			fi
		fi
		pb_node=${SLURMD_NODENAME:-$(hostname -s 2>/dev/null || uname -n)}
		pb_host=$(hostname -s 2>/dev/null || uname -n)
		pb_pre=$(printf '%s\n' "$pb_pre" | sed "s/%n/$pb_node/g; s/%h/$pb_host/g")
		printf '%s/uid_%s/job_%s\n' "$pb_pre" "$pb_uid" "$pb_job"
		;;
	v2) printf '/system.slice/slurmstepd.scope/job_%s\n' "$pb_job" ;;
	*)
		pb_log err "PINBROKER_SLURM_CGROUP=$pb_mode: write auto, v1 or v2"
		return 1
		;;
	esac
}

# A broker failure: exit 0 (the job runs, without a pinned quota) unless PINBROKER_SLURM_STRICT=1,
# where exit 1 makes slurmd drain the node (and, in a prolog, requeue the job held).
pb_fail() {
	if [ "${PINBROKER_SLURM_STRICT:-0}" = 1 ]; then
		pb_log err "$* (PINBROKER_SLURM_STRICT=1: failing, slurmd drains the node)"
		exit 1
	fi
	pb_log warning "$* (going on: PINBROKER_SLURM_STRICT=1 would fail instead)"
	exit 0
}

pb_find_pinctl() {
	pb_pinctl=${PINBROKER_SLURM_PINCTL:-$(command -v pinctl 2>/dev/null || :)}
	if [ -z "$pb_pinctl" ] || [ ! -x "$pb_pinctl" ]; then
		pb_fail "pinctl not found (PATH, or PINBROKER_SLURM_PINCTL)"
	fi
}
# ---- shared: end ----

pb_load_conf
case ${SLURM_SCRIPT_CONTEXT:-epilog_slurmd} in
epilog_slurmd) ;;
*)
	pb_log warning "run as ${SLURM_SCRIPT_CONTEXT}: this is slurm.conf's Epilog= (slurmd's); doing nothing"
	exit 0
	;;
esac
if [ -z "${SLURM_JOB_ID:-}" ] || [ -z "${SLURM_JOB_UID:-}" ]; then
	pb_log err "no SLURM_JOB_ID or SLURM_JOB_UID: not run by slurmd? doing nothing"
	exit 0
fi
pb_deadline=${PINBROKER_SLURM_DEADLINE_MS:-2000}
case $pb_deadline in *[!0-9]* | '')
	pb_log err "PINBROKER_SLURM_DEADLINE_MS=$pb_deadline is not a number of milliseconds; using 2000"
	pb_deadline=2000
	;;
esac
pb_cg=$(pb_cgroup_path) || exit 0
pb_find_pinctl
if pb_out=$(pb_run "$pb_pinctl" quota clear "$pb_cg" --revoke --deadline "$pb_deadline" 2>&1); then
	pb_log info "$pb_cg: $(printf '%s' "$pb_out" | tr '\n' ' ')"
	exit 0
fi
pb_fail "pinctl quota clear $pb_cg --revoke failed: $(printf '%s' "$pb_out" | tr '\n' ' ')"

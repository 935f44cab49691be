#!/bin/sh
# SPDX-License-Identifier: MIT
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/pinbroker-prolog.sh), run by slurmd as root on each
# compute node before the job's first step: gives the job a pinned-memory quota in pinbrokerd.
#
# The quota comes from, in order:
#   1. the job's GRES (PINBROKER_SLURM_GRES, default "pinned", counted in GiB): --gres=pinned:8 -> 8G
#      (TresPerNode of `scontrol show job -o $SLURM_JOB_ID`; else gres/pinned in its TRES, per node);
#   2. the job comment: --comment "pinned=8G" (SLURM_JOB_COMMENT, else scontrol's Comment=);
#   3. PINBROKER_SLURM_DEFAULT (8G; empty or "none": no quota, the job is bounded by the budget alone).
# It is set with `pinctl quota set CGROUP BYTES` for the job's cgroup: /slurm/uid_UID/job_ID (Slurm's
# cgroup/v1, in the memory controller) or /system.slice/slurmstepd.scope/job_ID (cgroup/v2). The
# cgroup need not exist yet: pinbrokerd keeps the rule until it has seen the cgroup and it is gone.
#
# Settings: the environment, else /etc/pinbroker/slurm.conf (deploy/slurm/README.md lists them).
# Exit status: 0, also when the broker is unreachable (the job runs without a quota, logged), unless
# PINBROKER_SLURM_STRICT=1: then 1, and slurmd drains the node and requeues the job held.
set -u
pb_script=prolog

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

# SIZE (digits, optional K/M/G/T/P, optionally "iB"/"B") to bytes on stdout; 1 if not a size.
pb_bytes() {
	pb_n=${1%%[!0-9]*}
	pb_s=${1#"$pb_n"}
	[ -n "$pb_n" ] && [ ${#pb_n} -le 18 ] || return 1
	while :; do case $pb_n in 0?*) pb_n=${pb_n#0} ;; *) break ;; esac; done
	case $pb_s in
	'' | [bB]) pb_m=1 ;;
	[kK] | [kK][bB] | [kK]i[bB]) pb_m=1024 ;;
	[mM] | [mM][bB] | [mM]i[bB]) pb_m=1048576 ;;
	[gG] | [gG][bB] | [gG]i[bB]) pb_m=1073741824 ;;
	[tT] | [tT][bB] | [tT]i[bB]) pb_m=1099511627776 ;;
	[pP] | [pP][bB] | [pP]i[bB]) pb_m=1125899906842624 ;;
	*) return 1 ;;
	esac
	[ "$pb_n" -le $((9223372036854775807 / pb_m)) ] || return 1
	echo $((pb_n * pb_m))
}

# The GRES count of NAME in a TresPerNode value (gres:NAME, gres:NAME:N, gres:NAME:TYPE:N, apart by
# commas) or a TRES one (gres/NAME=N); N may carry Slurm's k/m/g multipliers (1024).
pb_gres_count() { # VALUE NAME
	printf '%s\n' "$1" | tr ',' '\n' | awk -v g="$2" '
		{ e = $0; sub(/^gres[:\/]/, "", e)
		  if (e == g) { print 1; exit }
		  if (index(e, g "=") == 1) { print substr(e, length(g) + 2); exit }
		  if (index(e, g ":") == 1) { n = split(e, p, ":"); print p[n]; exit } }'
}

# A count (with k/m/g/t/p: x1024) times the unit's bytes.
pb_count_bytes() { # COUNT UNIT-BYTES
	pb_c=${1%%[!0-9]*}
	[ -n "$pb_c" ] || return 1
	case ${1#"$pb_c"} in
	'') ;;
	[kK]) pb_c=$((pb_c * 1024)) ;;
	[mM]) pb_c=$((pb_c * 1048576)) ;;
	[gG]) pb_c=$((pb_c * 1073741824)) ;;
	*) return 1 ;;
	esac
	pb_bytes "$pb_c" >/dev/null || return 1
	[ "$pb_c" -le $((9223372036854775807 / $2)) ] || return 1
	echo $((pb_c * $2))
}

pb_load_conf
case ${SLURM_SCRIPT_CONTEXT:-prolog_slurmd} in
prolog_slurmd) ;;
*)
	pb_log warning "run as ${SLURM_SCRIPT_CONTEXT}: this is slurm.conf's Prolog= (slurmd's); doing nothing"
	exit 0
	;;
esac
if [ -z "${SLURM_JOB_ID:-}" ] || [ -z "${SLURM_JOB_UID:-}" ]; then
	pb_log err "no SLURM_JOB_ID or SLURM_JOB_UID: not run by slurmd? doing nothing"
	exit 0
fi
pb_gres=${PINBROKER_SLURM_GRES:-pinned}
case $pb_gres in *[!A-Za-z0-9_-]* | '')
	pb_log err "PINBROKER_SLURM_GRES=$pb_gres is not a GRES name; using pinned"
	pb_gres=pinned
	;;
esac
pb_unit=$(pb_bytes "${PINBROKER_SLURM_GRES_UNIT:-1G}") || {
	pb_log err "PINBROKER_SLURM_GRES_UNIT=${PINBROKER_SLURM_GRES_UNIT} is not a size; using 1G"
	pb_unit=1073741824
}

pb_cg=$(pb_cgroup_path) || exit 0
pb_bytes_q="" pb_from=""

# 1. The GRES, from slurmctld (slurmd passes a prolog no GRES of a plugin-less name like this one).
pb_scontrol=${PINBROKER_SLURM_SCONTROL-scontrol}
pb_line=""
if [ -n "$pb_scontrol" ] && [ "$pb_scontrol" != none ]; then
	if ! pb_line=$(pb_run "$pb_scontrol" show job -o "$SLURM_JOB_ID" 2>&1); then
		pb_log warning "$pb_scontrol show job -o $SLURM_JOB_ID failed: $(printf '%s' "$pb_line" | head -n 3 | tr '\n' ' ')"
		pb_line=""
	fi
	pb_line=$(printf '%s\n' "$pb_line" | head -n 1)
fi
if [ -n "$pb_line" ]; then
	# Take the exact comment out first (a user's comment could hold "TresPerNode=..."), then the
	# last TresPerNode= (Slurm prints the real one after the job name, paths and comment).
	if [ -n "${SLURM_JOB_COMMENT:-}" ]; then
		case $pb_line in *" Comment=$SLURM_JOB_COMMENT "*)
			pb_line="${pb_line%%" Comment=$SLURM_JOB_COMMENT "*} ${pb_line#*" Comment=$SLURM_JOB_COMMENT "}"
			;;
		esac
	fi
	pb_tpn=$(printf '%s\n' "$pb_line" | tr ' ' '\n' | sed -n 's/^TresPerNode=//p' | tail -n 1)
	pb_cnt=$(pb_gres_count "$pb_tpn" "$pb_gres")
	if [ -z "$pb_cnt" ]; then
		# No per-node request (--gres is per node; --tres-per-job, say): the allocated TRES
		# (AccountingStorageTRES=gres/NAME) spread evenly over the job's nodes.
		pb_tres=$(printf '%s\n' "$pb_line" | tr ' ' '\n' | sed -n 's/^TRES=//p' | head -n 1)
		pb_cnt=$(pb_gres_count "$pb_tres" "$pb_gres")
		pb_nodes=$(printf '%s\n' "$pb_line" | tr ' ' '\n' | sed -n 's/^NumNodes=\([0-9][0-9]*\).*/\1/p' | head -n 1)
		if [ -n "$pb_cnt" ] && [ "${pb_nodes:-1}" -gt 1 ] && pb_c=$(pb_count_bytes "$pb_cnt" 1); then
			pb_cnt=$(((pb_c + pb_nodes - 1) / pb_nodes))
		fi
	fi
	if [ -n "$pb_cnt" ]; then
		if pb_bytes_q=$(pb_count_bytes "$pb_cnt" "$pb_unit"); then
			pb_from="GRES $pb_gres:$pb_cnt"
		else
			pb_log warning "GRES $pb_gres count '$pb_cnt' is not a count; ignoring it"
			pb_bytes_q=""
		fi
	fi
fi

# 2. The comment: "pinned=8G" among words apart by blanks, commas or semicolons.
if [ -z "$pb_from" ] && [ "${PINBROKER_SLURM_COMMENT:-1}" != 0 ]; then
	if [ -n "${SLURM_JOB_COMMENT+x}" ]; then
		pb_comment=$SLURM_JOB_COMMENT
	else
		pb_comment=$(printf '%s\n' "$pb_line" | sed -n 's/.* Comment=//p')
	fi
	pb_want=$(printf '%s\n' "$pb_comment" | awk -v k="$pb_gres=" '
		{ n = split($0, w, /[,; \t]+/)
		  for (i = 1; i <= n; i++) if (index(w[i], k) == 1) { print substr(w[i], length(k) + 1); exit } }')
	if [ -n "$pb_want" ]; then
		if pb_bytes_q=$(pb_bytes "$pb_want"); then
			pb_from="comment $pb_gres=$pb_want"
		else
			pb_log warning "comment $pb_gres=$pb_want is not a size (write 8G, 512M); ignoring it"
			pb_bytes_q=""
		fi
	fi
fi

# 3. The default.
if [ -z "$pb_from" ]; then
	case ${PINBROKER_SLURM_DEFAULT:-none} in
	none | '') ;;
	*)
		if pb_bytes_q=$(pb_bytes "$PINBROKER_SLURM_DEFAULT"); then
			pb_from="default $PINBROKER_SLURM_DEFAULT"
		else
			pb_log err "PINBROKER_SLURM_DEFAULT=$PINBROKER_SLURM_DEFAULT is not a size; no default quota"
			pb_bytes_q=""
		fi
		;;
	esac
fi

if [ -z "$pb_from" ]; then
	pb_log info "no $pb_gres GRES, comment or default: no quota for $pb_cg"
	exit 0
fi
if [ -n "${PINBROKER_SLURM_MAX:-}" ]; then
	if pb_max=$(pb_bytes "$PINBROKER_SLURM_MAX"); then
		if [ "$pb_bytes_q" -gt "$pb_max" ]; then
			pb_log notice "$pb_from is above PINBROKER_SLURM_MAX=$PINBROKER_SLURM_MAX: capped"
			pb_bytes_q=$pb_max
		fi
	else
		pb_log err "PINBROKER_SLURM_MAX=$PINBROKER_SLURM_MAX is not a size; not capping"
	fi
fi

pb_find_pinctl
if pb_out=$(pb_run "$pb_pinctl" quota set "$pb_cg" "$pb_bytes_q" 2>&1); then
	pb_log info "quota $pb_bytes_q bytes ($pb_from) for $pb_cg"
	exit 0
fi
pb_fail "pinctl quota set $pb_cg $pb_bytes_q ($pb_from) failed: $(printf '%s' "$pb_out" | tr '\n' ' ')"

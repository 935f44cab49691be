#!/bin/sh
# SPDX-License-Identifier: MIT
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/pinbroker-prolog.sh), run by slurmd as root on each
# compute node before the job's first step: gives the job a pinned-memory quota in pinbrokerd.
#
# The quota comes from, in order:
#   1. the job's GRES (PINBROKER_SLURM_GRES, default "pinned", counted in GiB): --gres=pinned:8 -> 8G
#      (tres_per_node of `scontrol --json show job $SLURM_JOB_ID`, where Slurm has JSON, else TresPerNode
#      of `scontrol show job -o`, read where no job name or path can pose as it; else gres/pinned in its
#      TRES, per node);
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

# The functions shared with pinbroker-epilog.sh and pinbroker-gres-count.sh (settings, logging, the job's
# cgroup, sizes, the job's data), from the folder this script really lives in (a prolog.d symlink followed).
pb_lib=$(readlink -f -- "$0" 2>/dev/null || printf '%s
' "$0")
pb_lib=${pb_lib%/*}/pinbroker-slurm-lib.sh
if [ ! -r "$pb_lib" ]; then
	echo "pinbroker-slurm $pb_script: no $pb_lib (install it beside this script)" >&2
	[ "${PINBROKER_SLURM_STRICT:-0}" = 1 ] && exit 1
	exit 0
fi
# shellcheck source=SCRIPTDIR/pinbroker-slurm-lib.sh
. "$pb_lib"

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
pb_unit=$(pb_gres_unit) || {
	pb_log err "PINBROKER_SLURM_GRES_UNIT=${PINBROKER_SLURM_GRES_UNIT} is not a size; using 1G"
	pb_unit=1073741824
}

pb_cg=$(pb_cgroup_path) || exit 0
pb_bytes_q="" pb_from=""

# 1. The GRES, from slurmctld (slurmd passes a prolog no GRES of a plugin-less name like this one):
# pb_job_data reads it where no job name, path or comment can pose as it.
pb_job_data "$SLURM_JOB_ID"
pb_cnt=""
if [ -n "$pb_job_how" ]; then
	pb_cnt=$(pb_gres_count "$pb_tpn" "$pb_gres")
	if [ -z "$pb_cnt" ]; then
		# No per-node request (--gres is per node; --tres-per-job, say): the allocated TRES
		# (AccountingStorageTRES=gres/NAME) spread evenly over the job's nodes.
		pb_cnt=$(pb_gres_count "$pb_tres" "$pb_gres")
		case $pb_nodes in *[!0-9]* | '') pb_nodes=1 ;; esac
		if [ -n "$pb_cnt" ] && [ "$pb_nodes" -gt 1 ] && pb_c=$(pb_count_bytes "$pb_cnt" 1); then
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
		pb_comment=$pb_sc_comment
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

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

#!/bin/sh
# SPDX-License-Identifier: MIT
# Print this node's pinned budget in whole GiB (budget_bytes of `pinctl status --json`, rounded
# down), for gres.conf's Name=pinned Count=N; with --gres-conf, the whole gres.conf line:
#   pinbroker-gres-count.sh --gres-conf >> /etc/slurm/gres.conf
# PINBROKER_SLURM_GRES names the GRES (default pinned), PINBROKER_SLURM_GRES_UNIT its unit (default
# 1G; the sizes the prolog takes: 1G, 1GiB, 1024M, bytes), PINBROKER_SLURM_PINCTL the pinctl to run;
# each from the environment, else /etc/pinbroker/slurm.conf, as the prolog reads them. Exit 1 when
# the daemon does not answer, 2 for a unit that is not a size.
set -u
pb_script=gres-count

# The settings and size parser shared with the prolog and epilog, from the folder this script lives in.
pb_lib=$(readlink -f -- "$0" 2>/dev/null || printf '%s\n' "$0")
pb_lib=${pb_lib%/*}/pinbroker-slurm-lib.sh
if [ ! -r "$pb_lib" ]; then
	echo "pinbroker-gres-count: no $pb_lib (install it beside this script)" >&2
	exit 1
fi
# shellcheck source=SCRIPTDIR/pinbroker-slurm-lib.sh
. "$pb_lib"
# Messages to stderr only: this runs by hand, not from slurmd.
PINBROKER_SLURM_SYSLOG=0
pb_load_conf

pinctl=${PINBROKER_SLURM_PINCTL:-pinctl}
if ! unit=$(pb_gres_unit); then
	echo "pinbroker-gres-count: PINBROKER_SLURM_GRES_UNIT=${PINBROKER_SLURM_GRES_UNIT:-} is not a size (1G, 1GiB, 1024M, bytes)" >&2
	exit 2
fi
if ! json=$("$pinctl" status --json); then
	echo "pinbroker-gres-count: pinctl status failed: is pinbrokerd running?" >&2
	exit 1
fi
bytes=$(printf '%s\n' "$json" | sed -n 's/.*"budget_bytes":\([0-9][0-9]*\).*/\1/p' | head -n 1)
if [ -z "$bytes" ]; then
	echo "pinbroker-gres-count: no budget_bytes in pinctl status --json" >&2
	exit 1
fi
count=$((bytes / unit))
if [ "${1:-}" = --gres-conf ]; then
	printf 'Name=%s Count=%s Flags=CountOnly\n' "${PINBROKER_SLURM_GRES:-pinned}" "$count"
else
	echo "$count"
fi

#!/bin/sh
# SPDX-License-Identifier: MIT
# Print this node's pinned budget in whole GiB (budget_bytes of `pinctl status --json`, rounded
# down), for gres.conf's Name=pinned Count=N; with --gres-conf, the whole gres.conf line:
#   pinbroker-gres-count.sh --gres-conf >> /etc/slurm/gres.conf
# PINBROKER_SLURM_GRES names the GRES (default pinned), PINBROKER_SLURM_GRES_UNIT its unit in
# bytes or with a suffix (default 1G), PINBROKER_SLURM_PINCTL the pinctl to run. Exit 1 when the
# daemon does not answer.
set -u
PATH=${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
pinctl=${PINBROKER_SLURM_PINCTL:-pinctl}
unit=${PINBROKER_SLURM_GRES_UNIT:-1G}
case $unit in
*[kK]) unit=$((${unit%?} * 1024)) ;;
*[mM]) unit=$((${unit%?} * 1048576)) ;;
*[gG]) unit=$((${unit%?} * 1073741824)) ;;
*[tT]) unit=$((${unit%?} * 1099511627776)) ;;
*[!0-9]* | '')
	echo "pinbroker-gres-count: PINBROKER_SLURM_GRES_UNIT=$unit is not a size" >&2
	exit 2
	;;
esac
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

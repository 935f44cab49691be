# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# Sourced (bash) by run-gpu.sh and run-preload.sh: the daemons a script starts (their pids in PIDS) and
# the huge pages it takes, both given back by gpu_cleanup when it exits.
PIDS=()
HUGE_BEFORE=

# gpu_cleanup: TERM each daemon in PIDS and wait up to 5 s for it; give back the huge pages taken.
gpu_cleanup() {
	local p
	for p in "${PIDS[@]}"; do
		kill -TERM "$p" 2>/dev/null
		for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
	done
	[ -n "$HUGE_BEFORE" ] && echo "$HUGE_BEFORE" >/proc/sys/vm/nr_hugepages 2>/dev/null
}

# gpu_take_hugepages: as root, raise /proc/sys/vm/nr_hugepages to PB_HUGEPAGES (default 1100; 0 leaves it
# alone); gpu_cleanup gives back what this took.
gpu_take_hugepages() {
	local want=${PB_HUGEPAGES:-1100} cur
	if [ "$want" = 0 ] || [ ! -w /proc/sys/vm/nr_hugepages ]; then
		return 0
	fi
	cur=$(cat /proc/sys/vm/nr_hugepages)
	if [ "$cur" -lt "$want" ]; then
		HUGE_BEFORE=$cur
		echo "$want" >/proc/sys/vm/nr_hugepages
	fi
}

# gpu_stop_last LOG: TERM the daemon started last and wait up to 10 s for it; else say so in LOG, KILL it
# and fail.
gpu_stop_last() {
	local p=${PIDS[-1]}
	unset 'PIDS[-1]'
	kill -TERM "$p" 2>/dev/null
	for _ in $(seq 1 200); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.05; done
	echo "FAIL: pinbrokerd $p did not stop" | tee -a "$1"
	kill -KILL "$p"
	return 1
}

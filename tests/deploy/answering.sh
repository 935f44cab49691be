# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# Sourced by run-daemon-limits.sh and run-monitoring.sh, which define fail and PINCTL: wait_answering SOCK LOG WHY
# waits (15 s at most) for pinctl status to answer on SOCK; past that it shows LOG and fails saying WHY.
wait_answering() {
	n=0
	until "$PINCTL" --socket "$1" status >/dev/null 2>&1; do
		n=$((n + 1))
		[ $n -lt 150 ] || {
			cat "$2"
			fail "$3"
		}
		sleep 0.1
	done
}

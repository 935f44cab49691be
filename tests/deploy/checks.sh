# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# Sourced by run-slurm.sh and run-slurm-real.sh: skip (exit 77), one line a check ("ok   ..." or
# "FAIL ..."), counted, and the closing summary.
fails=0
checks=0

skip() {
	echo "SKIP: $*"
	exit 77
}
ok() {
	checks=$((checks + 1))
	echo "ok   $*"
}
bad() {
	checks=$((checks + 1))
	fails=$((fails + 1))
	echo "FAIL $*"
}
check() { # DESCRIPTION COMMAND...
	d=$1
	shift
	if "$@"; then ok "$d"; else bad "$d"; fi
}
# checks_failed: whether any check failed so far.
checks_failed() { [ "$fails" != 0 ]; }
# checks_summary: "N checks, N failed"; returns 0 only when none failed.
checks_summary() {
	echo "$checks checks, $fails failed"
	[ "$fails" = 0 ]
}

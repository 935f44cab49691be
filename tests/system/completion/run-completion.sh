#!/bin/bash
# SPDX-License-Identifier: MIT
# Sources completion/pinctl.bash and pinbrokerd.bash in a plain bash (no bash-completion package:
# they need none) and checks what they register and what they offer, against the built binaries.
# usage: run-completion.sh SOURCE_DIR PINCTL PINBROKERD      exit 0 pass, 1 fail
set -u
export LC_ALL=C
SRC=${1:?usage: run-completion.sh SOURCE_DIR PINCTL PINBROKERD}
PINCTL=${2:?}
PINBROKERD=${3:?}
fail() { echo "FAIL: $*" >&2; exit 1; }

# shellcheck source=/dev/null
. "$SRC/completion/pinctl.bash" || fail "sourcing pinctl.bash failed"
# shellcheck source=/dev/null
. "$SRC/completion/pinbrokerd.bash" || fail "sourcing pinbrokerd.bash failed"
[[ $(complete -p pinctl) == "complete -F _pinctl pinctl" ]] || fail "complete -p pinctl: $(complete -p pinctl 2>&1)"
[[ $(complete -p pinbrokerd) == "complete -F _pinbrokerd pinbrokerd" ]] ||
	fail "complete -p pinbrokerd: $(complete -p pinbrokerd 2>&1)"

# Complete the line "$@" (the last word is the one under the cursor) with FN, as bash would call it.
comp() {
	local fn=$1 cmd=$2
	shift 2
	COMP_WORDS=("$cmd" "$@")
	COMP_CWORD=$#
	COMPREPLY=()
	"$fn" "$cmd" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
	printf '%s\n' "${COMPREPLY[@]}" | sort | tr '\n' ' ' | sed 's/ $//'
}
# expect, contains and lacks (shared with the other shell's check).
COMP_FIRST=2
# shellcheck source=tests/system/completion/expect.sh
. "$SRC/tests/system/completion/expect.sh"

expect "acquire" _pinctl "$PINCTL" ac
expect "doctor" _pinctl "$PINCTL" --socket /tmp/s d
expect "reservations revoke run" _pinctl "$PINCTL" r
expect "top" _pinctl "$PINCTL" to
expect "watch" _pinctl "$PINCTL" wa
expect "get" _pinctl "$PINCTL" ge
expect "config" _pinctl "$PINCTL" con
expect "quota" _pinctl "$PINCTL" qu
expect "jobs" _pinctl "$PINCTL" jo
expect "headroom" _pinctl "$PINCTL" hea
expect "--no-revoke" _pinctl "$PINCTL" headroom --no-r
expect "clear list set" _pinctl "$PINCTL" quota ""
expect "--interval" _pinctl "$PINCTL" top --int
contains "--once" _pinctl "$PINCTL" watch --
expect "" _pinctl "$PINCTL" top --interval ""
contains "root" _pinctl "$PINCTL" revoke --uid ro
# quota set and clear complete cgroup paths under the cgroupfs root (here a fixture tree).
CGROOT=$(mktemp -d)
trap 'rm -rf "$CGROOT"' EXIT
mkdir -p "$CGROOT/slurm_n1/uid_1000/job_42" "$CGROOT/slurm_n1/uid_1000/job_43" "$CGROOT/system.slice"
export PINCTL_CGROUP_ROOT=$CGROOT
expect "/slurm_n1/ /system.slice/" _pinctl "$PINCTL" quota set ""
expect "/slurm_n1/uid_1000/job_42/ /slurm_n1/uid_1000/job_43/" _pinctl "$PINCTL" quota clear /slurm_n1/uid_1000/job_4
expect "/system.slice/" _pinctl "$PINCTL" quota set sys
expect "" _pinctl "$PINCTL" quota set /slurm_n1/uid_1000/job_42 ""
unset PINCTL_CGROUP_ROOT
expect "--socket" _pinctl "$PINCTL" --s
expect "--json" _pinctl "$PINCTL" status --j
expect "--no-headers" _pinctl "$PINCTL" leases --no
expect "csv json text" _pinctl "$PINCTL" status --format ""
# -o completes the command's field names, after the last comma too (from pinctl's own list).
expect "id idle_ms" _pinctl "$PINCTL" leases -o i
expect "job,bytes" _pinctl "$PINCTL" jobs -o job,b
expect "bound,left_bytes" _pinctl "$PINCTL" headroom -o bound,le
expect "value" _pinctl "$PINCTL" get budget -o va
# Every table command, as pinctl help --commands names them, offers the table options alike.
while IFS=$'\t' read -r name takes args; do
	[[ $takes == *table* ]] || continue
	[[ $args == KEY ]] && args=budget
	# shellcheck disable=SC2086 # args: none, or one word
	for opt in --no-headers --output --format --json; do
		contains "$opt" _pinctl "$PINCTL" "$name" $args "${opt:0:5}"
	done
done < <("$PINCTL" help --commands)
expect "--help --hold" _pinctl "$PINCTL" acquire 1G --h
expect "best-effort" _pinctl "$PINCTL" acquire --priority b
expect "cuda" _pinctl "$PINCTL" run --fallback c
expect "--no-torch" _pinctl "$PINCTL" run --no
expect "" _pinctl "$PINCTL" acquire --wait ""
contains "bash" _pinctl "$PINCTL" run -- bas
expect "leases" _pinctl "$PINCTL" help le
# set's keys are the reloadable ones of the daemon's table: budget is, chunk-size is not.
PATH=${PINBROKERD%/*}:$PATH
contains "budget" _pinctl "$PINCTL" set b
lacks "chunk-size" _pinctl "$PINCTL" set c
expect "" _pinctl "$PINCTL" set budget ""
# get takes every key, the fixed ones too.
contains "chunk-size" _pinctl "$PINCTL" get c
contains "budget" _pinctl "$PINCTL" get b
expect "" _pinctl "$PINCTL" get budget ""

contains "--check-config" _pinbrokerd "$PINBROKERD" --check
contains "--max-connections-per-uid" _pinbrokerd "$PINBROKERD" --max-conn
expect "auto no yes" _pinbrokerd "$PINBROKERD" --hugetlb ""
expect "own" _pinbrokerd "$PINBROKERD" --status-visibility o
expect "sigkill sigterm" _pinbrokerd "$PINBROKERD" --revoke-enforce sig
expect "debug" _pinbrokerd "$PINBROKERD" --log-level d
expect "no yes" _pinbrokerd "$PINBROKERD" --lock-memory ""
expect "" _pinbrokerd "$PINBROKERD" --budget ""
contains "--budget" _pinbrokerd "$PINBROKERD" --check-config --bu
# Every key of the table is offered.
for key in $("$PINBROKERD" --config-doc | sed -n 's/^| `\([a-z0-9-]*\)` |.*/\1/p'); do
	contains "--$key" _pinbrokerd "$PINBROKERD" "--$key"
done
echo "completion: all checks passed"

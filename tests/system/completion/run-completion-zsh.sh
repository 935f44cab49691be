#!/bin/bash
# SPDX-License-Identifier: MIT
# The zsh completions (completion/_pinctl, _pinbrokerd), loaded by compinit in an interactive zsh
# (through a zpty: capture.zsh) and asked about the built binaries, as run-completion.sh does for bash.
# usage: run-completion-zsh.sh SOURCE_DIR PINCTL PINBROKERD      exit 0 pass, 1 fail, 77 no zsh
set -u
export LC_ALL=C
SRC=${1:?usage: run-completion-zsh.sh SOURCE_DIR PINCTL PINBROKERD}
PINCTL=${2:?}
PINBROKERD=${3:?}
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v zsh >/dev/null || { echo "SKIP: no zsh (apt-get install zsh)"; exit 77; }
zsh -fc 'zmodload zsh/zpty' 2>/dev/null || { echo "SKIP: zsh without zsh/zpty"; exit 77; }

# What zsh offers for the line "$*" completed at its end, sorted, on one line.
comp() {
	local got rc
	got=$(timeout 30 zsh -f "$SRC/tests/system/completion/capture.zsh" "$SRC/completion" "$*")
	rc=$?
	# In a command substitution fail cannot end the script: answer what no check wants instead.
	((rc == 0)) || { echo "capture.zsh-exited-$rc"; return; }
	printf '%s\n' "$got" | sed '/^$/d' | sort -u | tr '\n' ' ' | sed 's/ $//'
}
# expect, contains and lacks (shared with the other shell's check).
COMP_FIRST=1
# shellcheck source=tests/system/completion/expect.sh
. "$SRC/tests/system/completion/expect.sh"

# An empty last word is a trailing space on the line.
expect "acquire" "$PINCTL" ac
expect "acquire config doctor get headroom help jobs leases metrics quota reservations revoke run set status top watch" "$PINCTL" ""
expect "doctor" "$PINCTL" --socket /tmp/s d
expect "--socket" "$PINCTL" --so
# status and leases take the script forms of issue 28 (-o, --format, --no-headers) besides --json.
expect "--format --help --json --no-headers --output --socket" "$PINCTL" status --
expect "--format --help --json --no-headers --output --socket" "$PINCTL" config --
expect "--format --help --json --no-headers --output --socket" "$PINCTL" jobs --
expect "--format --help --json --no-headers --no-revoke --output --socket" "$PINCTL" headroom --
expect "--format --help --json --no-headers --output --socket" "$PINCTL" metrics --
expect "--format --help --json --no-headers --output --socket" "$PINCTL" doctor --
expect "--help --interval --once --socket" "$PINCTL" top --
expect "--help --interval --once --socket" "$PINCTL" watch --
expect "best-effort" "$PINCTL" acquire --priority b
expect "cuda error pageable" "$PINCTL" run --fallback ""
expect "clear list set" "$PINCTL" quota ""
# quota set and clear complete cgroup paths under the cgroupfs root (here a fixture tree).
CGROOT=$(mktemp -d)
trap 'rm -rf "$CGROOT"' EXIT
mkdir -p "$CGROOT/slurm_n1/uid_1000/job_42" "$CGROOT/slurm_n1/uid_1000/job_43" "$CGROOT/system.slice"
export PINCTL_CGROUP_ROOT=$CGROOT
expect "/slurm_n1 /system.slice" "$PINCTL" quota set "" # the / is the suffix compadd adds
expect "/slurm_n1/uid_1000/job_42 /slurm_n1/uid_1000/job_43" "$PINCTL" quota clear /slurm_n1/uid_1000/job_4
unset PINCTL_CGROUP_ROOT
contains "root" "$PINCTL" revoke --uid ro
expect "leases" "$PINCTL" help le
# get takes every key; set only the reloadable ones (budget is, chunk-size is not).
contains "chunk-size" "$PINCTL" get ch
contains "budget" "$PINCTL" get bu
contains "budget" "$PINCTL" set bu
lacks "chunk-size" "$PINCTL" set ch

contains "--check-config" "$PINBROKERD" --check
contains "--max-connections-per-uid" "$PINBROKERD" --max-conn
expect "auto no yes" "$PINBROKERD" --hugetlb ""
expect "sigkill sigterm" "$PINBROKERD" --revoke-enforce sig
expect "debug" "$PINBROKERD" --log-level d
expect "no yes" "$PINBROKERD" --lock-memory ""
expect "" "$PINBROKERD" --budget ""
echo "completion (zsh): all checks passed"

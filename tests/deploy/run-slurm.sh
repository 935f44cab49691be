#!/bin/sh
# SPDX-License-Identifier: MIT
# deploy/slurm's Prolog and Epilog, run the way slurmd runs them (as root, in a fresh environment of
# slurmd's variables and no PATH), against a real pinbrokerd and real cgroups. Only scontrol is a
# stand-in: it prints `scontrol show job -o` lines captured from a real slurmctld 22.05.8 (Debian 12).
# Usage: run-slurm.sh [BUILD_DIR]. Exit 0, 1 (a check failed) or 77 (cannot run here: not root, no jq).
# PB_TEST_SH=/bin/bash runs the scripts under another shell than /bin/sh (dash on Debian).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
PROLOG=$SRC/deploy/slurm/pinbroker-prolog.sh
EPILOG=$SRC/deploy/slurm/pinbroker-epilog.sh
GRESCOUNT=$SRC/deploy/slurm/pinbroker-gres-count.sh
LIB=$SRC/deploy/slurm/pinbroker-slurm-lib.sh
PINBROKERD=$BUILD/daemon/pinbrokerd
PINCTL=$BUILD/client/pinctl

# skip, ok, bad, check and the summary, shared with the other Slurm test.
# shellcheck source=/dev/null
. "$SRC/tests/deploy/checks.sh"
[ "$(id -u)" = 0 ] || skip "run as root (slurmd runs Prolog/Epilog as root; the test makes cgroups)"
command -v jq >/dev/null 2>&1 || skip "no jq (scripts/deps.sh installs it)"
if [ ! -x "$PINBROKERD" ] || [ ! -x "$PINCTL" ]; then
	echo "FAIL: build $BUILD first (no $PINBROKERD or $PINCTL)"
	exit 1
fi

T=$(mktemp -d /tmp/pb-slurm.XXXXXX)
chmod 755 "$T"
SOCK=$T/pb.sock
export PINBROKER_SOCKET="$SOCK"
DAEMON=""
HOLDER=""
CGDIRS=""

cleanup() {
	[ -n "$HOLDER" ] && kill "$HOLDER" 2>/dev/null
	[ -n "$DAEMON" ] && kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null
	for d in $CGDIRS; do rmdir "$d" 2>/dev/null; done
	rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

absent() { ! grep -q "$1" "$2"; } # TEXT FILE

start_daemon() {
	"$PINBROKERD" --socket "$SOCK" --budget 1G --prewarm 0 --config /dev/null </dev/null >>"$T/daemon.log" 2>&1 &
	DAEMON=$!
	for _ in $(seq 100); do
		"$PINCTL" status >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "FAIL: pinbrokerd did not answer on $SOCK; its log:"
	sed 's/^/   /' "$T/daemon.log"
	exit 1
}
stop_daemon() {
	kill "$DAEMON"
	wait "$DAEMON" 2>/dev/null
	DAEMON=""
}

# --- the scripts themselves ---------------------------------------------------------------------
check "sh -n pinbroker-prolog.sh" sh -n "$PROLOG"
check "sh -n pinbroker-epilog.sh" sh -n "$EPILOG"
check "sh -n pinbroker-gres-count.sh" sh -n "$GRESCOUNT"
check "sh -n pinbroker-slurm-lib.sh" sh -n "$LIB"
if command -v shellcheck >/dev/null 2>&1; then
	# -x: each script with the helper it sources.
	check "shellcheck deploy/slurm/*.sh" shellcheck -x "$PROLOG" "$EPILOG" "$GRESCOUNT" "$LIB" "$0" \
		"$SRC/tests/deploy/run-slurm-real.sh" "$SRC/tests/deploy/checks.sh"
else
	echo "skip shellcheck: not installed (apt-get install shellcheck)"
fi
# What the scripts share is one sourced file (it was a block copied into each): each sources it, and
# none defines a function of it again.
# shellcheck disable=SC2016 # the literal line '. "$pb_lib"'
sources_lib() { grep -q -F -x '. "$pb_lib"' "$1" && grep -q 'pinbroker-slurm-lib\.sh$' "$1"; }
no_copy() { ! grep -Eq '^(pb_load_conf|pb_bytes|pb_cgroup_path|pb_log)\(\)' "$1"; }
both_source() { sources_lib "$PROLOG" && sources_lib "$EPILOG"; }
none_copies() { no_copy "$PROLOG" && no_copy "$EPILOG" && no_copy "$GRESCOUNT"; }
check "the prolog and the epilog source the one helper" both_source
check "the shared helper is there, with the config and size parsers" grep -q '^pb_load_conf()' "$LIB"
check "pinbroker-gres-count.sh sources it too" sources_lib "$GRESCOUNT"
check "no script keeps a copy of the helper's functions" none_copies

# --- slurmd's world: scontrol, slurm.conf, cgroup.conf, /etc/pinbroker/slurm.conf ---------------
mkdir -p "$T/bin" "$T/jobs" "$T/etc"
# scontrol show job -o ID: the line the test left in $T/jobs/ID, else Slurm's error. scontrol --json
# show job ID: $T/jobs/ID.json, else the error of a Slurm without its JSON serializer (22.05 as
# Debian 12 installs it), so the prolog falls back to the text.
cat >"$T/bin/scontrol" <<EOF
#!/bin/sh
echo "\$*" >>"$T/scontrol.calls"
if [ "\$1 \$2 \$3" = "--json show job" ]; then
	[ -r "$T/jobs/\$4.json" ] || { echo "scontrol: error: cannot load plugin serializer/json" >&2; exit 1; }
	cat "$T/jobs/\$4.json"
	exit 0
fi
[ "\$1 \$2 \$3" = "show job -o" ] || { echo "stub scontrol: unexpected: \$*" >&2; exit 2; }
[ -r "$T/jobs/\$4" ] || { echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }
cat "$T/jobs/\$4"
EOF
chmod +x "$T/bin/scontrol"
# Lines as slurmctld 22.05.8 printed them for `srun --gres=pinned:1 sh` (BatchFlag=0, no Comment, no
# StdOut: TresPerNode last) and `sbatch --comment ... --wrap` (Comment, StdErr/In/Out, Power=).
srun_line() { # JOBID UID USER TRESPERNODE [COMMENT]
	c=""
	[ -n "${5:-}" ] && c=" Comment=$5  "
	printf '%s\n' "JobId=$1 JobName=sh UserId=$3($2) GroupId=$3($2) MCS_label=N/A Priority=4294901758 Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=0 Reboot=0 ExitCode=0:0 RunTime=00:00:02 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-12-03T21:38:51 EligibleTime=2026-12-03T21:38:51 AccrueTime=Unknown StartTime=2026-12-03T21:38:51 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-03T21:38:51 Scheduler=Main Partition=debug AllocNode:Sid=localhost:23924 ReqNodeList=(null) ExcNodeList=(null) NodeList=node1 BatchHost=node1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=sh WorkDir=/tmp${c:- }Power= TresPerNode=$4"
}
batch_line() { # JOBID UID USER COMMENT
	printf '%s\n' "JobId=$1 JobName=wrap UserId=$3($2) GroupId=$3($2) MCS_label=N/A Priority=4294901757 Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-12-03T21:38:59 EligibleTime=2026-12-03T21:38:59 AccrueTime=2026-12-03T21:38:59 StartTime=2026-12-03T21:39:00 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-03T21:39:00 Scheduler=Main Partition=debug AllocNode:Sid=localhost:23924 ReqNodeList=(null) ExcNodeList=(null) NodeList=node1 BatchHost=node1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp Comment=$4  StdErr=/tmp/slurm-$1.out StdIn=/dev/null StdOut=/tmp/slurm-$1.out Power= "
}

# Which cgroup tree this host's broker charges (the v1 memory controller's, else the unified one),
# and the layout the scripts are to use for it: Slurm's v1 one under a CgroupPrepend of the test's
# own (%n is the node), or on a cgroup2-only host a path template of the test's own.
CGROOT=""
if [ "$(stat -f -c %T /sys/fs/cgroup/memory 2>/dev/null)" = cgroupfs ]; then
	CGROOT=/sys/fs/cgroup/memory
	printf 'CgroupPlugin=cgroup/v1\n# the build default is /slurm or /slurm_%%n\nCgroupPrepend = /pbtest_slurm_%%n\n' >"$T/etc/cgroup.conf"
	PREFIX=/pbtest_slurm_node1
	cgpath() { echo "$PREFIX/uid_$1/job_$2"; } # UID JOBID
	CGENV=""
elif [ "$(stat -f -c %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ]; then
	CGROOT=/sys/fs/cgroup
	PREFIX=/pbtest-slurm
	cgpath() { echo "$PREFIX/uid_$1/job_$2"; }
	CGENV="PINBROKER_SLURM_CGROUP_PATH=/pbtest-slurm/uid_{uid}/job_{job}"
else
	PREFIX=/pbtest_slurm_node1
	printf 'CgroupPlugin=cgroup/v1\nCgroupPrepend=/pbtest_slurm_%%n\n' >"$T/etc/cgroup.conf"
	cgpath() { echo "$PREFIX/uid_$1/job_$2"; }
	CGENV=""
fi
echo "ClusterName=pbtest" >"$T/etc/slurm.conf"
# /etc/pinbroker/slurm.conf's stand-in: quoted values, a comment, an export, a key it ignores.
cat >"$T/pinbroker-slurm.conf" <<EOF
# pinbroker's Slurm scripts
PINBROKER_SOCKET="$SOCK"
export PINBROKER_SLURM_PINCTL='$PINCTL'
PINBROKER_SLURM_DEFAULT=768M
PINBROKER_SLURM_SYSLOG=0
LD_PRELOAD=/nonexistent.so
EOF

# Run SCRIPT as slurmd does: env -i, slurmd's variables (prep_script_slurmd.c's _build_env), no
# PATH but the stub's (the scripts add the usual ones). Extra NAME=VALUE arguments go first.
# JOB UID USER CONTEXT SCRIPT [NAME=VALUE...]
slurmd_run() {
	job=$1 uid=$2 user=$3 ctx=$4 script=$5
	shift 5
	# shellcheck disable=SC2086 # CGENV is one NAME=VALUE or nothing
	env -i PATH="$T/bin" SLURMD_NODENAME=node1 SLURM_CONF="$T/etc/slurm.conf" SLURM_CLUSTER_NAME=pbtest \
		SLURM_JOB_ID="$job" SLURM_JOBID="$job" SLURM_JOB_UID="$uid" SLURM_UID="$uid" SLURM_JOB_GID="$uid" \
		SLURM_JOB_USER="$user" SLURM_JOB_WORK_DIR=/tmp SLURM_NODELIST=node1 SLURM_JOB_PARTITION=debug \
		SLURM_JOB_NUM_NODES=1 SLURM_JOB_CPUS_PER_NODE=1 SLURM_JOB_RESTART_COUNT=0 \
		SLURM_SCRIPT_CONTEXT="$ctx" PINBROKER_SLURM_CONF="$T/pinbroker-slurm.conf" $CGENV "$@" \
		${PB_TEST_SH:-/bin/sh} "$script" >"$T/out" 2>&1
	rc=$?
	sed 's/^/       | /' "$T/out"
	return $rc
}
prolog() { # JOB UID USER [NAME=VALUE...]
	j=$1 u=$2 n=$3
	shift 3
	slurmd_run "$j" "$u" "$n" prolog_slurmd "$PROLOG" "$@"
}
epilog() {
	j=$1 u=$2 n=$3
	shift 3
	slurmd_run "$j" "$u" "$n" epilog_slurmd "$EPILOG" "$@"
}
# The rule of PATTERN's bytes in `pinctl quota list --json`, "none" without one.
rule_bytes() {
	"$PINCTL" quota list --json | jq -r --arg p "$1" '[.rules[] | select(.pattern == $p)] | if length == 0 then "none" else .[0].bytes end'
}
rule_seen() {
	"$PINCTL" quota list --json | jq -r --arg p "$1" '[.rules[] | select(.pattern == $p)] | if length == 0 then "none" else .[0].seen end'
}
expect_rule() { # DESCRIPTION PATTERN BYTES
	got=$(rule_bytes "$2")
	if [ "$got" = "$3" ]; then ok "$1: rule $2 = $3"; else bad "$1: rule $2: want $3, got $got"; fi
}

start_daemon
U=4242

# --- the quota's source: GRES, comment, default, none ------------------------------------------------
echo "== GRES: --gres=pinned:2 (and a comment, which the GRES beats)"
srun_line 101 $U alice gres:pinned:2 "pinned=100M" >"$T/jobs/101"
check "prolog exits 0" prolog 101 $U alice SLURM_JOB_COMMENT="pinned=100M"
expect_rule "GRES pinned:2 in GiB" "$(cgpath $U 101)" 2147483648
check "it asked scontrol show job -o 101" grep -qx "show job -o 101" "$T/scontrol.calls"
check "the cgroup path expanded CgroupPrepend's %n (or the template)" test "$(cgpath $U 101)" = "$PREFIX/uid_$U/job_101"

echo "== GRES among others, with a type, and a unit of 256M"
srun_line 108 $U alice "gres:gpu:1,gres:pinned:fast:3" >"$T/jobs/108"
check "prolog exits 0" prolog 108 $U alice PINBROKER_SLURM_GRES_UNIT=256M
expect_rule "gres:pinned:fast:3 at 256M" "$(cgpath $U 108)" 805306368

echo "== no TresPerNode: gres/pinned=4 in the allocated TRES over NumNodes=2"
srun_line 115 $U alice "" | sed 's/ TresPerNode=$//; s/TRES=cpu=1,node=1,billing=1/TRES=cpu=2,node=2,billing=2,gres\/pinned=4/; s/NumNodes=1 /NumNodes=2 /' >"$T/jobs/115"
check "prolog exits 0" prolog 115 $U alice
expect_rule "TRES gres/pinned=4 over 2 nodes" "$(cgpath $U 115)" 2147483648

echo "== comment (sbatch --comment 'pinned=512M for the loader'), from SLURM_JOB_COMMENT"
batch_line 102 $U alice "pinned=512M for the loader" >"$T/jobs/102"
check "prolog exits 0" prolog 102 $U alice SLURM_JOB_COMMENT="pinned=512M for the loader"
expect_rule "comment pinned=512M" "$(cgpath $U 102)" 536870912

echo "== comment from scontrol's Comment= when slurmd passed none"
batch_line 107 $U alice "data;pinned=300M,x" >"$T/jobs/107"
check "prolog exits 0" prolog 107 $U alice
expect_rule "scontrol Comment= pinned=300M" "$(cgpath $U 107)" 314572800

echo "== a comment forging TresPerNode= gets no GRES quota (the comment's own pinned= counts)"
batch_line 109 $U mallory "x TresPerNode=gres:pinned:64 pinned=64M" >"$T/jobs/109"
check "prolog exits 0" prolog 109 $U mallory SLURM_JOB_COMMENT="x TresPerNode=gres:pinned:64 pinned=64M"
expect_rule "forged TresPerNode ignored" "$(cgpath $U 109)" 67108864

echo "== a job name made to look like TRES=, NumNodes= and TresPerNode= fields (no --gres): the default, not 64G"
FORGED='x TresPerNode=gres:pinned:64 TRES=cpu=1,gres/pinned=64 NumNodes=1 Power= TresPerNode=gres:pinned:64'
batch_line 121 $U mallory "" | sed "s|JobName=wrap |JobName=$FORGED |" >"$T/jobs/121"
check "prolog exits 0" prolog 121 $U mallory PINBROKER_SLURM_COMMENT=0
expect_rule "forged fields in the job name ignored" "$(cgpath $U 121)" 805306368
check "it says TRES= was there twice" grep -q "TRES= more than once" "$T/out"
check "it tried scontrol --json first" grep -qx -- "--json show job 121" "$T/scontrol.calls"
check "then the text" grep -qx "show job -o 121" "$T/scontrol.calls"

echo "== a working directory made to look like Power= TresPerNode= (no --gres): the default"
batch_line 122 $U mallory "" | sed 's|WorkDir=/tmp |WorkDir=/tmp/a Power= TresPerNode=gres:pinned:64 |' >"$T/jobs/122"
check "prolog exits 0" prolog 122 $U mallory PINBROKER_SLURM_COMMENT=0
expect_rule "forged TresPerNode in a path ignored" "$(cgpath $U 122)" 805306368

echo "== a forged job name beside a real --gres=pinned:2: the real one"
srun_line 123 $U mallory gres:pinned:2 | sed "s|JobName=sh |JobName=$FORGED |" >"$T/jobs/123"
check "prolog exits 0" prolog 123 $U mallory PINBROKER_SLURM_COMMENT=0
expect_rule "the real GRES pinned:2" "$(cgpath $U 123)" 2147483648

echo "== scontrol --json (Slurm with its JSON serializer): tres_per_node, whatever the name says"
srun_line 125 $U mallory "" | sed "s|JobName=sh |JobName=$FORGED |" >"$T/jobs/125"
cat >"$T/jobs/125.json" <<EOF
{"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [],
 "jobs": [{"job_id": 124, "name": "other", "tres_per_node": "gres:pinned:9"},
          {"job_id": 125, "name": "$FORGED Comment=pinned=64G", "user_id": $U, "comment": "",
           "tres_per_node": "gres:gpu:1,gres:pinned:3", "tres_alloc_str": "cpu=1,node=1,billing=1", "node_count": 1}]}
EOF
check "prolog exits 0" prolog 125 $U mallory PINBROKER_SLURM_COMMENT=0
expect_rule "JSON tres_per_node gres:pinned:3" "$(cgpath $U 125)" 3221225472
check "it did not read the text" test "$(grep -c -x "show job -o 125" "$T/scontrol.calls")" = 0

echo "== scontrol --json of a newer Slurm: node_count as an object, gres/pinned=4 in tres_alloc_str over 2 nodes"
cat >"$T/jobs/126.json" <<EOF
{"jobs": [{"job_id": 126, "name": "TresPerNode=gres:pinned:64", "comment": {"job": "pinned=5M", "administrator": null},
           "tres_per_node": "", "tres_alloc_str": "cpu=2,node=2,billing=2,gres/pinned=4",
           "node_count": {"set": true, "infinite": false, "number": 2}}]}
EOF
check "prolog exits 0" prolog 126 $U alice
expect_rule "JSON tres_alloc_str gres/pinned=4 over 2 nodes" "$(cgpath $U 126)" 2147483648
rm "$T/jobs/126.json"
check "prolog exits 0" prolog 126 $U alice PINBROKER_SLURM_CGROUP_PATH='/pbtest-json/job_{job}'
expect_rule "no JSON nor text (no such job): the default" /pbtest-json/job_126 805306368

echo "== without jq, python3 reads scontrol --json the same"
mkdir -p "$T/pybin"
# The python3 slurmd's PATH finds (not a wrapper such as pyenv's, which needs more than this PATH).
for py in /usr/bin/python3 /usr/local/bin/python3 "$(command -v python3)"; do [ -x "$py" ] && break; done
ln -sf "$py" "$T/pybin/python3"
ln -sf "$(command -v sed)" "$T/pybin/sed"
# shellcheck disable=SC2016 # expanded by the inner sh
got=$(sh -c '. "$1"; pb_json=$(cat "$3"); PATH=$2; command -v jq >/dev/null && exit 9
	pb_job_json 125 && printf "%s|%s|%s|%s\n" "$pb_tpn" "$pb_tres" "$pb_nodes" "$pb_sc_comment"' \
	sh "$LIB" "$T/pybin" "$T/jobs/125.json")
check "python3: tres_per_node, tres_alloc_str, node_count, comment ($got)" \
	test "$got" = "gres:gpu:1,gres:pinned:3|cpu=1,node=1,billing=1|1|"
printf '%s\n' '{"jobs": [{"job_id": 126, "tres_per_node": "", "tres_alloc_str": "gres/pinned=4",
	"node_count": {"set": true, "number": 2}, "comment": {"job": "pinned=5M"}}]}' >"$T/jobs/126b.json"
# shellcheck disable=SC2016
got=$(sh -c '. "$1"; pb_json=$(cat "$3"); PATH=$2; pb_job_json 126 && printf "%s|%s|%s|%s\n" "$pb_tpn" "$pb_tres" "$pb_nodes" "$pb_sc_comment"' \
	sh "$LIB" "$T/pybin" "$T/jobs/126b.json")
check "python3: node_count and comment as objects ($got)" test "$got" = "|gres/pinned=4|2|pinned=5M"

echo "== PINBROKER_SLURM_GRES_UNIT: the prolog and pinbroker-gres-count.sh take the same sizes"
srun_line 127 $U alice gres:pinned:1 >"$T/jobs/127"
for unit in 1G 1GiB 1gib 1024M 1048576K 1073741824; do
	prolog 127 $U alice PINBROKER_SLURM_GRES_UNIT=$unit >/dev/null
	expect_rule "prolog at PINBROKER_SLURM_GRES_UNIT=$unit" "$(cgpath $U 127)" 1073741824
	got=$(PINBROKER_SLURM_PINCTL="$PINCTL" PINBROKER_SLURM_GRES_UNIT=$unit PINBROKER_SLURM_CONF=/nonexistent "$GRESCOUNT")
	check "gres-count at PINBROKER_SLURM_GRES_UNIT=$unit: budget 1G is 1 ($got)" test "$got" = 1
done
for unit in 1X 0 G -1G; do
	prolog 127 $U alice PINBROKER_SLURM_GRES_UNIT=$unit >/dev/null
	check "prolog: PINBROKER_SLURM_GRES_UNIT=$unit is not a size, 1G used" grep -q "is not a size; using 1G" "$T/out"
	PINBROKER_SLURM_PINCTL="$PINCTL" PINBROKER_SLURM_GRES_UNIT=$unit PINBROKER_SLURM_CONF=/nonexistent "$GRESCOUNT" >/dev/null 2>"$T/err"
	check "gres-count: PINBROKER_SLURM_GRES_UNIT=$unit exits 2" test $? = 2
done
printf 'PINBROKER_SLURM_GRES_UNIT=512MiB\n' >"$T/unit.conf"
got=$(PINBROKER_SLURM_CONF="$T/unit.conf" PINBROKER_SLURM_PINCTL="$PINCTL" "$GRESCOUNT")
check "gres-count reads the unit from pinbroker-slurm.conf as the prolog does (512MiB: 2, got $got)" test "$got" = 2
for j in 121 122 123 125 127; do
	epilog $j $U alice >/dev/null 2>&1 || bad "epilog of job $j exited $?"
	expect_rule "epilog of job $j" "$(cgpath $U "$j")" none
done
epilog 126 $U alice PINBROKER_SLURM_CGROUP_PATH='/pbtest-json/job_{job}' >/dev/null 2>&1
expect_rule "epilog of job 126" /pbtest-json/job_126 none

echo "== PINBROKER_SLURM_MAX caps a comment"
batch_line 110 $U alice "pinned=100G" >"$T/jobs/110"
check "prolog exits 0" prolog 110 $U alice SLURM_JOB_COMMENT="pinned=100G" PINBROKER_SLURM_MAX=1G
expect_rule "pinned=100G capped to 1G" "$(cgpath $U 110)" 1073741824

echo "== a bad comment is ignored (the default applies), never fails the job"
batch_line 111 $U alice "pinned=lots" >"$T/jobs/111"
check "prolog exits 0" prolog 111 $U alice SLURM_JOB_COMMENT="pinned=lots" PINBROKER_SLURM_STRICT=1
expect_rule "pinned=lots: the default 768M" "$(cgpath $U 111)" 805306368

echo "== default (the config file's PINBROKER_SLURM_DEFAULT=768M): no GRES, no comment"
srun_line 103 $U bob "gres:gpu:1" >"$T/jobs/103"
check "prolog exits 0" prolog 103 $U bob
expect_rule "default 768M" "$(cgpath $U 103)" 805306368

echo "== scontrol failing (no such job) falls back to the comment"
check "prolog exits 0" prolog 112 $U bob SLURM_JOB_COMMENT="pinned=1M"
expect_rule "scontrol failed: comment pinned=1M" "$(cgpath $U 112)" 1048576
check "the failure was logged" grep -q "scontrol show job -o 112 failed" "$T/out"

echo "== no quota: PINBROKER_SLURM_DEFAULT=none, no GRES, no comment"
srun_line 104 $U bob "gres:gpu:1" >"$T/jobs/104"
check "prolog exits 0" prolog 104 $U bob PINBROKER_SLURM_DEFAULT=none
expect_rule "no rule" "$(cgpath $U 104)" none
check "the epilog of a job without a quota exits 0" epilog 104 $U bob

echo "== cgroup/v2 layout (PINBROKER_SLURM_CGROUP=v2)"
check "prolog exits 0" prolog 113 $U bob SLURM_JOB_COMMENT="pinned=2M" PINBROKER_SLURM_CGROUP=v2 PINBROKER_SLURM_CGROUP_PATH=
expect_rule "v2 path" /system.slice/slurmstepd.scope/job_113 2097152
check "its epilog exits 0" epilog 113 $U bob PINBROKER_SLURM_CGROUP=v2 PINBROKER_SLURM_CGROUP_PATH=
expect_rule "v2 rule cleared" /system.slice/slurmstepd.scope/job_113 none

echo "== a prolog run in another context does nothing"
check "prolog as epilog_slurmd exits 0" slurmd_run 114 $U bob epilog_slurmd "$PROLOG" SLURM_JOB_COMMENT="pinned=2M"
expect_rule "no rule" "$(cgpath $U 114)" none

echo "== pinbroker-slurm.conf.example parses without a warning"
srun_line 116 $U alice "" >"$T/jobs/116"
check "prolog exits 0" prolog 116 $U alice PINBROKER_SLURM_CONF="$SRC/deploy/slurm/pinbroker-slurm.conf.example" \
	PINBROKER_SOCKET="$SOCK" PINBROKER_SLURM_PINCTL="$PINCTL"
check "no warning" absent ignoring "$T/out"
expect_rule "its default is none" "$(cgpath $U 116)" none

echo "== epilogs clear the rules"
for j in 101 102 103 107 108 109 110 111 112 115; do
	epilog $j $U alice >/dev/null 2>&1 || bad "epilog of job $j exited $?"
	expect_rule "epilog of job $j" "$(cgpath $U "$j")" none
done

# --- a client in the job's real cgroup ---------------------------------------------------------------
J=105
CG=$CGROOT$(cgpath $U $J)
if [ -n "$CGROOT" ] && mkdir -p "$CG" 2>/dev/null && sh -c "echo \$\$ >'$CG/cgroup.procs'" 2>/dev/null; then
	CGDIRS="$CG $CGROOT$PREFIX/uid_$U $CGROOT$PREFIX"
	echo "== a client in cgroup $(cgpath $U $J): --gres=pinned:3 at PINBROKER_SLURM_GRES_UNIT=64M (192M)"
	rmdir "$CG" # the prolog runs before the job's cgroup is made
	srun_line $J $U alice gres:pinned:3 >"$T/jobs/$J"
	check "prolog exits 0" prolog $J $U alice PINBROKER_SLURM_GRES_UNIT=64M
	expect_rule "GRES pinned:3 at 64M" "$(cgpath $U $J)" 201326592
	check "the rule is not seen yet" test "$(rule_seen "$(cgpath $U $J)")" = false
	sleep 6 # past a sweep (5 s): a rule whose cgroup never existed stays
	expect_rule "the rule outlives a sweep before its cgroup exists" "$(cgpath $U $J)" 201326592
	mkdir -p "$CG"
	in_job() { sh -c "echo \$\$ >'$CG/cgroup.procs' && exec \"\$@\"" sh "$@"; }
	in_job "$PINCTL" acquire 256M >"$T/acq" 2>&1
	rc=$?
	sed 's/^/       | /' "$T/acq"
	check "acquire 256M beyond the 192M quota exits 1" test $rc = 1
	check "and says the job's quota is full" grep -q "refused: job $(cgpath $U $J) already holds 0 B of its 192 MiB quota" "$T/acq"
	in_job "$PINCTL" acquire 64M >"$T/acq" 2>&1
	rc=$?
	sed 's/^/       | /' "$T/acq"
	check "acquire 64M within it exits 0" test $rc = 0
	check "the rule is seen now" test "$(rule_seen "$(cgpath $U $J)")" = true
	in_job "$PINCTL" acquire 128M --hold 30 >"$T/hold" 2>&1 &
	HOLDER=$!
	for _ in $(seq 50); do grep -q "^lease" "$T/hold" && break; sleep 0.1; done
	check "a holder got 128M" grep -q "^lease .*(134217728 bytes)" "$T/hold"
	got=$("$PINCTL" jobs --json | jq -r --arg p "$(cgpath $U $J)" '.jobs[] | select(.job == $p) | "\(.bytes) \(.leases) \(.quota_bytes)"')
	check "pinctl jobs --json: 134217728 bytes in 1 lease of 201326592 ($got)" test "$got" = "134217728 1 201326592"
	in_job "$PINCTL" acquire 96M >"$T/acq" 2>&1
	check "acquire 96M more (128M held) is refused" test $? = 1
	check "the epilog exits 0" epilog $J $U alice PINBROKER_SLURM_DEADLINE_MS=3000
	check "it revoked 1 lease" grep -q "revoking 1 lease" "$T/out"
	for _ in $(seq 50); do kill -0 "$HOLDER" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$HOLDER" 2>/dev/null; then
		bad "the holder still runs 5 s after the epilog"
	else
		wait "$HOLDER"
		check "the holder exited 0 after the revoke" test $? = 0
	fi
	HOLDER=""
	sed 's/^/       | /' "$T/hold"
	check "the holder heard the revoke" grep -q "revoked lease" "$T/hold"
	check "no lease left" test "$("$PINCTL" leases --json | jq '.leases | length')" = 0
	expect_rule "the epilog cleared the quota" "$(cgpath $U $J)" none

	echo "== a rule seen and then its cgroup gone is released by the daemon (a job whose epilog never ran)"
	J=106
	CG6=$CGROOT$(cgpath $U $J)
	srun_line $J $U alice gres:pinned:1 >"$T/jobs/$J"
	check "prolog exits 0" prolog $J $U alice
	mkdir "$CG6"
	check "seen once its cgroup exists" test "$(rule_seen "$(cgpath $U $J)")" = true
	rmdir "$CG6"
	expect_rule "released once its cgroup is gone" "$(cgpath $U $J)" none
	rmdir "$CG" "$CGROOT$PREFIX/uid_$U" "$CGROOT$PREFIX" 2>/dev/null
	CGDIRS=""
else
	rmdir "$CG" "$CGROOT$PREFIX/uid_$U" "$CGROOT$PREFIX" 2>/dev/null
	echo "SKIP (part): cannot make cgroup $CG or move a process into it here; the quota's enforcement in a job's cgroup is not checked"
fi

# --- pinbroker-gres-count.sh ---------------------------------------------------------------------------
echo "== pinbroker-gres-count.sh"
got=$(PINBROKER_SLURM_PINCTL="$PINCTL" "$GRESCOUNT")
check "budget 1G is Count=1 ($got)" test "$got" = 1
got=$(PINBROKER_SLURM_PINCTL="$PINCTL" PINBROKER_SLURM_GRES_UNIT=256M "$GRESCOUNT" --gres-conf)
check "--gres-conf at 256M ($got)" test "$got" = "Name=pinned Count=4 Flags=CountOnly"

# --- the broker down ------------------------------------------------------------------------------
echo "== pinbrokerd stopped"
stop_daemon
srun_line 120 $U alice gres:pinned:1 >"$T/jobs/120"
check "prolog exits 0 (the job runs without a quota)" prolog 120 $U alice
check "and logs why" grep -q "pinctl quota set .* failed" "$T/out"
prolog 120 $U alice PINBROKER_SLURM_STRICT=1
check "prolog with PINBROKER_SLURM_STRICT=1 exits 1" test $? = 1
check "epilog exits 0" epilog 120 $U alice
epilog 120 $U alice PINBROKER_SLURM_STRICT=1
check "epilog with PINBROKER_SLURM_STRICT=1 exits 1" test $? = 1
check "no pinctl: prolog exits 0" prolog 120 $U alice PINBROKER_SLURM_PINCTL=/nonexistent/pinctl
got=$(PINBROKER_SLURM_PINCTL="$PINCTL" "$GRESCOUNT" 2>/dev/null)
check "gres-count exits 1 and prints nothing" test $? = 1 -a -z "$got"

checks_summary

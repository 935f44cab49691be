#!/bin/sh
# SPDX-License-Identifier: MIT
# deploy/slurm for real: a single-node Slurm of Debian's packages (munged, slurmctld, slurmd of
# their own, on ports and sockets of their own) with Prolog/Epilog pointing at deploy/slurm, the
# cgroup/v1 plugin with ConstrainRAMSpace, a pinned GRES, and a real pinbrokerd run as the packaged
# unit runs it (systemd/pinbrokerd.service: user pinbroker, the unit's ambient capabilities, /proc as
# its ProtectProc= mounts it). Jobs of an ordinary user (pbslurm) by srun and sbatch then pin memory
# through pinctl acquire inside their Slurm-made cgroups: the daemon must read another uid's /proc.
# Usage: run-slurm-real.sh [BUILD_DIR]. Exit 0, 1, or 77 (not root; no slurmd/slurmctld/munged/jq;
# no cgroup v1 memory controller: Slurm's v2 plugin wants systemd's dbus, not there in containers).
# shellcheck disable=SC2016 # sh -c '...' scripts take their values as arguments, on purpose
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
PINBROKERD=$BUILD/daemon/pinbrokerd
PINCTL=$BUILD/client/pinctl
# skip, ok, bad, check and the summary, shared with the other Slurm test.
# shellcheck source=/dev/null
. "$SRC/tests/deploy/checks.sh"
[ "$(id -u)" = 0 ] || skip "run as root"
for c in slurmctld slurmd munged srun sbatch scontrol scancel squeue jq setpriv unshare runuser useradd; do
	command -v $c >/dev/null 2>&1 || skip "no $c (apt-get install slurmd slurmctld slurm-client munge jq)"
done
[ "$(stat -f -c %T /sys/fs/cgroup/memory 2>/dev/null)" = cgroupfs ] || skip "no cgroup v1 memory controller"
if [ ! -x "$PINBROKERD" ] || [ ! -x "$PINCTL" ]; then
	echo "FAIL: build $BUILD first"
	exit 1
fi

T=$(mktemp -d /tmp/pb-slurm-real.XXXXXX)
chmod 755 "$T"
# The job user runs pinctl, which a build tree under a 0700 folder (a clone in /root, CI's mktemp -d) keeps
# from it: a staged copy beside its library (pinctl's RUNPATH starts at $ORIGIN) is what the jobs run.
mkdir "$T/bin"
cp "$PINCTL" "$T/bin/pinctl"
cp -L "$BUILD/client/libpinbroker.so.1" "$T/bin/"
chmod 755 "$T/bin" "$T/bin/pinctl"
chmod 644 "$T/bin/libpinbroker.so.1"
PINCTL=$T/bin/pinctl
# The unit's user and an ordinary job user in the socket's group, made where missing (as the package's
# sysusers snippet and an admin would) and removed again at the end: a pinbroker group left behind
# would make every later test daemon's socket 0660 root:pinbroker, shut to the other tests' uids.
UNIT=$SRC/systemd/pinbrokerd.service
JOBUSER=pbslurm
MADE=""
getent group pinbroker >/dev/null || { groupadd --system pinbroker && MADE="$MADE group:pinbroker"; }
id pinbroker >/dev/null 2>&1 ||
	{ useradd --system -M -g pinbroker -s /usr/sbin/nologin pinbroker && MADE="user:pinbroker $MADE"; }
id $JOBUSER >/dev/null 2>&1 || { useradd -M -G pinbroker $JOBUSER && MADE="user:$JOBUSER $MADE"; }
JOBUID=$(id -u $JOBUSER)
# The socket's folder is the daemon's; job output goes where the job user may write.
mkdir -p "$T/run" "$T/out"
chown pinbroker:pinbroker "$T/run"
chown $JOBUSER "$T/out"
NODE=$(hostname -s)
# The cgroups slurmd will make (cgroup/v1: /slurm or /slurm_NODE in each controller): those not
# there before are removed after, once empty.
NEWCG=""
for c in /sys/fs/cgroup/*/; do
	for p in slurm "slurm_$NODE"; do
		[ -e "$c$p" ] || NEWCG="$NEWCG $c$p"
	done
done
export PINBROKER_SOCKET="$T/run/pb.sock" SLURM_CONF="$T/slurm.conf"
DAEMON=""
cleanup() {
	for f in "$T/slurmd.pid" "$T/slurmctld.pid" "$T/munged.pid"; do
		[ -r "$f" ] && kill "$(cat "$f")" 2>/dev/null
	done
	[ -n "$DAEMON" ] && kill "$DAEMON" 2>/dev/null
	sleep 1
	for d in $NEWCG; do
		[ -d "$d" ] || continue
		for u in "$d"/uid_*; do [ -d "$u" ] && rmdir "$u" 2>/dev/null; done
		rmdir "$d" 2>/dev/null
	done
	rm -rf "$T"
	for m in $MADE; do
		case $m in
		user:*) userdel "${m#user:}" 2>/dev/null ;;
		group:*) groupdel "${m#group:}" 2>/dev/null ;;
		esac
	done
}
trap cleanup EXIT
trap 'exit 1' INT TERM
logs() {
	for f in "$T"/log/*; do
		echo "--- $f"
		tail -n 30 "$f"
	done
}

mkdir -p "$T/state" "$T/spool" "$T/log"
# munge: a key and a socket of its own, so a host's munged is left alone.
dd if=/dev/urandom of="$T/munge.key" bs=1024 count=1 2>/dev/null
chmod 600 "$T/munge.key"
munged --force --socket="$T/munge.sock" --key-file="$T/munge.key" --pid-file="$T/munged.pid" \
	--log-file="$T/log/munged.log" --seed-file="$T/munge.seed" || {
	echo "FAIL: munged did not start"
	exit 1
}
# The daemon as the packaged unit runs it, without systemd: AmbientCapabilities= (also its bounding
# set), NoNewPrivileges=, User=pinbroker, and /proc mounted as ProtectProc= mounts it in the
# service's own mount namespace (default: no hidepid).
# Those this host's bounding set lacks (a container's, often CAP_SYS_RESOURCE) cannot be raised: left out, and said.
bnd=$((0x$(awk '/^CapBnd:/ { print $2 }' /proc/self/status)))
caps=""
unit_caps=$(sed -n 's/^AmbientCapabilities=//p' "$UNIT")
for c in $unit_caps; do
	n=$(sed -n "s/^#define ${c}[[:space:]]*\([0-9]*\).*/\1/p" /usr/include/linux/capability.h)
	if [ -n "$n" ] && [ $(((bnd >> n) & 1)) = 1 ]; then
		caps="${caps:+$caps,}+$(echo "${c#CAP_}" | tr '[:upper:]' '[:lower:]')"
	else
		echo "note: this host's bounding set lacks $c: the daemon runs without it"
	fi
done
hidepid=$(sed -n 's/^ProtectProc=//p' "$UNIT")
[ "$hidepid" = default ] && hidepid=off
unshare -m --propagation private sh -c 'mount -t proc -o "hidepid=$1" proc /proc &&
	exec setpriv --reuid=pinbroker --regid=pinbroker --init-groups --inh-caps="-all,$2" --ambient-caps="$2" \
		--bounding-set="-all,$2" --no-new-privs "$3" --socket "$4" --budget 1G --prewarm 0 --config /dev/null' \
	sh "$hidepid" "$caps" "$PINBROKERD" "$PINBROKER_SOCKET" </dev/null >"$T/log/pinbrokerd.log" 2>&1 &
DAEMON=$!

# /etc/pinbroker/slurm.conf's stand-in (slurmd gives Prolog/Epilog a fresh environment, so the
# wrappers below only name this file): the GRES in units of 128M so jobs fit the 1G budget.
cat >"$T/pinbroker-slurm.conf" <<EOF
PINBROKER_SOCKET=$PINBROKER_SOCKET
PINBROKER_SLURM_PINCTL=$PINCTL
PINBROKER_SLURM_GRES_UNIT=128M
EOF
for s in prolog epilog; do
	printf '#!/bin/sh\nenv >"%s/%s-env.$SLURM_JOB_ID"\nPINBROKER_SLURM_CONF=%s exec %s 2>>"%s"\n' \
		"$T" "$s" "$T/pinbroker-slurm.conf" "$SRC/deploy/slurm/pinbroker-$s.sh" "$T/log/pinbroker-$s.log" >"$T/$s.sh"
	chmod 755 "$T/$s.sh"
done
cat >"$SLURM_CONF" <<EOF
ClusterName=pbtest
SlurmctldHost=$NODE
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$T/munge.sock
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
SelectType=select/cons_tres
GresTypes=pinned
ReturnToService=2
MpiDefault=none
Prolog=$T/prolog.sh
Epilog=$T/epilog.sh
NodeName=$NODE CPUs=$(nproc) RealMemory=1000 Gres=pinned:8 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
printf 'CgroupPlugin=cgroup/v1\nConstrainRAMSpace=yes\n' >"$T/cgroup.conf"
printf 'Name=pinned Count=8 Flags=CountOnly\n' >"$T/gres.conf"
slurmctld -f "$SLURM_CONF" </dev/null >"$T/log/slurmctld.out" 2>&1
slurmd -f "$SLURM_CONF" </dev/null >"$T/log/slurmd.out" 2>&1
for _ in $(seq 60); do
	sinfo -h -o %t 2>/dev/null | grep -q idle && break
	sleep 0.5
done
if ! sinfo -h -o %t 2>/dev/null | grep -q idle; then
	echo "FAIL: the node did not come up idle"
	logs
	exit 1
fi
ok "slurmctld and slurmd up, node $NODE idle"
# CAP_KILL (5), CAP_IPC_LOCK (14), CAP_SYS_PTRACE (19), CAP_SYS_RESOURCE (24): the unit's four.
ids=$(awk '/^Uid:/ { print $2 } /^CapAmb:/ { print $2 }' /proc/$DAEMON/status | tr '\n' ' ')
want=$(printf '%016x' $((0x1084020 & bnd)))
check "pinbrokerd runs as user pinbroker with the unit's four capabilities, of the host's (uid CapAmb: $ids)" \
	test "$ids" = "$(id -u pinbroker) $want "

echo "== srun --gres=pinned:2 (256M) as $JOBUSER: beyond it refused, within granted"
out=$(timeout 120 runuser -u $JOBUSER -- srun --chdir=/tmp --gres=pinned:2 sh -c "grep memory /proc/self/cgroup; $PINCTL acquire 384M; echo rc=\$?; $PINCTL acquire 192M; echo rc=\$?" 2>&1)
echo "$out" | sed 's/^/       | /'
J=$(sed -n 's/^SLURM_JOB_ID=//p' "$T"/prolog-env.* 2>/dev/null | sort -n | tail -n 1)
CG=$(echo "$out" | sed -n 's/^[0-9]*:memory:\(.*\/job_[0-9]*\)\/.*/\1/p')
check "the job ran in a Slurm memory cgroup ($CG)" test -n "$CG"
check "the prolog gave that cgroup its quota" grep -q "quota 268435456 bytes (GRES pinned:2) for $CG\$" "$T/log/pinbroker-prolog.log"
check "acquire 384M was refused by the job's quota" sh -c 'echo "$1" | grep -q "refused: job $2 already holds 0 B of its 256 MiB quota"' sh "$out" "$CG"
check "acquire 384M exited 1, 192M 0" sh -c 'echo "$1" | tr "\n" " " | grep -q "rc=1 .*lease .*rc=0"' sh "$out"
check "slurmd ran the prolog as prolog_slurmd" grep -q SLURM_SCRIPT_CONTEXT=prolog_slurmd "$T/prolog-env.$J"
check "without a PATH" sh -c '! grep -q ^PATH= "$1"' sh "$T/prolog-env.$J"

echo "== sbatch --comment 'pinned=96M', holding 64M; scancel"
J=$(runuser -u $JOBUSER -- sbatch --parsable --chdir=/tmp --comment "pinned=96M for the loader" -o "$T/out/job-%j.out" \
	--wrap "$PINCTL acquire 64M --hold 120")
for _ in $(seq 100); do grep -q "^lease" "$T/out/job-$J.out" 2>/dev/null && break; sleep 0.2; done
CG=/slurm_$NODE/uid_$JOBUID/job_$J
grep -q "for /slurm/uid_$JOBUID/job_$J\$" "$T/log/pinbroker-prolog.log" && CG=/slurm/uid_$JOBUID/job_$J
got=$("$PINCTL" jobs --json | jq -r --arg p "$CG" '.jobs[] | select(.job == $p) | "\(.bytes) \(.quota_bytes)"')
check "pinctl jobs: $CG holds 64M of 96M ($got)" test "$got" = "67108864 100663296"
scancel "$J"
for _ in $(seq 100); do
	[ -z "$(squeue -h -j "$J" 2>/dev/null)" ] && grep -q "job $J:" "$T/log/pinbroker-epilog.log" 2>/dev/null && break
	sleep 0.2
done
sed 's/^/       | /' "$T/out/job-$J.out"
check "the epilog cleared $CG" grep -q "job $J: $CG: quota of $CG cleared" "$T/log/pinbroker-epilog.log"
check "no lease left" test "$("$PINCTL" leases --json | jq '.leases | length')" = 0
check "no rule left" test "$("$PINCTL" quota list --json | jq '.rules | length')" = 0
check "every client's job was known (job_unknown_total 0)" \
	test "$("$PINCTL" status --json | jq '.job_unknown_total')" = 0
check "the node is not drained" sh -c '! sinfo -h -o %t | grep -q drain'

checks_failed && logs
checks_summary

# SPDX-License-Identifier: MIT
# shellcheck shell=sh disable=SC2034 # pb_job_data's variables are for the scripts that source it
# pinbroker-slurm-lib.sh: what pinbroker-prolog.sh, pinbroker-epilog.sh and pinbroker-gres-count.sh
# share, sourced by each of them from the folder it lives in (symlinks followed): the settings file,
# logging, timeouts, the job's cgroup, sizes and GRES counts, and the job's data from slurmctld.
# It only defines functions and sets PATH: sourced, never run (it is installed mode 644, outside any
# Prolog=.../prolog.d/* glob). Every name it defines starts with pb_; pb_script names the caller.
: "${pb_script:=slurm}"

# slurmd gives these scripts no PATH: add the usual places after any the caller set.
PATH=${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH

pb_log() { # PRIORITY MESSAGE...: stderr, and syslog through logger where present
	pb_prio=$1
	shift
	printf 'pinbroker-slurm %s job %s: %s\n' "$pb_script" "${SLURM_JOB_ID:-?}" "$*" >&2
	if [ "${PINBROKER_SLURM_SYSLOG:-1}" != 0 ] && command -v logger >/dev/null 2>&1; then
		logger -t pinbroker-slurm -p "daemon.$pb_prio" -- "$pb_script job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null || :
	fi
}

# KEY=VALUE lines of /etc/pinbroker/slurm.conf (PINBROKER_SLURM_CONF); never sourced, and a
# variable already in the environment wins (slurmd passes none of these: its scripts get a fresh one).
pb_load_conf() {
	pb_conf=${PINBROKER_SLURM_CONF:-/etc/pinbroker/slurm.conf}
	[ -r "$pb_conf" ] || return 0
	while IFS= read -r pb_line || [ -n "$pb_line" ]; do
		pb_line=${pb_line#"${pb_line%%[! 	]*}"}
		case $pb_line in '' | '#'*) continue ;; esac
		pb_line=${pb_line#export }
		pb_name=${pb_line%%=*}
		pb_val=${pb_line#*=}
		case $pb_name in
		*[!A-Z0-9_]* | '') pb_ok=0 ;;
		PINBROKER_SLURM_CONF) pb_ok=0 ;;
		PINBROKER_SLURM_* | PINBROKER_SOCKET) pb_ok=1 ;;
		*) pb_ok=0 ;;
		esac
		if [ "$pb_ok" = 0 ] || [ "$pb_line" = "$pb_name" ]; then
			pb_log warning "$pb_conf: ignoring '$pb_line' (only PINBROKER_SLURM_*=VALUE and PINBROKER_SOCKET=PATH)"
			continue
		fi
		case $pb_val in
		\"*\") pb_val=${pb_val#\"}; pb_val=${pb_val%\"} ;;
		\'*\') pb_val=${pb_val#\'}; pb_val=${pb_val%\'} ;;
		esac
		eval "pb_isset=\${$pb_name+x}"
		[ -n "$pb_isset" ] || eval "$pb_name=\$pb_val; export $pb_name"
	done <"$pb_conf"
}

# Run a command under timeout(1) where present, so a hung broker or slurmctld cannot hold the job
# past PrologEpilogTimeout (which would drain the node).
pb_run() {
	if [ "${PINBROKER_SLURM_TIMEOUT:-5}" != 0 ] && command -v timeout >/dev/null 2>&1; then
		timeout -k 2 "${PINBROKER_SLURM_TIMEOUT:-5}" "$@"
	else
		"$@"
	fi
}

# A setting of a Slurm-style config file (keys case-insensitive, the last one wins): KEY FILE.
pb_slurm_conf_get() {
	[ -r "$2" ] || return 0
	awk -v k="$1" 'BEGIN { k = tolower(k) }
		{ l = $0; sub(/#.*/, "", l); n = index(l, "="); if (!n) next
		  key = substr(l, 1, n - 1); val = substr(l, n + 1)
		  gsub(/[ \t]/, "", key); gsub(/^[ \t]+|[ \t]+$/, "", val)
		  if (tolower(key) == k) v = val }
		END { if (v != "") print v }' "$2"
}

# The job's cgroup path as the broker sees it (the v1 memory controller's, else the unified one).
pb_cgroup_path() {
	pb_uid=${SLURM_JOB_UID:-}
	pb_job=${SLURM_JOB_ID:-}
	if [ -n "${PINBROKER_SLURM_CGROUP_PATH:-}" ]; then
		printf '%s\n' "$PINBROKER_SLURM_CGROUP_PATH" | sed "s/{uid}/$pb_uid/g; s/{job}/$pb_job/g"
		return 0
	fi
	pb_cgconf=${SLURM_CONF:-/etc/slurm/slurm.conf}
	pb_cgconf=${pb_cgconf%/*}/cgroup.conf
	pb_mode=${PINBROKER_SLURM_CGROUP:-auto}
	if [ "$pb_mode" = auto ]; then
		case $(pb_slurm_conf_get CgroupPlugin "$pb_cgconf") in
		cgroup/v1) pb_mode=v1 ;;
		cgroup/v2) pb_mode=v2 ;;
		*) # autodetect, as Slurm does: a hybrid host (v1 controllers, cgroup2 beside them) is v1.
			if [ "$(stat -f -c %T /sys/fs/cgroup/memory 2>/dev/null)" = cgroupfs ]; then
				pb_mode=v1
			else
				pb_mode=v2
			fi
			;;
		esac
	fi
	case $pb_mode in
	v1)
		# CgroupPrepend, else the build's default: "/slurm", or "/slurm_%n" where slurmd was built
		# for multiple slurmds per host (Debian's is): a cgroup already there, else libslurm says.
		pb_pre=${PINBROKER_SLURM_CGROUP_PREPEND:-$(pb_slurm_conf_get CgroupPrepend "$pb_cgconf")}
		if [ -z "$pb_pre" ]; then
			if [ -d "/sys/fs/cgroup/memory/slurm_${SLURMD_NODENAME:-}" ]; then
				pb_pre=/slurm_%n
			elif [ -d /sys/fs/cgroup/memory/slurm ]; then
				pb_pre=/slurm
			else
				pb_pre=/slurm
				for pb_lib in /usr/lib/*/slurm-wlm/libslurmfull.so /usr/lib*/slurm/libslurmfull.so \
					/usr/local/lib*/slurm/libslurmfull.so; do
					[ -r "$pb_lib" ] || continue
					grep -q -a '/slurm_%n' "$pb_lib" && pb_pre=/slurm_%n
					break
				done
			fi
		fi
		pb_node=${SLURMD_NODENAME:-$(hostname -s 2>/dev/null || uname -n)}
		pb_host=$(hostname -s 2>/dev/null || uname -n)
		pb_pre=$(printf '%s\n' "$pb_pre" | sed "s/%n/$pb_node/g; s/%h/$pb_host/g")
		printf '%s/uid_%s/job_%s\n' "$pb_pre" "$pb_uid" "$pb_job"
		;;
	v2) printf '/system.slice/slurmstepd.scope/job_%s\n' "$pb_job" ;;
	*)
		pb_log err "PINBROKER_SLURM_CGROUP=$pb_mode: write auto, v1 or v2"
		return 1
		;;
	esac
}

# A broker failure: exit 0 (the job runs, without a pinned quota) unless PINBROKER_SLURM_STRICT=1,
# where exit 1 makes slurmd drain the node (and, in a prolog, requeue the job held).
pb_fail() {
	if [ "${PINBROKER_SLURM_STRICT:-0}" = 1 ]; then
		pb_log err "$* (PINBROKER_SLURM_STRICT=1: failing, slurmd drains the node)"
		exit 1
	fi
	pb_log warning "$* (going on: PINBROKER_SLURM_STRICT=1 would fail instead)"
	exit 0
}

pb_find_pinctl() {
	pb_pinctl=${PINBROKER_SLURM_PINCTL:-$(command -v pinctl 2>/dev/null || :)}
	if [ -z "$pb_pinctl" ] || [ ! -x "$pb_pinctl" ]; then
		pb_fail "pinctl not found (PATH, or PINBROKER_SLURM_PINCTL)"
	fi
}

# SIZE (digits, optional K/M/G/T/P, optionally "iB"/"B") to bytes on stdout; 1 if not a size.
pb_bytes() {
	pb_n=${1%%[!0-9]*}
	pb_s=${1#"$pb_n"}
	[ -n "$pb_n" ] && [ ${#pb_n} -le 18 ] || return 1
	while :; do case $pb_n in 0?*) pb_n=${pb_n#0} ;; *) break ;; esac; done
	case $pb_s in
	'' | [bB]) pb_m=1 ;;
	[kK] | [kK][bB] | [kK]i[bB]) pb_m=1024 ;;
	[mM] | [mM][bB] | [mM]i[bB]) pb_m=1048576 ;;
	[gG] | [gG][bB] | [gG]i[bB]) pb_m=1073741824 ;;
	[tT] | [tT][bB] | [tT]i[bB]) pb_m=1099511627776 ;;
	[pP] | [pP][bB] | [pP]i[bB]) pb_m=1125899906842624 ;;
	*) return 1 ;;
	esac
	[ "$pb_n" -le $((9223372036854775807 / pb_m)) ] || return 1
	echo $((pb_n * pb_m))
}

# The GRES count of NAME in a TresPerNode value (gres:NAME, gres:NAME:N, gres:NAME:TYPE:N, apart by
# commas) or a TRES one (gres/NAME=N); N may carry Slurm's k/m/g multipliers (1024).
pb_gres_count() { # VALUE NAME
	printf '%s\n' "$1" | tr ',' '\n' | awk -v g="$2" '
		{ e = $0; sub(/^gres[:\/]/, "", e)
		  if (e == g) { print 1; exit }
		  if (index(e, g "=") == 1) { print substr(e, length(g) + 2); exit }
		  if (index(e, g ":") == 1) { n = split(e, p, ":"); print p[n]; exit } }'
}

# A count (with k/m/g/t/p: x1024) times the unit's bytes.
pb_count_bytes() { # COUNT UNIT-BYTES
	pb_c=${1%%[!0-9]*}
	[ -n "$pb_c" ] || return 1
	case ${1#"$pb_c"} in
	'') ;;
	[kK]) pb_c=$((pb_c * 1024)) ;;
	[mM]) pb_c=$((pb_c * 1048576)) ;;
	[gG]) pb_c=$((pb_c * 1073741824)) ;;
	*) return 1 ;;
	esac
	pb_bytes "$pb_c" >/dev/null || return 1
	[ "$pb_c" -le $((9223372036854775807 / $2)) ] || return 1
	echo $((pb_c * $2))
}


# PINBROKER_SLURM_GRES_UNIT (default 1G) in bytes: any size pb_bytes takes (1G, 1GiB, 1024M, 1073741824),
# above 0. The prolog and pinbroker-gres-count.sh both read it through here, so they agree on it.
pb_gres_unit() {
	pb_u=$(pb_bytes "${PINBROKER_SLURM_GRES_UNIT:-1G}") && [ "$pb_u" -gt 0 ] || return 1
	echo "$pb_u"
}

# ---- the job's data from slurmctld ----
# slurmd passes a prolog no variable for a plugin-less GRES like pinned, so it is asked of slurmctld.
# pb_job_data JOBID sets pb_tpn (TresPerNode: gres:pinned:2), pb_tres (the allocated TRES), pb_nodes
# (NumNodes), pb_sc_comment (the comment) and pb_job_how (where they came from; "" when from nowhere).
# First `scontrol --json show job` (Slurm's JSON: no user-chosen text can pose as another field), read
# with jq or python3; where Slurm has no JSON serializer, the text of `scontrol show job -o`, read only
# where its layout puts each field out of reach of user-chosen text (pb_job_text).
pb_job_data() { # JOBID
	pb_tpn="" pb_tres="" pb_nodes="" pb_sc_comment="" pb_job_how=""
	pb_scontrol=${PINBROKER_SLURM_SCONTROL-scontrol}
	if [ -z "$pb_scontrol" ] || [ "$pb_scontrol" = none ]; then
		return 0
	fi
	if pb_json=$(pb_run "$pb_scontrol" --json show job "$1" 2>/dev/null) && pb_job_json "$1"; then
		pb_job_how="$pb_scontrol --json show job"
		return 0
	fi
	if ! pb_line=$(pb_run "$pb_scontrol" show job -o "$1" 2>&1); then
		pb_log warning "$pb_scontrol show job -o $1 failed: $(printf '%s' "$pb_line" | head -n 3 | tr '\n' ' ')"
		return 0
	fi
	pb_line=$(printf '%s\n' "$pb_line" | head -n 1)
	pb_job_text
	pb_job_how="$pb_scontrol show job -o"
}

# The fields of the job JOBID in $pb_json; 1 when it is not JSON with that job (or there is no jq nor
# python3). TresPerNode and TRES lose any blank (Slurm's have none); the comment comes last, whole.
pb_job_json() { # JOBID
	if command -v jq >/dev/null 2>&1; then
		pb_out=$(printf '%s\n' "$pb_json" | jq -r --arg id "$1" '
			def str: if type == "string" then . else "" end;
			def num: if type == "object" then (if .set == false then null else .number end)
				 elif type == "number" then . else null end;
			first(.jobs[]? | select((.job_id | tostring) == $id))
			| (.tres_per_node | str | gsub("[[:space:]]"; "")), (.tres_alloc_str | str | gsub("[[:space:]]"; "")),
			  ((.node_count | num) // "" | tostring), (.comment | if type == "object" then .job else . end | str)
			' 2>/dev/null) || return 1
	elif command -v python3 >/dev/null 2>&1; then
		pb_out=$(printf '%s\n' "$pb_json" | python3 -c '
import json, sys
def s(v): return v if isinstance(v, str) else ""
def n(v):
    if isinstance(v, dict): v = v.get("number") if v.get("set", True) else None
    return str(v) if isinstance(v, int) and not isinstance(v, bool) else ""
job = next(j for j in json.load(sys.stdin).get("jobs", []) if str(j.get("job_id")) == sys.argv[1])
c = job.get("comment")
print("".join(s(job.get("tres_per_node")).split())); print("".join(s(job.get("tres_alloc_str")).split()))
print(n(job.get("node_count"))); print(s(c.get("job") if isinstance(c, dict) else c))
' "$1" 2>/dev/null) || return 1
	else
		return 1
	fi
	[ -n "$pb_out" ] || return 1
	pb_tpn=$(printf '%s\n' "$pb_out" | sed -n 1p)
	pb_tres=$(printf '%s\n' "$pb_out" | sed -n 2p)
	pb_nodes=$(printf '%s\n' "$pb_out" | sed -n 3p)
	pb_sc_comment=$(printf '%s\n' "$pb_out" | sed -n '4,$p')
	return 0
}

# The fields of a `scontrol show job -o` line ($pb_line) that user-chosen text cannot forge. Users
# choose the job name (printed before TRES= and NumNodes=), the command, paths and comment (after them,
# before Power=) and, from 23.02, MailUser= (after TresPerNode=). So TRES= and NumNodes= count only
# when the line holds exactly one (Slurm always prints the real one: with a second, neither is
# trusted), and TresPerNode= only after the last " Power=" (always printed, after every path and the
# comment) and before any " MailUser=". The exact comment (SLURM_JOB_COMMENT) is taken out first.
pb_job_text() {
	pb_l=" $pb_line "
	if [ -n "${SLURM_JOB_COMMENT:-}" ]; then
		case $pb_l in *" Comment=$SLURM_JOB_COMMENT "*)
			pb_l="${pb_l%%" Comment=$SLURM_JOB_COMMENT "*} ${pb_l#*" Comment=$SLURM_JOB_COMMENT "}"
			;;
		esac
	fi
	pb_tres=$(pb_field_once TRES "$pb_l") ||
		pb_log warning "scontrol's line holds TRES= more than once (a job name or path made to look like it): not read"
	pb_nodes=$(pb_field_once NumNodes "$pb_l") ||
		pb_log warning "scontrol's line holds NumNodes= more than once: not read"
	case $pb_l in
	*" Power="*) pb_tail=${pb_l##*" Power="} ;;
	*) pb_tail="" ;;
	esac
	pb_tail=${pb_tail%%" MailUser="*}
	pb_tpn=$(printf '%s\n' "$pb_tail" | tr ' ' '\n' | sed -n 's/^TresPerNode=//p' | head -n 1)
	pb_sc_comment=$(printf '%s\n' "$pb_line" | sed -n 's/.* Comment=//p')
}

# The value of the blank-separated word KEY=VALUE in LINE when LINE has exactly one; 1 when it has more.
pb_field_once() { # KEY LINE
	printf '%s\n' "$2" | tr ' ' '\n' | awk -v k="$1=" '
		index($0, k) == 1 { n++; v = substr($0, length(k) + 1) }
		END { if (n == 1) print v; exit (n > 1) }'
}

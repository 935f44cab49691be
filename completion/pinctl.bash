# SPDX-License-Identifier: MIT
# bash completion for pinctl: commands, each command's options (read from `pinctl CMD --help`, so
# they never drift), option values, -o's field names (from the command itself), pinctl set's reloadable keys and get's keys (from
# `pinbrokerd --config-doc`), user names for --uid, quota's subcommands and cgroup paths, and run's program. Needs nothing but bash; bash-completion's helpers are not used.

# Words of the line being completed: cur (the word under the cursor) and prev.
_pinctl_words() {
	cur=${COMP_WORDS[COMP_CWORD]}
	prev=
	((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}
}

# The --options a command's help lists: `pinctl CMD --help`.
_pinctl_options() {
	local cmd=$1 sub=$2
	"$cmd" "$sub" --help 2>/dev/null | grep -o -- '--[a-z][a-z-]*' | sort -u
}

# The fields -o takes for a table command: the list its usage error for an unknown field gives (no daemon needed).
_pinctl_fields() {
	local cmd=$1 sub=$2 args=()
	[[ $sub == quota ]] && args=(list)
	[[ $sub == get ]] && args=(budget)
	"$cmd" "$sub" "${args[@]}" -o '?' 2>&1 >/dev/null | sed -n 's/.*the fields: \([a-z0-9_,]*\).*/\1/p' | tr ',' '\n'
}

# pinbrokerd next to this pinctl, on PATH, or where cmake --install puts it.
_pinctl_daemon() {
	local d dir=${1%/*}
	[[ $dir == "$1" ]] && dir=.
	for d in "$dir/../sbin/pinbrokerd" "$dir/../daemon/pinbrokerd" "$(command -v pinbrokerd 2>/dev/null)" \
		/usr/sbin/pinbrokerd /usr/local/sbin/pinbrokerd; do
		[[ -n $d && -x $d ]] && { printf '%s\n' "$d"; return 0; }
	done
	return 1
}

# The keys pinctl set accepts: the rows of pinbrokerd's config table marked reloadable.
_pinctl_set_keys() {
	local daemon
	daemon=$(_pinctl_daemon "$1") || return 0
	"$daemon" --config-doc 2>/dev/null | sed -n 's/^| `\([a-z0-9-]*\)` | [^|]* | yes |.*/\1/p'
}

# The keys pinctl get shows: every row of the table.
_pinctl_all_keys() {
	local daemon
	daemon=$(_pinctl_daemon "$1") || return 0
	"$daemon" --config-doc 2>/dev/null | sed -n 's/^| `\([a-z0-9-]*\)` |.*/\1/p'
}

# Completions for what a word is, one per line, filtered by cur: COMPREPLY.
# cgroup paths for quota set and clear, as the daemon names them: the v1 memory controller's tree
# where the host has one, else the unified tree. PINCTL_CGROUP_ROOT names another root (a container's
# view of the host's cgroupfs, or a test's).
_pinctl_cgroups() {
	local root=${PINCTL_CGROUP_ROOT:-/sys/fs/cgroup} d want=$1
	[[ -z ${PINCTL_CGROUP_ROOT:-} && -d $root/memory ]] && root=$root/memory
	[[ $want == /* ]] || want=/$want
	COMPREPLY=()
	while IFS= read -r d; do
		COMPREPLY+=("${d#"$root"}/")
	done < <(compgen -d -- "$root$want")
	compopt -o nospace 2>/dev/null
	return 0
}

_pinctl_reply() {
	local IFS=$'\n'
	COMPREPLY=($(compgen -W "$1" -- "$cur"))
}

_pinctl() {
	local cur prev cmd=$1 sub= i w skip=0 nargs=0 run_prog=
	local commands="status leases top watch acquire revoke get set config quota jobs headroom reservations metrics run doctor help"
	_pinctl_words
	COMPREPLY=()

	# Find the command: the first word that is neither an option nor an option's value.
	for ((i = 1; i < COMP_CWORD; i++)); do
		w=${COMP_WORDS[i]}
		if ((skip)); then
			skip=0
			continue
		fi
		if [[ -z $sub ]]; then
			case $w in
			--socket) skip=1 ;;
			-*) ;;
			*) sub=$w ;;
			esac
			continue
		fi
		# Inside the command: count its arguments; run's program ends pinctl's options.
		case $w in
		--socket | --hold | --label | --priority | --wait | --uid | --deadline | --reservation | --fallback | --interval | -n | -o | --output | --format) skip=1 ;;
		--) [[ $sub == run ]] && run_prog=next ;;
		-*) ;;
		*)
			if [[ $sub == run ]]; then
				run_prog=$w
				break
			fi
			((nargs++))
			;;
		esac
	done

	case $prev in
	--socket)
		COMPREPLY=($(compgen -f -- "$cur"))
		return 0
		;;
	--priority)
		_pinctl_reply $'normal\ncritical\nbest-effort'
		return 0
		;;
	--fallback)
		_pinctl_reply $'cuda\nerror\npageable'
		return 0
		;;
	--format)
		_pinctl_reply $'text\ncsv\njson'
		return 0
		;;
	-o | --output)
		# FIELD,FIELD,...: the field after the last comma, the ones before kept.
		local pre=${cur%"${cur##*,}"} f
		COMPREPLY=()
		while IFS= read -r f; do
			[[ $f == "${cur##*,}"* ]] && COMPREPLY+=("$pre$f")
		done < <(_pinctl_fields "$cmd" "$sub")
		compopt -o nospace 2>/dev/null
		return 0
		;;
	--uid)
		COMPREPLY=($(compgen -u -- "$cur"))
		return 0
		;;
	--hold | --label | --wait | --deadline | --reservation | --interval)
		return 0
		;;
	esac

	if [[ -z $sub ]]; then
		if [[ $cur == -* ]]; then
			_pinctl_reply $'--socket\n--wait\n--version\n--help'
		else
			_pinctl_reply "${commands// /$'\n'}"
		fi
		return 0
	fi

	if [[ $sub == run && -n $run_prog ]]; then
		if [[ $run_prog == next ]]; then
			COMPREPLY=($(compgen -c -- "$cur"))
		else
			COMPREPLY=($(compgen -f -- "$cur"))
		fi
		return 0
	fi

	if [[ $cur == -* ]]; then
		_pinctl_reply "$(_pinctl_options "$cmd" "$sub")"
		return 0
	fi
	case $sub in
	help)
		((nargs == 0)) && _pinctl_reply "${commands// /$'\n'}"
		;;
	set)
		((nargs == 0)) && _pinctl_reply "$(_pinctl_set_keys "$cmd")"
		;;
	get)
		((nargs == 0)) && _pinctl_reply "$(_pinctl_all_keys "$cmd")"
		;;
	quota)
		((nargs == 0)) && _pinctl_reply $'set\nclear\nlist'
		((nargs == 1)) && [[ $prev == set || $prev == clear ]] && _pinctl_cgroups "$cur"
		;;
	run)
		COMPREPLY=($(compgen -c -- "$cur"))
		;;
	esac
	return 0
}

complete -F _pinctl pinctl

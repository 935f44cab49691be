# SPDX-License-Identifier: MIT
# bash completion for pinbrokerd: its options and every config key as --KEY, read from
# `pinbrokerd --help` (so they never drift from the config table), and the values of the keys the
# table gives as "One of: ..." or "yes or no." (from `pinbrokerd --config-doc`). Needs nothing but bash.

_pinbrokerd() {
	local cmd=$1 cur=${COMP_WORDS[COMP_CWORD]} prev= key values IFS=$'\n'
	((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}
	COMPREPLY=()

	case $prev in
	-c | --config | --proc-root | --socket)
		COMPREPLY=($(compgen -f -- "$cur"))
		return 0
		;;
	--log-level)
		COMPREPLY=($(compgen -W $'debug\ninfo\nnotice\nwarning\nerr' -- "$cur"))
		return 0
		;;
	--*)
		key=${prev#--}
		# A key whose row says "One of: a, b, c." completes to those; any other key takes free text.
		# A yes/no key says "yes or no." there.
		values=$("$cmd" --config-doc 2>/dev/null |
			sed -n -e "s/^| \`$key\` |.*One of: \\([a-z0-9, -]*\\)\\..*/\\1/p" \
				-e "s/^| \`$key\` |.* yes or no\\. |\$/yes,no/p" | tr -d ' ' | tr ',' '\n')
		if [[ -n $values ]]; then
			COMPREPLY=($(compgen -W "$values" -- "$cur"))
			return 0
		fi
		if "$cmd" --help 2>/dev/null | sed -n '/^Every config key/,$p' | grep -q -- "^ *--$key "; then
			return 0 # a key's value: nothing to offer
		fi
		;;
	esac
	if [[ $cur == -* || -z $cur ]]; then
		COMPREPLY=($(compgen -W "$("$cmd" --help 2>/dev/null | grep -o -- '--[a-z][a-z0-9-]*' | sort -u)" -- "$cur"))
	fi
	return 0
}

complete -F _pinbrokerd pinbrokerd

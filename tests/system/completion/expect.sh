# SPDX-License-Identifier: MIT
# Sourced (bash) by run-completion.sh and run-completion-zsh.sh: the three checks both make of what a
# completion offers. The caller defines comp LINE... (the offers for LINE, sorted, on one line), fail MSG,
# and COMP_FIRST: the first argument of LINE that names the line in messages (2 skips a function name).

# expect WANT LINE...: the offers are exactly WANT.
expect() {
	local want=$1 got
	shift
	got=$(comp "$@")
	[[ $got == "$want" ]] || fail "completing '${*:COMP_FIRST}': want '$want', got '$got'"
}
# contains WORD LINE...: WORD is among the offers.
contains() {
	local want=$1 got
	shift
	got=$(comp "$@")
	[[ " $got " == *" $want "* ]] || fail "completing '${*:COMP_FIRST}': '$want' not among '$got'"
}
# lacks WORD LINE...: WORD is not among the offers.
lacks() {
	local unwanted=$1 got
	shift
	got=$(comp "$@")
	[[ " $got " != *" $unwanted "* ]] || fail "completing '${*:COMP_FIRST}': '$unwanted' should not be among '$got'"
}

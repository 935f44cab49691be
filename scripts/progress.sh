# SPDX-License-Identifier: MIT
# Sourced by scripts/deps.sh, demo.sh and test.sh: one line per phase with the time since the first script
# started, and a line at least every PB_HEARTBEAT_S seconds while a quiet phase (an apt install, a build)
# runs, so a newcomer never watches a silent terminal wondering whether it hangs.
# PB_T0 is exported: deps.sh, run by demo.sh or test.sh, counts from the same start.
: "${PB_T0:=$(date +%s)}"
export PB_T0
: "${PB_HEARTBEAT_S:=15}"

# say MSG...: "[  12s] MSG"
say() {
	printf '[%4ds] %s\n' "$(($(date +%s) - PB_T0))" "$*"
}

# quietly LABEL LOG CMD...: run CMD with its output in LOG, saying "LABEL..." at the start, LOG's last line every
# PB_HEARTBEAT_S seconds meanwhile, and "LABEL: done" at the end. On failure it prints LOG's last 60 lines and
# returns CMD's status.
quietly() {
	_q_label=$1
	_q_log=$2
	shift 2
	say "$_q_label..."
	"$@" >"$_q_log" 2>&1 &
	_q_pid=$!
	_q_n=0
	while kill -0 "$_q_pid" 2>/dev/null; do
		sleep 1
		_q_n=$((_q_n + 1))
		if [ $((_q_n % PB_HEARTBEAT_S)) = 0 ] && kill -0 "$_q_pid" 2>/dev/null; then
			_q_last=$(tail -n 1 "$_q_log" 2>/dev/null | tr -d '\r' | cut -c1-100)
			say "$_q_label: still running${_q_last:+ ($_q_last)}"
		fi
	done
	_q_rc=0
	wait "$_q_pid" || _q_rc=$?
	if [ "$_q_rc" = 0 ]; then
		say "$_q_label: done"
	else
		say "$_q_label: FAILED (exit $_q_rc); the last lines of $_q_log:"
		tail -n 60 "$_q_log" | sed 's/^/    /'
	fi
	return "$_q_rc"
}

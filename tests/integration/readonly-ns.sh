# SPDX-License-Identifier: MIT
# Sourced by run-classes-skip.sh and run-reserve-readonly.sh: a command run where a folder is read-only, as a
# container's /proc/sys is. ro_ns_require skips (77) unless this is root with unshare; ro_ns_run DIR CMD [ARG...]
# runs CMD in a mount namespace of its own whose DIR is bound read-only, prints its output and leaves it in out, its
# exit status in rc, and skips where this host cannot make such a namespace. ro_ns_expect RC HAS LACKS OK FAIL: the
# verdict, exit 0 saying OK where it exited RC with output matching HAS and not LACKS (grep patterns), else 1.
ro_ns_require() {
	[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (unshare -m and a read-only bind mount)"; exit 77; }
	command -v unshare >/dev/null || { echo "SKIP: unshare not found (apt-get install util-linux)"; exit 77; }
}

ro_ns_run() {
	out=$(unshare -m sh -c '
		mount --make-rprivate / 2>/dev/null
		mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" || exit 99
		exec "$@"' "$@" 2>&1)
	rc=$?
	echo "$out"
	[ $rc = 99 ] && { echo "SKIP: cannot bind $1 read-only in a mount namespace here"; exit 77; }
}

ro_ns_expect() {
	if [ "$rc" = "$1" ] && echo "$out" | grep -q "$2" && ! echo "$out" | grep -q "$3"; then
		echo "ok: $4"
		exit 0
	fi
	echo "FAIL: $5"
	exit 1
}

#!/bin/sh
# SPDX-License-Identifier: MIT
# pinbrokerd --reserve-hugepages where nr_hugepages is read-only (issue 41): a container's /proc/sys, or a unit
# whose sandbox left the file out. It said "(run as root)" to root. Runs it on a fixture proc root whose sys/
# is bound read-only in a mount namespace of its own, and checks it fails saying the file is read-only and what
# to do, not to run as root.
# usage: run-reserve-readonly.sh PINBROKERD
# Exits 0 when the message is right, 1 when not, 77 (skip) where this host cannot make such a namespace.
set -u
BIN=$1
. "$(dirname "$0")/readonly-ns.sh"
ro_ns_require
root=$(mktemp -d /tmp/pb-hp-ro.XXXXXX)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/proc/sys/vm"
printf 'MemTotal: 16777216 kB\nMemFree: 8388608 kB\nMemAvailable: 12582912 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\nHugePages_Total: 0\nHugePages_Free: 0\nHugepagesize: 2048 kB\n' \
	>"$root/proc/meminfo"
echo 0 >"$root/proc/sys/vm/nr_hugepages"
ro_ns_run "$root/proc/sys" "$BIN" --config /dev/null --proc-root "$root" --budget 8M --prewarm 0 --reserve-hugepages
ro_ns_expect 1 'nr_hugepages: Read-only file system (it is read-only here: .*ReadWritePaths=' 'run as root' \
	"a read-only nr_hugepages is reported as read-only, with what to do, not as a matter of root" \
	"--reserve-hugepages on a read-only nr_hugepages should exit 1 (got $rc) saying it is read-only and \
naming ReadWritePaths=, not 'run as root'"

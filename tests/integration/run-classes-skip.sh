#!/bin/sh
# SPDX-License-Identifier: MIT
# check_itest_classes's skip reason where root cannot write /proc/sys/vm/nr_hugepages (issue 41): in a
# container /proc/sys is mounted read-only, and the suite said it "needs root" to a root user. Runs the suite
# with no tcase selected (CK_RUN_CASE names none, so only its choice of what to leave out runs) in a mount
# namespace of its own whose /proc/sys is read-only, and checks the SKIPPED line names the read-only file.
# usage: run-classes-skip.sh CHECK_ITEST_CLASSES
# Exits 0 when the reason is right, 1 when not, 77 (skip) where this host cannot make such a namespace.
set -u
BIN=$1
. "$(dirname "$0")/readonly-ns.sh"
ro_ns_require
ro_ns_run /proc/sys env CK_RUN_CASE=no-such-case "$BIN"
ro_ns_expect 77 'SKIPPED: .*nr_hugepages, which is read-only here although this runs as root' 'needs root' \
	"as root with a read-only /proc/sys, the skip says the file is read-only, not that it needs root" \
	"as root with a read-only /proc/sys, check_itest_classes should skip (exit 77, got $rc) saying \
/proc/sys/vm/nr_hugepages is read-only, not that it needs root"

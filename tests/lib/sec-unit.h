/* SPDX-License-Identifier: MIT */
/* For the security suites that run the daemon as the packaged unit does: its own uid, its capabilities, its /proc. */
#pragma once

#define _GNU_SOURCE
#include <grp.h>
#include <linux/capability.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The daemon's own uid where a suite runs it as the unit's User=pinbroker: neither of the clients'. */
#define SEC_UID_DAEMON 61003

/* The unit's capabilities (systemd/pinbrokerd.service) this host has: the pool's mlock and the signals, and
 * since issue 38 CAP_SYS_PTRACE for other uids' /proc/PID/maps and fdinfo. Not CAP_SYS_RESOURCE, which the
 * tests need not (the daemon falls back to 2 s PSI windows) and a container's bounding set may lack. */
#define SEC_UNIT_CAPS_OLD ((1ull << CAP_IPC_LOCK) | (1ull << CAP_KILL))
#define SEC_UNIT_CAPS (SEC_UNIT_CAPS_OLD | (1ull << CAP_SYS_PTRACE))

/* How sec_as_unit_user runs the daemon: /proc's hidepid= (ProtectProc=: "invisible", "off") and its capabilities. */
struct sec_unit {
	const char *hidepid;
	uint64_t caps;
};

/*
 * daemon_restart_with's child_setup (ud: a struct sec_unit): the daemon as the unit runs it, in a mount
 * namespace of its own with /proc mounted as ProtectProc= mounts it, then as SEC_UID_DAEMON with the unit's
 * capabilities as ambient ones (AmbientCapabilities=). The daemon's dir must be SEC_UID_DAEMON's. _exit(91..95).
 */
static inline void sec_as_unit_user(void *ud)
{
	const struct sec_unit *u = ud;
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = { { 0 } };
	char opts[64];

	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		_exit(91);
	snprintf(opts, sizeof(opts), "hidepid=%s", u->hidepid);
	if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts) < 0)
		_exit(92);
	if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0 || setgroups(0, NULL) < 0 ||
	    setresgid(SEC_UID_DAEMON, SEC_UID_DAEMON, SEC_UID_DAEMON) < 0 ||
	    setresuid(SEC_UID_DAEMON, SEC_UID_DAEMON, SEC_UID_DAEMON) < 0)
		_exit(93);
	for (int c = 0; c < 64; c++)
		if (u->caps & (1ull << c)) {
			data[c / 32].effective |= 1u << (c % 32);
			data[c / 32].permitted |= 1u << (c % 32);
			data[c / 32].inheritable |= 1u << (c % 32);
		}
	if (syscall(SYS_capset, &h, data) < 0)
		_exit(94);
	for (int c = 0; c < 64; c++)
		if ((u->caps & (1ull << c)) && prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, c, 0, 0) < 0)
			_exit(95);
}

/* SPDX-License-Identifier: MIT */
/*
 * Shared by the restart suites (check_sec_17_restart_books, check_sec_30_planted_memfd, check_sec_31_crash_blind):
 * a daemon started again over what an earlier one lent, asked what it counts and what it still lends to a uid.
 */
#pragma once

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pinbroker.h"
#include "sec.h"

/*
 * As uid, in a child, ask sock for bytes once, without waiting: 0 lent, 1 refused for want of budget (-ENOSPC),
 * 2 refused otherwise, 100 when it cannot connect (said on stderr).
 */
static inline int sec_try_acquire_as(const char *sock, uid_t uid, uint64_t bytes)
{
	pid_t pid = itest_fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
		pb_client *c;
		pb_lease *l;
		int r;

		sec_drop_to(uid);
		if (pb_connect(sock, &c) < 0) {
			fprintf(stderr, "uid %u cannot connect: %s\n", (unsigned)uid, pb_last_error());
			_exit(100);
		}
		r = pb_acquire(c, bytes, &o, &l);
		_exit(r == 0 ? 0 : r == -ENOSPC ? 1 : 2);
	}
	return itest_wait_exit(pid);
}

/* The bytes the daemon on sock counts as orphaned (lent by an earlier daemon, still held), as STATUS says. */
static inline int64_t sec_orphaned(const char *sock)
{
	struct pb_status *s = itest_status(sock);
	int64_t v = (int64_t)s->orphaned_bytes;

	pb_status_free(s);
	return v;
}

/* This boot's id, the kernel's, as a state file's "boot" line carries it, into buf (len of 37 or more). */
static inline void sec_boot_id(char *buf, size_t len)
{
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");

	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(buf, (int)len, f));
	fclose(f);
	buf[strcspn(buf, "\n")] = '\0';
}

/* Stop the daemon d and reap it: a crash (kill -9, nothing written), or a clean stop (SIGTERM) that must exit 0. */
static inline void sec_stop_for_restart(struct daemon *d, bool kill9)
{
	int st = 0;

	kill(d->pid, kill9 ? SIGKILL : SIGTERM);
	ck_assert_int_eq(waitpid(d->pid, &st, 0), d->pid);
	if (!kill9)
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the daemon did not stop cleanly");
}

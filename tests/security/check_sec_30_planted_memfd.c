/* SPDX-License-Identifier: MIT */
/* Issue 38 finding 5: memfds another uid names like the daemon's chunks take no budget after a restart, and an admin can drop a bogus orphan. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pinbroker.h"
#include "sec.h"
#include "sec_restart.h"

#define MiB (1024ull * 1024ull)
/* The 512 MiB memfd against a 512 MiB budget, scaled: B plants the whole budget. */
#define BUDGET_BYTES (64 * MiB)
#define A_WANTS (32 * MiB)

static const char *const args[] = { "--budget", "64M", "--uid-quota", "64M", "--prewarm", "8M", NULL };

/* The daemon's chunk name for socket path sock: "pinbroker-chunk." and the FNV-1a hash of the path. */
static void chunk_name(const char *sock, char *buf, size_t len)
{
	uint32_t h = 2166136261u;

	for (const unsigned char *p = (const unsigned char *)sock; *p; p++)
		h = (h ^ *p) * 16777619u;
	snprintf(buf, len, "pinbroker-chunk.%08x", h);
}

/* Uid B: a memfd of the daemon's chunk name, the whole budget, filled (fallocate) and mapped, held until told. */
static pid_t plant(const char *sock, int to[2], int from[2])
{
	pid_t p = itest_fork_piped(to, from);

	if (p == 0) {
		char name[64];
		void *m;
		int fd;

		itest_child_ends(to, from);
		sec_drop_to(SEC_UID_B);
		chunk_name(sock, name, sizeof(name));
		fd = memfd_create(name, MFD_CLOEXEC);
		if (fd < 0 || ftruncate(fd, (off_t)BUDGET_BYTES) < 0 || fallocate(fd, 0, 0, (off_t)BUDGET_BYTES) < 0)
			_exit(10);
		m = mmap(NULL, BUDGET_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED)
			_exit(11);
		itest_say(from[1], 'p');
		itest_hear(to[0], 120);
		_exit(0);
	}
	itest_parent_ends(to, from);
	ck_assert_msg(itest_hear(from[0], 60) == 'p', "uid B could not plant its memfd");
	return p;
}

static void planted(bool kill9)
{
	int to[2], from[2];
	struct daemon d;
	pid_t b;

	daemon_start(&d, args);
	b = plant(d.socket, to, from);
	sec_stop_for_restart(&d, kill9);
	daemon_restart(&d, args);
	/* B's memory was never lent by the daemon: it is not orphaned, and A gets what the budget has. */
	ck_assert_int_eq(sec_orphaned(d.socket), 0);
	ck_assert_int_eq(status_leased(d.socket), 0);
	ck_assert_int_eq(sec_try_acquire_as(d.socket, SEC_UID_A, A_WANTS), 0);
	ck_assert_int_eq(sec_try_acquire_as(d.socket, SEC_UID_A, BUDGET_BYTES), 0);
	itest_say(to[1], 'q');
	ck_assert_int_eq(itest_wait_exit(b), 0);
	close(to[1]);
	close(from[0]);
	ck_assert_int_eq(daemon_stop(&d), 0);
}

START_TEST(test_planted_memfd_after_sigterm_takes_no_budget)
{
	planted(false);
}
END_TEST

START_TEST(test_planted_memfd_after_kill_9_takes_no_budget)
{
	planted(true);
}
END_TEST

/*
 * An orphan the daemon cannot disprove (a state line naming uid B's live process, as one from an older daemon
 * would) stays counted; an admin drops it with `pinctl revoke --orphans`, B cannot.
 */
START_TEST(test_admin_drops_a_bogus_orphan)
{
	char state[400], boot[64] = "", *out = NULL;
	int to[2], from[2];
	struct daemon d;
	FILE *f;
	pid_t b;

	daemon_prepare(&d);
	b = plant(d.socket, to, from);
	sec_boot_id(boot, sizeof(boot));
	snprintf(state, sizeof(state), "%s.state", d.socket);
	f = fopen(state, "we");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "pinbroker-restart 1\nboot %s\no 7 %u %llu p%d k\nend\n", boot, (unsigned)SEC_UID_B,
		(unsigned long long)BUDGET_BYTES, (int)b);
	ck_assert_int_eq(fclose(f), 0);
	daemon_restart(&d, args);
	ck_assert_int_eq(sec_orphaned(d.socket), (int64_t)BUDGET_BYTES);
	ck_assert_int_eq(sec_try_acquire_as(d.socket, SEC_UID_A, A_WANTS), 1);
	/* B may not drop it (it would lend what may be pinned), root may. */
	ck_assert_int_ne(pinctl_as(&d, SEC_UID_B, &out, "revoke --orphans --all"), 0);
	free(out);
	ck_assert_int_eq(sec_orphaned(d.socket), (int64_t)BUDGET_BYTES);
	itest_pinctl_says(&d, 0, "revoke --orphans --uid 61002", "dropped 1 orphan", NULL);
	ck_assert_int_eq(sec_orphaned(d.socket), 0);
	ck_assert_int_eq(status_leased(d.socket), 0);
	ck_assert_int_eq(sec_try_acquire_as(d.socket, SEC_UID_A, A_WANTS), 0);
	ck_assert(daemon_wait_log(&d, "dropped by an admin", 5000));
	itest_say(to[1], 'q');
	ck_assert_int_eq(itest_wait_exit(b), 0);
	close(to[1]);
	close(from[0]);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

CHECK_SUITE(suite, "sec-30-planted-memfd", "memfds of the chunk name", NULL, NULL, 120,
	    test_planted_memfd_after_sigterm_takes_no_budget, test_planted_memfd_after_kill_9_takes_no_budget,
	    test_admin_drops_a_bogus_orphan)

SEC_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/* Issue 22 finding 7: a daemon stopped and started again, without systemd, still counts what a live holder maps. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pinbroker.h"
#include "sec.h"
#include "sec_restart.h"

#define MiB (1024ull * 1024ull)
/* The 128 MiB holder on a 512 MiB budget, scaled to the test's size: half the budget stays mapped. */
#define BUDGET_BYTES (64 * MiB)
#define HOLD_BYTES (32 * MiB)
/* orphan-rescan-ms is 2 s by default: a freed holder must be seen within a few checks. */
#define FREED_WITHIN_MS 20000

static const char *const args[] = { "--budget", "64M", "--uid-quota", "64M", "--prewarm", "8M", NULL };

enum stop_how {
	STOP_CLEAN,    /* SIGTERM: the restart state file is written */
	STOP_KILL,     /* kill -9: no file, no fd store */
	STOP_NO_STATE, /* SIGTERM, then the file is removed */
	STOP_DAMAGED,  /* SIGTERM, then the file is garbage */
};

/*
 * Set by a case before the holder forks: once it has its lease, the holder
 * makes a second mapping of the lease's first chunk, PROT_NONE, 1 TiB long
 * (mremap with old size 0 duplicates a shared mapping), so /proc shows a
 * mapping that ends far past the memfd's end (issue 22 finding 7, review 1).
 */
static bool stretch;
#define STRETCH_BYTES (1ull << 40)

/* uid A: one lease of HOLD_BYTES, written, kept mapped until told to go; then it exits without a word. */
static void holder(const char *sock, int to_test, int from_test)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
	pb_client *c;
	pb_lease *l;

	sec_drop_to(SEC_UID_A);
	if (pb_connect(sock, &c) < 0)
		_exit(10);
	if (pb_acquire(c, HOLD_BYTES, &o, &l) < 0)
		_exit(11);
	memset(pb_lease_data(l), 'A', HOLD_BYTES);
	if (stretch) {
		void *p = mremap(pb_lease_data(l), 0, STRETCH_BYTES, MREMAP_MAYMOVE);

		if (p == MAP_FAILED || mprotect(p, STRETCH_BYTES, PROT_NONE) < 0)
			_exit(13);
	}
	itest_say(to_test, 'h');
	itest_hear(from_test, 120);
	/* Still 'A' after the restart: nobody was lent these pages. */
	for (size_t i = 0; i < HOLD_BYTES; i += 4096)
		if (((const char *)pb_lease_data(l))[i] != 'A')
			_exit(12);
	_exit(0);
}

/*
 * A daemon d with the suite's args, and a holder child holding its lease (it said 'h' on to_test[0]); the pipes'
 * other ends are the child's. Returns the holder's pid.
 */
static pid_t start_with_holder(struct daemon *d, int to_test[2], int from_test[2])
{
	pid_t h;

	daemon_start(d, args);
	h = itest_fork_piped(to_test, from_test);
	if (h == 0) {
		close(to_test[0]);
		close(from_test[1]);
		holder(d->socket, to_test[1], from_test[0]);
	}
	close(to_test[1]);
	close(from_test[0]);
	ck_assert_msg(itest_hear(to_test[0], 120) == 'h', "the holder did not get its lease");
	return h;
}

/* The end of start_with_holder's case: the holder told to quit exits 0, its lease is freed, the daemon stops cleanly. */
static void end_with_holder(struct daemon *d, pid_t h, int to_test[2], int from_test[2])
{
	itest_say(from_test[1], 'q');
	ck_assert_int_eq(itest_wait_exit(h), 0);
	ck_assert_int_eq(wait_leased(d->socket, 0, FREED_WITHIN_MS), 0);
	close(to_test[0]);
	close(from_test[1]);
	ck_assert_int_eq(daemon_stop(d), 0);
}

/* VmLck of pid, in bytes (what its mlock holds). */
static uint64_t vm_locked(pid_t pid)
{
	long kb = sec_proc_status(pid, "VmLck");

	return kb > 0 ? (uint64_t)kb * 1024 : 0;
}

static void scenario(enum stop_how how)
{
	char state[400], *log;
	struct daemon d;
	int to_test[2], from_test[2];
	uint64_t rss_before, rss_after, lck_before, lck_after;
	struct pb_status *s;
	pid_t h;

	h = start_with_holder(&d, to_test, from_test);

	ck_assert_int_eq(status_leased(d.socket), (int64_t)HOLD_BYTES);
	rss_before = sec_chunk_rss(h);
	lck_before = vm_locked(d.pid);
	ck_assert_uint_eq(rss_before, HOLD_BYTES);
	/* The lent chunks are the daemon's locked memory while it runs. ASan makes mlock a no-op (it would lock
	 * the shadow too), so under it there is nothing locked to compare (as check_itest_hardening). */
#if !defined(__SANITIZE_ADDRESS__)
	ck_assert_uint_ge(lck_before, HOLD_BYTES);
#endif

	snprintf(state, sizeof(state), "%s.state", d.socket);
	sec_stop_for_restart(&d, how == STOP_KILL);
	if (how == STOP_NO_STATE)
		unlink(state);
	if (how == STOP_DAMAGED) {
		FILE *f = fopen(state, "we");

		ck_assert_ptr_nonnull(f);
		/* A torn line whose chunks do not add up, and no "end". */
		fputs("pinbroker-restart 1\nboot\no 1 61001 99999999999 p1 k0:1:5:7\n", f);
		fclose(f);
	}
	daemon_restart(&d, args);

	/* The holder still maps its pages: the new daemon counts them, as the issue requires. */
	ck_assert_uint_eq(sec_chunk_rss(h), HOLD_BYTES);
	ck_assert_int_eq(status_leased(d.socket), (int64_t)HOLD_BYTES);
	ck_assert_int_eq(sec_orphaned(d.socket), (int64_t)HOLD_BYTES);
	/* The over-grant: what would put the host over budget is refused, to another uid and to A. */
	ck_assert_int_eq(sec_try_acquire_as(d.socket, SEC_UID_B, BUDGET_BYTES - HOLD_BYTES + 16 * MiB), 1);
	ck_assert_int_eq(sec_try_acquire_as(d.socket, SEC_UID_A, BUDGET_BYTES - HOLD_BYTES + 2 * MiB), 1);
	/* What is left is still lent (B's process exits and gives it back). */
	ck_assert_int_eq(sec_try_acquire_as(d.socket, SEC_UID_B, BUDGET_BYTES - HOLD_BYTES), 0);
	ck_assert_int_eq(wait_leased(d.socket, HOLD_BYTES, 10000), (int64_t)HOLD_BYTES);
	/* Locked by the new daemon plus what the holder keeps mapped: within the budget. */
	s = itest_status(d.socket);
	rss_after = sec_chunk_rss(h);
	lck_after = vm_locked(d.pid);
	ck_assert_msg(s->pool_bytes + rss_after <= BUDGET_BYTES,
		      "pool %llu + held %llu bytes over the %llu budget (daemon VmLck %llu, before the restart %llu)",
		      (unsigned long long)s->pool_bytes, (unsigned long long)rss_after,
		      (unsigned long long)BUDGET_BYTES, (unsigned long long)lck_after, (unsigned long long)lck_before);
	pb_status_free(s);

	log = daemon_log(&d);
	if (how == STOP_DAMAGED)
		ck_assert_msg(strstr(log, "is damaged") != NULL, "no warning about the damaged state file:\n%s", log);
	ck_assert_msg(strstr(log, "counted as orphaned") != NULL, "no log line about orphaned memory:\n%s", log);
	free(log);

	/* The holder lets go (exits): the bytes come back within a bounded poll, and can be lent again. */
	itest_say(from_test[1], 'q');
	ck_assert_int_eq(itest_wait_exit(h), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, FREED_WITHIN_MS), 0);
	ck_assert_int_eq(sec_orphaned(d.socket), 0);
	ck_assert_int_eq(sec_try_acquire_as(d.socket, SEC_UID_B, BUDGET_BYTES - 16 * MiB), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 10000), 0);
	close(to_test[0]);
	close(from_test[1]);
	ck_assert_int_eq(daemon_stop(&d), 0);
}

/* A holder that stretches a mapping of its lease cannot make the next daemon forget (or inflate) it. */
START_TEST(test_stretched_mapping_neither_inflates_nor_drops_a_named_lease)
{
	stretch = true;
	scenario(STOP_CLEAN);
}
END_TEST

/* The same without a state file: the memfd's size counts, not where a mapping of it ends. */
START_TEST(test_stretched_mapping_neither_inflates_nor_drops_a_lease_found_by_name)
{
	stretch = true;
	scenario(STOP_KILL);
}
END_TEST

/*
 * The release before chunks carried their socket's tag named them plain
 * "pinbroker-chunk": the daemon that replaces it (no state file) still counts
 * them while a live process maps them.
 */
/* The packaged unit's environment (RuntimeDirectory=): only there is the untagged name looked for. */
static void as_unit(void *ud)
{
	setenv("RUNTIME_DIRECTORY", ud, 1);
}

static void legacy_case(uint64_t size, uint64_t touched, int64_t want)
{
	struct daemon d;
	int to_test[2], from_test[2];
	pid_t h;

	h = itest_fork_piped(to_test, from_test);
	if (h == 0) {
		int fd;
		char *p;

		close(to_test[0]);
		close(from_test[1]);
		/* Made by root, as the old daemon made its chunks (a memfd another uid made is not ours), held by A. */
		fd = memfd_create("pinbroker-chunk", MFD_CLOEXEC);
		if (fd < 0 || ftruncate(fd, (off_t)size) < 0)
			_exit(20);
		sec_drop_to(SEC_UID_A);
		p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED)
			_exit(21);
		close(fd);
		memset(p, 'A', touched);
		itest_say(to_test[1], 'h');
		itest_hear(from_test[0], 120);
		_exit(0);
	}
	close(to_test[1]);
	close(from_test[0]);
	ck_assert_msg(itest_hear(to_test[0], 120) == 'h', "the legacy holder did not map its memfd");
	daemon_prepare(&d);
	daemon_restart_with(&d, args, as_unit, d.dir);
	ck_assert_int_eq(sec_orphaned(d.socket), want);
	ck_assert_int_eq(status_leased(d.socket), want);
	/* Past what is left (the budget less what it counts) but within the budget: refused for room. */
	ck_assert_int_eq(sec_try_acquire_as(d.socket, SEC_UID_B, BUDGET_BYTES - (uint64_t)want + 2 * MiB), 1);
	end_with_holder(&d, h, to_test, from_test);
}

START_TEST(test_legacy_chunk_name_is_counted_without_a_state_file)
{
	legacy_case(HOLD_BYTES, HOLD_BYTES, (int64_t)HOLD_BYTES);
}
END_TEST

/*
 * Found by name alone (no state file), a memfd counts for the pages it has,
 * not the size it was ftruncated to: 48 MiB of which 4 MiB were written is
 * 4 MiB, so a process cannot hold the budget with pages it never made.
 */
START_TEST(test_a_sparse_memfd_found_by_name_counts_its_pages)
{
	legacy_case(48 * MiB, 4 * MiB, (int64_t)(4 * MiB));
}
END_TEST

START_TEST(test_clean_stop_keeps_a_live_holder_counted)
{
	scenario(STOP_CLEAN);
}
END_TEST

START_TEST(test_kill_9_without_fd_store_keeps_a_live_holder_counted)
{
	scenario(STOP_KILL);
}
END_TEST

START_TEST(test_clean_stop_without_state_file_counts_by_memfd_name)
{
	scenario(STOP_NO_STATE);
}
END_TEST

START_TEST(test_damaged_state_file_is_ignored_and_the_holder_still_counted)
{
	scenario(STOP_DAMAGED);
}
END_TEST

/* Two restarts in a row, the holder alive through both: the second daemon still counts it. */
START_TEST(test_two_clean_restarts_keep_counting)
{
	struct daemon d;
	int to_test[2], from_test[2];
	pid_t h;

	h = start_with_holder(&d, to_test, from_test);
	for (int round = 0; round < 2; round++) {
		sec_stop_for_restart(&d, false);
		daemon_restart(&d, args);
		ck_assert_int_eq(status_leased(d.socket), (int64_t)HOLD_BYTES);
		ck_assert_int_eq(sec_try_acquire_as(d.socket, SEC_UID_B, BUDGET_BYTES - HOLD_BYTES + 16 * MiB), 1);
	}
	end_with_holder(&d, h, to_test, from_test);
}
END_TEST

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/*
 * Review finding 3: while an orphan lives, the new daemon must not pay a full
 * pass over /proc every orphan-rescan-ms for as long as its holder keeps it.
 * At 100 ms for 3.2 s, a scan per tick is 30 or more; backing off (doubling
 * while nothing is let go) is 6. The holder's exit still frees it promptly.
 */
START_TEST(test_rescans_back_off_while_nothing_is_let_go)
{
	static const char *const fast[] = { "--budget",           "64M", "--uid-quota", "64M",   "--prewarm", "8M",
					    "--orphan-rescan-ms", "100", "--log-level", "debug", NULL };
	struct daemon d;
	int to_test[2], from_test[2];
	uint64_t t0;
	size_t scans;
	char *log;
	pid_t h;

	h = start_with_holder(&d, to_test, from_test);
	sec_stop_for_restart(&d, false);
	daemon_restart(&d, fast);
	ck_assert_int_eq(sec_orphaned(d.socket), (int64_t)HOLD_BYTES);
	/* A window of time is what is measured here: the scans the daemon made in it. */
	t0 = mono_ms();
	while (mono_ms() - t0 < 3200) {
		ck_assert(daemon_alive(&d));
		usleep(50 * 1000);
	}
	log = daemon_log(&d);
	scans = sec_count(log, "restart: /proc scan for memfds");
	ck_assert_msg(scans >= 2 && scans <= 12, "%zu scans of /proc in 3.2 s at orphan-rescan-ms 100", scans);
	free(log);
	ck_assert_int_eq(sec_orphaned(d.socket), (int64_t)HOLD_BYTES);
	end_with_holder(&d, h, to_test, from_test);
}
END_TEST

static void low_nofile(void *ud)
{
	struct rlimit rl = { 128, 128 };

	(void)ud;
	setrlimit(RLIMIT_NOFILE, &rl);
}

#define NAMED_LINES 300

/*
 * Review finding 2: a state file naming more processes than the daemon has
 * fds for. A pid whose pidfd cannot be opened (EMFILE, or past the daemon's
 * bound) is still running, so what it holds stays counted; it goes when the
 * process exits. Each line here is a registration (no memfds): held by its
 * pid alone, so nothing but the pid check keeps it.
 */
/*
 * A state file at path, of this boot, whose nlines lines each name a registration (no memfds, 4096 bytes) of
 * uid A held by pid.
 */
static void write_state(const char *path, pid_t pid, int nlines)
{
	char boot[64] = "";
	FILE *f;

	sec_boot_id(boot, sizeof(boot));
	f = fopen(path, "we");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "pinbroker-restart 1\nboot %s\n", boot);
	for (int i = 1; i <= nlines; i++)
		fprintf(f, "o %d %u 4096 p%d k\n", i, (unsigned)SEC_UID_A, (int)pid);
	fputs("end\n", f);
	ck_assert_int_eq(fclose(f), 0);
}

/* A child that waits in pause() until killed. */
static pid_t fork_sleeper(void)
{
	pid_t p = itest_fork();

	ck_assert_int_ge(p, 0);
	if (p == 0) {
		for (;;)
			pause();
	}
	return p;
}

START_TEST(test_pids_without_a_pidfd_still_hold)
{
	struct daemon d;
	char state[400];
	pid_t sleeper;

	daemon_prepare(&d);
	sleeper = fork_sleeper();
	snprintf(state, sizeof(state), "%s.state", d.socket);
	write_state(state, sleeper, NAMED_LINES);
	daemon_restart_with(&d, args, low_nofile, NULL);
	ck_assert_int_eq(sec_orphaned(d.socket), (int64_t)NAMED_LINES * 4096);
	kill(sleeper, SIGKILL);
	ck_assert_int_eq(waitpid(sleeper, NULL, 0), sleeper);
	ck_assert_int_eq(wait_leased(d.socket, 0, FREED_WITHIN_MS), 0);
	ck_assert_int_eq(sec_orphaned(d.socket), 0);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/*
 * Where a tenant may write the state file's folder (a sticky /tmp holding the socket) and fs.protected_hardlinks
 * is 0, it can hard-link a root-owned file to the state file's name: a regular file of the daemon's uid, mode
 * 0600, as the daemon writes it. Another daemon's state linked there would have this one hold what that one
 * lent; a file with a second name is not one this daemon wrote (it renames a new file in), so it is ignored, as
 * the quota rules file is. (Root makes the link here, as protected_hardlinks=0 lets anyone.)
 */
START_TEST(test_a_hard_linked_state_file_is_ignored)
{
	char state[400], other[400];
	struct daemon d;
	pid_t sleeper;
	char *log;

	daemon_prepare(&d);
	sleeper = fork_sleeper();
	snprintf(state, sizeof(state), "%s.state", d.socket);
	snprintf(other, sizeof(other), "%s/other.state", d.dir);
	write_state(other, sleeper, 4);
	ck_assert_int_eq(link(other, state), 0);
	daemon_restart(&d, args);
	ck_assert_int_eq(sec_orphaned(d.socket), 0);
	ck_assert_int_eq(status_leased(d.socket), 0);
	ck_assert_msg(daemon_wait_log(&d, "ignoring the restart state", 5000), "no warning:\n%s",
		      itest_tail(daemon_log(&d)));
	log = daemon_log(&d);
	ck_assert_msg(strstr(log, "hard links") != NULL, "the warning does not say why:\n%s", log);
	free(log);
	kill(sleeper, SIGKILL);
	ck_assert_int_eq(waitpid(sleeper, NULL, 0), sleeper);
	unlink(other);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

CHECK_SUITE(suite, "sec-17-restart-books", "restart without systemd", NULL, NULL, 120,
	    test_clean_stop_keeps_a_live_holder_counted, test_kill_9_without_fd_store_keeps_a_live_holder_counted,
	    test_clean_stop_without_state_file_counts_by_memfd_name,
	    test_damaged_state_file_is_ignored_and_the_holder_still_counted, test_two_clean_restarts_keep_counting,
	    test_stretched_mapping_neither_inflates_nor_drops_a_named_lease,
	    test_stretched_mapping_neither_inflates_nor_drops_a_lease_found_by_name,
	    test_legacy_chunk_name_is_counted_without_a_state_file, test_a_sparse_memfd_found_by_name_counts_its_pages,
	    test_rescans_back_off_while_nothing_is_let_go, test_pids_without_a_pidfd_still_hold,
	    test_a_hard_linked_state_file_is_ignored)

SEC_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/* Issue 38 finding 6: the orphan rescans after a restart read only the uids that own an orphan (by /proc/PID/status), in slices, each memfd stat'ed once. */
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
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pinbroker.h"
#include "sec.h"

/* Uids no other suite uses, so that processes of other tests running beside this one are not counted. */
#define UID_HOLDER 61011   /* holds a lease across the restart, and maps the chunk name many times */
#define UID_STRANGER 61012 /* owns nothing, maps the chunk name many times */
#define MAPPERS 4
#define MAPS_EACH 8000
#define MEMFD_BYTES 8192
#define MiB (1024ull * 1024ull)

static const char *const args[] = { "--budget", "64M", "--uid-quota", "64M", "--prewarm", "8M", NULL };
static const char *const again[] = {
	"--budget",           "64M", "--uid-quota", "64M",   "--prewarm", "8M", "--orphan-rescan-ms", "100",
	"--enforce-slice-us", "100", "--log-level", "debug", NULL
};

static void chunk_name(const char *sock, char *buf, size_t len)
{
	uint32_t h = 2166136261u;

	for (const unsigned char *p = (const unsigned char *)sock; *p; p++)
		h = (h ^ *p) * 16777619u;
	snprintf(buf, len, "pinbroker-chunk.%08x", h);
}

/*
 * A process of uid: with lease set, one lease of 4 MiB; then, not dumpable (its /proc/PID directory shows as root's),
 * an 8 KiB memfd of the chunk name mapped MAPS_EACH times, its fd closed. Says 'r' on ready[1], lives until killed.
 */
static pid_t mapper(const char *sock, uid_t uid, bool lease, int ready[2])
{
	pid_t p = itest_fork();

	ck_assert_int_ge(p, 0);
	if (p == 0) {
		char name[64];
		int fd;

		close(ready[0]);
		sec_drop_to(uid);
		if (lease) {
			struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
			pb_client *c;
			pb_lease *l;

			if (pb_connect(sock, &c) < 0 || pb_acquire(c, 4 * MiB, &o, &l) < 0)
				_exit(10);
		}
		prctl(PR_SET_DUMPABLE, 0);
		chunk_name(sock, name, sizeof(name));
		fd = memfd_create(name, MFD_CLOEXEC);
		if (fd < 0 || ftruncate(fd, MEMFD_BYTES) < 0 || fallocate(fd, 0, 0, MEMFD_BYTES) < 0)
			_exit(11);
		for (int i = 0; i < MAPS_EACH; i++)
			if (mmap(NULL, MEMFD_BYTES, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED)
				_exit(12);
		close(fd);
		itest_say(ready[1], 'r');
		for (;;)
			pause();
	}
	return p;
}

/* The daemon's orphaned bytes, its status freed. */
static uint64_t orphaned_bytes(const char *socket)
{
	struct pb_status *st = itest_status(socket);
	uint64_t v = st->orphaned_bytes;

	pb_status_free(st);
	return v;
}

START_TEST(test_rescans_read_only_orphan_owners_in_slices_stat_once)
{
	pid_t holder, m[MAPPERS], s[MAPPERS];
	struct daemon d;
	char *log, *line;
	int ready[2];
	long procs = -1, unreadable = -1, stats = -1, lines = -1, slices = -1;

	daemon_start(&d, args);
	ck_assert_int_eq(pipe(ready), 0);
	holder = mapper(d.socket, UID_HOLDER, true, ready);
	for (int i = 0; i < MAPPERS; i++) {
		m[i] = mapper(d.socket, UID_HOLDER, false, ready);
		s[i] = mapper(d.socket, UID_STRANGER, false, ready);
	}
	close(ready[1]);
	for (int i = 0; i < 1 + 2 * MAPPERS; i++)
		ck_assert_msg(itest_hear(ready[0], 120) == 'r', "a mapper did not start");
	close(ready[0]);
	kill(d.pid, SIGTERM);
	ck_assert_int_eq(waitpid(d.pid, NULL, 0), d.pid);
	daemon_restart(&d, again);
	ck_assert_uint_eq(orphaned_bytes(d.socket), 4 * MiB);

	ck_assert_msg(daemon_wait_log(&d, "(pass 0, in slices)", 20000), "no sliced rescan:\n%s",
		      daemon_log_excerpt(&d));
	log = daemon_log(&d);
	line = strstr(log, "(pass 0, in slices): ");
	ck_assert_int_eq(sscanf(line + strlen("(pass 0, in slices): "),
				"%ld processes read, %ld unreadable, %ld maps lines, %ld stats, %ld slices", &procs,
				&unreadable, &lines, &stats, &slices),
			 5);
	/* The holder and its uid's mappers are read: UID_HOLDER owns the orphan. The strangers are not, though their
	 * /proc/PID directories show as root's (before: read, as root was always wanted). */
	ck_assert_msg(procs >= 1 + MAPPERS && procs < 1 + 2 * MAPPERS, "%ld processes read: %.300s", procs, line);
	/* Every line of the owner's maps was read, and each memfd stat'ed once, not once a mapping (before: 32,000). */
	ck_assert_msg(lines >= MAPPERS * MAPS_EACH, "%ld maps lines read: %.300s", lines, line);
	ck_assert_msg(stats >= 0 && stats <= 64, "%ld stats for %d mappings: %.300s", stats, MAPPERS * MAPS_EACH, line);
	/* 32,000 lines at 100 us a slice: many loop turns, not one. */
	ck_assert_msg(slices >= 2, "the pass took %ld slices: %.300s", slices, line);
	free(log);
	ck_assert_uint_eq(orphaned_bytes(d.socket), 4 * MiB);
	kill(holder, SIGKILL);
	itest_wait_exit(holder);
	ck_assert_int_eq(wait_leased(d.socket, 0, 20000), 0);
	for (int i = 0; i < MAPPERS; i++) {
		kill(m[i], SIGKILL);
		kill(s[i], SIGKILL);
		itest_wait_exit(m[i]);
		itest_wait_exit(s[i]);
	}
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

CHECK_SUITE(suite, "sec-32-rescan-slices", "orphan rescans in slices", NULL, NULL, 120,
	    test_rescans_read_only_orphan_owners_in_slices_stat_once)

SEC_MAIN(suite)

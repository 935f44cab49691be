/* SPDX-License-Identifier: MIT */
/*
 * Issue 38, finding 1: under the shipped unit's privileges the holder scans see other uids' processes. The
 * daemon runs as its own uid with the unit's ambient capabilities (now with CAP_SYS_PTRACE) and /proc as
 * ProtectProc=default leaves it. A lease of uid A is held by a process that keeps the connection, a forked
 * child that maps one chunk, and another that only holds the other chunk's fd (never mapped). Past a revoke's
 * deadline both children get SIGTERM: the mapper found through /proc/PID/maps, the fd holder through
 * /proc/PID/fdinfo (another uid's fd/ folder cannot be listed without CAP_DAC_READ_SEARCH, which the unit
 * does not grant). Under the old unit (hidepid=invisible, no CAP_SYS_PTRACE) neither was reached.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "sec-unit.h"
#include "sec.h"

#define MiB (1024ull * 1024ull)
#define LEASE_BYTES (4 * MiB) /* two 2 MiB chunks (chunk-max 2M) */

static struct daemon d;

struct report {
	uint64_t lease_id;
	pid_t mapper, fd_holder;
};

static void start_as_unit(void)
{
	ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0); /* the holders come to the test when their parent dies */
	daemon_prepare(&d);
	ck_assert_int_eq(chown(d.dir, SEC_UID_DAEMON, SEC_UID_DAEMON), 0);
	daemon_restart_with(&d,
			    ITEST_ARGS("--budget", "64M", "--prewarm", "8M", "--chunk-max", "2M", "--revoke-enforce",
				       "sigterm", "--revoke-deadline-ms", "300"),
			    sec_as_unit_user, &(struct sec_unit){ .hidepid = "off", .caps = SEC_UNIT_CAPS });
}

/* A child of the client: keep only fd (mapped or not) and wait for a signal; tell the client through ready. */
static void holder(int sock, int keep, int drop, bool map, int ready)
{
	close(sock);
	close(drop);
	if (map) {
		if (mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, keep, 0) == MAP_FAILED)
			_exit(62);
		close(keep);
	}
	if (write(ready, "r", 1) != 1)
		_exit(63);
	for (;;)
		pause();
}

/* Uid A's client: acquires, forks the mapper and the fd holder, keeps the connection and never acks. */
static pid_t client(struct report *rep)
{
	int p[2];
	pid_t pid = itest_fork_piped(p, NULL);

	if (pid == 0) {
		struct report r = { 0 };
		int fds[8], sock, g[2];
		size_t nfds;
		char ok[2];

		close(p[0]);
		sock = sec_session_as(SEC_UID_A, d.socket, 60);
		if (raw_acquire(sock, LEASE_BYTES, &r.lease_id, fds, 8, &nfds) != 0 || nfds != 2 || pipe(g) < 0)
			_exit(61);
		if ((r.mapper = fork()) == 0)
			holder(sock, fds[1], fds[0], true, g[1]);
		if ((r.fd_holder = fork()) == 0)
			holder(sock, fds[0], fds[1], false, g[1]);
		close(g[1]); /* a holder that fails closes its end: the read below ends rather than waits */
		if (r.mapper < 0 || r.fd_holder < 0 || read(g[0], ok, 1) != 1 || read(g[0], ok + 1, 1) != 1)
			_exit(64);
		close(fds[0]);
		close(fds[1]);
		if (write(p[1], &r, sizeof(r)) != sizeof(r))
			_exit(65);
		for (;;)
			pause();
	}
	sec_read_report(p, rep, sizeof(*rep));
	return pid;
}

static void expect_sigterm(pid_t pid, const char *who, uint64_t lease)
{
	int st = itest_wait_end(pid, 5000);

	if (st == -1)
		itest_kill_and_reap(pid);
	ck_assert_msg(st != -1,
		      "%s (pid %d, uid %d) still holds lease %llu 5 s after its 300 ms deadline: the scan "
		      "did not see it (log:\n%s)",
		      who, (int)pid, SEC_UID_A, (unsigned long long)lease, itest_tail(daemon_log(&d)));
	ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM, "%s ended with status %#x", who, st);
}

START_TEST(test_revoke_reaches_another_uids_mapper_and_fd_holder_under_the_unit)
{
	struct report rep;
	pid_t c = client(&rep);
	char *out = NULL, *log;
	int rc;

	ck_assert_int_eq(status_leased(d.socket), (int64_t)LEASE_BYTES);
	rc = pinctl(&d, &out, "revoke %llu --deadline 300", (unsigned long long)rep.lease_id);
	ck_assert_msg(rc == 0, "pinctl revoke: %d\n%s", rc, out);
	free(out);
	expect_sigterm(c, "the client", rep.lease_id);
	expect_sigterm(rep.mapper, "the forked mapper", rep.lease_id);
	expect_sigterm(rep.fd_holder, "the forked fd holder (no mapping)", rep.lease_id);
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
	log = daemon_log(&d);
	ck_assert_msg(!strstr(log, "without CAP_SYS_PTRACE"), "the daemon says it could not read /proc:\n%s",
		      itest_tail(log));
	free(log);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

CHECK_SUITE(sec_23_suite, "sec_23_unit_proc_view", "unit_proc_view", start_as_unit, NULL, 120,
	    test_revoke_reaches_another_uids_mapper_and_fd_holder_under_the_unit)

SEC_MAIN(sec_23_suite)

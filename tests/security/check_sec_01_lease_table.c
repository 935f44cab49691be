/* SPDX-License-Identifier: MIT */
/* Finding 1 of issue 16: one uid holding 64 (or 200) leases must not let anyone wedge the daemon with lookups of absent ids. */
#include "sec.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#define LEASE_BYTES 4096
#define MAX_LEASES 200
/* Absent ids probed past the last live one: enough to land in every bucket of the daemon's table. */
#define ABSENT_PROBES 600
/* A daemon that answers at all answers a RELEASE in microseconds; this only bounds a wedged one. */
#define REPLY_TIMEOUT_MS 3000

static struct daemon d;

SEC_START(start, d, NULL)

SEC_STOP(stop, d)

/* RELEASE id over fd (seq id); returns the reply's status, or -errno (-ETIMEDOUT when the daemon does not answer). */
static int release_id(int fd, uint64_t id)
{
	return raw_release_seq(fd, id, id, REPLY_TIMEOUT_MS);
}

/*
 * Child as uid A: acquire n leases of 4 KiB over one connection, send their
 * ids up the pipe, wait for a byte, release every one, and exit 0 only if
 * each release was answered OK.
 */
static void holder(int n, int wr, int rd, const char *sock)
{
	uint64_t ids[MAX_LEASES];
	char c;
	int fd;

	fd = sec_session_as(SEC_UID_A, sock, 91);
	for (int i = 0; i < n; i++) {
		int fds[8];
		size_t nfds = 0;

		if (raw_acquire(fd, LEASE_BYTES, &ids[i], fds, 8, &nfds) != 0)
			_exit(92);
		/* The lease lives with the connection; the holder does not need the memory itself. */
		for (size_t k = 0; k < nfds; k++)
			close(fds[k]);
	}
	if (write(wr, ids, sizeof(ids[0]) * (size_t)n) != (ssize_t)(sizeof(ids[0]) * (size_t)n))
		_exit(93);
	if (read(rd, &c, 1) != 1)
		_exit(94);
	for (int i = 0; i < n; i++)
		if (release_id(fd, ids[i]) != PINBROKER__V1__STATUS_CODE__STATUS_OK)
			_exit(95);
	close(fd);
	_exit(0);
}

/* Child as uid B: RELEASE ids the table does not hold; each must be refused at once, not hang. */
static void prober(const uint64_t *absent, size_t n, const char *sock)
{
	int fd;

	fd = sec_session_as(SEC_UID_B, sock, 81);
	for (size_t i = 0; i < n; i++) {
		int st = release_id(fd, absent[i]);

		if (st == -ETIMEDOUT)
			_exit(82);
		if (st != PINBROKER__V1__STATUS_CODE__STATUS_UNKNOWN_LEASE &&
		    st != PINBROKER__V1__STATUS_CODE__STATUS_NOT_YOUR_LEASE)
			_exit(83);
	}
	close(fd);
	_exit(0);
}

static const char *child_failure(int code)
{
	switch (code) {
	case 81:
		return "uid B could not connect";
	case 82:
		return "the daemon did not answer a RELEASE of an absent id (wedged)";
	case 83:
		return "a RELEASE of an absent id got neither UNKNOWN_LEASE nor NOT_YOUR_LEASE";
	case 91:
		return "uid A could not connect";
	case 92:
		return "uid A could not acquire its leases";
	case 93:
	case 94:
		return "uid A lost its pipe to the test";
	case 95:
		return "uid A could not release its own leases";
	default:
		return "unexpected exit";
	}
}

static void wait_child(pid_t pid, const char *who)
{
	int st;

	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: %s (status %d)", who,
		      WIFEXITED(st) ? child_failure(WEXITSTATUS(st)) : "killed", st);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static bool contains(const uint64_t *sorted, size_t n, uint64_t id)
{
	return bsearch(&id, sorted, n, sizeof(*sorted), cmp_u64) != NULL;
}

static void hold_probe_release(int n)
{
	uint64_t ids[MAX_LEASES], sorted[MAX_LEASES], absent[ABSENT_PROBES + 1];
	size_t nabsent = 0;
	int a2p[2], p2a[2], fd;
	char *out = NULL, cmd[600];
	pid_t a, b;
	int r;

	a = itest_fork_piped(a2p, p2a);
	if (a == 0)
		holder(n, a2p[1], p2a[0], d.socket);
	ck_assert_int_eq(read(a2p[0], ids, sizeof(ids[0]) * (size_t)n), (ssize_t)(sizeof(ids[0]) * (size_t)n));
	memcpy(sorted, ids, sizeof(ids[0]) * (size_t)n);
	qsort(sorted, (size_t)n, sizeof(sorted[0]), cmp_u64);

	/* The reproducer's id, where it is absent, and a run past the last live id. */
	if (!contains(sorted, (size_t)n, 133))
		absent[nabsent++] = 133;
	for (uint64_t id = sorted[n - 1] + 1; nabsent < ABSENT_PROBES + 1; id++)
		absent[nabsent++] = id;
	b = itest_fork();
	ck_assert_int_ge(b, 0);
	if (b == 0)
		prober(absent, nabsent, d.socket);
	wait_child(b, "uid B's releases of absent ids");

	/* The admin view still answers, and an admin revoke of an absent id is refused, not spun on. */
	snprintf(cmd, sizeof(cmd), "timeout 10 %s --socket '%s' status", PINCTL_PATH, d.socket);
	r = run_capture(cmd, &out);
	ck_assert_msg(r == 0, "pinctl status failed (%d) with %d leases held:\n%s", r, n, out);
	free(out);
	fd = raw_connect(d.socket);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(raw_hello(fd), 0);
	ck_assert_int_eq(raw_admin_revoke(fd, absent[0], REPLY_TIMEOUT_MS),
			 PINBROKER__V1__STATUS_CODE__STATUS_UNKNOWN_LEASE);
	ck_assert_int_eq(raw_admin_revoke(fd, absent[nabsent - 1], REPLY_TIMEOUT_MS),
			 PINBROKER__V1__STATUS_CODE__STATUS_UNKNOWN_LEASE);
	close(fd);

	/* The holder lets go of every lease; the table must give each one back exactly once. */
	ck_assert_int_eq(write(p2a[1], "x", 1), 1);
	wait_child(a, "uid A");
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
	ck_assert(daemon_alive(&d));
	close(a2p[0]);
	close(a2p[1]);
	close(p2a[0]);
	close(p2a[1]);
}

START_TEST(test_absent_id_lookups_answer_with_64_leases_held)
{
	hold_probe_release(64);
}
END_TEST

START_TEST(test_absent_id_lookups_answer_with_200_leases_held)
{
	hold_probe_release(200);
}
END_TEST

/* A wedged daemon fails by the child's reply timeout well before this. */
CHECK_SUITE(sec_suite, "sec_01_lease_table", "absent-ids", start, stop, 60,
	    test_absent_id_lookups_answer_with_64_leases_held, test_absent_id_lookups_answer_with_200_leases_held)

SEC_MAIN(sec_suite)

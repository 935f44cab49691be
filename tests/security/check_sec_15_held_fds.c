/* SPDX-License-Identifier: MIT */
/* Issue 22, finding 3: the fds the daemon keeps for a uid's exit holds count against that uid's caps, one pidfd per process, so another uid gets its own cap and an admin is always answered. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sec.h"
#include "pinbroker.pb-c.h"

/*
 * The daemon runs with 4096 fds. Its fixed share (reserve-fds 64, two per
 * connection for max-connections 16, 1024 for queued replies, its own) leaves
 * ~2,950 for chunks; each uid may hold CAP of them. The review's uid A left
 * one chunk fd and one pidfd copy per connect/acquire/close round, twice its
 * cap in fds; uid B then got 3,186 of 8,397 leases and root's status failed.
 */
#define NOFILE 4096
#define CAP 1400
#define LEASE_BYTES 4096

static struct daemon d;

static void start(void)
{
	static const char *const args[] = { "--max-connections",
					    "16",
					    "--max-connections-per-uid",
					    "8",
					    "--max-chunks-per-uid",
					    "1400",
					    "--prewarm",
					    "0",
					    NULL };
	struct rlimit rl = { NOFILE, NOFILE };

	/* The daemon raises its soft limit to the hard one: bound both (this forked test process only). */
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	daemon_start(&d, args);
}

SEC_STOP(stop, d)

struct tally {
	int granted;
	int status;
	char msg[512];
};

/*
 * A holder process: acquire(t, uid) acquires as uid and tallies; the tally goes to the parent (from), and the
 * process lives on, every lease held for it, until the parent writes a byte (to). It exits code when the tally
 * cannot be sent, code + 1 when the parent's byte does not come.
 */
static pid_t tally_holder(void (*acquire)(struct tally *t, uid_t uid), uid_t uid, int code, int *to, int *from)
{
	int a[2], b[2];
	pid_t pid;

	pid = itest_fork_piped(a, b);
	if (pid == 0) {
		struct tally t = { 0 };
		char c;

		close(a[1]);
		close(b[0]);
		acquire(&t, uid);
		if (write(b[1], &t, sizeof(t)) != sizeof(t))
			_exit(code);
		if (read(a[0], &c, 1) != 1)
			_exit(code + 1);
		_exit(0);
	}
	close(a[0]);
	close(b[1]);
	*to = a[1];
	*from = b[0];
	return pid;
}

/* Connect, acquire one 4 KiB lease, close the connection, keep living; until an acquire is refused. */
static void acquire_closing_each(struct tally *t, uid_t uid)
{
	sec_drop_to(uid);
	for (;;) {
		int sock = raw_connect(d.socket);

		if (sock < 0 || raw_hello(sock) != 0)
			_exit(70);
		t->status = raw_acquire_msg(sock, LEASE_BYTES, NULL, 5, t->msg, sizeof(t->msg), 10000);
		close(sock); /* the process lives on: the lease is held until it exits */
		if (t->status != 0 || t->granted > 4 * CAP)
			break;
		t->granted++;
	}
}

/* On one connection: acquire 4 KiB leases until refused. */
static void acquire_on_one_connection(struct tally *t, uid_t uid)
{
	int sock = sec_session_as(uid, d.socket, 80);

	while (t->granted <= 4 * CAP) {
		t->status = raw_acquire_msg(sock, LEASE_BYTES, NULL, 5, t->msg, sizeof(t->msg), 10000);
		if (t->status != 0)
			break;
		t->granted++;
	}
}

/* Uid A in one process, a connection per lease, each closed: the tally; every lease held until the parent writes. */
static pid_t exit_holder(int *to, int *from)
{
	return tally_holder(acquire_closing_each, SEC_UID_A, 71, to, from);
}

/* Uid B on one connection: acquire 4 KiB leases until refused; the tally. Holds them until the parent writes. */
static pid_t plain_holder(uid_t uid, int *to, int *from)
{
	return tally_holder(acquire_on_one_connection, uid, 81, to, from);
}

START_TEST(test_exit_holds_count_against_their_uid_and_leave_others_their_cap)
{
	struct tally ta, tb;
	int a_to, a_from, b_to, b_from;
	pid_t a, b;
	char *out = NULL;
	int rc;

	a = exit_holder(&a_to, &a_from);
	ck_assert_int_eq(read(a_from, &ta, sizeof(ta)), (ssize_t)sizeof(ta));
	/* B gets its whole cap, and is then refused for its own cap (max-leases-per-uid follows max-chunks-per-uid),
	 * not for the daemon's fds. */
	b = plain_holder(SEC_UID_B, &b_to, &b_from);
	ck_assert_int_eq(read(b_from, &tb, sizeof(tb)), (ssize_t)sizeof(tb));
	ck_assert_msg(tb.granted == CAP, "uid B got %d leases below its cap of %d (refused with %d: %s)", tb.granted,
		      CAP, tb.status, tb.msg);
	ck_assert_msg(tb.status == PINBROKER__V1__STATUS_CODE__STATUS_LIMIT &&
			      (strstr(tb.msg, "max-chunks-per-uid") || strstr(tb.msg, "max-leases-per-uid")),
		      "uid B's refusal at its cap: status %d: %s", tb.status, tb.msg);

	/* Root is still answered, with both uids at their caps. */
	rc = pinctl(&d, &out, "status");
	ck_assert_msg(rc == 0, "pinctl status with uids A and B at their caps: %d\n%s", rc, out);
	free(out);
	/*
	 * A's one process keeps one pidfd in the daemon, counted with its chunks:
	 * CAP - 1 leases, then a refusal naming the cap. Per connection (the old
	 * pidfd copy per close), it would get half its cap or, uncounted, all of it.
	 */
	ck_assert_msg(ta.status == PINBROKER__V1__STATUS_CODE__STATUS_LIMIT && strstr(ta.msg, "max-chunks-per-uid"),
		      "uid A's refusal after %d exit-held leases: status %d: %s", ta.granted, ta.status, ta.msg);
	ck_assert_msg(ta.granted == CAP - 1, "uid A got %d exit-held leases; its cap is %d fds, one of them its pidfd",
		      ta.granted, CAP);

	ck_assert_int_eq(status_leased(d.socket), (int64_t)(2 * CAP - 1) * LEASE_BYTES);

	/* A's exit ends every exit hold (and its pidfd); B's leases go with its process. */
	ck_assert_int_eq(write(a_to, "x", 1), 1);
	ck_assert_int_eq(itest_wait_exit(a), 0);
	ck_assert_int_eq(write(b_to, "x", 1), 1);
	ck_assert_int_eq(itest_wait_exit(b), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 10000), 0);
	close(a_to);
	close(a_from);
	close(b_to);
	close(b_from);
}
END_TEST

CHECK_SUITE(suite, "sec_15_held_fds", "held_fds", start, stop, 120,
	    test_exit_holds_count_against_their_uid_and_leave_others_their_cap)

SEC_MAIN(suite)

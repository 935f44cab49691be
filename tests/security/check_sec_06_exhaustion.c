/* SPDX-License-Identifier: MIT */
/* Finding 6: one uid must not exhaust the daemon's fds or mappings; an admin connection always works. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sec.h"
#include "pinbroker.pb-c.h"

#define NCONN 5
#define TRY_LEASES 20000 /* the review held 19,973 leases of 4 KiB before the daemon ran out of fds */

static struct daemon d;

SEC_START(start, d, NULL)

SEC_STOP(stop, d)

/* ACQUIRE size; on success close the fds at once (the daemon keeps its own). Returns the status; *msg on refusal. */
static int acquire_msg(int fd, uint64_t size, char *msg, size_t msglen)
{
	return raw_acquire_msg(fd, size, NULL, 5, msg, msglen, 10000);
}

/*
 * As uid, acquire 4 KiB leases over NCONN connections until refused; report
 * how many were granted and the refusal through the pipe, then hold them
 * until the parent writes a byte.
 */
static void hog(uid_t uid, int wr, int rd)
{
	int fds[NCONN], st = 0, n = 0;
	char msg[512] = "";
	char c;

	sec_drop_to(uid);
	for (int i = 0; i < NCONN; i++) {
		fds[i] = raw_connect(d.socket);
		if (fds[i] < 0 || raw_hello(fds[i]) != 0)
			_exit(91);
	}
	while (n < TRY_LEASES) {
		st = acquire_msg(fds[n % NCONN], 4096, msg, sizeof(msg));
		if (st != 0)
			break;
		n++;
	}
	if (write(wr, &n, sizeof(n)) != sizeof(n) || write(wr, &st, sizeof(st)) != sizeof(st) ||
	    write(wr, msg, sizeof(msg)) != sizeof(msg))
		_exit(92);
	if (read(rd, &c, 1) != 1)
		_exit(93);
	_exit(0);
}

struct hogger {
	pid_t pid;
	int to[2], from[2];
	int granted, status;
	char msg[512];
};

static void hog_start(struct hogger *h, uid_t uid)
{
	ck_assert_int_eq(pipe(h->to), 0);
	ck_assert_int_eq(pipe(h->from), 0);
	h->pid = itest_fork();
	ck_assert_int_ge(h->pid, 0);
	if (h->pid == 0)
		hog(uid, h->from[1], h->to[0]);
	ck_assert_int_eq(read(h->from[0], &h->granted, sizeof(int)), (ssize_t)sizeof(int));
	ck_assert_int_eq(read(h->from[0], &h->status, sizeof(int)), (ssize_t)sizeof(int));
	ck_assert_int_eq(read(h->from[0], h->msg, sizeof(h->msg)), (ssize_t)sizeof(h->msg));
}

static void hog_end(struct hogger *h)
{
	int st;

	ck_assert_int_eq(write(h->to[1], "x", 1), 1);
	ck_assert_int_eq(waitpid(h->pid, &st, 0), h->pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "hog exited with %d", WEXITSTATUS(st));
	close(h->to[0]);
	close(h->to[1]);
	close(h->from[0]);
	close(h->from[1]);
}

static void assert_admin_answers(void)
{
	char *out = NULL;

	ck_assert_msg(pinctl(&d, &out, "status") == 0, "pinctl status did not answer at the limit: %s", out);
	free(out);
}

START_TEST(test_one_uid_is_capped_and_admin_still_answers)
{
	struct hogger a;

	hog_start(&a, SEC_UID_A);
	ck_assert_msg(a.status == PINBROKER__V1__STATUS_CODE__STATUS_LIMIT,
		      "uid A got %d leases and then status %d (%s); expected a per-uid limit first", a.granted,
		      a.status, a.msg);
	ck_assert_msg(strstr(a.msg, "max-leases-per-uid") || strstr(a.msg, "max-chunks-per-uid"),
		      "the refusal does not name the setting: %s", a.msg);
	ck_assert_msg(a.granted > 100, "only %d granted: %s", a.granted, a.msg);
	ck_assert_int_lt(a.granted, TRY_LEASES);
	assert_admin_answers();
	/* Another uid is not starved by A. */
	{
		pid_t pid = itest_fork();
		int st;

		ck_assert_int_ge(pid, 0);
		if (pid == 0) {
			int fd;

			fd = sec_session_as(SEC_UID_B, d.socket, 81);
			_exit(acquire_msg(fd, 4096, NULL, 0) == 0 ? 0 : 82);
		}
		ck_assert_int_eq(waitpid(pid, &st, 0), pid);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "uid B could not acquire while A is capped");
	}
	hog_end(&a);
	ck_assert_int_eq(wait_leased(d.socket, 0, 10000), 0);
	ck_assert(daemon_alive(&d));
}
END_TEST

/* Two uids at their caps fill the daemon's capacity; a third is refused by name, and the admin still gets in. */
START_TEST(test_daemon_capacity_keeps_a_reserve_for_the_admin)
{
	struct hogger a, b;

	hog_start(&a, SEC_UID_A);
	hog_start(&b, SEC_UID_B);
	ck_assert_int_eq(a.status, PINBROKER__V1__STATUS_CODE__STATUS_LIMIT);
	ck_assert_int_eq(b.status, PINBROKER__V1__STATUS_CODE__STATUS_LIMIT);
	assert_admin_answers();
	{
		char msg[512] = "";
		int fd = raw_connect(d.socket);
		int st;

		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(raw_hello(fd), 0);
		st = acquire_msg(fd, 4096, msg, sizeof(msg));
		/* A and B each got half of the capacity; root may get what is left, if anything. */
		ck_assert_msg(st == 0 || (st == PINBROKER__V1__STATUS_CODE__STATUS_LIMIT && strstr(msg, "reserve-fds")),
			      "third uid: status %d (%s)", st, msg);
		close(fd);
	}
	assert_admin_answers();
	hog_end(&a);
	hog_end(&b);
	ck_assert_int_eq(wait_leased(d.socket, 0, 10000), 0);
}
END_TEST

/* An explicit cap is obeyed and named. */
START_TEST(test_explicit_caps_are_named_in_the_refusal)
{
	static const char *const args[] = { "--max-leases-per-uid", "10", NULL };
	struct hogger a;

	ck_assert_int_eq(daemon_stop(&d), 0);
	daemon_start(&d, args);
	hog_start(&a, SEC_UID_A);
	ck_assert_int_eq(a.granted, 10);
	ck_assert_int_eq(a.status, PINBROKER__V1__STATUS_CODE__STATUS_LIMIT);
	ck_assert_msg(strstr(a.msg, "max-leases-per-uid = 10"), "message: %s", a.msg);
	hog_end(&a);
	ck_assert_int_eq(wait_leased(d.socket, 0, 10000), 0);
}
END_TEST

CHECK_SUITE(suite, "sec_06_exhaustion", "core", start, stop, 240, test_one_uid_is_capped_and_admin_still_answers,
	    test_daemon_capacity_keeps_a_reserve_for_the_admin, test_explicit_caps_are_named_in_the_refusal)

SEC_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/* Finding 12: a holder may release or revoke its own leases without admin rights, and never another uid's. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sec.h"
#include "pinbroker.pb-c.h"

static struct daemon d;

SEC_START(start, d, "--revoke-deadline-ms", "60000", "--revoke-enforce", "none")

SEC_STOP(stop, d)

/* Run the staged pinctl as uid with args (a shell line), its output dropped; returns its exit status. */
static int pinctl_quiet_as(uid_t uid, const char *args)
{
	char *out = NULL;
	int r = pinctl_as(&d, uid, &out, args);

	free(out);
	return r;
}

struct holder {
	pid_t pid;
	int to, from;
	uint64_t id;
};

/* As uid: hold one lease over a raw connection. With drop_conn, close the connection but stay alive. */
static void holder_start(struct holder *h, uid_t uid, bool drop_conn)
{
	int p[2], q[2];

	h->pid = itest_fork_piped(p, q);
	if (h->pid == 0) {
		int fds[4], fd, err;
		size_t nfds;
		uint64_t id;
		char c = 'n';
		Pinbroker__V1__Reply *rep;

		sec_drop_to(uid);
		fd = raw_connect(d.socket);
		if (fd < 0 || raw_hello(fd) != 0 || raw_acquire(fd, 1 << 20, &id, fds, 4, &nfds) != 0)
			_exit(81);
		if (drop_conn)
			close(fd);
		if (write(q[1], &id, sizeof(id)) != sizeof(id))
			_exit(82);
		/* Report whether a REVOKE arrived, when asked. */
		if (read(p[0], &c, 1) != 1)
			_exit(83);
		c = 'n';
		if (!drop_conn && (rep = raw_recv(fd, NULL, 0, NULL, 2000, &err))) {
			if (rep->body_case == PINBROKER__V1__REPLY__BODY_REVOKE && rep->revoke->lease_id == id)
				c = 'y';
			pinbroker__v1__reply__free_unpacked(rep, NULL);
		}
		if (write(q[1], &c, 1) != 1 || read(p[0], &c, 1) != 1)
			_exit(84);
		_exit(0);
	}
	h->to = p[1];
	h->from = q[0];
	ck_assert_int_eq(read(h->from, &h->id, sizeof(h->id)), (ssize_t)sizeof(h->id));
}

static bool holder_saw_revoke(struct holder *h)
{
	char c;

	ck_assert_int_eq(write(h->to, "?", 1), 1);
	ck_assert_int_eq(read(h->from, &c, 1), 1);
	return c == 'y';
}

static void holder_end(struct holder *h)
{
	int st;

	/* Two bytes: whether or not holder_saw_revoke() asked first, the child then exits. */
	ck_assert_int_eq(write(h->to, "xx", 2), 2);
	ck_assert_int_eq(waitpid(h->pid, &st, 0), h->pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "holder exited with %d", WEXITSTATUS(st));
}

START_TEST(test_holder_revokes_its_own_lease_without_admin)
{
	struct holder a;
	char cmd[64];

	holder_start(&a, SEC_UID_A, false);
	snprintf(cmd, sizeof(cmd), "revoke %llu", (unsigned long long)a.id);
	/* Another uid may not; a non-admin may not reach other uids by --uid either. */
	ck_assert_int_ne(pinctl_quiet_as(SEC_UID_B, cmd), 0);
	ck_assert_int_ne(pinctl_quiet_as(SEC_UID_B, "revoke --uid 61001"), 0);
	/* Its own uid may, from any process. */
	ck_assert_int_eq(pinctl_quiet_as(SEC_UID_A, cmd), 0);
	ck_assert_msg(holder_saw_revoke(&a), "the holder got no REVOKE for its lease");
	holder_end(&a);
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
	/* The metrics count it as the holder's own revoke, not an admin's. */
	{
		char *out = NULL;

		ck_assert_int_eq(pinctl(&d, &out, "metrics"), 0);
		ck_assert_msg(strstr(out, "pinbroker_revocations_total{reason=\"self\"} 1\n") &&
				      strstr(out, "pinbroker_revocations_total{reason=\"admin\"} 0\n"),
			      "a holder's own revoke is not counted as reason=\"self\":\n%s", out);
		free(out);
	}
}
END_TEST

START_TEST(test_holder_revokes_all_of_its_own_by_uid)
{
	struct holder a;

	holder_start(&a, SEC_UID_A, false);
	ck_assert_int_eq(pinctl_quiet_as(SEC_UID_A, "revoke --uid 61001"), 0);
	ck_assert(holder_saw_revoke(&a));
	holder_end(&a);
}
END_TEST

static int raw_release_as(uid_t uid, uint64_t id)
{
	pid_t pid = itest_fork();
	int st;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int fd, rst;

		fd = sec_session_as(uid, d.socket, 100);
		rst = raw_release_seq(fd, id, 9, 3000);
		_exit(rst < 0 ? 101 : rst);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st));
	return WEXITSTATUS(st);
}

/* A lease whose connection closed while its process lives has no connection to release it; its uid may. */
START_TEST(test_own_uid_releases_a_lease_left_without_a_connection)
{
	struct holder a;

	holder_start(&a, SEC_UID_A, true);
	ck_assert_int_eq(wait_leased(d.socket, 1 << 20, 3000), 1 << 20);
	ck_assert_int_eq(raw_release_as(SEC_UID_B, a.id), PINBROKER__V1__STATUS_CODE__STATUS_NOT_YOUR_LEASE);
	ck_assert_int_eq(status_leased(d.socket), 1 << 20);
	ck_assert_int_eq(raw_release_as(SEC_UID_A, a.id), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(wait_leased(d.socket, 0, 3000), 0);
	holder_end(&a);
}
END_TEST

CHECK_SUITE(suite, "sec_12_holder_rights", "core", start, stop, 60, test_holder_revokes_its_own_lease_without_admin,
	    test_holder_revokes_all_of_its_own_by_uid, test_own_uid_releases_a_lease_left_without_a_connection)

SEC_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/* Integration: uid isolation between real processes, and hostile raw packets against the real daemon. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"
#include "wirefix.h"
#include "pinbroker.h"
#include "wire.h"
#include "check_main.h"

#define MiB (1024ull * 1024ull)
#define UID_A 61001
#define UID_B 61002

static struct daemon d;

ITEST_FIXTURE_START(start, d, NULL)

ITEST_FIXTURE_STOP(stop, d)

/* Child A: acquire raw, fill with a secret, report lease id and pid, then wait for a byte to release. */
static void child_a(int wr, int rd, const char *sock)
{
	uint64_t id;
	int fds[8];
	size_t nfds;
	int fd;
	char *p;

	itest_drop_to(UID_A);
	fd = raw_connect(sock);
	if (fd < 0 || raw_hello(fd) != 0)
		_exit(91);
	if (raw_acquire(fd, 2 * MiB, &id, fds, 8, &nfds) != 0 || nfds != 1)
		_exit(92);
	p = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (p == MAP_FAILED)
		_exit(93);
	memset(p, 'S', 2 * MiB);
	/* Sealed: the holder itself can neither grow nor shrink it. */
	if (ftruncate(fds[0], 4 * MiB) == 0 || errno != EPERM)
		_exit(94);
	if (ftruncate(fds[0], 1 * MiB) == 0 || errno != EPERM)
		_exit(95);
	if (write(wr, &id, sizeof(id)) != sizeof(id))
		_exit(96);
	{
		char c;

		if (read(rd, &c, 1) != 1)
			_exit(97);
	}
	munmap(p, 2 * MiB);
	close(fds[0]);
	close(fd); /* connection close returns the lease */
	_exit(0);
}

START_TEST(test_uids_cannot_touch_each_others_memory)
{
	int a2p[2], p2a[2], st;
	pid_t a, b;
	uint64_t id;

	ck_assert_int_eq(pipe(a2p), 0);
	ck_assert_int_eq(pipe(p2a), 0);
	a = itest_fork();
	ck_assert_int_ge(a, 0);
	if (a == 0)
		child_a(a2p[1], p2a[0], d.socket);
	ck_assert_int_eq(read(a2p[0], &id, sizeof(id)), (ssize_t)sizeof(id));

	b = itest_fork();
	ck_assert_int_ge(b, 0);
	if (b == 0) {
		char path[64];
		int fd, rst;

		itest_drop_to(UID_B);
		fd = raw_connect(d.socket);
		if (fd < 0 || raw_hello(fd) != 0)
			_exit(81);
		/* B cannot release (or learn anything about) A's lease by id. */
		rst = raw_release_seq(fd, id, 3, 3000);
		if (rst == -EPIPE)
			_exit(82);
		if (rst != PINBROKER__V1__STATUS_CODE__STATUS_NOT_YOUR_LEASE)
			_exit(83);
		/* Nor reach A's memfd through /proc: another uid's fds are closed to it. */
		snprintf(path, sizeof(path), "/proc/%d/fd/3", (int)a);
		for (int i = 3; i < 16; i++) {
			int x;

			snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)a, i);
			x = open(path, O_RDWR);
			if (x >= 0)
				_exit(84);
		}
		_exit(0);
	}
	ck_assert_int_eq(waitpid(b, &st, 0), b);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "uid B child failed with %d", WEXITSTATUS(st));

	/* A lets go; B then gets memory that never shows A's bytes. */
	ck_assert_int_eq(write(p2a[1], "x", 1), 1);
	ck_assert_int_eq(waitpid(a, &st, 0), a);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "uid A child failed with %d", WEXITSTATUS(st));
	ck_assert_int_eq(wait_leased(d.socket, 0, 2000), 0);

	b = itest_fork();
	ck_assert_int_ge(b, 0);
	if (b == 0) {
		uint64_t idb;
		int fds[8];
		size_t nfds;
		unsigned char *p;
		int fd;

		itest_drop_to(UID_B);
		fd = raw_connect(d.socket);
		if (fd < 0 || raw_hello(fd) != 0)
			_exit(71);
		/* Ask for the whole warm pool, so A's old chunk would be among it if it were reused. */
		if (raw_acquire(fd, 16 * MiB, &idb, fds, 8, &nfds) != 0)
			_exit(72);
		for (size_t k = 0; k < nfds; k++) {
			struct stat sb;

			if (fstat(fds[k], &sb) < 0)
				_exit(73);
			p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fds[k], 0);
			if (p == MAP_FAILED)
				_exit(74);
			for (off_t i = 0; i < sb.st_size; i++)
				if (p[i] == 'S')
					_exit(75);
			munmap(p, (size_t)sb.st_size);
		}
		_exit(0);
	}
	ck_assert_int_eq(waitpid(b, &st, 0), b);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "uid B second child failed with %d", WEXITSTATUS(st));
	close(a2p[0]);
	close(a2p[1]);
	close(p2a[0]);
	close(p2a[1]);
}
END_TEST

START_TEST(test_non_admin_cannot_revoke_or_set)
{
	pb_client *c;
	int st;
	pid_t pid;

	pid = itest_fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		itest_drop_to(UID_A);
		if (pb_connect(d.socket, &c) < 0)
			_exit(1);
		if (pb_admin_revoke(c, PB_REVOKE_ALL, 0, 0, 0, NULL, NULL) != -EACCES)
			_exit(2);
		if (pb_admin_set(c, "budget", "1G") != -EACCES)
			_exit(3);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed with %d", WEXITSTATUS(st));
}
END_TEST

static void assert_survives(void)
{
	ck_assert(daemon_alive(&d));
	ck_assert_int_ge(status_leased(d.socket), 0);
}

/* The daemon closes fd within 3 s (our end is closed too) and lives on. */
static void assert_closed(int fd)
{
	ck_assert_msg(raw_closed_by_peer(fd, 3000), "the daemon kept connection %d open", fd);
	close(fd);
	assert_survives();
}

/* Sends req (no fds) on fd: the daemon answers within 3 s with status want, and needle (unless NULL) in its message. */
static void assert_reply(int fd, Pinbroker__V1__Request *req, int want, const char *needle)
{
	Pinbroker__V1__Reply *rep;
	int err;

	ck_assert_int_eq(raw_send(fd, req, NULL, 0), 0);
	rep = raw_recv(fd, NULL, 0, NULL, 3000, &err);
	ck_assert_msg(rep != NULL, "no reply (want status %d): %d", want, err);
	ck_assert_int_eq(rep->status, want);
	if (needle)
		ck_assert_msg(strstr(rep->message, needle), "'%s' not in '%s'", needle, rep->message);
	pinbroker__v1__reply__free_unpacked(rep, NULL);
}

START_TEST(test_garbage_packet_closes_only_that_connection)
{
	int bystander = raw_connect(d.socket), fd = raw_connect(d.socket);
	unsigned char junk[512];

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(raw_hello(bystander), 0);
	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (unsigned char)(i * 37 + 11);
	ck_assert_int_eq(wire_send(fd, junk, sizeof(junk), NULL, 0), 0);
	assert_closed(fd);
	/* The bystander's connection is untouched. */
	ck_assert_int_eq(raw_status(bystander), 0);
	close(bystander);
}
END_TEST

START_TEST(test_oversized_packet_closes_connection)
{
	int fd = raw_connect(d.socket);
	size_t n = 200 * 1024; /* over max-message-bytes (64 KiB) */
	char *big = calloc(1, n);

	ck_assert_int_eq(raw_hello(fd), 0);
	ck_assert_int_eq(wire_send(fd, big, n, NULL, 0), 0);
	ck_assert(raw_closed_by_peer(fd, 3000));
	free(big);
	close(fd);
	assert_survives();
}
END_TEST

START_TEST(test_packet_with_fd_closes_connection)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__StatusRequest sreq = PINBROKER__V1__STATUS_REQUEST__INIT;
	int fd = raw_connect(d.socket), extra = open("/dev/null", O_RDONLY);

	ck_assert_int_eq(raw_hello(fd), 0);
	wirefix_set_oneof(&req.base, PINBROKER__V1__REQUEST__BODY_STATUS, &sreq.base);
	ck_assert_int_eq(raw_send(fd, &req, &extra, 1), 0);
	close(extra);
	assert_closed(fd);
}
END_TEST

START_TEST(test_request_before_hello_is_refused_and_closed)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Acquire a = PINBROKER__V1__ACQUIRE__INIT;
	int fd = raw_connect(d.socket);

	a.size = 4096;
	req.has_seq = true;
	req.seq = 9;
	wirefix_set_oneof(&req.base, PINBROKER__V1__REQUEST__BODY_ACQUIRE, &a.base);
	assert_reply(fd, &req, PINBROKER__V1__STATUS_CODE__STATUS_NO_HELLO, NULL);
	assert_closed(fd);
}
END_TEST

START_TEST(test_wrong_version_gets_clear_error)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Hello h = PINBROKER__V1__HELLO__INIT;
	int fd = raw_connect(d.socket);

	h.version = 99;
	wirefix_set_oneof(&req.base, PINBROKER__V1__REQUEST__BODY_HELLO, &h.base);
	assert_reply(fd, &req, PINBROKER__V1__STATUS_CODE__STATUS_VERSION_MISMATCH, "version");
	close(fd);
	assert_survives();
}
END_TEST

START_TEST(test_empty_request_and_truncated_packets_close_connection)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Acquire a = PINBROKER__V1__ACQUIRE__INIT;
	uint8_t buf[64];
	size_t n;
	int fd;

	/* No body at all: unknown request kind. */
	fd = raw_connect(d.socket);
	ck_assert_int_eq(raw_hello(fd), 0);
	ck_assert_int_eq(raw_send(fd, &req, NULL, 0), 0);
	assert_closed(fd);

	/* A valid ACQUIRE cut short. */
	fd = raw_connect(d.socket);
	ck_assert_int_eq(raw_hello(fd), 0);
	a.size = 1ull << 40;
	wirefix_set_oneof(&req.base, PINBROKER__V1__REQUEST__BODY_ACQUIRE, &a.base);
	n = pinbroker__v1__request__pack(&req, buf);
	ck_assert_int_eq(wire_send(fd, buf, n - 2, NULL, 0), 0);
	assert_closed(fd);
}
END_TEST

START_TEST(test_absurd_sizes_get_status_not_crash)
{
	uint64_t id;
	int fds[4];
	size_t nfds;
	int fd = raw_connect(d.socket);

	ck_assert_int_eq(raw_hello(fd), 0);
	ck_assert_int_eq(raw_acquire(fd, 0, &id, fds, 4, &nfds), PINBROKER__V1__STATUS_CODE__STATUS_INVALID_SIZE);
	ck_assert_int_eq(raw_acquire(fd, UINT64_MAX, &id, fds, 4, &nfds),
			 PINBROKER__V1__STATUS_CODE__STATUS_INVALID_SIZE);
	ck_assert_int_eq(raw_acquire(fd, 1ull << 63, &id, fds, 4, &nfds), PINBROKER__V1__STATUS_CODE__STATUS_TOO_LARGE);
	close(fd);
	assert_survives();
}
END_TEST

START_TEST(test_silent_peer_is_dropped_after_handshake_timeout)
{
	int fd = raw_connect(d.socket);

	ck_assert_int_ge(fd, 0);
	/* --handshake-timeout-ms 300 for this case. */
	assert_closed(fd);
}
END_TEST

ITEST_FIXTURE_START(start_short_handshake, d, ITEST_ARGS("--handshake-timeout-ms", "300"))

static Suite *suite(void)
{
	Suite *s = suite_create("integration-security");
	TCase *iso;

	if (geteuid() == 0) {
		iso = tcase_create("isolation");
		tcase_add_checked_fixture(iso, start, stop);
		tcase_set_timeout(iso, 30);
		tcase_add_test(iso, test_uids_cannot_touch_each_others_memory);
		tcase_add_test(iso, test_non_admin_cannot_revoke_or_set);
		suite_add_tcase(s, iso);
	} else {
		/* The suite then exits 77, so ctest reports it skipped, not passed (check_main.h). */
		check_skip("2 uid-isolation tests need root to switch uids; run the suite as root");
	}

	CHECK_CASE(s, "bad-input", start, stop, 30, test_garbage_packet_closes_only_that_connection,
		   test_oversized_packet_closes_connection, test_packet_with_fd_closes_connection,
		   test_request_before_hello_is_refused_and_closed, test_wrong_version_gets_clear_error,
		   test_empty_request_and_truncated_packets_close_connection, test_absurd_sizes_get_status_not_crash);

	CHECK_CASE(s, "handshake", start_short_handshake, stop, 30,
		   test_silent_peer_is_dropped_after_handshake_timeout);
	return s;
}

CHECK_MAIN(suite)

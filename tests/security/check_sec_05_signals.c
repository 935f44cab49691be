/* SPDX-License-Identifier: MIT */
/* Finding 5: revoke enforcement reaches every process of the lease's uid that still maps its memory (a child forked before its parent exited, the mappers of a ghost lease), and nobody else. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "sec.h"

#define MiB (1024ull * 1024ull)
#define LEASE_BYTES (4 * MiB) /* two 2 MiB chunks: one class (chunk-max 2M, as chunk-size) */

static struct daemon d;

/* What the dodging client tells the test. */
struct report {
	uint64_t lease_id;
	pid_t grandchild;
};

static void start_sigterm(void)
{
	static const char *const args[] = {
		"--revoke-enforce", "sigterm", "--revoke-deadline-ms", "300", "--chunk-max", "2M", NULL
	};

	/* Orphans (a grandchild whose parent exited) come to the test, so it can wait for them. */
	ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	daemon_start(&d, args);
}

static void start_sigkill(void)
{
	static const char *const args[] = {
		"--revoke-enforce", "sigkill", "--revoke-deadline-ms", "300", "--chunk-max", "2M", NULL
	};

	ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	daemon_start(&d, args);
}

SEC_STOP(stop, d)

static void send_fd(int sock, int fd)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = { 0 }, byte = 'f';
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&m);

	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	if (sendmsg(sock, &m, 0) != 1)
		_exit(80);
}

static int recv_fd(int sock)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = { 0 }, byte;
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm;
	int fd;

	if (recvmsg(sock, &m, 0) != 1 || !(cm = CMSG_FIRSTHDR(&m)) || cm->cmsg_type != SCM_RIGHTS)
		return -1;
	memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	return fd;
}

/*
 * A client of uid A that acquires a two-chunk lease over the raw protocol and
 * maps both chunks; share >= 0 gets the first chunk's memfd (for another uid's
 * process to map). It forks a grandchild that keeps only the second chunk's
 * mapping and reports. keep_socket: the grandchild keeps the inherited
 * connection and the parent exits (the dodge); otherwise the grandchild drops
 * the connection and the parent closes it too but lives on, mapping the lease
 * (a ghost lease). Returns the client's pid; *rep says what it got.
 */
static pid_t dodging_client(bool keep_socket, int share, struct report *rep)
{
	int p[2];
	pid_t pid;

	pid = itest_fork_piped(p, NULL);
	if (pid == 0) {
		struct report r = { 0 };
		int fds[8], sock, g[2];
		size_t nfds;
		char *m[2], ok;
		pid_t gc;

		close(p[0]);
		sock = sec_session_as(SEC_UID_A, d.socket, 70);
		if (raw_acquire(sock, LEASE_BYTES, &r.lease_id, fds, 8, &nfds) != 0 || nfds != 2)
			_exit(71);
		for (int i = 0; i < 2; i++) {
			m[i] = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
			if (m[i] == MAP_FAILED)
				_exit(72);
			memset(m[i], 'A', 2 * MiB);
		}
		if (share >= 0)
			send_fd(share, fds[0]);
		/* Only the mappings stay: the scan must find them through maps, not fds. */
		close(fds[0]);
		close(fds[1]);
		if (pipe(g) < 0)
			_exit(73);
		gc = fork();
		if (gc < 0)
			_exit(73);
		if (gc == 0) {
			munmap(m[0], 2 * MiB);
			if (!keep_socket)
				close(sock);
			if (write(g[1], "g", 1) != 1)
				_exit(74);
			for (;;)
				pause();
		}
		if (read(g[0], &ok, 1) != 1) /* the grandchild has set itself up */
			_exit(74);
		r.grandchild = gc;
		if (!keep_socket)
			close(sock); /* the last reference: the connection closes while both still map */
		if (write(p[1], &r, sizeof(r)) != sizeof(r))
			_exit(74);
		if (keep_socket)
			_exit(0);
		for (;;)
			pause();
	}
	sec_read_report(p, rep, sizeof(*rep));
	return pid;
}

/* A plain process: uid, and whether it holds a lease of its own. It maps nothing of anyone's. */
static pid_t bystander(uid_t uid, bool own_lease, int recv_sock)
{
	int p[2];
	pid_t pid;

	pid = itest_fork_piped(p, NULL);
	if (pid == 0) {
		uint64_t id;
		int fds[8], sock;
		size_t nfds;

		close(p[0]);
		sec_drop_to(uid);
		if (own_lease) {
			sock = raw_connect(d.socket);
			if (sock < 0 || raw_hello(sock) != 0 || raw_acquire(sock, 2 * MiB, &id, fds, 8, &nfds) != 0)
				_exit(75);
			if (mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0) == MAP_FAILED)
				_exit(76);
		}
		if (recv_sock >= 0) {
			/* As a compositor maps a client's shm pool: another uid's memfd, received and mapped. */
			int fd = recv_fd(recv_sock);

			if (fd < 0 || mmap(NULL, 2 * MiB, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED)
				_exit(77);
			close(fd);
		}
		itest_child_ready(p, 78);
	}
	itest_wait_ready(p);
	return pid;
}

static void admin_revoke(uint64_t id)
{
	char *out = NULL;
	int rc = pinctl(&d, &out, "revoke %llu --deadline 300", (unsigned long long)id);

	ck_assert_msg(rc == 0, "pinctl revoke %llu: %d\n%s", (unsigned long long)id, rc, out);
	free(out);
}

START_TEST(test_revoke_reaches_the_child_of_a_parent_that_exited)
{
	struct report rep;
	pid_t client = dodging_client(true, -1, &rep);
	int st;

	/* The connecting process is gone; its child keeps the connection and the memory. */
	ck_assert_int_eq(waitpid(client, &st, 0), client);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	ck_assert_int_eq(status_leased(d.socket), (int64_t)LEASE_BYTES);

	admin_revoke(rep.lease_id);
	st = itest_wait_end(rep.grandchild, 5000);
	if (st == -1)
		itest_kill_and_reap(rep.grandchild);
	ck_assert_msg(st != -1, "the grandchild still maps lease %llu 5 s after a 300 ms deadline",
		      (unsigned long long)rep.lease_id);
	ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
	/* Its death closed the connection: the lease is back. */
	ck_assert_int_eq(wait_leased(d.socket, 0, 3000), 0);
}
END_TEST

START_TEST(test_revoke_spares_other_uids_and_processes_without_the_memory)
{
	struct report rep;
	int sp[2], st;
	pid_t b_mapper, a_other, client;
	char *log;

	/* uid B maps the lease's first chunk (A sent it the memfd); another uid-A process holds its own lease. */
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
	a_other = bystander(SEC_UID_A, true, -1);
	client = dodging_client(true, sp[0], &rep);
	b_mapper = bystander(SEC_UID_B, false, sp[1]);
	close(sp[0]);
	close(sp[1]);
	ck_assert_int_eq(waitpid(client, &st, 0), client);
	ck_assert_int_eq(status_leased(d.socket), (int64_t)(LEASE_BYTES + 2 * MiB));

	admin_revoke(rep.lease_id);
	st = itest_wait_end(rep.grandchild, 5000);
	if (st == -1)
		itest_kill_and_reap(rep.grandchild);
	ck_assert_msg(st != -1, "the grandchild survived enforcement");
	ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
	/* Enforcement is over once the lease is back (the STATUS reply comes after it). */
	ck_assert_int_eq(wait_leased(d.socket, (int64_t)(2 * MiB), 3000), (int64_t)(2 * MiB));

	/* Neither another uid mapping the memory nor the uid's unrelated process was signalled. */
	ck_assert_int_eq(itest_kill_and_reap(b_mapper), SIGKILL);
	ck_assert_int_eq(itest_kill_and_reap(a_other), SIGKILL);
	log = daemon_log(&d);
	{
		char needle[64];

		snprintf(needle, sizeof(needle), "to pid %d for overdue lease", (int)b_mapper);
		ck_assert_msg(!strstr(log, needle), "uid B's pid %d was signalled:\n%s", (int)b_mapper,
			      itest_tail(log));
		snprintf(needle, sizeof(needle), "to pid %d for overdue lease", (int)a_other);
		ck_assert_msg(!strstr(log, needle), "the unrelated pid %d was signalled", (int)a_other);
		snprintf(needle, sizeof(needle), "to pid %d for overdue lease", (int)rep.grandchild);
		ck_assert_msg(strstr(log, needle), "no log line for the grandchild's signal");
	}
	free(log);
}
END_TEST

START_TEST(test_revoke_of_a_ghost_lease_reaches_every_mapper)
{
	struct report rep;
	pid_t client = dodging_client(false, -1, &rep);
	int st;

	/*
	 * Both closed the connection; the client lives on, so the lease stays
	 * counted until it exits (a ghost lease with no connection to signal).
	 */
	ck_assert_int_eq(wait_leased(d.socket, (int64_t)LEASE_BYTES, 3000), (int64_t)LEASE_BYTES);
	admin_revoke(rep.lease_id);
	st = itest_wait_end(client, 5000);
	if (st == -1)
		itest_kill_and_reap(client);
	ck_assert_msg(st != -1, "the ghost lease's client was never signalled");
	ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	st = itest_wait_end(rep.grandchild, 5000);
	if (st == -1)
		itest_kill_and_reap(rep.grandchild);
	ck_assert_msg(st != -1, "the ghost lease's other mapper was never signalled");
	ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	ck_assert_int_eq(wait_leased(d.socket, 0, 3000), 0);
}
END_TEST

/* The pidfd names the process that connected, taken by the kernel at connect (not a pid looked up later). */
START_TEST(test_pidfd_comes_from_the_kernel_at_connect)
{
	struct utsname u;
	unsigned maj = 0, min = 0;
	char *log;
	int fd;

	ck_assert_int_eq(uname(&u), 0);
	sscanf(u.release, "%u.%u", &maj, &min);
	fd = raw_connect(d.socket);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(raw_hello(fd), 0);
	close(fd);
	log = daemon_log(&d);
	if (maj > 6 || (maj == 6 && min >= 5)) {
		ck_assert_msg(strstr(log, "pidfd from SO_PEERPIDFD"),
			      "the daemon did not take the peer's pidfd from SO_PEERPIDFD");
		ck_assert_msg(!strstr(log, "pidfd from pidfd_open"),
			      "a connection fell back to pidfd_open of a pid number");
	} else {
		/* Before 6.5 the documented fallback, and the log says so. */
		ck_assert_msg(strstr(log, "pidfd from pidfd_open (pid reuse possible)"),
			      "kernel %s: no fallback logged", u.release);
	}
	free(log);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("sec-05-signals");
	TCase *t, *k;

	/* pidfd_open and pidfd_send_signal: valgrind 3.19 lacks them, so its run excludes the tag "enforce". */
	t = CHECK_CASE(s, "enforce-sigterm", start_sigterm, stop, 60, test_pidfd_comes_from_the_kernel_at_connect,
		       test_revoke_reaches_the_child_of_a_parent_that_exited,
		       test_revoke_spares_other_uids_and_processes_without_the_memory);
	tcase_set_tags(t, "enforce");

	k = CHECK_CASE(s, "enforce-sigkill", start_sigkill, stop, 60,
		       test_revoke_of_a_ghost_lease_reaches_every_mapper);
	tcase_set_tags(k, "enforce");
	return s;
}

SEC_MAIN(suite)

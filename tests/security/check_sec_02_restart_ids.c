/* SPDX-License-Identifier: MIT */
/* Finding 2: after a restart without systemd, a lease handle from before must never free or reach another lease. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pinbroker.h"
#include "sec.h"

#define MiB (1024ull * 1024ull)
#define LEASE_BYTES (8 * MiB)
#define QUOTA "16M"

static const char *const args[] = { "--uid-quota", QUOTA, NULL };

static bool all_bytes(const uint8_t *p, size_t n, uint8_t v)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v)
			return false;
	return true;
}

struct waiting {
	pb_client *c;
	int r;
};

/* A call in flight when the daemon dies: it waits for quota that only A's own release could free. */
static void *waiting_acquire(void *arg)
{
	struct waiting *w = arg;
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_WAIT, .timeout_ms = 60000 };
	pb_lease *l = NULL;

	w->r = pb_acquire(w->c, 16 * MiB, &o, &l);
	return NULL;
}

/*
 * Holder A, step by step with the test: lease 1 with 'A', a waiting acquire in
 * flight, the kill, a call while the daemon is down, the restart, lease 1 again
 * (of the new instance) with 'N', then its old handle released. Exit codes say
 * which step failed.
 */
static void holder_a(int to_test, int from_test, const char *sock)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
	struct waiting w = { 0 };
	struct pb_status *st;
	pb_lease *old, *fresh;
	pb_client *c;
	pthread_t t;
	uint8_t *po, *pn;

	sec_drop_to(SEC_UID_A);
	if (pb_connect(sock, &c) < 0)
		_exit(10);
	if (pb_acquire(c, LEASE_BYTES, &o, &old) < 0 || pb_lease_id(old) != 1)
		_exit(11);
	po = pb_lease_data(old);
	memset(po, 'A', LEASE_BYTES);
	w.c = c;
	if (pthread_create(&t, NULL, waiting_acquire, &w) != 0)
		_exit(12);
	for (int i = 0;; i++) {
		uint32_t waiting = 0;

		if (pb_status_get(c, &st) == 0) {
			waiting = st->waiting_acquires;
			pb_status_free(st);
		}
		if (waiting == 1)
			break;
		if (i > 2000)
			_exit(13);
		usleep(1000);
	}
	itest_say(to_test, 'k');
	if (itest_hear(from_test, 30) != 'd')
		_exit(14);
	/* In flight when the daemon died: -ECONNRESET. */
	pthread_join(t, NULL);
	if (w.r != -ECONNRESET) {
		fprintf(stderr, "waiting acquire returned %d, not -ECONNRESET\n", w.r);
		_exit(15);
	}
	/* The next call tries to reconnect; with no daemon there, -ECONNRESET again. */
	if (pb_status_get(c, &st) != -ECONNRESET)
		_exit(16);
	itest_say(to_test, 'r');
	if (itest_hear(from_test, 30) != 'g')
		_exit(17);
	/* The next call after the restart reconnects: a fresh instance, whose ids start at 1 again. */
	if (pb_acquire(c, LEASE_BYTES, &o, &fresh) < 0) {
		fprintf(stderr, "acquire after the restart: %s\n", pb_last_error());
		_exit(18);
	}
	if (pb_lease_id(fresh) != 1)
		_exit(19);
	if (!pb_lease_stale(old) || pb_lease_stale(fresh))
		_exit(20);
	pn = pb_lease_data(fresh);
	memset(pn, 'N', LEASE_BYTES);
	/* Issue 22 finding 7: the old lease, still mapped here, stays counted by the new instance (orphaned). */
	if (pb_status_get(c, &st) < 0)
		_exit(27);
	if (st->leased_bytes != 2 * LEASE_BYTES || st->orphaned_bytes != LEASE_BYTES) {
		fprintf(stderr,
			"leased_bytes %llu, orphaned %llu with the old lease still mapped, want %llu and %llu\n",
			(unsigned long long)st->leased_bytes, (unsigned long long)st->orphaned_bytes,
			(unsigned long long)(2 * LEASE_BYTES), (unsigned long long)LEASE_BYTES);
		_exit(28);
	}
	pb_status_free(st);
	/* The step: releasing the old handle must not free lease 1 of the new instance. */
	if (pb_release(c, old) != 0)
		_exit(21);
	/* The stale release unmaps it: the new daemon's next look at /proc (orphan-rescan-ms) stops counting it. */
	for (int i = 0;; i++) {
		uint64_t orphaned;

		if (pb_status_get(c, &st) < 0)
			_exit(22);
		orphaned = st->orphaned_bytes;
		if (orphaned == 0)
			break;
		pb_status_free(st);
		if (i > 2000)
			_exit(29);
		usleep(10000);
	}
	if (st->leased_bytes != LEASE_BYTES) {
		fprintf(stderr, "leased_bytes %llu after releasing the stale handle, want %llu\n",
			(unsigned long long)st->leased_bytes, (unsigned long long)LEASE_BYTES);
		_exit(23);
	}
	pb_status_free(st);
	itest_say(to_test, 'b');
	/* B has taken and written everything it could: A's live buffer must be untouched. */
	if (itest_hear(from_test, 30) != 'v')
		_exit(24);
	if (!all_bytes(pn, LEASE_BYTES, 'N')) {
		fprintf(stderr, "A's live buffer was overwritten\n");
		_exit(25);
	}
	if (pb_release(c, fresh) != 0)
		_exit(26);
	pb_disconnect(c);
	_exit(0);
}

/* B: every lease it can get, none showing A's bytes; then it writes its own and holds until told. */
static void taker_b(uid_t uid, int to_test, int from_test, const char *sock)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
	pb_lease *got[64];
	size_t n = 0;
	pb_client *c;

	sec_drop_to(uid);
	if (pb_connect(sock, &c) < 0)
		_exit(40);
	while (n < 64 && pb_acquire(c, 2 * MiB, &o, &got[n]) == 0) {
		const uint8_t *p = pb_lease_data(got[n]);

		for (size_t i = 0; i < 2 * MiB; i++)
			if (p[i] == 'A' || p[i] == 'N') {
				fprintf(stderr, "B's lease %llu shows A's data at byte %zu\n",
					(unsigned long long)pb_lease_id(got[n]), i);
				_exit(41);
			}
		memset(pb_lease_data(got[n]), 'B', 2 * MiB);
		n++;
	}
	if (n == 0)
		_exit(42);
	itest_say(to_test, 'w');
	if (itest_hear(from_test, 30) != 'q')
		_exit(43);
	pb_disconnect(c);
	_exit(0);
}

static int reap(pid_t pid)
{
	int st = 0;

	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* In the test: the child's next step byte, or the test fails with the child's exit code. */
static void expect(int fd, char want, pid_t child, const char *who)
{
	char c = 0;

	if (read(fd, &c, 1) != 1 || c != want)
		ck_abort_msg("%s failed: exit code %d (see the numbered _exit calls)", who, reap(child));
}

static void scenario(uid_t uid_b)
{
	struct daemon d;
	int a_out[2], a_in[2], b_out[2], b_in[2];
	pid_t a, b;

	daemon_start(&d, args);
	a = itest_fork_piped(a_out, a_in);
	if (a == 0) {
		close(a_out[0]);
		close(a_in[1]);
		holder_a(a_out[1], a_in[0], d.socket);
	}
	close(a_out[1]);
	close(a_in[0]);

	expect(a_out[0], 'k', a, "holder A, before the kill");
	/* The restart in the middle: kill -9, no systemd, so the new daemon starts clean. */
	kill(d.pid, SIGKILL);
	ck_assert_int_eq(waitpid(d.pid, NULL, 0), d.pid);
	itest_say(a_in[1], 'd');
	expect(a_out[0], 'r', a, "holder A, while the daemon was down");
	daemon_restart(&d, args);
	itest_say(a_in[1], 'g');
	expect(a_out[0], 'b', a, "holder A, after the restart");

	b = itest_fork_piped(b_out, b_in);
	if (b == 0) {
		close(b_out[0]);
		close(b_in[1]);
		taker_b(uid_b, b_out[1], b_in[0], d.socket);
	}
	close(b_out[1]);
	close(b_in[0]);
	expect(b_out[0], 'w', b, "B");
	itest_say(a_in[1], 'v');
	ck_assert_int_eq(reap(a), 0);
	itest_say(b_in[1], 'q');
	ck_assert_int_eq(reap(b), 0);
	ck_assert_int_eq(daemon_stop(&d), 0);
}

START_TEST(test_stale_handle_after_restart_cannot_free_the_new_lease_one_uid)
{
	scenario(SEC_UID_A);
}
END_TEST

START_TEST(test_stale_handle_after_restart_cannot_free_the_new_lease_two_uids)
{
	scenario(SEC_UID_B);
}
END_TEST

CHECK_SUITE(suite, "sec-02-restart-ids", "restart without systemd", NULL, NULL, 90,
	    test_stale_handle_after_restart_cannot_free_the_new_lease_one_uid,
	    test_stale_handle_after_restart_cannot_free_the_new_lease_two_uids)

SEC_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/* Issue 22, finding 4: a revoke a holder starts on its own shared lease never signals an attacher of another uid; an admin revoke still does. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fdstore.h"
#include "sec.h"

#define MiB (1024ull * 1024ull)
#define LEASE_BYTES (2 * MiB)

static struct daemon d;
static const struct pb_acquire_opts no_cuda = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE, .label = "sec16" };

SEC_START(start_sigterm, d, "--revoke-enforce", "sigterm")

SEC_START(start_sigkill, d, "--revoke-enforce", "sigkill")

SEC_STOP(stop, d)

struct shared {
	char token[PB_SHARE_TOKEN_LEN];
	uint64_t id;
};

/*
 * The holder, uid A, with the library's defaults: acquires, fills and shares
 * a lease with uid B and reports the token. On a byte from rd it revokes its
 * own lease with a 1 ms deadline (self_revoke) and reports pb_admin_revoke's
 * result; then it keeps using the memory (it never gives it back).
 */
static pid_t holder(int *to, int *from)
{
	int a[2], b[2];
	pid_t pid;

	pid = itest_fork_piped(a, b);
	if (pid == 0) {
		uid_t grant = SEC_UID_B;
		struct shared sh;
		uint64_t *ids = NULL;
		size_t n = 0;
		pb_client *c;
		pb_lease *l;
		char go;
		int r;

		close(a[1]);
		close(b[0]);
		sec_drop_to(SEC_UID_A);
		if (pb_connect(d.socket, &c) < 0 || pb_acquire(c, LEASE_BYTES, &no_cuda, &l) < 0)
			_exit(70);
		memset(pb_lease_data(l), 'A', LEASE_BYTES);
		if (pb_lease_share(c, l, &grant, 1, sh.token) < 0)
			_exit(71);
		sh.id = pb_lease_id(l);
		if (write(b[1], &sh, sizeof(sh)) != sizeof(sh))
			_exit(72);
		if (read(a[0], &go, 1) != 1)
			_exit(73);
		if (go == 'r') {
			r = pb_admin_revoke(c, PB_REVOKE_LEASE, sh.id, 0, 1, &ids, &n);
			free(ids);
			if (write(b[1], &r, sizeof(r)) != sizeof(r))
				_exit(74);
		}
		for (;;)
			pause();
	}
	close(a[0]);
	close(b[1]);
	*to = a[1];
	*from = b[0];
	return pid;
}

/* The attacher, uid B, with the library's defaults: attaches by token, reads the holder's bytes, keeps the mapping. */
static pid_t attacher(const struct shared *sh)
{
	int p[2];
	pid_t pid;

	pid = itest_fork_piped(p, NULL);
	if (pid == 0) {
		pb_client *c;
		pb_lease *l;
		const char *m;

		close(p[0]);
		sec_drop_to(SEC_UID_B);
		if (pb_connect(d.socket, &c) < 0 || pb_attach(c, sh->token, &l) < 0)
			_exit(80);
		m = pb_lease_data(l);
		if (!m || m[0] != 'A' || m[LEASE_BYTES - 1] != 'A')
			_exit(81);
		itest_child_ready(p, 82);
	}
	itest_wait_ready(p);
	return pid;
}

/* The lease row of id as root sees it; false without one. */
static bool lease_row(uint64_t id, struct pb_lease_info *ret)
{
	struct pb_status *s = itest_status(d.socket);
	const struct pb_lease_info *r;
	bool found;

	ck_assert_ptr_nonnull(s);
	r = itest_lease_row(s, id);
	found = r != NULL;
	if (found) {
		*ret = *r;
		ret->label = ret->state = ret->job = NULL;
	}
	pb_status_free(s);
	return found;
}

/* Poll (bounded) until lease id has want attachers; the last count seen (-1: no row). */
static int wait_attachers(uint64_t id, uint32_t want, int timeout_ms)
{
	struct timespec ts = { 0, 20 * 1000 * 1000 };
	struct pb_lease_info li;
	int last = -1;

	for (int waited = 0; waited <= timeout_ms; waited += 20) {
		last = lease_row(id, &li) ? (int)li.attachers : -1;
		if (last == (int)want)
			break;
		nanosleep(&ts, NULL);
	}
	return last;
}

/*
 * Uid A shares with uid B, B attaches, A revokes its own lease with 1 ms:
 * past the deadline A's own process is signalled, B's is not; B is detached
 * from the lease on the daemon's books, which keep the bytes counted while B
 * still runs (it may map them) and let them go once B exits.
 */
static void holder_revoke_spares_attacher(int expect_sig)
{
	struct shared sh;
	pid_t a, b;
	int to, from, r, st;
	char *log;

	a = holder(&to, &from);
	ck_assert_int_eq(read(from, &sh, sizeof(sh)), (ssize_t)sizeof(sh));
	b = attacher(&sh);
	ck_assert_int_eq(wait_attachers(sh.id, 1, 5000), 1);

	ck_assert_int_eq(write(to, "r", 1), 1);
	ck_assert_int_eq(read(from, &r, sizeof(r)), (ssize_t)sizeof(r));
	ck_assert_msg(r == 0, "uid A's revoke of its own lease: %d", r);

	/* Enforcement reaches the holder's own process: the deadline floor plus a generous margin. */
	st = itest_wait_end(a, 15000);
	ck_assert_msg(st != -1, "uid A's holder was not signalled within 15 s of its own revoke");
	ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == expect_sig, "uid A's holder ended with status %#x", st);
	/* Not B's: it is detached instead. Its signal would have gone in the same enforcement step as A's. */
	ck_assert_msg(itest_wait_end(b, 1000) == -1, "uid B's attacher was killed by uid A's revoke of its own lease");
	ck_assert_int_eq(wait_attachers(sh.id, 0, 5000), 0);
	/* B may still map the pages: they stay counted while it runs. */
	ck_assert_int_eq(status_leased(d.socket), (int64_t)LEASE_BYTES);
	log = daemon_log(&d);
	ck_assert_ptr_nonnull(log);
	ck_assert_msg(strstr(log, "detached, not signalled"), "no detach logged:\n%s", log);
	free(log);

	ck_assert_int_eq(itest_kill_and_reap(b), SIGKILL);
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
	close(to);
	close(from);
}

START_TEST(test_holder_self_revoke_never_signals_another_uid_sigterm)
{
	holder_revoke_spares_attacher(SIGTERM);
}
END_TEST

START_TEST(test_holder_self_revoke_never_signals_another_uid_sigkill)
{
	holder_revoke_spares_attacher(SIGKILL);
}
END_TEST

/* An admin revoke (root) of the same kind of shared lease still enforces on every mapper, B's process too. */
START_TEST(test_admin_revoke_still_reaches_another_uids_attacher)
{
	struct shared sh;
	pid_t a, b;
	int to, from, st;
	char *out = NULL;

	a = holder(&to, &from);
	ck_assert_int_eq(read(from, &sh, sizeof(sh)), (ssize_t)sizeof(sh));
	b = attacher(&sh);
	ck_assert_int_eq(wait_attachers(sh.id, 1, 5000), 1);
	ck_assert_int_eq(pinctl(&d, &out, "revoke %llu --deadline 300", (unsigned long long)sh.id), 0);
	free(out);
	st = itest_wait_end(b, 15000);
	ck_assert_msg(st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM,
		      "uid B's attacher was not SIGTERMed by an admin revoke (status %#x)", st);
	ck_assert_int_eq(itest_kill_and_reap(a), SIGTERM);
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
	close(to);
	close(from);
}
END_TEST

/*
 * The same after a crash: the restarted daemon (the fd store kept the lease; a stand-in for systemd's) holds
 * B's recovered attach until B exits, as an exit hold on B's own uid, read from its process, not the lease's.
 * Uid A's revoke of its own lease must still reach A's process only.
 */
START_TEST(test_holder_self_revoke_after_a_crash_never_signals_another_uid)
{
	static const char *const args[] = { "--revoke-enforce", "sigterm", "--redeclare-grace-ms", "5000", NULL };
	struct fdstore *fs;
	struct shared sh;
	pid_t a, b;
	int to, from, r, st;

	daemon_prepare(&d);
	fs = fdstore_new(&d);
	fdstore_daemon_start(fs, args);
	a = holder(&to, &from);
	ck_assert_int_eq(read(from, &sh, sizeof(sh)), (ssize_t)sizeof(sh));
	b = attacher(&sh);
	ck_assert_int_eq(wait_attachers(sh.id, 1, 5000), 1);
	fdstore_daemon_kill(fs);
	fdstore_daemon_start(fs, args);

	/* A's first call reconnects to the same instance and re-declares its lease, then revokes it with 1 ms. */
	ck_assert_int_eq(write(to, "r", 1), 1);
	ck_assert_int_eq(read(from, &r, sizeof(r)), (ssize_t)sizeof(r));
	ck_assert_msg(r == 0, "uid A's revoke of its own lease after the restart: %d", r);
	st = itest_wait_end(a, 15000);
	ck_assert_msg(st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM,
		      "uid A's holder was not SIGTERMed after its own revoke (status %#x)", st);
	ck_assert_msg(itest_wait_end(b, 1000) == -1,
		      "uid B's attacher, recovered after the crash, was killed by uid A's revoke of its own lease");
	/* B may still map the pages: counted until it exits. */
	ck_assert_int_eq(status_leased(d.socket), (int64_t)LEASE_BYTES);
	ck_assert_int_eq(itest_kill_and_reap(b), SIGKILL);
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
	close(to);
	close(from);
	sec_stop_with_store(&d, fs);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("sec_16_holder_signal");

	CHECK_CASE(s, "sigterm", start_sigterm, stop, 60, test_holder_self_revoke_never_signals_another_uid_sigterm,
		   test_admin_revoke_still_reaches_another_uids_attacher);
	CHECK_CASE(s, "sigkill", start_sigkill, stop, 60, test_holder_self_revoke_never_signals_another_uid_sigkill);
	CHECK_CASE(s, "after a crash", NULL, NULL, 60, test_holder_self_revoke_after_a_crash_never_signals_another_uid);
	return s;
}

SEC_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/* Integration: shared leases across real processes and uids: same bytes, counted once, revoked everywhere, crash-safe. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fdstore.h"
#include "itest.h"
#include "pinbroker.h"
#include "check_main.h"

#define MiB (1024ull * 1024ull)
#define UID_A 61001
#define LEASE_BYTES (4 * MiB)

static struct daemon d;
static const struct pb_acquire_opts no_cuda = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE, .label = "share" };

ITEST_FIXTURE_START(start, d, NULL)

ITEST_FIXTURE_STOP(stop, d)

static void write_all(int fd, const void *p, size_t n)
{
	ck_assert_int_eq(write(fd, p, n), (ssize_t)n);
}

static void read_all(int fd, void *p, size_t n)
{
	ck_assert_int_eq(read(fd, p, n), (ssize_t)n);
}

/* Child side of a pipe read: 0 on a full read, else nonzero (the child exits with it). */
static int child_read(int fd, void *p, size_t n)
{
	return read(fd, p, n) == (ssize_t)n ? 0 : 1;
}

/* The lease row of id, as the daemon reports it; false if there is none. */
static bool lease_row(uint64_t id, struct pb_lease_info *ret)
{
	struct pb_status *s;
	pb_client *c;
	bool found = false;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_status_get(c, &s), 0);
	for (size_t i = 0; i < s->n_leases; i++)
		if (s->leases[i].id == id) {
			*ret = s->leases[i];
			ret->label = ret->state = NULL; /* freed with s */
			found = true;
		}
	pb_status_free(s);
	pb_disconnect(c);
	return found;
}

/* Poll until lease id has n attachers (or is gone when n < 0). Returns the last count seen (-1: no row). */
static int wait_attachers(uint64_t id, int n, int timeout_ms)
{
	struct pb_lease_info li;
	int seen = -1;

	for (int t = 0; t <= timeout_ms; t += 20) {
		seen = lease_row(id, &li) ? (int)li.attachers : -1;
		if (seen == n)
			break;
		usleep(20000);
	}
	return seen;
}

/* Poll until the daemon lists no connection of pid (it has handled its close). False after timeout_ms. */
static bool wait_client_gone(pid_t pid, int timeout_ms)
{
	for (int t = 0; t <= timeout_ms; t += 20) {
		struct pb_status *st = itest_status(d.socket);
		bool listed = false;

		for (size_t i = 0; i < st->n_clients; i++)
			listed |= st->clients[i].pid == pid;
		pb_status_free(st);
		if (!listed)
			return true;
		usleep(20000);
	}
	return false;
}

/*
 * Child: attach with the token read from rd, check the holder's pattern, write
 * 0x5a at offset 1, report the leased bytes it sees, then release on a byte
 * from rd (or die by SIGKILL meanwhile). Exit codes name the step that failed.
 */
static void attacher_child(int rd, int wr, uid_t uid)
{
	char token[PB_SHARE_TOKEN_LEN], go;
	pb_client *c;
	pb_lease *l;
	unsigned char *p;
	int64_t leased;
	int r;

	if (uid)
		itest_drop_to(uid);
	if (child_read(rd, token, sizeof(token)))
		_exit(80);
	if (pb_connect(d.socket, &c) < 0)
		_exit(81);
	r = pb_attach(c, token, &l);
	if (r < 0) {
		write_all(wr, &(int){ r }, sizeof(int));
		_exit(0);
	}
	write_all(wr, &(int){ 0 }, sizeof(int));
	p = pb_lease_data(l);
	if (!pb_lease_attached(l) || pb_lease_size(l) != LEASE_BYTES || p[0] != 0xa5 || p[LEASE_BYTES - 1] != 0xa5)
		_exit(82);
	p[1] = 0x5a;
	leased = status_leased(d.socket);
	write_all(wr, &leased, sizeof(leased));
	if (child_read(rd, &go, 1))
		_exit(83);
	if (pb_release(c, l) < 0)
		_exit(84);
	pb_disconnect(c);
	_exit(0);
}

/* Fork an attacher of uid (0: stay root); to_child and from_child talk to it. Returns its pid. */
static pid_t spawn_attacher(uid_t uid, int *to_child, int *from_child)
{
	int a[2], b[2];
	pid_t pid = itest_fork_piped(a, b);

	if (pid == 0) {
		close(a[1]);
		close(b[0]);
		attacher_child(a[0], b[1], uid);
	}
	close(a[0]);
	close(b[1]);
	*to_child = a[1];
	*from_child = b[0];
	return pid;
}

/*
 * An attacher spawned earlier (spawn_attacher, before the test connected: a fork must not find a client's receiver
 * thread running), handed token (PB_SHARE_TOKEN_LEN bytes): its pb_attach must return want.
 */
static void attacher_go(uid_t uid, const char *token, int want, int to_child, int from_child)
{
	int r;

	write_all(to_child, token, PB_SHARE_TOKEN_LEN);
	read_all(from_child, &r, sizeof(r));
	ck_assert_msg(r == want, "attacher of uid %u: pb_attach gave %d, want %d", (unsigned)uid, r, want);
}

static pb_lease *acquire_filled(pb_client *c)
{
	pb_lease *l;

	ck_assert_int_eq(pb_acquire(c, LEASE_BYTES, &no_cuda, &l), 0);
	memset(pb_lease_data(l), 0xa5, LEASE_BYTES);
	return l;
}

/* A fresh connection in *c with a filled lease shared (any uid of its own), its token in token. */
static pb_lease *connect_and_share(pb_client **c, char *token)
{
	pb_lease *l;

	ck_assert_int_eq(pb_connect(d.socket, c), 0);
	l = acquire_filled(*c);
	ck_assert_int_eq(pb_lease_share(*c, l, NULL, 0, token), 0);
	return l;
}

START_TEST(test_attacher_of_same_uid_sees_and_writes_the_same_bytes_counted_once)
{
	char token[PB_SHARE_TOKEN_LEN], token2[PB_SHARE_TOKEN_LEN], *out = NULL;
	struct pb_lease_info li;
	int to, from;
	int64_t leased;
	pb_client *c;
	pb_lease *l;
	pid_t pid = spawn_attacher(0, &to, &from);

	l = connect_and_share(&c, token);
	ck_assert_uint_eq(strlen(token), PB_SHARE_TOKEN_LEN - 1);
	/* One token per lease: sharing again gives the same one. */
	ck_assert_int_eq(pb_lease_share(c, l, NULL, 0, token2), 0);
	ck_assert_str_eq(token, token2);

	attacher_go(0, token, 0, to, from);
	read_all(from, &leased, sizeof(leased));
	/* Counted once: the attach added nothing. */
	ck_assert_int_eq(leased, (int64_t)LEASE_BYTES);
	ck_assert_uint_eq(((unsigned char *)pb_lease_data(l))[1], 0x5a);

	ck_assert(lease_row(pb_lease_id(l), &li));
	ck_assert_int_eq(li.shared, 1);
	ck_assert_uint_eq(li.attachers, 1);
	ck_assert_uint_eq(li.n_attacher_pids, 1);
	ck_assert_int_eq(li.attacher_pids[0], pid);
	/* The attacher's client row counts the attachment (the budget does not). */
	{
		struct pb_status *st;
		bool row = false;

		ck_assert_int_eq(pb_status_get(c, &st), 0);
		for (size_t i = 0; i < st->n_clients; i++)
			if (st->clients[i].pid == pid)
				row = st->clients[i].attached == 1 && st->clients[i].leases == 1 &&
				      st->clients[i].bytes == LEASE_BYTES;
		ck_assert_uint_eq(st->leased_bytes, LEASE_BYTES);
		pb_status_free(st);
		ck_assert_msg(row, "no client row for attacher pid %d with one attached lease", pid);
	}
	ck_assert_int_eq(pinctl(&d, &out, "leases"), 0);
	{
		char want[64];

		snprintf(want, sizeof(want), "shared: 1 attached (pid %d)", pid);
		ck_assert_msg(strstr(out, want), "pinctl leases does not show the attacher: %s", out);
	}
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "leases --json"), 0);
	ck_assert_msg(strstr(out, "\"attachers\":1"), "pinctl leases --json: %s", out);
	free(out);

	/* The holder lets go first: the lease lives on for its attacher, still counted once. */
	ck_assert_int_eq(pb_release(c, l), 0);
	ck_assert_int_eq(status_leased(d.socket), (int64_t)LEASE_BYTES);
	ck_assert(lease_row(li.id, &li));
	ck_assert_int_eq(li.holder_detached, 1);
	write_all(to, "x", 1);
	ck_assert_int_eq(itest_wait_exit(pid), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 2000), 0);
	close(to);
	close(from);
	pb_disconnect(c);
}
END_TEST

START_TEST(test_cross_uid_attach_refused_without_grant_and_allowed_with_one)
{
	char token[PB_SHARE_TOKEN_LEN], again[PB_SHARE_TOKEN_LEN];
	uid_t grant = UID_A;
	int to, from, to2, from2;
	int64_t leased;
	pb_client *c;
	pb_lease *l;
	pid_t pid = spawn_attacher(UID_A, &to, &from), pid2 = spawn_attacher(UID_A, &to2, &from2);

	l = connect_and_share(&c, token);

	attacher_go(UID_A, token, -EACCES, to, from);
	ck_assert_int_eq(itest_wait_exit(pid), 0);
	close(to);
	close(from);
	pid = pid2;
	to = to2;
	from = from2;

	/* The grant adds the uid to the same token. */
	ck_assert_int_eq(pb_lease_share(c, l, &grant, 1, again), 0);
	ck_assert_str_eq(token, again);
	/* At most 32 uids besides the holder's, over all calls; a refusal leaves the grant as it was. */
	{
		uid_t many[33];

		for (size_t i = 0; i < 33; i++)
			many[i] = 70000 + (uid_t)i;
		ck_assert_int_eq(pb_lease_share(c, l, many, 33, again), -EINVAL);
		ck_assert_int_eq(pb_lease_share(c, l, many, 32, again), -EINVAL); /* 31 fit beside UID_A */
		ck_assert_int_eq(pb_lease_share(c, l, many, 31, again), 0);
		ck_assert_str_eq(token, again);
	}
	attacher_go(UID_A, token, 0, to, from);
	read_all(from, &leased, sizeof(leased));
	ck_assert_uint_eq(((unsigned char *)pb_lease_data(l))[1], 0x5a);
	write_all(to, "x", 1);
	ck_assert_int_eq(itest_wait_exit(pid), 0);
	ck_assert_int_eq(wait_attachers(pb_lease_id(l), 0, 2000), 0);
	ck_assert_int_eq(status_leased(d.socket), (int64_t)LEASE_BYTES);
	ck_assert_int_eq(pb_release(c, l), 0);
	ck_assert_int_eq(status_leased(d.socket), 0);
	close(to);
	close(from);
	pb_disconnect(c);
}
END_TEST

START_TEST(test_forged_malformed_own_and_stale_tokens_refused)
{
	char token[PB_SHARE_TOKEN_LEN], forged[PB_SHARE_TOKEN_LEN];
	pb_client *c, *c2;
	pb_lease *l, *a;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_connect(d.socket, &c2), 0);
	l = acquire_filled(c);
	ck_assert_int_eq(pb_lease_share(c, l, NULL, 0, token), 0);

	/* One hex digit off: a forgery, refused like a token nobody holds. */
	memcpy(forged, token, sizeof(forged));
	forged[5] = forged[5] == '0' ? '1' : '0';
	ck_assert_int_eq(pb_attach(c2, forged, &a), -ENOENT);
	ck_assert_ptr_null(a);
	ck_assert_int_eq(pb_attach(c2, "00000000000000000000000000000000", &a), -ENOENT);
	ck_assert_int_eq(pb_attach(c2, "zz", &a), -ENOENT);
	ck_assert_int_eq(pb_attach(c2, "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz", &a), -ENOENT);
	/* The holder's own connection already maps it. */
	ck_assert_int_eq(pb_attach(c, token, &a), -EINVAL);

	/* A second connection of this process attaches; a second attach there is refused. */
	ck_assert_int_eq(pb_attach(c2, token, &a), 0);
	ck_assert_uint_eq(((unsigned char *)pb_lease_data(a))[0], 0xa5);
	{
		pb_lease *twice;

		ck_assert_int_eq(pb_attach(c2, token, &twice), -EINVAL);
	}
	/* An attached lease cannot be shared further, and never goes to the cache. */
	ck_assert_int_eq(pb_lease_share(c2, a, NULL, 0, forged), -EINVAL);
	ck_assert_int_eq(pb_release(c2, a), 0);
	ck_assert_int_eq(wait_attachers(pb_lease_id(l), 0, 1000), 0);

	/* Stale: the lease is gone, so its token names nothing. */
	ck_assert_int_eq(pb_release(c, l), 0);
	ck_assert_int_eq(status_leased(d.socket), 0);
	ck_assert_int_eq(pb_attach(c2, token, &a), -ENOENT);
	ck_assert_int_eq(status_leased(d.socket), 0);
	pb_disconnect(c2);
	pb_disconnect(c);
}
END_TEST

static atomic_int revokes_holder, revokes_attacher;

static int on_revoke_holder(pb_client *c, pb_lease *l, uint32_t deadline_ms, void *ud)
{
	atomic_fetch_add(&revokes_holder, 1);
	return 0;
}

static int on_revoke_attacher(pb_client *c, pb_lease *l, uint32_t deadline_ms, void *ud)
{
	atomic_fetch_add(&revokes_attacher, 1);
	return 0;
}

START_TEST(test_revoke_reaches_holder_and_attacher_and_frees_after_both)
{
	char token[PB_SHARE_TOKEN_LEN];
	pb_client *c, *c2;
	pb_lease *l, *a;
	uint64_t *ids = NULL;
	size_t nids = 0;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_connect(d.socket, &c2), 0);
	pb_set_revoke_callback(c, on_revoke_holder, NULL);
	pb_set_revoke_callback(c2, on_revoke_attacher, NULL);
	l = acquire_filled(c);
	ck_assert_int_eq(pb_lease_share(c, l, NULL, 0, token), 0);
	ck_assert_int_eq(pb_attach(c2, token, &a), 0);

	ck_assert_int_eq(pb_admin_revoke(c, 0, pb_lease_id(l), 0, 5000, &ids, &nids), 0);
	free(ids);
	for (int t = 0; t < 200 && (atomic_load(&revokes_holder) == 0 || atomic_load(&revokes_attacher) == 0); t++)
		usleep(10000);
	ck_assert_int_eq(atomic_load(&revokes_holder), 1);
	ck_assert_int_eq(atomic_load(&revokes_attacher), 1);
	/* Revoking: no new attacher. */
	{
		pb_client *c3;
		pb_lease *x;

		ck_assert_int_eq(pb_connect(d.socket, &c3), 0);
		ck_assert_int_eq(pb_attach(c3, token, &x), -ENOENT);
		pb_disconnect(c3);
	}
	ck_assert_int_eq(pb_release(c, l), 0);
	ck_assert_int_eq(status_leased(d.socket), (int64_t)LEASE_BYTES);
	ck_assert_int_eq(pb_release(c2, a), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 2000), 0);
	pb_disconnect(c2);
	pb_disconnect(c);
}
END_TEST

/* Sum of the lease rows against leased_bytes: the books stay exact. */
static void check_books(const char *where)
{
	struct pb_status *s;
	uint64_t sum = 0;
	pb_client *c;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_status_get(c, &s), 0);
	for (size_t i = 0; i < s->n_leases; i++)
		sum += s->leases[i].bytes;
	ck_assert_msg(sum == s->leased_bytes, "%s: leased_bytes %llu != sum of lease rows %llu", where,
		      (unsigned long long)s->leased_bytes, (unsigned long long)sum);
	pb_status_free(s);
	pb_disconnect(c);
}

START_TEST(test_attachers_killed_are_cleaned_up_and_accounting_stays_exact)
{
	char token[PB_SHARE_TOKEN_LEN];
	int to[5], from[5], r;
	int64_t leased;
	pb_client *c;
	pb_lease *l;
	pid_t pid[5];

	/* The fifth attaches after the first four are killed. */
	for (int i = 0; i < 5; i++)
		pid[i] = spawn_attacher(i % 2 ? UID_A : 0, &to[i], &from[i]);
	l = connect_and_share(&c, token);
	for (int i = 0; i < 4; i++) {
		if (i == 1) {
			uid_t g = UID_A;
			char same[PB_SHARE_TOKEN_LEN];

			ck_assert_int_eq(pb_lease_share(c, l, &g, 1, same), 0);
		}
		write_all(to[i], token, sizeof(token));
		read_all(from[i], &r, sizeof(r));
		ck_assert_int_eq(r, 0);
		read_all(from[i], &leased, sizeof(leased));
		ck_assert_int_eq(leased, (int64_t)LEASE_BYTES);
	}
	ck_assert_int_eq(wait_attachers(pb_lease_id(l), 4, 1000), 4);
	check_books("four attachers");
	/* Crash them all: the holder lives, so the lease stays, counted once. */
	for (int i = 0; i < 4; i++) {
		kill(pid[i], SIGKILL);
		ck_assert_int_eq(itest_wait_exit(pid[i]), 128 + SIGKILL);
		close(to[i]);
		close(from[i]);
	}
	ck_assert_int_eq(wait_attachers(pb_lease_id(l), 0, 2000), 0);
	ck_assert_int_eq(status_leased(d.socket), (int64_t)LEASE_BYTES);
	check_books("attachers killed, holder alive");

	/* The holder lets go with one attacher left; that attacher's crash ends the lease. */
	attacher_go(0, token, 0, to[4], from[4]);
	read_all(from[4], &leased, sizeof(leased));
	ck_assert_int_eq(pb_release(c, l), 0);
	ck_assert_int_eq(status_leased(d.socket), (int64_t)LEASE_BYTES);
	kill(pid[4], SIGKILL);
	ck_assert_int_eq(itest_wait_exit(pid[4]), 128 + SIGKILL);
	ck_assert_int_eq(wait_leased(d.socket, 0, 2000), 0);
	check_books("every mapper gone");
	close(to[4]);
	close(from[4]);
	pb_disconnect(c);
}
END_TEST

/* Child: acquire, share, send the token, then wait to be killed. */
static void holder_child(int wr, int rd)
{
	char token[PB_SHARE_TOKEN_LEN], go;
	pb_client *c;
	pb_lease *l;

	if (pb_connect(d.socket, &c) < 0 || pb_acquire(c, LEASE_BYTES, &no_cuda, &l) < 0)
		_exit(70);
	memset(pb_lease_data(l), 0xa5, LEASE_BYTES);
	if (pb_lease_share(c, l, NULL, 0, token) < 0)
		_exit(71);
	write_all(wr, token, sizeof(token));
	(void)!read(rd, &go, 1);
	_exit(0);
}

START_TEST(test_holder_killed_leaves_lease_to_attacher_until_it_releases)
{
	char token[PB_SHARE_TOKEN_LEN];
	int a[2], b[2];
	pb_client *c;
	pb_lease *l;
	pid_t pid = itest_fork_piped(a, b);

	if (pid == 0) {
		close(a[0]);
		close(b[1]);
		holder_child(a[1], b[0]);
	}
	close(a[1]);
	close(b[0]);
	read_all(a[0], token, sizeof(token));
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_attach(c, token, &l), 0);
	kill(pid, SIGKILL);
	ck_assert_int_eq(itest_wait_exit(pid), 128 + SIGKILL);
	/* The holder is gone (the daemon has dropped its connection); this process still maps the lease: it stays,
	 * counted once. */
	ck_assert(wait_client_gone(pid, 5000));
	ck_assert_int_eq(status_leased(d.socket), (int64_t)LEASE_BYTES);
	ck_assert_uint_eq(((unsigned char *)pb_lease_data(l))[LEASE_BYTES / 2], 0xa5);
	ck_assert_int_eq(pb_release(c, l), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 2000), 0);
	close(a[0]);
	close(b[1]);
	pb_disconnect(c);
}
END_TEST

/*
 * A restart that keeps the fd store: the holder re-declares, the attacher does
 * not (its handle goes stale), and the lease stays counted until the former
 * attacher exits, though the holder has let go: its pages must reach nobody
 * while a stale attacher still maps them.
 */
START_TEST(test_restart_keeps_lease_counted_until_former_attacher_exits)
{
	static const char *const args[] = { "--redeclare-grace-ms", "300", NULL };
	char token[PB_SHARE_TOKEN_LEN];
	struct fdstore *fs;
	int to, from;
	int64_t leased;
	pb_client *c;
	pb_lease *l;
	pid_t pid;

	daemon_prepare(&d);
	fs = fdstore_new(&d);
	fdstore_daemon_start(fs, args);
	pid = spawn_attacher(0, &to, &from);
	l = connect_and_share(&c, token);
	attacher_go(0, token, 0, to, from);
	read_all(from, &leased, sizeof(leased));

	fdstore_daemon_crash_restart(fs, args, c);
	ck_assert_int_eq(pb_lease_stale(l), 0);
	ck_assert_int_eq(status_leased(d.socket), (int64_t)LEASE_BYTES);

	/* The holder lets go; past the grace, the former attacher still holds it. */
	ck_assert_int_eq(pb_release(c, l), 0);
	/* The release is answered (pb_release waits for it); the grace ends by the daemon's clock, 300 ms after its start. */
	ck_assert(wait_daemon_uptime(d.socket, 300 + 500, 10000));
	ck_assert_int_eq(status_leased(d.socket), (int64_t)LEASE_BYTES);
	write_all(to, "x", 1);
	ck_assert_int_eq(itest_wait_exit(pid), 0);
	close(to);
	close(from);
	itest_end_clean(&d, c, 3000);
	fdstore_free(fs);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-share");

	CHECK_CASE(s, "share", start, stop, 60, test_attacher_of_same_uid_sees_and_writes_the_same_bytes_counted_once,
		   test_cross_uid_attach_refused_without_grant_and_allowed_with_one,
		   test_forged_malformed_own_and_stale_tokens_refused,
		   test_revoke_reaches_holder_and_attacher_and_frees_after_both,
		   test_attachers_killed_are_cleaned_up_and_accounting_stays_exact,
		   test_holder_killed_leaves_lease_to_attacher_until_it_releases);
	CHECK_CASE(s, "restart", NULL, NULL, 60, test_restart_keeps_lease_counted_until_former_attacher_exits);
	return s;
}

CHECK_MAIN(suite)

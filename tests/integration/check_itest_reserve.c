/* SPDX-License-Identifier: MIT */
/*
 * Integration: all-or-nothing reservations for a group of ranks on the real daemon. Eight rank processes of one
 * job race to reserve 8 shares of B: where only 7 x B fit every one is refused and nothing stays charged; where
 * 8 x B fit each takes its share. A share is at most B, there are at most 8, and the reservation ends on release,
 * when its ranks are killed, and on an admin revoke; a waiting reserve keeps its place behind an earlier waiting
 * acquire. Expected figures come from the shares and sizes asked, never from the daemon.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "itest.h"
#include "pinbroker.h"

#define MiB (1024ull * 1024)
#define RANKS 8
#define SHARE (2 * MiB)

static struct daemon d;

static void start_with(const char *budget)
{
	daemon_start(&d, ITEST_ARGS("--budget", budget, "--prewarm", "0", "--hugetlb", "no", "--thp", "no",
				    "--chunk-size", "2M", "--chunk-max", "2M", "--pool-shrink-delay-ms", "600000"));
}

static void start_eight(void)
{
	start_with("16M");
}

ITEST_FIXTURE_STOP(stop_daemon, d)

/* A rank: one connection, driven one command byte at a time; it answers each with the call's -errno (0: ok). */
struct rank {
	pid_t pid;
	int to[2], from[2];
};

static void rank_child(struct rank *rk, const char *name, uint32_t shares, uint64_t share_bytes)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA, .label = "share" };
	pb_client *c = NULL;
	pb_lease *l = NULL;
	uint64_t id = 0;

	itest_child_ends(rk->to, rk->from);
	if (pb_connect(d.socket, &c) < 0)
		_exit(70);
	itest_say(rk->from[1], 0);
	for (;;) {
		char cmd = itest_hear(rk->to[0], 60);
		int r = 0;

		switch (cmd) {
		case 'r': /* reserve or join */
			r = pb_reserve(c, name, shares, share_bytes, 0, 0, &id);
			break;
		case 'w': /* the same, waiting up to 20 s */
			r = pb_reserve(c, name, shares, share_bytes, PB_ACQUIRE_WAIT, 20000, &id);
			break;
		case 'a': /* this rank's share */
			r = pb_acquire_from(c, id, share_bytes, &o, &l);
			break;
		case 'A': /* a share and a page more */
			r = pb_acquire_from(c, id, share_bytes + 4096, &o, &l);
			break;
		case 'x':
			r = pb_reservation_release(c, id);
			break;
		case 'q':
			pb_disconnect(c);
			_exit(0);
		default:
			_exit(71);
		}
		itest_say(rk->from[1], (char)-r);
	}
}

static void rank_start(struct rank *rk, const char *name, uint32_t shares, uint64_t share_bytes)
{
	rk->pid = itest_fork_piped(rk->to, rk->from);
	if (rk->pid == 0)
		rank_child(rk, name, shares, share_bytes);
	itest_parent_ends(rk->to, rk->from);
	ck_assert_int_eq(itest_hear(rk->from[0], 30), 0);
}

/* Send cmd; the rank's answer as -errno. */
static int rank_do(struct rank *rk, char cmd)
{
	itest_say(rk->to[1], cmd);
	return -(int)(unsigned char)itest_hear(rk->from[0], 30);
}

static void rank_kill(struct rank *rk)
{
	itest_kill_and_reap(rk->pid);
	close(rk->to[1]);
	close(rk->from[0]);
}

/* The daemon's books: leased bytes (reservations' untaken bytes included) and reserved-not-taken bytes. */
static void books(uint64_t *leased, uint64_t *reserved, size_t *nres)
{
	struct pb_status *s = itest_status(d.socket);
	struct pb_reservation_info *rows = NULL;
	pb_client *c;

	*leased = s->leased_bytes;
	pb_status_free(s);
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_reservations(c, &rows, nres, reserved), 0);
	free(rows);
	pb_disconnect(c);
}

static void assert_books(uint64_t leased, uint64_t reserved, const char *what)
{
	uint64_t l, r;
	size_t n;

	books(&l, &r, &n);
	ck_assert_msg(l == leased && r == reserved, "%s: leased %llu reserved %llu, want %llu and %llu", what,
		      (unsigned long long)l, (unsigned long long)r, (unsigned long long)leased,
		      (unsigned long long)reserved);
}

/* Wait up to 10 s for the books to read so (a closed connection is reaped on the daemon's next turn). */
static void wait_books(uint64_t leased, uint64_t reserved, const char *what)
{
	uint64_t l = 0, r = 0;
	size_t n;

	for (int i = 0; i < 500; i++) {
		books(&l, &r, &n);
		if (l == leased && r == reserved)
			return;
		usleep(20000);
	}
	ck_abort_msg("%s: leased %llu reserved %llu, want %llu and %llu", what, (unsigned long long)l,
		     (unsigned long long)r, (unsigned long long)leased, (unsigned long long)reserved);
}

/* Every rank sends its reserve before any answer is read: they race in the daemon. */
static void race_reserve(struct rank *rk, int *res)
{
	for (int i = 0; i < RANKS; i++)
		itest_say(rk[i].to[1], 'r');
	for (int i = 0; i < RANKS; i++)
		res[i] = -(int)(unsigned char)itest_hear(rk[i].from[0], 30);
}

START_TEST(test_eight_ranks_over_budget_are_all_refused_and_nothing_charged)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE, .label = "other job" };
	struct rank rk[RANKS];
	int res[RANKS];
	pb_client *other;
	pb_lease *l;

	/* The ranks forked before this process connects: no receiver thread is running at a fork. */
	for (int i = 0; i < RANKS; i++)
		rank_start(&rk[i], "kv-pool", RANKS, SHARE);
	/* Another user holds 1M of the 16M budget: 7 shares of 2M fit, 8 do not. */
	ck_assert_int_eq(pb_connect(d.socket, &other), 0);
	ck_assert_int_eq(pb_acquire(other, 1 * MiB, &o, &l), 0);
	race_reserve(rk, res);
	for (int i = 0; i < RANKS; i++)
		ck_assert_msg(res[i] == -ENOSPC, "rank %d: reserve gave %d (%s), want -ENOSPC (8 x 2M over 15M free)",
			      i, res[i], strerror(-res[i]));
	assert_books(1 * MiB, 0, "after eight refusals");
	for (int i = 0; i < RANKS; i++)
		ck_assert_int_eq(rank_do(&rk[i], 'a'), -EINVAL); /* nothing joined: no share to take */
	assert_books(1 * MiB, 0, "after eight refused shares");
	for (int i = 0; i < RANKS; i++)
		rank_kill(&rk[i]);
	pb_release(other, l);
	pb_disconnect(other);
	wait_books(0, 0, "all gone");
}
END_TEST

START_TEST(test_eight_ranks_that_fit_each_take_one_share)
{
	struct rank rk[RANKS];
	int res[RANKS];

	for (int i = 0; i < RANKS; i++)
		rank_start(&rk[i], "kv-pool", RANKS, SHARE);
	race_reserve(rk, res);
	for (int i = 0; i < RANKS; i++)
		ck_assert_msg(res[i] == 0, "rank %d: reserve gave %d (%s)", i, res[i], strerror(-res[i]));
	assert_books(RANKS * SHARE, RANKS * SHARE, "reserved, nothing taken");
	/* A share and a page more is refused; nothing moves. */
	ck_assert_int_eq(rank_do(&rk[0], 'A'), -EINVAL);
	for (int i = 0; i < RANKS; i++)
		itest_say(rk[i].to[1], 'a');
	for (int i = 0; i < RANKS; i++)
		ck_assert_int_eq(-(int)(unsigned char)itest_hear(rk[i].from[0], 30), 0);
	/* Charged once: the shares moved from the reservation to the leases. */
	assert_books(RANKS * SHARE, 0, "every share taken");
	/* A ninth share: every one is taken. */
	ck_assert_int_eq(rank_do(&rk[3], 'a'), -EUSERS);
	assert_books(RANKS * SHARE, 0, "after a ninth share was refused");
	for (int i = 0; i < RANKS; i++) {
		itest_say(rk[i].to[1], 'q');
		ck_assert_int_eq(itest_wait_exit(rk[i].pid), 0);
		close(rk[i].to[1]);
		close(rk[i].from[0]);
	}
	wait_books(0, 0, "ranks gone");
}
END_TEST

START_TEST(test_release_gives_back_the_untaken_shares_only)
{
	struct rank a, b;

	rank_start(&a, "grp", 4, SHARE);
	rank_start(&b, "grp", 4, SHARE);
	ck_assert_int_eq(rank_do(&a, 'r'), 0);
	ck_assert_int_eq(rank_do(&b, 'r'), 0);
	assert_books(4 * SHARE, 4 * SHARE, "reserved");
	ck_assert_int_eq(rank_do(&b, 'a'), 0);
	assert_books(4 * SHARE, 3 * SHARE, "one share taken");
	ck_assert_int_eq(rank_do(&a, 'x'), 0);
	assert_books(SHARE, 0, "released: the taken share is a lease");
	/* Gone: a share can no longer be taken, nor released twice. */
	ck_assert_int_eq(rank_do(&a, 'a'), -EINVAL);
	ck_assert_int_eq(rank_do(&b, 'x'), -ENOENT);
	rank_kill(&a);
	rank_kill(&b);
	wait_books(0, 0, "ranks gone");
}
END_TEST

START_TEST(test_ranks_killed_end_the_reservation)
{
	struct rank rk[4];

	for (int i = 0; i < 4; i++) {
		rank_start(&rk[i], "grp", 4, SHARE);
		ck_assert_int_eq(rank_do(&rk[i], 'r'), 0);
	}
	ck_assert_int_eq(rank_do(&rk[0], 'a'), 0);
	assert_books(4 * SHARE, 3 * SHARE, "reserved, one share taken");
	for (int i = 0; i < 3; i++)
		rank_kill(&rk[i]);
	/* One rank lives: the reservation stays (rank 0's lease went with it). */
	wait_books(3 * SHARE, 3 * SHARE, "three ranks killed");
	rank_kill(&rk[3]);
	wait_books(0, 0, "last rank killed");
}
END_TEST

START_TEST(test_admin_revoke_ends_it_and_revokes_its_leases)
{
	struct rank a;
	struct pb_reservation_info *rows = NULL;
	uint64_t *ids = NULL, reserved;
	size_t n = 0, nrows = 0;
	pb_client *admin;

	rank_start(&a, "grp", 2, SHARE);
	ck_assert_int_eq(rank_do(&a, 'r'), 0);
	ck_assert_int_eq(rank_do(&a, 'a'), 0);
	ck_assert_int_eq(pb_connect(d.socket, &admin), 0);
	ck_assert_int_eq(pb_reservations(admin, &rows, &nrows, &reserved), 0);
	ck_assert_uint_eq(nrows, 1);
	ck_assert_str_eq(rows[0].name, "grp");
	ck_assert_uint_eq(rows[0].shares, 2);
	ck_assert_uint_eq(rows[0].taken, 1);
	ck_assert_uint_eq(rows[0].bytes_reserved, SHARE);
	ck_assert_uint_eq(reserved, SHARE);
	ck_assert_int_eq(pb_admin_revoke(admin, PB_REVOKE_RESERVATION, rows[0].id, 0, 100, &ids, &n), 0);
	ck_assert_uint_eq(n, 1); /* the one share's lease */
	free(ids);
	free(rows);
	/* The reservation is gone at once; its lease goes when its holder gives it back (the library does). */
	ck_assert_int_eq(pb_reservations(admin, &rows, &nrows, &reserved), 0);
	ck_assert_uint_eq(nrows, 0);
	ck_assert_uint_eq(reserved, 0);
	pb_disconnect(admin);
	rank_kill(&a);
	wait_books(0, 0, "rank gone");
}
END_TEST

START_TEST(test_join_with_other_shares_is_refused)
{
	struct rank a, b;

	rank_start(&a, "grp", 4, SHARE);
	rank_start(&b, "grp", 3, SHARE);
	ck_assert_int_eq(rank_do(&a, 'r'), 0);
	ck_assert_int_eq(rank_do(&b, 'r'), -EINVAL);
	assert_books(4 * SHARE, 4 * SHARE, "after a mismatched join");
	rank_kill(&a);
	rank_kill(&b);
	wait_books(0, 0, "ranks gone");
}
END_TEST

START_TEST(test_pinctl_lists_and_revokes_a_reservation)
{
	struct rank a;
	char *out = NULL, want[64];
	size_t n;
	uint64_t l, r;

	rank_start(&a, "kv-pool", 3, SHARE);
	ck_assert_int_eq(rank_do(&a, 'r'), 0);
	ck_assert_int_eq(rank_do(&a, 'a'), 0);
	ck_assert_int_eq(pinctl(&d, &out, "reservations --json"), 0);
	ck_assert_msg(strstr(out, "\"name\":\"kv-pool\"") && strstr(out, "\"shares\":3,\"share_bytes\":2097152,"
									 "\"taken\":1,\"bytes_reserved\":4194304"),
		      "pinctl reservations --json: %s", out);
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "metrics"), 0);
	ck_assert_msg(itest_metrics_sample(out, "pinbroker_reserved_bytes") == 2 * SHARE, "metrics: %s",
		      itest_tail(out));
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "reservations -o id --no-headers"), 0);
	snprintf(want, sizeof(want), "revoke --reservation %d --deadline 100", atoi(out));
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "%s", want), 0);
	ck_assert_msg(strstr(out, "revoking 1 lease"), "pinctl revoke --reservation: %s", out);
	free(out);
	books(&l, &r, &n);
	ck_assert_uint_eq(n, 0);
	ck_assert_uint_eq(r, 0);
	rank_kill(&a);
	wait_books(0, 0, "rank gone");
}
END_TEST

/* Wait up to 10 s for the daemon to count n waiting acquires. */
static void wait_waiting(uint32_t n)
{
	for (int i = 0; i < 500; i++) {
		struct pb_status *s = itest_status(d.socket);
		uint32_t w = s->waiting_acquires;

		pb_status_free(s);
		if (w == n)
			return;
		usleep(20000);
	}
	ck_abort_msg("the daemon never counted %u waiting acquires", n);
}

START_TEST(test_waiting_reserve_keeps_its_place_behind_an_earlier_acquire)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
	struct pb_acquire_opts ow = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE | PB_ACQUIRE_WAIT,
				      .timeout_ms = 20000 };
	struct rank r;
	pb_client *holder, *waiter;
	pb_lease *big, *w = NULL;
	int to[2], from[2];
	pid_t acq;

	/* The acquirer and the rank forked before this process connects: no receiver thread is running at a fork. */
	acq = itest_fork_piped(to, from);
	if (acq == 0) {
		itest_child_ends(to, from);
		if (itest_hear(to[0], 60) != 's' || pb_connect(d.socket, &waiter) < 0 ||
		    pb_acquire(waiter, 14 * MiB, &ow, &w) < 0)
			_exit(72);
		itest_say(from[1], 'g');
		itest_hear(to[0], 60);
		_exit(0); /* its lease goes with it */
	}
	itest_parent_ends(to, from);
	rank_start(&r, "grp", 2, SHARE);
	/* The whole 16M budget held; then a 14M acquire waits, then a reserve of 2 x 2M. */
	ck_assert_int_eq(pb_connect(d.socket, &holder), 0);
	ck_assert_int_eq(pb_acquire(holder, 16 * MiB, &o, &big), 0);
	itest_say(to[1], 's');
	wait_waiting(1);
	itest_say(r.to[1], 'w');
	wait_waiting(2);
	/*
	 * 16M back: the acquire first (FIFO), and the 2M left do not fit the reserve, which waits on. Had the reserve
	 * gone first (4M), the acquire's 14M would not fit.
	 */
	pb_release(holder, big);
	ck_assert_int_eq(itest_hear(from[0], 30), 'g');
	assert_books(14 * MiB, 0, "the earlier acquire granted, the reserve still waiting");
	wait_waiting(1);
	/* The acquire's 14M back: the reserve is granted. */
	itest_say(to[1], 'q');
	ck_assert_int_eq(itest_wait_exit(acq), 0);
	ck_assert_int_eq(-(int)(unsigned char)itest_hear(r.from[0], 30), 0);
	assert_books(2 * SHARE, 2 * SHARE, "the reserve granted");
	rank_kill(&r);
	pb_disconnect(holder);
	wait_books(0, 0, "all gone");
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-reserve");

	CHECK_CASE(s, "eight-fit", start_eight, stop_daemon, 120,
		   test_eight_ranks_over_budget_are_all_refused_and_nothing_charged,
		   test_eight_ranks_that_fit_each_take_one_share, test_release_gives_back_the_untaken_shares_only,
		   test_ranks_killed_end_the_reservation, test_admin_revoke_ends_it_and_revokes_its_leases,
		   test_join_with_other_shares_is_refused, test_pinctl_lists_and_revokes_a_reservation,
		   test_waiting_reserve_keeps_its_place_behind_an_earlier_acquire);
	return s;
}

CHECK_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the reservation table and its charges (core/reservation.c): all or nothing against the budget, the
 * uid's quota and the job's; joins; one share per acquire, at most a share each, moved from the reservation to the
 * lease with the books exact after every step; the ends (release, the last member gone).
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"
#include "brokerfix.h"
#include "budget.h"
#include "check_main.h"
#include "jobs.h"
#include "lease.h"
#include "poolmodel.h"
#include "reservation.h"

static int rank[8];

static enum broker_refusal reserve(struct broker *b, uid_t uid, const void *owner, const char *name, uint32_t n,
				   uint64_t bytes, struct job_cgroup *cg, struct reservation **ret,
				   enum reservation_error *rerr)
{
	struct reserve_args a = { .uid = uid,
				  .owner = owner,
				  .cgroup = cg,
				  .name = name,
				  .shares = n,
				  .share_bytes = bytes,
				  .page_bytes = 4 * KIB,
				  .now_ms = 5 };
	enum reservation_error e;
	struct reservation *r = NULL;
	bool joined;
	int err;
	enum broker_refusal v = broker_reserve(b, &a, &r, &joined, rerr ? rerr : &e, &err);

	if (ret)
		*ret = v == REFUSAL_NONE ? r : NULL;
	return v;
}

static enum broker_refusal take(struct broker *b, struct reservation *r, const void *owner, uint64_t size,
				struct lease **ret)
{
	struct acquire_args a = { .uid = r->uid,
				  .gid = r->uid,
				  .pid = 1,
				  .owner = (void *)owner,
				  .size = size,
				  .priority = LEASE_PRIO_NORMAL,
				  .label = "share",
				  .now_ms = 6,
				  .reservation = r,
				  .cgroup = r->cgroup };
	struct lease *l = NULL;
	enum broker_refusal v = pool_model_acquire(b, &a, &l, &last_err);

	if (ret)
		*ret = l;
	return v;
}

START_TEST(test_reserve_over_budget_charges_nothing)
{
	struct broker *b = new_broker(16 * MIB, 0, 0);
	struct lease *other;

	ck_assert_int_eq(acquire(b, UID_B, &conn_b, 1 * MIB, &other), REFUSAL_NONE);
	/* 8 x 2M = 16M, 15M free: refused whole, and nothing moved. */
	ck_assert_int_eq(reserve(b, UID_A, &rank[0], "kv", 8, 2 * MIB, NULL, NULL, NULL), REFUSAL_BUDGET);
	ck_assert_uint_eq(budget_leased(b->budget), 1 * MIB);
	ck_assert_uint_eq(budget_uid_leased(b->budget, UID_A), 0);
	ck_assert_ptr_null(reservation_first(b));
	/* 7 x 2M fits. */
	ck_assert_int_eq(reserve(b, UID_A, &rank[0], "kv", 7, 2 * MIB, NULL, NULL, NULL), REFUSAL_NONE);
	ck_assert_uint_eq(budget_leased(b->budget), 15 * MIB);
	check_books(b);
	/* Reserved bytes count as used: another job gets the 1M left, not a page more. */
	ck_assert_int_eq(acquire(b, UID_B, &conn_b, 1 * MIB + 4 * KIB, NULL), REFUSAL_BUDGET);
	free_broker(b);
}
END_TEST

START_TEST(test_reserve_over_uid_quota_and_whole_budget_refused)
{
	struct broker *b = new_broker(64 * MIB, 8 * MIB, 0);

	ck_assert_int_eq(reserve(b, UID_A, &rank[0], "kv", 5, 2 * MIB, NULL, NULL, NULL), REFUSAL_TOO_LARGE);
	ck_assert_int_eq(reserve(b, UID_A, &rank[0], "kv", 4, 2 * MIB, NULL, NULL, NULL), REFUSAL_NONE);
	ck_assert_int_eq(reserve(b, UID_A, &rank[0], "kv2", 1, 4 * KIB, NULL, NULL, NULL), REFUSAL_UID_QUOTA);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_reserve_over_job_quota_refused)
{
	struct broker *b = new_broker(64 * MIB, 0, 0);
	struct job_cgroup *cg;
	const char *why;

	ck_assert_int_eq(jobs_new(&b->jobs), 0);
	ck_assert_int_eq(jobs_rule_set(b->jobs, "/job", 8 * MIB, JOB_RULE_SET, &why), 0);
	ck_assert_int_eq(jobs_cgroup_get(b->jobs, "/job/step", &cg), 0);
	ck_assert_int_eq(reserve(b, UID_A, &rank[0], "kv", 5, 2 * MIB, cg, NULL, NULL), REFUSAL_JOB_QUOTA);
	ck_assert_uint_eq(cg->job->bytes, 0);
	ck_assert_int_eq(reserve(b, UID_A, &rank[0], "kv", 4, 2 * MIB, cg, NULL, NULL), REFUSAL_NONE);
	ck_assert_uint_eq(cg->job->bytes, 8 * MIB);
	while (reservation_first(b))
		broker_reservation_end(b, (struct reservation *)reservation_first(b));
	ck_assert_uint_eq(cg->job->bytes, 0);
	jobs_cgroup_put(b->jobs, cg);
	jobs_free(b->jobs);
	b->jobs = NULL;
	free_broker(b);
}
END_TEST

START_TEST(test_join_same_shape_mismatch_refused)
{
	struct broker *b = new_broker(64 * MIB, 0, 0);
	struct reservation *r1, *r2;
	enum reservation_error e;

	ck_assert_int_eq(reserve(b, UID_A, &rank[0], "kv", 4, 2 * MIB, NULL, &r1, NULL), REFUSAL_NONE);
	ck_assert_int_eq(reserve(b, UID_A, &rank[1], "kv", 4, 2 * MIB, NULL, &r2, NULL), REFUSAL_NONE);
	ck_assert_ptr_eq(r1, r2);
	ck_assert_uint_eq(r1->nmembers, 2);
	ck_assert_uint_eq(budget_leased(b->budget), 8 * MIB); /* charged once */
	ck_assert_int_ne(reserve(b, UID_A, &rank[2], "kv", 3, 2 * MIB, NULL, NULL, &e), REFUSAL_NONE);
	ck_assert_int_eq(e, RESERVATION_MISMATCH);
	ck_assert_int_ne(reserve(b, UID_A, &rank[2], "kv", 4, 1 * MIB, NULL, NULL, &e), REFUSAL_NONE);
	ck_assert_int_eq(e, RESERVATION_MISMATCH);
	/* Another uid's group of the same name is its own. */
	ck_assert_int_eq(reserve(b, UID_B, &rank[3], "kv", 1, 2 * MIB, NULL, &r2, NULL), REFUSAL_NONE);
	ck_assert_ptr_ne(r1, r2);
	ck_assert_int_ne(reserve(b, UID_A, &rank[2], "", 1, 2 * MIB, NULL, NULL, &e), REFUSAL_NONE);
	ck_assert_int_eq(e, RESERVATION_INVALID);
	ck_assert_int_ne(reserve(b, UID_A, &rank[2], "z", 0, 2 * MIB, NULL, NULL, &e), REFUSAL_NONE);
	ck_assert_int_eq(e, RESERVATION_INVALID);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_shares_move_to_leases_with_the_books_exact)
{
	struct broker *b = new_broker(16 * MIB, 0, 0);
	struct reservation *r;
	struct lease *l[8];

	ck_assert_int_eq(reserve(b, UID_A, &rank[0], "kv", 8, 2 * MIB, NULL, &r, NULL), REFUSAL_NONE);
	ck_assert_int_eq(take(b, r, &rank[0], 2 * MIB + 1, NULL), REFUSAL_OVER_SHARE);
	for (int i = 0; i < 8; i++) {
		ck_assert_int_eq(take(b, r, &rank[i], 2 * MIB, &l[i]), REFUSAL_NONE);
		ck_assert_uint_eq(l[i]->reservation_id, r->id);
		/* Always the whole budget, never more: moved, not added. */
		ck_assert_uint_eq(budget_leased(b->budget), 16 * MIB);
		ck_assert_uint_eq(broker_reserved_bytes(b), (uint64_t)(7 - i) * 2 * MIB);
		check_books(b);
	}
	ck_assert_int_eq(take(b, r, &rank[0], 4 * KIB, NULL), REFUSAL_SHARES_TAKEN);
	free_broker(b);
}
END_TEST

START_TEST(test_smaller_share_gives_the_rest_back)
{
	struct broker *b = new_broker(16 * MIB, 0, 0);
	struct reservation *r;

	ck_assert_int_eq(reserve(b, UID_A, &rank[0], "kv", 2, 2 * MIB, NULL, &r, NULL), REFUSAL_NONE);
	ck_assert_int_eq(take(b, r, &rank[0], 1 * MIB, NULL), REFUSAL_NONE);
	ck_assert_uint_eq(budget_leased(b->budget), 3 * MIB);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_end_on_release_and_on_last_member)
{
	struct broker *b = new_broker(16 * MIB, 0, 0);
	struct reservation *r;
	size_t ended;

	ck_assert_int_eq(reserve(b, UID_A, &rank[0], "kv", 4, 2 * MIB, NULL, &r, NULL), REFUSAL_NONE);
	ck_assert_int_eq(reserve(b, UID_A, &rank[1], "kv", 4, 2 * MIB, NULL, &r, NULL), REFUSAL_NONE);
	ck_assert_int_eq(take(b, r, &rank[0], 2 * MIB, NULL), REFUSAL_NONE);
	ck_assert_uint_eq(broker_reservations_drop_owner(b, &rank[0], &ended), 0);
	ck_assert_uint_eq(ended, 0);
	ck_assert_uint_eq(broker_reservations_drop_owner(b, &rank[1], &ended), 6 * MIB);
	ck_assert_uint_eq(ended, 1);
	ck_assert_ptr_null(reservation_first(b));
	ck_assert_uint_eq(budget_leased(b->budget), 2 * MIB); /* the taken share is an ordinary lease */
	check_books(b);
	ck_assert_int_eq(reserve(b, UID_A, &rank[2], "kv", 2, 2 * MIB, NULL, &r, NULL), REFUSAL_NONE);
	ck_assert_uint_eq(broker_reservation_end(b, r), 4 * MIB);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_critical_refuses_a_reserve)
{
	struct broker *b = new_broker(16 * MIB, 0, 0);

	(void)broker_set_pressure(b, BROKER_CRITICAL);
	ck_assert_int_eq(reserve(b, UID_A, &rank[0], "kv", 2, 2 * MIB, NULL, NULL, NULL), REFUSAL_CRITICAL);
	ck_assert_uint_eq(budget_leased(b->budget), 0);
	(void)broker_set_pressure(b, BROKER_NORMAL);
	free_broker(b);
}
END_TEST

/* Reservations alive for uid, counted here rather than by the function under test. */
static size_t alive_of(const struct broker *b, uid_t uid)
{
	size_t n = 0;

	for (const struct reservation *r = reservation_first(b); r; r = r->next)
		n += r->uid == uid;
	return n;
}

START_TEST(test_uid_at_its_reservation_cap_is_refused_another_uid_reserves)
{
	struct broker *b = new_broker(64 * MIB, 0, 0);
	enum reservation_error rerr;
	struct reservation *r[3], *joined;
	const char *names[] = { "a0", "a1", "a2" };

	ck_assert_uint_eq(b->settings.max_reservations_per_uid, 16); /* the fixture keeps the key's default */
	b->settings.max_reservations_per_uid = 3;
	/* The smallest reservations there are (one share of one page): only the count can stop them. */
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(reserve(b, UID_A, &rank[i], names[i], 1, 4 * KIB, NULL, &r[i], &rerr), REFUSAL_NONE);
	ck_assert_int_eq(reserve(b, UID_A, &rank[3], "a3", 1, 4 * KIB, NULL, NULL, &rerr), REFUSAL_INVALID_SIZE);
	ck_assert_int_eq(rerr, RESERVATION_UID_CAP);
	ck_assert_uint_eq(alive_of(b, UID_A), 3);
	ck_assert_uint_eq(budget_uid_leased(b->budget, UID_A), 3 * 4 * KIB); /* the refusal charged nothing */
	/* Over the budget too: the cap answers first, so a waiting reserve is not queued for nothing. */
	ck_assert_int_eq(reserve(b, UID_A, &rank[3], "big", 1, 128 * MIB, NULL, NULL, &rerr), REFUSAL_INVALID_SIZE);
	ck_assert_int_eq(rerr, RESERVATION_UID_CAP);
	/* A join creates none: another rank of a group still joins at the cap. */
	ck_assert_int_eq(reserve(b, UID_A, &rank[4], "a0", 1, 4 * KIB, NULL, &joined, &rerr), REFUSAL_NONE);
	ck_assert_ptr_eq(joined, r[0]);
	/* Another uid is not held back by A's. */
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(reserve(b, UID_B, &rank[5], names[i], 1, 4 * KIB, NULL, NULL, &rerr), REFUSAL_NONE);
	ck_assert_uint_eq(alive_of(b, UID_B), 3);
	/* A releases one: A may reserve one more, and no more than that. */
	ck_assert_uint_eq(broker_reservation_end(b, r[1]), 4 * KIB);
	ck_assert_int_eq(reserve(b, UID_A, &rank[3], "a3", 1, 4 * KIB, NULL, NULL, &rerr), REFUSAL_NONE);
	ck_assert_int_eq(reserve(b, UID_A, &rank[3], "a4", 1, 4 * KIB, NULL, NULL, &rerr), REFUSAL_INVALID_SIZE);
	ck_assert_int_eq(rerr, RESERVATION_UID_CAP);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_lowered_reservation_cap_keeps_those_alive_refuses_new)
{
	struct broker *b = new_broker(64 * MIB, 0, 0);
	enum reservation_error rerr;
	struct reservation *r[3];
	const char *names[] = { "a0", "a1", "a2" };

	b->settings.max_reservations_per_uid = 3;
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(reserve(b, UID_A, &rank[i], names[i], 2, 4 * KIB, NULL, &r[i], &rerr), REFUSAL_NONE);
	/* A reload to 1 (config_settings copies the key into b->settings): none of the 3 ends. */
	b->settings.max_reservations_per_uid = 1;
	ck_assert_uint_eq(alive_of(b, UID_A), 3);
	ck_assert_uint_eq(budget_uid_leased(b->budget, UID_A), 3 * 2 * 4 * KIB);
	ck_assert_int_eq(take(b, r[2], &rank[2], 4 * KIB, NULL), REFUSAL_NONE); /* its shares are still taken */
	ck_assert_int_eq(reserve(b, UID_A, &rank[3], "a3", 1, 4 * KIB, NULL, NULL, &rerr), REFUSAL_INVALID_SIZE);
	ck_assert_int_eq(rerr, RESERVATION_UID_CAP);
	/* Ending one leaves 2, still at or over 1: refused until A holds none. */
	broker_reservation_end(b, r[0]);
	broker_reservation_end(b, r[1]);
	ck_assert_int_eq(reserve(b, UID_A, &rank[3], "a3", 1, 4 * KIB, NULL, NULL, &rerr), REFUSAL_INVALID_SIZE);
	ck_assert_int_eq(rerr, RESERVATION_UID_CAP);
	broker_reservation_end(b, r[2]);
	ck_assert_int_eq(reserve(b, UID_A, &rank[3], "a3", 1, 4 * KIB, NULL, NULL, &rerr), REFUSAL_NONE);
	check_books(b);
	free_broker(b);
}
END_TEST

CHECK_SUITE(suite, "reservation", "table", NULL, NULL, 30, test_reserve_over_budget_charges_nothing,
	    test_reserve_over_uid_quota_and_whole_budget_refused, test_reserve_over_job_quota_refused,
	    test_join_same_shape_mismatch_refused, test_shares_move_to_leases_with_the_books_exact,
	    test_smaller_share_gives_the_rest_back, test_end_on_release_and_on_last_member,
	    test_critical_refuses_a_reserve, test_uid_at_its_reservation_cap_is_refused_another_uid_reserves,
	    test_lowered_reservation_cap_keeps_those_alive_refuses_new)

CHECK_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for broker_headroom: for every bound, a state where it binds; the headroom names it, an acquire of
 * exactly the headroom is granted, and one of a page more is refused with that bound's refusal. Over the pool
 * model (poolmodel.h): 4 KiB pages, 2 MiB chunks (classes up to 8 MiB where a row says so).
 */
#include <check.h>
#include <stdbool.h>
#include <stdlib.h>

#include "broker.h"
#include "budget.h"
#include "jobs.h"
#include "lease.h"
#include "brokerfix.h"
#include "check_main.h"
#include "poolmodel.h"

#define PAGE 4096ull

/* One row's world: the broker, the asker's job cgroup (or NULL), its connection's leases. */
struct world {
	struct broker *b;
	struct job_cgroup *cg;
	bool job_unknown;
	uint64_t conn_leases, conn_max;
};

static enum broker_refusal ask(struct world *w, uid_t uid, void *owner, uint64_t size, enum ask kind)
{
	struct acquire_args a = {
		.uid = uid,
		.gid = uid,
		.pid = 1234,
		.owner = owner,
		.size = size,
		.label = "test",
		.no_revoke = kind == ASK_NO_REVOKE,
		.registration = kind == ASK_REGISTRATION,
		.cgroup = uid == UID_A ? w->cg : NULL,
		.job_unknown = uid == UID_A && w->job_unknown,
		.now_ms = 1000,
	};
	struct lease *l;

	return pool_model_acquire(w->b, &a, &l, &last_err);
}

static void headroom(struct world *w, enum ask kind, struct broker_headroom *h)
{
	struct acquire_args a = {
		.uid = UID_A,
		.no_revoke = kind == ASK_NO_REVOKE,
		.registration = kind == ASK_REGISTRATION,
		.cgroup = w->cg,
		.job_unknown = w->job_unknown,
	};
	struct pool_view pv;

	pool_model_view(&pv);
	broker_headroom(w->b, &a, &pv, w->conn_leases, w->conn_max, h);
}

/* The budget, 64 MiB: another uid holds 10 MiB, so 54 MiB are left. */
static void set_budget(struct world *w)
{
	w->b = new_broker(64 * MIB, 0, 0);
	ck_assert_int_eq(ask(w, UID_B, &conn_b, 10 * MIB, ASK_POOL), REFUSAL_NONE);
}

/* A budget that is not a whole number of pages: the headroom is rounded down to one. */
static void set_budget_odd(struct world *w)
{
	w->b = new_broker(64 * MIB + 100, 0, 0);
	ck_assert_int_eq(ask(w, UID_B, &conn_b, 10 * MIB, ASK_POOL), REFUSAL_NONE);
}

/* A 16 MiB uid quota of which the asker holds 5 MiB: 11 MiB left, though the budget has 59. */
static void set_uid_quota(struct world *w)
{
	w->b = new_broker(64 * MIB, 16 * MIB, 0);
	ck_assert_int_eq(ask(w, UID_A, &conn_a, 5 * MIB, ASK_POOL), REFUSAL_NONE);
}

static void add_job(struct world *w, uint64_t quota)
{
	const char *why;

	ck_assert_int_eq(jobs_new(&w->b->jobs), 0);
	ck_assert_int_eq(jobs_rule_set(w->b->jobs, "/slurm/job_1", quota, JOB_RULE_SET, &why), 0);
	ck_assert_int_eq(jobs_cgroup_get(w->b->jobs, "/slurm/job_1", &w->cg), 0);
}

/* An 8 MiB job quota of which the job holds 3 MiB: 5 MiB left. */
static void set_job_quota(struct world *w)
{
	w->b = new_broker(64 * MIB, 0, 0);
	add_job(w, 8 * MIB);
	ck_assert_int_eq(ask(w, UID_A, &conn_a, 3 * MIB, ASK_POOL), REFUSAL_NONE);
}

/* Rules exist, and the asker's job could not be read: nothing. */
static void set_job_unknown(struct world *w)
{
	w->b = new_broker(64 * MIB, 0, 0);
	add_job(w, 8 * MIB);
	jobs_cgroup_put(w->b->jobs, w->cg);
	w->cg = NULL;
	w->job_unknown = true;
}

/* 8 MiB of never-revoked memory per uid, 3 MiB held: 5 MiB left for a never-revoked lease. */
static void set_no_revoke(struct world *w)
{
	w->b = new_broker(64 * MIB, 0, 0);
	w->b->max_no_revoke_per_uid_bytes = 8 * MIB;
	ck_assert_int_eq(ask(w, UID_A, &conn_a, 3 * MIB, ASK_NO_REVOKE), REFUSAL_NONE);
}

/* Tight with 6 MiB warm: a revocable lease may have all of it, never-revoked memory nothing. */
static void set_tight(struct world *w)
{
	w->b = new_broker(64 * MIB, 0, 6 * MIB);
	(void)broker_set_pressure(w->b, BROKER_TIGHT);
}

static void set_critical(struct world *w)
{
	w->b = new_broker(64 * MIB, 0, 6 * MIB);
	(void)broker_set_pressure(w->b, BROKER_CRITICAL);
}

/* Two leases per uid, both held. */
static void set_uid_leases(struct world *w)
{
	w->b = new_broker(64 * MIB, 0, 0);
	w->b->max_leases_per_uid = 2;
	ck_assert_int_eq(ask(w, UID_A, &conn_a, PAGE, ASK_POOL), REFUSAL_NONE);
	ck_assert_int_eq(ask(w, UID_A, &conn_a, PAGE, ASK_POOL), REFUSAL_NONE);
}

/* Classes 2, 4, 8 MiB; 4 fds per uid, 1 held: 3 chunks of 8 MiB at most, though the budget has 1 GiB more. */
static void set_uid_chunks(struct world *w)
{
	w->b = new_broker(1024 * MIB + 2 * MIB, 0, 0);
	pool_model_reset(2 * MIB, 8 * MIB);
	w->b->max_chunks_per_uid = 4;
	ck_assert_int_eq(ask(w, UID_A, &conn_a, 2 * MIB, ASK_POOL), REFUSAL_NONE);
}

/* The same with one chunk of room and 11 MiB of budget: 8 MiB, one chunk (11 MiB would take three). */
static void set_uid_chunks_under_budget(struct world *w)
{
	w->b = new_broker(13 * MIB, 0, 0);
	pool_model_reset(2 * MIB, 8 * MIB);
	w->b->max_chunks_per_uid = 2;
	ck_assert_int_eq(ask(w, UID_A, &conn_a, 2 * MIB, ASK_POOL), REFUSAL_NONE);
}

/* The daemon's capacity of 3 chunks, another uid holding 2. */
static void set_capacity(struct world *w)
{
	w->b = new_broker(64 * MIB, 0, 0);
	w->b->chunk_capacity = 3;
	ck_assert_int_eq(ask(w, UID_B, &conn_b, 4 * MIB, ASK_POOL), REFUSAL_NONE);
}

/* A registration is counted in host pages and meets the never-revoked cap: 32 MiB (half the budget). */
static void set_registration(struct world *w)
{
	w->b = new_broker(64 * MIB, 0, 0);
}

/* The connection at max-leases-per-client: nothing (the handler's check, before the broker's). */
static void set_conn_leases(struct world *w)
{
	w->b = new_broker(64 * MIB, 0, 0);
	w->conn_leases = 4;
}

/* The world's broker freed; with a job table, its leases first (they hold the job's charges), then the table. */
static void world_free(struct world *w)
{
	if (w->b->jobs) {
		struct lease *l, *next;

		for (l = lease_first(w->b->leases); l; l = next) {
			next = lease_next(w->b->leases, l);
			pool_model_free(w->b, l);
		}
		jobs_cgroup_put(w->b->jobs, w->cg);
		jobs_free(w->b->jobs);
		w->b->jobs = NULL;
	}
	free_broker(w->b);
}

static const struct row {
	const char *name;
	void (*setup)(struct world *w);
	enum ask kind;
	uint64_t available;
	enum broker_bound_kind binding;
	enum broker_refusal above; /* the refusal of a page more; REFUSAL_NONE: the handler's own (connection) */
} rows[] = {
	{ "budget", set_budget, ASK_POOL, 54 * MIB, BOUND_BUDGET, REFUSAL_BUDGET },
	{ "budget-odd", set_budget_odd, ASK_POOL, 54 * MIB, BOUND_BUDGET, REFUSAL_BUDGET },
	{ "uid-quota", set_uid_quota, ASK_POOL, 11 * MIB, BOUND_UID_QUOTA, REFUSAL_UID_QUOTA },
	{ "job-quota", set_job_quota, ASK_POOL, 5 * MIB, BOUND_JOB_QUOTA, REFUSAL_JOB_QUOTA },
	{ "job-unknown", set_job_unknown, ASK_POOL, 0, BOUND_JOB_UNKNOWN, REFUSAL_JOB_UNKNOWN },
	{ "no-revoke", set_no_revoke, ASK_NO_REVOKE, 5 * MIB, BOUND_NO_REVOKE, REFUSAL_UID_NO_REVOKE },
	{ "no-revoke-unasked", set_no_revoke, ASK_POOL, 61 * MIB, BOUND_BUDGET, REFUSAL_BUDGET },
	{ "tight", set_tight, ASK_POOL, 6 * MIB, BOUND_PRESSURE, REFUSAL_TIGHT },
	{ "tight-no-revoke", set_tight, ASK_NO_REVOKE, 0, BOUND_PRESSURE, REFUSAL_TIGHT_NO_REVOKE },
	{ "critical", set_critical, ASK_POOL, 0, BOUND_PRESSURE, REFUSAL_CRITICAL },
	{ "uid-leases", set_uid_leases, ASK_POOL, 0, BOUND_UID_LEASES, REFUSAL_UID_LEASES },
	{ "uid-chunks", set_uid_chunks, ASK_POOL, 24 * MIB, BOUND_UID_CHUNKS, REFUSAL_UID_CHUNKS },
	{ "uid-chunks-under-budget", set_uid_chunks_under_budget, ASK_POOL, 8 * MIB, BOUND_UID_CHUNKS,
	  REFUSAL_UID_CHUNKS },
	{ "capacity", set_capacity, ASK_POOL, 2 * MIB, BOUND_CAPACITY, REFUSAL_CAPACITY },
	{ "registration", set_registration, ASK_REGISTRATION, 32 * MIB, BOUND_NO_REVOKE, REFUSAL_UID_NO_REVOKE },
	{ "conn-leases", set_conn_leases, ASK_POOL, 0, BOUND_CONN_LEASES, REFUSAL_NONE },
};

START_TEST(test_headroom_is_what_an_acquire_then_gets)
{
	const struct row *r = &rows[_i];
	struct world w = { .conn_max = 4 };
	struct broker_headroom h;

	r->setup(&w);
	headroom(&w, r->kind, &h);
	ck_assert_msg(h.available_bytes == r->available, "%s: headroom %llu, expected %llu", r->name,
		      (unsigned long long)h.available_bytes, (unsigned long long)r->available);
	ck_assert_msg(h.bounds[h.binding].kind == r->binding, "%s: binding %d, expected %d", r->name,
		      h.bounds[h.binding].kind, r->binding);
	ck_assert_uint_eq(h.page_bytes, PAGE);
	if (r->above != REFUSAL_NONE) {
		/* A page more is refused by the bound that binds; exactly the headroom is granted. */
		ck_assert_msg(ask(&w, UID_A, &conn_a, h.available_bytes + PAGE, r->kind) == r->above,
			      "%s: a page more was not refused by its bound", r->name);
		if (h.available_bytes > 0)
			ck_assert_msg(ask(&w, UID_A, &conn_a, h.available_bytes, r->kind) == REFUSAL_NONE,
				      "%s: the headroom itself was refused", r->name);
		headroom(&w, r->kind, &h);
		ck_assert_uint_eq(h.available_bytes, 0);
	}
	check_books(w.b);
	world_free(&w);
}
END_TEST

/* Every bound is listed with its figures, in the order an acquire checks them. */
START_TEST(test_headroom_lists_each_bound_with_its_figures)
{
	struct world w = { .conn_max = 4 };
	struct broker_headroom h;
	enum broker_bound_kind want[] = { BOUND_CONN_LEASES, BOUND_UID_QUOTA, BOUND_BUDGET, BOUND_JOB_QUOTA,
					  BOUND_NO_REVOKE };

	w.b = new_broker(64 * MIB, 16 * MIB, 0);
	add_job(&w, 8 * MIB);
	ck_assert_int_eq(ask(&w, UID_A, &conn_a, 3 * MIB, ASK_NO_REVOKE), REFUSAL_NONE);
	headroom(&w, ASK_NO_REVOKE, &h);
	ck_assert_uint_eq(h.n, 5);
	for (size_t i = 0; i < h.n; i++)
		ck_assert_int_eq(h.bounds[i].kind, want[i]);
	ck_assert_uint_eq(h.bounds[0].left_bytes, UINT64_MAX);
	ck_assert_uint_eq(h.bounds[1].limit, 16 * MIB);
	ck_assert_uint_eq(h.bounds[1].used, 3 * MIB);
	ck_assert_uint_eq(h.bounds[1].left_bytes, 13 * MIB);
	ck_assert_uint_eq(h.bounds[2].left_bytes, 61 * MIB);
	ck_assert_uint_eq(h.bounds[3].left_bytes, 5 * MIB);
	ck_assert_uint_eq(h.bounds[4].limit, 8 * MIB); /* half the uid quota */
	ck_assert_uint_eq(h.bounds[4].left_bytes, 5 * MIB);
	/* A tie binds as the acquire's first check would: the job's quota before the never-revoked cap. */
	ck_assert_int_eq(h.bounds[h.binding].kind, BOUND_JOB_QUOTA);
	ck_assert_uint_eq(h.available_bytes, 5 * MIB);
	ck_assert_int_eq(ask(&w, UID_A, &conn_a, 5 * MIB + PAGE, ASK_NO_REVOKE), REFUSAL_JOB_QUOTA);
	world_free(&w);
}
END_TEST

static Suite *headroom_suite(void)
{
	Suite *s = suite_create("headroom");
	TCase *tc = CHECK_CASE(s, "core", NULL, NULL, 60, test_headroom_lists_each_bound_with_its_figures);

	tcase_add_loop_test(tc, test_headroom_is_what_an_acquire_then_gets, 0, (int)(sizeof(rows) / sizeof(rows[0])));
	return s;
}

CHECK_MAIN(headroom_suite)

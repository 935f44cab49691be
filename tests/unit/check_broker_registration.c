/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the broker's registrations and never-revoked leases: charged without pool memory, capped per uid,
 * and a shared file's pages charged once, to the oldest registrant, the charge moving as registrants go.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include "broker.h"
#include "budget.h"
#include "jobs.h"
#include "lease.h"
#include "brokerfix.h"
#include "check_main.h"
#include "poolmodel.h"

START_TEST(test_registration_is_charged_without_pool_memory_and_never_revoked)
{
	struct broker *b = new_broker(64 * MIB, 32 * MIB, 4 * MIB);
	struct lease *r, *n, **order;
	size_t norder;

	/* Whole 4 KiB pages of the program's own memory, however large the pool's pages are. */
	ck_assert_int_eq(acquire_kind(b, UID_A, &conn_a, 5000, ASK_REGISTRATION, &r), 0);
	ck_assert_uint_eq(r->bytes, 8 * KIB);
	ck_assert_uint_eq(r->nchunks, 0);
	ck_assert(r->registration && r->no_revoke);
	ck_assert_int_eq(acquire_kind(b, UID_A, &conn_a, 2 * MIB, ASK_NO_REVOKE, &n), 0);
	ck_assert(!n->registration && n->no_revoke);
	ck_assert_uint_eq(b->registered_bytes, 8 * KIB);
	ck_assert_uint_eq(budget_uid_no_revoke(b->budget, UID_A), 2 * MIB + 8 * KIB);
	ck_assert_uint_eq(budget_uid_leased(b->budget, UID_A), 2 * MIB + 8 * KIB);
	/* The pool lent the never-revoked lease, not the registration. */
	ck_assert_uint_eq(resident_bytes(), 4 * MIB);
	ck_assert_uint_eq(idle_bytes(), 2 * MIB);
	ck_assert_int_eq(lease_revoke_order(b->leases, &order, &norder), 0);
	ck_assert_uint_eq(norder, 0);
	free(order);
	/* Tight: a registration pins new pages that could not be taken back, so it is refused. */
	(void)broker_set_pressure(b, BROKER_TIGHT);
	ck_assert_int_eq(acquire_kind(b, UID_A, &conn_a, 4096, ASK_REGISTRATION, NULL), REFUSAL_TIGHT_NO_REVOKE);
	(void)broker_set_pressure(b, BROKER_NORMAL);
	pool_model_free(b, r);
	pool_model_free(b, n);
	ck_assert_uint_eq(b->registered_bytes, 0);
	ck_assert_uint_eq(budget_no_revoke(b->budget), 0);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_never_revoked_bytes_are_capped_per_uid)
{
	struct broker *b = new_broker(64 * MIB, 32 * MIB, 0);
	struct lease *l;

	/* new_broker's cap: half the 32 MiB quota. */
	ck_assert_int_eq(acquire_kind(b, UID_A, &conn_a, 12 * MIB, ASK_NO_REVOKE, &l), 0);
	ck_assert_int_eq(acquire_kind(b, UID_A, &conn_a, 4 * MIB + 4096, ASK_REGISTRATION, NULL),
			 REFUSAL_UID_NO_REVOKE);
	ck_assert_int_eq(acquire_kind(b, UID_A, &conn_a, 4 * MIB, ASK_REGISTRATION, NULL), 0);
	ck_assert_int_eq(acquire_kind(b, UID_A, &conn_a, 4096, ASK_NO_REVOKE, NULL), REFUSAL_UID_NO_REVOKE);
	/* The rest of the quota is still there for leases that can be taken back, and for other uids. */
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 16 * MIB, NULL), 0);
	ck_assert_int_eq(acquire_kind(b, UID_B, &conn_b, 16 * MIB, ASK_NO_REVOKE, NULL), 0);
	/* Freed, the share comes back. */
	pool_model_free(b, l);
	ck_assert_int_eq(acquire_kind(b, UID_A, &conn_a, 12 * MIB, ASK_REGISTRATION, NULL), 0);
	/* 0 refuses every one. */
	b->max_no_revoke_per_uid_bytes = 0;
	ck_assert_int_eq(acquire_kind(b, UID_C, &conn_c, 4096, ASK_NO_REVOKE, NULL), REFUSAL_UID_NO_REVOKE);
	check_books(b);
	free_broker(b);
}
END_TEST

/* A registration of [off, off + size) of shared file (1, ino). */
static enum broker_refusal acquire_backed(struct broker *b, uid_t uid, void *owner, uint64_t ino, uint64_t off,
					  uint64_t size, struct lease **ret)
{
	struct acquire_args a = acquire_args_of(uid, owner, size, ASK_REGISTRATION);

	a.label = "shm";
	a.backed = true;
	a.backing_dev = 1;
	a.backing_ino = ino;
	a.backing_offset = off;
	return acquire_with(b, &a, ret);
}

START_TEST(test_shared_registrations_are_charged_once_and_the_charge_moves_to_the_oldest_left)
{
	/* A 20 MiB budget: two 16 MiB registrations of one file fit, two of private memory would not. */
	struct broker *b = new_broker(20 * MIB, 0, 0);
	struct lease *a, *bb, *c, *p;

	b->max_no_revoke_per_uid_bytes = 20 * MIB;
	ck_assert_int_eq(acquire_backed(b, UID_A, &conn_a, 7, 0, 16 * MIB, &a), 0);
	ck_assert_int_eq(acquire_backed(b, UID_B, &conn_b, 7, 0, 16 * MIB, &bb), 0);
	ck_assert_uint_eq(a->charged_bytes, 16 * MIB);
	ck_assert_uint_eq(bb->charged_bytes, 0);
	ck_assert_uint_eq(b->registered_bytes, 16 * MIB);
	ck_assert_uint_eq(budget_uid_leased(b->budget, UID_B), 0);
	ck_assert_uint_eq(budget_uid_leases(b->budget, UID_B), 1); /* still a lease: the count caps apply */
	check_books(b);
	/* Another file, or private memory, is new memory: over the budget. */
	ck_assert_int_eq(acquire_backed(b, UID_C, &conn_c, 8, 0, 16 * MIB, &p), REFUSAL_BUDGET);
	ck_assert_int_eq(acquire_kind(b, UID_C, &conn_c, 16 * MIB, ASK_REGISTRATION, &p), REFUSAL_BUDGET);
	/* Half inside, half past the end: only the new half is charged, and checked. */
	ck_assert_int_eq(acquire_backed(b, UID_C, &conn_c, 7, 12 * MIB, 12 * MIB, &c), REFUSAL_BUDGET);
	ck_assert_int_eq(acquire_backed(b, UID_C, &conn_c, 7, 12 * MIB, 6 * MIB, &c), 0);
	ck_assert_uint_eq(c->charged_bytes, 2 * MIB);
	check_books(b);
	/* Pressure refuses new pinning only: pages already registered come whatever the state. */
	(void)broker_set_pressure(b, BROKER_TIGHT);
	ck_assert_int_eq(acquire_backed(b, UID_C, &conn_c, 7, 0, 2 * MIB, &p), 0);
	pool_model_free(b, p);
	ck_assert_int_eq(acquire_backed(b, UID_C, &conn_c, 7, 18 * MIB, 4096, &p), REFUSAL_TIGHT_NO_REVOKE);
	(void)broker_set_pressure(b, BROKER_CRITICAL);
	ck_assert_int_eq(acquire_backed(b, UID_C, &conn_c, 7, 4 * MIB, 2 * MIB, &p), 0);
	pool_model_free(b, p);
	ck_assert_int_eq(acquire_backed(b, UID_C, &conn_c, 7, 18 * MIB, 4096, &p), REFUSAL_CRITICAL);
	(void)broker_set_pressure(b, BROKER_NORMAL);
	check_books(b);
	/* The first registrant goes: its pages pass to the oldest left that covers them (B), with B's uid. */
	pool_model_free(b, a);
	ck_assert_uint_eq(bb->charged_bytes, 16 * MIB);
	ck_assert_uint_eq(budget_uid_leased(b->budget, UID_A), 0);
	ck_assert_uint_eq(budget_uid_leased(b->budget, UID_B), 16 * MIB);
	ck_assert_uint_eq(budget_uid_no_revoke(b->budget, UID_B), 16 * MIB);
	ck_assert_uint_eq(b->registered_bytes, 18 * MIB);
	check_books(b);
	/* B goes: C covers 12..16 MiB of B's pages, and takes them; the rest is uncharged. */
	pool_model_free(b, bb);
	ck_assert_uint_eq(c->charged_bytes, 6 * MIB);
	ck_assert_uint_eq(b->registered_bytes, 6 * MIB);
	check_books(b);
	pool_model_free(b, c);
	ck_assert_uint_eq(b->registered_bytes, 0);
	ck_assert_uint_eq(budget_no_revoke(b->budget), 0);
	ck_assert_ptr_null(b->backings);
	check_books(b);
	free_broker(b);
}
END_TEST

/* Job accounting follows the same rule: the region is charged once, to the job of its oldest registrant. */
START_TEST(test_a_shared_region_is_charged_to_one_job_and_moves_with_its_pages)
{
	struct broker *b = new_broker(64 * MIB, 0, 0);
	struct job_cgroup *cga, *cgb;
	struct lease *a, *bb;
	struct acquire_args args = {
		.gid = UID_A,
		.pid = 1234,
		.size = 16 * MIB,
		.label = "shm",
		.registration = true,
		.now_ms = 1000,
		.backed = true,
		.backing_dev = 1,
		.backing_ino = 11,
	};

	b->max_no_revoke_per_uid_bytes = 64 * MIB;
	ck_assert_int_eq(jobs_new(&b->jobs), 0);
	ck_assert_int_eq(jobs_cgroup_get(b->jobs, "/slurm/job_1", &cga), 0);
	ck_assert_int_eq(jobs_cgroup_get(b->jobs, "/slurm/job_2", &cgb), 0);
	args.uid = UID_A;
	args.owner = &conn_a;
	args.cgroup = cga;
	ck_assert_int_eq(pool_model_acquire(b, &args, &a, &last_err), 0);
	args.uid = UID_B;
	args.owner = &conn_b;
	args.cgroup = cgb;
	ck_assert_int_eq(pool_model_acquire(b, &args, &bb, &last_err), 0);
	ck_assert_uint_eq(cga->bytes, 16 * MIB);
	ck_assert_uint_eq(cgb->bytes, 0);
	ck_assert_uint_eq(cga->job->bytes + cgb->job->bytes, 16 * MIB);
	ck_assert_uint_eq(cgb->leases, 1); /* a lease of the job all the same */
	/* Job 1's rank ends: job 2's rank still maps the region and now carries it. */
	pool_model_free(b, a);
	ck_assert_uint_eq(cga->bytes, 0);
	ck_assert_uint_eq(cgb->bytes, 16 * MIB);
	ck_assert_uint_eq(cgb->job->bytes, 16 * MIB);
	check_books(b);
	pool_model_free(b, bb);
	ck_assert_uint_eq(cgb->bytes, 0);
	ck_assert_uint_eq(cgb->leases, 0);
	jobs_cgroup_put(b->jobs, cga);
	jobs_cgroup_put(b->jobs, cgb);
	jobs_free(b->jobs);
	b->jobs = NULL;
	free_broker(b);
}
END_TEST

/*
 * n registrations of one page of file 9, each recorded as a registrant and charged once in all; then one more,
 * past the bound: not recorded as a registrant, charged as private memory would be. Returns that one.
 */
static struct lease *register_past_the_bound(struct broker *b, int n)
{
	struct lease *l;

	for (int i = 0; i < n; i++) {
		ck_assert_int_eq(acquire_backed(b, UID_A, &conn_a, 9, 0, 4096, &l), 0);
		ck_assert(l->backed);
	}
	ck_assert_uint_eq(b->registered_bytes, 4096);
	ck_assert_int_eq(acquire_backed(b, UID_A, &conn_a, 9, 0, 4096, &l), 0);
	ck_assert(!l->backed);
	ck_assert_uint_eq(b->registered_bytes, 2 * 4096);
	return l;
}

START_TEST(test_registrants_of_one_file_are_bounded_and_the_rest_charged_in_full)
{
	struct broker *b = new_broker(64 * MIB, 0, 0);

	b->max_no_revoke_per_uid_bytes = 64 * MIB;
	/* 256: max-registrants-per-file's default. */
	ck_assert_uint_eq(register_past_the_bound(b, 256)->charged_bytes, 4096);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_max_registrants_per_file_is_the_bound_and_0_charges_every_registration_in_full)
{
	struct broker *b = new_broker(64 * MIB, 0, 0);
	struct lease *l;

	b->max_no_revoke_per_uid_bytes = 64 * MIB;
	b->max_registrants_per_file = 3;
	register_past_the_bound(b, 3);
	/* 0: another file's first registration is already charged in full, and so is its second. */
	b->max_registrants_per_file = 0;
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(acquire_backed(b, UID_A, &conn_a, 10, 0, 4096, &l), 0);
		ck_assert(!l->backed);
		ck_assert_uint_eq(l->charged_bytes, 4096);
	}
	ck_assert_uint_eq(b->registered_bytes, 4 * 4096);
	check_books(b);
	free_broker(b);
}
END_TEST

CHECK_SUITE(broker_registration_suite, "broker_registration", "core", NULL, NULL, 60,
	    test_registration_is_charged_without_pool_memory_and_never_revoked,
	    test_never_revoked_bytes_are_capped_per_uid,
	    test_shared_registrations_are_charged_once_and_the_charge_moves_to_the_oldest_left,
	    test_a_shared_region_is_charged_to_one_job_and_moves_with_its_pages,
	    test_registrants_of_one_file_are_bounded_and_the_rest_charged_in_full,
	    test_max_registrants_per_file_is_the_bound_and_0_charges_every_registration_in_full)

CHECK_MAIN(broker_registration_suite)

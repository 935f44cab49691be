/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the broker verbs: budget stays exact, leased plus idle never exceeds it, gates and owners hold.
 * The pool is poolmodel.h's, on records: the core's plans are carried out without a memfd.
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

/* A broker of 64 MiB (no quota, no warm pool) with one lease of bytes of UID_A's on conn_a, in *l. */
static struct broker *broker_with_lease(uint64_t bytes, struct lease **l)
{
	struct broker *b = new_broker(64 * MIB, 0, 0);

	ck_assert_int_eq(acquire(b, UID_A, &conn_a, bytes, l), 0);
	return b;
}

/*
 * Idle chunks hold fds and mappings as lent ones do: 60 idle 2 MiB chunks of one uid must not keep 60 leases of
 * 1 GiB (fresh chunks of another class) from a capacity of 64 chunks. Before, the pool grew to 120 chunks,
 * past the capacity the daemon had planned from its fd limit and vm.max_map_count.
 */
START_TEST(test_idle_chunks_make_room_under_the_chunk_capacity)
{
	struct broker *b = calloc(1, sizeof(*b));
	struct lease *l[60];

	ck_assert_ptr_nonnull(b);
	ck_assert_int_eq(budget_new(64ull * 1024 * MIB, 0, &b->budget), 0);
	ck_assert_int_eq(lease_table_new(&b->leases), 0);
	pool_model_reset(2 * MIB, 1024 * MIB);
	b->budget_bytes = 64ull * 1024 * MIB;
	b->max_no_revoke_per_uid_bytes = b->budget_bytes / 2;
	b->max_registrants_per_file = 256;
	b->chunk_capacity = 64;
	(void)broker_set_pressure(b, BROKER_NORMAL);
	for (int i = 0; i < 60; i++)
		ck_assert_int_eq(acquire(b, UID_A, &conn_a, 2 * MIB, &l[i]), 0);
	for (int i = 0; i < 60; i++) {
		l[i]->released = true; /* as its holder's RELEASE does: the chunks go idle */
		pool_model_free(b, l[i]);
	}
	ck_assert_uint_eq(chunk_count(), 60);
	for (int i = 0; i < 60; i++) {
		ck_assert_int_eq(acquire(b, UID_B, &conn_b, 1024 * MIB, &l[i]), 0);
		ck_assert_uint_le(chunk_count(), b->chunk_capacity);
	}
	ck_assert_uint_eq(budget_fds(b->budget), 60);
	free_broker(b);
}
END_TEST

START_TEST(test_acquire_rounds_to_page_size_and_charges_exactly)
{
	struct broker *b = new_broker(64 * MIB, 32 * MIB, 0);
	struct lease *l = NULL;

	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 5000, &l), 0);
	ck_assert_uint_eq(l->bytes, 8 * KIB);
	ck_assert_int_eq(l->state, LEASE_ACTIVE);
	ck_assert_uint_eq(l->uid, UID_A);
	ck_assert_ptr_eq(l->owner, &conn_a);
	ck_assert_str_eq(l->label, "test");
	ck_assert_uint_eq(budget_uid_leased(b->budget, UID_A), 8 * KIB);
	ck_assert_ptr_eq(lease_find(b->leases, l->id), l);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_acquire_of_zero_or_overflowing_size_is_invalid)
{
	struct broker *b = new_broker(64 * MIB, 32 * MIB, 0);

	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 0, NULL), REFUSAL_INVALID_SIZE);
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, UINT64_MAX, NULL), REFUSAL_INVALID_SIZE);
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, UINT64_MAX - 4094, NULL), REFUSAL_INVALID_SIZE);
	ck_assert_uint_eq(lease_count(b->leases), 0);
	free_broker(b);
}
END_TEST

START_TEST(test_acquire_passes_budget_refusals_through)
{
	struct broker *b = new_broker(16 * MIB, 8 * MIB, 0);

	EXPECT_VERDICTS(
		b, { UID_A, &conn_a, 17 * MIB, ASK_POOL, REFUSAL_TOO_LARGE },
		{ UID_A, &conn_a, 9 * MIB, ASK_POOL, REFUSAL_TOO_LARGE }, { UID_A, &conn_a, 6 * MIB, ASK_POOL, 0 },
		{ UID_A, &conn_a, 4 * MIB, ASK_POOL, REFUSAL_UID_QUOTA }, { UID_B, &conn_b, 8 * MIB, ASK_POOL, 0 },
		{ UID_C, &conn_c, 4 * MIB, ASK_POOL, REFUSAL_BUDGET }, { UID_C, &conn_c, 2 * MIB, ASK_POOL, 0 });
	ck_assert_uint_eq(lease_count(b->leases), 3);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_acquire_when_tight_lends_only_from_the_idle_pool)
{
	struct broker *b = new_broker(64 * MIB, 0, 4 * MIB);

	(void)broker_set_pressure(b, BROKER_TIGHT);
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 6 * MIB, NULL), REFUSAL_TIGHT);
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 4 * MIB, NULL), 0);
	ck_assert_uint_eq(idle_bytes(), 0);
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 4096, NULL), REFUSAL_TIGHT);
	/* No new memory was pinned while tight. */
	ck_assert_uint_eq(resident_bytes(), 4 * MIB);
	(void)broker_set_pressure(b, BROKER_NORMAL);
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 4096, NULL), 0);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_acquire_when_tight_refuses_never_revoked_leases_even_from_the_idle_pool)
{
	struct broker *b = new_broker(64 * MIB, 0, 4 * MIB);
	struct lease *l = NULL;

	(void)broker_set_pressure(b, BROKER_TIGHT);
	/* The idle pool could serve them, but nothing could take them back if the host got worse. */
	ck_assert_int_eq(acquire_kind(b, UID_A, &conn_a, 4096, ASK_NO_REVOKE, NULL), REFUSAL_TIGHT_NO_REVOKE);
	ck_assert_int_eq(acquire_kind(b, UID_A, &conn_a, 4096, ASK_REGISTRATION, NULL), REFUSAL_TIGHT_NO_REVOKE);
	ck_assert_uint_eq(lease_count(b->leases), 0);
	ck_assert_uint_eq(budget_leased(b->budget), 0);
	ck_assert_uint_eq(budget_no_revoke(b->budget), 0);
	ck_assert_uint_eq(idle_bytes(), 4 * MIB);
	/* A cooperative lease is still lent from the idle pool, as before. */
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 2 * MIB, &l), 0);
	ck_assert(!l->no_revoke);
	ck_assert_uint_eq(idle_bytes(), 2 * MIB);
	/* Critical answers first, whatever the kind. */
	(void)broker_set_pressure(b, BROKER_CRITICAL);
	ck_assert_int_eq(acquire_kind(b, UID_A, &conn_a, 4096, ASK_NO_REVOKE, NULL), REFUSAL_CRITICAL);
	/* Normal again: both kinds are lent. */
	(void)broker_set_pressure(b, BROKER_NORMAL);
	ck_assert_int_eq(acquire_kind(b, UID_A, &conn_a, 4096, ASK_NO_REVOKE, &l), 0);
	ck_assert(l->no_revoke && !l->registration);
	ck_assert_int_eq(acquire_kind(b, UID_A, &conn_a, 4096, ASK_REGISTRATION, &l), 0);
	ck_assert(l->no_revoke && l->registration);
	ck_assert_uint_eq(budget_no_revoke(b->budget), 8 * KIB);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_acquire_when_critical_is_refused)
{
	struct broker *b = new_broker(64 * MIB, 0, 4 * MIB);

	(void)broker_set_pressure(b, BROKER_CRITICAL);
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 2 * MIB, NULL), REFUSAL_CRITICAL);
	ck_assert_uint_eq(lease_count(b->leases), 0);
	ck_assert_uint_eq(budget_leased(b->budget), 0);
	free_broker(b);
}
END_TEST

/* DESIGN.md, "Pressure and revocation": tight shrinks the idle pool; critical also refuses and revokes; normal grants. */
START_TEST(test_set_pressure_records_the_state_and_names_the_reaction)
{
	struct broker *b = new_broker(64 * MIB, 0, 4 * MIB);

	ck_assert_uint_eq(broker_set_pressure(b, BROKER_TIGHT), BROKER_ACT_TRIM_POOL | BROKER_ACT_STOP_RECLAIM);
	ck_assert_int_eq(b->state, BROKER_TIGHT);
	ck_assert_uint_eq(broker_set_pressure(b, BROKER_CRITICAL),
			  BROKER_ACT_TRIM_POOL | BROKER_ACT_REFUSE_WAITERS | BROKER_ACT_START_RECLAIM);
	ck_assert_int_eq(b->state, BROKER_CRITICAL);
	ck_assert_uint_eq(broker_set_pressure(b, BROKER_NORMAL), BROKER_ACT_STOP_RECLAIM | BROKER_ACT_GRANT_WAITERS);
	ck_assert_int_eq(b->state, BROKER_NORMAL);
	/* Deciding is all it does: the shell trims, so the warm pool is untouched here. */
	(void)broker_set_pressure(b, BROKER_TIGHT);
	ck_assert_uint_eq(idle_bytes(), 4 * MIB);
	free_broker(b);
}
END_TEST

START_TEST(test_budget_refusal_wins_over_pressure_refusal)
{
	struct broker *b = new_broker(16 * MIB, 0, 0);

	(void)broker_set_pressure(b, BROKER_CRITICAL);
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 32 * MIB, NULL), REFUSAL_TOO_LARGE);
	free_broker(b);
}
END_TEST

START_TEST(test_acquire_shrinks_idle_pool_to_fit_budget)
{
	struct broker *b = new_broker(16 * MIB, 0, 16 * MIB);

	ck_assert_uint_eq(idle_bytes(), 16 * MIB);
	/* 2 MiB from the pool plus a new 1 MiB tail: 17 MiB locked until the pool gives some back. */
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 3 * MIB, NULL), 0);
	ck_assert_uint_eq(idle_bytes(), 12 * MIB);
	check_books(b);
	/* Another uid's lease replaces chunks rather than adding to them. */
	ck_assert_int_eq(acquire(b, UID_B, &conn_b, 8 * MIB, NULL), 0);
	check_books(b);
	ck_assert_int_eq(acquire(b, UID_C, &conn_c, 5 * MIB, NULL), 0);
	check_books(b);
	ck_assert_uint_eq(budget_leased(b->budget), 16 * MIB);
	ck_assert_uint_eq(idle_bytes(), 0);
	free_broker(b);
}
END_TEST

START_TEST(test_acquire_pool_failure_changes_nothing)
{
	struct broker *b = new_broker(64 * MIB, 0, 2 * MIB);

	/* Making the fresh chunks fails, as memfd_create does with no fd left: a kernel error, not a verdict. */
	pool_model_fail_next(-EMFILE);
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 9 * MIB, NULL), REFUSAL_FAILED);
	ck_assert_int_eq(last_err, -EMFILE);
	ck_assert_uint_eq(lease_count(b->leases), 0);
	ck_assert_uint_eq(budget_leased(b->budget), 0);
	ck_assert_uint_eq(idle_bytes(), 2 * MIB);
	ck_assert_uint_eq(resident_bytes(), 2 * MIB);
	free_broker(b);
}
END_TEST

START_TEST(test_release_returns_memory_to_budget_and_pool)
{
	struct lease *l = NULL;
	uint64_t id;
	struct broker *b = broker_with_lease(5 * MIB, &l);

	id = l->id;
	ck_assert_int_eq(release(b, id, UID_A, &conn_a, false), 0);
	ck_assert_ptr_null(lease_find(b->leases, id));
	ck_assert_uint_eq(budget_leased(b->budget), 0);
	/* Full chunks stay warm; the tail is gone. */
	ck_assert_uint_eq(idle_bytes(), 4 * MIB);
	ck_assert_uint_eq(resident_bytes(), 4 * MIB);
	ck_assert_int_eq(release(b, id, UID_A, &conn_a, false), -ENOENT);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_release_of_foreign_lease_is_refused)
{
	struct lease *l = NULL;
	struct broker *b = broker_with_lease(2 * MIB, &l);

	ck_assert_int_eq(release(b, l->id, UID_B, &conn_b, false), -EPERM);
	/* Same uid on another connection is still someone else. */
	ck_assert_int_eq(release(b, l->id, UID_A, &conn_b, false), -EPERM);
	/* Same connection claiming another uid too. */
	ck_assert_int_eq(release(b, l->id, UID_B, &conn_a, false), -EPERM);
	ck_assert_ptr_eq(lease_find(b->leases, l->id), l);
	ck_assert_uint_eq(budget_leased(b->budget), 2 * MIB);
	ck_assert_int_eq(release(b, 424242, UID_A, &conn_a, false), -ENOENT);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_admin_may_release_any_lease)
{
	struct lease *l = NULL;
	struct broker *b = broker_with_lease(2 * MIB, &l);

	ck_assert_int_eq(release(b, l->id, 0, NULL, true), 0);
	ck_assert_uint_eq(lease_count(b->leases), 0);
	ck_assert_uint_eq(budget_leased(b->budget), 0);
	free_broker(b);
}
END_TEST

START_TEST(test_drop_owner_frees_only_that_connections_leases)
{
	struct broker *b = new_broker(64 * MIB, 0, 0);
	struct lease *kept = NULL;

	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 2 * MIB, NULL), 0);
	ck_assert_int_eq(acquire(b, UID_A, &conn_b, 3 * MIB, &kept), 0);
	EXPECT_VERDICTS(b, { UID_A, &conn_a, 5 * MIB, ASK_POOL, 0 }, { UID_B, &conn_c, 1 * MIB, ASK_POOL, 0 },
			{ UID_A, &conn_a, 4096, ASK_POOL, 0 });

	ck_assert_uint_eq(drop_owner(b, &conn_a), 3);
	ck_assert_uint_eq(lease_count(b->leases), 2);
	ck_assert_ptr_eq(lease_find(b->leases, kept->id), kept);
	ck_assert_uint_eq(budget_uid_leased(b->budget, UID_A), 3 * MIB);
	ck_assert_uint_eq(budget_uid_leased(b->budget, UID_B), 1 * MIB);
	ck_assert_uint_eq(drop_owner(b, &conn_a), 0);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_drop_owner_leaves_orphaned_leases_alone)
{
	struct lease *l = NULL;
	struct broker *b = broker_with_lease(2 * MIB, &l);

	/* As after a restart: the lease has no connection yet. */
	l->owner = NULL;
	ck_assert_uint_eq(drop_owner(b, NULL), 0);
	ck_assert_uint_eq(lease_count(b->leases), 1);
	free_broker(b);
}
END_TEST

START_TEST(test_free_lease_in_any_state_uncharges_it)
{
	struct lease *l = NULL;
	struct broker *b = broker_with_lease(2 * MIB, &l);

	ck_assert_int_eq(lease_set_state(l, LEASE_REVOKING, 1), 0);
	ck_assert_int_eq(lease_set_state(l, LEASE_OVERDUE, 2), 0);
	pool_model_free(b, l);
	ck_assert_uint_eq(budget_leased(b->budget), 0);
	ck_assert_uint_eq(lease_count(b->leases), 0);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_free_lease_after_lowered_limit_keeps_idle_within_budget)
{
	struct lease *big = NULL;
	struct broker *b = broker_with_lease(16 * MIB, &big);

	ck_assert_int_eq(acquire(b, UID_B, &conn_b, 8 * MIB, NULL), 0);
	budget_set_limits(b->budget, 12 * MIB, 0);
	big->released = true;
	pool_model_free(b, big);
	/* 8 MiB still leased under a 12 MiB limit: at most 4 MiB may stay idle. */
	ck_assert_uint_eq(idle_bytes(), 4 * MIB);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_trim_pool_shrinks_to_target_bounded_by_budget)
{
	struct broker *b = new_broker(32 * MIB, 0, 24 * MIB);

	pool_model_trim(b, 30 * MIB); /* above idle: nothing to do, and never grows */
	ck_assert_uint_eq(idle_bytes(), 24 * MIB);
	pool_model_trim(b, 10 * MIB);
	ck_assert_uint_eq(idle_bytes(), 10 * MIB);
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 20 * MIB, NULL), 0);
	/* The budget leaves 12 MiB; a 20 MiB target is bounded by it. */
	pool_model_grow(20 * MIB);
	pool_model_trim(b, 20 * MIB);
	ck_assert_uint_eq(idle_bytes(), 12 * MIB);
	pool_model_trim(b, 0);
	ck_assert_uint_eq(idle_bytes(), 0);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_overdue_bytes_counts_only_overdue_leases)
{
	struct broker *b = new_broker(64 * MIB, 0, 0);
	struct lease *x = NULL, *y = NULL, *z = NULL;

	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 2 * MIB, &x), 0);
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 4 * MIB, &y), 0);
	ck_assert_int_eq(acquire(b, UID_B, &conn_b, 8 * MIB, &z), 0);
	ck_assert_uint_eq(broker_overdue_bytes(b), 0);
	ck_assert_int_eq(lease_set_state(y, LEASE_REVOKING, 1), 0);
	ck_assert_int_eq(lease_set_state(z, LEASE_REVOKING, 1), 0);
	ck_assert_int_eq(lease_set_state(z, LEASE_OVERDUE, 2), 0);
	ck_assert_uint_eq(broker_overdue_bytes(b), 8 * MIB);
	ck_assert_int_eq(lease_set_state(y, LEASE_OVERDUE, 2), 0);
	ck_assert_uint_eq(broker_overdue_bytes(b), 12 * MIB);
	/* Overdue bytes stay charged until the lease is freed. */
	ck_assert_uint_eq(budget_leased(b->budget), 14 * MIB);
	pool_model_free(b, z);
	ck_assert_uint_eq(broker_overdue_bytes(b), 4 * MIB);
	free_broker(b);
}
END_TEST

START_TEST(test_random_acquire_release_keeps_books_exact_and_within_budget)
{
	static void *const owners[] = { &conn_a, &conn_b, &conn_c };
	static const uid_t uids[] = { UID_A, UID_B, UID_C };
	struct broker *b = new_broker(24 * MIB, 12 * MIB, 8 * MIB);
	unsigned seed = 4242;

	for (int step = 0; step < 400; step++) {
		unsigned k = (unsigned)rand_r(&seed) % 3, op = (unsigned)rand_r(&seed) % 10;

		if (op < 6) {
			uint64_t size = ((uint64_t)(rand_r(&seed) % 1536) + 1) * 4096 - (unsigned)rand_r(&seed) % 4096;
			enum broker_refusal r = acquire(b, uids[k], owners[k], size, NULL);

			ck_assert_msg(r == REFUSAL_NONE || r == REFUSAL_UID_QUOTA || r == REFUSAL_BUDGET, "acquire: %d",
				      r);
		} else if (op < 9) {
			struct lease *l = lease_first(b->leases);

			for (unsigned skip = (unsigned)rand_r(&seed) % 8; l && skip; skip--)
				l = lease_next(b->leases, l);
			if (l)
				ck_assert_int_eq(release(b, l->id, l->uid, l->owner, false), 0);
		} else {
			drop_owner(b, owners[k]);
		}
		check_books(b);
	}
	free_broker(b);
}
END_TEST

START_TEST(test_attach_charges_nothing_and_lease_lives_until_last_mapper)
{
	struct broker *b = new_broker(64 * MIB, 0, 0);
	uint8_t tok[LEASE_TOKEN_BYTES] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 };
	uint8_t bad[LEASE_TOKEN_BYTES] = { 0 };
	uid_t grant = UID_B;
	struct lease *l = NULL, *got = NULL;
	uint64_t id;

	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 2 * MIB, &l), 0);
	id = l->id;
	/* Only the holder shares. */
	ck_assert_int_eq(broker_share(b, l, &conn_b, tok, NULL, 0), -EPERM);
	ck_assert_int_eq(broker_share(b, l, &conn_a, tok, NULL, 0), 0);
	ck_assert_int_eq(broker_attach(b, bad, &conn_b, UID_A, 7, 0, 1000, &got), -ENOENT);
	ck_assert_int_eq(broker_attach(b, tok, &conn_c, UID_B, 8, 0, 1000, &got), -EACCES);
	ck_assert_int_eq(broker_share(b, l, &conn_a, tok, &grant, 1), 0);
	ck_assert_int_eq(broker_attach(b, tok, &conn_c, UID_B, 8, 0, 1000, &got), 0);
	ck_assert_ptr_eq(got, l);
	ck_assert_int_eq(broker_attach(b, tok, &conn_b, UID_A, 7, 0, 1000, &got), 0);
	ck_assert_int_eq(broker_attach(b, tok, &conn_b, UID_A, 7, 0, 1000, &got), -EEXIST);
	ck_assert_int_eq(broker_attach(b, tok, &conn_a, UID_A, 7, 0, 1000, &got), -EEXIST);
	/* Counted once, to the holder's uid. */
	ck_assert_uint_eq(budget_leased(b->budget), 2 * MIB);
	ck_assert_uint_eq(budget_uid_leased(b->budget, UID_A), 2 * MIB);
	ck_assert_uint_eq(budget_uid_leased(b->budget, UID_B), 0);
	check_books(b);
	/* Holder first, then the attachers: freed only with the last. */
	ck_assert_int_eq(broker_detach(b, l, &conn_a), 0);
	ck_assert_int_eq(broker_detach(b, l, &conn_a), -ENOENT);
	ck_assert_int_eq(broker_detach(b, l, &conn_c), 0);
	ck_assert_int_eq(broker_detach(b, l, &conn_b), 1);
	pool_model_free(b, l);
	ck_assert_ptr_null(lease_find(b->leases, id));
	ck_assert_int_eq(broker_attach(b, tok, &conn_b, UID_A, 7, 0, 1000, &got), -ENOENT);
	ck_assert_uint_eq(budget_leased(b->budget), 0);
	check_books(b);
	free_broker(b);
}
END_TEST

START_TEST(test_attach_refused_while_revoking_and_idle_lease_becomes_active)
{
	struct broker *b = new_broker(64 * MIB, 0, 0);
	uint8_t tok[LEASE_TOKEN_BYTES] = { 9, 9, 9, 9, 9, 9, 9, 9, 1, 1, 1, 1, 1, 1, 1, 1 };
	struct lease *l = NULL, *got = NULL;

	ck_assert_int_eq(acquire(b, UID_A, &conn_a, MIB, &l), 0);
	ck_assert_int_eq(lease_set_state(l, LEASE_IDLE, 1), 0);
	ck_assert_int_eq(broker_share(b, l, &conn_a, tok, NULL, 0), 0);
	ck_assert_int_eq(broker_attach(b, tok, &conn_b, UID_A, 7, 0, 1000, &got), 0);
	ck_assert_int_eq(l->state, LEASE_ACTIVE);
	ck_assert_int_eq(lease_set_state(l, LEASE_REVOKING, 2), 0);
	ck_assert_int_eq(broker_attach(b, tok, &conn_c, UID_A, 8, 0, 1000, &got), -ENOENT);
	ck_assert_int_eq(broker_share(b, l, &conn_a, tok, NULL, 0), -EINVAL);
	/* A closed connection lets go of what it attached, too. */
	ck_assert_uint_eq(drop_owner(b, &conn_a), 0);
	ck_assert_uint_eq(drop_owner(b, &conn_b), 1);
	ck_assert_uint_eq(lease_count(b->leases), 0);
	check_books(b);
	free_broker(b);
}
END_TEST

/* The chunk ids of l, for comparing leases across a release (ids are never reused). */
static void chunk_ids(const struct lease *l, uint64_t *ids, size_t max)
{
	ck_assert_uint_le(l->nchunks, max);
	for (size_t i = 0; i < l->nchunks; i++)
		ids[i] = l->chunks[i].id;
}

static bool shares_a_chunk(const struct lease *l, const uint64_t *ids, size_t n)
{
	for (size_t i = 0; i < l->nchunks; i++)
		for (size_t k = 0; k < n; k++)
			if (l->chunks[i].id == ids[k])
				return true;
	return false;
}

/*
 * Issue 22, finding 1: uid B attaches to uid A's shared lease and may keep a view after it lets go.
 * The chunks are tainted at the attach (before their fds leave), destroyed when the lease ends, and
 * A's next lease is made of other chunks; the books stay exact through it.
 */
START_TEST(test_cross_uid_attach_taints_chunks_and_they_never_return_to_the_pool)
{
	struct broker *b = new_broker(64 * MIB, 0, 8 * MIB);
	uint8_t tok[LEASE_TOKEN_BYTES] = { 3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3 };
	uid_t grant = UID_B;
	struct lease *l = NULL, *got = NULL;
	uint64_t old[4];
	size_t nold;

	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 4 * MIB + 4 * KIB, &l), 0); /* two warm chunks and a tail */
	nold = l->nchunks;
	ck_assert_uint_eq(nold, 3);
	chunk_ids(l, old, 4);
	ck_assert_int_eq(broker_share(b, l, &conn_a, tok, &grant, 1), 0);
	for (size_t i = 0; i < nold; i++)
		ck_assert_msg(!l->chunks[i].tainted, "sharing alone sends no fd: nothing is tainted yet");
	ck_assert_int_eq(broker_attach(b, tok, &conn_b, UID_B, 8, 0, 1000, &got), 0);
	for (size_t i = 0; i < nold; i++)
		ck_assert_msg(l->chunks[i].tainted, "chunk %zu not tainted by uid B's attach", i);
	/* The attacher lets go first (its view may outlive that), then the holder. */
	ck_assert_int_eq(broker_detach(b, l, &conn_b), 0);
	ck_assert_int_eq(broker_detach(b, l, &conn_a), 1);
	pool_model_free(b, l);
	ck_assert_uint_eq(budget_leased(b->budget), 0);
	ck_assert_uint_eq(tainted_destroyed(), 3);
	/* The two warm chunks are gone, not idle: the pool holds what it did not lend. */
	ck_assert_uint_eq(idle_bytes(), 4 * MIB);
	ck_assert_uint_eq(resident_bytes(), 4 * MIB);
	ck_assert_uint_eq(chunk_count(), 2);
	check_books(b);

	/* A again, the same size and more: never the tainted chunks. */
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 4 * MIB + 4 * KIB, &l), 0);
	ck_assert(!shares_a_chunk(l, old, nold));
	for (size_t i = 0; i < l->nchunks; i++)
		ck_assert(!l->chunks[i].tainted);
	check_books(b);
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 8 * MIB, &got), 0);
	ck_assert(!shares_a_chunk(got, old, nold));
	check_books(b);
	free_broker(b);
}
END_TEST

/* The holder's own uid may read its memory anyway: its attachment taints nothing and the warm chunks come back. */
START_TEST(test_same_uid_attach_taints_nothing)
{
	struct broker *b = new_broker(64 * MIB, 0, 8 * MIB);
	uint8_t tok[LEASE_TOKEN_BYTES] = { 2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5 };
	struct lease *l = NULL, *got = NULL;
	uint64_t old[4];

	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 4 * MIB, &l), 0);
	chunk_ids(l, old, 4);
	ck_assert_int_eq(broker_share(b, l, &conn_a, tok, NULL, 0), 0);
	ck_assert_int_eq(broker_attach(b, tok, &conn_b, UID_A, 8, 0, 1000, &got), 0);
	for (size_t i = 0; i < l->nchunks; i++)
		ck_assert(!l->chunks[i].tainted);
	/* Both let go by a request (a closed connection would retire the chunks: test_a_dropped_lease_is_not_pooled). */
	ck_assert_int_eq(broker_detach(b, l, &conn_b), 0);
	ck_assert_int_eq(release(b, l->id, UID_A, &conn_a, false), 0);
	ck_assert_uint_eq(tainted_destroyed(), 0);
	ck_assert_uint_eq(idle_bytes(), 8 * MIB);
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 4 * MIB, &l), 0);
	ck_assert(shares_a_chunk(l, old, 2));
	check_books(b);
	free_broker(b);
}
END_TEST

/* Per-uid caps on leases and chunks, and the daemon's chunk capacity, each with its own error. */
START_TEST(test_caps_refuse_by_leases_chunks_and_capacity)
{
	struct broker *b = new_broker(64 * MIB, 0, 0);

	b->settings.reserve_fds = 16;
	b->settings.max_connections = 1;
	/* 16 fds of room after the reserve, two per connection and the queued-fd allowance. */
	ck_assert(!broker_resolve_limits(b, 16 + 2 + BROKER_QUEUED_FDS_MAX + 100 + 64, 0, 100, 0));
	ck_assert_uint_eq(b->chunk_capacity, 64);
	ck_assert_uint_eq(b->max_chunks_per_uid, 32);
	ck_assert_uint_eq(b->max_leases_per_uid, 32);
	b->max_leases_per_uid = 2;
	/* A registration takes no chunk, but it is a lease: 100,000 of them meet the same cap. */
	EXPECT_VERDICTS(b, { UID_A, &conn_a, 2 * MIB, ASK_POOL, 0 }, { UID_A, &conn_a, 2 * MIB, ASK_POOL, 0 },
			{ UID_A, &conn_a, 2 * MIB, ASK_POOL, REFUSAL_UID_LEASES },
			{ UID_A, &conn_a, 4096, ASK_REGISTRATION, REFUSAL_UID_LEASES });
	/* 2 MiB chunks: 5 MiB takes three (two whole and a tail). */
	b->max_leases_per_uid = 100;
	b->max_chunks_per_uid = 4;
	EXPECT_VERDICTS(b, { UID_A, &conn_a, 5 * MIB, ASK_POOL, REFUSAL_UID_CHUNKS },
			{ UID_B, &conn_b, 5 * MIB, ASK_POOL, 0 });
	b->max_chunks_per_uid = 0;
	b->chunk_capacity = 6;
	EXPECT_VERDICTS(b, { UID_C, &conn_c, 4 * MIB, ASK_POOL, REFUSAL_CAPACITY },
			{ UID_C, &conn_c, 2 * MIB, ASK_POOL, 0 });
	check_books(b);
	/* Too few fds at all: the capacity is clamped up and the caller is told. */
	ck_assert(broker_resolve_limits(b, 100, 0, 100, 0));
	ck_assert_uint_eq(b->chunk_capacity, BROKER_CHUNK_CAPACITY_MIN);
	free_broker(b);
}
END_TEST

/* Issue 22, finding 2: a non-admin's own revoke gets at least revoke-min-deadline-ms; an admin's does not. */
START_TEST(test_revoke_deadline_floor_applies_to_non_admins_only)
{
	/* The default deadline, whether an admin asks, the deadline asked (0: the default), the deadline given. */
	static const struct {
		uint32_t default_ms;
		bool admin;
		uint32_t asked_ms, want_ms;
	} rows[] = {
		{ 5000, false, 1, 1000 },
		{ 5000, false, 999, 1000 },
		{ 5000, false, 1000, 1000 },
		{ 5000, false, 3000, 3000 },
		{ 5000, false, 0, 5000 },
		{ 5000, true, 1, 1 },
		{ 5000, true, 0, 5000 },
		/* A default below the floor is raised for a non-admin too. */
		{ 200, false, 0, 1000 },
		{ 200, true, 0, 200 },
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct broker_settings cfg = { .revoke_deadline_ms = rows[i].default_ms,
					       .revoke_min_deadline_ms = 1000 };
		uint32_t got = broker_revoke_deadline_ms(&cfg, rows[i].admin, rows[i].asked_ms);

		ck_assert_msg(got == rows[i].want_ms, "row %zu: %u ms, wanted %u", i, got, rows[i].want_ms);
	}
}
END_TEST

/* Issue 22, finding 4: a revoke the holder started reaches only the holder's uid; others reach every uid. */
START_TEST(test_holder_revoke_never_signals_another_uid)
{
	struct lease l = { .uid = UID_A };

	ck_assert(broker_enforce_may_signal(&l, UID_A));
	ck_assert(broker_enforce_may_signal(&l, UID_B));
	l.revoke_by_holder = true;
	ck_assert(broker_enforce_may_signal(&l, UID_A));
	ck_assert(!broker_enforce_may_signal(&l, UID_B));
	ck_assert(!broker_enforce_may_signal(&l, 0));
}
END_TEST

/* Issue 22, finding 3: the pidfds of exit holds meet the per-uid chunk cap and the daemon's capacity. */
START_TEST(test_held_fds_meet_the_chunk_caps)
{
	struct broker *b = new_broker(64 * MIB, 0, 0);

	b->max_chunks_per_uid = 3;
	ck_assert_int_eq(budget_fd_add(b->budget, UID_A), 0);
	ck_assert_int_eq(budget_fd_add(b->budget, UID_A), 0);
	EXPECT_VERDICTS(b, { UID_A, &conn_a, 2 * MIB, ASK_POOL, 0 },
			{ UID_A, &conn_a, 2 * MIB, ASK_POOL, REFUSAL_UID_CHUNKS },
			{ UID_B, &conn_b, 4 * MIB, ASK_POOL, 0 });
	b->max_chunks_per_uid = 0;
	b->chunk_capacity = 6;
	/* 3 chunks and 2 pidfds held: one fd left of the capacity. */
	EXPECT_VERDICTS(b, { UID_C, &conn_c, 4 * MIB, ASK_POOL, REFUSAL_CAPACITY },
			{ UID_C, &conn_c, 2 * MIB, ASK_POOL, 0 });
	budget_fd_sub(b->budget, UID_A);
	budget_fd_sub(b->budget, UID_A);
	check_books(b);
	free_broker(b);
}
END_TEST

/* A lease whose holder's connection closed may still be mapped (a clone(CLONE_VM) sibling): its chunks are destroyed. */
START_TEST(test_a_dropped_lease_is_not_pooled)
{
	struct lease *l = NULL;
	struct pool_model_stats tb;
	uint64_t old[2];
	struct broker *b = broker_with_lease(4 * MIB, &l);

	chunk_ids(l, old, 2);
	ck_assert_uint_eq(drop_owner(b, &conn_a), 1);
	ck_assert_uint_eq(idle_bytes(), 0);
	pool_model_stats(&tb);
	ck_assert_uint_eq(tb.retired_bytes, 4 * MIB);
	ck_assert_int_eq(acquire(b, UID_A, &conn_a, 4 * MIB, &l), 0);
	ck_assert(!shares_a_chunk(l, old, 2));
	check_books(b);
	free_broker(b);
}
END_TEST

/* One uid, two tenants (pid namespaces or cgroups): released chunks stay warm for their tenant only. */
START_TEST(test_chunks_are_reused_within_a_tenant_only)
{
	struct broker *b = new_broker(64 * MIB, 0, 0);
	struct acquire_args a = { .uid = UID_A,
				  .gid = UID_A,
				  .pid = 7,
				  .owner = &conn_a,
				  .size = 4 * MIB,
				  .priority = LEASE_PRIO_NORMAL,
				  .numa_node = -1,
				  .tenant = 11,
				  .now_ms = 1000 };
	struct lease *l = NULL;
	struct pool_model_stats tb;
	uint64_t old[2];

	ck_assert_int_eq(pool_model_acquire(b, &a, &l, &last_err), 0);
	chunk_ids(l, old, 2);
	ck_assert_int_eq(release(b, l->id, UID_A, &conn_a, false), 0);
	ck_assert_uint_eq(idle_bytes(), 4 * MIB);
	/* The same tenant: the same chunks, warm. */
	ck_assert_int_eq(pool_model_acquire(b, &a, &l, &last_err), 0);
	ck_assert(shares_a_chunk(l, old, 2));
	ck_assert_int_eq(release(b, l->id, UID_A, &conn_a, false), 0);
	/* Another tenant of the same uid: fresh chunks, the idle ones replaced (the pool holds no more). */
	a.tenant = 12;
	a.owner = &conn_b;
	ck_assert_int_eq(pool_model_acquire(b, &a, &l, &last_err), 0);
	ck_assert(!shares_a_chunk(l, old, 2));
	ck_assert_uint_eq(idle_bytes(), 0);
	pool_model_stats(&tb);
	ck_assert_uint_eq(tb.replaced_bytes, 4 * MIB);
	check_books(b);
	free_broker(b);
}
END_TEST

CHECK_SUITE(broker_suite, "broker", "core", NULL, NULL, 60, test_acquire_rounds_to_page_size_and_charges_exactly,
	    test_acquire_of_zero_or_overflowing_size_is_invalid, test_acquire_passes_budget_refusals_through,
	    test_acquire_when_tight_lends_only_from_the_idle_pool,
	    test_acquire_when_tight_refuses_never_revoked_leases_even_from_the_idle_pool,
	    test_acquire_when_critical_is_refused, test_budget_refusal_wins_over_pressure_refusal,
	    test_set_pressure_records_the_state_and_names_the_reaction, test_acquire_shrinks_idle_pool_to_fit_budget,
	    test_acquire_pool_failure_changes_nothing, test_release_returns_memory_to_budget_and_pool,
	    test_release_of_foreign_lease_is_refused, test_admin_may_release_any_lease,
	    test_drop_owner_frees_only_that_connections_leases, test_drop_owner_leaves_orphaned_leases_alone,
	    test_free_lease_in_any_state_uncharges_it, test_free_lease_after_lowered_limit_keeps_idle_within_budget,
	    test_trim_pool_shrinks_to_target_bounded_by_budget, test_overdue_bytes_counts_only_overdue_leases,
	    test_random_acquire_release_keeps_books_exact_and_within_budget,
	    test_attach_charges_nothing_and_lease_lives_until_last_mapper,
	    test_attach_refused_while_revoking_and_idle_lease_becomes_active,
	    test_cross_uid_attach_taints_chunks_and_they_never_return_to_the_pool, test_same_uid_attach_taints_nothing,
	    test_caps_refuse_by_leases_chunks_and_capacity, test_revoke_deadline_floor_applies_to_non_admins_only,
	    test_holder_revoke_never_signals_another_uid, test_held_fds_meet_the_chunk_caps,
	    test_idle_chunks_make_room_under_the_chunk_capacity, test_a_dropped_lease_is_not_pooled,
	    test_chunks_are_reused_within_a_tenant_only)

CHECK_MAIN(broker_suite)

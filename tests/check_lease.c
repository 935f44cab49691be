/* SPDX-License-Identifier: MIT */
/* Unit tests for the lease table: ids, lookup, id-order walks, every state edge, and revoke order. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lease.h"
#include "check_main.h"

#define MIB (1024ull * 1024)

static struct lease_table *new_table(void)
{
	struct lease_table *t = NULL;

	ck_assert_int_eq(lease_table_new(&t), 0);
	ck_assert_ptr_nonnull(t);
	return t;
}

/* A chunks array as the pool would hand over; the table frees it. */
static struct chunk **fake_chunks(size_t n)
{
	struct chunk **v = calloc(n ? n : 1, sizeof(*v));

	ck_assert_ptr_nonnull(v);
	return v;
}

static struct lease *add(struct lease_table *t, uid_t uid, uint64_t bytes, enum lease_priority prio,
			 uint64_t now_ms)
{
	struct lease *l = NULL;

	ck_assert_int_eq(lease_add(t, uid, uid, 100, (void *)t, bytes, prio, "test", fake_chunks(1), 1, now_ms, &l),
			 0);
	ck_assert_ptr_nonnull(l);
	return l;
}

START_TEST(test_add_starts_active_with_fields_set)
{
	struct lease_table *t = new_table();
	struct lease *l = NULL;
	int owner;

	ck_assert_int_eq(lease_add(t, 1000, 100, 4242, &owner, 6 * MIB, LEASE_PRIO_CRITICAL, "kv-cache",
				   fake_chunks(3), 3, 777, &l),
			 0);
	ck_assert_uint_ne(l->id, 0);
	ck_assert_int_eq(l->state, LEASE_ACTIVE);
	ck_assert_uint_eq(l->uid, 1000);
	ck_assert_uint_eq(l->gid, 100);
	ck_assert_int_eq(l->pid, 4242);
	ck_assert_ptr_eq(l->owner, &owner);
	ck_assert_uint_eq(l->bytes, 6 * MIB);
	ck_assert_int_eq(l->priority, LEASE_PRIO_CRITICAL);
	ck_assert_str_eq(l->label, "kv-cache");
	ck_assert_uint_eq(l->created_ms, 777);
	ck_assert_uint_eq(l->last_used_ms, 777);
	ck_assert_uint_eq(l->nchunks, 3);
	ck_assert_uint_eq(lease_count(t), 1);
	lease_table_free(t);
}
END_TEST

START_TEST(test_label_is_truncated_and_null_label_is_empty)
{
	struct lease_table *t = new_table();
	char long_label[200];
	struct lease *l = NULL;

	memset(long_label, 'x', sizeof(long_label) - 1);
	long_label[sizeof(long_label) - 1] = '\0';
	ck_assert_int_eq(lease_add(t, 1, 1, 1, NULL, MIB, LEASE_PRIO_NORMAL, long_label, fake_chunks(1), 1, 0, &l),
			 0);
	ck_assert_uint_eq(strlen(l->label), LEASE_LABEL_MAX - 1);
	ck_assert_int_eq(lease_add(t, 1, 1, 1, NULL, MIB, LEASE_PRIO_NORMAL, NULL, fake_chunks(1), 1, 0, &l), 0);
	ck_assert_str_eq(l->label, "");
	lease_table_free(t);
}
END_TEST

START_TEST(test_ids_are_unique_increasing_and_never_reused)
{
	struct lease_table *t = new_table();
	uint64_t last = 0;

	for (int i = 0; i < 1000; i++) {
		struct lease *l = add(t, 1000, MIB, LEASE_PRIO_NORMAL, 0);

		ck_assert_uint_gt(l->id, last);
		last = l->id;
		/* Remove every other one: freed ids must not come back. */
		if (i % 2)
			lease_remove(t, l);
	}
	ck_assert_uint_eq(lease_count(t), 500);
	ck_assert_uint_gt(add(t, 1000, MIB, LEASE_PRIO_NORMAL, 0)->id, last);
	lease_table_free(t);
}
END_TEST

START_TEST(test_set_next_id_moves_ids_up_but_never_down)
{
	struct lease_table *t = new_table();
	struct lease *l;

	lease_table_set_next_id(t, 5000);
	l = add(t, 1, MIB, LEASE_PRIO_NORMAL, 0);
	ck_assert_uint_gt(l->id, 5000);
	lease_table_set_next_id(t, 10);
	ck_assert_uint_gt(add(t, 1, MIB, LEASE_PRIO_NORMAL, 0)->id, l->id);
	lease_table_free(t);
}
END_TEST

START_TEST(test_find_returns_each_lease_and_null_after_remove)
{
	struct lease_table *t = new_table();
	struct lease *v[3000];

	/* Enough to force the hash to grow several times. */
	for (int i = 0; i < 3000; i++)
		v[i] = add(t, (uid_t)i, MIB, LEASE_PRIO_NORMAL, 0);
	for (int i = 0; i < 3000; i++)
		ck_assert_ptr_eq(lease_find(t, v[i]->id), v[i]);
	ck_assert_ptr_null(lease_find(t, 0));
	ck_assert_ptr_null(lease_find(t, 999999));
	for (int i = 0; i < 3000; i += 3) {
		uint64_t id = v[i]->id;

		lease_remove(t, v[i]);
		ck_assert_ptr_null(lease_find(t, id));
	}
	ck_assert_uint_eq(lease_count(t), 2000);
	lease_table_free(t);
}
END_TEST

START_TEST(test_adopt_keeps_id_is_orphaned_and_rejects_taken_ids)
{
	struct lease_table *t = new_table();
	struct lease *l = NULL, *fresh;

	ck_assert_int_eq(lease_adopt(t, 42, 1000, 4 * MIB, LEASE_PRIO_BEST_EFFORT, "old", fake_chunks(2), 2, 9, &l),
			 0);
	ck_assert_uint_eq(l->id, 42);
	ck_assert_int_eq(l->state, LEASE_ORPHANED);
	ck_assert_ptr_null(l->owner);
	ck_assert_ptr_eq(lease_find(t, 42), l);

	struct chunk **dup = fake_chunks(1);
	ck_assert_int_eq(lease_adopt(t, 42, 1000, MIB, LEASE_PRIO_NORMAL, NULL, dup, 1, 9, &l), -EEXIST);
	free(dup);

	/* Fresh ids never collide with an adopted one. */
	fresh = add(t, 1, MIB, LEASE_PRIO_NORMAL, 0);
	ck_assert_uint_gt(fresh->id, 42);
	lease_table_free(t);
}
END_TEST

START_TEST(test_iteration_is_in_id_order_even_with_adopted_ids)
{
	struct lease_table *t = new_table();
	static const uint64_t ids[] = { 50, 10, 30, 70, 20 };
	struct lease *l = NULL;
	uint64_t prev = 0;
	size_t seen = 0;

	for (size_t i = 0; i < 5; i++)
		ck_assert_int_eq(lease_adopt(t, ids[i], 1, MIB, LEASE_PRIO_NORMAL, NULL, fake_chunks(1), 1, 0, &l), 0);
	add(t, 1, MIB, LEASE_PRIO_NORMAL, 0);
	for (l = lease_first(t); l; l = lease_next(t, l)) {
		ck_assert_uint_gt(l->id, prev);
		prev = l->id;
		seen++;
	}
	ck_assert_uint_eq(seen, 6);
	ck_assert_uint_eq(lease_first(t)->id, 10);
	lease_table_free(t);
}
END_TEST

START_TEST(test_removing_current_while_iterating_is_safe)
{
	struct lease_table *t = new_table();
	struct lease *l, *next;
	size_t visited = 0;

	for (int i = 0; i < 10; i++)
		add(t, 1, MIB, LEASE_PRIO_NORMAL, 0);
	for (l = lease_first(t); l; l = next) {
		next = lease_next(t, l);
		lease_remove(t, l);
		visited++;
	}
	ck_assert_uint_eq(visited, 10);
	ck_assert_uint_eq(lease_count(t), 0);
	ck_assert_ptr_null(lease_first(t));
	lease_table_free(t);
}
END_TEST

/* The spec's edges, written independently of the implementation's table. */
static bool expected_legal(enum lease_state from, enum lease_state to)
{
	if (from == to)
		return false;
	if (to == LEASE_FREED)
		return from != LEASE_FREED;
	switch (from) {
	case LEASE_ACTIVE:
		return to == LEASE_IDLE || to == LEASE_REVOKING;
	case LEASE_IDLE:
		return to == LEASE_ACTIVE || to == LEASE_REVOKING;
	case LEASE_REVOKING:
		return to == LEASE_OVERDUE;
	case LEASE_ORPHANED:
		return to == LEASE_ACTIVE || to == LEASE_IDLE;
	default:
		return false;
	}
}

START_TEST(test_every_state_edge_is_legal_or_rejected_as_specified)
{
	unsigned nlegal = 0;

	for (int from = 0; from < LEASE__STATE_MAX; from++)
		for (int to = 0; to < LEASE__STATE_MAX; to++) {
			struct lease l = { .state = from, .last_used_ms = 1 };
			bool want = expected_legal(from, to);
			int r = lease_set_state(&l, to, 500);

			ck_assert_msg(lease_edge_legal(from, to) == want, "%s -> %s", lease_state_name(from),
				      lease_state_name(to));
			if (want) {
				nlegal++;
				ck_assert_int_eq(r, 0);
				ck_assert_int_eq(l.state, to);
				ck_assert_uint_eq(l.last_used_ms, to == LEASE_ACTIVE ? 500 : 1);
			} else {
				ck_assert_msg(r == -EINVAL, "%s -> %s", lease_state_name(from), lease_state_name(to));
				ck_assert_int_eq(l.state, from);
				ck_assert_uint_eq(l.last_used_ms, 1);
			}
		}
	/* 7 listed edges plus 5 non-FREED states to FREED. */
	ck_assert_uint_eq(nlegal, 12);
}
END_TEST

START_TEST(test_revoking_lease_cannot_become_active_again)
{
	struct lease l = { .state = LEASE_REVOKING };

	ck_assert_int_eq(lease_set_state(&l, LEASE_ACTIVE, 1), -EINVAL);
	ck_assert_int_eq(l.state, LEASE_REVOKING);
}
END_TEST

START_TEST(test_out_of_range_states_are_illegal)
{
	struct lease l = { .state = LEASE_ACTIVE };

	ck_assert(!lease_edge_legal(LEASE__STATE_MAX, LEASE_FREED));
	ck_assert(!lease_edge_legal(LEASE_ACTIVE, LEASE__STATE_MAX));
	ck_assert(!lease_edge_legal((enum lease_state)-1, LEASE_FREED));
	ck_assert_int_eq(lease_set_state(&l, LEASE__STATE_MAX, 1), -EINVAL);
}
END_TEST

START_TEST(test_revoke_order_follows_class_then_size_then_lru)
{
	struct lease_table *t = new_table();
	struct lease *crit_big, *norm_small, *norm_big_old, *norm_big_new, *idle_norm, *idle_crit, *be_small,
		*be_big, *revoking, *overdue, *orphan = NULL;
	struct lease **order = NULL;
	size_t n = 0;

	crit_big = add(t, 1, 64 * MIB, LEASE_PRIO_CRITICAL, 10);
	norm_small = add(t, 1, 2 * MIB, LEASE_PRIO_NORMAL, 10);
	norm_big_new = add(t, 1, 8 * MIB, LEASE_PRIO_NORMAL, 30);
	norm_big_old = add(t, 1, 8 * MIB, LEASE_PRIO_NORMAL, 20);
	idle_norm = add(t, 1, 4 * MIB, LEASE_PRIO_NORMAL, 10);
	idle_crit = add(t, 1, 16 * MIB, LEASE_PRIO_CRITICAL, 10);
	be_small = add(t, 1, 2 * MIB, LEASE_PRIO_BEST_EFFORT, 10);
	be_big = add(t, 1, 32 * MIB, LEASE_PRIO_BEST_EFFORT, 10);
	revoking = add(t, 1, 128 * MIB, LEASE_PRIO_BEST_EFFORT, 10);
	overdue = add(t, 1, 128 * MIB, LEASE_PRIO_BEST_EFFORT, 10);
	ck_assert_int_eq(lease_adopt(t, 9999, 1, 256 * MIB, LEASE_PRIO_BEST_EFFORT, NULL, fake_chunks(1), 1, 0,
				     &orphan),
			 0);
	ck_assert_int_eq(lease_set_state(idle_norm, LEASE_IDLE, 10), 0);
	ck_assert_int_eq(lease_set_state(idle_crit, LEASE_IDLE, 10), 0);
	ck_assert_int_eq(lease_set_state(revoking, LEASE_REVOKING, 10), 0);
	ck_assert_int_eq(lease_set_state(overdue, LEASE_REVOKING, 10), 0);
	ck_assert_int_eq(lease_set_state(overdue, LEASE_OVERDUE, 10), 0);

	ck_assert_int_eq(lease_revoke_order(t, &order, &n), 0);
	ck_assert_uint_eq(n, 8);
	/* Best-effort, largest first; then cached-idle; then normal (big, older first); then critical. */
	ck_assert_ptr_eq(order[0], be_big);
	ck_assert_ptr_eq(order[1], be_small);
	ck_assert_ptr_eq(order[2], idle_crit);
	ck_assert_ptr_eq(order[3], idle_norm);
	ck_assert_ptr_eq(order[4], norm_big_old);
	ck_assert_ptr_eq(order[5], norm_big_new);
	ck_assert_ptr_eq(order[6], norm_small);
	ck_assert_ptr_eq(order[7], crit_big);
	free(order);
	lease_table_free(t);
}
END_TEST

START_TEST(test_revoke_order_of_empty_table_is_empty)
{
	struct lease_table *t = new_table();
	struct lease **order = NULL;
	size_t n = 99;

	ck_assert_int_eq(lease_revoke_order(t, &order, &n), 0);
	ck_assert_uint_eq(n, 0);
	free(order);
	lease_table_free(t);
}
END_TEST

START_TEST(test_names_cover_every_state_and_priority)
{
	ck_assert_str_eq(lease_state_name(LEASE_ACTIVE), "active");
	ck_assert_str_eq(lease_state_name(LEASE_IDLE), "idle");
	ck_assert_str_eq(lease_state_name(LEASE_REVOKING), "revoking");
	ck_assert_str_eq(lease_state_name(LEASE_OVERDUE), "overdue");
	ck_assert_str_eq(lease_state_name(LEASE_ORPHANED), "orphaned");
	ck_assert_str_eq(lease_state_name(LEASE_FREED), "freed");
	ck_assert_str_eq(lease_state_name(LEASE__STATE_MAX), "unknown");
	ck_assert_str_eq(lease_priority_name(LEASE_PRIO_NORMAL), "normal");
	ck_assert_str_eq(lease_priority_name(LEASE_PRIO_CRITICAL), "critical");
	ck_assert_str_eq(lease_priority_name(LEASE_PRIO_BEST_EFFORT), "best-effort");
}
END_TEST

static Suite *lease_suite(void)
{
	Suite *s = suite_create("lease");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_add_starts_active_with_fields_set);
	tcase_add_test(tc, test_label_is_truncated_and_null_label_is_empty);
	tcase_add_test(tc, test_ids_are_unique_increasing_and_never_reused);
	tcase_add_test(tc, test_set_next_id_moves_ids_up_but_never_down);
	tcase_add_test(tc, test_find_returns_each_lease_and_null_after_remove);
	tcase_add_test(tc, test_adopt_keeps_id_is_orphaned_and_rejects_taken_ids);
	tcase_add_test(tc, test_iteration_is_in_id_order_even_with_adopted_ids);
	tcase_add_test(tc, test_removing_current_while_iterating_is_safe);
	tcase_add_test(tc, test_every_state_edge_is_legal_or_rejected_as_specified);
	tcase_add_test(tc, test_revoking_lease_cannot_become_active_again);
	tcase_add_test(tc, test_out_of_range_states_are_illegal);
	tcase_add_test(tc, test_revoke_order_follows_class_then_size_then_lru);
	tcase_add_test(tc, test_revoke_order_of_empty_table_is_empty);
	tcase_add_test(tc, test_names_cover_every_state_and_priority);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(lease_suite)

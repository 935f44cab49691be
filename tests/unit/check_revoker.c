/* SPDX-License-Identifier: MIT */
/* Unit tests for the revoker's decisions (revoker-policy): deadline rounds, their coalescing, which leases a round marks, slices, reclaim, on a clock the test sets. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "lease.h"
#include "revoker-policy.h"
#include "check_main.h"

#define MIB (1024ull * 1024)

static struct lease_table *new_table(void)
{
	struct lease_table *t = NULL;

	ck_assert_int_eq(lease_table_new(&t), 0);
	return t;
}

static struct lease *add(struct lease_table *t, uint64_t bytes)
{
	struct lease *l = NULL;
	struct lease_chunk *chunks = calloc(1, sizeof(*chunks));

	ck_assert_ptr_nonnull(chunks);
	ck_assert_int_eq(lease_add(t, 1000, 1000, 100, t, bytes, LEASE_PRIO_NORMAL, "t", chunks, 1, 0, &l), 0);
	return l;
}

/* What revoker_revoke does to the lease at now_ms. */
static void revoke(struct lease *l, uint64_t now_ms, uint32_t deadline_ms)
{
	ck_assert_int_eq(lease_set_state(l, LEASE_REVOKING, now_ms), 0);
	l->deadline_ms = now_ms + deadline_ms;
}

/* ------------------------------------------------------------ the deadline timer */

START_TEST(test_round_runs_after_the_deadline_plus_the_coalescing_window)
{
	ck_assert_uint_eq(revoker_policy_round_delay_ms(5000, 0), 5000 + REVOKER_ROUND_COALESCE_MS);
	ck_assert_uint_eq(revoker_policy_round_delay_ms(5000, 4990), 10 + REVOKER_ROUND_COALESCE_MS);
	/* Already past (the loop was busy): as soon as the window allows, never a wrapped-around wait. */
	ck_assert_uint_eq(revoker_policy_round_delay_ms(5000, 7000), REVOKER_ROUND_COALESCE_MS);
	ck_assert_int_ge(REVOKER_ROUND_COALESCE_MS, 1);
	ck_assert_int_le(REVOKER_ROUND_COALESCE_MS, 1000);
}
END_TEST

START_TEST(test_running_timer_serves_later_deadlines_but_not_shorter_ones)
{
	/* No timer: it must be set. */
	ck_assert(!revoker_policy_timer_serves(false, 0, 5000));
	/* Fires in 5060 ms; a lease due in 5000 ms is served within the window. */
	ck_assert(revoker_policy_timer_serves(true, 5060, 5000));
	ck_assert(revoker_policy_timer_serves(true, 5100, 5000));
	/* A shorter deadline needs an earlier round: the timer moves. */
	ck_assert(!revoker_policy_timer_serves(true, 5101, 5000));
	ck_assert(!revoker_policy_timer_serves(true, 5000, 1000));
	/* A longer deadline: the earlier round leaves it REVOKING and re-arms for it at its end. */
	ck_assert(revoker_policy_timer_serves(true, 1000, 60000));
}
END_TEST

START_TEST(test_earliest_deadline_is_of_revoking_leases_only)
{
	struct lease_table *t = new_table();
	struct lease *a = add(t, MIB), *b = add(t, MIB), *c = add(t, MIB);

	ck_assert_uint_eq(revoker_policy_earliest_deadline(t), UINT64_MAX);
	revoke(a, 0, 3000);
	revoke(b, 100, 1000);
	ck_assert_uint_eq(revoker_policy_earliest_deadline(t), 1100);
	/* Overdue already: its round has run; it sets no timer. */
	ck_assert_int_eq(lease_set_state(b, LEASE_OVERDUE, 1200), 0);
	ck_assert_uint_eq(revoker_policy_earliest_deadline(t), 3000);
	c->deadline_ms = 1; /* a stale deadline on a lease that is not revoking counts for nothing */
	ck_assert_uint_eq(revoker_policy_earliest_deadline(t), 3000);
	lease_table_free(t);
}
END_TEST

/* ------------------------------------------------------------ which leases a round marks */

START_TEST(test_round_marks_only_leases_past_their_deadline)
{
	struct lease_table *t = new_table();
	struct lease *due = add(t, MIB), *later = add(t, MIB), *active = add(t, MIB), *released = add(t, MIB);
	uint64_t cursor = 0, released_id = released->id;

	revoke(due, 0, 1000);
	revoke(later, 0, 3000);
	revoke(released, 0, 1000);
	/* Its holder let go inside the deadline: the lease is gone, nothing to enforce. */
	lease_remove(t, released);
	(void)active;
	ck_assert_ptr_eq(revoker_policy_next_overdue(t, &cursor, 2000), due);
	ck_assert_ptr_null(revoker_policy_next_overdue(t, &cursor, 2000));
	ck_assert_uint_ge(cursor, released_id - 1);
	/* At its deadline exactly it is due. */
	cursor = 0;
	ck_assert_ptr_eq(revoker_policy_next_overdue(t, &cursor, 1000), due);
	/* A millisecond before, nobody is. */
	cursor = 0;
	ck_assert_ptr_null(revoker_policy_next_overdue(t, &cursor, 999));
	lease_table_free(t);
}
END_TEST

START_TEST(test_round_resumes_after_its_cursor_across_slices)
{
	struct lease_table *t = new_table();
	struct lease *l[6];
	uint64_t cursor = 0;

	for (int i = 0; i < 6; i++) {
		l[i] = add(t, MIB);
		revoke(l[i], 0, 100);
	}
	/* One lease per slice: each slice picks up where the last stopped, none twice. */
	for (int i = 0; i < 3; i++) {
		struct lease *got = revoker_policy_next_overdue(t, &cursor, 500);

		ck_assert_ptr_eq(got, l[i]);
		ck_assert_int_eq(lease_set_state(got, LEASE_OVERDUE, 500), 0);
	}
	/* Between slices: one given back (freed), one overdue already; the round goes on with the rest. */
	ck_assert_int_eq(lease_set_state(l[3], LEASE_OVERDUE, 510), 0);
	ck_assert_int_eq(lease_set_state(l[4], LEASE_FREED, 510), 0);
	lease_remove(t, l[4]);
	ck_assert_ptr_eq(revoker_policy_next_overdue(t, &cursor, 500), l[5]);
	ck_assert_int_eq(lease_set_state(l[5], LEASE_OVERDUE, 500), 0);
	ck_assert_ptr_null(revoker_policy_next_overdue(t, &cursor, 500));
	/* Revoked while the round ran (its deadline is after the round's start): the next round's. */
	{
		struct lease *late = add(t, MIB);

		revoke(late, 520, 100);
		ck_assert_ptr_null(revoker_policy_next_overdue(t, &cursor, 500));
		cursor = 0;
		ck_assert_ptr_eq(revoker_policy_next_overdue(t, &cursor, 700), late);
	}
	lease_table_free(t);
}
END_TEST

START_TEST(test_slice_budget)
{
	ck_assert(!revoker_policy_slice_spent(1000, 1000, 500));
	ck_assert(!revoker_policy_slice_spent(1000, 1499, 500));
	ck_assert(revoker_policy_slice_spent(1000, 1500, 500));
	ck_assert(revoker_policy_slice_spent(1000, 9000, 500));
	ck_assert_uint_eq(revoker_policy_slice_left(1000, 1200, 500), 300);
	/* Spent: the scan still gets a microsecond, so a round always moves. */
	ck_assert_uint_eq(revoker_policy_slice_left(1000, 1500, 500), 1);
	ck_assert_uint_eq(revoker_policy_slice_left(1000, 5000, 500), 1);
}
END_TEST

/*
 * The revoker's timer logic on a simulated clock: every revoke arms the deadline timer as
 * revoker_round_arm_for does; when it fires a round marks what is due and re-arms for the
 * earliest deadline left. Every lease must be marked no earlier than its deadline (a holder
 * gets all its time) and no later than the deadline plus the coalescing window.
 */
START_TEST(test_every_deadline_is_enforced_inside_its_window)
{
	struct lease_table *t = new_table();
	uint64_t now = 0, fire_at = 0;
	bool armed = false;
	unsigned seed = 12345, rounds = 0, marked = 0;
	const uint32_t deadlines[] = { 50, 100, 250, 1000, 5000, 30000 };

	for (int step = 0; step < 4000; step++) {
		seed = seed * 1103515245u + 12345u;
		now += (seed >> 16) % 40;
		/* The timer fires first if it is due. */
		while (armed && fire_at <= now) {
			uint64_t started = fire_at, cursor = 0, earliest;
			struct lease *l;

			armed = false;
			rounds++;
			while ((l = revoker_policy_next_overdue(t, &cursor, started))) {
				ck_assert_uint_ge(started, l->deadline_ms);
				ck_assert_uint_le(started, l->deadline_ms + REVOKER_ROUND_COALESCE_MS);
				ck_assert_int_eq(lease_set_state(l, LEASE_OVERDUE, started), 0);
				marked++;
			}
			earliest = revoker_policy_earliest_deadline(t);
			if (earliest != UINT64_MAX) {
				fire_at = started + revoker_policy_round_delay_ms(earliest, started);
				armed = true;
			}
		}
		if ((seed >> 8) % 3 == 0) {
			struct lease *l = add(t, MIB);
			uint32_t d = deadlines[(seed >> 20) % 6];

			revoke(l, now, d);
			if (!revoker_policy_timer_serves(armed, armed ? (double)(fire_at - now) : 0, d)) {
				fire_at = now + d + REVOKER_ROUND_COALESCE_MS;
				armed = true;
			}
		} else if ((seed >> 8) % 3 == 1) {
			/* A holder gives a revoking lease back in time. */
			struct lease *l = lease_first(t);

			for (; l && l->state != LEASE_REVOKING; l = lease_next(t, l))
				;
			if (l)
				lease_remove(t, l);
		}
	}
	ck_assert_uint_gt(marked, 100);
	ck_assert_uint_gt(rounds, 10);
	lease_table_free(t);
}
END_TEST

/* One REVOKE of many leases stamps each as it goes: they fall due in one round, not one each. */
START_TEST(test_leases_revoked_together_fall_due_in_one_round)
{
	struct lease_table *t = new_table();
	struct lease *l[5];
	uint64_t fire_at = 0, cursor = 0;
	bool armed = false;
	int n = 0;

	for (int i = 0; i < 5; i++) {
		uint64_t now = 1000 + 20 * (uint64_t)i; /* 20 ms apart: a loaded host's REVOKE of a uid's leases */

		l[i] = add(t, MIB);
		revoke(l[i], now, 5000);
		if (!revoker_policy_timer_serves(armed, armed ? (double)(fire_at - now) : 0, 5000)) {
			fire_at = now + 5000 + REVOKER_ROUND_COALESCE_MS;
			armed = true;
		}
	}
	/* The timer was set once, by the first. */
	ck_assert_uint_eq(fire_at, 1000 + 5000 + REVOKER_ROUND_COALESCE_MS);
	while (revoker_policy_next_overdue(t, &cursor, fire_at))
		n++;
	ck_assert_int_eq(n, 5);
	lease_table_free(t);
}
END_TEST

/* ------------------------------------------------------------ reclaim and enforcement */

START_TEST(test_reclaim_deficit_aims_for_the_tight_line)
{
	uint64_t total = 100ull << 30;

	/* 5 % available, tight at 10 %: 5 % of memory must come back. */
	ck_assert_uint_eq(revoker_policy_reclaim_deficit(5.0, 10.0, total), 5ull << 30);
	/* No memory figure (PSI alone): one lease at a time. */
	ck_assert_uint_eq(revoker_policy_reclaim_deficit(NAN, 10.0, total), 1);
	/* At or above the line: one lease at a time. */
	ck_assert_uint_eq(revoker_policy_reclaim_deficit(10.0, 10.0, total), 1);
	ck_assert_uint_eq(revoker_policy_reclaim_deficit(30.0, 10.0, total), 1);
}
END_TEST

START_TEST(test_revoking_bytes_counts_leases_on_their_way_back)
{
	struct lease_table *t = new_table();
	struct lease *a = add(t, 2 * MIB), *b = add(t, 3 * MIB);

	add(t, 5 * MIB);
	ck_assert_uint_eq(revoker_policy_revoking_bytes(t), 0);
	revoke(a, 0, 100);
	revoke(b, 0, 100);
	ck_assert_uint_eq(revoker_policy_revoking_bytes(t), 5 * MIB);
	/* Overdue: its holder did not let go, so it is not on its way back. */
	ck_assert_int_eq(lease_set_state(b, LEASE_OVERDUE, 200), 0);
	ck_assert_uint_eq(revoker_policy_revoking_bytes(t), 2 * MIB);
	lease_table_free(t);
}
END_TEST

START_TEST(test_enforce_signal_follows_revoke_enforce)
{
	ck_assert_int_eq(revoker_policy_signal(ENFORCE_SIGKILL), SIGKILL);
	ck_assert_int_eq(revoker_policy_signal(ENFORCE_SIGTERM), SIGTERM);
	ck_assert_int_eq(revoker_policy_signal(ENFORCE_DISCONNECT), 0);
	ck_assert_int_eq(revoker_policy_signal(ENFORCE_NONE), 0);
}
END_TEST

CHECK_SUITE(revoker_suite, "revoker", "policy", NULL, NULL, 30,
	    test_round_runs_after_the_deadline_plus_the_coalescing_window,
	    test_running_timer_serves_later_deadlines_but_not_shorter_ones,
	    test_earliest_deadline_is_of_revoking_leases_only, test_round_marks_only_leases_past_their_deadline,
	    test_round_resumes_after_its_cursor_across_slices, test_slice_budget,
	    test_every_deadline_is_enforced_inside_its_window, test_leases_revoked_together_fall_due_in_one_round,
	    test_reclaim_deficit_aims_for_the_tight_line, test_revoking_bytes_counts_leases_on_their_way_back,
	    test_enforce_signal_follows_revoke_enforce)

CHECK_MAIN(revoker_suite)

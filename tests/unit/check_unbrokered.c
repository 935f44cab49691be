/* SPDX-License-Identifier: MIT */
/* Unit tests for unbrokered: per-uid sums of clients' reports, and the caps that bound what one uid's word adds. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "check_main.h"
#include "unbrokered.h"

#define MIB (1024ull * 1024)
#define GIB (1024ull * MIB)
#define TIB (1024ull * GIB)

START_TEST(test_reports_replace_each_other_per_connection_and_sum_per_uid)
{
	struct unbrokered u = { 0 };

	ck_assert_int_eq(unbrokered_set(&u, 1000, 0, 3 * MIB), 0);
	ck_assert_int_eq(unbrokered_set(&u, 1000, 0, 1 * MIB), 0);
	ck_assert_int_eq(unbrokered_set(&u, 2000, 0, 5 * MIB), 0);
	ck_assert_uint_eq(unbrokered_uid_reported(&u, 1000), 4 * MIB);
	ck_assert_uint_eq(unbrokered_uid_reported(&u, 2000), 5 * MIB);
	ck_assert_uint_eq(u.reported_bytes, 9 * MIB);
	/* The first connection of uid 1000 reports again: its new figure replaces its old one. */
	ck_assert_int_eq(unbrokered_set(&u, 1000, 3 * MIB, 2 * MIB), 0);
	ck_assert_uint_eq(unbrokered_uid_reported(&u, 1000), 3 * MIB);
	ck_assert_uint_eq(u.nuids, 2);
	ck_assert_uint_eq(u.uids[0].connections, 2);
	/* Connections close: the uid goes when its last reporting connection does, and the table with it. */
	ck_assert_int_eq(unbrokered_set(&u, 1000, 2 * MIB, 0), 0);
	ck_assert_int_eq(unbrokered_set(&u, 1000, 1 * MIB, 0), 0);
	ck_assert_uint_eq(unbrokered_uid_reported(&u, 1000), 0);
	ck_assert_uint_eq(u.nuids, 1);
	ck_assert_int_eq(unbrokered_set(&u, 2000, 5 * MIB, 0), 0);
	ck_assert_uint_eq(u.nuids, 0);
	ck_assert_uint_eq(u.reported_bytes, 0);
	ck_assert_ptr_null(u.uids);
}
END_TEST

START_TEST(test_one_uid_on_many_connections_is_capped_and_another_still_counts)
{
	struct unbrokered u = { 0 };
	uint64_t cap = 64 * GIB;

	/* The attack, at MemTotal per connection: 200 connections of one uid. */
	for (int i = 0; i < 200; i++)
		ck_assert_int_eq(unbrokered_set(&u, 61001, 0, cap), 0);
	ck_assert_int_eq(unbrokered_set(&u, 61002, 0, 64 * MIB), 0);
	ck_assert_uint_eq(unbrokered_uid_reported(&u, 61001), 200 * cap);
	ck_assert_uint_eq(unbrokered_uid_counted(&u, 61001, cap), cap);
	ck_assert_uint_eq(unbrokered_uid_counted(&u, 61002, cap), 64 * MIB);
	ck_assert_uint_eq(unbrokered_counted(&u, cap), cap);
	/* With a cap above A's sum, B adds in full. */
	ck_assert_uint_eq(unbrokered_counted(&u, UINT64_MAX), 200 * cap + 64 * MIB);
	unbrokered_clear(&u);
}
END_TEST

START_TEST(test_cap_is_memtotal_less_what_is_pinned)
{
	ck_assert_uint_eq(unbrokered_cap(64 * GIB, 4 * GIB), 60 * GIB);
	ck_assert_uint_eq(unbrokered_cap(64 * GIB, 65 * GIB), 0);
	ck_assert_uint_eq(unbrokered_cap(0, 4 * GIB), UINT64_MAX);
}
END_TEST

START_TEST(test_a_report_above_memtotal_or_the_wire_bound_is_not_ok)
{
	ck_assert(unbrokered_report_ok(64 * GIB, 64 * GIB, 16 * TIB));
	ck_assert(!unbrokered_report_ok(64 * GIB + 1, 64 * GIB, 16 * TIB));
	ck_assert(!unbrokered_report_ok(16 * TIB, 64 * GIB, 16 * TIB));
	/* MemTotal unknown: only the wire's bound. */
	ck_assert(unbrokered_report_ok(16 * TIB, 0, 16 * TIB));
	ck_assert(!unbrokered_report_ok(16 * TIB + 1, 0, 16 * TIB));
}
END_TEST

START_TEST(test_zero_reports_add_no_uid)
{
	struct unbrokered u = { 0 };

	ck_assert_int_eq(unbrokered_set(&u, 1000, 0, 0), 0);
	ck_assert_uint_eq(u.nuids, 0);
	ck_assert_uint_eq(unbrokered_counted(&u, 1), 0);
}
END_TEST

START_TEST(test_random_reports_keep_exact_sums)
{
	struct unbrokered u = { 0 };
	uint64_t conn[64] = { 0 };
	uid_t owner[64];

	srandom(22);
	for (int i = 0; i < 64; i++)
		owner[i] = 1000 + (uid_t)(i % 7);
	for (int step = 0; step < 20000; step++) {
		int i = (int)(random() % 64);
		uint64_t v = random() % 4 ? (uint64_t)(random() % 1024) * MIB : 0, sum[7] = { 0 }, all = 0;

		ck_assert_int_eq(unbrokered_set(&u, owner[i], conn[i], v), 0);
		conn[i] = v;
		for (int k = 0; k < 64; k++) {
			sum[k % 7] += conn[k];
			all += conn[k];
		}
		for (int k = 0; k < 7; k++)
			ck_assert_uint_eq(unbrokered_uid_reported(&u, 1000 + (uid_t)k), sum[k]);
		ck_assert_uint_eq(u.reported_bytes, all);
	}
	unbrokered_clear(&u);
}
END_TEST

CHECK_SUITE(unbrokered_suite, "unbrokered", "core", NULL, NULL, 30,
	    test_reports_replace_each_other_per_connection_and_sum_per_uid,
	    test_one_uid_on_many_connections_is_capped_and_another_still_counts,
	    test_cap_is_memtotal_less_what_is_pinned, test_a_report_above_memtotal_or_the_wire_bound_is_not_ok,
	    test_zero_reports_add_no_uid, test_random_reports_keep_exact_sums)

CHECK_MAIN(unbrokered_suite)

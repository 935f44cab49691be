/* SPDX-License-Identifier: MIT */
/* Unit tests for budget: every refusal, and exact books after long random charge/uncharge runs. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>

#include "budget.h"
#include "check_main.h"

#define MIB (1024ull * 1024)
#define GIB (1024ull * MIB)

static struct budget *new_budget(uint64_t limit_bytes, uint64_t quota_bytes)
{
	struct budget *b = NULL;

	ck_assert_int_eq(budget_new(limit_bytes, quota_bytes, &b), 0);
	ck_assert_ptr_nonnull(b);
	return b;
}

START_TEST(test_fresh_budget_is_empty)
{
	struct budget *b = new_budget(4 * GIB, GIB);

	ck_assert_uint_eq(budget_limit(b), 4 * GIB);
	ck_assert_uint_eq(budget_uid_quota(b), GIB);
	ck_assert_uint_eq(budget_leased(b), 0);
	ck_assert_uint_eq(budget_uid_leased(b, 1000), 0);
	ck_assert_uint_eq(budget_pool_allowance(b), 4 * GIB);
	budget_free(b);
}
END_TEST

START_TEST(test_check_zero_bytes_is_invalid)
{
	struct budget *b = new_budget(4 * GIB, GIB);

	ck_assert_int_eq(budget_check(b, 1000, 0), REFUSAL_INVALID_SIZE);
	budget_free(b);
}
END_TEST

START_TEST(test_check_over_whole_budget_is_never_satisfiable)
{
	struct budget *b = new_budget(4 * GIB, 0);

	ck_assert_int_eq(budget_check(b, 1000, 4 * GIB + 1), REFUSAL_TOO_LARGE);
	ck_assert_int_eq(budget_check(b, 1000, UINT64_MAX), REFUSAL_TOO_LARGE);
	ck_assert_int_eq(budget_check(b, 1000, 4 * GIB), REFUSAL_NONE);
	budget_free(b);
}
END_TEST

START_TEST(test_check_over_uid_quota_alone_is_never_satisfiable)
{
	struct budget *b = new_budget(4 * GIB, GIB);

	ck_assert_int_eq(budget_check(b, 1000, GIB + 1), REFUSAL_TOO_LARGE);
	ck_assert_int_eq(budget_check(b, 1000, GIB), REFUSAL_NONE);
	budget_free(b);
}
END_TEST

START_TEST(test_reserve_over_uid_quota_fails)
{
	struct budget *b = new_budget(4 * GIB, GIB);

	ck_assert_int_eq(budget_charge(b, 1000, 768 * MIB), 0);
	ck_assert_int_eq(budget_check(b, 1000, 256 * MIB + 1), REFUSAL_UID_QUOTA);
	ck_assert_int_eq(budget_check(b, 1000, 256 * MIB), REFUSAL_NONE);
	/* Another uid is not affected by 1000's usage. */
	ck_assert_int_eq(budget_check(b, 1001, GIB), REFUSAL_NONE);
	budget_free(b);
}
END_TEST

START_TEST(test_reserve_over_budget_with_current_leases_fails)
{
	struct budget *b = new_budget(2 * GIB, GIB);

	ck_assert_int_eq(budget_charge(b, 1000, GIB), 0);
	ck_assert_int_eq(budget_charge(b, 1001, 512 * MIB), 0);
	ck_assert_int_eq(budget_check(b, 1002, 512 * MIB + 1), REFUSAL_BUDGET);
	ck_assert_int_eq(budget_check(b, 1002, 512 * MIB), REFUSAL_NONE);
	ck_assert_uint_eq(budget_pool_allowance(b), 512 * MIB);
	budget_free(b);
}
END_TEST

START_TEST(test_quota_is_checked_before_budget)
{
	struct budget *b = new_budget(GIB, 512 * MIB);

	ck_assert_int_eq(budget_charge(b, 1000, 512 * MIB), 0);
	ck_assert_int_eq(budget_charge(b, 1001, 512 * MIB), 0);
	/* Both over quota and over budget: the uid's own limit is the one to report. */
	ck_assert_int_eq(budget_check(b, 1000, MIB), REFUSAL_UID_QUOTA);
	ck_assert_int_eq(budget_check(b, 1002, MIB), REFUSAL_BUDGET);
	budget_free(b);
}
END_TEST

START_TEST(test_zero_quota_means_only_the_budget_limits_a_uid)
{
	struct budget *b = new_budget(GIB, 0);

	ck_assert_int_eq(budget_check(b, 1000, GIB), REFUSAL_NONE);
	ck_assert_int_eq(budget_charge(b, 1000, 1000 * MIB), 0);
	ck_assert_int_eq(budget_check(b, 1000, 24 * MIB + 1), REFUSAL_BUDGET);
	budget_free(b);
}
END_TEST

START_TEST(test_lowered_limits_keep_charges_and_refuse_new_ones)
{
	struct budget *b = new_budget(4 * GIB, 2 * GIB);

	ck_assert_int_eq(budget_charge(b, 1000, 2 * GIB), 0);
	ck_assert_int_eq(budget_charge(b, 1001, GIB), 0);
	budget_set_limits(b, 2 * GIB, GIB);
	ck_assert_uint_eq(budget_leased(b), 3 * GIB);
	ck_assert_uint_eq(budget_uid_leased(b, 1000), 2 * GIB);
	ck_assert_uint_eq(budget_pool_allowance(b), 0);
	ck_assert_int_eq(budget_check(b, 1000, MIB), REFUSAL_UID_QUOTA);
	ck_assert_int_eq(budget_check(b, 1002, MIB), REFUSAL_BUDGET);
	budget_uncharge(b, 1000, 2 * GIB);
	budget_uncharge(b, 1001, GIB);
	ck_assert_uint_eq(budget_pool_allowance(b), 2 * GIB);
	budget_free(b);
}
END_TEST

START_TEST(test_uncharge_returns_exactly_what_was_charged)
{
	struct budget *b = new_budget(4 * GIB, 2 * GIB);

	ck_assert_int_eq(budget_charge(b, 1000, 3 * MIB), 0);
	ck_assert_int_eq(budget_charge(b, 1000, 5 * MIB), 0);
	budget_uncharge(b, 1000, 3 * MIB);
	ck_assert_uint_eq(budget_uid_leased(b, 1000), 5 * MIB);
	ck_assert_uint_eq(budget_leased(b), 5 * MIB);
	budget_uncharge(b, 1000, 5 * MIB);
	ck_assert_uint_eq(budget_uid_leased(b, 1000), 0);
	ck_assert_uint_eq(budget_leased(b), 0);
	budget_free(b);
}
END_TEST

START_TEST(test_uncharge_more_than_charged_aborts)
{
	struct budget *b = new_budget(4 * GIB, 2 * GIB);

	ck_assert_int_eq(budget_charge(b, 1000, MIB), 0);
	budget_uncharge(b, 1000, MIB + 1);
}
END_TEST

START_TEST(test_uncharge_of_unknown_uid_aborts)
{
	struct budget *b = new_budget(4 * GIB, 2 * GIB);

	ck_assert_int_eq(budget_charge(b, 1000, MIB), 0);
	budget_uncharge(b, 1001, MIB);
}
END_TEST

#define NUIDS 37
#define NSTEPS 20000

START_TEST(test_random_charge_uncharge_stays_exact)
{
	struct budget *b = new_budget(64 * GIB, 8 * GIB);
	uint64_t model[NUIDS] = { 0 }, total = 0;
	unsigned seed = 12345;

	for (int step = 0; step < NSTEPS; step++) {
		/* Spread uids out, including 0 and very large ones, so sorted insertion is exercised. */
		unsigned k = (unsigned)rand_r(&seed) % NUIDS;
		uid_t uid = k == 0 ? 0 : k == 1 ? (uid_t)-2 : (uid_t)(k * 7919u);
		uint64_t bytes = ((uint64_t)(rand_r(&seed) % 4096) + 1) * 4096;
		enum broker_refusal r;

		if (rand_r(&seed) % 3 != 0) {
			r = budget_check(b, uid, bytes);
			if (r == REFUSAL_NONE) {
				ck_assert_int_eq(budget_charge(b, uid, bytes), 0);
				model[k] += bytes;
				total += bytes;
			} else {
				ck_assert(r == REFUSAL_UID_QUOTA || r == REFUSAL_BUDGET);
				ck_assert(model[k] + bytes > 8 * GIB || total + bytes > 64 * GIB);
			}
		} else if (model[k] > 0) {
			uint64_t back = model[k] <= bytes ? model[k] : bytes;

			budget_uncharge(b, uid, back);
			model[k] -= back;
			total -= back;
		}
		ck_assert_uint_eq(budget_leased(b), total);
		ck_assert_uint_eq(budget_uid_leased(b, uid), model[k]);
		ck_assert_uint_eq(budget_pool_allowance(b), 64 * GIB - total);
	}
	for (unsigned k = 0; k < NUIDS; k++) {
		uid_t uid = k == 0 ? 0 : k == 1 ? (uid_t)-2 : (uid_t)(k * 7919u);

		ck_assert_uint_eq(budget_uid_leased(b, uid), model[k]);
		budget_uncharge(b, uid, model[k]);
	}
	ck_assert_uint_eq(budget_leased(b), 0);
	budget_free(b);
}
END_TEST

/* The lease and chunk counts of uid, and of the host. */
static void assert_uid_counts(const struct budget *b, uid_t uid, uint64_t leases, uint64_t chunks)
{
	ck_assert_uint_eq(budget_uid_leases(b, uid), leases);
	ck_assert_uint_eq(budget_uid_chunks(b, uid), chunks);
}

static void assert_host_counts(const struct budget *b, uint64_t leases, uint64_t chunks)
{
	ck_assert_uint_eq(budget_leases(b), leases);
	ck_assert_uint_eq(budget_chunks(b), chunks);
}

START_TEST(test_counts_follow_leases_and_chunks_per_uid)
{
	struct budget *b = new_budget(4 * GIB, 0);

	ck_assert_int_eq(budget_count_add(b, 1000, 3), 0);
	ck_assert_int_eq(budget_count_add(b, 1000, 1), 0);
	ck_assert_int_eq(budget_count_add(b, 1001, 2), 0);
	assert_uid_counts(b, 1000, 2, 4);
	ck_assert_uint_eq(budget_uid_leases(b, 1001), 1);
	assert_host_counts(b, 3, 6);
	/* Counts keep a uid's entry even with no bytes charged, and bytes without counts too. */
	ck_assert_int_eq(budget_charge(b, 1000, MIB), 0);
	budget_uncharge(b, 1000, MIB);
	ck_assert_uint_eq(budget_uid_leases(b, 1000), 2);
	budget_count_sub(b, 1000, 3);
	budget_count_sub(b, 1000, 1);
	budget_count_sub(b, 1001, 2);
	ck_assert_uint_eq(budget_uid_leases(b, 1000), 0);
	ck_assert_uint_eq(budget_uid_chunks(b, 1001), 0);
	assert_host_counts(b, 0, 0);
	budget_free(b);
}
END_TEST

START_TEST(test_count_sub_of_uncounted_lease_aborts)
{
	struct budget *b = new_budget(4 * GIB, 0);

	ck_assert_int_eq(budget_count_add(b, 1000, 1), 0);
	budget_count_sub(b, 1000, 2); /* more chunks than counted */
}
END_TEST

/* Issue 22, finding 3: the pidfd of an exit hold is an fd the daemon keeps for its uid, like a chunk. */
START_TEST(test_held_fds_count_with_chunks_per_uid)
{
	struct budget *b;

	ck_assert_int_eq(budget_new(64 * MIB, 0, &b), 0);
	ck_assert_int_eq(budget_count_add(b, 1000, 3), 0);
	ck_assert_int_eq(budget_fd_add(b, 1000), 0);
	ck_assert_int_eq(budget_fd_add(b, 1001), 0);
	ck_assert_uint_eq(budget_uid_fds(b, 1000), 4);
	ck_assert_uint_eq(budget_uid_chunks(b, 1000), 3);
	ck_assert_uint_eq(budget_uid_fds(b, 1001), 1);
	ck_assert_uint_eq(budget_fds(b), 5);
	/* A uid holding only a pidfd is still on the books, and leaves them with it. */
	budget_fd_sub(b, 1001);
	ck_assert_uint_eq(budget_uid_fds(b, 1001), 0);
	ck_assert_uint_eq(budget_fds(b), 4);
	budget_count_sub(b, 1000, 3);
	budget_fd_sub(b, 1000);
	ck_assert_uint_eq(budget_fds(b), 0);
	budget_free(b);
}
END_TEST

START_TEST(test_fd_sub_of_uncounted_fd_aborts)
{
	struct budget *b;

	ck_assert_int_eq(budget_new(64 * MIB, 0, &b), 0);
	budget_fd_sub(b, 1000);
}
END_TEST

static Suite *budget_suite(void)
{
	Suite *s = suite_create("budget");
	TCase *tc;

	tc = CHECK_CASE(s, "core", NULL, NULL, 30, test_fresh_budget_is_empty, test_check_zero_bytes_is_invalid,
			test_check_over_whole_budget_is_never_satisfiable,
			test_check_over_uid_quota_alone_is_never_satisfiable, test_reserve_over_uid_quota_fails,
			test_reserve_over_budget_with_current_leases_fails, test_quota_is_checked_before_budget,
			test_zero_quota_means_only_the_budget_limits_a_uid,
			test_lowered_limits_keep_charges_and_refuse_new_ones,
			test_uncharge_returns_exactly_what_was_charged, test_random_charge_uncharge_stays_exact,
			test_counts_follow_leases_and_chunks_per_uid, test_held_fds_count_with_chunks_per_uid);
	tcase_add_test_raise_signal(tc, test_uncharge_more_than_charged_aborts, SIGABRT);
	tcase_add_test_raise_signal(tc, test_uncharge_of_unknown_uid_aborts, SIGABRT);
	tcase_add_test_raise_signal(tc, test_count_sub_of_uncounted_lease_aborts, SIGABRT);
	tcase_add_test_raise_signal(tc, test_fd_sub_of_uncounted_fd_aborts, SIGABRT);
	return s;
}

CHECK_MAIN(budget_suite)

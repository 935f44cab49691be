/* SPDX-License-Identifier: MIT */
/* Unit tests for backing: registrations of one shared file charged by the union of their page ranges, once. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backing.h"
#include "check_main.h"

#define MIB (1024ull * 1024)
#define PAGE 4096ull
#define DEV 0x2dull /* a tmpfs's st_dev */
#define INO 4242ull

/* The charges moved between registrants, as the daemon would apply them to their leases. */
struct ledger {
	uint64_t charged[64]; /* by key */
	uint64_t moves;
};

static void on_move(void *ctx, uint64_t from_key, uint64_t to_key, uint64_t bytes)
{
	struct ledger *lg = ctx;

	ck_assert_uint_ge(lg->charged[from_key], bytes);
	lg->charged[from_key] -= bytes;
	lg->charged[to_key] += bytes;
	lg->moves++;
}

static struct backing_table *table(void)
{
	struct backing_table *t;

	ck_assert_int_eq(backing_table_new(&t), 0);
	return t;
}

static uint64_t add(struct backing_table *t, struct ledger *lg, uint64_t key, uint64_t start, uint64_t end)
{
	uint64_t added;

	ck_assert_int_eq(backing_add(t, DEV, INO, key, start, end, &added, on_move, lg), 0);
	lg->charged[key] += added;
	return added;
}

static uint64_t drop(struct backing_table *t, struct ledger *lg, uint64_t key)
{
	uint64_t gone;

	ck_assert_int_eq(backing_remove(t, DEV, INO, key, &gone, on_move, lg), 0);
	/* What it still carried after the moves is exactly what nobody covers any more. */
	ck_assert_uint_eq(lg->charged[key], gone);
	lg->charged[key] = 0;
	return gone;
}

START_TEST(test_four_ranks_of_one_region_are_charged_once)
{
	struct backing_table *t = table();
	struct ledger lg = { 0 };

	ck_assert_uint_eq(add(t, &lg, 1, 0, 64 * MIB), 64 * MIB);
	for (uint64_t k = 2; k <= 4; k++)
		ck_assert_uint_eq(add(t, &lg, k, 0, 64 * MIB), 0);
	ck_assert_uint_eq(backing_registrants(t, DEV, INO), 4);
	ck_assert_uint_eq(backing_covered(t, DEV, INO), 64 * MIB);
	ck_assert_uint_eq(backing_charged(t, DEV, INO, 1), 64 * MIB);
	ck_assert_uint_eq(backing_charged(t, DEV, INO, 3), 0);
	/* The first leaves: its charge moves to the oldest left (key 2); nothing is uncharged. */
	ck_assert_uint_eq(drop(t, &lg, 1), 0);
	ck_assert_uint_eq(lg.charged[2], 64 * MIB);
	ck_assert_uint_eq(drop(t, &lg, 4), 0);
	ck_assert_uint_eq(drop(t, &lg, 2), 0);
	ck_assert_uint_eq(lg.charged[3], 64 * MIB);
	ck_assert_uint_eq(drop(t, &lg, 3), 64 * MIB);
	ck_assert_uint_eq(backing_objects(t), 0);
	backing_table_free(t);
}
END_TEST

START_TEST(test_overlapping_ranges_charge_only_new_pages)
{
	struct backing_table *t = table();
	struct ledger lg = { 0 };

	ck_assert_uint_eq(add(t, &lg, 1, 0, 10 * PAGE), 10 * PAGE);
	ck_assert_uint_eq(backing_uncovered(t, DEV, INO, 5 * PAGE, 15 * PAGE), 5 * PAGE);
	ck_assert_uint_eq(add(t, &lg, 2, 5 * PAGE, 15 * PAGE), 5 * PAGE);
	ck_assert_uint_eq(backing_covered(t, DEV, INO), 15 * PAGE);
	/* The first leaves: pages 5..10 go to 2, pages 0..5 stop being charged. */
	ck_assert_uint_eq(drop(t, &lg, 1), 5 * PAGE);
	ck_assert_uint_eq(lg.charged[2], 10 * PAGE);
	ck_assert_uint_eq(backing_charged(t, DEV, INO, 2), 10 * PAGE);
	ck_assert_uint_eq(drop(t, &lg, 2), 10 * PAGE);
	backing_table_free(t);
}
END_TEST

START_TEST(test_nested_range_adds_nothing_and_outer_leaving_moves_it)
{
	struct backing_table *t = table();
	struct ledger lg = { 0 };

	ck_assert_uint_eq(add(t, &lg, 1, 0, 100 * PAGE), 100 * PAGE);
	ck_assert_uint_eq(add(t, &lg, 2, 20 * PAGE, 30 * PAGE), 0);
	ck_assert_uint_eq(drop(t, &lg, 1), 90 * PAGE);
	ck_assert_uint_eq(lg.charged[2], 10 * PAGE);
	ck_assert_uint_eq(drop(t, &lg, 2), 10 * PAGE);
	backing_table_free(t);
}
END_TEST

START_TEST(test_adjacent_ranges_do_not_share_a_page)
{
	struct backing_table *t = table();
	struct ledger lg = { 0 };

	ck_assert_uint_eq(add(t, &lg, 1, 0, 4 * PAGE), 4 * PAGE);
	ck_assert_uint_eq(add(t, &lg, 2, 4 * PAGE, 8 * PAGE), 4 * PAGE);
	ck_assert_uint_eq(backing_covered(t, DEV, INO), 8 * PAGE);
	ck_assert_uint_eq(drop(t, &lg, 2), 4 * PAGE);
	ck_assert_uint_eq(lg.moves, 0);
	ck_assert_uint_eq(drop(t, &lg, 1), 4 * PAGE);
	backing_table_free(t);
}
END_TEST

START_TEST(test_identical_ranges_in_every_release_order)
{
	/* All 24 orders of 4 registrants of one range: the charge ends with the last, never before. */
	static const int perms[24][4] = {
		{ 0, 1, 2, 3 }, { 0, 1, 3, 2 }, { 0, 2, 1, 3 }, { 0, 2, 3, 1 }, { 0, 3, 1, 2 }, { 0, 3, 2, 1 },
		{ 1, 0, 2, 3 }, { 1, 0, 3, 2 }, { 1, 2, 0, 3 }, { 1, 2, 3, 0 }, { 1, 3, 0, 2 }, { 1, 3, 2, 0 },
		{ 2, 0, 1, 3 }, { 2, 0, 3, 1 }, { 2, 1, 0, 3 }, { 2, 1, 3, 0 }, { 2, 3, 0, 1 }, { 2, 3, 1, 0 },
		{ 3, 0, 1, 2 }, { 3, 0, 2, 1 }, { 3, 1, 0, 2 }, { 3, 1, 2, 0 }, { 3, 2, 0, 1 }, { 3, 2, 1, 0 },
	};

	for (int p = 0; p < 24; p++) {
		struct backing_table *t = table();
		struct ledger lg = { 0 };
		uint64_t total = 0;

		for (uint64_t k = 1; k <= 4; k++)
			total += add(t, &lg, k, 8 * PAGE, 24 * PAGE);
		ck_assert_uint_eq(total, 16 * PAGE);
		for (int i = 0; i < 4; i++) {
			uint64_t gone = drop(t, &lg, (uint64_t)perms[p][i] + 1);

			ck_assert_uint_eq(gone, i == 3 ? 16 * PAGE : 0);
		}
		backing_table_free(t);
	}
}
END_TEST

START_TEST(test_errors_leave_the_table_unchanged)
{
	struct backing_table *t = table();
	struct ledger lg = { 0 };
	uint64_t n;

	ck_assert_int_eq(backing_add(t, DEV, INO, 1, 5, 5, &n, NULL, NULL), -EINVAL);
	ck_assert_int_eq(backing_remove(t, DEV, INO, 1, &n, NULL, NULL), -ENOENT);
	add(t, &lg, 1, 0, PAGE);
	ck_assert_int_eq(backing_add(t, DEV, INO, 1, 0, 2 * PAGE, &n, NULL, NULL), -EEXIST);
	ck_assert_uint_eq(backing_covered(t, DEV, INO), PAGE);
	/* Another inode, or the same inode on another device, is another object. */
	ck_assert_uint_eq(backing_uncovered(t, DEV, INO + 1, 0, PAGE), PAGE);
	ck_assert_uint_eq(backing_uncovered(t, DEV + 1, INO, 0, PAGE), PAGE);
	ck_assert_int_eq(backing_remove(t, DEV, INO, 2, &n, NULL, NULL), -ENOENT);
	ck_assert_uint_eq(backing_registrants(t, DEV, INO), 1);
	backing_table_free(t); /* with a registrant left: freed all the same */
}
END_TEST

START_TEST(test_an_older_key_added_later_takes_the_charge_over)
{
	struct backing_table *t = table();
	struct ledger lg = { 0 };

	ck_assert_uint_eq(add(t, &lg, 5, 0, 8 * PAGE), 8 * PAGE);
	ck_assert_uint_eq(add(t, &lg, 3, 4 * PAGE, 12 * PAGE), 4 * PAGE);
	ck_assert_uint_eq(lg.charged[3], 8 * PAGE);
	ck_assert_uint_eq(lg.charged[5], 4 * PAGE);
	ck_assert_uint_eq(backing_charged(t, DEV, INO, 3), 8 * PAGE);
	ck_assert_uint_eq(drop(t, &lg, 3), 4 * PAGE);
	ck_assert_uint_eq(drop(t, &lg, 5), 8 * PAGE);
	backing_table_free(t);
}
END_TEST

/*
 * The model: a bitmap of pages per registrant. Covered = the OR of the live ones. A page is charged to the
 * smallest live key covering it. Random adds and removes over three files, each step checked against it.
 */
#define FUZZ_PAGES 96
#define FUZZ_KEYS 40
#define FUZZ_FILES 3

START_TEST(test_random_registrations_match_a_bitmap_model)
{
	struct backing_table *t = table();
	struct ledger lg[FUZZ_FILES];
	bool live[FUZZ_KEYS] = { 0 }, map[FUZZ_KEYS][FUZZ_PAGES];
	int file[FUZZ_KEYS];
	uint64_t total_charged = 0;

	memset(lg, 0, sizeof(lg));
	memset(map, 0, sizeof(map));
	srandom(26);
	for (int step = 0; step < 6000; step++) {
		uint64_t k = 1 + (uint64_t)(random() % (FUZZ_KEYS - 1)), n;

		if (!live[k]) {
			uint64_t s = (uint64_t)(random() % FUZZ_PAGES),
				 e = s + 1 + (uint64_t)(random() % (FUZZ_PAGES - s));
			uint64_t expect = 0;

			file[k] = (int)(random() % FUZZ_FILES);
			for (uint64_t p = s; p < e; p++) {
				bool cov = false;

				for (int j = 0; j < FUZZ_KEYS; j++)
					cov |= live[j] && file[j] == file[k] && map[j][p];
				expect += cov ? 0 : PAGE;
			}
			ck_assert_uint_eq(backing_uncovered(t, DEV, (uint64_t)file[k], s * PAGE, e * PAGE), expect);
			ck_assert_int_eq(backing_add(t, DEV, (uint64_t)file[k], k, s * PAGE, e * PAGE, &n, on_move,
						     &lg[file[k]]),
					 0);
			ck_assert_uint_eq(n, expect);
			lg[file[k]].charged[k] += n;
			total_charged += n;
			live[k] = true;
			for (uint64_t p = 0; p < FUZZ_PAGES; p++)
				map[k][p] = p >= s && p < e;
		} else {
			uint64_t expect = 0;

			for (int p = 0; p < FUZZ_PAGES; p++) {
				bool other = false;

				for (int j = 0; j < FUZZ_KEYS; j++)
					other |= live[j] && (uint64_t)j != k && file[j] == file[k] && map[j][p];
				expect += map[k][p] && !other ? PAGE : 0;
			}
			ck_assert_int_eq(backing_remove(t, DEV, (uint64_t)file[k], k, &n, on_move, &lg[file[k]]), 0);
			ck_assert_uint_eq(n, expect);
			ck_assert_uint_eq(lg[file[k]].charged[k], n);
			lg[file[k]].charged[k] = 0;
			total_charged -= n;
			live[k] = false;
		}
		/* Per file: covered pages, registrants, and each key's charge against the model. */
		for (int f = 0; f < FUZZ_FILES; f++) {
			uint64_t covered = 0, sum = 0;
			size_t nreg = 0;

			for (int p = 0; p < FUZZ_PAGES; p++) {
				int owner = -1;

				for (int j = 0; j < FUZZ_KEYS && owner < 0; j++)
					if (live[j] && file[j] == f && map[j][p])
						owner = j;
				covered += owner >= 0 ? PAGE : 0;
			}
			for (int j = 0; j < FUZZ_KEYS; j++) {
				uint64_t mine = 0;

				if (!live[j] || file[j] != f)
					continue;
				nreg++;
				for (int p = 0; p < FUZZ_PAGES; p++) {
					int owner = -1;

					for (int i = 0; i < FUZZ_KEYS && owner < 0; i++)
						if (live[i] && file[i] == f && map[i][p])
							owner = i;
					mine += owner == j ? PAGE : 0;
				}
				ck_assert_uint_eq(backing_charged(t, DEV, (uint64_t)f, (uint64_t)j), mine);
				ck_assert_uint_eq(lg[f].charged[j], mine);
				sum += mine;
			}
			ck_assert_uint_eq(backing_covered(t, DEV, (uint64_t)f), covered);
			ck_assert_uint_eq(sum, covered);
			ck_assert_uint_eq(backing_registrants(t, DEV, (uint64_t)f), nreg);
		}
	}
	(void)total_charged;
	backing_table_free(t);
}
END_TEST

START_TEST(test_many_registrants_keep_their_order)
{
	struct backing_table *t = table();
	struct ledger lg = { 0 };
	uint64_t key;

	for (uint64_t k = 1; k < 64; k++)
		add(t, &lg, k, (k % 8) * PAGE, (k % 8 + 8) * PAGE);
	ck_assert_uint_eq(backing_covered(t, DEV, INO), 15 * PAGE);
	ck_assert(backing_registrant_at(t, DEV, INO, 0, &key) && key == 1);
	ck_assert(backing_registrant_at(t, DEV, INO, 62, &key) && key == 63);
	ck_assert(!backing_registrant_at(t, DEV, INO, 63, &key));
	/* While the 8 oldest live, every page stays charged: each offset has one of them. */
	for (uint64_t k = 63; k >= 9; k--)
		ck_assert_uint_eq(drop(t, &lg, k), 0);
	ck_assert(backing_registrant_at(t, DEV, INO, 0, &key) && key == 1);
	ck_assert_uint_eq(drop(t, &lg, 8), PAGE); /* page 0 was its own */
	/* Key 4 (pages 4..12) lies inside what 3 and 5 cover together: nothing of it goes. */
	ck_assert_uint_eq(drop(t, &lg, 4), 0);
	ck_assert_uint_eq(drop(t, &lg, 1) + drop(t, &lg, 7) + drop(t, &lg, 2) + drop(t, &lg, 6) + drop(t, &lg, 3) +
				  drop(t, &lg, 5),
			  14 * PAGE);
	ck_assert_uint_eq(backing_objects(t), 0);
	backing_table_free(t);
}
END_TEST

CHECK_SUITE(backing_suite, "backing", "core", NULL, NULL, 60, test_four_ranks_of_one_region_are_charged_once,
	    test_overlapping_ranges_charge_only_new_pages, test_nested_range_adds_nothing_and_outer_leaving_moves_it,
	    test_adjacent_ranges_do_not_share_a_page, test_identical_ranges_in_every_release_order,
	    test_errors_leave_the_table_unchanged, test_an_older_key_added_later_takes_the_charge_over,
	    test_random_registrations_match_a_bitmap_model, test_many_registrants_keep_their_order)

CHECK_MAIN(backing_suite)

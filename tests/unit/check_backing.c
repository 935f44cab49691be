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

/*
 * One step of a scenario on one file and what it must give: ADD key [start, end) (the bytes newly charged), DROP
 * key (the bytes no longer covered), or a figure: COVERED, UNCOVERED [start, end), CHARGED (the table's charge of
 * key), LEDGER (the charge moved to key so far), REGISTRANTS, OBJECTS, MOVES. The steps end at the first END.
 */
enum op { END, ADD, DROP, COVERED, UNCOVERED, CHARGED, LEDGER, REGISTRANTS, OBJECTS, MOVES };

struct step {
	enum op op;
	uint64_t key, start, end, want;
};

static const struct scenario {
	const char *name;
	struct step steps[16];
} scenarios[] = {
	/* The first leaves: its charge moves to the oldest left (key 2); nothing is uncharged. */
	{ "four ranks of one region are charged once",
	  { { ADD, 1, 0, 64 * MIB, 64 * MIB },
	    { ADD, 2, 0, 64 * MIB, 0 },
	    { ADD, 3, 0, 64 * MIB, 0 },
	    { ADD, 4, 0, 64 * MIB, 0 },
	    { REGISTRANTS, 0, 0, 0, 4 },
	    { COVERED, 0, 0, 0, 64 * MIB },
	    { CHARGED, 1, 0, 0, 64 * MIB },
	    { CHARGED, 3, 0, 0, 0 },
	    { DROP, 1, 0, 0, 0 },
	    { LEDGER, 2, 0, 0, 64 * MIB },
	    { DROP, 4, 0, 0, 0 },
	    { DROP, 2, 0, 0, 0 },
	    { LEDGER, 3, 0, 0, 64 * MIB },
	    { DROP, 3, 0, 0, 64 * MIB },
	    { OBJECTS, 0, 0, 0, 0 } } },
	/* The first leaves: pages 5..10 go to 2, pages 0..5 stop being charged. */
	{ "overlapping ranges charge only new pages",
	  { { ADD, 1, 0, 10 * PAGE, 10 * PAGE },
	    { UNCOVERED, 0, 5 * PAGE, 15 * PAGE, 5 * PAGE },
	    { ADD, 2, 5 * PAGE, 15 * PAGE, 5 * PAGE },
	    { COVERED, 0, 0, 0, 15 * PAGE },
	    { DROP, 1, 0, 0, 5 * PAGE },
	    { LEDGER, 2, 0, 0, 10 * PAGE },
	    { CHARGED, 2, 0, 0, 10 * PAGE },
	    { DROP, 2, 0, 0, 10 * PAGE } } },
	{ "a nested range adds nothing, and the outer one leaving moves it",
	  { { ADD, 1, 0, 100 * PAGE, 100 * PAGE },
	    { ADD, 2, 20 * PAGE, 30 * PAGE, 0 },
	    { DROP, 1, 0, 0, 90 * PAGE },
	    { LEDGER, 2, 0, 0, 10 * PAGE },
	    { DROP, 2, 0, 0, 10 * PAGE } } },
	{ "adjacent ranges do not share a page",
	  { { ADD, 1, 0, 4 * PAGE, 4 * PAGE },
	    { ADD, 2, 4 * PAGE, 8 * PAGE, 4 * PAGE },
	    { COVERED, 0, 0, 0, 8 * PAGE },
	    { DROP, 2, 0, 0, 4 * PAGE },
	    { MOVES, 0, 0, 0, 0 },
	    { DROP, 1, 0, 0, 4 * PAGE } } },
	{ "an older key added later takes the charge over",
	  { { ADD, 5, 0, 8 * PAGE, 8 * PAGE },
	    { ADD, 3, 4 * PAGE, 12 * PAGE, 4 * PAGE },
	    { LEDGER, 3, 0, 0, 8 * PAGE },
	    { LEDGER, 5, 0, 0, 4 * PAGE },
	    { CHARGED, 3, 0, 0, 8 * PAGE },
	    { DROP, 3, 0, 0, 4 * PAGE },
	    { DROP, 5, 0, 0, 8 * PAGE } } },
};

/* What the step's op reads or does on t (its ledger lg). */
static uint64_t step_result(struct backing_table *t, struct ledger *lg, const struct step *st)
{
	switch (st->op) {
	case ADD:
		return add(t, lg, st->key, st->start, st->end);
	case DROP:
		return drop(t, lg, st->key);
	case COVERED:
		return backing_covered(t, DEV, INO);
	case UNCOVERED:
		return backing_uncovered(t, DEV, INO, st->start, st->end);
	case CHARGED:
		return backing_charged(t, DEV, INO, st->key);
	case LEDGER:
		return lg->charged[st->key];
	case REGISTRANTS:
		return backing_registrants(t, DEV, INO);
	case OBJECTS:
		return backing_objects(t);
	case MOVES:
		return lg->moves;
	case END:
		break;
	}
	ck_abort_msg("no such step %d", (int)st->op);
	return 0;
}

/* Row _i: each step of the scenario in order on a fresh table, every one giving what it must. */
START_TEST(test_scenarios)
{
	const struct scenario *sc = &scenarios[_i];
	struct backing_table *t = table();
	struct ledger lg = { 0 };

	for (size_t i = 0; i < sizeof(sc->steps) / sizeof(sc->steps[0]) && sc->steps[i].op != END; i++) {
		const struct step *st = &sc->steps[i];
		uint64_t got = step_result(t, &lg, st);

		ck_assert_msg(got == st->want, "%s, step %zu (op %d, key %llu): %llu, wanted %llu", sc->name, i,
			      (int)st->op, (unsigned long long)st->key, (unsigned long long)got,
			      (unsigned long long)st->want);
	}
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

static Suite *backing_suite(void)
{
	Suite *s = suite_create("backing");
	TCase *tc = CHECK_CASE(s, "core", NULL, NULL, 60, test_identical_ranges_in_every_release_order,
			       test_errors_leave_the_table_unchanged, test_random_registrations_match_a_bitmap_model,
			       test_many_registrants_keep_their_order);

	tcase_add_loop_test(tc, test_scenarios, 0, (int)(sizeof(scenarios) / sizeof(scenarios[0])));
	return s;
}

CHECK_MAIN(backing_suite)

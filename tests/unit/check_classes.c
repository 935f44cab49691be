/* SPDX-License-Identifier: MIT */
/* Unit tests for classes: a lease's chunks, the warm pool's carving, and the plan for the fd and map limits. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>

#include "check_main.h"
#include "classes.h"

#define KIB (1024ull)
#define MIB (1024ull * KIB)
#define GIB (1024ull * MIB)
#define TIB (1024ull * GIB)

/* The default host: vm.max_map_count 65,530 and LimitNOFILE 65,536, less the daemon's own. */
#define DEFAULT_HOST_CAPACITY 64000ull

static struct classes default_classes(void)
{
	struct classes c;

	ck_assert_int_eq(classes_init(&c, 2 * MIB, GIB), 0);
	return c;
}

START_TEST(test_default_classes_are_powers_of_two_from_2m_to_1g)
{
	struct classes c = default_classes();

	ck_assert_uint_eq(c.n, 10);
	ck_assert_uint_eq(c.bytes[0], 2 * MIB);
	ck_assert_uint_eq(c.bytes[9], GIB);
	ck_assert_uint_eq(classes_max(&c), GIB);
	ck_assert_int_eq(classes_index(&c, 64 * MIB), 5);
	ck_assert_int_eq(classes_index(&c, 3 * MIB), -1);
}
END_TEST

START_TEST(test_max_at_or_below_base_is_the_one_class)
{
	struct classes c;

	ck_assert_int_eq(classes_init(&c, 2 * MIB, 2 * MIB), 0);
	ck_assert_uint_eq(c.n, 1);
	ck_assert_int_eq(classes_init(&c, 2 * MIB, 0), 0);
	ck_assert_uint_eq(c.n, 1);
	ck_assert_int_eq(classes_init(&c, 0, GIB), -EINVAL);
	/* A max between two classes stops below it. */
	ck_assert_int_eq(classes_init(&c, 2 * MIB, 5 * MIB), 0);
	ck_assert_uint_eq(c.n, 2);
	ck_assert_uint_eq(classes_max(&c), 4 * MIB);
}
END_TEST

START_TEST(test_one_class_is_whole_chunks_plus_a_tail)
{
	struct classes c;
	uint64_t counts[CLASSES_MAX], tail;

	ck_assert_int_eq(classes_init(&c, 2 * MIB, 2 * MIB), 0);
	ck_assert_uint_eq(classes_split(&c, 7 * MIB, counts, &tail), 4);
	ck_assert_uint_eq(counts[0], 3);
	ck_assert_uint_eq(tail, MIB);
	/* The "before": 700 GiB of 2 MiB chunks. */
	ck_assert_uint_eq(classes_chunks_for(&c, 700 * GIB), 358400);
}
END_TEST

START_TEST(test_lease_sizes_take_the_fewest_chunks)
{
	struct classes c = default_classes();

	ck_assert_uint_eq(classes_chunks_for(&c, 4 * KIB), 1);
	ck_assert_uint_eq(classes_chunks_for(&c, 2 * MIB), 1);
	ck_assert_uint_eq(classes_chunks_for(&c, GIB), 1);
	ck_assert_uint_eq(classes_chunks_for(&c, 96 * GIB), 96);
	ck_assert_uint_eq(classes_chunks_for(&c, 700 * GIB), 700);
	/* 512M + 256M + ... + 2M: one of each smaller class. */
	ck_assert_uint_eq(classes_chunks_for(&c, GIB - 2 * MIB), 9);
	/* ... and a tail below the smallest class. */
	ck_assert_uint_eq(classes_chunks_for(&c, GIB - 4 * KIB), 10);
}
END_TEST

START_TEST(test_split_sums_to_the_exact_bytes)
{
	struct classes c = default_classes();

	srand(27);
	for (int i = 0; i < 10000; i++) {
		uint64_t bytes = ((uint64_t)rand() * 4096 + (uint64_t)rand()) % (3 * TIB) / 4096 * 4096 + 4096;
		uint64_t counts[CLASSES_MAX], tail, sum, n = 0;

		sum = 0;
		ck_assert_uint_ge(classes_split(&c, bytes, counts, &tail), 1);
		for (unsigned k = 0; k < CLASSES_MAX; k++) {
			sum += counts[k] * (k < c.n ? c.bytes[k] : 0);
			n += counts[k];
			/* Greedy: below the largest, at most one chunk of a class. */
			if (k + 1 < c.n)
				ck_assert_uint_le(counts[k], 1);
		}
		ck_assert_uint_lt(tail, c.bytes[0]);
		ck_assert_uint_eq(sum + tail, bytes);
		ck_assert_uint_eq(n + (tail ? 1 : 0), classes_chunks_for(&c, bytes));
		/* The logarithmic bound: whole largest chunks, one per smaller class, one tail. */
		ck_assert_uint_le(n + (tail ? 1 : 0), bytes / GIB + c.n);
	}
}
END_TEST

START_TEST(test_split_from_what_is_there_uses_smaller_chunks_for_missing_big_ones)
{
	struct classes c = default_classes();
	uint64_t avail[CLASSES_MAX] = { 0 }, counts[CLASSES_MAX], tail;

	/* 3 GiB + 4 KiB from one 1 GiB chunk and four of 512 MiB: 1 + 4 chunks and the tail. */
	avail[9] = 1;
	avail[8] = 4;
	ck_assert_uint_eq(classes_split_avail(&c, 3 * GIB + 4 * KIB, avail, counts, &tail), 6);
	ck_assert_uint_eq(counts[9], 1);
	ck_assert_uint_eq(counts[8], 4);
	ck_assert_uint_eq(tail, 4 * KIB);
	/* Plenty there: the same as the split of a fresh lease. */
	for (unsigned k = 0; k < CLASSES_MAX; k++)
		avail[k] = 1000;
	ck_assert_uint_eq(classes_split_avail(&c, 96 * GIB + 6 * MIB, avail, counts, &tail), 98);
	/* Not enough: 0, whatever the tail. */
	for (unsigned k = 0; k < CLASSES_MAX; k++)
		avail[k] = 0;
	avail[0] = 2;
	ck_assert_uint_eq(classes_split_avail(&c, 6 * MIB, avail, counts, &tail), 0);
	ck_assert_uint_eq(classes_split_avail(&c, 4 * MIB + 8 * KIB, avail, counts, &tail), 3);
}
END_TEST

START_TEST(test_warm_split_keeps_a_small_share_and_carves_the_rest_like_a_lease)
{
	struct classes c = default_classes();
	uint64_t t[CLASSES_MAX], sum = 0;

	/* The default prewarm: 1/8 in 2 MiB chunks, the rest 128M + 64M + 32M. */
	classes_warm_split(&c, 256 * MIB, t);
	ck_assert_uint_eq(t[0], 32 * MIB);
	ck_assert_uint_eq(t[4], 32 * MIB);
	ck_assert_uint_eq(t[5], 64 * MIB);
	ck_assert_uint_eq(t[6], 128 * MIB);
	for (unsigned k = 0; k < CLASSES_MAX; k++)
		sum += t[k];
	ck_assert_uint_eq(sum, 256 * MIB);
	ck_assert_uint_eq(classes_warm_chunks(&c, 256 * MIB), 16 + 3);

	/* A large pool: the small share is capped at 64 chunks, the rest is mostly 1 GiB chunks. */
	classes_warm_split(&c, 100 * GIB, t);
	ck_assert_uint_eq(t[0], 64 * 2 * MIB);
	ck_assert_uint_eq(t[9], 99 * GIB);
	ck_assert_uint_eq(classes_warm_chunks(&c, 100 * GIB), 64 + 99 + 3);
}
END_TEST

START_TEST(test_warm_split_rounds_up_to_the_smallest_class)
{
	struct classes c;
	uint64_t t[CLASSES_MAX];

	ck_assert_int_eq(classes_init(&c, 2 * MIB, 2 * MIB), 0);
	classes_warm_split(&c, 5 * MIB, t);
	ck_assert_uint_eq(t[0], 6 * MIB);
	ck_assert_uint_eq(t[1], 0);
}
END_TEST

START_TEST(test_warm_room_fits_the_chunks_given)
{
	struct classes c;
	uint64_t room;

	ck_assert_int_eq(classes_init(&c, 2 * MIB, 2 * MIB), 0);
	ck_assert_uint_eq(classes_warm_room(&c, 100, 64 * GIB), 200 * MIB);
	c = default_classes();
	ck_assert_uint_eq(classes_warm_room(&c, 1000, 64 * GIB), 64 * GIB);
	room = classes_warm_room(&c, 20, 64 * GIB);
	ck_assert_uint_le(classes_warm_chunks(&c, room), 20);
	ck_assert_uint_gt(room, 0);
}
END_TEST

START_TEST(test_plan_fits_a_terabyte_on_a_default_host_unchanged)
{
	struct classes_plan p;

	ck_assert_int_eq(classes_plan(2 * MIB, GIB, TIB, DEFAULT_HOST_CAPACITY, true, &p), 0);
	ck_assert(p.fits);
	ck_assert(!p.raised);
	ck_assert_uint_eq(p.max_bytes, GIB);
	ck_assert_uint_eq(p.n_classes, 10);
	ck_assert_uint_eq(p.worst_chunks, 1024);
}
END_TEST

START_TEST(test_plan_raises_the_largest_class_for_a_low_fd_limit)
{
	struct classes_plan p;

	/* 2,000 chunks: 1 TiB must be at most 500 of them, so 4 GiB chunks (256). */
	ck_assert_int_eq(classes_plan(2 * MIB, GIB, TIB, 2000, true, &p), 0);
	ck_assert(p.fits);
	ck_assert(p.raised);
	ck_assert_uint_eq(p.max_bytes, 4 * GIB);
	ck_assert_uint_eq(p.worst_chunks, 256);
}
END_TEST

START_TEST(test_plan_says_when_nothing_fits)
{
	struct classes_plan p;

	ck_assert_int_eq(classes_plan(2 * MIB, GIB, TIB, 10, true, &p), 0);
	ck_assert(!p.fits);
	ck_assert_uint_eq(p.max_bytes, 64 * GIB);
	ck_assert_uint_eq(p.worst_chunks, 16);
	/* Unbounded capacity: as configured. */
	ck_assert_int_eq(classes_plan(2 * MIB, GIB, TIB, 0, true, &p), 0);
	ck_assert(p.fits);
	ck_assert_uint_eq(p.max_bytes, GIB);
	ck_assert_int_eq(classes_plan(0, GIB, TIB, 0, true, &p), -EINVAL);
	/* An operator's largest class is kept: the plan only says it does not fit. */
	ck_assert_int_eq(classes_plan(2 * MIB, 2 * MIB, 4 * GIB, 250, false, &p), 0);
	ck_assert(!p.fits);
	ck_assert(!p.raised);
	ck_assert_uint_eq(p.max_bytes, 2 * MIB);
	ck_assert_uint_eq(p.worst_chunks, 2048);
}
END_TEST

static Suite *classes_suite(void)
{
	Suite *s = suite_create("classes");

	CHECK_CASE(s, "core", NULL, NULL, 30, test_default_classes_are_powers_of_two_from_2m_to_1g,
		   test_max_at_or_below_base_is_the_one_class, test_one_class_is_whole_chunks_plus_a_tail,
		   test_lease_sizes_take_the_fewest_chunks, test_split_sums_to_the_exact_bytes,
		   test_split_from_what_is_there_uses_smaller_chunks_for_missing_big_ones,
		   test_warm_split_keeps_a_small_share_and_carves_the_rest_like_a_lease,
		   test_warm_split_rounds_up_to_the_smallest_class, test_warm_room_fits_the_chunks_given,
		   test_plan_fits_a_terabyte_on_a_default_host_unchanged,
		   test_plan_raises_the_largest_class_for_a_low_fd_limit, test_plan_says_when_nothing_fits);
	return s;
}

CHECK_MAIN(classes_suite)

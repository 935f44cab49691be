/* SPDX-License-Identifier: MIT */
/* Unit tests for warmseg: a big chunk's fill segments and the warm-up thread count. */
#include <check.h>
#include <errno.h>

#include "check_main.h"
#include "warmseg.h"

#define KIB (1024ull)
#define MIB (1024ull * KIB)
#define GIB (1024ull * MIB)

START_TEST(test_size_defaults_and_rounds_up_to_2m)
{
	ck_assert_uint_eq(warmseg_size(0), 64 * MIB);
	ck_assert_uint_eq(warmseg_size(64 * MIB), 64 * MIB);
	ck_assert_uint_eq(warmseg_size(1), 2 * MIB);
	ck_assert_uint_eq(warmseg_size(3 * MIB), 4 * MIB);
	ck_assert_uint_eq(warmseg_size(UINT64_MAX) % (2 * MIB), 0);
}
END_TEST

START_TEST(test_a_1g_chunk_is_16_segments_of_64m)
{
	uint64_t off, len;

	ck_assert_uint_eq(warmseg_count(GIB, 0), 16);
	for (uint64_t i = 0; i < 16; i++) {
		ck_assert_int_eq(warmseg_get(GIB, 0, i, &off, &len), 0);
		ck_assert_uint_eq(off, i * 64 * MIB);
		ck_assert_uint_eq(len, 64 * MIB);
	}
	ck_assert_int_eq(warmseg_get(GIB, 0, 16, &off, &len), -EINVAL);
}
END_TEST

START_TEST(test_a_small_chunk_is_one_segment)
{
	uint64_t off, len;

	ck_assert_uint_eq(warmseg_count(2 * MIB, 0), 1);
	ck_assert_uint_eq(warmseg_count(64 * MIB, 0), 1);
	ck_assert_uint_eq(warmseg_count(4 * KIB, 0), 1);
	ck_assert_int_eq(warmseg_get(4 * KIB, 0, 0, &off, &len), 0);
	ck_assert_uint_eq(off, 0);
	ck_assert_uint_eq(len, 4 * KIB);
	ck_assert_uint_eq(warmseg_count(0, 0), 0);
	ck_assert_int_eq(warmseg_get(0, 0, 0, &off, &len), -EINVAL);
}
END_TEST

/* Every size, segment size: disjoint, in order, aligned starts, exact cover. */
START_TEST(test_segments_cover_the_chunk_exactly)
{
	static const uint64_t sizes[] = { 4 * KIB,   2 * MIB, 66 * MIB,         100 * MIB + 4 * KIB,
					  128 * MIB, GIB,     3 * GIB + 6 * MIB };
	static const uint64_t segs[] = { 0, 1, 2 * MIB, 5 * MIB, 64 * MIB, 256 * MIB };

	for (size_t a = 0; a < sizeof(sizes) / sizeof(sizes[0]); a++)
		for (size_t b = 0; b < sizeof(segs) / sizeof(segs[0]); b++) {
			uint64_t n = warmseg_count(sizes[a], segs[b]), next = 0, off, len;

			ck_assert_uint_ge(n, 1);
			for (uint64_t i = 0; i < n; i++) {
				ck_assert_int_eq(warmseg_get(sizes[a], segs[b], i, &off, &len), 0);
				ck_assert_uint_eq(off, next);
				ck_assert_uint_eq(off % (2 * MIB), 0);
				ck_assert_uint_gt(len, 0);
				ck_assert_uint_le(len, warmseg_size(segs[b]));
				if (i + 1 < n)
					ck_assert_uint_eq(len, warmseg_size(segs[b]));
				next = off + len;
			}
			ck_assert_uint_eq(next, sizes[a]);
		}
}
END_TEST

START_TEST(test_pick_spreads_a_chunk_over_the_threads_in_64m_or_more)
{
	/* 16 threads: a 1 GiB chunk is one 64 MiB segment each. */
	ck_assert_uint_eq(warmseg_pick(GIB, 16, 1), 64 * MIB);
	ck_assert_uint_eq(warmseg_count(GIB, warmseg_pick(GIB, 16, 1)), 16);
	/* 2 threads: two halves, not sixteen calls. */
	ck_assert_uint_eq(warmseg_pick(GIB, 2, 1), 512 * MIB);
	ck_assert_uint_eq(warmseg_count(GIB, warmseg_pick(GIB, 2, 1)), 2);
	/* 64 threads: never below 64 MiB. */
	ck_assert_uint_eq(warmseg_pick(GIB, 64, 1), 64 * MIB);
	/* One thread: the chunk whole. */
	ck_assert_uint_eq(warmseg_pick(GIB, 1, 1), GIB);
	ck_assert_uint_eq(warmseg_pick(GIB, 0, 1), GIB);
	/* An odd share is rounded up to 2 MiB: 3 threads over 1 GiB make three segments, the last shorter. */
	ck_assert_uint_eq(warmseg_pick(GIB, 3, 1), 342 * MIB);
	ck_assert_uint_eq(warmseg_count(GIB, warmseg_pick(GIB, 3, 1)), 3);
	/* Small chunks stay whole. */
	ck_assert_uint_eq(warmseg_count(2 * MIB, warmseg_pick(2 * MIB, 16, 1)), 1);
}
END_TEST

START_TEST(test_pick_shares_the_threads_among_a_batchs_chunks_first)
{
	/* As many chunks as threads, or more: each chunk whole, one collapse call and one file a thread. */
	ck_assert_uint_eq(warmseg_pick(GIB, 16, 16), GIB);
	ck_assert_uint_eq(warmseg_pick(GIB, 16, 100), GIB);
	/* 16 threads on 4 chunks: four segments a chunk. */
	ck_assert_uint_eq(warmseg_pick(GIB, 16, 4), 256 * MIB);
	ck_assert_uint_eq(warmseg_count(GIB, warmseg_pick(GIB, 16, 4)), 4);
	/* 16 threads on 3 chunks: six a chunk (rounded up), the segments 2 MiB aligned. */
	ck_assert_uint_eq(warmseg_count(GIB, warmseg_pick(GIB, 16, 3)), 6);
	ck_assert_uint_eq(warmseg_pick(GIB, 16, 3) % (2 * MIB), 0);
	/* No chunks said: as one. */
	ck_assert_uint_eq(warmseg_pick(GIB, 16, 0), warmseg_pick(GIB, 16, 1));
}
END_TEST

START_TEST(test_threads_follow_the_cores_and_the_setting)
{
	ck_assert_uint_eq(warmseg_threads(0, 16), 16);
	ck_assert_uint_eq(warmseg_threads(0, 2), 2);
	ck_assert_uint_eq(warmseg_threads(0, 0), 1);
	ck_assert_uint_eq(warmseg_threads(0, -1), 1);
	ck_assert_uint_eq(warmseg_threads(0, 192), WARMSEG_THREADS_DEFAULT_MAX);
	ck_assert_uint_eq(warmseg_threads(4, 192), 4);
	ck_assert_uint_eq(warmseg_threads(48, 2), 48);
	ck_assert_uint_eq(warmseg_threads(1000, 2), WARMSEG_THREADS_MAX);
}
END_TEST

static Suite *warmseg_suite(void)
{
	Suite *s = suite_create("warmseg");

	CHECK_CASE(s, "core", NULL, NULL, 30, test_size_defaults_and_rounds_up_to_2m,
		   test_a_1g_chunk_is_16_segments_of_64m, test_a_small_chunk_is_one_segment,
		   test_segments_cover_the_chunk_exactly, test_pick_spreads_a_chunk_over_the_threads_in_64m_or_more,
		   test_pick_shares_the_threads_among_a_batchs_chunks_first,
		   test_threads_follow_the_cores_and_the_setting);
	return s;
}

CHECK_MAIN(warmseg_suite)

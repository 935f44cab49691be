/* SPDX-License-Identifier: MIT */
/*
 * Unit: how libpinbroker cuts a registration into pieces below the driver's per-call cap (client/lib/cuda.c's
 * pbcuda_plan_stride and the piece size from PINBROKER_CUDA_REGISTER_PIECE). No driver is loaded: the plan is
 * arithmetic on the range, its page size and its chunks.
 */
#define _GNU_SOURCE
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "cuda.h"
#include "check_main.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)

/* Every multiple of stride inside the range falls on a boundary between two chunks. */
static int cuts_on_chunk_boundaries(uint64_t stride, const uint64_t *chunks, size_t n)
{
	uint64_t start = 0, total = 0;

	for (size_t i = 0; i < n; i++)
		total += chunks[i];
	for (uint64_t cut = stride; cut < total; cut += stride) {
		int found = 0;

		start = 0;
		for (size_t i = 0; i < n && start <= cut; i++) {
			found |= start == cut;
			start += chunks[i];
		}
		if (!found)
			return 0;
	}
	return 1;
}

START_TEST(test_a_range_at_or_below_the_piece_size_is_one_call)
{
	ck_assert_uint_eq(pbcuda_plan_stride(256 * GiB, 256 * GiB, 4 * KiB, NULL, 0), 0);
	ck_assert_uint_eq(pbcuda_plan_stride(4 * KiB, 256 * GiB, 4 * KiB, NULL, 0), 0);
	ck_assert_uint_eq(pbcuda_plan_stride(4 * MiB, 4 * MiB, 2 * MiB, NULL, 0), 0);
}
END_TEST

/* The default piece is half the r580 driver's 512 GiB cap, so a 600 GiB lease of 2 MiB chunks needs 3 calls. */
START_TEST(test_a_lease_of_uniform_chunks_is_cut_at_chunk_boundaries_below_the_cap)
{
	size_t n = (size_t)(600 * GiB / (2 * MiB)) + 1;
	uint64_t *chunks = malloc(n * sizeof(*chunks)), stride;

	ck_assert_ptr_nonnull(chunks);
	for (size_t i = 0; i + 1 < n; i++)
		chunks[i] = 2 * MiB;
	chunks[n - 1] = 12 * KiB; /* the tail */
	stride = pbcuda_plan_stride(600 * GiB + 12 * KiB, PBCUDA_REGISTER_PIECE_MAX, 4 * KiB, chunks, n);
	ck_assert_uint_eq(stride, 256 * GiB);
	ck_assert_uint_lt(stride, 512 * GiB);
	ck_assert(cuts_on_chunk_boundaries(stride, chunks, n));
	free(chunks);
}
END_TEST

/* Chunks of 3 MiB and pieces of at most 10 MiB: 9 MiB, so no chunk mapping is split between two calls. */
START_TEST(test_the_stride_is_the_largest_multiple_of_the_chunk_that_fits)
{
	uint64_t chunks[10];

	for (size_t i = 0; i < 10; i++)
		chunks[i] = 3 * MiB;
	ck_assert_uint_eq(pbcuda_plan_stride(30 * MiB, 10 * MiB, 4 * KiB, chunks, 10), 9 * MiB);
}
END_TEST

/* Size classes, biggest first (issue 27's layout): multiples of the biggest are boundaries. */
START_TEST(test_power_of_two_size_classes_biggest_first_are_cut_at_boundaries)
{
	uint64_t chunks[] = { 1 * GiB,   1 * GiB,   1 * GiB,  1 * GiB, 1 * GiB, 512 * MiB, 256 * MiB,
			      256 * MiB, 128 * MiB, 64 * MiB, 2 * MiB, 2 * MiB, 8 * KiB };
	size_t n = sizeof(chunks) / sizeof(chunks[0]);
	uint64_t total = 0, stride;

	for (size_t i = 0; i < n; i++)
		total += chunks[i];
	stride = pbcuda_plan_stride(total, 2 * GiB + 512 * MiB, 4 * KiB, chunks, n);
	ck_assert_uint_eq(stride, 2 * GiB);
	ck_assert(cuts_on_chunk_boundaries(stride, chunks, n));
	/* A piece of 1.25 GiB: still 1 GiB, the one multiple of the biggest chunk that fits. */
	ck_assert_uint_eq(pbcuda_plan_stride(total, GiB + 256 * MiB, 4 * KiB, chunks, n), 1 * GiB);
}
END_TEST

/* A layout whose cuts would split a chunk falls back to the page-aligned piece: the driver takes that too. */
START_TEST(test_a_layout_without_regular_boundaries_is_cut_at_page_alignment)
{
	uint64_t chunks[] = { 2 * MiB, 3 * MiB, 2 * MiB, 3 * MiB, 2 * MiB, 3 * MiB };

	/* 6 MiB (two 3 MiB chunks) would fall inside the third chunk: 7 MiB instead, the piece size itself. */
	ck_assert_uint_eq(pbcuda_plan_stride(15 * MiB, 7 * MiB, 4 * KiB, chunks, 6), 7 * MiB);
	ck_assert(!cuts_on_chunk_boundaries(6 * MiB, chunks, 6));
}
END_TEST

/* Chunks bigger than a piece, or no chunks (a registration): the piece size, aligned to the page size. */
START_TEST(test_without_a_boundary_inside_a_piece_the_cut_is_page_aligned)
{
	uint64_t chunks[] = { 16 * MiB, 16 * MiB };

	ck_assert_uint_eq(pbcuda_plan_stride(32 * MiB, 4 * MiB, 4 * KiB, chunks, 2), 4 * MiB);
	ck_assert_uint_eq(pbcuda_plan_stride(32 * MiB, 4 * MiB + 100, 4 * KiB, NULL, 0), 4 * MiB);
	/* hugetlb: 2 MiB pages, so a 5 MiB piece is 4 MiB, and a piece below a page is one page. */
	ck_assert_uint_eq(pbcuda_plan_stride(32 * MiB, 5 * MiB, 2 * MiB, NULL, 0), 4 * MiB);
	ck_assert_uint_eq(pbcuda_plan_stride(32 * MiB, 1 * MiB, 2 * MiB, NULL, 0), 2 * MiB);
}
END_TEST

/* Each test runs in its own process (fork mode), so the piece size is read afresh. */
START_TEST(test_the_piece_size_defaults_to_256_gib)
{
	unsetenv("PINBROKER_CUDA_REGISTER_PIECE");
	ck_assert_uint_eq(pbcuda_piece_max(), 256 * GiB);
}
END_TEST

START_TEST(test_the_piece_size_comes_from_the_environment)
{
	setenv("PINBROKER_CUDA_REGISTER_PIECE", "4M", 1);
	ck_assert_uint_eq(pbcuda_piece_max(), 4 * MiB);
}
END_TEST

START_TEST(test_a_piece_size_below_a_page_is_one_page)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	setenv("PINBROKER_CUDA_REGISTER_PIECE", "100", 1);
	ck_assert_uint_eq(pbcuda_piece_max(), page);
}
END_TEST

START_TEST(test_a_piece_size_is_rounded_down_to_the_page)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	setenv("PINBROKER_CUDA_REGISTER_PIECE", "1048577", 1);
	ck_assert_uint_eq(pbcuda_piece_max(), MiB - MiB % page);
}
END_TEST

START_TEST(test_a_piece_size_that_is_not_a_size_is_ignored)
{
	setenv("PINBROKER_CUDA_REGISTER_PIECE", "lots", 1);
	ck_assert_uint_eq(pbcuda_piece_max(), PBCUDA_REGISTER_PIECE_MAX);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("cuda");

	CHECK_CASE(s, "plan", NULL, NULL, 30, test_a_range_at_or_below_the_piece_size_is_one_call,
		   test_a_lease_of_uniform_chunks_is_cut_at_chunk_boundaries_below_the_cap,
		   test_the_stride_is_the_largest_multiple_of_the_chunk_that_fits,
		   test_power_of_two_size_classes_biggest_first_are_cut_at_boundaries,
		   test_a_layout_without_regular_boundaries_is_cut_at_page_alignment,
		   test_without_a_boundary_inside_a_piece_the_cut_is_page_aligned);
	CHECK_CASE(s, "piece-size", NULL, NULL, 10, test_the_piece_size_defaults_to_256_gib,
		   test_the_piece_size_comes_from_the_environment, test_a_piece_size_below_a_page_is_one_page,
		   test_a_piece_size_is_rounded_down_to_the_page, test_a_piece_size_that_is_not_a_size_is_ignored);
	return s;
}

CHECK_MAIN(suite)

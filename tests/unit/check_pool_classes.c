/* SPDX-License-Identifier: MIT */
/* Unit tests for the pool's chunk classes: a lease's chunks, refilling an empty class, warm carving, shrink, simulation. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_main.h"
#include "pool.h"

#define KIB 1024ull
#define MIB (1024ull * KIB)
#define GIB (1024ull * MIB)
#define UID_A 1000

/* Classes 64K, 128K, 256K, 512K, 1M of 4 KiB pages: small enough to fault for real. */
static struct pool *new_pool(uint64_t base_bytes, uint64_t max_bytes, bool simulate)
{
	struct pool_opts o = {
		.chunk_bytes = base_bytes,
		.chunk_max_bytes = max_bytes,
		.hugetlb = POOL_HUGETLB_NO,
		.thp = POOL_THP_NO,
		.threads = 1,
		.lock = geteuid() == 0,
		.simulate = simulate,
	};
	struct pool *p = NULL;

	ck_assert_int_eq(pool_new(&o, &p), 0);
	return p;
}

static uint64_t sum_bytes(struct chunk **v, size_t n)
{
	uint64_t s = 0;

	for (size_t i = 0; i < n; i++)
		s += v[i]->bytes;
	return s;
}

static ino_t inode_of(const struct chunk *c)
{
	struct stat st;

	ck_assert_int_eq(fstat(c->fd, &st), 0);
	return st.st_ino;
}

START_TEST(test_lease_is_the_fewest_chunks_largest_first_tail_last)
{
	struct pool *p = new_pool(64 * KIB, MIB, false);
	uint64_t bytes = 2 * MIB + 256 * KIB + 64 * KIB + 12 * KIB;
	struct chunk **v;
	size_t n;

	ck_assert_uint_eq(pool_chunk_max(p), MIB);
	ck_assert_uint_eq(pool_chunks_for(p, bytes), 5);
	ck_assert_int_eq(pool_take(p, UID_A, bytes, &v, &n), 0);
	ck_assert_uint_eq(n, 5);
	ck_assert_uint_eq(v[0]->bytes, MIB);
	ck_assert_uint_eq(v[1]->bytes, MIB);
	ck_assert_uint_eq(v[2]->bytes, 256 * KIB);
	ck_assert_uint_eq(v[3]->bytes, 64 * KIB);
	ck_assert_uint_eq(v[4]->bytes, 12 * KIB);
	ck_assert(v[4]->tail);
	for (size_t i = 0; i < 4; i++)
		ck_assert(!v[i]->tail);
	ck_assert_uint_eq(sum_bytes(v, n), bytes);
	ck_assert_uint_eq(pool_resident_bytes(p), bytes);
	pool_put(p, v, n);
	free(v);
	/* The tail goes; the class chunks stay idle. */
	ck_assert_uint_eq(pool_idle_bytes(p), bytes - 12 * KIB);
	ck_assert_uint_eq(pool_chunk_count(p), 4);
	pool_free(p);
}
END_TEST

START_TEST(test_empty_class_is_refilled_by_making_chunks_then_reused)
{
	struct pool *p = new_pool(64 * KIB, MIB, false);
	struct chunk **v, **w;
	ino_t first;
	size_t n, m;

	/* Nothing idle: every class the lease needs is made. */
	ck_assert_int_eq(pool_take(p, UID_A, 3 * MIB, &v, &n), 0);
	ck_assert_uint_eq(n, 3);
	first = inode_of(v[0]);
	pool_put(p, v, n);
	free(v);
	ck_assert_uint_eq(pool_idle_class_bytes(p, 4), 3 * MIB);
	/* A smaller lease of that class takes an idle chunk, not a fresh one. */
	ck_assert_int_eq(pool_take(p, UID_A, MIB, &w, &m), 0);
	ck_assert_uint_eq(m, 1);
	ck_assert_uint_eq(pool_chunk_count(p), 3);
	ck_assert(inode_of(w[0]) == first || pool_idle_class_bytes(p, 4) == 2 * MIB);
	/* A class with nothing idle (128K) next to one with plenty (1M) is made, not refused. */
	pool_put(p, w, m);
	free(w);
	ck_assert_int_eq(pool_take(p, UID_A, 128 * KIB, &w, &m), 0);
	ck_assert_uint_eq(m, 1);
	ck_assert_uint_eq(w[0]->bytes, 128 * KIB);
	ck_assert_uint_eq(pool_idle_bytes(p), 3 * MIB);
	pool_put(p, w, m);
	free(w);
	pool_free(p);
}
END_TEST

START_TEST(test_grow_carves_a_small_share_and_the_rest_like_a_lease)
{
	struct pool *p = new_pool(64 * KIB, MIB, false);

	/* 4M: an eighth (512K) in 64K chunks; the rest, 3.5M, as 3 x 1M + 512K. */
	ck_assert_int_eq(pool_grow(p, 4 * MIB, NULL, NULL), 0);
	ck_assert_uint_eq(pool_idle_bytes(p), 4 * MIB);
	ck_assert_uint_eq(pool_idle_class_bytes(p, 0), 512 * KIB);
	ck_assert_uint_eq(pool_idle_class_bytes(p, 1), 0);
	ck_assert_uint_eq(pool_idle_class_bytes(p, 3), 512 * KIB);
	ck_assert_uint_eq(pool_idle_class_bytes(p, 4), 3 * MIB);
	ck_assert_uint_eq(pool_chunk_count(p), 8 + 1 + 3);
	/* Growing to what is there already makes nothing. */
	ck_assert_int_eq(pool_grow(p, 4 * MIB, NULL, NULL), 0);
	ck_assert_uint_eq(pool_chunk_count(p), 12);
	pool_free(p);
}
END_TEST

/* Under pressure a lease comes from idle chunks alone: smaller classes stand in, no new memory but the tail. */
START_TEST(test_warm_take_uses_smaller_idle_chunks_and_pins_nothing_new)
{
	struct pool *p = new_pool(64 * KIB, MIB, false);
	uint64_t bytes = 3 * MIB + 512 * KIB + 256 * KIB + 4 * KIB;
	struct chunk **v;
	size_t n;

	ck_assert_int_eq(pool_grow(p, 4 * MIB, NULL, NULL), 0);
	/* 3 x 1M and the 512K are idle; the 256K class is empty: four 64K chunks stand in. */
	ck_assert_int_eq(pool_take_warm_on(p, UID_A, bytes, -1, &v, &n), 0);
	ck_assert_uint_eq(n, 3 + 1 + 4 + 1);
	ck_assert_uint_eq(sum_bytes(v, n), bytes);
	ck_assert_uint_eq(v[n - 1]->bytes, 4 * KIB);
	ck_assert(v[n - 1]->tail);
	ck_assert_uint_eq(pool_resident_bytes(p), 4 * MIB + 4 * KIB);
	pool_put(p, v, n);
	free(v);
	/* More than the idle chunks hold: refused, nothing taken or made. */
	ck_assert_int_eq(pool_take_warm_on(p, UID_A, 5 * MIB, -1, &v, &n), -EBUSY);
	ck_assert_uint_eq(pool_resident_bytes(p), 4 * MIB);
	ck_assert_uint_eq(pool_idle_bytes(p), 4 * MIB);
	pool_free(p);
}
END_TEST

START_TEST(test_shrink_takes_chunks_that_fit_the_excess_first)
{
	struct pool *p = new_pool(64 * KIB, MIB, false);
	uint64_t left;

	ck_assert_int_eq(pool_grow(p, 4 * MIB, NULL, NULL), 0);
	/* 128K too many: two 64K chunks go, not a 1M one. */
	ck_assert_uint_eq(pool_shrink(p, 4 * MIB - 128 * KIB), 128 * KIB);
	ck_assert_uint_eq(pool_idle_bytes(p), 4 * MIB - 128 * KIB);
	ck_assert_uint_eq(pool_idle_class_bytes(p, 4), 3 * MIB);
	/* 700K too many: the 512K chunk, then 64K chunks, then one more to get below. */
	ck_assert_uint_ge(pool_shrink(p, 4 * MIB - 128 * KIB - 700 * KIB), 700 * KIB);
	ck_assert_uint_le(pool_idle_bytes(p), 4 * MIB - 128 * KIB - 700 * KIB);
	ck_assert_uint_eq(pool_idle_class_bytes(p, 4), 3 * MIB);
	left = pool_idle_bytes(p);
	ck_assert_uint_eq(pool_shrink(p, 0), left);
	ck_assert_uint_eq(pool_idle_bytes(p), 0);
	pool_free(p);
}
END_TEST

START_TEST(test_one_class_is_whole_chunks_and_a_tail)
{
	struct pool *p = new_pool(64 * KIB, 0, false);
	struct chunk **v;
	size_t n;

	ck_assert_uint_eq(pool_chunk_max(p), 64 * KIB);
	ck_assert_int_eq(pool_take(p, UID_A, 200 * KIB, &v, &n), 0);
	ck_assert_uint_eq(n, 4);
	for (size_t i = 0; i < 3; i++)
		ck_assert_uint_eq(v[i]->bytes, 64 * KIB);
	ck_assert_uint_eq(v[3]->bytes, 8 * KIB);
	pool_put(p, v, n);
	free(v);
	pool_free(p);
}
END_TEST

START_TEST(test_raise_chunk_max_adds_classes_and_never_removes)
{
	struct pool *p = new_pool(64 * KIB, 256 * KIB, false);

	ck_assert_int_eq(pool_grow(p, MIB, NULL, NULL), 0);
	ck_assert_int_eq(pool_raise_chunk_max(p, MIB), 0);
	ck_assert_uint_eq(pool_chunk_max(p), MIB);
	ck_assert(pool_is_class(p, 256 * KIB));
	ck_assert(pool_is_class(p, MIB));
	ck_assert_int_eq(pool_raise_chunk_max(p, 512 * KIB), -EINVAL);
	ck_assert_uint_eq(pool_shrink(p, 0), MIB);
	pool_free(p);
}
END_TEST

/* The target, in the pool: a terabyte of chunks that cost address space and fds, no memory. */
START_TEST(test_simulated_pool_leaves_chunks_unpopulated)
{
	struct pool *p = new_pool(2 * MIB, GIB, true);
	struct chunk **v;
	size_t n;

	ck_assert(pool_simulated(p));
	ck_assert_int_eq(pool_grow(p, 64 * GIB, NULL, NULL), 0);
	ck_assert_uint_eq(pool_idle_bytes(p), 64 * GIB);
	ck_assert_int_eq(pool_take(p, UID_A, 48 * GIB + 6 * MIB + 4 * KIB, &v, &n), 0);
	ck_assert_uint_eq(n, 48 + 2 + 1);
	ck_assert_uint_eq(sum_bytes(v, n), 48 * GIB + 6 * MIB + 4 * KIB);
	for (size_t i = 0; i < n; i++) {
		struct stat st;

		ck_assert_int_eq(fstat(v[i]->fd, &st), 0);
		ck_assert_uint_eq((uint64_t)st.st_size, v[i]->bytes);
		ck_assert_int_eq(st.st_blocks, 0);
	}
	/* Nothing is missing that was ever there: the audit finds no punch. */
	ck_assert_uint_eq(pool_audit(p, UINT64_MAX), 0);
	pool_put(p, v, n);
	free(v);
	ck_assert_uint_eq(pool_punched_count(p), 0);
	pool_free(p);
}
END_TEST

static Suite *pool_classes_suite(void)
{
	Suite *s = suite_create("pool_classes");

	CHECK_CASE(s, "classes", NULL, NULL, 60, test_lease_is_the_fewest_chunks_largest_first_tail_last,
		   test_empty_class_is_refilled_by_making_chunks_then_reused,
		   test_grow_carves_a_small_share_and_the_rest_like_a_lease,
		   test_warm_take_uses_smaller_idle_chunks_and_pins_nothing_new,
		   test_shrink_takes_chunks_that_fit_the_excess_first, test_one_class_is_whole_chunks_and_a_tail,
		   test_raise_chunk_max_adds_classes_and_never_removes, test_simulated_pool_leaves_chunks_unpopulated);
	return s;
}

CHECK_MAIN(pool_classes_suite)

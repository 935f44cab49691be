/* SPDX-License-Identifier: MIT */
/*
 * libpinbroker's lease cache (client/lib/lib-cache.c, lib-cache-index.c) on a client built in memory, no daemon:
 * a lease of any page size the daemon can send is cached and found again (the index had room for four page
 * sizes and silently left a fifth out, issue 27), and the page-size counts follow the leases in and out.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "check_main.h"
#include "lib-int.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define GiB (1024 * MiB)

#define TIMEOUT_S 10

/* A connected client as the cache sees one: a limit, no slack, a receiver that is ticking (no wake-up). */
static pb_client *client_new(size_t limit_bytes)
{
	pb_client *c = calloc(1, sizeof(*c));

	ck_assert_ptr_nonnull(c);
	pthread_mutex_init(&c->lock, NULL);
	c->cache_limit_bytes = limit_bytes;
	c->rx_ticking = true;
	c->wake_fd = -1;
	return c;
}

static void client_free(pb_client *c)
{
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* An active, mapped lease of size_bytes in pages of page_size_bytes, on the client's connection. */
static pb_lease *lease_new(pb_client *c, uint64_t id, size_t size_bytes, size_t page_size_bytes)
{
	pb_lease *l = calloc(1, sizeof(*l));

	ck_assert_ptr_nonnull(l);
	l->client = c;
	l->id = id;
	l->size_bytes = size_bytes;
	l->page_size_bytes = page_size_bytes;
	l->state = LEASE_ACTIVE;
	l->kind = PB_MEM_LOCKED;
	l->conn_gen = c->conn_gen;
	return l;
}

static bool keep(pb_client *c, pb_lease *l)
{
	pb_lease *evicted = NULL;
	bool kept, tell_now;

	pthread_mutex_lock(&c->lock);
	kept = cache_keep_locked(c, l, &evicted, &tell_now);
	ck_assert(!tell_now); /* this fixture's receiver never waits in its recv */
	pthread_mutex_unlock(&c->lock);
	ck_assert_ptr_null(evicted);
	return kept;
}

/*
 * Page sizes the pool has (4 KiB, 2 MiB and 1 GiB hugetlb) and others a kernel has (64 KiB, 16 MiB, 16 GiB on
 * other architectures): more than the four the index held.
 */
static const size_t page_sizes[] = { 4 * KiB, 64 * KiB, 2 * MiB, 16 * MiB, 1 * GiB, 16 * GiB };
#define N_PAGE_SIZES (sizeof(page_sizes) / sizeof(page_sizes[0]))

START_TEST(test_lease_of_every_page_size_is_cached_and_taken_back)
{
	pb_client *c = client_new(SIZE_MAX);
	pb_lease *l[N_PAGE_SIZES];
	struct pb_cache_stats st;

	/* Three pages each: a size no lease of another page size has, nor rounds to. */
	for (size_t i = 0; i < N_PAGE_SIZES; i++) {
		l[i] = lease_new(c, i + 1, 3 * page_sizes[i], page_sizes[i]);
		ck_assert_msg(keep(c, l[i]), "a lease of %zu-byte pages (page size %zu of %zu) was not cached",
			      page_sizes[i], i + 1, N_PAGE_SIZES);
		ck_assert_int_eq(l[i]->state, LEASE_CACHED);
	}
	ck_assert_int_eq(pb_cache_stats(c, &st), 0);
	ck_assert_uint_eq(st.cached_leases, N_PAGE_SIZES);
	ck_assert_uint_eq(st.kept, N_PAGE_SIZES);

	/* Each request finds the lease of its own page size, whatever order they were cached in. */
	for (size_t j = N_PAGE_SIZES; j-- > 0;) {
		pb_lease *got = cache_take(c, 3 * page_sizes[j], 0, PB_PRIORITY_NORMAL);

		ck_assert_msg(got == l[j], "3 pages of %zu bytes: took lease %lld, not %llu", page_sizes[j],
			      got ? (long long)got->id : -1LL, (unsigned long long)l[j]->id);
		ck_assert_int_eq(got->state, LEASE_ACTIVE);
	}
	ck_assert_int_eq(pb_cache_stats(c, &st), 0);
	ck_assert_uint_eq(st.cached_leases, 0);
	ck_assert_uint_eq(st.cached_bytes, 0);
	ck_assert_uint_eq(st.hits, N_PAGE_SIZES);
	/* Nothing left for any page size: a miss. */
	ck_assert_ptr_null(cache_take(c, 3 * page_sizes[0], 0, PB_PRIORITY_NORMAL));
	ck_assert_uint_eq(c->cache_page_mask, 0);

	for (size_t i = 0; i < N_PAGE_SIZES; i++)
		free(l[i]);
	client_free(c);
}
END_TEST

/* Two leases of one page size: taking one leaves the other findable (the page size stays counted). */
START_TEST(test_page_size_stays_searched_while_a_lease_of_it_is_cached)
{
	pb_client *c = client_new(SIZE_MAX);
	pb_lease *a = lease_new(c, 1, 4 * MiB, 2 * MiB), *b = lease_new(c, 2, 8 * MiB, 2 * MiB);
	pb_lease *s = lease_new(c, 3, 12 * KiB, 4 * KiB);

	ck_assert(keep(c, a));
	ck_assert(keep(c, b));
	ck_assert(keep(c, s));
	ck_assert_ptr_eq(cache_take(c, 4 * MiB, 0, PB_PRIORITY_NORMAL), a);
	ck_assert_ptr_eq(cache_take(c, 8 * MiB, 0, PB_PRIORITY_NORMAL), b);
	/* 2 MiB pages are no longer searched; 4 KiB pages still are. */
	ck_assert_ptr_null(cache_take(c, 8 * MiB, 0, PB_PRIORITY_NORMAL));
	ck_assert_ptr_eq(cache_take(c, 12 * KiB, 0, PB_PRIORITY_NORMAL), s);
	ck_assert_uint_eq(c->cached_leases, 0);
	free(a);
	free(b);
	free(s);
	client_free(c);
}
END_TEST

/* map_chunks lets no other page size through; were one to reach the cache, it is not cached, and nothing counts it. */
START_TEST(test_page_size_not_a_power_of_two_is_not_cached)
{
	pb_client *c = client_new(SIZE_MAX);
	pb_lease *l = lease_new(c, 1, 3 * 3 * KiB, 3 * KiB);

	ck_assert(!keep(c, l));
	ck_assert_int_eq(l->state, LEASE_ACTIVE);
	ck_assert_uint_eq(c->cached_leases, 0);
	ck_assert_uint_eq(c->cache_stats.kept, 0);
	ck_assert_uint_eq(c->cache_page_mask, 0);
	free(l);
	client_free(c);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("lib_cache");

	CHECK_CASE(s, "page_sizes", NULL, NULL, TIMEOUT_S, test_lease_of_every_page_size_is_cached_and_taken_back,
		   test_page_size_stays_searched_while_a_lease_of_it_is_cached,
		   test_page_size_not_a_power_of_two_is_not_cached);
	return s;
}

CHECK_MAIN(suite)

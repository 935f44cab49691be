/* SPDX-License-Identifier: MIT */
/*
 * Integration: leases are exact and the budget is exact, on the real daemon. DESIGN.md ("Sizing",
 * "Accounting"): a lease is the request rounded up to the page, never to a chunk or a power of two,
 * and the budget refuses the first page over it. The expected sizes are computed here from the
 * request and the 4 KiB page, never read from the daemon: the daemon's status, the lease row, the
 * memfds it hands out and the pool's lent memory must each equal them.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_main.h"
#include "itest.h"
#include "pinbroker.h"

#define KiB 1024ull
#define MiB (1024ull * KiB)
#define PAGE (4 * KiB)  /* the pool's page with hugetlb = no: the sizes below are rounded to it */
#define CHUNK (2 * MiB) /* chunk-size, as the fixtures set it */
/* The budget of the "budget" case: 4 whole chunks, so a page over it is not a chunk over it. */
#define BUDGET (8 * MiB)

static struct daemon d;

/* The request rounded up to the page, as DESIGN.md says a lease is. */
static uint64_t page_rounded(uint64_t n)
{
	return (n + PAGE - 1) / PAGE * PAGE;
}

/* Requests around every boundary: under, at and over a page, a chunk, and a chunk and a half. */
static const uint64_t sizes[] = {
	1,         PAGE - 1,    PAGE,          PAGE + 1,      2 * PAGE + 1,           CHUNK - 1,    CHUNK,
	CHUNK + 1, 3 * MiB + 5, 2 * CHUNK - 1, 2 * CHUNK + 7, 5 * MiB + 3 * PAGE + 1, 64 * KiB + 1,
};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

/* Small pages, no pool kept warm, and no idle shrink during a test: what is lent is what was asked. */
ITEST_FIXTURE_START(start_pool, d,
		    ITEST_ARGS("--budget", "64M", "--prewarm", "0", "--hugetlb", "no", "--thp", "no", "--chunk-size",
			       "2M", "--chunk-max", "2M", "--pool-shrink-delay-ms", "600000"))

ITEST_FIXTURE_START(start_budget, d,
		    ITEST_ARGS("--budget", "8M", "--prewarm", "0", "--hugetlb", "no", "--thp", "no", "--chunk-size",
			       "2M", "--chunk-max", "2M", "--pool-shrink-delay-ms", "600000"))

ITEST_FIXTURE_STOP(stop_daemon, d)

/* The daemon's books for what is lent now: leased bytes, and pool memory not idle (lent chunks). */
static void assert_lent(uint64_t want, const char *what)
{
	struct pb_status *s = itest_status(d.socket);

	ck_assert_msg(s->page_size_bytes == PAGE,
		      "the pool's page is %llu, not 4 KiB: the fixture's --hugetlb no failed",
		      (unsigned long long)s->page_size_bytes);
	ck_assert_msg(s->leased_bytes == want, "%s: leased_bytes %llu, want %llu", what,
		      (unsigned long long)s->leased_bytes, (unsigned long long)want);
	ck_assert_msg(s->pool_bytes - s->pool_idle_bytes == want,
		      "%s: lent pool memory %llu (pool %llu, idle %llu), want %llu", what,
		      (unsigned long long)(s->pool_bytes - s->pool_idle_bytes), (unsigned long long)s->pool_bytes,
		      (unsigned long long)s->pool_idle_bytes, (unsigned long long)want);
	pb_status_free(s);
}

START_TEST(test_each_lease_is_its_request_rounded_to_the_page)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA, .label = "exact" };
	pb_client *c;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	for (size_t i = 0; i < NSIZES; i++) {
		uint64_t want = page_rounded(sizes[i]);
		const struct pb_lease_info *row;
		struct pb_status *s;
		unsigned char *p;
		pb_lease *l;
		char what[64];

		snprintf(what, sizeof(what), "a request of %llu bytes", (unsigned long long)sizes[i]);
		ck_assert_int_eq(pb_acquire(c, sizes[i], &o, &l), 0);
		ck_assert_msg(pb_lease_size(l) == want, "%s: the library maps %zu bytes, want %llu", what,
			      pb_lease_size(l), (unsigned long long)want);
		/* The whole rounded size is the caller's: its last byte is writable. */
		p = pb_lease_data(l);
		p[want - 1] = 0x5a;
		assert_lent(want, what);
		s = itest_status(d.socket);
		row = itest_lease_row(s, pb_lease_id(l));
		ck_assert_ptr_nonnull(row);
		ck_assert_msg(row->bytes == want, "%s: the lease row says %llu, want %llu", what,
			      (unsigned long long)row->bytes, (unsigned long long)want);
		pb_status_free(s);
		ck_assert_int_eq(pb_release(c, l), 0);
		assert_lent(0, what);
	}
	pb_disconnect(c);
}
END_TEST

/* The memfds the daemon sends are the memory a client can map: their sizes add up to the rounded request. */
START_TEST(test_memfds_sent_add_up_to_the_rounded_request)
{
	int fd = raw_connect(d.socket);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(raw_hello(fd), 0);
	for (size_t i = 0; i < NSIZES; i++) {
		uint64_t want = page_rounded(sizes[i]), sum = 0, id;
		int fds[16];
		size_t n = 0;

		ck_assert_int_eq(raw_acquire(fd, sizes[i], &id, fds, 16, &n), 0);
		/* Whole chunks, then one tail for the rest: never a chunk more than the size needs. */
		ck_assert_uint_eq(n, (want + CHUNK - 1) / CHUNK);
		for (size_t k = 0; k < n; k++) {
			struct stat st;

			ck_assert_int_eq(fstat(fds[k], &st), 0);
			ck_assert_msg(k + 1 == n || (uint64_t)st.st_size == CHUNK,
				      "request %llu: chunk %zu is %lld bytes", (unsigned long long)sizes[i], k,
				      (long long)st.st_size);
			sum += (uint64_t)st.st_size;
			close(fds[k]);
		}
		ck_assert_msg(sum == want, "request %llu: the memfds hold %llu bytes, want %llu",
			      (unsigned long long)sizes[i], (unsigned long long)sum, (unsigned long long)want);
		ck_assert_int_eq(raw_release(fd, id), 0);
	}
	close(fd);
}
END_TEST

/* All held at once: the books are the sum of the rounded requests, not of chunks. */
START_TEST(test_leases_held_together_add_up_exactly)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA };
	pb_lease *l[NSIZES];
	uint64_t sum = 0;
	pb_client *c;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	for (size_t i = 0; i < NSIZES; i++) {
		ck_assert_int_eq(pb_acquire(c, sizes[i], &o, &l[i]), 0);
		sum += page_rounded(sizes[i]);
		assert_lent(sum, "leases held together");
	}
	for (size_t i = 0; i < NSIZES; i++)
		ck_assert_int_eq(pb_release(c, l[i]), 0);
	assert_lent(0, "all released");
	pb_disconnect(c);
}
END_TEST

START_TEST(test_budget_takes_a_lease_of_its_size_and_refuses_a_page_more)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA };
	pb_lease *l, *m, *x;
	pb_client *c;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_acquire(c, BUDGET + 1, &o, &l), -EFBIG);
	ck_assert_int_eq(pb_acquire(c, BUDGET + PAGE, &o, &l), -EFBIG);
	ck_assert_int_eq(pb_acquire(c, BUDGET, &o, &l), 0);
	assert_lent(BUDGET, "a lease of the whole budget");
	ck_assert_int_eq(pb_acquire(c, 1, &o, &x), -ENOSPC);
	ck_assert_int_eq(pb_release(c, l), 0);
	/* A page under it, then the last page fits, then nothing more. */
	ck_assert_int_eq(pb_acquire(c, BUDGET - PAGE, &o, &l), 0);
	ck_assert_int_eq(pb_acquire(c, 1, &o, &m), 0);
	assert_lent(BUDGET, "the budget less a page, and a page");
	ck_assert_int_eq(pb_acquire(c, 1, &o, &x), -ENOSPC);
	ck_assert_int_eq(pb_release(c, m), 0);
	ck_assert_int_eq(pb_release(c, l), 0);
	pb_disconnect(c);
}
END_TEST

/* After other leases, what is left is exact to the page: it fits, a page more is refused. */
START_TEST(test_budget_left_after_other_leases_is_exact_to_the_page)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA };
	const uint64_t held[] = { 3 * MiB + 5, 1, PAGE + 1 };
	pb_lease *h[3], *l;
	uint64_t used = 0, left;
	pb_client *c;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	for (size_t i = 0; i < 3; i++) {
		ck_assert_int_eq(pb_acquire(c, held[i], &o, &h[i]), 0);
		used += page_rounded(held[i]);
	}
	assert_lent(used, "three leases");
	left = BUDGET - used;
	/* One byte over what is left rounds to a page over: refused. */
	ck_assert_int_eq(pb_acquire(c, left + 1, &o, &l), -ENOSPC);
	ck_assert_int_eq(pb_acquire(c, left + PAGE, &o, &l), -ENOSPC);
	ck_assert_int_eq(pb_acquire(c, left, &o, &l), 0);
	assert_lent(BUDGET, "the rest of the budget");
	ck_assert_int_eq(pb_release(c, l), 0);
	/* One released lease's room, exactly: 8 KiB for the request of a page and a byte. */
	ck_assert_int_eq(pb_release(c, h[2]), 0);
	ck_assert_int_eq(pb_acquire(c, left + 2 * PAGE + 1, &o, &l), -ENOSPC);
	ck_assert_int_eq(pb_acquire(c, left + 2 * PAGE, &o, &l), 0);
	ck_assert_int_eq(pb_release(c, l), 0);
	for (size_t i = 0; i < 2; i++)
		ck_assert_int_eq(pb_release(c, h[i]), 0);
	assert_lent(0, "all released");
	pb_disconnect(c);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-exact");

	CHECK_CASE(s, "sizes", start_pool, stop_daemon, 60, test_each_lease_is_its_request_rounded_to_the_page,
		   test_memfds_sent_add_up_to_the_rounded_request, test_leases_held_together_add_up_exactly);

	CHECK_CASE(s, "budget", start_budget, stop_daemon, 60,
		   test_budget_takes_a_lease_of_its_size_and_refuses_a_page_more,
		   test_budget_left_after_other_leases_is_exact_to_the_page);
	return s;
}

CHECK_MAIN(suite)

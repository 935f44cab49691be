/* SPDX-License-Identifier: MIT */
/*
 * Integration: which chunks libpinbroker pre-faults when it maps a lease, on the real daemon. Chunks of 4 KiB
 * pages are mapped with their page tables filled (a first touch costs nothing); chunks the daemon reports
 * collapsed into 2 MiB THPs are not (a first touch maps 2 MiB in one fault), so a lease the caller never touches
 * whole costs no page-table work. The process's resident bytes of the pool's memfds show which it was.
 */
#define _GNU_SOURCE
#include <check.h>
#include <string.h>

#include "check_main.h"
#include "itest.h"
#include "pinbroker.h"
#include "sec.h"

#define KiB 1024ull
#define MiB (1024ull * KiB)
/* Two whole 2 MiB chunks and a 4 KiB tail chunk (made for the remainder, never collapsed). */
#define WHOLE (4 * MiB)
#define TAIL (4 * KiB)

static struct daemon d;

static void start_thp(void)
{
	daemon_start(&d, ITEST_ARGS("--budget", "64M", "--prewarm", "16M", "--hugetlb", "no", "--thp", "auto",
				    "--chunk-size", "2M", "--chunk-max", "2M", "--pool-shrink-delay-ms", "600000"));
}

static void start_4k(void)
{
	daemon_start(&d, ITEST_ARGS("--budget", "64M", "--prewarm", "16M", "--hugetlb", "no", "--thp", "no",
				    "--chunk-size", "2M", "--chunk-max", "2M", "--pool-shrink-delay-ms", "600000"));
}

static void stop_daemon(void)
{
	ck_assert_int_eq(daemon_stop(&d), 0);
}

/* The pool's page kind ("thp", "4k", "hugetlb"), as the daemon reports it; the caller frees it. */
static char *page_kind(void)
{
	struct pb_status *s = itest_status(d.socket);
	char *k = strdup(s->page_kind ? s->page_kind : "unknown");

	pb_status_free(s);
	return k;
}

/* Acquire WHOLE + TAIL; check this process's resident chunk bytes right after the map, then after writing it all. */
static void check_resident_after_map(uint64_t want_before)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE, .label = "prefault" };
	uint64_t before, after;
	unsigned char *p;
	pb_client *c;
	pb_lease *l;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(sec_chunk_rss(getpid()), 0);
	ck_assert_int_eq(pb_acquire(c, WHOLE + TAIL, &o, &l), 0);
	before = sec_chunk_rss(getpid());
	p = pb_lease_data(l);
	memset(p, 0xa5, WHOLE + TAIL);
	after = sec_chunk_rss(getpid());
	ck_assert_msg(p[0] == 0xa5 && p[WHOLE - 1] == 0xa5 && p[WHOLE] == 0xa5 && p[WHOLE + TAIL - 1] == 0xa5,
		      "the lease did not keep what was written");
	ck_assert_int_eq(pb_release(c, l), 0);
	pb_disconnect(c);
	ck_assert_msg(before == want_before, "resident right after the map: %llu bytes, want %llu",
		      (unsigned long long)before, (unsigned long long)want_before);
	ck_assert_msg(after == WHOLE + TAIL, "resident after writing the lease: %llu bytes, want %llu",
		      (unsigned long long)after, WHOLE + TAIL);
}

START_TEST(test_thp_chunks_are_mapped_unfaulted_and_the_tail_prefaulted)
{
	char *kind = page_kind();

	if (strcmp(kind, "thp") != 0) {
		printf("SKIP thp: this kernel did not collapse the pool into THPs (page kind %s)\n", kind);
		free(kind);
		return;
	}
	free(kind);
	check_resident_after_map(TAIL);
}
END_TEST

START_TEST(test_4k_chunks_are_prefaulted)
{
	char *kind = page_kind();

	ck_assert_str_eq(kind, "4k");
	free(kind);
	check_resident_after_map(WHOLE + TAIL);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("itest_prefault");

	CHECK_CASE(s, "thp", start_thp, stop_daemon, 60, test_thp_chunks_are_mapped_unfaulted_and_the_tail_prefaulted);
	CHECK_CASE(s, "4k", start_4k, stop_daemon, 60, test_4k_chunks_are_prefaulted);
	return s;
}

CHECK_MAIN(suite)

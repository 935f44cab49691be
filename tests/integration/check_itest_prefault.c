/* SPDX-License-Identifier: MIT */
/*
 * Integration: which chunks libpinbroker pre-faults when it maps a lease, on the real daemon. Chunks of 4 KiB
 * pages are mapped with their page tables filled (a first touch costs nothing); chunks the daemon reports
 * collapsed into 2 MiB THPs are not (a first touch maps 2 MiB in one fault), so a lease the caller never touches
 * whole costs no page-table work, unless the process turned THP off. The process's resident bytes of the pool's
 * memfds (smaps Rss) show which it was, and ShmemPmdMapped that a write mapped 2 MiB at once.
 */
#define _GNU_SOURCE
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "check_main.h"
#include "itest.h"
#include "pinbroker.h"

#define KiB 1024ull
#define MiB (1024ull * KiB)
/* Two whole 2 MiB chunks and a 4 KiB tail chunk (made for the remainder, never collapsed). */
#define WHOLE (4 * MiB)
#define TAIL (4 * KiB)

static struct daemon d;

ITEST_FIXTURE_START(start_thp, d,
		    ITEST_ARGS("--budget", "64M", "--prewarm", "16M", "--hugetlb", "no", "--thp", "auto",
			       "--chunk-size", "2M", "--chunk-max", "2M", "--pool-shrink-delay-ms", "600000"))
ITEST_FIXTURE_START(start_4k, d,
		    ITEST_ARGS("--budget", "64M", "--prewarm", "16M", "--hugetlb", "no", "--thp", "no", "--chunk-size",
			       "2M", "--chunk-max", "2M", "--pool-shrink-delay-ms", "600000"))
ITEST_FIXTURE_STOP(stop_daemon, d)

/* The pool's page kind ("thp", "4k", "hugetlb"), as the daemon reports it; the caller frees it. */
static char *page_kind(void)
{
	struct pb_status *s = itest_status(d.socket);
	char *k = strdup(s->page_kind ? s->page_kind : "unknown");

	pb_status_free(s);
	return k;
}

/* A field of /proc/self/smaps ("Rss", "ShmemPmdMapped") summed over this process's mappings of the pool's chunks. */
static uint64_t chunk_smaps(const char *field)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	unsigned long long kb, lo, hi;
	size_t n = strlen(field);
	uint64_t sum_kb = 0;
	bool chunk = false;
	char line[512];

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		/* A mapping's header line ("lo-hi perms offset dev inode name"), then its fields. */
		if (sscanf(line, "%llx-%llx ", &lo, &hi) == 2)
			chunk = strstr(line, "/memfd:pinbroker-chunk") != NULL;
		else if (chunk && strncmp(line, field, n) == 0 && line[n] == ':' &&
			 sscanf(line + n + 1, "%llu kB", &kb) == 1)
			sum_kb += kb;
	}
	fclose(f);
	return sum_kb * 1024;
}

/*
 * Acquire WHOLE + TAIL and check this process's resident chunk bytes right after the map (want_before), the bytes
 * mapped by PMDs after one write into each 2 MiB (want_pmd), and that writing it all leaves it all resident.
 */
static void check_mapping(uint64_t want_before, uint64_t want_pmd)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE, .label = "prefault" };
	uint64_t before, pmd, after;
	unsigned char *p;
	pb_client *c;
	pb_lease *l;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(chunk_smaps("Rss"), 0);
	ck_assert_int_eq(pb_acquire(c, WHOLE + TAIL, &o, &l), 0);
	before = chunk_smaps("Rss");
	p = pb_lease_data(l);
	for (uint64_t off = 0; off < WHOLE; off += 2 * MiB)
		p[off] = 0x5a;
	pmd = chunk_smaps("ShmemPmdMapped");
	memset(p, 0xa5, WHOLE + TAIL);
	after = chunk_smaps("Rss");
	ck_assert_msg(p[0] == 0xa5 && p[WHOLE - 1] == 0xa5 && p[WHOLE] == 0xa5 && p[WHOLE + TAIL - 1] == 0xa5,
		      "the lease did not keep what was written");
	ck_assert_int_eq(pb_release(c, l), 0);
	pb_disconnect(c);
	ck_assert_msg(before == want_before, "resident right after the map: %llu bytes, want %llu",
		      (unsigned long long)before, (unsigned long long)want_before);
	ck_assert_msg(pmd == want_pmd, "mapped by PMDs after one write a 2 MiB: %llu bytes, want %llu",
		      (unsigned long long)pmd, (unsigned long long)want_pmd);
	ck_assert_msg(after == WHOLE + TAIL, "resident after writing the lease: %llu bytes, want %llu",
		      (unsigned long long)after, WHOLE + TAIL);
}

/* The daemon's pool is THP-collapsed; false, saying so, where this kernel did not collapse it. */
static bool pool_is_thp(void)
{
	char *kind = page_kind();
	bool thp = strcmp(kind, "thp") == 0;

	if (!thp)
		printf("SKIP thp: this kernel did not collapse the pool into THPs (page kind %s)\n", kind);
	free(kind);
	return thp;
}

/* THP chunks unfaulted (a write maps each 2 MiB whole), the 4 KiB tail pre-faulted. */
START_TEST(test_thp_chunks_are_mapped_unfaulted_and_the_tail_prefaulted)
{
	if (pool_is_thp())
		check_mapping(TAIL, WHOLE);
}
END_TEST

/* A process with THP turned off would map THP chunks a 4 KiB page a fault: they are pre-faulted for it. */
START_TEST(test_thp_chunks_are_prefaulted_where_the_process_turned_thp_off)
{
	if (!pool_is_thp())
		return;
	ck_assert_int_eq(prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0), 0);
	check_mapping(WHOLE + TAIL, 0);
}
END_TEST

START_TEST(test_4k_chunks_are_prefaulted)
{
	char *kind = page_kind();

	ck_assert_str_eq(kind, "4k");
	free(kind);
	check_mapping(WHOLE + TAIL, 0);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("itest_prefault");

	CHECK_CASE(s, "thp", start_thp, stop_daemon, 60, test_thp_chunks_are_mapped_unfaulted_and_the_tail_prefaulted,
		   test_thp_chunks_are_prefaulted_where_the_process_turned_thp_off);
	CHECK_CASE(s, "4k", start_4k, stop_daemon, 60, test_4k_chunks_are_prefaulted);
	return s;
}

CHECK_MAIN(suite)

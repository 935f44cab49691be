/* SPDX-License-Identifier: MIT */
/* Unit tests for the pool's pages: punched chunks found, counted and repaired, the audit's slices, smaps, THP collapse. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/falloc.h>

#include "pool.h"
#include "check_main.h"
#include "poolfix.h"

/* ------------------------------------------------------------ hole punching */

struct punch_seen {
	size_t calls;
	uint64_t missing_bytes;
	uint64_t lease_id;
	uid_t uid;
};

static void on_punch(const struct chunk *c, uint64_t missing_bytes, void *ud)
{
	struct punch_seen *s = ud;

	s->calls++;
	s->missing_bytes += missing_bytes;
	s->lease_id = c->lease_id;
	s->uid = c->owner_uid;
}

static void punch(const struct chunk *c, uint64_t off, uint64_t len)
{
	ck_assert_int_eq(fallocate(c->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len), 0);
}

static uint64_t file_bytes(const struct chunk *c)
{
	struct stat st;

	ck_assert_int_eq(fstat(c->fd, &st), 0);
	return (uint64_t)st.st_blocks * 512u;
}

/* Pages of the pool's own mapping of c that are present (what its mlock covers). */
static uint64_t mapped_bytes(const struct chunk *c)
{
	uint64_t e, n = 0;
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	for (uint64_t off = 0; off < c->bytes; off += 4096) {
		ck_assert_int_eq(pread(fd, &e, sizeof(e), (off_t)(((uintptr_t)c->addr + off) / 4096 * 8)), 8);
		n += (e >> 63) ? 4096 : 0;
	}
	close(fd);
	return n;
}

START_TEST(test_seals_do_not_stop_a_punch)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct chunk **v = NULL;
	size_t n = 0;

	/* Why the pool detects instead of preventing: its seals leave fallocate(PUNCH_HOLE) open. */
	n = take_ok(p, UID_A, 2 * MIB, &v);
	punch(v[0], 0, 1 * MIB);
	ck_assert_uint_eq(file_bytes(v[0]), 1 * MIB);
	put_back(p, v, n);
	pool_free(p);
}
END_TEST

START_TEST(test_put_repairs_a_punched_chunk_and_counts_its_uid)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct punch_seen seen = { 0 };
	struct chunk **v = NULL, *c;
	size_t n = 0;

	pool_set_punch_hook(p, on_punch, &seen);
	n = take_ok(p, UID_A, 4 * MIB, &v);
	ck_assert_uint_eq(n, 2);
	v[0]->lease_id = v[1]->lease_id = 77;
	c = v[0];
	punch(c, 0, 2 * MIB);
	punch(v[1], 4096, 4096);
	put_back(p, v, n);
	ck_assert_uint_eq(seen.calls, 2);
	ck_assert_uint_eq(seen.missing_bytes, 2 * MIB + 4096);
	ck_assert_uint_eq(seen.lease_id, 77);
	ck_assert_uint_eq(seen.uid, UID_A);
	ck_assert_uint_eq(pool_punched_count(p), 2);
	ck_assert_uint_eq(pool_punched_count_uid(p, UID_A), 2);
	ck_assert_uint_eq(pool_punched_count_uid(p, UID_B), 0);
	/* Back in the pool whole: every page in the file and in the pool's (locked) mapping. */
	ck_assert_uint_eq(pool_idle_bytes(p), 4 * MIB);
	ck_assert_uint_eq(pool_chunk_count(p), 2);
	ck_assert_uint_eq(file_bytes(c), 2 * MIB);
	ck_assert_uint_eq(mapped_bytes(c), 2 * MIB);
	ck_assert_uint_eq(c->lease_id, 0);
	ck_assert_uint_eq(pool_audit(p, UINT64_MAX), 0);
	ck_assert_uint_eq(seen.calls, 2);
	pool_free(p);
}
END_TEST

START_TEST(test_put_finds_pages_punched_then_touched_through_the_holder_mapping)
{
	struct pool *p;
	struct punch_seen seen = { 0 };
	struct chunk **v = NULL, *c;
	size_t n = 0;
	char *holder;

	if (geteuid() != 0)
		return; /* needs a locked pool: without mlock, reclaim may unmap pages by itself */
	p = new_pool(2 * MIB, 1);
	pool_set_punch_hook(p, on_punch, &seen);
	n = take_ok(p, UID_A, 2 * MIB, &v);
	c = v[0];
	holder = mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
	ck_assert(holder != MAP_FAILED);
	punch(c, 0, 1 * MIB);
	memset(holder, 0x5a, c->bytes);
	munmap(holder, c->bytes);
	/* The file is whole again, but half of it is fresh pages that nothing locks. */
	ck_assert_uint_eq(file_bytes(c), 2 * MIB);
	ck_assert_uint_eq(mapped_bytes(c), 1 * MIB);
	put_back(p, v, n);
	ck_assert_uint_eq(seen.calls, 1);
	ck_assert_uint_eq(seen.missing_bytes, 1 * MIB);
	ck_assert_uint_eq(mapped_bytes(c), 2 * MIB);
	/* The repair keeps what the holder wrote. */
	ck_assert_int_eq(((unsigned char *)c->addr)[0], 0x5a);
	pool_free(p);
}
END_TEST

START_TEST(test_tail_punch_is_counted_and_the_tail_destroyed)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct punch_seen seen = { 0 };
	struct chunk **v = NULL;
	size_t n = 0;

	pool_set_punch_hook(p, on_punch, &seen);
	n = take_ok(p, UID_B, 64 * KIB, &v);
	ck_assert(v[0]->tail);
	punch(v[0], 0, 64 * KIB);
	put_back(p, v, n);
	ck_assert_uint_eq(seen.calls, 1);
	ck_assert_uint_eq(pool_punched_count_uid(p, UID_B), 1);
	ck_assert_uint_eq(pool_chunk_count(p), 0);
	ck_assert_uint_eq(pool_resident_bytes(p), 0);
	pool_free(p);
}
END_TEST

START_TEST(test_audit_checks_bounded_slices_and_repairs_lent_chunks_in_place)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct punch_seen seen = { 0 };
	struct chunk **v = NULL, *idle;
	size_t n = 0, calls = 0, found = 0;

	pool_set_punch_hook(p, on_punch, &seen);
	ck_assert_int_eq(pool_grow(p, 8 * MIB, NULL, NULL), 0);
	n = take_ok(p, UID_A, 8 * MIB, &v);
	ck_assert_int_eq(pool_grow(p, 4 * MIB, NULL, NULL), 0);
	ck_assert_uint_eq(pool_chunk_count(p), 6);
	punch(v[2], 0, 2 * MIB);
	/* One chunk per call: the punched one turns up within one round of the six. */
	while (found == 0 && calls < 6) {
		found += pool_audit(p, 1);
		calls++;
	}
	ck_assert_uint_eq(found, 1);
	ck_assert_uint_eq(seen.calls, 1);
	ck_assert_uint_eq(pool_punched_count_uid(p, UID_A), 1);
	/* Repaired where it is: still lent, whole again, nothing counted twice. */
	ck_assert_uint_eq(file_bytes(v[2]), 2 * MIB);
	ck_assert_uint_eq(pool_resident_bytes(p), 12 * MIB);
	for (int i = 0; i < 12; i++)
		ck_assert_uint_eq(pool_audit(p, 1), 0);
	idle = v[0];
	put_back(p, v, n);
	ck_assert_uint_eq(seen.calls, 1);
	ck_assert_uint_eq(pool_idle_bytes(p), 12 * MIB);

	/* Idle chunks too: a holder may keep a chunk's fd after releasing it. */
	punch(idle, 0, 2 * MIB);
	ck_assert_uint_eq(pool_audit(p, UINT64_MAX), 1);
	ck_assert_uint_eq(pool_punched_count_uid(p, UID_A), 2);
	ck_assert_uint_eq(file_bytes(idle), 2 * MIB);
	ck_assert_uint_eq(pool_idle_bytes(p), 12 * MIB);
	pool_free(p);
}
END_TEST

/* ShmemPmdMapped-style check: every 2 MiB of c's pool mapping is one huge page (pagemap: present, and the
 * kernel reports THP through /proc/self/smaps' ShmemPmdMapped for the whole VMA). */
static uint64_t smaps_field_kb(const void *addr, const char *field)
{
	FILE *f = fopen("/proc/self/smaps", "re");
	char line[512];
	bool in = false;
	unsigned long long v = 0;
	uintptr_t a = (uintptr_t)addr;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned long long lo, hi;

		if (sscanf(line, "%llx-%llx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
			in = a >= lo && a < hi;
			continue;
		}
		if (in && strncmp(line, field, strlen(field)) == 0)
			sscanf(line + strlen(field), ": %llu", &v);
	}
	fclose(f);
	return v;
}

static bool kernel_collapses(void)
{
	struct pool_opts o = { .chunk_bytes = 2 * MIB, .hugetlb = POOL_HUGETLB_NO, .thp = POOL_THP_YES, .threads = 1 };
	struct pool *p = NULL;
	int r = pool_new(&o, &p);

	pool_free(p);
	return r == 0;
}

/* The smaps parser on captured-layout text: each chunk's PMD-mapped bytes, by the VMA's start. */
START_TEST(test_smaps_parser_reads_pmd_mapped_bytes_per_chunk)
{
	const uintptr_t starts[] = { 0x7f3a40000000, 0x7f3a40600000, 0x7f3a40c00000, 0x7f3a40d00000, 0x7f3a41000000 };
	uint64_t pmd[5];
	char path[512], *buf;
	size_t len;
	FILE *f;

	snprintf(path, sizeof(path), "%s/proc/smaps/pool-chunks", FIXTURES_DIR);
	f = fopen(path, "re");
	ck_assert_ptr_nonnull(f);
	buf = malloc(1 << 16);
	ck_assert_ptr_nonnull(buf);
	len = fread(buf, 1, 1 << 16, f);
	fclose(f);
	ck_assert_int_eq(pool_parse_smaps_pmd(buf, len, starts, 5, pmd), 4);
	ck_assert_uint_eq(pmd[0], 4 * MIB); /* wholly huge */
	ck_assert_uint_eq(pmd[1], 2 * MIB); /* collapse said yes, half PTE-mapped: not verified */
	ck_assert_uint_eq(pmd[2], 0);
	ck_assert_uint_eq(pmd[3], UINT64_MAX); /* no VMA starts there (inside the one before) */
	ck_assert_uint_eq(pmd[4], 2 * MIB);    /* FilePmdMapped, past a path longer than a line buffer */
	/* Cut in the middle of the first chunk's fields: what is there is read, nothing invented. */
	ck_assert_int_eq(pool_parse_smaps_pmd(buf,
					      (size_t)(strstr(strstr(buf, "7f3a40000000-"), "ShmemPmdMapped") - buf),
					      starts, 1, pmd),
			 1);
	ck_assert_uint_eq(pmd[0], 0);
	ck_assert_int_eq(pool_parse_smaps_pmd("", 0, starts, 1, pmd), 0);
	ck_assert_uint_eq(pmd[0], UINT64_MAX);
	free(buf);

	/* Not smaps at all (the garbage fixture): refused, so the collapse's own answer stands. */
	snprintf(path, sizeof(path), "%s/proc/garbage/proc/meminfo", FIXTURES_DIR);
	f = fopen(path, "re");
	ck_assert_ptr_nonnull(f);
	buf = malloc(8192);
	ck_assert_ptr_nonnull(buf);
	len = fread(buf, 1, 8192, f);
	fclose(f);
	ck_assert_int_eq(pool_parse_smaps_pmd(buf, len, starts, 5, pmd), -EINVAL);
	free(buf);
}
END_TEST

START_TEST(test_thp_chunks_are_collapsed_pmd_mapped_and_counted)
{
	struct pool_opts o = { .chunk_bytes = 4 * MIB,
			       .hugetlb = POOL_HUGETLB_NO,
			       .thp = POOL_THP_AUTO,
			       .threads = 2,
			       .lock = geteuid() == 0 };
	struct chunk **v = NULL;
	struct pool *p = NULL;
	size_t n = 0;

	ck_assert_int_eq(pool_new(&o, &p), 0);
	ck_assert(pool_thp(p));
	ck_assert_str_eq(pool_page_kind(p), "thp");
	ck_assert_int_eq(pool_grow(p, 16 * MIB, NULL, NULL), 0);
	ck_assert_uint_eq(pool_thp_bytes(p), 16 * MIB);
	ck_assert_uint_eq(pool_thp_failures(p), 0);
	ck_assert_uint_eq(pool_thp_unverified(p), 0); /* smaps agreed with every collapse */
	/* A lease of 2 full chunks and a 4 KiB tail: the tail stays on 4 KiB pages. */
	n = take_ok(p, UID_A, 8 * MIB + 4096, &v);
	ck_assert_uint_eq(n, 3);
	for (size_t i = 0; i < 2; i++) {
		ck_assert(v[i]->thp);
		ck_assert_uint_eq((uintptr_t)v[i]->addr % (2 * MIB), 0);
		ck_assert_uint_eq(smaps_field_kb(v[i]->addr, "ShmemPmdMapped"), 4096);
		ck_assert_uint_eq(mapped_bytes(v[i]), 4 * MIB);
		ck_assert_uint_eq(file_bytes(v[i]), 4 * MIB);
		/* Collapsed memory is zeroed memory: a fresh chunk reads as zeros. */
		for (size_t off = 0; off < 4 * MIB; off += 4096)
			ck_assert_int_eq(((unsigned char *)v[i]->addr)[off], 0);
	}
	ck_assert(!v[2]->thp);
	ck_assert_uint_eq(pool_thp_bytes(p), 16 * MIB);
	/* A second mapping of a collapsed chunk, 2 MiB-aligned as the client maps it, is PMD-mapped too. */
	{
		char *res = mmap(NULL, 6 * MIB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		char *base = (char *)(((uintptr_t)res + 2 * MIB - 1) & ~(uintptr_t)(2 * MIB - 1));

		ck_assert(res != MAP_FAILED);
		ck_assert(mmap(base, 4 * MIB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, v[0]->fd,
			       0) == base);
		ck_assert_uint_eq(smaps_field_kb(base, "ShmemPmdMapped"), 4096);
		munmap(res, 6 * MIB);
	}
	put_back(p, v, n);
	ck_assert_uint_eq(pool_shrink(p, 0), 16 * MIB);
	ck_assert_uint_eq(pool_thp_bytes(p), 0);
	pool_free(p);
}
END_TEST

START_TEST(test_thp_no_and_hugetlb_pools_do_not_collapse)
{
	struct pool_opts o = { .chunk_bytes = 2 * MIB, .hugetlb = POOL_HUGETLB_NO, .thp = POOL_THP_NO, .threads = 1 };
	struct pool *p = NULL;

	ck_assert_int_eq(pool_new(&o, &p), 0);
	ck_assert(!pool_thp(p));
	ck_assert_str_eq(pool_page_kind(p), "4k");
	ck_assert_int_eq(pool_grow(p, 4 * MIB, NULL, NULL), 0);
	ck_assert_uint_eq(pool_thp_bytes(p), 0);
	pool_free(p);
	/* Chunks that are not whole 2 MiB pages cannot be THP, whatever thp says. */
	o.chunk_bytes = 1 * MIB;
	o.thp = POOL_THP_AUTO;
	ck_assert_int_eq(pool_new(&o, &p), 0);
	ck_assert(!pool_thp(p));
	pool_free(p);
}
END_TEST

START_TEST(test_a_punched_thp_chunk_is_repaired_and_collapsed_again)
{
	struct pool_opts o = {
		.chunk_bytes = 2 * MIB, .hugetlb = POOL_HUGETLB_NO, .thp = POOL_THP_AUTO, .threads = 1, .lock = true
	};
	struct punch_seen seen = { 0 };
	struct chunk **v = NULL, *c;
	struct pool *p = NULL;
	size_t n = 0;

	ck_assert_int_eq(pool_new(&o, &p), 0);
	pool_set_punch_hook(p, on_punch, &seen);
	n = take_ok(p, UID_A, 2 * MIB, &v);
	c = v[0];
	ck_assert(c->thp);
	punch(c, 0, 4096);
	put_back(p, v, n);
	/* Found (a punch splits the huge page: the whole of it was unlocked), repaired, huge again. */
	ck_assert_uint_eq(seen.calls, 1);
	ck_assert_uint_ge(seen.missing_bytes, 4096);
	ck_assert(c->thp);
	ck_assert_uint_eq(pool_thp_bytes(p), 2 * MIB);
	ck_assert_uint_eq(file_bytes(c), 2 * MIB);
	ck_assert_uint_eq(mapped_bytes(c), 2 * MIB);
	ck_assert_uint_eq(pool_audit(p, UINT64_MAX), 0);
	pool_free(p);
}
END_TEST

static Suite *pool_pages_suite(void)
{
	Suite *s = suite_create("pool_pages");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_smaps_parser_reads_pmd_mapped_bytes_per_chunk);
	tcase_add_test(tc, test_seals_do_not_stop_a_punch);
	tcase_add_test(tc, test_put_repairs_a_punched_chunk_and_counts_its_uid);
	tcase_add_test(tc, test_put_finds_pages_punched_then_touched_through_the_holder_mapping);
	tcase_add_test(tc, test_tail_punch_is_counted_and_the_tail_destroyed);
	tcase_add_test(tc, test_audit_checks_bounded_slices_and_repairs_lent_chunks_in_place);
	tcase_add_test(tc, test_thp_no_and_hugetlb_pools_do_not_collapse);
	/* Left out, and the suite reported skipped, where the kernel cannot collapse shmem or mlock is denied. */
	if (kernel_collapses()) {
		tcase_add_test(tc, test_thp_chunks_are_collapsed_pmd_mapped_and_counted);
		if (geteuid() == 0)
			tcase_add_test(tc, test_a_punched_thp_chunk_is_repaired_and_collapsed_again);
		else
			check_skip("thp punch repair needs a locked pool (root)");
	} else {
		check_skip("this kernel cannot collapse shmem into THP (MADV_COLLAPSE, Linux 6.1+)");
	}
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(pool_pages_suite)

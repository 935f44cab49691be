/* SPDX-License-Identifier: MIT */
/* Unit tests for the memfd pool: seals, exact sizes, tails, uid isolation, counters, shrink and threaded grow. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/falloc.h>

#include "pool.h"
#include "check_main.h"
#include "fdlimit.h"

#define KIB 1024ull
#define MIB (1024ull * KIB)
#define UID_A 1000
#define UID_B 1001

static char proc_root[PATH_MAX];

/* A fake proc root whose meminfo reports huge_free free huge pages. */
static const char *fake_proc(unsigned huge_free)
{
	char path[PATH_MAX + 32];
	FILE *f;

	snprintf(proc_root, sizeof(proc_root), "/tmp/check_pool.%d", (int)getpid());
	mkdir(proc_root, 0700);
	snprintf(path, sizeof(path), "%s/proc", proc_root);
	mkdir(path, 0700);
	snprintf(path, sizeof(path), "%s/proc/meminfo", proc_root);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f,
		"MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n"
		"HugePages_Total:    %u\nHugePages_Free:     %u\nHugepagesize:       2048 kB\n",
		huge_free, huge_free);
	fclose(f);
	return proc_root;
}

static void unfake_proc(void)
{
	char path[PATH_MAX + 32];

	snprintf(path, sizeof(path), "%s/proc/meminfo", proc_root);
	unlink(path);
	snprintf(path, sizeof(path), "%s/proc", proc_root);
	rmdir(path);
	rmdir(proc_root);
}

/* A pool of 4 KiB pages (thp off: these tests count 4 KiB pages; the THP ones make their own). */
static struct pool *new_pool(uint64_t chunk_bytes, unsigned threads)
{
	struct pool_opts o = {
		.chunk_bytes = chunk_bytes,
		.hugetlb = POOL_HUGETLB_NO,
		.thp = POOL_THP_NO,
		.threads = threads,
		/* Without CAP_IPC_LOCK the memlock rlimit is usually far below a pool. */
		.lock = geteuid() == 0,
	};
	struct pool *p = NULL;

	ck_assert_int_eq(pool_new(&o, &p), 0);
	ck_assert_ptr_nonnull(p);
	return p;
}

static ino_t inode_of(const struct chunk *c)
{
	struct stat st;

	ck_assert_int_eq(fstat(c->fd, &st), 0);
	return st.st_ino;
}

/* Read through the memfd, as a client would (hugetlb chunks have no daemon mapping). */
static bool all_zero(const struct chunk *c)
{
	const unsigned char *b = mmap(NULL, c->bytes, PROT_READ, MAP_SHARED, c->fd, 0);
	bool zero = true;

	ck_assert(b != MAP_FAILED);
	for (uint64_t i = 0; i < c->bytes && zero; i++)
		zero = b[i] == 0;
	munmap((void *)b, c->bytes);
	return zero;
}

START_TEST(test_new_rejects_chunk_size_not_a_page_multiple)
{
	struct pool_opts o = { .chunk_bytes = 3 * 4096 + 1, .hugetlb = POOL_HUGETLB_NO };
	struct pool *p = NULL;

	ck_assert_int_eq(pool_new(&o, &p), -EINVAL);
}
END_TEST

START_TEST(test_new_defaults_to_2mib_chunks_of_4k_pages)
{
	struct pool *p = new_pool(0, 1);

	ck_assert_uint_eq(pool_chunk_size(p), 2 * MIB);
	ck_assert_uint_eq(pool_page_size(p), 4096);
	ck_assert(!pool_hugetlb(p));
	ck_assert_uint_eq(pool_idle_bytes(p), 0);
	ck_assert_uint_eq(pool_resident_bytes(p), 0);
	ck_assert_uint_eq(pool_chunk_count(p), 0);
	pool_free(p);
}
END_TEST

START_TEST(test_hugetlb_yes_without_huge_pages_is_not_supported)
{
	struct pool_opts o = { .hugetlb = POOL_HUGETLB_YES, .proc_root = fake_proc(0) };
	struct pool *p = NULL;

	ck_assert_int_eq(pool_new(&o, &p), -ENOTSUP);
	ck_assert_uint_eq(pool_host_page_size(POOL_HUGETLB_AUTO, proc_root), 4096);
	ck_assert_uint_eq(pool_host_page_size(POOL_HUGETLB_NO, proc_root), 4096);
	unfake_proc();
}
END_TEST

START_TEST(test_hugetlb_mode_needs_chunks_of_2mib_multiples)
{
	struct pool_opts o = { .chunk_bytes = MIB, .hugetlb = POOL_HUGETLB_AUTO, .proc_root = fake_proc(8) };
	struct pool *p = NULL;

	ck_assert_uint_eq(pool_host_page_size(POOL_HUGETLB_AUTO, proc_root), 2 * MIB);
	ck_assert_int_eq(pool_new(&o, &p), -EINVAL);
	o.chunk_bytes = 4 * MIB;
	ck_assert_int_eq(pool_new(&o, &p), 0);
	ck_assert(pool_hugetlb(p));
	ck_assert_uint_eq(pool_page_size(p), 2 * MIB);
	pool_free(p);
	unfake_proc();
}
END_TEST

START_TEST(test_auto_hugetlb_falls_back_to_4k_chunk_when_huge_pages_run_out)
{
	/* meminfo claims free huge pages; if the real host has none, mmap fails with ENOMEM. */
	struct pool_opts o = { .hugetlb = POOL_HUGETLB_AUTO, .proc_root = fake_proc(8), .lock = geteuid() == 0 };
	bool host_has_huge = pool_host_page_size(POOL_HUGETLB_AUTO, "/") == 2 * MIB;
	struct chunk **v = NULL;
	struct pool *p = NULL;
	size_t n = 0;

	ck_assert_int_eq(pool_new(&o, &p), 0);
	ck_assert_int_eq(pool_take(p, UID_A, 4 * MIB, &v, &n), 0);
	ck_assert_uint_eq(n, 2);
	for (size_t i = 0; i < n; i++) {
		ck_assert_uint_eq(v[i]->bytes, 2 * MIB);
		if (!host_has_huge)
			ck_assert(!v[i]->hugetlb);
		ck_assert(all_zero(v[i]));
	}
	pool_put(p, v, n);
	free(v);
	pool_free(p);
	unfake_proc();
}
END_TEST

START_TEST(test_chunk_is_sealed_against_resize)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct chunk **v = NULL;
	size_t n = 0;
	int seals;

	ck_assert_int_eq(pool_take(p, UID_A, 2 * MIB, &v, &n), 0);
	seals = fcntl(v[0]->fd, F_GET_SEALS);
	ck_assert_int_eq(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
			 F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	errno = 0;
	ck_assert_int_eq(ftruncate(v[0]->fd, MIB), -1);
	ck_assert_int_eq(errno, EPERM);
	errno = 0;
	ck_assert_int_eq(ftruncate(v[0]->fd, 4 * MIB), -1);
	ck_assert_int_eq(errno, EPERM);
	/* F_SEAL_SEAL: nobody can add a write seal later and break the daemon's mapping. */
	ck_assert_int_eq(fcntl(v[0]->fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
	ck_assert_int_eq(errno, EPERM);
	ck_assert(fcntl(v[0]->fd, F_GETFD) & FD_CLOEXEC);
	pool_put(p, v, n);
	free(v);
	pool_free(p);
}
END_TEST

START_TEST(test_chunks_are_prefaulted)
{
	struct pool *p = new_pool(2 * MIB, 1);
	unsigned char vec[2 * MIB / 4096];
	struct chunk **v = NULL;
	size_t n = 0;

	ck_assert_int_eq(pool_take(p, UID_A, 2 * MIB, &v, &n), 0);
	ck_assert_int_eq(mincore(v[0]->addr, 2 * MIB, vec), 0);
	for (size_t i = 0; i < sizeof(vec); i++)
		ck_assert_msg(vec[i] & 1, "page %zu not resident", i);
	pool_put(p, v, n);
	free(v);
	pool_free(p);
}
END_TEST

START_TEST(test_take_rejects_zero_and_non_page_multiples)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct chunk **v = NULL;
	size_t n = 0;

	ck_assert_int_eq(pool_take(p, UID_A, 0, &v, &n), -EINVAL);
	ck_assert_int_eq(pool_take(p, UID_A, 4096 + 1, &v, &n), -EINVAL);
	ck_assert_uint_eq(pool_resident_bytes(p), 0);
	pool_free(p);
}
END_TEST

START_TEST(test_take_sizes_are_exact_with_tail_for_remainder)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct chunk **v = NULL;
	uint64_t sum = 0;
	size_t n = 0;

	ck_assert_int_eq(pool_take(p, UID_A, 5 * MIB + 8 * KIB, &v, &n), 0);
	ck_assert_uint_eq(n, 3);
	for (size_t i = 0; i < n; i++) {
		struct stat st;

		ck_assert_int_eq(fstat(v[i]->fd, &st), 0);
		ck_assert_uint_eq((uint64_t)st.st_size, v[i]->bytes);
		ck_assert_uint_eq(v[i]->owner_uid, UID_A);
		ck_assert_int_eq(v[i]->tail, i == n - 1);
		sum += v[i]->bytes;
	}
	ck_assert_uint_eq(v[2]->bytes, MIB + 8 * KIB);
	ck_assert_uint_eq(sum, 5 * MIB + 8 * KIB);
	ck_assert_uint_eq(pool_resident_bytes(p), 5 * MIB + 8 * KIB);
	ck_assert_uint_eq(pool_chunk_count(p), 3);

	/* Tails are destroyed on return, full chunks become idle. */
	pool_put(p, v, n);
	free(v);
	ck_assert_uint_eq(pool_idle_bytes(p), 4 * MIB);
	ck_assert_uint_eq(pool_resident_bytes(p), 4 * MIB);
	ck_assert_uint_eq(pool_chunk_count(p), 2);
	pool_free(p);
}
END_TEST

START_TEST(test_take_smaller_than_a_chunk_is_one_tail)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct chunk **v = NULL;
	size_t n = 0;

	ck_assert_int_eq(pool_grow(p, 4 * MIB, NULL, NULL), 0);
	ck_assert_int_eq(pool_take(p, UID_A, 64 * KIB, &v, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert(v[0]->tail);
	ck_assert_uint_eq(v[0]->bytes, 64 * KIB);
	ck_assert_uint_eq(pool_idle_bytes(p), 4 * MIB);
	ck_assert_uint_eq(pool_resident_bytes(p), 4 * MIB + 64 * KIB);
	pool_put(p, v, n);
	free(v);
	ck_assert_uint_eq(pool_resident_bytes(p), 4 * MIB);
	pool_free(p);
}
END_TEST

START_TEST(test_counters_track_grow_take_put)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct chunk **v = NULL;
	size_t n = 0;

	ck_assert_int_eq(pool_grow(p, 7 * MIB, NULL, NULL), 0); /* rounds up to 4 chunks */
	ck_assert_uint_eq(pool_idle_bytes(p), 8 * MIB);
	ck_assert_uint_eq(pool_resident_bytes(p), 8 * MIB);
	ck_assert_uint_eq(pool_chunk_count(p), 4);
	ck_assert_int_eq(pool_grow(p, 6 * MIB, NULL, NULL), 0); /* already there */
	ck_assert_uint_eq(pool_chunk_count(p), 4);

	ck_assert_int_eq(pool_take(p, UID_A, 3 * MIB, &v, &n), 0);
	ck_assert_uint_eq(pool_idle_bytes(p), 6 * MIB);
	ck_assert_uint_eq(pool_resident_bytes(p), 9 * MIB);
	ck_assert_uint_eq(pool_chunk_count(p), 5);
	pool_put(p, v, n);
	free(v);
	ck_assert_uint_eq(pool_idle_bytes(p), 8 * MIB);
	ck_assert_uint_eq(pool_resident_bytes(p), 8 * MIB);
	ck_assert_uint_eq(pool_chunk_count(p), 4);

	/* Larger than the idle pool: idle chunks first, then new ones. */
	ck_assert_int_eq(pool_take(p, UID_A, 12 * MIB, &v, &n), 0);
	ck_assert_uint_eq(n, 6);
	ck_assert_uint_eq(pool_idle_bytes(p), 0);
	ck_assert_uint_eq(pool_resident_bytes(p), 12 * MIB);
	pool_put(p, v, n);
	free(v);
	ck_assert_uint_eq(pool_idle_bytes(p), 12 * MIB);
	pool_free(p);
}
END_TEST

START_TEST(test_chunk_released_by_one_uid_is_never_lent_to_another)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct chunk **v = NULL;
	ino_t ino_a;
	size_t n = 0;

	ck_assert_int_eq(pool_take(p, UID_A, 2 * MIB, &v, &n), 0);
	ino_a = inode_of(v[0]);
	memset(v[0]->addr, 0xA5, v[0]->bytes);
	pool_put(p, v, n);
	free(v);
	ck_assert_uint_eq(pool_idle_bytes(p), 2 * MIB);

	ck_assert_int_eq(pool_take(p, UID_B, 2 * MIB, &v, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_ne(inode_of(v[0]), ino_a);
	ck_assert_uint_eq(v[0]->owner_uid, UID_B);
	ck_assert(all_zero(v[0]));
	/* A's chunk was replaced, not kept alongside: the pool holds no more than before. */
	ck_assert_uint_eq(pool_idle_bytes(p), 0);
	ck_assert_uint_eq(pool_resident_bytes(p), 2 * MIB);
	ck_assert_uint_eq(pool_chunk_count(p), 1);
	pool_put(p, v, n);
	free(v);
	pool_free(p);
}
END_TEST

START_TEST(test_same_uid_gets_its_own_chunk_back)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct chunk **v = NULL;
	ino_t ino_a;
	size_t n = 0;

	ck_assert_int_eq(pool_grow(p, 4 * MIB, NULL, NULL), 0);
	ck_assert_int_eq(pool_take(p, UID_A, 2 * MIB, &v, &n), 0);
	ino_a = inode_of(v[0]);
	pool_put(p, v, n);
	free(v);
	ck_assert_int_eq(pool_take(p, UID_A, 2 * MIB, &v, &n), 0);
	ck_assert_uint_eq(inode_of(v[0]), ino_a);
	pool_put(p, v, n);
	free(v);
	pool_free(p);
}
END_TEST

/*
 * Issue 22, finding 1: a chunk whose fd went to another uid (tainted) may still be mapped there after
 * it comes back (mremap, fork, a passed-on fd), so it is destroyed like a tail, never lent again, not
 * even to the uid it was lent to; the pool's books stay exact and a later take makes a fresh chunk.
 */
START_TEST(test_tainted_chunk_is_destroyed_on_put_and_never_lent_again)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct chunk **v = NULL;
	ino_t kept_ino[2];
	int kept[2];
	size_t n = 0;

	ck_assert_int_eq(pool_grow(p, 6 * MIB, NULL, NULL), 0);
	ck_assert_int_eq(pool_take(p, UID_A, 4 * MIB + 4 * KIB, &v, &n), 0); /* two full chunks and a tail */
	ck_assert_uint_eq(n, 3);
	ck_assert_uint_eq(pool_idle_bytes(p), 2 * MIB);
	/* The other uid's view: a dup of each full chunk's fd, as a mapping or a passed fd would keep it. */
	for (int i = 0; i < 2; i++) {
		kept[i] = dup(v[i]->fd);
		ck_assert_int_ge(kept[i], 0);
		kept_ino[i] = inode_of(v[i]);
		v[i]->tainted = true;
	}
	pool_put(p, v, n);
	free(v);
	/* Gone, both full chunks and the tail: only the never-lent chunk is left, and nothing is lent. */
	ck_assert_uint_eq(pool_tainted_destroyed(p), 2);
	ck_assert_uint_eq(pool_idle_bytes(p), 2 * MIB);
	ck_assert_uint_eq(pool_resident_bytes(p), 2 * MIB);
	ck_assert_uint_eq(pool_chunk_count(p), 1);

	/* The same uid asks again: fresh pages, none of the kept ones, and writes through a kept fd reach none. */
	ck_assert_int_eq(pool_take(p, UID_A, 4 * MIB, &v, &n), 0);
	ck_assert_uint_eq(n, 2);
	for (int i = 0; i < 2; i++) {
		ck_assert(!v[i]->tainted);
		for (int k = 0; k < 2; k++)
			ck_assert_uint_ne(inode_of(v[i]), kept_ino[k]);
		ck_assert_int_eq(pwrite(kept[i], "B", 1, 0), 1);
	}
	for (int i = 0; i < 2; i++)
		ck_assert(all_zero(v[i]));
	ck_assert_uint_eq(pool_resident_bytes(p), 4 * MIB);
	ck_assert_uint_eq(pool_chunk_count(p), 2);
	pool_put(p, v, n);
	free(v);
	/* Untainted, they are pooled again as before. */
	ck_assert_uint_eq(pool_idle_bytes(p), 4 * MIB);
	ck_assert_uint_eq(pool_tainted_destroyed(p), 2);
	close(kept[0]);
	close(kept[1]);
	pool_free(p);
}
END_TEST

START_TEST(test_take_prefers_own_then_never_lent_chunks)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct chunk **a = NULL, **b = NULL, **v = NULL;
	ino_t ino_a, ino_b;
	size_t na = 0, nb = 0, n = 0;

	ck_assert_int_eq(pool_take(p, UID_A, 2 * MIB, &a, &na), 0);
	ck_assert_int_eq(pool_take(p, UID_B, 2 * MIB, &b, &nb), 0);
	ino_a = inode_of(a[0]);
	ino_b = inode_of(b[0]);
	pool_put(p, a, na);
	pool_put(p, b, nb);
	free(a);
	free(b);
	ck_assert_int_eq(pool_grow(p, 6 * MIB, NULL, NULL), 0); /* one never-lent chunk */
	ck_assert_uint_eq(pool_chunk_count(p), 3);

	/* A asks for two: its own, then the never-lent one; B's stays for B. */
	ck_assert_int_eq(pool_take(p, UID_A, 4 * MIB, &v, &n), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert_uint_eq(inode_of(v[0]), ino_a);
	ck_assert_uint_ne(inode_of(v[1]), ino_b);
	ck_assert_uint_eq(pool_idle_bytes(p), 2 * MIB);
	pool_put(p, v, n);
	free(v);

	ck_assert_int_eq(pool_take(p, UID_B, 2 * MIB, &v, &n), 0);
	ck_assert_uint_eq(inode_of(v[0]), ino_b);
	pool_put(p, v, n);
	free(v);
	pool_free(p);
}
END_TEST

START_TEST(test_take_fails_atomically_when_fds_run_out)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct chunk **v = NULL;
	size_t n = 0;

	ck_assert_int_eq(pool_grow(p, 2 * MIB, NULL, NULL), 0);
	/* memfd_create takes the lowest free fd: let it make one chunk, not four. */
	fdlimit_leave_one();

	ck_assert_int_eq(pool_take(p, UID_A, 8 * MIB + 4096, &v, &n), -EMFILE);
	ck_assert_uint_eq(pool_idle_bytes(p), 2 * MIB);
	ck_assert_uint_eq(pool_resident_bytes(p), 2 * MIB);
	ck_assert_uint_eq(pool_chunk_count(p), 1);
	/* What the idle list can cover alone still works. */
	ck_assert_int_eq(pool_take(p, UID_A, 2 * MIB, &v, &n), 0);
	pool_put(p, v, n);
	free(v);
	pool_free(p);
}
END_TEST

START_TEST(test_grow_keeps_chunks_made_before_a_failure)
{
	struct pool *p = new_pool(2 * MIB, 1);

	fdlimit_leave_one();

	ck_assert_int_eq(pool_grow(p, 8 * MIB, NULL, NULL), -EMFILE);
	ck_assert_uint_eq(pool_chunk_count(p), 1);
	ck_assert_uint_eq(pool_idle_bytes(p), 2 * MIB);
	pool_free(p);
}
END_TEST

START_TEST(test_shrink_releases_idle_down_to_keep)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct chunk **v = NULL;
	size_t n = 0;

	ck_assert_int_eq(pool_grow(p, 10 * MIB, NULL, NULL), 0);
	ck_assert_int_eq(pool_take(p, UID_A, 2 * MIB, &v, &n), 0);
	ck_assert_uint_eq(pool_shrink(p, 3 * MIB), 6 * MIB);
	ck_assert_uint_eq(pool_idle_bytes(p), 2 * MIB);
	ck_assert_uint_eq(pool_shrink(p, 3 * MIB), 0);
	ck_assert_uint_eq(pool_shrink(p, 0), 2 * MIB);
	ck_assert_uint_eq(pool_idle_bytes(p), 0);
	/* Lent chunks are untouched. */
	ck_assert_uint_eq(pool_resident_bytes(p), 2 * MIB);
	ck_assert_uint_eq(pool_chunk_count(p), 1);
	pool_put(p, v, n);
	free(v);
	pool_free(p);
}
END_TEST

START_TEST(test_shrink_drops_uid_owned_chunks_before_never_lent_ones)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct chunk **v = NULL;
	ino_t ino_a;
	size_t n = 0;

	ck_assert_int_eq(pool_take(p, UID_A, 2 * MIB, &v, &n), 0);
	ino_a = inode_of(v[0]);
	ck_assert_int_eq(pool_grow(p, 2 * MIB, NULL, NULL), 0);
	pool_put(p, v, n);
	free(v);
	ck_assert_uint_eq(pool_idle_bytes(p), 4 * MIB);
	ck_assert_uint_eq(pool_shrink(p, 2 * MIB), 2 * MIB);
	/* The survivor is the never-lent one (it serves anybody); A, asking again, gets that one. */
	ck_assert_int_eq(pool_take(p, UID_A, 2 * MIB, &v, &n), 0);
	ck_assert_uint_ne(inode_of(v[0]), ino_a);
	ck_assert_uint_eq(pool_chunk_count(p), 1);
	pool_put(p, v, n);
	free(v);
	pool_free(p);
}
END_TEST

struct progress_log {
	uint64_t last_done, total;
	unsigned calls;
	bool monotonic;
};

static void on_progress(uint64_t done, uint64_t total, void *ud)
{
	struct progress_log *pl = ud;

	if (done < pl->last_done)
		pl->monotonic = false;
	pl->last_done = done;
	pl->total = total;
	pl->calls++;
}

START_TEST(test_grow_with_threads_makes_distinct_prefaulted_chunks)
{
	/* 64 MiB is the smallest grow that goes parallel. */
	struct pool *p = new_pool(2 * MIB, 2);
	struct progress_log pl = { .monotonic = true };
	struct chunk **v = NULL;
	ino_t inos[32];
	size_t n = 0;

	ck_assert_int_eq(pool_grow(p, 64 * MIB, on_progress, &pl), 0);
	ck_assert_uint_eq(pool_chunk_count(p), 32);
	ck_assert_uint_eq(pool_idle_bytes(p), 64 * MIB);
	ck_assert(pl.calls >= 1);
	ck_assert(pl.monotonic);
	ck_assert_uint_eq(pl.last_done, 64 * MIB);
	ck_assert_uint_eq(pl.total, 64 * MIB);

	ck_assert_int_eq(pool_take(p, UID_A, 64 * MIB, &v, &n), 0);
	ck_assert_uint_eq(n, 32);
	for (size_t i = 0; i < n; i++) {
		ck_assert_uint_eq(v[i]->bytes, 2 * MIB);
		inos[i] = inode_of(v[i]);
		for (size_t j = 0; j < i; j++) {
			ck_assert_uint_ne(inos[i], inos[j]);
			ck_assert_uint_ne(v[i]->id, v[j]->id);
		}
	}
	pool_put(p, v, n);
	free(v);
	pool_free(p);
}
END_TEST

START_TEST(test_large_take_from_empty_pool_uses_threads_and_is_exact)
{
	struct pool *p = new_pool(2 * MIB, 2);
	struct chunk **v = NULL;
	uint64_t sum = 0;
	size_t n = 0;

	ck_assert_int_eq(pool_take(p, UID_A, 64 * MIB + 12 * KIB, &v, &n), 0);
	ck_assert_uint_eq(n, 33);
	for (size_t i = 0; i < n; i++) {
		sum += v[i]->bytes;
		ck_assert_int_eq(v[i]->tail, i == n - 1);
	}
	ck_assert_uint_eq(sum, 64 * MIB + 12 * KIB);
	pool_put(p, v, n);
	free(v);
	ck_assert_uint_eq(pool_idle_bytes(p), 64 * MIB);
	pool_free(p);
}
END_TEST

/* ------------------------------------------------------------ hole punching (finding 10) */

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
	ck_assert_int_eq(pool_take(p, UID_A, 2 * MIB, &v, &n), 0);
	punch(v[0], 0, 1 * MIB);
	ck_assert_uint_eq(file_bytes(v[0]), 1 * MIB);
	pool_put(p, v, n);
	free(v);
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
	ck_assert_int_eq(pool_take(p, UID_A, 4 * MIB, &v, &n), 0);
	ck_assert_uint_eq(n, 2);
	v[0]->lease_id = v[1]->lease_id = 77;
	c = v[0];
	punch(c, 0, 2 * MIB);
	punch(v[1], 4096, 4096);
	pool_put(p, v, n);
	free(v);
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
	ck_assert_int_eq(pool_take(p, UID_A, 2 * MIB, &v, &n), 0);
	c = v[0];
	holder = mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
	ck_assert(holder != MAP_FAILED);
	punch(c, 0, 1 * MIB);
	memset(holder, 0x5a, c->bytes);
	munmap(holder, c->bytes);
	/* The file is whole again, but half of it is fresh pages that nothing locks. */
	ck_assert_uint_eq(file_bytes(c), 2 * MIB);
	ck_assert_uint_eq(mapped_bytes(c), 1 * MIB);
	pool_put(p, v, n);
	free(v);
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
	ck_assert_int_eq(pool_take(p, UID_B, 64 * KIB, &v, &n), 0);
	ck_assert(v[0]->tail);
	punch(v[0], 0, 64 * KIB);
	pool_put(p, v, n);
	free(v);
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
	ck_assert_int_eq(pool_take(p, UID_A, 8 * MIB, &v, &n), 0);
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
	pool_put(p, v, n);
	free(v);
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
	ck_assert_int_eq(pool_take(p, UID_A, 8 * MIB + 4096, &v, &n), 0);
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
	pool_put(p, v, n);
	free(v);
	ck_assert_uint_eq(pool_shrink(p, 0), 16 * MIB);
	ck_assert_uint_eq(pool_thp_bytes(p), 0);
	pool_free(p);
}
END_TEST

/* The node of the page at addr, asked of the kernel by the test itself. */
static int kernel_node_of(void *addr)
{
	int status = -1;
	void *pages[1] = { addr };

	ck_assert_int_eq(syscall(SYS_move_pages, 0, 1, pages, NULL, &status, 0), 0);
	return status;
}

START_TEST(test_numa_placed_chunks_land_where_the_pool_says)
{
	int nodes[1] = { 0 };
	struct pool_opts o = { .chunk_bytes = 2 * MIB,
			       .hugetlb = POOL_HUGETLB_NO,
			       .thp = POOL_THP_NO,
			       .threads = 2,
			       .lock = geteuid() == 0,
			       .nodes = nodes,
			       .n_nodes = 1 };
	struct pool_node_bytes nb;
	struct chunk **v = NULL;
	struct pool *p = NULL;
	const int *pn;
	size_t n = 0;

	ck_assert_int_eq(pool_new(&o, &p), 0);
	ck_assert_uint_eq(pool_nodes(p, &pn), 1);
	ck_assert_int_eq(pn[0], 0);
	ck_assert_int_eq(pool_grow_on(p, 8 * MIB, 0, NULL, NULL), 0);
	pool_node_bytes(p, 0, &nb);
	ck_assert_uint_eq(nb.idle, 8 * MIB);
	ck_assert_uint_eq(nb.lent, 0);
	ck_assert_int_eq(pool_take_on(p, UID_A, 4 * MIB + 4096, 0, &v, &n), 0);
	for (size_t i = 0; i < n; i++) {
		/* A mapping of our own, asked of the kernel: the pages are where the pool said. */
		char *m = mmap(NULL, v[i]->bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, v[i]->fd, 0);

		ck_assert(m != MAP_FAILED);
		ck_assert_int_eq(v[i]->node, 0);
		ck_assert(!v[i]->misplaced);
		ck_assert_int_eq(kernel_node_of(m), 0);
		ck_assert_int_eq(kernel_node_of(m + v[i]->bytes - 4096), 0);
		munmap(m, v[i]->bytes);
	}
	pool_node_bytes(p, 0, &nb);
	ck_assert_uint_eq(nb.lent, 4 * MIB + 4096);
	ck_assert_uint_eq(nb.misplaced, 0);
	pool_put(p, v, n);
	free(v);
	/* A node the pool does not place on asks for nothing in particular: served from node 0. */
	ck_assert_int_eq(pool_take_on(p, UID_A, 2 * MIB, 7, &v, &n), 0);
	ck_assert_int_eq(v[0]->node, 0);
	pool_put(p, v, n);
	free(v);
	pool_free(p);
}
END_TEST

/* A fake host for the numa hooks: node 1 is full while node1_full says so; 2, then 0, stand in for it. */
static bool node1_full;
static unsigned fallback_asked;

static uint64_t fake_free(int node, void *ud)
{
	(void)ud;
	return node == 1 && node1_full ? 0 : UINT64_MAX;
}

static size_t fake_fallback(int node, int *order, size_t max, void *ud)
{
	static const int by_node[3][2] = { { 1, 2 }, { 2, 0 }, { 1, 0 } };

	(void)ud;
	ck_assert_uint_ge(max, 2);
	fallback_asked++;
	order[0] = by_node[node][0];
	order[1] = by_node[node][1];
	return 2;
}

/*
 * Asked of a node that is full, a take uses the idle chunks of the nodes that stand in for it, nearest
 * first (node 2 has none, node 0 has), and makes nothing; asked of a node with room, it makes fresh ones
 * there and the kernel's placement decides. This host has one node, so only node 0 holds pages.
 */
START_TEST(test_take_on_a_full_node_uses_idle_chunks_of_the_nearest_node_with_some)
{
	int nodes[3] = { 0, 1, 2 };
	struct pool_opts o = { .chunk_bytes = 2 * MIB,
			       .hugetlb = POOL_HUGETLB_NO,
			       .thp = POOL_THP_NO,
			       .threads = 1,
			       .lock = geteuid() == 0,
			       .nodes = nodes,
			       .n_nodes = 3 };
	const struct pool_numa_hooks hooks = { fake_free, fake_fallback, NULL };
	struct pool_node_bytes nb;
	struct chunk **v = NULL, **w = NULL;
	struct pool *p = NULL;
	size_t n = 0, m = 0;

	ck_assert_int_eq(pool_new(&o, &p), 0);
	pool_set_numa_hooks(p, &hooks);
	ck_assert_int_eq(pool_grow_on(p, 8 * MIB, 0, NULL, NULL), 0);
	ck_assert_uint_eq(pool_chunk_count(p), 4);
	node1_full = true;
	ck_assert_int_eq(pool_take_on(p, UID_A, 4 * MIB, 1, &v, &n), 0);
	ck_assert_uint_eq(fallback_asked, 1);
	ck_assert_uint_eq(n, 2);
	ck_assert_uint_eq(pool_chunk_count(p), 4); /* nothing made, nothing replaced */
	for (size_t i = 0; i < n; i++) {
		ck_assert_int_eq(v[i]->node, 0);
		ck_assert(
			!v[i]->misplaced); /* made for node 0, where it is: the lease (asked of 1) is what is misplaced */
	}
	pool_node_bytes(p, 0, &nb);
	ck_assert_uint_eq(nb.idle, 4 * MIB);
	ck_assert_uint_eq(nb.lent, 4 * MIB);
	/* A node with room gets fresh chunks placed for it, even with idle ones elsewhere. */
	node1_full = false;
	ck_assert_int_eq(pool_take_on(p, UID_A, 2 * MIB, 1, &w, &m), 0);
	ck_assert_uint_eq(fallback_asked, 1);
	ck_assert_uint_eq(m, 1);
	ck_assert_uint_gt(w[0]->id, 4);
	ck_assert(w[0]->misplaced);                /* asked of node 1, which this kernel does not have */
	ck_assert_uint_eq(pool_chunk_count(p), 4); /* an idle node-0 chunk made room for it */
	pool_put(p, w, m);
	pool_put(p, v, n);
	free(w);
	free(v);
	/* A take its own node can serve never asks for a fallback. */
	node1_full = true;
	ck_assert_int_eq(pool_take_on(p, UID_A, 2 * MIB, 0, &v, &n), 0);
	ck_assert_uint_eq(fallback_asked, 1);
	pool_put(p, v, n);
	free(v);
	pool_free(p);
}
END_TEST

START_TEST(test_without_placement_chunks_have_no_node)
{
	struct chunk **v = NULL;
	struct pool *p = new_pool(2 * MIB, 1);
	size_t n = 0;

	ck_assert_int_eq(pool_take_on(p, UID_A, 2 * MIB, 0, &v, &n), 0);
	ck_assert_int_eq(v[0]->node, -1);
	pool_put(p, v, n);
	free(v);
	pool_free(p);
}
END_TEST

START_TEST(test_hugepages_target_adds_only_what_the_free_pages_lack)
{
	/* 64 MiB = 32 pages. */
	ck_assert_uint_eq(pool_hugepages_target(64 * MIB, 10, 10), 32);
	ck_assert_uint_eq(pool_hugepages_target(64 * MIB, 100, 40), 100); /* fits: never lowered */
	ck_assert_uint_eq(pool_hugepages_target(64 * MIB, 100, 20), 112); /* others hold 80 */
	ck_assert_uint_eq(pool_hugepages_target(64 * MIB + 1, 0, 0), 33); /* a partial page is a page */
	ck_assert_uint_eq(pool_hugepages_target(0, 7, 0), 7);
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
	ck_assert_int_eq(pool_take(p, UID_A, 2 * MIB, &v, &n), 0);
	c = v[0];
	ck_assert(c->thp);
	punch(c, 0, 4096);
	pool_put(p, v, n);
	free(v);
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

static Suite *pool_suite(void)
{
	Suite *s = suite_create("pool");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_new_rejects_chunk_size_not_a_page_multiple);
	tcase_add_test(tc, test_smaps_parser_reads_pmd_mapped_bytes_per_chunk);
	tcase_add_test(tc, test_new_defaults_to_2mib_chunks_of_4k_pages);
	tcase_add_test(tc, test_hugetlb_yes_without_huge_pages_is_not_supported);
	tcase_add_test(tc, test_hugetlb_mode_needs_chunks_of_2mib_multiples);
	tcase_add_test(tc, test_auto_hugetlb_falls_back_to_4k_chunk_when_huge_pages_run_out);
	tcase_add_test(tc, test_chunk_is_sealed_against_resize);
	tcase_add_test(tc, test_chunks_are_prefaulted);
	tcase_add_test(tc, test_take_rejects_zero_and_non_page_multiples);
	tcase_add_test(tc, test_take_sizes_are_exact_with_tail_for_remainder);
	tcase_add_test(tc, test_take_smaller_than_a_chunk_is_one_tail);
	tcase_add_test(tc, test_counters_track_grow_take_put);
	tcase_add_test(tc, test_chunk_released_by_one_uid_is_never_lent_to_another);
	tcase_add_test(tc, test_same_uid_gets_its_own_chunk_back);
	tcase_add_test(tc, test_take_prefers_own_then_never_lent_chunks);
	tcase_add_test(tc, test_tainted_chunk_is_destroyed_on_put_and_never_lent_again);
	tcase_add_test(tc, test_take_fails_atomically_when_fds_run_out);
	tcase_add_test(tc, test_grow_keeps_chunks_made_before_a_failure);
	tcase_add_test(tc, test_shrink_releases_idle_down_to_keep);
	tcase_add_test(tc, test_shrink_drops_uid_owned_chunks_before_never_lent_ones);
	tcase_add_test(tc, test_grow_with_threads_makes_distinct_prefaulted_chunks);
	tcase_add_test(tc, test_large_take_from_empty_pool_uses_threads_and_is_exact);
	tcase_add_test(tc, test_seals_do_not_stop_a_punch);
	tcase_add_test(tc, test_put_repairs_a_punched_chunk_and_counts_its_uid);
	tcase_add_test(tc, test_put_finds_pages_punched_then_touched_through_the_holder_mapping);
	tcase_add_test(tc, test_tail_punch_is_counted_and_the_tail_destroyed);
	tcase_add_test(tc, test_audit_checks_bounded_slices_and_repairs_lent_chunks_in_place);
	tcase_add_test(tc, test_thp_no_and_hugetlb_pools_do_not_collapse);
	tcase_add_test(tc, test_hugepages_target_adds_only_what_the_free_pages_lack);
	tcase_add_test(tc, test_numa_placed_chunks_land_where_the_pool_says);
	tcase_add_test(tc, test_take_on_a_full_node_uses_idle_chunks_of_the_nearest_node_with_some);
	tcase_add_test(tc, test_without_placement_chunks_have_no_node);
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

CHECK_MAIN(pool_suite)

/* SPDX-License-Identifier: MIT */
/* Unit tests for the memfd pool: seals, exact sizes, tails, uid and tenant isolation, counters, shrink, threaded grow, huge pages. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "broker.h"
#include "budget.h"
#include "daemon.h"
#include "lease.h"
#include "pool.h"
#include "waitq-order.h"
#include "check_main.h"
#include "fdlimit.h"
#include "poolfix.h"

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
	assert_books(p, 0, 0, 0);
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
	n = take_ok(p, UID_A, 4 * MIB, &v);
	ck_assert_uint_eq(n, 2);
	for (size_t i = 0; i < n; i++) {
		ck_assert_uint_eq(v[i]->bytes, 2 * MIB);
		if (!host_has_huge)
			ck_assert(!v[i]->hugetlb);
		ck_assert(all_zero(v[i]));
	}
	put_back(p, v, n);
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

	n = take_ok(p, UID_A, 2 * MIB, &v);
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
	put_back(p, v, n);
	pool_free(p);
}
END_TEST

START_TEST(test_chunks_are_prefaulted)
{
	struct pool *p = new_pool(2 * MIB, 1);
	unsigned char vec[2 * MIB / 4096];
	struct chunk **v = NULL;
	size_t n = 0;

	n = take_ok(p, UID_A, 2 * MIB, &v);
	ck_assert_int_eq(mincore(v[0]->addr, 2 * MIB, vec), 0);
	for (size_t i = 0; i < sizeof(vec); i++)
		ck_assert_msg(vec[i] & 1, "page %zu not resident", i);
	put_back(p, v, n);
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

	n = take_ok(p, UID_A, 5 * MIB + 8 * KIB, &v);
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
	put_back(p, v, n);
	assert_books(p, 4 * MIB, 4 * MIB, 2);
	pool_free(p);
}
END_TEST

START_TEST(test_take_smaller_than_a_chunk_is_one_tail)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct chunk **v = NULL;
	size_t n = 0;

	ck_assert_int_eq(pool_grow(p, 4 * MIB, NULL, NULL), 0);
	n = take_ok(p, UID_A, 64 * KIB, &v);
	ck_assert_uint_eq(n, 1);
	ck_assert(v[0]->tail);
	ck_assert_uint_eq(v[0]->bytes, 64 * KIB);
	ck_assert_uint_eq(pool_idle_bytes(p), 4 * MIB);
	ck_assert_uint_eq(pool_resident_bytes(p), 4 * MIB + 64 * KIB);
	put_back(p, v, n);
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
	assert_books(p, 8 * MIB, 8 * MIB, 4);
	ck_assert_int_eq(pool_grow(p, 6 * MIB, NULL, NULL), 0); /* already there */
	ck_assert_uint_eq(pool_chunk_count(p), 4);

	n = take_ok(p, UID_A, 3 * MIB, &v);
	assert_books(p, 6 * MIB, 9 * MIB, 5);
	put_back(p, v, n);
	assert_books(p, 8 * MIB, 8 * MIB, 4);

	/* Larger than the idle pool: idle chunks first, then new ones. */
	n = take_ok(p, UID_A, 12 * MIB, &v);
	ck_assert_uint_eq(n, 6);
	ck_assert_uint_eq(pool_idle_bytes(p), 0);
	ck_assert_uint_eq(pool_resident_bytes(p), 12 * MIB);
	put_back(p, v, n);
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

	n = take_ok(p, UID_A, 2 * MIB, &v);
	ino_a = inode_of(v[0]);
	memset(v[0]->addr, 0xA5, v[0]->bytes);
	put_back(p, v, n);
	ck_assert_uint_eq(pool_idle_bytes(p), 2 * MIB);

	n = take_ok(p, UID_B, 2 * MIB, &v);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_ne(inode_of(v[0]), ino_a);
	ck_assert_uint_eq(v[0]->owner_uid, UID_B);
	ck_assert(all_zero(v[0]));
	/* A's chunk was replaced, not kept alongside: the pool holds no more than before. */
	assert_books(p, 0, 2 * MIB, 1);
	put_back(p, v, n);
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
	n = take_ok(p, UID_A, 2 * MIB, &v);
	ino_a = inode_of(v[0]);
	put_back(p, v, n);
	n = take_ok(p, UID_A, 2 * MIB, &v);
	ck_assert_uint_eq(inode_of(v[0]), ino_a);
	put_back(p, v, n);
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
	n = take_ok(p, UID_A, 4 * MIB + 4 * KIB, &v); /* two full chunks and a tail */
	ck_assert_uint_eq(n, 3);
	ck_assert_uint_eq(pool_idle_bytes(p), 2 * MIB);
	/* The other uid's view: a dup of each full chunk's fd, as a mapping or a passed fd would keep it. */
	for (int i = 0; i < 2; i++) {
		kept[i] = dup(v[i]->fd);
		ck_assert_int_ge(kept[i], 0);
		kept_ino[i] = inode_of(v[i]);
		v[i]->tainted = true;
	}
	put_back(p, v, n);
	/* Gone, both full chunks and the tail: only the never-lent chunk is left, and nothing is lent. */
	ck_assert_uint_eq(pool_tainted_destroyed(p), 2);
	assert_books(p, 2 * MIB, 2 * MIB, 1);

	/* The same uid asks again: fresh pages, none of the kept ones, and writes through a kept fd reach none. */
	n = take_ok(p, UID_A, 4 * MIB, &v);
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
	put_back(p, v, n);
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

	na = take_ok(p, UID_A, 2 * MIB, &a);
	nb = take_ok(p, UID_B, 2 * MIB, &b);
	ino_a = inode_of(a[0]);
	ino_b = inode_of(b[0]);
	pool_put(p, a, na);
	pool_put(p, b, nb);
	free(a);
	free(b);
	ck_assert_int_eq(pool_grow(p, 6 * MIB, NULL, NULL), 0); /* one never-lent chunk */
	ck_assert_uint_eq(pool_chunk_count(p), 3);

	/* A asks for two: its own, then the never-lent one; B's stays for B. */
	n = take_ok(p, UID_A, 4 * MIB, &v);
	ck_assert_uint_eq(n, 2);
	ck_assert_uint_eq(inode_of(v[0]), ino_a);
	ck_assert_uint_ne(inode_of(v[1]), ino_b);
	ck_assert_uint_eq(pool_idle_bytes(p), 2 * MIB);
	put_back(p, v, n);

	n = take_ok(p, UID_B, 2 * MIB, &v);
	ck_assert_uint_eq(inode_of(v[0]), ino_b);
	put_back(p, v, n);
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
	assert_books(p, 2 * MIB, 2 * MIB, 1);
	/* What the idle list can cover alone still works. */
	n = take_ok(p, UID_A, 2 * MIB, &v);
	put_back(p, v, n);
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
	n = take_ok(p, UID_A, 2 * MIB, &v);
	ck_assert_uint_eq(pool_shrink(p, 3 * MIB), 6 * MIB);
	ck_assert_uint_eq(pool_idle_bytes(p), 2 * MIB);
	ck_assert_uint_eq(pool_shrink(p, 3 * MIB), 0);
	ck_assert_uint_eq(pool_shrink(p, 0), 2 * MIB);
	ck_assert_uint_eq(pool_idle_bytes(p), 0);
	/* Lent chunks are untouched. */
	ck_assert_uint_eq(pool_resident_bytes(p), 2 * MIB);
	ck_assert_uint_eq(pool_chunk_count(p), 1);
	put_back(p, v, n);
	pool_free(p);
}
END_TEST

START_TEST(test_shrink_drops_uid_owned_chunks_before_never_lent_ones)
{
	struct pool *p = new_pool(2 * MIB, 1);
	struct chunk **v = NULL;
	ino_t ino_a;
	size_t n = 0;

	n = take_ok(p, UID_A, 2 * MIB, &v);
	ino_a = inode_of(v[0]);
	ck_assert_int_eq(pool_grow(p, 2 * MIB, NULL, NULL), 0);
	put_back(p, v, n);
	ck_assert_uint_eq(pool_idle_bytes(p), 4 * MIB);
	ck_assert_uint_eq(pool_shrink(p, 2 * MIB), 2 * MIB);
	/* The survivor is the never-lent one (it serves anybody); A, asking again, gets that one. */
	n = take_ok(p, UID_A, 2 * MIB, &v);
	ck_assert_uint_ne(inode_of(v[0]), ino_a);
	ck_assert_uint_eq(pool_chunk_count(p), 1);
	put_back(p, v, n);
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

	n = take_ok(p, UID_A, 64 * MIB, &v);
	ck_assert_uint_eq(n, 32);
	for (size_t i = 0; i < n; i++) {
		ck_assert_uint_eq(v[i]->bytes, 2 * MIB);
		inos[i] = inode_of(v[i]);
		for (size_t j = 0; j < i; j++) {
			ck_assert_uint_ne(inos[i], inos[j]);
			ck_assert_uint_ne(v[i]->id, v[j]->id);
		}
	}
	put_back(p, v, n);
	pool_free(p);
}
END_TEST

START_TEST(test_large_take_from_empty_pool_uses_threads_and_is_exact)
{
	struct pool *p = new_pool(2 * MIB, 2);
	struct chunk **v = NULL;
	uint64_t sum = 0;
	size_t n = 0;

	n = take_ok(p, UID_A, 64 * MIB + 12 * KIB, &v);
	ck_assert_uint_eq(n, 33);
	for (size_t i = 0; i < n; i++) {
		sum += v[i]->bytes;
		ck_assert_int_eq(v[i]->tail, i == n - 1);
	}
	ck_assert_uint_eq(sum, 64 * MIB + 12 * KIB);
	put_back(p, v, n);
	ck_assert_uint_eq(pool_idle_bytes(p), 64 * MIB);
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
	put_back(p, v, n);
	/* A node the pool does not place on asks for nothing in particular: served from node 0. */
	ck_assert_int_eq(pool_take_on(p, UID_A, 2 * MIB, 7, &v, &n), 0);
	ck_assert_int_eq(v[0]->node, 0);
	put_back(p, v, n);
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
	put_back(p, v, n);
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
	put_back(p, v, n);
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

/* ------------------------------------------------------------ the broker's plans carried out */

/* The host's huge pages ran out: what fallocate says of a hugetlb memfd then (hugetlbfs, "ENOSPC: no free pages"). */
static int no_huge_pages(int fd, uint64_t bytes)
{
	(void)fd;
	(void)bytes;
	return -ENOSPC;
}

/* A broker over pool p (as main.c wires one), 64 MiB of budget, nothing lent. */
static struct broker *broker_on(struct pool *p)
{
	struct daemon *d = calloc(1, sizeof(*d));
	struct broker *b = &d->broker;

	ck_assert_ptr_nonnull(d);
	ck_assert_int_eq(budget_new(64 * MIB, 0, &b->budget), 0);
	ck_assert_int_eq(lease_table_new(&b->leases), 0);
	daemon_of(b)->pool = p;
	b->max_no_revoke_per_uid_bytes = 32 * MIB;
	(void)broker_set_pressure(b, BROKER_NORMAL);
	return b;
}

static void broker_off(struct broker *b)
{
	for (struct lease *l = lease_first(b->leases), *next; l; l = next) {
		next = lease_next(b->leases, l);
		daemon_free_lease(b, l);
	}
	lease_table_free(b->leases);
	budget_free(b->budget);
	pool_free(daemon_of(b)->pool);
	free(daemon_of(b));
}

/*
 * hugetlb = yes is "huge pages or fail": when they run out the take fails with the kernel's ENOSPC, and the acquire
 * is a failure the client is told about (REFUSAL_FAILED, -ENOSPC), not the budget's refusal, which would queue it
 * for memory the budget has. hugetlb = auto falls back to 4 KiB pages instead.
 */
START_TEST(test_hugetlb_yes_pages_that_run_out_fail_the_acquire_and_auto_falls_back)
{
	struct pool_opts o = { .hugetlb = POOL_HUGETLB_YES, .proc_root = fake_proc(8), .huge_alloc = no_huge_pages };
	struct acquire_args a = { .uid = UID_A, .gid = UID_A, .size = 4 * MIB, .numa_node = -1, .now_ms = 1 };
	struct chunk **v = NULL;
	struct broker *b;
	struct pool *p = NULL;
	struct lease *l = NULL;
	size_t n = 0;
	int err = 0;

	ck_assert_int_eq(pool_new(&o, &p), 0);
	ck_assert(pool_hugetlb(p));
	ck_assert_int_eq(pool_take(p, UID_A, 4 * MIB, &v, &n), -ENOSPC);
	ck_assert_uint_eq(pool_resident_bytes(p), 0);
	b = broker_on(p);
	ck_assert_int_eq(daemon_acquire(b, &a, &l, &err), REFUSAL_FAILED);
	ck_assert_int_eq(err, -ENOSPC);
	ck_assert_ptr_null(l);
	ck_assert_uint_eq(budget_leased(b->budget), 0);
	ck_assert_uint_eq(lease_count(b->leases), 0);
	/* Not a verdict a waiting acquire could wait out: answered at once. */
	ck_assert_int_eq(waitq_order_verdict(REFUSAL_FAILED), WAITQ_ANSWERED);
	broker_off(b);

	o.hugetlb = POOL_HUGETLB_AUTO;
	ck_assert_int_eq(pool_new(&o, &p), 0);
	b = broker_on(p);
	ck_assert_int_eq(daemon_acquire(b, &a, &l, &err), REFUSAL_NONE);
	ck_assert_uint_eq(l->nchunks, 2);
	for (size_t i = 0; i < l->nchunks; i++)
		ck_assert(!l->chunks[i].mem->hugetlb);
	broker_off(b);
	unfake_proc();
}
END_TEST

/*
 * One uid, two tenants (pid namespaces or cgroups): released chunks stay warm for their tenant only, and a lease
 * that ended without a release (its connection closed) gives its chunks to nobody.
 */
START_TEST(test_acquires_reuse_chunks_within_a_tenant_and_a_dropped_lease_is_not_pooled)
{
	struct broker *b = broker_on(new_pool(2 * MIB, 1));
	struct acquire_args a = {
		.uid = UID_A, .gid = UID_A, .pid = 7, .size = 4 * MIB, .numa_node = -1, .tenant = 11, .now_ms = 1
	};
	struct pool_tenant_bytes tb;
	struct lease *l = NULL;
	ino_t old[2];
	int err = 0;

	ck_assert_int_eq(daemon_acquire(b, &a, &l, &err), REFUSAL_NONE);
	for (size_t i = 0; i < 2; i++)
		old[i] = inode_of(l->chunks[i].mem);
	l->released = true; /* its holder's RELEASE */
	daemon_free_lease(b, l);
	ck_assert_uint_eq(pool_idle_bytes(daemon_of(b)->pool), 4 * MIB);
	/* The same tenant: the same chunks, warm. */
	ck_assert_int_eq(daemon_acquire(b, &a, &l, &err), REFUSAL_NONE);
	ck_assert(inode_of(l->chunks[0].mem) == old[0] || inode_of(l->chunks[0].mem) == old[1]);
	l->released = true;
	daemon_free_lease(b, l);
	/* Another tenant of the same uid: fresh chunks, the idle ones replaced (the pool holds no more). */
	a.tenant = 12;
	ck_assert_int_eq(daemon_acquire(b, &a, &l, &err), REFUSAL_NONE);
	for (size_t i = 0; i < l->nchunks; i++)
		ck_assert(inode_of(l->chunks[i].mem) != old[0] && inode_of(l->chunks[i].mem) != old[1]);
	ck_assert_uint_eq(pool_idle_bytes(daemon_of(b)->pool), 0);
	pool_tenant_bytes(daemon_of(b)->pool, &tb);
	ck_assert_uint_eq(tb.replaced, 4 * MIB);
	/* Its connection closed (dropped): a clone(CLONE_VM) sibling may map it still, so its chunks are destroyed. */
	l->dropped = true;
	daemon_free_lease(b, l);
	ck_assert_uint_eq(pool_idle_bytes(daemon_of(b)->pool), 0);
	pool_tenant_bytes(daemon_of(b)->pool, &tb);
	ck_assert_uint_eq(tb.retired, 4 * MIB);
	broker_off(b);
}
END_TEST

CHECK_SUITE(pool_suite, "pool", "core", NULL, NULL, 60, test_new_rejects_chunk_size_not_a_page_multiple,
	    test_new_defaults_to_2mib_chunks_of_4k_pages, test_hugetlb_yes_without_huge_pages_is_not_supported,
	    test_hugetlb_mode_needs_chunks_of_2mib_multiples,
	    test_auto_hugetlb_falls_back_to_4k_chunk_when_huge_pages_run_out, test_chunk_is_sealed_against_resize,
	    test_chunks_are_prefaulted, test_take_rejects_zero_and_non_page_multiples,
	    test_take_sizes_are_exact_with_tail_for_remainder, test_take_smaller_than_a_chunk_is_one_tail,
	    test_counters_track_grow_take_put, test_chunk_released_by_one_uid_is_never_lent_to_another,
	    test_same_uid_gets_its_own_chunk_back, test_tainted_chunk_is_destroyed_on_put_and_never_lent_again,
	    test_take_prefers_own_then_never_lent_chunks, test_take_fails_atomically_when_fds_run_out,
	    test_grow_keeps_chunks_made_before_a_failure, test_shrink_releases_idle_down_to_keep,
	    test_shrink_drops_uid_owned_chunks_before_never_lent_ones,
	    test_grow_with_threads_makes_distinct_prefaulted_chunks,
	    test_large_take_from_empty_pool_uses_threads_and_is_exact, test_numa_placed_chunks_land_where_the_pool_says,
	    test_take_on_a_full_node_uses_idle_chunks_of_the_nearest_node_with_some,
	    test_without_placement_chunks_have_no_node, test_hugepages_target_adds_only_what_the_free_pages_lack,
	    test_hugetlb_yes_pages_that_run_out_fail_the_acquire_and_auto_falls_back,
	    test_acquires_reuse_chunks_within_a_tenant_and_a_dropped_lease_is_not_pooled)

CHECK_MAIN(pool_suite)

/* SPDX-License-Identifier: MIT */
/* What the pool's suites share: a fake proc root for the huge page counts, a 4 KiB pool, and reading a chunk back. */
#pragma once

#include <check.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pool.h"

#define KIB 1024ull
#define MIB (1024ull * KIB)
#define UID_A 1000
#define UID_B 1001

static char proc_root[PATH_MAX];

/* A fake proc root whose meminfo reports huge_free free huge pages. */
static inline const char *fake_proc(unsigned huge_free)
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

static inline void unfake_proc(void)
{
	char path[PATH_MAX + 32];

	snprintf(path, sizeof(path), "%s/proc/meminfo", proc_root);
	unlink(path);
	snprintf(path, sizeof(path), "%s/proc", proc_root);
	rmdir(path);
	rmdir(proc_root);
}

/* A pool of 4 KiB pages (thp off: these tests count 4 KiB pages; the THP ones make their own). */
static inline struct pool *new_pool(uint64_t chunk_bytes, unsigned threads)
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

static inline ino_t inode_of(const struct chunk *c)
{
	struct stat st;

	ck_assert_int_eq(fstat(c->fd, &st), 0);
	return st.st_ino;
}

/* Read through the memfd, as a client would (hugetlb chunks have no daemon mapping). */
static inline bool all_zero(const struct chunk *c)
{
	const unsigned char *b = mmap(NULL, c->bytes, PROT_READ, MAP_SHARED, c->fd, 0);
	bool zero = true;

	ck_assert(b != MAP_FAILED);
	for (uint64_t i = 0; i < c->bytes && zero; i++)
		zero = b[i] == 0;
	munmap((void *)b, c->bytes);
	return zero;
}

/* Takes bytes for uid, which must succeed: the chunks in *v, their count returned. */
static inline size_t take_ok(struct pool *p, uint32_t uid, uint64_t bytes, struct chunk ***v)
{
	size_t n = 0;

	ck_assert_int_eq(pool_take(p, uid, bytes, v, &n), 0);
	return n;
}

/* Gives the n chunks of v back to the pool and frees v. */
static inline void put_back(struct pool *p, struct chunk **v, size_t n)
{
	pool_put(p, v, n);
	free(v);
}

/* The pool's books: idle and resident bytes, and how many chunks it holds (a macro: a failure names the test's line). */
#define assert_books(p, idle, resident, chunks)                        \
	do {                                                           \
		ck_assert_uint_eq(pool_idle_bytes(p), (idle));         \
		ck_assert_uint_eq(pool_resident_bytes(p), (resident)); \
		ck_assert_uint_eq(pool_chunk_count(p), (chunks));      \
	} while (0)

/* SPDX-License-Identifier: MIT */
/* The warm pool: sealed, pre-faulted, mlocked memfd chunks, lent whole to one lease at a time. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define POOL_NO_OWNER ((uid_t)-1)

enum pool_hugetlb {
	POOL_HUGETLB_AUTO, /* hugetlb when the host has free huge pages */
	POOL_HUGETLB_YES,  /* hugetlb or fail */
	POOL_HUGETLB_NO,   /* 4 KiB pages, MADV_HUGEPAGE where shmem THP allows */
};

struct chunk {
	uint64_t id;
	int fd;           /* memfd, sealed against grow and shrink */
	void *addr;       /* the daemon's own mapping, mlocked */
	uint64_t bytes;
	uid_t owner_uid;  /* uid it was last lent to, POOL_NO_OWNER if never */
	bool hugetlb;
	bool tail;        /* made for one lease's remainder; destroyed on return */
	struct chunk *next; /* idle list link, owned by the pool */
};

struct pool_opts {
	uint64_t chunk_bytes;     /* multiple of the page size; default 2 MiB */
	enum pool_hugetlb hugetlb;
	unsigned threads;         /* pre-fault threads for large grows; 0 = number of CPUs, max 16 */
	const char *proc_root;    /* for /proc/meminfo HugePages_*; NULL = "/" */
	bool lock;                /* mlock chunks; false only for unprivileged tests */
};

struct pool;

/* Returns 0 and *ret, -EINVAL for a bad chunk size, -ENOTSUP when hugetlb=YES but none exist. */
int pool_new(const struct pool_opts *opts, struct pool **ret);
/* Unmaps and closes every idle chunk. Lent chunks must have come back first. */
void pool_free(struct pool *p);

uint64_t pool_page_size(const struct pool *p);
uint64_t pool_chunk_size(const struct pool *p);
bool pool_hugetlb(const struct pool *p);

/*
 * Add idle chunks until the idle pool holds at least bytes (rounded up to chunks),
 * pre-faulting and locking them in parallel threads. progress, if set, is called
 * from the calling thread with (done, total) bytes now and then.
 * Returns 0 or a negative errno (the chunks made so far stay).
 */
int pool_grow(struct pool *p, uint64_t bytes, void (*progress)(uint64_t done, uint64_t total, void *ud), void *ud);

/*
 * Take chunks covering exactly bytes (a multiple of the page size) for uid:
 * full chunks from the idle list (first those last lent to uid, then never-lent
 * ones; a chunk last lent to another uid is replaced by a fresh memfd so no uid
 * ever sees another's pages), new chunks when the idle list runs out, and one
 * tail chunk for a remainder smaller than a chunk.
 * *ret is a malloc'd array of *n chunk pointers. Returns 0, -EINVAL, or the errno
 * of a failed memfd_create/ftruncate/mmap/mlock (nothing is taken then).
 */
int pool_take(struct pool *p, uid_t uid, uint64_t bytes, struct chunk ***ret, size_t *n);

/* Give chunks back: full ones become idle, tails are destroyed. Does not free the array. */
void pool_put(struct pool *p, struct chunk **chunks, size_t n);

/* Destroy idle chunks until at most keep_bytes stay idle. Returns bytes released. */
uint64_t pool_shrink(struct pool *p, uint64_t keep_bytes);

uint64_t pool_idle_bytes(const struct pool *p);
/* Idle plus lent: all the memory the pool holds locked right now. */
uint64_t pool_resident_bytes(const struct pool *p);
size_t pool_chunk_count(const struct pool *p);

/*
 * Watchers for chunks coming and going (the fd store keeps every chunk memfd
 * across a daemon crash). Called from the calling thread, after the fact.
 */
struct pool_hooks {
	void (*created)(struct chunk *c, void *ud);
	void (*destroyed)(struct chunk *c, void *ud);
	void *ud;
};
void pool_set_hooks(struct pool *p, const struct pool_hooks *h);

/* Call fn for every idle chunk. */
void pool_foreach_idle(const struct pool *p, void (*fn)(const struct chunk *c, void *ud), void *ud);

/*
 * Adopt a chunk memfd kept from an earlier daemon instance: map and lock it
 * again (its pages are still resident), keep its id (later ids go above it).
 * idle: put it on the idle list; otherwise it counts as lent and *ret gets it.
 * Returns 0, or -EINVAL (not a sealed memfd of whole pages) / -errno.
 */
int pool_adopt(struct pool *p, int fd, uint64_t id, uid_t owner_uid, bool tail, bool idle, struct chunk **ret);

/* Chunk size for the page size in effect (4096 or 2 MiB) by probing the host. */
uint64_t pool_host_page_size(enum pool_hugetlb mode, const char *proc_root);

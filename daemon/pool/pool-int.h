/* SPDX-License-Identifier: MIT */
/*
 * The pool's private floors, shared by its four files. Calls run one way only, down the list:
 *   pool.c        the idle pool: take, put, grow, shrink, audit, adopt, and the books of them
 *   pool-chunk.c  making a chunk (memfd, seals, placement, pre-fault, mlock), checking and repairing punches
 *   pool-place.c  NUMA placement: which node a chunk goes on, where its pages landed, fallback nodes
 *   pool-pages.c  page kinds: huge page counts, THP collapse and its smaps check, pre-fault, pagemap
 * struct pool is visible to every floor (each keeps its own fields), but no floor calls one above it.
 */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "classes.h"
#include "numa.h"
#include "pool.h"
#include "warmseg.h"

#define PAGE_4K_BYTES 4096u
#define HUGE_2M_BYTES POOL_THP_BYTES
#define MAX_THREADS WARMSEG_THREADS_MAX
#define CHUNK_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

struct punch_count {
	uid_t uid;
	uint64_t n;
};

struct pool {
	uint64_t chunk_bytes;   /* the smallest class: chunk-size */
	struct classes classes; /* chunk_bytes * 2^k up to the largest class (core/classes.h) */
	bool simulate;          /* chunks left unpopulated and unlocked: tests of terabyte pools on small hosts */
	uint64_t page_bytes;
	bool hugetlb;              /* try MFD_HUGETLB first */
	bool hugetlb_required;     /* POOL_HUGETLB_YES: no fallback to 4 KiB pages */
	bool thp;                  /* collapse 4 KiB chunks to THP */
	int nodes[NUMA_MAX_NODES]; /* NUMA placement: the nodes chunks go on */
	size_t n_nodes;            /* 0: no placement */
	/* Per placement node (by index into nodes): chunks on it, idle ones, misplaced ones. Kept as they move. */
	uint64_t node_all[NUMA_MAX_NODES], node_idle[NUMA_MAX_NODES], node_misplaced[NUMA_MAX_NODES];
	bool lock;
	int (*huge_alloc)(int fd, uint64_t bytes); /* pool_opts.huge_alloc */
	unsigned threads;
	char memfd_name[POOL_MEMFD_NAME_MAX];

	struct chunk *idle[CLASSES_MAX];  /* per class, most recently returned first */
	uint64_t idle_count[CLASSES_MAX]; /* chunks on each idle list */
	uint64_t idle_bytes;
	uint64_t lent_bytes;
	size_t nchunks;     /* idle and lent */
	uint64_t thp_bytes; /* chunks (idle and lent) collapsed to THP; under id_lock while growing */
	uint64_t thp_failures;
	uint64_t thp_unverified; /* of thp_failures: collapse said yes, smaps said not PMD-mapped */
	uint64_t hugetlb_bytes;  /* hugetlb chunks, idle and lent; under id_lock while growing */

	pthread_mutex_t id_lock; /* chunk ids are handed out from grow threads */
	uint64_t next_chunk_id;
	struct pool_hooks hooks;
	struct pool_numa_hooks numa_hooks;

	struct chunk *all;        /* every chunk, idle and lent (all_next links) */
	struct chunk *audit_next; /* where the next pool_audit slice starts; NULL = at the head */
	int pagemap_fd;           /* /proc/self/pagemap, opened on first use; -2 = unavailable */
	pool_punch_fn punch_fn;
	void *punch_ud;
	uint64_t punched;
	uint64_t tainted_destroyed;     /* chunks destroyed on return because another uid had mapped them */
	uint64_t tenant_replaced_bytes; /* idle chunks of another tenant destroyed for a take's fresh ones */
	uint64_t retired_bytes;         /* chunks destroyed on return: their lease ended without a release */
	struct punch_count *punched_uid;
	size_t npunched_uid;
};

/* ---- pages (pool-pages.c): no pool state, only addresses, fds and /proc. */

/* HugePages_Free from <proc_root>/proc/meminfo, parsed as the monitor parses it; 0 when it can't tell. */
uint64_t pages_huge_free(const char *proc_root);
/*
 * A 4 KiB-page chunk mapped at a 2 MiB boundary, so its THPs (if any) are PMD-mapped here: over-reserve
 * address space, map the memfd inside it, trim the rest. NULL (errno set) on failure.
 */
void *pages_map_aligned(int fd, uint64_t bytes);
/* Collapse a resident range into THPs. Returns true when the whole range is THP-backed. */
bool pages_collapse(void *addr, uint64_t bytes);
/* Whether this kernel collapses shmem into THP: one 2 MiB memfd, tried and thrown away. */
bool pages_thp_supported(void);
/* /proc/self/smaps, whole, in a malloc'd buffer (*len bytes); NULL when it cannot be read. */
char *pages_read_smaps(size_t *len);
/* Fault every page of the range in writable now. Returns 0 or -errno. */
int pages_prefault(void *addr, uint64_t bytes, uint64_t page_bytes);
/*
 * Bytes of the range that this process's mapping has no page for (neither present nor swapped), from
 * /proc/self/pagemap; *pagemap_fd is opened on first use (-1: not yet, -2: unavailable). 0 when it can't tell.
 */
uint64_t pages_unmapped(int *pagemap_fd, const void *addr, uint64_t bytes);

/* ---- placement (pool-place.c): NUMA nodes, calling only pages. */

/* The index of node in p->nodes, or -1. */
int place_slot(const struct pool *p, int node);
/* node if chunks are placed on it, else -1 (any): a node the pool does not place on is no request. */
int place_node(const struct pool *p, int node);
/* Whether chunk c counts as on node (-1, or no placement: every chunk does). */
bool place_on_node(const struct pool *p, const struct chunk *c, int node);
/*
 * The nodes whose idle chunks serve a take for node, into out[] (room for NUMA_MAX_NODES): node itself,
 * then, when node's free memory cannot hold short_bytes of fresh chunks and keep a reserve, the nodes the
 * numa hooks say stand in for it, nearest first. Returns the count (1 without a node or hooks).
 */
size_t place_take_nodes(const struct pool *p, int node, uint64_t short_bytes, int *out);
/* Prefer node for the range's pages from now on (shmem keeps the policy with the file). 0 or -errno. */
int place_prefer_range(void *addr, uint64_t bytes, int node);
/* Prefer node for this thread's allocations (hugetlb's fallocate), or back to the default (node < 0). */
void place_prefer_thread(int node);
/* Set c->node, c->mixed and c->misplaced (made for want, -1: none) from where its pages are. */
void place_locate(struct chunk *c, int want);

/* ---- chunks (pool-chunk.c): making, adopting, checking and repairing one chunk; calls placement and pages. */

/* Add (sign 1) or remove (-1) c from the page-kind and node counters. Grow threads hold id_lock. */
void chunk_count_kind(struct pool *p, const struct chunk *c, int sign);
/*
 * Make n chunks of sizes[i] into out[i] (NULL where not made), in parallel for large batches; the one at
 * tail_index (n: none) is a tail. Returns 0 or the first error; made chunks stay in out, counted.
 */
int chunk_make_batch(struct pool *p, const uint64_t *sizes, size_t n, size_t tail_index, uid_t owner_uid, int node,
		     struct chunk **out, void (*progress)(uint64_t, uint64_t, void *), void *ud);
/* Unmap and close c and free it (its counters are the caller's). */
void chunk_destroy(struct chunk *c);
/* After a warm-up batch: collapsed chunks that smaps shows not wholly PMD-mapped count as 4 KiB pages. */
void chunk_verify_collapsed(struct pool *p, struct chunk **v, size_t n);
/*
 * Check c. A punched chunk is counted and reported once until it is whole again,
 * and repaired when repair is set. Returns 0 when c was whole, 1 when it was
 * punched and is whole again, or -EIO when pages are still missing.
 */
int chunk_check(struct pool *p, struct chunk *c, bool repair);
/*
 * A chunk from a kept memfd (pool_adopt): checked to be a sealed memfd of whole pages, mapped and locked
 * again, its id kept (later ids go above it), located. Not yet counted or linked. The fd stays the
 * caller's on failure. Returns 0 and *ret, -EINVAL or -errno.
 */
int chunk_adopt(struct pool *p, int fd, uint64_t id, uid_t owner_uid, bool tail, bool idle, struct chunk **ret);

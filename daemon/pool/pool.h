/* SPDX-License-Identifier: MIT */
/* The warm pool: sealed, pre-faulted, mlocked memfd chunks, lent whole to one lease at a time. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "classes.h"

struct lease_chunk;
struct pool_view;

#define POOL_NO_OWNER ((uid_t)-1)

enum pool_hugetlb {
	POOL_HUGETLB_AUTO, /* hugetlb when the host has free huge pages */
	POOL_HUGETLB_YES,  /* hugetlb or fail */
	POOL_HUGETLB_NO,   /* 4 KiB pages, MADV_HUGEPAGE where shmem THP allows */
};

/* The size of a shmem THP: chunks collapse in these units. */
#define POOL_THP_BYTES (UINT64_C(2) << 20)

/* Collapsing 4 KiB chunks into shmem THPs (MADV_COLLAPSE, Linux 6.1+): huge pages with no reservation. */
enum pool_thp {
	POOL_THP_AUTO, /* collapse where the kernel can, when the pool is not on hugetlb */
	POOL_THP_YES,  /* the kernel must be able to (else pool_new fails), when not on hugetlb */
	POOL_THP_NO,
};

struct chunk {
	uint64_t id;
	int fd;     /* memfd, sealed against grow and shrink */
	void *addr; /* the daemon's own mapping, mlocked */
	uint64_t bytes;
	uid_t owner_uid; /* uid it was last lent to, POOL_NO_OWNER if never */
	/*
	 * The tenant (core/tenant.h: uid, pid namespace, cgroup) it was last lent to: only that tenant is handed it
	 * again; TENANT_NONE (0) after a restart, which no peer is.
	 */
	uint64_t owner_tenant;
	bool hugetlb;
	bool thp;       /* 4 KiB shmem collapsed into 2 MiB THPs (mapped PMD-aligned) */
	int node;       /* the NUMA node its (first) pages are on, checked with move_pages; -1 without placement */
	bool mixed;     /* its pages are on more than one node */
	bool misplaced; /* made for another node than it landed on (that node was full or is not there) */
	bool tail;      /* made for one lease's remainder; destroyed on return */
	/*
	 * Its fd went to another uid (a shared lease's attacher), set before the fd left the daemon.
	 * That uid may keep a view past its release (mremap, fork, a passed-on fd, map_files), so the
	 * chunk is destroyed on return like a tail, never pooled again for anyone.
	 */
	bool tainted;
	/*
	 * Its lease ended without every mapper letting go by a request (a connection closed, a process exited, an
	 * enforcement or an admin took it): a clone(CLONE_VM) sibling of the holder, or a child it forked, may map
	 * it still. Destroyed on return like a tainted chunk.
	 */
	bool retired;
	bool punched;                      /* found with pages missing and not yet repaired (counted once) */
	uint64_t lease_id;                 /* the lease it is lent to, for reports; 0 while idle or unknown */
	dev_t st_dev;                      /* its memfd's device and inode, for the restart state's lines: */
	ino_t st_ino;                      /* 0 until first asked (restart-journal.c), fixed for its life */
	struct chunk *next;                /* idle list link, owned by the pool */
	struct chunk *all_prev, *all_next; /* every chunk, idle and lent, for the audit */
};

struct pool_opts {
	uint64_t chunk_bytes; /* the smallest chunk class, a multiple of the page size; default 2 MiB */
	/* The largest class: classes are chunk_bytes * 2^k up to it (core/classes.h); 0 or chunk_bytes: one class. */
	uint64_t chunk_max_bytes;
	/*
	 * Test only: chunks are memfds of their size but never faulted, collapsed or locked, and the audit finds no
	 * punch in them, so a terabyte pool fits a small test host. Clients must not touch them either.
	 */
	bool simulate;
	enum pool_hugetlb hugetlb;
	enum pool_thp thp;
	unsigned threads;      /* warm-up threads for large grows; 0: the cores in our affinity mask, at most 32 */
	const char *proc_root; /* for /proc/meminfo HugePages_*; NULL = "/" */
	bool lock;             /* mlock chunks; false only for unprivileged tests */
	/*
	 * NUMA nodes chunks are placed on (mbind MPOL_PREFERRED before any page is faulted); n_nodes 0: no placement.
	 */
	const int *nodes;
	size_t n_nodes;
	/* memfd name of every chunk (NULL: POOL_MEMFD_NAME); what a restarted daemon looks for in /proc (restart.c). */
	const char *memfd_name;
	/*
	 * Test only: stands in for the fallocate(2) that allocates a hugetlb chunk's pages, returning 0 or a negative
	 * errno, so a suite can run the host out of huge pages (-ENOSPC) whatever it has; NULL: fallocate.
	 */
	int (*huge_alloc)(int fd, uint64_t bytes);
};

/* The default chunk memfd name; the daemon appends its socket's tag (restart.h) so that instances differ. */
#define POOL_MEMFD_NAME "pinbroker-chunk"
/* memfd_create(2) takes names of up to 249 bytes; ours stay far shorter. */
#define POOL_MEMFD_NAME_MAX 64

struct pool;

/*
 * Returns 0 and *ret, -EINVAL for a bad chunk size, -ENOTSUP when hugetlb=YES but none exist,
 * -EOPNOTSUPP when thp=YES on a 4 KiB pool but the kernel cannot collapse shmem.
 */
int pool_new(const struct pool_opts *opts, struct pool **ret);
/* Unmaps and closes every idle chunk. Lent chunks must have come back first. */
void pool_free(struct pool *p);

uint64_t pool_page_size(const struct pool *p);
/* The smallest chunk class (chunk-size). */
uint64_t pool_chunk_size(const struct pool *p);
/* The chunk classes, smallest first. */
const struct classes *pool_classes(const struct pool *p);
/* The largest chunk class. */
uint64_t pool_chunk_max(const struct pool *p);
/* Whether bytes is the size of a chunk class (what an idle chunk may be). */
bool pool_is_class(const struct pool *p, uint64_t bytes);
/* Chunks a lease of bytes (a multiple of the page size) takes: greedy over the classes, one tail. */
uint64_t pool_chunks_for(const struct pool *p, uint64_t bytes);
/*
 * Raise the largest class to max_bytes (the limits plan, rlimits.c): classes are only ever added, so every
 * chunk the pool holds stays of a class. Returns 0, or -EINVAL when max_bytes is below the largest now.
 */
int pool_raise_chunk_max(struct pool *p, uint64_t max_bytes);
/* Threads that make chunks for a large batch (warm-up): pool_opts.threads, resolved. */
unsigned pool_threads(const struct pool *p);
/* Chunks are left unpopulated and unlocked (pool_opts.simulate). */
bool pool_simulated(const struct pool *p);
/* Idle bytes of class k (pool_classes' index). */
uint64_t pool_idle_class_bytes(const struct pool *p, unsigned k);
bool pool_hugetlb(const struct pool *p);
/* Chunks are collapsed to THP (pool not on hugetlb, thp not "no", the kernel can). */
bool pool_thp(const struct pool *p);
/* Bytes of chunks (idle and lent) that are THP-collapsed now. */
uint64_t pool_thp_bytes(const struct pool *p);
/* Chunks whose collapse failed (they stay on 4 KiB pages). */
uint64_t pool_thp_failures(const struct pool *p);
/*
 * Of pool_thp_failures: chunks whose MADV_COLLAPSE returned 0 but whose mapping /proc/self/smaps then did
 * not show as wholly PMD-mapped (ShmemPmdMapped/FilePmdMapped below the chunk's size); they count as 4 KiB.
 * Checked for warm-up batches (pool_grow, pool_grow_on) only: an acquire's fresh chunks never read smaps.
 */
uint64_t pool_thp_unverified(const struct pool *p);

/*
 * For the fixture tests and the daemon's checks: the ShmemPmdMapped plus FilePmdMapped bytes of each VMA of
 * smaps text buf (len bytes) that starts at one of starts[] (n addresses, ascending), into pmd_bytes[i];
 * UINT64_MAX where no VMA starts there. Returns how many were found, or -EINVAL when buf has text but no
 * VMA header (not smaps).
 */
int pool_parse_smaps_pmd(const char *buf, size_t len, const uintptr_t *starts, size_t n, uint64_t *pmd_bytes);

/* Bytes of hugetlb chunks (idle and lent): the huge pages the pool holds, times 2 MiB. */
uint64_t pool_hugetlb_bytes(const struct pool *p);
/* "hugetlb", "thp" or "4k": what the pool's full chunks are made of. */
const char *pool_page_kind(const struct pool *p);

/*
 * Add idle chunks until the idle pool holds at least bytes, carved into classes as classes_warm_split
 * says (each class grown to its share, rounded up to its chunks), pre-faulting and locking them in parallel threads.
 * progress, if set, is called
 * from the calling thread with (done, total) bytes now and then.
 * Returns 0 or a negative errno (the chunks made so far stay).
 */
int pool_grow(struct pool *p, uint64_t bytes, void (*progress)(uint64_t done, uint64_t total, void *ud), void *ud);

/*
 * Take chunks covering exactly bytes (a multiple of the page size) for uid, the fewest the classes
 * allow (classes_split: largest first, one tail chunk for a remainder below the smallest class).
 * Each class's chunks come from its idle list (first those last lent to uid, then never-lent
 * ones; a chunk last lent to another uid is replaced by a fresh memfd so no uid
 * ever sees another's pages), new chunks of that class when its idle list runs out.
 * The array is largest chunks first, the tail last.
 * *ret is a malloc'd array of *n chunk pointers. Returns 0, -EINVAL, or the errno
 * of a failed memfd_create/ftruncate/mmap/mlock (nothing is taken then).
 */
int pool_take(struct pool *p, uid_t uid, uint64_t bytes, struct chunk ***ret, size_t *n);

/*
 * pool_take with a NUMA node (-1: any): idle chunks on that node first, fresh
 * ones placed there; the kernel places pages elsewhere only when the node is
 * full, which the chunks then say (node, mixed, misplaced). Without placement the node
 * is ignored.
 */
int pool_take_on(struct pool *p, uid_t uid, uint64_t bytes, int node, struct chunk ***ret, size_t *n);

/*
 * pool_take_on from the warm pool alone, for a host under pressure: the idle chunks there are, largest first
 * (smaller classes standing in for bigger ones that are not idle: more chunks, no new memory), each fresh chunk
 * replacing an idle one of its class (as pool_take_on's do), and a fresh tail below the smallest class.
 * Returns -EBUSY when the idle chunks cannot cover bytes, else as pool_take_on.
 */
int pool_take_warm_on(struct pool *p, uid_t uid, uint64_t bytes, int node, struct chunk ***ret, size_t *n);

/*
 * pool_take_on (warm: pool_take_warm_on) for a tenant of uid (core/tenant.h): an idle chunk is reused only when it
 * was last lent to the same uid and tenant; one of another tenant counts as another uid's (replaced by a fresh
 * memfd). pool_take_on and pool_take_warm_on are this with TENANT_NONE.
 */
int pool_take_tenant(struct pool *p, uid_t uid, uint64_t tenant, bool warm, uint64_t bytes, int node,
		     struct chunk ***ret, size_t *n);

/*
 * An acquire plan's take (core/broker.h, struct acquire_plan): counts[k] chunks of each class k and a tail of
 * tail_bytes (0: none, else below the smallest class), for (uid, tenant) on node, as pool_take_tenant takes
 * them once it has split the bytes. Returns as pool_take_on.
 */
int pool_take_split(struct pool *p, uid_t uid, uint64_t tenant, const uint64_t counts[CLASSES_MAX], uint64_t tail_bytes,
		    int node, struct chunk ***ret, size_t *n);

/* What the broker's decisions read of the pool now (core/broker.h), into *v; v->classes points into p. */
void pool_view(const struct pool *p, struct pool_view *v);

/* pool_grow for one NUMA node: idle chunks on node until they hold at least bytes. */
int pool_grow_on(struct pool *p, uint64_t bytes, int node, void (*progress)(uint64_t done, uint64_t total, void *ud),
		 void *ud);

/*
 * A warm-up in pieces, for one that runs beside the event loop (daemon/warmup.c). pool_grow_on is
 * pool_warm_plan, pool_make_warm and pool_add_warm of each chunk made.
 *
 * pool_warm_plan: the chunk sizes (largest first, a malloc'd *sizes of *n; none when the idle chunks on node
 * hold bytes already) that grow node's idle chunks to at least bytes, carved as pool_grow_on carves them.
 * Returns 0 or -errno. Event loop's thread.
 */
int pool_warm_plan(struct pool *p, uint64_t bytes, int node, uint64_t **sizes, size_t *n);
/*
 * Make chunks of sizes[] on node into out[] (NULL where not made), pre-faulted and locked in the pool's
 * threads; they are in no book of the pool (no idle bytes, no page-kind or node bytes, no hook) until
 * pool_add_warm. Any thread, beside the event loop's use of the pool. Returns 0 or the first error.
 */
int pool_make_warm(struct pool *p, const uint64_t *sizes, size_t n, int node, struct chunk **out,
		   void (*progress)(uint64_t done, uint64_t total, void *ud), void *ud);
/* A chunk of pool_make_warm joins the idle pool (and the books, and the created hook). Event loop's thread. */
void pool_add_warm(struct pool *p, struct chunk *c);
/* A chunk of pool_make_warm that is not wanted after all (the daemon stops, pressure came): destroyed. */
void pool_drop_warm(struct chunk *c);

/*
 * What the pool needs to know of the host's nodes to fall back (set by the daemon from its topology):
 * free_bytes: a node's free memory now (UINT64_MAX: unknown, taken as room); fallback: the other nodes
 * that stand in for node, nearest first (at most max ids into order[]; returns the count).
 */
struct pool_numa_hooks {
	uint64_t (*free_bytes)(int node, void *ud);
	size_t (*fallback)(int node, int *order, size_t max, void *ud);
	void *ud;
};
/*
 * With hooks set, pool_take_on for a node whose idle chunks fall short and whose free memory cannot hold
 * the fresh chunks (less than 256 MiB of it would be left) takes idle chunks of the
 * fallback nodes, nearest first, before making fresh ones; those chunks say their own node, so the lease
 * reads as misplaced. NULL clears them (then only the kernel's MPOL_PREFERRED fallback applies).
 */
void pool_set_numa_hooks(struct pool *p, const struct pool_numa_hooks *h);

/* Bytes of chunks on node: idle, lent, and misplaced (made for another node, idle or lent). */
struct pool_node_bytes {
	uint64_t idle, lent, misplaced;
};
void pool_node_bytes(const struct pool *p, int node, struct pool_node_bytes *ret);

/* Whether the pool places chunks on node. */
bool pool_places_on(const struct pool *p, int node);

/* The placement nodes (n_nodes 0: placement off). */
size_t pool_nodes(const struct pool *p, const int **nodes);

/*
 * Give chunks back: full ones become idle, tails and tainted chunks are destroyed (the pool
 * shrinks by them; a later take makes fresh ones). Does not free the array.
 * Each chunk is checked first (see pool_audit): a punched one is counted, reported
 * through the punch hook (its lease_id still set), and repaired before it goes idle,
 * or destroyed when it cannot be repaired.
 */
void pool_put(struct pool *p, struct chunk **chunks, size_t n);

/* c as a lease keeps it (core/lease.h): its handle, id, size, node and tail mark; not tainted. */
void pool_lease_chunk(struct chunk *c, struct lease_chunk *ret);

/*
 * A lease's chunks back (an ending lease's, or those broker_acquire_done did not take): each chunk takes its
 * lease_chunk's taint, and is retired (destroyed on return) when retire is set, then goes as pool_put puts it.
 * Does not free the array.
 */
void pool_put_lease(struct pool *p, const struct lease_chunk *chunks, size_t n, bool retire);

/* Chunks destroyed on return because another uid had mapped them (tainted), since pool_new. */
uint64_t pool_tainted_destroyed(const struct pool *p);

/*
 * Since pool_new: bytes of idle chunks destroyed because a take for another tenant would have reused them (it got
 * fresh memory in their place), and bytes of chunks destroyed on return because their lease ended without a
 * release (retired).
 */
struct pool_tenant_bytes {
	uint64_t replaced, retired;
};
void pool_tenant_bytes(const struct pool *p, struct pool_tenant_bytes *ret);

/* Destroy idle chunks until at most keep_bytes stay idle. Returns bytes released. */
uint64_t pool_shrink(struct pool *p, uint64_t keep_bytes);

uint64_t pool_idle_bytes(const struct pool *p);
/* Idle plus lent: all the memory the pool holds locked right now. */
uint64_t pool_resident_bytes(const struct pool *p);
size_t pool_chunk_count(const struct pool *p);
/*
 * Idle chunks destroyed, smallest class first, until the pool holds at most max_chunks chunks (lent ones
 * count and stay). Each chunk is an fd (and, off hugetlb, a mapping) of the daemon whether lent or idle: a
 * pool whose idle chunks are of classes nobody asks for any more must not crowd out the chunks a lease needs.
 * Returns how many went.
 */
size_t pool_trim_chunks(struct pool *p, size_t max_chunks);

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

/*
 * Hole punching. A holder may fallocate(FALLOC_FL_PUNCH_HOLE) its memfd: the
 * kernel frees those pages even though the daemon's mapping is mlocked, and a
 * later touch brings back fresh pages that are not locked (shmem), or takes new
 * huge pages from the free pool (hugetlb). No seal blocks it yet lets the holder
 * write: F_SEAL_WRITE and F_SEAL_FUTURE_WRITE forbid punching but also the
 * holder's writable mapping, and F_SEAL_SHRINK/GROW do not cover it. So the pool
 * detects it: st_blocks below the chunk size (pages freed, both page kinds), or,
 * for a locked shmem chunk, pages of the daemon's own mapping that are neither
 * present nor swapped in /proc/self/pagemap (freed, then touched again through
 * the holder's mapping only: st_blocks is whole again but the pages are not
 * locked). Repair puts every page back and locks it through the daemon's
 * mapping (hugetlb: fallocate); a hole reads as zeros either way, so the holder
 * sees no change.
 */

/*
 * Called once per detection with the chunk (owner_uid is the holder, lease_id
 * its lease where known) and how many bytes were missing, before any repair.
 */
typedef void (*pool_punch_fn)(const struct chunk *c, uint64_t missing_bytes, void *ud);
void pool_set_punch_hook(struct pool *p, pool_punch_fn fn, void *ud);

/*
 * Check the next chunks (idle and lent, round robin over every chunk the pool
 * holds) until max_bytes of them are checked, at least one: a bounded slice per
 * call, so a periodic caller covers the pool over several calls. A punched chunk
 * is counted, reported and repaired in place; an idle one that cannot be repaired
 * is destroyed, a lent one is tried again next time round. Returns the number of
 * chunks found punched.
 */
size_t pool_audit(struct pool *p, uint64_t max_bytes);

/* Chunks found punched since pool_new, in all and by the uid that held them. */
uint64_t pool_punched_count(const struct pool *p);
uint64_t pool_punched_count_uid(const struct pool *p, uid_t uid);

/* Call fn for every idle chunk. */
void pool_foreach_idle(const struct pool *p, void (*fn)(const struct chunk *c, void *ud), void *ud);
/* Every chunk the pool holds, idle, lent or set aside (recovery's quarantine), in no particular order. */
void pool_foreach_chunk(const struct pool *p, void (*fn)(const struct chunk *c, void *ud), void *ud);

/*
 * Adopt a chunk memfd kept from an earlier daemon instance: map and lock it
 * again (its pages are still resident), keep its id (later ids go above it).
 * idle: put it on the idle list; otherwise it counts as lent and *ret gets it.
 * Returns 0, or -EINVAL (not a sealed memfd of whole pages) / -errno.
 */
int pool_adopt(struct pool *p, int fd, uint64_t id, uid_t owner_uid, bool tail, bool idle, struct chunk **ret);

/* Chunk size for the page size in effect (4096 or 2 MiB) by probing the host. */
uint64_t pool_host_page_size(enum pool_hugetlb mode, const char *proc_root);

/*
 * The vm.nr_hugepages that leaves want_bytes of 2 MiB huge pages free for the pool, given the
 * host's nr_hugepages and free huge pages now: never lower than now (pages others hold stay theirs).
 */
uint64_t pool_hugepages_target(uint64_t want_bytes, uint64_t nr_now, uint64_t free_now);

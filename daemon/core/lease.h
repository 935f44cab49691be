/* SPDX-License-Identifier: MIT */
/* The lease table and each lease's state machine. Pure: no I/O. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct chunk;
struct job_cgroup;

/*
 * One chunk of a lease as the core knows it. mem is the pool's own chunk (its memfd and the daemon's mapping),
 * which the core never reads: the shell fills the rest when the pool hands the chunk over, and reads the taint
 * back when the lease ends.
 */
struct lease_chunk {
	struct chunk *mem;
	uint64_t id; /* the pool's chunk id, kept over restarts (the fd store's records name it) */
	uint64_t bytes;
	int node;   /* the NUMA node its (first) pages are on; -1 without placement */
	bool mixed; /* its pages are on more than one node */
	bool tail;  /* made for this lease's remainder: destroyed on return */
	/*
	 * Its fd went to another uid or tenant (broker_attach marks it before the fds are sent): that process may
	 * keep a view past its release, so the pool destroys the chunk on return, as it does a tail.
	 */
	bool tainted;
};

enum lease_priority {
	LEASE_PRIO_NORMAL = 0,
	LEASE_PRIO_CRITICAL = 1,    /* revoked last */
	LEASE_PRIO_BEST_EFFORT = 2, /* revoked first */
};

enum lease_state {
	LEASE_ACTIVE,   /* lent and in use by its client */
	LEASE_IDLE,     /* released into the client's cache: still mapped and counted, reclaimable first */
	LEASE_REVOKING, /* REVOKE sent; the client must let go before deadline_ms */
	LEASE_OVERDUE,  /* deadline passed; stays counted until the client lets go or dies */
	LEASE_ORPHANED, /* adopted from the fd store after a restart; awaits its client's re-declare */
	LEASE_FREED,    /* terminal: released, its chunks back in the pool */
	LEASE__STATE_MAX,
};

#define LEASE_LABEL_MAX 64
/* A share token: 128 random bits, so it cannot be guessed (hex on the wire). */
#define LEASE_TOKEN_BYTES 16
/* Uids one share may name besides the holder's: a grant, not a group database. */
#define LEASE_SHARE_UIDS_MAX 32

/* A connection that maps a lease through its share token (not its holder). */
struct lease_attacher {
	void *owner; /* the attached connection; opaque here */
	pid_t pid;
	uid_t uid;
};

/* Who may attach: set by lease_share, for the lease's life. */
struct lease_share {
	uint8_t token[LEASE_TOKEN_BYTES];
	size_t nuids;
	uid_t uids[LEASE_SHARE_UIDS_MAX]; /* besides the holder's uid, which is always allowed */
};

struct lease {
	uint64_t id;
	uid_t uid;
	gid_t gid;
	pid_t pid;
	void *owner;    /* the connection holding it; opaque here, NULL when orphaned */
	uint64_t bytes; /* exactly the request rounded up to the page size */
	enum lease_priority priority;
	enum lease_state state;
	char label[LEASE_LABEL_MAX];
	uint64_t created_ms;     /* monotonic */
	uint64_t last_used_ms;   /* last ACTIVE transition, for LRU */
	uint64_t deadline_ms;    /* monotonic, while REVOKING/OVERDUE */
	uint64_t reservation_id; /* the reservation it is a share of (reservation.h); 0: none */
	/*
	 * While REVOKING/OVERDUE: the revoke was started by the holder's own uid
	 * (not an admin, not pressure), so its enforcement never reaches a process
	 * of another uid (broker_enforce_may_signal).
	 */
	bool revoke_by_holder;
	struct lease_chunk *chunks; /* owned: freed by lease_remove (the pool's chunks they name are not) */
	int numa_node;              /* the NUMA node asked for, -1 for any */
	size_t nchunks;
	/*
	 * Sharing. The lease is charged once, to uid, and lives while any mapper
	 * does: its holder (owner), an attacher, or a process whose connection
	 * closed while it still ran (exit_holds, each released when that process
	 * exits; an enforcement round scanning for its mappers holds it too, until
	 * the round ends). holder_detached: the holder let go while attachers remained;
	 * owner is then NULL for good.
	 */
	struct lease_share *share;        /* owned; NULL until shared */
	struct lease_attacher *attachers; /* owned */
	size_t nattachers;
	uint32_t exit_holds;
	bool holder_detached;
	/*
	 * How the memory may be reused (broker_lease_reusable). tenant: the holder's (core/tenant.h), whose next leases
	 * may be handed the chunks. released: its last mapper let go by a request (RELEASE), after unmapping it.
	 * dropped: some mapper let go without one (its connection closed, its process exited): a clone(CLONE_VM)
	 * sibling or a forked child of it may still map the chunks. Only a released, never dropped lease's chunks
	 * go back to the pool; any other lease's are destroyed.
	 */
	uint64_t tenant;
	bool released;
	bool dropped;
	/*
	 * no_revoke: its holder cannot give memory back on request (a program run
	 * under the interposer), so it is never revoked and its holder never
	 * signalled. registration: a charge for memory the program owns and
	 * registered with CUDA itself: no chunks, never in the pool or the fd store;
	 * always no_revoke.
	 */
	bool no_revoke;
	bool registration;
	/* A staging ring (ACQUIRE_FLAG_STAGING_RING): a pool lease like any, counted apart for status and metrics. */
	bool staging_ring;
	/*
	 * A registration of a shared file mapping (backing.h): the file (dev, ino) and the offset of its first
	 * page. Registrations of one file are charged by the union of their pages, each page to the oldest
	 * registration covering it, so charged_bytes may be below bytes (0 for a rank whose pages were all
	 * registered already), and grows when an older registrant of the same pages goes.
	 */
	bool backed;
	uint64_t backing_dev, backing_ino, backing_offset;
	/* What the budget, the uid's never-revoked share and the job count for it: bytes unless backed. */
	uint64_t charged_bytes;
	/* The client cgroup it is charged to for job quotas (jobs.h); NULL: none (an orphan, a test). */
	struct job_cgroup *cgroup;
	/*
	 * Set by lease_add/lease_adopt and kept by the table: lease_set_state
	 * updates its per-state counters through it. NULL for a lease built
	 * outside a table (tests of the state machine). id, bytes and table must
	 * not be written while the lease is in a table.
	 */
	struct lease_table *table;
};

struct lease_table;

int lease_table_new(struct lease_table **ret);
/* Frees the table and any remaining lease structs (not their chunks). */
void lease_table_free(struct lease_table *t);

/*
 * Add a lease in state ACTIVE with a fresh id (never 0, never reused while the
 * daemon runs; ids start above start_id, see lease_table_set_next_id).
 * Takes ownership of chunks on success. label may be NULL; it is truncated
 * to fit. Returns 0 and *ret, -ENOSPC once ids are exhausted, or -ENOMEM.
 */
int lease_add(struct lease_table *t, uid_t uid, gid_t gid, pid_t pid, void *owner, uint64_t bytes,
	      enum lease_priority prio, const char *label, struct lease_chunk *chunks, size_t nchunks, uint64_t now_ms,
	      struct lease **ret);

/*
 * Re-insert a lease with a known id (fd-store recovery), in state ORPHANED;
 * ids may come in any order. Fresh ids from lease_add stay above it.
 * Returns 0 and *ret, -EINVAL for id 0, -EEXIST if the id is taken, or
 * -ENOMEM; on an error the table is unchanged and chunks stay the caller's.
 */
int lease_adopt(struct lease_table *t, uint64_t id, uid_t uid, uint64_t bytes, enum lease_priority prio,
		const char *label, struct lease_chunk *chunks, size_t nchunks, uint64_t now_ms, struct lease **ret);

/* Ids handed out from now on are > id. */
void lease_table_set_next_id(struct lease_table *t, uint64_t id);

/* The lease with this id, or NULL (id 0 is never a lease). O(1) expected. */
struct lease *lease_find(const struct lease_table *t, uint64_t id);

/*
 * The one place a state changes. Returns 0, or -EINVAL for an edge the
 * machine does not have (the lease is unchanged). Going to ACTIVE stamps
 * last_used_ms with now_ms. A lease in a table moves its bytes between
 * the table's per-state counters (O(1)).
 */
int lease_set_state(struct lease *l, enum lease_state to, uint64_t now_ms);
bool lease_edge_legal(enum lease_state from, enum lease_state to);
/*
 * The holder's library takes a never-revoked lease back into use from its
 * cache while a REVOKE for it (sent while it was idle) is on its way: the
 * lease goes back to ACTIVE, outside the edge table (which keeps "revoked
 * leases never come back" for every other lease). Returns 0, or -EINVAL for
 * a lease that is not no_revoke (or a registration) or not REVOKING/OVERDUE.
 */
int lease_cancel_revoke(struct lease *l, uint64_t now_ms);
/* A lease its holder marked idle that may be revoked: a no_revoke lease only while it is idle (cached). */
bool lease_revocable(const struct lease *l);

/*
 * Unlink and free a lease (any state) of table t. The chunks array is freed;
 * chunks are not. O(log n). Aborts if l is not in t: that is a daemon bug
 * that would otherwise leave a freed node reachable.
 */
void lease_remove(struct lease_table *t, struct lease *l);

/* Live leases in the table, in any state. O(1). */
size_t lease_count(const struct lease_table *t);

/*
 * How many leases are in state s now, and their bytes summed. O(1): the
 * table keeps the counters on every add, adopt, state change and remove.
 * 0 for an out-of-range s.
 */
size_t lease_state_count(const struct lease_table *t, enum lease_state s);
uint64_t lease_state_bytes(const struct lease_table *t, enum lease_state s);

/*
 * Iterate in id order, ascending:
 *   for (l = lease_first(t); l; l = lease_next(t, l))
 * or descending with lease_last/lease_prev. Each step is O(1). It is safe to
 * remove the current lease after fetching its neighbour; adding during a walk
 * is safe too (a lease_add lands at the end).
 */
struct lease *lease_first(const struct lease_table *t);
struct lease *lease_next(const struct lease_table *t, const struct lease *l);
struct lease *lease_last(const struct lease_table *t);
struct lease *lease_prev(const struct lease_table *t, const struct lease *l);

/*
 * The lease with the smallest id strictly greater than id (id 0: the first
 * lease), or NULL if there is none: a cursor for paging the lease list that
 * stays valid when the lease it names is removed meanwhile. O(1) expected
 * when id is live, O(log n) worst case otherwise.
 */
struct lease *lease_next_after(const struct lease_table *t, uint64_t id);

/*
 * Revocation order, as DESIGN.md sets it: best-effort first, then cached-idle,
 * then normal, then critical; within a class the largest first, then the least
 * recently used. Only ACTIVE and IDLE leases are candidates, and a no_revoke
 * one only while IDLE (lease_revocable).
 * *ret is a malloc'd array of *n leases. Returns 0 or -ENOMEM.
 */
int lease_revoke_order(const struct lease_table *t, struct lease ***ret, size_t *n);

/*
 * Share l: the first call sets its token (token: 128 random bits from the
 * caller) and links it for lease_find_token; later calls keep the first token
 * and only add uids. uids holds n more uids allowed to attach (duplicates and
 * the holder's own are dropped). Returns 0, -E2BIG if the union would pass
 * LEASE_SHARE_UIDS_MAX (l unchanged), -EEXIST if another lease has this
 * token, -ENOMEM, or -EINVAL for a lease outside a table.
 */
int lease_share(struct lease_table *t, struct lease *l, const uint8_t token[LEASE_TOKEN_BYTES], const uid_t *uids,
		size_t n);

/* The lease whose share token this is, or NULL. O(1) expected; tokens compare in constant time. */
struct lease *lease_find_token(const struct lease_table *t, const uint8_t token[LEASE_TOKEN_BYTES]);

/* True if uid may attach to l: l is shared and uid is its holder's or a granted one. */
bool lease_share_allows(const struct lease *l, uid_t uid);

/*
 * Record owner (a connection of pid, uid) as an attacher of l. Returns 0,
 * -EEXIST if owner already maps l (as its holder or an attacher), or -ENOMEM.
 */
int lease_attach(struct lease *l, void *owner, pid_t pid, uid_t uid);

/* The attacher entry of owner, or NULL. */
struct lease_attacher *lease_attacher_find(const struct lease *l, const void *owner);

/*
 * owner lets go of l: the holder (owner == l->owner) detaches and
 * holder_detached is set; an attacher is removed. Returns 0 or -ENOENT (owner
 * does not map l, l unchanged).
 */
int lease_detach(struct lease *l, const void *owner);

/* True once nobody maps l any more (no holder, attacher or exit hold): it must be freed. */
bool lease_unmapped(const struct lease *l);

const char *lease_state_name(enum lease_state s);
const char *lease_priority_name(enum lease_priority p);

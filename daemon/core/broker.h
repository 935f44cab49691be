/* SPDX-License-Identifier: MIT */
/* struct broker, the one state struct, and the broker's verbs linking budget, pool and leases (no I/O). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "classes.h"
#include "lease.h"
#include "pressure.h"
#include "refusal.h"
#include "settings.h"
#include "staged.h"
#include "unbrokered.h"

struct budget;
struct lease_table;
struct jobs;
struct backing_table;
struct tenants;
struct job_cgroup;
struct reservation;
struct reservations;

struct broker;
/* A listener of the freed-memory event: runs after leases were freed and the pool trimmed. */
typedef void broker_freed_fn(struct broker *b);
#define BROKER_FREED_LISTENERS_MAX 4

/* The metrics' reason label of a refusal (pinbroker_acquires_refused_total): broker_refusal_reason's groups. */
enum broker_refusal_reason {
	REFUSED_INVALID,
	REFUSED_TOO_LARGE,
	REFUSED_OVER_QUOTA,
	REFUSED_JOB_QUOTA,
	REFUSED_OVER_BUDGET,
	REFUSED_PRESSURE,
	REFUSED_CRITICAL,
	REFUSED_LIMIT,
	REFUSED_TIMEOUT,
	REFUSED_OTHER,
	REFUSED_N,
};

/* The metrics' reason for refusal why. */
enum broker_refusal_reason broker_refusal_reason(enum broker_refusal why);

/* What a grant lent, for the metrics' kind label. */
enum broker_grant {
	GRANTED_POOL,         /* pool memory, mapped through memfds */
	GRANTED_REGISTRATION, /* a charge for memory the program owns (ACQUIRE_FLAG_REGISTER_ONLY) */
	GRANTED_N,
};

/* Why a lease was revoked (revoker_revoke's callers), for the metrics' reason label. */
enum broker_revocation {
	REVOKED_PRESSURE,     /* host memory critical: reclaim */
	REVOKED_IDLE_RECLAIM, /* a cached-idle lease another client's acquire needs */
	REVOKED_ADMIN,        /* pinctl revoke by an admin */
	REVOKED_SELF,         /* pinctl revoke of a uid's own leases by that uid */
	REVOKED_JOB_QUOTA,    /* pinctl quota set|clear --revoke */
	REVOKED_N,
};

/* Why a never-revoked lease's revoke was cancelled (lease_cancel_revoke's callers), for the metrics' reason label. */
enum broker_revoke_cancel {
	CANCELLED_REUSED,         /* its library took it back into use from its cache (SET_IDLE 0) */
	CANCELLED_NOT_GIVEN_BACK, /* neither given back nor taken back by the deadline: kept as in use */
	CANCELLED_N,
};

/* What was done to an overdue holder (revoke-enforce), for the metrics' action label. */
enum broker_enforcement {
	ENFORCED_DISCONNECT,
	ENFORCED_SIGTERM,
	ENFORCED_SIGKILL,
	ENFORCED_N,
};

/* Loop-turn histogram bounds: the goal is no turn over 20 ms under a revoke storm. */
#define BROKER_TURN_BUCKETS 6
#define BROKER_TURN_BUCKET_US                             \
	{                                                 \
		1000, 5000, 20000, 50000, 100000, 1000000 \
	}

/* Counters since start, for the metrics. */
struct broker_counters {
	uint64_t granted[GRANTED_N]; /* leases granted, by kind */
	uint64_t granted_bytes[GRANTED_N];
	uint64_t refused[REFUSED_N];
	uint64_t revocations[REVOKED_N];   /* REVOKEs sent, by reason */
	uint64_t enforcements[ENFORCED_N]; /* overdue holders disconnected or signalled, by action */
	uint64_t holder_scans;             /* /proc scans for processes mapping overdue leases (one per round) */
	uint64_t job_unknown;              /* acquires of clients whose job could not be read, while rules existed */
	uint64_t loop_turn_max_us;         /* the longest loop turn (all callbacks of one iteration) since start */
	uint64_t loop_turns[BROKER_TURN_BUCKETS +
			    1]; /* turns by length: <= each of BROKER_TURN_BUCKET_US, then longer */
	uint64_t loop_turn_sum_us;
	uint64_t revokes_cancelled[CANCELLED_N]; /* never-revoked leases' revokes cancelled, by reason */
};

/*
 * The core's state: what the decisions read and write, and nothing of the I/O shell. The shell's struct daemon
 * (daemon/daemon.h) holds it beside the pool, the server and the other objects that act.
 */
struct broker {
	struct budget *budget;
	struct lease_table *leases;
	struct jobs *jobs; /* per-job quotas; NULL: none (the fuzz harness) */
	/* The connections' tenants (core/tenant.h), the server's: who may see or revoke whose leases of one uid */
	const struct tenants *tenants;

	uint64_t mem_total_bytes;        /* MemTotal, or the cgroup limit if lower */
	uint64_t host_mem_total_bytes;   /* MemTotal itself, what caps clients' unbrokered reports; 0: unknown */
	uint64_t budget_cap_bytes;       /* the most the budget resolves to; 0 = no cap (the fuzz harness sets one) */
	uint64_t budget_bytes;           /* resolved from cfg */
	struct broker_settings settings; /* the config values decided with here (settings.h) */
	uint64_t uid_quota_bytes;
	uint64_t max_no_revoke_per_uid_bytes;
	/*
	 * max-registrants-per-file: registrations of one shared file recorded as its registrants (backing.h's work
	 * per call grows with the square of their number); beyond this many, a registration of the file is charged
	 * in full, as one of private memory is. Ranks of one server are a handful; this bounds what a client could
	 * make a call cost.
	 */
	uint32_t max_registrants_per_file;
	uint64_t prewarm_bytes;
	/* The start warm-up still runs beside the loop (daemon/warmup.c): the pool is growing toward prewarm. */
	bool pool_warming;
	uint64_t started_ms;
	enum broker_state state;
	bool shutting_down;

	/* Resolved by broker_resolve_limits(): what the daemon's fds and mappings allow. */
	uint64_t chunk_capacity; /* pool chunks the daemon may hold lent at once */
	uint64_t max_chunks_per_uid;
	uint64_t max_leases_per_uid;
	/* The chunk classes planned for those limits (rlimits.c), with the limits they came from. */
	struct classes_plan chunk_plan;
	uint64_t limit_nofile, limit_max_map_count;
	/* Bumped by every verb below that changes the leases, their holders or the idle pool:
	 * the fd-store state (recovery.c) is rewritten only when it moved. */
	uint64_t generation;
	/* After a restart, until redeclare-grace-ms is over: an orphan waits for its holder, however many exit. */
	bool redeclare_grace;

	/* Of the leased bytes, registration charges (never-revoked bytes are the budget's: budget_no_revoke). */
	uint64_t registered_bytes;
	/* Registrations of shared files, by file (backing.h); made with the first, freed with the last. */
	struct backing_table *backings;
	/* Pinned outside the broker, as live connections last reported it (ReportUnbrokered), before any cap. */
	uint64_t unbrokered_bytes;
	/* The same reports per uid: what status and the metrics show is capped from these (unbrokered.h). */
	struct unbrokered unbrokered;
	/* Of the leased bytes, memory an earlier daemon lent that live processes still map (restart.c). */
	uint32_t job_unknown_clients; /* connections whose job could not be read (conn.h job_unknown) */
	uint64_t orphaned_bytes;
	/*
	 * Staging-ring leases held now and their bytes (of the leased bytes), kept by broker_acquire_done and
	 * broker_free_lease.
	 */
	uint32_t staging_rings;
	uint64_t staging_ring_bytes;
	/* All-or-nothing reservations for groups of ranks (reservation.h); NULL until the first. */
	struct reservations *reservations;
	/* Clients' staged copies since start (ReportStaging), closed connections' included. */
	struct staged_totals staged;

	struct broker_counters counters;

	/* Who hears that leased memory came back (broker_memory_freed): the wait queue, a test. */
	broker_freed_fn *freed_listeners[BROKER_FREED_LISTENERS_MAX];
};

struct acquire_args {
	uid_t uid;
	gid_t gid;
	pid_t pid;
	void *owner;
	uint64_t size; /* as requested; rounded up to the page size here */
	enum lease_priority priority;
	const char *label;
	bool no_revoke;            /* never revoked: its holder cannot give memory back */
	bool registration;         /* a charge only: no pool memory (implies no_revoke) */
	bool staging_ring;         /* a staging ring: counted in staging_rings and staging_ring_bytes */
	int numa_node;             /* NUMA node asked for, -1 for any (only with a placing pool) */
	struct job_cgroup *cgroup; /* the client's cgroup, charged for job quotas; NULL: none */
	uint64_t tenant;           /* the client's tenant (core/tenant.h): whose idle chunks it may be handed */
	bool job_unknown;          /* the client's cgroup could not be read: job-unknown decides while rules exist */
	uint64_t now_ms;           /* monotonic, when it is granted: the lease's creation time (no clock read here) */
	/* With registration: the span is a shared mapping of file (dev, ino) from backing_offset (lease.h). */
	bool backed;
	uint64_t backing_dev, backing_ino, backing_offset;
	/* A share of this reservation (reservation.h): no budget, quota or job check (its bytes are held), one
	 * share at most; NULL: an ordinary acquire. */
	struct reservation *reservation;
};

/* Queued reply packets duplicate their fds; this many may be queued over all connections. */
#define BROKER_QUEUED_FDS_MAX 1024
/* Below this many chunks the daemon could not serve a useful load; the limits are clamped up to it. */
#define BROKER_CHUNK_CAPACITY_MIN 64

/*
 * Where a lease's pages are: the node of its first chunk (-1 without placement
 * or chunks), and whether it was asked for a node and some chunk is elsewhere.
 */
int broker_lease_node(const struct lease *l, bool *misplaced);

/*
 * What clients' unbrokered reports count up to, per uid and in all: the host's MemTotal less what the
 * daemon knows is pinned (its resident pool and registration charges). UINT64_MAX when MemTotal is unknown.
 */
uint64_t broker_unbrokered_cap(const struct broker *b, uint64_t pool_resident_bytes);

/*
 * Derive chunk_capacity and the per-uid caps from the daemon's own limits:
 * nofile (RLIMIT_NOFILE), max_map_count (vm.max_map_count; 0 when chunks are
 * not mapped, as with hugetlb), and the fds and mappings in use before any
 * chunk exists. Each connection costs two fds (socket and pidfd); reserve-fds
 * fds and mappings stay free for admin connections. Unset (0) per-uid caps
 * become half the capacity. Returns true if the capacity had to be clamped
 * up to BROKER_CHUNK_CAPACITY_MIN (the caller warns).
 */
bool broker_resolve_limits(struct broker *b, uint64_t nofile, uint64_t max_map_count, uint64_t fds_in_use,
			   uint64_t maps_in_use);

/*
 * The deadline a REVOKE carries: asked_ms (0: revoke-deadline-ms), raised to
 * revoke-min-deadline-ms when the asker is not an admin (a holder revoking its
 * own leases), so a 1 ms self-revoke cannot make all of a uid's leases overdue
 * before its processes had a chance to let go. Admin revokes keep asked_ms.
 */
uint32_t broker_revoke_deadline_ms(const struct broker_settings *s, bool admin, uint32_t asked_ms);

/*
 * May enforcement on overdue lease l signal (or disconnect) a process of
 * target_uid? Always for a pressure or admin revoke; for a revoke the holder
 * started itself, only a process of the lease's own uid: a holder must not be
 * able to kill another uid's attacher by revoking its own lease.
 */
bool broker_enforce_may_signal(const struct lease *l, uid_t target_uid);

/*
 * What the core reads of the pool: plain figures the shell's pool fills (pool_view) just before a decision, as
 * the time is passed in.
 */
struct pool_view {
	uint64_t page_bytes;               /* the pool's page size: a lease is a whole number of them */
	uint64_t host_page_bytes;          /* the host's base page: a registration is a whole number of them */
	const struct classes *classes;     /* the chunk classes, smallest first */
	uint64_t idle_bytes;               /* idle chunks, all classes */
	uint64_t idle_chunks[CLASSES_MAX]; /* idle chunks of each class */
	uint64_t resident_bytes;           /* idle and lent: all the pool holds locked */
	size_t chunks;                     /* idle and lent */
	const int *nodes;                  /* the NUMA nodes chunks are placed on */
	size_t n_nodes;                    /* 0: no placement */
};

/*
 * An acquire the core has admitted: the lease's shape and what the pool is to do for it, in this order (the
 * shell, daemon.c, carries it out and reports back with broker_acquire_done):
 *   1. destroy idle chunks, smallest class first, until the pool holds at most trim_to_chunks (SIZE_MAX: none);
 *   2. take counts[k] chunks of each class k and one tail of tail_bytes (0: none), for uid's tenant on node:
 *      idle chunks where the pool has ones that tenant may be handed, fresh ones for the rest.
 */
struct acquire_plan {
	uint64_t bytes;        /* the request rounded up to the page size */
	uint64_t charge_bytes; /* what it is charged: bytes, or a backed registration's pages nobody covers yet */
	bool backed;           /* a registration recorded in the backing table (backing.h) */
	size_t trim_to_chunks;
	size_t nchunks; /* chunks to take, the tail included: 0 for a registration */
	uint64_t counts[CLASSES_MAX];
	uint64_t tail_bytes;
	int node; /* -1: any, else a node the pool places on */
};

/*
 * Decide an acquire: size, budget, quota, job, the fd and mapping caps, and the pressure state, against the
 * pool as pv shows it. Returns REFUSAL_NONE with *plan filled, or the refusal (nothing changed):
 * REFUSAL_INVALID_SIZE, REFUSAL_TOO_LARGE, REFUSAL_UID_QUOTA, REFUSAL_JOB_QUOTA, REFUSAL_JOB_UNKNOWN,
 * REFUSAL_BUDGET, REFUSAL_CRITICAL, REFUSAL_TIGHT (beyond the free warm pool), REFUSAL_TIGHT_NO_REVOKE (a
 * never-revoked lease or a registration, whatever its size), REFUSAL_UID_LEASES, REFUSAL_UID_CHUNKS,
 * REFUSAL_CAPACITY or REFUSAL_UID_NO_REVOKE.
 * While tight, a pool lease is carved from the idle chunks there are (smaller classes standing in for bigger
 * ones: more chunks, no new memory). A registration (a->registration) takes no chunks: it is charged and
 * counted as a lease. A backed registration (a->backed) is charged only the pages of its file range that no
 * live registration of the same file covers (backing.h); one that adds no page is granted whatever the
 * pressure (it pins nothing new) and passes no budget, quota or job check, only the lease-count caps.
 */
enum broker_refusal broker_acquire(struct broker *b, const struct acquire_args *a, const struct pool_view *pv,
				   struct acquire_plan *plan);

/* A bound on what one more acquire may get (broker_headroom), each the figures of one check broker_acquire makes. */
enum broker_bound_kind {
	BOUND_BUDGET,      /* the host budget: limit and leased bytes */
	BOUND_UID_QUOTA,   /* the uid quota (uid-quota, where below the budget) */
	BOUND_JOB_QUOTA,   /* the client's job's quota rule */
	BOUND_JOB_UNKNOWN, /* its job could not be read while rules exist and job-unknown is refuse: 0 */
	BOUND_NO_REVOKE,   /* max-no-revoke-per-uid: only for never-revoked leases and registrations */
	BOUND_PRESSURE,    /* tight: the free warm pool, or 0 for never-revoked memory; critical: 0 */
	BOUND_UID_LEASES,  /* max-leases-per-uid (limit and used count leases) */
	BOUND_UID_CHUNKS,  /* max-chunks-per-uid (limit and used count fds) */
	BOUND_CAPACITY,    /* the daemon's chunk capacity (limit and used count fds) */
	BOUND_CONN_LEASES, /* max-leases-per-client, this connection's (limit and used count leases) */
	BOUND_N,
};

/* One bound: limit and used in bytes (counts for the kinds that say so), left_bytes always bytes. */
struct broker_bound {
	enum broker_bound_kind kind;
	uint64_t limit, used;
	uint64_t left_bytes; /* UINT64_MAX: this cap bounds the count, not the bytes, and is not reached */
};

/* What one more acquire may get now: broker_headroom's answer. */
struct broker_headroom {
	uint64_t available_bytes; /* min of the bounds' left_bytes, rounded down to page_bytes */
	uint64_t page_bytes;      /* the granularity an acquire of these flags is rounded up to */
	size_t n;
	int binding; /* index in bounds of the one that binds (the first of the least left) */
	struct broker_bound bounds[BOUND_N];
};

/* A connection may ask for another lease while it holds fewer than max (max-leases-per-client). */
static inline bool broker_conn_may_acquire(uint64_t held, uint64_t max)
{
	return held < max;
}

/*
 * How much an acquire with a's flags (no_revoke, registration; size ignored) may get now, from the same checks
 * broker_acquire makes, each a bound: an acquire of out->available_bytes is granted (granularity and pool
 * permitting, as broker_acquire plans it) and one of a page more is refused with the binding bound's refusal.
 * conn_leases and conn_max are the asking connection's leases and max-leases-per-client. Unbacked only.
 */
void broker_headroom(const struct broker *b, const struct acquire_args *a, const struct pool_view *pv,
		     uint64_t conn_leases, uint64_t conn_max, struct broker_headroom *out);

/*
 * The shell carried out plan for a: trimmed is how many idle chunks step 1 destroyed; err is 0 and chunks holds
 * plan->nchunks chunks (a malloc'd array, largest first, the tail last; NULL for a registration), or err is the
 * negative errno making them failed with (memfd_create, ftruncate, fallocate, mmap, mlock, or an allocation;
 * chunks NULL). Charges the budget, the uid, the job and the backing table and adds the lease: returns
 * REFUSAL_NONE and *ret (the lease owns chunks now), or REFUSAL_FAILED with *err set (the pool's errno, or
 * -ENOMEM here) and nothing charged; chunks stay the caller's then, to give back.
 */
enum broker_refusal broker_acquire_done(struct broker *b, const struct acquire_args *a, const struct acquire_plan *plan,
					size_t trimmed, int err, struct lease_chunk *chunks, struct lease **ret,
					int *errp);

/*
 * Release lease id on behalf of (uid, owner). Returns 0 and *ret, the lease for the caller to free
 * (broker_free_lease), -ENOENT (no such lease) or -EPERM (someone else's). admin may release any lease; its
 * chunks are then destroyed, not pooled (its holder may map them still).
 */
int broker_release(struct broker *b, uint64_t id, uid_t uid, void *owner, bool admin, struct lease **ret);

/*
 * Whether lease l's chunks may stay warm for its holder's tenant when it ends: only when it was released
 * (l->released), never dropped (l->dropped), and nobody maps it now. Otherwise a process that may still map
 * them (a clone(CLONE_VM) sibling, a forked child) would see another lease's pages: they are destroyed (retired).
 */
bool broker_lease_reusable(const struct lease *l);

/*
 * Uncharge lease l, whatever its state, and take it out of the table (its chunks array with it: the shell gave
 * the chunks back to the pool first, retired unless broker_lease_reusable). A backed registration's pages that
 * other registrations of the file still cover pass to the oldest of them (its uid, never-revoked share and job
 * take the charge over); only pages nobody covers any more are uncharged.
 */
void broker_free_lease(struct broker *b, struct lease *l);

/*
 * A connection closed: it lets go of every lease it holds or is attached to (each marked dropped: its process,
 * or one sharing its memory, may map it still). Those nobody maps any more go into out[] (room for max), for the
 * caller to free (broker_free_lease). Returns how many there are (more than max: the rest were not stored).
 */
size_t broker_drop_owner(struct broker *b, void *owner, struct lease **out, size_t max);

/*
 * Share lease l on behalf of owner, its holder: see lease_share (token: 128
 * random bits, used on the first share only). Returns 0, -EPERM (owner is not
 * its holder), -EINVAL (not ACTIVE or IDLE: revoked, or an orphan), -E2BIG
 * (too many uids), -EEXIST (token taken) or -ENOMEM.
 */
int broker_share(struct broker *b, struct lease *l, const void *owner, const uint8_t token[LEASE_TOKEN_BYTES],
		 const uid_t *uids, size_t n);

/*
 * Attach owner (a connection of uid, pid, tenant) to the lease token names: no new
 * charge, the lease is counted once. An IDLE lease becomes ACTIVE (it is in
 * use again). An attacher of another uid or tenant than the holder's taints the lease's
 * chunks (struct lease_chunk's tainted) before the caller sends their fds: they are
 * destroyed when the lease ends, never pooled again. Returns 0 and *ret,
 * -ENOENT (no live lease has this token, or it is being revoked), -EACCES (uid
 * not granted), -EEXIST (owner maps it already) or -ENOMEM. now_ms
 * (monotonic) is when, for an idle lease's last use.
 */
int broker_attach(struct broker *b, const uint8_t token[LEASE_TOKEN_BYTES], void *owner, uid_t uid, pid_t pid,
		  uint64_t tenant, uint64_t now_ms, struct lease **ret);

/*
 * owner (holder or attacher) lets go of l. Returns 1 when nobody maps l any
 * more (the caller frees it: broker_free_lease), 0 when it lives on for its
 * other mappers, or -ENOENT if owner does not map l.
 */
int broker_detach(struct broker *b, struct lease *l, const void *owner);

/* What the shell does when the pressure state changes: broker_set_pressure's answer, carried out in this order. */
enum broker_pressure_action {
	BROKER_ACT_TRIM_POOL = 1u << 0,      /* tight or critical: trim the idle pool to 0; it regrows on demand */
	BROKER_ACT_REFUSE_WAITERS = 1u << 1, /* critical: refuse every waiting acquire with REFUSAL_CRITICAL at once */
	BROKER_ACT_START_RECLAIM = 1u << 2,  /* critical: revoke now, and again every reclaim step while it lasts */
	BROKER_ACT_STOP_RECLAIM = 1u << 3,   /* no longer critical: stop the reclaim steps */
	BROKER_ACT_GRANT_WAITERS = 1u << 4,  /* normal again: grant waiting acquires that fit */
};

/*
 * The pressure state is now to: the one writer of b->state. Returns the
 * actions (enum broker_pressure_action bits) the I/O shell must carry out, in
 * their bit order; react.c does so. A caller that only (re)initialises the
 * state, before anything is lent or waits, may ignore them.
 */
unsigned broker_set_pressure(struct broker *b, enum broker_state to);

/*
 * Bring the idle pool (idle_bytes now) toward target_idle_bytes, bounded by the budget (leased plus idle must fit
 * it). Returns true, with *keep_bytes, when the pool must shrink to keep at most that much idle.
 */
bool broker_trim_pool(struct broker *b, uint64_t target_idle_bytes, uint64_t idle_bytes, uint64_t *keep_bytes);

/* Sum of bytes in OVERDUE leases. */
uint64_t broker_overdue_bytes(const struct broker *b);

/*
 * Listen to the freed-memory event: fn runs once at each broker_memory_freed.
 * Returns 0, -EEXIST (fn listens already) or -ENOSPC (BROKER_FREED_LISTENERS_MAX listen).
 */
int broker_listen_freed(struct broker *b, broker_freed_fn *fn);
/* fn stops listening (nothing if it did not listen). */
void broker_unlisten_freed(struct broker *b, broker_freed_fn *fn);
/*
 * Leased memory came back (released, a holder exited, a connection closed): tell every listener.
 * The revoker raises it once per batch of frees, never with a lease half freed.
 */
void broker_memory_freed(struct broker *b);

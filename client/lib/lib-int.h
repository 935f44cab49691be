/* SPDX-License-Identifier: MIT */
/* libpinbroker's private header: the structs the rooms share, the lease room's hooks, and each room's verbs. */
#pragma once

/* Built with -fvisibility=hidden: only the public API gets default visibility, which the
 * version script then exports. Everything declared below stays inside the library. */
#pragma GCC visibility push(default)
#include "pinbroker.h"
#pragma GCC visibility pop

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pinbroker-internal.h"
#include "pinbroker.pb-c.h"

/*
 * The rooms, one file each, their cross-room verbs under the file's prefix. A room calls only rooms
 * below it in this list (every one calls lib-errors.c), so there is no import loop:
 *   lib-client.c    pb_connect, pb_disconnect: builds a client, wires the rooms    (staging, receiver, lease, cache)
 *   lib-staging.c   pb_copy_*, pbst_copy: the staged copy's pipeline     (staging-ring, staging-plan, cuda.c)
 *   lib-staging-ring.c  staging_: the ring lease, its events and threads, fork (acquire, lease, report, cuda.c)
 *   lib-staging-report.c  staging_report_send: ReportStaging                         (conn)
 *   lib-admin.c     metrics, config, admin revoke and set, job quotas               (status, conn)
 *   lib-headroom.c  pb_headroom: what this client may still get now                 (conn)
 *   lib-status.c    status_: STATUS paging and conversion                           (conn)
 *   lib-share.c     pb_lease_share, pb_attach                                       (acquire, lease, conn)
 *   lib-register.c  pb_register, pb_unregister, unbrokered reports                  (acquire, conn)
 *   lib-acquire.c   acquire_: granted lease to pb_lease; pb_acquire, fallback, pb_release
 *                                                                    (cache, lease, map, gpu, conn)
 *   lib-cache.c     cache_: released leases kept for a fast re-acquire              (lease, cache-index)
 *   lib-lease.c     lease_: the lease list, release, revoke; fills conn_hooks (map, conn, cache-index)
 *   lib-cache-index.c  cache_index_: cached leases in cache order and by size
 *   lib-map.c       map_: a lease's chunks mapped back to back, unmapped, retired   (cuda.c)
 *   lib-gpu.c       gpu_: the GPU's NUMA node, CUDA's availability                  (cuda.c)
 *   lib-receiver.c  receiver_: HELLO, the receiver thread, reconnect, re-declare    (conn)
 *   lib-conn.c      conn_: sending, waiting for replies (reading them too), dispatching what arrives
 *   lib-errors.c    err_: pb_last_error's text, errnos for the daemon's status codes
 * The connection room (conn, receiver) acts on leases only through struct conn_hooks.
 */

/*
 * The cache's page sizes are counted by their log2: a mapped lease's page size is a power of two (map_chunks
 * refuses any other), so every page size the daemon can send has a slot, and no lease is left out of the cache
 * for its page size. A bit per slot in use keeps a take's search to the page sizes cached.
 */
#define CACHE_PAGE_SHIFTS 64

typedef Pinbroker__V1__Request Request;
typedef Pinbroker__V1__Reply Reply;

enum lease_state {
	LEASE_ACTIVE,   /* the application owns it */
	LEASE_CACHED,   /* released by the application, kept mapped and registered for a fast re-acquire */
	LEASE_REVOKING, /* the receiver thread is giving it back after a revoke; pb_release waits */
	LEASE_GONE,     /* memory already returned by the library; the struct waits for pb_release */
};

struct pb_lease {
	pb_client *client;            /* NULL for fallback memory */
	struct pb_lease *prev, *next; /* client->leases, under client->lock */
	enum lease_state state;
	uint64_t id;
	void *data;        /* what the application sees; NULL once GONE */
	void *map_base;    /* the mapped range (== data until GONE) */
	size_t size_bytes; /* usable: the request rounded up to the page size */
	size_t map_bytes;  /* mapped: the sum of the chunks, >= size_bytes */
	size_t page_size_bytes;
	size_t chunks;
	enum pb_memory_kind kind;
	enum pb_priority priority;
	bool cuda_registered;
	bool cuda_registering;   /* pb_lease_register_slice is in the driver now (under client->lock) */
	size_t cuda_piece_bytes; /* registered in pieces every this many bytes from the first page; 0: one call */
	size_t cuda_slice_off;   /* pb_lease_register_slice: the registered slice's offset from map_base */
	size_t cuda_slice_bytes; /* and its length; 0: the whole range (or nothing) is registered */
	bool hugetlb;
	bool no_cuda;         /* acquired with PB_ACQUIRE_NO_CUDA: a cache hit must match */
	bool no_revoke;       /* PB_ACQUIRE_NO_REVOKE or a registration: the daemon takes it back only while cached */
	bool mapped;          /* registered with DEVICEMAP (PB_ACQUIRE_MAPPED): a cache hit must match */
	bool registration;    /* pb_register: data is the caller's memory, nothing is mapped here */
	bool shared_memory;   /* pb_register of a MAP_SHARED file: charged once per file (daemon) */
	int numa_node;        /* where the daemon says its pages are; -1 when not placed */
	bool misplaced;       /* placed for a node and partly elsewhere */
	bool revoke_pending;  /* the daemon wants it back: never cache it */
	bool shared;          /* pb_lease_share gave out a token: others may map it, never cache it */
	bool attached;        /* mapped by pb_attach: another process holds it; never cached or re-declared */
	bool stale;           /* the broker no longer counts it (new instance, or not re-adopted): atomic */
	uint64_t instance_id; /* of the daemon that granted it: (instance_id, id) names the lease */
	uint64_t conn_gen;    /* the connection it is counted on; requests naming it go only there */
	int idle;             /* pb_lease_set_idle; read by the receiver thread (atomic) */
	uint64_t cached_seq;  /* while LEASE_CACHED: when it was cached (client->cache_seq), oldest evicted first */
	bool idle_told;       /* while LEASE_CACHED: the daemon was told it is idle (a re-acquire must say busy) */
	bool inherit;         /* PB_ACQUIRE_INHERIT: mapped without MADV_DONTFORK */
	bool staging_ring; /* PB_ACQUIRE_STAGING_RING: the library's own ring (a revoke goes to c->staging_revoke; never
				* cached), counted by the daemon as a staging ring */
	uint64_t forks_at_map; /* map_forks() before it was mapped: more since means a child may map it */
	/* While LEASE_CACHED, under client->lock (lib-cache-index.c): */
	struct pb_lease *cache_prev, *cache_next; /* client->cache_head's list, in cache order */
	struct pb_lease *idx_left, *idx_right;    /* client->cache_root's treap of sizes, while idx_node */
	struct pb_lease *dup_prev, *dup_next;     /* the other cached leases of its key, newest first */
	bool idx_node;                            /* the treap's node for its key (else on a node's dup list) */
	uint32_t cache_flags;                     /* the acquire flags a hit must ask for */
	char *fallback_reason;
};

/* One outstanding request. Lives on the caller's stack, linked into client->waiters. */
struct waiter {
	struct waiter *next;
	uint64_t seq;
	Reply *reply;
	int *fds; /* a lease's chunk fds, collected across LeaseFds packets */
	size_t nfds;
	size_t fds_expected;
	int err; /* 0, or a negative errno when no usable reply came */
	bool done;
	bool revoked;             /* a revoke came for the lease before pb_acquire published it */
	uint64_t revokes_at_done; /* c->revokes_queued when it completed: the call waits for those to have run */
	uint64_t instance_id;     /* the daemon instance and connection the reply came on */
	uint64_t conn_gen;
};

/*
 * What the connection room does to leases, as the lease room provides it: the receiver thread
 * and the reconnect call through this table and never name a lease function, so the connection
 * room has no import of the lease room. lib-lease.c fills it in; pb_connect installs it
 * (lease_install_hooks) before the receiver thread starts.
 */
struct conn_hooks {
	/* The daemon pushed REVOKE for lease id. On the receiver thread, without c->lock: it must never
	 * wait for a reply, so all it sends is async. */
	void (*revoke)(pb_client *c, uint64_t id, uint32_t deadline_ms);
	/* Under c->lock, reconnected to instance_id, the daemon instance that granted our leases: the ids
	 * to re-declare to it (malloc'd, *n of them), or NULL with *n 0 when out of memory. */
	uint64_t *(*redeclare_ids_locked)(pb_client *c, uint64_t instance_id, size_t *n);
	/* Under c->lock, as a reconnect completes (c->conn_gen already the new connection's): with same (the
	 * instance that granted them), the leases in adopted move to the new connection; every other lease
	 * goes stale. Cached ones are unlinked and returned, chained on ->next, for drop. */
	pb_lease *(*reconnected_locked)(pb_client *c, bool same, uint64_t instance_id, const uint64_t *adopted,
					size_t nadopted);
	/* Unmap and free a chain reconnected_locked returned; without c->lock. */
	void (*drop)(pb_lease *chain);
};

/* A REVOKE a caller read, queued for the receiver thread (a caller finding the queue full waits for it). */
#define CONN_REVOKES_MAX 64
struct conn_revoke {
	uint64_t lease_id;
	uint32_t deadline_ms;
};

struct pb_client {
	int sock;
	const struct conn_hooks *hooks; /* the lease room's, set before the receiver starts; never changes */
	bool registrations; /* the daemon's HELLO: it knows NO_REVOKE, REGISTER_ONLY, ReportUnbrokered (atomic) */
	bool knows_staging; /* the daemon's HELLO: it knows the staging-ring flag and ReportStaging (atomic) */
	/*
	 * Held shared around every send and exclusively while a reconnect swaps the
	 * socket: a request checked against one connection (and daemon instance)
	 * is never written to the next one. Taken before lock, never while waiting.
	 */
	pthread_rwlock_t sock_lock;
	pthread_t receiver;
	bool receiver_started;
	pthread_mutex_t lock; /* guards everything below */
	pthread_cond_t cond;  /* waiters completing, leases leaving LEASE_REVOKING */
	uint64_t next_seq;
	struct waiter *waiters;
	int dead; /* 0, or a negative errno once the connection is gone */
	char dead_reason[160];
	struct pb_lease *leases;
	size_t cache_limit_bytes;
	size_t cached_bytes;
	size_t cached_leases;
	struct pb_lease *cache_head, *cache_tail;    /* cached leases, oldest first */
	struct pb_lease *cache_untold;               /* where the tick starts: every one before it was told idle
						      * (after it, some may be too: pb_release's tell_now) */
	struct pb_lease *cache_root;                 /* the size index (a treap) */
	size_t cache_page_leases[CACHE_PAGE_SHIFTS]; /* cached leases by log2 of their page size */
	uint64_t cache_page_mask; /* bit k: leases of 2^k-byte pages are cached; a take searches each */
	unsigned cache_slack_pct; /* a cached lease serves a request up to this much smaller (100: half its size) */
	uint64_t cache_seq;       /* bumped by each lease cached */
	uint64_t cache_told_seq;  /* the receiver's last tick: leases cached at or before it are told idle next */
	unsigned tells_in_flight; /* SET_IDLE 1s decided (the lease marked told) and not yet sent: a take waits */
	bool rx_ticking;  /* the receiver ticks (a lease not told idle is cached); else a cache write wakes it */
	bool rx_blocking; /* the receiver's last wait found no cache, nothing cached and no call of late, so it went
			   * into its recv alone, which no write wakes (true until that recv returns) */
	int wake_fd;      /* an eventfd the receiver polls with the socket: wakes it to tick, or to run revokes */
	/*
	 * The socket's read side has one reader at a time (reading). A caller waiting for its reply reads the socket
	 * itself when no one else does (lib-conn.c), so a reply wakes the one thread that wants it rather than the
	 * receiver, which then woke the caller. The receiver watches the socket only once no call was sent for
	 * CONN_WATCH_MS (until then the calls read what comes, and it waits on wake_fd alone, so calls wake it
	 * neither coming nor going), or while the client stops. Revokes a caller reads are queued for it (revoke
	 * callbacks run on the receiver alone, woken through wake_fd), and the call that read them returns once they
	 * have run, as when the receiver read them in order; a connection a caller finds broken is the receiver's to
	 * hang up (rx_failed).
	 */
	bool reading;
	bool rx_got;               /* the reader has a packet it has not dispatched yet (atomic; cleared as it ends) */
	unsigned readers_waiting;  /* callers waiting for the read side, to read their reply */
	uint64_t last_call_ms;     /* the last call sent: the receiver keeps off its lone recv for a while after */
	int rx_failed;             /* a caller's read found the connection broken (-errno): the receiver hangs up */
	char rx_failed_reason[96]; /* why, as the receiver would say it */
	struct conn_revoke revokes[CONN_REVOKES_MAX]; /* read by callers, for the receiver to run, oldest first */
	size_t n_revokes;
	uint64_t revokes_queued, revokes_run; /* counts: a call returns once those read before its reply have run */
	pid_t pid;                            /* the process that connected: a forked child's calls are refused */
	uint64_t cache_tick_at_ms;            /* the receiver's next tick (its own: read and written by it alone) */
	unsigned cache_idle_ms;               /* the tick (pb_set_cache_idle_ms) */
	bool cache_tick_reset;                /* the tick changed: the receiver starts its schedule again */
	struct pb_cache_stats cache_stats;    /* hits, misses, evictions, revoked */
	pb_revoke_fn revoke_fn;
	void *revoke_userdata;
	/*
	 * Staged copies (lib-staging*.c): their state, made on first use (atomic pointer), and the hook the lease room
	 * calls, on the receiver thread without c->lock, when the daemon revokes a staging ring (instead of revoke_fn:
	 * the ring is the library's own). Set once, before the first ring is acquired.
	 */
	struct pbst_state *staging;
	void (*staging_revoke)(pb_client *c, pb_lease *l, uint32_t deadline_ms);
	/* Whether l is staging's own ring (or one it is acquiring): called under c->lock, takes staging's lock (staging
	 * never takes c->lock under its own). A program's lease acquired with the flag is revoked as any other. */
	bool (*staging_owns)(pb_client *c, const pb_lease *l);
	uint8_t *rxbuf;       /* PB_MAX_MSG_BYTES, used only by whoever is reading: HELLO, then the receiver */
	char path[108];       /* the socket, for reconnecting after the daemon restarts */
	bool closing;         /* pb_disconnect is running: never reconnect */
	uint64_t instance_id; /* the daemon's, from HELLO; 0 if it sent none */
	uint64_t conn_gen;    /* bumped by each reconnect */
	/*
	 * Under lock: what staging_report_send sent last, on which connection, and the counters as they stood when
	 * that connection began: the daemon takes each connection's counters as counted from 0, so a reconnect
	 * does not count again what the last connection reported.
	 */
	struct {
		uint64_t conn_gen;
		struct pb_staging_stats sent, base;
	} staged_report;
	/* A call that finds the connection down asks for an attempt now (kick_gen) and waits until
	 * an attempt that started after its ask has ended (served_gen). */
	uint64_t kick_gen, served_gen;
	/*
	 * Leases released while the connection was down (or whose RELEASE the dying connection lost), by the
	 * instance that granted them. A restart that adopts systemd's fd store keeps them counted while this
	 * process runs, so the reconnect that finds that instance again sends their RELEASE.
	 */
	uint64_t *away_ids;
	size_t n_away, cap_away;
	uint64_t away_instance;
};

/* The caller's memory that a pb_register charge is for. */
struct reg_span {
	void *p;
	size_t bytes;
};

/* ---------------------------------------------------------------- lib-errors.c */

/* Longest text pb_connect's failure keeps for pb_acquire_or_fallback(NULL, ...). */
#define ERR_CONNECT_FAILURE_LEN 512

/* Sets pb_last_error() from fmt; returns err, so callers can `return err_set(-E..., ...)`. */
__attribute__((format(printf, 2, 3))) int err_set(int err, const char *fmt, ...);
/* Empties pb_last_error() (it then reads "no error"). */
void err_clear(void);
/* A non-OK reply: returns its errno, with the daemon's message as pb_last_error() and err_daemon_message(). */
int err_reply(const Reply *rep);
/* The daemon's words for the last refusal in this thread ("" when none, or after err_forget_daemon_message). */
const char *err_daemon_message(void);
void err_forget_daemon_message(void);
/* pb_connect's outcome, process-wide: failed keeps the current pb_last_error() text, succeeded clears it. */
void err_connect_failed(void);
void err_connect_succeeded(void);
/* Why the last pb_connect failed, into buf; "not connected to a broker" when none did. */
void err_connect_failure(char *buf, size_t len);

/* ---------------------------------------------------------------- lib-conn.c */

/* Packs and sends req on sock; 0 or -errno (-EPIPE when the daemon is gone). */
int conn_send_packed(int sock, const Request *req);
/*
 * Send req and wait until its reply (and, for a lease, all its fds) has come.
 * With keep, w stays linked so a revoke racing with pb_acquire finds it; the
 * caller unlinks it under the lock. gen: the connection generation of the lease
 * the request names, 0 when it names none. A call that finds the connection down
 * first waits for one reconnect attempt. Returns 0 with w->reply set (any status),
 * or a negative errno when the connection failed (-ECONNRESET: the daemon went
 * away, also while this call was in flight) or the lease is stale (-ESTALE).
 */
/* Under c->lock: have everything the daemon has sent so far dispatched, by this thread or by the one reading. */
void conn_drain_locked(pb_client *c);
int conn_call(pb_client *c, Request *req, struct waiter *w, bool keep, uint64_t gen);
/* conn_call for a request naming no lease, with the status checked: 0 with w->reply OK, or -errno
 * (the reply already freed). -ENOTCONN for a NULL c. */
int conn_call_checked(pb_client *c, Request *req, struct waiter *w);
/* Frees what a finished waiter still holds: the reply and any fds nobody took. */
void conn_waiter_cleanup(struct waiter *w);
/* Under c->lock: takes w off c->waiters (no-op when not linked). */
void conn_unlink_waiter_locked(pb_client *c, struct waiter *w);
/* Under c->lock: a revoke came for lease id before any pb_lease held it; its waiter (w->revoked) gives it back. */
void conn_mark_revoked_locked(pb_client *c, uint64_t id);
/* Fire-and-forget requests (the reply is dropped); gen as for conn_call. 0, -ECONNRESET or -ESTALE. */
int conn_send_release(pb_client *c, uint64_t id, uint64_t gen, bool forked);
int conn_send_revoke_ack(pb_client *c, uint64_t id, uint64_t gen);
int conn_send_set_idle(pb_client *c, uint64_t id, bool idle, uint64_t gen);
/* Is the caller the receiver thread (which must never wait for a reply)? */
bool conn_on_receiver_thread(const pb_client *c);
/* Under c->lock: lease id of instance was let go while the connection was down; the reconnect that
 * finds that instance again RELEASEs it. */
void conn_note_away_locked(pb_client *c, uint64_t instance, uint64_t id);
/* 0 when the daemon's HELLO said it knows never-revoke leases, registrations and unbrokered
 * reports; else -EOPNOTSUPP with pb_last_error() naming what (the feature). */
int conn_need_registrations(const pb_client *c, const char *what);
/* Whether the daemon's HELLO said it knows the staging-ring flag and ReportStaging (an older one closes a
 * connection that reports). */
bool conn_knows_staging(const pb_client *c);
/*
 * Send req (one that names no lease) without waiting, ever: not for its answer (the receiver drops it, as it has no
 * waiter), not for a reconnect in progress, not for room in the socket. Returns 0, -EAGAIN (not sent now: the
 * socket is full or being swapped), -ECONNRESET (the connection is down), -EMSGSIZE or another negative errno.
 */
int conn_send_nowait(pb_client *c, Request *req);
/* One packet the receiver (or a caller) read: a reply to its waiter, the fds of a lease, or a push (REVOKE, through
 * c->hooks on the receiver thread; queued for it when a caller read it). Takes rep and fds. */
void conn_dispatch(pb_client *c, Reply *rep, int *fds, size_t nfds);
/* On the receiver thread, under c->lock: run the revokes callers read (the hooks run unlocked). */
void conn_run_revokes_locked(pb_client *c);
/* Under c->lock: the reader lets go of the read side, waking whoever waits for it. */
void conn_end_read_locked(pb_client *c);
/* Milliseconds after a call in which the calls read the socket and the receiver does not watch it. */
#define CONN_WATCH_MS 20

/* ---------------------------------------------------------------- lib-receiver.c */

/* Says HELLO on c->sock and reads the answer, before the receiver thread runs or on it.
 * *instance_id gets the daemon's instance (0 if it names none). 0 or -errno, pb_last_error() set. */
int receiver_hello(pb_client *c, const char *path, uint64_t *instance_id);
/* Starts the receiver thread (it takes no signals). 0 or -errno, pb_last_error() set. */
int receiver_start(pb_client *c);
/* Stops reconnecting, half-closes, and joins the receiver once the daemon closed (or after a drain bound). */
void receiver_stop(pb_client *c);

/* ---------------------------------------------------------------- lib-gpu.c */

/* The node an acquire asks for (PB_ACQUIRE_NUMA_NODE, _GPU, _ANY_NODE, else the current CUDA device's), or -1. */
int gpu_acquire_node(const struct pb_acquire_opts *opts);

/* ---------------------------------------------------------------- lib-map.c */

/*
 * Map a lease's chunks back to back into one reserved range, so CUDA can
 * register it once (chunk-by-chunk registration breaks copies that span two
 * chunks, measured on the H200). Does not close the fds. Returns 0 or -errno.
 */
int map_chunks(const Pinbroker__V1__Lease *ls, const int *fds, bool inherit, void **base_ret, size_t *map_bytes_ret);
/* Forks of this process since the first inheritable lease was mapped (counted in the parent). */
uint64_t map_forks(void);
/* l was mapped inheritable (PB_ACQUIRE_INHERIT) and this process forked since: a child may map it still. */
bool map_forked(const pb_lease *l);
/*
 * Register [p, p + bytes) of l with CUDA (chunk_bytes: l's chunks, mapped back to back from p; NULL, 0 for a
 * registration), in pieces below the driver's per-call cap when it is that big, cut at chunk boundaries where
 * it can. Sets l->cuda_registered and l->cuda_piece_bytes. Returns 0 or -errno, pbcuda_strerror() saying why.
 */
int map_cuda_register(pb_lease *l, void *p, size_t bytes, const uint64_t *chunk_bytes, size_t n_chunks, bool mapped);
/* Unregisters and unmaps l's memory (a registration: only unregisters); data becomes NULL. */
void map_release(pb_lease *l);
/* Gives up the memory of a lease the application still points at: PROT_NONE, kind PB_MEM_REVOKED. */
void map_retire(pb_lease *l);

/* ---------------------------------------------------------------- lib-lease.c */

/* Installs the lease room's struct conn_hooks on c. */
void lease_install_hooks(pb_client *c);
/* Under c->lock: put l on, or take it off, c->leases. */
void lease_link_locked(pb_client *c, pb_lease *l);
void lease_unlink_locked(pb_client *c, pb_lease *l);
/* The broker no longer counts l (a new instance, or not re-adopted). */
bool lease_is_stale(const pb_lease *l);
/* Frees the struct only (not the memory). */
void lease_free(pb_lease *l);
/* Unmap, free, and RELEASE on the wire (awaited when wait and not on the receiver thread); 0 or -errno. */
int lease_release_now(pb_client *c, pb_lease *l, bool wait);
/* pb_disconnect's part: waits out revokes in progress, then releases every lease, pipelined. */
void lease_release_all(pb_client *c);

/* ---------------------------------------------------------------- lib-cache-index.c */

/*
 * Under c->lock: l joins the cache (newest, not told idle) with the acquire flags a hit must ask for; sets
 * l->cached_seq, counts it. -EINVAL when its page size is not a power of two (map_chunks lets none through).
 */
int cache_index_add_locked(pb_client *c, pb_lease *l, uint32_t flags);
/* Under c->lock: l leaves the cache (taken, evicted, revoked, gone stale); uncounts it. */
void cache_index_remove_locked(pb_client *c, pb_lease *l);
/*
 * Under c->lock: of the cached leases with these flags, priority and page size, the smallest of at least
 * need_bytes (of equal ones the most recently cached), or NULL. O(log n) in the distinct sizes cached.
 */
pb_lease *cache_index_lower_bound_locked(pb_client *c, uint32_t flags, enum pb_priority prio, size_t page_size_bytes,
					 size_t need_bytes);
/* Under c->lock: forget every cached lease at once (the leases themselves are the caller's). */
void cache_index_clear_locked(pb_client *c);

/* ---------------------------------------------------------------- lib-cache.c */

/* The cache limit from PINBROKER_CACHE_BYTES (0, no caching, when unset or bad). */
size_t cache_limit_from_env(void);
/*
 * How often the receiver tells the daemon which cached leases are idle (while one waits to be told): a lease is
 * told after one to two of these. The default, and pb_set_cache_idle_ms's bounds (an hour at most).
 */
#define CACHE_IDLE_MS_DEFAULT 100u
#define CACHE_IDLE_MS_MIN 1u
#define CACHE_IDLE_MS_MAX 3600000u
/* The tick from PINBROKER_CACHE_IDLE_MS (CACHE_IDLE_MS_DEFAULT when unset, or not a whole number in bounds). */
unsigned cache_idle_ms_from_env(void);
/*
 * Best fit among cached leases acquired with the same flags (PB_ACQUIRE_NO_CUDA, _NO_REVOKE, _MAPPED) and
 * priority, within the slack; made active again and told busy (sent here) if the daemon knew it idle. NULL: none.
 */
pb_lease *cache_take(pb_client *c, size_t size, uint32_t flags, enum pb_priority prio);
/*
 * Under c->lock, for pb_release of an active lease: keeps it cached when it may be (true), else false. Older
 * cached leases it pushed out to stay under the limit are unlinked onto *evicted (release them unlocked). Wakes
 * the receiver when it is not ticking, so the lease is told idle a tick or two later; when the receiver waits in
 * its recv alone (c->rx_blocking), which no wake reaches, sets *tell_now instead: the caller tells the daemon
 * the lease is idle itself, once unlocked, and then calls cache_told (the tell counts in c->tells_in_flight).
 */
bool cache_keep_locked(pb_client *c, pb_lease *l, pb_lease **evicted, bool *tell_now);
/* A SET_IDLE 1 that cache_keep_locked or the tick decided has been sent: a take of a told lease may go on. */
void cache_told(pb_client *c);
/* Release what cache_keep_locked evicted (not under c->lock). */
void cache_release_evicted(pb_client *c, pb_lease *evicted);
/* The receiver's tick: tell the daemon which leases have sat in the cache since the last tick. */
void cache_tick(pb_client *c);
/* Under c->lock: is a lease cached that the daemon was not told idle yet (the receiver must tick)? */
bool cache_untold_locked(const pb_client *c);
/* Under c->lock, after a reconnect to the daemon instance that granted the cached leases: tell them idle again. */
void cache_retell_locked(pb_client *c);

/* ---------------------------------------------------------------- lib-acquire.c */

/* The ACQUIRE for size bytes as opts asks, with the wire flags extra on top. */
void acquire_message(Pinbroker__V1__Acquire *acq, uint64_t size, const struct pb_acquire_opts *opts, uint32_t extra);
/*
 * Send req (ACQUIRE or ATTACH), map the lease in the reply (for reg, register the caller's memory instead)
 * and link it to c. A lease that the daemon revoked before it could be used is given back and fails:
 * -EAGAIN for an acquire (host memory critical), -ENOENT for an attach.
 */
int acquire_call(pb_client *c, Request *req, const char *verb, uint32_t flags, bool attached,
		 const struct reg_span *reg, pb_lease **ret);

/* ---------------------------------------------------------------- lib-register.c */

/* register_charge_bytes: pinbroker-internal.h, the interposer's face. */

/* ---------------------------------------------------------------- lib-status.c */

/* strdup of s ("" for NULL); sets *oom and returns NULL when out of memory. */
char *status_strdup(const char *s, bool *oom);
/* One job row, as STATUS and the quota replies carry it. */
void status_job_copy(struct pb_job *y, const Pinbroker__V1__JobInfo *x);

/*
 * Send a client's staged-copy counters to the daemon (ReportStaging), without waiting for its answer;
 * cumulative, so a lost report costs nothing (s counts from the client's start; what goes out counts from the
 * connection's, as the daemon takes it). Never waits (conn_send_nowait). Returns 0, or a negative errno:
 * -EOPNOTSUPP (a daemon that predates ReportStaging: nothing is sent), -EAGAIN (not sent now: send the next),
 * -ECONNRESET (no connection), -EINVAL (a NULL argument).
 */
int staging_report_send(pb_client *c, const struct pb_staging_stats *s);

/* ---------------------------------------------------------------- lib-staging-ring.c */

/* pb_disconnect's part, before any lease is released: waits out a staged copy in flight, lets the GPU finish
 * with the ring, releases it (with a last report) and stops the copy threads. */
void staging_client_close(pb_client *c);
/* pb_disconnect's part once the receiver thread has stopped: frees the state. */
void staging_client_free(pb_client *c);

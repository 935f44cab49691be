/* SPDX-License-Identifier: MIT */
/* libpinbroker: borrow pinned, CUDA-registered host memory from pinbrokerd, or fall back to ordinary memory. */
#ifndef PINBROKER_H
#define PINBROKER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The version of this header; pb_version() gives the library's at run time. CMake checks these
 * against project(VERSION) at configure time, so the two cannot drift.
 */
#define PINBROKER_VERSION_MAJOR 0
#define PINBROKER_VERSION_MINOR 2
#define PINBROKER_VERSION_PATCH 0
/* One number to compare with #if: 10000 * major + 100 * minor + patch (0.1.0 is 100). */
#define PINBROKER_VERSION_NUMBER \
	(PINBROKER_VERSION_MAJOR * 10000 + PINBROKER_VERSION_MINOR * 100 + PINBROKER_VERSION_PATCH)

/*
 * Conventions: functions returning int return 0 on success or a negative
 * errno. After a failure, pb_last_error() gives a human message for the
 * calling thread (the daemon's own words when it refused). All calls on one
 * pb_client are thread-safe.
 */

typedef struct pb_client pb_client;
typedef struct pb_lease pb_lease;

enum pb_priority {
	PB_PRIORITY_NORMAL = 0,
	PB_PRIORITY_CRITICAL = 1,    /* revoked last */
	PB_PRIORITY_BEST_EFFORT = 2, /* revoked first */
};

/* pb_acquire_opts.flags */
#define PB_ACQUIRE_WAIT (1u << 0)     /* wait up to timeout_ms for memory instead of failing at once */
#define PB_ACQUIRE_NO_CUDA (1u << 1)  /* map only; skip CUDA registration */
#define PB_ACQUIRE_NO_CACHE (1u << 2) /* do not reuse a cached buffer */
/*
 * The caller cannot give memory back on request (a program run under the
 * LD_PRELOAD interposer): the daemon never revokes the lease and never
 * signals its holder; under pressure it refuses new ones instead (-EBUSY as
 * soon as memory is tight, even when the warm pool could serve them). At most
 * max-no-revoke-per-uid of a uid's memory (-EUSERS past it); -EOPNOTSUPP from
 * a daemon that predates them.
 */
#define PB_ACQUIRE_NO_REVOKE (1u << 3)
/* Register with CU_MEMHOSTREGISTER_DEVICEMAP too, so cuMemHostGetDevicePointer works on it. */
#define PB_ACQUIRE_MAPPED (1u << 4)
/* pb_register only: charge the budget but leave CUDA registration to the caller. */
#define PB_REGISTER_CHARGE_ONLY (1u << 5)
/*
 * NUMA placement. By default a lease goes on the node of the calling thread's
 * current CUDA device (where the driver and sysfs say; anywhere when they do
 * not, or without a CUDA context). PB_ACQUIRE_NUMA_NODE names a node
 * (opts->numa_node), PB_ACQUIRE_GPU a GPU (opts->gpu: a CUDA ordinal "0", a
 * UUID "GPU-...", or a PCI bus id "0000:3b:00.0"), PB_ACQUIRE_ANY_NODE none.
 * The daemon falls back to another node only when the asked one is full, and
 * pb_lease_numa_node() says where the lease landed.
 */
#define PB_ACQUIRE_NUMA_NODE (1u << 6)
#define PB_ACQUIRE_GPU (1u << 7)
#define PB_ACQUIRE_ANY_NODE (1u << 8)
/*
 * Children this process forks inherit the lease's mapping, as they do memory from cudaHostAlloc (the interposer and
 * torch's allocator ask for it). Without it a lease is mapped MADV_DONTFORK: a forked child has nothing at its
 * address. A child keeps an inherited mapping after the lease ends, so a lease released after a fork tells the
 * daemon, which then never lends its memory again (it makes fresh memory in its place).
 */
#define PB_ACQUIRE_INHERIT (1u << 9)
/*
 * A staging ring (pb_copy_to_device and the interposer's staged copies take theirs with it): the daemon
 * names the lease a ring in status and `pinctl leases`, and counts it apart. An old daemon ignores it.
 */
#define PB_ACQUIRE_STAGING_RING (1u << 10)

struct pb_acquire_opts {
	uint32_t flags;
	uint32_t timeout_ms; /* with PB_ACQUIRE_WAIT; 0 = the daemon's default */
	enum pb_priority priority;
	const char *label; /* shown by `pinctl status`; may be NULL */
	/* Read only with the flag that names them (so callers built before them pass a shorter struct). */
	int numa_node;   /* PB_ACQUIRE_NUMA_NODE */
	const char *gpu; /* PB_ACQUIRE_GPU */
};

/* What a lease's memory is. */
enum pb_memory_kind {
	PB_MEM_PINNED = 0,   /* broker memory, locked and registered with CUDA: full-speed async copies */
	PB_MEM_LOCKED = 1,   /* broker memory, locked but not CUDA-registered (no GPU or no driver here) */
	PB_MEM_FALLBACK = 2, /* ordinary pageable memory: the broker refused or is not running */
	PB_MEM_REVOKED = 3,  /* revoked while idle and given back by the library: no memory (data is NULL) */
};

/*
 * Lease handles and their lifetime.
 *
 * A pb_lease stays valid until pb_release() is called on it, whatever happens
 * to its memory meanwhile; pb_release() is then the only call that frees it.
 * Its memory can go in two ways:
 *
 * - Revoked. When the daemon revokes a lease that is marked idle
 *   (pb_lease_set_idle(l, 1)) and no revoke callback is set, the library gives
 *   the memory back itself: from then on pb_lease_data() is NULL,
 *   pb_lease_kind() is PB_MEM_REVOKED and pb_lease_set_idle() returns -ESTALE,
 *   and the old range faults (PROT_NONE) instead of reaching other memory. So
 *   mark a lease busy with pb_lease_set_idle(l, 0) before touching it again,
 *   and touch it only if that returned 0.
 *
 * - Stale. A lease is named by the daemon instance that granted it and its id;
 *   ids start at 1 again in a new instance. When the daemon restarts with its
 *   leases kept in systemd's fd store, it is the same instance: the library
 *   reconnects and re-declares the leases and nothing changes. When it starts
 *   clean instead (no systemd, or no fd store), every handle from the earlier
 *   instance becomes stale (pb_lease_stale() is 1), as does one the daemon did
 *   not take back at re-declare: its data stays mapped and usable by this
 *   process, but it is no longer a lease nor locked by the broker: the new
 *   daemon counts it against the budget and this uid as orphaned memory for
 *   as long as this process maps it (pb_status orphaned_bytes). The library
 *   never names it to the daemon again, so pb_release() on it only unmaps and
 *   frees it here (the daemon stops counting it at its next look at /proc)
 *   and can never free someone else's lease, and pb_lease_set_idle() returns
 *   -ESTALE. Release stale leases when convenient and acquire again.
 *
 * When the connection drops, a call in flight returns -ECONNRESET; the next
 * call reconnects first (and returns -ECONNRESET again if no daemon answers).
 * Between calls the library also retries in the background for a minute.
 */

/*
 * Connect and say HELLO. path NULL means $PINBROKER_SOCKET, else
 * /run/pinbroker/pinbroker.sock. Returns 0 and *ret, or -ENOENT / -ECONNREFUSED
 * (no daemon), -EACCES (socket permissions), -EPROTONOSUPPORT (version mismatch).
 */
int pb_connect(const char *path, pb_client **ret);

/* Release every lease this client holds, unmap, and close. NULL is fine. */
void pb_disconnect(pb_client *c);

/*
 * Acquire at least size bytes (rounded up to the page size), mapped into this
 * process as one contiguous range and, where CUDA is usable here, registered
 * with cuMemHostRegister(PORTABLE). opts may be NULL. Blocking. Returns 0 and
 * *ret, or a negative errno:
 *   -EINVAL size 0; -EFBIG never satisfiable; -EDQUOT over the uid quota;
 *   -ENOSPC budget exhausted; -EBUSY host memory tight; -EAGAIN critical;
 *   -ETIMEDOUT a PB_ACQUIRE_WAIT timed out; -ECONNRESET the daemon went away.
 */
int pb_acquire(pb_client *c, size_t size, const struct pb_acquire_opts *opts, pb_lease **ret);

/*
 * Like pb_acquire, but never fails for lack of pinned memory: when the broker
 * refuses or c is NULL/disconnected, returns ordinary memory with kind
 * PB_MEM_FALLBACK. Returns NULL, with pb_last_error() set, for size 0 (the
 * -EINVAL of pb_acquire; no fallback is made) and when even malloc fails. The
 * reason for a fallback is in pb_lease_fallback_reason().
 */
pb_lease *pb_acquire_or_fallback(pb_client *c, size_t size, const struct pb_acquire_opts *opts);

/*
 * Budgeted cudaHostRegister: charge [p, p + size) (widened to whole pages) to
 * the budget and quota as a registration lease (counted, not pool memory, never
 * revoked), then register it with CUDA (PORTABLE, plus DEVICEMAP with
 * PB_ACQUIRE_MAPPED) unless PB_REGISTER_CHARGE_ONLY. The memory stays the
 * caller's: pb_lease_data() is p. Refusals are pb_acquire's errnos, plus
 * -EUSERS past max-no-revoke-per-uid and -EOPNOTSUPP from a daemon that
 * predates registrations; a CUDA failure returns its errno and gives the
 * charge back. Free with pb_unregister.
 */
int pb_register(pb_client *c, void *p, size_t size, const struct pb_acquire_opts *opts, pb_lease **ret);

/* Unregister from CUDA (unless it was charge-only) and give the charge back. l is invalid afterwards. */
int pb_unregister(pb_client *c, pb_lease *l);

/* 1 for a lease made by pb_register() (memory the program owns, charged to the budget), else 0. */
int pb_lease_registration(const pb_lease *l);

/*
 * 1 for a pb_register lease over shared memory (a MAP_SHARED file: /dev/shm, a memfd): the daemon charges
 * the registrations of one file once, by the union of their pages, whichever process or uid made them.
 * 0 for private memory (charged per registration) and every other lease.
 */
int pb_lease_shared_memory(const pb_lease *l);

/*
 * The NUMA node a lease's pages are on, or -1 (no placement: a daemon with
 * numa = no, an older daemon, fallback memory). *misplaced (may be NULL) is 1
 * when it was placed for a node and some of it is on another (that node was full).
 */
int pb_lease_numa_node(const pb_lease *l, int *misplaced);

/*
 * The NUMA node of a GPU (a CUDA ordinal "0", "GPU-<uuid>", or a PCI bus id):
 * the driver's CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID (CUDA 12.2+) where it gives
 * one, else sysfs through the GPU's PCI bus id; -1 when neither can tell (no
 * such GPU, no driver for an ordinal or UUID, firmware that gives no node).
 */
int pb_gpu_numa_node(const char *gpu);

/*
 * Tell the daemon this process holds `bytes` of pinned memory outside the
 * broker (the interposer's fallback to the real allocator), so `pinctl status`
 * shows all pinned memory on the host. Each report replaces the last; the
 * daemon forgets it when the connection closes.
 */
int pb_report_unbrokered(pb_client *c, uint64_t bytes);

/*
 * The daemon's Prometheus metrics (what metrics-path holds) as text in *text
 * (free it); per-uid rows only for admins or with status-visibility = all.
 */
int pb_metrics(pb_client *c, char **text);

/* One key of the daemon's running config, as pb_config_get returns it. */
struct pb_config_entry {
	char *key;
	char *value;    /* as the config file spells it: "8G", "25%", "30000", "yes"; "" written as \"\" */
	char *source;   /* "default", "file", "environment", "command line" or "set" (pinctl set) */
	char *file;     /* source "file": the file read, else "" */
	uint32_t line;  /* source "file": its line, else 0 */
	int reloadable; /* 1: SIGHUP and pinctl set apply it; 0: only a restart */
};

/*
 * The daemon's running config: key's entry, or every key when key is NULL,
 * in *ret (an array of *n; free with pb_config_free). Any client may ask.
 * Returns 0, -EINVAL for an unknown key (pb_last_error() names close
 * matches), -EOPNOTSUPP against a daemon older than the request, or another
 * negative errno.
 */
int pb_config_get(pb_client *c, const char *key, struct pb_config_entry **ret, size_t *n);
/* Free the n entries pb_config_get() returned in e (NULL is fine). */
void pb_config_free(struct pb_config_entry *e, size_t n);

/*
 * Give a lease back (unregister, unmap, RELEASE), or, when the client cache is
 * enabled, keep it mapped as cached-idle for a fast re-acquire. Works for
 * fallback, revoked and stale leases too (a stale one is only unmapped and
 * freed here: nothing is sent). l is invalid afterwards. Returns 0 or a
 * negative errno (the local resources are freed either way).
 */
int pb_release(pb_client *c, pb_lease *l);

/*
 * All-or-nothing reservations for a group of ranks (one process per GPU, say). Each rank calls pb_reserve with
 * the same name, shares (N) and share_bytes (B): the first call of the job (same uid and job cgroup) charges N x B
 * to the budget, the uid's quota and the job's quota at once, or fails with the reason and charges nothing (never
 * part of it); later calls join it. Each rank then takes its share with pb_acquire_from: granted from the
 * reserved bytes, without racing other ranks or other jobs, at most N shares of at most B bytes each. A taken
 * share is an ordinary lease (release, revoke, cache as any); the bytes of a share taken smaller than B, and of a
 * share's lease once released, go back to the budget, not to the reservation.
 *
 * The reservation ends on pb_reservation_release (any rank), an admin's pb_admin_revoke(PB_REVOKE_RESERVATION),
 * or when the last connection that reserved or joined it closes (its ranks exited); its untaken bytes go back
 * then. With flags PB_ACQUIRE_WAIT it waits up to timeout_ms (0: the daemon's acquire-timeout-ms) among the
 * waiting acquires, in their order, when the budget or a quota is full now.
 *
 * Returns 0 and *reservation_id, or a negative errno with pb_last_error() saying why: pb_acquire's refusals
 * (-ENOSPC over the budget, -EDQUOT over the uid's or job's quota, -EFBIG never satisfiable, -EAGAIN host memory
 * critical, -ETIMEDOUT a wait timed out, -EUSERS too many waiting, or the uid already holds the daemon's
 * max-reservations-per-uid reservations, or the host 1024) and -EINVAL (a reservation of that name exists with other shares
 * or share bytes, or the arguments are out of range: name 1-63 bytes, 1-1024 shares).
 */
int pb_reserve(pb_client *c, const char *name, uint32_t shares, uint64_t share_bytes, uint32_t flags,
	       uint32_t timeout_ms, uint64_t *reservation_id);

/*
 * Take this rank's share of reservation_id (a connection must have reserved or joined it first): a lease of size
 * (at most the share bytes) from the reserved bytes. opts as pb_acquire's; PB_ACQUIRE_WAIT, PB_ACQUIRE_NO_REVOKE
 * and PB_ACQUIRE_STAGING_RING are ignored, and the library's cache is never used. Returns 0 and *ret, or a
 * negative errno: -EINVAL (no such reservation joined on c, or size over one share), -EUSERS (every share is
 * taken, or a per-uid limit as with pb_acquire), -EBUSY / -EAGAIN (host memory tight or critical).
 */
int pb_acquire_from(pb_client *c, uint64_t reservation_id, size_t size, const struct pb_acquire_opts *opts,
		    pb_lease **ret);

/* End reservation_id: its untaken bytes go back to the budget; leases taken from it live on. 0 or -errno. */
int pb_reservation_release(pb_client *c, uint64_t reservation_id);

/* A reservation as pb_reservations lists it. */
struct pb_reservation_info {
	uint64_t id;
	uint32_t uid;
	char name[64];
	char job[256];  /* the job it is charged to, "" when none (cut to fit) */
	char state[16]; /* "open" (shares left) or "taken" */
	uint32_t shares;
	uint64_t share_bytes;
	uint32_t taken;
	uint64_t bytes_reserved; /* reserved and not taken: counted as leased in the budget */
	uint32_t members;        /* connections that reserved or joined it */
	uint64_t age_ms;
};

/*
 * The reservations alive that the caller may see (its uid's; every one for an admin or with status-visibility =
 * all), newest first, at most 64, in *rows (free() it), and the host's reserved-not-taken bytes in
 * *reserved_bytes (may be NULL). Returns 0 or a negative errno.
 */
int pb_reservations(pb_client *c, struct pb_reservation_info **rows, size_t *n, uint64_t *reserved_bytes);

/*
 * The start of a lease's memory: the mapping for broker memory, p for a pb_register lease, the
 * allocation for fallback memory; NULL once the lease was revoked and given back (PB_MEM_REVOKED).
 * Valid until pb_release(); NULL for a NULL l.
 */
void *pb_lease_data(const pb_lease *l);
/* Its usable size in bytes: the size asked for, rounded up to whole pages (0 for a NULL l). */
size_t pb_lease_size(const pb_lease *l);
/* The page size it is mapped with: the pool's (2 MiB on hugetlb pages), the system's for fallback memory. */
size_t pb_lease_page_size(const pb_lease *l);
/* The daemon's id for the lease, as `pinctl leases` and pb_admin_revoke() name it; 0 for fallback memory. */
uint64_t pb_lease_id(const pb_lease *l);
/* What its memory is (enum pb_memory_kind): PB_MEM_REVOKED once revoked and given back. */
enum pb_memory_kind pb_lease_kind(const pb_lease *l);
/* 1 when the memory is registered with CUDA in this process (kind PB_MEM_PINNED), else 0. */
int pb_lease_cuda_registered(const pb_lease *l);
/*
 * 0 when the lease (or registration) is registered with CUDA in one piece, or not registered; else the stride
 * of its pieces. The driver takes one registration call of less than 512 GiB (r580), so a lease bigger than
 * PINBROKER_CUDA_REGISTER_PIECE (256 GiB by default) is registered as consecutive pieces starting every that
 * many bytes from its first page (for a lease, pb_lease_data itself). A single cudaMemcpyAsync that crosses a
 * piece boundary spans two registrations, which the driver may refuse ("invalid argument") or stage as
 * pageable: split such a copy at the boundary.
 */
size_t pb_lease_cuda_piece_bytes(const pb_lease *l);
/* 1 when every chunk of the lease is on 2 MiB hugetlb pages, else 0. */
int pb_lease_hugetlb(const pb_lease *l);
/* How many of the daemon's memfd chunks are mapped back to back to make the lease; 0 for fallback memory. */
size_t pb_lease_chunks(const pb_lease *l);
/*
 * Why a lease is fallback memory ("broker refused: over uid quota", "not connected to a broker", ...), for a
 * log line; NULL unless its kind is PB_MEM_FALLBACK. Owned by the lease: valid until pb_release().
 */
const char *pb_lease_fallback_reason(const pb_lease *l);

/* 1 when the broker no longer counts the lease (see "Lease handles" above): still mapped, not brokered. */
int pb_lease_stale(const pb_lease *l);

/*
 * Mark a lease idle (1) or busy (0). On REVOKE with no callback set, the
 * library releases idle leases itself; busy ones go to the callback or are
 * reported overdue. Returns 0 (also for fallback memory, where it does
 * nothing), or:
 *   -ESTALE the lease was revoked and given back (pb_lease_data() is NULL:
 *           do not touch the memory), or it is stale (still mapped, no longer
 *           counted); call pb_release() on it either way;
 *   -EINVAL l is NULL or was released.
 */
int pb_lease_set_idle(pb_lease *l, int idle);

/*
 * Called from the library's receiver thread when the daemon revokes a lease:
 * stop using the buffer and call pb_release() (from any thread) before
 * deadline_ms. Return 0 if handled.
 */
typedef int (*pb_revoke_fn)(pb_client *c, pb_lease *l, uint32_t deadline_ms, void *userdata);
void pb_set_revoke_callback(pb_client *c, pb_revoke_fn fn, void *userdata);

/*
 * Client cache of released buffers, in bytes (0 disables and gives back what it holds; default from
 * $PINBROKER_CACHE_BYTES, else 0).
 *
 * pb_release() of a lease keeps it mapped and registered here instead, and a later pb_acquire() of a like
 * size with the same flags (PB_ACQUIRE_NO_CUDA, _NO_REVOKE, _MAPPED) and priority takes it back without
 * asking the daemon. The daemon still counts a cached lease against the budget and the uid; a lease that
 * has sat in the cache for one to two ticks (pb_set_cache_idle_ms, 100 ms by default) is shown to it as idle,
 * so it is revoked first, and this library gives it back at once when it is (never-revoked leases included:
 * cached, they are revocable).
 * When the limit would be passed, the longest-cached leases are given back first. Shared, attached,
 * registered (pb_register), stale and revoked leases are never cached.
 */
void pb_set_cache_limit(pb_client *c, size_t bytes);
/*
 * How much smaller than a cached lease a request may be and still be served by it, in percent of the
 * request's page-rounded size: 0 serves only the same page-rounded size (what an allocator counting
 * exact bytes wants), 100 (the default) up to twice the size.
 */
void pb_set_cache_slack(pb_client *c, unsigned percent);
/*
 * The cache's tick, in milliseconds: a lease cached one to two ticks ago, still cached, is shown to the daemon
 * as idle (what it revokes first). Shorter frees cached memory for others sooner; longer sends fewer messages for
 * leases reused within the tick. Clamped to 1..3,600,000 (an hour); default from $PINBROKER_CACHE_IDLE_MS, else
 * 100. It takes effect at once: the schedule starts again. The library wakes only while a cached lease waits to
 * be told idle.
 */
void pb_set_cache_idle_ms(pb_client *c, unsigned ms);

/* The client cache's figures (pb_cache_stats). */
struct pb_cache_stats {
	size_t limit_bytes;   /* pb_set_cache_limit */
	size_t cached_bytes;  /* held in the cache now */
	size_t cached_leases; /* how many leases that is */
	unsigned slack_pct;   /* pb_set_cache_slack */
	uint64_t hits;        /* pb_acquire calls served from the cache */
	uint64_t misses;      /* pb_acquire calls that asked the daemon while caching was on */
	uint64_t kept;        /* pb_release calls that cached the lease */
	uint64_t evicted;     /* cached leases given back to stay under the limit (or by a lower limit) */
	uint64_t revoked;     /* cached leases the daemon revoked (given back at once) */
	uint64_t told_idle;   /* cached leases the daemon was told are idle */
};
/* Fill *out; returns 0, or -EINVAL for a NULL argument. */
int pb_cache_stats(pb_client *c, struct pb_cache_stats *out);

/* The CUDA state of this process: 1 usable, 0 not, with a reason ("no libcuda.so.1", ...). */
int pb_cuda_available(const char **reason);

/*
 * Staged copies: a copy between device memory and ordinary (pageable) host memory, carried out through a
 * small pinned ring leased from the broker, at close to pinned memory's rate. The ring (a lease, counted,
 * exact, revocable) is taken on the first staged copy, per pb_client; several threads copy between the
 * caller's memory and ring slots while the GPU copies the slots, on the caller's stream.
 *
 * Same results as cuMemcpyHtoDAsync / cuMemcpyDtoHAsync from pageable memory, sooner:
 * - pb_copy_to_device returns once src may be reused; the copy is ordered on stream (NULL: the legacy
 *   default stream), and may still be running on the GPU when it returns;
 * - pb_copy_from_device returns when the data is in dst.
 * Memory that is not pageable (pinned, registered, managed), a copy under the threshold, a stream being
 * captured, a refused or revoked ring: the copy goes to the driver as it is, so it never fails because of
 * the broker. Both need a current CUDA context (the one dptr belongs to).
 * Returns 0, or -EINVAL (a NULL pointer with bytes > 0), -ENODEV (no CUDA driver here), -EIO (the driver
 * failed the copy: pb_last_error() names its error).
 */
int pb_copy_to_device(pb_client *c, uint64_t dptr, const void *src, size_t bytes, void *stream);
int pb_copy_from_device(pb_client *c, void *dst, uint64_t dptr, size_t bytes, void *stream);

/* Settings of a client's staged copies; 0 in a field means $PINBROKER_STAGING_* or the default. */
struct pb_staging_opts {
	size_t ring_bytes;      /* the ring's size ($PINBROKER_STAGING_RING) */
	size_t slot_bytes;      /* one slot, the unit of the pipeline ($PINBROKER_STAGING_SLOT) */
	unsigned threads;       /* host threads copying to and from slots ($PINBROKER_STAGING_THREADS) */
	size_t threshold_bytes; /* smaller copies go to the driver ($PINBROKER_STAGING_THRESHOLD) */
};
/*
 * Set before the first staged copy; returns 0, -EINVAL (a bad value: pb_last_error says which), -EBUSY (a ring is
 * held).
 */
int pb_staging_configure(pb_client *c, const struct pb_staging_opts *opts);

/* What a client's staged copies did. */
struct pb_staging_stats {
	uint64_t h2d_bytes, d2h_bytes;   /* bytes staged through the ring, each way */
	uint64_t h2d_copies, d2h_copies; /* copies staged */
	uint64_t driver_copies;          /* pageable copies at or over the threshold that went to the driver instead */
	uint64_t ring_bytes;             /* the ring held now (0: none) */
	uint64_t ring_leases;            /* rings acquired so far */
	uint64_t ring_revoked;           /* rings the daemon revoked */
	uint64_t ring_refused;           /* ring acquisitions refused */
	uint64_t busy_ns;                /* time spent in staged copies */
};
/* Fill *out; returns 0, or -EINVAL for a NULL argument. */
int pb_staging_stats(pb_client *c, struct pb_staging_stats *out);

/*
 * Shared leases.
 *
 * One lease, mapped by several processes, counted once. The holder of a lease (the process that acquired it) calls
 * pb_lease_share() to get a token, and passes it to other processes by any means (a pipe, an
 * environment variable, a DataLoader worker's arguments). Each calls
 * pb_attach() on its own pb_client and maps the same memory: what one writes,
 * the others read. The token is the only key: 128 random bits, so hand it only
 * to processes that should map the lease.
 *
 * - Who may attach: processes of the holder's uid, and of the uids named in
 *   pb_lease_share(). A lease has one token for its life: sharing it again
 *   returns the same token and adds the uids named (at most 32 besides the
 *   holder's).
 * - Accounting: the lease is charged once, to the holder's uid, and stays
 *   charged until its last mapper lets go. pb_release() by the holder with
 *   attachers left only detaches the holder; the lease lives on for them.
 *   An attacher's pb_release() detaches it. A mapper that exits or crashes lets
 *   go like a pb_release(); one whose connection drops while the process lives
 *   keeps the lease counted until it exits.
 * - Revocation: a revoke reaches every mapper (each gets its revoke callback)
 *   and every one must pb_release() before the deadline; the deadline's
 *   enforcement (revoke-enforce) applies to each of them.
 * - Shared and attached leases never go to the client cache: pb_release() on
 *   them always lets go at once.
 * - What an attacher can keep: a process may keep a view of the pages after
 *   its pb_release() (a second mapping, a forked child, the fd passed on), and
 *   keeps seeing and writing what is in the lease until the lease ends. Write
 *   nothing into a shared lease that its attachers must not see, and trust
 *   nothing read from it, until it is released. Once an attacher of another
 *   uid has mapped it, its memory is never lent again, to anyone: the holder's
 *   later leases are fresh memory. An attachment by the holder's own uid
 *   changes nothing (that uid may read the holder's memory anyway).
 * - A daemon restart: the holder re-declares its lease as usual, attachments
 *   are not re-declared: an attached handle goes stale (pb_lease_stale() is 1;
 *   its memory stays mapped here; release it and attach again with a fresh
 *   token from the holder). The daemon keeps the lease counted until such a
 *   stale attacher exits, so its memory never reaches anyone else meanwhile.
 */
#define PB_SHARE_TOKEN_LEN 33 /* 32 hex characters + NUL */

/*
 * Let processes of the holder's uid, plus nuids more uids (uids may be NULL
 * when nuids is 0), attach to l, a lease this process acquired (c may be NULL:
 * the lease knows its client). Writes the
 * lease's NUL-terminated token (token[0] is NUL on failure). The holder's uid
 * need not be named; naming a uid twice is harmless. Returns 0, or -EINVAL (a
 * fallback, stale, attached, revoked or released lease, or the uids granted
 * over all calls would pass 32 besides the holder's; the grant is unchanged),
 * -ECONNRESET (the daemon went away), or another -errno from the daemon.
 */
int pb_lease_share(pb_client *c, pb_lease *l, const uid_t *uids, size_t nuids, char token[PB_SHARE_TOKEN_LEN]);

/*
 * Map the lease a token names, registered with CUDA like an acquired lease
 * (unless PINBROKER_NO_CUDA is set; pb_lease_kind says which), and return a
 * handle to it in *ret. pb_release(c, *ret) detaches. The revoke callback
 * fires for it like for an acquired lease. Returns 0, or -ENOENT (an unknown,
 * forged, mistyped or stale token: its lease was released or is being
 * revoked), -EACCES (this uid was not granted), -EINVAL (this connection
 * already maps that lease, as its holder or attached: attach from another
 * pb_client), -EUSERS (max-leases-per-client, attachments included),
 * -ECONNRESET, or another -errno.
 */
int pb_attach(pb_client *c, const char *token, pb_lease **ret);

/*
 * pb_attach() with options: opts->flags may hold PB_ACQUIRE_NO_CUDA (map only, so that
 * pb_lease_register_slice() can register just this process's part) and PB_ACQUIRE_MAPPED; the other
 * fields are not read. opts may be NULL. Returns what pb_attach() returns, or -EINVAL for another flag.
 */
int pb_attach_opts(pb_client *c, const char *token, const struct pb_acquire_opts *opts, pb_lease **ret);

/*
 * Register with CUDA only [offset, offset + length) of a broker lease mapped with PB_ACQUIRE_NO_CUDA
 * (acquired or attached): the slice one rank of a shared region copies from, so that N ranks of one
 * region pin it in the driver once in all, not N times. offset is a multiple of the lease's page size
 * (pb_lease_page_size), length is rounded up to whole pages; flags is 0 or PB_ACQUIRE_MAPPED. The lease's
 * kind becomes PB_MEM_PINNED (pb_lease_cuda_slice says which part is); release unregisters it. Call it
 * while the lease is the caller's (not concurrently with its release). Returns 0, -EINVAL (not broker
 * memory, a misaligned offset, zero length, another flag, released), -ERANGE (past the lease's end),
 * -EALREADY (already registered here, whole or a slice), -EBUSY (another thread's call for this lease is
 * registering now: one of two concurrent callers registers, the other gets -EBUSY), -ENODEV (no usable CUDA
 * driver here), or the driver's failure as a negative errno (pb_last_error says which CUDA error).
 */
int pb_lease_register_slice(pb_lease *l, size_t offset, size_t length, uint32_t flags);

/* 1 with *offset and *length (either may be NULL) set when only a slice of l is registered with CUDA here, else 0. */
int pb_lease_cuda_slice(const pb_lease *l, size_t *offset, size_t *length);

/* 1 if l was mapped with pb_attach(), 0 otherwise. */
int pb_lease_attached(const pb_lease *l);

/* The human message for the last failure in this thread. Never NULL. */
const char *pb_last_error(void);
/*
 * A short description of a negative errno as the library uses it ("over uid quota" for -EDQUOT,
 * "budget exhausted" for -ENOSPC, ...), else strerror's; a static string, never NULL.
 */
const char *pb_strerror(int err);
/*
 * The library's version, "MAJOR.MINOR.PATCH" (as PINBROKER_VERSION_* of the header it was built
 * with). A static string, never NULL; any thread, no connection needed.
 */
const char *pb_version(void);

/* ---- status and administration (used by pinctl) ---- */

/* One row per connection: a process with two connections has two rows; a lease counts on the one holding it. */
struct pb_client_info {
	int32_t pid;
	uint32_t uid;
	uint32_t leases;
	uint64_t bytes;
	char *labels;      /* up to 4 distinct labels of its leases, comma-separated, "" if none */
	char *name;        /* the client name from its HELLO, control characters replaced by '?' */
	uint32_t attached; /* of its leases, how many it maps through a share token (also in leases and bytes) */
	uint64_t unbrokered_bytes; /* pinned outside the broker, as its pb_report_unbrokered last said */
};

struct pb_lease_info {
	uint64_t id;
	int32_t pid;
	uint32_t uid;
	uint64_t bytes;
	char *label;
	uint64_t age_ms;
	enum pb_priority priority;
	char *state; /* "active", "idle", "revoking", "overdue", "orphaned" */
	uint64_t idle_ms;
	int64_t deadline_left_ms; /* while revoking; negative when overdue */
	/* Sharing (pb_lease_share): the lease is counted once, to uid, whoever maps it. */
	int shared;             /* 1 once a share token exists */
	int holder_detached;    /* 1 when its holder let go and it lives on for its attachers */
	uint32_t attachers;     /* connections attached to it now */
	size_t n_attacher_pids; /* how many of attacher_pids are set (at most PB_LEASE_INFO_PIDS) */
#define PB_LEASE_INFO_PIDS 16
	int32_t attacher_pids[PB_LEASE_INFO_PIDS];
	int registration; /* 1 for a pb_register charge: memory the program owns, not pool memory */
	int no_revoke;    /* 1 when never revoked: its holder cannot give memory back */
	int numa_node;    /* the node its pages are on, -1 when not placed */
	int misplaced;    /* 1 when placed for a node and some pages are elsewhere */
	char *job;        /* the job it is charged to (pb_quota_list's jobs), "" when none */
	/*
	 * A registration of shared memory (a /dev/shm file, a memfd): registrations of one file are charged
	 * once, by the union of their pages, each page to the oldest registration covering it. charged_bytes:
	 * what this row carries (bytes for any other lease); registrants: registrations of the same file, this
	 * one included (0: not shared memory); their pids, those of uids the caller may see.
	 */
	uint64_t charged_bytes;
	uint32_t registrants;
	/* 1 for a staging ring (PB_ACQUIRE_STAGING_RING), as the daemon counts it; 0 from an older library or
	 * daemon. It sits in what was padding: the struct keeps its size and every other member its offset. */
	int staging_ring;
	size_t n_registrant_pids;
	int32_t registrant_pids[PB_LEASE_INFO_PIDS];
};

struct pb_signal_info {
	char *name;
	double value;
	double tight;
	double critical;
	char *unit;
	int available;
};

struct pb_event_info {
	uint64_t age_ms;
	char *text;
};

struct pb_node_info {
	int node;
	uint64_t idle_bytes;      /* pool memory on it, idle */
	uint64_t lent_bytes;      /* pool memory on it, lent */
	uint64_t misplaced_bytes; /* of it, chunks with pages off the node they were asked for */
	uint32_t gpus;            /* NVIDIA GPUs on it */
	uint64_t mem_free_bytes;  /* its MemFree when the daemon started */
};

/* One uid's unbrokered reports (pb_report_unbrokered), summed over its connections: its word, never verified. */
struct pb_unbrokered_uid {
	uint32_t uid;
	uint32_t connections;    /* its connections that report more than 0 */
	uint64_t reported_bytes; /* the sum of their last reports */
	uint64_t counted_bytes;  /* of that, what counts in unbrokered_bytes: at most unbrokered_cap_bytes */
};

struct pb_status {
	uint32_t schema_version;
	char *server_version;
	uint64_t budget_bytes;
	uint64_t uid_quota_bytes;
	uint64_t leased_bytes;
	uint64_t pool_bytes;
	uint64_t pool_idle_bytes;
	uint64_t page_size_bytes;
	uint64_t chunk_size_bytes;
	int hugetlb;
	uint64_t overdue_bytes;
	uint64_t cached_idle_bytes;
	uint64_t prewarm_bytes;
	uint32_t waiting_acquires;
	char *pressure_state;
	char *monitor_mode;
	uint64_t uptime_ms;
	size_t n_clients;
	struct pb_client_info *clients;
	size_t n_leases;
	struct pb_lease_info *leases;
	size_t n_signals;
	struct pb_signal_info *signals;
	size_t n_transitions;
	struct pb_event_info *transitions;
	size_t n_revocations;
	struct pb_event_info *revocations;
	uint64_t registered_bytes; /* of leased_bytes, pb_register charges */
	uint64_t no_revoke_bytes;  /* of leased_bytes, never revoked (interposed programs, registrations) */
	/* Pinned outside the budget, reported by clients and not verified: on top of leased_bytes. Each uid's sum
	 * and the total are capped at unbrokered_cap_bytes, so no uid can inflate it past what the host holds. */
	uint64_t unbrokered_bytes;
	/* The pool's pages. */
	char *page_kind;                /* "hugetlb", "thp" or "4k" ("unknown" from an older daemon) */
	uint64_t thp_bytes;             /* pool chunks collapsed into transparent huge pages */
	uint64_t thp_failures;          /* chunks whose collapse failed (on 4 KiB pages) */
	uint64_t hugetlb_bytes;         /* pool chunks on hugetlb pages */
	uint64_t huge_pages_free_bytes; /* the host's free hugetlb memory */
	size_t n_nodes;                 /* NUMA nodes the pool places on (0: no placement) */
	struct pb_node_info *nodes;
	/* Per-job quotas: the jobs with a quota or with leases, largest first, at most 64 (pb_quota_list has
	 * them all); every job for admins (or status-visibility = all), else the caller's own. */
	size_t n_jobs;
	struct pb_job *jobs; /* struct pb_job is below */
	/* client_cgroups[i] is clients[i]'s cgroup at connect, "" when unknown: kept apart so that
	 * struct pb_client_info, which programs index by its size, keeps its layout. */
	char **client_cgroups;
	/* Unbrokered reports before the caps, the cap (MemTotal less the pool and registrations; UINT64_MAX
	 * when the daemon does not know MemTotal, 0 from an older daemon), and per uid, the largest reports
	 * first (at most 64; visible as client rows are). */
	uint64_t unbrokered_reported_bytes;
	uint64_t unbrokered_cap_bytes;
	size_t n_unbrokered_uids;
	struct pb_unbrokered_uid *unbrokered_uids;
	/* Of leased_bytes, memory an earlier daemon instance lent that live processes still map: after a restart
	 * it stays counted until they let go (0 from an older daemon). */
	uint64_t orphaned_bytes;
	/* The pool's chunk classes: chunk_size_bytes * 2^k up to chunk_max_bytes (chunk_size_bytes from an older
	 * daemon: one class), and the chunks its fds and mappings allow (0 from an older daemon). */
	uint64_t chunk_max_bytes;
	uint64_t chunk_capacity;
	/* The daemon's start warm-up still runs: serving, its pool grows toward prewarm_bytes (false from an
	 * older daemon, which served only once warm). */
	int pool_warming;
};

/*
 * The daemon's status: the summary, every client row, and with
 * PB_STATUS_LEASES every lease row. The daemon sends rows in pages that fit
 * one packet (up to 1024 of each kind); this asks for page after page, one
 * round trip each, and returns them all. Pages are read one after the other,
 * not as one snapshot: a lease that comes or goes meanwhile may be listed or
 * not, but none is listed twice. Under the daemon's status-visibility = own
 * (the default), a caller that is not an admin gets only its own uid's client
 * and lease rows (and no revocation events); the summary figures are always
 * the whole host's. Free *ret with pb_status_free. Returns 0 or a negative
 * errno (-ECONNRESET, -ENOMEM, -EPROTO for a reply that makes no sense).
 */
#define PB_STATUS_LEASES (1u << 0)
int pb_status_query(pb_client *c, unsigned flags, struct pb_status **ret);
/* The status with every lease row: pb_status_query(c, PB_STATUS_LEASES, ret). */
int pb_status_get(pb_client *c, struct pb_status **ret);
/* Free what pb_status_query() or pb_status_get() returned, every row included (NULL is fine). */
void pb_status_free(struct pb_status *s);
/*
 * The daemon's cgroup namespace, as it learned it at start: "host" (it reads cgroups as pid 1 does),
 * "private" (a namespace of its own that it placed in the host's tree: clients' cgroups are the host's
 * paths, and *root, where root is not NULL, is its namespace root's) or "unresolved" (a namespace of its
 * own it could not place: clients outside it have no cgroup, so quotas on theirs do not bind). NULL from an
 * older daemon (*root NULL unless "private"). The strings belong to s, which pb_status_query or pb_status_get
 * returned. Kept out of struct pb_status so that its layout stays.
 */
const char *pb_status_cgroup_namespace(const struct pb_status *s, const char **root);
/*
 * What the daemon knew at start of the memory its predecessor lent: *books (optional) is "none", "complete" (its
 * restart state named every lease), "partial" or "unknown" (NULL from an older daemon). Returns a sentence when
 * the daemon cannot see all its predecessor lent (an unusable state file and other uids' /proc it may not
 * read), else NULL.
 */
const char *pb_status_restart_warning(const struct pb_status *s, const char **books);
/*
 * s->pool_warming (1 or 0), for bindings that read struct pb_status by its layout: the function's presence says the
 * struct ends with the field (a library without it has a shorter struct).
 */
int pb_status_pool_warming(const struct pb_status *s);
/*
 * Clients connected now whose job the daemon could not tell (their /proc/PID/cgroup was hidden or unreadable
 * when they connected), and through *acquires (where not NULL) how many acquires such clients made since the
 * daemon started while job quota rules existed: refused under job-unknown = refuse, else charged to no job.
 * 0 from an older daemon. Kept out of struct pb_status so that its layout stays.
 */
uint32_t pb_status_job_unknown(const struct pb_status *s, uint64_t *acquires);

/* A client row's staged copies (pb_status_client_staging): its last report, its rate, its rings. */
struct pb_client_staging {
	uint64_t h2d_bytes, d2h_bytes;             /* staged through its ring since it connected, as it reported */
	uint64_t h2d_copies, d2h_copies;           /* copies staged */
	uint64_t driver_copies;                    /* pageable copies over the threshold left to the driver */
	uint64_t ring_revoked, ring_refused;       /* its rings revoked, ring acquisitions refused */
	uint64_t busy_ns;                          /* time in staged copies */
	uint64_t h2d_bytes_per_s, d2h_bytes_per_s; /* over the last few seconds of its reports (the daemon's figure) */
	uint64_t ring_bytes;                       /* its staging-ring leases' bytes now (the daemon's books) */
	uint32_t rings;                            /* and how many */
};
/*
 * s->clients[i]'s staged copies into *out. Returns 1 when the client reported staged copies or holds a ring, 0
 * when not (or an older daemon: *out all 0), -EINVAL for a NULL argument or i past n_clients. Kept out of
 * struct pb_client_info so that its layout stays.
 */
int pb_status_client_staging(const struct pb_status *s, size_t i, struct pb_client_staging *out);
/* The host's staging rings and staged bytes (pb_status_staging). */
struct pb_status_staging {
	uint32_t rings;      /* staging-ring leases held now */
	uint64_t ring_bytes; /* their bytes, of leased_bytes */
	uint64_t h2d_bytes;  /* bytes staged host to device since the daemon started, closed connections' too */
	uint64_t d2h_bytes;  /* device to host */
};
/* The summary's staging figures into *out (all 0 from an older daemon). Returns 0, or -EINVAL for a NULL argument. */
int pb_status_staging(const struct pb_status *s, struct pb_status_staging *out);

/*
 * One page of lease rows, for walking a long lease list without holding all
 * of it: the leases with id > cursor (0: from the first), in id order, at most
 * max_rows (0: as many as the daemon puts in one page, at most 1024). *next is
 * the cursor for the next page, 0 after the last one. A page may hold fewer
 * rows than asked, even none, before the end (the daemon bounds the work of
 * one page): go on until *next is 0.
 *
 *   uint64_t cur = 0;
 *   do {
 *           if (pb_leases_page(c, cur, 0, &rows, &n, &cur) < 0) break;
 *           ... rows[0..n) ...
 *           pb_lease_info_free(rows, n);
 *   } while (cur);
 *
 * Visibility as for pb_status_query. Free *rows (n of them) with
 * pb_lease_info_free. Returns 0 or a negative errno.
 */
int pb_leases_page(pb_client *c, uint64_t cursor, size_t max_rows, struct pb_lease_info **rows, size_t *n,
		   uint64_t *next);
/* Free the n rows pb_leases_page() returned (NULL is fine). */
void pb_lease_info_free(struct pb_lease_info *rows, size_t n);

/*
 * Revoke leases (admin): what is PB_REVOKE_LEASE (the lease lease_id),
 * PB_REVOKE_UID (every lease of uid) or PB_REVOKE_ALL (every lease); the
 * holders get deadline_ms to give them back (0 = the daemon's default).
 * *ids and *n list what was revoked (free(*ids)); both may be NULL.
 * Returns 0 or a negative errno (-EACCES for a caller that is not an admin).
 */
#define PB_REVOKE_LEASE 0
#define PB_REVOKE_UID 1
#define PB_REVOKE_ALL 2
/*
 * Admin: stop counting orphaned memory (what an earlier daemon lent, or a memfd found by its name, that
 * live processes still map): PB_REVOKE_ORPHANS all of it, PB_REVOKE_ORPHANS_UID uid's. Nothing is
 * signalled or unmapped. *n is how many orphans went; *ids stays NULL.
 */
#define PB_REVOKE_ORPHANS 3
#define PB_REVOKE_ORPHANS_UID 4
/*
 * A reservation (pb_reserve): lease_id names the reservation. It ends (its untaken bytes go back) and the leases
 * taken from it are revoked as PB_REVOKE_LEASE revokes one; *ids are those leases. Its uid or an admin may.
 */
#define PB_REVOKE_RESERVATION 5
int pb_admin_revoke(pb_client *c, int what, uint64_t lease_id, uint32_t uid, uint32_t deadline_ms, uint64_t **ids,
		    size_t *n);

/* Change a reloadable daemon setting (admin), e.g. ("budget", "8G"). */
int pb_admin_set(pb_client *c, const char *key, const char *value);

/*
 * Per-job quotas. Leases are charged to the client's cgroup; a quota rule names a cgroup path whose
 * components may be globs ("/kubepods.slice/" then "*": one quota per pod) and bounds what each job
 * it makes may hold. See pinctl quota.
 */
#define PB_JOB_PATH_MAX 512
struct pb_job {
	char job[PB_JOB_PATH_MAX]; /* the cgroup, or the part of its path a rule names */
	uint64_t bytes;            /* charged to it now */
	uint32_t leases;
	int has_quota; /* 0: no rule covers it (quota_bytes is 0) */
	uint64_t quota_bytes;
	char rule[PB_JOB_PATH_MAX]; /* the rule's pattern ("" without a quota) */
	char source[8];             /* "config" (the job-quota key) or "set" (pb_quota_set) */
};
struct pb_quota_rule {
	char pattern[PB_JOB_PATH_MAX];
	uint64_t bytes;
	char source[8];
	int seen; /* a set rule's cgroup was seen to exist: the rule is released once it is gone */
};
/* pb_quota_set flags. */
#define PB_QUOTA_CLEAR 1u  /* remove the rule instead of setting it (bytes is ignored) */
#define PB_QUOTA_REVOKE 2u /* also revoke the leases of every job cgroup matches */
/*
 * Set (or with PB_QUOTA_CLEAR, remove) the quota of cgroup (admin). With PB_QUOTA_REVOKE the
 * matching jobs' leases are revoked with deadline_ms (0: the daemon's default); their ids in
 * *ids (free it), *n of them (either may be NULL). Returns 0 or a negative errno. On success,
 * pb_last_error() is the daemon's warning if it gave one (a quota larger than the whole budget,
 * accepted but binding nothing), else "no error".
 */
int pb_quota_set(pb_client *c, const char *cgroup, uint64_t bytes, unsigned flags, uint32_t deadline_ms, uint64_t **ids,
		 size_t *n);
/*
 * The rules (admins, or with status-visibility = all; else none) and the jobs, largest first
 * (every job for them; else the caller's own). Free both arrays; either pointer may be NULL.
 */
int pb_quota_list(pb_client *c, struct pb_quota_rule **rules, size_t *nrules, struct pb_job **jobs, size_t *njobs);

/*
 * How much this client may still get now, from one state of the daemon: each bound an acquire meets
 * (the budget, the uid's and the job's quotas, the never-revoked cap, the pressure state, the fd and
 * lease-count caps) with its figures and a reason, and the least of them. A serving framework sizes
 * its host pool from available_bytes rather than from /proc/meminfo: an acquire of available_bytes
 * with the same flags is granted now, and one of a page (page_bytes) more is refused with the binding
 * bound's refusal, unless other clients' acquires or releases come between.
 */
enum pb_bound_kind {
	PB_BOUND_BUDGET = 0,      /* the host budget */
	PB_BOUND_UID_QUOTA = 1,   /* the uid quota (uid-quota, where below the budget) */
	PB_BOUND_JOB_QUOTA = 2,   /* the job's quota rule (pinctl quota) */
	PB_BOUND_JOB_UNKNOWN = 3, /* the job could not be read while quota rules exist: 0 */
	PB_BOUND_NO_REVOKE = 4,   /* max-no-revoke-per-uid (with PB_ACQUIRE_NO_REVOKE or PB_HEADROOM_REGISTER) */
	PB_BOUND_PRESSURE = 5,    /* tight: the free warm pool, 0 for never-revoked memory; critical: 0 */
	PB_BOUND_UID_LEASES = 6,  /* max-leases-per-uid: limit and used count leases */
	PB_BOUND_UID_CHUNKS = 7,  /* max-chunks-per-uid: limit and used count fds */
	PB_BOUND_CAPACITY = 8,    /* the daemon's chunk capacity: limit and used count fds */
	PB_BOUND_CONN_LEASES = 9, /* max-leases-per-client, this connection's: limit and used count leases */
};
#define PB_HEADROOM_BOUNDS_MAX 16
#define PB_HEADROOM_UNBOUNDED UINT64_MAX /* left_bytes of a count cap not reached: it bounds no bytes */
struct pb_headroom_bound {
	int kind;            /* enum pb_bound_kind; a newer daemon may send others */
	uint64_t limit;      /* bytes, or a count for the kinds that say so */
	uint64_t used;       /* the same unit as limit */
	uint64_t left_bytes; /* what an acquire may get under this bound, or PB_HEADROOM_UNBOUNDED */
	char reason[256];    /* the daemon's words: what the bound is, and its figures */
};
struct pb_headroom {
	uint64_t available_bytes; /* an acquire of this many bytes is granted now; a page more is refused */
	uint64_t page_bytes;      /* an acquire of these flags is rounded up to a whole number of these */
	size_t n_bounds;          /* bounds[0..n_bounds), in the order an acquire checks them */
	size_t binding;           /* the index in bounds of the one that binds */
	char state[16];           /* the pressure state: "normal", "tight" or "critical" */
	struct pb_headroom_bound bounds[PB_HEADROOM_BOUNDS_MAX];
};
/* pb_headroom flags: PB_ACQUIRE_NO_REVOKE, and this one for what pb_register may still charge. */
#define PB_HEADROOM_REGISTER (1u << 16)
/*
 * Fill *out with what an acquire with flags (PB_ACQUIRE_NO_REVOKE: the never-revoked cap binds too;
 * PB_HEADROOM_REGISTER: a registration, counted in the host's base pages) may get now. Any client may
 * ask about itself. Returns 0, -EINVAL (out NULL or an unknown flag), -EOPNOTSUPP (a daemon that
 * predates it) or another negative errno of the connection.
 */
int pb_headroom(pb_client *c, unsigned flags, struct pb_headroom *out);
/*
 * A bound's kind as a word: "budget", "uid_quota", "job_quota", "job_unknown", "no_revoke", "pressure",
 * "uid_leases", "uid_chunks", "capacity", "connection_leases"; "unknown" for a kind this library does not know.
 */
const char *pb_bound_name(int kind);

#ifdef __cplusplus
}
#endif

#endif /* PINBROKER_H */

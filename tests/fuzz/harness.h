/* SPDX-License-Identifier: MIT */
/*
 * The fuzz harnesses' core: one broker built in memory with real modules for the whole process, reset between
 * inputs, connections over socketpairs, and accounting checks.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "broker.h"
#include "daemon.h"
#include "server.h"

#define FZ_CONNS 2
/* Lease ids a connection's peer remembers from its replies, for the release-all op. */
#define FZ_IDS_MAX 16384

/*
 * Input flags byte: bit i makes connection i uid 0; FZ_FLAG_MANY picks the
 * many-leases profile, and with bits 3-7 equal to FZ_FLAGS_HUGE_MAGIC the
 * huge one. The magic keeps inputs with ten thousand leases (a quarter of a
 * second each) rare in random mutation, so they cannot eat the run.
 */
#define FZ_FLAG_MANY 0x04
#define FZ_FLAGS_HUGE_MAGIC 0x58

enum fz_profile {
	FZ_PROFILE_DEFAULT, /* 2 MiB budget, 16 leases per client, 16 KiB chunks */
	FZ_PROFILE_MANY,    /* 64 MiB budget, 320 leases per client, 4 KiB chunks, peers drained after each op */
	FZ_PROFILE_HUGE,    /* as MANY with 16384 leases per client */
};

struct fz {
	struct daemon d;             /* its broker is the request modules' */
	struct conn *conn[FZ_CONNS]; /* NULL once the daemon closed it */
	uint64_t conn_id[FZ_CONNS];
	int peer[FZ_CONNS]; /* our end of each socketpair, -1 once closed */
	uid_t uid[FZ_CONNS];
	uint64_t *ids[FZ_CONNS]; /* lease ids seen in replies on connection i */
	size_t nids[FZ_CONNS];
	uint64_t seq;            /* for requests the harness builds itself */
	size_t peak_leases;      /* the most live leases after any op of this input */
	unsigned prev_waiting;   /* waiting acquires after the previous op */
	int baseline_fds;        /* open at the start of this input */
	enum fz_profile profile; /* which config and pool the broker runs */
	struct pool *pools[2];   /* 16 KiB chunks (default profile), 4 KiB chunks (the others) */
	bool cfg_dirty;          /* a SET replaced the config during this input */
	uint64_t packets_sent;   /* by the request modules, through the harness's conn_io; never reset */
	/*
	 * Sharing across the two uids (the share ops, fz_bulk_op): the last share token connection i
	 * got in a reply and the lease it names; and the model of chunks whose fds went to another uid
	 * (chunk id and the lease it was in then, sorted by chunk id), kept apart from the daemon's
	 * own flag: such a chunk must never be idle again nor lent in any other lease.
	 */
	char token[FZ_CONNS][33];
	bool has_token[FZ_CONNS];
	uint64_t token_lease[FZ_CONNS];
	uint64_t share_asked[FZ_CONNS]; /* the lease of the SHARE in flight on connection i */
	struct fz_taint {
		uint64_t chunk_id, lease_id;
	} * taint;
	size_t ntaint, taint_cap;
};

/* Abort with a message: libFuzzer records the input as a crash. */
#define FZ_ASSERT(cond, ...)                                             \
	do {                                                             \
		if (!(cond))                                             \
			fz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__); \
	} while (0)
void fz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
	__attribute__((format(printf, 4, 5), noreturn));

/*
 * One-time process set-up: signals, the fd limit, the victim process whose
 * pid connections carry, the loop, and the broker itself. The broker runs
 * with budget 2 MiB of a pretend 64 MiB host, 16 KiB chunks, a 512 KiB warm
 * pool, unlocked memfds and short timeouts, plus the given "key=value"
 * overrides (NULL-terminated, may be NULL; keys a reload cannot change go
 * here). The many and huge profiles raise the budget to the whole pretend
 * host (16384 leases of 4 KiB, fewer where the fd limit is below 18432) and
 * use a second pool of 4 KiB chunks with 1 MiB warm, so a 4 KiB lease is one
 * warm chunk.
 */
void fz_global_init(const char *const *overrides);

/*
 * Start an input: pick the profile from flags (FZ_FLAG_MANY...), set each
 * connection's uid (bit i: uid 0, else 1000 + i), and count open fds.
 * The broker is in its canonical state: no leases, no connections, lease ids
 * from 1, pressure normal, exactly prewarm bytes idle in the pool.
 */
struct fz *fz_begin(unsigned flags);
/*
 * End an input: run the loop, drain, check, then reset the broker to its
 * canonical state (every connection closed, every lease freed, accounting
 * at zero) and assert that no fd leaked since fz_begin.
 */
void fz_end(struct fz *f);

/* Connection i, (re)created if the daemon closed it or its peer went away. */
struct conn *fz_conn(struct fz *f, int i);
/* True if connection i is still open on the daemon's side. */
bool fz_conn_alive(struct fz *f, int i);
/* Close our end of connection i: the daemon's next send fails with EPIPE. */
void fz_close_peer(struct fz *f, int i);

/* Run the loop once without blocking (flush queues, fire due timers, read input). */
void fz_run_loop(struct fz *f);
/* Move the daemon's monotonic clock on by ms (no real sleep: timers fire at the next loop run). */
void fz_advance_clock(uint64_t ms);
/* Read and check every reply waiting at each peer, closing any fds that came. */
void fz_drain(struct fz *f);
/* The same for connection i only. */
void fz_drain_one(struct fz *f, int i);
/* Put the broker in a pressure state, as the monitor would. */
void fz_set_state(struct fz *f, enum broker_state to);

/* Check the accounting invariants; aborts on a mismatch. */
void fz_check(struct fz *f);
/* After each op of an input: drain the peers in the many-leases profile, then fz_check. */
void fz_after_op(struct fz *f);

/* Open fds of this process. */
int fz_count_fds(void);
/* List open fds on stderr (for a leak report). */
void fz_dump_fds(void);

/*
 * The operations both harnesses share, ops 4-7 of an input byte: drain the
 * peers, flip the pressure state, run the loop (sometimes after 3 ms of
 * clock so timers fire), hang up peer i. Returns false for any other op.
 */
bool fz_common_op(struct fz *f, uint8_t op, int i);

/* How a harness hands one request packet to the daemon on connection i. */
typedef void (*fz_inject_fn)(struct fz *f, int i, const uint8_t *pkt, size_t len);

/*
 * Op 3: requests in bulk, built by the harness, so one input can hold
 * thousands of live leases and probe ids around them. Reads its argument
 * bytes from *p (advancing it, never past end). Sub-op (op >> 4) & 3:
 *   0  acquire burst on connection i: count byte C (C + 1 leases), size
 *      byte S (4 KiB, or 16 KiB where S >> 4 is 0xf; priority S & 3, 3
 *      meaning none); C = 0xff is followed by a byte M for ((M & 15) + 1) *
 *      1024 leases. A burst stops at the first refusal;
 *   1  id sweep: two bytes base id (little-endian), count byte (+1): one
 *      request per id of kind op >> 6: RELEASE, SET_IDLE, REVOKE_ACK or an
 *      admin REVOKE of that lease id;
 *   2  release the ids connection i saw in its lease replies: op >> 6 picks
 *      forward, reverse, every other one, or SET_IDLE instead of RELEASE;
 *   3  by op >> 6, with an argument byte K:
 *      0  clock: move the clock on by K * 10 ms and run the loop;
 *      1  SHARE on connection i of the (K % n)-th lease id it saw, with the
 *         other connection's uid (none with K & 0x80); the token comes back
 *         in the reply, which is read at once;
 *      2  ATTACH on connection i with the last token of the other connection
 *         (its own with K & 1), one hex digit changed with K & 2 (a forged
 *         token, which must be refused);
 *      3  let go as in issue 22 (finding 1): connection i RELEASEs the
 *         (K % n)-th lease it is attached to; with K & 0x80 its holder's
 *         connection then RELEASEs it too, and with K & 0x40 the holder
 *         acquires the same size again (which must get no chunk another
 *         uid mapped).
 * Replies are drained every 32 requests, as a client would read them.
 */
void fz_bulk_op(struct fz *f, uint8_t op, int i, const uint8_t **p, const uint8_t *end, fz_inject_fn inject);

/* A harness's own ops 0-2 on connection i: reads its argument bytes from *p (advancing it, never past end). */
typedef void (*fz_own_op_fn)(struct fz *f, uint8_t op, int i, const uint8_t **p, const uint8_t *end);

/*
 * One input as both harnesses read it (their LLVMFuzzerTestOneInput): the first byte fz_begin's flags, then one
 * op a byte, on connection (op >> 3) & 1: ops 0-2 own, 3 fz_bulk_op with inject, 4-7 fz_common_op, fz_after_op
 * after each; fz_end. Returns 0.
 */
int fz_run_input(const uint8_t *data, size_t size, fz_own_op_fn own, fz_inject_fn inject);

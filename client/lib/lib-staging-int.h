/* SPDX-License-Identifier: MIT */
/* Staged copies' state, shared by the pipeline (lib-staging.c) and the ring room (lib-staging-ring.c). */
#pragma once

#include "lib-int.h"
#include "staging-plan.h"

/* After a revoke or a refusal, copies go to the driver this long before a ring is asked for again. */
#define STAGING_BACKOFF_MS 5000
/* Counters go to the daemon at most this often while copying (and when the ring goes). */
#define STAGING_REPORT_MS 250

/* One slot of the ring: the event recorded after the last GPU copy that used it, until that is known done. */
struct staging_slot {
	void *pending;     /* NULL: free to fill or to copy into */
	void *pending_ctx; /* the context pending was recorded in */
};

/* The events of one CUDA context, one per slot (cuEventRecord needs the stream's context), made on first use. */
struct staging_events {
	void *ctx;
	void **ev;
	unsigned n;
	struct staging_events *next;
};

/* Threads that copy parts of one piece beside the calling thread. */
struct staging_pool {
	pthread_mutex_t lock;
	pthread_cond_t go, done;
	pthread_t *tids;
	unsigned n; /* workers running (the calling thread is one more) */
	bool stop;
	/* The job, under lock: parts taken in order by whoever is free, the caller included. */
	uint64_t gen;
	unsigned nparts, next_part, left;
	uint8_t *dst;
	const uint8_t *src;
	size_t bytes;
	bool stream; /* streaming stores (settings' stream_h2d or stream_d2h, by the copy's direction) */
};

struct pbst_state {
	pb_client *c;
	struct pbst_state *next; /* every client's state, for fork */
	/*
	 * lock: settings, stats, ring (the pointer), going, acquiring, retry_at_ms. Never held across a driver call,
	 * a wait or a message. ring_lock: held by the one staged copy using the ring (taken with trylock: a copy never
	 * waits for another) and by whoever takes or drops the ring; it guards the ring's contents, slots, next_slot
	 * and events. Order: ring_lock, then lock.
	 */
	pthread_mutex_t lock;
	pthread_mutex_t ring_lock;
	struct pbst_settings set;
	/* The smallest copy worth a look (SIZE_MAX: staging off), kept beside set for a lock-free first test (atomic). */
	size_t min_bytes;
	pb_lease *ring;
	uint8_t *ring_base;
	unsigned nslots;
	size_t slot_bytes;
	struct staging_slot *slots;
	unsigned next_slot; /* where the next copy starts: the slot least recently used */
	struct staging_events *events;
	bool going;     /* the daemon revoked the ring: it is dropped once no copy uses it (atomic) */
	bool acquiring; /* a ring is being asked for: a revoke of it comes before it is published */
	uint64_t retry_at_ms;
	struct pb_staging_stats stats;
	uint64_t report_at_ms;
	bool reported; /* stats changed since the last report */
	struct staging_pool pool;
};

/* c's state, made (settings from the environment) on first use; NULL when out of memory. */
struct pbst_state *staging_state(pb_client *c);
/* Under st->lock, after st->set changed: the smallest copy worth a look, for pbst_copy's first test. */
void staging_settings_changed_locked(struct pbst_state *st);
/* Under ring_lock: a ring of st->set's size, acquired now unless one is held or the back-off runs. 0 or -errno. */
int staging_ring_take(struct pbst_state *st);
/* Under ring_lock: wait for the GPU to finish with every slot, then give the ring back (revoked: back off). */
void staging_ring_drop(struct pbst_state *st, bool revoked);
/* Unlock ring_lock, then drop the ring if a revoke came meanwhile (whoever holds ring_lock last does it). */
void staging_ring_unlock(struct pbst_state *st);
/* Under ring_lock: the slots' events in the current context ctx, made on first use; NULL when the driver refused. */
void **staging_events(struct pbst_state *st, void *ctx);
/* Under ring_lock: the threads for st->set.threads, started on first use; 0 or -errno (then copies use one). */
int staging_pool_start(struct pbst_state *st);
/* Copy bytes from src to dst, split among up to n threads of st's pool (the caller is one); stream: with
 * streaming stores (pbst_stream_copy). */
void staging_pool_copy(struct pbst_state *st, void *dst, const void *src, size_t bytes, unsigned n, bool stream);
/* Under ring_lock: stop and join the pool's threads. */
void staging_pool_stop(struct pbst_state *st);
/* Send the counters when STAGING_REPORT_MS has passed since the last report (or now, when force). */
void staging_report(struct pbst_state *st, bool force);

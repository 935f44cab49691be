/* SPDX-License-Identifier: MIT */
/*
 * The recovery state's writer: snapshots and journal appends to the state memfd, and the pool's chunks kept in the fd
 * store.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ev.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "daemon.h"
#include "lease.h"
#include "log.h"
#include "notify.h"
#include "pool.h"
#include "recovery-int.h"
#include "recovery.h"
#include "restart.h"
#include "util.h"

/*
 * The full snapshot is O(leases), so the loop spends at most a tenth of its
 * time on it: after a snapshot that took t, the next waits 9 t (a few µs with
 * few leases, so then it is written every iteration that changed something).
 * Appends cover what happens in between; what a crash forgets is only release
 * history, which makes recovery hold that memory longer, never lend it.
 */
#define SNAPSHOT_SPACING_FACTOR 9u
#define SNAPSHOT_SPACING_MAX_US 1000000u
#define JOURNAL_MIN_BYTES (64u * 1024)

static int pwrite_all(int fd, const void *p, size_t n, uint64_t off)
{
	const char *c = p;

	while (n > 0) {
		ssize_t w = pwrite(fd, c, n, (off_t)off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		c += w;
		n -= (size_t)w;
		off += (uint64_t)w;
	}
	return 0;
}

void recovery_chunk_name(uint64_t id, char *buf, size_t len)
{
	snprintf(buf, len, "c%llu", (unsigned long long)id);
}

void recovery_poison(struct recovery *rc)
{
	/* Shrinking never needs memory. One byte, not zero: an empty state means "clean stop". */
	if (ftruncate(rc->state_fd, 1) < 0)
		log_warn("cannot invalidate the recovery state either; a crash now may mis-assign memory");
	rc->committed = false;
}

/* The pids holding l until they exit (the revoker's, through the hook), as many as its line has room for. */
static size_t hold_pids(const struct recovery *rc, const struct lease *l, pid_t holds[RECOVERY_MAPPERS_MAX])
{
	size_t nattached = l->nattachers < RECOVERY_MAPPERS_MAX ? l->nattachers : RECOVERY_MAPPERS_MAX;

	if (l->exit_holds == 0 || !rc->hold_pids)
		return 0;
	return rc->hold_pids(rc->b, l->id, holds, RECOVERY_MAPPERS_MAX - nattached);
}

static void put_lease(struct recovery *rc, struct recovery_buf *buf, const struct lease *l)
{
	pid_t holds[RECOVERY_MAPPERS_MAX];

	recovery_format_lease(buf, l, holds, hold_pids(rc, l, holds));
}

static void idle_line(const struct chunk *c, void *ud)
{
	recovery_format_idle(ud, c->id, c->owner_uid);
}

int recovery_commit_snapshot(struct recovery *rc)
{
	struct broker *b = rc->b;
	struct recovery_buf *body = &rc->body;
	struct recovery_desc d;
	uint64_t off, t0_us = now_us();
	int slot, r;

	recovery_buf_reset(body);
	/* A registration has no memfd to keep: after a restart its program's re-declare is refused. */
	for (const struct lease *l = lease_first(b->leases); l; l = lease_next(b->leases, l))
		if (!l->registration)
			put_lease(rc, body, l);
	pool_foreach_idle(daemon_of(b)->pool, idle_line, body);
	if (body->oom)
		return -ENOMEM;
	if (!rc->committed) {
		/* Nothing readable to keep: start over. Empty until the descriptor lands, which still
		 * quarantines every stored chunk (no line names them). */
		if (ftruncate(rc->state_fd, 0) < 0)
			return -errno;
		off = RECOVERY_BODY_START_BYTES;
	} else if (RECOVERY_BODY_START_BYTES + body->len <= rc->body_off) {
		off = RECOVERY_BODY_START_BYTES;
	} else {
		off = recovery_format_align8(rc->journal_end);
	}
	r = pwrite_all(rc->state_fd, body->p, body->len, off);
	if (r < 0)
		return r;
	recovery_format_desc(&d, rc->seq + 1, rc->instance_id, rc->max_lent_id, off, body->p, body->len);
	slot = rc->committed ? 1 - rc->slot : 0;
	r = pwrite_all(rc->state_fd, &d, sizeof(d), (uint64_t)slot * RECOVERY_DESC_BYTES);
	if (r < 0)
		return r;
	rc->committed = true;
	rc->slot = slot;
	rc->seq = d.seq;
	rc->body_off = off;
	rc->body_len = body->len;
	rc->journal_end = recovery_format_align8(off + body->len);
	rc->journal_bytes = 0;
	rc->written_generation = b->generation;
	rc->snapshot_us = now_us();
	rc->snapshot_cost_us = rc->snapshot_us - t0_us;
	/* Back at the front: what lies beyond (older snapshots) is dead weight. */
	if (off == RECOVERY_BODY_START_BYTES && ftruncate(rc->state_fd, (off_t)rc->journal_end) < 0)
		log_debug("cannot shrink the recovery state: %s", strerror(errno));
	return 0;
}

void recovery_lent(struct broker *b, const struct lease *l)
{
	struct recovery *rc = daemon_of(b)->recovery;
	pid_t holds[RECOVERY_MAPPERS_MAX];
	int r;

	/* The restart state file too: a crash without the fd store reads that. */
	restart_journal_lent(b, l);
	if (!rc || rc->state_fd < 0)
		return;
	if (l->id > rc->max_lent_id)
		rc->max_lent_id = l->id;
	if (l->registration)
		return; /* no memfd to keep; its id reaches the next descriptor */
	if (!rc->committed) {
		/* The snapshot holds l already: it is in the lease table. */
		r = recovery_commit_snapshot(rc);
		goto out;
	}
	r = recovery_format_record(&rc->rec, rc->seq, l, holds, hold_pids(rc, l, holds));
	if (r == 0)
		r = pwrite_all(rc->state_fd, rc->rec.p, rc->rec.len, rc->journal_end);
	if (r == 0) {
		rc->journal_end = recovery_format_align8(rc->journal_end + rc->rec.len);
		rc->journal_bytes += rc->rec.len;
	}
out:
	if (r < 0) {
		log_warnx("cannot record lease %llu in the recovery state (%s): after a crash every pool chunk "
			  "will be quarantined for redeclare-grace-ms instead of re-adopted",
			  (unsigned long long)l->id, strerror(-r));
		recovery_poison(rc);
	}
}

static void snapshot_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	/* Nothing to do here: waking the loop runs prepare_cb, which writes the snapshot. */
}

static void prepare_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
	struct recovery *rc = w->data;
	uint64_t since_us, spacing_us, limit_bytes;
	int r;

	/* Only when a broker verb changed something, and no more often than the spacing allows. */
	if (rc->committed && rc->b->generation == rc->written_generation)
		return;
	since_us = now_us() - rc->snapshot_us;
	spacing_us = rc->snapshot_cost_us * SNAPSHOT_SPACING_FACTOR;
	if (spacing_us > SNAPSHOT_SPACING_MAX_US)
		spacing_us = SNAPSHOT_SPACING_MAX_US;
	limit_bytes = rc->body_len > JOURNAL_MIN_BYTES ? rc->body_len : JOURNAL_MIN_BYTES;
	if (rc->committed && since_us < spacing_us && rc->journal_bytes < limit_bytes) {
		if (!ev_is_active(&rc->snapshot_timer)) {
			ev_timer_set(&rc->snapshot_timer, (double)(spacing_us - since_us) / 1e6, 0.);
			ev_timer_start(loop, &rc->snapshot_timer);
		}
		return;
	}
	ev_timer_stop(loop, &rc->snapshot_timer);
	r = recovery_commit_snapshot(rc);
	if (r < 0)
		log_debug("cannot write the recovery state snapshot (%s); the last one stays valid, retrying",
			  strerror(-r));
}

void recovery_writer_start(struct recovery *rc)
{
	ev_prepare_init(&rc->prepare, prepare_cb);
	rc->prepare.data = rc;
	ev_prepare_start(daemon_of(rc->b)->loop, &rc->prepare);
	ev_timer_init(&rc->snapshot_timer, snapshot_timer_cb, 0., 0.);
	rc->snapshot_timer.data = rc;
}

void recovery_writer_stop(struct recovery *rc)
{
	ev_prepare_stop(daemon_of(rc->b)->loop, &rc->prepare);
	ev_timer_stop(daemon_of(rc->b)->loop, &rc->snapshot_timer);
}

/* ------------------------------------------------------------ the pool's chunks in the fd store */

static void chunk_created(struct chunk *c, void *ud)
{
	char name[32];
	int r;

	recovery_chunk_name(c->id, name, sizeof(name));
	r = notify_fdstore(c->fd, name);
	if (r < 0)
		log_debug("cannot store chunk %s in the fd store: %s", name, strerror(-r));
}

static void chunk_destroyed(struct chunk *c, void *ud)
{
	char name[32];

	/* The store holds a reference: without removal the memory would outlive the chunk. */
	recovery_chunk_name(c->id, name, sizeof(name));
	notify_fdstore_remove(name);
}

void recovery_store_chunks(struct recovery *rc)
{
	pool_set_hooks(daemon_of(rc->b)->pool, &(struct pool_hooks){ chunk_created, chunk_destroyed, rc });
}

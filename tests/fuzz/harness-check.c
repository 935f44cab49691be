/* SPDX-License-Identifier: MIT */
/* The harness's checks: the daemon's books against a walk of its leases, pool and connections, after every op. */
#include <stdlib.h>

#include "backing.h"
#include "budget.h"
#include "config.h"
#include "harness-int.h"
#include "jobs.h"
#include "lease.h"
#include "pool.h"
#include "reservation.h"
#include "waitq.h"

/* Index of the listed, open connection c, or -1; a short list (a few per input). */
static int conn_index(struct conn *const *conns, size_t n, const void *c)
{
	for (size_t k = 0; k < n; k++)
		if (conns[k] == c)
			return (int)k;
	return -1;
}

#define FZ_CHECK_CONNS 64
/* Uids the per-uid books are checked for: the two connections' (both may be 0). */
#define FZ_CHECK_UIDS FZ_CONNS

static int taint_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct fz_taint *)a)->chunk_id, y = ((const struct fz_taint *)b)->chunk_id;

	return x < y ? -1 : x > y;
}

/* The model's entry for chunk id, or NULL. */
static const struct fz_taint *taint_find(const struct fz *f, uint64_t chunk_id)
{
	struct fz_taint key = { .chunk_id = chunk_id };

	return f->ntaint ? bsearch(&key, f->taint, f->ntaint, sizeof(key), taint_cmp) : NULL;
}

void fz_taint_model_add(struct fz *f, const struct lease *l)
{
	for (size_t k = 0; k < l->nchunks; k++) {
		if (taint_find(f, l->chunks[k].id))
			continue;
		if (f->ntaint == f->taint_cap) {
			size_t cap = f->taint_cap ? 2 * f->taint_cap : 256;
			struct fz_taint *v = realloc(f->taint, cap * sizeof(*v));

			FZ_ASSERT(v != NULL, "taint model of %zu chunks", cap);
			f->taint = v;
			f->taint_cap = cap;
		}
		f->taint[f->ntaint++] = (struct fz_taint){ l->chunks[k].id, l->id };
		qsort(f->taint, f->ntaint, sizeof(*f->taint), taint_cmp);
	}
}

struct idle_walk {
	const struct fz *f;
	uint64_t bytes;
	size_t n;
};

static void check_idle_chunk(const struct chunk *c, void *ud)
{
	struct idle_walk *w = ud;
	const struct fz_taint *t = taint_find(w->f, c->id);

	FZ_ASSERT(!c->tainted, "idle chunk %llu is tainted: another uid mapped it", (unsigned long long)c->id);
	FZ_ASSERT(t == NULL, "chunk %llu went to another uid in lease %llu and is back in the pool",
		  (unsigned long long)c->id, (unsigned long long)(t ? t->lease_id : 0));
	w->bytes += c->bytes;
	w->n++;
}

void fz_check(struct fz *f)
{
	struct broker *b = &f->d.broker;
	struct conn *conns[FZ_CHECK_CONNS];
	uint32_t held[FZ_CHECK_CONNS] = { 0 };
	size_t nconns = 0, nleases = 0, state_count[LEASE__STATE_MAX] = { 0 };
	uint64_t sum = 0, pending_conn = 0, state_bytes[LEASE__STATE_MAX] = { 0 }, prev_id = 0;
	uint64_t registered = 0, no_revoke = 0, unbrokered = 0, job_sum = 0;
	uint64_t rings = 0, ring_bytes = 0, staged_h2d = 0, staged_d2h = 0, conn_ring_bytes = 0;
	uint64_t uid_bytes[FZ_CHECK_UIDS] = { 0 }, uid_leases[FZ_CHECK_UIDS] = { 0 }, uid_chunks[FZ_CHECK_UIDS] = { 0 };
	uint64_t lent_chunks = 0;
	struct idle_walk idle = { .f = f };

	/* The books are checked where the daemon's loop would: after the reaper ran. */
	fz_reap(f);
	for (struct conn *c = server_conns(daemon_of(b)->server); c; c = c->next) {
		FZ_ASSERT(!c->closing, "closed connection %llu is still on the live list", (unsigned long long)c->id);
		FZ_ASSERT(nconns < FZ_CHECK_CONNS, "more than %d open connections", FZ_CHECK_CONNS);
		conns[nconns++] = c;
		pending_conn += c->npending;
		unbrokered += c->unbrokered_bytes;
		staged_h2d += c->staged.last.h2d_bytes;
		staged_d2h += c->staged.last.d2h_bytes;
		conn_ring_bytes += c->ring_bytes;
	}
	for (struct lease *l = lease_first(b->leases); l; l = lease_next(b->leases, l)) {
		uint64_t chunk_sum = 0;
		int k = l->owner ? conn_index(conns, nconns, l->owner) : -1;

		FZ_ASSERT(l->state != LEASE_FREED, "freed lease %llu still in the table", (unsigned long long)l->id);
		FZ_ASSERT(l->id > prev_id, "lease %llu walked after %llu", (unsigned long long)l->id,
			  (unsigned long long)prev_id);
		/* Every lease the walk sees must be what a lookup of its id finds: a broken chain hangs or misses here. */
		FZ_ASSERT(lease_find(b->leases, l->id) == l, "lease %llu not found by id", (unsigned long long)l->id);
		prev_id = l->id;
		for (size_t i = 0; i < l->nchunks; i++) {
			const struct fz_taint *t = taint_find(f, l->chunks[i].id);

			chunk_sum += l->chunks[i].mem->bytes;
			/* Sent to another uid: the daemon knows it, and the chunk never moved to another lease. */
			FZ_ASSERT(t == NULL || (t->lease_id == l->id && l->chunks[i].tainted),
				  "chunk %llu went to another uid in lease %llu; now in lease %llu, %s",
				  (unsigned long long)l->chunks[i].id, (unsigned long long)(t ? t->lease_id : 0),
				  (unsigned long long)l->id, l->chunks[i].tainted ? "tainted" : "not tainted");
		}
		for (size_t j = 0; j < l->nattachers; j++)
			for (size_t i = 0; l->attachers[j].uid != l->uid && i < l->nchunks; i++)
				FZ_ASSERT(l->chunks[i].tainted,
					  "lease %llu of uid %u has an attacher of uid %u but chunk "
					  "%llu is not tainted",
					  (unsigned long long)l->id, (unsigned)l->uid, (unsigned)l->attachers[j].uid,
					  (unsigned long long)l->chunks[i].id);
		lent_chunks += l->nchunks;
		for (int u = 0; u < FZ_CHECK_UIDS; u++)
			if (l->uid == f->uid[u]) {
				uid_bytes[u] += l->charged_bytes;
				uid_leases[u]++;
				uid_chunks[u] += l->nchunks;
				break;
			}
		/* A registration is a charge for the program's own memory: no chunks at all. */
		FZ_ASSERT(chunk_sum == (l->registration ? 0 : l->bytes),
			  "lease %llu%s: %llu bytes but chunks hold %llu", (unsigned long long)l->id,
			  l->registration ? " (registration)" : "", (unsigned long long)l->bytes,
			  (unsigned long long)chunk_sum);
		FZ_ASSERT(!l->registration || (l->no_revoke && !l->share), "registration %llu is revocable or shared",
			  (unsigned long long)l->id);
		FZ_ASSERT(!l->no_revoke || l->state == LEASE_ACTIVE || l->state == LEASE_IDLE,
			  "never-revoked lease %llu is %s", (unsigned long long)l->id, lease_state_name(l->state));
		/* A shared registration carries only the pages no older one of its file covers (backing.h). */
		FZ_ASSERT(l->charged_bytes == l->bytes || (l->backed && l->registration && l->charged_bytes < l->bytes),
			  "lease %llu is charged %llu of its %llu bytes", (unsigned long long)l->id,
			  (unsigned long long)l->charged_bytes, (unsigned long long)l->bytes);
		FZ_ASSERT(!l->backed || (b->backings && backing_charged(b->backings, l->backing_dev, l->backing_ino,
									l->id) == l->charged_bytes),
			  "shared registration %llu carries %llu, its file's ranges say otherwise",
			  (unsigned long long)l->id, (unsigned long long)l->charged_bytes);
		registered += l->registration ? l->charged_bytes : 0;
		no_revoke += l->no_revoke ? l->charged_bytes : 0;
		rings += l->staging_ring;
		ring_bytes += l->staging_ring ? l->bytes : 0;
		FZ_ASSERT(l->owner == NULL || k >= 0, "lease %llu is owned by a connection that is gone",
			  (unsigned long long)l->id);
		if (k >= 0)
			held[k]++;
		/* An attachment counts on its connection too (shared leases, lease.h). */
		for (size_t j = 0; j < l->nattachers; j++) {
			int ka = conn_index(conns, nconns, l->attachers[j].owner);

			FZ_ASSERT(ka >= 0, "lease %llu has an attacher whose connection is gone",
				  (unsigned long long)l->id);
			held[ka]++;
		}
		state_count[l->state]++;
		state_bytes[l->state] += l->bytes;
		sum += l->charged_bytes;
		job_sum += l->cgroup ? l->charged_bytes : 0;
		nleases++;
	}
	/*
	 * A reservation's untaken shares are charged as leased bytes, to its uid and its job (reservation.h); every
	 * member is a live connection, and a share moved to a lease leaves the reservation's books.
	 */
	{
		uint64_t held_sum = 0;

		for (const struct reservation *r = reservation_first(b); r; r = r->next) {
			FZ_ASSERT(r->taken <= r->shares &&
					  r->held_bytes == (uint64_t)(r->shares - r->taken) * r->share_bytes,
				  "reservation %llu: %u of %u shares taken, %llu held", (unsigned long long)r->id,
				  r->taken, r->shares, (unsigned long long)r->held_bytes);
			FZ_ASSERT(r->nmembers > 0, "reservation %llu has no member left", (unsigned long long)r->id);
			for (size_t m = 0; m < r->nmembers; m++)
				FZ_ASSERT(conn_index(conns, nconns, r->members[m]) >= 0,
					  "reservation %llu has a member whose connection is gone",
					  (unsigned long long)r->id);
			held_sum += r->held_bytes;
			sum += r->held_bytes;
			job_sum += r->cgroup ? r->held_bytes : 0;
			for (int u = 0; u < FZ_CHECK_UIDS; u++)
				if (r->uid == f->uid[u]) {
					uid_bytes[u] += r->held_bytes;
					break;
				}
		}
		FZ_ASSERT(held_sum == broker_reserved_bytes(b), "reservations hold %llu, the table says %llu",
			  (unsigned long long)held_sum, (unsigned long long)broker_reserved_bytes(b));
	}
	/* Every charged lease is in exactly one job, whatever the rules did to the grouping. */
	if (b->jobs) {
		uint64_t jobs_bytes = 0;

		for (const struct job *jb = jobs_first(b->jobs); jb; jb = jb->next)
			jobs_bytes += jb->bytes;
		FZ_ASSERT(jobs_bytes == job_sum, "jobs are charged %llu bytes, leases charged to cgroups hold %llu",
			  (unsigned long long)jobs_bytes, (unsigned long long)job_sum);
	}
	FZ_ASSERT(nleases == lease_count(b->leases), "lease_count %zu, walked %zu", lease_count(b->leases), nleases);
	for (int s = 0; s < LEASE__STATE_MAX; s++)
		FZ_ASSERT(lease_state_count(b->leases, s) == state_count[s] &&
				  lease_state_bytes(b->leases, s) == state_bytes[s],
			  "state %s: table counts %zu leases of %llu bytes, walk %zu of %llu", lease_state_name(s),
			  lease_state_count(b->leases, s), (unsigned long long)lease_state_bytes(b->leases, s),
			  state_count[s], (unsigned long long)state_bytes[s]);
	FZ_ASSERT(budget_leased(b->budget) == sum, "budget says %llu leased, leases hold %llu",
		  (unsigned long long)budget_leased(b->budget), (unsigned long long)sum);
	/* Per uid, each counted once (the connections' uids may be the same one). */
	for (int u = 0; u < FZ_CHECK_UIDS; u++) {
		if (u > 0 && f->uid[u] == f->uid[0])
			continue;
		FZ_ASSERT(
			budget_uid_leased(b->budget, f->uid[u]) == uid_bytes[u] &&
				budget_uid_leases(b->budget, f->uid[u]) == uid_leases[u] &&
				budget_uid_chunks(b->budget, f->uid[u]) == uid_chunks[u],
			"uid %u: budget counts %llu bytes, %llu leases, %llu chunks; its leases hold %llu, %llu, %llu",
			(unsigned)f->uid[u], (unsigned long long)budget_uid_leased(b->budget, f->uid[u]),
			(unsigned long long)budget_uid_leases(b->budget, f->uid[u]),
			(unsigned long long)budget_uid_chunks(b->budget, f->uid[u]), (unsigned long long)uid_bytes[u],
			(unsigned long long)uid_leases[u], (unsigned long long)uid_chunks[u]);
	}
	FZ_ASSERT(budget_chunks(b->budget) == lent_chunks, "budget counts %llu chunks lent, leases hold %llu",
		  (unsigned long long)budget_chunks(b->budget), (unsigned long long)lent_chunks);
	/* Every chunk the pool holds is idle or in exactly one lease; no tainted one is idle. */
	pool_foreach_idle(daemon_of(b)->pool, check_idle_chunk, &idle);
	FZ_ASSERT(idle.bytes == pool_idle_bytes(daemon_of(b)->pool) &&
			  idle.n + lent_chunks == pool_chunk_count(daemon_of(b)->pool),
		  "pool: %zu chunks (%llu bytes idle); idle list %zu chunks of %llu bytes, leases %llu chunks",
		  pool_chunk_count(daemon_of(b)->pool), (unsigned long long)pool_idle_bytes(daemon_of(b)->pool), idle.n,
		  (unsigned long long)idle.bytes, (unsigned long long)lent_chunks);
	FZ_ASSERT(pool_resident_bytes(daemon_of(b)->pool) ==
			  pool_idle_bytes(daemon_of(b)->pool) + sum - registered - broker_reserved_bytes(b),
		  "pool resident %llu != idle %llu + leased %llu - registered %llu - reserved",
		  (unsigned long long)pool_resident_bytes(daemon_of(b)->pool),
		  (unsigned long long)pool_idle_bytes(daemon_of(b)->pool), (unsigned long long)sum,
		  (unsigned long long)registered);
	FZ_ASSERT(b->registered_bytes == registered && budget_no_revoke(b->budget) == no_revoke,
		  "broker counts %llu registered, %llu never-revoked; leases hold %llu, %llu",
		  (unsigned long long)b->registered_bytes, (unsigned long long)budget_no_revoke(b->budget),
		  (unsigned long long)registered, (unsigned long long)no_revoke);
	FZ_ASSERT(b->staging_rings == rings && b->staging_ring_bytes == ring_bytes,
		  "broker counts %u staging rings of %llu bytes; leases hold %llu of %llu", b->staging_rings,
		  (unsigned long long)b->staging_ring_bytes, (unsigned long long)rings, (unsigned long long)ring_bytes);
	/* A connection's rings are among them (a holder that let go while attachers map it no longer counts its). */
	FZ_ASSERT(conn_ring_bytes <= ring_bytes, "connections count %llu ring bytes, leases hold %llu",
		  (unsigned long long)conn_ring_bytes, (unsigned long long)ring_bytes);
	/* The totals hold every live connection's last report, and closed ones' too. */
	FZ_ASSERT(b->staged.sum.h2d_bytes >= staged_h2d && b->staged.sum.d2h_bytes >= staged_d2h,
		  "staged totals %llu/%llu below the live connections' reports %llu/%llu",
		  (unsigned long long)b->staged.sum.h2d_bytes, (unsigned long long)b->staged.sum.d2h_bytes,
		  (unsigned long long)staged_h2d, (unsigned long long)staged_d2h);
	FZ_ASSERT(b->unbrokered_bytes == unbrokered, "broker counts %llu unbrokered, connections report %llu",
		  (unsigned long long)b->unbrokered_bytes, (unsigned long long)unbrokered);
	/* The per-uid table sums to the same, and what status shows never passes the cap. */
	FZ_ASSERT(b->unbrokered.reported_bytes == unbrokered,
		  "per-uid unbrokered sums to %llu, connections report %llu",
		  (unsigned long long)b->unbrokered.reported_bytes, (unsigned long long)unbrokered);
	FZ_ASSERT(unbrokered_counted(&b->unbrokered, daemon_unbrokered_cap(b)) <= daemon_unbrokered_cap(b),
		  "counted unbrokered over its cap");
	for (size_t k = 0; k < nconns; k++)
		FZ_ASSERT(conns[k]->nleases == held[k], "connection %llu counts %u leases, holds %u",
			  (unsigned long long)conns[k]->id, conns[k]->nleases, held[k]);
	FZ_ASSERT(pending_conn == waitq_count(b), "connections count %llu waiting acquires, queue has %u",
		  (unsigned long long)pending_conn, waitq_count(b));
	/*
	 * A SET that lowers max-pending-acquires keeps the acquires already waiting (they time out or are
	 * granted as usual): the bound is that the queue never grows while it is over the limit.
	 */
	FZ_ASSERT(waitq_count(b) <= daemon_of(b)->cfg->max_pending_acquires || waitq_count(b) <= f->prev_waiting,
		  "%u waiting acquires over max-pending-acquires %u (%u before this op)", waitq_count(b),
		  daemon_of(b)->cfg->max_pending_acquires, f->prev_waiting);
	f->prev_waiting = waitq_count(b);
}

void fz_check_order(struct fz *f)
{
	struct lease_table *t = f->d.broker.leases;
	struct lease *l, *r = lease_last(t), *c = lease_next_after(t, 0);
	size_t n = 0;

	for (l = lease_first(t); l; l = lease_next(t, l), n++) {
		FZ_ASSERT(c == l, "cursor after the lease before %llu is wrong", (unsigned long long)l->id);
		c = lease_next_after(t, l->id);
	}
	FZ_ASSERT(c == NULL, "cursor goes past the last lease%s", "");
	for (; r; r = lease_prev(t, r))
		n--;
	FZ_ASSERT(n == 0, "reverse walk and forward walk differ by %zu leases", n);
}

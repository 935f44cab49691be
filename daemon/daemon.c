/* SPDX-License-Identifier: MIT */
/* The broker's verbs that reach memory, carried out: the core's acquire plan and frees, done on the pool. */
#include "daemon.h"

#include <errno.h>
#include <stdlib.h>

#include "lease.h"
#include "pool.h"

/* The pool's chunks as the lease keeps them (core/lease.h); NULL when out of memory. */
static struct lease_chunk *lease_chunks(struct chunk **taken, size_t n)
{
	struct lease_chunk *lc = calloc(n, sizeof(*lc));

	for (size_t i = 0; lc && i < n; i++)
		pool_lease_chunk(taken[i], &lc[i]);
	return lc;
}

enum broker_refusal daemon_acquire(struct broker *b, const struct acquire_args *a, struct lease **ret, int *err)
{
	struct lease_chunk *lc = NULL;
	struct chunk **taken = NULL;
	struct acquire_plan plan;
	struct pool_view pv;
	size_t trimmed = 0, n = 0;
	enum broker_refusal v;
	int r = 0;

	pool_view(daemon_of(b)->pool, &pv);
	v = broker_acquire(b, a, &pv, &plan);
	if (v != REFUSAL_NONE)
		return v;
	if (plan.trim_to_chunks != SIZE_MAX)
		trimmed = pool_trim_chunks(daemon_of(b)->pool, plan.trim_to_chunks);
	if (plan.nchunks > 0) {
		r = pool_take_split(daemon_of(b)->pool, a->uid, a->tenant, plan.counts, plan.tail_bytes, plan.node,
				    &taken, &n);
		if (r == 0 && n != plan.nchunks)
			abort(); /* the pool carries out the split it was given */
		if (r == 0 && !(lc = lease_chunks(taken, n))) {
			pool_put(daemon_of(b)->pool, taken, n);
			r = -ENOMEM;
		}
		free(taken);
	}
	v = broker_acquire_done(b, a, &plan, trimmed, r, lc, ret, err);
	if (v == REFUSAL_NONE) {
		/* So the pool's hole-punch reports can name the lease (pool.h). */
		for (size_t i = 0; i < n; i++)
			lc[i].mem->lease_id = (*ret)->id;
	} else if (lc) {
		pool_put_lease(daemon_of(b)->pool, lc, n, false);
		free(lc);
	}
	if (r == 0)
		daemon_trim_pool(b, UINT64_MAX);
	return v;
}

void daemon_free_lease(struct broker *b, struct lease *l)
{
	/* Back to the pool while the lease is in the table still, so a punch found on the way names it. */
	pool_put_lease(daemon_of(b)->pool, l->chunks, l->nchunks, !broker_lease_reusable(l));
	broker_free_lease(b, l);
	/* A reload may have lowered the limit below what is held: the returned chunks may not all fit. */
	daemon_trim_pool(b, UINT64_MAX);
}

void daemon_trim_pool(struct broker *b, uint64_t target_idle_bytes)
{
	uint64_t keep_bytes;

	if (broker_trim_pool(b, target_idle_bytes, pool_idle_bytes(daemon_of(b)->pool), &keep_bytes))
		pool_shrink(daemon_of(b)->pool, keep_bytes);
}

uint64_t daemon_unbrokered_cap(const struct broker *b)
{
	return broker_unbrokered_cap(b, daemon_of(b)->pool ? pool_resident_bytes(daemon_of(b)->pool) : 0);
}

/* SPDX-License-Identifier: MIT */
/* A pool without memory for the core's suites (poolmodel.h). */
#include "poolmodel.h"

#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "classes.h"
#include "lease.h"
#include "tenant.h"

#define NO_OWNER ((uid_t)-1)
#define MODEL_CHUNKS_MAX 4096

struct rec {
	bool live, idle;
	uint64_t id, bytes;
	uid_t owner;
	uint64_t tenant;
	uint64_t seq; /* when it went idle: the most recent first, as the pool's idle lists */
};

static struct {
	struct classes classes;
	struct rec recs[MODEL_CHUNKS_MAX];
	uint64_t next_id, seq;
	int fail;
	struct pool_model_stats st;
} m;

static struct chunk *handle(struct rec *r)
{
	return (struct chunk *)r; /* the lease's opaque handle: here, the record */
}

static struct rec *fresh(uint64_t bytes, uid_t owner, uint64_t tenant)
{
	for (size_t i = 0; i < MODEL_CHUNKS_MAX; i++)
		if (!m.recs[i].live) {
			m.recs[i] = (struct rec){
				.live = true, .id = ++m.next_id, .bytes = bytes, .owner = owner, .tenant = tenant
			};
			m.st.chunks++;
			m.st.resident_bytes += bytes;
			return &m.recs[i];
		}
	ck_abort_msg("pool model: more than %d chunks", MODEL_CHUNKS_MAX);
	return NULL;
}

static void destroy(struct rec *r)
{
	if (r->idle)
		m.st.idle_bytes -= r->bytes;
	r->live = false;
	m.st.chunks--;
	m.st.resident_bytes -= r->bytes;
}

static void make_idle(struct rec *r)
{
	r->idle = true;
	r->seq = ++m.seq;
	m.st.idle_bytes += r->bytes;
}

/* The most recently idled chunk of bytes that pick accepts, or NULL. */
static struct rec *idle_find(uint64_t bytes, bool (*pick)(const struct rec *r, uid_t uid, uint64_t tenant), uid_t uid,
			     uint64_t tenant)
{
	struct rec *best = NULL;

	for (size_t i = 0; i < MODEL_CHUNKS_MAX; i++) {
		struct rec *r = &m.recs[i];

		if (r->live && r->idle && r->bytes == bytes && pick(r, uid, tenant) && (!best || r->seq > best->seq))
			best = r;
	}
	return best;
}

static bool own(const struct rec *r, uid_t uid, uint64_t tenant)
{
	return r->owner == uid && r->tenant == tenant;
}

static bool never_lent(const struct rec *r, uid_t uid, uint64_t tenant)
{
	(void)uid;
	(void)tenant;
	return r->owner == NO_OWNER;
}

static bool others(const struct rec *r, uid_t uid, uint64_t tenant)
{
	return !own(r, uid, tenant) && !never_lent(r, uid, tenant);
}

static bool any(const struct rec *r, uid_t uid, uint64_t tenant)
{
	(void)r;
	(void)uid;
	(void)tenant;
	return true;
}

void pool_model_reset(uint64_t chunk_bytes, uint64_t max_bytes)
{
	memset(&m, 0, sizeof(m));
	ck_assert_int_eq(classes_init(&m.classes, chunk_bytes, max_bytes), 0);
}

void pool_model_grow(uint64_t bytes)
{
	while (m.st.idle_bytes < bytes)
		make_idle(fresh(m.classes.bytes[0], NO_OWNER, TENANT_NONE));
}

void pool_model_fail_next(int err)
{
	m.fail = err;
}

void pool_model_stats(struct pool_model_stats *ret)
{
	*ret = m.st;
}

void pool_model_view(struct pool_view *v)
{
	*v = (struct pool_view){ .page_bytes = 4096,
				 .host_page_bytes = 4096,
				 .classes = &m.classes,
				 .idle_bytes = m.st.idle_bytes,
				 .resident_bytes = m.st.resident_bytes,
				 .chunks = m.st.chunks };
	for (size_t i = 0; i < MODEL_CHUNKS_MAX; i++)
		if (m.recs[i].live && m.recs[i].idle)
			v->idle_chunks[classes_index(&m.classes, m.recs[i].bytes)]++;
}

static size_t trim_chunks(size_t max)
{
	size_t n = 0;

	for (unsigned k = 0; k < m.classes.n && m.st.chunks > max; k++) {
		struct rec *r;

		while (m.st.chunks > max && (r = idle_find(m.classes.bytes[k], any, 0, 0))) {
			destroy(r);
			n++;
		}
	}
	return n;
}

static void take_one(struct lease_chunk *lc, struct rec *r, bool tail)
{
	*lc = (struct lease_chunk){ .mem = handle(r), .id = r->id, .bytes = r->bytes, .node = -1, .tail = tail };
}

static int take(const struct acquire_args *a, const struct acquire_plan *plan, struct lease_chunk **ret)
{
	struct lease_chunk *lc;
	size_t n = 0;

	if (m.fail) {
		int err = m.fail;

		m.fail = 0;
		return err;
	}
	lc = calloc(plan->nchunks, sizeof(*lc));
	ck_assert_ptr_nonnull(lc);
	for (unsigned k = m.classes.n; k-- > 0;)
		for (uint64_t j = 0; j < plan->counts[k]; j++) {
			uint64_t bytes = m.classes.bytes[k];
			struct rec *r = idle_find(bytes, own, a->uid, a->tenant);

			if (!r)
				r = idle_find(bytes, never_lent, a->uid, a->tenant);
			if (r) {
				r->idle = false;
				m.st.idle_bytes -= r->bytes;
			} else {
				struct rec *old = idle_find(bytes, others, a->uid, a->tenant);

				/* A fresh chunk stands in for an idle one of another tenant: the pool holds no more. */
				if (old) {
					if (old->owner == a->uid)
						m.st.replaced_bytes += old->bytes;
					destroy(old);
				}
				r = fresh(bytes, a->uid, a->tenant);
			}
			r->owner = a->uid;
			r->tenant = a->tenant;
			take_one(&lc[n++], r, false);
		}
	if (plan->tail_bytes)
		take_one(&lc[n++], fresh(plan->tail_bytes, a->uid, a->tenant), true);
	ck_assert_uint_eq(n, plan->nchunks);
	*ret = lc;
	return 0;
}

static void put(const struct lease_chunk *lc, size_t n, bool retire)
{
	for (size_t i = 0; i < n; i++) {
		struct rec *r = (struct rec *)lc[i].mem;

		if (lc[i].tainted)
			m.st.tainted_destroyed++;
		else if (retire && !lc[i].tail)
			m.st.retired_bytes += r->bytes;
		if (lc[i].tail || lc[i].tainted || retire)
			destroy(r);
		else
			make_idle(r);
	}
}

static void shrink(uint64_t keep_bytes)
{
	/* Chunks last lent to someone go before never-lent ones, which serve anybody. */
	static bool (*const order[])(const struct rec *, uid_t, uint64_t) = { others, never_lent };

	for (size_t p = 0; p < 2; p++)
		for (unsigned k = m.classes.n; k-- > 0;) {
			struct rec *r;

			while (m.st.idle_bytes > keep_bytes &&
			       (r = idle_find(m.classes.bytes[k], order[p], NO_OWNER, 0)))
				destroy(r);
		}
}

void pool_model_trim(struct broker *b, uint64_t target_idle_bytes)
{
	uint64_t keep_bytes;

	if (broker_trim_pool(b, target_idle_bytes, m.st.idle_bytes, &keep_bytes))
		shrink(keep_bytes);
}

enum broker_refusal pool_model_acquire(struct broker *b, const struct acquire_args *a, struct lease **ret, int *err)
{
	struct lease_chunk *lc = NULL;
	struct acquire_plan plan;
	struct pool_view v;
	size_t trimmed = 0;
	enum broker_refusal why;
	int r = 0;

	pool_model_view(&v);
	why = broker_acquire(b, a, &v, &plan);
	if (why != REFUSAL_NONE)
		return why;
	if (plan.trim_to_chunks != SIZE_MAX)
		trimmed = trim_chunks(plan.trim_to_chunks);
	if (plan.nchunks > 0)
		r = take(a, &plan, &lc);
	why = broker_acquire_done(b, a, &plan, trimmed, r, lc, ret, err);
	if (why != REFUSAL_NONE && lc) {
		put(lc, plan.nchunks, false);
		free(lc);
	}
	if (r == 0)
		pool_model_trim(b, UINT64_MAX);
	return why;
}

void pool_model_free(struct broker *b, struct lease *l)
{
	put(l->chunks, l->nchunks, !broker_lease_reusable(l));
	broker_free_lease(b, l);
	pool_model_trim(b, UINT64_MAX);
}

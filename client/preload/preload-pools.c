/* SPDX-License-Identifier: MIT */
/*
 * libpinbroker-preload.so's hooks for memory pools with a host location (cuMemPoolCreate, CUDA 13's default host
 * pool, cuMemAllocFromPoolAsync), memory the CUDA driver allocates and owns itself, so no lease can serve it.
 *
 * A host pool is charged, as a registration against the budget (charge only: the pages stay the driver's), by what
 * it reserves. Before an allocation, the pool's charge grows to cover the live allocations (each page-rounded) plus
 * the new one; after every allocation, free and trim it is set to what the driver says the pool reserves
 * (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, never below the live allocations): freed memory the pool keeps stays charged
 * until the driver lets it go, which shows at the pool's next allocation, free or trim. A pool's maxSize bounds its
 * charge (the driver refuses an allocation past it, uncharged). The charge ends when the pool is destroyed and its
 * last allocation freed. When the broker refuses (or is absent), PINBROKER_PRELOAD_FALLBACK decides
 * (preload-cudapaths.c). Device memory goes through these hooks too (cudaFree's cuMemFree, cuMemFreeAsync,
 * allocations from device pools): pbp_pools.allocs_span and pbp_pools.host_pools let it call through without the
 * lock.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "pinbroker.h"
#include "preload-cudapaths-int.h"
#include "preload-filter.h"
#include "preload-table.h"
#include "preload.h"

/* A memory pool with a host location, and what it is charged. */
struct pool {
	CUmemoryPool pool;
	size_t max_bytes;  /* its maxSize; 0: none given */
	uint64_t live;     /* its live allocations, each page-rounded */
	pb_lease **leases; /* its charges, oldest first */
	size_t n_leases, cap_leases;
	uint64_t charged;    /* the sum of leases' sizes */
	uint64_t unbrokered; /* what it holds beyond them: refused, or no broker */
	bool destroyed;      /* cuMemPoolDestroy'd while allocations were live: gone with the last */
};

/* The record of a host pool, or NULL. Under the lock. */
static struct pool *pool_find(CUmemoryPool p, size_t *at)
{
	for (size_t i = 0; i < pbp_pools.n; i++)
		if (pbp_pools.v[i]->pool == p) {
			if (at)
				*at = i;
			return pbp_pools.v[i];
		}
	return NULL;
}

/* Start tracking a host pool (max_bytes: its maxSize, or 0). Under the lock. */
static void pool_add(CUmemoryPool p, size_t max_bytes)
{
	struct pool *q;

	if (pool_find(p, NULL))
		return;
	if (pbp_pools.n == pbp_pools.cap) {
		size_t cap = pbp_pools.cap ? pbp_pools.cap * 2 : 8;
		struct pool **v = realloc(pbp_pools.v, cap * sizeof(*v));

		if (!v)
			return;
		pbp_pools.v = v;
		pbp_pools.cap = cap;
	}
	if (!(q = calloc(1, sizeof(*q))))
		return;
	q->pool = p;
	q->max_bytes = max_bytes;
	pbp_pools.v[pbp_pools.n++] = q;
	pbp_slots_add(&pbp_pools.host_pools, p);
	atomic_store(&pbp_pools.seen, true);
}

/* Charge bytes more to q: a lease, or unbrokered. Returns false when the broker refused and the policy is error. */
static bool pool_grow(struct pool *q, uint64_t bytes, bool may_refuse, const char *verb)
{
	pb_lease *l = NULL;
	char why[256];

	if (bytes == 0)
		return true;
	if (q->n_leases == q->cap_leases) {
		size_t cap = q->cap_leases ? q->cap_leases * 2 : 8;
		pb_lease **v = realloc(q->leases, cap * sizeof(*v));

		if (!v) {
			snprintf(why, sizeof(why), "out of memory");
			goto refused;
		}
		q->leases = v;
		q->cap_leases = cap;
	}
	if (pbp_charge(bytes, &l, why, sizeof(why)) == 0) {
		q->leases[q->n_leases++] = l;
		q->charged += bytes;
		return true;
	}
refused:
	if (may_refuse && pbp_cudapaths_refuse()) {
		pbp_say(true, "%s of %llu host-pool bytes refused (%s): out-of-memory error (fallback=error)", verb,
			(unsigned long long)bytes, why);
		return false;
	}
	pbp_say(true,
		"%s: %llu host-pool bytes: %s: pinned by the CUDA driver, outside the budget (reported as "
		"unbrokered)",
		verb, (unsigned long long)bytes, why);
	q->unbrokered += bytes;
	pbp_unbrokered_adjust(bytes, 0);
	return true;
}

/* Bring q's charge down to target: unbrokered bytes first, then whole leases, newest first, the last re-made. */
static void pool_shrink(struct pool *q, uint64_t target)
{
	uint64_t over, cut, keep;

	if (q->charged + q->unbrokered <= target)
		return;
	over = q->charged + q->unbrokered - target;
	cut = over < q->unbrokered ? over : q->unbrokered;
	q->unbrokered -= cut;
	pbp_unbrokered_adjust(0, cut);
	keep = q->charged - (over - cut);
	while (q->charged > keep) {
		pb_lease *l = q->leases[--q->n_leases];

		q->charged -= pb_lease_size(l);
		pbp_uncharge(l);
	}
	if (q->charged < keep)
		pool_grow(q, keep - q->charged, false, "a pool's charge re-made");
}

/* The bytes the driver says q reserves now, or -1 when it cannot say (a destroyed pool). */
static int64_t pool_reserved(const struct pool *q)
{
	static void *_Atomic get_attr;
	uint64_t v = 0;
	void *fn = atomic_load(&get_attr);
	CUresult r;

	if (!fn) {
		void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);

		if (h) {
			fn = pbp_call_real_dlsym(h, "cuMemPoolGetAttribute");
			dlclose(h);
		}
		if (!fn) {
			pbp_say(false,
				"cuMemPoolGetAttribute not found in libcuda.so.1: a pool's charge follows its calls");
			return -1;
		}
		atomic_store(&get_attr, fn);
	}
	pbp_enter();
	r = ((CUresult(*)(CUmemoryPool, int, void *))(uintptr_t)fn)(q->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v);
	pbp_leave();
	if (r != CU_OK) {
		pbp_say(false, "host pool %p: cuMemPoolGetAttribute(RESERVED_MEM_CURRENT) failed (%d)", q->pool,
			(int)r);
		return -1;
	}
	return (int64_t)pbp_cudapaths_round_page(v);
}

/*
 * Set q's charge to what the driver says it reserves (bounded by its maxSize, never below its live
 * allocations); fallback when the driver cannot say.
 */
static void pool_settle(struct pool *q, uint64_t fallback)
{
	int64_t reserved = pool_reserved(q);
	uint64_t target = reserved >= 0 ? (uint64_t)reserved : fallback;

	if (q->max_bytes && target > q->max_bytes)
		target = q->max_bytes;
	if (target < q->live)
		target = q->live;
	pbp_say(false, "host pool %p: the driver says it reserves %lld bytes (live %llu, fallback %llu): charge %llu",
		q->pool, (long long)reserved, (unsigned long long)q->live, (unsigned long long)fallback,
		(unsigned long long)target);
	if (target > q->charged + q->unbrokered)
		pool_grow(q, target - q->charged - q->unbrokered, false, "a pool that reserved more");
	else
		pool_shrink(q, target);
}

/* Forget q, its charges given back. Under the lock. */
static void pool_drop(size_t at)
{
	struct pool *q = pbp_pools.v[at];

	pbp_slots_remove(&pbp_pools.host_pools, q->pool);
	pool_shrink(q, 0);
	free(q->leases);
	free(q);
	pbp_pools.v[at] = pbp_pools.v[--pbp_pools.n];
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const struct cu_pool_props *props)
{
	CUresult r;

	if (!pbp_real_fn(F_cuMemPoolCreate))
		return CU_NOT_INITIALIZED;
	pbp_enter();
	r = CALL(CUresult(*)(CUmemoryPool *, const struct cu_pool_props *), F_cuMemPoolCreate, pool, props);
	pbp_leave();
	if (r != CU_OK || pbp_passthrough() || !pool || !props || !pbp_cudapaths_host_location(&props->location))
		return r;
	pbp_cudapaths_lock();
	pool_add(*pool, pbp_cudapaths_round_page(props->max_size));
	pbp_cudapaths_unlock();
	pbp_say(false, "cuMemPoolCreate: host pool %p (maxSize %zu)", *pool, props->max_size);
	return r;
}

/* cuMemGetDefaultMemPool and cuMemGetMemPool: a host location's pool is tracked from then on. */
static CUresult get_pool(enum fn f, CUmemoryPool *pool, struct cu_location *location, int type)
{
	CUresult r;

	if (!pbp_real_fn(f))
		return CU_NOT_INITIALIZED;
	pbp_enter();
	r = CALL(CUresult(*)(CUmemoryPool *, struct cu_location *, int), f, pool, location, type);
	pbp_leave();
	if (r != CU_OK || pbp_passthrough() || !pool || !pbp_cudapaths_host_location(location) ||
	    type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return r;
	pbp_cudapaths_lock();
	pool_add(*pool, 0);
	pbp_cudapaths_unlock();
	return r;
}

EXPORT CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, struct cu_location *location, int type)
{
	return get_pool(F_cuMemGetDefaultMemPool, pool, location, type);
}

EXPORT CUresult cuMemGetMemPool(CUmemoryPool *pool, struct cu_location *location, int type)
{
	return get_pool(F_cuMemGetMemPool, pool, location, type);
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	struct pool *q;
	size_t at;
	CUresult r;

	if (!pbp_real_fn(F_cuMemPoolDestroy))
		return CU_NOT_INITIALIZED;
	pbp_enter();
	r = CALL(CUresult(*)(CUmemoryPool), F_cuMemPoolDestroy, pool);
	pbp_leave();
	if (r != CU_OK || pbp_passthrough() || !atomic_load(&pbp_pools.seen))
		return r;
	pbp_cudapaths_lock();
	if ((q = pool_find(pool, &at))) {
		/* The driver frees the pool with its last allocation; until then it stays charged as it was. */
		if (q->live == 0)
			pool_drop(at);
		else
			q->destroyed = true;
	}
	pbp_cudapaths_unlock();
	return r;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t min_bytes_to_keep)
{
	struct pool *q;
	CUresult r;

	if (!pbp_real_fn(F_cuMemPoolTrimTo))
		return CU_NOT_INITIALIZED;
	pbp_enter();
	r = CALL(CUresult(*)(CUmemoryPool, size_t), F_cuMemPoolTrimTo, pool, min_bytes_to_keep);
	pbp_leave();
	if (r != CU_OK || pbp_passthrough() || !atomic_load(&pbp_pools.seen))
		return r;
	pbp_cudapaths_lock();
	if ((q = pool_find(pool, NULL))) {
		uint64_t held = q->charged + q->unbrokered;

		pool_settle(q, held < min_bytes_to_keep ? held : min_bytes_to_keep);
	}
	pbp_cudapaths_unlock();
	return r;
}

static CUresult alloc_from_pool(enum fn f, CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)
{
	typedef CUresult (*fn_t)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
	size_t bytes = pbp_cudapaths_round_page(bytesize);
	uint64_t held_before;
	struct pool *q;
	CUresult r;

	if (!pbp_real_fn(f))
		return CU_NOT_INITIALIZED;
	if (pbp_passthrough() || !dptr || bytesize == 0 || !pbp_slots_may_hold(&pbp_pools.host_pools, pool))
		return CALL(fn_t, f, dptr, bytesize, pool, stream);
	pbp_cudapaths_lock();
	q = pool_find(pool, NULL);
	/* Past its maxSize the driver refuses: nothing to charge. */
	if (!q || (q->max_bytes && q->live + bytes > q->max_bytes)) {
		pbp_cudapaths_unlock();
		pbp_enter();
		r = CALL(fn_t, f, dptr, bytesize, pool, stream);
		pbp_leave();
		return r;
	}
	held_before = q->charged + q->unbrokered;
	if (q->live + bytes > held_before && !pool_grow(q, q->live + bytes - held_before, true, pbp_fn_names[f])) {
		pbp_cudapaths_unlock();
		return CU_OUT_OF_MEMORY;
	}
	pbp_enter();
	r = CALL(fn_t, f, dptr, bytesize, pool, stream);
	pbp_leave();
	if (r != CU_OK) {
		pool_shrink(q, held_before);
		pbp_cudapaths_unlock();
		return r;
	}
	if (pbp_table_put(&pbp_pools.allocs,
			  &(struct pbp_entry){
				  .base = (uintptr_t)*dptr, .bytes = bytes, .kind = PBP_LEASE, .lease = q }) == 0) {
		q->live += bytes;
		pbp_cudapaths_span_set(&pbp_pools.allocs_span, &pbp_pools.allocs);
	}
	pool_settle(q, q->live > held_before ? q->live : held_before);
	pbp_cudapaths_unlock();
	return r;
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)
{
	return alloc_from_pool(F_cuMemAllocFromPoolAsync, dptr, bytesize, pool, stream);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)
{
	return alloc_from_pool(F_cuMemAllocFromPoolAsync_ptsz, dptr, bytesize, pool, stream);
}

/* cuMemFreeAsync(_ptsz) (stream) and cuMemFree_v2 (none): a pool allocation's bytes leave its live count. */
static CUresult free_pool_alloc(enum fn f, CUdeviceptr dptr, CUstream stream, bool async)
{
	struct pbp_entry e;
	bool track;
	CUresult r;

	if (!pbp_real_fn(f))
		return CU_NOT_INITIALIZED;
	/*
	 * Locked before the driver's call: once it has freed dptr, an allocation on another thread may be given the
	 * same address, and its entry would be put before this one's is taken (then taken in its stead). A pointer
	 * outside allocs' span is no host-pool allocation (see pbp_pools.allocs_span): no lock. Should the driver hand its
	 * address to a host-pool allocation once it is freed, that entry is new and this free takes nothing.
	 */
	if ((track = !pbp_passthrough() && pbp_span_may_hold(&pbp_pools.allocs_span, (uintptr_t)dptr)))
		pbp_cudapaths_lock();
	pbp_enter();
	if (async)
		r = CALL(CUresult(*)(CUdeviceptr, CUstream), f, dptr, stream);
	else
		r = CALL(CUresult(*)(CUdeviceptr), f, dptr);
	pbp_leave();
	if (!track)
		return r;
	if (r == CU_OK && pbp_table_take(&pbp_pools.allocs, (uintptr_t)dptr, true, &e)) {
		struct pool *q = e.lease;
		size_t at;

		pbp_cudapaths_span_set(&pbp_pools.allocs_span, &pbp_pools.allocs);
		q->live -= e.bytes;
		/* A destroyed pool cannot be asked what it reserves: it keeps its charge until it is gone. */
		if (q->destroyed && q->live == 0 && pool_find(q->pool, &at) == q)
			pool_drop(at);
		else if (!q->destroyed)
			pool_settle(q, q->charged + q->unbrokered);
	}
	pbp_cudapaths_unlock();
	return r;
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
	return free_pool_alloc(F_cuMemFreeAsync, dptr, stream, true);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream)
{
	return free_pool_alloc(F_cuMemFreeAsync_ptsz, dptr, stream, true);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	return free_pool_alloc(F_cuMemFree_v2, dptr, NULL, false);
}

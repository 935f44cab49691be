/* SPDX-License-Identifier: MIT */
/*
 * libpinbroker-preload.so's hooks for host memory that the CUDA driver allocates and owns itself, so no lease can
 * serve it: VMM allocations (cuMemCreate with a host location, then cuMemMap), memory pools with a host location
 * (cuMemPoolCreate, CUDA 13's default host pool, cuMemAllocFromPoolAsync) and graph memory nodes with a host
 * location. The runtime's calls (cudaMemPoolCreate, cudaMallocFromPoolAsync, cudaMemGetDefaultMemPool,
 * cudaGraphAddMemAllocNode...) reach these driver entry points through cuGetProcAddress, which preload.c answers
 * with the wrappers here, so no runtime function is wrapped.
 *
 * What is charged, as a registration against the budget (charge only: the pages stay the driver's):
 * - a VMM handle: its page-rounded size, from cuMemCreate until the driver frees the memory, which is when the
 *   last reference goes: the handle released (cuMemRelease, once per cuMemCreate or cuMemRetainAllocationHandle)
 *   and every mapping of it unmapped (cuMemUnmap). The common "map, then release the handle" idiom stays charged
 *   while mapped.
 * - a host pool: what it reserves. Before an allocation, the pool's charge grows to cover the live allocations
 *   (each page-rounded) plus the new one; after every allocation, free and trim it is set to what the driver says
 *   the pool reserves (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, never below the live allocations): freed memory
 *   the pool keeps stays charged until the driver lets it go, which shows at the pool's next allocation, free or
 *   trim. A pool's maxSize bounds its charge (the driver refuses an allocation past it, uncharged). The charge
 *   ends when the pool is destroyed and its last allocation freed.
 * When the broker refuses (or is absent), PINBROKER_PRELOAD_FALLBACK decides: error makes the call fail with
 * CUDA_ERROR_OUT_OF_MEMORY before the driver pins anything; cuda and pageable (no pageable stand-in exists for
 * driver-owned memory) let the driver pin it and report the bytes as unbrokered.
 * Graph memory nodes with a host location are reported as unbrokered by their page-rounded size from the node's
 * creation until its graph is destroyed: the driver backs them when the graph runs, from a pool of its own.
 * Device memory goes through some of these hooks too (cudaFree's cuMemFree, cuMemFreeAsync, allocations from device
 * pools, the VMM calls of PyTorch's expandable segments): those find out without the module's lock that the memory
 * is none of the host pools' or host VMM allocations', so a program's threads do not queue on it (allocs_span,
 * host_pools, host_vmms and maps_span say how).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pinbroker.h"
#include "preload-filter.h"
#include "preload-table.h"
#include "preload.h"

#define EXPORT __attribute__((visibility("default")))

/* From cuda.h (CUDA 13): the ABI of what the wrappers read. */
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUmemoryPool;
typedef void *CUstream;
typedef void *CUgraph;
typedef void *CUgraphNode;

enum {
	CU_LOC_HOST = 2,             /* CU_MEM_LOCATION_TYPE_HOST */
	CU_LOC_HOST_NUMA = 3,        /* CU_MEM_LOCATION_TYPE_HOST_NUMA */
	CU_LOC_HOST_NUMA_CURRENT = 4 /* CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT */
};
#define CU_MEM_ALLOCATION_TYPE_PINNED 1
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5
#define CU_GRAPH_NODE_TYPE_MEM_ALLOC 10

struct cu_location {
	int type;
	int id;
};

struct cu_alloc_prop { /* CUmemAllocationProp */
	int type;
	int requested_handle_types;
	struct cu_location location;
	void *win32_handle_metadata;
	unsigned char alloc_flags[8];
};

struct cu_pool_props { /* CUmemPoolProps */
	int alloc_type;
	int handle_types;
	struct cu_location location;
	void *win32_security_attributes;
	size_t max_size;
	unsigned short usage;
	unsigned char reserved[54];
};

struct cu_alloc_node_params { /* CUDA_MEM_ALLOC_NODE_PARAMS (v1 and v2 alike) */
	struct cu_pool_props pool_props;
	const void *access_descs;
	size_t access_desc_count;
	size_t bytesize;
	CUdeviceptr dptr;
};

struct cu_graph_node_params { /* CUgraphNodeParams */
	int type;
	int reserved0[3];
	union {
		long long reserved1[29];
		struct cu_alloc_node_params alloc;
	};
	long long reserved2;
};

_Static_assert(sizeof(struct cu_pool_props) == 88, "CUmemPoolProps is 88 bytes");
_Static_assert(sizeof(struct cu_graph_node_params) == 256, "CUgraphNodeParams is 256 bytes");

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const struct cu_alloc_prop *prop,
			    unsigned long long flags);
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr);
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
			 unsigned long long flags);
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const struct cu_pool_props *props);
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool);
EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t min_bytes_to_keep);
EXPORT CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, struct cu_location *location, int type);
EXPORT CUresult cuMemGetMemPool(CUmemoryPool *pool, struct cu_location *location, int type);
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream);
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream);
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr);
EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n_deps,
				       struct cu_alloc_node_params *params);
EXPORT CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n_deps,
			       struct cu_graph_node_params *params);
EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, const void *edge_data,
				  size_t n_deps, struct cu_graph_node_params *params);
EXPORT CUresult cuGraphDestroy(CUgraph graph);

/* A VMM allocation with a host location: alive while the program holds a handle to it or a mapping of it. */
struct vmm {
	CUmemGenericAllocationHandle handle;
	size_t bytes;     /* page-rounded */
	pb_lease *charge; /* NULL: unbrokered */
	int refs;         /* cuMemCreate, plus each cuMemRetainAllocationHandle, less each cuMemRelease */
	int maps;         /* live cuMemMap mappings */
};

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

/* A graph that holds memory nodes with a host location. */
struct graph {
	CUgraph graph;
	uint64_t bytes;
};

/*
 * Serialises every hook here, broker calls included, so a pool's charge always matches its allocations. Taken
 * before preload-memory.c's locks, never under them; held across fork() by a handler registered on first use,
 * after the constructor registered preload-memory.c's, so that it runs first (prepare handlers run in reverse).
 */
static pthread_mutex_t ops_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static struct pbp_table handles;  /* by handle: lease is the struct vmm (kind PBP_LEASE) */
static struct pbp_table mappings; /* by address: lease is the struct vmm mapped there */
/*
 * The keys of handles (but 0, which a slot cannot hold: always a "maybe"), and the span of mappings, both changed
 * under ops_lock with the tables: cuMemMap and cuMemRelease of a handle outside the set, and cuMemUnmap and
 * cuMemRetainAllocationHandle of addresses outside the span (device VMM, as PyTorch's expandable segments map and
 * unmap at every step) call through without the lock. A host handle is in the set before cuMemCreate (or
 * cuMemRetainAllocationHandle) returns it and leaves it only with its last release, this release's own work; a
 * host mapping is in the span before cuMemMap returns and leaves it only when cuMemUnmap takes it.
 */
static struct pbp_slots host_vmms;
static struct pbp_span maps_span = PBP_SPAN_EMPTY;
static struct pbp_table allocs; /* by device pointer: lease is its struct pool; bytes page-rounded */
/*
 * The span of allocs, set under ops_lock after every change to it: cuMemFree and cuMemFreeAsync of a pointer
 * outside it (a device free, the common case of a training job) call through without the lock, so a program's
 * frees do not queue on it. A pointer the program frees came back from alloc_from_pool after its entry was put and
 * the span set around it, and it leaves the span only when the entry is taken, this free's own work.
 */
static struct pbp_span allocs_span = PBP_SPAN_EMPTY;
static struct pool **pools;
static size_t n_pools, cap_pools;
/*
 * The host pools' handles: an allocation from any other pool (a device pool, from which RMM's and CCCL's async
 * resources allocate at every step) calls through without the lock. A handle is added, under ops_lock, before
 * cuMemPoolCreate or cuMemGetDefaultMemPool returns it, and removed when its record is dropped.
 */
static struct pbp_slots host_pools;
static struct graph *graphs;
static size_t n_graphs, cap_graphs;
/*
 * Set once the process has a host pool or a host graph node: until then cuMemPoolDestroy, cuMemPoolTrimTo and
 * cuGraphDestroy, which device memory calls too, call through without the lock.
 */
static atomic_bool pools_seen, graphs_seen;

/* Publish t's span to s after a change to t (sorted by address). Under ops_lock. */
static void span_set(struct pbp_span *s, const struct pbp_table *t)
{
	pbp_span_set(s, t->n ? t->v[0].base : 0, t->n ? t->v[t->n - 1].base + t->v[t->n - 1].bytes : 0);
}

static void ops_prepare(void)
{
	pthread_mutex_lock(&ops_lock);
}

static void ops_parent(void)
{
	pthread_mutex_unlock(&ops_lock);
}

/* A child owns none of its parent's driver memory (CUDA does not survive fork): it starts with nothing. */
static void ops_child(void)
{
	pbp_table_free(&handles);
	pbp_table_free(&mappings);
	pbp_slots_reset(&host_vmms);
	span_set(&maps_span, &mappings);
	pbp_table_free(&allocs);
	span_set(&allocs_span, &allocs);
	pools = NULL;
	n_pools = cap_pools = 0;
	pbp_slots_reset(&host_pools);
	graphs = NULL;
	n_graphs = cap_graphs = 0;
	pthread_mutex_unlock(&ops_lock);
}

static void register_fork(void)
{
	pthread_atfork(ops_prepare, ops_parent, ops_child);
}

static void lock(void)
{
	pthread_once(&fork_once, register_fork);
	pthread_mutex_lock(&ops_lock);
}

static void unlock(void)
{
	pthread_mutex_unlock(&ops_lock);
}

static bool host_location(const struct cu_location *l)
{
	return l && (l->type == CU_LOC_HOST || l->type == CU_LOC_HOST_NUMA || l->type == CU_LOC_HOST_NUMA_CURRENT);
}

static size_t round_page(size_t bytes)
{
	return pbp_page_span(0, bytes, pbp_page_size());
}

/* The fallback for driver-owned memory the broker did not take: only error refuses; else unbrokered. */
static bool refuse(void)
{
	return pbp_fallback(pbp_cfg.policy, PBP_HOST_MAPPED, false) == PBP_DO_ERROR;
}

/* ---- VMM ---- */

/* Whether h may be a host VMM allocation's handle (in handles); false means it is not. */
static bool vmm_may_be_host(CUmemGenericAllocationHandle h)
{
	return h == 0 || pbp_slots_may_hold(&host_vmms, (void *)(uintptr_t)h);
}

/* Know v by handle h, in handles and host_vmms. Under ops_lock. */
static int vmm_put_handle(struct vmm *v, CUmemGenericAllocationHandle h)
{
	int r = pbp_table_put(&handles,
			      &(struct pbp_entry){ .base = (uintptr_t)h, .bytes = 1, .kind = PBP_LEASE, .lease = v });

	if (r == 0 && h)
		pbp_slots_add(&host_vmms, (void *)(uintptr_t)h);
	return r;
}

/* Drop what v holds when its last reference went: the charge or the unbrokered report. Under ops_lock. */
static void vmm_maybe_free(struct vmm *v)
{
	if (v->refs > 0 || v->maps > 0)
		return;
	if (v->charge)
		pbp_uncharge(v->charge);
	else
		pbp_unbrokered_adjust(0, v->bytes);
	pbp_say(false, "cuMemCreate handle %llu: %zu host bytes freed", v->handle, v->bytes);
	free(v);
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const struct cu_alloc_prop *prop,
			    unsigned long long flags)
{
	typedef CUresult (*fn_t)(CUmemGenericAllocationHandle *, size_t, const struct cu_alloc_prop *,
				 unsigned long long);
	size_t bytes = round_page(size);
	pb_lease *charge = NULL;
	struct vmm *v;
	char why[256];
	CUresult r;

	if (!pbp_real_fn(F_cuMemCreate))
		return CU_NOT_INITIALIZED;
	if (pbp_passthrough() || !handle || size == 0 || !prop || !host_location(&prop->location))
		return CALL(fn_t, F_cuMemCreate, handle, size, prop, flags);
	if (!(v = calloc(1, sizeof(*v))))
		return CU_OUT_OF_MEMORY;
	lock();
	if (pbp_charge(bytes, &charge, why, sizeof(why)) < 0) {
		if (refuse()) {
			unlock();
			free(v);
			pbp_say(true,
				"cuMemCreate of %zu host bytes refused (%s): out-of-memory error (fallback=error)",
				size, why);
			return CU_OUT_OF_MEMORY;
		}
		pbp_say(true,
			"cuMemCreate of %zu host bytes: %s: pinned by the CUDA driver, outside the budget "
			"(reported as unbrokered)",
			size, why);
	}
	pbp_enter();
	r = CALL(fn_t, F_cuMemCreate, handle, size, prop, flags);
	pbp_leave();
	if (r != CU_OK) {
		pbp_uncharge(charge);
		unlock();
		free(v);
		return r;
	}
	*v = (struct vmm){ .handle = *handle, .bytes = bytes, .charge = charge, .refs = 1 };
	if (vmm_put_handle(v, *handle) < 0) {
		/* Untracked, it would stay charged for ever: give the memory back instead. */
		pbp_enter();
		CALL(CUresult(*)(CUmemGenericAllocationHandle), F_cuMemRelease, *handle);
		pbp_leave();
		pbp_uncharge(charge);
		unlock();
		free(v);
		return CU_OUT_OF_MEMORY;
	}
	if (!charge)
		pbp_unbrokered_adjust(bytes, 0);
	unlock();
	pbp_say(false, "cuMemCreate: %zu host bytes %s", bytes, charge ? "charged as a registration" : "unbrokered");
	return CU_OK;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	const struct pbp_entry *e;
	bool track;
	CUresult r;

	if (!pbp_real_fn(F_cuMemRelease))
		return CU_NOT_INITIALIZED;
	/* Locked across the driver's call too: see cuMemMap. A device handle calls through (see host_vmms). */
	if ((track = !pbp_passthrough() && vmm_may_be_host(handle)))
		lock();
	pbp_enter();
	r = CALL(CUresult(*)(CUmemGenericAllocationHandle), F_cuMemRelease, handle);
	pbp_leave();
	if (!track)
		return r;
	e = r == CU_OK ? pbp_table_find(&handles, (uintptr_t)handle) : NULL;
	if (e && e->base == (uintptr_t)handle) {
		struct vmm *v = e->lease;

		/* Still retained: the handle stays known, in the set all along (a reader must never miss it). */
		if (--v->refs == 0) {
			pbp_table_take(&handles, (uintptr_t)handle, true, &(struct pbp_entry){ 0 });
			if (handle)
				pbp_slots_remove(&host_vmms, (void *)(uintptr_t)handle);
		}
		vmm_maybe_free(v);
	}
	unlock();
	return r;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	const struct pbp_entry *e;
	bool track;
	CUresult r;

	if (!pbp_real_fn(F_cuMemRetainAllocationHandle))
		return CU_NOT_INITIALIZED;
	/* Locked across the driver's call too (see cuMemMap): an unmap in between would free the record. */
	if ((track = !pbp_passthrough() && handle && pbp_span_may_hold(&maps_span, (uintptr_t)addr)))
		lock();
	pbp_enter();
	r = CALL(CUresult(*)(CUmemGenericAllocationHandle *, void *), F_cuMemRetainAllocationHandle, handle, addr);
	pbp_leave();
	if (!track)
		return r;
	if (r == CU_OK && (e = pbp_table_find(&mappings, (uintptr_t)addr))) {
		struct vmm *v = e->lease;

		/* Released while mapped, it is known again by the handle the driver gave now. */
		if (v->refs++ == 0) {
			v->handle = *handle;
			vmm_put_handle(v, *handle);
		}
	}
	unlock();
	return r;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
			 unsigned long long flags)
{
	const struct pbp_entry *e;
	bool track;
	CUresult r;

	if (!pbp_real_fn(F_cuMemMap))
		return CU_NOT_INITIALIZED;
	/*
	 * Locked before the driver's call, not after: a cuMemRelease on another thread in between would see no
	 * mapping, free the record and give the charge back, and this mapping would then find no handle: pinned
	 * by the driver, charged to no one (cuMemUnmap and cuMemRelease lock the same way). A device handle calls
	 * through (see host_vmms).
	 */
	if ((track = !pbp_passthrough() && vmm_may_be_host(handle)))
		lock();
	pbp_enter();
	r = CALL(CUresult(*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long), F_cuMemMap,
		 ptr, size, offset, handle, flags);
	pbp_leave();
	if (!track)
		return r;
	e = r == CU_OK ? pbp_table_find(&handles, (uintptr_t)handle) : NULL;
	if (e && e->base == (uintptr_t)handle &&
	    pbp_table_put(&mappings, &(struct pbp_entry){ .base = (uintptr_t)ptr,
							  .bytes = size ? size : 1,
							  .kind = PBP_LEASE,
							  .lease = e->lease }) == 0) {
		((struct vmm *)e->lease)->maps++;
		span_set(&maps_span, &mappings);
	}
	unlock();
	return r;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	struct pbp_entry e;
	bool track;
	CUresult r;

	if (!pbp_real_fn(F_cuMemUnmap))
		return CU_NOT_INITIALIZED;
	/* Locked across the driver's call too: see cuMemMap. A range away from every host mapping: no lock. */
	if ((track = !pbp_passthrough() && pbp_span_may_meet(&maps_span, (uintptr_t)ptr, size)))
		lock();
	pbp_enter();
	r = CALL(CUresult(*)(CUdeviceptr, size_t), F_cuMemUnmap, ptr, size);
	pbp_leave();
	if (!track)
		return r;
	/* Every mapping that starts inside the range is gone (the driver unmaps whole mappings only). */
	for (size_t i = 0; r == CU_OK && i < mappings.n;) {
		if (mappings.v[i].base >= (uintptr_t)ptr && mappings.v[i].base - (uintptr_t)ptr < size &&
		    pbp_table_take(&mappings, mappings.v[i].base, true, &e)) {
			struct vmm *v = e.lease;

			v->maps--;
			vmm_maybe_free(v);
			continue;
		}
		i++;
	}
	span_set(&maps_span, &mappings);
	unlock();
	return r;
}

/* ---- Memory pools ---- */

/* The record of a host pool, or NULL. Under ops_lock. */
static struct pool *pool_find(CUmemoryPool p, size_t *at)
{
	for (size_t i = 0; i < n_pools; i++)
		if (pools[i]->pool == p) {
			if (at)
				*at = i;
			return pools[i];
		}
	return NULL;
}

/* Start tracking a host pool (max_bytes: its maxSize, or 0). Under ops_lock. */
static void pool_add(CUmemoryPool p, size_t max_bytes)
{
	struct pool *q;

	if (pool_find(p, NULL))
		return;
	if (n_pools == cap_pools) {
		size_t cap = cap_pools ? cap_pools * 2 : 8;
		struct pool **v = realloc(pools, cap * sizeof(*v));

		if (!v)
			return;
		pools = v;
		cap_pools = cap;
	}
	if (!(q = calloc(1, sizeof(*q))))
		return;
	q->pool = p;
	q->max_bytes = max_bytes;
	pools[n_pools++] = q;
	pbp_slots_add(&host_pools, p);
	atomic_store(&pools_seen, true);
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
	if (may_refuse && refuse()) {
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
	return (int64_t)round_page(v);
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

/* Forget q, its charges given back. Under ops_lock. */
static void pool_drop(size_t at)
{
	struct pool *q = pools[at];

	pbp_slots_remove(&host_pools, q->pool);
	pool_shrink(q, 0);
	free(q->leases);
	free(q);
	pools[at] = pools[--n_pools];
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const struct cu_pool_props *props)
{
	CUresult r;

	if (!pbp_real_fn(F_cuMemPoolCreate))
		return CU_NOT_INITIALIZED;
	pbp_enter();
	r = CALL(CUresult(*)(CUmemoryPool *, const struct cu_pool_props *), F_cuMemPoolCreate, pool, props);
	pbp_leave();
	if (r != CU_OK || pbp_passthrough() || !pool || !props || !host_location(&props->location))
		return r;
	lock();
	pool_add(*pool, round_page(props->max_size));
	unlock();
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
	if (r != CU_OK || pbp_passthrough() || !pool || !host_location(location) ||
	    type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return r;
	lock();
	pool_add(*pool, 0);
	unlock();
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
	if (r != CU_OK || pbp_passthrough() || !atomic_load(&pools_seen))
		return r;
	lock();
	if ((q = pool_find(pool, &at))) {
		/* The driver frees the pool with its last allocation; until then it stays charged as it was. */
		if (q->live == 0)
			pool_drop(at);
		else
			q->destroyed = true;
	}
	unlock();
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
	if (r != CU_OK || pbp_passthrough() || !atomic_load(&pools_seen))
		return r;
	lock();
	if ((q = pool_find(pool, NULL))) {
		uint64_t held = q->charged + q->unbrokered;

		pool_settle(q, held < min_bytes_to_keep ? held : min_bytes_to_keep);
	}
	unlock();
	return r;
}

static CUresult alloc_from_pool(enum fn f, CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)
{
	typedef CUresult (*fn_t)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
	size_t bytes = round_page(bytesize);
	uint64_t held_before;
	struct pool *q;
	CUresult r;

	if (!pbp_real_fn(f))
		return CU_NOT_INITIALIZED;
	if (pbp_passthrough() || !dptr || bytesize == 0 || !pbp_slots_may_hold(&host_pools, pool))
		return CALL(fn_t, f, dptr, bytesize, pool, stream);
	lock();
	q = pool_find(pool, NULL);
	/* Past its maxSize the driver refuses: nothing to charge. */
	if (!q || (q->max_bytes && q->live + bytes > q->max_bytes)) {
		unlock();
		pbp_enter();
		r = CALL(fn_t, f, dptr, bytesize, pool, stream);
		pbp_leave();
		return r;
	}
	held_before = q->charged + q->unbrokered;
	if (q->live + bytes > held_before && !pool_grow(q, q->live + bytes - held_before, true, pbp_fn_names[f])) {
		unlock();
		return CU_OUT_OF_MEMORY;
	}
	pbp_enter();
	r = CALL(fn_t, f, dptr, bytesize, pool, stream);
	pbp_leave();
	if (r != CU_OK) {
		pool_shrink(q, held_before);
		unlock();
		return r;
	}
	if (pbp_table_put(&allocs,
			  &(struct pbp_entry){
				  .base = (uintptr_t)*dptr, .bytes = bytes, .kind = PBP_LEASE, .lease = q }) == 0) {
		q->live += bytes;
		span_set(&allocs_span, &allocs);
	}
	pool_settle(q, q->live > held_before ? q->live : held_before);
	unlock();
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
	 * outside allocs' span is no host-pool allocation (see allocs_span): no lock. Should the driver hand its
	 * address to a host-pool allocation once it is freed, that entry is new and this free takes nothing.
	 */
	if ((track = !pbp_passthrough() && pbp_span_may_hold(&allocs_span, (uintptr_t)dptr)))
		lock();
	pbp_enter();
	if (async)
		r = CALL(CUresult(*)(CUdeviceptr, CUstream), f, dptr, stream);
	else
		r = CALL(CUresult(*)(CUdeviceptr), f, dptr);
	pbp_leave();
	if (!track)
		return r;
	if (r == CU_OK && pbp_table_take(&allocs, (uintptr_t)dptr, true, &e)) {
		struct pool *q = e.lease;
		size_t at;

		span_set(&allocs_span, &allocs);
		q->live -= e.bytes;
		/* A destroyed pool cannot be asked what it reserves: it keeps its charge until it is gone. */
		if (q->destroyed && q->live == 0 && pool_find(q->pool, &at) == q)
			pool_drop(at);
		else if (!q->destroyed)
			pool_settle(q, q->charged + q->unbrokered);
	}
	unlock();
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

/* ---- Graph memory nodes ---- */

/* A memory node of bytes with a host location added to graph: reported as unbrokered until it is destroyed. */
static void graph_note(CUgraph graph, size_t bytesize)
{
	uint64_t bytes = round_page(bytesize);
	size_t i;

	lock();
	for (i = 0; i < n_graphs && graphs[i].graph != graph; i++)
		;
	if (i == n_graphs) {
		if (n_graphs == cap_graphs) {
			size_t cap = cap_graphs ? cap_graphs * 2 : 8;
			struct graph *v = realloc(graphs, cap * sizeof(*v));

			if (!v) {
				unlock();
				return;
			}
			graphs = v;
			cap_graphs = cap;
		}
		graphs[n_graphs++] = (struct graph){ .graph = graph };
	}
	graphs[i].bytes += bytes;
	atomic_store(&graphs_seen, true);
	pbp_unbrokered_adjust(bytes, 0);
	unlock();
	pbp_say(false, "graph %p: a memory node of %llu host bytes (reported as unbrokered)", graph,
		(unsigned long long)bytes);
}

EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n_deps,
				       struct cu_alloc_node_params *params)
{
	CUresult r;

	if (!pbp_real_fn(F_cuGraphAddMemAllocNode))
		return CU_NOT_INITIALIZED;
	pbp_enter();
	r = CALL(CUresult(*)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, struct cu_alloc_node_params *),
		 F_cuGraphAddMemAllocNode, node, graph, deps, n_deps, params);
	pbp_leave();
	if (r == CU_OK && !pbp_passthrough() && params && host_location(&params->pool_props.location))
		graph_note(graph, params->bytesize);
	return r;
}

EXPORT CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n_deps,
			       struct cu_graph_node_params *params)
{
	CUresult r;

	if (!pbp_real_fn(F_cuGraphAddNode))
		return CU_NOT_INITIALIZED;
	pbp_enter();
	r = CALL(CUresult(*)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, struct cu_graph_node_params *),
		 F_cuGraphAddNode, node, graph, deps, n_deps, params);
	pbp_leave();
	if (r == CU_OK && !pbp_passthrough() && params && params->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC &&
	    host_location(&params->alloc.pool_props.location))
		graph_note(graph, params->alloc.bytesize);
	return r;
}

EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, const void *edge_data,
				  size_t n_deps, struct cu_graph_node_params *params)
{
	CUresult r;

	if (!pbp_real_fn(F_cuGraphAddNode_v2))
		return CU_NOT_INITIALIZED;
	pbp_enter();
	r = CALL(CUresult(*)(CUgraphNode *, CUgraph, const CUgraphNode *, const void *, size_t,
			     struct cu_graph_node_params *),
		 F_cuGraphAddNode_v2, node, graph, deps, edge_data, n_deps, params);
	pbp_leave();
	if (r == CU_OK && !pbp_passthrough() && params && params->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC &&
	    host_location(&params->alloc.pool_props.location))
		graph_note(graph, params->alloc.bytesize);
	return r;
}

EXPORT CUresult cuGraphDestroy(CUgraph graph)
{
	CUresult r;

	if (!pbp_real_fn(F_cuGraphDestroy))
		return CU_NOT_INITIALIZED;
	pbp_enter();
	r = CALL(CUresult(*)(CUgraph), F_cuGraphDestroy, graph);
	pbp_leave();
	if (r != CU_OK || pbp_passthrough() || !atomic_load(&graphs_seen))
		return r;
	lock();
	for (size_t i = 0; i < n_graphs; i++)
		if (graphs[i].graph == graph) {
			pbp_unbrokered_adjust(0, graphs[i].bytes);
			graphs[i] = graphs[--n_graphs];
			break;
		}
	unlock();
	return r;
}

UNSANITIZED void *pbp_cudapaths_wrapper(enum fn f)
{
	typedef void (*any_fn)(void);
	static const any_fn wrappers[F_DRIVER_END] = {
		[F_cuMemCreate] = (any_fn)cuMemCreate,
		[F_cuMemRelease] = (any_fn)cuMemRelease,
		[F_cuMemRetainAllocationHandle] = (any_fn)cuMemRetainAllocationHandle,
		[F_cuMemMap] = (any_fn)cuMemMap,
		[F_cuMemUnmap] = (any_fn)cuMemUnmap,
		[F_cuMemPoolCreate] = (any_fn)cuMemPoolCreate,
		[F_cuMemPoolDestroy] = (any_fn)cuMemPoolDestroy,
		[F_cuMemPoolTrimTo] = (any_fn)cuMemPoolTrimTo,
		[F_cuMemGetDefaultMemPool] = (any_fn)cuMemGetDefaultMemPool,
		[F_cuMemGetMemPool] = (any_fn)cuMemGetMemPool,
		[F_cuMemAllocFromPoolAsync] = (any_fn)cuMemAllocFromPoolAsync,
		[F_cuMemAllocFromPoolAsync_ptsz] = (any_fn)cuMemAllocFromPoolAsync_ptsz,
		[F_cuMemFreeAsync] = (any_fn)cuMemFreeAsync,
		[F_cuMemFreeAsync_ptsz] = (any_fn)cuMemFreeAsync_ptsz,
		[F_cuMemFree_v2] = (any_fn)cuMemFree_v2,
		[F_cuGraphAddMemAllocNode] = (any_fn)cuGraphAddMemAllocNode,
		[F_cuGraphAddNode] = (any_fn)cuGraphAddNode,
		[F_cuGraphAddNode_v2] = (any_fn)cuGraphAddNode_v2,
		[F_cuGraphDestroy] = (any_fn)cuGraphDestroy,
	};

	return f < F_DRIVER_END ? (void *)(uintptr_t)wrappers[f] : NULL;
}

/* SPDX-License-Identifier: MIT */
/*
 * The stand-in libcuda.so.1's host memory that the driver owns itself (part of stub_cuda.c's library): VMM
 * allocations (cuMemCreate with a host location, cuMemMap, cuMemRelease), memory pools with a host location
 * (their own and CUDA 13's default host pool), and graph memory nodes with a host location. It keeps what a real
 * driver would hold in host memory (stub_cuda_vmm_stats) so a test can compare the broker's figures with it:
 * - a VMM allocation is held from cuMemCreate until its handle is released and its last mapping unmapped;
 * - a pool reserves in POOL_GRANULE_BYTES steps, keeps freed memory until cuMemPoolTrimTo (as with a release
 *   threshold that a synchronisation never passes), refuses past its maxSize, and is freed on cuMemPoolDestroy
 *   or, if allocations are live then, with the last of them;
 * - a graph's host memory nodes count from their creation until cuGraphDestroy.
 * STUB_CUDA_MAP_SLEEP_MS makes cuMemMap sleep that long after it has mapped, its lock let go, as a real driver
 * may take its time: a test's window for another thread's cuMemRelease (check_itest_cudapaths vmm-race).
 * STUB_CUDA_FREE_SLEEP_MS makes a free of a device pool's allocation sleep that long first, outside its lock: frees
 * that the interposer serialises then add up (check_itest_cudapaths free-race).
 * STUB_CUDA_VMM_SLEEP_MS makes cuMemMap, cuMemUnmap and cuMemRelease of a device VMM allocation sleep that long
 * first, outside its lock, in the same way (check_itest_cudapaths vmm-device-race).
 */
#define _GNU_SOURCE
#include "cuda_vmm_types.h"
#include "stub_cuda.h"
#include "stub_cuda_int.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CUDA_ERROR_NOT_SUPPORTED 801

/* A pool grows by whole 2 MiB steps, so a charge that follows the driver's figure differs from the sum asked. */
#define POOL_GRANULE_BYTES (2u << 20)

struct vmm {
	CUmemGenericAllocationHandle handle;
	size_t bytes;
	bool host;
	int refs, maps;
};

struct mapping {
	CUdeviceptr va;
	struct vmm *v;
};

struct pool {
	bool host, destroyed, is_default, used;
	size_t max_bytes;
	uint64_t reserved, live;
};

struct alloc {
	CUdeviceptr p;
	size_t bytes;
	struct pool *pool;
};

struct graph {
	bool used;
	uint64_t host_bytes;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct vmm *vmms[256];
static struct mapping mappings[256];
static size_t n_mappings;
static CUmemGenericAllocationHandle next_handle = 0x1000;
static struct pool pools[64]; /* a pool's CUmemoryPool is its address here */
static struct pool default_host_pool = { .host = true, .is_default = true, .used = true };
static struct pool default_device_pool = { .is_default = true, .used = true };
static struct alloc allocs[1024];
static size_t n_allocs;
static struct graph graphs[64];
static struct stub_cuda_vmm_stats vstats;

static bool host_location(const struct cu_location *l)
{
	return l && (l->type == CU_MEM_LOCATION_TYPE_HOST || l->type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
		     l->type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT);
}

/* The host bytes every live pool reserves. Under lock. */
static void pool_stats(void)
{
	vstats.pool_host_bytes = default_host_pool.reserved;
	for (size_t i = 0; i < sizeof(pools) / sizeof(pools[0]); i++)
		if (pools[i].used && pools[i].host)
			vstats.pool_host_bytes += pools[i].reserved;
}

STUB void stub_cuda_vmm_get_stats(struct stub_cuda_vmm_stats *s)
{
	pthread_mutex_lock(&lock);
	*s = vstats;
	pthread_mutex_unlock(&lock);
}

/* ---- VMM ---- */

static int vmm_index(CUmemGenericAllocationHandle h)
{
	for (size_t i = 0; i < sizeof(vmms) / sizeof(vmms[0]); i++)
		if (vmms[i] && vmms[i]->handle == h && vmms[i]->refs > 0)
			return (int)i;
	return -1;
}

/* STUB_CUDA_VMM_SLEEP_MS: sleep when handle h (or, h 0, the mapping at va) is a device VMM allocation's. */
static void vmm_device_sleep(CUmemGenericAllocationHandle h, CUdeviceptr va)
{
	bool device = false;
	int i;

	if (!getenv("STUB_CUDA_VMM_SLEEP_MS"))
		return;
	pthread_mutex_lock(&lock);
	if (h)
		device = (i = vmm_index(h)) >= 0 && !vmms[i]->host;
	for (size_t j = 0; !h && j < n_mappings; j++)
		if (mappings[j].va == va)
			device = !mappings[j].v->host;
	pthread_mutex_unlock(&lock);
	if (device)
		usleep((useconds_t)atoi(getenv("STUB_CUDA_VMM_SLEEP_MS")) * 1000);
}

/* Free v when nothing names it any more. Under lock. */
static void vmm_maybe_free(struct vmm *v)
{
	if (v->refs > 0 || v->maps > 0)
		return;
	if (v->host)
		vstats.vmm_host_bytes -= v->bytes;
	for (size_t i = 0; i < sizeof(vmms) / sizeof(vmms[0]); i++)
		if (vmms[i] == v)
			vmms[i] = NULL;
	free(v);
}

STUB CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const struct cu_alloc_prop *prop,
			  unsigned long long flags)
{
	struct vmm *v;
	size_t i;

	if (!handle || !prop || flags || size == 0 || size % (size_t)sysconf(_SC_PAGESIZE))
		return CUDA_ERROR_INVALID_VALUE;
	if (!(v = calloc(1, sizeof(*v))))
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&lock);
	for (i = 0; i < sizeof(vmms) / sizeof(vmms[0]) && vmms[i]; i++)
		;
	if (i == sizeof(vmms) / sizeof(vmms[0])) {
		pthread_mutex_unlock(&lock);
		free(v);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*v = (struct vmm){ .handle = next_handle++, .bytes = size, .host = host_location(&prop->location), .refs = 1 };
	vmms[i] = v;
	if (v->host)
		vstats.vmm_host_bytes += size;
	*handle = v->handle;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

STUB CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	int i;

	vmm_device_sleep(handle, 0);
	pthread_mutex_lock(&lock);
	i = vmm_index(handle);
	if (i >= 0) {
		vmms[i]->refs--;
		vmm_maybe_free(vmms[i]);
	}
	pthread_mutex_unlock(&lock);
	return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

STUB CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
				  unsigned long long flags)
{
	void *p;

	(void)alignment;
	(void)addr;
	(void)flags;
	p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*ptr = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

STUB CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	return munmap((void *)(uintptr_t)ptr, size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

STUB CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
		       unsigned long long flags)
{
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	int i;

	(void)size;
	(void)offset;
	(void)flags;
	vmm_device_sleep(handle, 0);
	pthread_mutex_lock(&lock);
	i = vmm_index(handle);
	if (i >= 0 && n_mappings < sizeof(mappings) / sizeof(mappings[0])) {
		mappings[n_mappings++] = (struct mapping){ ptr, vmms[i] };
		vmms[i]->maps++;
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lock);
	if (getenv("STUB_CUDA_MAP_SLEEP_MS"))
		usleep((useconds_t)atoi(getenv("STUB_CUDA_MAP_SLEEP_MS")) * 1000);
	return r;
}

STUB CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	vmm_device_sleep(0, ptr);
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < n_mappings;) {
		if (mappings[i].va >= ptr && mappings[i].va - ptr < size) {
			struct vmm *v = mappings[i].v;

			mappings[i] = mappings[--n_mappings];
			v->maps--;
			vmm_maybe_free(v);
			r = CUDA_SUCCESS;
			continue;
		}
		i++;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

STUB CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < n_mappings; i++)
		if (mappings[i].va == (CUdeviceptr)(uintptr_t)addr) {
			mappings[i].v->refs++;
			*handle = mappings[i].v->handle;
			r = CUDA_SUCCESS;
			break;
		}
	pthread_mutex_unlock(&lock);
	return r;
}

STUB CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const void *desc, size_t count)
{
	(void)ptr;
	(void)size;
	(void)desc;
	(void)count;
	return CUDA_SUCCESS;
}

/* ---- Memory pools ---- */

static struct pool *pool_of(void *p)
{
	struct pool *q = p;

	if (q == &default_host_pool || q == &default_device_pool)
		return q;
	if (q >= pools && q < pools + sizeof(pools) / sizeof(pools[0]) && q->used && !q->destroyed)
		return q;
	return NULL;
}

static uint64_t granules(uint64_t bytes)
{
	return (bytes + POOL_GRANULE_BYTES - 1) / POOL_GRANULE_BYTES * POOL_GRANULE_BYTES;
}

STUB CUresult cuMemPoolCreate(void **pool, const struct cu_pool_props *props)
{
	CUresult r = CUDA_ERROR_OUT_OF_MEMORY;

	if (!pool || !props || props->alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < sizeof(pools) / sizeof(pools[0]); i++)
		if (!pools[i].used) {
			pools[i] = (struct pool){ .used = true,
						  .host = host_location(&props->location),
						  .max_bytes = props->max_size };
			*pool = &pools[i];
			r = CUDA_SUCCESS;
			break;
		}
	pthread_mutex_unlock(&lock);
	return r;
}

STUB CUresult cuMemPoolDestroy(void *pool)
{
	struct pool *q;

	pthread_mutex_lock(&lock);
	q = pool_of(pool);
	if (!q || q->is_default) {
		pthread_mutex_unlock(&lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	/* With allocations live, the driver frees it with the last of them. */
	if (q->live == 0)
		*q = (struct pool){ 0 };
	else
		q->destroyed = true;
	pool_stats();
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

STUB CUresult cuMemPoolTrimTo(void *pool, size_t keep)
{
	struct pool *q;

	pthread_mutex_lock(&lock);
	q = pool_of(pool);
	if (q) {
		uint64_t floor = granules(q->live);

		if (q->reserved > keep)
			q->reserved = granules(keep) > floor ? granules(keep) : floor;
		if (q->reserved < floor)
			q->reserved = floor;
		pool_stats();
	}
	pthread_mutex_unlock(&lock);
	return q ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

STUB CUresult cuMemPoolGetAttribute(void *pool, int attr, void *value)
{
	struct pool *q;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	pthread_mutex_lock(&lock);
	q = pool_of(pool);
	if (q && attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) {
		*(cuuint64_t *)value = q->reserved;
		r = CUDA_SUCCESS;
	} else if (q && attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT) {
		*(cuuint64_t *)value = q->live;
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

/* CUDA 13's default pool of a location (cuMemGetMemPool answers the same: no other was set current). */
STUB CUresult cuMemGetDefaultMemPool(void **pool, struct cu_location *location, int type)
{
	if (!pool || !location || type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return CUDA_ERROR_INVALID_VALUE;
	if (host_location(location))
		*pool = &default_host_pool;
	else if (location->type == CU_MEM_LOCATION_TYPE_DEVICE)
		*pool = &default_device_pool;
	else
		return CUDA_ERROR_NOT_SUPPORTED;
	return CUDA_SUCCESS;
}

STUB CUresult cuMemGetMemPool(void **pool, struct cu_location *location, int type)
{
	return cuMemGetDefaultMemPool(pool, location, type);
}

STUB CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, void *pool, void *stream)
{
	CUresult r = CUDA_SUCCESS;
	struct pool *q;
	void *p;

	(void)stream;
	if (!dptr || bytes == 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	q = pool_of(pool);
	if (!q)
		r = CUDA_ERROR_INVALID_VALUE;
	else if ((q->max_bytes && q->live + bytes > q->max_bytes) || n_allocs == sizeof(allocs) / sizeof(allocs[0]))
		r = CUDA_ERROR_OUT_OF_MEMORY;
	else if ((p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)) == MAP_FAILED)
		r = CUDA_ERROR_OUT_OF_MEMORY;
	if (r == CUDA_SUCCESS) {
		q->live += bytes;
		if (q->reserved < granules(q->live))
			q->reserved = granules(q->live);
		allocs[n_allocs++] = (struct alloc){ (CUdeviceptr)(uintptr_t)p, bytes, q };
		*dptr = (CUdeviceptr)(uintptr_t)p;
		pool_stats();
	}
	pthread_mutex_unlock(&lock);
	return r;
}

STUB CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, void *pool, void *stream)
{
	return cuMemAllocFromPoolAsync(dptr, bytes, pool, stream);
}

/* Whether dptr is a live allocation of a device pool. */
static bool device_alloc(CUdeviceptr dptr)
{
	bool device = false;

	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < n_allocs; i++)
		if (allocs[i].p == dptr)
			device = !allocs[i].pool->host;
	pthread_mutex_unlock(&lock);
	return device;
}

/* The pool keeps what is freed (reserved unchanged) until trimmed, or lets all go with a destroyed pool's last. */
STUB CUresult cuMemFreeAsync(CUdeviceptr dptr, void *stream)
{
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	(void)stream;
	if (getenv("STUB_CUDA_FREE_SLEEP_MS") && device_alloc(dptr))
		usleep((useconds_t)atoi(getenv("STUB_CUDA_FREE_SLEEP_MS")) * 1000);
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < n_allocs; i++)
		if (allocs[i].p == dptr) {
			struct pool *q = allocs[i].pool;

			munmap((void *)(uintptr_t)dptr, allocs[i].bytes);
			q->live -= allocs[i].bytes;
			allocs[i] = allocs[--n_allocs];
			if (q->destroyed && q->live == 0)
				*q = (struct pool){ 0 };
			pool_stats();
			r = CUDA_SUCCESS;
			break;
		}
	pthread_mutex_unlock(&lock);
	return r;
}

STUB CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, void *stream)
{
	return cuMemFreeAsync(dptr, stream);
}

/* cuMemFree_v2 (stub_cuda_copy.c) frees a pool's allocation through cuMemFreeAsync, and its own device memory. */
CUresult cuMemFree_v2(CUdeviceptr dptr);

/* ---- Graphs ---- */

STUB CUresult cuGraphCreate(void **graph, unsigned flags)
{
	CUresult r = CUDA_ERROR_OUT_OF_MEMORY;

	(void)flags;
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < sizeof(graphs) / sizeof(graphs[0]); i++)
		if (!graphs[i].used) {
			graphs[i] = (struct graph){ .used = true };
			*graph = &graphs[i];
			r = CUDA_SUCCESS;
			break;
		}
	pthread_mutex_unlock(&lock);
	return r;
}

/* A memory node: its address is reserved now (as the driver does), its host bytes counted while the graph lives. */
static CUresult add_alloc_node(void **node, void *graph, struct cu_alloc_node_params *params)
{
	struct graph *g = graph;
	void *p;

	if (!node || !params || params->bytesize == 0 || g < graphs || g >= graphs + 64 || !g->used)
		return CUDA_ERROR_INVALID_VALUE;
	p = mmap(NULL, params->bytesize, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	params->dptr = (CUdeviceptr)(uintptr_t)p;
	*node = p;
	pthread_mutex_lock(&lock);
	if (host_location(&params->pool_props.location)) {
		g->host_bytes += params->bytesize;
		vstats.graph_host_bytes += params->bytesize;
	}
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

STUB CUresult cuGraphAddMemAllocNode(void **node, void *graph, const void *deps, size_t n_deps,
				     struct cu_alloc_node_params *params)
{
	(void)deps;
	(void)n_deps;
	return add_alloc_node(node, graph, params);
}

STUB CUresult cuGraphAddNode(void **node, void *graph, const void *deps, size_t n_deps,
			     struct cu_graph_node_params *params)
{
	(void)deps;
	(void)n_deps;
	/* A memory-allocation node is the only kind this stand-in knows. */
	if (!params || params->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC)
		return CUDA_ERROR_NOT_SUPPORTED;
	return add_alloc_node(node, graph, &params->alloc);
}

STUB CUresult cuGraphAddNode_v2(void **node, void *graph, const void *deps, const void *edges, size_t n_deps,
				struct cu_graph_node_params *params)
{
	(void)edges;
	return cuGraphAddNode(node, graph, deps, n_deps, params);
}

STUB CUresult cuGraphDestroy(void *graph)
{
	struct graph *g = graph;

	if (g < graphs || g >= graphs + 64 || !g->used)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	vstats.graph_host_bytes -= g->host_bytes;
	*g = (struct graph){ 0 };
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

void *stub_cuda_copy_proc(const char *symbol, int version, cuuint64_t flags);

/*
 * What cuGetProcAddress answers for this file's names (stub_cuda.c asks here for names it does not know), and
 * for stub_cuda_copy.c's.
 */
void *stub_cuda_vmm_proc(const char *symbol, int version, cuuint64_t flags)
{
	static const struct stub_proc table[] = {
		{ "cuMemCreate", (stub_any_fn)cuMemCreate, NULL, 0 },
		{ "cuMemRelease", (stub_any_fn)cuMemRelease, NULL, 0 },
		{ "cuMemAddressReserve", (stub_any_fn)cuMemAddressReserve, NULL, 0 },
		{ "cuMemAddressFree", (stub_any_fn)cuMemAddressFree, NULL, 0 },
		{ "cuMemMap", (stub_any_fn)cuMemMap, NULL, 0 },
		{ "cuMemUnmap", (stub_any_fn)cuMemUnmap, NULL, 0 },
		{ "cuMemRetainAllocationHandle", (stub_any_fn)cuMemRetainAllocationHandle, NULL, 0 },
		{ "cuMemSetAccess", (stub_any_fn)cuMemSetAccess, NULL, 0 },
		{ "cuMemPoolCreate", (stub_any_fn)cuMemPoolCreate, NULL, 0 },
		{ "cuMemPoolDestroy", (stub_any_fn)cuMemPoolDestroy, NULL, 0 },
		{ "cuMemPoolTrimTo", (stub_any_fn)cuMemPoolTrimTo, NULL, 0 },
		{ "cuMemPoolGetAttribute", (stub_any_fn)cuMemPoolGetAttribute, NULL, 0 },
		{ "cuMemGetDefaultMemPool", (stub_any_fn)cuMemGetDefaultMemPool, NULL, 0 },
		{ "cuMemGetMemPool", (stub_any_fn)cuMemGetMemPool, NULL, 0 },
		{ "cuMemAllocFromPoolAsync", (stub_any_fn)cuMemAllocFromPoolAsync,
		  (stub_any_fn)cuMemAllocFromPoolAsync_ptsz, 0 },
		{ "cuMemFreeAsync", (stub_any_fn)cuMemFreeAsync, (stub_any_fn)cuMemFreeAsync_ptsz, 0 },
		{ "cuMemFree", (stub_any_fn)cuMemFree_v2, NULL, 3020 },
		{ "cuGraphCreate", (stub_any_fn)cuGraphCreate, NULL, 0 },
		{ "cuGraphAddMemAllocNode", (stub_any_fn)cuGraphAddMemAllocNode, NULL, 0 },
		{ "cuGraphAddNode", (stub_any_fn)cuGraphAddNode_v2, NULL, 12030 },
		{ "cuGraphAddNode", (stub_any_fn)cuGraphAddNode, NULL, 0 },
		{ "cuGraphDestroy", (stub_any_fn)cuGraphDestroy, NULL, 0 },
	};
	void *fn = stub_proc_find(table, sizeof(table) / sizeof(table[0]), symbol, version,
				  flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);

	return fn ? fn : stub_cuda_copy_proc(symbol, version, flags);
}

/* SPDX-License-Identifier: MIT */
/*
 * What the hooks for host memory the CUDA driver owns share; all hidden. preload-cudapaths.c hands their wrappers
 * to preload.c; preload-vmm.c, preload-pools.c and preload-graph.c are the wrappers; preload-cudapaths-state.c
 * holds their one lock and their state, which a forked child forgets. Each calls only downwards, in that order.
 */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* The wrappers, exported (client/preload/preload.map): preload-vmm.c's, preload-pools.c's, then preload-graph.c's. */
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

/* ---- The state (preload-cudapaths-state.c), under pbp_cudapaths_lock() but where a comment says otherwise ---- */

/* preload-vmm.c's: the VMM allocations with a host location (its struct vmm). */
struct pbp_vmm_state {
	struct pbp_table handles;  /* by handle: lease is the struct vmm (kind PBP_LEASE) */
	struct pbp_table mappings; /* by address: lease is the struct vmm mapped there */
	/*
	 * The keys of handles (but 0, which a slot cannot hold: always a "maybe"), and the span of mappings, both
	 * changed under the lock with the tables: cuMemMap and cuMemRelease of a handle outside the set, and
	 * cuMemUnmap and cuMemRetainAllocationHandle of addresses outside the span (device VMM, as PyTorch's
	 * expandable segments map and unmap at every step) call through without the lock. A host handle is in the set
	 * before cuMemCreate (or cuMemRetainAllocationHandle) returns it and leaves it only with its last release,
	 * this release's own work; a host mapping is in the span before cuMemMap returns and leaves it only when
	 * cuMemUnmap takes it.
	 */
	struct pbp_slots host_vmms;
	struct pbp_span maps_span;
};
PBP_HIDDEN extern struct pbp_vmm_state pbp_vmm;

struct pool; /* preload-pools.c's record of a host pool */

/* preload-pools.c's: the memory pools with a host location, and their allocations. */
struct pbp_pool_state {
	struct pbp_table allocs; /* by device pointer: lease is its struct pool; bytes page-rounded */
	/*
	 * The span of allocs, set under the lock after every change to it: cuMemFree and cuMemFreeAsync of a pointer
	 * outside it (a device free, the common case of a training job) call through without the lock, so a
	 * program's frees do not queue on it. A pointer the program frees came back from alloc_from_pool after its
	 * entry was put and the span set around it, and it leaves the span only when the entry is taken, this free's
	 * own work.
	 */
	struct pbp_span allocs_span;
	struct pool **v;
	size_t n, cap;
	/*
	 * The host pools' handles: an allocation from any other pool (a device pool, from which RMM's and CCCL's
	 * async resources allocate at every step) calls through without the lock. A handle is added, under the
	 * lock, before cuMemPoolCreate or cuMemGetDefaultMemPool returns it, and removed when its record is dropped.
	 */
	struct pbp_slots host_pools;
	/*
	 * Set once the process has a host pool: until then cuMemPoolDestroy and cuMemPoolTrimTo, which device memory
	 * calls too, call through without the lock.
	 */
	atomic_bool seen;
};
PBP_HIDDEN extern struct pbp_pool_state pbp_pools;

struct graph; /* preload-graph.c's record of a graph with host memory nodes */

/* preload-graph.c's: the graphs that hold memory nodes with a host location. */
struct pbp_graph_state {
	struct graph *v;
	size_t n, cap;
	/*
	 * Set once the process has a host graph node: until then cuGraphDestroy, which device memory calls too, calls
	 * through without the lock.
	 */
	atomic_bool seen;
};
PBP_HIDDEN extern struct pbp_graph_state pbp_graphs;

/*
 * Take and give back the lock that serialises every hook of these files, broker calls included (the first take
 * registers the fork handlers that hold it across fork() and let a child forget the state).
 */
PBP_HIDDEN void pbp_cudapaths_lock(void);
PBP_HIDDEN void pbp_cudapaths_unlock(void);
/* Publish t's span to s after a change to t (sorted by address). Under the lock. */
PBP_HIDDEN void pbp_cudapaths_span_set(struct pbp_span *s, const struct pbp_table *t);
/* Whether l names host memory (host, a host NUMA node, the current one); false for NULL. */
PBP_HIDDEN bool pbp_cudapaths_host_location(const struct cu_location *l);
/* bytes rounded up to whole pages. */
PBP_HIDDEN size_t pbp_cudapaths_round_page(size_t bytes);
/* The fallback for driver-owned memory the broker did not take: true to refuse (fallback=error); else unbrokered. */
PBP_HIDDEN bool pbp_cudapaths_refuse(void);

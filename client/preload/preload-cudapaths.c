/* SPDX-License-Identifier: MIT */
/*
 * libpinbroker-preload.so's hooks for host memory that the CUDA driver allocates and owns itself, so no lease can
 * serve it: VMM allocations (cuMemCreate with a host location, then cuMemMap: preload-vmm.c), memory pools with a
 * host location (cuMemPoolCreate, CUDA 13's default host pool, cuMemAllocFromPoolAsync: preload-pools.c) and graph
 * memory nodes with a host location (preload-graph.c). The runtime's calls (cudaMemPoolCreate,
 * cudaMallocFromPoolAsync, cudaMemGetDefaultMemPool, cudaGraphAddMemAllocNode...) reach these driver entry points
 * through cuGetProcAddress, which preload.c answers with the wrappers this file hands it, so no runtime function is
 * wrapped. preload-cudapaths-state.c holds the one lock these hooks share, their state, and what a forked child
 * does with them.
 *
 * A VMM handle and a host pool are charged as a registration against the budget (charge only: the pages stay the
 * driver's); preload-vmm.c and preload-pools.c say for how long. When the broker refuses (or is absent),
 * PINBROKER_PRELOAD_FALLBACK decides: error makes the call fail with CUDA_ERROR_OUT_OF_MEMORY before the driver pins
 * anything; cuda and pageable (no pageable stand-in exists for driver-owned memory) let the driver pin it and report
 * the bytes as unbrokered. Graph memory nodes with a host location are only reported as unbrokered.
 * Device memory goes through some of these hooks too (cudaFree's cuMemFree, cuMemFreeAsync, allocations from device
 * pools, the VMM calls of PyTorch's expandable segments): those find out without the lock that the memory is none of
 * the host pools' or host VMM allocations', so a program's threads do not queue on it (pbp_pools.allocs_span,
 * pbp_pools.host_pools, pbp_vmm.host_vmms and pbp_vmm.maps_span in preload-cudapaths-int.h say how).
 */
#define _GNU_SOURCE
#include <stdint.h>

#include "preload-cudapaths-int.h"
#include "preload.h"

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

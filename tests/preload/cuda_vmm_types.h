/* SPDX-License-Identifier: MIT */
/*
 * The subset of the CUDA driver API's VMM, memory-pool and graph-memory-node ABI that the stand-in libcuda
 * (stub_cuda_vmm.c) and the test program that calls it (cudapaths.c) share, written out without cuda.h. Names,
 * values and layouts are cuda.h's: the interposer between the two (client/preload/preload-cudapaths-int.h) reads these
 * structs as a real driver lays them out, so the tests mean something only while they match.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;

/* CUmemLocationType */
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_LOCATION_TYPE_HOST 2
#define CU_MEM_LOCATION_TYPE_HOST_NUMA 3
#define CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT 4
/* CUmemAllocationType */
#define CU_MEM_ALLOCATION_TYPE_PINNED 1
/* CUmemAccess_flags */
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 3
/* CUmemPool_attribute */
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5
#define CU_MEMPOOL_ATTR_USED_MEM_CURRENT 7
/* CUgraphNodeType */
#define CU_GRAPH_NODE_TYPE_MEM_ALLOC 10
/* cuGetProcAddress's flags */
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2u

/* CUmemLocation */
struct cu_location {
	int type; /* CU_MEM_LOCATION_TYPE_* */
	int id;   /* a device ordinal or a NUMA node; ignored for HOST */
};

/* CUmemAllocationProp (cuMemCreate) */
struct cu_alloc_prop {
	int type; /* CU_MEM_ALLOCATION_TYPE_* */
	int requested_handle_types;
	struct cu_location location;
	void *win32;
	unsigned char alloc_flags[8];
};

/* CUmemPoolProps (cuMemPoolCreate; a graph memory node's pool) */
struct cu_pool_props {
	int alloc_type; /* CU_MEM_ALLOCATION_TYPE_* */
	int handle_types;
	struct cu_location location;
	void *win32;
	size_t max_size; /* 0: no maximum */
	unsigned short usage;
	unsigned char reserved[54];
};

/* CUDA_MEM_ALLOC_NODE_PARAMS (cuGraphAddMemAllocNode) */
struct cu_alloc_node_params {
	struct cu_pool_props pool_props;
	const void *access_descs;
	size_t access_desc_count;
	size_t bytesize;
	CUdeviceptr dptr; /* out: the node's address */
};

/* CUgraphNodeParams (cuGraphAddNode_v2), with only the memory-allocation member of its union spelled out */
struct cu_graph_node_params {
	int type; /* CU_GRAPH_NODE_TYPE_* */
	int reserved0[3];
	union {
		long long reserved1[29];
		struct cu_alloc_node_params alloc;
	};
	long long reserved2;
};

/* CUmemAccessDesc (cuMemSetAccess) */
struct cu_access_desc {
	struct cu_location location;
	int flags; /* CU_MEM_ACCESS_FLAGS_* */
};

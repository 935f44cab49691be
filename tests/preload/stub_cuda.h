/* SPDX-License-Identifier: MIT */
/* The stand-in driver's record of what it pinned itself (tests/preload/stub_cuda.c). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct stub_cuda_stats {
	uint64_t alloc_bytes;      /* live cuMemHostAlloc / cuMemAllocHost memory */
	uint64_t registered_bytes; /* live cuMemHostRegister ranges */
	uint64_t alloc_calls;      /* allocations ever made */
	uint64_t register_calls;   /* registrations ever made */
	uint64_t unregister_calls; /* registrations ever undone */
};

/* One cuMemHostRegister call, as the stand-in driver saw it. */
struct stub_cuda_register_call {
	uintptr_t p;
	size_t bytes;
	int result; /* the CUresult it answered */
};

/* Exported by the stub libcuda.so.1; find it with dlsym on a dlopen("libcuda.so.1", RTLD_NOLOAD) handle. */
void stub_cuda_get_stats(struct stub_cuda_stats *s);
/*
 * The cuMemHostRegister calls made so far in this process, refused ones too: up to max of them, oldest first,
 * into calls; returns how many were made (which may be more than max; only the first 1024 are kept).
 * STUB_CUDA_REGISTER_CAP (a size: digits, then K, M or G) makes a call of that many bytes or more fail with
 * CUDA_ERROR_OUT_OF_MEMORY, as r580 drivers refuse one of 512 GiB; STUB_CUDA_REGISTER_FAIL_AT=N makes the
 * process's Nth call (from 1) fail the same way. Both are read at each call.
 */
size_t stub_cuda_register_log(struct stub_cuda_register_call *calls, size_t max);
/* cuMemHostAlloc by another name, so the interposer never sees the allocation (also found with dlsym). */
int stub_cuda_alloc_untracked(void **pp, size_t bytes);

/* Host memory the stand-in driver owns itself (tests/preload/stub_cuda_vmm.c): what a real driver would hold. */
struct stub_cuda_vmm_stats {
	uint64_t vmm_host_bytes;   /* live cuMemCreate allocations with a host location (handle held or mapped) */
	uint64_t pool_host_bytes;  /* what host-located pools reserve, the default host pool included */
	uint64_t graph_host_bytes; /* host-located memory nodes of live graphs */
};

/* Exported by the stub libcuda.so.1, found as stub_cuda_get_stats is. */
void stub_cuda_vmm_get_stats(struct stub_cuda_vmm_stats *s);

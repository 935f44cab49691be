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
};

/* Exported by the stub libcuda.so.1; find it with dlsym on a dlopen("libcuda.so.1", RTLD_NOLOAD) handle. */
void stub_cuda_get_stats(struct stub_cuda_stats *s);
/* cuMemHostAlloc by another name, so the interposer never sees the allocation (also found with dlsym). */
int stub_cuda_alloc_untracked(void **pp, size_t bytes);

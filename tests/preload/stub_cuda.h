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
/* closed 1: every cuMemHostRegister call waits before it does anything, until called with 0. */
void stub_cuda_register_gate(int closed);
/* Wait up to timeout_ms until n or more registrations wait at the closed gate; returns how many wait. */
int stub_cuda_register_gate_wait(int n, int timeout_ms);
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

/*
 * Every copy call the stand-in driver saw (tests/preload/stub_cuda_copy.c), by the kind of its host side: a test
 * tells from it whether a copy reached the driver as the program made it (its pageable host memory) or staged
 * through pinned memory (the ring's), and that the driver staged nothing itself.
 */
struct stub_cuda_copy_stats {
	uint64_t calls; /* copy calls, failed ones too: STUB_CUDA_COPY_FAIL_AT=calls+k fails the kth from now */
	uint64_t pageable_copies;    /* between device memory and pageable host memory */
	uint64_t pageable_bytes;     /* their bytes, and split by direction: */
	uint64_t pageable_h2d_bytes; /* host to device */
	uint64_t pageable_d2h_bytes; /* device to host */
	uint64_t pinned_copies;      /* between device memory and pinned or registered host memory */
	uint64_t pinned_bytes;
	uint64_t device_copies; /* neither side plain host memory: device to device, managed memory */
	uint64_t device_bytes;
	uint64_t host_copies;     /* host to host (cuMemcpy with two host pointers) */
	uint64_t captured_copies; /* of all these, made on a stream being captured: recorded, never run */
	uint64_t failed_calls;    /* answered with an error: STUB_CUDA_COPY_FAIL_AT, a bad pointer */
	uint64_t kernels;         /* stub_cuda_launch_* calls */
};

/* Exported by the stub libcuda.so.1, found as stub_cuda_get_stats is. */
void stub_cuda_copy_get_stats(struct stub_cuda_copy_stats *s);
/* Microseconds each stream waits before each operation (starts at $STUB_CUDA_STREAM_DELAY_US). */
void stub_cuda_set_stream_delay_us(unsigned us);
/* closed 1: every stream stops before its next copy, until called with 0. */
void stub_cuda_copy_gate(int closed);
/* How many streams wait at the closed gate now. */
int stub_cuda_copy_gate_waiting(void);
/*
 * Stand-in kernels, in stream order: set bytes of device memory at dptr to byte, or add addend to each (mod 256).
 * stream as cuLaunchKernel takes it (0 and 0x1: the legacy stream, 0x2: the caller's per-thread stream).
 * CUDA_ERROR_INVALID_VALUE unless [dptr, dptr + bytes) is device memory.
 */
int stub_cuda_launch_fill(void *stream, unsigned long long dptr, int byte, size_t bytes);
int stub_cuda_launch_add(void *stream, unsigned long long dptr, int addend, size_t bytes);

/* SPDX-License-Identifier: MIT */
/* The stand-in libcuda.so.1's own types and results, shared by its sources (stub_cuda*.c): cuda.h's, without cuda.h. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef int CUresult;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef uint64_t cuuint64_t;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2

/* An entry point the library exports (it is built with hidden visibility). */
#define STUB __attribute__((visibility("default")))

/* One row of what cuGetProcAddress answers: a name, its function, and from which CUDA version. */
typedef void (*stub_any_fn)(void);

struct stub_proc {
	const char *name;
	stub_any_fn fn, per_thread; /* per_thread: what CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM gets (NULL: fn) */
	int since;
};

/* The function table[0..n) gives symbol at version (per_thread: the per-thread default stream's form), or NULL. */
static inline void *stub_proc_find(const struct stub_proc *table, size_t n, const char *symbol, int version,
				   bool per_thread)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(symbol, table[i].name) == 0 && version >= table[i].since)
			return (void *)(uintptr_t)(per_thread && table[i].per_thread ? table[i].per_thread
										     : table[i].fn);
	return NULL;
}

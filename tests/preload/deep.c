/* SPDX-License-Identifier: MIT */
/*
 * A plugin that pins through the driver it links (libcuda.so.1), meant to be dlopen()ed with RTLD_DEEPBIND:
 * its cuMemHostAlloc, dlsym and cuGetProcAddress then bind to its own dependencies first (issue 22, finding 6).
 *   deep_alloc(way, bytes, &p): way "call" (the symbol), "dlsym" (dlsym on a libcuda.so.1 handle),
 *   "gpa" (cuGetProcAddress at CUDA 12.0). Returns the driver's CUresult. deep_free frees through the symbol.
 *   deep_scope(): "plugin" while its own deep_scope_probe wins over the program's, as RTLD_DEEPBIND promises.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef int CUresult;
CUresult cuInit(unsigned flags);
CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned flags);
CUresult cuMemFreeHost(void *p);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags);

__attribute__((visibility("default"))) int deep_alloc(const char *way, size_t bytes, void **p);
__attribute__((visibility("default"))) int deep_free(void *p);
__attribute__((visibility("default"))) const char *deep_scope_probe(void);
__attribute__((visibility("default"))) const char *deep_scope(void);

/* The program defines one too: which one deep_scope reaches says whether the library is still deep-bound. */
__attribute__((noinline)) const char *deep_scope_probe(void)
{
	return "plugin";
}

const char *deep_scope(void)
{
	const char *(*volatile probe)(void) = deep_scope_probe;

	return probe();
}

int deep_alloc(const char *way, size_t bytes, void **p)
{
	CUresult (*fn)(void **, size_t, unsigned) = NULL;
	void *h;

	cuInit(0);
	if (strcmp(way, "call") == 0)
		return cuMemHostAlloc(p, bytes, 0);
	if (strcmp(way, "dlsym") == 0) {
		h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
		if (h)
			fn = (CUresult(*)(void **, size_t, unsigned))(uintptr_t)dlsym(h, "cuMemHostAlloc");
	} else if (strcmp(way, "gpa") == 0) {
		void *q = NULL;

		if (cuGetProcAddress("cuMemHostAlloc", &q, 12000, 0) == 0)
			fn = (CUresult(*)(void **, size_t, unsigned))(uintptr_t)q;
	}
	return fn ? fn(p, bytes, 0) : 999;
}

int deep_free(void *p)
{
	return cuMemFreeHost(p);
}

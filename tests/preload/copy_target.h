/* SPDX-License-Identifier: MIT */
/*
 * copy_target's shared parts (copy_target.c: the ways in, the checked copies, the main modes; copy_target_modes.c:
 * pass-through, contexts, failures, the revoke dialogue, hold and the stand-in's self-test).
 */
#pragma once

#include "stub_cuda.h"
#include "target_check.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef uint64_t cuuint64_t;
typedef void *CUstream;
typedef void *CUevent;

#define PER_THREAD ((CUstream)0x2)

#ifdef TARGET_DRIVER
/* The driver's six copy forms, each plain and in its per-thread form (_ptds for the sync ones, _ptsz async). */
#define COPY_FORMS(sync, async)                                                                       \
	CUresult cuMemcpyHtoD_v2##sync(CUdeviceptr dst, const void *src, size_t n);                   \
	CUresult cuMemcpyDtoH_v2##sync(void *dst, CUdeviceptr src, size_t n);                         \
	CUresult cuMemcpyHtoDAsync_v2##async(CUdeviceptr dst, const void *src, size_t n, CUstream s); \
	CUresult cuMemcpyDtoHAsync_v2##async(void *dst, CUdeviceptr src, size_t n, CUstream s);       \
	CUresult cuMemcpy##sync(CUdeviceptr dst, CUdeviceptr src, size_t n);                          \
	CUresult cuMemcpyAsync##async(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
COPY_FORMS(, )
COPY_FORMS(_ptds, _ptsz)
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
#define BUILD "driver"
#else
typedef int cudaError_t;
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind);
cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t n, int kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream);
cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t n, int kind, void *stream);
#define BUILD "runtime"
#endif

/* One way in: the six copy forms, as the program's way of reaching them gives them. */
struct way {
	CUresult (*h2d)(CUdeviceptr, const void *, size_t);
	CUresult (*d2h)(void *, CUdeviceptr, size_t);
	CUresult (*h2d_async)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*d2h_async)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*copy)(CUdeviceptr, CUdeviceptr, size_t);
	CUresult (*copy_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
	bool ptds; /* stream 0 and the sync forms are the calling thread's per-thread stream */
};

extern struct way w;

/* The driver entry points for everything but the copies, from dlsym on a libcuda.so.1 handle. */
struct driver {
	CUresult (*init)(unsigned);
	CUresult (*retain)(void **, int);
	CUresult (*set_current)(void *);
	CUresult (*mem_alloc)(CUdeviceptr *, size_t);
	CUresult (*mem_alloc_managed)(CUdeviceptr *, size_t, unsigned);
	CUresult (*mem_free)(CUdeviceptr);
	CUresult (*host_alloc)(void **, size_t, unsigned);
	CUresult (*free_host)(void *);
	CUresult (*host_register)(void *, size_t, unsigned);
	CUresult (*host_unregister)(void *);
	CUresult (*stream_create)(CUstream *, unsigned);
	CUresult (*stream_destroy)(CUstream);
	CUresult (*stream_sync)(CUstream);
	CUresult (*ctx_sync)(void);
	CUresult (*event_create)(CUevent *, unsigned);
	CUresult (*event_record)(CUevent, CUstream);
	CUresult (*event_sync)(CUevent);
	CUresult (*event_destroy)(CUevent);
	CUresult (*wait_event)(CUstream, CUevent, unsigned);
	CUresult (*begin_capture)(CUstream, int);
	CUresult (*end_capture)(CUstream, void **);
	CUresult (*graph_destroy)(void *);
	int (*fill)(void *, CUdeviceptr, int, size_t);
	int (*add)(void *, CUdeviceptr, int, size_t);
	void (*copy_stats)(struct stub_cuda_copy_stats *);
	void (*stats)(struct stub_cuda_stats *);
	void (*set_delay)(unsigned);
	void (*gate)(int);
	int (*gate_waiting)(void);
};

extern struct driver cu;

extern void *ctx;
extern size_t slot, ring, threshold;
extern bool expect_staged;

enum form { FORM_SYNC, FORM_ASYNC, FORM_UNIFIED, FORM_UNIFIED_ASYNC, N_FORMS };
extern const char *const form_names[];

#define GUARD 64

struct stub_cuda_copy_stats copy_stats(void);
CUresult d2h(enum form f, void *d, CUdeviceptr s, size_t n, CUstream st);
CUdeviceptr dev_alloc(size_t n);
void enter(void);
void fill_pat(unsigned char *p, size_t n, unsigned seed);
size_t first_bad(const unsigned char *p, size_t n, unsigned seed, int add);
size_t first_not(const unsigned char *p, size_t n, unsigned char byte);
CUresult h2d(enum form f, CUdeviceptr d, const void *s, size_t n, CUstream st);
void *need(void *h, const char *name);
void round_trip(CUdeviceptr dev, size_t doff, size_t n, size_t hoff, enum form fh, enum form fd, CUstream st,
		unsigned seed, bool route);
CUstream stream_new(void);

/* The modes of copy_target_modes.c. */
int mode_passthrough(void);
int mode_contexts(void);
int mode_fail(void);
int mode_revoke(void);
int mode_hold(void);
int mode_selftest(void);

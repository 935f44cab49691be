/* SPDX-License-Identifier: MIT */
/*
 * What preload.c (the interposition: the exported functions, cuGetProcAddress, dlsym, set-up) and
 * preload-memory.c (what the wrappers do: the real functions, the broker, the table) share; all hidden.
 * preload.c calls preload-memory.c, never the other way.
 */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "pinbroker.h"
#include "preload-table.h"

#define PBP_HIDDEN __attribute__((visibility("hidden")))
/*
 * dlsym() runs from the sanitizers' own start-up (they look their interceptors up with it), before
 * their shadow memory exists: what it reaches here must not be instrumented.
 */
#define UNSANITIZED __attribute__((no_sanitize("address", "undefined")))

/* From cuda.h and driver_types.h: the values are ABI. The runtime's and the driver's coincide for these. */
typedef int CUresult;
typedef int cudaError_t;
typedef uint64_t cuuint64_t;
#define CU_OK 0
#define CU_INVALID_VALUE 1
#define CU_OUT_OF_MEMORY 2
#define CU_NOT_INITIALIZED 3
#define CU_HOST_MEMORY_NOT_REGISTERED 713

/* Every function the interposer stands in for. The driver's come first, then the runtime's. */
enum fn {
	F_cuMemHostAlloc,
	F_cuMemAllocHost, /* CUDA 3.1's: unsigned int bytesize */
	F_cuMemAllocHost_v2,
	F_cuMemFreeHost,
	F_cuMemHostRegister, /* same ABI as _v2 */
	F_cuMemHostRegister_v2,
	F_cuMemHostUnregister,
	F_cuMemHostGetFlags,
	F_cuGetProcAddress,
	F_cuGetProcAddress_v2,
	/* Where the driver allocates host memory itself (preload-cudapaths.c): VMM, memory pools, graph nodes. */
	F_cuMemCreate,
	F_cuMemRelease,
	F_cuMemRetainAllocationHandle,
	F_cuMemMap,
	F_cuMemUnmap,
	F_cuMemPoolCreate,
	F_cuMemPoolDestroy,
	F_cuMemPoolTrimTo,
	F_cuMemGetDefaultMemPool,
	F_cuMemGetMemPool,
	F_cuMemAllocFromPoolAsync,
	F_cuMemAllocFromPoolAsync_ptsz,
	F_cuMemFreeAsync,
	F_cuMemFreeAsync_ptsz,
	F_cuMemFree_v2,
	F_cuGraphAddMemAllocNode,
	F_cuGraphAddNode,
	F_cuGraphAddNode_v2,
	F_cuGraphDestroy,
	/* Copies between device memory and host memory (preload-copy.c): staged when the host side is pageable. */
	F_cuMemcpyHtoD_v2,
	F_cuMemcpyHtoD_v2_ptds,
	F_cuMemcpyDtoH_v2,
	F_cuMemcpyDtoH_v2_ptds,
	F_cuMemcpyHtoDAsync_v2,
	F_cuMemcpyHtoDAsync_v2_ptsz,
	F_cuMemcpyDtoHAsync_v2,
	F_cuMemcpyDtoHAsync_v2_ptsz,
	F_cuMemcpy,
	F_cuMemcpy_ptds,
	F_cuMemcpyAsync,
	F_cuMemcpyAsync_ptsz,
	F_DRIVER_END,
	F_cudaHostAlloc = F_DRIVER_END,
	F_cudaMallocHost,
	F_cudaFreeHost,
	F_cudaHostRegister,
	F_cudaHostUnregister,
	F_cudaHostGetFlags,
	F_cudaMemcpy,
	F_cudaMemcpy_ptds,
	F_cudaMemcpyAsync,
	F_cudaMemcpyAsync_ptsz,
	F_END,
};

/* Each function's name, as dlsym and cuGetProcAddress are asked for it. */
PBP_HIDDEN extern const char *const pbp_fn_names[F_END];
/* The real functions: the driver's from our own handle on libcuda.so.1, the runtime's as found. */
PBP_HIDDEN extern void *_Atomic pbp_fn_real[F_END];
/* The real dlsym once known (hidden, so the assembly reaches it without the GOT). */
PBP_HIDDEN extern void *(*pbp_real_dlsym)(void *, const char *);

/* The environment's word, read once by the constructor (preload.c). */
struct pbp_cfg {
	enum pbp_policy policy;
	char label[96];
	bool verbose;
	bool off;            /* PINBROKER_PRELOAD=0: forward everything */
	uintptr_t self_base; /* this object's load address, to know our own dlsym() calls */
};
PBP_HIDDEN extern struct pbp_cfg pbp_cfg;

/* A few warnings by default (a fallback, a refusal), everything with PINBROKER_PRELOAD_LOG=1. */
PBP_HIDDEN void pbp_say(bool warning, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* libc's dlsym (the versions glibc has had), or NULL. */
UNSANITIZED PBP_HIDDEN void *pbp_resolve_real_dlsym(void);
/* The real dlsym(handle, name), resolved on first use; NULL when there is none. */
UNSANITIZED PBP_HIDDEN void *pbp_call_real_dlsym(void *handle, const char *name);
/* The real function f: the driver's (loaded once), or the runtime's next definition after ours; NULL if none. */
PBP_HIDDEN void *pbp_real_fn(enum fn f);
/* Call the real f as type: the caller has checked pbp_real_fn(f) first. */
#define CALL(type, f, ...) ((type)(uintptr_t)pbp_real_fn(f))(__VA_ARGS__)

/*
 * What the exported functions do, f naming which was called; each returns a CUDA status (CU_*):
 * allocation and freeing, registration and unregistering, and the flags of a pointer.
 */
PBP_HIDDEN int pbp_host_alloc(enum fn f, void **pp, size_t size, unsigned flags);
PBP_HIDDEN int pbp_host_free(enum fn f, void *p);
PBP_HIDDEN int pbp_host_register(enum fn f, void *p, size_t size, unsigned flags);
PBP_HIDDEN int pbp_host_unregister(enum fn f, void *p);
PBP_HIDDEN int pbp_host_get_flags(enum fn f, unsigned *flags, void *p);

/*
 * For preload-cudapaths.c's rooms, whose memory the driver owns: whether a wrapper must call straight through; the
 * depth around a real call (pbp_enter, pbp_leave), so what the driver reaches from there passes through; a
 * charge of bytes no address names (0, or -errno with why filled: no broker, or its refusal) and its
 * release; unbrokered bytes added and taken away (then reported); the page size.
 */
PBP_HIDDEN bool pbp_passthrough(void);
PBP_HIDDEN void pbp_enter(void);
PBP_HIDDEN void pbp_leave(void);
PBP_HIDDEN int pbp_charge(size_t bytes, pb_lease **out, char *why, size_t why_len);
PBP_HIDDEN void pbp_uncharge(pb_lease *l);
PBP_HIDDEN void pbp_unbrokered_adjust(uint64_t add, uint64_t sub);
PBP_HIDDEN size_t pbp_page_size(void);

/* The broker connection, made on first need (NULL while none answers: asked again at most every 5 s). */
PBP_HIDDEN pb_client *pbp_client(void);

/* The exported wrappers of preload-copy.c, for the tables of preload.c. */
PBP_HIDDEN void *pbp_copy_wrapper(enum fn f);

/*
 * The exported wrappers of preload-cudapaths.c's rooms, for the tables of preload.c (what dlsym and
 * cuGetProcAddress hand out).
 */
PBP_HIDDEN void *pbp_cudapaths_wrapper(enum fn f);

/* pthread_atfork's three: every lock held across fork(), and the child's connection and counts reset. */
PBP_HIDDEN void pbp_before_fork(void);
PBP_HIDDEN void pbp_after_fork_parent(void);
PBP_HIDDEN void pbp_after_fork_child(void);

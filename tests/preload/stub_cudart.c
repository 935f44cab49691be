/* SPDX-License-Identifier: MIT */
/*
 * A stand-in CUDA runtime: the host-memory calls of cuda_runtime_api.h, made
 * the way the real runtime makes them. It dlopen()s libcuda.so.1, looks up
 * cuGetProcAddress_v2 with dlsym() and takes every other driver entry point
 * from it. Built twice: as libcudart.so.13 (a program linked with
 * -cudart shared) and compiled into the program itself (nvcc's default, the
 * static runtime, whose calls no symbol interposition can reach).
 *
 * Its copies (cudaMemcpy, cudaMemcpyAsync and their per-thread-stream forms) call the driver's cuMemcpy* entry
 * points by the kind of copy, and cudaMalloc/cudaFree/cudaStreamSynchronize theirs; like the real runtime, each
 * call first makes the device's primary context current on the calling thread when none is.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef int cudaError_t;
typedef int CUresult;
typedef uint64_t cuuint64_t;

#define RT __attribute__((visibility("default")))

static struct {
	CUresult (*init)(unsigned);
	CUresult (*host_alloc)(void **, size_t, unsigned);
	CUresult (*alloc_host)(void **, size_t);
	CUresult (*free_host)(void *);
	CUresult (*host_register)(void *, size_t, unsigned);
	CUresult (*host_unregister)(void *);
	CUresult (*host_get_flags)(unsigned *, void *);
	CUresult (*host_get_device_pointer)(unsigned long long *, void *, unsigned);
	CUresult (*ctx_get_current)(void **);
	CUresult (*ctx_set_current)(void *);
	CUresult (*primary_ctx_retain)(void **, int);
	CUresult (*mem_alloc)(unsigned long long *, size_t);
	CUresult (*mem_free)(unsigned long long);
	/* [0]: the legacy default stream's forms; [1]: the per-thread default stream's (_ptds, _ptsz). */
	CUresult (*htod[2])(unsigned long long, const void *, size_t);
	CUresult (*dtoh[2])(void *, unsigned long long, size_t);
	CUresult (*copy[2])(unsigned long long, unsigned long long, size_t);
	CUresult (*htod_async[2])(unsigned long long, const void *, size_t, void *);
	CUresult (*dtoh_async[2])(void *, unsigned long long, size_t, void *);
	CUresult (*copy_async[2])(unsigned long long, unsigned long long, size_t, void *);
	CUresult (*stream_sync[2])(void *);
} drv;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int loaded, copies;

static void load(void)
{
	CUresult (*gpa)(const char *, void **, int, cuuint64_t, int *);
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

	if (!h)
		return;
	*(void **)&gpa = dlsym(h, "cuGetProcAddress_v2");
	if (!gpa)
		return;
	gpa("cuInit", (void **)&drv.init, 13000, 0, NULL);
	gpa("cuMemHostAlloc", (void **)&drv.host_alloc, 13000, 0, NULL);
	gpa("cuMemAllocHost", (void **)&drv.alloc_host, 13000, 0, NULL);
	gpa("cuMemFreeHost", (void **)&drv.free_host, 13000, 0, NULL);
	gpa("cuMemHostRegister", (void **)&drv.host_register, 13000, 0, NULL);
	gpa("cuMemHostUnregister", (void **)&drv.host_unregister, 13000, 0, NULL);
	gpa("cuMemHostGetFlags", (void **)&drv.host_get_flags, 13000, 0, NULL);
	gpa("cuMemHostGetDevicePointer", (void **)&drv.host_get_device_pointer, 13000, 0, NULL);
	gpa("cuCtxGetCurrent", (void **)&drv.ctx_get_current, 13000, 0, NULL);
	gpa("cuCtxSetCurrent", (void **)&drv.ctx_set_current, 13000, 0, NULL);
	gpa("cuDevicePrimaryCtxRetain", (void **)&drv.primary_ctx_retain, 13000, 0, NULL);
	gpa("cuMemAlloc", (void **)&drv.mem_alloc, 13000, 0, NULL);
	gpa("cuMemFree", (void **)&drv.mem_free, 13000, 0, NULL);
	for (int pt = 0; pt < 2; pt++) {
		cuuint64_t f = pt ? 2 : 0; /* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM */

		gpa("cuMemcpyHtoD", (void **)&drv.htod[pt], 13000, f, NULL);
		gpa("cuMemcpyDtoH", (void **)&drv.dtoh[pt], 13000, f, NULL);
		gpa("cuMemcpy", (void **)&drv.copy[pt], 13000, f, NULL);
		gpa("cuMemcpyHtoDAsync", (void **)&drv.htod_async[pt], 13000, f, NULL);
		gpa("cuMemcpyDtoHAsync", (void **)&drv.dtoh_async[pt], 13000, f, NULL);
		gpa("cuMemcpyAsync", (void **)&drv.copy_async[pt], 13000, f, NULL);
		gpa("cuStreamSynchronize", (void **)&drv.stream_sync[pt], 13000, f, NULL);
	}
	copies = drv.ctx_get_current && drv.ctx_set_current && drv.primary_ctx_retain && drv.mem_alloc && drv.mem_free;
	for (int pt = 0; pt < 2; pt++)
		copies = copies && drv.htod[pt] && drv.dtoh[pt] && drv.copy[pt] && drv.htod_async[pt] &&
			 drv.dtoh_async[pt] && drv.copy_async[pt] && drv.stream_sync[pt];
	loaded = drv.init && drv.init(0) == 0 && drv.host_alloc && drv.alloc_host && drv.free_host &&
		 drv.host_register && drv.host_unregister && drv.host_get_flags && drv.host_get_device_pointer;
}

/* cudaErrorInitializationError when there is no driver, as the real runtime answers. */
#define DRIVER(call) (pthread_once(&once, load), loaded ? (call) : 3)

RT cudaError_t cudaHostAlloc(void **p, size_t size, unsigned flags);
RT cudaError_t cudaMallocHost(void **p, size_t size);
RT cudaError_t cudaFreeHost(void *p);
RT cudaError_t cudaHostRegister(void *p, size_t size, unsigned flags);
RT cudaError_t cudaHostUnregister(void *p);
RT cudaError_t cudaHostGetFlags(unsigned *flags, void *p);
RT cudaError_t cudaHostGetDevicePointer(void **d, void *p, unsigned flags);

RT cudaError_t cudaHostAlloc(void **p, size_t size, unsigned flags)
{
	return DRIVER(drv.host_alloc(p, size, flags));
}

RT cudaError_t cudaMallocHost(void **p, size_t size)
{
	return DRIVER(drv.alloc_host(p, size));
}

RT cudaError_t cudaFreeHost(void *p)
{
	return DRIVER(drv.free_host(p));
}

RT cudaError_t cudaHostRegister(void *p, size_t size, unsigned flags)
{
	return DRIVER(drv.host_register(p, size, flags));
}

RT cudaError_t cudaHostUnregister(void *p)
{
	return DRIVER(drv.host_unregister(p));
}

RT cudaError_t cudaHostGetFlags(unsigned *flags, void *p)
{
	return DRIVER(drv.host_get_flags(flags, p));
}

RT cudaError_t cudaHostGetDevicePointer(void **d, void *p, unsigned flags)
{
	return DRIVER(drv.host_get_device_pointer((unsigned long long *)d, p, flags));
}

/* ---- Device memory and copies ---- */

/* cudaMemcpyKind */
enum { H2H = 0, H2D = 1, D2H = 2, D2D = 3, DEFAULT = 4 };

/* The driver's entry points for copies, with the device's primary context current on this thread; else the
 * runtime's error (cudaErrorInitializationError without a driver). */
static cudaError_t ready(void)
{
	void *ctx = NULL;
	CUresult r;

	pthread_once(&once, load);
	if (!loaded || !copies)
		return 3;
	if ((r = drv.ctx_get_current(&ctx)) != 0)
		return r;
	if (!ctx && ((r = drv.primary_ctx_retain(&ctx, 0)) != 0 || (r = drv.ctx_set_current(ctx)) != 0))
		return r;
	return 0;
}

static cudaError_t memcpy_by_kind(void *dst, const void *src, size_t n, int kind, void *stream, bool async, int pt)
{
	unsigned long long d = (unsigned long long)(uintptr_t)dst, s = (unsigned long long)(uintptr_t)src;
	cudaError_t r = ready();

	if (r != 0)
		return r;
	if (kind < H2H || kind > DEFAULT)
		return 21; /* cudaErrorInvalidMemcpyDirection */
	if (kind == H2D)
		return async ? drv.htod_async[pt](d, src, n, stream) : drv.htod[pt](d, src, n);
	if (kind == D2H)
		return async ? drv.dtoh_async[pt](dst, s, n, stream) : drv.dtoh[pt](dst, s, n);
	return async ? drv.copy_async[pt](d, s, n, stream) : drv.copy[pt](d, s, n);
}

RT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind);
RT cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t n, int kind);
RT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream);
RT cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t n, int kind, void *stream);
RT cudaError_t cudaMalloc(void **p, size_t n);
RT cudaError_t cudaFree(void *p);
RT cudaError_t cudaStreamSynchronize(void *stream);
RT cudaError_t cudaStreamSynchronize_ptsz(void *stream);

RT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind)
{
	return memcpy_by_kind(dst, src, n, kind, NULL, false, 0);
}

RT cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t n, int kind)
{
	return memcpy_by_kind(dst, src, n, kind, NULL, false, 1);
}

RT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream)
{
	return memcpy_by_kind(dst, src, n, kind, stream, true, 0);
}

RT cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t n, int kind, void *stream)
{
	return memcpy_by_kind(dst, src, n, kind, stream, true, 1);
}

RT cudaError_t cudaMalloc(void **p, size_t n)
{
	cudaError_t r = ready();

	if (r != 0)
		return r;
	if (!p)
		return 1;
	return drv.mem_alloc((unsigned long long *)p, n);
}

/* cudaFree(NULL) is the runtime's idiom for "initialise": no driver call. */
RT cudaError_t cudaFree(void *p)
{
	cudaError_t r = ready();

	return r != 0 || !p ? r : drv.mem_free((unsigned long long)(uintptr_t)p);
}

RT cudaError_t cudaStreamSynchronize(void *stream)
{
	cudaError_t r = ready();

	return r != 0 ? r : drv.stream_sync[0](stream);
}

RT cudaError_t cudaStreamSynchronize_ptsz(void *stream)
{
	cudaError_t r = ready();

	return r != 0 ? r : drv.stream_sync[1](stream);
}

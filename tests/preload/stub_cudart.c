/* SPDX-License-Identifier: MIT */
/*
 * A stand-in CUDA runtime: the host-memory calls of cuda_runtime_api.h, made
 * the way the real runtime makes them. It dlopen()s libcuda.so.1, looks up
 * cuGetProcAddress_v2 with dlsym() and takes every other driver entry point
 * from it. Built twice: as libcudart.so.13 (a program linked with
 * -cudart shared) and compiled into the program itself (nvcc's default, the
 * static runtime, whose calls no symbol interposition can reach).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
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
} drv;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int loaded;

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

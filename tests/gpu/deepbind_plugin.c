/* SPDX-License-Identifier: MIT */
/*
 * A plugin linked against the real CUDA driver, for run-preload.sh's deep-bind check (issue 22, finding 6):
 * loaded with RTLD_DEEPBIND, its own cuMemHostAlloc import binds to libcuda.so.1 first, which the
 * interposer must still see.
 */
#include <cuda.h>
#include <stddef.h>

int deep_gpu_alloc(size_t size, void **p);
int deep_gpu_free(void *p);

static CUcontext ctx;

int deep_gpu_alloc(size_t size, void **p)
{
	CUdevice dev;

	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
	    cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
		return -1;
	return cuMemHostAlloc(p, size, 0) == CUDA_SUCCESS ? 0 : -2;
}

int deep_gpu_free(void *p)
{
	return cuMemFreeHost(p) == CUDA_SUCCESS ? 0 : -1;
}

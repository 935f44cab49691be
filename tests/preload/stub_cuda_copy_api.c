/* SPDX-License-Identifier: MIT */
/* The stand-in driver's copy entry points (cuMemcpy* and their per-thread forms) and what cuGetProcAddress answers for stub_cuda_copy.c's names. */
#include "stub_cuda_copy.h"

#include <string.h>

#define HTOD(dptr) ((void *)(uintptr_t)(dptr))

STUB CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	return stub_copy(HTOD(dst), src, n, NULL, COPY_H2D | COPY_SYNC);
}

STUB CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n)
{
	return stub_copy(HTOD(dst), src, n, NULL, COPY_H2D | COPY_SYNC | COPY_PTDS);
}

STUB CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	return stub_copy(dst, HTOD(src), n, NULL, COPY_D2H | COPY_SYNC);
}

STUB CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n)
{
	return stub_copy(dst, HTOD(src), n, NULL, COPY_D2H | COPY_SYNC | COPY_PTDS);
}

STUB CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, struct stream *h)
{
	return stub_copy(HTOD(dst), src, n, h, COPY_H2D);
}

STUB CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, struct stream *h)
{
	return stub_copy(HTOD(dst), src, n, h, COPY_H2D | COPY_PTDS);
}

STUB CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, struct stream *h)
{
	return stub_copy(dst, HTOD(src), n, h, COPY_D2H);
}

STUB CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, struct stream *h)
{
	return stub_copy(dst, HTOD(src), n, h, COPY_D2H | COPY_PTDS);
}

STUB CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	return stub_copy(HTOD(dst), HTOD(src), n, NULL, COPY_SYNC);
}

STUB CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	return stub_copy(HTOD(dst), HTOD(src), n, NULL, COPY_SYNC | COPY_PTDS);
}

STUB CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, struct stream *h)
{
	return stub_copy(HTOD(dst), HTOD(src), n, h, 0);
}

STUB CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, struct stream *h)
{
	return stub_copy(HTOD(dst), HTOD(src), n, h, COPY_PTDS);
}

/* What cuGetProcAddress answers for this file's names (stub_cuda_vmm.c asks here for names it does not know). */
void *stub_cuda_copy_proc(const char *symbol, int version, cuuint64_t flags)
{
	typedef void (*any_fn)(void);
	static const struct {
		const char *name;
		any_fn fn, per_thread; /* per_thread: what CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM gets */
		int since;
	} table[] = {
		{ "cuMemAlloc", (any_fn)cuMemAlloc_v2, NULL, 3020 },
		{ "cuMemAllocManaged", (any_fn)cuMemAllocManaged, NULL, 0 },
		{ "cuPointerGetAttribute", (any_fn)cuPointerGetAttribute, NULL, 0 },
		{ "cuPointerGetAttributes", (any_fn)cuPointerGetAttributes, NULL, 0 },
		{ "cuStreamCreate", (any_fn)cuStreamCreate, NULL, 0 },
		{ "cuStreamCreateWithPriority", (any_fn)cuStreamCreateWithPriority, NULL, 0 },
		{ "cuStreamDestroy", (any_fn)cuStreamDestroy_v2, NULL, 4000 },
		{ "cuStreamSynchronize", (any_fn)cuStreamSynchronize, (any_fn)cuStreamSynchronize_ptsz, 0 },
		{ "cuStreamQuery", (any_fn)cuStreamQuery, NULL, 0 },
		{ "cuCtxSynchronize", (any_fn)cuCtxSynchronize, NULL, 0 },
		{ "cuStreamBeginCapture", (any_fn)cuStreamBeginCapture_v2, (any_fn)cuStreamBeginCapture_v2_ptsz,
		  10010 },
		{ "cuStreamBeginCapture", (any_fn)cuStreamBeginCapture, NULL, 0 },
		{ "cuStreamEndCapture", (any_fn)cuStreamEndCapture, (any_fn)cuStreamEndCapture_ptsz, 0 },
		{ "cuStreamIsCapturing", (any_fn)cuStreamIsCapturing, (any_fn)cuStreamIsCapturing_ptsz, 0 },
		{ "cuEventCreate", (any_fn)cuEventCreate, NULL, 0 },
		{ "cuEventRecord", (any_fn)cuEventRecord, (any_fn)cuEventRecord_ptsz, 0 },
		{ "cuEventQuery", (any_fn)cuEventQuery, NULL, 0 },
		{ "cuEventSynchronize", (any_fn)cuEventSynchronize, NULL, 0 },
		{ "cuEventDestroy", (any_fn)cuEventDestroy_v2, NULL, 4000 },
		{ "cuStreamWaitEvent", (any_fn)cuStreamWaitEvent, (any_fn)cuStreamWaitEvent_ptsz, 0 },
		{ "cuMemcpyHtoD", (any_fn)cuMemcpyHtoD_v2, (any_fn)cuMemcpyHtoD_v2_ptds, 3020 },
		{ "cuMemcpyDtoH", (any_fn)cuMemcpyDtoH_v2, (any_fn)cuMemcpyDtoH_v2_ptds, 3020 },
		{ "cuMemcpyHtoDAsync", (any_fn)cuMemcpyHtoDAsync_v2, (any_fn)cuMemcpyHtoDAsync_v2_ptsz, 3020 },
		{ "cuMemcpyDtoHAsync", (any_fn)cuMemcpyDtoHAsync_v2, (any_fn)cuMemcpyDtoHAsync_v2_ptsz, 3020 },
		{ "cuMemcpy", (any_fn)cuMemcpy, (any_fn)cuMemcpy_ptds, 4000 },
		{ "cuMemcpyAsync", (any_fn)cuMemcpyAsync, (any_fn)cuMemcpyAsync_ptsz, 4000 },
	};
	bool ptds = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if (strcmp(symbol, table[i].name) == 0 && version >= table[i].since)
			return (void *)(uintptr_t)(ptds && table[i].per_thread ? table[i].per_thread : table[i].fn);
	return NULL;
}

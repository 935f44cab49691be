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
	static const struct stub_proc table[] = {
		{ "cuMemAlloc", (stub_any_fn)cuMemAlloc_v2, NULL, 3020 },
		{ "cuMemAllocManaged", (stub_any_fn)cuMemAllocManaged, NULL, 0 },
		{ "cuPointerGetAttribute", (stub_any_fn)cuPointerGetAttribute, NULL, 0 },
		{ "cuPointerGetAttributes", (stub_any_fn)cuPointerGetAttributes, NULL, 0 },
		{ "cuStreamCreate", (stub_any_fn)cuStreamCreate, NULL, 0 },
		{ "cuStreamCreateWithPriority", (stub_any_fn)cuStreamCreateWithPriority, NULL, 0 },
		{ "cuStreamDestroy", (stub_any_fn)cuStreamDestroy_v2, NULL, 4000 },
		{ "cuStreamSynchronize", (stub_any_fn)cuStreamSynchronize, (stub_any_fn)cuStreamSynchronize_ptsz, 0 },
		{ "cuStreamQuery", (stub_any_fn)cuStreamQuery, NULL, 0 },
		{ "cuCtxSynchronize", (stub_any_fn)cuCtxSynchronize, NULL, 0 },
		{ "cuStreamBeginCapture", (stub_any_fn)cuStreamBeginCapture_v2,
		  (stub_any_fn)cuStreamBeginCapture_v2_ptsz, 10010 },
		{ "cuStreamBeginCapture", (stub_any_fn)cuStreamBeginCapture, NULL, 0 },
		{ "cuStreamEndCapture", (stub_any_fn)cuStreamEndCapture, (stub_any_fn)cuStreamEndCapture_ptsz, 0 },
		{ "cuStreamIsCapturing", (stub_any_fn)cuStreamIsCapturing, (stub_any_fn)cuStreamIsCapturing_ptsz, 0 },
		{ "cuEventCreate", (stub_any_fn)cuEventCreate, NULL, 0 },
		{ "cuEventRecord", (stub_any_fn)cuEventRecord, (stub_any_fn)cuEventRecord_ptsz, 0 },
		{ "cuEventQuery", (stub_any_fn)cuEventQuery, NULL, 0 },
		{ "cuEventSynchronize", (stub_any_fn)cuEventSynchronize, NULL, 0 },
		{ "cuEventDestroy", (stub_any_fn)cuEventDestroy_v2, NULL, 4000 },
		{ "cuStreamWaitEvent", (stub_any_fn)cuStreamWaitEvent, (stub_any_fn)cuStreamWaitEvent_ptsz, 0 },
		{ "cuMemcpyHtoD", (stub_any_fn)cuMemcpyHtoD_v2, (stub_any_fn)cuMemcpyHtoD_v2_ptds, 3020 },
		{ "cuMemcpyDtoH", (stub_any_fn)cuMemcpyDtoH_v2, (stub_any_fn)cuMemcpyDtoH_v2_ptds, 3020 },
		{ "cuMemcpyHtoDAsync", (stub_any_fn)cuMemcpyHtoDAsync_v2, (stub_any_fn)cuMemcpyHtoDAsync_v2_ptsz,
		  3020 },
		{ "cuMemcpyDtoHAsync", (stub_any_fn)cuMemcpyDtoHAsync_v2, (stub_any_fn)cuMemcpyDtoHAsync_v2_ptsz,
		  3020 },
		{ "cuMemcpy", (stub_any_fn)cuMemcpy, (stub_any_fn)cuMemcpy_ptds, 4000 },
		{ "cuMemcpyAsync", (stub_any_fn)cuMemcpyAsync, (stub_any_fn)cuMemcpyAsync_ptsz, 4000 },
	};
	return stub_proc_find(table, sizeof(table) / sizeof(table[0]), symbol, version,
			      flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
}

/* SPDX-License-Identifier: MIT */
/*
 * The stand-in driver's copies, streams and events: what stub_cuda_copy.c (the engine) and stub_cuda_copy_api.c (the
 * copy entry points and cuGetProcAddress's table for them) share.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stub_cuda_int.h"

#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_ILLEGAL_STATE 401
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_ILLEGAL_ADDRESS 700
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900

#define CU_STREAM_NON_BLOCKING 0x1u
#define CU_STREAM_LEGACY ((struct stream *)0x1)
#define CU_STREAM_PER_THREAD ((struct stream *)0x2)
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2u

/* CUpointer_attribute, CUmemorytype */
#define ATTR_CONTEXT 1
#define ATTR_MEMORY_TYPE 2
#define ATTR_IS_MANAGED 8
#define ATTR_DEVICE_ORDINAL 9
#define MEMORYTYPE_HOST 1
#define MEMORYTYPE_DEVICE 2

/* stub_cuda.c's: whether p lies in memory the driver pinned (an allocation or a registration). */
bool stub_cuda_host_pinned(uintptr_t p);
CUresult cuCtxGetCurrent(CUcontext *c);
CUresult cuGraphCreate(void **graph, unsigned flags);
CUresult cuMemFreeAsync(CUdeviceptr dptr, void *stream);

struct stream;
struct CUevent_st;

/* How stub_copy copies: its direction, whether it returns when done, and whether stream 0 is per-thread. */
#define COPY_H2D 0x1u
#define COPY_D2H 0x2u
#define COPY_SYNC 0x4u
#define COPY_PTDS 0x8u

/* One copy of n bytes on stream h (NULL: the default stream), as a cuMemcpy* call asks. */
CUresult stub_copy(void *dst, const void *src, size_t n, struct stream *h, unsigned how);

/* stub_cuda_copy.c's entry points that cuGetProcAddress hands out. */
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned flags);
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr ptr);
CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr ptr);
CUresult cuStreamCreate(struct stream **ph, unsigned flags);
CUresult cuStreamCreateWithPriority(struct stream **ph, unsigned flags, int priority);
CUresult cuStreamDestroy_v2(struct stream *h);
CUresult cuStreamSynchronize(struct stream *h);
CUresult cuStreamSynchronize_ptsz(struct stream *h);
CUresult cuStreamQuery(struct stream *h);
CUresult cuCtxSynchronize(void);
CUresult cuStreamBeginCapture_v2(struct stream *h, int mode);
CUresult cuStreamBeginCapture_v2_ptsz(struct stream *h, int mode);
CUresult cuStreamBeginCapture(struct stream *h);
CUresult cuStreamEndCapture(struct stream *h, void **graph);
CUresult cuStreamEndCapture_ptsz(struct stream *h, void **graph);
CUresult cuStreamIsCapturing(struct stream *h, int *status);
CUresult cuStreamIsCapturing_ptsz(struct stream *h, int *status);
CUresult cuEventCreate(struct CUevent_st **pe, unsigned flags);
CUresult cuEventRecord(struct CUevent_st *e, struct stream *h);
CUresult cuEventRecord_ptsz(struct CUevent_st *e, struct stream *h);
CUresult cuEventQuery(struct CUevent_st *e);
CUresult cuEventSynchronize(struct CUevent_st *e);
CUresult cuEventDestroy_v2(struct CUevent_st *e);
CUresult cuStreamWaitEvent(struct stream *h, struct CUevent_st *e, unsigned flags);
CUresult cuStreamWaitEvent_ptsz(struct stream *h, struct CUevent_st *e, unsigned flags);

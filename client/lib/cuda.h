/* SPDX-License-Identifier: MIT */
/* libpinbroker's run-time binding to the CUDA driver (dlopen of libcuda.so.1): internal, never exported. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * The most one cuMemHostRegister call is asked to take. r580 drivers refuse one call of 512 GiB or more with
 * CUDA_ERROR_OUT_OF_MEMORY, whatever memory is free: 16 bytes of driver state per 4 KiB page must fit one
 * kvzalloc(), which Linux caps at INT_MAX (vLLM measured it: 511.96 GiB passed, 512.15 GiB failed; the cap is
 * per call, not per process). Half of it leaves room for drivers that count differently.
 * $PINBROKER_CUDA_REGISTER_PIECE (a size) overrides it, for tests.
 */
/* CUresult values the staging engine tells apart (cuda.h). */
#define PBCU_INVALID_CONTEXT 201
#define PBCU_INVALID_HANDLE 400
#define PBCU_CONTEXT_IS_DESTROYED 709

#define PBCUDA_REGISTER_PIECE_MAX (UINT64_C(256) << 30)

/*
 * Load and initialise the driver once per process. Returns 1 when memory can
 * be registered here, else 0 with *reason (static text, may be NULL) saying
 * why: no driver, cuInit failed, no devices, or PINBROKER_NO_CUDA=1.
 */
int pbcuda_available(const char **reason);

/* The piece size in force: PBCUDA_REGISTER_PIECE_MAX or $PINBROKER_CUDA_REGISTER_PIECE, page-aligned, >= a page. */
size_t pbcuda_piece_max(void);

/*
 * How to cut a range of bytes into registrations of at most max_piece: 0 when one call takes it all, else
 * the stride, a multiple of align (the range's page size), at which pieces start from the range's first page.
 * With the range's chunk sizes (mapped back to back, chunk_bytes[0] first; NULL, 0 when there are none), the
 * stride is a multiple of the biggest chunk when every cut then falls on a chunk boundary, so no chunk
 * mapping is split between two registrations; else the largest aligned stride. Pure: no driver call.
 */
size_t pbcuda_plan_stride(size_t bytes, size_t max_piece, size_t align, const uint64_t *chunk_bytes, size_t n_chunks);

/*
 * cuMemHostRegister(PORTABLE, plus DEVICEMAP when mapped) the range [p, p + bytes), so
 * cuMemHostGetDevicePointer works on it: in one call when stride is 0, else in pieces, the first from p,
 * the next ones at p's page + k * stride (pbcuda_plan_stride). Works whether or not the calling thread has
 * a current context (it borrows device 0's primary context otherwise). All or nothing: when a piece is
 * refused, the pieces before it are unregistered. Returns 0 or a negative errno; pbcuda_strerror() then
 * says what the driver answered, and for pieces which piece it refused.
 */
int pbcuda_register(void *p, size_t bytes, bool mapped, size_t stride);

/* Undo pbcuda_register(p, bytes, mapped, stride), every piece. Failures are ignored: the range is unmapped next. */
void pbcuda_unregister(void *p, size_t bytes, size_t stride);

/* 1 when the driver knows p as registered host memory, 0 otherwise (for tests and diagnostics). */
int pbcuda_is_registered(const void *p);

/*
 * The PCI bus id ("0000:3b:00.0") of the calling thread's current CUDA device
 * (gpu NULL), or of a GPU named by CUDA ordinal ("0") or UUID ("GPU-..."), in
 * buf. Returns 0, or -ENODEV (no driver, no context, no such GPU).
 */
int pbcuda_bus_id(const char *gpu, char *buf, size_t len);

/*
 * The host NUMA node the driver reports for a GPU (CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, CUDA 12.2+): gpu as
 * pbcuda_bus_id takes it, or a PCI bus id. Returns the node, or -1 when the driver cannot say (no driver,
 * no such GPU, a driver without the attribute, or a system without NUMA).
 */
int pbcuda_host_numa_node(const char *gpu);

/* The calling thread's message for its last failed pbcuda_register(). Never NULL. */
const char *pbcuda_strerror(void);

/*
 * Staged copies (lib-staging.c). The entry points are loaded with the driver; when one is missing (an old driver,
 * a stand-in without them) staging is unavailable and nothing else changes. Returns 1 when pbcuda_available() and
 * every one of them is there, else 0 with *reason (may be NULL) naming what is missing. The calls below may be
 * made only after it said 1; each returns the driver's CUresult (0: CUDA_SUCCESS), streams and events as the
 * driver's handles (NULL: the legacy default stream).
 */
int pbcuda_staging_available(const char **reason);
/* The driver's text for a CUresult ("invalid argument"); never NULL. */
const char *pbcuda_result_text(int r);
/*
 * cuPointerGetAttributes(MEMORY_TYPE, IS_MANAGED) of p: *memory_type 0 for memory the driver does not know
 * (pageable host memory), 1 host (pinned, registered), 2 device, 3 array, 4 unified; *managed for managed memory.
 */
int pbcuda_pointer_facts(const void *p, unsigned *memory_type, bool *managed);
/* cuStreamIsCapturing: *capturing unless the status is NONE (also true when the driver failed to say). */
int pbcuda_stream_capturing(void *stream, bool *capturing);
/* The calling thread's current context (*ctx NULL: none). */
int pbcuda_ctx_current(void **ctx);
/* The context of stream (cuStreamGetCtx); the current one for the default streams or a driver without the call. */
int pbcuda_stream_ctx(void *stream, void **ctx);
/* cuCtxPushCurrent / cuCtxPopCurrent. */
int pbcuda_ctx_push(void *ctx);
void pbcuda_ctx_pop(void);
/* CU_STREAM_PER_THREAD: the calling thread's per-thread default stream. */
void *pbcuda_per_thread_stream(void);
/* cuEventCreate(DISABLE_TIMING) in the current context, cuEventRecord, cuEventSynchronize, cuEventQuery,
 * cuEventDestroy. */
int pbcuda_event_create(void **ev);
int pbcuda_event_record(void *ev, void *stream);
int pbcuda_event_sync(void *ev);
int pbcuda_event_query(void *ev);
void pbcuda_event_destroy(void *ev);
/* cuMemcpyHtoDAsync_v2, cuMemcpyDtoHAsync_v2, cuMemcpyDtoH_v2, cuStreamSynchronize. */
int pbcuda_htod_async(uint64_t dst, const void *src, size_t bytes, void *stream);
int pbcuda_dtoh_async(void *dst, uint64_t src, size_t bytes, void *stream);
int pbcuda_dtoh(void *dst, uint64_t src, size_t bytes);
int pbcuda_stream_sync(void *stream);

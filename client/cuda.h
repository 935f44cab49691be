/* SPDX-License-Identifier: MIT */
/* libpinbroker's run-time binding to the CUDA driver (dlopen of libcuda.so.1): internal, never exported. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * The most one cuMemHostRegister call is asked to take. r580 drivers refuse one call of 512 GiB or more with
 * CUDA_ERROR_OUT_OF_MEMORY, whatever memory is free: 16 bytes of driver state per 4 KiB page must fit one
 * kvzalloc(), which Linux caps at INT_MAX (vLLM issue 51080: 511.96 GiB passed, 512.15 GiB failed; the cap is
 * per call, not per process). Half of it leaves room for drivers that count differently.
 * $PINBROKER_CUDA_REGISTER_PIECE (a size) overrides it, for tests.
 */
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

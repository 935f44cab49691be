/* SPDX-License-Identifier: MIT */
/*
 * libpinbroker-preload.so's copies: the driver's and the runtime's copies between device memory and host
 * memory. A copy whose host side is pageable (the driver would stage it itself, through one small buffer
 * and one thread) is carried out through the process's staging ring instead (pbst_copy, lib-staging.c);
 * every other copy, and every copy the ring cannot take, goes to the real function untouched.
 *
 * The ways in are the interposer's usual three (preload.c): these exports, dlsym and cuGetProcAddress.
 * 2D and 3D copies (cuMemcpy2D*, cuMemcpy3D*, cudaMemcpy2D*...), peer copies and batch copies are not
 * wrapped: they reach the driver as they are.
 *
 * The runtime's copies: a staged copy that fails is given to the real runtime function to do again, so
 * the program gets the runtime's own error and its last-error state (cudaGetLastError) as it would have;
 * doing a copy twice writes the same bytes.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>

#include "preload.h"
#include "pinbroker-internal.h"

#define EXPORT __attribute__((visibility("default")))

typedef unsigned long long CUdeviceptr;
typedef void *CUstream;

/* cudaMemcpyKind (driver_types.h). */
enum {
	RT_HOST_TO_HOST = 0,
	RT_HOST_TO_DEVICE = 1,
	RT_DEVICE_TO_HOST = 2,
	RT_DEVICE_TO_DEVICE = 3,
	RT_DEFAULT = 4,
};

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes);
EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t bytes);
EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes);
EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t bytes);
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream);
EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream);
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream stream);
EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t bytes, CUstream stream);
EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, int kind);
EXPORT cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t bytes, int kind);
EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, int kind, CUstream stream);
EXPORT cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t bytes, int kind, CUstream stream);

/*
 * Whether the ring took the copy (then *cu is the status to return). Never from inside another wrapper
 * (the runtime calling the driver for a copy it passes on), never with the interposer off.
 */
static bool staged(void *dst, const void *src, size_t bytes, CUstream stream, unsigned flags, int *cu)
{
	pb_client *c;
	bool took;

	if (pbp_passthrough() || bytes == 0)
		return false;
	c = pbp_client();
	if (!c)
		return false;
	pbp_enter();
	took = pbst_copy(c, dst, src, bytes, stream, flags, cu);
	pbp_leave();
	return took;
}

/* The direction flags of a runtime copy's kind; 0 for the kinds that never have a pageable side to stage. */
static unsigned kind_flags(int kind, bool *stageable)
{
	*stageable = true;
	switch (kind) {
	case RT_HOST_TO_DEVICE:
		return PBST_H2D;
	case RT_DEVICE_TO_HOST:
		return PBST_D2H;
	case RT_DEFAULT:
		return 0;
	default:
		*stageable = false;
		return 0;
	}
}

#define DEVPTR(p) ((void *)(uintptr_t)(p))

/* The real driver function f called with args, inside the depth so nothing it reaches re-enters. */
#define DRIVER(type, f, ...)                                         \
	do {                                                         \
		CUresult r_;                                         \
		if (!pbp_real_fn(f))                                 \
			return CU_NOT_INITIALIZED;                   \
		pbp_enter();                                         \
		r_ = ((type)(uintptr_t)pbp_real_fn(f))(__VA_ARGS__); \
		pbp_leave();                                         \
		return r_;                                           \
	} while (0)

typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t);
typedef CUresult (*htod_async_fn)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*dtoh_async_fn)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*copy_fn)(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult (*copy_async_fn)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
typedef cudaError_t (*rt_copy_fn)(void *, const void *, size_t, int);
typedef cudaError_t (*rt_copy_async_fn)(void *, const void *, size_t, int, CUstream);

/* ---- The driver's ---- */

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes)
{
	int cu;

	if (staged(DEVPTR(dst), src, bytes, NULL, PBST_H2D | PBST_SYNC, &cu))
		return cu;
	DRIVER(htod_fn, F_cuMemcpyHtoD_v2, dst, src, bytes);
}

EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t bytes)
{
	int cu;

	if (staged(DEVPTR(dst), src, bytes, NULL, PBST_H2D | PBST_SYNC | PBST_PTDS, &cu))
		return cu;
	DRIVER(htod_fn, F_cuMemcpyHtoD_v2_ptds, dst, src, bytes);
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes)
{
	int cu;

	if (staged(dst, DEVPTR(src), bytes, NULL, PBST_D2H | PBST_SYNC, &cu))
		return cu;
	DRIVER(dtoh_fn, F_cuMemcpyDtoH_v2, dst, src, bytes);
}

EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t bytes)
{
	int cu;

	if (staged(dst, DEVPTR(src), bytes, NULL, PBST_D2H | PBST_SYNC | PBST_PTDS, &cu))
		return cu;
	DRIVER(dtoh_fn, F_cuMemcpyDtoH_v2_ptds, dst, src, bytes);
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream)
{
	int cu;

	if (staged(DEVPTR(dst), src, bytes, stream, PBST_H2D, &cu))
		return cu;
	DRIVER(htod_async_fn, F_cuMemcpyHtoDAsync_v2, dst, src, bytes, stream);
}

EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream)
{
	int cu;

	if (staged(DEVPTR(dst), src, bytes, stream, PBST_H2D | PBST_PTDS, &cu))
		return cu;
	DRIVER(htod_async_fn, F_cuMemcpyHtoDAsync_v2_ptsz, dst, src, bytes, stream);
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream stream)
{
	int cu;

	if (staged(dst, DEVPTR(src), bytes, stream, PBST_D2H, &cu))
		return cu;
	DRIVER(dtoh_async_fn, F_cuMemcpyDtoHAsync_v2, dst, src, bytes, stream);
}

EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t bytes, CUstream stream)
{
	int cu;

	if (staged(dst, DEVPTR(src), bytes, stream, PBST_D2H | PBST_PTDS, &cu))
		return cu;
	DRIVER(dtoh_async_fn, F_cuMemcpyDtoHAsync_v2_ptsz, dst, src, bytes, stream);
}

EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
	int cu;

	if (staged(DEVPTR(dst), DEVPTR(src), bytes, NULL, PBST_SYNC, &cu))
		return cu;
	DRIVER(copy_fn, F_cuMemcpy, dst, src, bytes);
}

EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
	int cu;

	if (staged(DEVPTR(dst), DEVPTR(src), bytes, NULL, PBST_SYNC | PBST_PTDS, &cu))
		return cu;
	DRIVER(copy_fn, F_cuMemcpy_ptds, dst, src, bytes);
}

EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream)
{
	int cu;

	if (staged(DEVPTR(dst), DEVPTR(src), bytes, stream, 0, &cu))
		return cu;
	DRIVER(copy_async_fn, F_cuMemcpyAsync, dst, src, bytes, stream);
}

EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream)
{
	int cu;

	if (staged(DEVPTR(dst), DEVPTR(src), bytes, stream, PBST_PTDS, &cu))
		return cu;
	DRIVER(copy_async_fn, F_cuMemcpyAsync_ptsz, dst, src, bytes, stream);
}

/* ---- The runtime's ---- */

/*
 * A runtime copy: staged when it can be and the ring did it without error; otherwise (not ours, or a
 * staged copy that failed) the real runtime function, which answers with its own error and state.
 */
static cudaError_t runtime_copy(enum fn f, void *dst, const void *src, size_t bytes, int kind, CUstream stream,
				unsigned flags)
{
	bool stageable;
	unsigned dir = kind_flags(kind, &stageable);
	int cu = CU_OK;
	cudaError_t r;

	if (stageable && staged(dst, src, bytes, stream, flags | dir, &cu) && cu == CU_OK)
		return 0; /* cudaSuccess */
	if (!pbp_real_fn(f))
		return CU_NOT_INITIALIZED; /* cudaErrorInitializationError, the same number */
	pbp_enter();
	if (flags & PBST_SYNC)
		r = ((rt_copy_fn)(uintptr_t)pbp_real_fn(f))(dst, src, bytes, kind);
	else
		r = ((rt_copy_async_fn)(uintptr_t)pbp_real_fn(f))(dst, src, bytes, kind, stream);
	pbp_leave();
	return r;
}

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, int kind)
{
	return runtime_copy(F_cudaMemcpy, dst, src, bytes, kind, NULL, PBST_SYNC);
}

EXPORT cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t bytes, int kind)
{
	return runtime_copy(F_cudaMemcpy_ptds, dst, src, bytes, kind, NULL, PBST_SYNC | PBST_PTDS);
}

EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, int kind, CUstream stream)
{
	return runtime_copy(F_cudaMemcpyAsync, dst, src, bytes, kind, stream, 0);
}

EXPORT cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t bytes, int kind, CUstream stream)
{
	return runtime_copy(F_cudaMemcpyAsync_ptsz, dst, src, bytes, kind, stream, PBST_PTDS);
}

UNSANITIZED void *pbp_copy_wrapper(enum fn f)
{
	typedef void (*any_fn)(void);
	static const any_fn wrappers[F_END] = {
		[F_cuMemcpyHtoD_v2] = (any_fn)cuMemcpyHtoD_v2,
		[F_cuMemcpyHtoD_v2_ptds] = (any_fn)cuMemcpyHtoD_v2_ptds,
		[F_cuMemcpyDtoH_v2] = (any_fn)cuMemcpyDtoH_v2,
		[F_cuMemcpyDtoH_v2_ptds] = (any_fn)cuMemcpyDtoH_v2_ptds,
		[F_cuMemcpyHtoDAsync_v2] = (any_fn)cuMemcpyHtoDAsync_v2,
		[F_cuMemcpyHtoDAsync_v2_ptsz] = (any_fn)cuMemcpyHtoDAsync_v2_ptsz,
		[F_cuMemcpyDtoHAsync_v2] = (any_fn)cuMemcpyDtoHAsync_v2,
		[F_cuMemcpyDtoHAsync_v2_ptsz] = (any_fn)cuMemcpyDtoHAsync_v2_ptsz,
		[F_cuMemcpy] = (any_fn)cuMemcpy,
		[F_cuMemcpy_ptds] = (any_fn)cuMemcpy_ptds,
		[F_cuMemcpyAsync] = (any_fn)cuMemcpyAsync,
		[F_cuMemcpyAsync_ptsz] = (any_fn)cuMemcpyAsync_ptsz,
		[F_cudaMemcpy] = (any_fn)cudaMemcpy,
		[F_cudaMemcpy_ptds] = (any_fn)cudaMemcpy_ptds,
		[F_cudaMemcpyAsync] = (any_fn)cudaMemcpyAsync,
		[F_cudaMemcpyAsync_ptsz] = (any_fn)cudaMemcpyAsync_ptsz,
	};

	return f < F_END ? (void *)(uintptr_t)wrappers[f] : NULL;
}

/* SPDX-License-Identifier: MIT */
/*
 * Staged copies inside libpinbroker (lib-staging.c): the ring, its threads and the pipelined copy, for
 * pb_copy_to_device / pb_copy_from_device and for the interposer's cuMemcpy* and cudaMemcpy* wrappers
 * (preload-copy.c). Internal, never exported.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pinbroker.h"

/* pbst_copy's flags: the direction the caller knows, and how its stream is to be read. */
#define PBST_H2D 0x1u  /* dst is device memory, src host memory (cuMemcpyHtoD*) */
#define PBST_D2H 0x2u  /* dst is host memory, src device memory (cuMemcpyDtoH*) */
#define PBST_SYNC 0x4u /* a synchronous copy (cuMemcpyHtoD, cudaMemcpy): returns as CUDA's would */
#define PBST_PTDS 0x8u /* stream 0 is the calling thread's per-thread default stream (_ptds, _ptsz) */
/* Neither H2D nor D2H: unified addressing (cuMemcpy, cudaMemcpyDefault): the pointers say which. */

/*
 * Stage one copy of bytes from src to dst on stream, if it is one the driver would stage itself: host
 * memory that is pageable (not pinned, registered or managed) on one side and device memory on the other,
 * bytes at or over the threshold, a stream not being captured, a ring at hand. Returns true when it took
 * the copy, with *cu the CUDA status to give the caller (CUDA_SUCCESS, or the driver's error), false when
 * the caller must call the driver itself (nothing was done). c may be NULL (no broker): then false.
 */
bool pbst_copy(pb_client *c, void *dst, const void *src, size_t bytes, void *stream, unsigned flags, int *cu);

/*
 * Around fork: the child has no ring and no threads (its copies take a ring of its own). The library registers
 * them with pthread_atfork itself, on its first staged copy; a second call from the same thread, around the same
 * fork (an interposer's own handlers), does nothing.
 */
void pbst_before_fork(void);
void pbst_after_fork_parent(void);
void pbst_after_fork_child(void);

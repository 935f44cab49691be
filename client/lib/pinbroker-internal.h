/* SPDX-License-Identifier: MIT */
/*
 * libpinbroker's internal face: what the interposer (client/preload/), which links the library's objects, may call
 * beyond pinbroker.h. Staged copies (lib-staging.c) and charges for memory the driver owns (lib-register.c).
 * Never exported; the interposer includes this and pinbroker.h, never lib-int.h.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pinbroker.h"

/* ---------------------------------------------------------------- staged copies (lib-staging.c) */

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

/* ---------------------------------------------------------------- charges (lib-register.c) */

/*
 * A registration charge of bytes that no address of this process names: memory the CUDA driver allocates and
 * owns itself (a VMM allocation or a memory pool with a host location), charged so the budget sees it. As
 * pb_register with PB_REGISTER_CHARGE_ONLY otherwise (never revoked, never cached; pb_unregister gives it back).
 */
int register_charge_bytes(pb_client *c, size_t bytes, const struct pb_acquire_opts *opts, pb_lease **ret);

/* SPDX-License-Identifier: MIT */
/* The staging threads' copy between a program's memory and a ring slot: no CUDA, no broker, no threads. */
#pragma once

#include <stddef.h>

/* Below this a copy is plain memcpy: streaming stores pay off only where the copy leaves the caches anyway. */
#define PBST_STREAM_MIN_BYTES ((size_t)64 << 10)

/*
 * memcpy(dst, src, n), writing dst with non-temporal (streaming) stores where the CPU has them (x86-64) and n is at
 * least PBST_STREAM_MIN_BYTES: the destination's lines are not read first (read for ownership) and do not evict
 * the cache. A staged copy writes each byte once and does not read it back, so this saves a third of the memory
 * traffic of a plain memcpy of pieces this size, which glibc copies with ordinary stores. The stores are fenced
 * before it returns: another thread, or the GPU's DMA, sees every byte once the caller signals it.
 */
void pbst_stream_copy(void *dst, const void *src, size_t n);

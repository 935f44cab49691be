/* SPDX-License-Identifier: MIT */
/*
 * Warm-up work split, with no I/O: the chunks of a batch go to the warm-up threads whole, and a batch of fewer
 * chunks than threads has its chunks filled (faulted, collapsed into THP) in segments that the threads share,
 * so one 1 GiB chunk is not one thread's alone; and how many threads warm the pool.
 */
#pragma once

#include <stdint.h>

/* A segment: big enough that a thread's handover costs nothing beside it, small enough to spread a 1 GiB chunk. */
#define WARMSEG_DEFAULT_BYTES (UINT64_C(64) << 20)
/* Segments start on 2 MiB boundaries, so each one collapses into whole huge pages (MADV_COLLAPSE by range). */
#define WARMSEG_ALIGN_BYTES (UINT64_C(2) << 20)
/* Threads with prewarm-threads at 0: the cores the daemon may run on, up to this (memory bandwidth saturates). */
#define WARMSEG_THREADS_DEFAULT_MAX 32u
/* The most threads any setting gives (prewarm-threads' range). */
#define WARMSEG_THREADS_MAX 64u

/*
 * The segment size for seg_bytes asked (0: WARMSEG_DEFAULT_BYTES), rounded up to WARMSEG_ALIGN_BYTES.
 */
uint64_t warmseg_size(uint64_t seg_bytes);

/*
 * The segment size for a chunk of bytes, one of nchunks that threads fill together: the threads are shared
 * among the chunks first, so a batch of at least as many chunks as threads fills each chunk whole (one
 * collapse call, one file a thread), and only a batch of fewer chunks spreads a chunk over several threads.
 * No segment below WARMSEG_DEFAULT_BYTES (each segment is one populate or collapse call, and a collapse call
 * drains the LRU caches of every CPU first, under one lock for the whole machine: thousands of small collapses
 * serialise the warm-up); rounded up to WARMSEG_ALIGN_BYTES. nchunks 0 counts as 1.
 */
uint64_t warmseg_pick(uint64_t bytes, unsigned threads, uint64_t nchunks);

/* How many segments a chunk of bytes is filled in (warmseg_size each, the last one shorter): 0 for 0 bytes. */
uint64_t warmseg_count(uint64_t bytes, uint64_t seg_bytes);

/*
 * Segment i of a chunk of bytes: its offset and length. Segments are disjoint, in order, and cover the chunk
 * exactly; every one but the last is warmseg_size(seg_bytes) long and starts 2 MiB aligned.
 * Returns 0, or -EINVAL when i is past the last segment.
 */
int warmseg_get(uint64_t bytes, uint64_t seg_bytes, uint64_t i, uint64_t *off, uint64_t *len);

/*
 * Warm-up threads: setting (prewarm-threads; 0: cores) bounded by WARMSEG_THREADS_MAX, or cores (the CPUs
 * in the daemon's affinity mask; 0 or less: unknown, taken as 1) bounded by WARMSEG_THREADS_DEFAULT_MAX.
 */
unsigned warmseg_threads(unsigned setting, long cores);

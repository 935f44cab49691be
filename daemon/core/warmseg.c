/* SPDX-License-Identifier: MIT */
/* Warm-up work split: a chunk's fill segments and the warm-up thread count (warmseg.h). No I/O. */
#include "warmseg.h"

#include <errno.h>

uint64_t warmseg_size(uint64_t seg_bytes)
{
	if (seg_bytes == 0)
		seg_bytes = WARMSEG_DEFAULT_BYTES;
	if (seg_bytes > UINT64_MAX - WARMSEG_ALIGN_BYTES)
		return UINT64_MAX / WARMSEG_ALIGN_BYTES * WARMSEG_ALIGN_BYTES;
	return (seg_bytes + WARMSEG_ALIGN_BYTES - 1) / WARMSEG_ALIGN_BYTES * WARMSEG_ALIGN_BYTES;
}

uint64_t warmseg_pick(uint64_t bytes, unsigned threads, uint64_t nchunks)
{
	uint64_t per_chunk, share;

	if (nchunks == 0)
		nchunks = 1;
	/* The threads each chunk gets, rounded up: 16 threads on 4 chunks give each chunk 4 segments. */
	per_chunk = threads > nchunks ? threads / nchunks + (threads % nchunks != 0) : 1;
	share = per_chunk > 1 ? bytes / per_chunk + (bytes % per_chunk != 0) : bytes;

	return warmseg_size(share > WARMSEG_DEFAULT_BYTES ? share : WARMSEG_DEFAULT_BYTES);
}

uint64_t warmseg_count(uint64_t bytes, uint64_t seg_bytes)
{
	uint64_t seg = warmseg_size(seg_bytes);

	return bytes / seg + (bytes % seg != 0);
}

int warmseg_get(uint64_t bytes, uint64_t seg_bytes, uint64_t i, uint64_t *off, uint64_t *len)
{
	uint64_t seg = warmseg_size(seg_bytes);

	if (i >= warmseg_count(bytes, seg_bytes))
		return -EINVAL;
	*off = i * seg;
	*len = bytes - *off < seg ? bytes - *off : seg;
	return 0;
}

unsigned warmseg_threads(unsigned setting, long cores)
{
	if (setting > 0)
		return setting < WARMSEG_THREADS_MAX ? setting : WARMSEG_THREADS_MAX;
	if (cores <= 0)
		return 1;
	return cores < (long)WARMSEG_THREADS_DEFAULT_MAX ? (unsigned)cores : WARMSEG_THREADS_DEFAULT_MAX;
}

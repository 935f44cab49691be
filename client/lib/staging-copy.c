/* SPDX-License-Identifier: MIT */
#include "staging-copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>

void pbst_stream_copy(void *dst, const void *src, size_t n)
{
	uint8_t *d = dst;
	const uint8_t *s = src;
	size_t head, blocks;

	if (n < PBST_STREAM_MIN_BYTES) {
		memcpy(d, s, n);
		return;
	}
	/* Up to the destination's next 64-byte line with memcpy, then whole lines streamed, then the tail. */
	head = (64 - ((uintptr_t)d & 63)) & 63;
	memcpy(d, s, head);
	d += head;
	s += head;
	n -= head;
	for (blocks = n / 64; blocks > 0; blocks--, d += 64, s += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)s);
		__m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(s + 48));

		_mm_stream_si128((__m128i *)d, a);
		_mm_stream_si128((__m128i *)(d + 16), b);
		_mm_stream_si128((__m128i *)(d + 32), c);
		_mm_stream_si128((__m128i *)(d + 48), e);
	}
	memcpy(d, s, n & 63);
	_mm_sfence(); /* streaming stores are weakly ordered: all of them visible before the caller says "done" */
}

#else

void pbst_stream_copy(void *dst, const void *src, size_t n)
{
	memcpy(dst, src, n);
}

#endif

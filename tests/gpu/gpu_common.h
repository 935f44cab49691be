/* SPDX-License-Identifier: MIT */
/*
 * What every GPU test program shares: reproducible contents (splitmix64) and the size suffixes they take ("64M",
 * "1G", "2MiB", "4096"): one parser of the unit for gpu_util.h (the pinbroker-linked tests) and preload_common.h (the
 * unmodified CUDA programs), which read the number in front of it each their own way. Plain C, so C and nvcc's C++
 * both include it.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

/*
 * The multiplier for the unit at *end ("", k, M, G, T with an optional "i" and "B"), moving *end past it; 0 when
 * something other than a unit follows. max_shift is the largest unit the caller takes (30 for G, 40 for T).
 */
static inline size_t gpu_size_unit(const char **end, unsigned max_shift)
{
	static const char units[] = "kmgt";
	const char *s = *end;
	size_t mul = 1;

	if (*s) {
		unsigned i = 0;

		while (units[i] && units[i] != (*s | 0x20))
			i++;
		if (!units[i] || 10 * (i + 1) > max_shift)
			return 0;
		mul = (size_t)1 << (10 * (i + 1));
		s++;
	}
	if (*s == 'i')
		s++;
	if (*s == 'B')
		s++;
	*end = s;
	return *s ? 0 : mul;
}

/* splitmix64: reproducible contents from a seed. */
static inline uint64_t mix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

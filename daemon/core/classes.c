/* SPDX-License-Identifier: MIT */
/* Chunk size classes: a lease's chunks, the warm pool's carving, and the plan that fits the daemon's limits. */
#include "classes.h"

#include <errno.h>

int classes_init(struct classes *c, uint64_t base_bytes, uint64_t max_bytes)
{
	if (base_bytes == 0)
		return -EINVAL;
	c->n = 0;
	c->bytes[c->n++] = base_bytes;
	/* Doubling stops before it would overflow or pass the largest class asked for. */
	while (c->n < CLASSES_MAX && c->bytes[c->n - 1] <= max_bytes / 2) {
		c->bytes[c->n] = c->bytes[c->n - 1] * 2;
		c->n++;
	}
	return 0;
}

int classes_index(const struct classes *c, uint64_t bytes)
{
	for (unsigned k = 0; k < c->n; k++)
		if (c->bytes[k] == bytes)
			return (int)k;
	return -1;
}

uint64_t classes_max(const struct classes *c)
{
	return c->bytes[c->n - 1];
}

uint64_t classes_split(const struct classes *c, uint64_t bytes, uint64_t counts[CLASSES_MAX], uint64_t *tail_bytes)
{
	uint64_t total = 0;

	for (unsigned k = c->n; k-- > 0;) {
		counts[k] = bytes / c->bytes[k];
		bytes -= counts[k] * c->bytes[k];
		total += counts[k];
	}
	for (unsigned k = c->n; k < CLASSES_MAX; k++)
		counts[k] = 0;
	*tail_bytes = bytes;
	return total + (bytes ? 1 : 0);
}

uint64_t classes_split_avail(const struct classes *c, uint64_t bytes, const uint64_t avail[CLASSES_MAX],
			     uint64_t counts[CLASSES_MAX], uint64_t *tail_bytes)
{
	uint64_t total = 0;

	for (unsigned k = c->n; k-- > 0;) {
		counts[k] = bytes / c->bytes[k];
		if (counts[k] > avail[k])
			counts[k] = avail[k];
		bytes -= counts[k] * c->bytes[k];
		total += counts[k];
	}
	for (unsigned k = c->n; k < CLASSES_MAX; k++)
		counts[k] = 0;
	*tail_bytes = bytes;
	if (bytes >= c->bytes[0])
		return 0;
	return total + (bytes ? 1 : 0);
}

uint64_t classes_chunks_for(const struct classes *c, uint64_t bytes)
{
	uint64_t counts[CLASSES_MAX], tail;

	return classes_split(c, bytes, counts, &tail);
}

void classes_warm_split(const struct classes *c, uint64_t bytes, uint64_t target[CLASSES_MAX])
{
	uint64_t base = c->bytes[0], counts[CLASSES_MAX], tail, small;

	/* Whole chunks of the smallest class: the warm pool is never short of what was asked. */
	bytes = bytes / base * base + (bytes % base ? base : 0);
	small = bytes / CLASSES_WARM_SMALL_DIVISOR / base * base;
	if (small > CLASSES_WARM_SMALL_MAX * base)
		small = CLASSES_WARM_SMALL_MAX * base;
	if (c->n == 1)
		small = 0;
	classes_split(c, bytes - small, counts, &tail);
	for (unsigned k = 0; k < CLASSES_MAX; k++)
		target[k] = k < c->n ? counts[k] * c->bytes[k] : 0;
	target[0] += small;
}

uint64_t classes_warm_chunks(const struct classes *c, uint64_t bytes)
{
	uint64_t target[CLASSES_MAX], n = 0;

	classes_warm_split(c, bytes, target);
	for (unsigned k = 0; k < c->n; k++)
		n += target[k] / c->bytes[k];
	return n;
}

uint64_t classes_warm_room(const struct classes *c, uint64_t chunks, uint64_t max_bytes)
{
	uint64_t base = c->bytes[0], lo = 0, hi = max_bytes / base;

	/* In smallest-class units; the chunk count is not monotone in bytes (1 GiB is one chunk, 1 GiB - 2 MiB
	 * nine), so this finds a size that fits, not always the largest: lo always fits. */
	if (classes_warm_chunks(c, hi * base) <= chunks)
		return hi * base;
	while (hi - lo > 1) {
		uint64_t mid = lo + (hi - lo) / 2;

		if (classes_warm_chunks(c, mid * base) <= chunks)
			lo = mid;
		else
			hi = mid;
	}
	return lo * base;
}

int classes_plan(uint64_t base_bytes, uint64_t max_bytes, uint64_t plan_bytes, uint64_t capacity, bool may_raise,
		 struct classes_plan *ret)
{
	struct classes c;
	int r;

	r = classes_init(&c, base_bytes, max_bytes);
	if (r < 0)
		return r;
	ret->plan_bytes = plan_bytes;
	ret->capacity = capacity;
	ret->raised = false;
	ret->worst_chunks = classes_chunks_for(&c, plan_bytes);
	/* Each doubling of the largest class halves the chunks of a large lease. */
	while (may_raise && capacity && ret->worst_chunks > capacity / CLASSES_PLAN_MARGIN && c.n < CLASSES_MAX &&
	       classes_max(&c) <= CLASSES_PLAN_MAX_BYTES / 2) {
		c.bytes[c.n] = c.bytes[c.n - 1] * 2;
		c.n++;
		ret->raised = true;
		ret->worst_chunks = classes_chunks_for(&c, plan_bytes);
	}
	ret->max_bytes = classes_max(&c);
	ret->n_classes = c.n;
	ret->fits = !capacity || ret->worst_chunks <= capacity / CLASSES_PLAN_MARGIN;
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * Chunk size classes, with no I/O: which chunks make up a lease, how a warm pool is carved into classes,
 * and the plan that fits a budget into the daemon's fd and mapping limits.
 *
 * A chunk is one memfd: one fd in the daemon, one mapping in the daemon and in each client that maps it.
 * With one chunk size, a lease's fd and mapping cost grows with its bytes (700 GiB of 2 MiB chunks is
 * 358,400 of each, past vm.max_map_count's default 65,530). With classes base * 2^k up to a largest, a
 * lease is at most bytes / largest chunks of the largest class, one of each smaller class and one tail:
 * logarithmic in its size below the largest class, linear with a slope of 1 / largest above it.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/* base * 2^k for k < CLASSES_MAX covers 4 KiB to 32 GiB (4 KiB base) or 2 MiB to 16 TiB (2 MiB base). */
#define CLASSES_MAX 24
/* The default largest class: a 1 TiB budget is then 1,024 chunks, and a chunk's fault at warm-up stays short. */
#define CLASSES_DEFAULT_MAX_BYTES (UINT64_C(1) << 30)
/* The plan never raises the largest class past this: a bigger memfd only makes the warm pool coarser. */
#define CLASSES_PLAN_MAX_BYTES (UINT64_C(64) << 30)
/*
 * The plan keeps the budget, lent as one lease, within capacity / CLASSES_PLAN_MARGIN chunks: the rest is
 * room for the warm pool's smaller classes and for many smaller leases, whose tails cost a chunk each.
 */
#define CLASSES_PLAN_MARGIN 4
/* Warm-up keeps this share (1 / N) of the pool in the smallest class, for small leases ... */
#define CLASSES_WARM_SMALL_DIVISOR 8
/* ... but at most this many chunks of it, so a large pool does not spend its fds on them. */
#define CLASSES_WARM_SMALL_MAX 64

/* The classes, smallest first: bytes[0] is chunk-size, each next one twice the one before. */
struct classes {
	uint64_t bytes[CLASSES_MAX];
	unsigned n;
};

/*
 * Classes base_bytes * 2^k up to max_bytes (at least base_bytes: max below it gives the one class).
 * Returns 0, or -EINVAL for a base of 0.
 */
int classes_init(struct classes *c, uint64_t base_bytes, uint64_t max_bytes);

/* The index of the class of exactly bytes, or -1 when no class has that size. */
int classes_index(const struct classes *c, uint64_t bytes);

/* The largest class. */
uint64_t classes_max(const struct classes *c);

/*
 * A lease of bytes, greedy largest first: counts[k] chunks of class k and *tail_bytes (below the smallest
 * class, 0 if none) for one tail chunk. That is the fewest chunks that sum to bytes exactly, since each class
 * is twice the one below. Returns the number of chunks, tail included.
 */
uint64_t classes_split(const struct classes *c, uint64_t bytes, uint64_t counts[CLASSES_MAX], uint64_t *tail_bytes);

/*
 * classes_split from what there is: at most avail[k] chunks of class k, largest first, each class taking as many
 * as fit what is left; *tail_bytes is the remainder below the smallest class. With each class twice the one below,
 * this finds a cover whenever avail has one. Returns the number of chunks (tail included), or 0 when avail
 * cannot cover bytes down to below the smallest class. For leases lent from the warm pool alone (under pressure).
 */
uint64_t classes_split_avail(const struct classes *c, uint64_t bytes, const uint64_t avail[CLASSES_MAX],
			     uint64_t counts[CLASSES_MAX], uint64_t *tail_bytes);

/* The number of chunks classes_split gives for bytes. */
uint64_t classes_chunks_for(const struct classes *c, uint64_t bytes);

/*
 * How a warm pool of bytes is carved: target[k] bytes of class k (multiples of it), summing to bytes rounded up
 * to the smallest class. The smallest class gets 1/CLASSES_WARM_SMALL_DIVISOR of bytes, at most
 * CLASSES_WARM_SMALL_MAX chunks, for small leases and tails of larger ones; the rest is carved like one lease,
 * largest first, so a big lease finds its big chunks warm. Returned chunks keep the classes leases use, so the
 * pool then follows demand.
 */
void classes_warm_split(const struct classes *c, uint64_t bytes, uint64_t target[CLASSES_MAX]);

/* Chunks the warm split of bytes takes. */
uint64_t classes_warm_chunks(const struct classes *c, uint64_t bytes);

/* The most bytes (up to max_bytes, a multiple of the smallest class) whose warm split takes at most chunks. */
uint64_t classes_warm_room(const struct classes *c, uint64_t chunks, uint64_t max_bytes);

/* What classes_plan decided, for the start log and pinctl doctor. */
struct classes_plan {
	uint64_t plan_bytes;   /* planned for: the larger of the budget and the host's memory */
	uint64_t capacity;     /* chunks the daemon's fds and mappings leave for the pool */
	uint64_t max_bytes;    /* the largest class, after planning */
	unsigned n_classes;    /* classes from the smallest to max_bytes */
	uint64_t worst_chunks; /* chunks of plan_bytes lent as one lease */
	bool raised;           /* max_bytes is above the configured largest class */
	bool fits;             /* worst_chunks * CLASSES_PLAN_MARGIN <= capacity */
};

/*
 * Plan the classes from base_bytes up to at least max_bytes so that plan_bytes, lent as one lease, takes
 * at most capacity / CLASSES_PLAN_MARGIN chunks: the largest class is doubled (up to CLASSES_PLAN_MAX_BYTES and
 * CLASSES_MAX classes) until it does, when may_raise (an operator's own chunk-max is kept). capacity 0 means
 * unbounded. Returns 0, or -EINVAL for a base of 0;
 * ret->fits is false when even the biggest allowed class leaves too many chunks.
 */
int classes_plan(uint64_t base_bytes, uint64_t max_bytes, uint64_t plan_bytes, uint64_t capacity, bool may_raise,
		 struct classes_plan *ret);

/* SPDX-License-Identifier: MIT */
/*
 * The start warm-up beside the event loop: chunks are made (faulted, collapsed, locked) in threads and handed
 * to the loop a batch at a time (ev_async), so the daemon serves leases while its pool grows. The threads
 * never touch the pool's books: the loop adds each chunk to the idle pool, or drops it when the pool must not
 * grow any more (pressure, a budget the leases took meanwhile).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ev_loop;
struct pool;
struct warmup;

/* Test only: the warm-up thread sleeps this many ms after each batch, so a test sees a pool still growing. */
#define WARMUP_DELAY_ENV "PINBROKER_TEST_WARMUP_DELAY_MS"
/*
 * Test only: the warm-up thread sleeps this many ms after making each batch, before handing it to the loop, so a
 * test sees the batch's chunks made and not yet in any book (what warmup-batch-max bounds).
 */
#define WARMUP_HOLD_ENV "PINBROKER_TEST_WARMUP_HOLD_MS"

/* Called on the loop's thread. */
struct warmup_hooks {
	/* Whether a chunk of bytes may join the idle pool now; false drops it and stops the warm-up. */
	bool (*admit)(uint64_t bytes, void *ud);
	/* Chunks joined the idle pool (once per batch). */
	void (*grown)(void *ud);
	/* The warm-up is over: bytes it added, in us microseconds, with its first error (0: none). */
	void (*done)(uint64_t bytes, uint64_t us, int err, void *ud);
	void *ud;
};

/*
 * Start warming the idle pool to bytes: split[i] of it on nodes[i] (n nodes, numa_split_prewarm's; none:
 * no placement), then whatever the split leaves short on any node, planned now (pool_warm_plan) and made by
 * a thread in batches, with the pool's threads: a batch is at most batch_max_bytes (warmup-batch-max), or one
 * chunk when a chunk is larger, and the next is made only once the loop took it, so what is made and not yet
 * in the pool's books is one batch at most. Returns 0 or -errno.
 */
int warmup_start(struct ev_loop *loop, struct pool *p, uint64_t bytes, const int *nodes, const uint64_t *split,
		 size_t n, uint64_t batch_max_bytes, const struct warmup_hooks *hooks, struct warmup **ret);
/* Whether it still runs (done not yet called). */
bool warmup_running(const struct warmup *w);
/*
 * Stop (the batch in the making is finished first), join the thread, destroy the chunks not yet handed over,
 * and free w. done is not called. NULL is fine.
 */
void warmup_free(struct warmup *w);

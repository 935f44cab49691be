/* SPDX-License-Identifier: MIT */
/*
 * Warming the idle pool to prewarm: at start (in one go, or beside the loop through warmup.c), and in steps off
 * the loop's busy turns when a reload raises it; how much the budget and the descriptors allow, and how it is
 * spread over the NUMA nodes (numa, numa-prewarm). main.c starts and stops it.
 */
#pragma once

#include <stdint.h>

struct broker;
struct config;
struct pool_opts;

/* What prewarm.c calls back in main.c, so prewarm.c never includes it: no import loop. */
struct prewarm_hooks {
	/* Write the systemd status line (main.c: update_status). */
	void (*status)(struct broker *b);
	/* A prewarm raised while the start warm-up ran: grow on, grant waiting acquires, report (config_applied). */
	void (*applied)(struct broker *b);
};

/* Set up the step warm-up (not started) and the hooks (the caller's, kept). */
void prewarm_init(const struct prewarm_hooks *h);

/*
 * Read the host's NUMA nodes from cfg's proc-root and how numa-prewarm spreads the pool over them; with numa
 * = auto, the nodes go into po and the daemon's numa. Returns 0, or -EINVAL with *err saying what in numa-prewarm is
 * wrong.
 */
int prewarm_numa_read(struct broker *b, const struct config *cfg, struct pool_opts *po, const char **err);
/* Once the pool is made: give it the nodes' free memory and fallback order, when it places (the daemon's numa). */
void prewarm_numa_hooks(struct broker *b, const struct config *cfg);

/* Say once that prewarm is more than the descriptors allow, and what to raise; returns what they allow. */
uint64_t prewarm_clamp_fds(const struct broker *b, uint64_t want);
/* A warm-up to want that failed with err: what is warm, and what the operator should raise. */
void prewarm_warn_failed(const struct broker *b, uint64_t want, int err);
/* Warm the pool to bytes now, spread over the NUMA nodes it places on (numa-prewarm), or as one. */
int prewarm_grow(struct broker *b, uint64_t bytes, void (*progress)(uint64_t, uint64_t, void *));
/* Warm the pool to bytes beside the loop, spread as prewarm_grow spreads it. Returns 0 or -errno. */
int prewarm_grow_bg(struct broker *b, uint64_t bytes);
/* Grow toward a raised prewarm in steps off the loop's busy turns, unless the pool is warm enough or it runs. */
void prewarm_kick(struct broker *b);
/* At shutdown: a warm-up still running stops after its batch; the chunks it made and did not hand over go. */
void prewarm_stop_warmup(struct broker *b);
/* At shutdown, once the loop is over: stop the step warm-up. */
void prewarm_fini(struct broker *b);

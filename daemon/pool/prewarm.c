/* SPDX-License-Identifier: MIT */
/* Warming the idle pool to prewarm (at start, beside the loop, in steps after a reload) and its NUMA spread. */
#define _GNU_SOURCE
#include <errno.h>
#include <ev.h>
#include <stdio.h>
#include <string.h>

#include "broker.h"
#include "budget.h"
#include "config.h"
#include "daemon.h"
#include "log.h"
#include "notify.h"
#include "numa.h"
#include "pool.h"
#include "prewarm.h"
#include "util.h"
#include "warmup.h"

/* main.c's status line and config_applied (prewarm_init). */
static const struct prewarm_hooks *shell;

/* Grows the pool toward a raised prewarm a step per loop turn, so requests are served in between. */
static ev_idle prewarm_idle;
/* 64 MiB faults in and locks in 22-26 ms on the 2-CPU development VM (the start-up "pool warmed" line):
 * the longest a request waits behind one step. */
#define PREWARM_STEP_BYTES (UINT64_C(64) << 20)

/*
 * Warm bytes, up to want, the daemon's descriptors leave room for: each chunk, idle or lent, is one fd (and one
 * mapping without hugetlb), and chunk_capacity already keeps reserve-fds and the connections' share free. Warming
 * past it would take the descriptors that accept, the monitor and recovery need. The warm pool is carved into
 * classes as classes_warm_split says.
 */
static uint64_t prewarm_fd_room(const struct broker *b, uint64_t want)
{
	uint64_t lent = budget_chunks(b->budget), room;

	if (b->chunk_capacity == 0)
		return UINT64_MAX;
	room = b->chunk_capacity > lent ? b->chunk_capacity - lent : 0;
	if (classes_warm_chunks(pool_classes(daemon_of(b)->pool), want) <= room)
		return UINT64_MAX;
	return classes_warm_room(pool_classes(daemon_of(b)->pool), room, want);
}

/* Say once that prewarm is more than the descriptors allow, and what to raise (prewarm.h). */
uint64_t prewarm_clamp_fds(const struct broker *b, uint64_t want)
{
	static bool said;
	uint64_t room = prewarm_fd_room(b, want);
	char s1[32], s2[32], s3[32];

	if (want <= room)
		return want;
	if (!said) {
		said = true;
		log_warnx("prewarm %s needs more chunks of %s than the daemon's file descriptors allow (%llu chunks in "
			  "all): warming %s; raise LimitNOFILE, or chunk-size",
			  format_size(want, s1, sizeof(s1)),
			  format_size(pool_chunk_size(daemon_of(b)->pool), s2, sizeof(s2)),
			  (unsigned long long)b->chunk_capacity, format_size(room, s3, sizeof(s3)));
	}
	return room;
}

/* What the idle pool should warm to: prewarm, within what the budget leaves beside the leases and the fds allow. */
static uint64_t prewarm_target(const struct broker *b)
{
	uint64_t allowance = budget_pool_allowance(b->budget);

	if (b->state != BROKER_NORMAL)
		return 0;
	return prewarm_clamp_fds(b, b->prewarm_bytes < allowance ? b->prewarm_bytes : allowance);
}

/* A warm-up to want that failed with err: what is warm, and what the operator should raise. */
void prewarm_warn_failed(const struct broker *b, uint64_t want, int err)
{
	char s1[32], s2[32];

	log_warnx("warming the pool to %s failed: %s; continuing with %s warm (%s)", format_size(want, s1, sizeof(s1)),
		  strerror(-err), format_size(pool_idle_bytes(daemon_of(b)->pool), s2, sizeof(s2)),
		  err == -EMFILE || err == -ENFILE ? "raise LimitNOFILE, or chunk-size"
						   : "raise LimitMEMLOCK or grant CAP_IPC_LOCK");
}

/* The host's NUMA nodes, and how prewarm is spread over them (numa, numa-prewarm). */
static struct numa_topology numa_topo;
static enum numa_prewarm numa_how;
static uint64_t numa_list[NUMA_MAX_NODES];
static int numa_ids[NUMA_MAX_NODES];

static char numa_root[4096]; /* proc-root at start (a reload keeps the topology read then) */

/* The pool's view of a node's free memory: read now, as the kernel reports it (a fixture's in tests). */
static uint64_t numa_hook_free(int node, void *ud)
{
	uint64_t v;

	(void)ud;
	return numa_node_free(numa_root, node, &v) == 0 ? v : UINT64_MAX;
}

/* The nodes that stand in for node when it is full, nearest first, by id (numa_fallback_order without node). */
static size_t numa_hook_fallback(int node, int *order, size_t max, void *ud)
{
	int idx[NUMA_MAX_NODES];
	size_t n = numa_fallback_order(&numa_topo, node, idx), got = 0;

	(void)ud;
	for (size_t i = 0; i < n && got < max; i++)
		if (numa_topo.node[idx[i]].id != node)
			order[got++] = numa_topo.node[idx[i]].id;
	return got;
}

int prewarm_numa_read(struct broker *b, const struct config *cfg, struct pool_opts *po, const char **err)
{
	int r;

	numa_read(cfg->proc_root, b->mem_total_bytes, &numa_topo);
	r = numa_parse_prewarm(&numa_topo, cfg->numa_prewarm, &numa_how, numa_list, err);
	if (r < 0)
		return r;
	if (cfg->numa == CONFIG_NUMA_AUTO) {
		for (size_t i = 0; i < numa_topo.n; i++)
			numa_ids[i] = numa_topo.node[i].id;
		po->nodes = numa_ids;
		po->n_nodes = numa_topo.n;
		daemon_of(b)->numa = &numa_topo;
	}
	return 0;
}

void prewarm_numa_hooks(struct broker *b, const struct config *cfg)
{
	if (daemon_of(b)->numa) {
		static const struct pool_numa_hooks hooks = { numa_hook_free, numa_hook_fallback, NULL };

		snprintf(numa_root, sizeof(numa_root), "%s", cfg->proc_root ? cfg->proc_root : "");
		pool_set_numa_hooks(daemon_of(b)->pool, &hooks);
	}
}

/* Say once that collapses the kernel answered yes to were not huge pages after all (pool_thp_unverified). */
static void warn_thp_unverified(const struct broker *b)
{
	static bool said;
	uint64_t n = pool_thp_unverified(daemon_of(b)->pool);

	if (n && !said) {
		said = true;
		log_warnx("%llu pool chunk%s collapsed by MADV_COLLAPSE but not PMD-mapped in /proc/self/smaps; "
			  "counted as 4 KiB pages, ignoring",
			  (unsigned long long)n, n == 1 ? "" : "s");
	}
}

/* Warm the pool to bytes, spread over the NUMA nodes it places on (numa-prewarm), or as one. */
int prewarm_grow(struct broker *b, uint64_t bytes, void (*progress)(uint64_t, uint64_t, void *))
{
	uint64_t split[NUMA_MAX_NODES], left = bytes;
	const int *nodes;
	size_t n = pool_nodes(daemon_of(b)->pool, &nodes);
	int r, first = 0;

	if (n == 0) {
		r = pool_grow(daemon_of(b)->pool, bytes, progress, NULL);
		goto out;
	}
	numa_split_prewarm(&numa_topo, numa_how, bytes, pool_chunk_size(daemon_of(b)->pool), numa_list, split);
	for (size_t i = 0; i < n; i++) {
		uint64_t want = split[i] < left ? split[i] : left; /* a list larger than the prewarm is cut */
		uint64_t idle = pool_idle_bytes(daemon_of(b)->pool), lack = bytes > idle ? bytes - idle : 0;
		struct pool_node_bytes on;

		left -= want;
		/* No more than the pool lacks: idle chunks no node counts (simulated, misplaced) are warm too. */
		pool_node_bytes(daemon_of(b)->pool, nodes[i], &on);
		r = pool_grow_on(daemon_of(b)->pool, want < on.idle + lack ? want : on.idle + lack, nodes[i], progress,
				 NULL);
		if (r < 0 && first == 0)
			first = r;
	}
	/*
	 * Whatever the split left short (chunk rounding, a list smaller than the prewarm, pages a node
	 * could not take) is topped up on any node: the pool ends at least this warm, as without NUMA.
	 */
	r = first < 0 ? first : pool_grow(daemon_of(b)->pool, bytes, progress, NULL);
out:
	warn_thp_unverified(b);
	return r;
}

static struct warmup *bg_warmup;
static uint64_t bg_target;

/* A chunk of bytes may join the idle pool while it stays within what prewarm_target allows now. */
static bool bg_admit(uint64_t bytes, void *ud)
{
	struct broker *b = ud;
	uint64_t target = prewarm_target(b), idle = pool_idle_bytes(daemon_of(b)->pool),
		 slack = pool_chunk_size(daemon_of(b)->pool);

	/* The plan rounds up to whole chunks of the smallest class, as a warm-up in one go does. */
	return !b->shutting_down && idle < target && idle + bytes <= target + slack - 1;
}

static void bg_grown(void *ud)
{
	struct broker *b = ud;
	char d[32], t[32];

	b->generation++;
	notify_status("Warming pool: %s of %s pre-faulted and locked (serving)",
		      format_size(pool_idle_bytes(daemon_of(b)->pool), d, sizeof(d)),
		      format_size(bg_target, t, sizeof(t)));
	shell->status(b);
}

static void bg_done(uint64_t bytes, uint64_t us, int err, void *ud)
{
	struct broker *b = ud;
	char s1[32], s2[32];

	b->pool_warming = false;
	warn_thp_unverified(b);
	if (err < 0)
		prewarm_warn_failed(b, bg_target, err);
	else
		log_info("pool warmed: %s in %.1f ms (%.1f GiB/s, %u threads), serving meanwhile; %s idle now",
			 format_size(bytes, s1, sizeof(s1)), (double)us / 1000.0,
			 (double)bytes / 1073741824.0 / ((double)(us + 1) / 1e6), pool_threads(daemon_of(b)->pool),
			 format_size(pool_idle_bytes(daemon_of(b)->pool), s2, sizeof(s2)));
	/*
	 * A prewarm raised meanwhile waited for this warm-up: grow on in steps (prewarm_cb). Chunks leases took
	 * meanwhile are not made again, as after a warm-up in one go.
	 */
	if (prewarm_target(b) > bg_target)
		shell->applied(b);
	else
		shell->status(b);
}

/* Warm the pool to bytes beside the loop, spread over the NUMA nodes as prewarm_grow spreads it. */
int prewarm_grow_bg(struct broker *b, uint64_t bytes)
{
	static const struct warmup_hooks hooks = { bg_admit, bg_grown, bg_done, NULL };
	struct warmup_hooks h = hooks;
	uint64_t split[NUMA_MAX_NODES];
	const int *nodes;
	size_t n = pool_nodes(daemon_of(b)->pool, &nodes);
	int r;

	if (n > 0)
		numa_split_prewarm(&numa_topo, numa_how, bytes, pool_chunk_size(daemon_of(b)->pool), numa_list, split);
	h.ud = b;
	bg_target = bytes;
	/* warmup-batch-max as at start: a reload does not change it (the key is restart-only). */
	r = warmup_start(daemon_of(b)->loop, daemon_of(b)->pool, bytes, nodes, split, n,
			 daemon_of(b)->cfg->warmup_batch_max_bytes, &h, &bg_warmup);
	if (r == 0)
		b->pool_warming = true;
	return r;
}

static void prewarm_cb(struct ev_loop *loop, ev_idle *w, int revents)
{
	struct broker *b = w->data;
	uint64_t target = prewarm_target(b), idle = pool_idle_bytes(daemon_of(b)->pool), step;
	/* A step holds at least one chunk of the largest class, or a stepped warm-up would never make one. */
	uint64_t step_bytes = pool_chunk_max(daemon_of(b)->pool) > PREWARM_STEP_BYTES
				      ? pool_chunk_max(daemon_of(b)->pool)
				      : PREWARM_STEP_BYTES;
	char s1[32];
	int r;

	/* The start warm-up is still making chunks: it calls back here when it is over (bg_done). */
	if (idle >= target || warmup_running(bg_warmup)) {
		ev_idle_stop(loop, w);
		return;
	}
	step = target - idle < step_bytes ? target : idle + step_bytes;
	r = prewarm_grow(b, step, NULL);
	b->generation++;
	if (r < 0) {
		prewarm_warn_failed(b, target, r);
		ev_idle_stop(loop, w);
	} else if (pool_idle_bytes(daemon_of(b)->pool) >= target) {
		log_info("pool warmed to %s for the new prewarm",
			 format_size(pool_idle_bytes(daemon_of(b)->pool), s1, sizeof(s1)));
		ev_idle_stop(loop, w);
		shell->status(b);
	}
}

void prewarm_init(const struct prewarm_hooks *h)
{
	shell = h;
	ev_idle_init(&prewarm_idle, prewarm_cb);
}

void prewarm_kick(struct broker *b)
{
	/* A raised prewarm grows the pool, in steps off the loop's busy turns (prewarm_cb). */
	if (daemon_of(b)->loop && prewarm_target(b) > pool_idle_bytes(daemon_of(b)->pool) &&
	    !ev_is_active(&prewarm_idle)) {
		prewarm_idle.data = b;
		ev_idle_start(daemon_of(b)->loop, &prewarm_idle);
	}
}

void prewarm_stop_warmup(struct broker *b)
{
	warmup_free(bg_warmup);
	bg_warmup = NULL;
	b->pool_warming = false;
}

void prewarm_fini(struct broker *b)
{
	ev_idle_stop(daemon_of(b)->loop, &prewarm_idle);
}

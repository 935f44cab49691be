/* SPDX-License-Identifier: MIT */
/*
 * The state of the hooks for host memory the CUDA driver owns (preload-vmm.c, preload-pools.c, preload-graph.c),
 * the one lock that guards it, what a forked child does with it, and the small helpers those files share.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "preload-cudapaths-int.h"
#include "preload-filter.h"
#include "preload-table.h"
#include "preload.h"

/*
 * Serialises every hook of these files, broker calls included, so a pool's charge always matches its allocations.
 * Taken before preload-memory.c's locks, never under them; held across fork() by a handler registered on first
 * use, after the constructor registered preload-memory.c's, so that it runs first (prepare handlers run in
 * reverse).
 */
static pthread_mutex_t ops_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

struct pbp_vmm_state pbp_vmm = { .maps_span = PBP_SPAN_EMPTY };
struct pbp_pool_state pbp_pools = { .allocs_span = PBP_SPAN_EMPTY };
struct pbp_graph_state pbp_graphs;

void pbp_cudapaths_span_set(struct pbp_span *s, const struct pbp_table *t)
{
	pbp_span_set(s, t->n ? t->v[0].base : 0, t->n ? t->v[t->n - 1].base + t->v[t->n - 1].bytes : 0);
}

static void ops_prepare(void)
{
	pthread_mutex_lock(&ops_lock);
}

static void ops_parent(void)
{
	pthread_mutex_unlock(&ops_lock);
}

/* A child owns none of its parent's driver memory (CUDA does not survive fork): it starts with nothing. */
static void ops_child(void)
{
	pbp_table_free(&pbp_vmm.handles);
	pbp_table_free(&pbp_vmm.mappings);
	pbp_slots_reset(&pbp_vmm.host_vmms);
	pbp_cudapaths_span_set(&pbp_vmm.maps_span, &pbp_vmm.mappings);
	pbp_table_free(&pbp_pools.allocs);
	pbp_cudapaths_span_set(&pbp_pools.allocs_span, &pbp_pools.allocs);
	pbp_pools.v = NULL;
	pbp_pools.n = pbp_pools.cap = 0;
	pbp_slots_reset(&pbp_pools.host_pools);
	pbp_graphs.v = NULL;
	pbp_graphs.n = pbp_graphs.cap = 0;
	pthread_mutex_unlock(&ops_lock);
}

static void register_fork(void)
{
	pthread_atfork(ops_prepare, ops_parent, ops_child);
}

void pbp_cudapaths_lock(void)
{
	pthread_once(&fork_once, register_fork);
	pthread_mutex_lock(&ops_lock);
}

void pbp_cudapaths_unlock(void)
{
	pthread_mutex_unlock(&ops_lock);
}

bool pbp_cudapaths_host_location(const struct cu_location *l)
{
	return l && (l->type == CU_LOC_HOST || l->type == CU_LOC_HOST_NUMA || l->type == CU_LOC_HOST_NUMA_CURRENT);
}

size_t pbp_cudapaths_round_page(size_t bytes)
{
	return pbp_page_span(0, bytes, pbp_page_size());
}

bool pbp_cudapaths_refuse(void)
{
	return pbp_fallback(pbp_cfg.policy, PBP_HOST_MAPPED, false) == PBP_DO_ERROR;
}

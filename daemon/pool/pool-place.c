/* SPDX-License-Identifier: MIT */
/*
 * The pool's placement floor: which NUMA node a chunk goes on (mbind and set_mempolicy before any page is
 * faulted), where its pages landed (move_pages), and which nodes stand in for a full one. The topology
 * itself comes from numa.c through the daemon's hooks. Calls only the pages floor (see pool-int.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pool-int.h"

/* <numaif.h>'s policy modes, without libnuma. */
#define PB_MPOL_DEFAULT 0
#define PB_MPOL_PREFERRED 1
/* Pages of a chunk whose node move_pages is asked (spread over it). */
#define PLACEMENT_SAMPLES 64
/*
 * Free memory a node keeps before it counts as full for a take: below it the kernel reclaims on the
 * node (its watermarks are ~0.1-0.5% of it: some hundreds of MiB on a 100+ GiB socket) or, under
 * MPOL_PREFERRED, places fresh pages on another node anyway.
 */
#define NODE_RESERVE_BYTES (256ull * 1024 * 1024)

/* The index of node in p->nodes, or -1. */
int place_slot(const struct pool *p, int node)
{
	for (size_t i = 0; node >= 0 && i < p->n_nodes; i++)
		if (p->nodes[i] == node)
			return (int)i;
	return -1;
}

/* node if chunks are placed on it, else -1 (any): a node the pool does not place on is no request. */
int place_node(const struct pool *p, int node)
{
	for (size_t i = 0; node >= 0 && i < p->n_nodes; i++)
		if (p->nodes[i] == node)
			return node;
	return -1;
}

/* Whether chunk c counts as on node (-1, or no placement: every chunk does). */
bool place_on_node(const struct pool *p, const struct chunk *c, int node)
{
	return node < 0 || p->n_nodes == 0 || c->node == node;
}

/* A node mask for mbind/set_mempolicy: the one bit of node. */
struct node_mask {
	unsigned long bits[NUMA_MAX_NODES / (8 * sizeof(unsigned long)) + 1];
};

static struct node_mask mask_of(int node)
{
	struct node_mask m = { { 0 } };

	if (node < 0 || node >= NUMA_MAX_NODES) /* numa_read never lists one: an empty mask, the local node */
		return m;
	m.bits[(size_t)node / (8 * sizeof(unsigned long))] = 1ul << ((size_t)node % (8 * sizeof(unsigned long)));
	return m;
}

/* Prefer node for the range's pages from now on (shmem keeps the policy with the file). */
int place_prefer_range(void *addr, uint64_t bytes, int node)
{
	struct node_mask m = mask_of(node);

	return syscall(SYS_mbind, addr, bytes, PB_MPOL_PREFERRED, m.bits, NUMA_MAX_NODES + 1, 0) == 0 ? 0 : -errno;
}

/* Prefer node for this thread's allocations (hugetlb's fallocate), or back to the default (node < 0). */
void place_prefer_thread(int node)
{
	struct node_mask m = node >= 0 ? mask_of(node) : (struct node_mask){ { 0 } };

	(void)syscall(SYS_set_mempolicy, node >= 0 ? PB_MPOL_PREFERRED : PB_MPOL_DEFAULT, node >= 0 ? m.bits : NULL,
		      node >= 0 ? NUMA_MAX_NODES + 1 : 0);
}

/*
 * Where a resident range's pages are: the node of its first page (-1 if it cannot tell), and in
 * *mixed whether any of PLACEMENT_SAMPLES pages spread over it is on another node than that one.
 */
static int range_node(void *addr, uint64_t bytes, bool *mixed)
{
	void *pages[PLACEMENT_SAMPLES];
	int status[PLACEMENT_SAMPLES];
	size_t n = bytes / PAGE_4K_BYTES < PLACEMENT_SAMPLES ? bytes / PAGE_4K_BYTES : PLACEMENT_SAMPLES;

	*mixed = false;
	if (n == 0)
		return -1;
	for (size_t i = 0; i < n; i++)
		pages[i] = (uint8_t *)addr + (bytes / n * i) / PAGE_4K_BYTES * PAGE_4K_BYTES;
	if (syscall(SYS_move_pages, 0, n, pages, NULL, status, 0) != 0)
		return -1;
	for (size_t i = 1; i < n; i++)
		if (status[i] != status[0])
			*mixed = true;
	return status[0] >= 0 ? status[0] : -1;
}

/* range_node for a chunk, mapping a hugetlb one (which the daemon does not map) for the question. */
void place_locate(struct chunk *c, int want)
{
	void *a = c->addr;

	if (!a) {
		a = mmap(NULL, c->bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, c->fd, 0);
		if (a == MAP_FAILED) {
			c->node = -1;
			return;
		}
	}
	c->node = range_node(a, c->bytes, &c->mixed);
	c->misplaced = want >= 0 && (c->node != want || c->mixed);
	if (!c->addr)
		munmap(a, c->bytes);
}

/*
 * The nodes whose idle chunks serve a take for node, into out[]: node itself, then, when node's free
 * memory cannot hold short_bytes of fresh chunks and still keep NODE_RESERVE_BYTES, the nodes the
 * numa hooks say stand in for it, nearest first. Returns the count (1 without a node or hooks).
 */
size_t place_take_nodes(const struct pool *p, int node, uint64_t short_bytes, int *out)
{
	const struct pool_numa_hooks *h = &p->numa_hooks;
	uint64_t free_bytes;
	size_t n = 0;

	out[n++] = node;
	if (node < 0 || p->n_nodes == 0 || short_bytes == 0 || !h->free_bytes || !h->fallback)
		return n;
	free_bytes = h->free_bytes(node, h->ud);
	if (free_bytes == UINT64_MAX || free_bytes >= short_bytes + NODE_RESERVE_BYTES)
		return n;
	{
		size_t got = h->fallback(node, out + 1, NUMA_MAX_NODES - 1, h->ud);

		/* Keeping the order: only nodes the pool places on, node itself once. */
		for (size_t i = 1; i <= got; i++)
			if (out[i] != node && pool_places_on(p, out[i]))
				out[n++] = out[i];
	}
	return n;
}

void pool_set_numa_hooks(struct pool *p, const struct pool_numa_hooks *h)
{
	if (h)
		p->numa_hooks = *h;
	else
		memset(&p->numa_hooks, 0, sizeof(p->numa_hooks));
}

void pool_node_bytes(const struct pool *p, int node, struct pool_node_bytes *ret)
{
	int slot = place_slot(p, node);

	*ret = (struct pool_node_bytes){ 0 };
	if (slot < 0)
		return;
	/* node_all and node_misplaced are shared with warm-up threads (chunk_count_kind). */
	pthread_mutex_lock((pthread_mutex_t *)&p->id_lock);
	ret->idle = p->node_idle[slot];
	ret->lent = p->node_all[slot] - p->node_idle[slot];
	ret->misplaced = p->node_misplaced[slot];
	pthread_mutex_unlock((pthread_mutex_t *)&p->id_lock);
}

bool pool_places_on(const struct pool *p, int node)
{
	return place_node(p, node) >= 0;
}

size_t pool_nodes(const struct pool *p, const int **nodes)
{
	*nodes = p->nodes;
	return p->n_nodes;
}

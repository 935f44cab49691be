/* SPDX-License-Identifier: MIT */
/*
 * NUMA topology and the pool's placement decisions: which nodes there are,
 * where the GPUs sit, how the prewarm is split, and the order in which a
 * node's neighbours stand in for it. Read from <root>/sys (a fixture root in
 * tests); no allocation policy is applied here (pool-place.c does the mbind).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define NUMA_MAX_NODES 64
#define NUMA_MAX_GPUS 64

struct numa_node {
	int id;
	uint64_t mem_total_bytes;          /* nodeN/meminfo MemTotal */
	uint64_t mem_free_bytes;           /* nodeN/meminfo MemFree */
	unsigned gpus;                     /* NVIDIA GPUs whose PCI device says this node */
	unsigned distance[NUMA_MAX_NODES]; /* nodeN/distance, by index into numa_topology.node */
};

struct numa_gpu {
	char bus_id[16]; /* "0000:3b:00.0" */
	int node;        /* its numa_node; -1 when the firmware does not say */
};

struct numa_topology {
	size_t n;
	struct numa_node node[NUMA_MAX_NODES];
	size_t n_gpus;
	struct numa_gpu gpu[NUMA_MAX_GPUS];
};

/*
 * Read the online nodes (those numbered below NUMA_MAX_NODES), their memory and distances, and the NVIDIA GPUs
 * (vendor 0x10de, display class 0x03) from <root>/sys ("" for the host).
 * A kernel without NUMA (no node folder) reads as one node 0 holding all the
 * memory (mem_total_fallback). Returns 0 or a negative errno.
 */
int numa_read(const char *root, uint64_t mem_total_fallback, struct numa_topology *t);

/*
 * Node id's MemFree now, from <root>/sys/devices/system/node/nodeN/meminfo, into *free_bytes.
 * Returns 0, or -ENOENT when the file or its MemFree line is missing (-EINVAL for a negative id).
 */
int numa_node_free(const char *root, int id, uint64_t *free_bytes);

/* Parse a kernel node list ("0", "0-3", "0,2-3") into ids (at most max). Returns the count or -EINVAL. */
int numa_parse_list(const char *s, int *ids, size_t max);

/* The index of node id in t, or -1. */
int numa_index(const struct numa_topology *t, int id);

/* The node of a GPU by PCI bus id (case-insensitive, domain optional), or -1. */
int numa_gpu_node(const struct numa_topology *t, const char *bus_id);

enum numa_prewarm {
	NUMA_PREWARM_GPUS, /* in proportion to each node's GPUs (even when no GPU says its node) */
	NUMA_PREWARM_EVEN,
	NUMA_PREWARM_LIST, /* explicit per-node sizes */
};

/*
 * Split bytes of prewarm over t's nodes into out[] (by index), each a
 * multiple of chunk_bytes, summing to bytes rounded down to chunks (the
 * remainder goes to the node with the most GPUs, then the lowest id). With
 * NUMA_PREWARM_LIST, out[] is taken from list_bytes[] (by index) as given.
 */
void numa_split_prewarm(const struct numa_topology *t, enum numa_prewarm how, uint64_t bytes, uint64_t chunk_bytes,
			const uint64_t *list_bytes, uint64_t *out);

/*
 * Parse numa-prewarm: "gpus", "even", or "NODE:SIZE[,NODE:SIZE...]" (sizes as
 * parse_size takes them) into *how and list_bytes[] by index of t. Returns 0,
 * or -EINVAL with *err (static text) naming the problem.
 */
int numa_parse_prewarm(const struct numa_topology *t, const char *spec, enum numa_prewarm *how, uint64_t *list_bytes,
		       const char **err);

/*
 * The nodes that serve a lease asked of node id, best first: the node, then
 * the others by distance (ties by id). Writes indexes into order[]; returns
 * how many (t->n), or 0 when id is not a node. The daemon's pool takes another
 * node's idle chunks in this order when node id is full (pool_set_numa_hooks).
 */
size_t numa_fallback_order(const struct numa_topology *t, int id, int *order);

/* SPDX-License-Identifier: MIT */
/*
 * libpinbroker-preload.so's hooks for graph memory nodes with a host location (cuGraphAddMemAllocNode,
 * cuGraphAddNode(_v2)): the driver backs them when the graph runs, from a pool of its own, so no lease can serve
 * them. They are reported as unbrokered by their page-rounded size from the node's creation until its graph is
 * destroyed.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "pinbroker.h"
#include "preload-cudapaths-int.h"
#include "preload.h"

/* A graph that holds memory nodes with a host location. */
struct graph {
	CUgraph graph;
	uint64_t bytes;
};

/* A memory node of bytes with a host location added to graph: reported as unbrokered until it is destroyed. */
static void graph_note(CUgraph graph, size_t bytesize)
{
	uint64_t bytes = pbp_cudapaths_round_page(bytesize);
	size_t i;

	pbp_cudapaths_lock();
	for (i = 0; i < pbp_graphs.n && pbp_graphs.v[i].graph != graph; i++)
		;
	if (i == pbp_graphs.n) {
		if (pbp_graphs.n == pbp_graphs.cap) {
			size_t cap = pbp_graphs.cap ? pbp_graphs.cap * 2 : 8;
			struct graph *v = realloc(pbp_graphs.v, cap * sizeof(*v));

			if (!v) {
				pbp_cudapaths_unlock();
				return;
			}
			pbp_graphs.v = v;
			pbp_graphs.cap = cap;
		}
		pbp_graphs.v[pbp_graphs.n++] = (struct graph){ .graph = graph };
	}
	pbp_graphs.v[i].bytes += bytes;
	atomic_store(&pbp_graphs.seen, true);
	pbp_unbrokered_adjust(bytes, 0);
	pbp_cudapaths_unlock();
	pbp_say(false, "graph %p: a memory node of %llu host bytes (reported as unbrokered)", graph,
		(unsigned long long)bytes);
}

/* A node cuGraphAddNode(_v2) added to graph: noted if it is a memory node with a host location. */
static void graph_note_node(CUgraph graph, const struct cu_graph_node_params *params)
{
	if (!pbp_passthrough() && params && params->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC &&
	    pbp_cudapaths_host_location(&params->alloc.pool_props.location))
		graph_note(graph, params->alloc.bytesize);
}

EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n_deps,
				       struct cu_alloc_node_params *params)
{
	CUresult r;

	if (!pbp_real_fn(F_cuGraphAddMemAllocNode))
		return CU_NOT_INITIALIZED;
	pbp_enter();
	r = CALL(CUresult(*)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, struct cu_alloc_node_params *),
		 F_cuGraphAddMemAllocNode, node, graph, deps, n_deps, params);
	pbp_leave();
	if (r == CU_OK && !pbp_passthrough() && params && pbp_cudapaths_host_location(&params->pool_props.location))
		graph_note(graph, params->bytesize);
	return r;
}

EXPORT CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n_deps,
			       struct cu_graph_node_params *params)
{
	CUresult r;

	if (!pbp_real_fn(F_cuGraphAddNode))
		return CU_NOT_INITIALIZED;
	pbp_enter();
	r = CALL(CUresult(*)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, struct cu_graph_node_params *),
		 F_cuGraphAddNode, node, graph, deps, n_deps, params);
	pbp_leave();
	if (r == CU_OK)
		graph_note_node(graph, params);
	return r;
}

EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, const void *edge_data,
				  size_t n_deps, struct cu_graph_node_params *params)
{
	CUresult r;

	if (!pbp_real_fn(F_cuGraphAddNode_v2))
		return CU_NOT_INITIALIZED;
	pbp_enter();
	r = CALL(CUresult(*)(CUgraphNode *, CUgraph, const CUgraphNode *, const void *, size_t,
			     struct cu_graph_node_params *),
		 F_cuGraphAddNode_v2, node, graph, deps, edge_data, n_deps, params);
	pbp_leave();
	if (r == CU_OK)
		graph_note_node(graph, params);
	return r;
}

EXPORT CUresult cuGraphDestroy(CUgraph graph)
{
	CUresult r;

	if (!pbp_real_fn(F_cuGraphDestroy))
		return CU_NOT_INITIALIZED;
	pbp_enter();
	r = CALL(CUresult(*)(CUgraph), F_cuGraphDestroy, graph);
	pbp_leave();
	if (r != CU_OK || pbp_passthrough() || !atomic_load(&pbp_graphs.seen))
		return r;
	pbp_cudapaths_lock();
	for (size_t i = 0; i < pbp_graphs.n; i++)
		if (pbp_graphs.v[i].graph == graph) {
			pbp_unbrokered_adjust(0, pbp_graphs.v[i].bytes);
			pbp_graphs.v[i] = pbp_graphs.v[--pbp_graphs.n];
			break;
		}
	pbp_cudapaths_unlock();
	return r;
}

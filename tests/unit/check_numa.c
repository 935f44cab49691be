/* SPDX-License-Identifier: MIT */
/* Unit tests for the NUMA placement decisions: topology from fixture sysfs trees (2 and 4 nodes, GPUs on each), the
 * real host's, GPU nodes, the prewarm split, numa-prewarm parsing and the fallback order. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "numa.h"
#include "check_main.h"

#define GIB (1024ull * 1024 * 1024)
#define MIB (1024ull * 1024)

static struct numa_topology topo(const char *name)
{
	struct numa_topology t;
	char root[512];

	snprintf(root, sizeof(root), "%s/../sys/%s", FIXTURES_DIR "/proc", name);
	ck_assert_int_eq(numa_read(root, 0, &t), 0);
	return t;
}

START_TEST(test_node_lists_parse_as_the_kernel_writes_them)
{
	int ids[8];

	ck_assert_int_eq(numa_parse_list("0", ids, 8), 1);
	ck_assert_int_eq(numa_parse_list("0-3", ids, 8), 4);
	ck_assert_int_eq(ids[3], 3);
	ck_assert_int_eq(numa_parse_list("0,2-3\n", ids, 8), 3);
	ck_assert_int_eq(ids[1], 2);
	ck_assert_int_eq(numa_parse_list("3-1", ids, 8), -EINVAL);
	ck_assert_int_eq(numa_parse_list("x", ids, 8), -EINVAL);
	ck_assert_int_eq(numa_parse_list("0-9", ids, 8), -EINVAL); /* more than max */
}
END_TEST

START_TEST(test_two_nodes_with_gpus_on_each)
{
	struct numa_topology t = topo("numa2");

	ck_assert_uint_eq(t.n, 2);
	ck_assert_int_eq(t.node[1].id, 1);
	ck_assert_uint_eq(t.node[0].mem_total_bytes, 65536000ull * 1024);
	ck_assert_uint_eq(t.node[1].mem_free_bytes, 50000000ull * 1024);
	ck_assert_uint_eq(t.node[0].distance[1], 21);
	/* Four GPUs (the NVIDIA audio function and the Intel bridge are not GPUs): 3 on node 0, 1 on node 1. */
	ck_assert_uint_eq(t.n_gpus, 4);
	ck_assert_uint_eq(t.node[0].gpus, 3);
	ck_assert_uint_eq(t.node[1].gpus, 1);
	ck_assert_int_eq(numa_gpu_node(&t, "0000:86:00.0"), 1);
	ck_assert_int_eq(numa_gpu_node(&t, "86:00.0"), 1);      /* without the domain, as nvidia-smi prints it */
	ck_assert_int_eq(numa_gpu_node(&t, "0000:3B:00.0"), 0); /* CUDA's upper case */
	ck_assert_int_eq(numa_gpu_node(&t, "0000:99:00.0"), -1);
}
END_TEST

START_TEST(test_four_nodes_order_neighbours_by_distance)
{
	struct numa_topology t = topo("numa4");
	int order[NUMA_MAX_NODES];

	ck_assert_uint_eq(t.n, 4);
	/* A GPU whose firmware gives no node counts for no node. */
	ck_assert_uint_eq(t.n_gpus, 5);
	ck_assert_uint_eq(t.node[0].gpus, 2);
	ck_assert_uint_eq(t.node[1].gpus, 0);
	ck_assert_uint_eq(t.node[3].gpus, 2);
	ck_assert_int_eq(numa_gpu_node(&t, "0000:e1:00.0"), -1);
	ck_assert_uint_eq(numa_fallback_order(&t, 2, order), 4);
	ck_assert_int_eq(order[0], 2); /* itself */
	ck_assert_int_eq(order[1], 3); /* same socket */
	ck_assert_int_eq(order[2], 0); /* across, lower id first */
	ck_assert_int_eq(order[3], 1);
	ck_assert_uint_eq(numa_fallback_order(&t, 1, order), 4);
	ck_assert_int_eq(order[1], 0);
	ck_assert_uint_eq(numa_fallback_order(&t, 7, order), 0);
}
END_TEST

START_TEST(test_prewarm_follows_the_gpus_or_is_even)
{
	struct numa_topology t2 = topo("numa2"), t4 = topo("numa4");
	uint64_t out[NUMA_MAX_NODES], list[NUMA_MAX_NODES];

	/* 8 GiB over 3 + 1 GPUs: 6 and 2. */
	numa_split_prewarm(&t2, NUMA_PREWARM_GPUS, 8 * GIB, 2 * MIB, NULL, out);
	ck_assert_uint_eq(out[0], 6 * GIB);
	ck_assert_uint_eq(out[1], 2 * GIB);
	numa_split_prewarm(&t2, NUMA_PREWARM_EVEN, 8 * GIB, 2 * MIB, NULL, out);
	ck_assert_uint_eq(out[0], 4 * GIB);
	/* GPUs on nodes 0 and 3 only: nodes 1 and 2 get nothing; a remainder of chunks goes to the first of them. */
	numa_split_prewarm(&t4, NUMA_PREWARM_GPUS, 6 * MIB, 2 * MIB, NULL, out);
	ck_assert_uint_eq(out[0] + out[3], 6 * MIB);
	ck_assert_uint_eq(out[1] + out[2], 0);
	ck_assert_uint_eq(out[0], 4 * MIB);
	/* Every split sums to the prewarm in whole chunks. */
	numa_split_prewarm(&t4, NUMA_PREWARM_EVEN, 1 * GIB + 3 * MIB, 2 * MIB, NULL, out);
	ck_assert_uint_eq(out[0] + out[1] + out[2] + out[3], 1 * GIB + 2 * MIB);
	for (int i = 0; i < 4; i++)
		ck_assert_uint_eq(out[i] % (2 * MIB), 0);
	list[0] = 1 * GIB;
	list[1] = 0;
	list[2] = 3 * GIB;
	list[3] = 0;
	numa_split_prewarm(&t4, NUMA_PREWARM_LIST, 99, 2 * MIB, list, out);
	ck_assert_uint_eq(out[2], 3 * GIB);
}
END_TEST

START_TEST(test_numa_prewarm_spec_parses_and_names_its_errors)
{
	struct numa_topology t = topo("numa2");
	enum numa_prewarm how;
	uint64_t list[NUMA_MAX_NODES];
	const char *err = NULL;

	ck_assert_int_eq(numa_parse_prewarm(&t, "gpus", &how, list, &err), 0);
	ck_assert_int_eq(how, NUMA_PREWARM_GPUS);
	ck_assert_int_eq(numa_parse_prewarm(&t, "even", &how, list, &err), 0);
	ck_assert_int_eq(how, NUMA_PREWARM_EVEN);
	ck_assert_int_eq(numa_parse_prewarm(&t, "0:4G,1:512M", &how, list, &err), 0);
	ck_assert_int_eq(how, NUMA_PREWARM_LIST);
	ck_assert_uint_eq(list[0], 4 * GIB);
	ck_assert_uint_eq(list[1], 512 * MIB);
	ck_assert_int_eq(numa_parse_prewarm(&t, "2:4G", &how, list, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "no such NUMA node"));
	ck_assert_int_eq(numa_parse_prewarm(&t, "0:lots", &how, list, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "not a size"));
	ck_assert_int_eq(numa_parse_prewarm(&t, "all", &how, list, &err), -EINVAL);
}
END_TEST

START_TEST(test_no_numa_in_the_kernel_is_one_node_with_all_memory)
{
	struct numa_topology t;

	ck_assert_int_eq(numa_read("/nonexistent-root", 42 * GIB, &t), 0);
	ck_assert_uint_eq(t.n, 1);
	ck_assert_int_eq(t.node[0].id, 0);
	ck_assert_uint_eq(t.node[0].mem_total_bytes, 42 * GIB);
}
END_TEST

START_TEST(test_nodes_numbered_past_the_mask_are_left_out)
{
	char root[] = "/tmp/pbnuma-ids.XXXXXX", cmd[256];
	struct numa_topology t;

	ck_assert_ptr_nonnull(mkdtemp(root));
	snprintf(cmd, sizeof(cmd),
		 "mkdir -p %s/sys/devices/system/node && echo 0,70,200-201 > %s/sys/devices/system/node/online", root,
		 root);
	ck_assert_int_eq(system(cmd), 0);
	ck_assert_int_eq(numa_read(root, 1, &t), 0);
	ck_assert_uint_eq(t.n, 1);
	ck_assert_int_eq(t.node[0].id, 0);
	snprintf(cmd, sizeof(cmd), "echo 70 > %s/sys/devices/system/node/online", root);
	ck_assert_int_eq(system(cmd), 0);
	ck_assert_int_eq(numa_read(root, 9, &t), 0); /* none usable: one node 0, as without NUMA */
	ck_assert_uint_eq(t.n, 1);
	ck_assert_uint_eq(t.node[0].mem_total_bytes, 9);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
	ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_the_real_host_has_a_node_zero)
{
	struct numa_topology t;

	ck_assert_int_eq(numa_read("", 1, &t), 0);
	ck_assert_uint_ge(t.n, 1);
	ck_assert_int_ge(numa_index(&t, t.node[0].id), 0);
	ck_assert_uint_gt(t.node[0].mem_total_bytes, 0);
}
END_TEST

CHECK_SUITE(suite, "numa", "placement", NULL, NULL, 0, test_node_lists_parse_as_the_kernel_writes_them,
	    test_two_nodes_with_gpus_on_each, test_four_nodes_order_neighbours_by_distance,
	    test_prewarm_follows_the_gpus_or_is_even, test_numa_prewarm_spec_parses_and_names_its_errors,
	    test_no_numa_in_the_kernel_is_one_node_with_all_memory, test_nodes_numbered_past_the_mask_are_left_out,
	    test_the_real_host_has_a_node_zero)

CHECK_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/*
 * Integration: NUMA placement against the real pinbrokerd. On this host's real kernel (one node here): leases land
 * on the node asked, as the daemon, the library and pinctl say. On a fixture sysfs of two nodes with GPUs on each
 * (tests/fixtures/sys/numa2) over the same single-node kernel: the prewarm split and the node rows follow the
 * fixture, the library resolves a GPU's node from sysfs, and a lease asked of node 1, which the kernel cannot
 * place there, falls back to node 0 and says it is misplaced. On the four-node fixture
 * (tests/fixtures/sys/numa4): the prewarm split and a row per node, and a node the fixture says is full
 * (MemFree 0) served from the idle chunks of the nearest node that has some, marked misplaced.
 */
#define _GNU_SOURCE
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"
#include "pinbroker.h"
#include "check_main.h"

#define MiB (1024ull * 1024ull)

static struct daemon d;
static char root[64];

ITEST_FIXTURE_START(start, d, ITEST_ARGS("--prewarm", "16M", "--thp", "no"))

/* A proc root (the idle fixture) with the two-node sysfs fixture beside it. */
static void start_fixture(void)
{
	itest_proc_root_start(&d, root, sizeof(root), "pbnuma", "cp -a " FIXTURES_DIR "/sys/numa2/sys/. sys/",
			      ITEST_ARGS("--prewarm", "64M", "--thp", "no"));
}

/*
 * The four-node fixture (tests/fixtures/sys/numa4: GPUs 2, 0, 0, 2, one GPU with no node; nodes 0-1 and 2-3
 * near each other) beside the idle proc root, with node 2's MemFree set to 0: a node that is full.
 */
static void start_fixture4(const char *const *args)
{
	itest_proc_root_start(
		&d, root, sizeof(root), "pbnuma4",
		"cp -a " FIXTURES_DIR "/sys/numa4/sys/. sys/ && "
		"sed -i 's/^Node 2 MemFree: .*/Node 2 MemFree:        0 kB/' sys/devices/system/node/node2/meminfo",
		args);
}

static void start_fixture4_gpus(void)
{
	start_fixture4(ITEST_ARGS("--prewarm", "64M", "--thp", "no"));
}

/* All of the prewarm on node 0, so a chunk counted misplaced there can only be a fresh one made for another. */
static void start_fixture4_node0(void)
{
	start_fixture4(ITEST_ARGS("--prewarm", "64M", "--numa-prewarm", "0:64M", "--thp", "no"));
}

static void stop(void)
{
	ck_assert_int_eq(daemon_stop(&d), 0);
	itest_proc_root_remove(root);
}

static struct pb_status *status(pb_client *c)
{
	struct pb_status *s;

	ck_assert_int_eq(pb_status_get(c, &s), 0);
	return s;
}

static const struct pb_node_info *node_row(const struct pb_status *s, int node)
{
	for (size_t i = 0; i < s->n_nodes; i++)
		if (s->nodes[i].node == node)
			return &s->nodes[i];
	return NULL;
}

START_TEST(test_real_kernel_leases_land_on_the_node_asked)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NUMA_NODE, .numa_node = 0 };
	const struct pb_node_info *nd;
	struct pb_status *s;
	pb_client *c;
	pb_lease *l, *any;
	int misplaced = -1;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_acquire(c, 6 * MiB, &o, &l), 0);
	ck_assert_int_eq(pb_lease_numa_node(l, &misplaced), 0);
	ck_assert_int_eq(misplaced, 0);
	s = status(c);
	ck_assert_uint_ge(s->n_nodes, 1);
	nd = node_row(s, 0);
	ck_assert_ptr_nonnull(nd);
	ck_assert_uint_eq(nd->lent_bytes, 6 * MiB);
	ck_assert_uint_eq(nd->misplaced_bytes, 0);
	ck_assert_int_eq(itest_lease_row(s, pb_lease_id(l))->numa_node, 0);
	ck_assert_int_eq(itest_lease_row(s, pb_lease_id(l))->misplaced, 0);
	pb_status_free(s);
	/* A node the daemon does not place on is "any": served, and not misplaced. */
	o.numa_node = 63;
	ck_assert_int_eq(pb_acquire(c, 2 * MiB, &o, &any), 0);
	ck_assert_int_eq(pb_lease_numa_node(any, &misplaced), 0);
	ck_assert_int_eq(misplaced, 0);
	pb_release(c, any);
	pb_release(c, l);
	s = status(c);
	ck_assert_uint_eq(node_row(s, 0)->lent_bytes, 0);
	pb_status_free(s);
	pb_disconnect(c);
}
END_TEST

START_TEST(test_numa_no_places_nothing)
{
	static const char *const args[] = { "--numa", "no", NULL };
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NUMA_NODE, .numa_node = 0 };
	struct pb_status *s;
	pb_client *c;
	pb_lease *l;

	ck_assert_int_eq(daemon_stop(&d), 0);
	daemon_restart(&d, args);
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_acquire(c, 2 * MiB, &o, &l), 0);
	ck_assert_int_eq(pb_lease_numa_node(l, NULL), -1);
	s = status(c);
	ck_assert_uint_eq(s->n_nodes, 0);
	pb_status_free(s);
	pb_release(c, l);
	pb_disconnect(c);
}
END_TEST

START_TEST(test_fixture_nodes_split_the_prewarm_and_a_full_node_falls_back)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NUMA_NODE, .numa_node = 1 };
	const struct pb_node_info *n0, *n1;
	struct pb_status *s;
	pb_client *c;
	pb_lease *l, *l0;
	int misplaced = 0;
	char *out = NULL;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	s = status(c);
	/* The fixture's two nodes, its GPUs (3 and 1) and memory. */
	ck_assert_uint_eq(s->n_nodes, 2);
	n0 = node_row(s, 0);
	n1 = node_row(s, 1);
	ck_assert_ptr_nonnull(n0);
	ck_assert_ptr_nonnull(n1);
	ck_assert_uint_eq(n0->gpus, 3);
	ck_assert_uint_eq(n1->gpus, 1);
	ck_assert_uint_eq(n1->mem_free_bytes, 50000000ull * 1024);
	/*
	 * 64 MiB split 3:1 by GPUs: node 1's 16 MiB was asked of a kernel with no node 1, so it landed on node 0 and is
	 * counted there, misplaced; nothing is on node 1.
	 */
	ck_assert_uint_eq(n0->idle_bytes, 64 * MiB);
	ck_assert_uint_eq(n0->misplaced_bytes, 16 * MiB);
	ck_assert_uint_eq(n1->idle_bytes + n1->lent_bytes, 0);
	pb_status_free(s);

	/* Asked of node 1, which cannot take it: served from node 0, and the lease says so. */
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &o, &l), 0);
	ck_assert_int_eq(pb_lease_numa_node(l, &misplaced), 0);
	ck_assert_int_eq(misplaced, 1);
	o.numa_node = 0;
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &o, &l0), 0);
	ck_assert_int_eq(pb_lease_numa_node(l0, &misplaced), 0);
	ck_assert_int_eq(misplaced, 0);
	s = status(c);
	ck_assert_int_eq(itest_lease_row(s, pb_lease_id(l))->misplaced, 1);
	ck_assert_int_eq(itest_lease_row(s, pb_lease_id(l0))->misplaced, 0);
	pb_status_free(s);
	ck_assert_int_eq(pinctl(&d, &out, "leases"), 0);
	ck_assert_ptr_nonnull(strstr(out, "misplaced: placed for a NUMA node that was full"));
	/* The NODE column: the node its pages are on, '!' when misplaced. */
	{
		char id[32], *cell;

		snprintf(id, sizeof(id), "%-8llu ", (unsigned long long)pb_lease_id(l));
		cell = itest_table_cell(out, id, "NODE");
		ck_assert_msg(cell && strcmp(cell, "0!") == 0, "lease %s NODE '%s' in:\n%s", id, cell, out);
		free(cell);
		snprintf(id, sizeof(id), "%-8llu ", (unsigned long long)pb_lease_id(l0));
		cell = itest_table_cell(out, id, "NODE");
		ck_assert_msg(cell && strcmp(cell, "0") == 0, "lease %s NODE '%s' in:\n%s", id, cell, out);
		free(cell);
	}
	free(out);
	itest_pinctl_says(&d, 0, "status", "node 1: 0 B idle, 0 B lent, 0 B misplaced; 1 GPU", NULL);

	/* The library finds a GPU's node in sysfs (here the fixture's): 0000:86:00.0 is on node 1. */
	{
		char sys[128];
		struct pb_acquire_opts g = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_GPU, .gpu = "86:00.0" };
		pb_lease *lg;

		snprintf(sys, sizeof(sys), "%s", root);
		setenv("PINBROKER_SYS_ROOT", sys, 1);
		ck_assert_int_eq(pb_gpu_numa_node("0000:86:00.0"), 1);
		ck_assert_int_eq(pb_gpu_numa_node("0000:3B:00.0"), 0);
		ck_assert_int_eq(pb_gpu_numa_node("0000:99:00.0"), -1);
		ck_assert_int_eq(pb_acquire(c, 2 * MiB, &g, &lg), 0);
		ck_assert_int_eq(pb_lease_numa_node(lg, &misplaced), 0);
		ck_assert_int_eq(misplaced, 1); /* asked for node 1, through its GPU */
		pb_release(c, lg);
		unsetenv("PINBROKER_SYS_ROOT");
	}
	pb_release(c, l);
	pb_release(c, l0);
	pb_disconnect(c);
}
END_TEST

/* Acquire 2 MiB with o: the lease must be placed as asked (not misplaced), by the library and in the daemon's rows. */
static void expect_placed_lease(pb_client *c, const struct pb_acquire_opts *o)
{
	struct pb_status *s;
	int misplaced = -1;
	pb_lease *l;

	ck_assert_int_eq(pb_acquire(c, 2 * MiB, o, &l), 0);
	ck_assert_int_eq(pb_lease_numa_node(l, &misplaced), 0);
	ck_assert_int_eq(misplaced, 0);
	s = status(c);
	ck_assert_int_eq(itest_lease_row(s, pb_lease_id(l))->misplaced, 0);
	pb_status_free(s);
	pb_release(c, l);
}

/*
 * The library asks the driver for a GPU's node first (CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID), and sysfs only when the
 * driver cannot say. The stand-in libcuda.so.1 is loaded before the library looks for one (it finds it by its
 * soname); its one GPU is 0000:86:00.0, on node 1 in the fixture sysfs; the attribute answers
 * STUB_CUDA_HOST_NUMA_ID, or is refused (a driver before CUDA 12.2) when that is unset.
 */
START_TEST(test_gpu_node_comes_from_the_driver_else_sysfs)
{
	struct pb_acquire_opts g = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_GPU, .gpu = "0" };
	struct pb_acquire_opts cur = { .flags = 0 };
	int (*retain)(void **, int), (*push)(void *);
	void *h, *ctx = NULL;
	pb_client *c;
	pb_lease *l;
	int misplaced = -1;

	h = dlopen(STUB_DIR "/libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	ck_assert_ptr_nonnull(h);
	setenv("PINBROKER_SYS_ROOT", root, 1);
	setenv("STUB_CUDA_PCI_BUS_ID", "0000:86:00.0", 1);
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);

	/* The attribute unsupported: sysfs, through the bus id the driver gives (ordinal, bus id alike). */
	unsetenv("STUB_CUDA_HOST_NUMA_ID");
	ck_assert_int_eq(pb_gpu_numa_node("0"), 1);
	ck_assert_int_eq(pb_gpu_numa_node("86:00.0"), 1);
	ck_assert_int_eq(pb_acquire(c, 2 * MiB, &g, &l), 0);
	ck_assert_int_eq(pb_lease_numa_node(l, &misplaced), 0);
	ck_assert_int_eq(misplaced, 1); /* asked of node 1, which this kernel does not have */
	pb_release(c, l);
	/* -1 from the driver (no NUMA, it says): sysfs still. */
	setenv("STUB_CUDA_HOST_NUMA_ID", "-1", 1);
	ck_assert_int_eq(pb_gpu_numa_node("0"), 1);

	/* The driver says node 0, against sysfs's 1: the driver wins, and the lease lands where it asked. */
	setenv("STUB_CUDA_HOST_NUMA_ID", "0", 1);
	ck_assert_int_eq(pb_gpu_numa_node("0"), 0);
	ck_assert_int_eq(pb_gpu_numa_node("0000:86:00.0"), 0);
	expect_placed_lease(c, &g);

	/* With no GPU named, the current device's node: the driver's 0 (the default a CUDA job gets). */
	*(void **)&retain = dlsym(h, "cuDevicePrimaryCtxRetain");
	*(void **)&push = dlsym(h, "cuCtxPushCurrent_v2");
	ck_assert_ptr_nonnull(retain);
	ck_assert_ptr_nonnull(push);
	ck_assert_int_eq(retain(&ctx, 0), 0);
	ck_assert_int_eq(push(ctx), 0);
	expect_placed_lease(c, &cur);
	pb_disconnect(c);
	unsetenv("STUB_CUDA_HOST_NUMA_ID");
	unsetenv("PINBROKER_SYS_ROOT");
}
END_TEST

START_TEST(test_four_fixture_nodes_split_the_prewarm_by_gpus_and_report_each_node)
{
	const struct pb_node_info *nd[4];
	struct pb_status *s;
	pb_client *c;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	s = status(c);
	ck_assert_uint_eq(s->n_nodes, 4);
	for (int i = 0; i < 4; i++) {
		nd[i] = node_row(s, i);
		ck_assert_ptr_nonnull(nd[i]);
	}
	/* GPUs per node as the fixture says; the one whose numa_node is -1 counts nowhere. */
	ck_assert_uint_eq(nd[0]->gpus, 2);
	ck_assert_uint_eq(nd[1]->gpus, 0);
	ck_assert_uint_eq(nd[2]->gpus, 0);
	ck_assert_uint_eq(nd[3]->gpus, 2);
	ck_assert_uint_eq(nd[1]->mem_free_bytes, 30000000ull * 1024);
	ck_assert_uint_eq(nd[2]->mem_free_bytes, 0);
	/*
	 * 64 MiB split 2:0:0:2 by GPUs: node 0's 32 MiB is on node 0; node 3's was asked of a kernel with one node, so
	 * it landed on node 0 too and is counted there, misplaced. Nodes 1-3 hold nothing.
	 */
	ck_assert_uint_eq(nd[0]->idle_bytes, 64 * MiB);
	ck_assert_uint_eq(nd[0]->misplaced_bytes, 32 * MiB);
	for (int i = 1; i < 4; i++)
		ck_assert_uint_eq(nd[i]->idle_bytes + nd[i]->lent_bytes + nd[i]->misplaced_bytes, 0);
	pb_status_free(s);
	itest_pinctl_says(&d, 0, "status", "node 3: 0 B idle, 0 B lent, 0 B misplaced; 2 GPUs",
			  "node 1: 0 B idle, 0 B lent, 0 B misplaced; 0 GPUs", NULL);
	/* The library reads the same fixture for a GPU's node: 0000:c2:00.0 is on node 3, e1 on none. */
	setenv("PINBROKER_SYS_ROOT", root, 1);
	ck_assert_int_eq(pb_gpu_numa_node("c2:00.0"), 3);
	ck_assert_int_eq(pb_gpu_numa_node("0000:19:00.0"), 0);
	ck_assert_int_eq(pb_gpu_numa_node("0000:e1:00.0"), -1);
	unsetenv("PINBROKER_SYS_ROOT");
	pb_disconnect(c);
}
END_TEST

/*
 * Node 2 is full (the fixture's MemFree 0) and has no idle chunks: a lease for it falls back to the idle chunks
 * of the nodes that stand in for it, nearest first (3, which has none here, then 0), with nothing made, and
 * says it is misplaced. Node 1 has room: a lease for it gets fresh chunks placed for node 1 (which this
 * kernel puts on node 0: misplaced too, and counted as misplaced chunks, unlike the fallen-back ones).
 */
START_TEST(test_a_full_node_falls_back_to_the_nearest_idle_chunks_and_says_so)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NUMA_NODE, .numa_node = 2 };
	const struct pb_node_info *n0;
	struct pb_status *s;
	pb_client *c;
	pb_lease *l2, *l1;
	int misplaced = 0;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	s = status(c);
	n0 = node_row(s, 0);
	ck_assert_uint_eq(n0->idle_bytes, 64 * MiB);
	ck_assert_uint_eq(n0->misplaced_bytes, 0);
	pb_status_free(s);

	ck_assert_int_eq(pb_acquire(c, 8 * MiB, &o, &l2), 0);
	ck_assert_int_eq(pb_lease_numa_node(l2, &misplaced), 0); /* where it is */
	ck_assert_int_eq(misplaced, 1);
	s = status(c);
	n0 = node_row(s, 0);
	ck_assert_uint_eq(n0->lent_bytes, 8 * MiB);
	ck_assert_uint_eq(n0->idle_bytes, 56 * MiB);
	ck_assert_uint_eq(n0->misplaced_bytes, 0); /* node 0's own chunks, lent: nothing was made for node 2 */
	ck_assert_uint_eq(s->pool_bytes, 64 * MiB);
	ck_assert_int_eq(itest_lease_row(s, pb_lease_id(l2))->numa_node, 0);
	ck_assert_int_eq(itest_lease_row(s, pb_lease_id(l2))->misplaced, 1);
	pb_status_free(s);
	itest_pinctl_says(&d, 0, "leases", "misplaced: placed for a NUMA node that was full", NULL);

	o.numa_node = 1;
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &o, &l1), 0);
	ck_assert_int_eq(pb_lease_numa_node(l1, &misplaced), 0);
	ck_assert_int_eq(misplaced, 1);
	s = status(c);
	ck_assert_uint_eq(node_row(s, 0)->misplaced_bytes, 4 * MiB); /* fresh chunks made for node 1 */
	pb_status_free(s);
	pb_release(c, l1);
	pb_release(c, l2);
	pb_disconnect(c);
}
END_TEST

START_TEST(test_bad_numa_prewarm_names_the_node)
{
	char *out = NULL, cmd[512];

	snprintf(cmd, sizeof(cmd), "%s --config /dev/null --socket /tmp/pb-numa-bad.sock --numa-prewarm 5:1G 2>&1",
		 PINBROKERD_PATH);
	ck_assert_int_ne(run_capture(cmd, &out), 0);
	ck_assert_ptr_nonnull(strstr(out, "numa-prewarm = 5:1G: no such NUMA node"));
	free(out);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-numa");

	CHECK_CASE(s, "real-kernel", start, stop, 60, test_real_kernel_leases_land_on_the_node_asked,
		   test_numa_no_places_nothing);
	CHECK_CASE(s, "fixture", start_fixture, stop, 60,
		   test_fixture_nodes_split_the_prewarm_and_a_full_node_falls_back,
		   test_gpu_node_comes_from_the_driver_else_sysfs);
	CHECK_CASE(s, "fixture-4-nodes", start_fixture4_gpus, stop, 60,
		   test_four_fixture_nodes_split_the_prewarm_by_gpus_and_report_each_node);
	CHECK_CASE(s, "fixture-full-node", start_fixture4_node0, stop, 60,
		   test_a_full_node_falls_back_to_the_nearest_idle_chunks_and_says_so);
	CHECK_CASE(s, "config", NULL, NULL, 0, test_bad_numa_prewarm_names_the_node);
	return s;
}

CHECK_MAIN(suite)

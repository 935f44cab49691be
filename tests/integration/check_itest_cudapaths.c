/* SPDX-License-Identifier: MIT */
/*
 * Integration: host memory that the CUDA driver allocates and owns itself, under libpinbroker-preload.so and the
 * real pinbrokerd (issue 26, item 3): VMM allocations with a host location, host-located memory pools (CUDA 13's
 * default host pool too) and graph memory nodes with a host location. An unmodified program
 * (tests/preload/cudapaths.c) reaches the stand-in libcuda.so.1 four ways: linked to it, dlopen() + dlsym(),
 * dlopen() + cuGetProcAddress, and cuGetProcAddress asking for the per-thread default stream's versions. At each
 * step the broker's figures (status: registered and unbrokered bytes) are compared with what the issue says they
 * must be, and with what the stand-in driver itself holds.
 */
#define _GNU_SOURCE
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "itest.h"
#include "pinbroker.h"

#define MiB (1024ull * 1024ull)

static struct daemon d;

/* The four ways in: the program, and how it finds the driver's functions. */
static const char *const bins[] = { CUDAPATHS_LINKED, CUDAPATHS_DL, CUDAPATHS_DL, CUDAPATHS_DL };
static const char *const ways[] = { "link", "dlsym", "gpa", "gpa-ptsz" };
#define N_WAYS ((int)(sizeof(ways) / sizeof(ways[0])))

static void start(void)
{
	daemon_start(&d, NULL);
}

/* A budget smaller than the 32 MiB the refusal tests ask. */
static void start_small(void)
{
	daemon_start(&d, ITEST_ARGS("--budget", "16M", "--prewarm", "4M"));
}

static void stop(void)
{
	ck_assert_int_eq(daemon_stop(&d), 0);
}

struct prog {
	pid_t pid;
	int in;
	FILE *out;
};

/* Run bin WAY PATH SIZE [MAX] under the interposer (preload) with fallback policy (NULL: the default). */
static void spawn(struct prog *p, int way, bool preload, const char *policy, const char *path, const char *size,
		  const char *max)
{
	int in[2], out[2];

	p->pid = itest_fork_piped(in, out);
	if (p->pid == 0) {
		char asan[512];

		dup2(in[0], 0);
		dup2(out[1], 1);
		close(in[1]);
		close(out[0]);
		setenv("LD_LIBRARY_PATH", STUB_DIR, 1);
		setenv("PINBROKER_SOCKET", d.socket, 1);
		setenv("PINBROKER_LABEL", "cudapaths", 1);
		if (preload)
			setenv("LD_PRELOAD", PRELOAD_LIB, 1);
		if (policy)
			setenv("PINBROKER_PRELOAD_FALLBACK", policy, 1);
		snprintf(asan, sizeof(asan), "%s%sverify_asan_link_order=0", getenv("ASAN_OPTIONS") ?: "",
			 getenv("ASAN_OPTIONS") ? ":" : "");
		setenv("ASAN_OPTIONS", asan, 1);
		execl(bins[way], bins[way], ways[way], path, size, max, (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	p->in = in[1];
	p->out = fdopen(out[0], "r");
	ck_assert_ptr_nonnull(p->out);
}

/* The program's next step line: its name must be want; returns its r= (the CUresult). */
static int next_step(struct prog *p, const char *want, char *line, size_t len)
{
	const char *r;

	ck_assert_msg(fgets(line, (int)len, p->out) != NULL, "%s: the program printed nothing", want);
	line[strcspn(line, "\n")] = 0;
	ck_assert_msg(strncmp(line, want, strlen(want)) == 0 && line[strlen(want)] == ' ', "wanted %s, got \"%s\"",
		      want, line);
	r = strstr(line, " r=");
	ck_assert_ptr_nonnull(r);
	return atoi(r + 3);
}

/* Let the program take its next step. */
static void go_on(struct prog *p)
{
	ck_assert_int_eq(write(p->in, "\n", 1), 1);
}

static unsigned long long field(const char *line, const char *key)
{
	const char *at = strstr(line, key);

	ck_assert_msg(at != NULL, "no %s in \"%s\"", key, line);
	return strtoull(at + strlen(key), NULL, 10);
}

/* Close its stdin (it takes its remaining steps), read what it prints, and return its exit status. */
static int finish(struct prog *p)
{
	char buf[256];

	close(p->in);
	while (fgets(buf, sizeof(buf), p->out))
		;
	fclose(p->out);
	return itest_wait_exit(p->pid);
}

/* Wait (5 s at most) for the broker to show registered and unbrokered bytes; fail with what it shows. */
static void expect_broker(const char *when, uint64_t registered, uint64_t unbrokered)
{
	uint64_t reg = 0, unb = 0;

	for (int i = 0; i < 100; i++) {
		struct pb_status *s = itest_status(d.socket);

		reg = s->registered_bytes;
		unb = s->unbrokered_bytes;
		pb_status_free(s);
		if (reg == registered && unb == unbrokered)
			return;
		usleep(50 * 1000);
	}
	ck_abort_msg("%s: the broker shows %llu registered, %llu unbrokered bytes; wanted %llu and %llu", when,
		     (unsigned long long)reg, (unsigned long long)unb, (unsigned long long)registered,
		     (unsigned long long)unbrokered);
}

/* One step: its name, CUresult 0, the broker's charge equal to want and to the driver's own figure (key). */
static void charged_step(struct prog *p, int way, const char *name, const char *key, uint64_t want)
{
	char line[256], when[64];

	ck_assert_int_eq(next_step(p, name, line, sizeof(line)), 0);
	ck_assert_uint_eq(field(line, key), want);
	snprintf(when, sizeof(when), "%s (%s)", name, ways[way]);
	expect_broker(when, want, 0);
}

START_TEST(test_vmm_host_memory_is_charged_until_released_and_unmapped)
{
	struct prog p;

	spawn(&p, _i, true, NULL, "vmm", "8388608", NULL);
	charged_step(&p, _i, "created", "vmm=", 8 * MiB);
	go_on(&p);
	/* Released but still mapped: the driver keeps the memory, so the charge stays. */
	charged_step(&p, _i, "released", "vmm=", 8 * MiB);
	go_on(&p);
	charged_step(&p, _i, "unmapped", "vmm=", 0);
	ck_assert_int_eq(finish(&p), 0);
}
END_TEST

/*
 * The handle released on one thread while another maps it (the stand-in driver sleeps 500 ms inside cuMemMap,
 * the release comes 100 ms in): the mapping keeps the memory, so the charge must stay until it is unmapped. The
 * interposer once took its lock only after the driver's call, so the release freed the record first and the map
 * then found no handle: pinned, charged to no one.
 */
START_TEST(test_a_release_racing_a_map_keeps_the_charge)
{
	struct prog p;

	setenv("STUB_CUDA_MAP_SLEEP_MS", "500", 1);
	spawn(&p, _i, true, NULL, "vmm-race", "8388608", NULL);
	unsetenv("STUB_CUDA_MAP_SLEEP_MS");
	charged_step(&p, _i, "raced", "vmm=", 8 * MiB);
	go_on(&p);
	charged_step(&p, _i, "unmapped", "vmm=", 0);
	ck_assert_int_eq(finish(&p), 0);
}
END_TEST

/* 3 MiB asked twice of a pool that reserves in 2 MiB steps: charged what the pool reserves, step by step. */
START_TEST(test_a_host_pool_is_charged_what_it_reserves_until_trimmed_and_destroyed)
{
	struct prog p;

	spawn(&p, _i, true, NULL, "pool", "3145728", NULL);
	charged_step(&p, _i, "created", "pool=", 4 * MiB);
	go_on(&p);
	charged_step(&p, _i, "alloc2", "pool=", 6 * MiB);
	go_on(&p);
	/* Freed memory the pool keeps stays charged... */
	charged_step(&p, _i, "freed", "pool=", 6 * MiB);
	go_on(&p);
	/* ...until the pool lets it go. */
	charged_step(&p, _i, "trimmed", "pool=", 4 * MiB);
	go_on(&p);
	/* Destroyed with an allocation live: the driver frees it with that allocation. */
	charged_step(&p, _i, "destroyed", "pool=", 4 * MiB);
	go_on(&p);
	charged_step(&p, _i, "gone", "pool=", 0);
	ck_assert_int_eq(finish(&p), 0);
}
END_TEST

START_TEST(test_the_default_host_pool_is_charged_too)
{
	struct prog p;

	spawn(&p, _i, true, NULL, "default-pool", "3145728", NULL);
	charged_step(&p, _i, "created", "pool=", 4 * MiB);
	go_on(&p);
	charged_step(&p, _i, "alloc2", "pool=", 6 * MiB);
	go_on(&p);
	charged_step(&p, _i, "freed", "pool=", 6 * MiB);
	go_on(&p);
	charged_step(&p, _i, "trimmed", "pool=", 4 * MiB);
	go_on(&p);
	charged_step(&p, _i, "done", "pool=", 0);
	ck_assert_int_eq(finish(&p), 0);
}
END_TEST

/* maxSize 4 MiB: the second 3 MiB is the driver's refusal, and nothing more is charged. */
START_TEST(test_a_pool_max_size_bounds_its_charge)
{
	struct prog p;
	char line[256];

	spawn(&p, _i, true, NULL, "pool", "3145728", "4194304");
	charged_step(&p, _i, "created", "pool=", 4 * MiB);
	go_on(&p);
	ck_assert_int_eq(next_step(&p, "alloc2", line, sizeof(line)), 2); /* CUDA_ERROR_OUT_OF_MEMORY */
	expect_broker("alloc2 past maxSize", 4 * MiB, 0);
	ck_assert_int_eq(finish(&p), 3);
	expect_broker("exited", 0, 0);
}
END_TEST

START_TEST(test_graph_memory_nodes_with_a_host_location_are_reported_as_unbrokered)
{
	struct prog p;
	char line[256];

	spawn(&p, _i, true, NULL, "graph", "1048576", NULL);
	ck_assert_int_eq(next_step(&p, "created", line, sizeof(line)), 0);
	ck_assert_uint_eq(field(line, "graph="), 2 * MiB);
	expect_broker("two host memory nodes", 0, 2 * MiB);
	go_on(&p);
	ck_assert_int_eq(next_step(&p, "destroyed", line, sizeof(line)), 0);
	expect_broker("graph destroyed", 0, 0);
	ck_assert_int_eq(finish(&p), 0);
}
END_TEST

/* The control: without the interposer the driver pins the same, and the broker sees nothing. */
START_TEST(test_without_the_interposer_the_broker_sees_none_of_it)
{
	struct prog p;
	char line[256];

	spawn(&p, 0, false, NULL, "vmm", "8388608", NULL);
	ck_assert_int_eq(next_step(&p, "created", line, sizeof(line)), 0);
	ck_assert_uint_eq(field(line, "vmm="), 8 * MiB);
	expect_broker("unseen", 0, 0);
	ck_assert_int_eq(finish(&p), 0);
}
END_TEST

/* Budget 16 MiB, 32 MiB asked: error refuses before the driver pins; cuda lets it pin, reported as unbrokered. */
START_TEST(test_over_the_budget_the_fallback_decides)
{
	static const char *const paths[] = { "vmm", "pool", "default-pool" };
	static const char *const keys[] = { "vmm=", "pool=", "pool=" };
	struct prog p;
	char line[256];

	for (size_t k = 0; k < sizeof(paths) / sizeof(paths[0]); k++) {
		spawn(&p, _i, true, "error", paths[k], "33554432", NULL);
		ck_assert_int_eq(next_step(&p, "created", line, sizeof(line)), 2);
		ck_assert_uint_eq(field(line, keys[k]), 0);
		ck_assert_int_eq(finish(&p), 3);
		expect_broker("refused", 0, 0);

		spawn(&p, _i, true, "cuda", paths[k], "33554432", NULL);
		ck_assert_int_eq(next_step(&p, "created", line, sizeof(line)), 0);
		ck_assert_uint_eq(field(line, keys[k]), 32 * MiB);
		expect_broker("pinned by the driver", 0, 32 * MiB);
		ck_assert_int_eq(finish(&p), 0);
		expect_broker("freed", 0, 0);
	}
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-cudapaths");
	TCase *t = tcase_create("charged"), *small = tcase_create("fallback");

	tcase_add_checked_fixture(t, start, stop);
	tcase_set_timeout(t, 120);
	tcase_add_loop_test(t, test_vmm_host_memory_is_charged_until_released_and_unmapped, 0, N_WAYS);
	tcase_add_loop_test(t, test_a_release_racing_a_map_keeps_the_charge, 0, N_WAYS);
	tcase_add_loop_test(t, test_a_host_pool_is_charged_what_it_reserves_until_trimmed_and_destroyed, 0, N_WAYS);
	tcase_add_loop_test(t, test_the_default_host_pool_is_charged_too, 0, N_WAYS);
	tcase_add_loop_test(t, test_a_pool_max_size_bounds_its_charge, 0, N_WAYS);
	tcase_add_loop_test(t, test_graph_memory_nodes_with_a_host_location_are_reported_as_unbrokered, 0, N_WAYS);
	tcase_add_test(t, test_without_the_interposer_the_broker_sees_none_of_it);
	suite_add_tcase(s, t);

	tcase_add_checked_fixture(small, start_small, stop);
	tcase_set_timeout(small, 120);
	tcase_add_loop_test(small, test_over_the_budget_the_fallback_decides, 0, N_WAYS);
	suite_add_tcase(s, small);
	return s;
}

CHECK_MAIN(suite)

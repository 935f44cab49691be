/* SPDX-License-Identifier: MIT */
/*
 * Integration: host memory that the CUDA driver allocates and owns itself, under libpinbroker-preload.so and the
 * real pinbrokerd (issue 26, item 3): VMM allocations with a host location, host-located memory pools (CUDA 13's
 * default host pool too) and graph memory nodes with a host location. An unmodified program
 * (tests/preload/cudapaths.c) reaches the stand-in libcuda.so.1 four ways: linked to it, dlopen() + dlsym(),
 * dlopen() + cuGetProcAddress, and cuGetProcAddress asking for the per-thread default stream's versions. Each case
 * is a table of the program's steps (struct path_run), which walk() takes one by one: at each step the broker's
 * figures (status: registered and unbrokered bytes) are compared with what the issue says they must be, and with
 * what the stand-in driver itself holds.
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

ITEST_FIXTURE_START(start, d, NULL)
/* A budget smaller than the 32 MiB the refusal tests ask. */
ITEST_FIXTURE_START(start_small, d, ITEST_ARGS("--budget", "16M", "--prewarm", "4M"))
ITEST_FIXTURE_STOP(stop, d)

/*
 * One step of the program and what it must show then: the CUresult it prints, the stand-in driver's own figure for
 * the path (vmm=, pool= or graph=), and the broker's (pinctl status: registered and unbrokered bytes).
 */
struct step {
	const char *name;
	int r;
	uint64_t driver;
	uint64_t registered, unbrokered;
};

/* A run of the program: its arguments, how it runs, and every step it must take, in order. */
struct path_run {
	const char *what;              /* the behaviour, for messages */
	const char *path, *size, *max; /* cudapaths PATH SIZE [MAX] */
	bool bare;                     /* without the interposer (the control) */
	const char *policy;            /* PINBROKER_PRELOAD_FALLBACK; NULL: the default */
	const char *env;               /* NAME=VALUE for the program too, or NULL */
	int exit_status;               /* once its stdin is closed after the last step */
	struct step steps[8];          /* up to the first without a name */
};

/* The program's environment as run says (in its child): under the interposer or not, its fallback policy. */
static void set_env(const void *arg)
{
	const struct path_run *run = arg;

	setenv("LD_LIBRARY_PATH", STUB_DIR, 1);
	setenv("PINBROKER_SOCKET", d.socket, 1);
	setenv("PINBROKER_LABEL", "cudapaths", 1);
	if (!run->bare)
		setenv("LD_PRELOAD", PRELOAD_LIB, 1);
	if (run->policy)
		setenv("PINBROKER_PRELOAD_FALLBACK", run->policy, 1);
	if (run->env)
		putenv((char *)run->env);
}

/* Run bin WAY PATH SIZE [MAX] as run says. */
static void spawn(struct itest_prog *p, int way, const struct path_run *run)
{
	const char *argv[] = { bins[way], ways[way], run->path, run->size, run->max, NULL };

	itest_prog_start(p, argv, false, set_env, run);
}

/* The program's next step line: its name must be want; returns its r= (the CUresult). */
static int next_step(struct itest_prog *p, const char *want, char *line, size_t len)
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
static void go_on(struct itest_prog *p)
{
	ck_assert_int_eq(write(p->in, "\n", 1), 1);
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

/* The stand-in driver's figure for a path's host memory. */
static const char *driver_key(const char *path)
{
	if (strncmp(path, "vmm", 3) == 0)
		return "vmm=";
	return strcmp(path, "graph") == 0 ? "graph=" : "pool=";
}

/* For messages: "[WHAT: ]PATH STEP (WAY[, bare][, fallback POLICY])". */
static void describe(char *buf, size_t len, int way, const struct path_run *run, const char *step)
{
	snprintf(buf, len, "%s%s%s %s (%s%s%s%s)", run->what ?: "", run->what ? ": " : "", run->path, step, ways[way],
		 run->bare ? ", bare" : "", run->policy ? ", fallback " : "", run->policy ?: "");
}

/*
 * Run the program as run says, one way in, and make every check of its table: at each step its name, its CUresult,
 * the driver's figure and the broker's; then its exit status once its stdin is closed, and nothing left charged or
 * reported by the broker.
 */
static void walk(int way, const struct path_run *run)
{
	const char *key = driver_key(run->path);
	struct itest_prog p;
	char line[256], when[256];
	int r;

	spawn(&p, way, run);
	for (const struct step *s = run->steps; s->name; s++) {
		if (s != run->steps)
			go_on(&p);
		describe(when, sizeof(when), way, run, s->name);
		r = next_step(&p, s->name, line, sizeof(line));
		ck_assert_msg(r == s->r, "%s: \"%s\", wanted r=%d", when, line, s->r);
		ck_assert_msg(itest_prog_field(line, key) == s->driver, "%s: \"%s\", wanted %s%llu", when, line, key,
			      (unsigned long long)s->driver);
		expect_broker(when, s->registered, s->unbrokered);
	}
	describe(when, sizeof(when), way, run, "exited");
	r = itest_prog_finish(&p, NULL, 0);
	ck_assert_msg(r == run->exit_status, "%s: exit status %d, wanted %d", when, r, run->exit_status);
	expect_broker(when, 0, 0);
}

/*
 * The tables: each step's name, CUresult, the driver's figure, and the broker's registered and unbrokered bytes.
 * The VMM and pool steps are registrations of what the driver holds: charged that, nothing unbrokered.
 */
static const struct path_run vmm = {
	"vmm host memory is charged until released and unmapped",
	"vmm", "8388608", .steps = {
		{ "created", 0, 8 * MiB, 8 * MiB, 0 },
		/* Released but still mapped: the driver keeps the memory, so the charge stays. */
		{ "released", 0, 8 * MiB, 8 * MiB, 0 },
		{ "unmapped", 0, 0, 0, 0 },
	},
};

/*
 * The handle released on one thread while another maps it (the stand-in driver sleeps 500 ms inside cuMemMap,
 * the release comes 100 ms in): the mapping keeps the memory, so the charge must stay until it is unmapped. The
 * interposer once took its lock only after the driver's call, so the release freed the record first and the map
 * then found no handle: pinned, charged to no one.
 */
static const struct path_run vmm_race = {
	"a release racing a map keeps the charge",
	"vmm-race", "8388608", .env = "STUB_CUDA_MAP_SLEEP_MS=500", .steps = {
		{ "raced", 0, 8 * MiB, 8 * MiB, 0 },
		{ "unmapped", 0, 0, 0, 0 },
	},
};

/* 3 MiB asked twice of a pool that reserves in 2 MiB steps: charged what the pool reserves, step by step. */
static const struct path_run pool = {
	"a host pool is charged what it reserves until trimmed and destroyed",
	"pool", "3145728", .steps = {
		{ "created", 0, 4 * MiB, 4 * MiB, 0 },
		{ "alloc2", 0, 6 * MiB, 6 * MiB, 0 },
		/* Freed memory the pool keeps stays charged... */
		{ "freed", 0, 6 * MiB, 6 * MiB, 0 },
		/* ...until the pool lets it go. */
		{ "trimmed", 0, 4 * MiB, 4 * MiB, 0 },
		/* Destroyed with an allocation live: the driver frees it with that allocation. */
		{ "destroyed", 0, 4 * MiB, 4 * MiB, 0 },
		{ "gone", 0, 0, 0, 0 },
	},
};

static const struct path_run default_pool = {
	"the default host pool is charged too",
	"default-pool", "3145728", .steps = {
		{ "created", 0, 4 * MiB, 4 * MiB, 0 },
		{ "alloc2", 0, 6 * MiB, 6 * MiB, 0 },
		{ "freed", 0, 6 * MiB, 6 * MiB, 0 },
		{ "trimmed", 0, 4 * MiB, 4 * MiB, 0 },
		{ "done", 0, 0, 0, 0 },
	},
};

/* maxSize 4 MiB: the second 3 MiB is the driver's refusal (CUDA_ERROR_OUT_OF_MEMORY), and nothing more is charged. */
static const struct path_run pool_max = {
	"a pool max size bounds its charge",
	"pool", "3145728", "4194304", .exit_status = 3, .steps = {
		{ "created", 0, 4 * MiB, 4 * MiB, 0 },
		{ "alloc2", 2, 4 * MiB, 4 * MiB, 0 },
	},
};

/*
 * 32 device frees on 8 threads, each sleeping 100 ms in the stand-in driver, while a 3 MiB host-pool allocation
 * lives and another 3 MiB comes and goes 4 times on the main thread: the pool's charge is exactly what it reserves
 * (6 MiB: it keeps what was freed), and the device frees ran side by side (FREES_SERIALISED, r=1000, when they took
 * half of 3.2 s or more). The interposer once took its lock around every free, device ones too, once a host pool
 * was seen.
 */
static const struct path_run free_race = {
	"device frees beside a host pool run side by side and keep its charge",
	"free-race", "3145728", .env = "STUB_CUDA_FREE_SLEEP_MS=100", .steps = {
		{ "created", 0, 4 * MiB, 4 * MiB, 0 },
		{ "raced", 0, 6 * MiB, 6 * MiB, 0 },
		{ "done", 0, 0, 0, 0 },
	},
};

/*
 * 48 device VMM calls (cuMemMap, cuMemUnmap, cuMemRelease: PyTorch's expandable segments) on 8 threads, each
 * sleeping 50 ms in the stand-in driver, while an 8 MiB host VMM allocation lives mapped and another comes and goes
 * twice on the main thread: the host charge is exactly the live allocation's, and the device calls ran side by side
 * (VMM_SERIALISED, r=1001, when they took half of 2.4 s or more). The interposer once took its lock around every
 * VMM call, device ones too, once a host VMM allocation existed.
 */
static const struct path_run vmm_device_race = {
	"device vmm beside a host vmm allocation runs side by side and keeps its charge",
	"vmm-device-race", "8388608", .env = "STUB_CUDA_VMM_SLEEP_MS=50", .steps = {
		{ "created", 0, 8 * MiB, 8 * MiB, 0 },
		{ "raced", 0, 8 * MiB, 8 * MiB, 0 },
		{ "done", 0, 0, 0, 0 },
	},
};

/* Two host memory nodes of 1 MiB: reported as unbrokered while their graph lives. */
static const struct path_run graph = {
	"graph memory nodes with a host location are reported as unbrokered",
	"graph", "1048576", .steps = {
		{ "created", 0, 2 * MiB, 0, 2 * MiB },
		{ "destroyed", 0, 0, 0, 0 },
	},
};

/* The control: without the interposer the driver pins the same, and the broker sees nothing. */
static const struct path_run vmm_bare = {
	"without the interposer the broker sees none of it",
	"vmm", "8388608", .bare = true, .steps = {
		{ "created", 0, 8 * MiB, 0, 0 },
	},
};

/* The runs under the default budget, each taken all four ways in. */
static const struct path_run *const charged[] = {
	&vmm, &vmm_race, &pool, &default_pool, &pool_max, &free_race, &vmm_device_race, &graph,
};
#define N_CHARGED ((int)(sizeof(charged) / sizeof(charged[0])))

/* Row _i: run _i / N_WAYS of charged, way _i % N_WAYS. */
START_TEST(test_driver_host_memory_is_charged_as_each_path_says)
{
	walk(_i % N_WAYS, charged[_i / N_WAYS]);
}
END_TEST

START_TEST(test_without_the_interposer_the_broker_sees_none_of_it)
{
	walk(0, &vmm_bare);
}
END_TEST

/*
 * Budget 16 MiB, 32 MiB asked: error refuses before the driver pins (CUDA_ERROR_OUT_OF_MEMORY; the program then
 * exits 3); cuda lets it pin, reported as unbrokered.
 */
#define OVER "over the budget the fallback decides"
static const struct path_run over_budget[] = {
	{ OVER, "vmm", "33554432", .policy = "error", .exit_status = 3, .steps = { { "created", 2, 0, 0, 0 } } },
	{ OVER, "vmm", "33554432", .policy = "cuda", .steps = { { "created", 0, 32 * MiB, 0, 32 * MiB } } },
	{ OVER, "pool", "33554432", .policy = "error", .exit_status = 3, .steps = { { "created", 2, 0, 0, 0 } } },
	{ OVER, "pool", "33554432", .policy = "cuda", .steps = { { "created", 0, 32 * MiB, 0, 32 * MiB } } },
	{ OVER, "default-pool", "33554432", .policy = "error", .exit_status = 3,
	  .steps = { { "created", 2, 0, 0, 0 } } },
	{ OVER, "default-pool", "33554432", .policy = "cuda", .steps = { { "created", 0, 32 * MiB, 0, 32 * MiB } } },
};

START_TEST(test_over_the_budget_the_fallback_decides)
{
	for (size_t k = 0; k < sizeof(over_budget) / sizeof(over_budget[0]); k++)
		walk(_i, &over_budget[k]);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-cudapaths");
	TCase *t = CHECK_CASE(s, "charged", start, stop, 120, test_without_the_interposer_the_broker_sees_none_of_it);

	tcase_add_loop_test(t, test_driver_host_memory_is_charged_as_each_path_says, 0, N_CHARGED * N_WAYS);
	CHECK_LOOP_CASE(s, "fallback", start_small, stop, 120, N_WAYS, test_over_the_budget_the_fallback_decides);
	return s;
}

CHECK_MAIN(suite)

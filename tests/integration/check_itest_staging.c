/* SPDX-License-Identifier: MIT */
/*
 * Integration: staged copies (issue 39) end to end on the stand-in driver. An unmodified program
 * (tests/preload/copy_target.c) copies between ordinary memory and the stand-in device under
 * libpinbroker-preload.so with the real pinbrokerd, reaching its copies every way a CUDA program does: the
 * driver's symbols and their per-thread-stream forms, dlsym, cuGetProcAddress (with and without the per-thread
 * flag), the runtime as a shared library, dlsym of the runtime, and the runtime compiled in. The stand-in driver
 * runs its streams asynchronously and logs what each copy's host side was, so the program can tell a staged
 * copy (the driver saw pinned memory only) from one that reached the driver as made.
 *
 * Small settings make every case cross slot and ring boundaries: a 64 KiB slot, a 256 KiB ring, a 16 KiB
 * threshold. The tcase "stand-in" runs the same program bare (no interposer, no daemon): it checks the stand-in
 * driver itself, and that the staged expectations fail there (the checks can fail).
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"
#include "pinbroker.h"
#include "check_main.h"

#define RING_BYTES (256u * 1024u)

static struct daemon d;

/* Every way in: the program built that way, and the argument naming it. */
static const struct way {
	const char *name, *bin, *arg;
} ways[] = {
	{ "driver symbols", COPY_DRIVER, "driver" },
	{ "driver _ptds/_ptsz symbols", COPY_DRIVER, "driver-ptds" },
	{ "dlsym on libcuda", COPY_DRIVER, "dlsym" },
	{ "cuGetProcAddress", COPY_DRIVER, "gpa" },
	{ "cuGetProcAddress per-thread", COPY_DRIVER, "gpa-ptds" },
	{ "shared runtime", COPY_SHARED, "runtime" },
	{ "shared runtime _ptds/_ptsz", COPY_SHARED, "runtime-ptds" },
	{ "dlsym of the runtime", COPY_SHARED, "dlsym-runtime" },
	{ "static runtime", COPY_STATIC, "runtime" },
	{ "static runtime _ptds/_ptsz", COPY_STATIC, "runtime-ptds" },
};
#define N_WAYS ((int)(sizeof(ways) / sizeof(ways[0])))

ITEST_FIXTURE_START(start, d, NULL)

ITEST_FIXTURE_STOP(stop, d)

struct run_opts {
	bool preload;         /* under the interposer, with the test daemon */
	const char *expect;   /* PB_EXPECT: staged (the default) or driver */
	const char *staging;  /* PINBROKER_STAGING, or NULL */
	const char *delay_us; /* STUB_CUDA_STREAM_DELAY_US, or NULL */
	const char *stream;   /* PINBROKER_STAGING_STREAM_STORES, or NULL (the default) */
	bool quiet;           /* stderr to /dev/null: a run expected to fail its checks */
};

/* The program's environment as o says (in its child). */
static void set_env(const void *arg)
{
	const struct run_opts *o = arg;

	setenv("LD_LIBRARY_PATH", STUB_DIR, 1);
	setenv("PINBROKER_SOCKET", d.socket[0] ? d.socket : "/nonexistent/pinbroker.sock", 1);
	setenv("PINBROKER_LABEL", "stager", 1);
	setenv("PB_EXPECT", o->expect ? o->expect : "staged", 1);
	setenv("PINBROKER_STAGING_SLOT", "64K", 1);
	setenv("PINBROKER_STAGING_RING", "256K", 1);
	setenv("PINBROKER_STAGING_THRESHOLD", "16K", 1);
	setenv("PINBROKER_STAGING_THREADS", "3", 1);
	if (o->staging)
		setenv("PINBROKER_STAGING", o->staging, 1);
	if (o->delay_us)
		setenv("STUB_CUDA_STREAM_DELAY_US", o->delay_us, 1);
	if (o->stream)
		setenv("PINBROKER_STAGING_STREAM_STORES", o->stream, 1);
	if (o->preload)
		setenv("LD_PRELOAD", PRELOAD_LIB, 1);
}

static void spawn(struct itest_prog *p, const struct way *w, const struct run_opts *o, const char *mode,
		  const char *arg)
{
	const char *argv[] = { w->bin, mode, w->arg, arg, NULL };

	itest_prog_start(p, argv, o->quiet, set_env, o);
}

static void expect_line(struct itest_prog *p, const char *want)
{
	char buf[256];

	itest_prog_read_line(p, buf, sizeof(buf));
	ck_assert_msg(strcmp(buf, want) == 0, "the program said \"%s\", expected \"%s\"", buf, want);
}

static void tell(struct itest_prog *p, const char *line)
{
	ck_assert_int_eq(write(p->in, line, strlen(line)), (ssize_t)strlen(line));
	ck_assert_int_eq(write(p->in, "\n", 1), 1);
}

/* Run mode (with arg, may be NULL) the way w under o: its exit status. */
static int run(const struct way *w, const struct run_opts *o, const char *mode, const char *arg)
{
	struct itest_prog p;

	spawn(&p, w, o, mode, arg);
	return itest_prog_finish(&p, NULL, 0);
}

static const struct run_opts staged = { .preload = true };

/* The mode passes under the interposer with the daemon, for way _i, and gives everything back. */
static void staged_mode_passes(int i, const char *mode, const char *arg, const struct run_opts *o)
{
	ck_assert_msg(run(&ways[i], o, mode, arg) == 0,
		      "%s %s: the checks failed under the interposer (see its stderr)", ways[i].name, mode);
	ck_assert_int_eq(wait_leased(d.socket, 0, 10000), 0);
}

/* ---- Under the interposer ---- */

/*
 * The test program's modes that pass under the interposer with the daemon, each run every way (ways[]): row
 * _i / N_WAYS, way _i % N_WAYS.
 */
static const struct staged_row {
	const char *name;
	const char *mode;
	const char *arg; /* or NULL */
	struct run_opts opts;
} staged_rows[] = {
	/* Bytes exact for every size around the slot, the ring and the threshold, at host offsets 1..63 and device
	 * offsets; nothing written outside; H2D's source reusable at its return; D2H's data in place at its return;
	 * copies at or over the threshold staged (the driver saw no pageable byte), under it the driver's. */
	{ "every size and alignment is exact and staged", "sizes", NULL, { .preload = true } },
	/* The same with every stream operation 200 us late: a buffer reused before its copy ran shows. */
	{ "sizes stay exact with slow streams", "sizes", NULL, { .preload = true, .delay_us = "200" } },
	/*
	 * The same with the threads writing streaming stores both ways, and with plain memcpy both ways (the default
	 * streams device to host only; a 64 KiB slot: every full piece takes the chosen path).
	 */
	{ "sizes stay exact with streaming stores both ways", "sizes", NULL, { .preload = true, .stream = "both" } },
	{ "sizes stay exact with memcpy both ways", "sizes", NULL, { .preload = true, .stream = "none" } },
	/* Staged copies keep their place among stand-in kernels: on their stream, on other streams through events, on
	 * the legacy and per-thread default streams. */
	{ "copies are ordered with kernels and events", "order", NULL, { .preload = true } },
	/* Eight host threads copying at once, each its own buffers: all exact, some staged. */
	{ "many threads copy at once", "threads", "8", { .preload = true } },
	/* Copies in two contexts taken in turn (the engine's events are per context): exact, staged. */
	{ "copies in two contexts", "contexts", NULL, { .preload = true } },
	/* A stream being captured: its pageable copies reach the driver as made (recorded, not run). */
	{ "capture passes copies to the driver", "capture", NULL, { .preload = true } },
	/* Under the threshold, pinned, registered and managed memory, device-to-device and host-to-host: the
	 * driver's, untouched; a bad device pointer gets the driver's own CUDA_ERROR_INVALID_VALUE. */
	{ "other memory passes to the driver untouched", "passthrough", NULL, { .preload = true } },
	/* A driver error in the middle of a staged copy (STUB_CUDA_COPY_FAIL_AT) comes back to the caller: 700. */
	{ "a driver error comes back to the caller", "fail", NULL, { .preload = true } },
#ifndef __SANITIZE_ADDRESS__ /* as check_itest_preload: GCC 12's libasan can hang a child forked while threads malloc */
	/* fork() while a thread copies: each child copies exactly (its own ring, or the driver) and never hangs, and
	 * the parent's copies go on. */
	{ "forked children copy too", "fork", NULL, { .preload = true } },
#endif
};
#define N_STAGED ((int)(sizeof(staged_rows) / sizeof(staged_rows[0])))

START_TEST(test_staged_modes_pass_every_way)
{
	const struct staged_row *r = &staged_rows[_i / N_WAYS];
	const struct way *w = &ways[_i % N_WAYS];

	ck_assert_msg(run(w, &r->opts, r->mode, r->arg) == 0,
		      "%s, %s (mode %s): the checks failed under the interposer (see its stderr)", r->name, w->name,
		      r->mode);
	ck_assert_int_eq(wait_leased(d.socket, 0, 10000), 0);
}
END_TEST

/* PINBROKER_STAGING=0: every copy goes to the driver as made, and no ring is taken. */
START_TEST(test_staging_off_passes_everything_to_the_driver)
{
	struct run_opts off = { .preload = true, .expect = "driver", .staging = "0" };
	struct pb_status *s;
	struct itest_prog p;
	char line[256];

	staged_mode_passes(_i, "sizes", NULL, &off);
	spawn(&p, &ways[_i], &off, "hold", NULL);
	itest_prog_read_line(&p, line, sizeof(line));
	ck_assert_msg(strncmp(line, "ready", 5) == 0, "%s: %s", ways[_i].name, line);
	s = itest_status(d.socket);
	for (size_t i = 0; i < s->n_leases; i++)
		ck_assert_msg(s->leases[i].pid != p.pid, "%s: staging off, yet the program holds a lease of %llu bytes",
			      ways[_i].name, (unsigned long long)s->leases[i].bytes);
	pb_status_free(s);
	ck_assert_int_eq(itest_prog_finish(&p, NULL, 0), 0);
}
END_TEST

/* The ring is one lease of exactly the configured size, named in status and `pinctl leases`; the process pins
 * nothing else (what the driver holds pinned is the ring). */
START_TEST(test_the_ring_is_one_lease_of_the_configured_size)
{
	struct pb_status *s;
	struct itest_prog p;
	char line[256], *out = NULL;
	uint64_t held = 0;
	size_t rows = 0;

	spawn(&p, &ways[_i], &staged, "hold", NULL);
	itest_prog_read_line(&p, line, sizeof(line));
	ck_assert_msg(strncmp(line, "ready", 5) == 0, "%s: %s", ways[_i].name, line);
	ck_assert_msg(strstr(line, "failures=0") != NULL, "%s: the staged round trip failed: %s", ways[_i].name, line);
	s = itest_status(d.socket);
	for (size_t i = 0; i < s->n_leases; i++) {
		const struct pb_lease_info *r = &s->leases[i];

		if (r->pid != p.pid)
			continue;
		rows++;
		held += r->bytes;
		ck_assert_uint_eq(r->bytes, RING_BYTES);
		ck_assert_msg(r->label && strstr(r->label, "staging ring"), "%s: the ring's label is \"%s\"",
			      ways[_i].name, r->label ? r->label : "(none)");
	}
	pb_status_free(s);
	ck_assert_msg(rows == 1, "%s: %zu leases for the program, expected its one ring", ways[_i].name, rows);
	/* Pinned memory per process: the driver holds pinned exactly what the broker lent, the ring. */
	ck_assert_msg(strtoull(strstr(line, "pinned=") + 7, NULL, 10) <= held,
		      "%s: the driver holds more pinned memory than the ring: %s", ways[_i].name, line);
	ck_assert_int_eq(pinctl(&d, &out, "leases"), 0);
	ck_assert_msg(strstr(out, "staging ring") != NULL, "pinctl leases does not name the ring:\n%s",
		      itest_tail(out));
	free(out);
	out = NULL;
	ck_assert_int_eq(pinctl(&d, &out, "status --json"), 0);
	ck_assert_msg(strstr(out, "staging ring") != NULL, "pinctl status --json does not name the ring:\n%s",
		      itest_tail(out));
	free(out);
	ck_assert_int_eq(itest_prog_finish(&p, NULL, 0), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 10000), 0);
}
END_TEST

/* The program's one ring lease: its id (0 when none), and its state into state (when not NULL). */
static uint64_t ring_of(pid_t pid, char *state, size_t len)
{
	struct pb_status *s = itest_status(d.socket);
	uint64_t id = 0;

	for (size_t i = 0; i < s->n_leases; i++)
		if (s->leases[i].pid == pid && s->leases[i].label && strstr(s->leases[i].label, "staging ring")) {
			id = s->leases[i].id;
			if (state)
				snprintf(state, len, "%s", s->leases[i].state ? s->leases[i].state : "");
		}
	pb_status_free(s);
	return id;
}

/*
 * Revocation in the middle of a copy: the stand-in driver holds a long copy at its gate after its first pieces;
 * the ring is revoked; the copy finishes exact; the ring is given back before its deadline (the program lives);
 * the next copies go to the driver; later a ring is taken again.
 */
START_TEST(test_revocation_in_the_middle_of_a_copy)
{
	struct run_opts o = { .preload = true, .delay_us = "100" };
	char state[32] = "", *out = NULL;
	uint64_t ring, again = 0;
	struct itest_prog p;
	int i;

	spawn(&p, &ways[_i], &o, "revoke", NULL);
	expect_line(&p, "ready");
	ring = ring_of(p.pid, NULL, 0);
	ck_assert_msg(ring != 0, "%s: no ring lease after a staged copy", ways[_i].name);
	tell(&p, "go");
	expect_line(&p, "copying");
	ck_assert_int_eq(pinctl(&d, &out, "revoke %llu --deadline 20000", (unsigned long long)ring), 0);
	free(out);
	/* The daemon has asked for it back while the copy is held. */
	for (i = 0; i < 200 && ring_of(p.pid, state, sizeof(state)) == ring && strcmp(state, "revoking") != 0; i++)
		usleep(10 * 1000);
	/* The ring cannot go while the held copy's pieces wait in it. */
	ck_assert_msg(
		ring_of(p.pid, state, sizeof(state)) == ring && strcmp(state, "revoking") == 0,
		"%s: the ring, revoked while a copy through it is held, is \"%s\" (expected still held, revoking)",
		ways[_i].name, state);
	tell(&p, "open");
	expect_line(&p, "copied");
	/* Given back, well before the deadline, by a program that is still running. */
	for (i = 0; i < 500 && ring_of(p.pid, NULL, 0) == ring; i++)
		usleep(20 * 1000);
	ck_assert_msg(ring_of(p.pid, NULL, 0) != ring, "%s: the revoked ring was not given back in 10 s",
		      ways[_i].name);
	ck_assert_int_eq(kill(p.pid, 0), 0);
	tell(&p, "released");
	expect_line(&p, "passed");
	expect_line(&p, "retaken");
	again = ring_of(p.pid, NULL, 0);
	ck_assert_msg(again != 0 && again != ring, "%s: no new ring after the copies were staged again", ways[_i].name);
	tell(&p, "done");
	ck_assert_int_eq(itest_prog_finish(&p, NULL, 0), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 10000), 0);
}
END_TEST

/* ---- The stand-in driver, bare ---- */

static void no_daemon(void)
{
	memset(&d, 0, sizeof(d));
}

/* The stand-in driver's own semantics (asynchronous pinned copies, pageable returns, stream order, pointer
 * attributes, capture, errors), through every way in. */
START_TEST(test_the_stand_in_driver_behaves_as_cuda)
{
	struct run_opts bare = { .expect = "driver" };

	ck_assert_msg(run(&ways[_i], &bare, "selftest", NULL) == 0, "%s: the stand-in driver's self-test failed",
		      ways[_i].name);
}
END_TEST

/* Every mode passes bare with every copy going to the driver: the program's checks hold on a correct driver. */
START_TEST(test_the_checks_pass_on_the_bare_driver)
{
	static const char *const modes[] = { "sizes",    "order",   "threads",     "fork",
					     "contexts", "capture", "passthrough", "fail" };
	struct run_opts bare = { .expect = "driver", .delay_us = NULL };

	for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++)
		ck_assert_msg(run(&ways[_i], &bare, modes[m], m == 2 ? "4" : NULL) == 0,
			      "%s %s: failed on the bare driver", ways[_i].name, modes[m]);
}
END_TEST

/* Expecting staged copies on the bare driver fails: the route checks see the driver's pageable copies. */
START_TEST(test_the_staged_checks_fail_without_the_interposer)
{
	struct run_opts bare = { .expect = "staged", .quiet = true };

	ck_assert_msg(run(&ways[_i], &bare, "sizes", NULL) == 1, "%s: the staged checks passed with nothing staged",
		      ways[_i].name);
	ck_assert_msg(run(&ways[_i], &bare, "fail", NULL) == 1, "%s: the mid-copy failure checks passed unstaged",
		      ways[_i].name);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-staging");
	TCase *t;

	CHECK_LOOP_CASE(s, "stand-in", no_daemon, NULL, 120, N_WAYS, test_the_stand_in_driver_behaves_as_cuda,
			test_the_checks_pass_on_the_bare_driver, test_the_staged_checks_fail_without_the_interposer);
	t = CHECK_LOOP_CASE(s, "interposer", start, stop, 120, N_WAYS, test_staging_off_passes_everything_to_the_driver,
			    test_the_ring_is_one_lease_of_the_configured_size, test_revocation_in_the_middle_of_a_copy);
	tcase_add_loop_test(t, test_staged_modes_pass_every_way, 0, N_STAGED * N_WAYS);
	return s;
}

CHECK_MAIN(suite)

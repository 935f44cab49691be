/* SPDX-License-Identifier: MIT */
/*
 * Issue 22, finding 6: under `pinctl run`, a library dlopen()ed with RTLD_DEEPBIND that pins 64 MiB through
 * the driver it links must show in status (leased or unbrokered), not 0 B, whichever way it reaches the
 * driver (the symbol, dlsym, cuGetProcAddress) and whether the program names it by path or by a bare name
 * along its RUNPATH; and the library must stay deep-bound. Run against the stand-in libcuda.so.1. And deep-bound
 * dlopen()s racing each other and a plain dlopen() in other threads must not crash the program (the
 * interposer rewrites only the objects each deep-bound dlopen() brought in, once they are relocated).
 */
#define _GNU_SOURCE
#include <check.h>
#include <inttypes.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pinbroker.h"
#include "sec.h"

#define MiB (1024ull * 1024)
#define PLUGIN_BYTES (64 * MiB)

static struct daemon d;
static pid_t prog;

SEC_START(start, d, NULL)

static void stop(void)
{
	itest_kill_child(&prog);
	daemon_stop(&d);
}

/*
 * The ways in: how the plugin reaches cuMemHostAlloc, and how the program names the plugin (a path, a bare
 * name along its RUNPATH, $ORIGIN: each must still find it under the interposer). The last is the control:
 * the same plugin loaded without RTLD_DEEPBIND, which the interposer must still pass through unchanged.
 */
static const struct {
	const char *way;
	const char *lib;
	bool shallow;
} cases[] = {
	{ "call", NULL, false }, /* NULL: the plugin by its full path */
	{ "call", "libpbdeep.so", false },
	{ "dlsym", NULL, false },
	{ "dlsym", "libpbdeep.so", false },
	{ "gpa", NULL, false },
	{ "gpa", "libpbdeep.so", false },
	{ "call", "$ORIGIN/deep/libpbdeep.so", false },
	{ "call", "libpbdeep.so", true },
};

/*
 * What uid A runs, staged where it can reach it (a build tree under a 0700 folder, a clone in /root, is out of
 * its reach): pinctl beside libpinbroker and the interposer (pinctl run looks for it there), and the program
 * with deep/ and stub/ beside it, the layout its $ORIGIN run paths name. Returns the program; *plugin is the
 * staged plugin's full path.
 */
static const char *stage_for_uid_a(const char **plugin)
{
	itest_stage(PINCTL_PATH);
	itest_stage(PRELOAD_LIB);
	*plugin = itest_stage_as(DEEP_LIB, "preload/deep/libpbdeep.so");
	itest_stage_as(STUB_DIR "/libcuda.so.1", "preload/stub/libcuda.so.1");
	return itest_stage_as(DEEP_TARGET, "preload/preload_deep_target");
}

/* What status counts for pid: its lease bytes and the unbrokered bytes its connections report. */
static uint64_t seen_for(pid_t pid, uint64_t *leased, uint64_t *unbrokered)
{
	struct pb_status *s = itest_status(d.socket);

	ck_assert_ptr_nonnull(s);
	*leased = *unbrokered = 0;
	for (size_t i = 0; i < s->n_leases; i++)
		if (s->leases[i].pid == pid) {
			ck_assert_uint_eq(s->leases[i].uid, SEC_UID_A);
			*leased += s->leases[i].bytes;
		}
	for (size_t i = 0; i < s->n_clients; i++)
		if (s->clients[i].pid == pid)
			*unbrokered += s->clients[i].unbrokered_bytes;
	pb_status_free(s);
	return *leased + *unbrokered;
}

/*
 * The program's end: closing its stdin (to) makes it free what it pinned and say "freed 0" on f; it then exits 0
 * and the daemon has nothing leased.
 */
static void free_and_end(int to, FILE *f)
{
	char line[256];

	close(to);
	ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
	ck_assert_str_eq(line, "freed 0\n");
	fclose(f);
	ck_assert_int_eq(itest_wait_exit(prog), 0);
	prog = 0;
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
}

START_TEST(test_a_deep_bound_plugin_pins_where_status_sees_it)
{
	const char *way = cases[_i].way, *plugin, *target = stage_for_uid_a(&plugin);
	const char *lib = cases[_i].lib ? cases[_i].lib : plugin, *pinctl = ITEST_PINCTL_FOR_OTHERS;
	int in[2], out[2];
	uint64_t leased = 0, unbrokered = 0, seen = 0;
	unsigned long long driver = ~0ull;
	char line[256], scope[32] = "", *text = NULL;
	FILE *f;
	int i;

	prog = itest_fork_piped(in, out);
	if (prog == 0) {
		char size[32];

		sec_child_stdio_as(in, out, SEC_UID_A);
		if (cases[_i].shallow)
			setenv("DEEP_TARGET_SHALLOW", "1", 1);
		sec_asan_allow_preload();
		snprintf(size, sizeof(size), "%llu", PLUGIN_BYTES);
		/* The interposer's default fallback (cuda): refused memory would still show, as unbrokered. */
		execl(pinctl, "pinctl", "--socket", d.socket, "run", "--label", "deep", "--", target, lib, way, size,
		      (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	f = fdopen(out[0], "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_msg(fgets(line, sizeof(line), f) != NULL, "%s %s: the program printed nothing", way, lib);
	ck_assert_msg(sscanf(line, "ready driver=%llu scope=%31s", &driver, scope) == 2, "%s", line);
	/* Still deep-bound: the plugin's own symbol won over the program's (and not, without RTLD_DEEPBIND). */
	ck_assert_str_eq(scope, cases[_i].shallow ? "program" : "plugin");

	/* The 64 MiB shows for the program's pid (pinctl execs it): leased, or at least reported as unbrokered. */
	for (i = 0; i < 500; i++) {
		seen = seen_for(prog, &leased, &unbrokered);
		if (seen >= PLUGIN_BYTES)
			break;
		nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 }, NULL);
	}
	ck_assert_msg(seen >= PLUGIN_BYTES,
		      "%s %s: status shows %" PRIu64 " B leased and %" PRIu64 " B unbrokered for the plugin's 64 MiB",
		      way, lib, leased, unbrokered);
	/* With the budget free it is a lease: pool memory, so the driver allocated nothing itself. */
	ck_assert_uint_eq(leased, PLUGIN_BYTES);
	ck_assert_uint_eq(driver, 0);
	/* The other uid sees it in the host's figures too. */
	ck_assert_int_eq(pinctl_as(&d, SEC_UID_B, &text, "status --json"), 0);
	ck_assert_msg(strstr(text, "\"leased_bytes\":"), "%s", text);
	ck_assert_msg(strtoull(strstr(text, "\"leased_bytes\":") + 15, NULL, 10) >= PLUGIN_BYTES, "%s", text);
	free(text);

	/* Freed through the plugin: the lease comes back. */
	free_and_end(in[1], f);
}
END_TEST

/*
 * Two threads dlopen() two plugins with RTLD_DEEPBIND, pin through them and dlclose them, over and over, while
 * a third dlopen()s and dlclose()s a plain library whose RELRO holds thousands of dlsym/dlopen pointers and a
 * fourth takes and drops plain references to the plugins. The interposer must rewrite only what each deep-bound
 * dlopen() brought in, once relocated: rewriting the plain library while the loader still relocates it (and
 * write-protecting its page) crashes the program. Every allocation still goes through the interposer, even when
 * a plugin's last reference went in another thread between the interposer's "already loaded?" probe and the
 * real dlopen() (which would then load it afresh, unrewritten), and the two last ones
 * show as leases.
 */
#define RACE_ROUNDS "300"
#define RACE_BYTES (16 * MiB)

/* The race below; same: both deep-bound threads load the one plugin (plugin2 is not used). */
static void deep_race(bool same)
{
	const char *plugin, *plugin2, *busy, *target, *pinctl = ITEST_PINCTL_FOR_OTHERS;
	int in[2], out[2];
	uint64_t leased = 0, unbrokered = 0;
	unsigned long long calls = ~0ull;
	char line[256];
	FILE *f;
	int i;

	stage_for_uid_a(&plugin);
	plugin2 = same ? plugin : itest_stage_as(DEEP_LIB2, "preload/deep/libpbdeep2.so");
	busy = itest_stage_as(DEEP_BUSY, "preload/deep/libpbdeepbusy.so");
	target = itest_stage_as(DEEP_RACE, "preload/preload_deep_race");
	prog = itest_fork_piped(in, out);
	if (prog == 0) {
		char size[32];

		sec_child_stdio_as(in, out, SEC_UID_A);
		sec_asan_allow_preload();
		snprintf(size, sizeof(size), "%llu", RACE_BYTES);
		execl(pinctl, "pinctl", "--socket", d.socket, "run", "--label", "deep-race", "--", target, plugin,
		      plugin2, busy, RACE_ROUNDS, size, (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	f = fdopen(out[0], "r");
	ck_assert_ptr_nonnull(f);
	if (!fgets(line, sizeof(line), f)) {
		int st = 0;

		ck_assert_int_eq(waitpid(prog, &st, 0), prog);
		prog = 0;
		ck_abort_msg("the racing program printed nothing and ended with %s %d",
			     WIFSIGNALED(st) ? "signal" : "status", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
	}
	ck_assert_msg(sscanf(line, "ready calls=%llu", &calls) == 1, "%s", line);
	/* No allocation, of the hundreds made, reached the driver past the interposer. */
	ck_assert_uint_eq(calls, 0);
	for (i = 0; i < 500; i++) {
		if (seen_for(prog, &leased, &unbrokered) >= 2 * RACE_BYTES)
			break;
		nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 }, NULL);
	}
	/* Both plugins' last allocations are leases. */
	ck_assert_uint_eq(leased, 2 * RACE_BYTES);
	free_and_end(in[1], f);
}

START_TEST(test_deep_bound_dlopens_racing_a_plain_one_do_not_crash)
{
	deep_race(false);
}
END_TEST

/*
 * Both deep-bound threads load the same plugin: one's dlopen() finds it already loaded while the other, which
 * loaded it, may still be between the real dlopen() and the end of its rewrite. The one that found it loaded
 * must not call through it before it is rewritten (it did, calls > 0, before the deep-load count).
 */
START_TEST(test_deep_bound_dlopens_of_one_plugin_all_go_through_the_interposer)
{
	deep_race(true);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("sec_19_deepbind");
	TCase *t = CHECK_CASE(s, "deepbind", start, stop, 60, test_deep_bound_dlopens_racing_a_plain_one_do_not_crash);

	tcase_add_test(t, test_deep_bound_dlopens_of_one_plugin_all_go_through_the_interposer);

	tcase_add_loop_test(t, test_a_deep_bound_plugin_pins_where_status_sees_it, 0,
			    (int)(sizeof(cases) / sizeof(cases[0])));
	return s;
}

SEC_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/*
 * The integration helpers' own failure reports (issue 23): when the daemon does not start, the test's message
 * says why (its exit status, the end of its log) instead of Check aborting on a message over its 4 KiB limit
 * ("Message string too long", which hid the daemon's error) or "log: (none)"; the wait for a daemon that never
 * answers is bounded by ITEST_START_TIMEOUT_S and ends with that daemon killed. Each case runs this program
 * again as an inner suite whose test fails on purpose, and checks what the inner run printed.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"
#include "check_main.h"

/* Config lines that each make the daemon print an error line: ~30 KiB of log before it exits 1. */
#define BAD_LINES 400

static struct daemon d;

/* Inner: a daemon that prints BAD_LINES errors and exits at start-up (the outer run writes the config). */
START_TEST(inner_daemon_exits_with_a_long_log)
{
	const char *args[] = { "--config", getenv("ITEST_HARNESS_FILE"), NULL };

	ck_assert_ptr_nonnull(args[1]);
	daemon_start(&d, args); /* fails the test: the daemon exits */
}
END_TEST

/* Inner: a daemon that runs but listens elsewhere (a later --socket wins), so it never answers on d.socket. */
START_TEST(inner_daemon_never_answers)
{
	const char *args[] = { "--socket", getenv("ITEST_HARNESS_FILE"), NULL };

	ck_assert_ptr_nonnull(args[1]);
	daemon_start(&d, args); /* fails the test after ITEST_START_TIMEOUT_S */
}
END_TEST

/* The inner test's temp folder (named in its message as "log /tmp/pbtest.XXXXXX/daemon.log"): it failed before
 * daemon_stop could remove it. */
static void remove_test_dir(const char *out)
{
	const char *p = strstr(out, "log /tmp/pbtest.");
	char dir[64], *cmd = NULL;

	if (p && sscanf(p, "log /tmp/%63[^/ ]", dir) == 1 && asprintf(&cmd, "rm -rf '/tmp/%s'", dir) >= 0 &&
	    system(cmd) != 0)
		fprintf(stderr, "cannot remove /tmp/%s\n", dir);
	free(cmd);
}

/*
 * Runs this program's inner case (env ITEST_HARNESS_INNER) with extra environment, and ITEST_HARNESS_FILE naming a
 * temp path (the config, or the other socket) removed afterwards, as the failing inner test cannot. Its output, and
 * its exit code.
 */
static int run_inner(const char *which, const char *env, char **out)
{
	char self[4096], file[] = "/tmp/pbharness.XXXXXX", *cmd = NULL;
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	int fd = mkstemp(file), r;
	FILE *f;

	ck_assert_int_gt(n, 0);
	self[n] = '\0';
	ck_assert_int_ge(fd, 0);
	f = fdopen(fd, "w");
	ck_assert_ptr_nonnull(f);
	for (int i = 1; strcmp(which, "exit") == 0 && i <= BAD_LINES; i++)
		fprintf(f, "bad-key-%d = 1\n", i);
	fclose(f);
	if (strcmp(which, "exit") != 0)
		unlink(file); /* a socket path, for the daemon to bind */
	ck_assert_int_ge(
		asprintf(&cmd, "env ITEST_HARNESS_INNER=%s ITEST_HARNESS_FILE=%s %s '%s'", which, file, env, self), 0);
	r = run_capture(cmd, out);
	unlink(file);
	free(cmd);
	remove_test_dir(*out);
	return r;
}

START_TEST(test_start_failure_shows_the_exit_status_and_the_end_of_a_long_log)
{
	char *out = NULL, *ex, last[64];

	ck_assert_int_ne(run_inner("exit", "", &out), 0);
	ex = itest_excerpt(out); /* what the messages below show: under Check's limit themselves */
	ck_assert_msg(!strstr(out, "Message string too long"), "Check aborted on the message:\n%s", ex);
	ck_assert_msg(strstr(out, "pinbrokerd exited during start-up (exit status 1)"), "%s", ex);
	/* The end of the log is what says why; its start is left out, and says so. */
	snprintf(last, sizeof(last), "unknown key 'bad-key-%d'", BAD_LINES);
	ck_assert_msg(strstr(out, last), "the log's last line is not in the message:\n%s", ex);
	ck_assert_msg(strstr(out, "bytes left out]"), "%s", ex);
	ck_assert_msg(!strstr(out, "unknown key 'bad-key-1'"), "the whole log went into the message:\n%s", ex);
	free(ex);
	free(out);
}
END_TEST

START_TEST(test_start_wait_is_bounded_by_the_setting_and_kills_the_silent_daemon)
{
	char *out = NULL, *ex, within[64];
	const char *p;
	int pid;

	ck_assert_int_ne(run_inner("hang", "ITEST_START_TIMEOUT_S=1", &out), 0);
	ex = itest_excerpt(out);
	/* 1 s, times what a sanitizer build allows. */
	setenv("ITEST_START_TIMEOUT_S", "1", 1);
	snprintf(within, sizeof(within), "within %u ms", itest_start_timeout_ms());
	ck_assert_msg(!strstr(out, "Message string too long"), "%s", ex);
	p = strstr(out, "pinbrokerd (pid ");
	ck_assert_msg(p && sscanf(p, "pinbrokerd (pid %d)", &pid) == 1, "%s", ex);
	ck_assert_msg(strstr(out, within), "%s", ex);
	/* The log excerpt is the daemon's own output, not "(none)". */
	ck_assert_msg(!strstr(out, "(none)") && strstr(out, "pinbrokerd:"), "%s", ex);
	ck_assert_msg(kill(pid, 0) == -1 && errno == ESRCH, "the daemon %d that never answered still runs", pid);
	free(ex);
	free(out);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("itest_harness");
	TCase *t = tcase_create("harness");
	const char *inner = getenv("ITEST_HARNESS_INNER");

	if (inner) {
		/* The inner run: one case, which fails on purpose. */
		tcase_set_timeout(t, 60);
		tcase_add_test(t, strcmp(inner, "exit") == 0 ? inner_daemon_exits_with_a_long_log
							     : inner_daemon_never_answers);
		suite_add_tcase(s, t);
		return s;
	}
	tcase_set_timeout(t, 120);
	tcase_add_test(t, test_start_failure_shows_the_exit_status_and_the_end_of_a_long_log);
	tcase_add_test(t, test_start_wait_is_bounded_by_the_setting_and_kills_the_silent_daemon);
	suite_add_tcase(s, t);
	return s;
}

CHECK_MAIN(suite)

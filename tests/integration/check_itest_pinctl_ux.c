/* SPDX-License-Identifier: MIT */
/* Integration: pinctl get/config with each value's source, top, and user names, against the real daemon. */
#define _GNU_SOURCE
#include <check.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"
#include "pinbroker.h"
#include "check_main.h"

#define MiB (1024ull * 1024ull)
#define RELOAD_WAIT_MS 5000

static struct daemon d;
static pid_t holder;
static char conf[320];

static void write_conf(const char *text)
{
	FILE *f = fopen(conf, "w");

	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
}

/* daemon_start's command line (--budget 256M ...) plus a config file: uid-quota on line 2. */
static void start(void)
{
	const char *extra[] = { "--config", conf, NULL };

	snprintf(conf, sizeof(conf), "/tmp/pbux-%d.conf", (int)getpid());
	write_conf("# pinctl get/config test\nuid-quota = 128M\nmax-leases-per-client = 50\n");
	daemon_start(&d, extra);
}

static void stop(void)
{
	itest_kill_child(&holder);
	ck_assert_int_eq(daemon_stop(&d), 0);
	unlink(conf);
}

/* A client process of this uid holding a labelled 6 MiB lease until killed. */
static void start_holder(void)
{
	holder = itest_hold_lease(d.socket, 6 * MiB, "ux-holder");
}

/* This test's user name: what status must show instead of the number. */
static const char *my_user(void)
{
	struct passwd *pw = getpwuid(getuid());

	ck_assert_msg(pw != NULL, "uid %u has no passwd entry; the user-name tests need one", (unsigned)getuid());
	return pw->pw_name;
}

/* The line of out that starts with prefix, copied (malloc'd), or NULL. */
static char *line_of(const char *out, const char *prefix)
{
	size_t n = strlen(prefix);

	for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
		if (strncmp(p, prefix, n) == 0)
			return strndup(p, strcspn(p, "\n"));
	return NULL;
}

START_TEST(test_get_shows_default_file_and_command_line_sources)
{
	char *out = NULL, *want = NULL;

	itest_pinctl_says(&d, 0, "get budget", "budget = 256M", "# command line", NULL);
	ck_assert_int_eq(pinctl(&d, &out, "get uid-quota"), 0);
	ck_assert_int_ge(asprintf(&want, "# file %s:2", conf), 0);
	ck_assert_msg(strstr(out, "uid-quota = 128M") && strstr(out, want), "want '%s' in: %s", want, out);
	free(want);
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "get pool-shrink-delay-ms"), 0);
	ck_assert_msg(strstr(out, "pool-shrink-delay-ms = 30000") && strstr(out, "# default"), "%s", out);
	ck_assert_ptr_null(strstr(out, "restart")); /* reloadable */
	free(out);
	/* A key only a restart changes says so. */
	itest_pinctl_says(&d, 0, "get chunk-size", "chunk-size = 2M", "(restart to change)", NULL);
}
END_TEST

START_TEST(test_get_json_names_source_file_and_line)
{
	char *out = NULL, *want = NULL;

	ck_assert_int_eq(pinctl(&d, &out, "get uid-quota --json"), 0);
	ck_assert_int_ge(asprintf(&want,
				  "{\"schema_version\":1,\"config\":{\"key\":\"uid-quota\",\"value\":\"128M\","
				  "\"source\":\"file\",\"file\":\"%s\",\"line\":2,\"reloadable\":true}}",
				  conf),
			 0);
	ck_assert_msg(strstr(out, want), "want %s, got %s", want, out);
	free(want);
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "config --json"), 0);
	ck_assert_msg(strncmp(out, "{\"schema_version\":1,\"config\":[{\"key\":\"socket\",", 45) == 0, "%s", out);
	ck_assert_ptr_nonnull(strstr(out, "{\"key\":\"budget\",\"value\":\"256M\",\"source\":\"command line\""));
	ck_assert_ptr_nonnull(strstr(out, "{\"key\":\"prewarm\",\"value\":\"16M\",\"source\":\"command line\""));
	ck_assert_ptr_nonnull(strstr(out, "{\"key\":\"admin-group\",\"value\":\"\\\"\\\"\",\"source\":\"default\""));
	free(out);
}
END_TEST

START_TEST(test_config_lists_every_key_once_with_its_source)
{
	char *out = NULL, *doc = NULL, *cmd = NULL, *l;
	unsigned keys = 0, lines = 0;

	ck_assert_int_ge(asprintf(&cmd, "%s --config-doc | grep -c '^| `'", PINBROKERD_PATH), 0);
	ck_assert_int_eq(run_capture(cmd, &doc), 0);
	keys = (unsigned)atoi(doc);
	ck_assert_uint_gt(keys, 20);
	ck_assert_int_eq(pinctl(&d, &out, "config"), 0);
	for (const char *p = out; *p; p++)
		lines += *p == '\n';
	ck_assert_uint_eq(lines, keys);
	l = line_of(out, "max-leases-per-client = ");
	ck_assert_ptr_nonnull(l);
	ck_assert_msg(strstr(l, "50") && strstr(l, ":3"), "%s", l);
	free(l);
	free(out);
	free(doc);
	free(cmd);
}
END_TEST

/* pinctl set marks the key "set"; SIGHUP re-reads the file for the others and keeps the set value. */
START_TEST(test_set_value_is_source_set_and_survives_reload)
{
	char *out = NULL;
	int waited;

	itest_pinctl_says(&d, 0, "set max-leases-per-client 100", NULL);
	itest_pinctl_says(&d, 0, "get max-leases-per-client", "max-leases-per-client = 100", "# set", NULL);
	write_conf("# changed\n\nuid-quota = 64M\nmax-leases-per-client = 70\n");
	ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
	for (waited = 0; waited < RELOAD_WAIT_MS; waited += 50) {
		ck_assert_int_eq(pinctl(&d, &out, "get uid-quota"), 0);
		if (strstr(out, "uid-quota = 64M"))
			break;
		free(out);
		out = NULL;
		usleep(50 * 1000);
	}
	ck_assert_msg(out && strstr(out, ":3"), "the reload did not show: %s", out ? out : "(none)");
	free(out);
	itest_pinctl_says(&d, 0, "get max-leases-per-client", "max-leases-per-client = 100", "# set", NULL);
}
END_TEST

START_TEST(test_get_unknown_key_exits_1_naming_the_close_key)
{
	itest_pinctl_says(&d, 1, "get bugdet", "unknown key 'bugdet'", "did you mean 'budget'", NULL);
}
END_TEST

START_TEST(test_status_and_leases_show_user_names_json_keeps_uid)
{
	char *out = NULL, *want = NULL, *row;
	char pid[32];

	start_holder();
	snprintf(pid, sizeof(pid), "%-8d %s ", (int)holder, my_user());
	ck_assert_int_eq(pinctl(&d, &out, "status"), 0);
	ck_assert_ptr_nonnull(strstr(out, " USER "));
	row = line_of(out, pid);
	ck_assert_msg(row != NULL, "no row '%s' in:\n%s", pid, out);
	free(row);
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "leases"), 0);
	ck_assert_msg(strstr(out, " USER ") && strstr(out, my_user()), "%s", out);
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "status --json"), 0);
	ck_assert_int_ge(asprintf(&want, "\"uid\":%u,\"user\":\"%s\"", (unsigned)getuid(), my_user()), 0);
	ck_assert_msg(strstr(out, want), "want %s in %s", want, out);
	free(want);
	free(out);
}
END_TEST

START_TEST(test_revoke_uid_takes_a_user_name)
{
	char *out = NULL;

	start_holder();
	ck_assert_int_eq(pinctl(&d, &out, "revoke --uid %s", my_user()), 0);
	ck_assert_msg(strstr(out, "revoking 1 lease:"), "%s", out);
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "revoke --uid %u", (unsigned)getuid()), 0);
	free(out);
}
END_TEST

START_TEST(test_top_once_prints_one_plain_frame_with_the_top_rows)
{
	char *out = NULL;

	start_holder();
	ck_assert_int_eq(pinctl(&d, &out, "top --once"), 0);
	ck_assert_msg(strstr(out, "budget 256 MiB") && strstr(out, "leased 6 MiB (2%)"), "%s", out);
	ck_assert_ptr_nonnull(strstr(out, "pressure: normal"));
	ck_assert_ptr_nonnull(strstr(out, "pool "));
	ck_assert_ptr_nonnull(strstr(out, "clients by bytes (1 of 1)"));
	ck_assert_ptr_nonnull(strstr(out, "leases by bytes (1 of 1)"));
	ck_assert_ptr_nonnull(strstr(out, "ux-holder"));
	ck_assert_ptr_nonnull(strstr(out, my_user()));
	ck_assert_msg(!strchr(out, '\033'), "escapes in a non-tty frame: %s", out);
	free(out);
	/* Not a tty: one frame even without --once, and watch is the same command. */
	itest_pinctl_says(&d, 0, "watch --interval 0.5", "leases by bytes (1 of 1)", NULL);
}
END_TEST

START_TEST(test_top_fits_lines_and_columns)
{
	char *out = NULL, *cmd = NULL;
	unsigned lines = 0;
	size_t longest = 0;

	start_holder();
	ck_assert_int_ge(asprintf(&cmd, "LINES=8 COLUMNS=30 %s --socket '%s' top --once", PINCTL_PATH, d.socket), 0);
	ck_assert_int_eq(run_capture(cmd, &out), 0);
	for (const char *p = out; *p;) {
		size_t n = strcspn(p, "\n");

		longest = n > longest ? n : longest;
		lines++;
		p += n + (p[n] == '\n');
	}
	ck_assert_msg(lines <= 8 && longest <= 30, "%u lines, longest %zu:\n%s", lines, longest, out);
	ck_assert_uint_ge(lines, 5);
	free(out);
	free(cmd);
}
END_TEST

/* On a terminal (script(1) gives it a pty) the frame has colour, unless NO_COLOR is set. */
START_TEST(test_top_colours_a_tty_unless_no_color)
{
	char *out = NULL, *cmd = NULL;

	ck_assert_int_ge(asprintf(&cmd, "env -u NO_COLOR script -qec \"%s --socket '%s' top --once\" /dev/null",
				  PINCTL_PATH, d.socket),
			 0);
	ck_assert_int_eq(run_capture(cmd, &out), 0);
	ck_assert_msg(strstr(out, "\033[32m") && strstr(out, "pressure: normal"), "no colour on a tty: %s", out);
	free(out);
	free(cmd);
	ck_assert_int_ge(asprintf(&cmd, "NO_COLOR=1 script -qec \"%s --socket '%s' top --once\" /dev/null", PINCTL_PATH,
				  d.socket),
			 0);
	ck_assert_int_eq(run_capture(cmd, &out), 0);
	ck_assert_ptr_nonnull(strstr(out, "pressure: normal"));
	ck_assert_msg(!strchr(out, '\033'), "colour with NO_COLOR set: %s", out);
	free(out);
	free(cmd);
}
END_TEST

/* Interactive on a pty: the alternate screen, then q quits and restores the screen and cursor. */
START_TEST(test_top_interactive_quits_on_q_and_restores_the_terminal)
{
	char *out = NULL, *cmd = NULL;

	ck_assert_int_ge(asprintf(&cmd,
				  "(sleep 1; printf q) | script -qec \"%s --socket '%s' top --interval 0.2\" /dev/null",
				  PINCTL_PATH, d.socket),
			 0);
	ck_assert_int_eq(run_capture(cmd, &out), 0);
	ck_assert_msg(strstr(out, "\033[?1049h") && strstr(out, "\033[?25h\033[?1049l"), "%s", out);
	ck_assert_ptr_nonnull(strstr(out, "q quits"));
	free(out);
	free(cmd);
}
END_TEST

START_TEST(test_bad_arguments_exit_2_with_usage)
{
	static const char *const bad[] = {
		"get",
		"get budget prewarm",
		"get --bogus budget",
		"config extra",
		"config --bogus",
		"top --interval 0",
		"top --interval abc",
		"top --bogus",
		"watch extra",
		"revoke --uid no-such-user-pbux",
		"revoke --uid 12x",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *out = NULL;

		ck_assert_msg(pinctl(&d, &out, "%s", bad[i]) == 2, "pinctl %s: not exit 2: %s", bad[i], out);
		ck_assert_msg(strstr(out, "see 'pinctl --help'"), "pinctl %s: %s", bad[i], out);
		free(out);
	}
}
END_TEST

START_TEST(test_new_commands_have_help)
{
	static const char *const cmds[] = { "get", "config", "top", "watch" };

	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		char *out = NULL;

		ck_assert_int_eq(pinctl(&d, &out, "%s --help", cmds[i]), 0);
		ck_assert_msg(strstr(out, "Usage: pinctl ") && strstr(out, cmds[i]), "%s --help: %s", cmds[i], out);
		free(out);
	}
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-pinctl-ux");
	TCase *t = tcase_create("pinctl-ux");
	bool have_script = system("command -v script >/dev/null 2>&1") == 0;

	tcase_add_checked_fixture(t, start, stop);
	tcase_set_timeout(t, 60);
	tcase_add_test(t, test_get_shows_default_file_and_command_line_sources);
	tcase_add_test(t, test_get_json_names_source_file_and_line);
	tcase_add_test(t, test_config_lists_every_key_once_with_its_source);
	tcase_add_test(t, test_set_value_is_source_set_and_survives_reload);
	tcase_add_test(t, test_get_unknown_key_exits_1_naming_the_close_key);
	tcase_add_test(t, test_status_and_leases_show_user_names_json_keeps_uid);
	tcase_add_test(t, test_revoke_uid_takes_a_user_name);
	tcase_add_test(t, test_top_once_prints_one_plain_frame_with_the_top_rows);
	tcase_add_test(t, test_top_fits_lines_and_columns);
	/* Registered only where script(1) can give pinctl a pty, so they never pass without running. */
	if (have_script) {
		tcase_add_test(t, test_top_colours_a_tty_unless_no_color);
		tcase_add_test(t, test_top_interactive_quits_on_q_and_restores_the_terminal);
	} else {
		check_skip("script(1) is not installed: top's terminal tests did not run (apt-get install bsdutils)");
	}
	tcase_add_test(t, test_bad_arguments_exit_2_with_usage);
	tcase_add_test(t, test_new_commands_have_help);
	suite_add_tcase(s, t);
	return s;
}

CHECK_MAIN(suite)

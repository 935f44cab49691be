/* SPDX-License-Identifier: MIT */
/* Integration: pinctl's human and JSON output, exit codes and messages against the real daemon. */
#define _GNU_SOURCE
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"
#include "pinbroker.h"
#include "check_main.h"

#define MiB (1024ull * 1024ull)

static struct daemon d;
static pid_t holder;

ITEST_FIXTURE_START(start, d, NULL)

static void stop(void)
{
	if (holder > 0) {
		kill(holder, SIGKILL);
		waitpid(holder, NULL, 0);
		holder = 0;
	}
	ck_assert_int_eq(daemon_stop(&d), 0);
}

/* A client process holding a labelled 6 MiB lease until killed. */
static void start_holder(void)
{
	holder = itest_hold_lease(d.socket, 6 * MiB, "trainer-7");
}

START_TEST(test_status_human_shows_budget_and_client_rows)
{
	char *out = NULL, pid[32];

	start_holder();
	ck_assert_int_eq(pinctl(&d, &out, "status"), 0);
	ck_assert_ptr_nonnull(strcasestr(out, "budget"));
	ck_assert_ptr_nonnull(strstr(out, "256 MiB"));
	ck_assert_ptr_nonnull(strstr(out, "page 4 KiB"));
	ck_assert_ptr_nonnull(strstr(out, "trainer-7"));
	ck_assert_ptr_nonnull(strstr(out, "NAME")); /* the HELLO name of each connection */
	snprintf(pid, sizeof(pid), "%d", (int)holder);
	ck_assert_msg(strstr(out, pid) != NULL, "holder pid %s missing from:\n%s", pid, out);
	ck_assert_ptr_nonnull(strstr(out, "6 MiB"));
	free(out);
}
END_TEST

/* Set in suite(), before the forks: without jq the structural JSON checks are left out, and the
 * suite reports itself skipped (check_skip) instead of passing. */
static bool jq_present;

static bool have_jq(void)
{
	return system("command -v jq >/dev/null 2>&1") == 0;
}

START_TEST(test_status_json_has_stable_schema)
{
	char *out = NULL, *cmd = NULL;

	start_holder();
	itest_pinctl_says(&d, 0, "status --json", "\"schema_version\":1", NULL);
	if (!jq_present)
		return; /* the field checks below need a JSON parser; suite() reports the skip */
	ck_assert_int_ge(
		asprintf(
			&cmd,
			"%s --socket '%s' status --json | jq -e '"
			".schema_version == 1 and .budget_bytes == 268435456 and .leased_bytes == 6291456 "
			"and (.pool_bytes >= 6291456) and .page_size_bytes == 4096 "
			"and (.clients | length) >= 1 and (.clients[] | select(.pid == %d) | .leases == 1 and .bytes == 6291456 and .uid == %u) "
			"and (.leases[0] | has(\"id\") and has(\"pid\") and has(\"uid\") and has(\"bytes\") and .label == \"trainer-7\" and has(\"age_ms\"))'",
			PINCTL_PATH, d.socket, (int)holder, (unsigned)getuid()),
		0);
	ck_assert_int_eq(run_capture(cmd, &out), 0);
	free(out);
	free(cmd);
}
END_TEST

START_TEST(test_leases_lists_each_lease)
{
	start_holder();
	itest_pinctl_says(&d, 0, "leases", "trainer-7", "active", NULL);
}
END_TEST

START_TEST(test_acquire_prints_timing_and_releases)
{
	itest_pinctl_says(&d, 0, "acquire 8M --label smoke", "8 MiB", "ms", "released", NULL);
	ck_assert_int_eq(status_leased(d.socket), 0);
}
END_TEST

START_TEST(test_acquire_refused_exits_1_with_reason)
{
	itest_pinctl_says(&d, 1, "acquire 4G", "budget", NULL);
}
END_TEST

START_TEST(test_bad_arguments_exit_2_with_usage)
{
	char *out = NULL;

	ck_assert_int_eq(pinctl(&d, &out, "frobnicate"), 2);
	ck_assert_ptr_nonnull(strcasestr(out, "usage"));
	free(out);
	itest_pinctl_says(&d, 2, "acquire", NULL);
	itest_pinctl_says(&d, 2, "acquire 12Q", NULL);
	itest_pinctl_says(&d, 2, "status --bogus", NULL);
}
END_TEST

/* How often needle occurs in hay. */
static int count_of(const char *hay, const char *needle)
{
	int n = 0;

	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

static int count_lines(const char *s)
{
	int n = 0;

	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/*
 * A usage error: exit 2, one line that names the problem once, and the pointer to help, no usage dump. Inside a
 * command the line names it and points to its own help (issue 28: "pinctl leases: unknown option --bogus; see
 * 'pinctl leases --help'"); an unknown command points to pinctl --help.
 */
static void assert_usage_error(const char *args, const char *says)
{
	char *out = NULL, cmd[32], help[64], named[48];

	snprintf(cmd, sizeof(cmd), "%.*s", (int)strcspn(args, " "), args);
	if (strncmp(says, "unknown command", 15) == 0) {
		snprintf(help, sizeof(help), "see 'pinctl --help'");
		snprintf(named, sizeof(named), "pinctl: ");
	} else {
		snprintf(help, sizeof(help), "see 'pinctl %s --help'", cmd);
		snprintf(named, sizeof(named), "pinctl %s: ", cmd);
	}
	ck_assert_int_eq(pinctl(&d, &out, "%s", args), 2);
	ck_assert_msg(count_lines(out) == 1, "pinctl %s: want one line, got:\n%s", args, out);
	ck_assert_msg(count_of(out, says) == 1, "pinctl %s: want \"%s\" once in:\n%s", args, says, out);
	ck_assert_msg(count_of(out, help) == 1, "pinctl %s: want \"%s\" once in:\n%s", args, help, out);
	ck_assert_msg(strncmp(out, named, strlen(named)) == 0, "pinctl %s: want it to start \"%s\":\n%s", args, named,
		      out);
	ck_assert_ptr_null(strstr(out, "Usage:"));
	free(out);
}

START_TEST(test_usage_errors_are_one_line_each_said_once)
{
	assert_usage_error("acquire -5", "-5: a size must be positive");
	assert_usage_error("acquire 0", "0: a size must be at least 1 byte");
	assert_usage_error("acquire", "give a SIZE");
	assert_usage_error("acquire 1M 2M", "give one SIZE, not 2 arguments");
	assert_usage_error("acquire 12Q", "not a size: 12Q");
	assert_usage_error("acquire 1M --hold", "--hold needs a value");
	assert_usage_error("revoke 1 2", "give one LEASE id, not 2 arguments");
	assert_usage_error("revoke x", "not a lease id: x");
	assert_usage_error("status --bogus", "unknown option --bogus");
	assert_usage_error("set admin-group", "give KEY VALUE");
	assert_usage_error("frobnicate", "unknown command: frobnicate");
}
END_TEST

/* Every size too large for any lease exits 2 the same way, however many digits it has. */
START_TEST(test_oversized_sizes_exit_2_whatever_the_digits)
{
	assert_usage_error("acquire 9223372036854775808", "too large");  /* 2^63 */
	assert_usage_error("acquire 9999999999999999999", "too large");  /* fits u64 */
	assert_usage_error("acquire 99999999999999999999", "too large"); /* overflows u64 */
	assert_usage_error("acquire 17179869184G", "too large");         /* 16 EiB: the suffix overflows */
}
END_TEST

START_TEST(test_empty_socket_is_a_usage_error_and_help_exits_0)
{
	char *out = NULL;

	ck_assert_int_eq(run_capture(PINCTL_PATH " --socket '' status", &out), 2);
	ck_assert_int_eq(count_lines(out), 1);
	ck_assert_int_eq(count_of(out, "--socket: empty path"), 1);
	free(out);
	ck_assert_int_eq(run_capture(PINCTL_PATH " --help", &out), 0);
	ck_assert_ptr_nonnull(strstr(out, "Usage:"));
	ck_assert_ptr_nonnull(strstr(out, "Commands:"));
	free(out);
	ck_assert_int_eq(run_capture(PINCTL_PATH " --bogus", &out), 2);
	ck_assert_int_eq(count_lines(out), 1);
	ck_assert_int_eq(count_of(out, "unknown option --bogus"), 1);
	free(out);
}
END_TEST

START_TEST(test_every_command_has_help_and_takes_socket_after_its_name)
{
	static const char *const cmds[] = { "status", "leases", "top",     "watch", "acquire", "revoke", "get",
					    "set",    "config", "metrics", "run",   "doctor",  "help" };
	/* Each run is pinctl BEFORE --socket SOCKET AFTER, and exits 0 with needle (unless NULL) in its output. */
	static const struct {
		const char *before, *after, *needle;
	} late[] = {
		{ "status", "--json", "\"budget_bytes\":268435456" },
		{ "--socket /nonexistent leases", "", NULL },
		{ "acquire 1M", "--hold 0", "released" },
		{ "set pool-shrink-delay-ms 20000", "", "pool-shrink-delay-ms = 20000" },
		{ "revoke --all", "", NULL },
	};
	char *out = NULL, *cmd = NULL, want[64];

	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		snprintf(want, sizeof(want), "Usage: pinctl %s", cmds[i]);
		/* --help, -h and pinctl help CMD say the same, exit 0, and connect to nothing. */
		ck_assert_int_ge(asprintf(&cmd, PINCTL_PATH " --socket /nonexistent %s --help", cmds[i]), 0);
		ck_assert_msg(run_capture(cmd, &out) == 0, "%s --help: %s", cmds[i], out);
		ck_assert_msg(strncmp(out, want, strlen(want)) == 0, "%s --help: %s", cmds[i], out);
		ck_assert_ptr_nonnull(strstr(out, "--socket PATH"));
		free(out);
		free(cmd);
		ck_assert_int_ge(asprintf(&cmd, PINCTL_PATH " %s -h", cmds[i]), 0);
		ck_assert_int_eq(run_capture(cmd, &out), 0);
		ck_assert_msg(strncmp(out, want, strlen(want)) == 0, "%s -h: %s", cmds[i], out);
		free(out);
		free(cmd);
		ck_assert_int_ge(asprintf(&cmd, PINCTL_PATH " help %s", cmds[i]), 0);
		ck_assert_int_eq(run_capture(cmd, &out), 0);
		ck_assert_msg(strncmp(out, want, strlen(want)) == 0, "help %s: %s", cmds[i], out);
		free(out);
		free(cmd);
	}
	ck_assert_int_eq(run_capture(PINCTL_PATH " help bogus", &out), 2);
	ck_assert_int_eq(count_of(out, "unknown command: bogus"), 1);
	free(out);
	/* --socket after the command, also after its arguments; the last one wins. */
	for (size_t i = 0; i < sizeof(late) / sizeof(late[0]); i++) {
		ck_assert_int_ge(
			asprintf(&cmd, "%s %s --socket '%s' %s", PINCTL_PATH, late[i].before, d.socket, late[i].after),
			0);
		ck_assert_msg(run_capture(cmd, &out) == 0, "%s failed:\n%s", cmd, out);
		ck_assert_msg(!late[i].needle || strstr(out, late[i].needle), "%s: '%s' not in\n%s", cmd,
			      late[i].needle, out);
		free(out);
		free(cmd);
	}
	ck_assert_int_eq(run_capture(PINCTL_PATH " status --socket ''", &out), 2);
	ck_assert_int_eq(count_of(out, "--socket: empty path"), 1);
	free(out);
	ck_assert_int_eq(run_capture(PINCTL_PATH " set a --socket", &out), 2);
	ck_assert_int_eq(count_of(out, "--socket needs a value"), 1);
	free(out);
}
END_TEST

START_TEST(test_status_prints_sizes_and_integer_counts_not_exponents)
{
	char *out = NULL;

	ck_assert_int_eq(pinctl(&d, &out, "status"), 0);
	ck_assert_msg(strstr(out, "e+") == NULL, "exponent in:\n%s", out);
	ck_assert_ptr_null(strstr(out, " bytes\n"));
	free(out);
}
END_TEST

/* Runs cmd as nobody (uid/gid 65534, no groups); skips the test when that is impossible. */
static int run_as_nobody(const char *args, char **out)
{
	char *cmd = NULL;
	int r;

	/* The staged copy: the build tree may lie where nobody cannot reach it. */
	ck_assert_int_ge(asprintf(&cmd, "setpriv --reuid=65534 --regid=65534 --clear-groups %s --socket '%s' %s",
				  ITEST_PINCTL_FOR_OTHERS, d.socket, args),
			 0);
	r = run_capture(cmd, out);
	free(cmd);
	return r;
}

static bool can_drop_to_nobody(void)
{
	/* Called while building the suite, outside any test: plain system(), no ck_assert. */
	return geteuid() == 0 && system("setpriv --reuid=65534 --regid=65534 --clear-groups true >/dev/null 2>&1") == 0;
}

START_TEST(test_permission_denied_says_how_to_get_admin_once)
{
	char *out = NULL;

	ck_assert_int_eq(chmod(d.socket, 0666), 0);
	ck_assert_int_eq(run_as_nobody("revoke --all", &out), 1);
	ck_assert_int_eq(count_of(out, "needs uid 0 or membership"), 1);
	ck_assert_ptr_null(strstr(out, "needs root"));
	ck_assert_int_eq(count_of(out, "admin-group in /etc/pinbroker/pinbrokerd.conf"), 1);
	free(out);
}
END_TEST

START_TEST(test_eacces_names_the_folder_or_socket_that_denies)
{
	char *out = NULL;

	ck_assert_int_eq(chmod(d.dir, 0700), 0);
	ck_assert_int_eq(run_as_nobody("status", &out), 1);
	ck_assert_msg(strstr(out, "the folder ") && strstr(out, d.dir) && !strstr(out, "the socket ("),
		      "want the folder %s named in:\n%s", d.dir, out);
	ck_assert_int_eq(count_lines(out), 1);
	free(out);
	ck_assert_int_eq(chmod(d.dir, 0755), 0);
	ck_assert_int_eq(chmod(d.socket, 0600), 0);
	ck_assert_int_eq(run_as_nobody("status", &out), 1);
	ck_assert_msg(strstr(out, "the socket (mode 0600") && !strstr(out, "the folder "),
		      "want the socket named in:\n%s", out);
	ck_assert_int_eq(count_lines(out), 1);
	free(out);
}
END_TEST

START_TEST(test_wait_timed_out_over_quota_says_over_quota)
{
	char *out = NULL;

	start_holder(); /* 6 MiB of the 8 MiB quota */
	ck_assert_int_eq(pinctl(&d, &out, "acquire 4M --wait 300"), 1);
	ck_assert_msg(count_of(out, "over quota") == 1, "want \"over quota\" once in:\n%s", out);
	ck_assert_ptr_null(strstr(out, "freed up"));
	free(out);
}
END_TEST

/* Issue 28: no daemon is exit 3 (as systemctl's for a stopped unit), distinct from other errors (1). */
START_TEST(test_no_daemon_exits_3_and_says_what_to_do)
{
	char *out = NULL;

	ck_assert_int_eq(run_capture(PINCTL_PATH " --socket /tmp/no-such-pinbroker.sock status", &out), 3);
	ck_assert_ptr_nonnull(strstr(out, "/tmp/no-such-pinbroker.sock"));
	ck_assert_ptr_nonnull(strcasestr(out, "pinbrokerd"));
	free(out);
}
END_TEST

START_TEST(test_revoke_of_unresponsive_holder_stays_counted_as_overdue)
{
	char *out = NULL;

	start_holder(); /* its library releases nothing on its own: no callback, not idle */
	itest_pinctl_says(&d, 0, "revoke --all --deadline 200", NULL);
	/* The deadline passing is the event: poll pinctl's own view of it, within a bound. */
	for (uint64_t t0 = itest_now_ms();; usleep(20000)) {
		ck_assert_int_eq(pinctl(&d, &out, "status --json"), 0);
		if (strstr(out, "\"overdue_bytes\":6291456") || itest_now_ms() - t0 > 10000)
			break;
		free(out);
	}
	/* Never forgotten: the unresponsive holder's bytes stay counted, as overdue. */
	ck_assert_msg(strstr(out, "\"overdue_bytes\":6291456"), "not overdue 10 s after a 200 ms deadline: %s",
		      itest_tail(out));
	free(out);
}
END_TEST

START_TEST(test_daemon_bad_cli_exits_2_and_bad_config_gives_file_line)
{
	char *out = NULL, path[] = "/tmp/pbconf.XXXXXX", *cmd = NULL;
	FILE *f;
	int fd;

	ck_assert_int_eq(run_capture(PINBROKERD_PATH " --no-such-option", &out), 2);
	ck_assert_ptr_nonnull(strcasestr(out, "usage"));
	free(out);
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	f = fdopen(fd, "w");
	fprintf(f, "# test\nbudget = 2G\nbugdet = 3G\nprewarm = lots\n");
	fclose(f);
	ck_assert_int_ge(asprintf(&cmd, PINBROKERD_PATH " --config %s --check-config", path), 0);
	ck_assert_int_eq(run_capture(cmd, &out), 1);
	ck_assert_msg(strstr(out, ":3:") && strstr(out, ":4:"), "want file:line errors, got:\n%s", out);
	ck_assert_ptr_nonnull(strstr(out, "budget"));
	free(out);
	free(cmd);
	unlink(path);
}
END_TEST

START_TEST(test_revoke_enforced_with_sigterm_returns_bytes)
{
	int st;

	start_holder();
	itest_pinctl_says(&d, 0, "revoke --all --deadline 200", NULL);
	/* revoke-enforce defaults to sigterm: the holder is terminated through its pidfd. */
	ck_assert_int_eq(waitpid(holder, &st, 0), holder);
	ck_assert(WIFSIGNALED(st));
	ck_assert_int_eq(WTERMSIG(st), SIGTERM);
	holder = 0;
	ck_assert_int_eq(wait_leased(d.socket, 0, 2000), 0);
}
END_TEST

/* More leases than one page holds (1024 rows): pinctl must ask page after page. */
#define PAGED_LEASES 2500

ITEST_FIXTURE_START(start_small_chunks, d, ITEST_ARGS("--chunk-size", "4K", "--chunk-max", "4K"))

static size_t count(const char *hay, const char *needle)
{
	size_t n = 0;

	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

START_TEST(test_leases_and_status_json_page_past_one_reply)
{
	char *out = NULL, *cmd = NULL;
	int pfd[2];

	holder = itest_fork_piped(pfd, NULL);
	if (holder == 0) {
		int fd = raw_connect(d.socket), fds[4];

		if (fd < 0 || raw_hello(fd) != 0)
			_exit(1);
		for (int i = 0; i < PAGED_LEASES; i++) {
			uint64_t id;
			size_t nfds = 0;

			if (raw_acquire(fd, 4096, &id, fds, 4, &nfds) != 0)
				_exit(2);
			for (size_t k = 0; k < nfds; k++)
				close(fds[k]);
		}
		itest_child_ready(pfd, 3);
	}
	itest_wait_ready(pfd);

	ck_assert_int_eq(pinctl(&d, &out, "leases"), 0);
	ck_assert_uint_eq(count(out, " active "), PAGED_LEASES);
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "leases --json"), 0);
	ck_assert_uint_eq(count(out, "{\"id\":"), PAGED_LEASES);
	free(out);
	/* status --json keeps its schema, leases[] complete. */
	ck_assert_int_eq(pinctl(&d, &out, "status --json"), 0);
	ck_assert_ptr_nonnull(strstr(out, "\"schema_version\":1"));
	ck_assert_uint_eq(count(out, "{\"id\":"), PAGED_LEASES);
	free(out);
	if (!jq_present)
		return; /* suite() reports the skip */
	ck_assert_int_ge(
		asprintf(
			&cmd,
			"%s --socket '%s' status --json | jq -e '(.leases | length) == %d and "
			"([.leases[].id] | unique | length) == %d and (.clients[] | select(.pid == %d) | .leases == %d)'",
			PINCTL_PATH, d.socket, PAGED_LEASES, PAGED_LEASES, (int)holder, PAGED_LEASES),
		0);
	ck_assert_int_eq(run_capture(cmd, &out), 0);
	free(out);
	free(cmd);
}
END_TEST

/* More connections than one page of client rows holds. */
#define PAGED_CONNS 1100

ITEST_FIXTURE_START(start_many_conns, d, ITEST_ARGS("--max-connections", "2000", "--max-connections-per-uid", "2000"))

START_TEST(test_status_lists_every_connection_across_pages)
{
	static int fds[PAGED_CONNS];
	struct pb_status *s = NULL;
	pb_client *c = NULL;
	size_t itest_rows = 0;

	for (int i = 0; i < PAGED_CONNS; i++) {
		fds[i] = raw_connect(d.socket);
		ck_assert_int_ge(fds[i], 0);
		ck_assert_int_eq(raw_hello(fds[i]), 0);
	}
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_status_get(c, &s), 0);
	for (size_t i = 0; i < s->n_clients; i++)
		itest_rows += strcmp(s->clients[i].name, "itest") == 0;
	ck_assert_uint_eq(itest_rows, PAGED_CONNS);
	ck_assert_uint_eq(s->n_clients, PAGED_CONNS + 1); /* and this one */
	pb_status_free(s);
	pb_disconnect(c);
	for (int i = 0; i < PAGED_CONNS; i++)
		close(fds[i]);
}
END_TEST

ITEST_FIXTURE_START(start_no_enforce, d, ITEST_ARGS("--revoke-enforce", "none"))

ITEST_FIXTURE_START(start_small_quota, d, ITEST_ARGS("--uid-quota", "8M"))

static Suite *suite(void)
{
	Suite *s = suite_create("integration-pinctl");
	TCase *t;

	jq_present = have_jq();
	if (!jq_present)
		check_skip("jq is not installed, so status --json was not checked field by field: "
			   "apt-get install jq (scripts/deps.sh installs it)");
	t = CHECK_CASE(s, "pinctl", start, stop, 30, test_status_human_shows_budget_and_client_rows,
		       test_status_json_has_stable_schema, test_leases_lists_each_lease,
		       test_acquire_prints_timing_and_releases, test_acquire_refused_exits_1_with_reason,
		       test_bad_arguments_exit_2_with_usage, test_no_daemon_exits_3_and_says_what_to_do,
		       test_daemon_bad_cli_exits_2_and_bad_config_gives_file_line,
		       test_usage_errors_are_one_line_each_said_once, test_oversized_sizes_exit_2_whatever_the_digits,
		       test_empty_socket_is_a_usage_error_and_help_exits_0,
		       test_every_command_has_help_and_takes_socket_after_its_name,
		       test_status_prints_sizes_and_integer_counts_not_exponents);
	/* Registered only where they can run, so they never pass without running. */
	if (can_drop_to_nobody()) {
		tcase_add_test(t, test_permission_denied_says_how_to_get_admin_once);
		tcase_add_test(t, test_eacces_names_the_folder_or_socket_that_denies);
	} else {
		fprintf(stderr, "not running the permission tests: they need root and setpriv to run pinctl as "
				"nobody\n");
	}

	CHECK_CASE(s, "quota", start_small_quota, stop, 30, test_wait_timed_out_over_quota_says_over_quota);

	/* Needs pidfd_send_signal: valgrind 3.19 lacks pidfd_open, so its run excludes the tag "enforce". */
	tcase_set_tags(CHECK_CASE(s, "enforce", start, stop, 30, test_revoke_enforced_with_sigterm_returns_bytes),
		       "enforce");

	CHECK_CASE(s, "paged", start_small_chunks, stop, 60, test_leases_and_status_json_page_past_one_reply);

	/*
	 * PAGED_CONNS connections: as many fds here, and in the daemon (which raises its soft limit to the hard one
	 * itself, but not under valgrind: it inherits the limit raised here). A root shell's soft limit is 1024.
	 */
	if (itest_need_fds(PAGED_CONNS + 100) == 0) {
		/* Created only when added: a TCase left out of the suite is never freed (LeakSanitizer). */
		CHECK_CASE(s, "paged-clients", start_many_conns, stop, 60,
			   test_status_lists_every_connection_across_pages);
	} else {
		check_skip("the %d-connection status test: %s", PAGED_CONNS, itest_nofile_why);
	}

	CHECK_CASE(s, "revoke-no-enforce", start_no_enforce, stop, 30,
		   test_revoke_of_unresponsive_holder_stays_counted_as_overdue);
	return s;
}

CHECK_MAIN(suite)

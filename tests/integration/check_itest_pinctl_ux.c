/* SPDX-License-Identifier: MIT */
/*
 * Integration: pinctl get/config with each value's source, top, user names, and issue 28's CLI habits (exit 3
 * with no daemon, fields and CSV for scripts, errors that point to the command's help, acquire's pool notice),
 * against the real daemon.
 */
#define _GNU_SOURCE
#include <check.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
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
		char *out = NULL, help[64];

		/* Issue 28: a command's error points to that command's help, not pinctl's. */
		snprintf(help, sizeof(help), "see 'pinctl %.*s --help'", (int)strcspn(bad[i], " "), bad[i]);
		ck_assert_msg(pinctl(&d, &out, "%s", bad[i]) == 2, "pinctl %s: not exit 2: %s", bad[i], out);
		ck_assert_msg(strstr(out, help), "pinctl %s: want \"%s\" in: %s", bad[i], help, out);
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

/* ---------------------------------------------------------------- issue 28: CLI habits */

/* pinctl ARGS run on socket: its exit status, its output (stdout and stderr) in *out. */
static int pinctl_on(const char *socket, char **out, const char *args)
{
	char *cmd = NULL;
	int r;

	ck_assert_int_ge(asprintf(&cmd, "%s --socket '%s' %s", PINCTL_PATH, socket, args), 0);
	r = run_capture(cmd, out);
	free(cmd);
	return r;
}

/* Every command that talks to the daemon exits 3 on socket, each saying how to start one both ways. */
static void assert_no_daemon(const char *socket)
{
	static const char *const cmds[] = { "status",     "leases",     "leases -o id",  "acquire 1M",
					    "get budget", "config",     "metrics",       "quota list",
					    "jobs",       "top --once", "set budget 1G", "revoke --all" };
	char want[400];

	snprintf(want, sizeof(want), "pinbrokerd --socket %s &", socket);
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		char *out = NULL;
		int r = pinctl_on(socket, &out, cmds[i]);

		ck_assert_msg(r == 3, "pinctl %s on %s: exit %d, want 3\n%s", cmds[i], socket, r, out);
		ck_assert_msg(strstr(out, "no pinbrokerd answers on") && strstr(out, socket), "pinctl %s: %s", cmds[i],
			      out);
		ck_assert_msg(strstr(out, "systemctl start pinbrokerd.socket"), "no socket unit in: %s", out);
		ck_assert_msg(strstr(out, want), "no '%s' in: %s", want, out);
		/* Issue 41: a daemon just started by hand has no socket for tens of ms: the hint names --wait, and
		 * sends no one who already is root to sudo. */
		ck_assert_msg(strstr(out, "pinctl --wait "), "no --wait in: %s", out);
		ck_assert_msg(geteuid() != 0 || !strstr(out, "sudo "), "sudo for root in: %s", out);
		free(out);
	}
}

START_TEST(test_no_daemon_exits_3_for_a_missing_socket_and_one_nobody_listens_on)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char path[300], *out = NULL;
	int fd;

	/* No socket file at all: ENOENT. */
	snprintf(path, sizeof(path), "%s/no-such.sock", d.dir);
	assert_no_daemon(path);
	/* A socket file left behind with nobody listening: ECONNREFUSED. */
	snprintf(path, sizeof(path), "%s/dead.sock", d.dir);
	ck_assert_uint_lt(strlen(path), sizeof(sa.sun_path));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(close(fd), 0);
	assert_no_daemon(path);
	/* Distinct from other errors: a refusal by a running daemon is 1, a usage error 2. */
	ck_assert_int_eq(pinctl(&d, &out, "acquire 4G"), 1);
	free(out);
	ck_assert_int_eq(pinctl_on(path, &out, "status --bogus"), 2);
	free(out);
	/* doctor with no daemon: its socket check fails for that alone, so 3 too. */
	ck_assert_int_eq(pinctl_on(path, &out, "doctor"), 3);
	ck_assert_msg(strstr(out, "sudo pinbrokerd --socket"), "%s", out);
	free(out);
}
END_TEST

/*
 * Issue 41: `pinbrokerd ... &` then `pinctl status`, pasted as one block, ran pinctl before the daemon had made its
 * socket (37-68 ms after launch) and it exited 3. pinctl --wait, started before the daemon, answers once it is up;
 * with nothing coming it gives up after the seconds given, exit 3, saying how long it waited.
 */
START_TEST(test_wait_answers_a_daemon_started_after_pinctl)
{
	struct daemon late;
	char log[400], dlog[400], *out = NULL, *text;
	pid_t pid, dpid;
	int st;

	daemon_prepare(&late);
	snprintf(log, sizeof(log), "%s/pinctl-wait.log", late.dir);
	snprintf(dlog, sizeof(dlog), "%s/pinctl-wait-doctor.log", late.dir);
	pid = itest_spawn_logged(
		log, (const char *const[]){ PINCTL_PATH, "--wait=30", "--socket", late.socket, "status", NULL }, false,
		NULL, NULL);
	ck_assert_int_gt(pid, 0);
	/* doctor connects its own way (it goes on without a daemon): --wait holds for it too. */
	dpid = itest_spawn_logged(
		dlog, (const char *const[]){ PINCTL_PATH, "--wait=30", "--socket", late.socket, "doctor", NULL }, false,
		NULL, NULL);
	ck_assert_int_gt(dpid, 0);
	daemon_restart(&late, ITEST_ARGS("--budget", "64M", "--prewarm", "16M"));
	st = itest_wait_end(pid, 30000);
	text = itest_read_file(log);
	ck_assert_msg(st == 0, "pinctl --wait=30 status, started before the daemon: exit %d\n%s", st, text);
	ck_assert_msg(text && strstr(text, "budget"), "%s", text);
	free(text);
	st = itest_wait_end(dpid, 60000);
	text = itest_read_file(dlog);
	ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) != 3 && text && strstr(text, "connected to"),
		      "pinctl --wait=30 doctor, started before the daemon: wait status %d\n%s", st, text);
	free(text);
	ck_assert_int_eq(daemon_stop(&late), 0);

	/* Nothing comes: 3 after the seconds given, saying so. */
	{
		char *cmd = NULL;

		ck_assert_int_ge(asprintf(&cmd, "%s --wait=1 --socket '%s' status", PINCTL_PATH, late.socket), 0);
		ck_assert_int_eq(run_capture(cmd, &out), 3);
		free(cmd);
	}
	ck_assert_msg(strstr(out, "waited 1 s") && !strstr(out, "pinctl --wait "), "%s", out);
	free(out);
	itest_pinctl_says(&d, 2, "--wait=soon status", "--wait: not a number of seconds", NULL);
}
END_TEST

/* Something listens but never accepts or answers: libpinbroker's HELLO times out (10 s), and that is no daemon. */
START_TEST(test_no_answer_to_hello_exits_3)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char *out = NULL, path[300];
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	snprintf(path, sizeof(path), "%s/mute.sock", d.dir);
	ck_assert_uint_lt(strlen(path), sizeof(sa.sun_path));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(fd, 8), 0);
	ck_assert_int_eq(pinctl_on(sa.sun_path, &out, "status"), 3);
	ck_assert_msg(strstr(out, "did not answer HELLO") && strstr(out, "systemctl start pinbrokerd.socket"), "%s",
		      out);
	free(out);
	close(fd);
}
END_TEST

/* The lines of text, split in place (text is changed); their count. */
static size_t split_lines(char *text, char **lines, size_t max)
{
	size_t n = 0;

	for (char *save = NULL, *l = strtok_r(text, "\n", &save); l && n < max; l = strtok_r(NULL, "\n", &save))
		lines[n++] = l;
	return n;
}

/* The index of name in a comma-separated header, or -1. */
static int column_of(const char *header, const char *name)
{
	int i = 0;

	for (const char *p = header; *p; i++) {
		size_t n = strcspn(p, ",");

		if (n == strlen(name) && strncmp(p, name, n) == 0)
			return i;
		p += n + (p[n] == ',');
	}
	return -1;
}

/* Cell i of a CSV line without quotes (copied into buf). */
static const char *cell(const char *line, int i, char *buf, size_t len)
{
	const char *p = line;

	for (; i > 0 && p; i--)
		p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL;
	ck_assert_ptr_nonnull(p);
	snprintf(buf, len, "%.*s", (int)strcspn(p, ","), p);
	return buf;
}

/* The fields are leases --json's keys (issue 28: "define the field names from the JSON keys"). */
#define LEASE_FIELDS                                                                                         \
	"id,pid,uid,user,bytes,label,age_ms,priority,state,idle_ms,deadline_left_ms,shared,holder_detached," \
	"registration,no_revoke,numa_node,misplaced,job,attachers,attacher_pids,charged_bytes,registrants,"  \
	"registrant_pids,staging_ring"

START_TEST(test_leases_fields_csv_and_no_headers_parse)
{
	char *out = NULL, *lines[8], buf[64], pid[16], key[64], node[16];
	size_t n;

	start_holder();
	snprintf(pid, sizeof(pid), "%d", (int)holder);
	/* -o: aligned columns under the names in capitals. */
	ck_assert_int_eq(pinctl(&d, &out, "leases -o id,pid,bytes,label"), 0);
	n = split_lines(out, lines, 8);
	ck_assert_msg(n == 2, "want a header and one row:\n%s", out);
	ck_assert_msg(strncmp(lines[0], "ID ", 3) == 0 && strstr(lines[0], " PID ") && strstr(lines[0], " BYTES ") &&
			      strstr(lines[0], " LABEL"),
		      "%s", lines[0]);
	{
		char id[32], p[32], b[32], l[64];

		ck_assert_int_eq(sscanf(lines[1], "%31s %31s %31s %63s", id, p, b, l), 4);
		ck_assert_str_eq(p, pid);
		ck_assert_str_eq(b, "6291456");
		ck_assert_str_eq(l, "ux-holder");
	}
	free(out);
	/* --no-headers: the row alone, in the columns and in the text table. */
	ck_assert_int_eq(pinctl(&d, &out, "leases -o bytes,user --no-headers"), 0);
	snprintf(buf, sizeof(buf), "6291456 %s\n", my_user());
	ck_assert_str_eq(out, buf);
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "leases --no-headers"), 0);
	ck_assert_msg(!strstr(out, "ID ") && strstr(out, "ux-holder") && split_lines(out, lines, 8) == 1, "%s", out);
	free(out);
	/* CSV: a header of every field, named as --json names them, then the row. */
	ck_assert_int_eq(pinctl(&d, &out, "leases --format csv"), 0);
	n = split_lines(out, lines, 8);
	ck_assert_msg(n == 2, "%s", out);
	ck_assert_str_eq(lines[0], LEASE_FIELDS);
	ck_assert_str_eq(cell(lines[1], column_of(lines[0], "pid"), buf, sizeof(buf)), pid);
	ck_assert_str_eq(cell(lines[1], column_of(lines[0], "bytes"), buf, sizeof(buf)), "6291456");
	ck_assert_str_eq(cell(lines[1], column_of(lines[0], "label"), buf, sizeof(buf)), "ux-holder");
	ck_assert_str_eq(cell(lines[1], column_of(lines[0], "user"), buf, sizeof(buf)), my_user());
	ck_assert_str_eq(cell(lines[1], column_of(lines[0], "priority"), buf, sizeof(buf)), "normal");
	ck_assert_str_eq(cell(lines[1], column_of(lines[0], "shared"), buf, sizeof(buf)), "false");
	snprintf(node, sizeof(node), "%s", cell(lines[1], column_of(lines[0], "numa_node"), buf, sizeof(buf)));
	free(out);
	/* Each field is a key of the JSON rows; a null there (an unplaced lease's node) is an empty cell. */
	ck_assert_int_eq(pinctl(&d, &out, "leases --json"), 0);
	{
		const char *v = strstr(out, "\"numa_node\":");

		ck_assert_ptr_nonnull(v);
		v += strlen("\"numa_node\":");
		if (strncmp(v, "null", 4) == 0)
			ck_assert_str_eq(node, "");
		else
			ck_assert_msg(strncmp(v, node, strlen(node)) == 0 && node[0], "csv %s, json %.8s", node, v);
	}
	for (const char *p = LEASE_FIELDS; *p;) {
		size_t k = strcspn(p, ",");

		snprintf(key, sizeof(key), "\"%.*s\":", (int)k, p);
		ck_assert_msg(strstr(out, key), "field %s is not a key of leases --json: %s", key, out);
		p += k + (p[k] == ',');
	}
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "leases --format csv -o label,bytes --no-headers"), 0);
	ck_assert_str_eq(out, "ux-holder,6291456\n");
	free(out);
}
END_TEST

START_TEST(test_status_fields_csv_and_no_headers_parse)
{
	char *out = NULL, *lines[8], buf[64], a[32], b[32], c[32];

	start_holder();
	ck_assert_int_eq(pinctl(&d, &out, "status -o budget_bytes,leased_bytes,pressure_state --no-headers"), 0);
	ck_assert_int_eq(sscanf(out, "%31s %31s %31s", a, b, c), 3);
	ck_assert_str_eq(a, "268435456");
	ck_assert_str_eq(b, "6291456");
	ck_assert_str_eq(c, "normal");
	ck_assert_int_eq(split_lines(out, lines, 8), 1);
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "status --format csv"), 0);
	ck_assert_int_eq(split_lines(out, lines, 8), 2);
	ck_assert_msg(strncmp(lines[0], "version,budget_bytes,", 21) == 0, "%s", lines[0]);
	ck_assert_str_eq(cell(lines[1], column_of(lines[0], "budget_bytes"), buf, sizeof(buf)), "268435456");
	ck_assert_str_eq(cell(lines[1], column_of(lines[0], "free_bytes"), buf, sizeof(buf)), "262144000");
	ck_assert_str_eq(cell(lines[1], column_of(lines[0], "uid_quota_bytes"), buf, sizeof(buf)), "134217728");
	ck_assert_str_eq(cell(lines[1], column_of(lines[0], "hugetlb"), buf, sizeof(buf)), "false");
	ck_assert_int_lt(column_of(lines[0], "clients"), 0); /* arrays are not fields */
	free(out);
	/* --no-headers alone: the row of every field, no header. */
	ck_assert_int_eq(pinctl(&d, &out, "status --no-headers"), 0);
	ck_assert_msg(split_lines(out, lines, 8) == 1 && !strstr(lines[0], "BUDGET_BYTES") &&
			      strstr(lines[0], "268435456"),
		      "%s", out);
	free(out);
}
END_TEST

/* An unknown field is a usage error of that command listing the valid fields, each of which its help names. */
static void assert_unknown_field(const char *cmd, const char *valid, const char *first_fields)
{
	char *out = NULL, *help = NULL, *list, line[64];

	ck_assert_int_eq(pinctl(&d, &out, "%s -o %s,bogus", cmd, valid), 2);
	snprintf(line, sizeof(line), "pinctl %s: -o: unknown field 'bogus'", cmd);
	ck_assert_msg(strncmp(out, line, strlen(line)) == 0, "%s", out);
	snprintf(line, sizeof(line), "see 'pinctl %s --help'", cmd);
	ck_assert_msg(strstr(out, line), "%s", out);
	list = strstr(out, "the fields: ");
	ck_assert_msg(list && strncmp(list + 12, first_fields, strlen(first_fields)) == 0, "%s", out);
	list += 12;
	list[strcspn(list, ";")] = '\0';
	ck_assert_int_eq(pinctl(&d, &help, "%s --help", cmd), 0);
	for (char *save = NULL, *f = strtok_r(list, ",", &save); f; f = strtok_r(NULL, ",", &save))
		ck_assert_msg(strstr(help, f), "field %s is not in pinctl %s --help", f, cmd);
	free(help);
	free(out);
}

START_TEST(test_unknown_field_bad_option_and_format_exit_2_pointing_to_the_command)
{
	char *out = NULL;

	assert_unknown_field("leases", "id", "id,pid,uid,user,bytes,");
	assert_unknown_field("status", "budget_bytes", "version,budget_bytes,");
	ck_assert_int_eq(pinctl(&d, &out, "leases --bogus"), 2);
	ck_assert_str_eq(out, "pinctl leases: unknown option --bogus; see 'pinctl leases --help'\n");
	free(out);
	itest_pinctl_says(&d, 2, "status --format xml", "pinctl status: --format: expected text, csv or json",
			  "see 'pinctl status --help'", NULL);
	itest_pinctl_says(&d, 2, "leases --json -o id", "see 'pinctl leases --help'", NULL);
	itest_pinctl_says(&d, 2, "leases -o", "-o needs a value", "see 'pinctl leases --help'", NULL);
	/* Before a command, or an unknown one: pinctl's own help. */
	itest_pinctl_says(&d, 2, "--bogus", "see 'pinctl --help'", NULL);
	itest_pinctl_says(&d, 2, "frobnicate", "see 'pinctl --help'", NULL);
}
END_TEST

/* An acquire over the idle pool says, before it waits, that the daemon grows its pool for it. */
START_TEST(test_acquire_over_the_idle_pool_says_the_pool_grows)
{
	char *out = NULL, want[128];
	unsigned long long idle;

	ck_assert_int_eq(pinctl(&d, &out, "status -o pool_idle_bytes --no-headers"), 0);
	idle = strtoull(out, NULL, 10);
	free(out);
	ck_assert_msg(idle > 0 && idle < 64 * MiB && idle % MiB == 0, "pool idle %llu", idle);
	snprintf(want, sizeof(want),
		 "pinctl: the pool has %llu MiB idle: pinbrokerd grows it by %llu MiB for this lease", idle / MiB,
		 (64 * MiB - idle) / MiB);
	itest_pinctl_says(&d, 0, "acquire 64M", want, "released", NULL);
	/* Within the idle pool (64 MiB now, after that release): nothing said. */
	ck_assert_int_eq(pinctl(&d, &out, "acquire 1M"), 0);
	ck_assert_msg(!strstr(out, "grows it"), "%s", out);
	free(out);
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
	tcase_add_test(t, test_no_daemon_exits_3_for_a_missing_socket_and_one_nobody_listens_on);
	tcase_add_test(t, test_no_answer_to_hello_exits_3);
	tcase_add_test(t, test_wait_answers_a_daemon_started_after_pinctl);
	tcase_add_test(t, test_leases_fields_csv_and_no_headers_parse);
	tcase_add_test(t, test_status_fields_csv_and_no_headers_parse);
	tcase_add_test(t, test_unknown_field_bad_option_and_format_exit_2_pointing_to_the_command);
	tcase_add_test(t, test_acquire_over_the_idle_pool_says_the_pool_grows);
	suite_add_tcase(s, t);
	return s;
}

CHECK_MAIN(suite)

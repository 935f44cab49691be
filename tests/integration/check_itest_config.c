/* SPDX-License-Identifier: MIT */
/* Integration suite for configuration: the real pinbrokerd with a file, command-line values, SIGHUP and pinctl set. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "itest.h"

#define TIMEOUT_S 60
#define MIB (UINT64_C(1) << 20)

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Writes text to pinbrokerd.conf in the daemon's temp dir; its path goes to path. */
static void write_conf(const struct daemon *d, const char *text, char *path, size_t len)
{
	FILE *f;

	snprintf(path, len, "%s/pinbrokerd.conf", d->dir);
	f = fopen(path, "we");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
}

/* In the daemon's child: no PINBROKER_SOCKET from the test's environment. */
static void unset_socket_env(void *ud)
{
	unsetenv("PINBROKER_SOCKET");
}

/*
 * Start pinbrokerd on d's socket with only the given arguments (daemon_start
 * always adds --prewarm, which would make every prewarm a user's value).
 */
static void start_plain(struct daemon *d, const char *const *args)
{
	const char *argv[32];
	size_t n = 0;
	uint64_t t0;

	argv[n++] = PINBROKERD_PATH;
	argv[n++] = "--socket";
	argv[n++] = d->socket;
	argv[n++] = "--hugetlb";
	argv[n++] = "no";
	for (size_t i = 0; args[i] && n < 31; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	d->pid = itest_spawn_logged(d->log, argv, false, unset_socket_env, NULL);
	for (t0 = mono_ms(); !itest_answers(d->socket); usleep(5000)) {
		if (!daemon_alive(d) || mono_ms() - t0 > itest_start_timeout_ms()) {
			char *log = daemon_log(d);

			ck_abort_msg("pinbrokerd did not start; log:\n%s", itest_tail(log));
		}
	}
}

/* One number from `pinctl status --json`, or -1. */
static int64_t json_field(const struct daemon *d, const char *key)
{
	char *out = NULL, pat[64], *p;
	int64_t v = -1;

	if (pinctl(d, &out, "status --json") == 0) {
		snprintf(pat, sizeof(pat), "\"%s\":", key);
		p = strstr(out, pat);
		if (p)
			v = strtoll(p + strlen(pat) + strspn(p + strlen(pat), " "), NULL, 10);
	}
	free(out);
	return v;
}

static int64_t wait_json(const struct daemon *d, const char *key, int64_t at_least, int timeout_ms)
{
	uint64_t t0 = mono_ms();
	int64_t v;

	for (;;) {
		v = json_field(d, key);
		if (v >= at_least || mono_ms() - t0 > (uint64_t)timeout_ms)
			return v;
		usleep(20000);
	}
}

/* How many times needle occurs in the daemon's log. */
static size_t log_count(const struct daemon *d, const char *needle)
{
	char *log = daemon_log(d);
	size_t n = 0;

	for (const char *p = log; p && (p = strstr(p, needle)); p++)
		n++;
	free(log);
	return n;
}

/*
 * SIGHUP, then wait for this reload's own outcome line: the count of "config reloaded" or
 * "reload rejected" lines going up by one, so that an earlier reload's line is not taken for it.
 */
static void reload_and_wait(struct daemon *d)
{
	size_t ok0 = log_count(d, "config reloaded"), bad0 = log_count(d, "reload rejected");
	uint64_t t0 = mono_ms();
	char *log;

	ck_assert_int_eq(kill(d->pid, SIGHUP), 0);
	for (;;) {
		if (log_count(d, "config reloaded") > ok0 || log_count(d, "reload rejected") > bad0)
			break;
		ck_assert_msg(mono_ms() - t0 < 10000, "no reload within 10 s");
		usleep(20000);
	}
	log = daemon_log(d);
	ck_assert_msg(log_count(d, "config reloaded") > ok0, "reload rejected:\n%s", itest_tail(log));
	free(log);
}

/* Runs pinbrokerd with args and captures its output; returns the exit code. */
static int pinbrokerd(char **out, const char *args)
{
	char cmd[1024];

	snprintf(cmd, sizeof(cmd), "env -u PINBROKER_SOCKET %s --config /dev/null %s", PINBROKERD_PATH, args);
	return run_capture(cmd, out);
}

/* pinbrokerd ARGS must exit want with each of the NULL-ended strings after args in its output. */
static __attribute__((sentinel)) void pinbrokerd_says(int want, const char *args, ...)
{
	const char *needle;
	char *out = NULL;
	va_list ap;
	int r = pinbrokerd(&out, args);

	ck_assert_msg(r == want, "pinbrokerd %s: exit %d, want %d\n%s", args, r, want, itest_tail(out));
	va_start(ap, args);
	while ((needle = va_arg(ap, const char *)))
		ck_assert_msg(strstr(out, needle), "pinbrokerd %s: '%s' not in\n%s", args, needle, itest_tail(out));
	va_end(ap);
	free(out);
}

START_TEST(test_budget_alone_starts_with_the_default_prewarm_clamped)
{
	static const char *const args[] = { "--config", "/dev/null", "--budget", "128M", NULL };
	struct daemon d;
	char *log;

	daemon_prepare(&d);
	start_plain(&d, args);
	ck_assert_int_eq(json_field(&d, "budget_bytes"), (int64_t)(128 * MIB));
	ck_assert_int_eq(json_field(&d, "prewarm_bytes"), (int64_t)(128 * MIB));
	reload_and_wait(&d);
	log = daemon_log(&d);
	ck_assert_msg(strstr(log, "prewarm: the default (256 MiB) is above budget (128 MiB); warming 128 MiB"),
		      "no clamp notice:\n%s", itest_tail(log));
	/* Said once, not again on a reload that changes nothing. */
	ck_assert_ptr_null(strstr(strstr(log, "prewarm: the default") + 1, "prewarm: the default"));
	free(log);
	ck_assert_int_eq(daemon_stop(&d), 0);

	/* A pair the user set both halves of stays an error. */
	pinbrokerd_says(1, "--budget 128M --prewarm 256M --check-config",
			"prewarm (256 MiB) is above budget (128 MiB); lower prewarm or raise budget", NULL);
	pinbrokerd_says(0, "--budget 100M --check-config", "configuration OK", NULL);
}
END_TEST

START_TEST(test_bad_command_line_value_exits_2_with_usage)
{
	pinbrokerd_says(2, "--budget 12Q --check-config", "--budget: budget: '12Q' is not a size", "Usage: pinbrokerd",
			NULL);
	pinbrokerd_says(2, "--max-connections 0", "out of range", NULL);
}
END_TEST

START_TEST(test_cross_key_errors_come_with_the_file_errors_and_lines)
{
	struct daemon d;
	char path[512], args[700], *out = NULL, want[700];

	daemon_prepare(&d);
	write_conf(&d, "bogus-key = 1\ntight-mem-available-pct = 5\ncritical-mem-available-pct = 8\n", path,
		   sizeof(path));
	snprintf(args, sizeof(args), "--config %s --check-config", path);
	ck_assert_int_eq(pinbrokerd(&out, args), 1);
	snprintf(want, sizeof(want), "%s:1: unknown key 'bogus-key'", path);
	ck_assert_msg(strstr(out, want), "%s", out);
	snprintf(want, sizeof(want), "%s:3: critical-mem-available-pct (8) must be below tight-mem-available-pct (5)",
		 path);
	ck_assert_msg(strstr(out, want), "%s", out);
	free(out);
}
END_TEST

START_TEST(test_missing_admin_group_warns_at_check_and_start)
{
	static const char *const args[] = { "--config", "/dev/null",     "--budget",         "64M", "--prewarm",
					    "0",        "--admin-group", "pb-no-such-group", NULL };
	struct daemon d;
	char *log;

	pinbrokerd_says(0, "--admin-group pb-no-such-group --check-config",
			"admin-group 'pb-no-such-group' does not exist", "configuration OK", NULL);
	daemon_prepare(&d);
	start_plain(&d, args);
	log = daemon_log(&d);
	ck_assert_msg(strstr(log, "admin-group 'pb-no-such-group' does not exist"), "%s", itest_tail(log));
	free(log);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

START_TEST(test_reload_grows_the_pool_to_a_raised_prewarm)
{
	struct daemon d;
	char path[512];
	const char *args[] = { "--config", path, "--lock-memory", "no", NULL };

	daemon_prepare(&d);
	write_conf(&d, "budget = 256M\nprewarm = 16M\n", path, sizeof(path));
	start_plain(&d, args);
	ck_assert_int_eq(wait_json(&d, "pool_idle_bytes", (int64_t)(16 * MIB), 5000), (int64_t)(16 * MIB));
	write_conf(&d, "budget = 256M\nprewarm = 144M\n", path, sizeof(path));
	reload_and_wait(&d);
	ck_assert_int_eq(json_field(&d, "prewarm_bytes"), (int64_t)(144 * MIB));
	ck_assert_int_eq(wait_json(&d, "pool_idle_bytes", (int64_t)(144 * MIB), 10000), (int64_t)(144 * MIB));
	/* pinctl set applies it the same way. */
	{
		char *out = NULL;

		ck_assert_int_eq(pinctl(&d, &out, "set prewarm 200M"), 0);
		free(out);
	}
	ck_assert_int_eq(wait_json(&d, "pool_idle_bytes", (int64_t)(200 * MIB), 10000), (int64_t)(200 * MIB));
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

START_TEST(test_pinctl_set_values_survive_a_reload)
{
	struct daemon d;
	char path[512], *log;
	const char *args[] = { "--config", path, "--lock-memory", "no", NULL };

	daemon_prepare(&d);
	write_conf(&d, "budget = 256M\nprewarm = 8M\nuid-quota = 100%\n", path, sizeof(path));
	start_plain(&d, args);
	itest_pinctl_says(&d, 0, "set uid-quota 64M", NULL);
	ck_assert_int_eq(json_field(&d, "uid_quota_bytes"), (int64_t)(64 * MIB));
	/* The file changes another key; the set value stays, the file's new budget applies. */
	write_conf(&d, "budget = 192M\nprewarm = 8M\nuid-quota = 100%\n", path, sizeof(path));
	reload_and_wait(&d);
	ck_assert_int_eq(json_field(&d, "budget_bytes"), (int64_t)(192 * MIB));
	ck_assert_int_eq(json_field(&d, "uid_quota_bytes"), (int64_t)(64 * MIB));
	log = daemon_log(&d);
	ck_assert_msg(strstr(log, "keeping uid-quota = 64M from pinctl set over the config file"), "%s",
		      itest_tail(log));
	free(log);
	/* A second reload keeps it too. */
	reload_and_wait(&d);
	ck_assert_int_eq(json_field(&d, "uid_quota_bytes"), (int64_t)(64 * MIB));
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* psi-window-ms needs a restart: a reload keeps the running value and says so, and pinctl set refuses it. */
START_TEST(test_reload_keeps_and_set_refuses_a_restart_key)
{
	struct daemon d;
	char path[512], *out = NULL, *log;
	const char *args[] = { "--config", path, "--lock-memory", "no", NULL };

	daemon_prepare(&d);
	write_conf(&d, "budget = 256M\nprewarm = 8M\n", path, sizeof(path));
	start_plain(&d, args);
	write_conf(&d, "budget = 192M\nprewarm = 8M\npsi-window-ms = 4000\n", path, sizeof(path));
	reload_and_wait(&d);
	ck_assert_int_eq(json_field(&d, "budget_bytes"), (int64_t)(192 * MIB));
	log = daemon_log(&d);
	ck_assert_msg(
		strstr(log, "psi-window-ms changed to '4000': it takes effect at the next restart, keeping '2000'"),
		"%s", itest_tail(log));
	free(log);
	ck_assert_int_ne(pinctl(&d, &out, "set psi-window-ms 4000"), 0);
	ck_assert_msg(strstr(out, "'psi-window-ms' cannot change while the daemon runs"), "%s", out);
	free(out);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* --reserve-hugepages against a fixture proc root: nr_hugepages raised by what the budget lacks, never lowered. */
START_TEST(test_reserve_hugepages_raises_nr_hugepages_by_what_the_budget_lacks)
{
	char root[] = "/tmp/pb-hp.XXXXXX", path[256], *out = NULL, args[512];
	FILE *f;
	unsigned long long nr = 0;

	ck_assert_ptr_nonnull(mkdtemp(root));
	snprintf(path, sizeof(path), "%s/proc/sys/vm", root);
	snprintf(args, sizeof(args), "mkdir -p %s", path);
	ck_assert_int_eq(system(args), 0);
	snprintf(path, sizeof(path), "%s/proc/meminfo", root);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs("MemTotal: 16777216 kB\nMemFree: 8388608 kB\nMemAvailable: 12582912 kB\nSwapTotal: 0 kB\n"
	      "SwapFree: 0 kB\nHugePages_Total: 10\nHugePages_Free: 10\nHugepagesize: 2048 kB\n",
	      f);
	fclose(f);
	snprintf(path, sizeof(path), "%s/proc/sys/vm/nr_hugepages", root);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs("10\n", f);
	fclose(f);

	/* 64 MiB = 32 pages, 10 free: asks for 22 more. */
	snprintf(args, sizeof(args), "--proc-root %s --budget 64M --prewarm 0 --reserve-hugepages", root);
	ck_assert_int_eq(pinbrokerd(&out, args), 0);
	ck_assert_ptr_nonnull(strstr(out, "vm.nr_hugepages 10 -> 32"));
	free(out);
	f = fopen(path, "r");
	ck_assert_int_eq(fscanf(f, "%llu", &nr), 1);
	fclose(f);
	ck_assert_uint_eq(nr, 32);
	/* A budget the free pages already hold changes nothing. */
	snprintf(args, sizeof(args), "--proc-root %s --budget 16M --prewarm 0 --reserve-hugepages", root);
	ck_assert_int_eq(pinbrokerd(&out, args), 0);
	ck_assert_ptr_nonnull(strstr(out, "stays 32"));
	free(out);
	snprintf(args, sizeof(args), "rm -rf %s", root);
	ck_assert_int_eq(system(args), 0);
}
END_TEST

CHECK_SUITE(itest_config_suite, "itest_config", "config", NULL, NULL, TIMEOUT_S,
	    test_budget_alone_starts_with_the_default_prewarm_clamped, test_bad_command_line_value_exits_2_with_usage,
	    test_cross_key_errors_come_with_the_file_errors_and_lines,
	    test_missing_admin_group_warns_at_check_and_start, test_reload_grows_the_pool_to_a_raised_prewarm,
	    test_pinctl_set_values_survive_a_reload, test_reload_keeps_and_set_refuses_a_restart_key,
	    test_reserve_hugepages_raises_nr_hugepages_by_what_the_budget_lacks)

CHECK_MAIN(itest_config_suite)

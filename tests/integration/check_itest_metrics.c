/* SPDX-License-Identifier: MIT */
/*
 * Integration: Prometheus metrics from the real pinbrokerd. metrics-path is rewritten atomically on its interval,
 * `pinctl metrics` prints the same figures, counters move with grants and refusals, per-uid rows follow the
 * holders, and Debian's prometheus-node-exporter reads the file through its textfile collector without a scrape
 * error (left out, and the suite reported skipped, where it is not installed).
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "itest.h"
#include "pinbroker.h"
#include "../check_main.h"

#define MiB (1024ull * 1024ull)
#define NODE_EXPORTER "/usr/bin/prometheus-node-exporter"

static struct daemon d;
static char dir[64], prom[128];

static void start(void)
{
	const char *args[] = { "--metrics-path", prom, "--metrics-interval-ms", "1000", NULL };

	snprintf(dir, sizeof(dir), "/tmp/pbmetrics.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(prom, sizeof(prom), "%s/pinbroker.prom", dir);
	daemon_start(&d, args);
}

static void stop(void)
{
	char cmd[128];

	ck_assert_int_eq(daemon_stop(&d), 0);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
}

/* The value of the sample line that starts with name (labels included), or -1. */
static double sample(const char *text, const char *name)
{
	size_t n = strlen(name);

	for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
		if (strncmp(l, name, n) == 0 && l[n] == ' ')
			return strtod(l + n + 1, NULL);
	return -1;
}

/* Wait until the file shows name at want (the daemon rewrites it every second). */
static char *wait_file(const char *name, double want)
{
	for (int i = 0; i < 60; i++) {
		char *t = itest_read_file(prom);

		if (t && sample(t, name) == want)
			return t;
		free(t);
		usleep(100 * 1000);
	}
	ck_abort_msg("%s never showed %s %.0f", prom, name, want);
	return NULL;
}

START_TEST(test_file_and_pinctl_show_the_figures_and_counters)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA, .label = "metrics" };
	struct stat st;
	char *t, *out = NULL, row[192];
	pb_client *c;
	pb_lease *l, *big;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_acquire(c, 6 * MiB, &o, &l), 0);
	ck_assert_int_eq(pb_acquire(c, 1ull << 40, &o, &big), -EFBIG);
	t = wait_file("pinbroker_leased_bytes", 6 * MiB);
	ck_assert(sample(t, "pinbroker_leases") == 1);
	ck_assert(sample(t, "pinbroker_acquires_granted_total") >= 1);
	ck_assert(sample(t, "pinbroker_acquires_refused_total{reason=\"too_large\"}") == 1);
	ck_assert(sample(t, "pinbroker_pressure_state{state=\"normal\"}") == 1);
	ck_assert(sample(t, "pinbroker_budget_bytes") == 256 * MiB);
	snprintf(row, sizeof(row), "pinbroker_uid_leased_bytes{uid=\"%u\",user=\"", (unsigned)getuid());
	ck_assert_ptr_nonnull(strstr(t, row));
	ck_assert_ptr_nonnull(strstr(t, "# TYPE pinbroker_acquires_refused_total counter"));
	free(t);
	/* Written whole and then renamed: no temp file left, readable by a collector running as another user. */
	ck_assert_int_eq(stat(prom, &st), 0);
	ck_assert_int_eq(st.st_mode & 0777, 0644);
	snprintf(row, sizeof(row), "%s.tmp", prom);
	ck_assert_int_ne(access(row, F_OK), 0);
	/* pinctl metrics prints the same figures. */
	ck_assert_int_eq(pinctl(&d, &out, "metrics"), 0);
	ck_assert(sample(out, "pinbroker_leased_bytes") == 6 * MiB);
	ck_assert(sample(out, "pinbroker_acquires_refused_total{reason=\"too_large\"}") == 1);
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "metrics extra"), 2);
	free(out);
	/* Something another user left beside the file is neither written to nor renamed into place. */
	snprintf(row, sizeof(row), "%s.tmp", prom);
	{
		FILE *f = fopen(row, "w");

		ck_assert_ptr_nonnull(f);
		fputs("planted\n", f);
		fclose(f);
	}
	pb_release(c, l);
	t = wait_file("pinbroker_leased_bytes", 0);
	free(t);
	t = itest_read_file(row);
	ck_assert_str_eq(t, "planted\n");
	free(t);
	pb_disconnect(c);
}
END_TEST

START_TEST(test_node_exporter_reads_the_file)
{
	char cmd[512], *out = NULL;
	pid_t ne;
	int port = 19000 + (int)(getpid() % 900), ok = 0;

	free(wait_file("pinbroker_leases", 0));
	ne = itest_fork();
	ck_assert_int_ge(ne, 0);
	if (ne == 0) {
		char addr[64], tf[128];

		snprintf(addr, sizeof(addr), "--web.listen-address=127.0.0.1:%d", port);
		snprintf(tf, sizeof(tf), "--collector.textfile.directory=%s", dir);
		if (!freopen("/dev/null", "w", stderr))
			_exit(126);
		execl(NODE_EXPORTER, NODE_EXPORTER, "--collector.disable-defaults", "--collector.textfile", tf, addr,
		      (char *)NULL);
		_exit(127);
	}
	snprintf(cmd, sizeof(cmd), "curl -sf http://127.0.0.1:%d/metrics", port);
	for (int i = 0; i < 50 && !ok; i++) {
		usleep(100 * 1000);
		free(out);
		out = NULL;
		ok = run_capture(cmd, &out) == 0 && strstr(out, "pinbroker_budget_bytes");
	}
	kill(ne, SIGTERM);
	itest_wait_exit(ne);
	ck_assert_msg(ok, "node_exporter never served the pinbroker metrics");
	ck_assert(sample(out, "node_textfile_scrape_error") == 0);
	ck_assert(sample(out, "pinbroker_budget_bytes") == 256 * MiB);
	free(out);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-metrics");
	TCase *t = tcase_create("metrics");

	tcase_add_checked_fixture(t, start, stop);
	tcase_set_timeout(t, 60);
	tcase_add_test(t, test_file_and_pinctl_show_the_figures_and_counters);
	if (access(NODE_EXPORTER, X_OK) == 0 && system("command -v curl >/dev/null") == 0)
		tcase_add_test(t, test_node_exporter_reads_the_file);
	else
		check_skip("node_exporter's textfile check needs prometheus-node-exporter and curl (scripts/deps.sh --test)");
	suite_add_tcase(s, t);
	return s;
}

CHECK_MAIN(suite)

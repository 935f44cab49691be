/* SPDX-License-Identifier: MIT */
/*
 * Integration: Prometheus metrics from the real pinbrokerd. metrics-path is rewritten atomically on its interval
 * (a reader never sees half a file, no temp file is left), `pinctl metrics` prints the same figures, counters move
 * with grants, refusals, revocations (by reason) and enforcements (by action), per-uid rows follow the holders, and
 * Debian's prometheus-node-exporter reads the file through its textfile collector without a scrape error (left
 * out, and the suite reported skipped, where it is not installed).
 */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "itest.h"
#include "pinbroker.h"
#include "check_main.h"

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

/* Wait until the file shows name at want (the daemon rewrites it every second). */
static char *wait_file(const char *name, double want)
{
	for (int i = 0; i < 60; i++) {
		char *t = itest_read_file(prom);

		if (t && itest_metrics_sample(t, name) == want)
			return t;
		free(t);
		usleep(100 * 1000);
	}
	ck_abort_msg("%s never showed %s %.0f", prom, name, want);
	return NULL;
}

static size_t count(const char *text, const char *what)
{
	size_t n = 0;

	for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
		n++;
	return n;
}

/* A whole file: it ends in a newline, every family has its HELP and TYPE, and the last line is there. */
static void assert_whole(const char *t, int read_no)
{
	size_t len = strlen(t);

	ck_assert_msg(len > 0 && t[len - 1] == '\n', "read %d: the file does not end in a newline:\n%s", read_no, t);
	ck_assert_msg(count(t, "# HELP ") == count(t, "# TYPE ") && count(t, "# TYPE ") >= 20,
		      "read %d: %zu HELP and %zu TYPE lines", read_no, count(t, "# HELP "), count(t, "# TYPE "));
	ck_assert_msg(itest_metrics_sample(t, "pinbroker_budget_bytes") == 256 * MiB, "read %d: no budget line",
		      read_no);
	ck_assert_msg(itest_metrics_sample(t, "pinbroker_metrics_timestamp_seconds") > 0,
		      "read %d: no timestamp line (the last)", read_no);
}

/* The names beside prom that look like metrics_write_file's temp files (PATH.XXXXXX), at most max. */
static size_t temp_names(char names[][64], size_t max)
{
	size_t n = strlen("pinbroker.prom."), k = 0;
	struct dirent *e;
	DIR *dp = opendir(dir);

	ck_assert_ptr_nonnull(dp);
	while ((e = readdir(dp)) && k < max)
		if (strncmp(e->d_name, "pinbroker.prom.", n) == 0 && strlen(e->d_name) == n + 6)
			memcpy(names[k++], e->d_name, n + 7); /* the length was checked: it fits, with its NUL */
	closedir(dp);
	return k;
}

/*
 * Temp files left behind. One being written right now is no leftover: it is renamed within its write, and the
 * next write gets a fresh random name. Writes follow one another, so once the file has been replaced (a new
 * inode) after the first look, any write that was under way then has renamed its temp file: count only names
 * seen in both looks.
 */
static int leftover_temp_files(void)
{
	char a[16][64], b[16][64];
	size_t na = temp_names(a, 16), nb;
	struct stat st;
	ino_t first;
	int k = 0;

	ck_assert_int_eq(stat(prom, &st), 0);
	first = st.st_ino;
	for (uint64_t t0 = itest_now_ms(); st.st_ino == first; usleep(20 * 1000)) {
		ck_assert_msg(itest_now_ms() - t0 < 5000, "%s was not rewritten within 5 s", prom);
		ck_assert_int_eq(stat(prom, &st), 0);
	}
	nb = temp_names(b, 16);
	for (size_t i = 0; i < na; i++)
		for (size_t j = 0; j < nb; j++)
			if (strcmp(a[i], b[j]) == 0)
				k++;
	return k;
}

START_TEST(test_file_and_pinctl_show_the_figures_and_counters)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA, .label = "metrics" };
	struct stat st;
	char *t, *out = NULL, row[192];
	pb_client *c;
	pb_lease *l, *big;
	double mem_ratio;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_acquire(c, 6 * MiB, &o, &l), 0);
	ck_assert_int_eq(pb_acquire(c, 1ull << 40, &o, &big), -EFBIG);
	t = wait_file("pinbroker_leased_bytes", 6 * MiB);
	ck_assert(itest_metrics_sample(t, "pinbroker_leases") == 1);
	ck_assert(itest_metrics_sample(t, "pinbroker_acquires_granted_total{kind=\"pool\"}") == 1);
	ck_assert(itest_metrics_sample(t, "pinbroker_granted_bytes_total{kind=\"pool\"}") == 6 * MiB);
	ck_assert(itest_metrics_sample(t, "pinbroker_acquires_granted_total{kind=\"registration\"}") == 0);
	ck_assert(itest_metrics_sample(t, "pinbroker_acquires_refused_total{reason=\"too_large\"}") == 1);
	ck_assert(itest_metrics_sample(t, "pinbroker_pressure_state{state=\"normal\"}") == 1);
	ck_assert(itest_metrics_sample(t, "pinbroker_budget_bytes") == 256 * MiB);
	snprintf(row, sizeof(row), "pinbroker_uid_leased_bytes{uid=\"%u\",user=\"", (unsigned)getuid());
	ck_assert_ptr_nonnull(strstr(t, row));
	ck_assert_ptr_nonnull(strstr(t, "# TYPE pinbroker_acquires_refused_total counter"));
	/* The pressure signals one metric each in base units (issue 28): MemAvailable as a ratio 0..1, in bytes. */
	mem_ratio = itest_metrics_sample(t, "pinbroker_mem_available_ratio");
	ck_assert_msg(mem_ratio > 0 && mem_ratio <= 1, "pinbroker_mem_available_ratio %g", mem_ratio);
	ck_assert(itest_metrics_sample(t, "pinbroker_mem_available_bytes") > 0);
	ck_assert_ptr_nonnull(strstr(t, "# TYPE pinbroker_mem_available_ratio gauge"));
	ck_assert_ptr_null(strstr(t, "pinbroker_signal"));
	free(t);
	/* Readable by a collector running as another user; written whole and then renamed (the test after next). */
	ck_assert_int_eq(stat(prom, &st), 0);
	ck_assert_int_eq(st.st_mode & 0777, 0644);
	/* pinctl metrics prints the same figures. */
	ck_assert_int_eq(pinctl(&d, &out, "metrics"), 0);
	ck_assert(itest_metrics_sample(out, "pinbroker_leased_bytes") == 6 * MiB);
	ck_assert(itest_metrics_sample(out, "pinbroker_acquires_refused_total{reason=\"too_large\"}") == 1);
	free(out);
	itest_pinctl_says(&d, 2, "metrics extra", NULL);
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

START_TEST(test_file_is_replaced_whole_and_leaves_no_temp_file)
{
	struct stat st;
	ino_t first;
	int rewrites = 0;

	free(wait_file("pinbroker_leases", 0));
	ck_assert_int_eq(stat(prom, &st), 0);
	first = st.st_ino;
	/*
	 * Read it over and over while the daemon rewrites it (every second): each read is one whole file, never a
	 * half-written one. Bounded: at most 4000 reads (about 10 s), done after three rewrites were seen.
	 */
	for (int i = 0; i < 4000 && rewrites < 3; i++) {
		char *t = itest_read_file(prom);
		ino_t ino;

		ck_assert_msg(t != NULL, "read %d: %s is gone", i, prom);
		assert_whole(t, i);
		free(t);
		ck_assert_int_eq(stat(prom, &st), 0);
		ino = st.st_ino;
		if (ino != first) {
			rewrites++;
			first = ino;
		}
		usleep(2500);
	}
	/* Each rewrite is a rename of a fresh file over it: a new inode. */
	ck_assert_msg(rewrites >= 1, "%s was never rewritten", prom);
	ck_assert_int_eq(leftover_temp_files(), 0);
}
END_TEST

/* An admin's revoke is counted by reason; a holder that misses the deadline, by enforcement action. */
START_TEST(test_revocations_and_enforcements_by_reason)
{
	static const char *const zero[] = {
		"pinbroker_revocations_total{reason=\"pressure\"}",
		"pinbroker_revocations_total{reason=\"idle_reclaim\"}",
		"pinbroker_revocations_total{reason=\"self\"}",
		"pinbroker_revocations_total{reason=\"job_quota\"}",
		"pinbroker_enforcements_total{action=\"sigterm\"}",
		"pinbroker_enforcements_total{action=\"sigkill\"}",
	};
	char *t, *out = NULL;
	uint64_t id = 0;
	int fd;

	/* Every reason and action has its row from the start, at 0, so rate() sees each series. */
	t = wait_file("pinbroker_leases", 0);
	ck_assert(itest_metrics_sample(t, "pinbroker_revocations_total{reason=\"admin\"}") == 0);
	ck_assert(itest_metrics_sample(t, "pinbroker_enforcements_total{action=\"disconnect\"}") == 0);
	for (size_t i = 0; i < sizeof(zero) / sizeof(zero[0]); i++)
		ck_assert_msg(itest_metrics_sample(t, zero[i]) == 0, "%s: %.0f", zero[i],
			      itest_metrics_sample(t, zero[i]));
	ck_assert_ptr_nonnull(strstr(t, "# TYPE pinbroker_revocations_total counter"));
	ck_assert_ptr_nonnull(strstr(t, "# TYPE pinbroker_enforcements_total counter"));
	free(t);

	/* A raw holder never answers REVOKE: disconnected at the deadline (not signalled: it is this process). */
	itest_pinctl_says(&d, 0, "set revoke-enforce disconnect", NULL);
	fd = raw_lease_held(d.socket, 2 * MiB, &id);
	ck_assert_int_eq(pinctl(&d, &out, "revoke %llu --deadline 100", (unsigned long long)id), 0);
	free(out);
	ck_assert_msg(raw_closed_by_peer(fd, 10000), "the overdue holder was not disconnected");
	close(fd);
	t = wait_file("pinbroker_enforcements_total{action=\"disconnect\"}", 1);
	ck_assert(itest_metrics_sample(t, "pinbroker_revocations_total{reason=\"admin\"}") == 1);
	for (size_t i = 0; i < sizeof(zero) / sizeof(zero[0]); i++)
		ck_assert_msg(itest_metrics_sample(t, zero[i]) == 0, "%s: %.0f", zero[i],
			      itest_metrics_sample(t, zero[i]));
	free(t);
	ck_assert_int_eq(pinctl(&d, &out, "metrics"), 0);
	ck_assert(itest_metrics_sample(out, "pinbroker_revocations_total{reason=\"admin\"}") == 1);
	ck_assert(itest_metrics_sample(out, "pinbroker_enforcements_total{action=\"disconnect\"}") == 1);
	free(out);
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
	ck_assert(itest_metrics_sample(out, "node_textfile_scrape_error") == 0);
	ck_assert(itest_metrics_sample(out, "pinbroker_budget_bytes") == 256 * MiB);
	free(out);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-metrics");
	TCase *t = CHECK_CASE(s, "metrics", start, stop, 60, test_file_and_pinctl_show_the_figures_and_counters,
			      test_file_is_replaced_whole_and_leaves_no_temp_file,
			      test_revocations_and_enforcements_by_reason);

	if (access(NODE_EXPORTER, X_OK) == 0 && system("command -v curl >/dev/null") == 0)
		tcase_add_test(t, test_node_exporter_reads_the_file);
	else
		check_skip(
			"node_exporter's textfile check needs prometheus-node-exporter and curl (scripts/deps.sh --test)");
	return s;
}

CHECK_MAIN(suite)

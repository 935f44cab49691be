/* SPDX-License-Identifier: MIT */
/*
 * Integration: a small fleet on one machine (issue 12, item 9). Three real pinbrokerd nodes, each with its
 * own socket, budget and fixture proc root, run jobs whose clients are real processes in fixture cgroups.
 * Each node's metrics and `pinctl jobs` show what is held on that node only, a job quota on one node binds
 * there only, and one node's memory pressure revokes that node's leases and no other's.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "itest.h"
#include "pinbroker.h"
#include "check_main.h"

#define MiB (1024ull * 1024ull)
#define MEMTOTAL_KB 24683548ull /* the idle fixture's MemTotal */
#define NODES 3
#define KIDS_MAX 32
#define MSG_BYTES 256

/* Cgroups as /proc/PID/cgroup names them: job 1 on the unified hierarchy, job 2's steps on v1's memory controller. */
#define JOB1 "/fleet.slice/job_1"
#define JOB2 "/fleet.slice/job_2"
#define CG_JOB1 "0::" JOB1 "\n"
#define CG_JOB2 "0::" JOB2 "\n"
#define CG_JOB2_STEP0 "7:memory:" JOB2 "/step_0\n0::/\n"
#define CG_JOB2_STEP1 "7:memory:" JOB2 "/step_1\n0::/\n"

struct node {
	struct daemon d;
	char root[320]; /* its fixture proc root, inside d.dir */
	char prom[320]; /* its metrics-path */
	uint64_t budget_bytes;
};

/* A client process: one lease on one node, released when the daemon revokes it. */
struct kid {
	pid_t pid;
	int fd; /* its reports: the acquire's result, then an 'R' for each revoke it handled */
	int node;
	uint64_t bytes;
	bool revoked;
};

/* Made by the runner (unchecked fixture): every node's dir lives in it, so a failed test's leave too. */
static char fleet[64];
static struct node nodes[NODES];
static struct kid kids[KIDS_MAX];
static int nkids;

static const uint64_t budgets[NODES] = { 64 * MiB, 128 * MiB, 96 * MiB };

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---------------------------------------------------------------- the fleet */

static void fleet_make(void)
{
	snprintf(fleet, sizeof(fleet), "/tmp/pbfleet.XXXXXX");
	if (!mkdtemp(fleet))
		fleet[0] = '\0';
}

static void fleet_remove(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", fleet);
	if (fleet[0] && getenv("PINBROKER_KEEP_TEST_DIRS") == NULL && system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", fleet);
}

/* In the daemon's child: it goes when the test does, even when a failed check ends the test at once. */
static void die_with_test(void *ud)
{
	(void)ud;
	prctl(PR_SET_PDEATHSIG, SIGTERM);
}

static void write_file(const char *path, const char *text)
{
	char tmp[600];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.new", path);
	f = fopen(tmp, "w");
	ck_assert_msg(f != NULL, "cannot write %s: %s", tmp, strerror(errno));
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_int_eq(rename(tmp, path), 0); /* atomic for the daemon's sampler */
}

/* Node i's MemAvailable at pct of MemTotal, in its fixture meminfo (the idle capture's other lines). */
static void set_mem_available_pct(int i, double pct)
{
	char path[400], *text, *line, out[8192];
	size_t len = 0;

	text = itest_read_file(FIXTURES_DIR "/proc/idle/proc/meminfo");
	ck_assert_ptr_nonnull(text);
	out[0] = '\0';
	for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		char buf[128];

		line = l;
		if (strncmp(line, "MemAvailable:", 13) == 0) {
			snprintf(buf, sizeof(buf), "MemAvailable:   %llu kB",
				 (unsigned long long)(MEMTOTAL_KB * pct / 100.0));
			line = buf;
		}
		len += (size_t)snprintf(out + len, sizeof(out) - len, "%s\n", line);
		ck_assert_uint_lt(len, sizeof(out));
	}
	free(text);
	snprintf(path, sizeof(path), "%s/proc/meminfo", nodes[i].root);
	write_file(path, out);
}

static void node_start(int i)
{
	struct node *n = &nodes[i];
	char dir[sizeof(n->d.dir)], budget[32], conf[sizeof(n->d.dir) + 32];
	const char *args[32] = { "--proc-root",           n->root, "--budget",        budget,
				 "--poll-interval-ms",    "100",   "--hysteresis-ms", "800",
				 "--revoke-deadline-ms",  "1000",  "--metrics-path",  n->prom,
				 "--metrics-interval-ms", "1000" };
	size_t na = 14;

	memset(n, 0, sizeof(*n));
	/* daemon_prepare's layout, inside the fleet's dir. */
	snprintf(dir, sizeof(dir), "%s/node%d.XXXXXX", fleet, i + 1);
	ck_assert_ptr_nonnull(mkdtemp(dir));
	ck_assert_int_eq(chmod(dir, 0755), 0);
	memcpy(n->d.dir, dir, sizeof(dir));
	snprintf(n->d.socket, sizeof(n->d.socket), "%s/pb.sock", dir);
	snprintf(n->d.log, sizeof(n->d.log), "%s/daemon.log", dir);
	snprintf(n->root, sizeof(n->root), "%s/root", dir);
	snprintf(n->prom, sizeof(n->prom), "%s/pinbroker.prom", dir);
	n->budget_bytes = budgets[i];
	snprintf(budget, sizeof(budget), "%lluM", (unsigned long long)(budgets[i] / MiB));
	itest_proc_root_copy(n->root, NULL);

	if (i == 1) {
		/* Node 2 has job 1's quota in its config file. */
		snprintf(conf, sizeof(conf), "%s/pinbrokerd.conf", dir);
		write_file(conf, "job-quota = " JOB1 ":24M\n");
		ck_assert_int_eq(chmod(conf, 0644), 0);
		args[na++] = "--config";
		args[na++] = conf;
	} else if (i == 2) {
		/* Node 3 gives every job under the slice 64M, its steps summed. */
		args[na++] = "--job-quota";
		args[na++] = "/fleet.slice/*:64M";
	}
	args[na] = NULL;
	daemon_restart_with(&n->d, args, die_with_test, NULL);
}

static void start(void)
{
	ck_assert_msg(fleet[0], "no fleet dir");
	nkids = 0;
	for (int i = 0; i < NODES; i++)
		node_start(i);
}

/* Signal kid k (sig 0: it is exiting anyway) and reap it; its exit status, or 128 + the signal. */
static int kid_reap(struct kid *k, int sig)
{
	char cmd[600];
	int st;

	if (k->pid <= 0)
		return -1;
	if (sig)
		kill(k->pid, sig);
	st = itest_wait_exit(k->pid);
	close(k->fd);
	/* Its fixture /proc entry goes too: a later process of the same pid must not join its job. */
	snprintf(cmd, sizeof(cmd), "rm -rf '%s/proc/%d'", nodes[k->node].root, (int)k->pid);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s/proc/%d\n", nodes[k->node].root, (int)k->pid);
	k->pid = 0;
	return st;
}

static void stop(void)
{
	int st[NODES];

	for (int i = 0; i < nkids; i++)
		kid_reap(&kids[i], SIGKILL);
	nkids = 0;
	for (int i = 0; i < NODES; i++)
		st[i] = daemon_stop(&nodes[i].d);
	for (int i = 0; i < NODES; i++)
		ck_assert_msg(st[i] == 0, "node %d exited %d", i + 1, st[i]);
}

/* ---------------------------------------------------------------- clients */

static int revoke_cb(pb_client *c, pb_lease *l, uint32_t deadline_ms, void *ud)
{
	int fd = (int)(intptr_t)ud;

	(void)deadline_ms;
	pb_release(c, l);
	if (write(fd, "R", 1) != 1)
		_exit(5);
	return 0;
}

/* The child: put itself in cgroup (its fixture /proc/PID/cgroup, before it connects), acquire, report, hold. */
static __attribute__((noreturn)) void client_main(const struct node *n, const char *cgroup, uint64_t bytes, int fd)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA, .label = "fleet" };
	char path[600], msg[MSG_BYTES] = "";
	pb_client *c = NULL;
	pb_lease *l;
	FILE *f;
	int r;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	snprintf(path, sizeof(path), "%s/proc/%d", n->root, (int)getpid());
	if (mkdir(path, 0755) < 0)
		_exit(10);
	snprintf(path, sizeof(path), "%s/proc/%d/cgroup", n->root, (int)getpid());
	f = fopen(path, "w");
	if (!f || fputs(cgroup, f) < 0 || fclose(f) != 0)
		_exit(11);
	r = pb_connect(n->d.socket, &c);
	if (r == 0) {
		pb_set_revoke_callback(c, revoke_cb, (void *)(intptr_t)fd);
		r = pb_acquire(c, bytes, &o, &l);
	}
	if (r < 0)
		snprintf(msg, sizeof(msg), "%s", pb_last_error());
	if (write(fd, &r, sizeof(r)) != sizeof(r) || write(fd, msg, sizeof(msg)) != sizeof(msg))
		_exit(12);
	if (r < 0)
		_exit(0);
	for (;;)
		pause();
}

/*
 * A client of job cgroup on node i holding bytes: its acquire's result (0, or the -errno pb_acquire
 * returned, with the daemon's message in msg when msg is not NULL). A refused client has exited.
 */
static int client_msg(int i, const char *cgroup, uint64_t bytes, char *msg, size_t msglen)
{
	char m[MSG_BYTES];
	struct pollfd p;
	int pfd[2], r = 0;
	pid_t pid;

	ck_assert_int_lt(nkids, KIDS_MAX);
	ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
	pid = itest_fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(pfd[0]);
		client_main(&nodes[i], cgroup, bytes, pfd[1]);
	}
	close(pfd[1]);
	p = (struct pollfd){ .fd = pfd[0], .events = POLLIN };
	ck_assert_msg(poll(&p, 1, 10000) == 1, "client on node %d never reported", i + 1);
	if (read(pfd[0], &r, sizeof(r)) != sizeof(r) || read(pfd[0], m, sizeof(m)) != sizeof(m)) {
		kill(pid, SIGKILL);
		ck_abort_msg("client on node %d died before it reported: exit %d", i + 1, itest_wait_exit(pid));
	}
	if (msg)
		snprintf(msg, msglen, "%.*s", (int)sizeof(m), m);
	kids[nkids] = (struct kid){ .pid = pid, .fd = pfd[0], .node = i, .bytes = bytes };
	if (r < 0) {
		int st = kid_reap(&kids[nkids], 0);

		ck_assert_msg(st == 0, "refused client on node %d exited %d", i + 1, st);
	} else {
		nkids++;
	}
	return r;
}

static int client(int i, const char *cgroup, uint64_t bytes)
{
	return client_msg(i, cgroup, bytes, NULL, 0);
}

/* A client that must be granted; its index in kids[]. */
static int holder(int i, const char *cgroup, uint64_t bytes)
{
	char msg[MSG_BYTES];
	int r = client_msg(i, cgroup, bytes, msg, sizeof(msg));

	ck_assert_msg(r == 0, "node %d refused %s %llu MiB: %d (%s)", i + 1, cgroup, (unsigned long long)(bytes / MiB),
		      r, msg);
	return nkids - 1;
}

/* Has kid k handled a revoke within timeout_ms? */
static bool kid_revoked(struct kid *k, int timeout_ms)
{
	struct pollfd p = { .fd = k->fd, .events = POLLIN };
	char c;

	if (!k->revoked && poll(&p, 1, timeout_ms) == 1 && read(k->fd, &c, 1) == 1 && c == 'R')
		k->revoked = true;
	return k->revoked;
}

/* ---------------------------------------------------------------- what the nodes say */

/* The sum of every series of a family (all its label values), or -1 when it has none. */
static double sample_sum(const char *text, const char *family)
{
	size_t n = strlen(family);
	double sum = -1;

	for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		const char *v = NULL;

		if (strncmp(l, family, n) != 0)
			continue;
		if (l[n] == ' ')
			v = l + n + 1;
		else if (l[n] == '{' && strchr(l, '}'))
			v = strchr(l, '}') + 1;
		if (v)
			sum = (sum < 0 ? 0 : sum) + strtod(v, NULL);
	}
	return sum;
}

__attribute__((noinline)) static char *metrics(int i)
{
	char *out = NULL;
	int r = pinctl(&nodes[i].d, &out, "metrics");

	ck_assert_msg(r == 0, "pinctl metrics on node %d: %d\n%s", i + 1, r, out);
	return out;
}

static double metric(int i, const char *name)
{
	char *t = metrics(i);
	double v = itest_metrics_sample(t, name);

	free(t);
	return v;
}

static double job_metric(int i, const char *series, const char *job)
{
	char name[256];

	snprintf(name, sizeof(name), "pinbroker_%s{cgroup=\"%s\"}", series, job);
	return metric(i, name);
}

/* Every series of family on node i, summed (revocations over their reasons, grants over their kinds). */
static double metric_sum(int i, const char *family)
{
	char *t = metrics(i);
	double v = sample_sum(t, family);

	free(t);
	return v;
}

static bool wait_metric(int i, const char *name, double want, int timeout_ms)
{
	uint64_t t0 = mono_ms();

	for (;;) {
		if (metric(i, name) == want)
			return true;
		if (mono_ms() - t0 > (uint64_t)timeout_ms)
			return false;
		usleep(20000);
	}
}

/* Poll node i's metric name until it is within tol of want: true, or false after timeout_ms. */
static bool wait_metric_near(int i, const char *name, double want, double tol, int timeout_ms)
{
	for (uint64_t t0 = mono_ms(); mono_ms() - t0 <= (uint64_t)timeout_ms; usleep(20000)) {
		double off = metric(i, name) - want;

		if (off <= tol && off >= -tol)
			return true;
	}
	return false;
}

static bool state_is(int i, const char *state)
{
	char name[96];

	snprintf(name, sizeof(name), "pinbroker_pressure_state{state=\"%s\"}", state);
	return metric(i, name) == 1;
}

/* Node i's budget and leased bytes, and each job's leased bytes (-1: no row), as `pinctl metrics` has them. */
static void assert_node(int i, uint64_t leased, double job1, double job2)
{
	char *t = metrics(i), name[128];

	ck_assert_msg(itest_metrics_sample(t, "pinbroker_budget_bytes") == (double)nodes[i].budget_bytes,
		      "node %d budget %.0f", i + 1, itest_metrics_sample(t, "pinbroker_budget_bytes"));
	ck_assert_msg(itest_metrics_sample(t, "pinbroker_leased_bytes") == (double)leased,
		      "node %d leased %.0f, want %llu", i + 1, itest_metrics_sample(t, "pinbroker_leased_bytes"),
		      (unsigned long long)leased);
	snprintf(name, sizeof(name), "pinbroker_job_leased_bytes{cgroup=\"%s\"}", JOB1);
	ck_assert_msg(itest_metrics_sample(t, name) == job1, "node %d %s: %.0f, want %.0f", i + 1, name,
		      itest_metrics_sample(t, name), job1);
	snprintf(name, sizeof(name), "pinbroker_job_leased_bytes{cgroup=\"%s\"}", JOB2);
	ck_assert_msg(itest_metrics_sample(t, name) == job2, "node %d %s: %.0f, want %.0f", i + 1, name,
		      itest_metrics_sample(t, name), job2);
	free(t);
}

__attribute__((noinline)) static char *pinctl_out(int i, const char *args)
{
	char *out = NULL;
	int r = pinctl(&nodes[i].d, &out, "%s", args);

	ck_assert_msg(r == 0, "pinctl %s on node %d: %d\n%s", args, i + 1, r, out);
	return out;
}

/*
 * The object of job in `pinctl jobs --json` (or quota list --json) text js: true when listed, with its bytes,
 * leases and quota (-1 for null).
 */
static bool json_job(const char *js, const char *job, uint64_t *bytes, unsigned *leases, int64_t *quota)
{
	char want[256];
	const char *p;
	unsigned long long b = 0, q = 0;
	unsigned n = 0;

	snprintf(want, sizeof(want), "{\"job\":\"%s\",", job);
	p = strstr(js, want);
	if (!p)
		return false;
	p += strlen(want);
	ck_assert_msg(sscanf(p, "\"bytes\":%llu,\"leases\":%u", &b, &n) == 2, "odd job row: %.120s", p);
	*bytes = b;
	*leases = n;
	p = strstr(p, "\"quota_bytes\":");
	ck_assert_ptr_nonnull(p);
	*quota = sscanf(p, "\"quota_bytes\":%llu", &q) == 1 ? (int64_t)q : -1;
	return true;
}

static void assert_job(const char *js, int i, const char *job, uint64_t bytes, unsigned leases, int64_t quota)
{
	uint64_t b;
	unsigned n;
	int64_t q;

	ck_assert_msg(json_job(js, job, &b, &n, &q), "node %d lists no job %s: %s", i + 1, job, js);
	ck_assert_msg(b == bytes && n == leases && q == quota,
		      "node %d job %s: %" PRIu64 " bytes in %u leases, quota %" PRId64 "; want %" PRIu64
		      " in %u, %" PRId64,
		      i + 1, job, b, n, q, bytes, leases, quota);
}

/* ---------------------------------------------------------------- tests */

START_TEST(test_each_node_shows_its_own_budget_and_nothing_leased)
{
	for (int i = 0; i < NODES; i++) {
		char *t = NULL, *js;
		uint64_t b;
		unsigned n;
		int64_t q;

		assert_node(i, 0, i == 1 ? 0 : -1, -1); /* node 2's literal rule has a row of its own */
		ck_assert(state_is(i, "normal"));
		ck_assert_msg(metric(i, "pinbroker_leases") == 0, "node %d has leases", i + 1);
		ck_assert_msg(metric_sum(i, "pinbroker_revocations_total") == 0, "node %d revoked", i + 1);
		/* Its metrics-path is its own and says the same. */
		for (int w = 0; w < 50 && !(t && itest_metrics_sample(t, "pinbroker_budget_bytes") >= 0); w++) {
			free(t);
			usleep(100 * 1000);
			t = itest_read_file(nodes[i].prom);
		}
		ck_assert_msg(t != NULL, "node %d never wrote %s", i + 1, nodes[i].prom);
		ck_assert(itest_metrics_sample(t, "pinbroker_budget_bytes") == (double)budgets[i]);
		ck_assert(itest_metrics_sample(t, "pinbroker_leased_bytes") == 0);
		free(t);
		/* No job holds anything; node 2's config rule is listed (a literal rule makes its job), with its quota. */
		js = pinctl_out(i, "jobs --json");
		ck_assert_msg(!json_job(js, JOB2, &b, &n, &q), "node %d lists %s: %s", i + 1, JOB2, js);
		if (i == 1)
			assert_job(js, i, JOB1, 0, 0, 24 * MiB);
		else
			ck_assert_msg(!json_job(js, JOB1, &b, &n, &q), "node %d lists %s: %s", i + 1, JOB1, js);
		free(js);
	}
	ck_assert(job_metric(1, "job_quota_bytes", JOB1) == 24 * MiB);
	ck_assert(job_metric(0, "job_quota_bytes", JOB1) == -1);
	/* Three sockets, three daemons. */
	ck_assert_str_ne(nodes[0].d.socket, nodes[1].d.socket);
	ck_assert_int_ne(nodes[0].d.pid, nodes[2].d.pid);
}
END_TEST

START_TEST(test_jobs_across_nodes_are_counted_per_node)
{
	char *js;
	uint64_t b;
	unsigned n;
	int64_t q;

	/* Job 1 on nodes 1 and 2, job 2 on nodes 2 and 3 (two steps there). */
	holder(0, CG_JOB1, 8 * MiB);
	holder(0, CG_JOB1, 4 * MiB);
	holder(1, CG_JOB1, 6 * MiB);
	holder(1, CG_JOB2, 10 * MiB);
	holder(2, CG_JOB2_STEP0, 12 * MiB);
	holder(2, CG_JOB2_STEP1, 4 * MiB);

	assert_node(0, 12 * MiB, 12 * MiB, -1);
	assert_node(1, 16 * MiB, 6 * MiB, 10 * MiB);
	assert_node(2, 16 * MiB, -1, 16 * MiB);
	ck_assert(job_metric(0, "job_leases", JOB1) == 2);
	ck_assert(job_metric(1, "job_leases", JOB1) == 1);
	ck_assert(job_metric(1, "job_leases", JOB2) == 1);
	ck_assert(job_metric(2, "job_leases", JOB2) == 2);
	/* Quotas where a rule covers the job: node 2's config rule, node 3's glob; none on node 1. */
	ck_assert(job_metric(0, "job_quota_bytes", JOB1) == -1);
	ck_assert(job_metric(1, "job_quota_bytes", JOB1) == 24 * MiB);
	ck_assert(job_metric(1, "job_quota_bytes", JOB2) == -1);
	ck_assert(job_metric(2, "job_quota_bytes", JOB2) == 64 * MiB);
	for (int i = 0; i < NODES; i++)
		ck_assert_int_eq(status_leased(nodes[i].d.socket), (int64_t)(i == 0 ? 12 * MiB : 16 * MiB));

	js = pinctl_out(0, "jobs --json");
	assert_job(js, 0, JOB1, 12 * MiB, 2, -1);
	ck_assert_msg(!json_job(js, JOB2, &b, &n, &q), "node 1 lists job 2: %s", js);
	free(js);
	js = pinctl_out(1, "jobs --json");
	assert_job(js, 1, JOB1, 6 * MiB, 1, 24 * MiB);
	assert_job(js, 1, JOB2, 10 * MiB, 1, -1);
	free(js);
	js = pinctl_out(2, "jobs --json");
	assert_job(js, 2, JOB2, 16 * MiB, 2, 64 * MiB);
	ck_assert_msg(!json_job(js, JOB1, &b, &n, &q), "node 3 lists job 1: %s", js);
	ck_assert_msg(!strstr(js, "step_"), "node 3 lists a step as a job of its own: %s", js);
	free(js);
}
END_TEST

START_TEST(test_job_quota_binds_on_its_node_only)
{
	char msg[MSG_BYTES], *js;

	/* Node 2's config gives job 1 24M: 16M fit, 12M more do not; job 2 there and job 1 on node 1 go on. */
	holder(1, CG_JOB1, 16 * MiB);
	ck_assert_int_eq(client_msg(1, CG_JOB1, 12 * MiB, msg, sizeof(msg)), -EDQUOT);
	ck_assert_msg(strstr(msg, "job " JOB1), "refusal does not name the job: %s", msg);
	holder(1, CG_JOB2, 12 * MiB);
	holder(0, CG_JOB1, 12 * MiB);
	assert_node(1, 28 * MiB, 16 * MiB, 12 * MiB);
	assert_node(0, 12 * MiB, 12 * MiB, -1);
	ck_assert(metric(1, "pinbroker_acquires_refused_total{reason=\"job_quota\"}") == 1);
	ck_assert(metric(0, "pinbroker_acquires_refused_total{reason=\"job_quota\"}") == 0);
	ck_assert(metric(2, "pinbroker_acquires_refused_total{reason=\"job_quota\"}") == 0);

	/* pinctl quota set raises it on node 2 (a set rule wins over the config's of the same path). */
	free(pinctl_out(1, "quota set " JOB1 " 40M"));
	ck_assert(job_metric(1, "job_quota_bytes", JOB1) == 40 * MiB);
	holder(1, CG_JOB1, 12 * MiB);
	ck_assert_int_eq(client(1, CG_JOB1, 14 * MiB), -EDQUOT);
	js = pinctl_out(1, "quota list --json");
	ck_assert_msg(strstr(js, "{\"pattern\":\"" JOB1 "\",\"bytes\":41943040,\"source\":\"set\""), "%s", js);
	ck_assert_msg(strstr(js, "{\"pattern\":\"" JOB1 "\",\"bytes\":25165824,\"source\":\"config\""), "%s", js);
	assert_job(js, 1, JOB1, 28 * MiB, 2, 40 * MiB);
	free(js);

	/* Node 1 gets a quota of its own below what job 1 holds there: nothing is revoked, nothing more granted. */
	free(pinctl_out(0, "quota set " JOB1 " 4M"));
	ck_assert_int_eq(client(0, CG_JOB1, 2 * MiB), -EDQUOT);
	assert_node(0, 12 * MiB, 12 * MiB, -1);
	ck_assert(job_metric(1, "job_quota_bytes", JOB1) == 40 * MiB);
	/* Node 3 never heard of either. */
	holder(2, CG_JOB1, 30 * MiB);
	assert_node(2, 30 * MiB, 30 * MiB, -1);

	/* Clearing node 2's set rule brings back the config's 24M (job 1 holds 28M there: still refused)... */
	free(pinctl_out(1, "quota clear " JOB1));
	ck_assert(job_metric(1, "job_quota_bytes", JOB1) == 24 * MiB);
	ck_assert_int_eq(client(1, CG_JOB1, 2 * MiB), -EDQUOT);
	/* ...and clearing that one too lets job 1 through. */
	free(pinctl_out(1, "quota clear " JOB1));
	ck_assert(job_metric(1, "job_quota_bytes", JOB1) == -1);
	holder(1, CG_JOB1, 14 * MiB);
	assert_node(1, 54 * MiB, 42 * MiB, 12 * MiB);
	ck_assert(metric(1, "pinbroker_acquires_refused_total{reason=\"job_quota\"}") == 3);
	/* Node 1's rule is still there until it is cleared. */
	ck_assert_int_eq(client(0, CG_JOB1, 2 * MiB), -EDQUOT);
	free(pinctl_out(0, "quota clear " JOB1));
	holder(0, CG_JOB1, 2 * MiB);
	assert_node(0, 14 * MiB, 14 * MiB, -1);
	ck_assert(metric(0, "pinbroker_acquires_refused_total{reason=\"job_quota\"}") == 2);
}
END_TEST

START_TEST(test_pressure_on_one_node_revokes_only_its_leases)
{
	int a1 = holder(0, CG_JOB1, 8 * MiB);
	int a2 = holder(1, CG_JOB1, 8 * MiB);
	int b2 = holder(1, CG_JOB2, 4 * MiB);
	int b3 = holder(2, CG_JOB2_STEP0, 8 * MiB);
	char *before[NODES];

	assert_node(1, 12 * MiB, 8 * MiB, 4 * MiB);
	for (int i = 0; i < NODES; i++)
		ck_assert(state_is(i, "normal"));

	set_mem_available_pct(1, 3.0); /* under critical-mem-available-pct (5%) */
	ck_assert_msg(wait_metric(1, "pinbroker_pressure_state{state=\"critical\"}", 1, 3000),
		      "node 2 never went critical");
	/* Its cooperative clients hear the revoke and give everything back well inside the 1 s deadline. */
	ck_assert_msg(kid_revoked(&kids[a2], 3000), "node 2's job 1 client saw no revoke");
	ck_assert_msg(kid_revoked(&kids[b2], 3000), "node 2's job 2 client saw no revoke");
	ck_assert_int_eq(wait_leased(nodes[1].d.socket, 0, 2000), 0);
	/* The literal config rule keeps job 1's row (at 0); job 2 has no rule there and no row left. */
	assert_node(1, 0, 0, -1);
	/* Both for pressure, and nothing else. */
	ck_assert(metric(1, "pinbroker_revocations_total{reason=\"pressure\"}") == 2);
	ck_assert(metric_sum(1, "pinbroker_revocations_total") == 2);
	ck_assert(metric(1, "pinbroker_leases") == 0);
	ck_assert(metric(1, "pinbroker_overdue_bytes") == 0);
	ck_assert_int_eq(client(1, CG_JOB2, 2 * MiB), -EAGAIN);
	ck_assert(metric(1, "pinbroker_acquires_refused_total{reason=\"critical\"}") == 1);

	/*
	 * Nodes 1 and 3 saw none of it: once each has polled its own memory since (a MemAvailable of 60%, still
	 * normal, written now and shown in its metrics), all is as it was.
	 */
	for (int i = 0; i < NODES; i++)
		before[i] = NULL;
	for (int i = 0; i < NODES; i += 2) {
		set_mem_available_pct(i, 60.0);
		ck_assert_msg(wait_metric_near(i, "pinbroker_mem_available_ratio", 0.60, 0.001, 3000),
			      "node %d never polled its new MemAvailable", i + 1);
	}
	ck_assert(!kid_revoked(&kids[a1], 0));
	ck_assert(!kid_revoked(&kids[b3], 0));
	assert_node(0, 8 * MiB, 8 * MiB, -1);
	assert_node(2, 8 * MiB, -1, 8 * MiB);
	for (int i = 0; i < NODES; i += 2) {
		ck_assert_msg(state_is(i, "normal"), "node %d left normal", i + 1);
		ck_assert(metric_sum(i, "pinbroker_revocations_total") == 0);
		ck_assert(metric(i, "pinbroker_leases") == 1);
		ck_assert(metric(i, "pinbroker_acquires_refused_total{reason=\"critical\"}") == 0);
		before[i] = metrics(i);
	}
	/* And they go on lending. */
	holder(0, CG_JOB1, 2 * MiB);
	holder(2, CG_JOB2_STEP1, 2 * MiB);
	assert_node(0, 10 * MiB, 10 * MiB, -1);
	assert_node(2, 10 * MiB, -1, 10 * MiB);
	ck_assert(state_is(1, "critical"));
	for (int i = 0; i < NODES; i += 2) {
		char *now = metrics(i);

		ck_assert(itest_metrics_sample(now, "pinbroker_acquires_granted_total{kind=\"pool\"}") ==
			  itest_metrics_sample(before[i], "pinbroker_acquires_granted_total{kind=\"pool\"}") + 1);
		free(now);
		free(before[i]);
	}
}
END_TEST

START_TEST(test_killed_client_returns_its_bytes_on_its_node_only)
{
	int victim;
	char *js;
	uint64_t b;
	unsigned n;
	int64_t q;

	holder(0, CG_JOB1, 8 * MiB);
	holder(1, CG_JOB2, 6 * MiB);
	holder(2, CG_JOB2_STEP0, 4 * MiB);
	victim = holder(2, CG_JOB2_STEP1, 10 * MiB);
	holder(2, CG_JOB1, 2 * MiB);
	assert_node(2, 16 * MiB, 2 * MiB, 14 * MiB);

	kid_reap(&kids[victim], SIGKILL);
	ck_assert_int_eq(wait_leased(nodes[2].d.socket, 6 * MiB, 3000), (int64_t)(6 * MiB));
	assert_node(2, 6 * MiB, 2 * MiB, 4 * MiB);
	ck_assert(job_metric(2, "job_leases", JOB2) == 1);
	js = pinctl_out(2, "jobs --json");
	assert_job(js, 2, JOB2, 4 * MiB, 1, 64 * MiB);
	assert_job(js, 2, JOB1, 2 * MiB, 1, 64 * MiB);
	free(js);
	/* Job 2 on node 2, and node 1, are untouched. */
	assert_node(0, 8 * MiB, 8 * MiB, -1);
	assert_node(1, 6 * MiB, 0, 6 * MiB); /* job 1 has a row there: its literal config rule */
	js = pinctl_out(1, "jobs --json");
	assert_job(js, 1, JOB2, 6 * MiB, 1, -1);
	free(js);
	for (int i = 0; i < NODES; i++)
		ck_assert(metric_sum(i, "pinbroker_revocations_total") == 0);

	/* The last of job 2's clients on node 3 goes too: its job is gone there, and still on node 2. */
	for (int i = 0; i < nkids; i++)
		if (kids[i].pid > 0 && kids[i].node == 2 && kids[i].bytes == 4 * MiB)
			kid_reap(&kids[i], SIGKILL);
	ck_assert_int_eq(wait_leased(nodes[2].d.socket, 2 * MiB, 3000), (int64_t)(2 * MiB));
	js = pinctl_out(2, "jobs --json");
	ck_assert_msg(!json_job(js, JOB2, &b, &n, &q) || (b == 0 && n == 0), "node 3 still has job 2: %s", js);
	free(js);
	ck_assert(job_metric(2, "job_leased_bytes", JOB2) <= 0);
	ck_assert(job_metric(1, "job_leased_bytes", JOB2) == 6 * MiB);
}
END_TEST

START_TEST(test_set_rule_is_released_when_its_cgroup_goes_on_that_node_only)
{
	char path[600], cmd[700], *js;

	/* The same rule on nodes 1 and 2, for a job whose cgroup both nodes' fixture sysfs then shows. */
	for (int i = 0; i < 2; i++) {
		free(pinctl_out(i, "quota set /fleet.slice/job_9 8M"));
		snprintf(cmd, sizeof(cmd), "mkdir -p '%s/sys/fs/cgroup/fleet.slice/job_9'", nodes[i].root);
		ck_assert_int_eq(system(cmd), 0);
		snprintf(path, sizeof(path), "%s/sys/fs/cgroup/fleet.slice/job_9/cgroup.procs", nodes[i].root);
		write_file(path, "");
		/* quota list sweeps first: the cgroup is seen. */
		js = pinctl_out(i, "quota list --json");
		ck_assert_msg(strstr(js, "{\"pattern\":\"/fleet.slice/job_9\",\"bytes\":8388608,\"source\":\"set\","
					 "\"seen\":true}"),
			      "node %d: %s", i + 1, js);
		free(js);
	}
	/* The job ends on node 2 only. */
	snprintf(cmd, sizeof(cmd), "rm -rf '%s/sys/fs/cgroup/fleet.slice'", nodes[1].root);
	ck_assert_int_eq(system(cmd), 0);
	js = pinctl_out(1, "quota list --json");
	ck_assert_msg(!strstr(js, "job_9"), "node 2 kept the rule of a cgroup that is gone: %s", js);
	free(js);
	ck_assert(job_metric(1, "job_quota_bytes", "/fleet.slice/job_9") == -1);
	js = pinctl_out(0, "quota list --json");
	ck_assert_msg(strstr(js, "\"/fleet.slice/job_9\",\"bytes\":8388608,\"source\":\"set\",\"seen\":true"),
		      "node 1 lost its rule: %s", js);
	free(js);
	ck_assert(job_metric(0, "job_quota_bytes", "/fleet.slice/job_9") == 8 * MiB);
	/* Node 2's config rule is still there. */
	ck_assert(job_metric(1, "job_quota_bytes", JOB1) == 24 * MiB);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-fleet");
	TCase *t = tcase_create("fleet");

	tcase_add_unchecked_fixture(t, fleet_make, fleet_remove);
	tcase_add_checked_fixture(t, start, stop);
	tcase_set_timeout(t, 60);
	if (geteuid() == 0) {
		tcase_add_test(t, test_each_node_shows_its_own_budget_and_nothing_leased);
		tcase_add_test(t, test_jobs_across_nodes_are_counted_per_node);
		tcase_add_test(t, test_job_quota_binds_on_its_node_only);
		tcase_add_test(t, test_pressure_on_one_node_revokes_only_its_leases);
		tcase_add_test(t, test_killed_client_returns_its_bytes_on_its_node_only);
		tcase_add_test(t, test_set_rule_is_released_when_its_cgroup_goes_on_that_node_only);
	} else {
		check_skip("the fleet needs root: three daemons lock memory and read fixture cgroups of their clients");
	}
	suite_add_tcase(s, t);
	return s;
}

CHECK_MAIN(suite)

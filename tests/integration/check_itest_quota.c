/* SPDX-License-Identifier: MIT */
/*
 * Integration: per-job quotas with the real pinbrokerd, pinctl and client processes. Real cgroups
 * (a cgroup per test under the v1 memory controller, or cgroup2 where that is the only one) where
 * this host lets us mkdir there; fixture /proc/PID/cgroup layouts through --proc-root everywhere.
 */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "itest.h"
#include "pinbroker.h"
#include "check_main.h"

#define MiB (1024ull * 1024ull)
#define UID_A 61001
#define HOLDERS_MAX 8
#define MSG_MAX 400

static struct daemon d;
static const struct pb_acquire_opts no_cuda = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE, .label = "quota" };

/* The cgroup mount tests make their cgroups in ("" when none allows it), and the tree's name in it. */
static char cg_mount[64];
static char cg_top[64]; /* "/pinbroker-itest-PID": cgroup paths as /proc/PID/cgroup writes them */
static char root[256];  /* a fixture proc root, "" when the test uses the real one */

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------------ real cgroups */

/* Pick a cgroup mount where mkdir works: v1's memory controller (what the daemon charges on v1), else cgroup2. */
static bool cg_probe(void)
{
	static const char *const mounts[] = { "/sys/fs/cgroup/memory", "/sys/fs/cgroup" };
	char p[256];

	for (size_t i = 0; i < sizeof(mounts) / sizeof(mounts[0]); i++) {
		snprintf(p, sizeof(p), "%s/cgroup.procs", mounts[i]);
		if (access(p, F_OK) != 0)
			continue;
		snprintf(p, sizeof(p), "%s/pinbroker-itest-probe-%d", mounts[i], (int)getpid());
		if (mkdir(p, 0755) == 0) {
			rmdir(p);
			snprintf(cg_mount, sizeof(cg_mount), "%s", mounts[i]);
			return true;
		}
	}
	return false;
}

static void write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	ck_assert_msg(fd >= 0, "open %s: %s", path, strerror(errno));
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

/* Make cgroup cg_top/name; returns its path as /proc/PID/cgroup shows it (static, one at a time per slot). */
static const char *cg_make(const char *name)
{
	static char rel[8][128];
	static int slot;
	char p[300];
	char *r = rel[slot++ % 8];

	snprintf(p, sizeof(p), "%s%s", cg_mount, cg_top);
	ck_assert_msg(mkdir(p, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", p, strerror(errno));
	snprintf(r, 128, "%s/%s", cg_top, name);
	snprintf(p, sizeof(p), "%s%s", cg_mount, r);
	ck_assert_msg(mkdir(p, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", p, strerror(errno));
	return r;
}

static void cg_move(const char *rel, pid_t pid)
{
	char p[300], txt[32];

	snprintf(p, sizeof(p), "%s%s/cgroup.procs", cg_mount, rel);
	snprintf(txt, sizeof(txt), "%d\n", (int)pid);
	write_file(p, txt);
}

/* Kill what is left in dir (a cgroup) and below, move nothing back, and remove it, deepest first. */
static void cg_remove_tree(const char *dir)
{
	char p[600], line[32];
	struct dirent *e;
	DIR *dd = opendir(dir);
	FILE *f;

	if (!dd)
		return;
	while ((e = readdir(dd)))
		if (e->d_type == DT_DIR && e->d_name[0] != '.') {
			snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
			cg_remove_tree(p);
		}
	closedir(dd);
	snprintf(p, sizeof(p), "%s/cgroup.procs", dir);
	for (int tries = 0; tries < 50; tries++) {
		bool any = false;

		f = fopen(p, "r");
		while (f && fgets(line, sizeof(line), f)) {
			kill((pid_t)atoi(line), SIGKILL);
			any = true;
		}
		if (f)
			fclose(f);
		if (!any)
			break;
		usleep(20000);
	}
	if (rmdir(dir) != 0 && errno != ENOENT)
		fprintf(stderr, "check_itest_quota: cannot remove cgroup %s: %s\n", dir, strerror(errno));
}

/* Unchecked teardown (in the runner, so it runs after a failed test too): every cgroup we made goes. */
static void cg_cleanup(void)
{
	char p[300];

	if (!cg_mount[0])
		return;
	snprintf(p, sizeof(p), "%s%s", cg_mount, cg_top);
	cg_remove_tree(p);
}

/* ------------------------------------------------------------------ client processes */

struct holder {
	pid_t pid;
	int go, rep; /* to and from the child */
	int r;       /* its acquire's result */
	char msg[MSG_MAX];
	uint64_t lease_id;
};

static struct holder holders[HOLDERS_MAX];
static int nholders;

/* Put pid where its job is: into real cgroup cg, or (fixture root) a /proc/PID/cgroup of text. */
static void place(pid_t pid, const char *cg, const char *fixture_text)
{
	char p[400];

	if (cg) {
		cg_move(cg, pid);
		return;
	}
	if (!fixture_text)
		return;
	snprintf(p, sizeof(p), "%s/proc/%d", root, (int)pid);
	ck_assert_int_eq(mkdir(p, 0755) == 0 || errno == EEXIST, 1);
	snprintf(p, sizeof(p), "%s/proc/%d/cgroup", root, (int)pid);
	write_file(p, fixture_text);
}

/*
 * A child (uid, 0: stays root) placed by place(), that then connects and acquires size bytes,
 * reports the result and holds the lease until it reads a byte or dies. Returns the holder.
 */
static struct holder *spawn_holder(uid_t uid, const char *cg, const char *fixture_text, uint64_t size)
{
	struct holder *h = &holders[nholders++];
	int to[2], from[2];
	char go;

	ck_assert_int_le(nholders, HOLDERS_MAX);
	ck_assert_int_eq(pipe2(to, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(from, O_CLOEXEC), 0);
	h->pid = itest_fork();
	ck_assert_int_ge(h->pid, 0);
	if (h->pid == 0) {
		struct {
			int r;
			uint64_t id;
			char msg[MSG_MAX];
		} out = { 0 };
		pb_client *c;
		pb_lease *l = NULL;

		if (read(to[0], &go, 1) != 1)
			_exit(80);
		if (uid)
			itest_drop_to(uid);
		out.r = pb_connect(d.socket, &c);
		if (out.r == 0)
			out.r = pb_acquire(c, size, &no_cuda, &l);
		if (out.r == 0)
			out.id = pb_lease_id(l);
		else
			snprintf(out.msg, sizeof(out.msg), "%s", pb_last_error());
		if (write(from[1], &out, sizeof(out)) != (ssize_t)sizeof(out))
			_exit(81);
		if (read(to[0], &go, 1) == 1 && l)
			pb_release(c, l);
		_exit(0);
	}
	close(to[0]);
	close(from[1]);
	h->go = to[1];
	h->rep = from[0];
	place(h->pid, cg, fixture_text);
	ck_assert_int_eq(write(h->go, "g", 1), 1);
	{
		struct {
			int r;
			uint64_t id;
			char msg[MSG_MAX];
		} in;

		ck_assert_int_eq(read(h->rep, &in, sizeof(in)), (ssize_t)sizeof(in));
		h->r = in.r;
		h->lease_id = in.id;
		memcpy(h->msg, in.msg, sizeof(h->msg));
	}
	return h;
}

static void holder_release(struct holder *h)
{
	ck_assert_int_eq(write(h->go, "r", 1), 1);
	ck_assert_int_eq(itest_wait_exit(h->pid), 0);
	h->pid = 0;
}

static void holder_kill(struct holder *h)
{
	kill(h->pid, SIGKILL);
	itest_wait_exit(h->pid);
	h->pid = 0;
}

/* pinctl ARGS run as uid, placed like a holder (its own pid is the client's: exec'd, no shell). Exit code; output in *out. */
static int pinctl_in(uid_t uid, const char *cg, const char *fixture_text, char **out, const char *args)
{
	int to[2], from[2], st;
	char go, *buf = malloc(65536);
	const char *pinctl_path;
	size_t n = 0;
	ssize_t k;
	pid_t pid;

	ck_assert_ptr_nonnull(buf);
	/* As another uid, the staged copy (made before the fork): the build tree may lie where uid cannot reach it. */
	pinctl_path = uid ? ITEST_PINCTL_FOR_OTHERS : PINCTL_PATH;
	ck_assert_int_eq(pipe2(to, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe(from), 0);
	pid = itest_fork();
	if (pid == 0) {
		char cmd[1024];

		close(from[0]);
		if (read(to[0], &go, 1) != 1)
			_exit(80);
		if (uid)
			itest_drop_to(uid);
		dup2(from[1], 1);
		dup2(from[1], 2);
		snprintf(cmd, sizeof(cmd), "%s", args);
		char *argv[32] = { (char *)pinctl_path, (char *)"--socket", d.socket };
		int argc = 3;
		for (char *t = strtok(cmd, " "); t && argc < 31; t = strtok(NULL, " "))
			argv[argc++] = t;
		argv[argc] = NULL;
		execv(pinctl_path, argv);
		_exit(127);
	}
	close(to[0]);
	close(from[1]);
	place(pid, cg, fixture_text);
	ck_assert_int_eq(write(to[1], "g", 1), 1);
	close(to[1]);
	while (n < 65535 && (k = read(from[0], buf + n, 65535 - n)) > 0)
		n += (size_t)k;
	buf[n] = '\0';
	close(from[0]);
	st = itest_wait_exit(pid);
	*out = buf;
	return st;
}

/* ------------------------------------------------------------------ what the daemon shows */

/* The number after key in text from where job's object starts ("job":"JOB"), or -1. */
static int64_t field_after(const char *text, const char *anchor, const char *key)
{
	const char *p = strstr(text, anchor), *q;
	char k[64];

	if (!p)
		return -1;
	snprintf(k, sizeof(k), "\"%s\":", key);
	q = strstr(p, k);
	if (!q || (strchr(p, '}') && q > strchr(p, '}')))
		return -1;
	return (int64_t)strtoll(q + strlen(k), NULL, 10);
}

/* A job's bytes (or key "leases", "quota_bytes") from pinctl jobs --json as root; -1: not listed. */
static int64_t job_field(const char *job, const char *key)
{
	char *out = NULL, anchor[300];
	int64_t v;

	ck_assert_int_eq(pinctl(&d, &out, "jobs --json"), 0);
	snprintf(anchor, sizeof(anchor), "{\"job\":\"%s\"", job);
	v = field_after(out, anchor, key);
	free(out);
	return v;
}

/* The job a lease row names in pinctl leases --json ("" for null). */
static void lease_job(uint64_t id, char *job, size_t len)
{
	char *out = NULL, anchor[64];
	const char *p, *q;

	ck_assert_int_eq(pinctl(&d, &out, "leases --json"), 0);
	snprintf(anchor, sizeof(anchor), "{\"id\":%" PRIu64 ",", id);
	p = strstr(out, anchor);
	ck_assert_msg(p, "no lease %" PRIu64 " in %s", id, out);
	p = strstr(p, "\"job\":");
	ck_assert_ptr_nonnull(p);
	p += 6;
	job[0] = '\0';
	if (*p == '"' && (q = strchr(p + 1, '"')))
		snprintf(job, len, "%.*s", (int)(q - p - 1), p + 1);
	free(out);
}

/* pinbroker_job_leased_bytes{cgroup="JOB"} from pinctl metrics; -1: no such series. */
static int64_t metric_job_bytes(const char *job)
{
	char *out = NULL, want[300];
	const char *p;
	int64_t v = -1;

	ck_assert_int_eq(pinctl(&d, &out, "metrics"), 0);
	snprintf(want, sizeof(want), "pinbroker_job_leased_bytes{cgroup=\"%s\"} ", job);
	p = strstr(out, want);
	if (p)
		v = (int64_t)strtoll(p + strlen(want), NULL, 10);
	free(out);
	return v;
}

static bool log_has(const char *text, int timeout_ms)
{
	uint64_t t0 = mono_ms();

	for (;;) {
		char *log = daemon_log(&d);
		bool yes = log && strstr(log, text);

		free(log);
		if (yes)
			return true;
		if (mono_ms() - t0 > (uint64_t)timeout_ms)
			return false;
		usleep(50000);
	}
}

/* ------------------------------------------------------------------ fixtures */

static void kill_holders(void)
{
	for (int i = 0; i < nholders; i++)
		if (holders[i].pid > 0) {
			kill(holders[i].pid, SIGKILL);
			waitpid(holders[i].pid, NULL, 0);
		}
	nholders = 0;
}

static void start_real(void)
{
	root[0] = '\0';
	nholders = 0;
	daemon_start(&d, ITEST_ARGS("--budget", "256M", "--prewarm", "0"));
}

static void stop_real(void)
{
	kill_holders();
	ck_assert_int_eq(daemon_stop(&d), 0);
	cg_cleanup();
}

static void start_fixture_with(const char *const *more)
{
	const char *args[16] = { "--budget", "256M", "--prewarm", "0" };
	size_t n = 4;

	for (size_t i = 0; more && more[i] && n < 15; i++)
		args[n++] = more[i];
	args[n] = NULL;
	nholders = 0;
	itest_proc_root_start(&d, root, sizeof(root), "pbquota", NULL, args);
}

static void start_fixture(void)
{
	start_fixture_with(NULL);
}

static void stop_fixture(void)
{
	kill_holders();
	ck_assert_int_eq(daemon_stop(&d), 0);
	itest_proc_root_remove(root);
}

static const char *fixture(const char *name)
{
	static char text[8][4096];
	static int slot;
	char path[512];
	char *t = text[slot++ % 8];
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "%s/proc-cgroup/%s", FIXTURES_DIR, name);
	f = fopen(path, "r");
	ck_assert_msg(f, "no fixture %s", path);
	n = fread(t, 1, 4095, f);
	fclose(f);
	t[n] = '\0';
	return t;
}

/* ------------------------------------------------------------------ a) real cgroups */

START_TEST(test_real_cgroup_lease_is_charged_to_its_job)
{
	const char *cg = cg_make("job_1");
	struct holder *h = spawn_holder(0, cg, NULL, 4 * MiB);
	char job[256];

	ck_assert_msg(h->r == 0, "acquire: %s", h->msg);
	ck_assert_int_eq(job_field(cg, "bytes"), (int64_t)(4 * MiB));
	ck_assert_int_eq(job_field(cg, "leases"), 1);
	lease_job(h->lease_id, job, sizeof(job));
	ck_assert_str_eq(job, cg);
	ck_assert_int_eq(metric_job_bytes(cg), (int64_t)(4 * MiB));
	holder_release(h);
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
	ck_assert_int_eq(job_field(cg, "bytes"), -1);
}
END_TEST

START_TEST(test_real_cgroup_quota_refuses_past_it_and_sums_two_clients)
{
	const char *cg = cg_make("job_2");
	char cmd[300];
	struct holder *a, *b, *c;

	snprintf(cmd, sizeof(cmd), "quota set %s 8M", cg);
	itest_pinctl_says(&d, 0, cmd, NULL);
	a = spawn_holder(0, cg, NULL, 4 * MiB);
	b = spawn_holder(0, cg, NULL, 4 * MiB);
	ck_assert_msg(a->r == 0 && b->r == 0, "acquire: %s %s", a->msg, b->msg);
	ck_assert_int_eq(job_field(cg, "bytes"), (int64_t)(8 * MiB));
	ck_assert_int_eq(job_field(cg, "leases"), 2);
	ck_assert_int_eq(job_field(cg, "quota_bytes"), (int64_t)(8 * MiB));
	c = spawn_holder(0, cg, NULL, 2 * MiB);
	ck_assert_int_eq(c->r, -EDQUOT);
	ck_assert_msg(strstr(c->msg, "quota") && strstr(c->msg, cg) && strstr(c->msg, "pinctl quota set"),
		      "unclear refusal: %s", c->msg);
	/* Clearing lets it through. */
	snprintf(cmd, sizeof(cmd), "quota clear %s", cg);
	itest_pinctl_says(&d, 0, cmd, NULL);
	ck_assert_int_eq(job_field(cg, "quota_bytes"), 0); /* null: no quota */
	c = spawn_holder(0, cg, NULL, 2 * MiB);
	ck_assert_msg(c->r == 0, "after clear: %s", c->msg);
	ck_assert_int_eq(job_field(cg, "bytes"), (int64_t)(10 * MiB));
}
END_TEST

START_TEST(test_real_cgroup_glob_quota_covers_each_job_and_revoke_takes_them_back)
{
	const char *j1 = cg_make("job_3"), *j2 = cg_make("job_4");
	char cmd[300], glob[200];
	struct holder *a, *b, *c;

	snprintf(glob, sizeof(glob), "%s/job_*", cg_top);
	snprintf(cmd, sizeof(cmd), "quota set %s 6M", glob);
	itest_pinctl_says(&d, 0, cmd, NULL);
	a = spawn_holder(0, j1, NULL, 4 * MiB);
	b = spawn_holder(0, j2, NULL, 4 * MiB);
	ck_assert_msg(a->r == 0 && b->r == 0, "acquire: %s %s", a->msg, b->msg);
	/* Each job has 6M of its own: 4M each fits, 4M more in either does not. */
	ck_assert_int_eq(job_field(j1, "quota_bytes"), (int64_t)(6 * MiB));
	ck_assert_int_eq(job_field(j2, "quota_bytes"), (int64_t)(6 * MiB));
	c = spawn_holder(0, j1, NULL, 4 * MiB);
	ck_assert_int_eq(c->r, -EDQUOT);
	ck_assert_int_eq(metric_job_bytes(j1), (int64_t)(4 * MiB));
	ck_assert_int_eq(metric_job_bytes(j2), (int64_t)(4 * MiB));
	/* --revoke on clear takes both jobs' leases back (the holders do not release: they are disconnected). */
	snprintf(cmd, sizeof(cmd), "quota clear %s --revoke --deadline 500", glob);
	itest_pinctl_says(&d, 0, cmd, "revoking 2 leases", NULL);
	ck_assert_int_eq(wait_leased(d.socket, 0, 10000), 0);
	ck_assert_int_eq(job_field(j1, "bytes"), -1);
}
END_TEST

START_TEST(test_real_cgroup_set_rule_is_released_when_the_cgroup_goes)
{
	const char *cg = cg_make("job_5");
	char *out = NULL, cmd[300], p[300], gone[300];
	struct holder *h;

	snprintf(cmd, sizeof(cmd), "quota set %s 8M", cg);
	itest_pinctl_says(&d, 0, cmd, NULL);
	h = spawn_holder(0, cg, NULL, 4 * MiB);
	ck_assert_msg(h->r == 0, "acquire: %s", h->msg);
	ck_assert_int_eq(pinctl(&d, &out, "quota list --json"), 0);
	ck_assert_msg(strstr(out, "\"seen\":true"), "%s", out);
	free(out);
	holder_kill(h);
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
	snprintf(p, sizeof(p), "%s%s", cg_mount, cg);
	ck_assert_msg(rmdir(p) == 0, "rmdir %s: %s", p, strerror(errno));
	/* The 5 s sweep timer alone (status does not sweep) drops it. */
	snprintf(gone, sizeof(gone), "job quota %s (8 MiB) released: its cgroup is gone", cg);
	ck_assert_msg(log_has(gone, 8000), "no release within 8 s");
	ck_assert_int_eq(pinctl(&d, &out, "quota list --json"), 0);
	ck_assert_msg(strstr(out, "\"rules\":[]"), "%s", out);
	free(out);
}
END_TEST

/* ------------------------------------------------------------------ b) fixture layouts */

START_TEST(test_fixture_layouts_charge_the_right_job)
{
	static const struct {
		const char *fixture, *job, *column;
	} cases[] = {
		{ "v2-slurm", "/system.slice/slurmstepd.scope/job_42/step_0/user/task_0", ".../step_0/user/task_0" },
		{ "v1-slurm", "/slurm/uid_1000/job_42/step_0/task_0", ".../job_42/step_0/task_0" },
		{ "v2-kubepods",
		  "/kubepods.slice/kubepods-burstable.slice/"
		  "kubepods-burstable-pod8f2c7a1e_3b4d_4c5e_9f60_7a8b9c0d1e2f.slice/cri-containerd-4f1e2d3c.scope",
		  "...containerd-4f1e2d3c.scope" },
		{ "v1-comounted-memory", "/docker/0123456789ab", "/docker/0123456789ab" },
		{ "hybrid-this-host", "/process_api/72a38dad009b4799edce4b82ef71581e", "...d009b4799edce4b82ef71581e" },
	};
	uint64_t ids[sizeof(cases) / sizeof(cases[0])];
	char job[600], *out = NULL;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct holder *h = spawn_holder(0, NULL, fixture(cases[i].fixture), 2 * MiB);

		ck_assert_msg(h->r == 0, "%s: %s", cases[i].fixture, h->msg);
		lease_job(h->lease_id, job, sizeof(job));
		ck_assert_msg(strcmp(job, cases[i].job) == 0, "%s: charged to '%s'", cases[i].fixture, job);
		ck_assert_int_eq(job_field(cases[i].job, "bytes"), (int64_t)(2 * MiB));
		ids[i] = h->lease_id;
	}
	/* pinctl leases keeps a long job's last components ("-" for none is in the odd layouts' test). */
	ck_assert_int_eq(pinctl(&d, &out, "leases"), 0);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char id[32], *cell;

		snprintf(id, sizeof(id), "%-8llu ", (unsigned long long)ids[i]);
		cell = itest_table_cell(out, id, "JOB");
		ck_assert_msg(cell && strcmp(cell, cases[i].column) == 0, "%s: JOB '%s', want '%s' in:\n%s",
			      cases[i].fixture, cell, cases[i].column, out);
		free(cell);
	}
	free(out);
}
END_TEST

START_TEST(test_fixture_odd_layouts_charge_no_job_but_grant)
{
	static const char *const odd[] = { "v1-no-memory", "v2-odd-path" };
	char job[600], *out = NULL;

	for (size_t i = 0; i < 2; i++) {
		struct holder *h = spawn_holder(0, NULL, fixture(odd[i]), 2 * MiB);

		ck_assert_msg(h->r == 0, "%s: %s", odd[i], h->msg);
		lease_job(h->lease_id, job, sizeof(job));
		ck_assert_msg(job[0] == '\0', "%s: charged to '%s'", odd[i], job);
	}
	ck_assert_int_eq(pinctl(&d, &out, "leases"), 0);
	{
		char id[32], *cell;

		snprintf(id, sizeof(id), "%-8llu ", (unsigned long long)holders[nholders - 1].lease_id);
		cell = itest_table_cell(out, id, "JOB");
		ck_assert_msg(cell && strcmp(cell, "-") == 0, "JOB '%s' in:\n%s", cell, out);
		free(cell);
	}
	free(out);
	/* No file at all (a pid the proc root does not know) is the same. */
	ck_assert_int_eq(spawn_holder(0, NULL, NULL, 2 * MiB)->r, 0);
	ck_assert_int_eq(pinctl(&d, &out, "jobs --json"), 0);
	ck_assert_msg(strstr(out, "\"jobs\":[]"), "%s", out);
	free(out);
	ck_assert_int_eq(wait_leased(d.socket, (int64_t)(6 * MiB), 2000), (int64_t)(6 * MiB));
}
END_TEST

START_TEST(test_fixture_prefix_glob_sums_slurm_steps)
{
	char *out = NULL;
	struct holder *a, *b, *c;

	itest_pinctl_says(&d, 0, "quota set /slurm/*/job_42 5M", NULL);
	a = spawn_holder(0, NULL, fixture("v1-slurm"), 2 * MiB);
	b = spawn_holder(0, NULL, "9:memory:/slurm/uid_1000/job_42/step_1/task_0\n0::/\n", 2 * MiB);
	ck_assert_msg(a->r == 0 && b->r == 0, "%s %s", a->msg, b->msg);
	ck_assert_int_eq(job_field("/slurm/uid_1000/job_42", "bytes"), (int64_t)(4 * MiB));
	/* status --json: the job, as pinctl jobs has it, and each client's cgroup (the step, not the job). */
	ck_assert_int_eq(pinctl(&d, &out, "status --json"), 0);
	ck_assert_msg(strstr(out, "\"jobs\":[{\"job\":\"/slurm/uid_1000/job_42\",\"bytes\":4194304,\"leases\":2,"
				  "\"quota_bytes\":5242880,\"rule\":\"/slurm/*/job_42\",\"source\":\"set\"}]"),
		      "status --json jobs: %s", out);
	ck_assert_msg(strstr(out, "\"cgroup\":\"/slurm/uid_1000/job_42/step_0/task_0\"") &&
			      strstr(out, "\"cgroup\":\"/slurm/uid_1000/job_42/step_1/task_0\""),
		      "status --json client cgroups: %s", out);
	free(out);
	/* pinctl leases: the JOB column names the job each lease is charged to (the rule's part of the path). */
	ck_assert_int_eq(pinctl(&d, &out, "leases"), 0);
	{
		char id[32], *cell;

		snprintf(id, sizeof(id), "%-8llu ", (unsigned long long)a->lease_id);
		cell = itest_table_cell(out, id, "JOB");
		ck_assert_msg(cell && strcmp(cell, "/slurm/uid_1000/job_42") == 0, "JOB '%s' in:\n%s", cell, out);
		free(cell);
		/* NODE: where the pool put its pages on this host, as the lease row says ("-": not placed). */
		{
			struct pb_status *st = itest_status(d.socket);
			const struct pb_lease_info *row = itest_lease_row(st, a->lease_id);
			char want[16] = "-";

			ck_assert_ptr_nonnull(row);
			if (row->numa_node >= 0)
				snprintf(want, sizeof(want), "%d%s", row->numa_node, row->misplaced ? "!" : "");
			pb_status_free(st);
			cell = itest_table_cell(out, id, "NODE");
			ck_assert_msg(cell && strcmp(cell, want) == 0, "NODE '%s', want '%s' in:\n%s", cell, want, out);
			free(cell);
		}
	}
	free(out);
	c = spawn_holder(0, NULL, "9:memory:/slurm/uid_1000/job_42/batch\n", 2 * MiB);
	ck_assert_int_eq(c->r, -EDQUOT);
	ck_assert_msg(strstr(c->msg, "/slurm/uid_1000/job_42"), "%s", c->msg);
}
END_TEST

/* ------------------------------------------------------------------ c) a non-admin */

START_TEST(test_non_admin_sees_only_its_job_and_cannot_set)
{
	const char *mine = "4:memory:/slurm/uid_61001/job_7/step_0\n";
	const char *theirs = "4:memory:/slurm/uid_1000/job_8/step_0\n";
	char *out = NULL;
	struct holder *a, *b;
	int rc;

	a = spawn_holder(UID_A, NULL, mine, 2 * MiB);
	b = spawn_holder(0, NULL, theirs, 4 * MiB);
	ck_assert_msg(a->r == 0 && b->r == 0, "%s %s", a->msg, b->msg);
	itest_pinctl_says(&d, 0, "quota set /slurm/*/job_8 64M", NULL);

	rc = pinctl_in(UID_A, NULL, mine, &out, "jobs --json");
	ck_assert_msg(rc == 0, "%s", out);
	ck_assert_msg(strstr(out, "/slurm/uid_61001/job_7/step_0"), "own job missing: %s", out);
	ck_assert_msg(!strstr(out, "job_8"), "another job shown: %s", out);
	free(out);
	rc = pinctl_in(UID_A, NULL, mine, &out, "quota list --json");
	ck_assert_msg(rc == 0 && strstr(out, "\"rules\":[]") && !strstr(out, "job_8"), "%s", out);
	free(out);
	rc = pinctl_in(UID_A, NULL, mine, &out, "status --json");
	ck_assert_msg(rc == 0 && !strstr(out, "job_8"), "status shows another job: %s", out);
	free(out);
	/* The metrics' per-job series are for everyone by default (metrics-detail = all, as in metrics-path); under
	 * metrics-detail = admin a non-admin sees no other job there either. */
	rc = pinctl_in(UID_A, NULL, mine, &out, "metrics");
	ck_assert_msg(rc == 0 && strstr(out, "job_8"), "metrics-detail = all: the other job's series missing: %s", out);
	free(out);
	itest_pinctl_says(&d, 0, "set metrics-detail admin", NULL);
	rc = pinctl_in(UID_A, NULL, mine, &out, "metrics");
	ck_assert_msg(rc == 0 && !strstr(out, "job_8"), "metrics-detail = admin: metrics show another job: %s", out);
	free(out);
	rc = pinctl_in(UID_A, NULL, mine, &out, "quota set /slurm/uid_61001/job_7 1T");
	ck_assert_int_eq(rc, 1);
	ck_assert_msg(strstr(out, "admin"), "refusal does not say why: %s", out);
	free(out);
	/* The admin sees both. */
	ck_assert_int_eq(job_field("/slurm/uid_1000/job_8", "bytes"), (int64_t)(4 * MiB));
	ck_assert_int_eq(job_field("/slurm/uid_61001/job_7/step_0", "bytes"), (int64_t)(2 * MiB));
}
END_TEST

/* ------------------------------------------------------------------ d) config rules and reload */

static char conf_path[512];

static void write_conf(const char *job_quota)
{
	char text[1024];

	snprintf(conf_path, sizeof(conf_path), "%s/pinbroker.conf", d.dir);
	snprintf(text, sizeof(text), "budget = 256M\nprewarm = 0\n%s%s\n", job_quota ? "job-quota = " : "",
		 job_quota ? job_quota : "");
	write_file(conf_path, text);
}

static void reload_and_wait(void)
{
	uint64_t t0 = mono_ms();
	char *log;
	int n0 = 0, n;

	log = daemon_log(&d);
	for (const char *p = log; p && (p = strstr(p, "config reloaded")); p++)
		n0++;
	free(log);
	ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
	for (;;) {
		n = 0;
		log = daemon_log(&d);
		for (const char *p = log; p && (p = strstr(p, "config reloaded")); p++)
			n++;
		ck_assert_msg(!strstr(log, "reload rejected"), "%s", itest_tail(log));
		free(log);
		if (n > n0)
			return;
		ck_assert_msg(mono_ms() - t0 < 10000, "no reload within 10 s");
		usleep(20000);
	}
}

START_TEST(test_config_rules_apply_at_start_and_regroup_on_reload)
{
	const char *args[] = { "--proc-root", root, "--config", conf_path, NULL };
	struct holder *a, *b, *c;

	itest_proc_root(root, sizeof(root), "pbquota", NULL);
	daemon_prepare(&d);
	write_conf("/slurm/uid_1000/*:8M");
	daemon_restart(&d, args);
	nholders = 0;
	a = spawn_holder(0, NULL, "4:memory:/slurm/uid_1000/job_1/step_0\n", 4 * MiB);
	b = spawn_holder(0, NULL, "4:memory:/slurm/uid_1000/job_2/step_0\n", 4 * MiB);
	ck_assert_msg(a->r == 0 && b->r == 0, "%s %s", a->msg, b->msg);
	ck_assert_int_eq(job_field("/slurm/uid_1000/job_1", "quota_bytes"), (int64_t)(8 * MiB));
	ck_assert_int_eq(job_field("/slurm/uid_1000/job_2", "bytes"), (int64_t)(4 * MiB));

	/* One rule per uid now, and a pinctl set rule that must survive the reload. */
	itest_pinctl_says(&d, 0, "quota set /slurm/uid_1000/job_2 16M", NULL);
	write_conf("/slurm/*:10M /slurm/uid_1000/job_2:2M");
	reload_and_wait();
	/* job_1 sums into the uid's job; job_2 keeps the set rule (16M) over the config's 2M. */
	ck_assert_int_eq(job_field("/slurm/uid_1000", "bytes"), (int64_t)(4 * MiB));
	ck_assert_int_eq(job_field("/slurm/uid_1000", "quota_bytes"), (int64_t)(10 * MiB));
	ck_assert_int_eq(job_field("/slurm/uid_1000/job_2", "bytes"), (int64_t)(4 * MiB));
	ck_assert_int_eq(job_field("/slurm/uid_1000/job_2", "quota_bytes"), (int64_t)(16 * MiB));
	ck_assert_int_eq(job_field("/slurm/uid_1000/job_1", "bytes"), -1);
	c = spawn_holder(0, NULL, "4:memory:/slurm/uid_1000/job_1/step_1\n", 8 * MiB);
	ck_assert_int_eq(c->r, -EDQUOT);
	ck_assert_int_eq(metric_job_bytes("/slurm/uid_1000"), (int64_t)(4 * MiB));

	/* Dropped from the file: no quota; the bytes stay charged to the leases' own cgroups. */
	write_conf(NULL);
	reload_and_wait();
	ck_assert_int_eq(job_field("/slurm/uid_1000/job_1/step_0", "bytes"), (int64_t)(4 * MiB));
	ck_assert_int_eq(job_field("/slurm/uid_1000/job_2", "quota_bytes"), (int64_t)(16 * MiB));
	holder_release(a);
	holder_release(b);
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
	ck_assert_int_eq(job_field("/slurm/uid_1000/job_2", "bytes"), 0);
}
END_TEST

START_TEST(test_config_quota_over_the_budget_warns)
{
	const char *args[] = { "--proc-root", root, "--config", conf_path, NULL };

	itest_proc_root(root, sizeof(root), "pbquota", NULL);
	daemon_prepare(&d);
	write_conf("/slurm/*:1T");
	daemon_restart(&d, args);
	nholders = 0;
	ck_assert_msg(log_has("is more than the whole budget", 2000), "no warning at start");
}
END_TEST

/* ------------------------------------------------------------------ pinctl quota input */

START_TEST(test_pinctl_quota_argument_errors_print_usage)
{
	static const char *const bad[] = {
		"quota",
		"quota set",
		"quota set /a",
		"quota set /a lots",
		"quota set a 1G",
		"quota clear",
		"quota frob /a",
		"quota list extra",
		"quota set /a 1G --deadline 5",
		"quota --bogus",
		"jobs extra",
	};
	char *out = NULL;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_msg(pinctl(&d, &out, "%s", bad[i]) == 2, "%s: %s", bad[i], out);
		ck_assert_msg(strstr(out, "Usage: pinctl"), "%s printed no usage: %s", bad[i], out);
		free(out);
	}
}
END_TEST

START_TEST(test_hostile_quota_set_input_is_refused_clearly)
{
	char *out = NULL, cmd[2200];

	snprintf(cmd, sizeof(cmd), "quota set /%01000d 1G", 7);
	itest_pinctl_says(&d, 1, cmd, "too long", NULL);
	ck_assert_int_eq(pinctl(&d, &out, "quota set '/a/../b' 1G"), 1);
	ck_assert_msg(strstr(out, "'..'"), "%s", out);
	free(out);
	itest_pinctl_says(&d, 1, "quota set '/a//b' 1G", NULL);
	itest_pinctl_says(&d, 1, "quota set '/a/b/' 1G", NULL);
	itest_pinctl_says(&d, 1, "quota set \"$(printf '/a\\tb')\" 1G", NULL);
	/* Over the budget: taken, with a warning that says what it means. */
	ck_assert_int_eq(pinctl(&d, &out, "quota set /big 1T"), 0);
	ck_assert_msg(strstr(out, "warning") && strstr(out, "more than the whole budget"), "%s", out);
	free(out);
	ck_assert_msg(log_has("is more than the whole budget", 2000), "not logged");
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("itest_quota");
	TCase *fix = tcase_create("fixtures"), *cfg = tcase_create("config");

	snprintf(cg_top, sizeof(cg_top), "/pinbroker-itest-%d", (int)getpid());
	if (geteuid() == 0 && cg_probe()) {
		/* Created only here: a TCase never added to the suite is never freed (LeakSanitizer). */
		TCase *real = tcase_create("real_cgroups");

		tcase_add_unchecked_fixture(real, NULL, cg_cleanup);
		tcase_add_checked_fixture(real, start_real, stop_real);
		tcase_set_timeout(real, 60);
		tcase_add_test(real, test_real_cgroup_lease_is_charged_to_its_job);
		tcase_add_test(real, test_real_cgroup_quota_refuses_past_it_and_sums_two_clients);
		tcase_add_test(real, test_real_cgroup_glob_quota_covers_each_job_and_revoke_takes_them_back);
		tcase_add_test(real, test_real_cgroup_set_rule_is_released_when_the_cgroup_goes);
		suite_add_tcase(s, real);
	} else {
		check_skip("real-cgroup quota tests: cannot mkdir in /sys/fs/cgroup/memory or /sys/fs/cgroup "
			   "(needs root and a writable cgroupfs; containers mount it read-only)");
	}
	tcase_add_checked_fixture(fix, start_fixture, stop_fixture);
	tcase_set_timeout(fix, 60);
	tcase_add_test(fix, test_fixture_layouts_charge_the_right_job);
	tcase_add_test(fix, test_fixture_odd_layouts_charge_no_job_but_grant);
	tcase_add_test(fix, test_fixture_prefix_glob_sums_slurm_steps);
	if (geteuid() == 0)
		tcase_add_test(fix, test_non_admin_sees_only_its_job_and_cannot_set);
	else
		check_skip("the non-admin test needs root to setuid");
	tcase_add_test(fix, test_pinctl_quota_argument_errors_print_usage);
	tcase_add_test(fix, test_hostile_quota_set_input_is_refused_clearly);
	suite_add_tcase(s, fix);
	tcase_add_checked_fixture(cfg, NULL, stop_fixture);
	tcase_set_timeout(cfg, 60);
	tcase_add_test(cfg, test_config_rules_apply_at_start_and_regroup_on_reload);
	tcase_add_test(cfg, test_config_quota_over_the_budget_warns);
	suite_add_tcase(s, cfg);
	return s;
}

CHECK_MAIN(suite)

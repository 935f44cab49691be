/* SPDX-License-Identifier: MIT */
/* Shared helpers for the CPU benchmarks: clocks, percentiles, a daemon under test and readings of it, other uids' clients. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pinbroker.h"

/* A daemon that cannot take a connection within this long (pool warm-up included) is broken. */
#define DAEMON_START_TIMEOUT_MS 30000
#define DAEMON_STOP_TIMEOUT_MS 5000

uint64_t bench_now_ns(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0)
		bench_die(-errno, "clock_gettime");
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void bench_sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double bench_percentile(double *v, size_t n, double p)
{
	size_t rank;

	if (n == 0)
		return 0;
	qsort(v, n, sizeof(*v), cmp_double);
	/* Nearest rank: the smallest value with at least p% of the samples at or below it. */
	rank = (size_t)((p / 100.0) * (double)n + 0.999999);
	if (rank < 1)
		rank = 1;
	if (rank > n)
		rank = n;
	return v[rank - 1];
}

void bench_die(int err, const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (err)
		fprintf(stderr, ": %s", strerror(err < 0 ? -err : err));
	fputc('\n', stderr);
	exit(1);
}

pid_t bench_daemon_start_with(const char *path, const char *sock, const char *logpath, const char *const *extra,
			      const struct bench_start *how)
{
	const char *argv[64];
	size_t n = 0;
	uint64_t t0, deadline;
	pid_t pid;

	argv[n++] = path;
	argv[n++] = "--config";
	argv[n++] = "/dev/null";
	argv[n++] = "--socket";
	argv[n++] = sock;
	for (size_t i = 0; extra && extra[i] && n < sizeof(argv) / sizeof(argv[0]) - 1; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	if (unlink(sock) < 0 && errno != ENOENT)
		bench_die(-errno, "unlink %s", sock);

	fflush(NULL);
	t0 = bench_now_ns();
	pid = fork();
	if (pid < 0)
		bench_die(-errno, "fork");
	if (pid == 0) {
		int fd = open(logpath, O_WRONLY | O_CREAT | (how->append_log ? O_APPEND : O_TRUNC) | O_CLOEXEC, 0644);

		if (fd < 0 || dup2(fd, STDERR_FILENO) < 0 || dup2(fd, STDOUT_FILENO) < 0)
			_exit(127);
		execv(path, (char *const *)argv);
		_exit(127);
	}

	deadline = t0 + (uint64_t)how->timeout_ms * 1000000ull;
	while (bench_now_ns() < deadline) {
		pb_client *c;
		int status;

		if (waitpid(pid, &status, WNOHANG) == pid)
			bench_die(0, "%s exited during start-up (status %d); see %s", path, status, logpath);
		if (pb_connect(sock, &c) == 0) {
			pb_disconnect(c);
			if (how->ready_ms)
				*how->ready_ms = (double)(bench_now_ns() - t0) / 1e6;
			return pid;
		}
		bench_sleep_ms(how->poll_ms);
	}
	kill(pid, SIGKILL);
	bench_die(0, "%s did not accept connections on %s within %u ms; see %s", path, sock, how->timeout_ms, logpath);
}

pid_t bench_daemon_start(const char *path, const char *sock, const char *logpath, const char *const *extra)
{
	const struct bench_start how = { .timeout_ms = DAEMON_START_TIMEOUT_MS, .poll_ms = 20 };

	return bench_daemon_start_with(path, sock, logpath, extra, &how);
}

void bench_daemon_stop(pid_t pid)
{
	uint64_t deadline = bench_now_ns() + (uint64_t)DAEMON_STOP_TIMEOUT_MS * 1000000ull;
	int status;

	if (kill(pid, SIGTERM) < 0)
		bench_die(-errno, "kill %d", (int)pid);
	while (bench_now_ns() < deadline) {
		pid_t r = waitpid(pid, &status, WNOHANG);

		if (r == pid)
			return;
		if (r < 0)
			bench_die(-errno, "waitpid %d", (int)pid);
		bench_sleep_ms(10);
	}
	fprintf(stderr, "pinbrokerd %d ignored SIGTERM for %d ms, killing it\n", (int)pid, DAEMON_STOP_TIMEOUT_MS);
	kill(pid, SIGKILL);
	if (waitpid(pid, &status, 0) < 0)
		bench_die(-errno, "waitpid %d", (int)pid);
}

static int read_small_file(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, cap - 1);
	if (n < 0) {
		int err = -errno;

		close(fd);
		return err;
	}
	close(fd);
	buf[n] = '\0';
	return (int)n;
}

long bench_status_kb(pid_t pid, const char *field)
{
	char path[64], buf[8192], key[64];
	const char *p;
	int r;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	r = read_small_file(path, buf, sizeof(buf));
	if (r < 0)
		return -1;
	snprintf(key, sizeof(key), "\n%s:", field);
	p = strstr(buf, key);
	if (!p)
		return -1;
	return strtol(p + strlen(key), NULL, 10);
}

/* Sum a per-thread figure over /proc/PID/task/ *. */
static int64_t sum_over_threads(pid_t pid, int64_t (*one)(const char *dir))
{
	char path[64];
	struct dirent *de;
	int64_t sum = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	if (!d)
		return -1;
	while ((de = readdir(d))) {
		char dir[320];
		int64_t v;

		if (de->d_name[0] == '.')
			continue;
		snprintf(dir, sizeof(dir), "%s/%s", path, de->d_name);
		v = one(dir);
		if (v >= 0)
			sum += v;
	}
	closedir(d);
	return sum;
}

static int64_t thread_schedstat_ns(const char *dir)
{
	char path[352], buf[256];

	snprintf(path, sizeof(path), "%s/schedstat", dir);
	if (read_small_file(path, buf, sizeof(buf)) < 0)
		return -1;
	return strtoll(buf, NULL, 10);
}

static int64_t thread_ctxt(const char *dir)
{
	char path[352], buf[8192];
	const char *v, *nv;

	snprintf(path, sizeof(path), "%s/status", dir);
	if (read_small_file(path, buf, sizeof(buf)) < 0)
		return -1;
	v = strstr(buf, "\nvoluntary_ctxt_switches:");
	nv = strstr(buf, "\nnonvoluntary_ctxt_switches:");
	if (!v || !nv)
		return -1;
	return strtoll(v + strlen("\nvoluntary_ctxt_switches:"), NULL, 10) +
	       strtoll(nv + strlen("\nnonvoluntary_ctxt_switches:"), NULL, 10);
}

int64_t bench_cpu_ns(pid_t pid)
{
	return sum_over_threads(pid, thread_schedstat_ns);
}

int64_t bench_ctxt_switches(pid_t pid)
{
	return sum_over_threads(pid, thread_ctxt);
}

int64_t bench_cpu_ticks(pid_t pid)
{
	char path[64], buf[4096];
	unsigned long long ut, st;
	const char *p;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (read_small_file(path, buf, sizeof(buf)) < 0)
		return -1;
	/* comm may contain spaces and parentheses: fields restart after the last ')'. */
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
		return -1;
	return (int64_t)(ut + st);
}

#define IDLE_MAX_PIDS 8

void bench_idle_measure(const pid_t *pids, size_t n, unsigned seconds, struct bench_idle *ret)
{
	int64_t ns0[IDLE_MAX_PIDS], t0[IDLE_MAX_PIDS], c0[IDLE_MAX_PIDS];
	long hz = sysconf(_SC_CLK_TCK);
	uint64_t w0, wall;

	if (n > IDLE_MAX_PIDS || hz <= 0)
		bench_die(0, "bench_idle_measure: bad arguments");
	for (size_t i = 0; i < n; i++) {
		ns0[i] = bench_cpu_ns(pids[i]);
		t0[i] = bench_cpu_ticks(pids[i]);
		c0[i] = bench_ctxt_switches(pids[i]);
		if (ns0[i] < 0 || t0[i] < 0 || c0[i] < 0)
			bench_die(0, "cannot read /proc/%d CPU figures", (int)pids[i]);
	}
	w0 = bench_now_ns();
	bench_sleep_ms(seconds * 1000u);
	wall = bench_now_ns() - w0;
	for (size_t i = 0; i < n; i++) {
		int64_t ns1 = bench_cpu_ns(pids[i]), t1 = bench_cpu_ticks(pids[i]), c1 = bench_ctxt_switches(pids[i]);

		if (ns1 < 0 || t1 < 0 || c1 < 0)
			bench_die(0, "cannot read /proc/%d CPU figures", (int)pids[i]);
		ret[i].cpu_pct_schedstat = 100.0 * (double)(ns1 - ns0[i]) / (double)wall;
		ret[i].cpu_pct_ticks = 100.0 * ((double)(t1 - t0[i]) / (double)hz) / ((double)wall / 1e9);
		ret[i].wakeups_per_s = (double)(c1 - c0[i]) / ((double)wall / 1e9);
	}
}

void bench_print_load(void)
{
	char buf[128];

	if (read_small_file("/proc/loadavg", buf, sizeof(buf)) < 0)
		return;
	buf[strcspn(buf, "\n")] = '\0';
	/* Other work on a 2-CPU machine moves every figure; say how busy it was. */
	printf("# load average now: %s\n", buf);
}

void bench_print_host(void)
{
	struct utsname u;
	char buf[256], model[128] = "unknown CPU";
	time_t now = time(NULL);
	FILE *f;

	if (uname(&u) < 0)
		bench_die(-errno, "uname");
	f = fopen("/proc/cpuinfo", "re");
	if (f) {
		while (fgets(buf, sizeof(buf), f))
			if (!strncmp(buf, "model name", 10)) {
				char *p = strchr(buf, ':');

				if (p) {
					snprintf(model, sizeof(model), "%s", p + 2);
					model[strcspn(model, "\n")] = '\0';
				}
				break;
			}
		fclose(f);
	}
	strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S %Z", localtime(&now));
	printf("# %s; %s %s; %ld CPUs (%s); %.1f GiB RAM\n", buf, u.sysname, u.release, sysconf(_SC_NPROCESSORS_ONLN),
	       model, (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024 * 1024));
	bench_print_load();
}

char *bench_metrics_text(const char *sock)
{
	char *text = NULL;
	pb_client *c;

	if (pb_connect(sock, &c) < 0)
		return NULL;
	if (pb_metrics(c, &text) < 0)
		text = NULL;
	pb_disconnect(c);
	return text;
}

double bench_metric_in(const char *text, const char *name)
{
	char key[128];
	const char *p;

	snprintf(key, sizeof(key), "\n%s ", name);
	return text && (p = strstr(text, key)) ? strtod(p + strlen(key), NULL) : -1;
}

double bench_metric(const char *sock, const char *name)
{
	char *text = bench_metrics_text(sock);
	double v = bench_metric_in(text, name);

	free(text);
	return v;
}

void bench_drop_to(uid_t uid)
{
	if (setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0)
		_exit(90);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
}

void bench_write_all(int fd, const void *p, size_t n)
{
	const char *c = p;

	while (n > 0) {
		ssize_t w = write(fd, c, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			_exit(91);
		c += w;
		n -= (size_t)w;
	}
}

int bench_read_all(int fd, void *p, size_t n)
{
	char *c = p;

	while (n > 0) {
		ssize_t r = read(fd, c, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		c += r;
		n -= (size_t)r;
	}
	return 0;
}

/* The most STATUS round trips one prober keeps: over 3 minutes at 1 ms apart. */
#define PROBER_MAX_SAMPLES 200000

void bench_prober_start(struct bench_prober *pr, const char *sock, uid_t uid, unsigned gap_us)
{
	int a[2], b[2];
	char ok;

	if (pipe(a) < 0 || pipe(b) < 0)
		bench_die(-errno, "pipe");
	pr->uid = uid;
	pr->pid = fork();
	if (pr->pid < 0)
		bench_die(-errno, "fork");
	if (pr->pid == 0) {
		struct pollfd stop = { .fd = a[0], .events = POLLIN };
		double *lat = calloc(PROBER_MAX_SAMPLES, sizeof(*lat));
		size_t n = 0;
		pb_client *c;

		close(a[1]);
		close(b[0]);
		bench_drop_to(uid);
		if (!lat || pb_connect(sock, &c) < 0)
			_exit(50);
		bench_write_all(b[1], "k", 1);
		while (poll(&stop, 1, 0) == 0 && n < PROBER_MAX_SAMPLES) {
			struct pb_status *s;
			uint64_t t0 = bench_now_ns();

			if (pb_status_get(c, &s) < 0)
				_exit(51);
			lat[n++] = (double)(bench_now_ns() - t0) / 1e6;
			pb_status_free(s);
			usleep(gap_us);
		}
		bench_write_all(b[1], &n, sizeof(n));
		bench_write_all(b[1], lat, n * sizeof(*lat));
		_exit(0);
	}
	close(a[0]);
	close(b[1]);
	pr->to = a[1];
	pr->from = b[0];
	if (bench_read_all(pr->from, &ok, 1) < 0)
		bench_die(0, "uid %u's prober could not connect", (unsigned)uid);
}

double *bench_prober_stop(struct bench_prober *pr, size_t *n)
{
	double *lat;

	bench_write_all(pr->to, "s", 1);
	if (bench_read_all(pr->from, n, sizeof(*n)) < 0 || !(lat = calloc(*n ? *n : 1, sizeof(*lat))) ||
	    bench_read_all(pr->from, lat, *n * sizeof(*lat)) < 0)
		bench_die(0, "uid %u's prober failed", (unsigned)pr->uid);
	waitpid(pr->pid, NULL, 0);
	close(pr->to);
	close(pr->from);
	return lat;
}

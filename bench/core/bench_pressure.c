/* SPDX-License-Identifier: MIT */
/* Pressure benchmark (issue 3 §6): time from a critical signal to REVOKE at a cooperative client and to the memory back in the pool; monitor idle CPU. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"
#include "pinbroker.h"

#define NLEASES 4
#define LEASE_BYTES (4u << 20)
#define MAX_RUNS 1000
#define MEMINFO_MAX_BYTES 16384
/* Every wait below is bounded: a daemon that never reacts fails the benchmark instead of hanging it. */
#define REACT_TIMEOUT_MS 10000
#define RECOVER_TIMEOUT_MS 15000
#define STATUS_POLL_US 500  /* how often the main thread asks for leased_bytes */
#define HYSTERESIS_MS "200" /* short, so the state returns to normal between runs */

static const char *daemon_path = PB_BENCH_DAEMON;
static const char *fixtures = PB_BENCH_FIXTURES;
static unsigned runs = 20, idle_s = 10;
static char tmpdir[] = "/tmp/pb-bench-pressure.XXXXXX";
static char meminfo_path[256], meminfo_next[256];
static char idle_meminfo[MEMINFO_MAX_BYTES], crit_meminfo[MEMINFO_MAX_BYTES];
static size_t idle_len, crit_len;

/* What the revoke callback (on libpinbroker's receiver thread) saw. */
static pthread_mutex_t rv_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t rv_first_ns;
static unsigned rv_count;

static int on_revoke(pb_client *c, pb_lease *l, uint32_t deadline_ms, void *userdata)
{
	uint64_t t = bench_now_ns();
	int r;

	pthread_mutex_lock(&rv_lock);
	if (rv_count++ == 0)
		rv_first_ns = t;
	pthread_mutex_unlock(&rv_lock);
	/* Cooperative: stop using it and give it back at once. */
	r = pb_release(c, l);
	if (r < 0)
		fprintf(stderr, "pb_release in revoke callback: %s\n", pb_last_error());
	return 0;
}

static size_t read_file(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		bench_die(-errno, "open %s", path);
	n = read(fd, buf, cap);
	if (n < 0)
		bench_die(-errno, "read %s", path);
	if ((size_t)n == cap)
		bench_die(-EFBIG, "%s", path);
	close(fd);
	return (size_t)n;
}

/* Replace TMP/proc/meminfo atomically: the monitor sees either the old file or the new one. */
static void flip_meminfo(const char *buf, size_t len)
{
	int fd = open(meminfo_next, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	if (fd < 0)
		bench_die(-errno, "open %s", meminfo_next);
	if (write(fd, buf, len) != (ssize_t)len)
		bench_die(-errno, "write %s", meminfo_next);
	if (close(fd) < 0)
		bench_die(-errno, "close %s", meminfo_next);
	if (rename(meminfo_next, meminfo_path) < 0)
		bench_die(-errno, "rename %s", meminfo_next);
}

static void run_cmd(const char *const argv[])
{
	pid_t pid;
	int st;

	fflush(NULL);
	pid = fork();
	if (pid < 0)
		bench_die(-errno, "fork");
	if (pid == 0) {
		execvp(argv[0], (char *const *)argv);
		_exit(127);
	}
	if (waitpid(pid, &st, 0) < 0)
		bench_die(-errno, "waitpid");
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		bench_die(0, "%s %s failed", argv[0], argv[1]);
}

static void setup_proc_root(void)
{
	char src[512], path[512];

	if (!mkdtemp(tmpdir))
		bench_die(-errno, "mkdtemp");
	snprintf(src, sizeof(src), "%s/idle/.", fixtures);
	{
		const char *const argv[] = { "cp", "-a", src, tmpdir, NULL };

		run_cmd(argv);
	}
	snprintf(meminfo_path, sizeof(meminfo_path), "%s/proc/meminfo", tmpdir);
	snprintf(meminfo_next, sizeof(meminfo_next), "%s/proc/.meminfo.next", tmpdir);
	idle_len = read_file(meminfo_path, idle_meminfo, sizeof(idle_meminfo));
	snprintf(path, sizeof(path), "%s/near-oom/proc/meminfo", fixtures);
	crit_len = read_file(path, crit_meminfo, sizeof(crit_meminfo));
}

static void cleanup_proc_root(void)
{
	const char *const argv[] = { "rm", "-rf", "--", tmpdir, NULL };

	run_cmd(argv);
}

static struct pb_status *status(pb_client *c)
{
	struct pb_status *st;
	int r = pb_status_get(c, &st);

	if (r < 0)
		bench_die(r, "pb_status_get: %s", pb_last_error());
	return st;
}

/* Wait (bounded) until the daemon says normal. */
static void wait_normal(pb_client *c)
{
	uint64_t deadline = bench_now_ns() + (uint64_t)RECOVER_TIMEOUT_MS * 1000000ull;

	while (bench_now_ns() < deadline) {
		struct pb_status *st = status(c);
		bool normal = st->pressure_state && !strcmp(st->pressure_state, "normal") && st->leased_bytes == 0;

		pb_status_free(st);
		if (normal)
			return;
		bench_sleep_ms(20);
	}
	bench_die(-ETIMEDOUT, "the daemon did not return to normal within %d ms", RECOVER_TIMEOUT_MS);
}

struct result {
	double revoke_p50_ms, revoke_p99_ms, revoke_max_ms;
	double back_p50_ms, back_p99_ms, back_max_ms;
	char mode[64];
	struct bench_idle idle;
};

static void measure(unsigned poll_ms, struct result *res)
{
	char sock[108], logp[128], poll_s[16];
	const char *extra[] = { "--proc-root",
				tmpdir,
				"--poll-interval-ms",
				poll_s,
				"--hysteresis-ms",
				HYSTERESIS_MS,
				"--revoke-deadline-ms",
				"5000",
				"--prewarm",
				"64M",
				NULL };
	double rv[MAX_RUNS], back[MAX_RUNS];
	struct pb_status *st;
	pb_client *c;
	pid_t dpid;
	int r;

	snprintf(poll_s, sizeof(poll_s), "%u", poll_ms);
	snprintf(sock, sizeof(sock), "/tmp/pb-bench-pressure.%d.sock", (int)getpid());
	snprintf(logp, sizeof(logp), "/tmp/pb-bench-pressure.%d.log", (int)getpid());
	flip_meminfo(idle_meminfo, idle_len);
	dpid = bench_daemon_start(daemon_path, sock, logp, extra);
	r = pb_connect(sock, &c);
	if (r < 0)
		bench_die(r, "pb_connect: %s", pb_last_error());
	pb_set_cache_limit(c, 0);
	pb_set_revoke_callback(c, on_revoke, NULL);
	st = status(c);
	snprintf(res->mode, sizeof(res->mode), "%s", st->monitor_mode ? st->monitor_mode : "?");
	pb_status_free(st);

	for (unsigned run = 0; run < runs; run++) {
		struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE, .label = "bench" };
		uint64_t t0, deadline, back_ns = 0, first_ns;
		unsigned count;

		wait_normal(c);
		pthread_mutex_lock(&rv_lock);
		rv_count = 0;
		rv_first_ns = 0;
		pthread_mutex_unlock(&rv_lock);
		for (int i = 0; i < NLEASES; i++) {
			pb_lease *l;

			r = pb_acquire(c, LEASE_BYTES, &o, &l);
			if (r < 0)
				bench_die(r, "pb_acquire: %s", pb_last_error());
			/* Owned by the revoke callback from here on. */
		}
		/* A random phase against the poll timer, so the runs sample the whole interval. */
		bench_sleep_ms(50 + (unsigned)(random() % poll_ms));

		t0 = bench_now_ns();
		flip_meminfo(crit_meminfo, crit_len);
		deadline = t0 + (uint64_t)REACT_TIMEOUT_MS * 1000000ull;
		while (bench_now_ns() < deadline) {
			st = status(c);
			if (st->leased_bytes == 0)
				back_ns = bench_now_ns();
			pb_status_free(st);
			if (back_ns)
				break;
			usleep(STATUS_POLL_US);
		}
		pthread_mutex_lock(&rv_lock);
		first_ns = rv_first_ns;
		count = rv_count;
		pthread_mutex_unlock(&rv_lock);
		if (!back_ns || count != NLEASES)
			bench_die(-ETIMEDOUT, "run %u at poll %u ms: %u of %d leases revoked, memory %s back in %d ms",
				  run, poll_ms, count, NLEASES, back_ns ? "" : "not", REACT_TIMEOUT_MS);
		rv[run] = (double)(first_ns - t0) / 1e6;
		back[run] = (double)(back_ns - t0) / 1e6;
		flip_meminfo(idle_meminfo, idle_len);
	}
	wait_normal(c);
	pb_disconnect(c);

	res->revoke_p50_ms = bench_percentile(rv, runs, 50);
	res->revoke_p99_ms = bench_percentile(rv, runs, 99);
	res->revoke_max_ms = rv[runs - 1];
	res->back_p50_ms = bench_percentile(back, runs, 50);
	res->back_p99_ms = bench_percentile(back, runs, 99);
	res->back_max_ms = back[runs - 1];
	/* The same daemon idle on the fixture root: the cost of polling at this interval. */
	bench_idle_measure(&dpid, 1, idle_s, &res->idle);
	bench_daemon_stop(dpid);
	unlink(logp);
}

/* The monitor idle on the real /proc with every default but the socket: the idle CPU target. */
static void measure_real_idle(struct result *res)
{
	char sock[108], logp[128];
	const char *extra[] = { "--prewarm", "64M", NULL };
	struct pb_status *st;
	pb_client *c;
	pid_t dpid;
	int r;

	snprintf(sock, sizeof(sock), "/tmp/pb-bench-pressure-real.%d.sock", (int)getpid());
	snprintf(logp, sizeof(logp), "/tmp/pb-bench-pressure-real.%d.log", (int)getpid());
	dpid = bench_daemon_start(daemon_path, sock, logp, extra);
	r = pb_connect(sock, &c);
	if (r < 0)
		bench_die(r, "pb_connect: %s", pb_last_error());
	st = status(c);
	snprintf(res->mode, sizeof(res->mode), "%s", st->monitor_mode ? st->monitor_mode : "?");
	pb_status_free(st);
	pb_disconnect(c);
	/* Let the start-up work (pool warm-up threads, first samples) finish first. */
	bench_sleep_ms(1000);
	bench_idle_measure(&dpid, 1, idle_s, &res->idle);
	bench_daemon_stop(dpid);
	unlink(logp);
}

static void usage(int code)
{
	printf("Usage: bench_pressure [--daemon PATH] [--fixtures DIR] [--runs N] [--idle-s N] [--quick]\n");
	exit(code);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "daemon", required_argument, NULL, 'd' },
		{ "fixtures", required_argument, NULL, 'f' },
		{ "runs", required_argument, NULL, 'n' },
		{ "idle-s", required_argument, NULL, 'i' },
		{ "quick", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static const unsigned polls[] = { 1000, 100 };
	struct result res[2], real;
	bool revoke_ok;
	int opt;

	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'd':
			daemon_path = optarg;
			break;
		case 'f':
			fixtures = optarg;
			break;
		case 'n':
			runs = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'i':
			idle_s = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'q':
			runs = 5;
			idle_s = 2;
			break;
		case 'h':
			usage(0);
			break;
		default:
			usage(2);
		}
	}
	if (runs == 0 || runs > MAX_RUNS || idle_s == 0 || idle_s > 120)
		usage(2);
	unsetenv("PINBROKER_CACHE_BYTES");
	signal(SIGPIPE, SIG_IGN);
	srandom((unsigned)getpid());
	setup_proc_root();

	printf("## bench_pressure: critical signal → REVOKE → memory back in the pool (issue 3 §6)\n");
	bench_print_host();
	printf("# pinbrokerd --config /dev/null --proc-root <copy of tests/fixtures/proc/idle> --hysteresis-ms %s "
	       "--prewarm 64M; a client holds %d leases of %u MiB, its revoke callback calls pb_release at once\n",
	       HYSTERESIS_MS, NLEASES, LEASE_BYTES >> 20);
	printf("# t0 = rename(2) of near-oom/proc/meminfo (MemAvailable 3%%) over the fixture's meminfo; "
	       "REVOKE = first callback; back = pb_status_get leased_bytes 0 (asked every %d µs); %u runs each\n\n",
	       STATUS_POLL_US, runs);
	for (size_t i = 0; i < 2; i++) {
		measure(polls[i], &res[i]);
		fflush(stdout);
	}
	measure_real_idle(&real);
	cleanup_proc_root();

	printf("| poll-interval-ms | monitor mode | to REVOKE p50 | p99 | max | to memory back p50 | p99 | max | "
	       "idle CPU, fixture root | wake-ups/s |\n");
	printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
	for (size_t i = 0; i < 2; i++)
		printf("| %u%s | %s | %.1f ms | %.1f ms | %.1f ms | %.1f ms | %.1f ms | %.1f ms | %.4f%% | %.1f |\n",
		       polls[i], polls[i] == 100 ? " (default)" : "", res[i].mode, res[i].revoke_p50_ms,
		       res[i].revoke_p99_ms, res[i].revoke_max_ms, res[i].back_p50_ms, res[i].back_p99_ms,
		       res[i].back_max_ms, res[i].idle.cpu_pct_schedstat, res[i].idle.wakeups_per_s);
	revoke_ok = res[0].revoke_p99_ms <= 100;
	printf("\nFixture files are plain files, not procfs: PSI triggers cannot be armed on them, so here the reaction "
	       "is bounded by the poll interval (expected ≈ U(0, interval) + reaction). On a real kernel a PSI "
	       "trigger (memory some %s ms stall in a 2 s window) wakes the loop at once and the daemon then samples "
	       "every 100 ms until the pressure is gone; a MemAvailable drop with no stall is still seen only at the "
	       "next poll.\n",
	       "100");
	printf("Compare: earlyoom polls meminfo every 100–1000 ms (adaptive); systemd-oomd reads pressure once a "
	       "second and swap every 150 ms.\n");
	printf("Target ≤ 100 ms to REVOKE: %s at a 1000 ms poll (p99 %.1f ms), %s at the default 100 ms (p99 %.1f ms); "
	       "event-driven on real PSI (not measurable with fixtures).\n\n",
	       revoke_ok ? "met" : "MISSED", res[0].revoke_p99_ms, res[1].revoke_p99_ms <= 100 ? "met" : "MISSED",
	       res[1].revoke_p99_ms);
	printf("| monitor idle on the real /proc, defaults (poll-interval-ms 100) | monitor mode | CPU (schedstat) | "
	       "CPU (utime+stime) | wake-ups/s |\n|---|---|---:|---:|---:|\n");
	printf("| pinbrokerd, no clients, %u s | %s | %.4f%% | %.2f%% | %.1f |\n", idle_s, real.mode,
	       real.idle.cpu_pct_schedstat, real.idle.cpu_pct_ticks, real.idle.wakeups_per_s);
	printf("\nTarget idle CPU ≤ 0.1%% of a core: %s\n", real.idle.cpu_pct_schedstat <= 0.1 ? "met" : "MISSED");
	return 0;
}

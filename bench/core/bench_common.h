/* SPDX-License-Identifier: MIT */
/*
 * Shared helpers for the CPU benchmarks: clocks, percentiles, a daemon under test, /proc readings of it, its metrics,
 * and clients run as other uids (a STATUS prober).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t bench_now_ns(void);

/* Sleep for ms milliseconds (restarted on EINTR). */
void bench_sleep_ms(unsigned ms);

/* The p-th percentile (0..100, nearest rank) of v[0..n); sorts v. 0 when n is 0. */
double bench_percentile(double *v, size_t n, double p);

/* Print a message with strerror(-err) and exit(1). */
__attribute__((noreturn, format(printf, 2, 3))) void bench_die(int err, const char *fmt, ...);

/*
 * Start pinbrokerd (path) with "--config /dev/null --socket sock" plus the
 * NULL-terminated extra argv, stderr to logpath. Waits (up to 30 s) until a
 * pb_connect succeeds. Returns the pid or exits.
 */
pid_t bench_daemon_start(const char *path, const char *sock, const char *logpath, const char *const *extra);

/* How bench_daemon_start_with waits for the daemon. */
struct bench_start {
	unsigned timeout_ms; /* exit (bench_die) when it does not answer within this */
	unsigned poll_ms;    /* between two tries to connect: what a ready time it measures is precise to */
	bool append_log;     /* append to logpath (a restart keeps the earlier daemon's log), else truncate it */
	double *ready_ms;    /* when set: ms from the fork to the first answer */
};

/* bench_daemon_start, waiting as how says. Returns the pid or exits. */
pid_t bench_daemon_start_with(const char *path, const char *sock, const char *logpath, const char *const *extra,
			      const struct bench_start *how);

/* SIGTERM the daemon and reap it (SIGKILL after 5 s). */
void bench_daemon_stop(pid_t pid);

/* A field of /proc/PID/status in kB ("VmRSS", "RssShmem", ...); -1 if absent. */
long bench_status_kb(pid_t pid, const char *field);

/* CPU time of pid (all threads) in ns from /proc/PID/schedstat, -1 on error. */
int64_t bench_cpu_ns(pid_t pid);

/* utime+stime of pid in clock ticks from /proc/PID/stat, -1 on error. */
int64_t bench_cpu_ticks(pid_t pid);

/* voluntary + involuntary context switches of pid, summed over its threads; -1 on error. */
int64_t bench_ctxt_switches(pid_t pid);

struct bench_idle {
	double cpu_pct_schedstat; /* % of one core, from schedstat (ns resolution) */
	double cpu_pct_ticks;     /* % of one core, from utime+stime (10 ms ticks) */
	double wakeups_per_s;     /* context switches per second: how often it ran at all */
};

/* Measure the CPU of pids[0..n) over the same `seconds` of wall time, with nothing asked of them. */
void bench_idle_measure(const pid_t *pids, size_t n, unsigned seconds, struct bench_idle *ret);

/* Write the current date/time and host facts (kernel, CPUs, memory) as '# ' comment lines. */
void bench_print_host(void);

/* Write /proc/loadavg as a '# ' comment line. */
void bench_print_load(void);

/* The daemon's metrics text on sock (malloc'd), or NULL when it cannot be had. */
char *bench_metrics_text(const char *sock);

/* A metric's value in a metrics text (NULL allowed); -1 when it has no such metric. */
double bench_metric_in(const char *text, const char *name);

/* A metric's value, read from the daemon on sock now; -1 when it has no such metric or did not answer. */
double bench_metric(const char *sock, const char *name);

/*
 * In a child: become uid (and gid) with no supplementary groups, or _exit(90); then die with the parent (set after
 * setuid, which clears it).
 */
void bench_drop_to(uid_t uid);

/* All of p to fd, restarted on EINTR; _exit(91) when it cannot (for children). */
void bench_write_all(int fd, const void *p, size_t n);

/* All n bytes from fd into p, restarted on EINTR: 0, or -1 on an error or an early end. */
int bench_read_all(int fd, void *p, size_t n);

/* A child of another uid that times STATUS round trips (bench_prober_start). */
struct bench_prober {
	pid_t pid;
	uid_t uid;
	int to, from; /* pipes to and from the child */
};

/*
 * Fork a child that becomes uid, connects to sock and asks STATUS in a loop, each timed, gap_us apart, until
 * bench_prober_stop. Returns once it is connected; exits (bench_die) when it cannot connect.
 */
void bench_prober_start(struct bench_prober *pr, const char *sock, uid_t uid, unsigned gap_us);

/* Stop the prober and reap it: its latencies in ms (malloc'd, *n of them, in the order taken), or exit. */
double *bench_prober_stop(struct bench_prober *pr, size_t *n);

/* SPDX-License-Identifier: MIT */
/*
 * The client-cache suites' daemon and helpers (check_itest_cache.c: the library's side; check_itest_cache_raw.c:
 * the daemon's side over the raw protocol): one daemon per test, the stand-in libcuda.so.1, and the lease states
 * read from the daemon's status.
 */
#pragma once

#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../preload/stub_cuda.h"
#include "check_main.h"
#include "fdstore.h"
#include "itest.h"
#include "pinbroker.h"

#define KiB 1024ull
#define MiB (1024ull * KiB)
#define PAGE (4 * KiB) /* the pool's page with --hugetlb no (daemon_start's default) */
/* Every wait here polls an event with this bound; nothing here asserts a speed. */
#define WAIT_MS 5000
/* The daemon's default deadline, short: a revoked cached lease left alone is taken back in well under a second. */
#define DEADLINE_MS "300"
/*
 * The deadline of the revoke that SET_IDLE 0 answers: long enough that the answer always comes first, however
 * loaded the machine, so the daemon's own take-back at the deadline is not what the test sees.
 */
#define TAKE_BACK_DEADLINE_MS 1500

static struct daemon d;
/* The stand-in driver's own record of registrations: a cache hit registers nothing. */
static void (*stub_stats)(struct stub_cuda_stats *);
static int (*stub_dev_ptr)(unsigned long long *, void *, unsigned);

/* What the interposer asks for (client/preload/preload-memory.c): never revoked, registered with DEVICEMAP. */
static const struct pb_acquire_opts nr_mapped = { .flags = PB_ACQUIRE_NO_REVOKE | PB_ACQUIRE_MAPPED,
						  .label = "cached" };

/* The stand-in libcuda.so.1 loaded before the library looks for one: it finds it by its soname. */
static inline void load_stub_cuda(void)
{
	void *h = dlopen(STUB_DIR "/libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);

	ck_assert_msg(h, "dlopen the stand-in libcuda: %s", dlerror());
	*(void **)&stub_stats = dlsym(h, "stub_cuda_get_stats");
	*(void **)&stub_dev_ptr = dlsym(h, "cuMemHostGetDevicePointer_v2");
	ck_assert_ptr_nonnull(stub_stats);
	ck_assert_ptr_nonnull(stub_dev_ptr);
	ck_assert_int_eq(pb_cuda_available(NULL), 1);
}

/* A test's clean end: nothing leased, c (unless NULL) disconnected; the teardown stops the daemon. */
static inline void end_clean(pb_client *c)
{
	ck_assert_int_eq(wait_leased(d.socket, 0, WAIT_MS), 0);
	if (c)
		pb_disconnect(c);
}

/* The daemon must exit 0: nothing the cache did left it in a state it cannot shut down from. */
static inline void stop(void)
{
	ck_assert_int_eq(daemon_stop(&d), 0);
}

/* A failed test exits before its teardown: take its daemon with it, so none outlives the run. */
static inline void kill_daemon_at_exit(void)
{
	if (d.pid > 0 && daemon_alive(&d))
		kill(d.pid, SIGKILL);
}

/* Room for every case's leases; no pool shrink meanwhile; a short revoke deadline for the race cases. */
static inline void start(void)
{
	atexit(kill_daemon_at_exit);
	load_stub_cuda();
	daemon_start(&d, ITEST_ARGS("--budget", "64M", "--prewarm", "0", "--chunk-size", "2M", "--chunk-max", "2M",
				    "--pool-shrink-delay-ms", "600000", "--revoke-deadline-ms", DEADLINE_MS));
}

/*
 * A budget that fits one 6 MiB lease and not two, all of it open to never-revoked leases: the idle-reclaim case.
 * The default deadline (5 s): the acquire that reclaims waits that long for the holder, and a loaded machine
 * (ASan, 2 cores) must not make it miss.
 */
static inline void start_tight(void)
{
	atexit(kill_daemon_at_exit);
	load_stub_cuda();
	daemon_start(&d, ITEST_ARGS("--budget", "8M", "--max-no-revoke-per-uid", "8M", "--prewarm", "0", "--chunk-size",
				    "2M", "--chunk-max", "2M", "--pool-shrink-delay-ms", "600000"));
}

static inline pb_client *cache_client(size_t limit, unsigned slack_pct)
{
	pb_client *c;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	pb_set_cache_limit(c, limit);
	pb_set_cache_slack(c, slack_pct);
	return c;
}

static inline struct pb_cache_stats stats_of(pb_client *c)
{
	struct pb_cache_stats st;

	ck_assert_int_eq(pb_cache_stats(c, &st), 0);
	return st;
}

/* Poll c's cache figures until revoked reaches want (the receiver thread counts it): true, or false at the bound. */
static inline bool wait_revoked(pb_client *c, uint64_t want)
{
	for (uint64_t t0 = itest_now_ms(); itest_now_ms() - t0 < WAIT_MS; usleep(10000))
		if (stats_of(c).revoked >= want)
			return true;
	return false;
}

/* The tasks of this process now, into tids (at most max); how many. */
static inline size_t own_tasks(pid_t *tids, size_t max)
{
	DIR *dir = opendir("/proc/self/task");
	struct dirent *e;
	size_t n = 0;

	ck_assert_ptr_nonnull(dir);
	while ((e = readdir(dir)) && n < max)
		if (e->d_name[0] != '.')
			tids[n++] = (pid_t)atoi(e->d_name);
	closedir(dir);
	return n;
}

/* How often thread tid slept and was woken (voluntary_ctxt_switches): each receiver tick is one. */
static inline long thread_wakeups(pid_t tid)
{
	char path[64], line[256];
	long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/task/%d/status", (int)tid);
	f = fopen(path, "re");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "voluntary_ctxt_switches: %ld", &v) == 1)
			break;
	fclose(f);
	ck_assert_int_ge(v, 0);
	return v;
}

/* Connects a caching client and finds its receiver thread: the one task pb_connect added. */
static inline pb_client *cache_client_rx(size_t limit, pid_t *rx)
{
	pid_t before[64], after[64];
	size_t nb = own_tasks(before, 64), na;
	pb_client *c = cache_client(limit, 0);

	*rx = 0;
	na = own_tasks(after, 64);
	for (size_t i = 0; i < na; i++) {
		bool old = false;

		for (size_t j = 0; j < nb; j++)
			old |= after[i] == before[j];
		if (!old) {
			ck_assert_msg(*rx == 0, "pb_connect started more than one thread");
			*rx = after[i];
		}
	}
	ck_assert_msg(*rx != 0, "no receiver thread found");
	return c;
}

/*
 * The window in which a ticking receiver would wake IDLE_WINDOW_TICKS times (a tick is 100 ms). The absence of
 * wakeups has no event to wait on: this window is the thing under test (the one fixed sleep here), and it
 * asserts nothing about speed.
 */
#define IDLE_WINDOW_TICKS 8

/* The daemon's leases now (this file's clients are its only holders). */
static inline size_t daemon_leases(void)
{
	struct pb_status *s = itest_status(d.socket);
	size_t n = s->n_leases;

	pb_status_free(s);
	return n;
}

/* The daemon's state of lease id ("active", "idle", ...), malloc'd, or NULL when it has no such lease. */
static inline char *lease_state(uint64_t id)
{
	struct pb_status *s = itest_status(d.socket);
	const struct pb_lease_info *row = itest_lease_row(s, id);
	char *v = row ? strdup(row->state) : NULL;

	pb_status_free(s);
	return v;
}

/* Whether the daemon still has lease id (cached ones included). */
static inline bool lease_held(uint64_t id)
{
	char *st = lease_state(id);
	bool held = st != NULL;

	free(st);
	return held;
}

/* Poll until lease id is in state want (NULL: gone); false at the bound, with the last state in *last. */
static inline bool wait_state(uint64_t id, const char *want, char *last, size_t lastlen)
{
	for (uint64_t t0 = itest_now_ms();; usleep(10000)) {
		char *st = lease_state(id);
		bool ok = want ? st && strcmp(st, want) == 0 : st == NULL;

		snprintf(last, lastlen, "%s", st ? st : "(gone)");
		free(st);
		if (ok)
			return true;
		if (itest_now_ms() - t0 > WAIT_MS)
			return false;
	}
}

#define ASSERT_STATE(id, want)                                                                                 \
	do {                                                                                                   \
		char last_[32];                                                                                \
		ck_assert_msg(wait_state((id), (want), last_, sizeof(last_)), "lease %llu: state %s, want %s", \
			      (unsigned long long)(id), last_, (want) ? (want) : "(gone)");                    \
	} while (0)

/* Lease id is in state want now: for what a synchronous reply has already settled. */
static inline void assert_state_now(uint64_t id, const char *want)
{
	char *st = lease_state(id);

	ck_assert_msg(st && strcmp(st, want) == 0, "lease %llu: state %s, want %s", (unsigned long long)id,
		      st ? st : "(gone)", want);
	free(st);
}

/* Whether any line of the daemon's log since its start names lease id ("lease ID (") and says what. */
static inline bool log_says_of_lease(uint64_t id, const char *what)
{
	char *log = daemon_log(&d), needle[64];
	bool found = false;

	snprintf(needle, sizeof(needle), "lease %llu (", (unsigned long long)id);
	for (char *p = log ? log + d.log_from : NULL; p && (p = strstr(p, needle)); p++) {
		char *eol = strchr(p, '\n');
		char *hit = strstr(p, what);

		if (hit && (!eol || hit < eol)) {
			found = true;
			break;
		}
	}
	free(log);
	return found;
}

/* A lease mapped with DEVICEMAP has a device pointer in the stand-in driver (only DEVICEMAP memory does). */
static inline bool device_mapped(pb_lease *l)
{
	unsigned long long dp = 0;

	return stub_dev_ptr(&dp, pb_lease_data(l), 0) == 0 && dp == (unsigned long long)(uintptr_t)pb_lease_data(l);
}

static inline uint64_t stub_register_calls(void)
{
	struct stub_cuda_stats s;

	stub_stats(&s);
	return s.register_calls;
}

static inline uint64_t stub_registered_bytes(void)
{
	struct stub_cuda_stats s;

	stub_stats(&s);
	return s.registered_bytes;
}

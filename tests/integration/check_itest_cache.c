/* SPDX-License-Identifier: MIT */
/*
 * Integration: libpinbroker's client cache of never-revoked leases (issue 25), against the real pinbrokerd.
 * A PB_ACQUIRE_NO_REVOKE|MAPPED lease released with the cache on stays mapped and registered (through the
 * stand-in libcuda.so.1), comes back for the same flags and a size within the slack, is shown idle to the
 * daemon after a receiver tick, and is then revocable: by an admin, or by another client's acquire that
 * does not fit. Over the raw protocol, a never-revoked lease taken back into use (SET_IDLE 0) while its
 * REVOKE is on the way, or left alone past the deadline, is the holder's again: never overdue, its
 * process never signalled. The expected values come from the issue and pinbroker.h, not from the code.
 */
#define _GNU_SOURCE
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
static void load_stub_cuda(void)
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
static void end_clean(pb_client *c)
{
	ck_assert_int_eq(wait_leased(d.socket, 0, WAIT_MS), 0);
	if (c)
		pb_disconnect(c);
}

/* The daemon must exit 0: nothing the cache did left it in a state it cannot shut down from. */
static void stop(void)
{
	ck_assert_int_eq(daemon_stop(&d), 0);
}

/* A failed test exits before its teardown: take its daemon with it, so none outlives the run. */
static void kill_daemon_at_exit(void)
{
	if (d.pid > 0 && daemon_alive(&d))
		kill(d.pid, SIGKILL);
}

/* Room for every case's leases; no pool shrink meanwhile; a short revoke deadline for the race cases. */
static void start(void)
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
static void start_tight(void)
{
	atexit(kill_daemon_at_exit);
	load_stub_cuda();
	daemon_start(&d, ITEST_ARGS("--budget", "8M", "--max-no-revoke-per-uid", "8M", "--prewarm", "0", "--chunk-size",
				    "2M", "--chunk-max", "2M", "--pool-shrink-delay-ms", "600000"));
}

static pb_client *cache_client(size_t limit, unsigned slack_pct)
{
	pb_client *c;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	pb_set_cache_limit(c, limit);
	pb_set_cache_slack(c, slack_pct);
	return c;
}

static struct pb_cache_stats stats_of(pb_client *c)
{
	struct pb_cache_stats st;

	ck_assert_int_eq(pb_cache_stats(c, &st), 0);
	return st;
}

/* Poll c's cache figures until revoked reaches want (the receiver thread counts it): true, or false at the bound. */
static bool wait_revoked(pb_client *c, uint64_t want)
{
	for (uint64_t t0 = itest_now_ms(); itest_now_ms() - t0 < WAIT_MS; usleep(10000))
		if (stats_of(c).revoked >= want)
			return true;
	return false;
}

/* The tasks of this process now, into tids (at most max); how many. */
static size_t own_tasks(pid_t *tids, size_t max)
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
static long thread_wakeups(pid_t tid)
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
static pb_client *cache_client_rx(size_t limit, pid_t *rx)
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
 * The window in which a ticking receiver would wake IDLE_WINDOW_TICKS times (a tick is 100 ms). Absence of an event
 * has no event to wait on: this is the one fixed sleep here, and it asserts nothing about speed.
 */
#define IDLE_WINDOW_TICKS 8

/* The daemon's leases now (this file's clients are its only holders). */
static size_t daemon_leases(void)
{
	struct pb_status *s = itest_status(d.socket);
	size_t n = s->n_leases;

	pb_status_free(s);
	return n;
}

/* The daemon's state of lease id ("active", "idle", ...), malloc'd, or NULL when it has no such lease. */
static char *lease_state(uint64_t id)
{
	struct pb_status *s = itest_status(d.socket);
	const struct pb_lease_info *row = itest_lease_row(s, id);
	char *v = row ? strdup(row->state) : NULL;

	pb_status_free(s);
	return v;
}

/* Whether the daemon still has lease id (cached ones included). */
static bool lease_held(uint64_t id)
{
	char *st = lease_state(id);
	bool held = st != NULL;

	free(st);
	return held;
}

/* Poll until lease id is in state want (NULL: gone); false at the bound, with the last state in *last. */
static bool wait_state(uint64_t id, const char *want, char *last, size_t lastlen)
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
static void assert_state_now(uint64_t id, const char *want)
{
	char *st = lease_state(id);

	ck_assert_msg(st && strcmp(st, want) == 0, "lease %llu: state %s, want %s", (unsigned long long)id,
		      st ? st : "(gone)", want);
	free(st);
}

/* Whether any line of the daemon's log since its start names lease id ("lease ID (") and says what. */
static bool log_says_of_lease(uint64_t id, const char *what)
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
static bool device_mapped(pb_lease *l)
{
	unsigned long long dp = 0;

	return stub_dev_ptr(&dp, pb_lease_data(l), 0) == 0 && dp == (unsigned long long)(uintptr_t)pb_lease_data(l);
}

static uint64_t stub_register_calls(void)
{
	struct stub_cuda_stats s;

	stub_stats(&s);
	return s.register_calls;
}

static uint64_t stub_registered_bytes(void)
{
	struct stub_cuda_stats s;

	stub_stats(&s);
	return s.registered_bytes;
}

/* ------------------------------------------------------------------------------------------------------------ */

START_TEST(test_cached_never_revoked_lease_comes_back_for_its_flags_and_size_within_the_slack)
{
	pb_client *c = cache_client(64 * MiB, 0);
	pb_lease *a, *b, *sm, *x, *y, *z, *half, *quarter;
	uint64_t ida, id_sm, calls;
	struct pb_cache_stats st;
	struct pb_status *s;

	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &nr_mapped, &a), 0);
	ida = pb_lease_id(a);
	ck_assert_int_eq(pb_lease_kind(a), PB_MEM_PINNED);
	ck_assert(device_mapped(a));
	ck_assert_int_eq(pb_release(c, a), 0);
	st = stats_of(c);
	ck_assert_uint_eq(st.kept, 1);
	ck_assert_uint_eq(st.cached_leases, 1);
	ck_assert_uint_eq(st.cached_bytes, 4 * MiB);
	ck_assert_uint_eq(st.slack_pct, 0);
	ck_assert_uint_eq(st.limit_bytes, 64 * MiB);

	/* The same size and flags: the same lease, still mapped with DEVICEMAP, registered no second time. */
	calls = stub_register_calls();
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &nr_mapped, &a), 0);
	ck_assert_uint_eq(pb_lease_id(a), ida);
	ck_assert_uint_eq(stub_register_calls(), calls);
	ck_assert(device_mapped(a));
	ck_assert_uint_eq(stats_of(c).hits, 1);
	ck_assert_uint_eq(stats_of(c).cached_bytes, 0);
	/* The daemon granted nothing more: one lease, of its size. */
	s = itest_status(d.socket);
	ck_assert_uint_eq(s->n_leases, 1);
	ck_assert_uint_eq(s->leased_bytes, 4 * MiB);
	ck_assert_uint_eq(s->no_revoke_bytes, 4 * MiB);
	pb_status_free(s);
	ck_assert_int_eq(pb_release(c, a), 0);

	/* A hit needs the same NO_REVOKE/MAPPED flags and priority: each of these is a lease of its own. */
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &(struct pb_acquire_opts){ .flags = PB_ACQUIRE_NO_REVOKE }, &x), 0);
	ck_assert_uint_ne(pb_lease_id(x), ida);
	ck_assert(!device_mapped(x));
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &(struct pb_acquire_opts){ .flags = PB_ACQUIRE_MAPPED }, &y), 0);
	ck_assert_uint_ne(pb_lease_id(y), ida);
	ck_assert_int_eq(pb_acquire(c, 4 * MiB,
				    &(struct pb_acquire_opts){ .flags = PB_ACQUIRE_NO_REVOKE | PB_ACQUIRE_MAPPED,
							       .priority = PB_PRIORITY_BEST_EFFORT },
				    &z),
			 0);
	ck_assert_uint_ne(pb_lease_id(z), ida);
	ck_assert_uint_eq(stats_of(c).hits, 1);
	ck_assert_uint_eq(daemon_leases(), 4);

	/* Slack 0: a page larger or a page smaller is another size, so another lease. */
	ck_assert_int_eq(pb_acquire(c, 4 * MiB + PAGE, &nr_mapped, &b), 0);
	ck_assert_uint_ne(pb_lease_id(b), ida);
	ck_assert_int_eq(pb_acquire(c, 4 * MiB - PAGE, &nr_mapped, &sm), 0);
	id_sm = pb_lease_id(sm);
	ck_assert_uint_ne(id_sm, ida);
	ck_assert_uint_eq(pb_lease_size(sm), 4 * MiB - PAGE);
	ck_assert_uint_eq(stats_of(c).hits, 1);
	ck_assert_uint_eq(daemon_leases(), 6);

	/* Slack 100: a request of half the size is served by a cached lease (up to twice its size). */
	ck_assert_int_eq(pb_release(c, b), 0);
	ck_assert_int_eq(pb_release(c, sm), 0);
	pb_set_cache_slack(c, 100);
	ck_assert_uint_eq(stats_of(c).slack_pct, 100);
	ck_assert_int_eq(pb_acquire(c, 2 * MiB, &nr_mapped, &half), 0);
	/* Of the three cached like it, only those up to twice 2 MiB: the 4 MiB one and the one a page under. */
	ck_assert_msg(pb_lease_id(half) == ida || pb_lease_id(half) == id_sm,
		      "2 MiB served by lease %llu, not by %llu (4 MiB) or %llu (a page under)",
		      (unsigned long long)pb_lease_id(half), (unsigned long long)ida, (unsigned long long)id_sm);
	ck_assert_uint_ge(pb_lease_size(half), 2 * MiB);
	ck_assert_uint_le(pb_lease_size(half), 4 * MiB);
	ck_assert_uint_eq(stats_of(c).hits, 2);
	ck_assert_uint_eq(daemon_leases(), 6);
	/* A quarter of the size is past any cached lease's slack: a new lease. */
	ck_assert_int_eq(pb_acquire(c, 1 * MiB, &nr_mapped, &quarter), 0);
	ck_assert_uint_eq(pb_lease_size(quarter), 1 * MiB);
	ck_assert_uint_eq(stats_of(c).hits, 2);
	ck_assert_uint_eq(daemon_leases(), 7);

	ck_assert_int_eq(pb_release(c, half), 0);
	ck_assert_int_eq(pb_release(c, quarter), 0);
	ck_assert_int_eq(pb_release(c, x), 0);
	ck_assert_int_eq(pb_release(c, y), 0);
	ck_assert_int_eq(pb_release(c, z), 0);
	ck_assert_uint_eq(stats_of(c).cached_leases, 7);
	/* Limit 0 gives every cached lease back. */
	pb_set_cache_limit(c, 0);
	ck_assert_uint_eq(stats_of(c).cached_leases, 0);
	end_clean(c);
}
END_TEST

START_TEST(test_cached_lease_is_shown_idle_after_a_tick_and_active_when_taken_back)
{
	pb_client *c = cache_client(64 * MiB, 0);
	pb_lease *a;
	uint64_t id;

	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &nr_mapped, &a), 0);
	id = pb_lease_id(a);
	ASSERT_STATE(id, "active");
	ck_assert_int_eq(pb_release(c, a), 0);
	/* A tick is 100 ms; WAIT_MS is the bound, not an expectation. */
	ASSERT_STATE(id, "idle");
	ck_assert_uint_ge(stats_of(c).told_idle, 1);
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &nr_mapped, &a), 0);
	ck_assert_uint_eq(pb_lease_id(a), id);
	ASSERT_STATE(id, "active");
	/* Cached again, and again shown idle; given back by a lower limit, gone. */
	ck_assert_int_eq(pb_release(c, a), 0);
	ASSERT_STATE(id, "idle");
	pb_set_cache_limit(c, 0);
	ASSERT_STATE(id, NULL);
	end_clean(c);
}
END_TEST

START_TEST(test_admin_revokes_a_cached_never_revoked_lease_but_not_an_active_one)
{
	pb_client *c = cache_client(64 * MiB, 0), *admin;
	pb_lease *a, *b;
	uint64_t id1, id2, idb, *ids = NULL;
	size_t n = 0;

	ck_assert_int_eq(pb_connect(d.socket, &admin), 0);
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &nr_mapped, &a), 0);
	id1 = pb_lease_id(a);
	ck_assert_int_eq(pb_release(c, a), 0);
	ASSERT_STATE(id1, "idle");

	/* By id: the library gives the cached lease back at once. */
	ck_assert_int_eq(pb_admin_revoke(admin, PB_REVOKE_LEASE, id1, 0, 0, &ids, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(ids[0], id1);
	free(ids);
	ck_assert_msg(wait_revoked(c, 1), "the library did not count the revoke of its cached lease");
	ck_assert_int_eq(wait_leased(d.socket, 0, WAIT_MS), 0);
	ASSERT_STATE(id1, NULL);
	ck_assert_uint_eq(stats_of(c).cached_leases, 0);
	ck_assert_uint_eq(stats_of(c).cached_bytes, 0);

	/* The next acquire is a new lease. */
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &nr_mapped, &a), 0);
	id2 = pb_lease_id(a);
	ck_assert_uint_ne(id2, id1);
	ck_assert_uint_eq(stats_of(c).hits, 0);

	/* In use, a never-revoked lease is still refused, and the admin is told why. */
	ids = NULL;
	ck_assert_int_lt(pb_admin_revoke(admin, PB_REVOKE_LEASE, id2, 0, 0, &ids, &n), 0);
	ck_assert_msg(strstr(pb_last_error(), "cannot give memory back") && strstr(pb_last_error(), "interposer"),
		      "admin revoke said: %s", pb_last_error());
	free(ids);
	ASSERT_STATE(id2, "active");

	/* By uid: only the cached one of the uid's two never-revoked leases. */
	ck_assert_int_eq(pb_acquire(c, 2 * MiB, &nr_mapped, &b), 0);
	idb = pb_lease_id(b);
	ck_assert_int_eq(pb_release(c, b), 0);
	ASSERT_STATE(idb, "idle");
	ck_assert_int_eq(pb_admin_revoke(admin, PB_REVOKE_UID, 0, getuid(), 0, &ids, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(ids[0], idb);
	free(ids);
	ck_assert_msg(wait_revoked(c, 2), "the library did not count the second revoke");
	ck_assert_int_eq(wait_leased(d.socket, (int64_t)(4 * MiB), WAIT_MS), (int64_t)(4 * MiB));
	ASSERT_STATE(idb, NULL);
	ASSERT_STATE(id2, "active");
	ck_assert_int_eq(pb_lease_kind(a), PB_MEM_PINNED);

	ck_assert_int_eq(pb_release(c, a), 0);
	pb_set_cache_limit(c, 0);
	pb_disconnect(admin);
	end_clean(c);
}
END_TEST

START_TEST(test_another_clients_acquire_reclaims_a_cached_never_revoked_lease)
{
	const struct pb_acquire_opts plain = { .flags = PB_ACQUIRE_NO_CUDA, .label = "other" };
	pb_client *a = cache_client(64 * MiB, 0), *b = cache_client(0, 0);
	pb_lease *la, *lb = NULL;
	uint64_t ida;

	ck_assert_int_eq(pb_acquire(a, 6 * MiB, &nr_mapped, &la), 0);
	ida = pb_lease_id(la);
	/* In use it is never taken: the budget (8M) has no room for B. */
	ck_assert_int_eq(pb_acquire(b, 6 * MiB, &plain, &lb), -ENOSPC);
	ASSERT_STATE(ida, "active");

	/* Cached and shown idle: B's acquire has the daemon revoke it, and waits for it. */
	ck_assert_int_eq(pb_release(a, la), 0);
	ASSERT_STATE(ida, "idle");
	ck_assert_msg(pb_acquire(b, 6 * MiB, &plain, &lb) == 0, "B's acquire: %s", pb_last_error());
	ck_assert_uint_ne(pb_lease_id(lb), ida);
	ck_assert_msg(wait_revoked(a, 1), "A's cache did not count the revoke");
	ck_assert_uint_eq(stats_of(a).cached_leases, 0);
	ck_assert_uint_eq(stats_of(a).cached_bytes, 0);
	ASSERT_STATE(ida, NULL);
	ck_assert_int_eq(status_leased(d.socket), (int64_t)(6 * MiB));

	ck_assert_int_eq(pb_release(b, lb), 0);
	pb_disconnect(b);
	end_clean(a);
}
END_TEST

START_TEST(test_oldest_cached_leases_are_evicted_to_stay_under_the_limit)
{
	pb_client *c = cache_client(3 * MiB, 0);
	pb_lease *one, *two, *under, *over, *big;
	uint64_t id_one, id_two, id_under, id_over, id_big;
	struct pb_cache_stats st;

	/* Four size classes (slack 0): none serves another. */
	ck_assert_int_eq(pb_acquire(c, 1 * MiB, &nr_mapped, &one), 0);
	ck_assert_int_eq(pb_acquire(c, 2 * MiB, &nr_mapped, &two), 0);
	ck_assert_int_eq(pb_acquire(c, 1 * MiB - PAGE, &nr_mapped, &under), 0);
	ck_assert_int_eq(pb_acquire(c, 1 * MiB + PAGE, &nr_mapped, &over), 0);
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &nr_mapped, &big), 0);
	id_one = pb_lease_id(one);
	id_two = pb_lease_id(two);
	id_under = pb_lease_id(under);
	id_over = pb_lease_id(over);
	id_big = pb_lease_id(big);

	/* 1 MiB then 2 MiB: the limit, exactly, and nothing evicted. */
	ck_assert_int_eq(pb_release(c, one), 0);
	ck_assert_int_eq(pb_release(c, two), 0);
	st = stats_of(c);
	ck_assert_uint_eq(st.cached_bytes, 3 * MiB);
	ck_assert_uint_eq(st.evicted, 0);

	/* A page under 1 MiB: the oldest (the first 1 MiB, not the larger 2 MiB) goes back to make room. */
	ck_assert_int_eq(pb_release(c, under), 0);
	ASSERT_STATE(id_one, NULL);
	ASSERT_STATE(id_two, "active");
	st = stats_of(c);
	ck_assert_uint_eq(st.evicted, 1);
	ck_assert_uint_eq(st.cached_leases, 2);
	ck_assert_uint_eq(st.cached_bytes, 3 * MiB - PAGE);
	ck_assert_uint_le(st.cached_bytes, st.limit_bytes);

	/* A page over 1 MiB: the 2 MiB one, now the oldest, goes too. */
	ck_assert_int_eq(pb_release(c, over), 0);
	ASSERT_STATE(id_two, NULL);
	st = stats_of(c);
	ck_assert_uint_eq(st.evicted, 2);
	ck_assert_uint_eq(st.cached_leases, 2);
	ck_assert_uint_eq(st.cached_bytes, 2 * MiB);
	ck_assert_uint_le(st.cached_bytes, st.limit_bytes);
	ck_assert(lease_held(id_under));
	ck_assert(lease_held(id_over));

	/* Larger than the whole limit: never cached, released to the daemon, and nothing evicted for it. */
	ck_assert_int_eq(pb_release(c, big), 0);
	ASSERT_STATE(id_big, NULL);
	st = stats_of(c);
	ck_assert_uint_eq(st.evicted, 2);
	ck_assert_uint_eq(st.cached_leases, 2);
	ck_assert_uint_eq(st.kept, 4);

	/* Limit 0: everything cached goes back, and the daemon counts nothing. */
	pb_set_cache_limit(c, 0);
	st = stats_of(c);
	ck_assert_uint_eq(st.cached_leases, 0);
	ck_assert_uint_eq(st.cached_bytes, 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, WAIT_MS), 0);
	ASSERT_STATE(id_under, NULL);
	ASSERT_STATE(id_over, NULL);
	end_clean(c);
}
END_TEST

/*
 * Many cached leases of mixed sizes (the size index and the cache-order list, not a walk of every lease): each
 * request finds its own size, the slack finds the smallest that fits past a missing size, a lease of other flags
 * is no hit, and a lower limit gives the longest-cached back first.
 */
#define MIXED_SIZES 24
START_TEST(test_many_cached_leases_of_mixed_sizes_each_found_by_size_and_the_oldest_evicted_first)
{
	pb_client *c = cache_client(64 * MiB, 0);
	pb_lease *l[MIXED_SIZES + 1], *x, *other;
	void *data[MIXED_SIZES + 1];
	uint64_t id[MIXED_SIZES + 1];
	unsigned order[MIXED_SIZES];
	struct pb_cache_stats st;

	/* k pages for k = 1..MIXED_SIZES, in a scrambled order (7 is prime to 24). */
	for (unsigned i = 0; i < MIXED_SIZES; i++)
		order[i] = i * 7 % MIXED_SIZES + 1;
	for (unsigned i = 0; i < MIXED_SIZES; i++) {
		unsigned k = order[i];

		ck_assert_int_eq(pb_acquire(c, k * PAGE, &nr_mapped, &l[k]), 0);
		data[k] = pb_lease_data(l[k]);
		id[k] = pb_lease_id(l[k]);
	}
	for (unsigned i = 0; i < MIXED_SIZES; i++)
		ck_assert_int_eq(pb_release(c, l[order[i]]), 0);
	st = stats_of(c);
	ck_assert_uint_eq(st.cached_leases, MIXED_SIZES);
	ck_assert_uint_eq(st.cached_bytes, MIXED_SIZES * (MIXED_SIZES + 1) / 2 * PAGE);

	/* Slack 0: a request a little under k pages is served by the k-page lease, whatever the order. */
	for (unsigned k = MIXED_SIZES; k >= 1; k--) {
		ck_assert_int_eq(pb_acquire(c, k * PAGE - 100, &nr_mapped, &l[k]), 0);
		ck_assert_uint_eq(pb_lease_id(l[k]), id[k]);
		ck_assert_ptr_eq(pb_lease_data(l[k]), data[k]);
	}
	st = stats_of(c);
	ck_assert_uint_eq(st.hits, MIXED_SIZES);
	ck_assert_uint_eq(st.cached_leases, 0);
	ck_assert_uint_eq(st.cached_bytes, 0);
	/* Back in ascending size: the 1-page lease is now the longest cached. */
	for (unsigned k = 1; k <= MIXED_SIZES; k++)
		ck_assert_int_eq(pb_release(c, l[k]), 0);
	ck_assert_uint_eq(stats_of(c).cached_leases, MIXED_SIZES);

	/* Other flags, same size: no hit. */
	ck_assert_int_eq(pb_acquire(c, 5 * PAGE, &(struct pb_acquire_opts){ .flags = PB_ACQUIRE_NO_REVOKE }, &other),
			 0);
	ck_assert_uint_ne(pb_lease_id(other), id[5]);
	ck_assert_uint_eq(stats_of(c).hits, MIXED_SIZES);

	/* Slack 100 (half): a byte over 10 pages needs 11, and the 11-page lease is the smallest that fits. */
	pb_set_cache_slack(c, 100);
	ck_assert_int_eq(pb_acquire(c, 10 * PAGE + 1, &nr_mapped, &l[11]), 0);
	ck_assert_uint_eq(pb_lease_id(l[11]), id[11]);
	/* With it taken, the next size up (12 pages, within the slack) serves the same request. */
	ck_assert_int_eq(pb_acquire(c, 10 * PAGE + 1, &nr_mapped, &l[12]), 0);
	ck_assert_uint_eq(pb_lease_id(l[12]), id[12]);
	/* Slack 0 again: 11 pages has no cached lease of its size left, so a new one. */
	pb_set_cache_slack(c, 0);
	ck_assert_int_eq(pb_acquire(c, 11 * PAGE, &nr_mapped, &x), 0);
	for (unsigned k = 1; k <= MIXED_SIZES; k++)
		ck_assert_uint_ne(pb_lease_id(x), id[k]);
	ck_assert_int_eq(pb_release(c, x), 0);
	ck_assert_int_eq(pb_release(c, l[11]), 0);
	ck_assert_int_eq(pb_release(c, l[12]), 0);

	/* A limit a byte under what is cached: only the longest-cached (1 page) goes back. */
	st = stats_of(c);
	pb_set_cache_limit(c, st.cached_bytes - 1);
	ASSERT_STATE(id[1], NULL);
	ck_assert(lease_held(id[2]));
	ck_assert_uint_eq(stats_of(c).evicted, st.evicted + 1);
	ck_assert_uint_eq(stats_of(c).cached_leases, st.cached_leases - 1);
	ck_assert_uint_eq(stats_of(c).cached_bytes, st.cached_bytes - PAGE);
	ck_assert_int_eq(pb_release(c, other), 0);
	pb_set_cache_limit(c, 0);
	end_clean(c);
}
END_TEST

/* Leases of one size: the most recently cached is taken first, and the longest cached is still evicted first. */
START_TEST(test_cached_leases_of_one_size_newest_taken_first_oldest_evicted_first)
{
	pb_client *c = cache_client(64 * MiB, 0);
	pb_lease *p, *q, *r, *x;
	uint64_t idp, idq, idr;

	ck_assert_int_eq(pb_acquire(c, 2 * PAGE, &nr_mapped, &p), 0);
	ck_assert_int_eq(pb_acquire(c, 2 * PAGE, &nr_mapped, &q), 0);
	ck_assert_int_eq(pb_acquire(c, 2 * PAGE, &nr_mapped, &r), 0);
	idp = pb_lease_id(p);
	idq = pb_lease_id(q);
	idr = pb_lease_id(r);
	ck_assert_int_eq(pb_release(c, p), 0);
	ck_assert_int_eq(pb_release(c, q), 0);
	ck_assert_int_eq(pb_release(c, r), 0);
	/* Newest first: r, then q; p stays. */
	ck_assert_int_eq(pb_acquire(c, 2 * PAGE, &nr_mapped, &x), 0);
	ck_assert_uint_eq(pb_lease_id(x), idr);
	r = x;
	ck_assert_int_eq(pb_acquire(c, 2 * PAGE, &nr_mapped, &x), 0);
	ck_assert_uint_eq(pb_lease_id(x), idq);
	q = x;
	/* Cache order now p, r, q. */
	ck_assert_int_eq(pb_release(c, r), 0);
	ck_assert_int_eq(pb_release(c, q), 0);
	ck_assert_uint_eq(stats_of(c).cached_leases, 3);
	/* Room for two: p, the longest cached, goes. Room for one: r. */
	pb_set_cache_limit(c, 4 * PAGE);
	ASSERT_STATE(idp, NULL);
	ck_assert(lease_held(idr));
	pb_set_cache_limit(c, 2 * PAGE);
	ASSERT_STATE(idr, NULL);
	ck_assert_uint_eq(stats_of(c).cached_leases, 1);
	ck_assert_uint_eq(stats_of(c).evicted, 2);
	ck_assert_int_eq(pb_acquire(c, 2 * PAGE, &nr_mapped, &x), 0);
	ck_assert_uint_eq(pb_lease_id(x), idq);
	ck_assert_uint_eq(stats_of(c).cached_leases, 0);
	ck_assert_int_eq(pb_release(c, x), 0);
	pb_set_cache_limit(c, 0);
	end_clean(c);
}
END_TEST

/* A caching client with nothing to tell the daemon (cache empty, or all of it told idle) never wakes its receiver. */
START_TEST(test_receiver_makes_no_periodic_wakeups_while_nothing_waits_to_be_told_idle)
{
	pid_t rx;
	pb_client *c = cache_client_rx(64 * MiB, &rx);
	pb_lease *a;
	uint64_t id;
	long w0;

	/* Caching on, nothing cached: the receiver sleeps through the window (it used to tick every 100 ms). */
	w0 = thread_wakeups(rx);
	usleep(IDLE_WINDOW_TICKS * 100 * 1000);
	ck_assert_int_le(thread_wakeups(rx) - w0, 1);

	/* A lease cached into the empty cache wakes it, and it is told idle a tick or two later. */
	ck_assert_int_eq(pb_acquire(c, 1 * MiB, &nr_mapped, &a), 0);
	id = pb_lease_id(a);
	ck_assert_int_eq(pb_release(c, a), 0);
	ASSERT_STATE(id, "idle");
	ck_assert_uint_eq(stats_of(c).told_idle, 1);

	/* Everything cached is told: no more ticks, though a lease is cached. */
	w0 = thread_wakeups(rx);
	usleep(IDLE_WINDOW_TICKS * 100 * 1000);
	ck_assert_int_le(thread_wakeups(rx) - w0, 1);
	ck_assert_uint_eq(stats_of(c).cached_leases, 1);

	/* Taken and cached again: told idle again, from the untimed wait. */
	ck_assert_int_eq(pb_acquire(c, 1 * MiB, &nr_mapped, &a), 0);
	ck_assert_uint_eq(pb_lease_id(a), id);
	ASSERT_STATE(id, "active");
	ck_assert_int_eq(pb_release(c, a), 0);
	ASSERT_STATE(id, "idle");
	ck_assert_uint_eq(stats_of(c).told_idle, 2);
	pb_set_cache_limit(c, 0);
	end_clean(c);
}
END_TEST

/* The system call thread tid is in now (/proc/self/task/TID/syscall's first field), or -1 when running. */
static long thread_syscall(pid_t tid)
{
	char path[64];
	long nr = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)tid);
	f = fopen(path, "re");
	ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
	if (fscanf(f, "%ld", &nr) != 1)
		nr = -1; /* "running" */
	fclose(f);
	return nr;
}

/* Poll until the receiver sits in recvmsg: true, or false at the bound. */
static bool wait_in_recvmsg(pid_t rx)
{
	for (uint64_t t0 = itest_now_ms(); itest_now_ms() - t0 < WAIT_MS; usleep(1000))
		if (thread_syscall(rx) == SYS_recvmsg)
			return true;
	return false;
}

/*
 * With no cache the receiver waits in its recvmsg alone, no poll beside it (a lease's round trip was 5-10% slower
 * at 4 KiB with one). Caching turned on then, a lease cached before the next message is told idle by pb_release
 * itself, since no wake reaches the recv; the receiver's later ticks do not tell it again.
 */
START_TEST(test_cache_turned_on_while_the_receiver_waits_in_its_recv_tells_idle_from_release)
{
	pid_t rx;
	pb_client *c = cache_client_rx(0, &rx);
	pb_lease *a, *b;
	uint64_t id, idb;

	ck_assert_int_eq(pb_acquire(c, 1 * MiB, &nr_mapped, &a), 0);
	id = pb_lease_id(a);
	ck_assert_msg(wait_in_recvmsg(rx),
		      "the receiver of a client without a cache is in system call %ld, not recvmsg",
		      thread_syscall(rx));
	pb_set_cache_limit(c, 64 * MiB);
	ck_assert_int_eq(pb_release(c, a), 0);
	ASSERT_STATE(id, "idle");
	ck_assert_uint_eq(stats_of(c).told_idle, 1);
	ck_assert_uint_eq(stats_of(c).cached_leases, 1);

	/* A reply wakes the receiver: caching is on now, so it polls and ticks; the told lease is not told again. */
	ck_assert_int_eq(pb_acquire(c, 2 * MiB, &nr_mapped, &b), 0);
	idb = pb_lease_id(b);
	usleep(IDLE_WINDOW_TICKS * 100 * 1000);
	ck_assert_uint_eq(stats_of(c).told_idle, 1);
	ck_assert_int_ne(thread_syscall(rx), SYS_recvmsg);

	/* The next lease cached is told by the receiver's tick, as always. */
	ck_assert_int_eq(pb_release(c, b), 0);
	ASSERT_STATE(idb, "idle");
	ck_assert_uint_eq(stats_of(c).told_idle, 2);
	pb_set_cache_limit(c, 0);
	end_clean(c);
}
END_TEST

/*
 * sendmsg as the library calls it (common/wire.c), this binary's own: the one thread named in slow_send_tid has
 * its sends held back, so that a SET_IDLE it decided first reaches the socket after another thread's.
 */
static pid_t slow_send_tid;

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	if (__atomic_load_n(&slow_send_tid, __ATOMIC_ACQUIRE) == gettid())
		usleep(300 * 1000);
	return syscall(SYS_sendmsg, fd, msg, flags);
}

struct slow_release {
	pb_client *c;
	pb_lease *l;
	int r;
};

static void *release_with_slow_sends(void *arg)
{
	struct slow_release *s = arg;

	__atomic_store_n(&slow_send_tid, gettid(), __ATOMIC_RELEASE);
	s->r = pb_release(s->c, s->l);
	__atomic_store_n(&slow_send_tid, 0, __ATOMIC_RELEASE);
	return NULL;
}

/*
 * pb_release tells the daemon a lease it cached is idle (the receiver waits in its recv), and another thread takes
 * the lease back before that SET_IDLE 1 has left: its SET_IDLE 0 must not overtake it, or the daemon holds a lease
 * in use for idle (reclaimed first; a never-revoked one revoked while busy is counted overdue).
 */
START_TEST(test_lease_taken_back_while_its_release_tells_it_idle_stays_active_at_the_daemon)
{
	pid_t rx;
	pb_client *c = cache_client_rx(0, &rx);
	struct slow_release s = { .c = c };
	pb_lease *a, *b;
	pthread_t t;
	uint64_t id;

	ck_assert_int_eq(pb_acquire(c, 1 * MiB, &nr_mapped, &s.l), 0);
	id = pb_lease_id(s.l);
	ck_assert(wait_in_recvmsg(rx));
	pb_set_cache_limit(c, 64 * MiB);
	ck_assert_int_eq(pthread_create(&t, NULL, release_with_slow_sends, &s), 0);
	/* Cached (and counted told) under the lock, before the SET_IDLE 1 leaves: take it back now. */
	for (uint64_t t0 = itest_now_ms(); stats_of(c).cached_leases == 0; usleep(1000))
		ck_assert_msg(itest_now_ms() - t0 < WAIT_MS, "the lease was never cached");
	ck_assert_int_eq(pb_acquire(c, 1 * MiB, &nr_mapped, &a), 0);
	ck_assert_uint_eq(pb_lease_id(a), id);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert_int_eq(s.r, 0);
	/* Answered on the same connection: the daemon has read both SET_IDLEs before this ACQUIRE. */
	ck_assert_int_eq(pb_acquire(c, 2 * MiB, &nr_mapped, &b), 0);
	assert_state_now(id, "active");
	ck_assert_int_eq(pb_release(c, a), 0);
	ck_assert_int_eq(pb_release(c, b), 0);
	pb_set_cache_limit(c, 0);
	end_clean(c);
}
END_TEST

/*
 * The tick is a setting: $PINBROKER_CACHE_IDLE_MS an hour keeps a cached lease from being shown idle through many
 * default ticks, and pb_set_cache_idle_ms shortens it at once (the schedule starts again).
 */
START_TEST(test_cache_idle_ms_from_the_environment_and_pb_set_cache_idle_ms)
{
	pb_client *c;
	pb_lease *a;
	uint64_t id;

	ck_assert_int_eq(setenv("PINBROKER_CACHE_IDLE_MS", "3600000", 1), 0);
	c = cache_client(64 * MiB, 0);
	ck_assert_int_eq(unsetenv("PINBROKER_CACHE_IDLE_MS"), 0);
	ck_assert_int_eq(pb_acquire(c, 1 * MiB, &nr_mapped, &a), 0);
	id = pb_lease_id(a);
	ck_assert_int_eq(pb_release(c, a), 0);
	/* IDLE_WINDOW_TICKS default ticks: a lease is told after two at most, and this one is not. */
	usleep(IDLE_WINDOW_TICKS * 100 * 1000);
	assert_state_now(id, "active");
	ck_assert_uint_eq(stats_of(c).told_idle, 0);
	/* A 20 ms tick, set now: told within the bound. */
	pb_set_cache_idle_ms(c, 20);
	ASSERT_STATE(id, "idle");
	ck_assert_uint_eq(stats_of(c).told_idle, 1);
	pb_set_cache_limit(c, 0);
	end_clean(c);
}
END_TEST

START_TEST(test_registrations_are_never_cached)
{
	static char buf[16 * 4096] __attribute__((aligned(4096)));
	static char buf2[8 * 4096] __attribute__((aligned(4096)));
	pb_client *c = cache_client(64 * MiB, 100);
	uint64_t reg_bytes = stub_registered_bytes(), id;
	pb_lease *l;

	/* A charge only: released, the daemon no longer counts it. */
	ck_assert_int_eq(pb_register(c, buf, sizeof(buf),
				     &(struct pb_acquire_opts){ .flags = PB_REGISTER_CHARGE_ONLY, .label = "reg" }, &l),
			 0);
	id = pb_lease_id(l);
	ck_assert_int_eq(status_leased(d.socket), (int64_t)sizeof(buf));
	ck_assert_int_eq(pb_release(c, l), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, WAIT_MS), 0);
	ASSERT_STATE(id, NULL);

	/* Registered with the driver (MAPPED, as cudaHostRegister asks): unregistered and uncounted at once. */
	ck_assert_int_eq(
		pb_register(c, buf2, sizeof(buf2), &(struct pb_acquire_opts){ .flags = PB_ACQUIRE_MAPPED }, &l), 0);
	ck_assert_int_eq(pb_lease_cuda_registered(l), 1);
	ck_assert_uint_eq(stub_registered_bytes(), reg_bytes + sizeof(buf2));
	ck_assert_int_eq(pb_release(c, l), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, WAIT_MS), 0);
	ck_assert_uint_eq(stub_registered_bytes(), reg_bytes);

	ck_assert_uint_eq(stats_of(c).kept, 0);
	ck_assert_uint_eq(stats_of(c).cached_leases, 0);
	end_clean(c);
}
END_TEST

/* ------------------------------------------------------------------------------------------------------------ */
/* Raw protocol: the daemon's side of the race, with no library in between. */

/*
 * A connection to the daemon made by a child, then handed to this process (SCM_RIGHTS): the daemon takes the
 * child's pid for the lease's holder, so any signal enforcement sends goes to the child, and the child's death
 * tells which. The child waits to be killed. Returns the connection; *pid is the child.
 */
static int raw_connect_by_child(pid_t *pid)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	int sp[2], fd = -1;
	char byte = 'f';
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	struct pollfd p;
	struct cmsghdr *cm;

	memset(&u, 0, sizeof(u));
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sp), 0);
	*pid = itest_fork();
	ck_assert_int_ge(*pid, 0);
	if (*pid == 0) {
		close(sp[0]);
		fd = raw_connect(d.socket);
		if (fd < 0)
			_exit(1);
		cm = CMSG_FIRSTHDR(&m);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(fd));
		if (sendmsg(sp[1], &m, 0) != 1)
			_exit(2);
		close(fd);
		for (;;)
			pause();
	}
	close(sp[1]);
	p = (struct pollfd){ .fd = sp[0], .events = POLLIN };
	ck_assert_msg(poll(&p, 1, WAIT_MS) == 1, "the child did not hand over its connection");
	ck_assert_int_eq(recvmsg(sp[0], &m, 0), 1);
	cm = CMSG_FIRSTHDR(&m);
	ck_assert_ptr_nonnull(cm);
	ck_assert_int_eq(cm->cmsg_type, SCM_RIGHTS);
	memcpy(&fd, CMSG_DATA(cm), sizeof(fd));
	close(sp[0]);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(raw_hello(fd), 0);
	return fd;
}

/* ACQUIRE size with flags (Acquire.flags); the fds are closed at once. Returns the reply status, or -errno. */
static int raw_acquire_flags(int fd, uint64_t size, uint32_t flags, uint64_t *id)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Acquire a = PINBROKER__V1__ACQUIRE__INIT;
	Pinbroker__V1__Reply *rep;
	size_t got, k, total;
	int fds[64], err, st;

	a.size = size;
	a.has_flags = true;
	a.flags = flags;
	req.has_seq = true;
	req.seq = 7;
	req.body_case = PINBROKER__V1__REQUEST__BODY_ACQUIRE;
	req.acquire = &a;
	if (raw_send(fd, &req, NULL, 0) < 0)
		return -EPIPE;
	rep = raw_recv(fd, fds, 64, &k, WAIT_MS, &err);
	if (!rep)
		return err;
	st = rep->status;
	if (st != 0 || rep->body_case != PINBROKER__V1__REPLY__BODY_LEASE) {
		pinbroker__v1__reply__free_unpacked(rep, NULL);
		return st ? st : -EPROTO;
	}
	*id = rep->lease->lease_id;
	total = rep->lease->n_chunk_bytes;
	pinbroker__v1__reply__free_unpacked(rep, NULL);
	for (got = k; got < total; got += k) {
		for (size_t i = 0; i < k; i++)
			close(fds[i]);
		rep = raw_recv(fd, fds, 64, &k, WAIT_MS, &err);
		if (!rep)
			return err;
		pinbroker__v1__reply__free_unpacked(rep, NULL);
	}
	for (size_t i = 0; i < k; i++)
		close(fds[i]);
	return 0;
}

/* The next message on fd must be a REVOKE for id. */
static void expect_revoke(int fd, uint64_t id)
{
	int fds[4], err = 0;
	size_t n = 0;
	Pinbroker__V1__Reply *rep = raw_recv(fd, fds, 4, &n, WAIT_MS, &err);

	ck_assert_msg(rep, "no REVOKE came (%s)", strerror(-err));
	ck_assert_int_eq(rep->body_case, PINBROKER__V1__REPLY__BODY_REVOKE);
	ck_assert_uint_eq(rep->revoke->lease_id, id);
	pinbroker__v1__reply__free_unpacked(rep, NULL);
}

/* A never-revoked lease acquired over fd (held by the child *pid), told idle: the daemon shows it idle. */
static uint64_t raw_idle_no_revoke_lease(int fd, pid_t holder)
{
	const struct pb_lease_info *row;
	struct pb_status *s;
	uint64_t id = 0;

	ck_assert_int_eq(raw_acquire_flags(fd, 4 * MiB, PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_NO_REVOKE, &id), 0);
	s = itest_status(d.socket);
	row = itest_lease_row(s, id);
	ck_assert_ptr_nonnull(row);
	ck_assert_int_eq(row->no_revoke, 1);
	ck_assert_int_eq(row->pid, holder);
	ck_assert_str_eq(row->state, "active");
	pb_status_free(s);
	/* Before issue 25 the daemon refused this (-EBUSY): a never-revoked lease could not be idle. */
	ck_assert_int_eq(raw_set_idle(fd, id, true), 0);
	assert_state_now(id, "idle");
	return id;
}

/* The holder was never signalled: only our SIGKILL ends it, and the daemon logged no signal for it. */
static void assert_holder_not_signalled(pid_t holder)
{
	char needle[64];
	char *log;

	snprintf(needle, sizeof(needle), " to pid %d for overdue lease", (int)holder);
	log = daemon_log(&d);
	ck_assert_msg(!strstr(log + d.log_from, needle), "the daemon signalled the holder: %s", itest_tail(log));
	free(log);
	ck_assert_int_eq(itest_wait_end(holder, 0), -1);
	ck_assert_int_eq(itest_kill_and_reap(holder), SIGKILL);
}

START_TEST(test_raw_set_idle_0_takes_a_revoked_cached_lease_back_and_it_stays_active)
{
	pid_t holder, sentinel;
	int fd = raw_connect_by_child(&holder);
	uint64_t id = raw_idle_no_revoke_lease(fd, holder), sid = 0, *ids = NULL;
	struct pb_status *s;
	pb_client *admin;
	size_t n = 0;
	bool seen_id = false, seen_sid = false;

	/* A plain lease revoked with it, at the same deadline: its going overdue shows the round ran. */
	sentinel = itest_hold_lease(d.socket, 2 * MiB, "sentinel");
	s = itest_status(d.socket);
	for (size_t i = 0; i < s->n_leases; i++)
		if (strcmp(s->leases[i].label, "sentinel") == 0)
			sid = s->leases[i].id;
	pb_status_free(s);
	ck_assert_uint_ne(sid, 0);
	ck_assert_uint_gt(sid, id); /* revoked after it, so its deadline is no earlier */

	ck_assert_int_eq(pb_connect(d.socket, &admin), 0);
	ck_assert_int_eq(pb_admin_revoke(admin, PB_REVOKE_UID, 0, getuid(), TAKE_BACK_DEADLINE_MS, &ids, &n), 0);
	for (size_t i = 0; i < n; i++) {
		seen_id |= ids[i] == id;
		seen_sid |= ids[i] == sid;
	}
	free(ids);
	ck_assert_msg(n == 2 && seen_id && seen_sid, "revoked %zu leases", n);
	expect_revoke(fd, id);
	assert_state_now(id, "revoking");

	/* The holder's library took it back from its cache before the REVOKE reached it: it is in use again. */
	ck_assert_int_eq(raw_set_idle(fd, id, false), 0);
	assert_state_now(id, "active");
	ck_assert(log_says_of_lease(id, "taken back into use"));

	/* The deadline passes and the round runs (the sentinel is overdue, or gone with its SIGTERM). */
	for (uint64_t t0 = itest_now_ms();; usleep(10000)) {
		char *st = lease_state(sid);
		bool done = !st || strcmp(st, "overdue") == 0;

		free(st);
		if (done)
			break;
		ck_assert_msg(itest_now_ms() - t0 < WAIT_MS, "the sentinel lease never went overdue");
	}
	assert_state_now(id, "active");
	ck_assert(!log_says_of_lease(id, "overdue"));
	ck_assert(!log_says_of_lease(id, "not given back"));

	ck_assert_int_eq(raw_release(fd, id), 0);
	close(fd);
	assert_holder_not_signalled(holder);
	itest_kill_child(&sentinel);
	pb_disconnect(admin);
	end_clean(NULL);
}
END_TEST

START_TEST(test_raw_revoked_cached_lease_left_alone_is_kept_as_in_use_never_overdue)
{
	pid_t holder;
	int fd = raw_connect_by_child(&holder);
	uint64_t id = raw_idle_no_revoke_lease(fd, holder), *ids = NULL;
	char needle[96];
	pb_client *admin;
	size_t n = 0;

	ck_assert_int_eq(pb_connect(d.socket, &admin), 0);
	ck_assert_int_eq(pb_admin_revoke(admin, PB_REVOKE_LEASE, id, 0, 0, &ids, &n), 0);
	ck_assert_uint_eq(n, 1);
	free(ids);
	expect_revoke(fd, id);
	assert_state_now(id, "revoking");

	/* It neither gives it back nor takes it back: past the deadline, the daemon keeps it as in use. */
	snprintf(needle, sizeof(needle), "lease %llu (pid %d): a never-revoked lease revoked while cached",
		 (unsigned long long)id, (int)holder);
	ck_assert_msg(daemon_wait_log(&d, needle, WAIT_MS), "no warning for lease %llu: %s", (unsigned long long)id,
		      daemon_log_excerpt(&d));
	ck_assert(log_says_of_lease(id, "kept as in use"));
	assert_state_now(id, "active");
	ck_assert(!log_says_of_lease(id, "is overdue"));

	/* The holder's again: in use, an admin revoke is refused; told idle again, it is revocable again. */
	ck_assert_int_lt(pb_admin_revoke(admin, PB_REVOKE_LEASE, id, 0, 0, NULL, NULL), 0);
	ck_assert_int_eq(raw_set_idle(fd, id, true), 0);
	assert_state_now(id, "idle");
	ck_assert_int_eq(raw_set_idle(fd, id, false), 0);
	assert_state_now(id, "active");

	ck_assert_int_eq(raw_release(fd, id), 0);
	close(fd);
	assert_holder_not_signalled(holder);
	pb_disconnect(admin);
	end_clean(NULL);
}
END_TEST

START_TEST(test_raw_registration_is_still_refused_set_idle)
{
	int fd = raw_connect(d.socket);
	uint64_t id = 0;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(raw_hello(fd), 0);
	ck_assert_int_eq(raw_acquire_flags(fd, 64 * KiB, PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_REGISTER_ONLY, &id),
			 0);
	ck_assert_int_ne(raw_set_idle(fd, id, true), 0);
	assert_state_now(id, "active");
	ck_assert_int_eq(raw_release(fd, id), 0);
	close(fd);
	end_clean(NULL);
}
END_TEST

/* More than the daemon's LOG_RATELIMIT_BURST (20 lines of one event kind in 5 s). */
#define STORM_LEASES 30

/* A budget and a never-revoked share that fit STORM_LEASES small leases, each one 64 KiB chunk. */
static void start_storm(void)
{
	atexit(kill_daemon_at_exit);
	daemon_start(&d, ITEST_ARGS("--budget", "64M", "--max-no-revoke-per-uid", "100%", "--prewarm", "0",
				    "--chunk-size", "64K", "--pool-shrink-delay-ms", "600000"));
}

/* How many lines of the daemon's log since its start say what. */
static size_t log_count(const char *what)
{
	char *log = daemon_log(&d);
	size_t n = 0;

	for (char *p = log ? log + d.log_from : NULL; p && (p = strstr(p, what)); p += strlen(what))
		n++;
	free(log);
	return n;
}

/*
 * A revoke of many cached never-revoked leases, all taken back into use at once: every one is kept and counted
 * in pinbroker_revokes_cancelled_total, and the log says so at most a burst's worth of times.
 */
START_TEST(test_cancelled_revokes_are_counted_and_their_log_lines_rate_limited)
{
	pid_t holder;
	int fd = raw_connect_by_child(&holder);
	uint64_t ids[STORM_LEASES], *revoked = NULL;
	size_t n = 0, got = 0;
	pb_client *admin;
	char *text = NULL;

	for (size_t i = 0; i < STORM_LEASES; i++) {
		ck_assert_int_eq(
			raw_acquire_flags(fd, 64 * KiB, PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_NO_REVOKE, &ids[i]),
			0);
		ck_assert_int_eq(raw_set_idle(fd, ids[i], true), 0);
	}
	ck_assert_int_eq(pb_connect(d.socket, &admin), 0);
	ck_assert_int_eq(pb_metrics(admin, &text), 0);
	ck_assert(itest_metrics_sample(text, "pinbroker_revokes_cancelled_total{reason=\"reused\"}") == 0);
	ck_assert(itest_metrics_sample(text, "pinbroker_revokes_cancelled_total{reason=\"not_given_back\"}") == 0);
	free(text);
	ck_assert_int_eq(pb_admin_revoke(admin, PB_REVOKE_UID, 0, getuid(), TAKE_BACK_DEADLINE_MS, &revoked, &n), 0);
	free(revoked);
	ck_assert_uint_eq(n, STORM_LEASES);
	/* Every REVOKE, then every lease taken back into use: each kept. */
	while (got < STORM_LEASES) {
		int fds[4], err = 0;
		size_t nfds = 0;
		Pinbroker__V1__Reply *rep = raw_recv(fd, fds, 4, &nfds, WAIT_MS, &err);

		ck_assert_msg(rep, "REVOKE %zu of %d did not come (%s)", got + 1, STORM_LEASES, strerror(-err));
		ck_assert_int_eq(rep->body_case, PINBROKER__V1__REPLY__BODY_REVOKE);
		pinbroker__v1__reply__free_unpacked(rep, NULL);
		got++;
	}
	for (size_t i = 0; i < STORM_LEASES; i++)
		ck_assert_int_eq(raw_set_idle(fd, ids[i], false), 0);
	for (size_t i = 0; i < STORM_LEASES; i++)
		assert_state_now(ids[i], "active");
	ck_assert_int_eq(pb_metrics(admin, &text), 0);
	ck_assert_msg(itest_metrics_sample(text, "pinbroker_revokes_cancelled_total{reason=\"reused\"}") ==
			      STORM_LEASES,
		      "%s", text);
	free(text);
	/* A burst's worth of lines at most (before the limit, one per lease). */
	ck_assert_uint_ge(log_count("taken back into use"), 1);
	ck_assert_uint_le(log_count("taken back into use"), 20);
	for (size_t i = 0; i < STORM_LEASES; i++)
		ck_assert_int_eq(raw_release(fd, ids[i]), 0);
	close(fd);
	assert_holder_not_signalled(holder);
	pb_disconnect(admin);
	end_clean(NULL);
}
END_TEST

/*
 * A cached lease told idle, then the daemon killed and started again from its fd store: it adopts the lease as in
 * use (its saved state keeps no idle marks), and the library, once it has re-declared the lease, tells it idle
 * again; taken back from the cache, it is told busy on the new connection.
 */
START_TEST(test_cached_lease_is_told_idle_again_after_a_restart_adopts_it)
{
	static const char *const args[] = {
		"--budget", "64M", "--prewarm", "0", "--chunk-size", "2M", "--chunk-max", "2M", "--redeclare-grace-ms",
		"5000",     NULL
	};
	struct fdstore *fs;
	pb_client *c;
	pb_lease *a;
	uint64_t id, told;

	atexit(kill_daemon_at_exit);
	load_stub_cuda();
	daemon_prepare(&d);
	fs = fdstore_new(&d);
	fdstore_daemon_start(fs, args);
	c = cache_client(64 * MiB, 0);
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &nr_mapped, &a), 0);
	id = pb_lease_id(a);
	ck_assert_int_eq(pb_release(c, a), 0);
	ASSERT_STATE(id, "idle");
	told = stats_of(c).told_idle;

	fdstore_daemon_crash_restart(fs, args, c);
	ck_assert_int_eq(pb_lease_stale(a), 0);
	ASSERT_STATE(id, "idle");
	ck_assert_uint_gt(stats_of(c).told_idle, told);

	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &nr_mapped, &a), 0);
	ck_assert_uint_eq(pb_lease_id(a), id);
	ASSERT_STATE(id, "active");
	ck_assert_int_eq(pb_release(c, a), 0);
	pb_set_cache_limit(c, 0);
	itest_end_clean(&d, c, WAIT_MS);
	fdstore_free(fs);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-cache");

	CHECK_CASE(s, "library", start, stop, 60,
		   test_cached_never_revoked_lease_comes_back_for_its_flags_and_size_within_the_slack,
		   test_cached_lease_is_shown_idle_after_a_tick_and_active_when_taken_back,
		   test_admin_revokes_a_cached_never_revoked_lease_but_not_an_active_one,
		   test_oldest_cached_leases_are_evicted_to_stay_under_the_limit,
		   test_many_cached_leases_of_mixed_sizes_each_found_by_size_and_the_oldest_evicted_first,
		   test_cached_leases_of_one_size_newest_taken_first_oldest_evicted_first,
		   test_receiver_makes_no_periodic_wakeups_while_nothing_waits_to_be_told_idle,
		   test_cache_turned_on_while_the_receiver_waits_in_its_recv_tells_idle_from_release,
		   test_lease_taken_back_while_its_release_tells_it_idle_stays_active_at_the_daemon,
		   test_cache_idle_ms_from_the_environment_and_pb_set_cache_idle_ms,
		   test_registrations_are_never_cached);
	CHECK_CASE(s, "reclaim", start_tight, stop, 60,
		   test_another_clients_acquire_reclaims_a_cached_never_revoked_lease);
	CHECK_CASE(s, "raw", start, stop, 60, test_raw_set_idle_0_takes_a_revoked_cached_lease_back_and_it_stays_active,
		   test_raw_revoked_cached_lease_left_alone_is_kept_as_in_use_never_overdue,
		   test_raw_registration_is_still_refused_set_idle);
	CHECK_CASE(s, "restart", NULL, NULL, 60, test_cached_lease_is_told_idle_again_after_a_restart_adopts_it);
	CHECK_CASE(s, "storm", start_storm, stop, 60,
		   test_cancelled_revokes_are_counted_and_their_log_lines_rate_limited);
	return s;
}

CHECK_MAIN(suite)

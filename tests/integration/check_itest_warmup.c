/* SPDX-License-Identifier: MIT */
/*
 * Integration: the warm-up at memory speed (issue 27). A start warm-up above prewarm-before-ready (1 GiB by
 * default; one at or below it is done before the daemon answers) runs beside the event loop: the daemon answers
 * at once and lends from a pool that grows (status pool_warming, pool_idle_bytes rising),
 * an acquire that finds no warm chunk makes its own, and the pool still ends at the prewarm with every byte
 * counted once (leased + idle == pool). SIGTERM mid warm-up stops it cleanly. A batch's chunks are filled whole,
 * a chunk a thread, and split into segments only when the batch has fewer chunks than threads. The background cases run in simulation (PB_SIMULATE_ENV) with the test delay
 * (WARMUP_DELAY_ENV), so the warm-up lasts long enough to be seen on any host. A restart mid warm-up (kill -9
 * under the fd store, SIGTERM with the restart state) keeps a lease taken while warming, or counts it as orphaned,
 * and a reload mid warm-up ends the pool at the last prewarm: the books checked against the daemon's memfds.
 * warmup-batch-max bounds what a warm-up holds made and not yet booked, measured against the same memfds.
 */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "fdstore.h"
#include "itest.h"
#include "pinbroker.h"
#include "wire.h"

#define KiB 1024ull
#define MiB (1024ull * KiB)
#define GiB (1024ull * MiB)

/* daemon/warmup.h's test delay: the warm-up thread sleeps this long after each batch (about 1 GiB). */
#define WARMUP_DELAY_ENV "PINBROKER_TEST_WARMUP_DELAY_MS"
/* daemon/warmup.h's test hold: the warm-up thread sleeps this long between making a batch and handing it over. */
#define WARMUP_HOLD_ENV "PINBROKER_TEST_WARMUP_HOLD_MS"

static struct daemon d;
static struct fdstore *fs; /* the fd store stand-in of the restart cases */

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The environment of a simulated daemon whose warm-up waits delay_ms a chunk (itest_env_apply's; free() it). */
static char **simulated_env(const char *delay_ms)
{
	static char sim[64], delay[64];

	snprintf(sim, sizeof(sim), "%s=1", PB_SIMULATE_ENV);
	snprintf(delay, sizeof(delay), "%s=%s", WARMUP_DELAY_ENV, delay_ms);
	return itest_env_make((char *const[]){ sim, delay, NULL });
}

/* daemon_restart_with a simulated pool whose warm-up waits delay_ms a chunk; nothing mallocs in the child. */
static void restart_simulated(const char *const *args, const char *delay_ms)
{
	char **env = simulated_env(delay_ms);

	daemon_restart_with(&d, args, itest_env_apply, env);
	free(env);
}

/* The warming daemons' arguments: an 8 GiB budget all one uid's, prewarm bytes warmed, 256 MiB chunks at most. */
#define WARMING_ARGS(prewarm)                                                                 \
	"--budget", "8G", "--uid-quota", "100%", "--prewarm", prewarm, "--chunk-max", "256M", \
		"--max-no-revoke-per-uid", "100%"

/*
 * Simulated, 256 MiB largest class, prewarm bytes, the warm-up sleeping delay_ms after each batch; before_ready,
 * unless NULL, is prewarm-before-ready (else its default, 1 GiB).
 */
static void start_warming_with(const char *prewarm, const char *delay_ms, const char *before_ready)
{
	const char *const args[] = { WARMING_ARGS(prewarm), before_ready ? "--prewarm-before-ready" : NULL,
				     before_ready, NULL };

	daemon_prepare(&d);
	restart_simulated(args, delay_ms);
	/* The client maps simulated chunks without populating them. */
	setenv(PB_SIMULATE_ENV, "1", 1);
}

static void start_warming(const char *prewarm, const char *delay_ms)
{
	start_warming_with(prewarm, delay_ms, NULL);
}

static void stop_daemon(void)
{
	unsetenv(PB_SIMULATE_ENV);
	unsetenv(WARMUP_DELAY_ENV);
	if (d.pid > 0 && daemon_alive(&d))
		ck_assert_int_eq(daemon_stop(&d), 0);
	fdstore_free(fs);
	fs = NULL;
}

/* Status until the warm-up is over (pool_warming false), or NULL after timeout_ms. */
static struct pb_status *wait_warm(int timeout_ms)
{
	uint64_t end = mono_ms() + (uint64_t)timeout_ms;

	for (;;) {
		struct pb_status *s = itest_status(d.socket);

		if (!s->pool_warming)
			return s;
		pb_status_free(s);
		if (mono_ms() > end)
			return NULL;
		usleep(50 * 1000);
	}
}

static size_t count_dir(const char *path)
{
	struct dirent *e;
	size_t n = 0;
	DIR *dir = opendir(path);

	ck_assert_ptr_nonnull(dir);
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	return n;
}

START_TEST(test_partly_warm_pool_lends_exact_bytes_and_still_reaches_prewarm)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA, .label = "early" };
	/* 256M + 32M + 8M + 4M and a 12 KiB tail: chunks of several classes, some maybe not warm yet. */
	uint64_t want = 300 * MiB + 12 * KiB, idle_first;
	struct pb_status *s;
	pb_client *c = NULL;
	pb_lease *l = NULL;
	char *log;

	start_warming("3G", "700");
	/* It answers while the pool still grows: serving is not held back until the pool is warm. */
	s = itest_status(d.socket);
	ck_assert_msg(s->pool_warming, "the daemon served only once warm (pool %llu of 3 GiB idle)",
		      (unsigned long long)s->pool_idle_bytes);
	ck_assert_uint_lt(s->pool_idle_bytes, 3 * GiB);
	ck_assert_uint_eq(s->prewarm_bytes, 3 * GiB);
	idle_first = s->pool_idle_bytes;
	pb_status_free(s);

	/* A lease right away: granted, exact, whatever is warm yet. */
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_acquire(c, want, &o, &l), 0);
	ck_assert_uint_eq(pb_lease_size(l), want);
	s = itest_status(d.socket);
	ck_assert_uint_eq(s->leased_bytes, want);
	ck_assert_uint_eq(s->pool_bytes, s->leased_bytes + s->pool_idle_bytes);
	pb_status_free(s);

	/* The pool grows on to the prewarm, and every byte is counted once. */
	s = wait_warm(60000);
	ck_assert_msg(s != NULL, "the warm-up did not end:\n%s", itest_tail(daemon_log(&d)));
	ck_assert(!s->pool_warming);
	ck_assert_uint_gt(s->pool_idle_bytes, idle_first);
	ck_assert_uint_eq(s->leased_bytes, want);
	ck_assert_uint_eq(s->pool_bytes, s->leased_bytes + s->pool_idle_bytes);
	ck_assert_uint_ge(s->pool_bytes, 3 * GiB);
	/* Never past the prewarm plus the lease: a chunk the lease made is not warmed again on top. */
	ck_assert_uint_le(s->pool_idle_bytes, 3 * GiB);
	pb_status_free(s);
	ck_assert(daemon_wait_log(&d, "pool warmed: ", 5000));
	log = daemon_log_excerpt(&d);
	ck_assert_msg(strstr(log, "GiB/s, "), "no rate in the warm-up's line:\n%s", log);
	ck_assert_msg(strstr(log, "serving meanwhile"), "the warm-up did not run beside the loop:\n%s", log);
	free(log);

	ck_assert_int_eq(pb_release(c, l), 0);
	itest_end_clean(&d, c, 5000);
}
END_TEST

START_TEST(test_sigterm_mid_warmup_stops_cleanly)
{
	char task[64];
	struct pb_status *s;
	uint64_t t0;

	/* A batch, then a 20 s pause: the daemon is mid warm-up whenever it is stopped. */
	start_warming("4G", "20000");
	s = itest_status(d.socket);
	ck_assert(s->pool_warming);
	pb_status_free(s);
	/* The warm-up thread is there beside the loop. */
	snprintf(task, sizeof(task), "/proc/%d/task", (int)d.pid);
	ck_assert_uint_ge(count_dir(task), 2);

	ck_assert(!daemon_wait_log(&d, "pool warmed", 0));

	/*
	 * Exit status 0 (daemon_stop's SIGTERM): the loop ended, the warm-up thread was joined and the chunks it
	 * had made but not handed over were destroyed (warmup_free), within the time a stop takes, not the pause.
	 */
	t0 = mono_ms();
	ck_assert_int_eq(daemon_stop(&d), 0);
	ck_assert_uint_lt(mono_ms() - t0, 10000);
}
END_TEST

/*
 * prewarm-before-ready (was a constant, 1 GiB): a start warm-up at the setting is done before the daemon
 * answers, even where a warm-up beside the loop would still be sleeping (the test delay applies only there).
 */
START_TEST(test_prewarm_at_the_setting_is_warm_before_ready)
{
	struct pb_status *s;
	char *log;

	start_warming_with("512M", "20000", "512M");
	s = itest_status(d.socket);
	ck_assert_msg(!s->pool_warming, "a 512 MiB prewarm at prewarm-before-ready 512M warmed beside the loop:\n%s",
		      itest_tail(daemon_log(&d)));
	ck_assert_uint_eq(s->prewarm_bytes, 512 * MiB);
	ck_assert_uint_eq(s->pool_idle_bytes, 512 * MiB);
	pb_status_free(s);
	log = daemon_log_excerpt(&d);
	ck_assert_msg(strstr(log, "pool warmed: 512 MiB in "), "no warm-up line:\n%s", log);
	ck_assert_msg(!strstr(log, "beside the loop") && !strstr(log, "serving meanwhile"),
		      "the warm-up ran beside the loop:\n%s", log);
	free(log);
}
END_TEST

/* One page above the setting, and 0 (always beside the loop): the daemon answers while the pool still warms. */
static void check_warms_in_background(const char *prewarm, const char *before_ready, uint64_t prewarm_bytes)
{
	struct pb_status *s;
	char *log;

	start_warming_with(prewarm, "3000", before_ready);
	s = itest_status(d.socket);
	ck_assert_msg(s->pool_warming, "a %s prewarm at prewarm-before-ready %s was warm before ready:\n%s", prewarm,
		      before_ready, itest_tail(daemon_log(&d)));
	ck_assert_uint_eq(s->prewarm_bytes, prewarm_bytes);
	pb_status_free(s);
	ck_assert(daemon_wait_log(&d, "beside the loop", 5000));
	s = wait_warm(60000);
	ck_assert_msg(s != NULL, "the warm-up did not end:\n%s", itest_tail(daemon_log(&d)));
	ck_assert_uint_eq(s->pool_idle_bytes, prewarm_bytes);
	pb_status_free(s);
	ck_assert(daemon_wait_log(&d, "serving meanwhile", 5000));
	log = daemon_log_excerpt(&d);
	ck_assert_msg(strstr(log, "pool warmed: "), "no warm-up line:\n%s", log);
	free(log);
	ck_assert_int_eq(daemon_stop(&d), 0);
}

START_TEST(test_prewarm_above_the_setting_warms_in_the_background)
{
	check_warms_in_background("512M", "511M", 512 * MiB);
	/* 0: even the embedded default prewarm (256 MiB) warms beside the loop. */
	check_warms_in_background("256M", "0", 256 * MiB);
}
END_TEST

/* ------------------------------------------------------------------ restarts and reloads mid warm-up */

/* A held lease's size: 256M + 32M + 8M + 4M and a 12 KiB tail, chunks of several classes. */
#define HELD_BYTES (300 * MiB + 12 * KiB)

/* The daemon's pool chunks as the kernel sees them: distinct memfds it holds, and their sizes. */
struct memfd_books {
	size_t chunks;
	uint64_t bytes;
};

/*
 * Every distinct "pinbroker-chunk" memfd pid holds (by inode: a chunk can be open twice), with its size
 * from fstat through /proc, not from the daemon's own books: what a leaked or double-counted chunk changes.
 */
static struct memfd_books memfd_books_of(pid_t pid)
{
	struct memfd_books mb = { 0, 0 };
	static ino_t seen[8192];
	size_t nseen = 0;
	char dir[64], path[320], link[256];
	struct dirent *e;
	DIR *dp;

	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	dp = opendir(dir);
	ck_assert_ptr_nonnull(dp);
	while ((e = readdir(dp))) {
		struct stat st;
		bool dup = false;
		ssize_t n;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		if (n < 0)
			continue;
		link[n] = '\0';
		if (strncmp(link, "/memfd:pinbroker-chunk", strlen("/memfd:pinbroker-chunk")) != 0 ||
		    stat(path, &st) < 0)
			continue;
		for (size_t i = 0; i < nseen && !dup; i++)
			dup = seen[i] == st.st_ino;
		if (dup)
			continue;
		ck_assert_uint_lt(nseen, sizeof(seen) / sizeof(seen[0]));
		seen[nseen++] = st.st_ino;
		mb.chunks++;
		mb.bytes += (uint64_t)st.st_size;
	}
	closedir(dp);
	return mb;
}

/*
 * The books after a restart or reload, once the pool is warm again: every byte counted once (leased, less
 * what is orphaned, + idle == pool), the daemon's chunk memfds are exactly its pool (no chunk of the earlier daemon, or of a warm-up cut
 * short, kept beside it), and the idle pool is at prewarm.
 */
static void check_books(uint64_t leased, uint64_t prewarm)
{
	struct pb_status *s = wait_warm(30000);
	struct memfd_books mb;

	ck_assert_msg(s != NULL, "the warm-up did not end:\n%s", itest_tail(daemon_log(&d)));
	ck_assert_uint_eq(s->leased_bytes, leased);
	/* Orphaned bytes are leased (of leased_bytes) but mapped from the earlier daemon's memfds, not the pool's. */
	ck_assert_uint_le(s->orphaned_bytes, s->leased_bytes);
	ck_assert_uint_eq(s->pool_bytes, s->leased_bytes - s->orphaned_bytes + s->pool_idle_bytes);
	ck_assert_msg(s->pool_idle_bytes == prewarm, "idle pool %llu bytes, prewarm %llu:\n%s",
		      (unsigned long long)s->pool_idle_bytes, (unsigned long long)prewarm, itest_tail(daemon_log(&d)));
	mb = memfd_books_of(d.pid);
	ck_assert_msg(mb.bytes == s->pool_bytes, "the daemon holds %zu chunk memfds of %llu bytes; its pool is %llu",
		      mb.chunks, (unsigned long long)mb.bytes, (unsigned long long)s->pool_bytes);
	pb_status_free(s);
}

/* The store holds the daemon's chunks and nothing else of the pool: none of the killed daemon's left parked. */
static void check_store_matches_daemon(void)
{
	uint64_t end = mono_ms() + 5000;
	struct memfd_books mb;
	size_t stored;

	/* The store's thread applies the daemon's FDSTORE=1 / FDSTOREREMOVE=1 as they come: poll, with a bound. */
	for (;;) {
		mb = memfd_books_of(d.pid);
		stored = fdstore_count(fs, "c");
		if (stored == mb.chunks || mono_ms() > end)
			break;
		usleep(20 * 1000);
	}
	ck_assert_msg(stored == mb.chunks, "the fd store holds %zu chunks, the daemon %zu:\n%s", stored, mb.chunks,
		      itest_tail(daemon_log(&d)));
}

/* Simulated, as start_warming_with, under the fd store stand-in (the environment reaches the daemon). */
static void fdstore_start_warming(const char *delay_ms)
{
	static const char *const args[] = {
		WARMING_ARGS("2G"), "--prewarm-before-ready", "256M", "--redeclare-grace-ms", "2000", NULL
	};

	setenv(PB_SIMULATE_ENV, "1", 1);
	setenv(WARMUP_DELAY_ENV, delay_ms, 1);
	fdstore_daemon_start(fs, args);
	unsetenv(WARMUP_DELAY_ENV);
}

/* A lease taken from a pool still warming (HELD_BYTES, no CUDA), on a connection of its own. */
static pb_lease *acquire_while_warming(pb_client **c)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE, .label = "held" };
	struct pb_status *s = itest_status(d.socket);
	pb_lease *l = NULL;

	ck_assert_msg(s->pool_warming, "warm before the test could act:\n%s", itest_tail(daemon_log(&d)));
	pb_status_free(s);
	ck_assert_int_eq(pb_connect(d.socket, c), 0);
	ck_assert_int_eq(pb_acquire(*c, HELD_BYTES, &o, &l), 0);
	memset(pb_lease_data(l), 'w', 4096);
	s = itest_status(d.socket);
	ck_assert(s->pool_warming);
	ck_assert_uint_eq(s->leased_bytes, HELD_BYTES);
	ck_assert_uint_eq(s->pool_bytes, s->leased_bytes + s->pool_idle_bytes);
	pb_status_free(s);
	return l;
}

/*
 * kill -9 mid warm-up under the fd store (a crash under systemd): the same instance comes back with the lease
 * a client took while the pool warmed (docs/security.md, what a restart guarantees), the chunks the warm-up
 * had handed over come back from the store, the ones it was still making die with the process, and the new
 * daemon warms its idle pool to the prewarm again, every byte counted once.
 */
START_TEST(test_kill_mid_warmup_keeps_the_lease_and_the_books)
{
	struct pb_status *s = NULL;
	pb_client *c = NULL;
	pb_lease *l;

	daemon_prepare(&d);
	fs = fdstore_new(&d);
	/* A 1 GiB batch, then a 20 s pause: mid warm-up whenever it is killed. */
	fdstore_start_warming("20000");
	l = acquire_while_warming(&c);
	ck_assert(!daemon_wait_log(&d, "pool warmed", 0));
	ck_assert_uint_gt(fdstore_count(fs, "c"), 0);

	fdstore_daemon_kill(fs);
	fdstore_start_warming("200");
	/* The library reconnects and re-declares the lease it still maps. */
	ck_assert(itest_wait_answered(c, 5000));
	ck_assert_int_eq(pb_lease_stale(l), 0);
	ck_assert_uint_eq(((const unsigned char *)pb_lease_data(l))[0], 'w');
	s = itest_status(d.socket);
	ck_assert_ptr_nonnull(itest_lease_row(s, pb_lease_id(l)));
	ck_assert_uint_eq(s->orphaned_bytes, 0);
	pb_status_free(s);
	check_books(HELD_BYTES, 2 * GiB);
	check_store_matches_daemon();

	ck_assert_int_eq(pb_release(c, l), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
	check_store_matches_daemon();
	itest_end_clean(&d, c, 5000);
}
END_TEST

/*
 * SIGTERM mid warm-up (systemctl restart, which empties the fd store): the stop writes the restart state, the
 * next daemon, a new instance, counts the lease this process still maps as orphaned (leased, never lent again)
 * until it is let go, and warms its own pool to the prewarm beside it (docs/operations.md, restarts).
 */
START_TEST(test_sigterm_mid_warmup_restart_counts_the_held_lease_once)
{
	static const char *const args[] = {
		WARMING_ARGS("2G"), "--prewarm-before-ready", "256M", "--orphan-rescan-ms", "200", NULL
	};
	char state[400];
	pb_client *c = NULL;
	pb_lease *l;
	uint64_t t0;
	int st;

	daemon_prepare(&d);
	restart_simulated(args, "20000");
	setenv(PB_SIMULATE_ENV, "1", 1);
	l = acquire_while_warming(&c);

	/* As daemon_stop, but the folder (socket, log, restart state) stays for the next daemon. */
	t0 = mono_ms();
	ck_assert_int_eq(kill(d.pid, SIGTERM), 0);
	st = itest_wait_end(d.pid, 10000);
	ck_assert_msg(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "no clean stop within 10 s (status %d):\n%s",
		      st, itest_tail(daemon_log(&d)));
	ck_assert_uint_lt(mono_ms() - t0, 10000);
	d.pid = 0;
	snprintf(state, sizeof(state), "%s.state", d.socket);
	ck_assert_msg(access(state, F_OK) == 0, "no restart state at %s:\n%s", state, itest_tail(daemon_log(&d)));

	restart_simulated(args, "200");
	/* The old instance's lease: still this process's to use, counted as orphaned, never lent again. */
	check_books(HELD_BYTES, 2 * GiB);
	{
		struct pb_status *s = itest_status(d.socket);

		ck_assert_uint_eq(s->orphaned_bytes, HELD_BYTES);
		pb_status_free(s);
	}
	ck_assert_uint_eq(((const unsigned char *)pb_lease_data(l))[0], 'w');
	ck_assert(daemon_wait_log(&d, "counted as orphaned", 5000));

	/* Let go: the orphan goes at the next rescan, and the books are the new pool's alone. */
	pb_release(c, l);
	ck_assert_int_eq(wait_leased(d.socket, 0, 10000), 0);
	check_books(0, 2 * GiB);
	pb_disconnect(c);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* The reload tests' config file: prewarm comes from it (a command-line value would win over a reload). */
static char conf_path[400];

static void write_prewarm(const char *prewarm)
{
	char tmp[420];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.new", conf_path);
	f = fopen(tmp, "we");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "prewarm = %s\n", prewarm);
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_int_eq(rename(tmp, conf_path), 0);
}

static size_t log_count(const char *needle)
{
	char *log = daemon_log(&d), *p = log;
	size_t n = 0;

	while (p && (p = strstr(p, needle))) {
		n++;
		p += strlen(needle);
	}
	free(log);
	return n;
}

/* SIGHUP, and wait for this reload's "config reloaded" line. */
static void reload_prewarm(const char *prewarm)
{
	size_t ok0 = log_count("config reloaded");
	uint64_t t0 = mono_ms();

	write_prewarm(prewarm);
	ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
	while (log_count("config reloaded") == ok0) {
		ck_assert_msg(mono_ms() - t0 < 5000, "no reload within 5 s:\n%s", itest_tail(daemon_log(&d)));
		usleep(20000);
	}
}

/*
 * Simulated, prewarm from the config file, batches of 1 GiB each followed by delay_ms; returns once warming.
 * Spawned here, not by daemon_restart_with: its "--prewarm 16M" on the command line would win over every
 * reload of the file. numa stays auto: a simulated chunk is never faulted, so no node counts it as its own,
 * which the stepped growth of a raised prewarm (grow_prewarm, per node) once took for a node still empty.
 */
static void start_warming_from_file(const char *prewarm, const char *delay_ms)
{
	const char *const argv[] = {
		PINBROKERD_PATH, "--socket",    d.socket, "--config",
		conf_path,       "--budget",    "8G",     "--uid-quota",
		"100%",          "--chunk-max", "256M",   "--prewarm-before-ready",
		"256M",          "--hugetlb",   "no",     "--log-level",
		"debug",         NULL,
	};
	struct pb_status *s;
	uint64_t end;
	char **env;

	daemon_prepare(&d);
	snprintf(conf_path, sizeof(conf_path), "%s/pinbrokerd.conf", d.dir);
	write_prewarm(prewarm);
	d.log_from = 0;
	env = simulated_env(delay_ms);
	d.pid = itest_spawn_logged(d.log, argv, false, itest_env_apply, env);
	free(env);
	end = mono_ms() + itest_start_timeout_ms();
	while (!itest_answers(d.socket)) {
		ck_assert_msg(daemon_alive(&d) && mono_ms() < end, "the daemon did not answer:\n%s",
			      itest_tail(daemon_log(&d)));
		usleep(20000);
	}
	setenv(PB_SIMULATE_ENV, "1", 1);
	/* Act once the first batch is in and the warm-up sleeps before the next. */
	end = mono_ms() + 5000;
	for (;;) {
		s = itest_status(d.socket);
		if (s->pool_idle_bytes > 0 || mono_ms() > end)
			break;
		pb_status_free(s);
		usleep(20000);
	}
	ck_assert_msg(s->pool_warming && s->pool_idle_bytes > 0, "not mid warm-up (warming %d, %llu idle):\n%s",
		      (int)s->pool_warming, (unsigned long long)s->pool_idle_bytes, itest_tail(daemon_log(&d)));
	ck_assert_uint_eq(s->prewarm_bytes, strcmp(prewarm, "3G") == 0 ? 3 * GiB : 2 * GiB);
	pb_status_free(s);
}

/* Poll until the warm-up is over and the idle pool is want (a raised prewarm grows on after it): true, or false. */
static bool wait_idle(uint64_t want, int timeout_ms)
{
	uint64_t end = mono_ms() + (uint64_t)timeout_ms;

	for (;;) {
		struct pb_status *s = itest_status(d.socket);
		bool ok = !s->pool_warming && s->pool_idle_bytes == want;

		pb_status_free(s);
		if (ok || mono_ms() > end)
			return ok;
		usleep(50 * 1000);
	}
}

/* The warm-up over, the idle pool is exactly want and the books hold it alone (no lease). */
static void check_ends_at(uint64_t want)
{
	ck_assert_msg(wait_idle(want, 10000), "the pool did not end at %llu bytes:\n%s", (unsigned long long)want,
		      itest_tail(daemon_log(&d)));
	check_books(0, want);
}

/*
 * Reloads of prewarm mid warm-up (a warm-up from prewarm start, then each of reloads) and where the pool must end:
 * exactly at the last prewarm, warmed once (warmed_log: the line that says so, and how many lines hold count_of).
 */
static const struct reload_case {
	const char *start, *reloads[2];
	uint64_t end;
	const char *not_yet;    /* a log line that must not be there right after the reloads, or NULL */
	const char *warmed_log; /* a log line to wait for once the pool ended, or NULL */
	const char *count_of;   /* ... and the lines holding this must be one, or NULL */
} reload_cases[] = {
	/*
	 * Lowered (reload.c trims the idle pool to it; bg_admit in main.c refuses the batches past it and so stops the
	 * warm-up): the pool ends at the new prewarm, not the old, and not both.
	 */
	{ "3G", { "512M" }, 512 * MiB, NULL, "pool warmed: ", "pool warmed" },
	/*
	 * Raised: the warm-up finishes its own plan, then the pool grows on to the new prewarm in steps (bg_done,
	 * prewarm_cb); it is not warmed twice (no second warm-up beside the first: the start warm-up is still the only
	 * one running when the reload comes, the stepped growth waits for it).
	 */
	{ "2G", { "3G" }, 3 * GiB, "for the new prewarm", "pool warmed to 3 GiB for the new prewarm", "pool warmed: " },
	/* Lowered, then raised back before the warm-up ends: the pool ends at the prewarm it was raised back to. */
	{ "3G", { "256M", "2G" }, 2 * GiB, NULL, NULL, NULL },
};

START_TEST(test_a_reload_mid_warmup_ends_at_the_last_prewarm)
{
	const struct reload_case *rc = &reload_cases[_i];

	start_warming_from_file(rc->start, "1500");
	for (int k = 0; k < 2 && rc->reloads[k]; k++)
		reload_prewarm(rc->reloads[k]);
	if (rc->not_yet)
		ck_assert(!daemon_wait_log(&d, rc->not_yet, 0));
	check_ends_at(rc->end);
	if (rc->warmed_log)
		ck_assert(daemon_wait_log(&d, rc->warmed_log, 5000));
	if (rc->count_of)
		ck_assert_uint_eq(log_count(rc->count_of), 1);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* ------------------------------------------------------------------ warmup-batch-max */

static void child_hold(void *ud)
{
	setenv(WARMUP_HOLD_ENV, (const char *)ud, 1);
}

/*
 * warmup-batch-max (was a constant, 16 GiB) bounds what a warm-up beside the loop holds that no book counts: a
 * batch is made whole, pinned, and only then taken into the pool. Real memory, locked; chunks of one class, chunk
 * (chunk-size and chunk-max, so the plan holds no smaller chunk); prewarm-before-ready 0 so all 64 MiB warm beside the loop, and the test hold (WARMUP_HOLD_ENV)
 * keeps each batch made-but-unbooked for 100 ms, long enough to be sampled on a loaded host.
 * The observable is the kernel's, not the daemon's word: the bytes of the chunk memfds in /proc/PID/fd less the
 * pool's booked bytes (pool_bytes, no lease here), the memfds read first so a batch booked between the two reads
 * can only make the difference smaller. It must never exceed batch_bytes, and the pool must grow in steps of it:
 * a cap ignored would make the whole 64 MiB one batch (a batch is at least 1 GiB otherwise) and fail both.
 */
static void check_batches_bounded(const char *cap, const char *chunk, uint64_t batch_bytes)
{
	const char *const args[] = { "--budget",
				     "1G",
				     "--prewarm",
				     "64M",
				     "--chunk-size",
				     chunk,
				     "--chunk-max",
				     chunk,
				     "--thp",
				     "no",
				     "--prewarm-threads",
				     "2",
				     "--prewarm-before-ready",
				     "0",
				     "--warmup-batch-max",
				     cap,
				     NULL };
	uint64_t end, idle_seen[64], max_unbooked = 0;
	size_t nidle = 0, samples = 0;
	struct pb_status *s;

	daemon_prepare(&d);
	daemon_restart_with(&d, args, child_hold, (void *)"100");
	end = mono_ms() + 30000;
	for (;;) {
		struct memfd_books mb = memfd_books_of(d.pid);
		bool warming, seen = false;
		uint64_t unbooked;

		s = itest_status(d.socket);
		warming = s->pool_warming;
		unbooked = mb.bytes > s->pool_bytes ? mb.bytes - s->pool_bytes : 0;
		ck_assert_uint_eq(s->leased_bytes, 0);
		ck_assert_msg(
			unbooked <= batch_bytes,
			"warmup-batch-max %s: the daemon held %llu bytes of chunk memfds (%zu chunks) against a pool "
			"of %llu: %llu bytes made and not booked, more than a batch of %llu:\n%s",
			cap, (unsigned long long)mb.bytes, mb.chunks, (unsigned long long)s->pool_bytes,
			(unsigned long long)unbooked, (unsigned long long)batch_bytes, itest_tail(daemon_log(&d)));
		if (unbooked > max_unbooked)
			max_unbooked = unbooked;
		for (size_t i = 0; i < nidle && !seen; i++)
			seen = idle_seen[i] == s->pool_idle_bytes;
		if (!seen) {
			ck_assert_uint_lt(nidle, sizeof(idle_seen) / sizeof(idle_seen[0]));
			/* Whole batches join the pool: the idle pool moves in steps of a batch. */
			ck_assert_msg(s->pool_idle_bytes % batch_bytes == 0,
				      "idle pool %llu bytes: not whole batches of %llu",
				      (unsigned long long)s->pool_idle_bytes, (unsigned long long)batch_bytes);
			idle_seen[nidle++] = s->pool_idle_bytes;
		}
		pb_status_free(s);
		samples++;
		if (!warming)
			break;
		ck_assert_msg(mono_ms() < end, "the warm-up did not end in 30 s:\n%s", itest_tail(daemon_log(&d)));
		usleep(10 * 1000);
	}
	/* The sampling saw batches in the making (else the bound above was never put to the test) ... */
	ck_assert_msg(max_unbooked > 0, "no batch seen made and not yet booked in %zu samples:\n%s", samples,
		      itest_tail(daemon_log(&d)));
	/*
	 * ... and the pool growing in whole batches, seen between empty and warm (a sample can miss a step on a
	 * loaded host, so not every one is required): one batch of all 64 MiB would show only the two ends.
	 */
	ck_assert_msg(nidle >= 3, "the idle pool took only %zu values in %zu samples (batches of %llu)", nidle, samples,
		      (unsigned long long)batch_bytes);
	check_books(0, 64 * MiB);
	ck_assert(daemon_wait_log(&d, "serving meanwhile", 5000));
	ck_assert_int_eq(daemon_stop(&d), 0);
}

START_TEST(test_warmup_batch_max_bounds_what_is_pinned_outside_the_books)
{
	/* 8 MiB: four 2 MiB chunks a batch (two threads, so the cap, not the threads, ends each batch). */
	check_batches_bounded("8M", "2M", 8 * MiB);
}
END_TEST

START_TEST(test_warmup_batch_max_below_a_chunk_makes_a_chunk_at_a_time)
{
	/* 2 MiB against 4 MiB chunks (64 MiB is 16 of them): a batch always holds one chunk, never none. */
	check_batches_bounded("2M", "4M", 4 * MiB);
}
END_TEST

static void start_real(void)
{
	/* 512 MiB of 256 MiB chunks on 4 threads: each chunk filled in two 128 MiB segments, before serving. */
	daemon_start(&d, ITEST_ARGS("--budget", "1G", "--prewarm", "512M", "--chunk-max", "256M", "--thp", "no",
				    "--prewarm-threads", "4"));
}

START_TEST(test_big_chunks_filled_in_segments_are_whole_and_locked)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA, .label = "segments" };
	struct pb_status *s;
	pb_client *c = NULL;
	pb_lease *l = NULL;
	unsigned char *p;
	char *log;

	log = daemon_log_excerpt(&d);
	ck_assert_msg(strstr(log, "pool warmed: 512 MiB") && strstr(log, "4 threads"), "no warm-up line:\n%s", log);
	free(log);
	s = itest_status(d.socket);
	ck_assert(!s->pool_warming);
	ck_assert_uint_eq(s->pool_idle_bytes, 512 * MiB);
	ck_assert_uint_eq(s->pool_bytes, 512 * MiB);
	pb_status_free(s);
	/* A whole 256 MiB chunk: every page was there (faulted segment by segment); writes read back. */
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_acquire(c, 256 * MiB, &o, &l), 0);
	p = pb_lease_data(l);
	for (uint64_t i = 0; i < 256 * MiB; i += 4 * KiB)
		p[i] = (unsigned char)(i >> 12);
	for (uint64_t i = 0; i < 256 * MiB; i += 4 * KiB)
		ck_assert_uint_eq(p[i], (unsigned char)(i >> 12));
	s = itest_status(d.socket);
	ck_assert_uint_eq(s->pool_bytes, 512 * MiB);
	ck_assert_uint_eq(s->leased_bytes, 256 * MiB);
	pb_status_free(s);
	ck_assert_int_eq(pb_release(c, l), 0);
	itest_end_clean(&d, c, 5000);
}
END_TEST

static void noop(void)
{
}

static Suite *suite(void)
{
	Suite *s = suite_create("itest_warmup");

	CHECK_CASE(s, "background", noop, stop_daemon, 120,
		   test_partly_warm_pool_lends_exact_bytes_and_still_reaches_prewarm,
		   test_sigterm_mid_warmup_stops_cleanly, test_prewarm_at_the_setting_is_warm_before_ready,
		   test_prewarm_above_the_setting_warms_in_the_background);
	CHECK_CASE(s, "restart", noop, stop_daemon, 60, test_kill_mid_warmup_keeps_the_lease_and_the_books,
		   test_sigterm_mid_warmup_restart_counts_the_held_lease_once);
	CHECK_LOOP_CASE(s, "reload", noop, stop_daemon, 60, (int)(sizeof(reload_cases) / sizeof(reload_cases[0])),
			test_a_reload_mid_warmup_ends_at_the_last_prewarm);
	CHECK_CASE(s, "batch", noop, stop_daemon, 60, test_warmup_batch_max_bounds_what_is_pinned_outside_the_books,
		   test_warmup_batch_max_below_a_chunk_makes_a_chunk_at_a_time);
	CHECK_CASE(s, "real", start_real, stop_daemon, 60, test_big_chunks_filled_in_segments_are_whole_and_locked);
	return s;
}

CHECK_MAIN(suite)

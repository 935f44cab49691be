/* SPDX-License-Identifier: MIT */
/*
 * Integration: the warm-up at memory speed (issue 27). A start warm-up above prewarm-before-ready (1 GiB by
 * default; one at or below it is done before the daemon answers) runs beside the event loop: the daemon answers
 * at once and lends from a pool that grows (status pool_warming, pool_idle_bytes rising),
 * an acquire that finds no warm chunk makes its own, and the pool still ends at the prewarm with every byte
 * counted once (leased + idle == pool). SIGTERM mid warm-up stops it cleanly. A batch's chunks are filled whole,
 * a chunk a thread, and split into segments only when the batch has fewer chunks than threads. The background cases run in simulation (PB_SIMULATE_ENV) with the test delay
 * (WARMUP_DELAY_ENV), so the warm-up lasts long enough to be seen on any host.
 */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "itest.h"
#include "pinbroker.h"
#include "wire.h"

#define KiB 1024ull
#define MiB (1024ull * KiB)
#define GiB (1024ull * MiB)

/* daemon/warmup.h's test delay: the warm-up thread sleeps this long after each batch (about 1 GiB). */
#define WARMUP_DELAY_ENV "PINBROKER_TEST_WARMUP_DELAY_MS"

static struct daemon d;

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void child_simulated(void *ud)
{
	setenv(PB_SIMULATE_ENV, "1", 1);
	setenv(WARMUP_DELAY_ENV, (const char *)ud, 1);
}

/*
 * Simulated, 256 MiB largest class, prewarm bytes, the warm-up sleeping delay_ms after each batch; before_ready,
 * unless NULL, is prewarm-before-ready (else its default, 1 GiB).
 */
static void start_warming_with(const char *prewarm, const char *delay_ms, const char *before_ready)
{
	const char *const args[] = { "--budget",
				     "8G",
				     "--uid-quota",
				     "100%",
				     "--prewarm",
				     prewarm,
				     "--chunk-max",
				     "256M",
				     "--max-no-revoke-per-uid",
				     "100%",
				     before_ready ? "--prewarm-before-ready" : NULL,
				     before_ready,
				     NULL };

	daemon_prepare(&d);
	daemon_restart_with(&d, args, child_simulated, (void *)delay_ms);
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
	if (d.pid > 0 && daemon_alive(&d))
		ck_assert_int_eq(daemon_stop(&d), 0);
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
	CHECK_CASE(s, "real", start_real, stop_daemon, 60, test_big_chunks_filled_in_segments_are_whole_and_locked);
	return s;
}

CHECK_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/* Unit tests for the pressure monitor (monitor*.c) on the captured and crafted proc roots of tests/fixtures/proc: start-up, the mode it picks, the first evaluation's transition, the host's memory and its cgroup. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <ev.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "log.h"
#include "monitor.h"
#include "check_main.h"

#define MIB (1024ull * 1024)
#define GIB (1024ull * MIB)

/* What the monitor's callback heard. */
static int calls;
static enum broker_state heard_from, heard_to;

static void on_state(void *ud, enum broker_state from, enum broker_state to, const char *why)
{
	(void)why;
	ck_assert_ptr_eq(ud, &calls);
	calls++;
	heard_from = from;
	heard_to = to;
}

/* A config reading the fixture scenario as its proc root, thresholds and intervals at their defaults. */
static struct config *scenario_config(const char *scenario)
{
	struct config *cfg = NULL;
	char root[4096], *err = NULL;

	snprintf(root, sizeof(root), "%s/proc/%s", FIXTURES_DIR, scenario);
	ck_assert_int_eq(config_new(&cfg), 0);
	ck_assert_msg(config_set(cfg, "proc-root", root, &err) == 0, "proc-root: %s", err ? err : "?");
	return cfg;
}

/*
 * Start a monitor on scenario and run its first evaluation (the loop's first turn). Returns 0 and *ret (the
 * loop in *loop), or monitor_new's errno.
 */
static int start(const char *scenario, struct ev_loop **loop, struct monitor **ret)
{
	struct config *cfg = scenario_config(scenario);
	int r;

	calls = 0;
	*loop = ev_loop_new(EVFLAG_AUTO);
	ck_assert_ptr_nonnull(*loop);
	r = monitor_new(*loop, cfg, on_state, &calls, ret);
	config_free(cfg);
	if (r == 0)
		ev_run(*loop, EVRUN_ONCE); /* the first evaluation is a timer due at once */
	return r;
}

static void stop(struct ev_loop *loop, struct monitor *m)
{
	monitor_free(m);
	ev_loop_destroy(loop);
}

/* fixtures/proc/README.md: each scenario's verdict under the default thresholds. */
static void assert_verdict(const char *scenario, enum broker_state want)
{
	struct ev_loop *loop;
	struct monitor *m;

	ck_assert_int_eq(start(scenario, &loop, &m), 0);
	ck_assert_int_eq(monitor_state(m), want);
	if (want == BROKER_NORMAL) {
		ck_assert_int_eq(calls, 0); /* no change: nothing to report */
	} else {
		/* A host already under pressure at start is reported like any other change. */
		ck_assert_int_eq(calls, 1);
		ck_assert_int_eq(heard_from, BROKER_NORMAL);
		ck_assert_int_eq(heard_to, want);
	}
	stop(loop, m);
}

START_TEST(test_idle_host_is_normal_and_reports_nothing)
{
	assert_verdict("idle", BROKER_NORMAL);
}
END_TEST

START_TEST(test_near_oom_host_is_reported_critical_at_start)
{
	assert_verdict("near-oom", BROKER_CRITICAL);
}
END_TEST

START_TEST(test_swapping_host_is_reported_tight_at_start)
{
	assert_verdict("swapping", BROKER_TIGHT);
}
END_TEST

START_TEST(test_cgroup_limits_bind_before_the_host)
{
	assert_verdict("cgroup-v2", BROKER_TIGHT);    /* 7.5% of its 4 GiB limit available */
	assert_verdict("cgroup-v1", BROKER_CRITICAL); /* 3.75% of its 8 GiB limit */
}
END_TEST

/* The monitor on scenario starts, reports mode and, unless want_state is negative, that state. */
static void assert_mode(const char *scenario, const char *mode, int want_state)
{
	struct ev_loop *loop;
	struct monitor *m;

	ck_assert_int_eq(start(scenario, &loop, &m), 0);
	ck_assert_str_eq(monitor_mode(m), mode);
	if (want_state >= 0)
		ck_assert_int_eq(monitor_state(m), want_state);
	stop(loop, m);
}

START_TEST(test_kernel_without_psi_polls_and_says_so)
{
	assert_mode("no-psi", "poll (no PSI)", BROKER_NORMAL);
}
END_TEST

START_TEST(test_plain_files_never_arm_psi_triggers)
{
	/* The fixture's PSI file is a plain file, not procfs: a trigger there would never fire. */
	assert_mode("idle", "poll (PSI triggers unavailable: not on procfs)", -1);
}
END_TEST

START_TEST(test_unusable_meminfo_fails_the_start)
{
	struct ev_loop *loop;
	struct monitor *m = NULL;

	ck_assert_int_eq(start("missing", &loop, &m), -ENOENT);
	ev_loop_destroy(loop);
	ck_assert_int_eq(start("garbage", &loop, &m), -EBADMSG);
	ev_loop_destroy(loop);
	ck_assert_int_eq(start("truncated", &loop, &m), -EBADMSG);
	ev_loop_destroy(loop);
}
END_TEST

START_TEST(test_signals_show_the_sampled_figures)
{
	struct monitor_signal sig[MONITOR_SIGNALS_MAX];
	struct ev_loop *loop;
	struct monitor *m;
	size_t n;
	bool seen = false;

	ck_assert_int_eq(start("near-oom", &loop, &m), 0);
	n = monitor_signals(m, sig, MONITOR_SIGNALS_MAX);
	ck_assert_uint_gt(n, 0);
	for (size_t i = 0; i < n && i < MONITOR_SIGNALS_MAX; i++)
		if (strcmp(sig[i].name, "mem_available_pct") == 0) {
			seen = true;
			ck_assert(sig[i].available);
			ck_assert(fabs(sig[i].value - 3.0) < 0.5); /* near-oom: MemAvailable 3% of MemTotal */
		}
	ck_assert(seen);
	ck_assert(fabs(monitor_mem_available_pct(m) - 3.0) < 0.5);
	/* The transition is kept for status. */
	{
		struct monitor_event ev[MONITOR_EVENTS_MAX];

		ck_assert_uint_eq(monitor_transitions(m, ev, MONITOR_EVENTS_MAX), 1);
	}
	stop(loop, m);
}
END_TEST

/* The metrics' swap counters (issue 28): vmstat's pswpin/pswpout as read; none on a host without swap. */
START_TEST(test_swap_counters_are_vmstat_as_read)
{
	struct ev_loop *loop;
	struct monitor *m;
	uint64_t in = 0, out = 0;

	ck_assert_int_eq(start("swapping", &loop, &m), 0);
	ck_assert(monitor_swap_pages(m, &in, &out));
	ck_assert_uint_eq(in, 512000);   /* fixtures/proc/swapping/proc/vmstat */
	ck_assert_uint_eq(out, 4096000); /* fixtures/proc/swapping/proc/vmstat */
	stop(loop, m);
	ck_assert_int_eq(start("idle", &loop, &m), 0); /* no swap: vmstat is not read */
	ck_assert(!monitor_swap_pages(m, &in, &out));
	stop(loop, m);
}
END_TEST

START_TEST(test_read_host_takes_the_cgroup_limit_and_its_usage)
{
	char root[4096];
	struct monitor_host h;

	snprintf(root, sizeof(root), "%s/proc/cgroup-v2", FIXTURES_DIR);
	ck_assert_int_eq(monitor_read_host(root, &h), 0);
	ck_assert_uint_eq(h.mem_total_bytes, 24683548ull * 1024); /* its meminfo's MemTotal */
	ck_assert_uint_eq(h.cgroup_limit_bytes, 4 * GIB);
	ck_assert_uint_eq(h.cgroup_usage_bytes, 3840 * MIB); /* 3.75 GiB */
	snprintf(root, sizeof(root), "%s/proc/no-psi", FIXTURES_DIR);
	ck_assert_int_eq(monitor_read_host(root, &h), 0);
	ck_assert_uint_eq(h.cgroup_limit_bytes, 0); /* no cgroup limit */
	snprintf(root, sizeof(root), "%s/proc/missing", FIXTURES_DIR);
	ck_assert_int_lt(monitor_read_host(root, &h), 0);
}
END_TEST

static Suite *monitor_suite(void)
{
	Suite *s = suite_create("monitor");
	TCase *tc = tcase_create("fixtures");

	log_init(LOG_EMERG, 0);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_idle_host_is_normal_and_reports_nothing);
	tcase_add_test(tc, test_near_oom_host_is_reported_critical_at_start);
	tcase_add_test(tc, test_swapping_host_is_reported_tight_at_start);
	tcase_add_test(tc, test_cgroup_limits_bind_before_the_host);
	tcase_add_test(tc, test_kernel_without_psi_polls_and_says_so);
	tcase_add_test(tc, test_plain_files_never_arm_psi_triggers);
	tcase_add_test(tc, test_unusable_meminfo_fails_the_start);
	tcase_add_test(tc, test_signals_show_the_sampled_figures);
	tcase_add_test(tc, test_swap_counters_are_vmstat_as_read);
	tcase_add_test(tc, test_read_host_takes_the_cgroup_limit_and_its_usage);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(monitor_suite)

/* SPDX-License-Identifier: MIT */
/* Unit tests for pressure's policy: each signal's thresholds, the transitions and their hysteresis (the parsers: check_pressure.c). */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pressure.h"
#include "check_main.h"
#include "pressure_ref.h"

/* --- policy --- */

/* 100 GiB host, no swap, no PSI, no cgroup; avail_pct of it available. */
static struct pressure_sample sample_pct(double avail_pct)
{
	struct pressure_sample s = { 0 };

	s.mem.mem_total_bytes = 100 * GIB;
	s.mem.mem_available_bytes = (uint64_t)(avail_pct / 100.0 * (double)(100 * GIB));
	s.mem.have = MEMINFO_MEM_TOTAL | MEMINFO_MEM_AVAILABLE;
	s.have_psi = true;
	s.psi.some.present = s.psi.full.present = true;
	s.have_swapout = true;
	return s;
}

static struct pressure *policy(uint32_t hysteresis_ms)
{
	struct pressure_thresholds t;
	struct pressure *p = NULL;

	reference_thresholds(&t);
	t.hysteresis_ms = hysteresis_ms;
	ck_assert_int_eq(pressure_new(&t, &p), 0);
	return p;
}

START_TEST(test_new_policy_rejects_null_thresholds)
{
	struct pressure *p = NULL;

	ck_assert_int_eq(pressure_new(NULL, &p), -EINVAL);
	ck_assert_ptr_null(p);
}
END_TEST

/* One sample on a fresh policy: the state it gives, and a phrase its explanation must hold (or the whole text). */
struct signal_row {
	const char *what;
	double avail_pct;
	double psi_some, psi_full, swapout;
	uint64_t swap_total, swap_free;
	enum broker_state want;
	const char *why;
	bool whole; /* why is the whole explanation, not a phrase of it */
};

static const struct signal_row signal_rows[] = {
	{ "MemAvailable just under 10%", 9.9, 0, 0, 0, 0, 0, BROKER_TIGHT, "MemAvailable 9.9% < 10% tight threshold",
	  false },
	{ "PSI some over 10", 50, 10.01, 0, 0, 0, 0, BROKER_TIGHT, "PSI some avg10 10.01 > 10 tight threshold", false },
	{ "swap-out over 1000/s", 50, 0, 0, 1001, 0, 0, BROKER_TIGHT, "swap-out 1001 pages/s > 1000/s tight threshold",
	  false },
	{ "SwapFree 10%", 50, 0, 0, 0, 10 * GIB, GIB, BROKER_TIGHT, "SwapFree 10.0% < 20% tight threshold", false },
	{ "MemAvailable under 5%", 4.1, 0, 0, 0, 0, 0, BROKER_CRITICAL,
	  "MemAvailable 4.1% < 5% critical threshold; PSI some avg10 0.00; PSI full avg10 0.00; swap-out 0 pages/s",
	  true },
	{ "PSI full over 5", 50, 0, 5.5, 0, 0, 0, BROKER_CRITICAL, "PSI full avg10 5.50 > 5 critical threshold",
	  false },
	{ "swap-out over 10000/s", 50, 0, 0, 20000, 0, 0, BROKER_CRITICAL,
	  "swap-out 20000 pages/s > 10000/s critical threshold", false },
};

START_TEST(test_each_signal_raises_normal)
{
	const struct signal_row *r = &signal_rows[_i];
	struct pressure *p = policy(1000);
	struct pressure_sample s = sample_pct(r->avail_pct);
	char why[256];

	s.psi.some.avg10 = r->psi_some;
	s.psi.full.avg10 = r->psi_full;
	s.swapout_pages_s = r->swapout;
	s.mem.swap_total_bytes = r->swap_total;
	s.mem.swap_free_bytes = r->swap_free;
	ck_assert_msg(pressure_evaluate(p, &s, 0, why, sizeof(why)) == r->want, "%s: not %s", r->what,
		      pressure_state_name(r->want));
	if (r->whole)
		ck_assert_str_eq(why, r->why);
	else
		ck_assert_msg(strstr(why, r->why), "%s: \"%s\" lacks \"%s\"", r->what, why, r->why);
	pressure_free(p);
}
END_TEST

START_TEST(test_exactly_the_tight_threshold_is_not_below)
{
	struct pressure *p = policy(1000);
	struct pressure_sample s = sample_pct(50);

	s.mem.mem_available_bytes = 10 * GIB;
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, NULL, 0), BROKER_NORMAL);
	pressure_free(p);
}
END_TEST

/* A run of samples on one policy: at each time (ms) the percentage available and the state it must give. */
struct step {
	double avail_pct;
	uint64_t now_ms;
	enum broker_state want;
};

struct step_run {
	const char *what;
	uint32_t hysteresis_ms;
	struct step steps[8]; /* ends at the first with avail_pct 0 */
};

static const struct step_run step_runs[] = {
	{ "tight rises to critical at once", 60000, { { 8, 0, BROKER_TIGHT }, { 4, 1, BROKER_CRITICAL } } },
	/* Tight needs its own calm run, which starts only when critical steps down to it. */
	{ "critical steps to tight, then normal",
	  10000,
	  { { 3, 0, BROKER_CRITICAL },
	    { 7, 1000, BROKER_CRITICAL },
	    { 7, 10999, BROKER_CRITICAL },
	    { 7, 11000, BROKER_TIGHT },
	    { 50, 12000, BROKER_TIGHT },
	    { 50, 21999, BROKER_TIGHT },
	    { 50, 22000, BROKER_NORMAL } } },
	{ "a spike restarts the hysteresis clock",
	  10000,
	  { { 8, 0, BROKER_TIGHT },
	    { 50, 1000, BROKER_TIGHT },
	    { 8, 5000, BROKER_TIGHT },
	    { 50, 6000, BROKER_TIGHT },
	    { 50, 11000, BROKER_TIGHT },
	    { 50, 15999, BROKER_TIGHT },
	    { 50, 16000, BROKER_NORMAL } } },
	{ "zero hysteresis drops on the first calm sample",
	  0,
	  { { 3, 5, BROKER_CRITICAL }, { 50, 5, BROKER_NORMAL } } },
	{ "the clock going back does not release early",
	  10000,
	  { { 3, 50000, BROKER_CRITICAL }, { 50, 50000, BROKER_CRITICAL }, { 50, 100, BROKER_CRITICAL } } },
};

START_TEST(test_step_runs)
{
	const struct step_run *r = &step_runs[_i];
	struct pressure *p = policy(r->hysteresis_ms);
	size_t i;

	for (i = 0; i < sizeof(r->steps) / sizeof(r->steps[0]) && r->steps[i].avail_pct > 0; i++) {
		const struct step *st = &r->steps[i];
		struct pressure_sample s = sample_pct(st->avail_pct);
		enum broker_state got = pressure_evaluate(p, &s, st->now_ms, NULL, 0);

		ck_assert_msg(got == st->want, "%s: step %zu (%.0f%% at %llu ms) is %s, want %s", r->what, i,
			      st->avail_pct, (unsigned long long)st->now_ms, pressure_state_name(got),
			      pressure_state_name(st->want));
	}
	/* The state it keeps is the last one it gave. */
	ck_assert_int_eq(pressure_state(p), r->steps[i - 1].want);
	pressure_free(p);
}
END_TEST

START_TEST(test_critical_drops_to_normal_only_after_hysteresis)
{
	struct pressure *p = policy(10000);
	struct pressure_sample hot = sample_pct(3), calm = sample_pct(50);
	char why[256];

	ck_assert_int_eq(pressure_evaluate(p, &hot, 1000, NULL, 0), BROKER_CRITICAL);
	ck_assert_int_eq(pressure_evaluate(p, &calm, 2000, why, sizeof(why)), BROKER_CRITICAL);
	ck_assert_ptr_nonnull(strstr(why, "below critical thresholds for 0 of 10000 ms"));
	ck_assert_int_eq(pressure_evaluate(p, &calm, 11999, NULL, 0), BROKER_CRITICAL);
	/* Below the tight thresholds the whole time: straight to normal. */
	ck_assert_int_eq(pressure_evaluate(p, &calm, 12000, why, sizeof(why)), BROKER_NORMAL);
	ck_assert_ptr_nonnull(strstr(why, "below tight thresholds for 10000 ms"));
	pressure_free(p);
}
END_TEST

START_TEST(test_cgroup_limit_dominates_mem_total)
{
	struct pressure *p = policy(1000);
	struct pressure_sample s = sample_pct(90);
	struct pressure_figures f;
	char why[256];

	s.have_cgroup_limit = true;
	s.cgroup_limit_bytes = 10 * GIB;
	s.cgroup_usage_bytes = 10 * GIB - 400 * MIB; /* 3.9% left */
	pressure_figures(&s, &f);
	ck_assert(f.cgroup_dominates);
	ck_assert_uint_eq(f.mem_base_bytes, 10 * GIB);
	ck_assert_uint_eq(f.mem_available_bytes, 400 * MIB);
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, why, sizeof(why)), BROKER_CRITICAL);
	ck_assert_ptr_nonnull(strstr(why, "MemAvailable 3.9% of cgroup limit 10"));

	/* Reclaimable page cache in the cgroup is not pressure. */
	s.cgroup_reclaimable_bytes = 2 * GIB;
	pressure_figures(&s, &f);
	ck_assert_uint_eq(f.mem_available_bytes, 2 * GIB + 400 * MIB);

	/* The host running out still counts when the cgroup has room. */
	s.cgroup_usage_bytes = GIB;
	s.cgroup_reclaimable_bytes = 0;
	s.mem.mem_available_bytes = 300 * MIB;
	pressure_figures(&s, &f);
	ck_assert_uint_eq(f.mem_available_bytes, 300 * MIB);

	/* Usage over the limit (v1 can overshoot briefly) reads as 0 available, not a wrap. */
	s.mem.mem_available_bytes = 90 * GIB;
	s.cgroup_usage_bytes = 11 * GIB;
	pressure_figures(&s, &f);
	ck_assert_uint_eq(f.mem_available_bytes, 0);
	ck_assert_double_eq(f.mem_available_pct, 0);
	pressure_free(p);
}
END_TEST

START_TEST(test_cgroup_limit_above_mem_total_or_unlimited_is_ignored)
{
	struct pressure_sample s = sample_pct(50);
	struct pressure_figures f;

	s.have_cgroup_limit = true;
	s.cgroup_limit_bytes = 200 * GIB;
	s.cgroup_usage_bytes = 199 * GIB;
	pressure_figures(&s, &f);
	ck_assert(!f.cgroup_dominates);
	ck_assert_uint_eq(f.mem_base_bytes, 100 * GIB);
	ck_assert_double_eq_tol(f.mem_available_pct, 50, 0.01);
	ck_assert_double_eq_tol(f.cgroup_usage_pct, 99.5, 0.01);

	s.cgroup_limit_bytes = PRESSURE_UNLIMITED;
	pressure_figures(&s, &f);
	ck_assert(!f.cgroup_dominates);
	ck_assert(isnan(f.cgroup_usage_pct));
}
END_TEST

START_TEST(test_swap_thresholds_ignored_without_swap)
{
	struct pressure *p = policy(1000);
	struct pressure_sample s = sample_pct(50);
	struct pressure_figures f;
	char why[256];

	s.mem.swap_total_bytes = 0;
	s.mem.swap_free_bytes = 0;
	pressure_figures(&s, &f);
	ck_assert(isnan(f.swap_free_pct));
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, why, sizeof(why)), BROKER_NORMAL);
	ck_assert_ptr_null(strstr(why, "SwapFree"));
	pressure_free(p);
}
END_TEST

START_TEST(test_missing_signals_never_cross)
{
	struct pressure *p = policy(1000);
	struct pressure_sample s = sample_pct(50);
	struct pressure_figures f;

	s.have_psi = false;
	s.psi.some.avg10 = s.psi.full.avg10 = 99; /* stale values behind have_psi = false */
	s.have_swapout = false;
	s.swapout_pages_s = 1e9;
	pressure_figures(&s, &f);
	ck_assert(isnan(f.psi_some_avg10) && isnan(f.psi_full_avg10) && isnan(f.swapout_pages_s));
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, NULL, 0), BROKER_NORMAL);
	pressure_free(p);
}
END_TEST

START_TEST(test_nan_threshold_disables_condition)
{
	struct pressure_thresholds t;
	struct pressure *p;
	struct pressure_sample s = sample_pct(50);

	reference_thresholds(&t);
	t.tight_psi_some_avg10 = NAN;
	ck_assert_int_eq(pressure_new(&t, &p), 0);
	s.psi.some.avg10 = 90;
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, NULL, 0), BROKER_NORMAL);
	pressure_free(p);
}
END_TEST

START_TEST(test_set_thresholds_keeps_state_and_applies_next_sample)
{
	struct pressure *p = policy(0);
	struct pressure_thresholds t;
	struct pressure_sample s = sample_pct(8);

	ck_assert_int_eq(pressure_evaluate(p, &s, 0, NULL, 0), BROKER_TIGHT);
	t = *pressure_get_thresholds(p);
	t.tight_mem_available_pct = 6;
	t.critical_mem_available_pct = 3;
	pressure_set_thresholds(p, &t);
	ck_assert_int_eq(pressure_state(p), BROKER_TIGHT);
	ck_assert_int_eq(pressure_evaluate(p, &s, 1, NULL, 0), BROKER_NORMAL);
	t.tight_mem_available_pct = 20;
	t.critical_mem_available_pct = 9;
	pressure_set_thresholds(p, &t);
	ck_assert_int_eq(pressure_evaluate(p, &s, 2, NULL, 0), BROKER_CRITICAL);
	pressure_free(p);
}
END_TEST

START_TEST(test_why_is_truncated_safely)
{
	struct pressure *p = policy(0);
	struct pressure_sample s = sample_pct(3);
	char why[9];

	memset(why, 'x', sizeof(why));
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, why, sizeof(why)), BROKER_CRITICAL);
	ck_assert_uint_eq(strlen(why), 8);
	ck_assert_str_eq(why, "MemAvail");
	/* A 1-byte buffer gets just the NUL. */
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, why, 1), BROKER_CRITICAL);
	ck_assert_str_eq(why, "");
	pressure_free(p);
}
END_TEST

START_TEST(test_state_names)
{
	static const struct {
		enum broker_state state;
		const char *want;
	} rows[] = {
		{ BROKER_NORMAL, "normal" },
		{ BROKER_TIGHT, "tight" },
		{ BROKER_CRITICAL, "critical" },
		{ (enum broker_state)42, "unknown" },
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		ck_assert_str_eq(pressure_state_name(rows[i].state), rows[i].want);
}
END_TEST

static Suite *pressure_policy_suite(void)
{
	Suite *s = suite_create("pressure_policy");
	TCase *tc;

	tc = CHECK_CASE(s, "policy", NULL, NULL, 10, test_new_policy_rejects_null_thresholds,
			test_exactly_the_tight_threshold_is_not_below,
			test_critical_drops_to_normal_only_after_hysteresis, test_cgroup_limit_dominates_mem_total,
			test_cgroup_limit_above_mem_total_or_unlimited_is_ignored,
			test_swap_thresholds_ignored_without_swap, test_missing_signals_never_cross,
			test_nan_threshold_disables_condition, test_set_thresholds_keeps_state_and_applies_next_sample,
			test_why_is_truncated_safely, test_state_names);
	tcase_add_loop_test(tc, test_each_signal_raises_normal, 0, (int)(sizeof(signal_rows) / sizeof(signal_rows[0])));
	tcase_add_loop_test(tc, test_step_runs, 0, (int)(sizeof(step_runs) / sizeof(step_runs[0])));
	return s;
}

CHECK_MAIN(pressure_policy_suite)

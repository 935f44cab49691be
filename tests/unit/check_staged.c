/* SPDX-License-Identifier: MIT */
/* Unit tests for staged: clients' staged-copy reports checked, summed, and turned into rates. */
#include <check.h>
#include <stdint.h>
#include <string.h>

#include "check_main.h"
#include "staged.h"

#define MIB (1024ull * 1024)
#define GIB (1024ull * MIB)

/* A connection made at 10 s of monotonic time. */
#define T0 10000

static struct staged_counters h2d(uint64_t bytes, uint64_t copies)
{
	return (struct staged_counters){ .h2d_bytes = bytes, .h2d_copies = copies };
}

START_TEST(test_reports_add_their_steps_to_the_totals)
{
	struct staged_client sc;
	struct staged_totals t = { 0 };
	struct staged_counters r = { .h2d_bytes = 3 * GIB,
				     .d2h_bytes = GIB,
				     .h2d_copies = 24,
				     .d2h_copies = 8,
				     .driver_copies = 5,
				     .ring_revoked = 1,
				     .ring_refused = 2,
				     .busy_ns = 7 };

	staged_client_init(&sc, T0);
	ck_assert_int_eq(staged_check(&sc, &r, T0 + 100, NULL), STAGED_OK);
	staged_apply(&sc, &t, &r, T0 + 100);
	r.h2d_bytes += GIB;
	r.h2d_copies += 8;
	ck_assert_int_eq(staged_check(&sc, &r, T0 + 400, NULL), STAGED_OK);
	staged_apply(&sc, &t, &r, T0 + 400);
	/* The totals hold the last report of this connection, not the sum of its reports. */
	ck_assert_uint_eq(t.sum.h2d_bytes, 4 * GIB);
	ck_assert_uint_eq(t.sum.d2h_bytes, GIB);
	ck_assert_uint_eq(t.sum.h2d_copies, 32);
	ck_assert_uint_eq(t.sum.driver_copies, 5);
	ck_assert_uint_eq(t.reports, 2);
	/* A second connection adds its own. */
	{
		struct staged_client other;
		struct staged_counters o = h2d(MIB, 1);

		staged_client_init(&other, T0);
		staged_apply(&other, &t, &o, T0 + 500);
		ck_assert_uint_eq(t.sum.h2d_bytes, 4 * GIB + MIB);
	}
}
END_TEST

START_TEST(test_backwards_or_absurd_reports_are_refused_naming_the_counter)
{
	struct staged_client sc;
	struct staged_totals t = { 0 };
	struct staged_counters r = h2d(100 * MIB, 10), bad;
	const char *field;

	staged_client_init(&sc, T0);
	staged_apply(&sc, &t, &r, T0 + 1000);
	bad = h2d(50 * MIB, 10);
	ck_assert_int_eq(staged_check(&sc, &bad, T0 + 1100, &field), STAGED_BACKWARDS);
	ck_assert_str_eq(field, "h2d_bytes");
	bad = r;
	bad.busy_ns = 0;
	r.busy_ns = 5;
	staged_apply(&sc, &t, &r, T0 + 1100);
	ck_assert_int_eq(staged_check(&sc, &bad, T0 + 1200, &field), STAGED_BACKWARDS);
	ck_assert_str_eq(field, "busy_ns");
	bad = h2d(STAGED_COUNTER_MAX + 1, 1);
	ck_assert_int_eq(staged_check(&sc, &bad, T0 + 1200, &field), STAGED_TOO_LARGE);
	bad = r;
	bad.h2d_bytes = 200 * MIB;
	bad.h2d_copies = 300 * MIB;
	ck_assert_int_eq(staged_check(&sc, &bad, T0 + 1200, &field), STAGED_COPIES_OVER_BYTES);
	ck_assert_str_eq(field, "h2d_copies");
	/* 1 s after the last: a second at the bound (2^42 bytes, to the ms) and the slack may come, one byte more may
	 * not (both ways count). */
	bad = r;
	bad.h2d_bytes = 100 * MIB + 1000 * (STAGED_MAX_BYTES_PER_S / 1000) + STAGED_SLACK_BYTES;
	ck_assert_int_eq(staged_check(&sc, &bad, T0 + 2100, NULL), STAGED_OK);
	bad.d2h_bytes = 1;
	ck_assert_int_eq(staged_check(&sc, &bad, T0 + 2100, NULL), STAGED_TOO_FAST);
	/* Refused reports changed nothing. */
	ck_assert_uint_eq(t.sum.h2d_bytes, 100 * MIB);
	ck_assert_uint_eq(sc.last.h2d_bytes, 100 * MIB);
	ck_assert_str_ne(staged_verdict_text(STAGED_BACKWARDS), "unknown");
}
END_TEST

START_TEST(test_rate_over_steady_reports_is_exact)
{
	struct staged_client sc;
	struct staged_totals t = { 0 };
	uint64_t hr, dr;

	/* 100 MiB every 250 ms for 10 s: 400 MiB/s host to device, and 25 MiB every 250 ms back: 100 MiB/s. */
	staged_client_init(&sc, T0);
	for (uint64_t k = 1; k <= 40; k++) {
		struct staged_counters r = {
			.h2d_bytes = k * 100 * MIB, .d2h_bytes = k * 25 * MIB, .h2d_copies = k, .d2h_copies = k
		};

		ck_assert_int_eq(staged_check(&sc, &r, T0 + k * 250, NULL), STAGED_OK);
		staged_apply(&sc, &t, &r, T0 + k * 250);
	}
	staged_rate(&sc, T0 + 40 * 250, &hr, &dr);
	ck_assert_uint_eq(hr, 400 * MIB);
	ck_assert_uint_eq(dr, 100 * MIB);
}
END_TEST

START_TEST(test_rate_is_zero_after_silence_and_spread_over_the_window_after_a_gap)
{
	struct staged_client sc;
	struct staged_totals t = { 0 };
	struct staged_counters r = h2d(GIB, 1);
	uint64_t hr, dr;

	staged_client_init(&sc, T0);
	staged_apply(&sc, &t, &r, T0 + 1000);
	/* Nothing reported for longer than the window: no rate. */
	staged_rate(&sc, T0 + 1000 + STAGED_RATE_WINDOW_MS + 1, &hr, &dr);
	ck_assert_uint_eq(hr, 0);
	ck_assert_uint_eq(dr, 0);
	/* An hour later, 1 GiB more in one report: it was copied within the window, at most the window's length
	 * (from its start to the report): 1 GiB over 5 s. */
	r = h2d(2 * GIB, 2);
	staged_apply(&sc, &t, &r, T0 + 3600000);
	staged_rate(&sc, T0 + 3600000, &hr, &dr);
	ck_assert_uint_eq(hr, GIB / 5);
	/* Before any report: none. */
	staged_client_init(&sc, T0);
	staged_rate(&sc, T0 + 100, &hr, &dr);
	ck_assert_uint_eq(hr, 0);
}
END_TEST

START_TEST(test_fast_reports_keep_the_window_in_the_samples)
{
	struct staged_client sc;
	struct staged_totals t = { 0 };
	uint64_t hr, dr;

	/* A report every ms for 8 s, 1 MiB each: samples are kept at most every 250 ms, so the window's start is
	 * still among them and the rate is 1 MiB per ms. */
	staged_client_init(&sc, T0);
	for (uint64_t k = 1; k <= 8000; k++) {
		struct staged_counters r = h2d(k * MIB, k);

		staged_apply(&sc, &t, &r, T0 + k);
	}
	ck_assert_uint_le(sc.nsamples, STAGED_SAMPLES);
	staged_rate(&sc, T0 + 8000, &hr, &dr);
	ck_assert_uint_eq(hr, 1000 * MIB);
}
END_TEST

CHECK_SUITE(suite, "staged", "staged", NULL, NULL, 10, test_reports_add_their_steps_to_the_totals,
	    test_backwards_or_absurd_reports_are_refused_naming_the_counter, test_rate_over_steady_reports_is_exact,
	    test_rate_is_zero_after_silence_and_spread_over_the_window_after_a_gap,
	    test_fast_reports_keep_the_window_in_the_samples)
CHECK_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/* Check suite for daemon/log: message ids, the per-kind rate limiter, level threshold and stderr format. */
#include <check.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "check_main.h"

#define TIMEOUT_S 10
#define T0 UINT64_C(1000000000) /* an arbitrary monotonic start, far from 0 */

/* Points fd 2 at a temp file; fork mode gives every test its own fd table. */
static FILE *capture_start(void)
{
	FILE *f = tmpfile();

	ck_assert_ptr_nonnull(f);
	fflush(stderr);
	ck_assert_int_ge(dup2(fileno(f), STDERR_FILENO), 0);
	return f;
}

/* Everything written to stderr since capture_start, malloc'd. */
static char *capture_read(FILE *f)
{
	static char buf[65536];
	size_t n;

	fflush(stderr);
	rewind(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	return strdup(buf);
}

/*
 * The log module's clock, set by the test: the suite links with -Wl,--wrap=now_us (tests/unit/CMakeLists.txt), so
 * log_event reads fake_now_us while it is set, and a test passes a rate-limit window without sleeping 5 s.
 */
uint64_t __wrap_now_us(void);
static uint64_t fake_now_us;

uint64_t __wrap_now_us(void)
{
	struct timespec ts;

	if (fake_now_us)
		return fake_now_us;
	/* As common/util.c's now_us (whose __real_ twin a static link does not pull in). */
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static unsigned count_lines(const char *s)
{
	unsigned n = 0;

	for (; *s; s++)
		n += *s == '\n';
	return n;
}

START_TEST(test_message_ids_are_32_hex_digits)
{
	for (int k = 0; k < EV__MAX; k++) {
		const char *id = log_event_message_id((enum log_event_kind)k);

		ck_assert_ptr_nonnull(id);
		ck_assert_uint_eq(strlen(id), 32);
		for (size_t i = 0; i < 32; i++)
			ck_assert_msg(isxdigit((unsigned char)id[i]) && !isupper((unsigned char)id[i]),
				      "kind %d id %s: not lowercase hex", k, id);
	}
}
END_TEST

START_TEST(test_message_ids_and_names_are_distinct)
{
	for (int a = 0; a < EV__MAX; a++)
		for (int b = a + 1; b < EV__MAX; b++) {
			ck_assert_str_ne(log_event_message_id((enum log_event_kind)a),
					 log_event_message_id((enum log_event_kind)b));
			ck_assert_str_ne(log_event_kind_name((enum log_event_kind)a),
					 log_event_kind_name((enum log_event_kind)b));
		}
}
END_TEST

START_TEST(test_unknown_kind_has_no_id)
{
	ck_assert_ptr_null(log_event_message_id(EV__MAX));
	ck_assert_str_eq(log_event_kind_name(EV__MAX), "unknown");
}
END_TEST

START_TEST(test_ratelimit_passes_burst_then_suppresses)
{
	unsigned sup = 99;

	for (int i = 0; i < LOG_RATELIMIT_BURST; i++) {
		ck_assert(log_ratelimit_pass(EV_LEASE_REFUSED, T0 + (uint64_t)i, &sup));
		ck_assert_uint_eq(sup, 0);
	}
	for (int i = 0; i < 5; i++)
		ck_assert(!log_ratelimit_pass(EV_LEASE_REFUSED, T0 + 100 + (uint64_t)i, &sup));
	/* Still inside the window at its last microsecond. */
	ck_assert(!log_ratelimit_pass(EV_LEASE_REFUSED, T0 + LOG_RATELIMIT_WINDOW_US - 1, NULL));
}
END_TEST

START_TEST(test_ratelimit_flush_reports_suppressed_count_once_window_ends)
{
	for (int i = 0; i < LOG_RATELIMIT_BURST + 7; i++)
		log_ratelimit_pass(EV_LEASE_REFUSED, T0, NULL);
	ck_assert_uint_eq(log_ratelimit_flush(EV_LEASE_REFUSED, T0 + LOG_RATELIMIT_WINDOW_US - 1), 0);
	ck_assert_uint_eq(log_ratelimit_flush(EV_LEASE_REFUSED, T0 + LOG_RATELIMIT_WINDOW_US), 7);
	ck_assert_uint_eq(log_ratelimit_flush(EV_LEASE_REFUSED, T0 + LOG_RATELIMIT_WINDOW_US + 1), 0);
}
END_TEST

START_TEST(test_ratelimit_new_window_reports_unflushed_count)
{
	unsigned sup = 0;

	for (int i = 0; i < LOG_RATELIMIT_BURST + 3; i++)
		log_ratelimit_pass(EV_PROTOCOL_ERROR, T0, NULL);
	ck_assert(log_ratelimit_pass(EV_PROTOCOL_ERROR, T0 + LOG_RATELIMIT_WINDOW_US, &sup));
	ck_assert_uint_eq(sup, 3);
	/* The new window has its own full burst. */
	for (int i = 1; i < LOG_RATELIMIT_BURST; i++)
		ck_assert(log_ratelimit_pass(EV_PROTOCOL_ERROR, T0 + LOG_RATELIMIT_WINDOW_US + 1, &sup));
	ck_assert(!log_ratelimit_pass(EV_PROTOCOL_ERROR, T0 + LOG_RATELIMIT_WINDOW_US + 2, &sup));
}
END_TEST

START_TEST(test_ratelimit_kinds_are_independent)
{
	for (int i = 0; i < LOG_RATELIMIT_BURST + 1; i++)
		log_ratelimit_pass(EV_LEASE_REFUSED, T0, NULL);
	ck_assert(!log_ratelimit_pass(EV_LEASE_REFUSED, T0, NULL));
	ck_assert(log_ratelimit_pass(EV_LEASE_GRANTED, T0, NULL));
	ck_assert_uint_eq(log_ratelimit_flush(EV_LEASE_GRANTED, T0 + LOG_RATELIMIT_WINDOW_US), 0);
}
END_TEST

START_TEST(test_level_from_string_knows_syslog_names)
{
	ck_assert_int_eq(log_level_from_string("debug"), LOG_DEBUG);
	ck_assert_int_eq(log_level_from_string("info"), LOG_INFO);
	ck_assert_int_eq(log_level_from_string("notice"), LOG_NOTICE);
	ck_assert_int_eq(log_level_from_string("warning"), LOG_WARNING);
	ck_assert_int_eq(log_level_from_string("WARN"), LOG_WARNING);
	ck_assert_int_eq(log_level_from_string("err"), LOG_ERR);
	ck_assert_int_eq(log_level_from_string("error"), LOG_ERR);
	ck_assert_int_eq(log_level_from_string("loud"), -1);
	ck_assert_int_eq(log_level_from_string(""), -1);
	ck_assert_int_eq(log_level_from_string(NULL), -1);
}
END_TEST

START_TEST(test_default_level_is_info)
{
	ck_assert_int_eq(log_level, LOG_INFO);
}
END_TEST

START_TEST(test_info_threshold_hides_debug)
{
	FILE *f = capture_start();
	char *out;

	log_init(LOG_INFO, 0);
	log_debug("hidden %d", 1);
	log_info("shown %d", 2);
	out = capture_read(f);
	ck_assert_str_eq(out, "pinbrokerd: shown 2\n");
	free(out);
}
END_TEST

START_TEST(test_debug_threshold_shows_debug)
{
	FILE *f = capture_start();
	char *out;

	log_init(LOG_DEBUG, 0);
	log_debug("detail");
	out = capture_read(f);
	ck_assert_str_eq(out, "pinbrokerd: detail\n");
	free(out);
}
END_TEST

START_TEST(test_warning_threshold_hides_info_and_events_below)
{
	FILE *f = capture_start();
	char *out;

	log_init(LOG_WARNING, 0);
	log_info("hidden");
	log_event(EV_LEASE_GRANTED, LOG_INFO, 1, 1000, 42, "hidden event");
	log_warnx("careful");
	out = capture_read(f);
	ck_assert_str_eq(out, "pinbrokerd: warning: careful\n");
	free(out);
}
END_TEST

START_TEST(test_warn_appends_strerror_and_keeps_errno)
{
	FILE *f = capture_start();
	char *out;

	log_init(LOG_INFO, 0);
	errno = ENOENT;
	log_warn("open %s", "/x");
	ck_assert_int_eq(errno, ENOENT);
	out = capture_read(f);
	ck_assert_str_eq(out, "pinbrokerd: warning: open /x: No such file or directory\n");
	free(out);
}
END_TEST

START_TEST(test_trailing_newlines_are_dropped)
{
	FILE *f = capture_start();
	char *out;

	log_init(LOG_INFO, 0);
	log_info("a.conf:3: bad\n");
	out = capture_read(f);
	ck_assert_str_eq(out, "pinbrokerd: a.conf:3: bad\n");
	free(out);
}
END_TEST

START_TEST(test_journal_stream_of_another_file_means_stderr)
{
	FILE *f = capture_start();
	char *out;

	setenv("JOURNAL_STREAM", "1:1", 1);
	log_init(LOG_INFO, -1);
	log_info("to stderr");
	out = capture_read(f);
	ck_assert_str_eq(out, "pinbrokerd: to stderr\n");
	free(out);
}
END_TEST

START_TEST(test_event_burst_is_cut_at_limit)
{
	FILE *f = capture_start();
	char *out;

	log_init(LOG_INFO, 0);
	/* 30 events take microseconds, far inside one 5 s window. */
	for (int i = 0; i < 30; i++)
		log_event(EV_LEASE_REFUSED, LOG_INFO, 0, 1000, 42, "refused %d", i);
	out = capture_read(f);
	ck_assert_uint_eq(count_lines(out), LOG_RATELIMIT_BURST);
	ck_assert_ptr_nonnull(strstr(out, "pinbrokerd: refused 0\n"));
	ck_assert_ptr_null(strstr(out, "refused 20\n"));
	free(out);
}
END_TEST

START_TEST(test_events_below_threshold_do_not_use_up_the_limit)
{
	FILE *f = capture_start();
	char *out;

	log_init(LOG_INFO, 0);
	for (int i = 0; i < 50; i++)
		log_event(EV_LEASE_GRANTED, LOG_DEBUG, (uint64_t)i + 1, 1000, 42, "quiet");
	log_event(EV_LEASE_GRANTED, LOG_INFO, 7, (uid_t)-1, 0, "loud");
	out = capture_read(f);
	ck_assert_str_eq(out, "pinbrokerd: loud\n");
	free(out);
}
END_TEST

/* The window ends on the log module's clock (fake_now_us), 100 ms after its 5 s. */
START_TEST(test_suppressed_events_are_reported_when_the_window_ends)
{
	FILE *f = capture_start();
	char *out;

	log_init(LOG_INFO, 0);
	fake_now_us = T0;
	for (int i = 0; i < LOG_RATELIMIT_BURST + 5; i++)
		log_event(EV_LEASE_REFUSED, LOG_INFO, 0, 1000, 42, "refused %d", i);
	fake_now_us = T0 + LOG_RATELIMIT_WINDOW_US + 100000;
	log_event(EV_LEASE_GRANTED, LOG_INFO, 9, 1000, 42, "granted");
	out = capture_read(f);
	ck_assert_uint_eq(count_lines(out), LOG_RATELIMIT_BURST + 2);
	ck_assert_ptr_nonnull(strstr(out, "pinbrokerd: 5 messages of kind lease-refused suppressed\n"
					  "pinbrokerd: granted\n"));
	free(out);
}
END_TEST

/* One microsecond before the window ends nothing is reported yet; at its end the count is, once. */
START_TEST(test_suppressed_count_waits_for_the_end_of_the_window)
{
	FILE *f = capture_start();
	char *out;

	log_init(LOG_INFO, 0);
	fake_now_us = T0;
	for (int i = 0; i < LOG_RATELIMIT_BURST + 3; i++)
		log_event(EV_LEASE_REFUSED, LOG_INFO, 0, 1000, 42, "refused %d", i);
	fake_now_us = T0 + LOG_RATELIMIT_WINDOW_US - 1;
	log_event(EV_LEASE_GRANTED, LOG_INFO, 9, 1000, 42, "granted early");
	fake_now_us = T0 + LOG_RATELIMIT_WINDOW_US;
	log_event(EV_LEASE_GRANTED, LOG_INFO, 9, 1000, 42, "granted late");
	log_event(EV_LEASE_GRANTED, LOG_INFO, 9, 1000, 42, "granted again");
	out = capture_read(f);
	ck_assert_uint_eq(count_lines(out), LOG_RATELIMIT_BURST + 4);
	ck_assert_ptr_nonnull(strstr(out, "pinbrokerd: granted early\n"
					  "pinbrokerd: 3 messages of kind lease-refused suppressed\n"
					  "pinbrokerd: granted late\n"
					  "pinbrokerd: granted again\n"));
	free(out);
}
END_TEST

START_TEST(test_fatalx_exits_1)
{
	capture_start(); /* keeps the suite's output clean */
	log_init(LOG_INFO, 0);
	fatalx("cannot go on");
}
END_TEST

START_TEST(test_fatal_exits_1)
{
	capture_start();
	log_init(LOG_INFO, 0);
	errno = EACCES;
	fatal("bind");
}
END_TEST

static Suite *log_suite(void)
{
	Suite *s = suite_create("log");
	TCase *tc;

	CHECK_CASE(s, "message_ids", NULL, NULL, TIMEOUT_S, test_message_ids_are_32_hex_digits,
		   test_message_ids_and_names_are_distinct, test_unknown_kind_has_no_id);

	CHECK_CASE(s, "ratelimit", NULL, NULL, TIMEOUT_S, test_ratelimit_passes_burst_then_suppresses,
		   test_ratelimit_flush_reports_suppressed_count_once_window_ends,
		   test_ratelimit_new_window_reports_unflushed_count, test_ratelimit_kinds_are_independent,
		   test_event_burst_is_cut_at_limit, test_events_below_threshold_do_not_use_up_the_limit,
		   test_suppressed_events_are_reported_when_the_window_ends,
		   test_suppressed_count_waits_for_the_end_of_the_window);

	tc = CHECK_CASE(s, "output", NULL, NULL, TIMEOUT_S, test_level_from_string_knows_syslog_names,
			test_default_level_is_info, test_info_threshold_hides_debug, test_debug_threshold_shows_debug,
			test_warning_threshold_hides_info_and_events_below, test_warn_appends_strerror_and_keeps_errno,
			test_trailing_newlines_are_dropped, test_journal_stream_of_another_file_means_stderr);
	tcase_add_exit_test(tc, test_fatalx_exits_1, 1);
	tcase_add_exit_test(tc, test_fatal_exits_1, 1);
	return s;
}

CHECK_MAIN(log_suite)

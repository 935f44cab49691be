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

/* n passes of kind at T0 through the limiter, whatever it says. */
static void pass_n(enum log_event_kind kind, int n)
{
	for (int i = 0; i < n; i++)
		log_ratelimit_pass(kind, T0, NULL);
}

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
	pass_n(EV_LEASE_REFUSED, LOG_RATELIMIT_BURST + 7);
	ck_assert_uint_eq(log_ratelimit_flush(EV_LEASE_REFUSED, T0 + LOG_RATELIMIT_WINDOW_US - 1), 0);
	ck_assert_uint_eq(log_ratelimit_flush(EV_LEASE_REFUSED, T0 + LOG_RATELIMIT_WINDOW_US), 7);
	ck_assert_uint_eq(log_ratelimit_flush(EV_LEASE_REFUSED, T0 + LOG_RATELIMIT_WINDOW_US + 1), 0);
}
END_TEST

START_TEST(test_ratelimit_new_window_reports_unflushed_count)
{
	unsigned sup = 0;

	pass_n(EV_PROTOCOL_ERROR, LOG_RATELIMIT_BURST + 3);
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
	pass_n(EV_LEASE_REFUSED, LOG_RATELIMIT_BURST + 1);
	ck_assert(!log_ratelimit_pass(EV_LEASE_REFUSED, T0, NULL));
	ck_assert(log_ratelimit_pass(EV_LEASE_GRANTED, T0, NULL));
	ck_assert_uint_eq(log_ratelimit_flush(EV_LEASE_GRANTED, T0 + LOG_RATELIMIT_WINDOW_US), 0);
}
END_TEST

START_TEST(test_level_from_string_knows_syslog_names)
{
	static const struct {
		const char *name;
		int level;
	} rows[] = {
		{ "debug", LOG_DEBUG },
		{ "info", LOG_INFO },
		{ "notice", LOG_NOTICE },
		{ "warning", LOG_WARNING },
		{ "WARN", LOG_WARNING },
		{ "err", LOG_ERR },
		{ "error", LOG_ERR },
		{ "loud", -1 },
		{ "", -1 },
		{ NULL, -1 },
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		ck_assert_msg(log_level_from_string(rows[i].name) == rows[i].level, "\"%s\": %d, wanted %d",
			      rows[i].name ?: "(null)", log_level_from_string(rows[i].name), rows[i].level);
}
END_TEST

START_TEST(test_default_level_is_info)
{
	ck_assert_int_eq(log_level, LOG_INFO);
}
END_TEST

static void emit_debug_and_info(void)
{
	log_debug("hidden %d", 1);
	log_info("shown %d", 2);
}

static void emit_debug(void)
{
	log_debug("detail");
}

static void emit_info_event_and_warning(void)
{
	log_info("hidden");
	log_event(EV_LEASE_GRANTED, LOG_INFO, 1, 1000, 42, "hidden event");
	log_warnx("careful");
}

static void emit_warn_keeping_errno(void)
{
	errno = ENOENT;
	log_warn("open %s", "/x");
	ck_assert_int_eq(errno, ENOENT);
}

static void emit_with_newline(void)
{
	log_info("a.conf:3: bad\n");
}

static void emit_to_stderr(void)
{
	log_info("to stderr");
}

static void emit_30_refused(void)
{
	/* 30 events take microseconds, far inside one 5 s window. */
	for (int i = 0; i < 30; i++)
		log_event(EV_LEASE_REFUSED, LOG_INFO, 0, 1000, 42, "refused %d", i);
}

static void emit_50_debug_events_then_info(void)
{
	for (int i = 0; i < 50; i++)
		log_event(EV_LEASE_GRANTED, LOG_DEBUG, (uint64_t)i + 1, 1000, 42, "quiet");
	log_event(EV_LEASE_GRANTED, LOG_INFO, 7, (uid_t)-1, 0, "loud");
}

/* The burst of lease-refused events and extra more (suppressed), all at T0 on the log module's clock. */
static void refused_at_t0(int extra)
{
	fake_now_us = T0;
	for (int i = 0; i < LOG_RATELIMIT_BURST + extra; i++)
		log_event(EV_LEASE_REFUSED, LOG_INFO, 0, 1000, 42, "refused %d", i);
}

/* The window ends on the log module's clock (fake_now_us), 100 ms after its 5 s. */
static void emit_5_suppressed_then_after_the_window(void)
{
	refused_at_t0(5);
	fake_now_us = T0 + LOG_RATELIMIT_WINDOW_US + 100000;
	log_event(EV_LEASE_GRANTED, LOG_INFO, 9, 1000, 42, "granted");
}

/* One microsecond before the window ends nothing is reported yet; at its end the count is, once. */
static void emit_3_suppressed_then_around_the_end(void)
{
	refused_at_t0(3);
	fake_now_us = T0 + LOG_RATELIMIT_WINDOW_US - 1;
	log_event(EV_LEASE_GRANTED, LOG_INFO, 9, 1000, 42, "granted early");
	fake_now_us = T0 + LOG_RATELIMIT_WINDOW_US;
	log_event(EV_LEASE_GRANTED, LOG_INFO, 9, 1000, 42, "granted late");
	log_event(EV_LEASE_GRANTED, LOG_INFO, 9, 1000, 42, "granted again");
}

/*
 * What reaches stderr: the threshold and journal fd log_init gets (JOURNAL_STREAM set first where given), what is
 * logged, then the output exactly, or (out NULL) its line count, a part it has and one it lacks (NULL: none).
 */
static const struct output_row {
	const char *name;
	int level, journal_fd;
	const char *journal_stream;
	void (*emit)(void);
	const char *out;
	unsigned lines;
	const char *has, *lacks;
} output_rows[] = {
	{ "the info threshold hides debug", LOG_INFO, 0, NULL, emit_debug_and_info, .out = "pinbrokerd: shown 2\n" },
	{ "the debug threshold shows debug", LOG_DEBUG, 0, NULL, emit_debug, .out = "pinbrokerd: detail\n" },
	{ "the warning threshold hides info and events below", LOG_WARNING, 0, NULL, emit_info_event_and_warning,
	  .out = "pinbrokerd: warning: careful\n" },
	{ "warn appends strerror and keeps errno", LOG_INFO, 0, NULL, emit_warn_keeping_errno,
	  .out = "pinbrokerd: warning: open /x: No such file or directory\n" },
	{ "trailing newlines are dropped", LOG_INFO, 0, NULL, emit_with_newline, .out = "pinbrokerd: a.conf:3: bad\n" },
	{ "a journal stream of another file means stderr", LOG_INFO, -1, "1:1", emit_to_stderr,
	  .out = "pinbrokerd: to stderr\n" },
	{ "an event burst is cut at the limit", LOG_INFO, 0, NULL, emit_30_refused, .lines = LOG_RATELIMIT_BURST,
	  .has = "pinbrokerd: refused 0\n", .lacks = "refused 20\n" },
	{ "events below the threshold do not use up the limit", LOG_INFO, 0, NULL, emit_50_debug_events_then_info,
	  .out = "pinbrokerd: loud\n" },
	{ "suppressed events are reported when the window ends", LOG_INFO, 0, NULL,
	  emit_5_suppressed_then_after_the_window, .lines = LOG_RATELIMIT_BURST + 2,
	  .has = "pinbrokerd: 5 messages of kind lease-refused suppressed\n"
		 "pinbrokerd: granted\n" },
	{ "the suppressed count waits for the end of the window", LOG_INFO, 0, NULL,
	  emit_3_suppressed_then_around_the_end, .lines = LOG_RATELIMIT_BURST + 4,
	  .has = "pinbrokerd: granted early\n"
		 "pinbrokerd: 3 messages of kind lease-refused suppressed\n"
		 "pinbrokerd: granted late\n"
		 "pinbrokerd: granted again\n" },
};

START_TEST(test_output_rows)
{
	const struct output_row *r = &output_rows[_i];
	FILE *f = capture_start();
	char *out;

	if (r->journal_stream)
		setenv("JOURNAL_STREAM", r->journal_stream, 1);
	log_init(r->level, r->journal_fd);
	r->emit();
	out = capture_read(f);
	if (r->out)
		ck_assert_msg(strcmp(out, r->out) == 0, "%s: wrote \"%s\", wanted \"%s\"", r->name, out, r->out);
	else
		ck_assert_msg(count_lines(out) == r->lines, "%s: wrote %u lines, wanted %u:\n%s", r->name,
			      count_lines(out), r->lines, out);
	ck_assert_msg(!r->has || strstr(out, r->has), "%s: no \"%s\" in:\n%s", r->name, r->has, out);
	ck_assert_msg(!r->lacks || !strstr(out, r->lacks), "%s: \"%s\" in:\n%s", r->name, r->lacks, out);
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
		   test_ratelimit_new_window_reports_unflushed_count, test_ratelimit_kinds_are_independent);

	tc = CHECK_CASE(s, "output", NULL, NULL, TIMEOUT_S, test_level_from_string_knows_syslog_names,
			test_default_level_is_info);
	tcase_add_loop_test(tc, test_output_rows, 0, (int)(sizeof(output_rows) / sizeof(output_rows[0])));
	tcase_add_exit_test(tc, test_fatalx_exits_1, 1);
	tcase_add_exit_test(tc, test_fatal_exits_1, 1);
	return s;
}

CHECK_MAIN(log_suite)

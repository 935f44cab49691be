/* SPDX-License-Identifier: MIT */
/* The one main() every Check suite shares: fork mode on, normal output, exit status from the failures. */
#pragma once

#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ctest's SKIP_RETURN_CODE for suites that can skip (tests/CMakeLists.txt sets it). */
#define CHECK_EXIT_SKIPPED 77

/* Why some tests were left out of the suite, or "" when none were. */
static char check_skipped[512];

/*
 * Called while building the Suite, in place of adding tests that cannot run here: the tests that
 * can run still run, and a suite with no failures then exits CHECK_EXIT_SKIPPED with the reason,
 * so ctest reports it skipped rather than passed. (Check has no skip: a test's child cannot tell
 * the parent, so the choice is made before the run.)
 */
static inline __attribute__((format(printf, 1, 2))) void check_skip(const char *fmt, ...)
{
	size_t n = strnlen(check_skipped, sizeof(check_skipped));
	va_list ap;

	if (n > 0 && n < sizeof(check_skipped) - 2) {
		check_skipped[n++] = ';';
		check_skipped[n++] = ' ';
	}
	va_start(ap, fmt);
	vsnprintf(check_skipped + n, sizeof(check_skipped) - n, fmt, ap);
	va_end(ap);
}

/*
 * Adds a tcase to s: its name, its checked fixture (setup, teardown; either may be NULL), its Check
 * timeout in seconds (0: Check's default), and its tests, NULL-terminated, each a loop test over _i in
 * [0, loops) when loops >= 0. Returns it for what is not a plain test (tags, exit and signal tests).
 * CHECK_CASE(s, "case", setup, teardown, 60, test_a, test_b) lists the tests as arguments;
 * CHECK_LOOP_CASE(s, "case", setup, teardown, 60, loops, test_a, test_b) the same, each over loops rows.
 */
static inline TCase *check_add_loop_case(Suite *s, const char *name, void (*setup)(void), void (*teardown)(void),
					 double timeout_s, int loops, const TTest *const *tests)
{
	TCase *tc = tcase_create(name);

	if (setup || teardown)
		tcase_add_checked_fixture(tc, setup, teardown);
	if (timeout_s > 0) /* else Check's default */
		tcase_set_timeout(tc, timeout_s);
	for (; *tests; tests++) {
		if (loops >= 0)
			tcase_add_loop_test(tc, *tests, 0, loops);
		else
			tcase_add_test(tc, *tests);
	}
	suite_add_tcase(s, tc);
	return tc;
}

static inline TCase *check_add_case(Suite *s, const char *name, void (*setup)(void), void (*teardown)(void),
				    double timeout_s, const TTest *const *tests)
{
	return check_add_loop_case(s, name, setup, teardown, timeout_s, -1, tests);
}

#define CHECK_CASE(s, name, setup, teardown, timeout_s, ...) \
	check_add_case(s, name, setup, teardown, timeout_s, (const TTest *const[]){ __VA_ARGS__, NULL })
#define CHECK_LOOP_CASE(s, name, setup, teardown, timeout_s, loops, ...) \
	check_add_loop_case(s, name, setup, teardown, timeout_s, loops, (const TTest *const[]){ __VA_ARGS__, NULL })

/* A suite of one tcase, the common case: CHECK_SUITE(fn, "suite", "case", ...as CHECK_CASE) defines fn for CHECK_MAIN. */
#define CHECK_SUITE(fn, name, case_name, setup, teardown, timeout_s, ...)          \
	static Suite *fn(void)                                                     \
	{                                                                          \
		Suite *s = suite_create(name);                                     \
                                                                                   \
		CHECK_CASE(s, case_name, setup, teardown, timeout_s, __VA_ARGS__); \
		return s;                                                          \
	}

/* Define CHECK_MAIN(suite_fn) once per suite file, where suite_fn builds the Suite. */
#define CHECK_MAIN(suite_fn)                                                            \
	int main(void)                                                                  \
	{                                                                               \
		SRunner *sr = srunner_create(suite_fn());                               \
		int failed;                                                             \
                                                                                        \
		/* Fork mode: a crashing test fails alone, and fixtures start fresh. */ \
		srunner_set_fork_status(sr, CK_FORK);                                   \
		srunner_run_all(sr, CK_NORMAL);                                         \
		failed = srunner_ntests_failed(sr);                                     \
		srunner_free(sr);                                                       \
		if (failed)                                                             \
			return EXIT_FAILURE;                                            \
		if (check_skipped[0]) {                                                 \
			fprintf(stderr, "SKIPPED: %s\n", check_skipped);                \
			return CHECK_EXIT_SKIPPED;                                      \
		}                                                                       \
		return EXIT_SUCCESS;                                                    \
	}

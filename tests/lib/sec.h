/* SPDX-License-Identifier: MIT */
/* Shared by the security suites: two real uids, dropping to them in children, and a main that skips without root. */
#pragma once

#define _GNU_SOURCE
#include <check.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "itest.h"

/* The two unprivileged uids (and same-numbered gids) every security suite plays. */
#define SEC_UID_A 61001
#define SEC_UID_B 61002

/* In a child: become uid (and gid) with no supplementary groups, or _exit(90). */
static inline void sec_drop_to(uid_t uid)
{
	itest_drop_to(uid);
}

/* How many times needle occurs in hay, without overlaps (log lines, warnings). */
static inline size_t sec_count(const char *hay, const char *needle)
{
	size_t n = 0, len = strlen(needle);
	const char *p = hay;

	while ((p = strstr(p, needle)) != NULL) {
		p += len;
		n++;
	}
	return n;
}

/*
 * A checked fixture's setup: fn() starts the daemon dmn with the given arguments (NULL for none) after
 * daemon_start's small test defaults. SEC_START(start, d, "--revoke-enforce", "none")
 */
#define SEC_START(fn, dmn, ...)                                               \
	static void fn(void)                                                  \
	{                                                                     \
		static const char *const fn##_args[] = { __VA_ARGS__, NULL }; \
                                                                              \
		daemon_start(&(dmn), fn##_args);                              \
	}

/* A checked fixture's teardown: fn() stops the daemon dmn, which must exit cleanly (0). */
#define SEC_STOP(fn, dmn)                                 \
	static void fn(void)                              \
	{                                                 \
		ck_assert_int_eq(daemon_stop(&(dmn)), 0); \
	}

/*
 * main() for a security suite: fork mode, and exit 77 (ctest's SKIP_RETURN_CODE)
 * with a message where the test cannot switch uids.
 */
#define SEC_MAIN(suite_fn)                                                                         \
	int main(void)                                                                             \
	{                                                                                          \
		SRunner *sr;                                                                       \
		int failed;                                                                        \
                                                                                                   \
		if (geteuid() != 0) {                                                              \
			printf("SKIP: %s needs root to run clients as two real uids\n", __FILE__); \
			return 77;                                                                 \
		}                                                                                  \
		sr = srunner_create(suite_fn());                                                   \
		srunner_set_fork_status(sr, CK_FORK);                                              \
		srunner_run_all(sr, CK_NORMAL);                                                    \
		failed = srunner_ntests_failed(sr);                                                \
		srunner_free(sr);                                                                  \
		return failed ? EXIT_FAILURE : EXIT_SUCCESS;                                       \
	}

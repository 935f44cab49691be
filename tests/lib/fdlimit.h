/* SPDX-License-Identifier: MIT */
/* For unit suites that test running out of file descriptors: room for exactly one more. */
#pragma once

#include <check.h>
#include <sys/resource.h>
#include <unistd.h>

/*
 * Lowers RLIMIT_NOFILE's soft limit so that one more descriptor can be opened (the lowest free one, as
 * memfd_create and dup take) and the next fails with EMFILE. The suites run forked, so it ends with the test.
 */
static inline void fdlimit_leave_one(void)
{
	struct rlimit rl;
	int lowest = dup(0);

	ck_assert_int_ge(lowest, 0);
	close(lowest);
	ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	rl.rlim_cur = (rlim_t)lowest + 1;
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
}

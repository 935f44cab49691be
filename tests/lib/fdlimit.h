/* SPDX-License-Identifier: MIT */
/* For suites that count or run out of file descriptors: how many are open, and room for exactly one more. */
#pragma once

#include <check.h>
#include <dirent.h>
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

/* How many descriptors this process has open (the count's own directory fd not included). */
static inline int fdlimit_open_count(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1;
}

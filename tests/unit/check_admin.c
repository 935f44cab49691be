/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the admin verdict (core/admin.c): root or admin-group is an admin only from the daemon's own pid
 * and user namespaces (issue 38 finding 4), and the pidfd fdinfo texts the kernel writes (fs/pidfs.c,
 * pidfd_show_fdinfo) read as the right namespace.
 */
#include <check.h>
#include <errno.h>
#include <string.h>

#include "admin.h"
#include "check_main.h"

static enum admin_verdict verdict(bool root, bool group, enum admin_ns pidns, enum admin_ns userns)
{
	struct admin_facts f = { .root = root, .in_group = group, .pidns = pidns, .userns = userns };

	return admin_decide(&f);
}

START_TEST(test_root_of_the_daemons_namespaces_is_admin)
{
	ck_assert_int_eq(verdict(true, false, ADMIN_NS_SAME, ADMIN_NS_SAME), ADMIN_YES);
	ck_assert_int_eq(verdict(false, true, ADMIN_NS_SAME, ADMIN_NS_SAME), ADMIN_YES);
}
END_TEST

START_TEST(test_root_of_a_container_is_a_tenant)
{
	ck_assert_int_eq(verdict(true, false, ADMIN_NS_OTHER, ADMIN_NS_SAME), ADMIN_OTHER_PIDNS);
	ck_assert_int_eq(verdict(true, false, ADMIN_NS_OTHER, ADMIN_NS_UNKNOWN), ADMIN_OTHER_PIDNS);
	ck_assert_int_eq(verdict(true, false, ADMIN_NS_SAME, ADMIN_NS_OTHER), ADMIN_OTHER_USERNS);
	/* admin-group members set by a pod spec's supplementalGroups are no admins either. */
	ck_assert_int_eq(verdict(false, true, ADMIN_NS_OTHER, ADMIN_NS_SAME), ADMIN_OTHER_PIDNS);
}
END_TEST

START_TEST(test_unknown_namespaces_are_no_admin)
{
	ck_assert_int_eq(verdict(true, false, ADMIN_NS_SAME, ADMIN_NS_UNKNOWN), ADMIN_NS_UNREADABLE);
	ck_assert_int_eq(verdict(true, false, ADMIN_NS_UNKNOWN, ADMIN_NS_SAME), ADMIN_NS_UNREADABLE);
	ck_assert_int_eq(verdict(true, false, ADMIN_NS_UNKNOWN, ADMIN_NS_UNKNOWN), ADMIN_NS_UNREADABLE);
}
END_TEST

START_TEST(test_others_are_not_even_candidates)
{
	struct admin_facts f = { .pidns = ADMIN_NS_SAME, .userns = ADMIN_NS_SAME };

	ck_assert(!admin_candidate(&f));
	ck_assert_int_eq(admin_decide(&f), ADMIN_NO_RIGHTS);
}
END_TEST

static int parse(const char *text, enum admin_ns *ns)
{
	return admin_parse_pidfd_fdinfo(text, strlen(text), ns);
}

START_TEST(test_fdinfo_levels)
{
	enum admin_ns ns = ADMIN_NS_UNKNOWN;

	ck_assert_int_eq(parse("pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t2068\nPid:\t4242\nNSpid:\t4242\n", &ns),
			 0);
	ck_assert_int_eq(ns, ADMIN_NS_SAME);
	/* unshare -pf: its pid here, then 1 in its own namespace. */
	ck_assert_int_eq(parse("Pid:\t4242\nNSpid:\t4242\t1\n", &ns), 0);
	ck_assert_int_eq(ns, ADMIN_NS_OTHER);
	/* Outside this namespace's tree (an ancestor's or a sibling's process). */
	ck_assert_int_eq(parse("Pid:\t0\nNSpid:\t0\n", &ns), 0);
	ck_assert_int_eq(ns, ADMIN_NS_OTHER);
	/* Gone. */
	ck_assert_int_eq(parse("Pid:\t-1\nNSpid:\t-1\n", &ns), 0);
	ck_assert_int_eq(ns, ADMIN_NS_UNKNOWN);
	/* No line ends the text. */
	ck_assert_int_eq(parse("Pid:\t7\nNSpid:\t7\t3", &ns), 0);
	ck_assert_int_eq(ns, ADMIN_NS_OTHER);
}
END_TEST

START_TEST(test_fdinfo_without_nspid_or_garbage)
{
	enum admin_ns ns;

	ck_assert_int_eq(parse("pos:\t0\nflags:\t02000002\nPid:\t12\n", &ns), -EINVAL);
	ck_assert_int_eq(parse("NSpid:\n", &ns), -EINVAL);
	ck_assert_int_eq(parse("NSpid:\t12x\n", &ns), -EINVAL);
	ck_assert_int_eq(parse("", &ns), -EINVAL);
}
END_TEST

CHECK_SUITE(suite, "admin", "verdict", NULL, NULL, 10, test_root_of_the_daemons_namespaces_is_admin,
	    test_root_of_a_container_is_a_tenant, test_unknown_namespaces_are_no_admin,
	    test_others_are_not_even_candidates, test_fdinfo_levels, test_fdinfo_without_nspid_or_garbage)

CHECK_MAIN(suite)

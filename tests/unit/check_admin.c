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

/* The verdict for a requester's facts: root, in the admin group, and its pid and user namespaces. */
static const struct verdict_row {
	const char *name;
	bool root, group;
	enum admin_ns pidns, userns;
	enum admin_verdict want;
} verdict_rows[] = {
	/* Root, or the admin group, of the daemon's own namespaces is an admin. */
	{ "root of the daemon's namespaces", true, false, ADMIN_NS_SAME, ADMIN_NS_SAME, ADMIN_YES },
	{ "admin group of the daemon's namespaces", false, true, ADMIN_NS_SAME, ADMIN_NS_SAME, ADMIN_YES },
	/* Root of a container is a tenant. */
	{ "root of another pid namespace", true, false, ADMIN_NS_OTHER, ADMIN_NS_SAME, ADMIN_OTHER_PIDNS },
	{ "root of another pid namespace, its user namespace unknown", true, false, ADMIN_NS_OTHER, ADMIN_NS_UNKNOWN,
	  ADMIN_OTHER_PIDNS },
	{ "root of another user namespace", true, false, ADMIN_NS_SAME, ADMIN_NS_OTHER, ADMIN_OTHER_USERNS },
	/* admin-group members set by a pod spec's supplementalGroups are no admins either. */
	{ "admin group in another pid namespace", false, true, ADMIN_NS_OTHER, ADMIN_NS_SAME, ADMIN_OTHER_PIDNS },
	/* Unknown namespaces are no admin. */
	{ "root, user namespace unknown", true, false, ADMIN_NS_SAME, ADMIN_NS_UNKNOWN, ADMIN_NS_UNREADABLE },
	{ "root, pid namespace unknown", true, false, ADMIN_NS_UNKNOWN, ADMIN_NS_SAME, ADMIN_NS_UNREADABLE },
	{ "root, both namespaces unknown", true, false, ADMIN_NS_UNKNOWN, ADMIN_NS_UNKNOWN, ADMIN_NS_UNREADABLE },
};

START_TEST(test_verdict_follows_the_namespaces)
{
	const struct verdict_row *r = &verdict_rows[_i];
	struct admin_facts f = { .root = r->root, .in_group = r->group, .pidns = r->pidns, .userns = r->userns };
	enum admin_verdict v = admin_decide(&f);

	ck_assert_msg(v == r->want, "%s: verdict %d, expected %d", r->name, v, r->want);
}
END_TEST

START_TEST(test_others_are_not_even_candidates)
{
	struct admin_facts f = { .pidns = ADMIN_NS_SAME, .userns = ADMIN_NS_SAME };

	ck_assert(!admin_candidate(&f));
	ck_assert_int_eq(admin_decide(&f), ADMIN_NO_RIGHTS);
}
END_TEST

/*
 * What a pidfd's fdinfo text (fs/pidfs.c, pidfd_show_fdinfo) says of the process's pid namespace: rc 0 and ns, or
 * -EINVAL for a text without a readable NSpid line.
 */
static const struct fdinfo_row {
	const char *name;
	const char *text;
	int rc;
	enum admin_ns ns; /* when rc is 0 */
} fdinfo_rows[] = {
	{ "the daemon's namespace", "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t2068\nPid:\t4242\nNSpid:\t4242\n", 0,
	  ADMIN_NS_SAME },
	/* unshare -pf: its pid here, then 1 in its own namespace. */
	{ "unshare -pf", "Pid:\t4242\nNSpid:\t4242\t1\n", 0, ADMIN_NS_OTHER },
	/* Outside this namespace's tree (an ancestor's or a sibling's process). */
	{ "outside this namespace's tree", "Pid:\t0\nNSpid:\t0\n", 0, ADMIN_NS_OTHER },
	{ "gone", "Pid:\t-1\nNSpid:\t-1\n", 0, ADMIN_NS_UNKNOWN },
	{ "no line ends the text", "Pid:\t7\nNSpid:\t7\t3", 0, ADMIN_NS_OTHER },
	{ "no NSpid line", "pos:\t0\nflags:\t02000002\nPid:\t12\n", -EINVAL, ADMIN_NS_UNKNOWN },
	{ "an empty NSpid", "NSpid:\n", -EINVAL, ADMIN_NS_UNKNOWN },
	{ "a garbled NSpid", "NSpid:\t12x\n", -EINVAL, ADMIN_NS_UNKNOWN },
	{ "an empty text", "", -EINVAL, ADMIN_NS_UNKNOWN },
};

START_TEST(test_fdinfo_tells_the_pid_namespace)
{
	const struct fdinfo_row *r = &fdinfo_rows[_i];
	/* Anything but the expected value, so the parse must write it. */
	enum admin_ns ns = r->ns == ADMIN_NS_UNKNOWN ? ADMIN_NS_SAME : ADMIN_NS_UNKNOWN;
	int rc = admin_parse_pidfd_fdinfo(r->text, strlen(r->text), &ns);

	ck_assert_msg(rc == r->rc, "%s: parse gave %d, expected %d", r->name, rc, r->rc);
	if (rc == 0)
		ck_assert_msg(ns == r->ns, "%s: namespace %d, expected %d", r->name, ns, r->ns);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("admin");
	TCase *tc = CHECK_CASE(s, "verdict", NULL, NULL, 10, test_others_are_not_even_candidates);

	tcase_add_loop_test(tc, test_verdict_follows_the_namespaces, 0, sizeof(verdict_rows) / sizeof(verdict_rows[0]));
	tcase_add_loop_test(tc, test_fdinfo_tells_the_pid_namespace, 0, sizeof(fdinfo_rows) / sizeof(fdinfo_rows[0]));
	return s;
}

CHECK_MAIN(suite)

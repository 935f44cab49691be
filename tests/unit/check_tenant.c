/* SPDX-License-Identifier: MIT */
/* Unit tests for tenant: who the pool may hand a chunk's pages to again, and the NSpid parser. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"
#include "tenant.h"

#define NS_A "id:4097"
#define NS_B "id:4102"

/* Each test's table, made fresh (the checked fixture) and freed after it. */
static struct tenants *t;

static void tenants_setup(void)
{
	ck_assert_int_eq(tenants_new(&t), 0);
}

static void tenants_teardown(void)
{
	tenants_free(t);
}

START_TEST(test_same_uid_namespace_and_cgroup_is_one_tenant)
{
	uint64_t a, b;

	a = tenants_get(t, 0, NS_A, "/system.slice/job.scope", true);
	b = tenants_get(t, 0, NS_A, "/system.slice/job.scope", true);
	ck_assert_uint_ne(a, TENANT_NONE);
	ck_assert_uint_eq(a, b);
	ck_assert_uint_eq(tenants_count(t), 1);
}
END_TEST

START_TEST(test_another_namespace_cgroup_or_uid_is_another_tenant)
{
	uint64_t a, ns, cg, uid;

	a = tenants_get(t, 0, NS_A, "/kubepods/pod1/c1", true);
	ns = tenants_get(t, 0, NS_B, "/kubepods/pod1/c1", true);
	cg = tenants_get(t, 0, NS_A, "/kubepods/pod2/c1", true);
	uid = tenants_get(t, 1000, NS_A, "/kubepods/pod1/c1", true);
	ck_assert_uint_ne(a, ns);
	ck_assert_uint_ne(a, cg);
	ck_assert_uint_ne(a, uid);
	ck_assert_uint_ne(ns, cg);
	ck_assert_uint_eq(tenants_count(t), 4);
}
END_TEST

START_TEST(test_an_unknown_namespace_or_cgroup_is_a_tenant_of_its_own)
{
	uint64_t a, b, c, d;

	a = tenants_get(t, 0, NULL, "/a", true);
	b = tenants_get(t, 0, NULL, "/a", true);
	c = tenants_get(t, 0, NS_A, NULL, true);
	d = tenants_get(t, 0, NS_A, NULL, true);
	ck_assert_uint_ne(a, TENANT_NONE);
	ck_assert_uint_ne(a, b);
	ck_assert_uint_ne(c, d);
	ck_assert_uint_ne(a, c);
	ck_assert_uint_eq(tenants_count(t), 0);
	tenants_put(t, a); /* kept in no entry: nothing to drop, nothing breaks */
}
END_TEST

START_TEST(test_a_tenant_outlives_its_connections_until_many_others_go_idle)
{
	uint64_t a, again, first_idle, later;
	char path[32];

	a = tenants_get(t, 0, NS_A, "/job", true);
	tenants_put(t, a);
	tenants_put(t, a); /* one put too many changes nothing */
	ck_assert_uint_eq(tenants_idle(t), 1);
	/* The job's next process, after the last one went: the same tenant, so its chunks are still warm for it. */
	again = tenants_get(t, 0, NS_A, "/job", true);
	ck_assert_uint_eq(again, a);
	ck_assert_uint_eq(tenants_idle(t), 0);
	tenants_put(t, again);
	first_idle = a;
	/* TENANTS_IDLE_KEPT other idle tenants push it out: its id never comes back. */
	for (unsigned i = 0; i < TENANTS_IDLE_KEPT; i++) {
		snprintf(path, sizeof(path), "/other/%u", i);
		tenants_put(t, tenants_get(t, 0, NS_A, path, true));
	}
	ck_assert_uint_eq(tenants_idle(t), TENANTS_IDLE_KEPT);
	later = tenants_get(t, 0, NS_A, "/job", true);
	ck_assert_uint_ne(later, first_idle);
	ck_assert_uint_gt(later, first_idle);
}
END_TEST

/* An nsfs inode or a cgroup path may name a later namespace or cgroup: such a tenant goes with its last reference. */
START_TEST(test_a_reusable_name_is_forgotten_with_its_last_reference)
{
	uint64_t a, b, later;

	a = tenants_get(t, 0, "ino:4026532500", "id:77", false);
	b = tenants_get(t, 0, "ino:4026532500", "id:77", false);
	ck_assert_uint_eq(a, b); /* while it lives, one tenant */
	tenants_put(t, a);
	tenants_put(t, b);
	ck_assert_uint_eq(tenants_count(t), 0);
	ck_assert_uint_eq(tenants_idle(t), 0);
	/* A new namespace that got the same inode is not the gone one's tenant. */
	later = tenants_get(t, 0, "ino:4026532500", "id:77", false);
	ck_assert_uint_ne(later, a);
	/* Nor is a kept name the same as a reusable one that reads alike. */
	ck_assert_uint_ne(tenants_get(t, 0, "ino:4026532500", "id:77", true), later);
}
END_TEST

START_TEST(test_same_pidns_is_told_only_of_known_tenants)
{
	uint64_t a, cg, ns, unknown;

	a = tenants_get(t, 0, NS_A, "/user.slice/a.scope", true);
	cg = tenants_get(t, 0, NS_A, "/user.slice/b.scope", true);
	ns = tenants_get(t, 0, NS_B, "/user.slice/a.scope", true);
	unknown = tenants_get(t, 0, NULL, "/user.slice/a.scope", true);
	ck_assert(tenants_same_pidns(t, a, a));
	ck_assert(tenants_same_pidns(t, a, cg));
	ck_assert(!tenants_same_pidns(t, a, ns));
	ck_assert(!tenants_same_pidns(t, a, unknown));
	ck_assert(tenants_same_pidns(t, unknown, unknown));
	ck_assert(!tenants_same_pidns(t, TENANT_NONE, TENANT_NONE));
	ck_assert(!tenants_same_pidns(NULL, a, cg));
	/* A dropped entry (a reusable name's last reference) is unknown; the others are still found. */
	{
		uint64_t gone = tenants_get(t, 0, NS_A, "path:/a", false);
		uint64_t after = tenants_get(t, 0, NS_A, "/user.slice/c.scope", true);

		ck_assert(tenants_same_pidns(t, a, after));
		ck_assert(tenants_same_pidns(t, gone, a));
		tenants_put(t, gone);
		ck_assert(!tenants_same_pidns(t, gone, a));
		ck_assert(tenants_same_pidns(t, a, after));
		ck_assert(tenants_same_pidns(t, cg, after));
		ck_assert(!tenants_same_pidns(t, ns, after));
	}
}
END_TEST

START_TEST(test_nspid_counts_the_namespaces)
{
	static const char host[] = "Name:\tpython3\nTgid:\t77\nNSpid:\t77\nNSpgid:\t77\n";
	static const char nested[] = "Name:\tsh\nNSpid:\t4242\t1\nNSsid:\t1\n";
	static const char deep[] = "NSpid:\t900\t12\t1";
	static const char old[] = "Name:\tsh\nPid:\t5\n";
	static const char bad[] = "NSpid:\t12x\t1\n";
	static const char prefix[] = "NSpidx:\t1\n";

	ck_assert_uint_eq(tenant_parse_nspid(host, strlen(host)), 1);
	ck_assert_uint_eq(tenant_parse_nspid(nested, strlen(nested)), 2);
	ck_assert_uint_eq(tenant_parse_nspid(deep, strlen(deep)), 3);
	ck_assert_uint_eq(tenant_parse_nspid(old, strlen(old)), 0);
	ck_assert_uint_eq(tenant_parse_nspid(bad, strlen(bad)), 0);
	ck_assert_uint_eq(tenant_parse_nspid(prefix, strlen(prefix)), 0);
	ck_assert_uint_eq(tenant_parse_nspid("", 0), 0);
}
END_TEST

static Suite *tenant_suite(void)
{
	Suite *s = suite_create("tenant");

	CHECK_CASE(s, "core", tenants_setup, tenants_teardown, 30, test_same_uid_namespace_and_cgroup_is_one_tenant,
		   test_same_pidns_is_told_only_of_known_tenants,
		   test_another_namespace_cgroup_or_uid_is_another_tenant,
		   test_an_unknown_namespace_or_cgroup_is_a_tenant_of_its_own,
		   test_a_tenant_outlives_its_connections_until_many_others_go_idle,
		   test_a_reusable_name_is_forgotten_with_its_last_reference, test_nspid_counts_the_namespaces);
	return s;
}

CHECK_MAIN(tenant_suite)

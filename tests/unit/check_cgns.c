/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for cgroup paths read in a cgroup namespace of the daemon's own (cgns.c), over texts captured in one
 * (tests/fixtures/cgns/README.md): which namespace the daemon is in, its root's host path learned from a setns
 * reading or a host tree mount, and clients' paths resolved to the host's ones quota rules name.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cgns.h"
#include "check_main.h"
#include "fixture.h"

#define CAPTURED_ROOT \
	"/pbx-capture/kubepods.slice/kubepods-pod0c6f1b2a_9d3e_4f5a_8b7c_6d5e4f3a2b1c.slice/cri-containerd-7a1c.scope"
#define CAPTURED_CLIENT                                                                                         \
	"/pbx-capture/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod3e2d1c0b_a9f8_4e7d_8c6b_" \
	"5a4f3e2d1c0b.slice/cri-containerd-9b2d.scope"

/* A fixture's text; each call has its own buffer, so a test may hold a few. */
static const char *fixture(const char *name)
{
	static char texts[4][16384];
	static unsigned next;

	return fixture_text("cgns", name, texts[next++ % 4], sizeof(texts[0]));
}

static struct cgns private_ns(const char *root)
{
	struct cgns ns = { .mode = CGNS_PRIVATE };

	snprintf(ns.root, sizeof(ns.root), "%s", root);
	return ns;
}

START_TEST(test_ups_split_what_the_kernel_writes)
{
	const char *rest;
	unsigned ups;

	ck_assert_int_eq(cgns_ups("/../../kubepods.slice/x", &ups, &rest), 0);
	ck_assert_uint_eq(ups, 2);
	ck_assert_str_eq(rest, "kubepods.slice/x");
	ck_assert_int_eq(cgns_ups("/../..", &ups, &rest), 0);
	ck_assert_uint_eq(ups, 2);
	ck_assert_str_eq(rest, "");
	ck_assert_int_eq(cgns_ups("/", &ups, &rest), 0);
	ck_assert_uint_eq(ups, 0);
	ck_assert_int_eq(cgns_ups("/a/b", &ups, &rest), 0);
	ck_assert_uint_eq(ups, 0);
	ck_assert_str_eq(rest, "a/b");
	/* A name that only starts with dots is a name. */
	ck_assert_int_eq(cgns_ups("/..a/b", &ups, &rest), 0);
	ck_assert_uint_eq(ups, 0);
	/* The kernel never writes a climb after a name, nor a relative path. */
	ck_assert_int_eq(cgns_ups("/a/../b", &ups, &rest), -EINVAL);
	ck_assert_int_eq(cgns_ups("/../a/..", &ups, &rest), -EINVAL);
	ck_assert_int_eq(cgns_ups("../a", &ups, &rest), -EINVAL);
}
END_TEST

/* Which cgroup namespace pid 1's /proc/1/cgroup text says the daemon is in. */
static const struct detect_row {
	const char *name;
	const char *fixture; /* tests/fixtures/cgns/<fixture>, or NULL: text */
	const char *text;
	int rc;
	enum cgns_mode mode; /* when rc is 0 */
} detect_rows[] = {
	/* Captured: pid 1 is four levels above the reader's namespace root. */
	{ "containerd, pid 1 outside", "containerd-v2/pid1", NULL, 0, CGNS_UNRESOLVED },
	/* On the hybrid host the memory line decides, as for clients. */
	{ "hybrid host, pid 1 outside", "hybrid-v1-memory/pid1", NULL, 0, CGNS_UNRESOLVED },
	/* systemd's pid 1 read from the host's namespace, and a container's own init (no hostPID). */
	{ "systemd's pid 1", NULL, "0::/init.scope\n", 0, CGNS_HOST },
	{ "a container's own init", NULL, "0::/\n", 0, CGNS_HOST },
	{ "an empty text", NULL, "", -ENOENT, CGNS_HOST },
};

START_TEST(test_pid1_outside_means_a_namespace_of_our_own)
{
	const struct detect_row *r = &detect_rows[_i];
	/* Anything but the expected mode, so a detect must write it. */
	enum cgns_mode m = r->mode == CGNS_PRIVATE ? CGNS_HOST : CGNS_PRIVATE;
	int rc = cgns_detect(r->fixture ? fixture(r->fixture) : r->text, &m);

	ck_assert_msg(rc == r->rc, "%s: detect gave %d, expected %d", r->name, rc, r->rc);
	if (rc == 0)
		ck_assert_msg(m == r->mode, "%s: mode %d, expected %d", r->name, m, r->mode);
}
END_TEST

START_TEST(test_root_from_a_setns_reading)
{
	char root[JOBS_PATH_MAX], self[JOBS_PATH_MAX], host[JOBS_PATH_MAX];

	ck_assert_int_eq(jobs_proc_cgroup_raw(fixture("containerd-v2/self"), self, sizeof(self), NULL), 0);
	ck_assert_int_eq(jobs_proc_cgroup_raw(fixture("containerd-v2/self-host"), host, sizeof(host), NULL), 0);
	ck_assert_int_eq(cgns_root_from_self(host, self, root, sizeof(root)), 0);
	ck_assert_str_eq(root, CAPTURED_ROOT);
	/* A daemon that moved below its root after the namespace was made: its own path comes off the end. */
	ck_assert_int_eq(cgns_root_from_self("/k/pod/ctr/init", "/init", root, sizeof(root)), 0);
	ck_assert_str_eq(root, "/k/pod/ctr");
	ck_assert_int_eq(cgns_root_from_self("/a/b", "/a/b", root, sizeof(root)), 0);
	ck_assert_str_eq(root, "/");
	/* Whole components only, and nothing that climbs. */
	ck_assert_int_eq(cgns_root_from_self("/k/xinit", "/init", root, sizeof(root)), -EINVAL);
	ck_assert_int_eq(cgns_root_from_self("/k/ctr", "/other", root, sizeof(root)), -EINVAL);
	ck_assert_int_eq(cgns_root_from_self("/../k", "/", root, sizeof(root)), -EINVAL);
	ck_assert_int_eq(cgns_root_from_self("/k", "/../k", root, sizeof(root)), -EINVAL);
	ck_assert_int_eq(cgns_root_from_self("/a/bb", "/", root, 4), -EINVAL);
}
END_TEST

START_TEST(test_host_mount_is_the_highest_climbing_one)
{
	char mnt[256];
	unsigned ups = 0;

	/* Captured: the namespace's own cgroup2 (root "/") is not it; the host's unified mount and the bind of it
	 * both climb four levels, and the first is taken. */
	ck_assert_int_eq(cgns_find_host_mount(fixture("containerd-v2/mountinfo"), false, 0, mnt, sizeof(mnt), &ups), 0);
	ck_assert_str_eq(mnt, "/sys/fs/cgroup/unified");
	ck_assert_uint_eq(ups, 4);
	/* Clients charged on v1's memory hierarchy: its mount, two levels up. */
	ck_assert_int_eq(cgns_find_host_mount(fixture("hybrid-v1-memory/mountinfo"), true, 0, mnt, sizeof(mnt), &ups),
			 0);
	ck_assert_str_eq(mnt, "/sys/fs/cgroup/memory");
	ck_assert_uint_eq(ups, 2);
	/* A container runtime's layout: its own cgroup2 at /sys/fs/cgroup, a hostPath at a name with a blank. */
	ck_assert_int_eq(cgns_find_host_mount("1 0 0:5 / / rw - ext4 /dev/x rw\n"
					      "2 1 0:37 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n"
					      "3 1 0:37 /../../.. /host/sys/fs\\040cg ro,nosuid master:9 - cgroup2 "
					      "cgroup2 rw,nsdelegate\n"
					      "4 1 0:37 /../x /sibling ro - cgroup2 cgroup2 rw\n",
					      false, 0, mnt, sizeof(mnt), &ups),
			 0);
	ck_assert_str_eq(mnt, "/host/sys/fs cg");
	ck_assert_uint_eq(ups, 3);
	/* Only the namespace's own mount, or a sibling subtree: none. A v1 mount without memory is not it. */
	ck_assert_int_eq(cgns_find_host_mount("2 1 0:37 / /sys/fs/cgroup ro - cgroup2 cgroup rw\n"
					      "4 1 0:37 /../x /sibling ro - cgroup2 cgroup2 rw\n"
					      "5 1 0:38 /../.. /v1 ro - cgroup cgroup rw,cpu\n",
					      false, 0, mnt, sizeof(mnt), &ups),
			 -ENOENT);
	ck_assert_int_eq(cgns_find_host_mount("5 1 0:38 /../.. /v1 ro - cgroup cgroup rw,cpu\n", true, 0, mnt,
					      sizeof(mnt), &ups),
			 -ENOENT);
	ck_assert_int_eq(cgns_find_host_mount("garbage\n\n- - -\n", false, 0, mnt, sizeof(mnt), &ups), -ENOENT);
	ck_assert_int_eq(cgns_find_host_mount(fixture("containerd-v2/mountinfo"), false, 0, mnt, 8, &ups),
			 -ENAMETOOLONG);
}
END_TEST

START_TEST(test_a_mount_short_of_the_hosts_root_is_no_host_tree)
{
	struct cgns ns = { .mode = CGNS_PRIVATE, .root = CAPTURED_ROOT };
	char mnt[256], prefix[JOBS_PATH_MAX];
	unsigned depth = 0, ups = 0;

	/* Pid 1 as the reader reads it: the host's root is as many levels up as its path climbs. */
	ck_assert_int_eq(cgns_host_depth(fixture("containerd-v2/pid1"), &depth), 0);
	ck_assert_uint_eq(depth, 4);
	ck_assert_int_eq(cgns_host_depth(fixture("hybrid-v1-memory/pid1"), &depth), 0);
	ck_assert_uint_eq(depth, 2);
	ck_assert_int_eq(cgns_host_depth("0::/../../init.scope\n", &depth), 0);
	ck_assert_uint_eq(depth, 2);
	ck_assert_int_eq(cgns_host_depth("0::/init.scope\n", &depth), 0);
	ck_assert_uint_eq(depth, 0);
	ck_assert_int_eq(cgns_host_depth("", &depth), -ENOENT);
	/* The whole host tree climbs all the way: taken. */
	ck_assert_int_eq(cgns_find_host_mount(fixture("containerd-v2/mountinfo"), false, 4, mnt, sizeof(mnt), &ups), 0);
	ck_assert_str_eq(mnt, "/sys/fs/cgroup/unified");
	ck_assert_uint_eq(ups, 4);
	ck_assert_int_eq(cgns_find_host_mount(fixture("hybrid-v1-memory/mountinfo"), true, 2, mnt, sizeof(mnt), &ups),
			 0);
	ck_assert_uint_eq(ups, 2);
	/* A hostPath of the host's /sys/fs/cgroup/pbx-capture/kubepods.slice, not /sys/fs/cgroup: it climbs 2 of the
	 * 4 levels, so naming clients from it would drop "/pbx-capture/kubepods.slice". Refused, and said which. */
	ck_assert_int_eq(cgns_find_host_mount(fixture("partial-hostpath/mountinfo"), false, 4, mnt, sizeof(mnt), &ups),
			 -ERANGE);
	ck_assert_str_eq(mnt, "/tmp/cgcap-mnt/host");
	ck_assert_uint_eq(ups, 2);
	/* With the root known (setns), the prefix the partial mount lacks. */
	ck_assert_int_eq(cgns_mount_root(&ns, ups, prefix, sizeof(prefix)), 0);
	ck_assert_str_eq(prefix, "/pbx-capture/kubepods.slice");
	ck_assert_int_eq(cgns_mount_root(&ns, 4, prefix, sizeof(prefix)), 0);
	ck_assert_str_eq(prefix, "/");
	ck_assert_int_eq(cgns_mount_root(&ns, 5, prefix, sizeof(prefix)), -ERANGE);
	ck_assert_int_eq(cgns_mount_root(&ns, 0, prefix, 8), -EINVAL);
	ns.mode = CGNS_UNRESOLVED;
	ck_assert_int_eq(cgns_mount_root(&ns, 1, prefix, sizeof(prefix)), -EINVAL);
	/* A shorter climb never wins over one that reaches the host's root, whichever comes first. */
	ck_assert_int_eq(cgns_find_host_mount("2 1 0:37 /../.. /part ro - cgroup2 cgroup2 rw\n"
					      "3 1 0:37 /../../.. /whole ro - cgroup2 cgroup2 rw\n"
					      "4 1 0:37 /.. /part2 ro - cgroup2 cgroup2 rw\n",
					      false, 3, mnt, sizeof(mnt), &ups),
			 0);
	ck_assert_str_eq(mnt, "/whole");
	ck_assert_uint_eq(ups, 3);
}
END_TEST

START_TEST(test_procs_lists_the_reader)
{
	ck_assert(cgns_procs_has(fixture("containerd-v2/procs"), 30719));
	ck_assert(!cgns_procs_has(fixture("containerd-v2/procs"), 3071));
	ck_assert(!cgns_procs_has(fixture("containerd-v2/procs"), 307190));
	ck_assert(!cgns_procs_has("", 1));
	ck_assert(cgns_procs_has("1\n22\n333", 333));
}
END_TEST

START_TEST(test_a_client_of_another_pod_resolves_to_its_host_path)
{
	struct cgns ns = private_ns(CAPTURED_ROOT);
	char out[JOBS_PATH_MAX];
	bool v1 = true;

	ck_assert_int_eq(cgns_client_cgroup(&ns, fixture("containerd-v2/client"), out, sizeof(out), &v1), 0);
	ck_assert_str_eq(out, CAPTURED_CLIENT);
	ck_assert(!v1);
	/* The daemon itself, and a process below its root. */
	ck_assert_int_eq(cgns_client_cgroup(&ns, fixture("containerd-v2/self"), out, sizeof(out), NULL), 0);
	ck_assert_str_eq(out, CAPTURED_ROOT);
	ck_assert_int_eq(cgns_resolve(&ns, "/sub", out, sizeof(out)), 0);
	ck_assert_str_eq(out, CAPTURED_ROOT "/sub");
	/* pid 1 (captured "/../../../.."): the host's root. */
	ck_assert_int_eq(cgns_client_cgroup(&ns, fixture("containerd-v2/pid1"), out, sizeof(out), NULL), 0);
	ck_assert_str_eq(out, "/");
	ck_assert_int_eq(cgns_resolve(&ns, "/../../../../init.scope", out, sizeof(out)), 0);
	ck_assert_str_eq(out, "/init.scope");
	/* Above the host's root, or a path the kernel never writes. */
	ck_assert_int_eq(cgns_resolve(&ns, "/../../../../../x", out, sizeof(out)), -ERANGE);
	ck_assert_int_eq(cgns_resolve(&ns, "/a/../b", out, sizeof(out)), -EINVAL);
	ck_assert_int_eq(cgns_resolve(&ns, "/../a b", out, sizeof(out)), -EINVAL);
	/* It must fit. */
	ck_assert_int_eq(cgns_client_cgroup(&ns, fixture("containerd-v2/client"), out, 40, NULL), -EINVAL);
	/* A namespace rooted at the host's "/" (a setns reading of "/"): paths pass through. */
	ns = private_ns("/");
	ck_assert_int_eq(cgns_resolve(&ns, "/a/b", out, sizeof(out)), 0);
	ck_assert_str_eq(out, "/a/b");
	ck_assert_int_eq(cgns_resolve(&ns, "/../a", out, sizeof(out)), -ERANGE);
}
END_TEST

START_TEST(test_hybrid_host_resolves_on_the_memory_line)
{
	/* The hybrid capture's reader: memory cgroup /process_api/HASH; a sibling client there. */
	struct cgns ns = private_ns("/process_api/90d7f5b095644e4b51e791217c1b8a65");
	char out[JOBS_PATH_MAX];
	bool v1 = false;

	ck_assert_int_eq(cgns_client_cgroup(&ns, "4:memory:/../other\n0::/../../../../x\n", out, sizeof(out), &v1), 0);
	ck_assert_str_eq(out, "/process_api/other");
	ck_assert(v1);
}
END_TEST

START_TEST(test_without_a_root_a_climbing_path_has_no_name)
{
	struct cgns ns = { .mode = CGNS_UNRESOLVED };
	char out[JOBS_PATH_MAX];

	ck_assert_int_eq(cgns_client_cgroup(&ns, fixture("containerd-v2/client"), out, sizeof(out), NULL), -ENXIO);
	/* Inside the namespace: its own name for it, the best there is. */
	ck_assert_int_eq(cgns_resolve(&ns, "/sub", out, sizeof(out)), 0);
	ck_assert_str_eq(out, "/sub");
	/* In the host's namespace nothing climbs; if something does, pid 1 was not the host's: no name either. */
	ns.mode = CGNS_HOST;
	ck_assert_int_eq(cgns_resolve(&ns, "/kubepods.slice/p", out, sizeof(out)), 0);
	ck_assert_str_eq(out, "/kubepods.slice/p");
	ck_assert_int_eq(cgns_resolve(&ns, "/../p", out, sizeof(out)), -ENXIO);
	ck_assert_str_eq(cgns_mode_name(CGNS_HOST), "host");
	ck_assert_str_eq(cgns_mode_name(CGNS_PRIVATE), "private");
	ck_assert_str_eq(cgns_mode_name(CGNS_UNRESOLVED), "unresolved");
}
END_TEST

START_TEST(test_host_path_back_to_the_namespace)
{
	struct cgns ns = private_ns("/k/pod/ctr");
	char out[JOBS_PATH_MAX];

	ck_assert_int_eq(cgns_to_ns(&ns, "/k/pod/ctr", out, sizeof(out)), 0);
	ck_assert_str_eq(out, "/");
	ck_assert_int_eq(cgns_to_ns(&ns, "/k/pod/ctr/a", out, sizeof(out)), 0);
	ck_assert_str_eq(out, "/a");
	ck_assert_int_eq(cgns_to_ns(&ns, "/k/pod/ctrx", out, sizeof(out)), -ENXIO);
	ck_assert_int_eq(cgns_to_ns(&ns, "/k/other", out, sizeof(out)), -ENXIO);
	ns.mode = CGNS_HOST;
	ck_assert_int_eq(cgns_to_ns(&ns, "/k/other", out, sizeof(out)), 0);
	ck_assert_str_eq(out, "/k/other");
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("cgns");
	TCase *tc = CHECK_CASE(s, "paths", NULL, NULL, 10, test_ups_split_what_the_kernel_writes,
			       test_root_from_a_setns_reading, test_host_mount_is_the_highest_climbing_one,
			       test_a_mount_short_of_the_hosts_root_is_no_host_tree, test_procs_lists_the_reader,
			       test_a_client_of_another_pod_resolves_to_its_host_path,
			       test_hybrid_host_resolves_on_the_memory_line,
			       test_without_a_root_a_climbing_path_has_no_name, test_host_path_back_to_the_namespace);

	tcase_add_loop_test(tc, test_pid1_outside_means_a_namespace_of_our_own, 0,
			    sizeof(detect_rows) / sizeof(detect_rows[0]));
	return s;
}

CHECK_MAIN(suite)

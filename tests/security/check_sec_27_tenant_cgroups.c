/* SPDX-License-Identifier: MIT */
/*
 * Issue 38, finding 3: one uid is not one tenant. Two processes of one uid and one pid namespace in two cgroups
 * (two jobs, two containers' cgroups): what one wrote into a released lease never reaches the other.
 */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <sys/stat.h>

#include "sec_tenant.h"

static struct daemon d;
static char cg_root[800]; /* the cgroup v2 folder this test runs in, where it may make children */
static char cg_a[840], cg_b[840];

SEC_START(start, d, "--prewarm", "0")
SEC_STOP(stop, d)

/*
 * The cgroup v2 folder of this process (its 0:: line under the cgroup2 mount), if children can be made there:
 * false, with why, when not (no cgroup2 mount, a read-only one, no rights).
 */
static bool find_cgroup_root(char *why, size_t len)
{
	char line[1024], mnt[256] = "", rel[512] = "", probe[840];
	FILE *f = fopen("/proc/self/mountinfo", "r");

	if (!f) {
		snprintf(why, len, "cannot read /proc/self/mountinfo");
		return false;
	}
	while (fgets(line, sizeof(line), f)) {
		char *sep = strstr(line, " - cgroup2 "), *p = line;

		if (!sep)
			continue;
		/* Field 5 is the mount point. */
		for (int i = 0; i < 4 && p; i++)
			p = strchr(p, ' ') ? strchr(p, ' ') + 1 : NULL;
		if (p && sscanf(p, "%255s", mnt) == 1)
			break;
	}
	fclose(f);
	f = fopen("/proc/self/cgroup", "r");
	while (f && fgets(line, sizeof(line), f))
		if (strncmp(line, "0::", 3) == 0 && sscanf(line + 3, "%511s", rel) == 1)
			break;
	if (f)
		fclose(f);
	if (!mnt[0] || !rel[0]) {
		snprintf(why, len, "no cgroup v2 hierarchy is mounted here");
		return false;
	}
	snprintf(cg_root, sizeof(cg_root), "%s%s", mnt, strcmp(rel, "/") == 0 ? "" : rel);
	snprintf(probe, sizeof(probe), "%s/pbsec27-probe.%d", cg_root, (int)getpid());
	if (mkdir(probe, 0755) < 0) {
		snprintf(why, len, "cannot make a child cgroup in %s: %s", cg_root, strerror(errno));
		return false;
	}
	rmdir(probe);
	return true;
}

static void make_cgroups(void)
{
	snprintf(cg_a, sizeof(cg_a), "%s/pbsec27-a.%d", cg_root, (int)getpid());
	snprintf(cg_b, sizeof(cg_b), "%s/pbsec27-b.%d", cg_root, (int)getpid());
	ck_assert_msg(mkdir(cg_a, 0755) == 0, "mkdir %s: %s", cg_a, strerror(errno));
	ck_assert_msg(mkdir(cg_b, 0755) == 0, "mkdir %s: %s", cg_b, strerror(errno));
}

/* Both clients have exited (they were reaped): their cgroups are empty and go. */
static void remove_cgroups(void)
{
	rmdir(cg_a);
	rmdir(cg_b);
}

START_TEST(test_another_cgroup_of_the_same_uid_reads_no_freed_byte)
{
	struct tenant_report ra, rb;
	struct tenant_client_proc a, b;

	make_cgroups();
	a = tenant_client_start(PLACE_CGROUP, cg_a, d.socket, 0, TENANT_MARK_A, true, false, &ra);
	ck_assert_msg(ra.status == 0, "writer failed at step %d: %s", ra.status, strerror(ra.err));
	ck_assert_int_eq(tenant_client_end(&a), 0);
	b = tenant_client_start(PLACE_CGROUP, cg_b, d.socket, TENANT_MARK_A, TENANT_MARK_B, true, false, &rb);
	ck_assert_msg(rb.status == 0, "reader failed at step %d: %s", rb.status, strerror(rb.err));
	ck_assert_int_eq(tenant_client_end(&b), 0);
	ck_assert_msg(rb.seen == 0,
		      "a process of the same uid in another cgroup read %llu of %llu bytes of 0x5A another process "
		      "wrote into its released lease",
		      (unsigned long long)rb.seen, (unsigned long long)TENANT_LEASE_BYTES);
	/* Within one cgroup the pool stays warm: the next process of cgroup b gets b's chunks back as they are. */
	a = tenant_client_start(PLACE_CGROUP, cg_b, d.socket, TENANT_MARK_B, TENANT_MARK_A, true, false, &ra);
	ck_assert_int_eq(ra.status, 0);
	ck_assert_int_eq(tenant_client_end(&a), 0);
	ck_assert_msg(ra.seen == TENANT_LEASE_BYTES, "the same cgroup got %llu of %llu warm bytes back",
		      (unsigned long long)ra.seen, (unsigned long long)TENANT_LEASE_BYTES);
	remove_cgroups();
}
END_TEST

/* After the run: the child cgroups a failed test left (an empty cgroup goes; one in use says EBUSY and stays). */
static void remove_leftovers(void)
{
	DIR *dir = cg_root[0] ? opendir(cg_root) : NULL;
	struct dirent *e;
	char path[1100];

	while (dir && (e = readdir(dir)))
		if (strncmp(e->d_name, "pbsec27-", 8) == 0) {
			snprintf(path, sizeof(path), "%s/%s", cg_root, e->d_name);
			rmdir(path);
		}
	if (dir)
		closedir(dir);
}

static Suite *suite(void)
{
	Suite *s = suite_create("sec_27_tenant_cgroups");
	char why[1100];

	if (find_cgroup_root(why, sizeof(why)))
		CHECK_CASE(s, "core", start, stop, 120, test_another_cgroup_of_the_same_uid_reads_no_freed_byte);
	else
		check_skip("two cgroups of one uid: %s", why);
	return s;
}

int main(void)
{
	SRunner *sr;
	int failed;

	if (geteuid() != 0) {
		printf("SKIP: %s needs root to place clients in cgroups of their own\n", __FILE__);
		return 77;
	}
	sr = srunner_create(suite());
	srunner_set_fork_status(sr, CK_FORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	remove_leftovers();
	if (failed)
		return EXIT_FAILURE;
	if (check_skipped[0]) {
		printf("SKIP: %s\n", check_skipped);
		return CHECK_EXIT_SKIPPED;
	}
	return EXIT_SUCCESS;
}

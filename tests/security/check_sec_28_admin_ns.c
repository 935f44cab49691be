/* SPDX-License-Identifier: MIT */
/*
 * Issue 38 finding 4: uid 0 is an admin only from the daemon's own pid and user namespaces. A root process of a
 * container (unshare -pf, as a pod is) or of a user namespace mapping its root to uid 0 (unshare -U -r) is an
 * ordinary tenant: it may acquire, but not set the budget, revoke another uid's lease, set a quota or list
 * everyone's leases. Host root stays an admin.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pinbroker.h"
#include "sec.h"

#define MiB (1024ull * 1024ull)
#define LEASE_BYTES (4 * MiB)

static struct daemon d;

SEC_START(start, d, "--budget", "64M", "--uid-quota", "64M", "--prewarm", "8M")
SEC_STOP(stop, d)

enum where {
	HOST,   /* the test's own namespaces: the daemon's */
	PIDNS,  /* unshare(CLONE_NEWPID), then a child: pid 1 of a new pid namespace */
	USERNS, /* unshare(CLONE_NEWUSER) mapping uid and gid 0 to 0, as `unshare -U -r` run by root */
};

/* What a probe got: 0 or a negative errno per verb, and how many rows of the holder's uid it was shown. */
struct report {
	int connect, acquire, set, revoke, quota;
	int listed_others;
	int lease_still_there; /* the holder's lease after the revoke attempt, as host root sees it */
};

/* uid A holds one lease until its pipe closes; its id comes back on ids. */
static pid_t holder(uint64_t *id, int *release)
{
	int ids[2], go[2];
	pid_t pid;

	ck_assert_int_eq(pipe(ids), 0);
	ck_assert_int_eq(pipe(go), 0);
	pid = itest_fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE, .label = "sec28-a" };
		pb_client *c;
		pb_lease *l;
		uint64_t lid;
		char b;

		close(ids[0]);
		close(go[1]);
		sec_drop_to(SEC_UID_A);
		if (pb_connect(d.socket, &c) < 0 || pb_acquire(c, LEASE_BYTES, &o, &l) < 0)
			_exit(10);
		lid = pb_lease_id(l);
		if (write(ids[1], &lid, sizeof(lid)) != sizeof(lid))
			_exit(11);
		/* Gone when the test closes go (or dies); a revoke is not answered, so the lease stays counted. */
		if (read(go[0], &b, 1) < 0)
			_exit(12);
		_exit(0);
	}
	close(ids[1]);
	close(go[0]);
	ck_assert_int_eq(read(ids[0], id, sizeof(*id)), (ssize_t)sizeof(*id));
	close(ids[0]);
	*release = go[1];
	return pid;
}

static int count_uid_rows(pb_client *c, uint32_t uid)
{
	struct pb_lease_info *rows;
	uint64_t cur = 0;
	int found = 0;
	size_t n;

	do {
		if (pb_leases_page(c, cur, 0, &rows, &n, &cur) < 0)
			return -1;
		for (size_t i = 0; i < n; i++)
			found += rows[i].uid == uid;
		pb_lease_info_free(rows, n);
	} while (cur);
	return found;
}

/* Every verb, in this process, whatever namespaces it is in. */
static void probe(uint64_t other_id, struct report *r)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE, .label = "sec28-probe" };
	pb_client *c;
	pb_lease *l;

	memset(r, 0, sizeof(*r));
	r->connect = pb_connect(d.socket, &c);
	if (r->connect < 0)
		return;
	r->acquire = pb_acquire(c, LEASE_BYTES, &o, &l);
	if (r->acquire == 0)
		pb_release(c, l);
	r->listed_others = count_uid_rows(c, SEC_UID_A);
	r->set = pb_admin_set(c, "pool-shrink-delay-ms", "29000");
	r->quota = pb_quota_set(c, "/sec28.slice", 8 * MiB, 0, 0, NULL, NULL);
	/* Last: an admin's revoke succeeds, and the case checks that only host root got that far. */
	r->revoke = pb_admin_revoke(c, PB_REVOKE_LEASE, other_id, 0, 60000, NULL, NULL);
	pb_disconnect(c);
}

static bool write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	bool ok;

	if (fd < 0)
		return false;
	ok = write(fd, text, strlen(text)) == (ssize_t)strlen(text);
	close(fd);
	return ok;
}

/* The probe in a child placed as where says; its report, or the test fails (or skips without namespaces). */
static void run_probe(enum where where, uint64_t other_id, struct report *r)
{
	int p[2];
	pid_t pid;
	int st;

	ck_assert_int_eq(pipe(p), 0);
	pid = itest_fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct report rep;
		pid_t inner;

		close(p[0]);
		if (where == USERNS) {
			if (unshare(CLONE_NEWUSER) < 0)
				_exit(77);
			if (!write_file("/proc/self/setgroups", "deny") || !write_file("/proc/self/uid_map", "0 0 1") ||
			    !write_file("/proc/self/gid_map", "0 0 1"))
				_exit(78);
		}
		if (where == PIDNS) {
			if (unshare(CLONE_NEWPID) < 0)
				_exit(77);
			inner = fork();
			if (inner < 0)
				_exit(79);
			if (inner > 0)
				_exit(itest_wait_exit(inner));
			if (getpid() != 1)
				_exit(81);
		}
		probe(other_id, &rep);
		_exit(write(p[1], &rep, sizeof(rep)) == sizeof(rep) ? 0 : 82);
	}
	close(p[1]);
	st = itest_wait_exit(pid);
	if (st == 77) {
		close(p[0]);
		printf("SKIP %s: this kernel or sandbox refuses unshare(%s)\n", where == PIDNS ? "pidns" : "userns",
		       where == PIDNS ? "CLONE_NEWPID" : "CLONE_NEWUSER");
		return;
	}
	ck_assert_msg(st == 0, "probe exited %d", st);
	ck_assert_int_eq(read(p[0], r, sizeof(*r)), (ssize_t)sizeof(*r));
	close(p[0]);
}

static void check_tenant(enum where where)
{
	struct report r = { .connect = 1 };
	uint64_t id;
	int release;
	pid_t h = holder(&id, &release);

	run_probe(where, id, &r);
	if (r.connect == 1) { /* skipped */
		close(release);
		itest_wait_exit(h);
		return;
	}
	ck_assert_int_eq(r.connect, 0);
	ck_assert_msg(r.acquire == 0, "a container's root may acquire as a tenant: %d", r.acquire);
	ck_assert_msg(r.listed_others == 0, "a container's root was shown %d of uid %d's leases", r.listed_others,
		      SEC_UID_A);
	ck_assert_msg(r.set == -EACCES, "a container's root set a daemon setting: %d", r.set);
	ck_assert_msg(r.quota == -EACCES, "a container's root set a quota: %d", r.quota);
	ck_assert_msg(r.revoke < 0, "a container's root revoked uid %d's lease", SEC_UID_A);
	ck_assert_msg(sec_lease_active(d.socket, id), "uid %d's lease was revoked", SEC_UID_A);
	ck_assert_int_eq(pinctl(&d, NULL, "get pool-shrink-delay-ms | grep -q 30000"), 0);
	close(release);
	ck_assert_int_eq(itest_wait_exit(h), 0);
}

START_TEST(test_root_in_new_pid_namespace_is_a_tenant)
{
	check_tenant(PIDNS);
}
END_TEST

START_TEST(test_root_in_new_user_namespace_is_a_tenant)
{
	check_tenant(USERNS);
}
END_TEST

START_TEST(test_host_root_is_admin)
{
	struct report r;
	uint64_t id;
	int release;
	pid_t h = holder(&id, &release);

	run_probe(HOST, id, &r);
	ck_assert_int_eq(r.connect, 0);
	ck_assert_int_eq(r.acquire, 0);
	ck_assert_int_eq(r.listed_others, 1);
	ck_assert_int_eq(r.set, 0);
	ck_assert_int_eq(r.quota, 0);
	ck_assert_int_eq(r.revoke, 0);
	ck_assert(!sec_lease_active(d.socket, id));
	close(release);
	ck_assert_int_eq(itest_wait_exit(h), 0);
}
END_TEST

/* The real tools: pinctl under unshare(1), as an operator would try it. */
START_TEST(test_pinctl_under_unshare_is_refused)
{
	static const char *const how[] = { "-pf --mount-proc", "-U -r", "-U -r -pf --mount-proc" };
	char *out = NULL, *cmd = NULL;

	if (run_capture("unshare -pf --mount-proc true", NULL) != 0 || run_capture("unshare -U -r true", NULL) != 0) {
		printf("SKIP pinctl under unshare: unshare(1) cannot make namespaces here\n");
		return;
	}
	for (size_t i = 0; i < sizeof(how) / sizeof(how[0]); i++) {
		ck_assert_int_ge(asprintf(&cmd, "unshare %s %s --socket '%s' set pool-shrink-delay-ms 29000", how[i],
					  PINCTL_PATH, d.socket),
				 0);
		ck_assert_msg(run_capture(cmd, &out) != 0, "unshare %s pinctl set succeeded:\n%s", how[i], out);
		ck_assert_msg(strstr(out, "own pid and user namespaces") != NULL,
			      "unshare %s pinctl set: the refusal does not say why:\n%s", how[i], out);
		free(out);
		free(cmd);
	}
	/* Host root: the same command is an admin's. */
	ck_assert_msg(pinctl(&d, &out, "set pool-shrink-delay-ms 28000") == 0,
		      "host root: pinctl set pool-shrink-delay-ms 28000: %s", out);
	free(out);
}
END_TEST

/* In the daemon's child: its folder becomes uid B's, then the daemon runs as uid B, without capabilities. */
static void daemon_as_b(void *ud)
{
	const struct daemon *dm = ud;

	if (chown(dm->dir, SEC_UID_B, SEC_UID_B) < 0)
		_exit(91);
	sec_drop_to(SEC_UID_B);
}

/*
 * A daemon that cannot read a root peer's user namespace (no ptrace access to it: another uid, no
 * CAP_SYS_PTRACE) refuses it admin, and says why in a warning.
 */
START_TEST(test_unreadable_namespaces_are_no_admin)
{
	struct daemon dm;
	pb_client *c;
	char *log;

	daemon_prepare(&dm);
	daemon_restart_with(&dm, ITEST_ARGS("--budget", "64M", "--prewarm", "4M", "--lock-memory", "no"), daemon_as_b,
			    &dm);
	ck_assert_int_eq(pb_connect(dm.socket, &c), 0);
	ck_assert_int_eq(pb_admin_set(c, "pool-shrink-delay-ms", "29000"), -EACCES);
	pb_disconnect(c);
	log = daemon_log(&dm);
	ck_assert_msg(strstr(log, "is not admin: its namespaces could not be read") != NULL &&
			      strstr(log, "CAP_SYS_PTRACE") != NULL,
		      "no warning saying why root is not admin:\n%s", itest_tail(log));
	free(log);
	ck_assert_int_eq(daemon_stop(&dm), 0);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("sec_28_admin_ns");

	CHECK_CASE(s, "admin", start, stop, 120, test_host_root_is_admin, test_root_in_new_pid_namespace_is_a_tenant,
		   test_root_in_new_user_namespace_is_a_tenant, test_pinctl_under_unshare_is_refused);
	CHECK_CASE(s, "fail-closed", NULL, NULL, 120, test_unreadable_namespaces_are_no_admin);
	return s;
}

SEC_MAIN(suite)

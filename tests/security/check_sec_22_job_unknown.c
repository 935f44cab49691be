/* SPDX-License-Identifier: MIT */
/*
 * Issue 38, finding 1: a client whose job the daemon cannot read is never silently unlimited. The daemon runs
 * as the shipped unit runs it, a uid of its own, with /proc mounted as ProtectProc= mounts it in the service's
 * mount namespace: hidepid=invisible (the old unit: another uid's /proc/PID/cgroup does not exist for it) or
 * default (the new unit). A quota rule smaller than the request on the client's own cgroup: with /proc hidden
 * the acquire used to be granted, charged to no job; now it is refused, saying why, and counted in STATUS and
 * the metrics, with one warning in the log. With /proc as the unit now mounts it, the job is known and charged.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "sec-unit.h"
#include "sec.h"

#define MiB (1024 * 1024ull)
#define QUOTA "1M"
#define ASK_BYTES (4 * MiB)   /* over the quota */
#define SMALL_BYTES (1 * MiB) /* within it */
/* Acquires by the hidden client, to see the warning come once (rate-limited) and the counter count each. */
#define HIDDEN_ACQUIRES 3

static struct daemon d;
static char job[512]; /* the clients' cgroup (they are this test's children), as the daemon charges it */

/*
 * The cgroup this process is in as job quotas read it (jobs.h): the v1 memory controller's line where there is
 * one, else the unified one. False when it is the root ("/"), on which no rule can be set.
 */
static bool own_cgroup(char *out, size_t len)
{
	char line[1024], unified[1024] = "", memory[1024] = "";
	FILE *f = fopen("/proc/self/cgroup", "re");

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		char *path = strchr(line, ':');

		path = path ? strchr(path + 1, ':') : NULL;
		if (!path)
			continue;
		path[strcspn(path, "\n")] = '\0';
		if (strncmp(line, "0::", 3) == 0)
			snprintf(unified, sizeof(unified), "%s", path + 1);
		else if (strstr(line, ":memory:"))
			snprintf(memory, sizeof(memory), "%s", path + 1);
	}
	fclose(f);
	snprintf(out, len, "%s", memory[0] ? memory : unified);
	return out[0] == '/' && out[1] != '\0';
}

/* The daemon as the old unit ran it ("invisible": hidepid=2, no CAP_SYS_PTRACE) or as the unit runs it now ("off"). */
static void start_as_unit(const char *hidepid, const char *policy, bool rule)
{
	char quota[600];

	snprintf(quota, sizeof(quota), "%s:%s", job, QUOTA);
	daemon_prepare(&d);
	ck_assert_int_eq(chown(d.dir, SEC_UID_DAEMON, SEC_UID_DAEMON), 0);
	daemon_restart_with(&d,
			    ITEST_ARGS("--budget", "64M", "--prewarm", "8M", "--log-level", "info", "--job-unknown",
				       policy, "--job-quota", rule ? quota : ""),
			    sec_as_unit_user,
			    &(struct sec_unit){ .hidepid = hidepid,
						.caps = strcmp(hidepid, "off") ? SEC_UNIT_CAPS_OLD : SEC_UNIT_CAPS });
}

struct result {
	int status;
	char msg[512];
};

/*
 * As uid, connect and acquire size; the reply's status and message into *res. The child keeps its lease until
 * the returned pipe's write end hears a byte (or closes): the caller ends it with release_holder.
 */
static pid_t acquire_as(uid_t uid, uint64_t size, struct result *res, int to_child[2])
{
	int from_child[2];
	pid_t pid = itest_fork_piped(to_child, from_child);

	if (pid == 0) {
		struct result r = { 0 };
		int fd;

		close(to_child[1]);
		close(from_child[0]);
		fd = sec_session_as(uid, d.socket, 80);
		r.status = raw_acquire_msg(fd, size, "sec22", 2, r.msg, sizeof(r.msg), 10000);
		if (write(from_child[1], &r, sizeof(r)) != (ssize_t)sizeof(r))
			_exit(81);
		itest_hear(to_child[0], 120);
		_exit(0);
	}
	close(to_child[0]);
	sec_read_report(from_child, res, sizeof(*res));
	return pid;
}

static void release_holder(pid_t pid, int to_child[2])
{
	itest_say(to_child[1], 'x');
	close(to_child[1]);
	ck_assert_int_eq(itest_wait_exit(pid), 0);
}

static uint64_t unknown_total(uint32_t *clients)
{
	struct pb_status *s = itest_status(d.socket);
	uint64_t n;

	ck_assert_ptr_nonnull(s);
	*clients = pb_status_job_unknown(s, &n);
	pb_status_free(s);
	return n;
}

static double metric(const char *name)
{
	char *out = NULL;
	double v;

	ck_assert_int_eq(pinctl(&d, &out, "metrics"), 0);
	v = itest_metrics_sample(out, name);
	free(out);
	return v;
}

static void setup(void)
{
	if (!own_cgroup(job, sizeof(job))) {
		printf("SKIP: this test runs in the root cgroup (%s), on which no quota rule can be set\n", job);
		exit(77);
	}
}

/* The old unit (ProtectProc=invisible): the daemon cannot read uid A's cgroup; a rule exists; refused. */
START_TEST(test_client_whose_cgroup_is_hidden_is_refused_while_rules_exist)
{
	struct result res[HIDDEN_ACQUIRES];
	int pipes[HIDDEN_ACQUIRES][2];
	pid_t pids[HIDDEN_ACQUIRES];
	uint32_t clients = 0;
	char *log;

	start_as_unit("invisible", "refuse", true);
	for (int i = 0; i < HIDDEN_ACQUIRES; i++)
		pids[i] = acquire_as(SEC_UID_A, ASK_BYTES, &res[i], pipes[i]);
	ck_assert_int_eq(unknown_total(&clients), HIDDEN_ACQUIRES);
	ck_assert_uint_ge(clients, HIDDEN_ACQUIRES); /* and root's STATUS connection: root's /proc is hidden too */
	ck_assert_int_eq(status_leased(d.socket), 0);
	for (int i = 0; i < HIDDEN_ACQUIRES; i++) {
		ck_assert_msg(
			res[i].status == PINBROKER__V1__STATUS_CODE__STATUS_OVER_QUOTA,
			"a client whose job is unknown got status %d (%s), not OVER_QUOTA, under a %s rule on its "
			"cgroup %s",
			res[i].status, res[i].msg, QUOTA, job);
		ck_assert_msg(strstr(res[i].msg, "could not tell which job") &&
				      strstr(res[i].msg, "ProtectProc=default"),
			      "the refusal does not say why and what to do: %s", res[i].msg);
		release_holder(pids[i], pipes[i]);
	}
	ck_assert(metric("pinbroker_job_unknown_total") == HIDDEN_ACQUIRES);
	ck_assert(metric("pinbroker_acquires_refused_total{reason=\"job_quota\"}") == HIDDEN_ACQUIRES);
	log = daemon_log(&d);
	/* One warning for the three (rate-limited), at warning level, naming the fix. */
	ck_assert_msg(sec_count(log, "its job is unknown") == 1, "want one warning, log:\n%s", itest_tail(log));
	ck_assert_ptr_nonnull(strstr(log, "ProtectProc=default"));
	free(log);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* The same with job-unknown = allow: granted and charged to no job, but counted and warned about. */
START_TEST(test_job_unknown_allow_grants_but_counts_and_warns)
{
	struct result res;
	uint32_t clients = 0;
	int pipe_[2];
	pid_t pid;
	char *log;

	start_as_unit("invisible", "allow", true);
	pid = acquire_as(SEC_UID_A, ASK_BYTES, &res, pipe_);
	ck_assert_msg(res.status == 0, "allow: status %d (%s)", res.status, res.msg);
	ck_assert_int_eq(unknown_total(&clients), 1);
	ck_assert_uint_ge(clients, 1);
	log = daemon_log(&d);
	ck_assert_msg(strstr(log, "granted, charged to no job (job-unknown = allow)"), "log:\n%s", itest_tail(log));
	free(log);
	release_holder(pid, pipe_);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* Without quota rules an unknown job changes nothing: nothing to refuse, nothing counted. */
START_TEST(test_hidden_cgroup_without_rules_is_served)
{
	struct result res;
	uint32_t clients = 0;
	int pipe_[2];
	pid_t pid;

	start_as_unit("invisible", "refuse", false);
	pid = acquire_as(SEC_UID_A, ASK_BYTES, &res, pipe_);
	ck_assert_msg(res.status == 0, "no rules: status %d (%s)", res.status, res.msg);
	ck_assert_int_eq(unknown_total(&clients), 0);
	ck_assert_uint_ge(clients, 1); /* still shown: a rule set now would refuse it */
	release_holder(pid, pipe_);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* The unit now (ProtectProc=default): the daemon, not root, reads uid B's cgroup: over quota refused, within charged. */
START_TEST(test_client_of_another_uid_is_charged_to_its_job_under_the_units_proc)
{
	struct result over, within;
	uint32_t clients = 1;
	int p1[2], p2[2];
	pid_t h1, h2;
	char *out = NULL;

	start_as_unit("off", "refuse", true);
	h1 = acquire_as(SEC_UID_B, ASK_BYTES, &over, p1);
	ck_assert_msg(over.status == PINBROKER__V1__STATUS_CODE__STATUS_OVER_QUOTA && strstr(over.msg, "quota (rule"),
		      "over its job's %s quota: status %d (%s)", QUOTA, over.status, over.msg);
	h2 = acquire_as(SEC_UID_B, SMALL_BYTES, &within, p2);
	ck_assert_msg(within.status == 0, "within its job's quota: status %d (%s)", within.status, within.msg);
	ck_assert_int_eq(unknown_total(&clients), 0);
	ck_assert_uint_eq(clients, 0);
	/* pinctl jobs shows the job holding the lease. */
	ck_assert_int_eq(pinctl(&d, &out, "jobs"), 0);
	ck_assert_msg(strstr(out, job) && strstr(out, "1 MiB"), "pinctl jobs:\n%s", out);
	free(out);
	release_holder(h1, p1);
	release_holder(h2, p2);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

static Suite *sec_22_suite(void)
{
	Suite *s = suite_create("sec_22_job_unknown");
	TCase *tc = CHECK_CASE(
		s, "job_unknown", NULL, NULL, 120, test_client_whose_cgroup_is_hidden_is_refused_while_rules_exist,
		test_job_unknown_allow_grants_but_counts_and_warns, test_hidden_cgroup_without_rules_is_served,
		test_client_of_another_uid_is_charged_to_its_job_under_the_units_proc);

	tcase_add_unchecked_fixture(tc, setup, NULL);
	return s;
}

SEC_MAIN(sec_22_suite)

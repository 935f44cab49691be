/* SPDX-License-Identifier: MIT */
/*
 * Integration: who may hold and end reservations on the real daemon. max-reservations-per-uid (a config file
 * setting it to 2) refuses a uid's third reservation with a message naming the limit, its value and what to do,
 * while another uid still reserves and a release makes room; a reload lowering it ends none. A process of the
 * same uid in another job (a fixture /proc/PID/cgroup through --proc-root) may neither release nor revoke a
 * job's reservation; one in the same job may.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_main.h"
#include "itest.h"
#include "pinbroker.h"

#define MSG_MAX 512
#define PAGE 4096
/* A non-root uid for clients when the suite runs as root (root is an admin, who may end any reservation). */
#define OTHER_UID 61001

static struct daemon d;
static char conf_path[300];
static char root[256]; /* the fixture proc root, "" when the real /proc is read */

/* A client process: one connection, driven one command at a time. */
struct client {
	pid_t pid;
	int to, from;
};

struct cmd {
	char op; /* r: reserve name (1 share of a page), x: release id, v: revoke id, l: count listed, q: quit */
	char name[32];
	uint64_t id;
};

struct answer {
	int r;
	uint64_t id; /* r: the reservation; l: how many are listed */
	char msg[MSG_MAX];
};

static void client_child(int to, int from, uid_t uid)
{
	struct answer a;
	struct cmd m;
	pb_client *c = NULL;
	char go;

	if (read(to, &go, 1) != 1)
		_exit(80);
	if (uid)
		itest_drop_to(uid);
	memset(&a, 0, sizeof(a));
	a.r = pb_connect(d.socket, &c);
	if (a.r < 0)
		snprintf(a.msg, sizeof(a.msg), "%s", pb_last_error());
	if (write(from, &a, sizeof(a)) != (ssize_t)sizeof(a) || a.r < 0)
		_exit(81);
	while (read(to, &m, sizeof(m)) == (ssize_t)sizeof(m)) {
		struct pb_reservation_info *rows = NULL;
		uint64_t *ids = NULL;
		size_t n = 0;

		memset(&a, 0, sizeof(a));
		switch (m.op) {
		case 'r':
			a.r = pb_reserve(c, m.name, 1, PAGE, 0, 0, &a.id);
			break;
		case 'x':
			a.r = pb_reservation_release(c, m.id);
			break;
		case 'v':
			a.r = pb_admin_revoke(c, PB_REVOKE_RESERVATION, m.id, 0, 0, &ids, &n);
			free(ids);
			break;
		case 'l':
			a.r = pb_reservations(c, &rows, &n, NULL);
			a.id = n;
			free(rows);
			break;
		default:
			pb_disconnect(c);
			_exit(0);
		}
		if (a.r < 0)
			snprintf(a.msg, sizeof(a.msg), "%s", pb_last_error());
		if (write(from, &a, sizeof(a)) != (ssize_t)sizeof(a))
			_exit(82);
	}
	_exit(0);
}

/* Write root's /proc/PID/cgroup for pid: the job the daemon reads for its connection. */
static void place(pid_t pid, const char *cgroup_text)
{
	char p[400];
	FILE *f;

	snprintf(p, sizeof(p), "%s/proc/%d", root, (int)pid);
	ck_assert_msg(mkdir(p, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", p, strerror(errno));
	snprintf(p, sizeof(p), "%s/proc/%d/cgroup", root, (int)pid);
	f = fopen(p, "w");
	ck_assert_msg(f, "%s: %s", p, strerror(errno));
	fputs(cgroup_text, f);
	ck_assert_int_eq(fclose(f), 0);
}

/* A connected client of uid (0: this process's), in the job of cgroup_text when not NULL (a fixture root). */
static struct client client_start(uid_t uid, const char *cgroup_text)
{
	struct client cl;
	struct answer a;
	int to[2], from[2];

	ck_assert_int_eq(pipe2(to, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(from, O_CLOEXEC), 0);
	cl.pid = itest_fork();
	ck_assert_int_ge(cl.pid, 0);
	if (cl.pid == 0) {
		close(to[1]);
		close(from[0]);
		client_child(to[0], from[1], uid);
	}
	close(to[0]);
	close(from[1]);
	cl.to = to[1];
	cl.from = from[0];
	if (cgroup_text)
		place(cl.pid, cgroup_text);
	ck_assert_int_eq(write(cl.to, "g", 1), 1);
	ck_assert_int_eq(read(cl.from, &a, sizeof(a)), (ssize_t)sizeof(a));
	ck_assert_msg(a.r == 0, "connect: %s", a.msg);
	return cl;
}

static struct answer client_do(struct client *cl, char op, const char *name, uint64_t id)
{
	struct cmd m = { .op = op, .id = id };
	struct answer a;

	snprintf(m.name, sizeof(m.name), "%s", name ? name : "");
	ck_assert_int_eq(write(cl->to, &m, sizeof(m)), (ssize_t)sizeof(m));
	ck_assert_int_eq(read(cl->from, &a, sizeof(a)), (ssize_t)sizeof(a));
	return a;
}

static uint64_t reserve_ok(struct client *cl, const char *name)
{
	struct answer a = client_do(cl, 'r', name, 0);

	ck_assert_msg(a.r == 0, "reserve %s: %d %s", name, a.r, a.msg);
	return a.id;
}

/* Disconnect and wait for the child's exit. */
static void client_end(struct client *cl)
{
	struct cmd m = { .op = 'q' };

	ck_assert_int_eq(write(cl->to, &m, sizeof(m)), (ssize_t)sizeof(m));
	ck_assert_int_eq(itest_wait_exit(cl->pid), 0);
	close(cl->to);
	close(cl->from);
}

/* A refusal at the cap: LIMIT (-EUSERS), the key, its value, the count held, and both ways out. */
static void assert_cap_refusal(const struct answer *a, unsigned cap)
{
	char want[96];

	ck_assert_msg(a->r == -EUSERS, "want -EUSERS, got %d: %s", a->r, a->msg);
	snprintf(want, sizeof(want), "max-reservations-per-uid = %u", cap);
	ck_assert_msg(strstr(a->msg, want), "no '%s' in: %s", want, a->msg);
	snprintf(want, sizeof(want), "holds %u reservations", cap);
	ck_assert_msg(strstr(a->msg, want), "no '%s' in: %s", want, a->msg);
	ck_assert_msg(strstr(a->msg, "pinctl reservations") && strstr(a->msg, "release") &&
			      strstr(a->msg, "pinbrokerd.conf") && strstr(a->msg, "reload"),
		      "the message says no way out: %s", a->msg);
}

static void write_conf(unsigned cap)
{
	FILE *f = fopen(conf_path, "w");

	ck_assert_ptr_nonnull(f);
	fprintf(f, "budget = 64M\nprewarm = 0\nhugetlb = no\nthp = no\nmax-reservations-per-uid = %u\n", cap);
	ck_assert_int_eq(fclose(f), 0);
}

/* ------------------------------------------------------------------ max-reservations-per-uid */

static void start_capped(void)
{
	snprintf(conf_path, sizeof(conf_path), "/tmp/pbreslim.%d.conf", (int)getpid());
	write_conf(2);
	root[0] = '\0';
	daemon_start(&d, ITEST_ARGS("--config", conf_path));
}

static void stop_capped(void)
{
	ck_assert_int_eq(daemon_stop(&d), 0);
	unlink(conf_path);
}

START_TEST(test_third_reservation_of_a_uid_is_refused_naming_the_cap)
{
	struct client a = client_start(0, NULL), a2 = client_start(0, NULL);
	uint64_t first;
	struct answer r;

	first = reserve_ok(&a, "one");
	reserve_ok(&a, "two");
	/* The smallest reservation there is, well within the budget and the uid's quota: only the count refuses. */
	r = client_do(&a, 'r', "three", 0);
	assert_cap_refusal(&r, 2);
	/* The cap is the uid's, not the connection's. */
	r = client_do(&a2, 'r', "three", 0);
	assert_cap_refusal(&r, 2);
	/* A join creates none: another rank joins "one" at the cap. */
	ck_assert_uint_eq(reserve_ok(&a2, "one"), first);
	/* Releasing one makes room for exactly one. */
	r = client_do(&a, 'x', NULL, first);
	ck_assert_msg(r.r == 0, "release: %s", r.msg);
	reserve_ok(&a, "three");
	r = client_do(&a, 'r', "four", 0);
	assert_cap_refusal(&r, 2);
	client_end(&a2);
	client_end(&a);
}
END_TEST

START_TEST(test_reload_lowering_the_cap_ends_none_and_refuses_new)
{
	struct client a = client_start(0, NULL);
	struct answer r;
	char *log;

	reserve_ok(&a, "one");
	reserve_ok(&a, "two");
	write_conf(1);
	ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
	ck_assert_msg(daemon_wait_log(&d, "config reloaded", 10000), "no reload in the log");
	log = daemon_log(&d);
	ck_assert_msg(!strstr(log, "reload rejected"), "reload rejected: %s", itest_tail(log));
	free(log);
	r = client_do(&a, 'l', NULL, 0);
	ck_assert_msg(r.r == 0 && r.id == 2, "after the reload %llu listed (%d %s), want both",
		      (unsigned long long)r.id, r.r, r.msg);
	r = client_do(&a, 'r', "three", 0);
	ck_assert_msg(r.r == -EUSERS && strstr(r.msg, "max-reservations-per-uid = 1"), "got %d: %s", r.r, r.msg);
	client_end(&a);
}
END_TEST

/* Root only: a client dropped to another uid. */
START_TEST(test_another_uid_reserves_while_one_is_at_its_cap)
{
	struct client a = client_start(0, NULL), b;
	struct answer r;

	reserve_ok(&a, "one");
	reserve_ok(&a, "two");
	r = client_do(&a, 'r', "three", 0);
	assert_cap_refusal(&r, 2);
	b = client_start(OTHER_UID, NULL);
	reserve_ok(&b, "one");
	reserve_ok(&b, "two");
	r = client_do(&b, 'r', "three", 0);
	assert_cap_refusal(&r, 2);
	client_end(&b);
	client_end(&a);
}
END_TEST

/* ------------------------------------------------------------------ another job of the same uid */

#define JOB_A "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poda.slice/cri-containerd-a.scope\n"
#define JOB_B "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podb.slice/cri-containerd-b.scope\n"

static void start_jobs(void)
{
	/* Other uids' clients are looked up under it by the daemon (root): the helper makes it 0755. */
	itest_proc_root_start(&d, root, sizeof(root), "pbreslim", NULL,
			      ITEST_ARGS("--budget", "64M", "--prewarm", "0", "--hugetlb", "no", "--thp", "no"));
}

static void stop_jobs(void)
{
	ck_assert_int_eq(daemon_stop(&d), 0);
	itest_proc_root_remove(root);
}

START_TEST(test_same_uid_in_another_job_may_not_end_a_reservation)
{
	/* Non-admins: root would be one, and an admin may end any reservation. */
	uid_t uid = geteuid() == 0 ? OTHER_UID : 0;
	struct client rank = client_start(uid, JOB_A), other = client_start(uid, JOB_B), mate;
	uint64_t id = reserve_ok(&rank, "kv");
	struct answer r;

	/* Same uid, another pod: as if the reservation were not there, and a revoke is denied by name. */
	r = client_do(&other, 'x', NULL, id);
	ck_assert_msg(r.r == -ENOENT, "release from another job: %d %s", r.r, r.msg);
	r = client_do(&other, 'v', NULL, id);
	ck_assert_msg(r.r == -EACCES && strstr(r.msg, "another job"), "revoke from another job: %d %s", r.r, r.msg);
	r = client_do(&rank, 'l', NULL, 0);
	ck_assert_msg(r.r == 0 && r.id == 1, "the reservation is gone (%llu listed)", (unsigned long long)r.id);
	/* Same uid, same job, not a rank of it: may end it. */
	mate = client_start(uid, JOB_A);
	r = client_do(&mate, 'x', NULL, id);
	ck_assert_msg(r.r == 0, "release from its own job: %d %s", r.r, r.msg);
	r = client_do(&rank, 'l', NULL, 0);
	ck_assert_msg(r.r == 0 && r.id == 0, "%llu still listed after its release", (unsigned long long)r.id);
	client_end(&mate);
	client_end(&other);
	client_end(&rank);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("itest_reserve_limits");

	CHECK_CASE(s, "uid_cap", start_capped, stop_capped, 120,
		   test_third_reservation_of_a_uid_is_refused_naming_the_cap,
		   test_reload_lowering_the_cap_ends_none_and_refuses_new);
	if (geteuid() == 0)
		CHECK_CASE(s, "uid_cap_two_uids", start_capped, stop_capped, 120,
			   test_another_uid_reserves_while_one_is_at_its_cap);
	else
		check_skip("another uid reserving beside a capped one needs root to change uid");
	CHECK_CASE(s, "jobs", start_jobs, stop_jobs, 120, test_same_uid_in_another_job_may_not_end_a_reservation);
	return s;
}

CHECK_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/*
 * Issue 38, finding 2: quota rules set with `pinctl quota set` survive a clean stop (SIGTERM), a crash (kill -9,
 * with and without the fd-store stand-in and RUNTIME_DIRECTORY, as systemd starts the unit) and a reload, and
 * still bind afterwards: a uid-61001 client in the job's cgroup is refused past the quota. Clients' cgroups come
 * from a fixture proc root (--proc-root), where a cgroup "exists" while its cgroup.procs file does.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sec.h"

#define MiB (1024ull * 1024ull)
#define MSG_MAX 400

static struct daemon d;
static char root[64]; /* the fixture proc root */
static char rules_path[400];
static uint64_t held_bytes; /* what other clients hold while acquire_in runs (it waits for its own to go) */

/* ------------------------------------------------------------------ the fixture root */

static void write_text(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);

	ck_assert_msg(fd >= 0, "open %s: %s", path, strerror(errno));
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	ck_assert_int_eq(fchmod(fd, mode), 0);
	close(fd);
}

/* The cgroup cg (a path as /proc/PID/cgroup writes it) exists in the fixture root, or not. */
static void cgroup_exists(const char *cg, bool yes)
{
	char p[512], cmd[600];

	snprintf(p, sizeof(p), "%s/sys/fs/cgroup%s", root, cg);
	if (!yes) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", p);
		ck_assert_int_eq(system(cmd), 0);
		return;
	}
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", p);
	ck_assert_int_eq(system(cmd), 0);
	snprintf(p, sizeof(p), "%s/sys/fs/cgroup%s/cgroup.procs", root, cg);
	write_text(p, "", 0644);
}

static const char *const *args(void)
{
	static const char *const a[] = { "--proc-root", root, "--budget", "64M", "--prewarm", "0", NULL };

	return a;
}

static void setup(void)
{
	itest_proc_root(root, sizeof(root), "pbsec24", NULL);
	daemon_prepare(&d);
	snprintf(rules_path, sizeof(rules_path), "%s.quota-rules", d.socket);
	daemon_restart(&d, args());
}

static void teardown(void)
{
	if (daemon_alive(&d))
		ck_assert_int_eq(daemon_stop(&d), 0);
	else
		sec_rm_rf(d.dir);
	sec_rm_rf(root);
}

/* ------------------------------------------------------------------ clients in a job */

struct tries {
	int r[2];
	char msg[2][MSG_MAX];
};

/*
 * A uid-61001 client in cgroup cg (its /proc/PID/cgroup in the fixture root) that acquires first, then second
 * more bytes while it holds the first, then exits: what each acquire returned.
 */
static struct tries acquire_in(const char *cg, uint64_t first, uint64_t second)
{
	static const struct pb_acquire_opts opts = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE,
						     .label = "sec24" };
	int go[2], rep[2];
	struct tries t;
	char p[300], text[400];
	pid_t pid;

	memset(&t, 0, sizeof(t));
	ck_assert_int_eq(pipe2(go, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(rep, O_CLOEXEC), 0);
	pid = itest_fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		pb_client *c;
		pb_lease *l[2] = { NULL, NULL };
		uint64_t size[2] = { first, second };
		char g;

		if (read(go[0], &g, 1) != 1)
			_exit(80);
		sec_drop_to(SEC_UID_A);
		t.r[0] = t.r[1] = pb_connect(d.socket, &c);
		for (int i = 0; i < 2 && t.r[0] == 0; i++) {
			t.r[i] = pb_acquire(c, size[i], &opts, &l[i]);
			snprintf(t.msg[i], MSG_MAX, "%s", t.r[i] ? pb_last_error() : "");
		}
		if (write(rep[1], &t, sizeof(t)) != (ssize_t)sizeof(t))
			_exit(81);
		_exit(0);
	}
	snprintf(p, sizeof(p), "%s/proc/%d", root, (int)pid);
	ck_assert_int_eq(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/proc/%d/cgroup", root, (int)pid);
	snprintf(text, sizeof(text), "0::%s\n", cg);
	write_text(p, text, 0644);
	ck_assert_int_eq(write(go[1], "g", 1), 1);
	ck_assert_int_eq(read(rep[0], &t, sizeof(t)), (ssize_t)sizeof(t));
	ck_assert_int_eq(itest_wait_exit(pid), 0);
	close(go[0]);
	close(go[1]);
	close(rep[0]);
	close(rep[1]);
	ck_assert_int_eq(wait_leased(d.socket, (int64_t)held_bytes, 10000), (int64_t)held_bytes);
	return t;
}

/* job_1's 8 MiB quota binds: 6 MiB granted, 4 MiB more refused for the quota; the pods' 4 MiB glob too. */
static void rules_bind(const char *when)
{
	struct tries t = acquire_in("/jobs/job_1/step_0", 6 * MiB, 4 * MiB);

	ck_assert_msg(t.r[0] == 0, "%s: 6 MiB in job_1 (quota 8 MiB): %s", when, t.msg[0]);
	ck_assert_msg(t.r[1] == -EDQUOT && strstr(t.msg[1], "quota"),
		      "%s: 4 MiB more in job_1 must be refused for its 8 MiB quota, got %d: %s", when, t.r[1],
		      t.msg[1]);
	t = acquire_in("/pods/pod_a/ctr", 4 * MiB, 1 * MiB);
	ck_assert_msg(t.r[0] == 0 && t.r[1] == -EDQUOT, "%s: pod_a's 4 MiB glob quota: %d %d: %s", when, t.r[0], t.r[1],
		      t.msg[1]);
}

/* ------------------------------------------------------------------ the rules as the daemon shows them */

/* The rules as pb_quota_list shows them: "PATTERN BYTES SOURCE[ seen]" lines, sorted by nothing (the daemon's order). */
static char *rules_now(void)
{
	struct pb_quota_rule *rules = NULL;
	size_t n = 0, at = 0;
	char *text = malloc(65536);
	pb_client *c;

	ck_assert_ptr_nonnull(text);
	text[0] = '\0';
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_msg(pb_quota_list(c, &rules, &n, NULL, NULL) == 0, "quota list: %s", pb_last_error());
	pb_disconnect(c);
	for (size_t i = 0; i < n; i++)
		at += (size_t)snprintf(text + at, 65536 - at, "%s %llu %s%s\n", rules[i].pattern,
				       (unsigned long long)rules[i].bytes, rules[i].source,
				       rules[i].seen ? " seen" : "");
	free(rules);
	return text;
}

static void rules_are(const char *when, const char *want)
{
	char *now = rules_now();

	ck_assert_msg(strcmp(now, want) == 0, "%s: the rules are\n%s\nwant\n%s\nlog:\n%s", when, now, want,
		      itest_tail(daemon_log(&d)));
	free(now);
}

static void quota(const char *args_line)
{
	char cmd[300];

	snprintf(cmd, sizeof(cmd), "quota %s", args_line);
	itest_pinctl_says(&d, 0, cmd, NULL);
}

#define THREE_RULES                      \
	"/jobs/job_1 8388608 set seen\n" \
	"/pods/* 4194304 set\n"          \
	"/jobs/job_later 16777216 set\n"

/* The three rules every restart case sets: job_1's (its cgroup exists, seen), a glob, and a job not started. */
static void set_three(void)
{
	cgroup_exists("/jobs/job_1", true);
	quota("set /jobs/job_1 8M");
	quota("set /pods/* 4M");
	quota("set /jobs/job_later 16M");
	rules_are("as set", THREE_RULES); /* quota list sweeps: job_1's cgroup is seen */
	rules_bind("before the restart");
}

/* The file: the daemon's own, 0600, and it names the three. */
static void file_holds_three(void)
{
	struct stat st;
	char *text;

	ck_assert_msg(lstat(rules_path, &st) == 0, "no rules file %s: %s", rules_path, strerror(errno));
	ck_assert_msg(S_ISREG(st.st_mode) && (st.st_mode & 07777) == 0600 && st.st_uid == geteuid(),
		      "%s: mode %o uid %u, want a regular file of mode 0600 owned by the daemon's uid %u", rules_path,
		      st.st_mode & 07777, st.st_uid, geteuid());
	text = itest_read_file(rules_path);
	ck_assert_ptr_nonnull(text);
	ck_assert_msg(strstr(text, "/jobs/job_1 8388608 seen\n") && strstr(text, "/pods/* 4194304\n") &&
			      strstr(text, "/jobs/job_later 16777216\n"),
		      "%s holds:\n%s", rules_path, text);
	free(text);
}

/* A clean stop that keeps the daemon's folder (daemon_stop removes it): SIGTERM, and exit status 0. */
static void term(void)
{
	int st = 0;

	ck_assert_int_eq(kill(d.pid, SIGTERM), 0);
	ck_assert_int_eq(waitpid(d.pid, &st, 0), d.pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the daemon did not stop cleanly (status %#x)", st);
	d.pid = 0;
}

static void kill9(void)
{
	ck_assert_int_eq(kill(d.pid, SIGKILL), 0);
	ck_assert_int_eq(waitpid(d.pid, NULL, 0), d.pid);
	d.pid = 0;
}

/* ------------------------------------------------------------------ tests */

START_TEST(test_rules_survive_a_clean_stop)
{
	set_three();
	term();
	daemon_restart(&d, args());
	rules_are("after SIGTERM and a start", THREE_RULES);
	rules_bind("after SIGTERM and a start");
	ck_assert_msg(daemon_wait_log(&d, "3 job quota rules restored from", 5000), "no restore line:\n%s",
		      itest_tail(daemon_log(&d)));
	file_holds_three();
	/* Through pinctl as an admin reads them. */
	itest_pinctl_says(&d, 0, "quota list", "/jobs/job_later", "16 MiB", "(its cgroup not seen yet)", NULL);
}
END_TEST

START_TEST(test_rules_survive_a_crash)
{
	set_three();
	kill9();
	daemon_restart(&d, args());
	rules_are("after kill -9 and a start", THREE_RULES);
	rules_bind("after kill -9 and a start");
	/* Twice: the restored rules are kept again by the next daemon. */
	kill9();
	daemon_restart(&d, args());
	rules_are("after a second kill -9", THREE_RULES);
}
END_TEST

/* As systemd runs the unit: the fd store, RUNTIME_DIRECTORY; a crash, restarted with the same. */
START_TEST(test_rules_survive_a_crash_under_the_fd_store)
{
	struct fdstore *fs;
	char unit_rules[400];

	term();
	unlink(d.socket);
	fs = fdstore_new(&d);
	ck_assert_ptr_nonnull(fs);
	/* This test's own process (Check forks one per test): the daemons it starts inherit it. */
	ck_assert_int_eq(setenv("RUNTIME_DIRECTORY", d.dir, 1), 0);
	snprintf(unit_rules, sizeof(unit_rules), "%s/quota-rules", d.dir);
	snprintf(rules_path, sizeof(rules_path), "%s", unit_rules);
	fdstore_daemon_start(fs, args());
	set_three();
	fdstore_daemon_kill(fs);
	fdstore_daemon_start(fs, args());
	rules_are("after kill -9 under the fd store", THREE_RULES);
	rules_bind("after kill -9 under the fd store");
	file_holds_three(); /* in RUNTIME_DIRECTORY, not beside the socket */
	sec_stop_with_store(&d, fs);
}
END_TEST

static void reload_and_wait(void)
{
	char *log = daemon_log(&d);
	size_t n0 = sec_count(log ? log : "", "config reloaded");

	free(log);
	ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
	for (int i = 0; i < 200; i++) {
		log = daemon_log(&d);
		size_t n = sec_count(log ? log : "", "config reloaded");

		free(log);
		if (n > n0)
			return;
		usleep(25000);
	}
	ck_abort_msg("no reload in 5 s:\n%s", itest_tail(daemon_log(&d)));
}

START_TEST(test_a_reload_keeps_rules_and_file)
{
	set_three();
	reload_and_wait();
	rules_are("after SIGHUP", THREE_RULES);
	rules_bind("after SIGHUP");
	kill9();
	daemon_restart(&d, args());
	rules_are("after SIGHUP and kill -9", THREE_RULES);
	file_holds_three();
}
END_TEST

START_TEST(test_clear_and_release_follow_in_the_file)
{
	char *text;

	set_three();
	quota("clear /pods/*");
	/* job_1's cgroup goes: the sweep (quota list runs it) releases its rule, and the file follows. */
	cgroup_exists("/jobs/job_1", false);
	rules_are("cleared and released", "/jobs/job_later 16777216 set\n");
	text = itest_read_file(rules_path);
	ck_assert_msg(text && !strstr(text, "job_1") && !strstr(text, "/pods/"), "the file still has them:\n%s", text);
	free(text);
	kill9();
	daemon_restart(&d, args());
	rules_are("cleared, released, kill -9", "/jobs/job_later 16777216 set\n");
	/* The last one cleared: no rule comes back. */
	quota("clear /jobs/job_later");
	kill9();
	daemon_restart(&d, args());
	rules_are("all cleared, kill -9", "");
}
END_TEST

/* A job that ended while no daemon ran: its seen rule is released at the first sweep after the start. */
START_TEST(test_a_rule_whose_cgroup_went_while_down_is_released)
{
	set_three();
	term();
	cgroup_exists("/jobs/job_1", false);
	daemon_restart(&d, args());
	rules_are("job_1 gone while down", "/pods/* 4194304 set\n/jobs/job_later 16777216 set\n");
	ck_assert_msg(daemon_wait_log(&d, "job quota /jobs/job_1 (8 MiB) released: its cgroup is gone", 5000),
		      "no release line:\n%s", itest_tail(daemon_log(&d)));
}
END_TEST

START_TEST(test_a_damaged_file_warns_file_line_and_keeps_good_lines)
{
	char want[600];

	term();
	write_text(rules_path,
		   "pinbroker-quota-rules 1\n"
		   "/jobs/job_1 8388608 seen\n"
		   "/jobs/bad 8Gigs\n"
		   "garbage \x01\x02\xff line\n"
		   "/pods/* 4194304\n"
		   "/jobs/../escape 1\n",
		   0600);
	cgroup_exists("/jobs/job_1", true); /* else its seen rule is released at once, as it should be */
	daemon_restart(&d, args());
	ck_assert(daemon_alive(&d));
	rules_are("a damaged file", "/jobs/job_1 8388608 set seen\n/pods/* 4194304 set\n");
	for (size_t i = 0; i < 3; i++) {
		static const int bad[] = { 3, 4, 6 };

		snprintf(want, sizeof(want), "%s:%d: ", rules_path, bad[i]);
		ck_assert_msg(daemon_wait_log(&d, want, 5000), "no warning '%s' in:\n%s", want,
			      itest_tail(daemon_log(&d)));
	}
	rules_bind("from a damaged file");

	/* Not a file of ours: others may write it, a symlink, a folder: ignored with a warning, and the daemon runs. */
	static const struct {
		const char *what, *said;
	} odd[] = { { "mode 0666", "its group or others may write it" },
		    { "symlink", "it is a symbolic link" },
		    { "folder", "it is not a regular file" },
		    { "binary", NULL } };
	for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
		char cmd[900];

		term();
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", rules_path);
		ck_assert_int_eq(system(cmd), 0);
		if (strcmp(odd[i].what, "mode 0666") == 0) {
			write_text(rules_path, "pinbroker-quota-rules 1\n/jobs/job_1 1\n", 0666);
		} else if (strcmp(odd[i].what, "symlink") == 0) {
			char target[450];

			snprintf(target, sizeof(target), "%s.target", rules_path);
			write_text(target, "pinbroker-quota-rules 1\n/jobs/job_1 1\n", 0600);
			ck_assert_int_eq(symlink(target, rules_path), 0);
		} else if (strcmp(odd[i].what, "folder") == 0) {
			ck_assert_int_eq(mkdir(rules_path, 0700), 0);
		} else {
			int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
			char junk[8192];

			ck_assert_int_ge(fd, 0);
			ck_assert_int_eq(read(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
			close(fd);
			fd = open(rules_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
			ck_assert_int_eq(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
			close(fd);
		}
		daemon_restart(&d, args());
		ck_assert_msg(daemon_alive(&d), "%s: the daemon died", odd[i].what);
		if (odd[i].said) {
			snprintf(want, sizeof(want), "ignoring the quota rules file %s: %s", rules_path, odd[i].said);
			ck_assert_msg(daemon_wait_log(&d, want, 5000), "%s: no '%s' in:\n%s", odd[i].what, want,
				      itest_tail(daemon_log(&d)));
			rules_are(odd[i].what, "");
		} else {
			snprintf(want, sizeof(want), "%s:1: ", rules_path);
			ck_assert_msg(daemon_wait_log(&d, want, 5000), "%s: no '%s' in:\n%s", odd[i].what, want,
				      itest_tail(daemon_log(&d)));
		}
	}
}
END_TEST

/* A rules file that cannot be written: quota set answers an error that says the rule is in force but not kept. */
START_TEST(test_a_file_that_cannot_be_written_is_an_error_to_the_admin)
{
	char *out = NULL;
	int rc;

	ck_assert_int_eq(mkdir(rules_path, 0700), 0); /* rename() cannot replace a folder, even for root */
	cgroup_exists("/jobs/job_1", true);
	rc = pinctl(&d, &out, "quota set /jobs/job_1 8M");
	ck_assert_msg(rc != 0 && strstr(out, "in force") && strstr(out, "will not survive a restart") &&
			      strstr(out, rules_path),
		      "quota set with an unwritable rules file: exit %d:\n%s", rc, out);
	free(out);
	/* In force all the same. */
	rules_are("unsaved", "/jobs/job_1 8388608 set seen\n");
	{
		struct tries t = acquire_in("/jobs/job_1/step_0", 6 * MiB, 4 * MiB);

		ck_assert_msg(t.r[0] == 0 && t.r[1] == -EDQUOT, "an unsaved rule binds: %d %d", t.r[0], t.r[1]);
	}
	ck_assert_msg(daemon_wait_log(&d, "cannot write the quota rules file", 5000), "the log does not say why:\n%s",
		      itest_tail(daemon_log(&d)));
	/* Once it can be written, the next change keeps everything. */
	ck_assert_int_eq(rmdir(rules_path), 0);
	quota("set /pods/* 4M");
	kill9();
	daemon_restart(&d, args());
	rules_are("written again", "/jobs/job_1 8388608 set seen\n/pods/* 4194304 set\n");
}
END_TEST

/* The fixture root's kernel boot id: a reboot, as the daemon sees one, is a new id there. */
static void boot_is(const char *id)
{
	char p[300], cmd[400];

	snprintf(cmd, sizeof(cmd), "mkdir -p '%s/proc/sys/kernel/random'", root);
	ck_assert_int_eq(system(cmd), 0);
	snprintf(p, sizeof(p), "%s/proc/sys/kernel/random/boot_id", root);
	snprintf(cmd, sizeof(cmd), "%s\n", id);
	write_text(p, cmd, 0444);
}

/*
 * A file that outlived a reboot (a socket path on a disk, not /run) holds rules for the jobs of that boot: none is
 * restored, not even one whose cgroup path a new job of this boot has taken; a restart within one boot keeps them.
 */
START_TEST(test_rules_of_another_boot_are_not_restored)
{
	term();
	boot_is("11111111-2222-3333-4444-555555555555");
	daemon_restart(&d, args());
	set_three();
	term();
	daemon_restart(&d, args());
	rules_are("a restart in the same boot", THREE_RULES);
	term();
	/* The reboot: job_1's path is taken by a new job of this boot (cgroup_exists keeps it). */
	boot_is("99999999-8888-7777-6666-555555555555");
	daemon_restart(&d, args());
	rules_are("after a reboot", "");
	{
		struct tries t = acquire_in("/jobs/job_1/step_0", 6 * MiB, 4 * MiB);

		ck_assert_msg(t.r[0] == 0 && t.r[1] == 0,
			      "a rule of the last boot bound a job of this one: %d %d: %s %s\nlog:\n%s", t.r[0], t.r[1],
			      t.msg[0], t.msg[1], itest_tail(daemon_log(&d)));
	}
	ck_assert_msg(daemon_wait_log(&d, "written before a reboot", 5000), "no warning about the old boot:\n%s",
		      itest_tail(daemon_log(&d)));
	/* The next change writes this boot's file, which the next start keeps. */
	quota("set /jobs/job_1 8M");
	kill9();
	daemon_restart(&d, args());
	rules_are("set again after the reboot", "/jobs/job_1 8388608 set seen\n");
}
END_TEST

/*
 * A crash between the temp file's creation and its rename (kill -9 in a quota set storm left 3 in 40 kills on the
 * build host) leaves "<file>.XXXXXX": the next start removes the daemon's own, and nothing of another uid's or of
 * another shape.
 */
START_TEST(test_temp_files_a_crash_left_are_removed_at_start)
{
	static const char *const kept[] = { "Zz9Zz9", "longer1", "Sym123", "ab-cd1" };
	char p[480], q[480];
	struct stat st;

	quota("set /jobs/job_later 16M");
	kill9();
	snprintf(p, sizeof(p), "%s.Ab3xY9", rules_path);
	write_text(p, "pinbroker-quota-rules 1\n/jobs/job_later 16777216\n", 0600);
	snprintf(p, sizeof(p), "%s.%s", rules_path, kept[0]);
	write_text(p, "another uid's\n", 0600);
	ck_assert_int_eq(chown(p, SEC_UID_A, SEC_UID_A), 0);
	snprintf(p, sizeof(p), "%s.%s", rules_path, kept[1]);
	write_text(p, "not a temp file's name\n", 0600);
	snprintf(p, sizeof(p), "%s.%s", rules_path, kept[2]);
	snprintf(q, sizeof(q), "%s.link-target", rules_path);
	write_text(q, "a link's target\n", 0600);
	ck_assert_int_eq(symlink(q, p), 0);
	snprintf(p, sizeof(p), "%s.%s", rules_path, kept[3]);
	write_text(p, "not a temp file's name\n", 0600);
	daemon_restart(&d, args());
	rules_are("after the crash", "/jobs/job_later 16777216 set\n");
	snprintf(p, sizeof(p), "%s.Ab3xY9", rules_path);
	ck_assert_msg(lstat(p, &st) < 0 && errno == ENOENT, "%s, left by a crash, is still there", p);
	for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++) {
		snprintf(p, sizeof(p), "%s.%s", rules_path, kept[i]);
		ck_assert_msg(lstat(p, &st) == 0, "%s was removed: %s", p, strerror(errno));
	}
	ck_assert_msg(lstat(q, &st) == 0, "the link's target %s was removed", q);
}
END_TEST

/* How many "<rules file>.XXXXXX" temp files were made in its folder since watch_temps (each is a write: an fsync). */
static int temps_made(int ifd, const char *base)
{
	char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
	size_t blen = strlen(base);
	ssize_t n;
	int count = 0;

	while ((n = read(ifd, buf, sizeof(buf))) > 0)
		for (char *p = buf; p < buf + n;) {
			const struct inotify_event *ev = (const struct inotify_event *)p;

			if (ev->len && strncmp(ev->name, base, blen) == 0 && ev->name[blen] == '.')
				count++;
			p += sizeof(*ev) + ev->len;
		}
	return count;
}

/*
 * While the file cannot be written (here a folder in its place), a tenant's quota list (which sweeps) must not
 * buy a write, with its fsync on the event loop, each: the daemon tries again once a sweep interval, and at an
 * admin's change.
 */
START_TEST(test_a_tenant_cannot_drive_a_write_per_request)
{
	const char *base = strrchr(rules_path, '/') + 1;
	int ifd, made, st = 0;
	char *out = NULL;
	pid_t pid;

	ck_assert_int_eq(mkdir(rules_path, 0700), 0);
	ck_assert_int_ne(pinctl(&d, &out, "quota set /jobs/job_1 8M"), 0);
	free(out);
	ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	ck_assert_int_ge(ifd, 0);
	ck_assert_int_ge(inotify_add_watch(ifd, d.dir, IN_CREATE), 0);
	pid = itest_fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		sec_drop_to(SEC_UID_A);
		for (int i = 0; i < 50; i++) {
			struct pb_quota_rule *rules = NULL;
			struct pb_job *jobs = NULL;
			size_t nr = 0, nj = 0;
			pb_client *c;

			if (pb_connect(d.socket, &c) != 0)
				_exit(1);
			if (pb_quota_list(c, &rules, &nr, &jobs, &nj) != 0)
				_exit(2);
			free(rules);
			free(jobs);
			pb_disconnect(c);
		}
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the tenant's quota lists failed: %#x", st);
	made = temps_made(ifd, base);
	close(ifd);
	ck_assert_msg(made <= 2, "50 quota lists of a tenant made %d write attempts of the rules file", made);
	/* An admin's change still tries at once, and once it can be written everything is kept. */
	ck_assert_int_eq(rmdir(rules_path), 0);
	quota("set /pods/* 4M");
	kill9();
	daemon_restart(&d, args());
	rules_are("written again", "/jobs/job_1 8388608 set\n/pods/* 4194304 set\n");
}
END_TEST

/*
 * Where a tenant may write the socket folder (a sticky /tmp, which the daemon accepts) and fs.protected_hardlinks
 * is 0, the tenant can hard-link any root-owned file to the rules file's name: it is then a regular file, the
 * daemon's uid's, mode 0600. It must be ignored, not read as rules nor echoed line by line into the log. (Root
 * makes the link here, as protected_hardlinks=0 lets anyone.)
 */
START_TEST(test_a_hard_link_to_another_file_is_ignored)
{
	char secret[450];
	char *log;

	term();
	snprintf(secret, sizeof(secret), "%s/secret", d.dir);
	write_text(secret, "root:$6$secrethash$:19000:0:99999:7:::\n/jobs/job_1 1\n", 0600);
	ck_assert_int_eq(link(secret, rules_path), 0);
	cgroup_exists("/jobs/job_1", true);
	daemon_restart(&d, args());
	rules_are("a hard link to a root-owned file", "");
	log = daemon_log(&d);
	ck_assert_msg(log && !strstr(log, "secrethash"), "the linked file's text is in the log:\n%s", log);
	free(log);
	ck_assert_msg(daemon_wait_log(&d, "ignoring the quota rules file", 5000), "no warning:\n%s",
		      itest_tail(daemon_log(&d)));
}
END_TEST

/* What the job is charged now, as an admin's quota list shows it (0 when it has no row). */
static uint64_t job_bytes(const char *job)
{
	struct pb_quota_rule *rules = NULL;
	struct pb_job *jobs = NULL;
	size_t nr = 0, nj = 0;
	uint64_t bytes = 0;
	pb_client *c;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_msg(pb_quota_list(c, &rules, &nr, &jobs, &nj) == 0, "quota list: %s", pb_last_error());
	pb_disconnect(c);
	for (size_t i = 0; i < nj; i++)
		if (strcmp(jobs[i].job, job) == 0)
			bytes = jobs[i].bytes;
	free(rules);
	free(jobs);
	return bytes;
}

/*
 * A lease a job held over a crash counts against the job's quota when the next daemon serves, not only once its
 * holder has re-declared it: else the job's other processes get its whole quota again in between.
 */
START_TEST(test_a_lease_held_over_a_crash_counts_for_its_job)
{
	static const struct pb_acquire_opts opts = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE,
						     .label = "sec24-holder" };
	struct fdstore *fs;
	int go[2], rep[2], r = -1;
	char p[300];
	struct tries t;
	pid_t pid;

	term();
	unlink(d.socket);
	fs = fdstore_new(&d);
	ck_assert_ptr_nonnull(fs);
	fdstore_daemon_start(fs, args());
	cgroup_exists("/jobs/job_1", true);
	quota("set /jobs/job_1 8M");
	ck_assert_int_eq(pipe2(go, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(rep, O_CLOEXEC), 0);
	pid = itest_fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		pb_client *c;
		pb_lease *l = NULL;
		char g;

		if (read(go[0], &g, 1) != 1)
			_exit(80);
		sec_drop_to(SEC_UID_A);
		r = pb_connect(d.socket, &c);
		if (r == 0)
			r = pb_acquire(c, 6 * MiB, &opts, &l);
		if (write(rep[1], &r, sizeof(r)) != (ssize_t)sizeof(r))
			_exit(81);
		if (read(go[0], &g, 1) != 1) /* held until told */
			_exit(82);
		_exit(0);
	}
	snprintf(p, sizeof(p), "%s/proc/%d", root, (int)pid);
	ck_assert_int_eq(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/proc/%d/cgroup", root, (int)pid);
	write_text(p, "0::/jobs/job_1/step_0\n", 0644);
	ck_assert_int_eq(write(go[1], "g", 1), 1);
	ck_assert_int_eq(read(rep[0], &r, sizeof(r)), (ssize_t)sizeof(r));
	ck_assert_msg(r == 0, "the holder's 6 MiB: %d", r);
	/* Stopped, as a suspended job is: it cannot re-declare until it runs again. */
	ck_assert_int_eq(kill(pid, SIGSTOP), 0);
	fdstore_daemon_kill(fs);
	fdstore_daemon_start(fs, args());
	held_bytes = 6 * MiB;
	t = acquire_in("/jobs/job_1/step_1", 4 * MiB, 1 * MiB);
	ck_assert_msg(t.r[0] == -EDQUOT,
		      "with 6 MiB of job_1's 8 MiB held over the crash, 4 MiB more in job_1 got %d (%s)\nlog:\n%s",
		      t.r[0], t.msg[0], itest_tail(daemon_log(&d)));
	/* Running again, the holder re-declares it: still 6 MiB on the job, not twice; its end leaves nothing. */
	ck_assert_int_eq(kill(pid, SIGCONT), 0);
	ck_assert_msg(daemon_wait_log(&d, "re-adopted by pid", 10000), "no re-declare:\n%s",
		      itest_tail(daemon_log(&d)));
	ck_assert_uint_eq(job_bytes("/jobs/job_1"), 6 * MiB);
	ck_assert_int_eq(write(go[1], "g", 1), 1);
	ck_assert_int_eq(itest_wait_exit(pid), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 10000), 0);
	ck_assert_uint_eq(job_bytes("/jobs/job_1"), 0);
	close(go[0]);
	close(go[1]);
	close(rep[0]);
	close(rep[1]);
	sec_stop_with_store(&d, fs);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("sec_24_quota_persist");

	CHECK_CASE(s, "persist", setup, teardown, 120, test_rules_survive_a_clean_stop, test_rules_survive_a_crash,
		   test_rules_survive_a_crash_under_the_fd_store, test_a_reload_keeps_rules_and_file,
		   test_clear_and_release_follow_in_the_file, test_a_rule_whose_cgroup_went_while_down_is_released,
		   test_a_damaged_file_warns_file_line_and_keeps_good_lines,
		   test_a_file_that_cannot_be_written_is_an_error_to_the_admin,
		   test_rules_of_another_boot_are_not_restored, test_temp_files_a_crash_left_are_removed_at_start,
		   test_a_tenant_cannot_drive_a_write_per_request, test_a_hard_link_to_another_file_is_ignored,
		   test_a_lease_held_over_a_crash_counts_for_its_job);
	return s;
}

SEC_MAIN(suite)

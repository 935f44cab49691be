/* SPDX-License-Identifier: MIT */
/* Finding 9: the daemon's socket path never leads it to change or remove another file, and an unsafe socket folder is refused. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sec.h"

/* Each attempt is one daemon start racing a rename; the unfixed daemon lost within a few. */
#define RACE_ATTEMPTS 40

static char base[64];
static char victim[256];

static void setup(void)
{
	int fd;

	snprintf(base, sizeof(base), "/tmp/pbsec09.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(base));
	ck_assert_int_eq(chmod(base, 0755), 0);
	/* Someone else's private file: what a planted link would point the daemon at. */
	snprintf(victim, sizeof(victim), "%s/victim", base);
	fd = open(victim, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "secret\n", 7), 7);
	close(fd);
	ck_assert_int_eq(chown(victim, SEC_UID_B, SEC_UID_B), 0);
	ck_assert_int_eq(chmod(victim, 0600), 0);
}

static void teardown(void)
{
	sec_rm_rf(base);
}

static void assert_victim_untouched(const char *where)
{
	struct stat st;

	ck_assert_int_eq(stat(victim, &st), 0);
	ck_assert_msg(st.st_uid == SEC_UID_B && st.st_gid == SEC_UID_B && (st.st_mode & 07777) == 0600,
		      "%s: the daemon changed %s to uid %u gid %u mode %04o", where, victim, (unsigned)st.st_uid,
		      (unsigned)st.st_gid, (unsigned)(st.st_mode & 07777));
}

/* Run the daemon on sock in the foreground, expecting it to refuse; returns its exit code and output. */
static int run_daemon_refusing(const char *sock, char **out)
{
	char cmd[512];

	/* timeout: a daemon that wrongly starts would otherwise never return. */
	snprintf(cmd, sizeof(cmd),
		 "timeout 5 %s --socket '%s' --config /dev/null --prewarm 0 --hugetlb no --log-level info",
		 PINBROKERD_PATH, sock);
	return run_capture(cmd, out);
}

/* Start the daemon on sock in the background, its output in logpath. */
static pid_t spawn_daemon(const char *sock, const char *logpath)
{
	pid_t pid = itest_fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		unsetenv("NOTIFY_SOCKET");
		unsetenv("LISTEN_FDS");
		execl(PINBROKERD_PATH, PINBROKERD_PATH, "--socket", sock, "--config", "/dev/null", "--prewarm", "0",
		      "--hugetlb", "no", "--log-level", "info", (char *)NULL);
		_exit(127);
	}
	return pid;
}

static bool log_has(const char *path, const char *what)
{
	FILE *f = fopen(path, "r");
	char line[1024];
	bool found = false;

	while (f && !found && fgets(line, sizeof(line), f))
		found = strstr(line, what) != NULL;
	if (f)
		fclose(f);
	return found;
}

/* Wait until the daemon logged that it is ready, or exited; true if ready. */
static bool wait_ready(pid_t pid, const char *logpath)
{
	int st;

	for (int t = 0; t < 1000; t++) {
		if (log_has(logpath, " ready on "))
			return true;
		if (waitpid(pid, &st, WNOHANG) == pid)
			return false;
		usleep(10000);
	}
	return false;
}

static void stop_daemon(pid_t pid)
{
	int st;

	kill(pid, SIGTERM);
	waitpid(pid, &st, 0);
}

START_TEST(test_planted_symlink_is_not_followed_or_removed)
{
	char sock[160], link[PATH_MAX], *out = NULL;
	ssize_t n;
	int rc;

	snprintf(sock, sizeof(sock), "%s/pb.sock", base);
	ck_assert_int_eq(symlink(victim, sock), 0);
	rc = run_daemon_refusing(sock, &out);
	ck_assert_msg(rc == 1, "the daemon should refuse a symlink at its socket path (exit %d):\n%s", rc, out);
	ck_assert_msg(strstr(out, "is a symbolic link, not a socket") && strstr(out, sock),
		      "the refusal should say what is at the path:\n%s", out);
	n = readlink(sock, link, sizeof(link) - 1);
	ck_assert_msg(n > 0, "the daemon removed the symlink at %s", sock);
	link[n] = '\0';
	ck_assert_str_eq(link, victim);
	assert_victim_untouched("symlink at the socket path");
	free(out);
}
END_TEST

START_TEST(test_planted_regular_file_is_not_unlinked)
{
	char sock[160], *out = NULL;
	struct stat st;
	int rc;

	snprintf(sock, sizeof(sock), "%s/pb.sock", base);
	ck_assert_int_eq(rename(victim, sock), 0);
	snprintf(victim, sizeof(victim), "%s", sock);
	rc = run_daemon_refusing(sock, &out);
	ck_assert_msg(rc == 1, "the daemon should refuse a regular file at its socket path (exit %d):\n%s", rc, out);
	ck_assert_msg(strstr(out, "is a regular file, not a socket"), "the refusal should say why:\n%s", out);
	ck_assert_msg(lstat(sock, &st) == 0 && S_ISREG(st.st_mode), "the daemon removed the file at %s", sock);
	assert_victim_untouched("regular file at the socket path");
	free(out);
}
END_TEST

START_TEST(test_world_writable_folder_refused_unless_sticky)
{
	char dir[128], sock[160], logpath[160], *out = NULL;
	struct stat st;
	pid_t pid;
	int rc;

	snprintf(dir, sizeof(dir), "%s/open", base);
	ck_assert_int_eq(mkdir(dir, 0755), 0);
	ck_assert_int_eq(chmod(dir, 0777), 0);
	snprintf(sock, sizeof(sock), "%s/pb.sock", dir);
	rc = run_daemon_refusing(sock, &out);
	ck_assert_msg(rc == 1, "the daemon should refuse a world-writable socket folder (exit %d):\n%s", rc, out);
	ck_assert_msg(strstr(out, "is writable by every user and not sticky") && strstr(out, "chmod o-w"),
		      "the refusal should say what to fix:\n%s", out);
	ck_assert_int_ne(access(sock, F_OK), 0);
	free(out);

	/* Group-writable by a group that is neither root's nor the daemon's: refused too. */
	ck_assert_int_eq(chmod(dir, 0775), 0);
	ck_assert_int_eq(chown(dir, 0, SEC_UID_A), 0);
	rc = run_daemon_refusing(sock, &out);
	ck_assert_msg(rc == 1 && strstr(out, "writable by group 61001") && strstr(out, "chmod g-w"),
		      "the daemon should refuse a folder writable by a foreign group (exit %d):\n%s", rc, out);
	free(out);

	/* Sticky (as /tmp): others may add entries but never remove or rename the daemon's socket. */
	ck_assert_int_eq(chown(dir, 0, 0), 0);
	ck_assert_int_eq(chmod(dir, 01777), 0);
	snprintf(logpath, sizeof(logpath), "%s/daemon.log", base);
	pid = spawn_daemon(sock, logpath);
	ck_assert_msg(wait_ready(pid, logpath), "the daemon should start in a sticky folder");
	ck_assert_int_eq(lstat(sock, &st), 0);
	ck_assert(S_ISSOCK(st.st_mode));
	/* The mode is set at bind: 0660 with group pinbroker, 0666 where it does not exist. */
	ck_assert_int_eq(st.st_mode & 0777, getgrnam("pinbroker") ? 0660 : 0666);
	stop_daemon(pid);
}
END_TEST

START_TEST(test_folder_owned_by_another_uid_refused)
{
	char dir[128], sock[160], *out = NULL;
	int rc;

	snprintf(dir, sizeof(dir), "%s/theirs", base);
	ck_assert_int_eq(mkdir(dir, 0755), 0);
	ck_assert_int_eq(chown(dir, SEC_UID_A, SEC_UID_A), 0);
	snprintf(sock, sizeof(sock), "%s/pb.sock", dir);
	rc = run_daemon_refusing(sock, &out);
	ck_assert_msg(rc == 1, "the daemon should refuse a socket folder owned by uid %d (exit %d):\n%s", SEC_UID_A, rc,
		      out);
	ck_assert_msg(strstr(out, "is owned by uid 61001") && strstr(out, "chown root"),
		      "the refusal should name the owner and the fix:\n%s", out);
	ck_assert_int_ne(access(sock, F_OK), 0);
	free(out);
}
END_TEST

/*
 * The racer: as soon as the daemon's socket appears, rename a symlink to the
 * victim over it, as whoever can write the folder could. A daemon that sets
 * mode and group by path afterwards then changes the victim.
 */
static pid_t start_racer(const char *dir, const char *name, const char *tmp_link, int *ready_fd)
{
	int pfd[2];
	pid_t pid;

	pid = itest_fork_piped(pfd, NULL);
	if (pid == 0) {
		char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
		char target[256];
		int in = inotify_init1(IN_CLOEXEC);

		close(pfd[0]);
		if (in < 0 || inotify_add_watch(in, dir, IN_CREATE) < 0)
			_exit(2);
		snprintf(target, sizeof(target), "%s/%s", dir, name);
		if (write(pfd[1], "r", 1) != 1)
			_exit(2);
		for (;;) {
			ssize_t n = read(in, buf, sizeof(buf));

			if (n <= 0)
				_exit(2);
			for (char *p = buf; p < buf + n;) {
				struct inotify_event *ev = (struct inotify_event *)p;

				if (ev->len && strcmp(ev->name, name) == 0)
					_exit(rename(tmp_link, target) == 0 ? 0 : 3);
				p += sizeof(*ev) + ev->len;
			}
		}
	}
	close(pfd[1]);
	*ready_fd = pfd[0];
	return pid;
}

START_TEST(test_socket_swapped_for_symlink_after_bind)
{
	char dir[128], sock[160], tmp_link[160], logpath[160];

	snprintf(dir, sizeof(dir), "%s/race", base);
	ck_assert_int_eq(mkdir(dir, 0755), 0);
	snprintf(sock, sizeof(sock), "%s/pb.sock", dir);
	snprintf(tmp_link, sizeof(tmp_link), "%s/link.tmp", dir);
	snprintf(logpath, sizeof(logpath), "%s/daemon.log", base);
	for (int i = 0; i < RACE_ATTEMPTS; i++) {
		int ready_fd, racer_st;
		pid_t racer, pid;
		char c;

		unlink(sock);
		unlink(tmp_link);
		unlink(logpath);
		ck_assert_int_eq(symlink(victim, tmp_link), 0);
		racer = start_racer(dir, "pb.sock", tmp_link, &ready_fd);
		ck_assert_int_eq(read(ready_fd, &c, 1), 1);
		close(ready_fd);
		pid = spawn_daemon(sock, logpath);
		ck_assert_int_eq(waitpid(racer, &racer_st, 0), racer);
		ck_assert_msg(WIFEXITED(racer_st) && WEXITSTATUS(racer_st) == 0, "the racer failed (status %d)",
			      racer_st);
		/* Past start-up (or gone): whatever it did to the path is done. */
		wait_ready(pid, logpath);
		stop_daemon(pid);
		assert_victim_untouched("socket swapped for a symlink right after bind");
	}
}
END_TEST

CHECK_SUITE(suite, "sec_09_socket_path", "socket_path", setup, teardown, 120,
	    test_planted_symlink_is_not_followed_or_removed, test_planted_regular_file_is_not_unlinked,
	    test_world_writable_folder_refused_unless_sticky, test_folder_owned_by_another_uid_refused,
	    test_socket_swapped_for_symlink_after_bind)

SEC_MAIN(suite)

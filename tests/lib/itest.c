/* SPDX-License-Identifier: MIT */
/* Helpers for integration tests: run the real pinbrokerd on a temp socket, run pinctl, read its status (the raw
 * protocol: itest-raw.c). */
#define _GNU_SOURCE
#include "itest.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pinbroker.h"
#include "wire.h"

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

pid_t itest_fork(void)
{
	pid_t pid = fork();

	if (pid == 0) {
		signal(SIGTERM, SIG_DFL);
		signal(SIGINT, SIG_DFL);
		signal(SIGHUP, SIG_DFL);
	}
	return pid;
}

pid_t itest_fork_piped(int a[2], int b[2])
{
	pid_t pid;

	ck_assert(!a || pipe(a) == 0);
	ck_assert(!b || pipe(b) == 0);
	pid = itest_fork();
	ck_assert_int_ge(pid, 0);
	return pid;
}

void itest_child_ends(int to[2], int from[2])
{
	close(to[1]);
	close(from[0]);
}

void itest_parent_ends(int to[2], int from[2])
{
	close(to[0]);
	close(from[1]);
	ck_assert_int_eq(fcntl(to[1], F_SETFD, FD_CLOEXEC), 0);
	ck_assert_int_eq(fcntl(from[0], F_SETFD, FD_CLOEXEC), 0);
}

void itest_child_ready(int p[2], int code)
{
	if (write(p[1], "k", 1) != 1)
		_exit(code);
	for (;;)
		pause();
}

void itest_wait_ready(int p[2])
{
	char c;

	close(p[1]);
	ck_assert_int_eq(read(p[0], &c, 1), 1);
	close(p[0]);
}

void itest_say(int fd, char c)
{
	if (write(fd, &c, 1) != 1)
		_exit(80);
}

char itest_hear(int fd, unsigned bound_s)
{
	char c = 0;

	alarm(bound_s);
	if (read(fd, &c, 1) != 1)
		_exit(81);
	alarm(0);
	return c;
}

pid_t itest_hold_lease(const char *socket_path, size_t size, const char *label)
{
	int p[2];
	pid_t pid = itest_fork_piped(p, NULL);

	if (pid == 0) {
		struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA, .label = label };
		pb_client *c;
		pb_lease *l;

		if (pb_connect(socket_path, &c) < 0 || pb_acquire(c, size, &o, &l) < 0)
			_exit(1);
		itest_child_ready(p, 1);
	}
	itest_wait_ready(p);
	return pid;
}

int itest_wait_exit(pid_t pid)
{
	int st;

	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int itest_wait_end(pid_t pid, int timeout_ms)
{
	struct timespec ts = { 0, 10 * 1000 * 1000 };
	int st;

	for (int waited = 0; waited <= timeout_ms; waited += 10) {
		pid_t r = waitpid(pid, &st, WNOHANG);

		if (r == pid)
			return st;
		ck_assert_int_eq(r, 0);
		nanosleep(&ts, NULL);
	}
	return -1;
}

int itest_kill_and_reap(pid_t pid)
{
	int st;

	kill(pid, SIGKILL);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return WIFSIGNALED(st) ? WTERMSIG(st) : -1;
}

void itest_kill_child(pid_t *pid)
{
	if (*pid > 0) {
		kill(*pid, SIGKILL);
		waitpid(*pid, NULL, 0);
		*pid = 0;
	}
}

double itest_metrics_sample(const char *text, const char *name)
{
	size_t n = strlen(name);

	for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
		if (strncmp(l, name, n) == 0 && l[n] == ' ')
			return strtod(l + n + 1, NULL);
	return -1;
}

void daemon_prepare(struct daemon *d)
{
	memset(d, 0, sizeof(*d));
	snprintf(d->dir, sizeof(d->dir), "/tmp/pbtest.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(d->dir));
	chmod(d->dir, 0755);
	snprintf(d->socket, sizeof(d->socket), "%s/pb.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/daemon.log", d->dir);
}

void daemon_start(struct daemon *d, const char *const *extra)
{
	daemon_prepare(d);
	daemon_restart(d, extra);
}

void daemon_restart(struct daemon *d, const char *const *extra)
{
	daemon_restart_with(d, extra, NULL, NULL);
}

/*
 * The daemon raises its soft RLIMIT_NOFILE to the hard one at start, but under valgrind it cannot: valgrind fixes
 * the client's limit from the soft one it was started with (less its own reserve). Raising it before exec gives
 * the daemon under a wrapper the room it has natively (a root shell's soft limit is 1024); at most cap, which no
 * test needs more than, where a container's hard limit is in the millions.
 */
static void soft_nofile_to_hard(rlim_t cap)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max && rl.rlim_cur < cap) {
		rl.rlim_cur = rl.rlim_max < cap ? rl.rlim_max : cap;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

bool itest_answers(const char *socket_path)
{
	int fd = raw_connect(socket_path), st;

	if (fd < 0)
		return false;
	st = raw_hello(fd);
	close(fd);
	return st == 0;
}

/* Does env ("NAME=value") name one of the variables in set or those itest_spawn_logged unsets? */
static bool env_dropped(const char *env, char *const *set)
{
	static const char *const spawn_unsets[] = { "NOTIFY_SOCKET=", "JOURNAL_STREAM=", "LISTEN_FDS=" };

	for (size_t i = 0; i < sizeof(spawn_unsets) / sizeof(spawn_unsets[0]); i++)
		if (strncmp(env, spawn_unsets[i], strlen(spawn_unsets[i])) == 0)
			return true;
	for (size_t i = 0; set[i]; i++) {
		size_t n = strcspn(set[i], "=") + 1;

		if (strncmp(env, set[i], n) == 0)
			return true;
	}
	return false;
}

char **itest_env_make(char *const *set)
{
	size_t n = 0, m = 0, k = 0;
	char **env;

	while (environ[n])
		n++;
	while (set[m])
		m++;
	env = calloc(n + m + 1, sizeof(*env));
	ck_assert_ptr_nonnull(env);
	for (size_t i = 0; i < n; i++)
		if (!env_dropped(environ[i], set))
			env[k++] = environ[i];
	for (size_t i = 0; i < m; i++)
		env[k++] = set[i];
	return env;
}

void itest_env_apply(void *env)
{
	environ = env;
}

pid_t itest_spawn_logged(const char *log, const char *const *argv, bool raise_nofile, void (*child_setup)(void *ud),
			 void *ud)
{
	pid_t pid = itest_fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		unsetenv("NOTIFY_SOCKET");
		unsetenv("JOURNAL_STREAM");
		unsetenv("LISTEN_FDS");
		if (raise_nofile)
			soft_nofile_to_hard(65536);
		if (child_setup)
			child_setup(ud);
		execvp(argv[0], (char *const *)argv); /* p: a wrapper is found on PATH */
		_exit(127);
	}
	return pid;
}

void daemon_restart_with(struct daemon *d, const char *const *extra, void (*child_setup)(void *ud), void *ud)
{
	const char *argv[64];
	char *wrapper;
	size_t n = 0;
	uint64_t t0;
	unsigned limit = itest_start_timeout_ms();
	bool noticed = false;
	int wst;

	/* PINBROKER_DAEMON_WRAPPER="valgrind --error-exitcode=99 ..." runs the daemon under a tool (split on spaces). */
	wrapper = getenv("PINBROKER_DAEMON_WRAPPER") ? strdup(getenv("PINBROKER_DAEMON_WRAPPER")) : NULL;
	for (char *save = NULL, *w = wrapper ? strtok_r(wrapper, " ", &save) : NULL; w && n < 16;
	     w = strtok_r(NULL, " ", &save))
		argv[n++] = w;
	/* A child_setup may take another uid, which cannot reach a build tree in a 0700 folder (a clone in /root):
	 * that daemon runs from a staged copy. */
	argv[n++] = child_setup ? itest_stage(PINBROKERD_PATH) : PINBROKERD_PATH;
	argv[n++] = "--socket";
	argv[n++] = d->socket;
	argv[n++] = "--config";
	argv[n++] = "/dev/null";
	/* Small, fast defaults for tests; extra args override them (later wins). */
	argv[n++] = "--budget";
	argv[n++] = "256M";
	argv[n++] = "--prewarm";
	argv[n++] = "16M";
	argv[n++] = "--hugetlb";
	argv[n++] = "no";
	argv[n++] = "--log-level";
	argv[n++] = "debug";
	for (size_t i = 0; extra && extra[i] && n < 62; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;

	{
		struct stat st;

		d->log_from = stat(d->log, &st) == 0 ? (long)st.st_size : 0;
	}
	d->pid = itest_spawn_logged(d->log, argv, wrapper != NULL, child_setup, ud);
	/* --config /dev/null: tests run on embedded defaults plus their arguments, never /etc. */
	free(wrapper);
	t0 = mono_ms();
	for (;;) {
		if (itest_answers(d->socket))
			return;
		if (waitpid(d->pid, &wst, WNOHANG) == d->pid)
			ck_abort_msg("pinbrokerd exited during start-up (%s %d); log %s since this start:\n%s",
				     WIFEXITED(wst) ? "exit status" : "signal",
				     WIFEXITED(wst) ? WEXITSTATUS(wst) : WTERMSIG(wst), d->log, daemon_log_excerpt(d));
		if (!noticed && mono_ms() - t0 > 10000u && limit > 10000u) {
			/*
			 * Said now, as well: a Check case timeout shorter than the bound would kill this test with only
			 * "Test timeout expired", hiding what the daemon logged.
			 */
			char *ex = daemon_log_excerpt(d);

			fprintf(stderr,
				"itest: pinbrokerd (pid %d) has not answered on %s for 10 s (waiting up to %u ms); "
				"log %s since this start:\n%s\n",
				(int)d->pid, d->socket, limit, d->log, ex ? ex : "");
			free(ex);
			noticed = true;
		}
		if (mono_ms() - t0 > limit) {
			/* A daemon that never answered is not left running after the test. */
			kill(d->pid, SIGKILL);
			waitpid(d->pid, NULL, 0);
			ck_abort_msg(
				"pinbrokerd (pid %d) did not answer on %s within %u ms; log %s since this start:\n%s",
				(int)d->pid, d->socket, limit, d->log, daemon_log_excerpt(d));
		}
		usleep(5000);
	}
}

bool itest_wait_answered(pb_client *c, int timeout_ms)
{
	struct pb_status *st = NULL;

	for (int waited = 0; pb_status_get(c, &st) < 0; waited += 20) {
		if (waited >= timeout_ms)
			return false;
		usleep(20000);
	}
	pb_status_free(st);
	return true;
}

void itest_end_clean(struct daemon *d, pb_client *c, int timeout_ms)
{
	ck_assert_int_eq(wait_leased(d->socket, 0, timeout_ms), 0);
	if (c)
		pb_disconnect(c);
	ck_assert_int_eq(daemon_stop(d), 0);
}

bool daemon_alive(const struct daemon *d)
{
	int st;

	return d->pid > 0 && waitpid(d->pid, &st, WNOHANG) == 0;
}

int daemon_stop(struct daemon *d)
{
	int st = 0;
	char cmd[600];

	if (d->pid <= 0)
		return -1;
	kill(d->pid, SIGTERM);
	/* Under a wrapper (valgrind) exit runs the leak check: give it 60 s, not 5. */
	for (int i = 0, max = getenv("PINBROKER_DAEMON_WRAPPER") ? 6000 : 500; i < max; i++) {
		pid_t r = waitpid(d->pid, &st, WNOHANG);

		if (r == d->pid)
			break;
		if (i == max - 1) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, &st, 0);
		}
		usleep(10000);
	}
	d->pid = 0;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
	if (getenv("PINBROKER_KEEP_TEST_DIRS") == NULL && system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", d->dir);
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	return 128 + WTERMSIG(st);
}

char *daemon_log(const struct daemon *d)
{
	return itest_read_file(d->log);
}

char *itest_excerpt(const char *text)
{
	size_t len = text ? strlen(text) : 0;
	const char *from;
	char *out = NULL;

	if (!text)
		return strdup("(none)");
	if (len == 0)
		return strdup("(empty)");
	if (len <= ITEST_LOG_EXCERPT)
		return strdup(text);
	/* The end is what tells why: the last lines, from a line start. */
	from = text + len - ITEST_LOG_EXCERPT;
	if (strchr(from, '\n') && strchr(from, '\n')[1])
		from = strchr(from, '\n') + 1;
	if (asprintf(&out, "[... first %zu bytes left out]\n%s", (size_t)(from - text), from) < 0)
		return NULL;
	return out;
}

const char *itest_tail(const char *text)
{
	static char buf[ITEST_LOG_EXCERPT + 64];
	char *ex = itest_excerpt(text);

	snprintf(buf, sizeof(buf), "%s", ex ? ex : "(out of memory)");
	free(ex);
	return buf;
}

char *daemon_log_excerpt(const struct daemon *d)
{
	char *log = daemon_log(d), *ex;

	/* An empty file reads as NULL: say which of the two it is. */
	if (!log && access(d->log, F_OK) == 0)
		return strdup("(empty: the daemon wrote nothing yet)");
	ex = itest_excerpt(log && (long)strlen(log) >= d->log_from ? log + d->log_from : log);
	free(log);
	return ex;
}

unsigned itest_start_timeout_ms(void)
{
	const char *env = getenv("ITEST_START_TIMEOUT_S");
	unsigned ms = env && atoi(env) > 0 ? (unsigned)atoi(env) * 1000u : 30000u;

	if (getenv("PINBROKER_DAEMON_WRAPPER"))
		return ms * 10;
#if defined(__SANITIZE_ADDRESS__)
	ms *= 4;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
	ms *= 4;
#endif
#endif
	return ms;
}

char itest_nofile_why[200];

int itest_need_fds(rlim_t want)
{
	struct rlimit rl;

	itest_nofile_why[0] = '\0';
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return -errno;
	if (rl.rlim_cur >= want)
		return 0;
	if (rl.rlim_max < want) {
		/* Root may raise the hard limit (CAP_SYS_RESOURCE), up to fs.nr_open. */
		struct rlimit up = { want, want };

		if (setrlimit(RLIMIT_NOFILE, &up) == 0)
			return 0;
		snprintf(itest_nofile_why, sizeof(itest_nofile_why),
			 "needs %llu open files and the hard RLIMIT_NOFILE is %llu (raise it: ulimit -Hn %llu, or "
			 "LimitNOFILE= in a unit)",
			 (unsigned long long)want, (unsigned long long)rl.rlim_max, (unsigned long long)want);
		return -EMFILE;
	}
	rl.rlim_cur = want;
	return setrlimit(RLIMIT_NOFILE, &rl) < 0 ? -errno : 0;
}

void itest_require_fds(rlim_t want)
{
	ck_assert_msg(itest_need_fds(want) == 0, "%s", itest_nofile_why);
}

/*
 * The staging folder (under /tmp, or /var/tmp or /dev/shm where /tmp is noexec), and the pid that made it (Check's
 * fork mode runs tests in children, which inherit it).
 */
static char stage_dir[64];
static pid_t stage_owner;

static void stage_remove(void)
{
	char cmd[128];

	if (stage_owner != getpid() || !stage_dir[0])
		return;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", stage_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", stage_dir);
	stage_dir[0] = '\0';
}

/* Copy src to dir/name with mode; 0 or -errno. */
static int copy_file(const char *src, const char *dir, const char *name, mode_t mode)
{
	char dst[PATH_MAX], buf[65536];
	int in, out, r = 0;
	ssize_t n;

	snprintf(dst, sizeof(dst), "%s/%s", dir, name);
	in = open(src, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return -errno;
	out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (out < 0) {
		r = -errno;
		close(in);
		return r == -EEXIST ? 0 : r;
	}
	while ((n = read(in, buf, sizeof(buf))) > 0)
		if (write(out, buf, (size_t)n) != n) {
			r = -EIO;
			break;
		}
	if (n < 0)
		r = -errno;
	/* Explicit mode: the umask (077 on some root accounts) must not make the copy unreadable to others. */
	if (r == 0 && fchmod(out, mode) < 0)
		r = -errno;
	close(in);
	if (close(out) < 0 && r == 0)
		r = -errno;
	return r;
}

const char *itest_stage(const char *path)
{
	return itest_stage_as(path, strrchr(path, '/') ? strrchr(path, '/') + 1 : path);
}

const char *itest_stage_as(const char *path, const char *relpath)
{
	/* Copies made by this process: the source path and where it went. */
	static struct {
		const char *src;
		char dst[PATH_MAX];
	} staged[16];
	char sub[PATH_MAX];
	size_t i;
	int r;

	if (stage_owner != getpid()) {
		/* Where programs may run: a hardened host mounts /tmp noexec. */
		static const char *const tops[] = { "/tmp", "/var/tmp", "/dev/shm" };
		struct statvfs vfs;
		size_t t = 0;

		while (t + 1 < sizeof(tops) / sizeof(tops[0]) && statvfs(tops[t], &vfs) == 0 &&
		       (vfs.f_flag & ST_NOEXEC))
			t++;
		/* A test child's copy of its parent's record: this process makes (and removes) its own. */
		snprintf(stage_dir, sizeof(stage_dir), "%s/pbstage.XXXXXX", tops[t]);
		ck_assert_ptr_nonnull(mkdtemp(stage_dir));
		ck_assert_int_eq(chmod(stage_dir, 0755), 0);
		stage_owner = getpid();
		memset(staged, 0, sizeof(staged));
		atexit(stage_remove);
		/* The build tree's pinctl finds libpinbroker at $ORIGIN: it goes next to every staged program. */
		r = copy_file(LIBPINBROKER_PATH, stage_dir, LIBPINBROKER_SONAME, 0644);
		ck_assert_msg(r == 0, "cannot stage %s in %s: %s", LIBPINBROKER_PATH, stage_dir, strerror(-r));
	}
	for (i = 0; i < sizeof(staged) / sizeof(staged[0]) && staged[i].src; i++)
		if (strcmp(staged[i].src, path) == 0)
			return staged[i].dst;
	ck_assert_uint_lt(i, sizeof(staged) / sizeof(staged[0]));
	/* Each folder of relpath, made reachable (0755 whatever the umask). */
	for (const char *slash = strchr(relpath, '/'); slash; slash = strchr(slash + 1, '/')) {
		snprintf(sub, sizeof(sub), "%s/%.*s", stage_dir, (int)(slash - relpath), relpath);
		ck_assert_msg(mkdir(sub, 0755) == 0 || errno == EEXIST, "cannot make %s: %s", sub, strerror(errno));
		ck_assert_int_eq(chmod(sub, 0755), 0);
	}
	r = copy_file(path, stage_dir, relpath, 0755);
	ck_assert_msg(r == 0, "cannot stage %s in %s: %s", path, stage_dir, strerror(-r));
	staged[i].src = path;
	snprintf(staged[i].dst, sizeof(staged[i].dst), "%s/%s", stage_dir, relpath);
	return staged[i].dst;
}

char *itest_read_file(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf = NULL;
	size_t len = 0;

	if (!f)
		return NULL;
	if (getdelim(&buf, &len, '\0', f) < 0) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	return buf;
}

char *itest_table_cell(const char *table, const char *row_prefix, const char *col)
{
	size_t cl = strlen(col), off = 0;
	bool header = false;

	for (const char *l = table; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		size_t len = strcspn(l, "\n");

		if (!header) {
			for (size_t p = 0; p + cl <= len && !header; p++)
				if ((p == 0 || l[p - 1] == ' ') && strncmp(l + p, col, cl) == 0 &&
				    (p + cl == len || l[p + cl] == ' ')) {
					header = true;
					off = p;
				}
			continue;
		}
		if (strncmp(l, row_prefix, strlen(row_prefix)) == 0) {
			if (len <= off || l[off] == ' ')
				return NULL;
			return strndup(l + off, strcspn(l + off, " \n"));
		}
	}
	return NULL;
}

int run_capture(const char *cmdline, char **out)
{
	char *full = NULL;
	FILE *p;
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	int st;

	ck_assert_ptr_nonnull(buf);
	ck_assert_int_ge(asprintf(&full, "%s 2>&1", cmdline), 0);
	p = popen(full, "r");
	ck_assert_ptr_nonnull(p);
	for (;;) {
		size_t n;

		if (len + 1024 > cap) {
			cap *= 2;
			buf = realloc(buf, cap);
			ck_assert_ptr_nonnull(buf);
		}
		n = fread(buf + len, 1, cap - len - 1, p);
		if (n == 0)
			break;
		len += n;
	}
	buf[len] = '\0';
	st = pclose(p);
	free(full);
	if (out)
		*out = buf;
	else
		free(buf);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int pinctl_as(const struct daemon *d, uid_t uid, char **out, const char *args)
{
	char *cmd = NULL;
	size_t len = 0;
	int pfd[2], st;
	pid_t pid;
	FILE *f;

	/* The staged copy: the build tree may lie where uid cannot reach it. */
	ck_assert_int_ge(asprintf(&cmd, "%s --socket '%s' %s", ITEST_PINCTL_FOR_OTHERS, d->socket, args), 0);
	ck_assert_int_eq(pipe(pfd), 0);
	pid = itest_fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		itest_drop_to(uid);
		dup2(pfd[1], 1);
		dup2(pfd[1], 2);
		close(pfd[0]);
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	free(cmd);
	f = fdopen(pfd[0], "r");
	ck_assert_ptr_nonnull(f);
	*out = NULL;
	if (getdelim(out, &len, '\0', f) < 0) {
		free(*out);
		*out = strdup("");
	}
	fclose(f);
	ck_assert_ptr_nonnull(*out);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int pinctl(const struct daemon *d, char **out, const char *fmt, ...)
{
	char *args = NULL, *cmd = NULL;
	va_list ap;
	int r;

	va_start(ap, fmt);
	ck_assert_int_ge(vasprintf(&args, fmt, ap), 0);
	va_end(ap);
	ck_assert_int_ge(asprintf(&cmd, "%s --socket '%s' %s", PINCTL_PATH, d->socket, args), 0);
	r = run_capture(cmd, out);
	free(args);
	free(cmd);
	return r;
}

void itest_pinctl_says(const struct daemon *d, int want_exit, const char *args, ...)
{
	const char *needle;
	char *out = NULL;
	va_list ap;
	int r = pinctl(d, &out, "%s", args);

	ck_assert_msg(r == want_exit, "pinctl %s: exit %d, want %d\n%s", args, r, want_exit, itest_tail(out));
	va_start(ap, args);
	while ((needle = va_arg(ap, const char *)))
		ck_assert_msg(strstr(out, needle), "pinctl %s: '%s' not in\n%s", args, needle, itest_tail(out));
	va_end(ap);
	free(out);
}

void itest_drop_to(uid_t uid)
{
	if (setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0)
		_exit(90);
}

static int64_t status_field(const char *socket_path, int which)
{
	struct pb_status *s = NULL;
	pb_client *c = NULL;
	int64_t v = -1;

	if (pb_connect(socket_path, &c) < 0)
		return -1;
	if (pb_status_get(c, &s) == 0) {
		v = which == 0 ? (int64_t)s->leased_bytes : (int64_t)s->pool_bytes;
		pb_status_free(s);
	}
	pb_disconnect(c);
	return v;
}

int64_t status_leased(const char *socket_path)
{
	return status_field(socket_path, 0);
}

int64_t status_pool(const char *socket_path)
{
	return status_field(socket_path, 1);
}

int64_t wait_leased(const char *socket_path, int64_t want, int timeout_ms)
{
	uint64_t t0 = mono_ms();
	int64_t v;

	for (;;) {
		v = status_leased(socket_path);
		if (v == want || mono_ms() - t0 > (uint64_t)timeout_ms)
			return v;
		usleep(10000);
	}
}

struct pb_status *itest_status(const char *socket_path)
{
	struct pb_status *s;
	pb_client *c;

	ck_assert_int_eq(pb_connect(socket_path, &c), 0);
	ck_assert_int_eq(pb_status_get(c, &s), 0);
	pb_disconnect(c);
	return s;
}

const struct pb_lease_info *itest_lease_row(const struct pb_status *s, uint64_t id)
{
	for (size_t i = 0; i < s->n_leases; i++)
		if (s->leases[i].id == id)
			return &s->leases[i];
	return NULL;
}

uint64_t itest_now_ms(void)
{
	return mono_ms();
}

uint32_t wait_waiting_acquires(const char *socket_path, uint32_t want, int timeout_ms)
{
	uint64_t t0 = mono_ms();
	uint32_t v = UINT32_MAX;

	for (;;) {
		struct pb_status *s = NULL;
		pb_client *c = NULL;

		if (pb_connect(socket_path, &c) == 0) {
			if (pb_status_get(c, &s) == 0) {
				v = s->waiting_acquires;
				pb_status_free(s);
			}
			pb_disconnect(c);
		}
		if (v == want || mono_ms() - t0 > (uint64_t)timeout_ms)
			return v;
		usleep(10000);
	}
}

bool daemon_wait_log(const struct daemon *d, const char *needle, int timeout_ms)
{
	uint64_t t0 = mono_ms();

	for (;;) {
		char *log = daemon_log(d);
		/* Only this start's output: an earlier start's line is not the event waited for. */
		bool found = log && (long)strlen(log) >= d->log_from && strstr(log + d->log_from, needle);

		free(log);
		if (found)
			return true;
		if (mono_ms() - t0 > (uint64_t)timeout_ms)
			return false;
		usleep(10000);
	}
}

bool wait_daemon_uptime(const char *socket_path, uint64_t uptime_ms, int timeout_ms)
{
	uint64_t t0 = mono_ms();

	for (;;) {
		struct pb_status *s = NULL;
		pb_client *c = NULL;
		bool past = false;

		if (pb_connect(socket_path, &c) == 0) {
			if (pb_status_get(c, &s) == 0) {
				past = s->uptime_ms >= uptime_ms;
				pb_status_free(s);
			}
			pb_disconnect(c);
		}
		if (past)
			return true;
		if (mono_ms() - t0 > (uint64_t)timeout_ms)
			return false;
		usleep(10000);
	}
}

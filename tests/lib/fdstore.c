/* SPDX-License-Identifier: MIT */
/* A stand-in for systemd's side of sd_notify and the fd store, so recovery can be tested without a booted systemd. */
#define _GNU_SOURCE
#include "fdstore.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* A notify datagram is a few lines; systemd caps the fds it takes per message (SCM_MAX_FD is 253). */
#define NOTIFY_MSG_BYTES 4096
#define NOTIFY_MAX_FDS 253

struct stored {
	int fd;
	char name[256];
	dev_t dev;
	ino_t ino;
};

struct fdstore {
	struct daemon *d;
	int notify_fd;
	int listen_fd;
	int stop_pipe[2];
	char notify_path[320];
	pthread_t thread;
	pthread_mutex_t lock; /* guards everything below; a message is received and applied under it */
	struct stored *fds;
	size_t n, cap;
	bool ready;
	/*
	 * Prepared before fork for the child: it must not read the store while the thread may change it, nor malloc
	 * (a child forked while another thread is in the allocator may hang there under GCC 12's sanitizer).
	 */
	int *child_fds;
	int *child_tmp;
	size_t child_n;
	char *child_names;
	char **child_env;       /* the daemon's environment (itest_env_make) */
	char *child_vars[5];    /* in it: NOTIFY_SOCKET, LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID (child_pid_var) */
	char child_pid_var[32]; /* LISTEN_PID=, written in the child */
};

/* Is pid the daemon? Its pid, or (before the parent has stored it) a child of this process. */
static bool from_daemon(struct fdstore *fs, pid_t pid)
{
	char path[64], buf[512], *p;
	pid_t main_pid = __atomic_load_n(&fs->d->pid, __ATOMIC_ACQUIRE);
	int ppid = -1;
	FILE *f;

	if (pid > 0 && pid == main_pid)
		return true;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return false;
	if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')) != NULL)
		sscanf(p + 1, " %*c %d", &ppid);
	fclose(f);
	return ppid == (int)getpid();
}

static void store_fd_locked(struct fdstore *fs, int fd, const char *name)
{
	struct stat st;

	if (fstat(fd, &st) < 0 || fs->n >= FDSTORE_MAX) {
		close(fd);
		return;
	}
	/* systemd keeps one copy of a file stored twice. */
	for (size_t i = 0; i < fs->n; i++)
		if (fs->fds[i].dev == st.st_dev && fs->fds[i].ino == st.st_ino) {
			close(fd);
			return;
		}
	if (fs->n == fs->cap) {
		size_t cap = fs->cap ? fs->cap * 2 : 64;
		struct stored *n = realloc(fs->fds, cap * sizeof(*n));

		if (!n) {
			close(fd);
			return;
		}
		fs->fds = n;
		fs->cap = cap;
	}
	fs->fds[fs->n].fd = fd;
	snprintf(fs->fds[fs->n].name, sizeof(fs->fds[fs->n].name), "%s", name);
	fs->fds[fs->n].dev = st.st_dev;
	fs->fds[fs->n].ino = st.st_ino;
	fs->n++;
}

static void remove_name_locked(struct fdstore *fs, const char *name)
{
	size_t k = 0;

	for (size_t i = 0; i < fs->n; i++) {
		if (strcmp(fs->fds[i].name, name) == 0)
			close(fs->fds[i].fd);
		else
			fs->fds[k++] = fs->fds[i];
	}
	fs->n = k;
}

/* One datagram, if one is queued. Returns false when none was. */
static bool receive_one_locked(struct fdstore *fs)
{
	char buf[NOTIFY_MSG_BYTES + 1];
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(NOTIFY_MAX_FDS * sizeof(int))];
	} ctl;
	struct iovec iov = { buf, NOTIFY_MSG_BYTES };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b) };
	struct ucred cred = { 0 };
	int fds[NOTIFY_MAX_FDS];
	size_t nfds = 0;
	bool store = false, remove = false, have_cred = false;
	char name[256] = "stored";
	ssize_t len;

	len = recvmsg(fs->notify_fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (len < 0)
		return false;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

			memcpy(fds + nfds, CMSG_DATA(c), k * sizeof(int));
			nfds += k;
		} else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
			memcpy(&cred, CMSG_DATA(c), sizeof(cred));
			have_cred = true;
		}
	}
	buf[len] = '\0';
	for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (strcmp(line, "FDSTORE=1") == 0)
			store = true;
		else if (strcmp(line, "FDSTOREREMOVE=1") == 0)
			remove = true;
		else if (strncmp(line, "FDNAME=", 7) == 0)
			snprintf(name, sizeof(name), "%s", line + 7);
		else if (strcmp(line, "READY=1") == 0 && have_cred && from_daemon(fs, cred.pid))
			fs->ready = true;
	}
	/* NotifyAccess=main: whatever another process sends is ignored, its fds closed. */
	if (!have_cred || !from_daemon(fs, cred.pid))
		store = remove = false;
	if (remove)
		remove_name_locked(fs, name);
	for (size_t i = 0; i < nfds; i++) {
		if (store)
			store_fd_locked(fs, fds[i], name);
		else
			close(fds[i]);
	}
	return true;
}

/*
 * A fork waits until no store's reader is applying a message: it mallocs under its lock, and a child forked while
 * another thread is inside the allocator can hang in it for good (GCC 12's AddressSanitizer).
 */
#define LIVE_MAX 8
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fdstore *live[LIVE_MAX];
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void before_fork(void)
{
	pthread_mutex_lock(&live_lock);
	for (size_t i = 0; i < LIVE_MAX; i++)
		if (live[i])
			pthread_mutex_lock(&live[i]->lock);
}

static void after_fork(void)
{
	for (size_t i = 0; i < LIVE_MAX; i++)
		if (live[i])
			pthread_mutex_unlock(&live[i]->lock);
	pthread_mutex_unlock(&live_lock);
}

static void watch_forks(void)
{
	pthread_atfork(before_fork, after_fork, after_fork);
}

/* Add fs to the stores a fork waits for (add), or take it out. */
static void set_live(struct fdstore *fs, bool add)
{
	size_t i;

	pthread_once(&atfork_once, watch_forks);
	pthread_mutex_lock(&live_lock);
	for (i = 0; i < LIVE_MAX && live[i] != (add ? NULL : fs); i++)
		;
	ck_assert_msg(i < LIVE_MAX || !add, "more than %d fd stores at once", LIVE_MAX);
	if (i < LIVE_MAX)
		live[i] = add ? fs : NULL;
	pthread_mutex_unlock(&live_lock);
}

static void *reader_main(void *arg)
{
	struct fdstore *fs = arg;

	for (;;) {
		struct pollfd p[2] = { { fs->notify_fd, POLLIN, 0 }, { fs->stop_pipe[0], POLLIN, 0 } };

		if (poll(p, 2, -1) < 0)
			continue;
		if (p[1].revents)
			return NULL;
		pthread_mutex_lock(&fs->lock);
		while (receive_one_locked(fs))
			;
		pthread_mutex_unlock(&fs->lock);
	}
}

struct fdstore *fdstore_new(struct daemon *d)
{
	struct fdstore *fs = calloc(1, sizeof(*fs));
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int one = 1, bufsize = 8 << 20;

	ck_assert_ptr_nonnull(fs);
	fs->d = d;
	pthread_mutex_init(&fs->lock, NULL);
	snprintf(fs->notify_path, sizeof(fs->notify_path), "%s/notify", d->dir);
	ck_assert_uint_lt(strlen(fs->notify_path), sizeof(sa.sun_path));
	memcpy(sa.sun_path, fs->notify_path, strlen(fs->notify_path) + 1);
	fs->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fs->notify_fd, 0);
	ck_assert_int_eq(bind(fs->notify_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(setsockopt(fs->notify_fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)), 0);
	setsockopt(fs->notify_fd, SOL_SOCKET, SO_RCVBUFFORCE, &bufsize, sizeof(bufsize));

	/* The socket unit's socket: SocketMode=0660 with group pinbroker, or open to all without the group. */
	memset(sa.sun_path, 0, sizeof(sa.sun_path));
	memcpy(sa.sun_path, d->socket, strlen(d->socket) + 1);
	fs->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fs->listen_fd, 0);
	ck_assert_int_eq(bind(fs->listen_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(chmod(d->socket, 0666), 0);
	ck_assert_int_eq(listen(fs->listen_fd, SOMAXCONN), 0);

	ck_assert_int_eq(pipe2(fs->stop_pipe, O_CLOEXEC), 0);
	set_live(fs, true);
	ck_assert_int_eq(pthread_create(&fs->thread, NULL, reader_main, fs), 0);
	return fs;
}

void fdstore_free(struct fdstore *fs)
{
	if (!fs)
		return;
	if (write(fs->stop_pipe[1], "x", 1) != 1)
		abort();
	pthread_join(fs->thread, NULL);
	set_live(fs, false);
	for (size_t i = 0; i < fs->n; i++)
		close(fs->fds[i].fd);
	free(fs->fds);
	close(fs->notify_fd);
	close(fs->listen_fd);
	close(fs->stop_pipe[0]);
	close(fs->stop_pipe[1]);
	unlink(fs->notify_path);
	pthread_mutex_destroy(&fs->lock);
	free(fs);
}

/* In the child, on a failure to place the fds: say why in the daemon's log (its stderr by now), and exit 126. */
static __attribute__((noreturn)) void child_fail(const struct fdstore *fs, const char *what)
{
	struct rlimit rl = { 0, 0 };
	int e = errno;

	getrlimit(RLIMIT_NOFILE, &rl);
	dprintf(2, "fdstore stand-in: cannot pass %zu fds to the daemon: %s: %s (RLIMIT_NOFILE soft %llu, hard %llu)\n",
		fs->child_n, what, strerror(e), (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max);
	_exit(126);
}

/* In the child, before exec: the fds from 3 up, and the environment sd_listen_fds_with_names reads; no malloc. */
static void child_setup(void *ud)
{
	struct fdstore *fs = ud;
	int *tmp = fs->child_tmp;

	/* Park every fd above the target range first, so no dup2 overwrites one still to be placed. */
	for (size_t i = 0; i < fs->child_n; i++) {
		tmp[i] = fcntl(fs->child_fds[i], F_DUPFD_CLOEXEC, 3 + (int)fs->child_n);
		if (tmp[i] < 0)
			child_fail(fs, "F_DUPFD");
	}
	for (size_t i = 0; i < fs->child_n; i++)
		if (dup2(tmp[i], 3 + (int)i) < 0) /* dup2 clears FD_CLOEXEC on the target */
			child_fail(fs, "dup2");
	snprintf(fs->child_pid_var, sizeof(fs->child_pid_var), "LISTEN_PID=%d", (int)getpid());
	itest_env_apply(fs->child_env);
}

/* fs->child_env, made before the fork (child_setup writes LISTEN_PID's value). */
static void child_env_make(struct fdstore *fs)
{
	ck_assert_int_ge(asprintf(&fs->child_vars[0], "NOTIFY_SOCKET=%s", fs->notify_path), 0);
	ck_assert_int_ge(asprintf(&fs->child_vars[1], "LISTEN_FDS=%zu", fs->child_n), 0);
	ck_assert_int_ge(asprintf(&fs->child_vars[2], "LISTEN_FDNAMES=%s", fs->child_names), 0);
	snprintf(fs->child_pid_var, sizeof(fs->child_pid_var), "LISTEN_PID=");
	fs->child_vars[3] = fs->child_pid_var;
	fs->child_vars[4] = NULL;
	fs->child_env = itest_env_make(fs->child_vars);
}

static void child_env_free(struct fdstore *fs)
{
	for (size_t i = 0; i < 3; i++)
		free(fs->child_vars[i]);
	free(fs->child_env);
	fs->child_env = NULL;
}

void fdstore_daemon_start(struct fdstore *fs, const char *const *extra)
{
	size_t len = sizeof("pinbroker");
	char *p;

	pthread_mutex_lock(&fs->lock);
	/*
	 * This process holds the store and makes a copy of it below, and the child parks one more copy before placing
	 * them: room for three times the store (and what the store thread may add meanwhile), as a service manager
	 * has. A root shell's soft limit is 1024.
	 */
	itest_require_fds(3 * (fs->n + 1) + 256);
	fs->ready = false;
	fs->child_n = fs->n + 1;
	fs->child_fds = calloc(fs->child_n, sizeof(int));
	fs->child_tmp = calloc(fs->child_n, sizeof(int));
	ck_assert_ptr_nonnull(fs->child_tmp);
	for (size_t i = 0; i < fs->n; i++)
		len += strlen(fs->fds[i].name) + 1;
	fs->child_names = malloc(len);
	ck_assert_ptr_nonnull(fs->child_fds);
	ck_assert_ptr_nonnull(fs->child_names);
	fs->child_fds[0] = fcntl(fs->listen_fd, F_DUPFD_CLOEXEC, 3);
	p = fs->child_names + sprintf(fs->child_names, "pinbroker");
	for (size_t i = 0; i < fs->n; i++) {
		/* Copies: the child works from this list while the thread goes on changing the store. */
		fs->child_fds[i + 1] = fcntl(fs->fds[i].fd, F_DUPFD_CLOEXEC, 3);
		ck_assert_int_ge(fs->child_fds[i + 1], 0);
		p += sprintf(p, ":%s", fs->fds[i].name);
	}
	pthread_mutex_unlock(&fs->lock);
	child_env_make(fs);
	/* Not under the lock: the new daemon's notifications must be read while it starts. */
	daemon_restart_with(fs->d, extra, child_setup, fs);
	child_env_free(fs);
	for (size_t i = 0; i < fs->child_n; i++)
		close(fs->child_fds[i]);
	free(fs->child_fds);
	free(fs->child_tmp);
	fs->child_tmp = NULL;
	free(fs->child_names);
	fs->child_fds = NULL;
	fs->child_names = NULL;
}

void fdstore_daemon_kill(struct fdstore *fs)
{
	struct daemon *d = fs->d;

	ck_assert_int_gt(d->pid, 0);
	kill(d->pid, SIGKILL);
	ck_assert_int_eq(waitpid(d->pid, NULL, 0), d->pid);
	pthread_mutex_lock(&fs->lock);
	while (receive_one_locked(fs))
		;
	__atomic_store_n(&d->pid, 0, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&fs->lock);
}

void fdstore_daemon_crash_restart(struct fdstore *fs, const char *const *extra_args, pb_client *c)
{
	fdstore_daemon_kill(fs);
	fdstore_daemon_start(fs, extra_args);
	ck_assert_msg(itest_wait_answered(c, 2000), "the client was not answered after the restart: %s",
		      pb_last_error());
}

size_t fdstore_count(struct fdstore *fs, const char *prefix)
{
	size_t n = 0;

	pthread_mutex_lock(&fs->lock);
	for (size_t i = 0; i < fs->n; i++)
		n += !prefix || strncmp(fs->fds[i].name, prefix, strlen(prefix)) == 0;
	pthread_mutex_unlock(&fs->lock);
	return n;
}

int fdstore_get(struct fdstore *fs, const char *name)
{
	int fd = -1;

	pthread_mutex_lock(&fs->lock);
	for (size_t i = 0; i < fs->n && fd < 0; i++)
		if (strcmp(fs->fds[i].name, name) == 0)
			fd = fcntl(fs->fds[i].fd, F_DUPFD_CLOEXEC, 3);
	pthread_mutex_unlock(&fs->lock);
	return fd;
}

int fdstore_replace(struct fdstore *fs, const char *name, int fd)
{
	int copy = fcntl(fd, F_DUPFD_CLOEXEC, 3);

	if (copy < 0)
		return -errno;
	pthread_mutex_lock(&fs->lock);
	remove_name_locked(fs, name);
	store_fd_locked(fs, copy, name);
	pthread_mutex_unlock(&fs->lock);
	return 0;
}

void fdstore_remove(struct fdstore *fs, const char *name)
{
	pthread_mutex_lock(&fs->lock);
	remove_name_locked(fs, name);
	pthread_mutex_unlock(&fs->lock);
}

int fdstore_ready(struct fdstore *fs)
{
	int r;

	pthread_mutex_lock(&fs->lock);
	r = fs->ready;
	pthread_mutex_unlock(&fs->lock);
	return r;
}

/* SPDX-License-Identifier: MIT */
/* Reading a peer's pid and user namespaces: the pidfd's fdinfo, the pidfd namespace ioctls, /proc (peer-ns.h). */
#define _GNU_SOURCE
#include "peer-ns.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

/* A pidfd's fdinfo is three or four short lines. */
#define FDINFO_BYTES 512

static bool same_file(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* Ours (/proc/self/ns/NAME) against stat st of the peer's: SAME or OTHER; UNKNOWN with why when ours fails. */
static enum admin_ns compare_own(const char *name, const struct stat *st, char *why, size_t len)
{
	char path[64];
	struct stat own;

	snprintf(path, sizeof(path), "/proc/self/ns/%s", name);
	if (stat(path, &own) < 0) {
		snprintf(why, len, "cannot read %s: %s", path, strerror(errno));
		return ADMIN_NS_UNKNOWN;
	}
	return same_file(&own, st) ? ADMIN_NS_SAME : ADMIN_NS_OTHER;
}

static const char *ptrace_hint(int err)
{
	return err == EACCES || err == EPERM ? " (the daemon needs CAP_SYS_PTRACE, or to be root, to see a root peer's "
					       "namespaces)"
					     : "";
}

/*
 * /proc/PID/ns/NAME of the peer. Without a pidfd the pid may have been reused since connect(); with one, the
 * process must still be alive afterwards, so what was read is its.
 */
static enum admin_ns read_proc_ns(int pidfd, pid_t pid, const char *name, char *why, size_t len)
{
	char path[64];
	struct stat st;

	if (pid <= 0) {
		snprintf(why, len, "no pidfd, and its pid is not visible in the daemon's pid namespace");
		return ADMIN_NS_UNKNOWN;
	}
	snprintf(path, sizeof(path), "/proc/%d/ns/%s", (int)pid, name);
	if (stat(path, &st) < 0) {
		int err = errno;

		snprintf(why, len, "cannot read %s: %s%s", path, strerror(err), ptrace_hint(err));
		return ADMIN_NS_UNKNOWN;
	}
	if (pidfd >= 0 && sys_pidfd_send_signal(pidfd, 0, 0) < 0 && errno == ESRCH) {
		snprintf(why, len, "it exited while %s was read", path);
		return ADMIN_NS_UNKNOWN;
	}
	return compare_own(name, &st, why, len);
}

/* The namespace behind the pidfd's ioctl cmd; -ENOTTY (or -EINVAL) on a kernel without it. */
static int pidfd_ns_stat(int pidfd, unsigned long cmd, struct stat *st)
{
	int nsfd = ioctl(pidfd, cmd, 0);
	int r = 0;

	if (nsfd < 0)
		return -errno;
	if (fstat(nsfd, st) < 0)
		r = -errno;
	close(nsfd);
	return r;
}

static enum admin_ns read_ns(int pidfd, pid_t pid, const char *name, unsigned long cmd, char *why, size_t len)
{
	struct stat st;
	int r;

	if (pidfd < 0)
		return read_proc_ns(pidfd, pid, name, why, len);
	r = pidfd_ns_stat(pidfd, cmd, &st);
	if (r == 0)
		return compare_own(name, &st, why, len);
	if (r == -ENOTTY || r == -EINVAL || r == -EOPNOTSUPP)
		return read_proc_ns(pidfd, pid, name, why, len);
	snprintf(why, len, "cannot read its %s namespace through its pidfd: %s%s", name, strerror(-r), ptrace_hint(-r));
	return ADMIN_NS_UNKNOWN;
}

/* The pid namespace from the pidfd's fdinfo: the kernel's own account, no access to the peer needed. */
static int read_fdinfo_pidns(int pidfd, enum admin_ns *ret, char *why, size_t len)
{
	char path[64], buf[FDINFO_BYTES];
	ssize_t n;
	int fd, r;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", pidfd);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf));
	r = n < 0 ? -errno : 0;
	close(fd);
	if (r < 0)
		return r;
	r = admin_parse_pidfd_fdinfo(buf, (size_t)n, ret);
	if (r == 0 && *ret == ADMIN_NS_UNKNOWN)
		snprintf(why, len, "it exited before its pid namespace was read");
	return r;
}

void peer_ns_read(int pidfd, pid_t pid, struct admin_facts *f, char *why, size_t len)
{
	why[0] = '\0';
	if (pidfd < 0 || read_fdinfo_pidns(pidfd, &f->pidns, why, len) < 0)
		f->pidns = read_ns(pidfd, pid, "pid", PB_PIDFD_GET_PID_NAMESPACE, why, len);
	/* A container is named as one without the user namespace, which may need more rights to read. */
	if (f->pidns == ADMIN_NS_OTHER) {
		f->userns = ADMIN_NS_UNKNOWN;
		return;
	}
	f->userns = read_ns(pidfd, pid, "user", PB_PIDFD_GET_USER_NAMESPACE, why, len);
}

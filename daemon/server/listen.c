/* SPDX-License-Identifier: MIT */
/*
 * The daemon's own listening socket: a checked folder, a stale socket replaced only if it is one, the mode set at bind.
 */
#define _GNU_SOURCE
#include "listen.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"

static const char *file_kind(mode_t mode)
{
	if (S_ISLNK(mode))
		return "a symbolic link";
	if (S_ISREG(mode))
		return "a regular file";
	if (S_ISDIR(mode))
		return "a directory";
	return "not a socket";
}

/*
 * Whoever may write the folder may unlink our socket and put a symlink in
 * its place, so the folder must belong to us (or root) and be closed to
 * others. The sticky bit makes a shared folder (/tmp) safe: there only the
 * owner of an entry may remove or rename it.
 */
static int check_dir(int dfd, const char *dir)
{
	uid_t euid = geteuid();
	struct stat st;
	int r;

	if (fstat(dfd, &st) < 0) {
		r = -errno;
		log_warn("cannot inspect the socket folder %s", dir);
		return r;
	}
	if (st.st_uid != 0 && st.st_uid != euid) {
		log_warnx("socket folder %s is owned by uid %u, not by root or by the daemon's uid %u, so its owner "
			  "could replace the socket; chown root %s, or choose another --socket",
			  dir, (unsigned)st.st_uid, (unsigned)euid, dir);
		return -EPERM;
	}
	if (st.st_mode & S_ISVTX)
		return 0;
	if (st.st_mode & S_IWOTH) {
		log_warnx("socket folder %s (mode %04o) is writable by every user and not sticky, so anyone could "
			  "replace the socket; chmod o-w %s (or chmod +t %s), or choose another --socket",
			  dir, (unsigned)(st.st_mode & 07777), dir, dir);
		return -EPERM;
	}
	if ((st.st_mode & S_IWGRP) && st.st_gid != 0 && st.st_gid != getegid()) {
		log_warnx("socket folder %s (mode %04o) is writable by group %u and not sticky, so its members could "
			  "replace the socket; chmod g-w %s, or choose another --socket",
			  dir, (unsigned)(st.st_mode & 07777), (unsigned)st.st_gid, dir);
		return -EPERM;
	}
	return 0;
}

/* A socket file left by a crashed daemon is stale only if nobody answers on it; anything else stays. */
static int clear_stale(int dfd, const char *name, const struct sockaddr_un *sa)
{
	const char *path = sa->sun_path;
	struct stat st;
	int probe, r;

	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno == ENOENT)
			return 0;
		r = -errno;
		log_warn("cannot inspect %s", path);
		return r;
	}
	if (!S_ISSOCK(st.st_mode)) {
		log_warnx("%s exists and is %s, not a socket; refusing to replace it: remove it if it is stale, "
			  "or choose another --socket",
			  path, file_kind(st.st_mode));
		return -EEXIST;
	}
	probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (probe >= 0 && connect(probe, (const struct sockaddr *)sa, sizeof(*sa)) == 0) {
		close(probe);
		log_warnx("another pinbrokerd is already listening on %s; stop it or use --socket", path);
		return -EADDRINUSE;
	}
	if (probe >= 0)
		close(probe);
	if (unlinkat(dfd, name, 0) < 0 && errno != ENOENT) {
		r = -errno;
		log_warn("cannot remove the stale socket %s", path);
		return r;
	}
	return 0;
}

/* Bind with the final mode already in place: a chmod by path after bind could follow a swapped-in link. */
static int bind_with_mode(int fd, const struct sockaddr_un *sa, mode_t mode)
{
	mode_t old = umask(0777 & ~mode);
	int r = bind(fd, (const struct sockaddr *)sa, sizeof(*sa)) < 0 ? -errno : 0;

	umask(old);
	return r;
}

int listen_unix_socket(const char *path, int *ret)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct group *gr;
	mode_t mode = 0660;
	const char *name;
	char *dir = NULL, *slash;
	int dfd = -1, fd = -1, r;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		log_warnx("socket path '%s' is longer than %zu bytes; choose a shorter --socket", path,
			  sizeof(sa.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);

	dir = strdup(path);
	if (!dir)
		return -ENOMEM;
	slash = strrchr(dir, '/');
	name = slash ? path + (slash - dir) + 1 : path;
	if (!*name) {
		log_warnx("socket path '%s' names a folder, not a socket; add a file name to --socket", path);
		r = -EINVAL;
		goto out;
	}
	if (!slash)
		strcpy(dir, ".");
	else if (slash == dir)
		dir[1] = '\0';
	else
		*slash = '\0';
	if (mkdir(dir, 0755) < 0 && errno != EEXIST)
		log_warn("cannot create socket folder %s, ignoring", dir);

	/* Every later step works relative to this fd, the folder that was checked. */
	dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		r = -errno;
		log_warn("cannot open socket folder %s", dir);
		goto out;
	}
	r = check_dir(dfd, dir);
	if (r < 0)
		goto out;
	r = clear_stale(dfd, name, &sa);
	if (r < 0)
		goto out;

	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		r = -errno;
		log_warn("cannot create a socket");
		goto out;
	}
	/* Mode 0660, group pinbroker (DESIGN.md). Without the group, leave it open to all
	 * local users rather than unusable, and say how to fix it. */
	gr = getgrnam("pinbroker");
	if (!gr) {
		mode = 0666;
		log_info("group 'pinbroker' does not exist: socket %s is open to every local user; "
			 "create the group (systemd-sysusers) to restrict it",
			 path);
	}
	r = bind_with_mode(fd, &sa, mode);
	if (r < 0) {
		errno = -r;
		log_warn("cannot bind %s", path);
		goto out;
	}
	if (gr && geteuid() == 0 && fchownat(dfd, name, 0, gr->gr_gid, AT_SYMLINK_NOFOLLOW) < 0)
		log_warn("cannot chown %s to group pinbroker, ignoring", path);

	if (listen(fd, SOMAXCONN) < 0) {
		r = -errno;
		log_warn("cannot listen on %s", path);
		unlinkat(dfd, name, 0);
		goto out;
	}
	*ret = fd;
	fd = -1;
	r = 0;
out:
	if (fd >= 0)
		close(fd);
	if (dfd >= 0)
		close(dfd);
	free(dir);
	return r;
}

void listen_unlink(const char *path)
{
	struct stat st;

	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode) && unlink(path) < 0)
		log_warn("cannot remove the socket %s, ignoring", path);
}

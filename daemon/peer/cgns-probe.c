/* SPDX-License-Identifier: MIT */
/*
 * Where the daemon's cgroup namespace sits in the host's tree: reading /proc, setns, searching a host mount
 * (cgns-probe.h).
 */
#define _GNU_SOURCE
#include "cgns-probe.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

/* mountinfo of a container is a few KiB; a host's with many bind mounts stays well under this. */
#define MOUNTINFO_BYTES (256 * 1024)
/* cgroup.procs of the daemon's own cgroup: itself, a helper or two. */
#define PROCS_BYTES (64 * 1024)

/*
 * Into pid 1's cgroup namespace and straight back, reading our own cgroup in between: the host's name for it.
 * Only the calling thread changes namespace, and only for these few calls. Returns 0 or -errno (EACCES: no
 * ptrace access to pid 1; EPERM: no CAP_SYS_ADMIN, or a seccomp filter).
 */
static int host_self_by_setns(char *text, size_t len)
{
	int host_fd, own_fd, r = 0;
	ssize_t n;

	own_fd = open("/proc/thread-self/ns/cgroup", O_RDONLY | O_CLOEXEC);
	if (own_fd < 0)
		return -errno;
	host_fd = open("/proc/1/ns/cgroup", O_RDONLY | O_CLOEXEC);
	if (host_fd < 0) {
		r = -errno;
		close(own_fd);
		return r;
	}
	if (setns(host_fd, CLONE_NEWCGROUP) < 0) {
		r = -errno;
		goto out;
	}
	n = read_text_at(AT_FDCWD, "/proc/thread-self/cgroup", text, len);
	if (n < 0)
		r = (int)n;
	/* Everything else the daemon reads (its own limits, clients' paths) is its own namespace's view. */
	if (setns(own_fd, CLONE_NEWCGROUP) < 0)
		fatal("cannot return to my own cgroup namespace");
out:
	close(host_fd);
	close(own_fd);
	return r;
}

struct search {
	const char *procs; /* "cgroup.procs" below a candidate: ns_self's components, then the file */
	long pid;
	size_t dirs;
	char rel[JOBS_PATH_MAX]; /* the candidate's path below the mount root */
	char *buf;
};

/* Depth-first to exactly depth levels below dirfd: the directory whose procs file lists us. */
static bool search(struct search *s, int dirfd, unsigned depth)
{
	DIR *d;
	struct dirent *e;
	bool found = false;
	int fd;

	if (depth == 0)
		return read_text_at(dirfd, s->procs, s->buf, PROCS_BYTES) >= 0 && cgns_procs_has(s->buf, s->pid);
	fd = dup(dirfd);
	if (fd < 0)
		return false;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return false;
	}
	while (!found && (e = readdir(d)) != NULL) {
		size_t n = strlen(s->rel), nl = strlen(e->d_name);
		int sub;

		if (e->d_type != DT_DIR || strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (++s->dirs > CGNS_PROBE_DIRS_MAX || n + 1 + nl >= sizeof(s->rel))
			break;
		sub = openat(dirfd, e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (sub < 0)
			continue;
		s->rel[n] = '/';
		memcpy(s->rel + n + 1, e->d_name, nl + 1);
		found = search(s, sub, depth - 1);
		close(sub);
		if (!found)
			s->rel[n] = '\0';
	}
	closedir(d);
	return found;
}

/* The namespace root's host path from a host tree mount ups levels above it: the directory holding us. */
static int root_by_mount(const char *proc_root, const char *mnt, unsigned ups, const char *ns_self, char *root,
			 size_t len)
{
	char path[PATH_MAX + 256], procs[JOBS_PATH_MAX + 16];
	struct search s = { .procs = procs, .pid = (long)getpid() };
	bool found;
	int fd;

	snprintf(procs, sizeof(procs), "%s%scgroup.procs", strcmp(ns_self, "/") == 0 ? "" : ns_self + 1,
		 strcmp(ns_self, "/") == 0 ? "" : "/");
	snprintf(path, sizeof(path), "%s%s", proc_root, mnt);
	fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	s.buf = malloc(PROCS_BYTES);
	if (!s.buf) {
		close(fd);
		return -ENOMEM;
	}
	found = search(&s, fd, ups);
	free(s.buf);
	close(fd);
	if (!found)
		return s.dirs > CGNS_PROBE_DIRS_MAX ? -E2BIG : -ENOENT;
	snprintf(root, len, "%s", s.rel[0] ? s.rel : "/");
	return 0;
}

void cgns_probe(const char *proc_root, struct cgns_probe *ret)
{
	char path[PATH_MAX], text[4096], ns_self[JOBS_PATH_MAX], host_self[JOBS_PATH_MAX], mnt[PATH_MAX];
	char *mountinfo = NULL;
	bool v1 = false, real_root = proc_root[0] == '\0';
	unsigned ups, depth = 0;
	ssize_t n;
	int r;

	memset(ret, 0, sizeof(*ret));
	ret->ns.mode = CGNS_HOST;
	snprintf(ret->ns.root, sizeof(ret->ns.root), "/");
	snprintf(ret->host_mount_root, sizeof(ret->host_mount_root), "/");
	snprintf(path, sizeof(path), "%s/proc/1/cgroup", proc_root);
	n = read_text_at(AT_FDCWD, path, text, sizeof(text));
	r = n < 0 ? (int)n : cgns_detect(text, &ret->ns.mode);
	if (r < 0 || ret->ns.mode == CGNS_HOST) {
		if (r < 0)
			log_debug("cgroup namespace: %s unreadable (%s); taking mine for the host's", path,
				  strerror(-r));
		snprintf(ret->via, sizeof(ret->via), "pid 1 reads its cgroup inside mine");
		return;
	}
	/* Pid 1's climb: how far above our root the host's root is, which a host tree mount must reach. */
	if (cgns_host_depth(text, &depth) < 0)
		depth = 0;
	snprintf(path, sizeof(path), "%s/proc/thread-self/cgroup", proc_root);
	n = read_text_at(AT_FDCWD, path, text, sizeof(text));
	if (n < 0 && !real_root) {
		snprintf(path, sizeof(path), "%s/proc/self/cgroup", proc_root);
		n = read_text_at(AT_FDCWD, path, text, sizeof(text));
	}
	r = n < 0 ? (int)n : jobs_proc_cgroup_raw(text, ns_self, sizeof(ns_self), &v1);
	if (r < 0) {
		snprintf(ret->via, sizeof(ret->via), "my own cgroup is unreadable (%s: %s)", path, strerror(-r));
		goto unresolved;
	}

	/* First the kernel's own word: our cgroup as pid 1's namespace names it. */
	r = real_root ? host_self_by_setns(text, sizeof(text)) : -ENOTSUP;
	if (r == 0 && jobs_proc_cgroup_raw(text, host_self, sizeof(host_self), NULL) == 0 &&
	    cgns_root_from_self(host_self, ns_self, ret->ns.root, sizeof(ret->ns.root)) == 0) {
		ret->ns.mode = CGNS_PRIVATE;
		snprintf(ret->via, sizeof(ret->via), "setns into pid 1's cgroup namespace");
	} else {
		log_debug("cgroup namespace: no setns into pid 1's (%s)", r == -ENOTSUP ? "not the real /proc"
									  : r < 0       ? strerror(-r)
										  : "its reading did not fit mine");
	}

	/* A host tree mounted in (a hostPath of /sys/fs/cgroup): for the sweep, and the root where setns failed. */
	mountinfo = malloc(MOUNTINFO_BYTES);
	if (!mountinfo)
		goto done;
	snprintf(path, sizeof(path), "%s/proc/self/mountinfo", proc_root);
	n = read_text_at(AT_FDCWD, path, mountinfo, MOUNTINFO_BYTES);
	/* With the root known (setns), the host's root is exactly its depth above it. */
	if (ret->ns.mode == CGNS_PRIVATE)
		depth = cgns_depth(ret->ns.root);
	r = n < 0 ? (int)n : cgns_find_host_mount(mountinfo, v1, depth, mnt, sizeof(mnt), &ups);
	if (r == -ERANGE && ret->ns.mode == CGNS_PRIVATE &&
	    cgns_mount_root(&ret->ns, ups, ret->host_mount_root, sizeof(ret->host_mount_root)) == 0) {
		/*
		 * Only a subtree of the host's: the sweep looks there for paths below its root, its prefix taken off.
		 */
		log_info(
			"cgroup namespace: the %s tree at %s is the host's %s, not its root: the sweep looks for other "
			"cgroups through my own mounts",
			v1 ? "v1 memory" : "cgroup2", mnt, ret->host_mount_root);
		snprintf(ret->host_mount, sizeof(ret->host_mount), "%s", mnt);
		goto done;
	}
	if (r == -ERANGE && ret->ns.mode != CGNS_PRIVATE) {
		/* Its names are relative to an ancestor whose own host path nothing tells: resolving would drop it. */
		snprintf(ret->via, sizeof(ret->via),
			 "no setns into pid 1's cgroup namespace, and the %s tree at %.1024s climbs %u levels, not the "
			 "%u to the host's root (pid 1's view): a subtree of the host's, not its root",
			 v1 ? "v1 memory" : "cgroup2", mnt, ups, depth);
		goto done;
	}
	if (r < 0) {
		if (ret->ns.mode != CGNS_PRIVATE)
			snprintf(ret->via, sizeof(ret->via),
				 "no setns into pid 1's cgroup namespace and no host %s tree mounted in",
				 v1 ? "v1 memory" : "cgroup2");
		goto done;
	}
	if (ret->ns.mode == CGNS_PRIVATE) {
		snprintf(ret->host_mount, sizeof(ret->host_mount), "%s", mnt);
		goto done;
	}
	r = root_by_mount(proc_root, mnt, ups, ns_self, ret->ns.root, sizeof(ret->ns.root));
	if (r < 0) {
		snprintf(ret->via, sizeof(ret->via), "the host tree at %.1024s does not show me %s: %s", mnt,
			 r == -E2BIG ? "within its first directories" : "where it should",
			 r == -ENOENT ? "not found" : strerror(-r));
		snprintf(ret->ns.root, sizeof(ret->ns.root), "/");
		goto done;
	}
	ret->ns.mode = CGNS_PRIVATE;
	snprintf(ret->host_mount, sizeof(ret->host_mount), "%s", mnt);
	snprintf(ret->via, sizeof(ret->via), "found in the host's tree mounted at %.1024s", mnt);
done:
	free(mountinfo);
	if (ret->ns.mode == CGNS_PRIVATE) {
		log_info("cgroup namespace: my own, its root %s in the host's tree (%s); clients' cgroups are named "
			 "as the host names them",
			 ret->ns.root, ret->via);
		return;
	}
unresolved:
	ret->ns.mode = CGNS_UNRESOLVED;
	log_warnx("cgroup namespace: my own, not pid 1's, and where it sits in the host's tree is unknown (%s): "
		  "clients outside it are charged to no job, so quotas on their cgroups do not bind; mount the host's "
		  "/sys/fs/cgroup read-only into my container, run me in the host's cgroup namespace, or give me "
		  "CAP_SYS_ADMIN (docs/kubernetes.md)",
		  ret->via);
}

bool cgns_probe_exists(const struct cgns_probe *p, const char *proc_root, const char *const *mounts, size_t n,
		       const char *path)
{
	char rel[JOBS_PATH_MAX], f[PATH_MAX + JOBS_PATH_MAX + 64];

	if (p->host_mount[0]) {
		struct cgns sub = { .mode = CGNS_PRIVATE };

		/* A partial host mount (host_mount_root not "/") shows only what lies below its root, prefix off. */
		snprintf(sub.root, sizeof(sub.root), "%s", p->host_mount_root);
		if (cgns_to_ns(&sub, path, rel, sizeof(rel)) == 0) {
			snprintf(f, sizeof(f), "%s%s%s/cgroup.procs", proc_root, p->host_mount,
				 strcmp(rel, "/") == 0 ? "" : rel);
			return access(f, F_OK) == 0;
		}
	}
	/* Only the part of the host's tree inside our namespace is visible through our own mounts. */
	if (cgns_to_ns(&p->ns, path, rel, sizeof(rel)) < 0)
		return false;
	for (size_t i = 0; i < n; i++) {
		snprintf(f, sizeof(f), "%s/%s%s/cgroup.procs", proc_root, mounts[i], strcmp(rel, "/") == 0 ? "" : rel);
		if (access(f, F_OK) == 0)
			return true;
	}
	return false;
}

/* SPDX-License-Identifier: MIT */
/* A client's tenant at connect (peer-tenant.h): its pid namespace from its pidfd or /proc, and its job cgroup. */
#define _GNU_SOURCE
#include "peer-tenant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jobs.h"
#include "log.h"
#include "tenant.h"
#include "util.h"

#ifndef PIDFS_IOCTL_MAGIC
#define PIDFS_IOCTL_MAGIC 0xFF
#endif
#ifndef PIDFD_GET_PID_NAMESPACE
#define PIDFD_GET_PID_NAMESPACE _IO(PIDFS_IOCTL_MAGIC, 5)
#endif

/* PIDFD_GET_INFO (Linux 6.13), its first version: struct pidfd_info of <linux/pidfd.h>, which older headers lack. */
struct peer_pidfd_info {
	uint64_t mask;
	uint64_t cgroupid;
	uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid, spare0[1];
};
#define PEER_PIDFD_GET_INFO _IOWR(PIDFS_IOCTL_MAGIC, 11, struct peer_pidfd_info)
#define PEER_PIDFD_INFO_CGROUPID (1ull << 2)

/* The pidfd's process has not exited (no pidfd: cannot tell, taken as yes: the peer's pid is SO_PEERCRED's). */
static bool pidfd_alive(int pidfd)
{
	return pidfd < 0 || sys_pidfd_send_signal(pidfd, 0, 0) == 0 || errno == EPERM;
}

/* NSpid's pid count in <proc_root>/proc/<who>/status; 0 when it cannot be read. */
static unsigned nspid_count(const char *proc_root, const char *who)
{
	char path[320], text[4096];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/proc/%s/status", proc_root, who);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, text, sizeof(text) - 1);
	close(fd);
	return n > 0 ? tenant_parse_nspid(text, (size_t)n) : 0;
}

uint64_t peer_pidns(int pidfd, pid_t pid, const char *proc_root)
{
	char path[320], who[16];
	struct stat st;
	int nsfd;

	if (pidfd >= 0) {
		nsfd = ioctl(pidfd, PIDFD_GET_PID_NAMESPACE, 0);
		if (nsfd >= 0) {
			int r = fstat(nsfd, &st);

			close(nsfd);
			if (r == 0 && st.st_ino != 0)
				return (uint64_t)st.st_ino;
		}
	}
	if (pid <= 0)
		return 0;
	snprintf(path, sizeof(path), "%s/proc/%d/ns/pid", proc_root, (int)pid);
	if (stat(path, &st) == 0 && st.st_ino != 0 && pidfd_alive(pidfd))
		return (uint64_t)st.st_ino;
	snprintf(who, sizeof(who), "%d", (int)pid);
	if (nspid_count(proc_root, who) == 1 && nspid_count(proc_root, "self") == 1 && pidfd_alive(pidfd)) {
		snprintf(path, sizeof(path), "%s/proc/self/ns/pid", proc_root);
		if (stat(path, &st) == 0 && st.st_ino != 0)
			return (uint64_t)st.st_ino;
	}
	return 0;
}

/*
 * The peer's cgroup as a text: "id:N", the cgroup v2 id (PIDFD_GET_INFO, no /proc needed; the kernel never gives
 * a later cgroup the same id), else "path:P" from its job cgroup; false when neither is known.
 */
static bool peer_cgroup(int pidfd, const struct job_cgroup *cg, char *buf, size_t len)
{
	struct peer_pidfd_info info = { .mask = PEER_PIDFD_INFO_CGROUPID };

	if (pidfd >= 0 && ioctl(pidfd, PEER_PIDFD_GET_INFO, &info) == 0 && (info.mask & PEER_PIDFD_INFO_CGROUPID) &&
	    info.cgroupid != 0) {
		snprintf(buf, len, "id:%llu", (unsigned long long)info.cgroupid);
		return true;
	}
	if (!cg || !cg->path)
		return false;
	snprintf(buf, len, "path:%s", cg->path);
	return true;
}

uint64_t peer_tenant(struct tenants *t, uid_t uid, int pidfd, pid_t pid, const struct job_cgroup *cg,
		     const char *proc_root)
{
	uint64_t pidns = peer_pidns(pidfd, pid, proc_root);
	char cgroup[JOBS_PATH_MAX + 8];
	bool cg_known = peer_cgroup(pidfd, cg, cgroup, sizeof(cgroup));

	if (pidns == 0 || !cg_known)
		log_debug("pid %d: its %s cannot be told; it is a tenant of its own (memory reaches it only fresh)",
			  (int)pid, pidns == 0 ? "pid namespace" : "cgroup");
	return tenants_get(t, uid, pidns, cg_known ? cgroup : NULL);
}

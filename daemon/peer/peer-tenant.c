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

/* PIDFD_GET_INFO (Linux 6.13), its first version: struct pidfd_info of <linux/pidfd.h>, which older headers lack. */
struct peer_pidfd_info {
	uint64_t mask;
	uint64_t cgroupid;
	uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid, spare0[1];
};
#define PEER_PIDFD_GET_INFO _IOWR(PB_PIDFS_IOCTL_MAGIC, 11, struct peer_pidfd_info)
#define PEER_PIDFD_INFO_CGROUPID (1ull << 2)
/* NS_GET_ID (Linux 6.18): a namespace's 64-bit id, never reused while the system runs. */
#define PEER_NS_GET_ID _IOR(0xb7, 13, uint64_t)

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

/* A pid namespace fd's name: its 64-bit id where the kernel has one, else its inode (reusable: *kept false). */
static bool ns_name(int nsfd, char *buf, size_t len, bool *kept)
{
	uint64_t id = 0;
	struct stat st;

	if (ioctl(nsfd, PEER_NS_GET_ID, &id) == 0 && id != 0) {
		snprintf(buf, len, "id:%llu", (unsigned long long)id);
		*kept = true;
		return true;
	}
	if (fstat(nsfd, &st) < 0 || st.st_ino == 0)
		return false;
	snprintf(buf, len, "ino:%llu", (unsigned long long)st.st_ino);
	*kept = false;
	return true;
}

bool peer_pidns(int pidfd, pid_t pid, const char *proc_root, char *buf, size_t len, bool *kept)
{
	char path[320], who[16];
	bool ok = false;
	int nsfd;

	if (pidfd >= 0) {
		nsfd = ioctl(pidfd, PB_PIDFD_GET_PID_NAMESPACE, 0);
		if (nsfd >= 0) {
			ok = ns_name(nsfd, buf, len, kept);
			close(nsfd);
			if (ok)
				return true;
		}
	}
	if (pid <= 0)
		return false;
	snprintf(path, sizeof(path), "%s/proc/%d/ns/pid", proc_root, (int)pid);
	nsfd = open(path, O_RDONLY | O_CLOEXEC);
	if (nsfd >= 0) {
		ok = ns_name(nsfd, buf, len, kept) && pidfd_alive(pidfd);
		close(nsfd);
		if (ok)
			return true;
	}
	snprintf(who, sizeof(who), "%d", (int)pid);
	if (nspid_count(proc_root, who) == 1 && nspid_count(proc_root, "self") == 1 && pidfd_alive(pidfd)) {
		/* The daemon's own namespace lives as long as the daemon: its name is never another's. */
		snprintf(buf, len, "self");
		*kept = true;
		return true;
	}
	return false;
}

/*
 * The peer's cgroup as a text: "id:N", the cgroup v2 id (PIDFD_GET_INFO, no /proc needed; the kernel never gives
 * a later cgroup the same id), else "path:P" from its job cgroup (a later cgroup may have it: *kept false); false
 * when neither is known.
 */
static bool peer_cgroup(int pidfd, const struct job_cgroup *cg, char *buf, size_t len, bool *kept)
{
	struct peer_pidfd_info info = { .mask = PEER_PIDFD_INFO_CGROUPID };

	if (pidfd >= 0 && ioctl(pidfd, PEER_PIDFD_GET_INFO, &info) == 0 && (info.mask & PEER_PIDFD_INFO_CGROUPID) &&
	    info.cgroupid != 0) {
		snprintf(buf, len, "id:%llu", (unsigned long long)info.cgroupid);
		*kept = true;
		return true;
	}
	if (!cg || !cg->path)
		return false;
	snprintf(buf, len, "path:%s", cg->path);
	*kept = false;
	return true;
}

uint64_t peer_tenant(struct tenants *t, uid_t uid, int pidfd, pid_t pid, const struct job_cgroup *cg,
		     const char *proc_root)
{
	char pidns[40], cgroup[JOBS_PATH_MAX + 8];
	bool ns_kept = false, cg_kept = false;
	bool ns_known = peer_pidns(pidfd, pid, proc_root, pidns, sizeof(pidns), &ns_kept);
	bool cg_known = peer_cgroup(pidfd, cg, cgroup, sizeof(cgroup), &cg_kept);

	if (!ns_known || !cg_known)
		log_debug("pid %d: its %s cannot be told; it is a tenant of its own (memory reaches it only fresh)",
			  (int)pid, !ns_known ? "pid namespace" : "cgroup");
	return tenants_get(t, uid, ns_known ? pidns : NULL, cg_known ? cgroup : NULL, ns_kept && cg_kept);
}

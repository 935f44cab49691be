/* SPDX-License-Identifier: MIT */
/*
 * pinctl doctor's checks: privileges, huge pages and THP, CUDA, socket and groups, cgroup and its namespace, PSI,
 * service, budget; each adds one finding, with its fix.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pinbroker.h"
#include "pinctl-doctor.h"
#include "util.h"

#define DOCTOR_SYSTEMCTL_ENV "PINBROKER_DOCTOR_SYSTEMCTL"
#define HUGE_2M_BYTES (UINT64_C(2) << 20)
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif
#define CAP_IPC_LOCK_BIT 14 /* linux/capability.h */
/* A v1 memory.limit_in_bytes at or above this is PAGE_COUNTER_MAX rounded to a page: no limit. */
#define V1_UNLIMITED_BYTES (UINT64_C(1) << 62)
/* Past these shares of MemTotal (or of the cgroup limit) the locked budget crowds out everything else. */
#define BUDGET_WARN_PCT 50

static void mode_owner(const char *path, char *buf, size_t len)
{
	struct stat st;
	struct group *g;

	if (stat(path, &st) < 0) {
		snprintf(buf, len, "%s: %s", path, strerror(errno));
		return;
	}
	g = getgrgid(st.st_gid);
	if (g)
		snprintf(buf, len, "%s %04o group %s", path, (unsigned)(st.st_mode & 07777), g->gr_name);
	else
		snprintf(buf, len, "%s %04o group %u", path, (unsigned)(st.st_mode & 07777), (unsigned)st.st_gid);
}

static void check_socket(struct doctor *d)
{
	char dir[PATH_MAX], dm[PATH_MAX + 64], sm[PATH_MAX + 64];
	char *slash;
	struct finding *f;

	snprintf(dir, sizeof(dir), "%s", d->socket);
	slash = strrchr(dir, '/');
	if (slash && slash != dir)
		*slash = '\0';
	mode_owner(dir, dm, sizeof(dm));
	mode_owner(d->socket, sm, sizeof(sm));
	if (d->connect_err == 0) {
		doctor_add(d, "socket", DOCTOR_OK, "connected to %s (folder %s; socket %s)", d->socket, dm, sm);
		return;
	}
	if (doctor_no_daemon(d)) {
		f = doctor_add(d, "socket", DOCTOR_FAIL, "cannot connect to %s: %s: pinbrokerd is not running there",
			       d->socket, strerror(-d->connect_err));
		doctor_fix(f,
			   "sudo systemctl enable --now pinbrokerd.socket, or by hand: sudo pinbrokerd --socket %s "
			   "(--socket PATH names another socket)",
			   d->socket);
		return;
	}
	switch (d->connect_err) {
	case -EACCES:
		f = doctor_add(d, "socket", DOCTOR_FAIL,
			       "cannot connect to %s: permission denied (folder %s; socket %s)", d->socket, dm, sm);
		doctor_fix(f, "connect needs search (x) on the folder and write on the socket: join the socket's group "
			      "(usermod -aG GROUP $USER, then log in again) or run as root");
		break;
	default:
		f = doctor_add(d, "socket", DOCTOR_FAIL, "cannot connect to %s: %s", d->socket, d->connect_msg);
		doctor_fix(f, "see journalctl -u pinbrokerd; use the pinctl that came with this pinbrokerd");
		break;
	}
}

static bool in_group(gid_t gid)
{
	gid_t groups[NGROUPS_MAX];
	int n = getgroups(NGROUPS_MAX, groups);

	if (getegid() == gid || getgid() == gid)
		return true;
	for (int i = 0; i < n; i++)
		if (groups[i] == gid)
			return true;
	return false;
}

/* admin-group from the daemon's command line (--admin-group G), else from its config file. "" when unset. */
static bool daemon_admin_group(const struct doctor *d, char *out, size_t len, char *whence, size_t wlen)
{
	char path[64], args[8192], conf[PATH_MAX] = "/etc/pinbroker/pinbrokerd.conf", text[65536];
	ssize_t n;

	out[0] = '\0';
	if (d->daemon_pid) {
		snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)d->daemon_pid);
		n = doctor_read_text(path, args, sizeof(args));
		for (ssize_t i = 0; n > 0 && i < n; i += (ssize_t)strlen(args + i) + 1) {
			const char *a = args + i, *next = i + (ssize_t)strlen(a) + 1 < n ? a + strlen(a) + 1 : NULL;

			if (strcmp(a, "--admin-group") == 0 && next) {
				snprintf(out, len, "%s", next);
				snprintf(whence, wlen, "the daemon's command line");
				return true;
			}
			if (strcmp(a, "--config") == 0 && next)
				snprintf(conf, sizeof(conf), "%s", next);
		}
	}
	if (doctor_read_text(conf, text, sizeof(text)) < 0)
		return false;
	snprintf(whence, wlen, "%s", conf);
	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
		char *p = line + strspn(line, " \t"), *v;

		if (strncmp(p, "admin-group", 11) != 0)
			continue;
		p += 11;
		p += strspn(p, " \t");
		if (*p != '=')
			continue;
		v = p + 1 + strspn(p + 1, " \t\"");
		v[strcspn(v, " \t\"#")] = '\0';
		snprintf(out, len, "%s", v);
	}
	return true;
}

static void check_groups(struct doctor *d)
{
	char admin[128], whence[PATH_MAX], gname[64];
	struct group *g;
	struct stat st;
	struct finding *f;
	bool sock_ok, have_admin;

	if (stat(d->socket, &st) < 0) {
		doctor_add(d, "groups", DOCTOR_SKIP, "no socket at %s to compare groups with", d->socket);
		return;
	}
	g = getgrgid(st.st_gid);
	snprintf(gname, sizeof(gname), "%s", g ? g->gr_name : "?");
	sock_ok = geteuid() == 0 || geteuid() == st.st_uid || in_group(st.st_gid) || (st.st_mode & S_IWOTH);
	have_admin = daemon_admin_group(d, admin, sizeof(admin), whence, sizeof(whence));
	if (!sock_ok) {
		f = doctor_add(d, "groups", DOCTOR_FAIL, "you (uid %u) are not in the socket's group %s",
			       (unsigned)geteuid(), gname);
		doctor_fix(f, "usermod -aG %s $USER, then log in again", gname);
		return;
	}
	if (!have_admin) {
		doctor_add(d, "groups", DOCTOR_OK,
			   "%s (socket group %s); the admin group is unknown (cannot read the daemon's "
			   "config)",
			   geteuid() == 0 ? "root: may connect, admin" : "may connect", gname);
	} else if (!admin[0]) {
		doctor_add(d, "groups", DOCTOR_OK,
			   "%s (socket group %s); admin-group is empty in %s: only root is admin",
			   geteuid() == 0 ? "root: may connect, admin" : "may connect", gname, whence);
	} else if ((g = getgrnam(admin)) == NULL) {
		f = doctor_add(d, "groups", DOCTOR_WARN,
			       "may connect (socket group %s); admin-group %s (from %s) does not "
			       "exist, so only root is admin",
			       gname, admin, whence);
		doctor_fix(f, "groupadd %s, or set admin-group to an existing group", admin);
	} else {
		doctor_add(d, "groups", DOCTOR_OK,
			   "may connect (socket group %s); admin-group %s (from %s): you are %s", gname, admin, whence,
			   geteuid() == 0 || in_group(g->gr_gid) ? "an admin"
								 : "not an admin (usermod -aG to become one)");
	}
}

/* Whether pid runs in pinbrokerd.service's cgroup (the unit's daemon), as /proc/PID/cgroup says. */
static bool daemon_in_its_unit(pid_t pid)
{
	char path[64], buf[4096];

	snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	return doctor_read_text(path, buf, sizeof(buf)) >= 0 && strstr(buf, "/pinbrokerd.service") != NULL;
}

/*
 * Who may connect: connect() needs write on the socket and search (x) on every folder above it. A socket
 * that others may write, under folders that all let others through, is open to every local user: any of
 * them may lease pinned memory up to the uid quota (admin requests still need root or admin-group).
 */
static void check_socket_access(struct doctor *d)
{
	char dir[PATH_MAX], closed[PATH_MAX] = "";
	struct stat st, ds;
	unsigned closed_mode = 0;
	struct finding *f;

	if (stat(d->socket, &st) < 0 || !S_ISSOCK(st.st_mode)) {
		doctor_add(d, "socket-access", DOCTOR_SKIP, "no socket at %s to check", d->socket);
		return;
	}
	snprintf(dir, sizeof(dir), "%s", d->socket);
	/* The nearest folder that keeps others out, walking up from the socket's. */
	for (char *slash = strrchr(dir, '/'); slash; slash = strrchr(dir, '/')) {
		*slash = '\0';
		if (stat(dir[0] ? dir : "/", &ds) == 0 && !(ds.st_mode & S_IXOTH)) {
			snprintf(closed, sizeof(closed), "%s", dir[0] ? dir : "/");
			closed_mode = (unsigned)(ds.st_mode & 07777);
			break;
		}
	}
	if (!(st.st_mode & S_IWOTH)) {
		doctor_add(d, "socket-access", DOCTOR_OK,
			   "socket %s is mode %04o: only its owner and group may connect", d->socket,
			   (unsigned)(st.st_mode & 07777));
		return;
	}
	if (closed[0]) {
		doctor_add(d, "socket-access", DOCTOR_OK,
			   "socket %s is mode %04o, but the folder %s (mode %04o) keeps other users out", d->socket,
			   (unsigned)(st.st_mode & 07777), closed, closed_mode);
		return;
	}
	f = doctor_add(d, "socket-access", DOCTOR_WARN,
		       "socket %s is mode %04o under folders that let everyone through: any local user may connect "
		       "and lease pinned memory up to the uid quota",
		       d->socket, (unsigned)(st.st_mode & 07777));
	/* pinbrokerd binds 0660 group pinbroker, and falls back to 0666 only where that group is missing. */
	if (d->daemon_pid && !daemon_in_its_unit(d->daemon_pid)) {
		/* Started by hand (scripts/demo.sh's daemon is): no unit to restart, no SocketMode= to set. */
		doctor_fix(
			f,
			"this pinbrokerd (pid %d) was started by hand, as scripts/demo.sh starts it, on a host without "
			"the group pinbroker, so it made the socket 0666. On a machine only you use that is fine; "
			"otherwise stop it (kill %d) and start it again with PINBROKER_SOCKET naming a socket in a "
			"folder only you may enter (mkdir -m 0700 ~/pinbroker-run), or after groupadd --system "
			"pinbroker, when it binds the socket 0660 group pinbroker",
			(int)d->daemon_pid, (int)d->daemon_pid);
		return;
	}
	doctor_fix(f,
		   "create the group (systemd-sysusers, or groupadd --system pinbroker) and restart pinbrokerd, which "
		   "then binds the socket 0660 group pinbroker; under socket activation set SocketMode=0660 "
		   "SocketGroup=pinbroker");
}

static bool cap_ipc_lock(const char *status_path, bool *known)
{
	char buf[4096];
	uint64_t eff;

	*known = doctor_read_text(status_path, buf, sizeof(buf)) >= 0 && doctor_field_u64(buf, "CapEff", 16, &eff) == 0;
	return *known && (eff >> CAP_IPC_LOCK_BIT & 1);
}

/* /proc/PID/limits' "Max locked memory" soft limit; UINT64_MAX for unlimited. */
static int memlock_limit(const char *limits_path, uint64_t *ret)
{
	char buf[4096], *p;

	if (doctor_read_text(limits_path, buf, sizeof(buf)) < 0 || !(p = strstr(buf, "Max locked memory")))
		return -ENOENT;
	p += strlen("Max locked memory");
	p += strspn(p, " ");
	*ret = strncmp(p, "unlimited", 9) == 0 ? UINT64_MAX : strtoull(p, NULL, 10);
	return 0;
}

static const char *limit_str(uint64_t v, char *buf, size_t len)
{
	return v == UINT64_MAX ? "unlimited" : format_size(v, buf, len);
}

static void check_daemon_memlock(struct doctor *d)
{
	char path[64], lim[32], bud[32];
	uint64_t limit;
	bool known, cap;
	struct finding *f;

	if (!d->daemon_pid) {
		doctor_add(d, "daemon-memlock", DOCTOR_SKIP,
			   "no pinbrokerd process found (not running, or in another pid "
			   "namespace)");
		return;
	}
	snprintf(path, sizeof(path), "/proc/%d/status", (int)d->daemon_pid);
	cap = cap_ipc_lock(path, &known);
	snprintf(path, sizeof(path), "/proc/%d/limits", (int)d->daemon_pid);
	if (memlock_limit(path, &limit) < 0) {
		doctor_add(d, "daemon-memlock", DOCTOR_SKIP, "pinbrokerd (pid %d): cannot read %s", (int)d->daemon_pid,
			   path);
		return;
	}
	if (cap || limit == UINT64_MAX || (d->have_status && limit >= d->budget_bytes)) {
		doctor_add(d, "daemon-memlock", DOCTOR_OK,
			   "pinbrokerd (pid %d): CAP_IPC_LOCK %s, RLIMIT_MEMLOCK %s: it can lock "
			   "its pool",
			   (int)d->daemon_pid, cap ? "yes" : "no", limit_str(limit, lim, sizeof(lim)));
		return;
	}
	f = doctor_add(
		d, "daemon-memlock", DOCTOR_WARN,
		"pinbrokerd (pid %d): no CAP_IPC_LOCK%s and RLIMIT_MEMLOCK %s%s%s: it cannot lock more than that",
		(int)d->daemon_pid, known ? "" : " (unknown)", limit_str(limit, lim, sizeof(lim)),
		d->have_status ? ", under the budget of " : "",
		d->have_status ? format_size(d->budget_bytes, bud, sizeof(bud)) : "");
	doctor_fix(f, "run it from the shipped pinbrokerd.service (AmbientCapabilities=CAP_IPC_LOCK), or raise "
		      "LimitMEMLOCK=infinity (ulimit -l unlimited)");
}

static void check_caller_memlock(struct doctor *d)
{
	struct rlimit rl;
	char lim[32];
	bool known, cap = cap_ipc_lock("/proc/self/status", &known);

	if (getrlimit(RLIMIT_MEMLOCK, &rl) < 0) {
		doctor_add(d, "caller-memlock", DOCTOR_SKIP, "getrlimit(RLIMIT_MEMLOCK): %s", strerror(errno));
		return;
	}
	/* Leases come locked by the daemon; a client locks nothing itself, so any limit does. */
	doctor_add(d, "caller-memlock", DOCTOR_OK,
		   "you: CAP_IPC_LOCK %s, RLIMIT_MEMLOCK %s; enough, clients lock nothing themselves (the daemon locks "
		   "the pool and the library maps it)",
		   known ? (cap ? "yes" : "no") : "unknown",
		   limit_str(rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur, lim, sizeof(lim)));
}

static void check_hugepages(struct doctor *d)
{
	char path[PATH_MAX], buf[64], a[32], b[32];
	uint64_t nr = 0, total = 0, free_ = 0, size = HUGE_2M_BYTES;
	bool have_nr = doctor_read_text(doctor_rooted(d, "/proc/sys/vm/nr_hugepages", path, sizeof(path)), buf,
					sizeof(buf)) > 0;
	struct finding *f;

	if (have_nr)
		nr = strtoull(buf, NULL, 10);
	if (doctor_meminfo_bytes(d, "HugePages_Total", &total) < 0 && !have_nr) {
		doctor_add(d, "hugepages", DOCTOR_SKIP, "no HugePages_Total in %s: a kernel without hugetlbfs",
			   doctor_rooted(d, "/proc/meminfo", path, sizeof(path)));
		return;
	}
	/* meminfo counts huge pages, not kB: meminfo_bytes multiplied them by 1024. */
	total /= 1024;
	if (doctor_meminfo_bytes(d, "HugePages_Free", &free_) == 0)
		free_ /= 1024;
	doctor_meminfo_bytes(d, "Hugepagesize", &size);
	if (!have_nr)
		nr = total;
	if (nr == 0) {
		doctor_add(d, "hugepages", DOCTOR_OK,
			   "no huge pages reserved (vm.nr_hugepages = 0): the pool uses transparent "
			   "huge pages where the kernel collapses them (see thp), else 4 KiB pages; "
			   "hugetlb is optional");
		return;
	}
	if (free_ == 0) {
		f = doctor_add(d, "hugepages", DOCTOR_WARN,
			       "%" PRIu64 " huge pages of %s reserved, none free: a new or "
			       "restarted pool falls back to THP or 4 KiB pages",
			       nr, format_size(size, a, sizeof(a)));
		doctor_fix(
			f,
			"raise vm.nr_hugepages (pinbrokerd --reserve-hugepages, or enable pinbroker-hugepages.service)");
		return;
	}
	doctor_add(d, "hugepages", DOCTOR_OK, "%" PRIu64 " huge pages of %s reserved, %" PRIu64 " free (%s)%s%s", nr,
		   format_size(size, a, sizeof(a)), free_, format_size(free_ * size, b, sizeof(b)),
		   d->have_status ? "; the pool is on " : "", d->have_status ? d->page_kind : "");
}

static void check_thp(struct doctor *d)
{
	char path[PATH_MAX], buf[256], *sel, *end;
	struct finding *f;

	if (doctor_read_text(doctor_rooted(d, "/sys/kernel/mm/transparent_hugepage/shmem_enabled", path, sizeof(path)),
			     buf, sizeof(buf)) < 0) {
		f = doctor_add(d, "thp", DOCTOR_WARN,
			       "no %s: a kernel without transparent huge pages; the pool is on 4 KiB "
			       "pages unless huge pages are reserved",
			       path);
		doctor_fix(f, "use a kernel with CONFIG_TRANSPARENT_HUGEPAGE, or reserve huge pages (pinbrokerd "
			      "--reserve-hugepages)");
		return;
	}
	/* The selected value is in brackets: "always within_size advise [never] deny force". */
	sel = strchr(buf, '[');
	end = sel ? strchr(sel, ']') : NULL;
	if (!sel || !end) {
		doctor_add(d, "thp", DOCTOR_SKIP, "%s: no selected value in \"%.*s\"", path, (int)strcspn(buf, "\n"),
			   buf);
		return;
	}
	sel++;
	*end = '\0';
	if (strcmp(sel, "deny") == 0) {
		f = doctor_add(d, "thp", DOCTOR_WARN,
			       "shmem THP is deny: MADV_COLLAPSE cannot collapse the pool, which stays on "
			       "4 KiB pages unless huge pages are reserved");
		doctor_fix(f,
			   "echo never > /sys/kernel/mm/transparent_hugepage/shmem_enabled (collapse works with never, "
			   "advise, within_size and always)");
		return;
	}
	/* MADV_COLLAPSE ignores these settings (Documentation/admin-guide/mm/transhuge.rst); only deny stops it. */
	doctor_add(d, "thp", DOCTOR_OK, "shmem THP is %s: MADV_COLLAPSE may collapse the pool (thp = auto)%s", sel,
		   strcmp(sel, "force") == 0 ? "; force makes every shmem mapping huge, also other programs'" : "");
}

/* Tried on this kernel: one 2 MiB memfd, aligned, touched, collapsed, thrown away (as pool-pages.c's probe). */
static void check_thp_collapse(struct doctor *d)
{
	int fd;
	uint8_t *res, *base;
	struct finding *f;
	int r = -1, err = 0;

	if (d->root[0]) {
		doctor_add(d, "thp-collapse", DOCTOR_SKIP, "not tried: %s points at a fixture root", DOCTOR_ROOT_ENV);
		return;
	}
	fd = memfd_create("pinctl-doctor-thp", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)HUGE_2M_BYTES) < 0) {
		err = errno;
		goto out;
	}
	res = mmap(NULL, 2 * HUGE_2M_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (res == MAP_FAILED) {
		err = errno;
		goto out;
	}
	base = (uint8_t *)(((uintptr_t)res + HUGE_2M_BYTES - 1) & ~(uintptr_t)(HUGE_2M_BYTES - 1));
	if (mmap(base, HUGE_2M_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
		err = errno;
	} else {
		base[0] = 1;
		r = madvise(base, HUGE_2M_BYTES, MADV_COLLAPSE);
		err = r < 0 ? errno : 0;
	}
	munmap(res, 2 * HUGE_2M_BYTES);
out:
	if (fd >= 0)
		close(fd);
	if (r == 0) {
		doctor_add(d, "thp-collapse", DOCTOR_OK,
			   "MADV_COLLAPSE collapsed a 2 MiB shmem test page on this kernel");
		return;
	}
	f = doctor_add(d, "thp-collapse", DOCTOR_WARN, "MADV_COLLAPSE on a 2 MiB shmem test page failed: %s",
		       strerror(err));
	doctor_fix(f, "%s",
		   err == EINVAL
			   ? "MADV_COLLAPSE needs Linux 6.1 or later with CONFIG_TRANSPARENT_HUGEPAGE; or "
			     "reserve huge pages (pinbrokerd --reserve-hugepages)"
			   : "memory may be too fragmented now (try again), or shmem THP is deny; or reserve huge "
			     "pages (pinbrokerd --reserve-hugepages)");
}

/* NVIDIA display or 3D controllers (vendor 0x10de, class 0x03xxxx) under sys/bus/pci/devices: their count, or -1
 * when the folder cannot be read (a fixture root without it, no sysfs): then unknown, and not taken for none. */
static int nvidia_pci_devices(const struct doctor *d)
{
	char path[PATH_MAX], file[PATH_MAX + 300], buf[32];
	struct dirent *e;
	DIR *dir = opendir(doctor_rooted(d, "/sys/bus/pci/devices", path, sizeof(path)));
	int n = 0;

	if (!dir)
		return -1;
	while ((e = readdir(dir))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(file, sizeof(file), "%s/%s/vendor", path, e->d_name);
		if (doctor_read_text(file, buf, sizeof(buf)) <= 0 || strncmp(buf, "0x10de", 6) != 0)
			continue;
		snprintf(file, sizeof(file), "%s/%s/class", path, e->d_name);
		if (doctor_read_text(file, buf, sizeof(buf)) > 0 && strncmp(buf, "0x03", 4) == 0)
			n++;
	}
	closedir(dir);
	return n;
}

static void check_cuda(struct doctor *d)
{
	char ver[32] = "unknown", mem[32];
	struct finding *f;

	if (d->driver_version)
		snprintf(ver, sizeof(ver), "%d.%d", d->driver_version / 1000, d->driver_version % 1000 / 10);
	if (!d->cuda_loaded && getenv("PINBROKER_NO_CUDA") &&
	    strcmp(d->cuda_msg, "disabled by PINBROKER_NO_CUDA") == 0) {
		doctor_add(d, "cuda", DOCTOR_SKIP, "%s", d->cuda_msg);
		return;
	}
	if (!d->cuda_usable && nvidia_pci_devices(d) == 0) {
		/* Nothing to register with: locked leases are all a host without NVIDIA GPUs needs. */
		doctor_add(d, "cuda", DOCTOR_OK,
			   "%s, and no NVIDIA GPU on the PCI bus: leases are locked, not CUDA-registered, which is "
			   "all this host needs",
			   d->cuda_msg);
		return;
	}
	if (!d->cuda_usable) {
		f = doctor_add(d, "cuda", DOCTOR_WARN, "%s%s%s: leases are locked but not CUDA-registered here",
			       d->cuda_msg, d->cuda_loaded ? "; driver API " : "", d->cuda_loaded ? ver : "");
		doctor_fix(
			f,
			"install the NVIDIA driver (libcuda.so.1 on the loader's path) on GPU hosts; nothing to do on a "
			"host without GPUs");
		return;
	}
	doctor_add(d, "cuda", DOCTOR_OK, "libcuda.so.1, driver API %s, %d GPU%s%s%s", ver, d->gpus,
		   d->gpus == 1 ? "" : "s", d->gpu_bytes ? " with " : "",
		   d->gpu_bytes ? format_size(d->gpu_bytes, mem, sizeof(mem)) : "");
}

/* The memory cgroup's limit, walking up from path to the root; UINT64_MAX when none. */
static uint64_t cgroup_limit(const struct doctor *d, bool v2, const char *cg_path, char *where, size_t wlen)
{
	char rel[PATH_MAX], path[PATH_MAX * 2], buf[64];
	uint64_t best = UINT64_MAX;

	snprintf(rel, sizeof(rel), "%s", cg_path);
	for (;;) {
		char *slash;

		snprintf(path, sizeof(path), "%s/sys/fs/cgroup%s%s/%s", d->root, v2 ? "" : "/memory",
			 strcmp(rel, "/") == 0 ? "" : rel, v2 ? "memory.max" : "memory.limit_in_bytes");
		if (doctor_read_text(path, buf, sizeof(buf)) > 0 && isdigit((unsigned char)buf[0])) {
			uint64_t v = strtoull(buf, NULL, 10);

			if (v < best && !(!v2 && v >= V1_UNLIMITED_BYTES)) {
				best = v;
				snprintf(where, wlen, "%s", path);
			}
		}
		if (strcmp(rel, "/") == 0 || !rel[0])
			break;
		slash = strrchr(rel, '/');
		if (slash == rel)
			slash[1] = '\0';
		else if (slash)
			*slash = '\0';
		else
			break;
	}
	return best;
}

static void check_cgroup(struct doctor *d)
{
	char path[PATH_MAX], text[8192], v2_path[PATH_MAX] = "", v1_path[PATH_MAX] = "", where[PATH_MAX * 2] = "";
	char lim[32], bud[32], who[64];
	bool have_v2 = false, have_v1 = false, v2;
	uint64_t limit;
	struct finding *f;

	if (d->root[0] || !d->daemon_pid) {
		doctor_rooted(d, "/proc/self/cgroup", path, sizeof(path));
		snprintf(who, sizeof(who), "%s", d->root[0] ? "the fixture's" : "pinctl's (no daemon found)");
	} else {
		snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)d->daemon_pid);
		snprintf(who, sizeof(who), "pinbrokerd's");
	}
	if (doctor_read_text(path, text, sizeof(text)) < 0) {
		doctor_add(d, "cgroup", DOCTOR_SKIP, "cannot read %s: %s", path, strerror(errno));
		return;
	}
	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;

		if (!c2)
			continue;
		*c2 = '\0';
		if (strncmp(line, "0:", 2) == 0 && c1[1] == '\0') {
			have_v2 = true;
			snprintf(v2_path, sizeof(v2_path), "%s", c2 + 1);
		} else {
			have_v1 = true;
			for (char *tok = strtok_r(c1 + 1, ",", &c1); tok; tok = strtok_r(NULL, ",", &c1))
				if (strcmp(tok, "memory") == 0)
					snprintf(v1_path, sizeof(v1_path), "%s", c2 + 1);
		}
	}
	if (!have_v1 && !have_v2) {
		doctor_add(d, "cgroup", DOCTOR_SKIP, "%s: no cgroup lines", path);
		return;
	}
	/* The memory controller is on v1 when a v1 hierarchy has it (hybrid hosts), else on v2. */
	v2 = !v1_path[0];
	limit = cgroup_limit(d, v2, v2 ? v2_path : v1_path, where, sizeof(where));
	if (limit == UINT64_MAX) {
		doctor_add(d, "cgroup", DOCTOR_OK, "cgroup %s (%s memory cgroup %s): no memory limit",
			   have_v1 && have_v2 ? "hybrid, memory on v1"
			   : v2               ? "v2"
					      : "v1",
			   who, v2 ? v2_path : v1_path);
		return;
	}
	format_size(limit, lim, sizeof(lim));
	if (d->have_status && d->budget_bytes > limit) {
		f = doctor_add(d, "cgroup", DOCTOR_FAIL,
			       "cgroup %s: %s memory limit %s (%s) is under the budget %s: the locked "
			       "pool is charged to the cgroup, which OOM-kills the daemon first",
			       v2 ? "v2" : "v1", who, lim, where, format_size(d->budget_bytes, bud, sizeof(bud)));
		doctor_fix(
			f,
			"lower the budget (pinctl set budget SIZE, or a percentage: it follows the lower of MemTotal and "
			"the limit), or raise the unit's MemoryMax=");
		return;
	}
	if (d->have_status && d->budget_bytes > limit / 100 * BUDGET_WARN_PCT) {
		f = doctor_add(d, "cgroup", DOCTOR_WARN,
			       "cgroup %s: the budget %s is over %d%% of %s memory limit %s (%s)", v2 ? "v2" : "v1",
			       format_size(d->budget_bytes, bud, sizeof(bud)), BUDGET_WARN_PCT, who, lim, where);
		doctor_fix(f,
			   "leave the cgroup room for the daemon and page cache: lower the budget or raise the limit");
		return;
	}
	doctor_add(d, "cgroup", DOCTOR_OK, "cgroup %s: %s memory limit %s (%s)%s",
		   have_v1 && have_v2 ? "hybrid, memory on v1"
		   : v2               ? "v2"
				      : "v1",
		   who, lim, where, d->have_status ? ", the budget fits" : "");
}

/*
 * The daemon reads clients' cgroups in its own cgroup namespace; in a container's (containerd, CRI-O, Docker
 * on cgroup v2) another pod's reads "/../../kubepods...", and unless the daemon placed its namespace in the
 * host's tree, pod quotas do not bind. It says in its status what it found at start.
 */
static void check_cgroup_namespace(struct doctor *d)
{
	struct finding *f;

	if (!d->have_status || !d->cgroup_ns[0]) {
		doctor_add(d, "cgroup-namespace", DOCTOR_SKIP, "%s",
			   d->have_status ? "the daemon does not say (an older version)" : "no daemon status");
		return;
	}
	if (strcmp(d->cgroup_ns, "host") == 0) {
		doctor_add(d, "cgroup-namespace", DOCTOR_OK,
			   "the daemon reads cgroups in the host's cgroup namespace: clients' are host paths");
		return;
	}
	if (strcmp(d->cgroup_ns, "private") == 0) {
		doctor_add(d, "cgroup-namespace", DOCTOR_OK,
			   "the daemon's cgroup namespace is its own, rooted at %s in the host's tree: clients' "
			   "cgroups are resolved to host paths",
			   d->cgroup_ns_root);
		return;
	}
	f = doctor_add(d, "cgroup-namespace", DOCTOR_WARN,
		       "the daemon's cgroup namespace is its own and it could not place it in the host's tree: "
		       "clients outside it are charged to no job, so quotas on their cgroups (a pod's) do not bind");
	doctor_fix(f,
		   "mount the host's /sys/fs/cgroup read-only into the daemon's container (deploy/kubernetes does, at "
		   "/host/sys/fs/cgroup), or run it in the host's cgroup namespace (docker run --cgroupns=host), "
		   "then restart it; its log says what it tried");
}

/*
 * A client whose /proc/PID/cgroup the daemon cannot read has no known job: while quota rules exist its acquires
 * are refused (job-unknown = refuse) or unlimited (allow). Under a unit with ProtectProc=invisible, or a /proc
 * mounted with hidepid, that is every other uid's client.
 */
static void check_job_unknown(struct doctor *d)
{
	struct finding *f;

	if (!d->have_status) {
		doctor_add(d, "job-unknown", DOCTOR_SKIP, "no daemon status");
		return;
	}
	if (d->job_unknown_clients == 0 && d->job_unknown_total == 0) {
		doctor_add(d, "job-unknown", DOCTOR_OK, "the daemon could tell every client's job (its cgroup)");
		return;
	}
	f = doctor_add(d, "job-unknown", DOCTOR_WARN,
		       "the daemon could not read the cgroup of %" PRIu32
		       " connected client%s, so their job is unknown; "
		       "%" PRIu64 " acquire%s of such clients came while job quota rules existed: refused under "
		       "job-unknown = refuse (the default), charged to no job under allow",
		       d->job_unknown_clients, d->job_unknown_clients == 1 ? "" : "s", d->job_unknown_total,
		       d->job_unknown_total == 1 ? "" : "s");
	doctor_fix(f,
		   "let pinbrokerd read every client's /proc/PID/cgroup: use the shipped pinbrokerd.service "
		   "(ProtectProc=default) and drop any drop-in that sets ProtectProc=invisible or noaccess; without "
		   "systemd run it as root or mount /proc without hidepid; its log names the pids (docs/security.md)");
}

static void check_psi(struct doctor *d)
{
	char path[PATH_MAX], buf[512];
	struct finding *f;

	if (doctor_read_text(doctor_rooted(d, "/proc/pressure/memory", path, sizeof(path)), buf, sizeof(buf)) < 0) {
		f = doctor_add(d, "psi", DOCTOR_WARN,
			       "no %s: the daemon sees pressure only by polling MemAvailable, swap and "
			       "the cgroup every poll-interval-ms, not the instant tasks stall",
			       path);
		doctor_fix(
			f,
			"boot a kernel with CONFIG_PSI=y (on some distributions add psi=1 to the kernel command line)");
		return;
	}
	if (!strstr(buf, "some avg10=") || !strstr(buf, "full avg10=")) {
		f = doctor_add(d, "psi", DOCTOR_WARN, "%s does not read as PSI (no some/full avg10)", path);
		doctor_fix(f, "check the kernel's PSI support (Documentation/accounting/psi.rst)");
		return;
	}
	doctor_add(d, "psi", DOCTOR_OK, "%s is there: memory stalls wake the daemon", path);
}

/* systemctl is-enabled UNIT: its one word, or "" when it could not be run. */
static void is_enabled(const char *systemctl, const char *unit, char *out, size_t len)
{
	int pfd[2], st;
	pid_t pid;
	ssize_t n;

	out[0] = '\0';
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return;
	pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);

		dup2(pfd[1], 1);
		if (null >= 0)
			dup2(null, 2);
		execl(systemctl, systemctl, "is-enabled", unit, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	n = pid > 0 ? read(pfd[0], out, len - 1) : -1;
	close(pfd[0]);
	out[n > 0 ? n : 0] = '\0';
	out[strcspn(out, " \n")] = '\0';
	if (pid > 0 && (waitpid(pid, &st, 0) < 0 || (WIFEXITED(st) && WEXITSTATUS(st) == 127)))
		out[0] = '\0';
}

static bool enabled_word(const char *s)
{
	return strcmp(s, "enabled") == 0 || strcmp(s, "enabled-runtime") == 0 || strcmp(s, "linked") == 0 ||
	       strcmp(s, "linked-runtime") == 0;
}

static void check_service(struct doctor *d)
{
	const char *env = getenv(DOCTOR_SYSTEMCTL_ENV), *systemctl = env;
	char found[PATH_MAX], sock[64], svc[64];
	struct finding *f;

	if (!env) {
		const char *dirs[] = { "/usr/bin", "/bin", "/usr/sbin", "/sbin" };

		systemctl = NULL;
		for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]) && !systemctl; i++) {
			snprintf(found, sizeof(found), "%s/systemctl", dirs[i]);
			if (access(found, X_OK) == 0)
				systemctl = found;
		}
	}
	if (!systemctl || !*systemctl || access(systemctl, X_OK) < 0) {
		doctor_add(d, "service", DOCTOR_SKIP, "no systemctl here: start pinbrokerd by your own means");
		return;
	}
	is_enabled(systemctl, "pinbrokerd.socket", sock, sizeof(sock));
	is_enabled(systemctl, "pinbrokerd.service", svc, sizeof(svc));
	if (!sock[0] && !svc[0]) {
		doctor_add(d, "service", DOCTOR_SKIP, "%s is-enabled gave no answer", systemctl);
		return;
	}
	if (enabled_word(sock) || enabled_word(svc)) {
		doctor_add(d, "service", DOCTOR_OK, "pinbrokerd.socket %s, pinbrokerd.service %s", sock[0] ? sock : "?",
			   svc[0] ? svc : "?");
		return;
	}
	if ((!sock[0] || strcmp(sock, "not-found") == 0) && (!svc[0] || strcmp(svc, "not-found") == 0)) {
		f = doctor_add(d, "service", DOCTOR_WARN, "pinbrokerd's units are not installed");
		doctor_fix(
			f,
			"cmake --install build, systemd-sysusers, systemd-tmpfiles --create, then systemctl enable --now "
			"pinbrokerd.socket (docs/operations.md: Running as a systemd service)");
		return;
	}
	f = doctor_add(d, "service", DOCTOR_WARN,
		       "pinbrokerd.socket %s, pinbrokerd.service %s: the daemon does not start at boot",
		       sock[0] ? sock : "?", svc[0] ? svc : "?");
	doctor_fix(f, "systemctl enable --now pinbrokerd.socket");
}

static void check_budget(struct doctor *d)
{
	char bud[32], mt[32], gm[32], path[PATH_MAX];
	uint64_t mem_total;
	struct finding *f;

	if (!d->have_status) {
		doctor_add(d, "budget", DOCTOR_SKIP, "the daemon did not answer, so its budget is unknown");
		return;
	}
	format_size(d->budget_bytes, bud, sizeof(bud));
	if (doctor_meminfo_bytes(d, "MemTotal", &mem_total) < 0 || mem_total == 0) {
		doctor_add(d, "budget", DOCTOR_SKIP, "budget %s; no MemTotal in %s", bud,
			   doctor_rooted(d, "/proc/meminfo", path, sizeof(path)));
		return;
	}
	format_size(mem_total, mt, sizeof(mt));
	if (d->budget_bytes >= mem_total) {
		f = doctor_add(d, "budget", DOCTOR_FAIL,
			       "budget %s is not under MemTotal %s: locking it all would leave the host "
			       "nothing",
			       bud, mt);
		doctor_fix(f, "pinctl set budget 25%% (the default), or a size well under MemTotal");
		return;
	}
	if (d->budget_bytes > mem_total / 100 * BUDGET_WARN_PCT) {
		f = doctor_add(d, "budget", DOCTOR_WARN,
			       "budget %s is %.0f%% of MemTotal %s: locked memory cannot be reclaimed, "
			       "so the page cache and the jobs get the rest",
			       bud, 100.0 * (double)d->budget_bytes / (double)mem_total, mt);
		doctor_fix(
			f,
			"keep the budget at or under %d%% of MemTotal unless the jobs need little else: pinctl set budget "
			"SIZE",
			BUDGET_WARN_PCT);
		return;
	}
	if (d->gpu_bytes && d->budget_bytes > d->gpu_bytes) {
		f = doctor_add(d, "budget", DOCTOR_WARN,
			       "budget %s (%.0f%% of MemTotal %s) is more than the GPUs' %s together: "
			       "staging buffers rarely need more than the GPUs hold",
			       bud, 100.0 * (double)d->budget_bytes / (double)mem_total, mt,
			       format_size(d->gpu_bytes, gm, sizeof(gm)));
		doctor_fix(
			f,
			"lower the budget to at most the GPUs' memory (pinctl set budget SIZE), unless jobs keep pinned "
			"host caches bigger than that");
		return;
	}
	doctor_add(d, "budget", DOCTOR_OK, "budget %s: %.0f%% of MemTotal %s%s%s%s", bud,
		   100.0 * (double)d->budget_bytes / (double)mem_total, mt, d->gpu_bytes ? ", within the GPUs' " : "",
		   d->gpu_bytes ? format_size(d->gpu_bytes, gm, sizeof(gm)) : "", d->gpu_bytes ? " together" : "");
}

/* /proc/PID/limits' "Max open files" soft limit; 0 when unreadable, UINT64_MAX for unlimited. */
static uint64_t nofile_limit(pid_t pid)
{
	char path[64], buf[4096], *p;

	snprintf(path, sizeof(path), "/proc/%d/limits", (int)pid);
	if (doctor_read_text(path, buf, sizeof(buf)) < 0 || !(p = strstr(buf, "Max open files")))
		return 0;
	p += strlen("Max open files");
	p += strspn(p, " ");
	return strncmp(p, "unlimited", 9) == 0 ? UINT64_MAX : strtoull(p, NULL, 10);
}

/*
 * The daemon's chunk classes against its fd limit and vm.max_map_count, as it planned them at start
 * (daemon/core/classes.h): the larger of the budget and MemTotal, lent as one lease, should take at most a
 * quarter of the chunks they allow (the rest: smaller leases and the warm pool's small chunks).
 */
static void check_chunks(struct doctor *d)
{
	uint64_t mem_total = 0, plan_bytes, left, worst = 0, map_max = 0, nofile;
	char path[PATH_MAX], buf[64], s1[32], s2[32], s3[32];
	struct finding *f;

	if (!d->have_status || d->chunk_capacity == 0 || d->chunk_size_bytes == 0) {
		doctor_add(d, "chunks", DOCTOR_SKIP,
			   "the daemon did not say its chunk classes (not running, or older)");
		return;
	}
	(void)doctor_meminfo_bytes(d, "MemTotal", &mem_total);
	plan_bytes = d->budget_bytes > mem_total ? d->budget_bytes : mem_total;
	/* Greedy, largest class first: whole chunks of the largest, at most one of each smaller, one tail. */
	left = plan_bytes;
	for (uint64_t c = d->chunk_max_bytes; c >= d->chunk_size_bytes && c > 0; c /= 2) {
		worst += left / c;
		left %= c;
	}
	worst += left ? 1 : 0;
	if (doctor_read_text(doctor_rooted(d, "/proc/sys/vm/max_map_count", path, sizeof(path)), buf, sizeof(buf)) > 0)
		map_max = strtoull(buf, NULL, 10);
	nofile = d->daemon_pid ? nofile_limit(d->daemon_pid) : 0;
	format_size(d->chunk_size_bytes, s1, sizeof(s1));
	format_size(d->chunk_max_bytes, s2, sizeof(s2));
	format_size(plan_bytes, s3, sizeof(s3));
	if (worst <= d->chunk_capacity / 4) {
		doctor_add(
			d, "chunks", DOCTOR_OK,
			"chunk classes %s to %s: %s (the budget or MemTotal, the larger) lent as one lease is %" PRIu64
			" chunks of the %" PRIu64 " the daemon's fds (RLIMIT_NOFILE %" PRIu64
			") and mappings (vm.max_map_count %" PRIu64 ") allow",
			s1, s2, s3, worst, d->chunk_capacity, nofile, map_max);
		return;
	}
	f = doctor_add(d, "chunks", DOCTOR_WARN,
		       "chunk classes %s to %s: %s lent as one lease is %" PRIu64
		       " chunks, more than a quarter of the %" PRIu64 " the daemon's fds (RLIMIT_NOFILE %" PRIu64
		       ") and mappings (vm.max_map_count %" PRIu64 ") allow: large leases may be refused",
		       s1, s2, s3, worst, d->chunk_capacity, nofile, map_max);
	doctor_fix(f, "raise LimitNOFILE= and vm.max_map_count, or leave chunk-max at its default (the daemon then "
		      "raises it to fit)");
}

/* After a restart without the fd store the daemon counts what its predecessor lent only where it can see it. */
static void check_restart(struct doctor *d)
{
	struct finding *f;

	if (!d->have_status || !d->restart_books[0]) {
		doctor_add(d, "restart", DOCTOR_SKIP, "%s",
			   d->have_status ? "the daemon does not say (an older version)" : "no daemon status");
		return;
	}
	if (!d->restart_warning[0]) {
		doctor_add(d, "restart", DOCTOR_OK, "what the previous daemon lent is known (restart state: %s)",
			   d->restart_books);
		return;
	}
	f = doctor_add(d, "restart", DOCTOR_WARN, "%s", d->restart_warning);
	doctor_fix(f, "give the daemon CAP_SYS_PTRACE (AmbientCapabilities= and CapabilityBoundingSet= in a drop-in) "
		      "so that it can read other users' /proc, and never remove its restart-state file while it is "
		      "stopped; memory it cannot see is counted again only once its holders exit");
}

void doctor_checks_run(struct doctor *d)
{
	check_socket(d);
	check_groups(d);
	check_socket_access(d);
	check_daemon_memlock(d);
	check_caller_memlock(d);
	check_hugepages(d);
	check_thp(d);
	check_thp_collapse(d);
	check_cuda(d);
	check_cgroup(d);
	check_cgroup_namespace(d);
	check_job_unknown(d);
	check_psi(d);
	check_service(d);
	check_budget(d);
	check_chunks(d);
	check_restart(d);
}

/* SPDX-License-Identifier: MIT */
/* The pressure monitor's I/O: reads /proc and the daemon's memory cgroup under proc-root, arms PSI triggers, runs the policy from the loop. */
#define _GNU_SOURCE
#include "monitor.h"

#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "pressure.h"
#include "util.h"

/*
 * Under pressure, or after a PSI trigger, sample this often. Issue 3 targets
 * <= 100 ms from a crossing to REVOKE; earlyoom polls every 100-1000 ms and
 * systemd-oomd checks swap every 150 ms.
 */
#define FAST_POLL_MS 100
/* Without a configured interval (a zeroed config); config.c's poll-interval-ms default says why 100. */
#define DEFAULT_POLL_MS 100

/*
 * PSI trigger windows: 500 ms to 10 s, and without CAP_SYS_RESOURCE only
 * multiples of 2 s are accepted, to bound the polling cost an unprivileged
 * user can impose (kernel Documentation/accounting/psi.rst, "Userspace
 * monitor usage").
 */
#define PSI_WINDOW_MIN_US 500000u
#define PSI_WINDOW_MAX_US 10000000u
#define PSI_WINDOW_UNPRIV_US 2000000u

/* vmstat is about 4 KiB on 6.x kernels, meminfo 1.5 KiB, cgroup v1 memory.stat 1 KiB. */
#define READ_BUF_BYTES 16384
/* Swap-out rates are taken over at least this long, so a 100 ms poll does not turn a burst into a rate. */
#define RATE_WINDOW_MS 1000
#define RING_SIZE 16
/* Ancestors walked for the tightest limit; real hierarchies are a handful deep. */
#define CGROUP_DEPTH_MAX 32
/*
 * Limits are set by an administrator and rarely change, while usage moves
 * every poll: on cgroupfs the limits are read this often (and on every
 * explicit sample), the usage on every poll.
 */
#define CG_LIMIT_REFRESH_MS 5000
#define REL_PATH_MAX (PRESSURE_CGROUP_PATH_MAX + 64)

#define MEMINFO_REL "proc/meminfo"
#define VMSTAT_REL "proc/vmstat"
#define PSI_REL "proc/pressure/memory"
#define SELF_CGROUP_REL "proc/self/cgroup"

/* Sources whose failure is reported once, not on every poll. */
enum source {
	SRC_MEMINFO = 1u << 0,
	SRC_VMSTAT = 1u << 1,
	SRC_PSI = 1u << 2,
	SRC_CGROUP = 1u << 3,
	SRC_CGROUP_PSI = 1u << 4,
};

enum cg_kind { CG_NONE, CG_V1, CG_V2 };

/*
 * A file under proc-root kept open between polls. On procfs and cgroupfs a
 * pread at offset 0 regenerates the contents, so a poll costs one or two
 * preads instead of open, read, read and close: at a 100 ms poll the six
 * files cost 0.31-0.35% of a core before, on the 2-CPU development VM.
 */
struct src_file {
	int fd;          /* -1: open at the next read */
	bool one_record; /* one read returns it all: see pread_all() */
	bool pseudo;     /* on procfs, cgroupfs or sysfs */
	dev_t dev;    /* which file fd is: a fixture's plain file may be replaced by rename(2) */
	ino_t ino;
};

/* Where the daemon's memory cgroup lives, relative to proc-root. */
struct cg_loc {
	enum cg_kind kind;
	char mount[32];          /* "sys/fs/cgroup/memory" (v1) or "sys/fs/cgroup" (v2): the walk stops here */
	char dir[REL_PATH_MAX];  /* the leaf: mount + the path from /proc/self/cgroup */
};

/* One directory of the walk from the leaf up to the mount point. */
struct cg_level {
	size_t dir_len;        /* the directory is the leaf's first dir_len bytes */
	int limit_err;         /* of the last limit read: 0 or a negative errno */
	uint64_t limit_bytes;  /* PRESSURE_UNLIMITED for none */
	struct src_file limit, usage, stat;
};

/* The cgroup's files, kept open, and the limits last read. */
struct cg_src {
	struct cg_loc loc;
	size_t nlevels;
	bool limits_valid;     /* false: read the limits at the next sample */
	bool limits_pseudo;    /* every limit file is on cgroupfs; else (a fixture) read them every poll */
	uint64_t limits_ms;
	struct cg_level level[CGROUP_DEPTH_MAX];
};

/* The tightest limit among the leaf and its ancestors. */
struct cg_reading {
	bool have_limit;
	uint64_t limit_bytes;
	uint64_t usage_bytes;
	uint64_t reclaimable_bytes;
};

struct vm_point {
	bool set;
	uint64_t ms;
	struct vmstat v;
};

struct monitor {
	struct ev_loop *loop;
	monitor_state_fn fn;
	void *ud;
	int root_fd;              /* proc-root, O_PATH: every read is an openat below it */
	char *proc_root;

	struct pressure *policy;
	uint32_t poll_interval_ms;
	uint32_t psi_window_ms;
	uint32_t psi_stall_ms;

	ev_timer timer;
	uint32_t timer_ms;        /* the period the timer runs at now */
	uint64_t fast_until_ms;   /* after a trigger: poll fast until then */

	/*
	 * PSI trigger fds sit in an inner epoll set watched through ev_io:
	 * libev has no POLLPRI watcher, and an ev_io on the PSI fd itself
	 * reports it readable forever, so the loop would spin.
	 */
	ev_io psi_io;
	int epfd;
	int psi_fd[2];            /* "some", "full"; -1 when not armed */
	uint32_t trigger_stall_us, trigger_window_us;
	char mode[128];

	struct cg_src cg;
	struct src_file meminfo_f, vmstat_f, psi_f, cg_psi_f;
	struct vm_point vm_old, vm_new;

	bool have_sample;
	struct pressure_sample sample;
	struct pressure_figures figs;
	unsigned warned;          /* enum source bits reported and not yet recovered */
	enum broker_state state;

	struct monitor_event ring[RING_SIZE];
	size_t ring_next, ring_count;
};

/* --- reading files under proc-root --- */

/* Read up to cap bytes of rel (below root_fd). Returns 0 and *len, or a negative errno. */
static int read_rel(int root_fd, const char *rel, char *buf, size_t cap, size_t *len)
{
	size_t got = 0;
	int fd;

	*len = 0;
	fd = openat(root_fd, rel, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return -errno;
	while (got < cap) {
		ssize_t n = read(fd, buf + got, cap - got);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			n = -errno;
			close(fd);
			return (int)n;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	*len = got;
	return 0;
}

static bool exists_rel(int root_fd, const char *rel)
{
	return faccessat(root_fd, rel, F_OK, 0) == 0;
}

static bool fs_regenerates(long f_type)
{
	return f_type == PROC_SUPER_MAGIC || f_type == CGROUP_SUPER_MAGIC || f_type == CGROUP2_SUPER_MAGIC ||
	       f_type == SYSFS_MAGIC;
}

static void src_init(struct src_file *f, bool one_record)
{
	*f = (struct src_file){.fd = -1, .one_record = one_record};
}

static void src_close(struct src_file *f)
{
	if (f->fd >= 0)
		close(f->fd);
	f->fd = -1;
}

static int src_open(int root_fd, struct src_file *f, const char *rel)
{
	struct statfs sfs;
	struct stat st;
	int r;

	f->fd = openat(root_fd, rel, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (f->fd < 0)
		return -errno;
	if (fstat(f->fd, &st) < 0 || fstatfs(f->fd, &sfs) < 0) {
		r = -errno;
		src_close(f);
		return r;
	}
	f->pseudo = fs_regenerates((long)sfs.f_type);
	f->dev = st.st_dev;
	f->ino = st.st_ino;
	return 0;
}

/*
 * Read from offset 0 until EOF or cap. A seq_file of many records (vmstat)
 * hands out about a page per call, so only a read of 0 means the end. A
 * one-record file is whole after a short read, which saves the read of 0:
 * single_open() files (meminfo, pressure/memory) and cgroup files produce
 * all their text in one show, growing the buffer until it fits
 * (fs/seq_file.c), and a regular file reads short only at its end.
 */
static int pread_all(int fd, bool one_record, char *buf, size_t cap, size_t *len)
{
	size_t got = 0;

	while (got < cap) {
		ssize_t n = pread(fd, buf + got, cap - got, (off_t)got);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		got += (size_t)n;
		if (one_record)
			break;
	}
	*len = got;
	return 0;
}

/*
 * Read rel (below root_fd) through f, opening it on first use. A plain file
 * (a fixture) is checked by inode first, so one renamed over it is seen. A
 * kept fd that fails (ENODEV for a removed cgroup, ESTALE) is reopened once.
 * Returns 0 and *len, or a negative errno; f is then closed and the next read
 * opens it again. The caller reports failures once per outage.
 */
static int src_read(int root_fd, struct src_file *f, const char *rel, char *buf, size_t cap, size_t *len)
{
	struct stat st;
	bool fresh = false;
	int r;

	*len = 0;
	if (f->fd >= 0 && !f->pseudo) {
		if (fstatat(root_fd, rel, &st, 0) < 0) {
			r = -errno;
			src_close(f);
			return r;
		}
		if (st.st_ino != f->ino || st.st_dev != f->dev)
			src_close(f);
	}
	if (f->fd < 0) {
		r = src_open(root_fd, f, rel);
		if (r < 0)
			return r;
		fresh = true;
	}
	r = pread_all(f->fd, f->one_record, buf, cap, len);
	if (r < 0 && !fresh) {
		log_debug("pressure monitor: %s: %s; reopening", rel, strerror(-r));
		src_close(f);
		r = src_open(root_fd, f, rel);
		if (r == 0)
			r = pread_all(f->fd, f->one_record, buf, cap, len);
	}
	if (r < 0)
		src_close(f);
	return r;
}

static int read_meminfo(int root_fd, struct src_file *f, struct meminfo *m, char *buf)
{
	size_t len;
	int r;

	r = src_read(root_fd, f, MEMINFO_REL, buf, READ_BUF_BYTES, &len);
	if (r < 0)
		return r;
	return pressure_parse_meminfo(buf, len, m);
}

/* --- the memory cgroup --- */

static int cg_join(char *dst, size_t cap, const char *mount, const char *path)
{
	int n;

	/* path is absolute ("/" for the namespace root): mount + path. */
	n = snprintf(dst, cap, "%s%s", mount, strcmp(path, "/") == 0 ? "" : path);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

/*
 * Find the daemon's memory cgroup. v1 wins when the memory controller is
 * mounted there (hybrid hosts such as the capture host keep memory on v1 and
 * only the name=systemd hierarchy on v2). Containers often mount their own
 * cgroup at the mount point while /proc/self/cgroup still names the host
 * path, so a leaf that does not exist falls back to the mount point.
 */
static void cg_resolve(int root_fd, struct cg_loc *loc, char *buf)
{
	struct cgroup_paths paths;
	char probe[REL_PATH_MAX + 32];
	size_t len;
	int r;

	memset(loc, 0, sizeof(*loc));
	r = read_rel(root_fd, SELF_CGROUP_REL, buf, READ_BUF_BYTES, &len);
	if (r < 0) {
		log_debug("cannot read %s (%s): host figures only", SELF_CGROUP_REL, strerror(-r));
		return;
	}
	r = pressure_parse_self_cgroup(buf, len, &paths);
	if (r < 0) {
		log_warnx("%s is not a cgroup list (%s); host figures only", SELF_CGROUP_REL, strerror(-r));
		return;
	}
	if (paths.has_v1_memory) {
		loc->kind = CG_V1;
		snprintf(loc->mount, sizeof(loc->mount), "sys/fs/cgroup/memory");
		r = cg_join(loc->dir, sizeof(loc->dir), loc->mount, paths.v1_memory);
		snprintf(probe, sizeof(probe), "%s/memory.limit_in_bytes", loc->dir);
	} else {
		loc->kind = CG_V2;
		snprintf(loc->mount, sizeof(loc->mount), "sys/fs/cgroup");
		r = cg_join(loc->dir, sizeof(loc->dir), loc->mount, paths.v2);
		snprintf(probe, sizeof(probe), "%s/memory.current", loc->dir);
	}
	if (r < 0 || !exists_rel(root_fd, probe)) {
		snprintf(loc->dir, sizeof(loc->dir), "%s", loc->mount);
		snprintf(probe, sizeof(probe), "%s/%s", loc->dir,
			 loc->kind == CG_V1 ? "memory.limit_in_bytes" : "memory.current");
		/* The v2 root has no memory.current: no limit applies there. */
		if (!exists_rel(root_fd, probe))
			loc->kind = CG_NONE;
	}
	log_debug("memory cgroup: %s", loc->kind == CG_NONE ? "none" : loc->dir);
}

/* Walk from the leaf up to the mount point once; the files open on first read. */
static void cg_levels_init(struct cg_src *cg)
{
	const struct cg_loc *loc = &cg->loc;
	size_t mount_len = strlen(loc->mount), len = strlen(loc->dir);

	cg->nlevels = 0;
	cg->limits_valid = false;
	if (loc->kind == CG_NONE)
		return;
	while (cg->nlevels < CGROUP_DEPTH_MAX) {
		struct cg_level *l = &cg->level[cg->nlevels++];
		const char *slash;

		*l = (struct cg_level){.dir_len = len, .limit_bytes = PRESSURE_UNLIMITED};
		src_init(&l->limit, true);
		src_init(&l->usage, true);
		src_init(&l->stat, true);
		if (len <= mount_len)
			break;
		slash = memrchr(loc->dir, '/', len);
		if (!slash || (size_t)(slash - loc->dir) < mount_len)
			break;
		len = (size_t)(slash - loc->dir);
	}
}

static void cg_close(struct cg_src *cg)
{
	for (size_t i = 0; i < cg->nlevels; i++) {
		src_close(&cg->level[i].limit);
		src_close(&cg->level[i].usage);
		src_close(&cg->level[i].stat);
	}
}

static int cg_level_read(int root_fd, const struct cg_src *cg, struct cg_level *l, struct src_file *f,
			 const char *name, char *buf, size_t *len)
{
	char rel[REL_PATH_MAX + 32];

	snprintf(rel, sizeof(rel), "%.*s/%s", (int)l->dir_len, cg->loc.dir, name);
	return src_read(root_fd, f, rel, buf, READ_BUF_BYTES, len);
}

/* Read every level's limit. Returns 0, or the leaf's errno when its own limit is unreadable. */
static int cg_read_limits(int root_fd, struct cg_src *cg, uint64_t now, char *buf)
{
	bool v1 = cg->loc.kind == CG_V1;
	size_t len;
	int r;

	cg->limits_pseudo = true;
	for (size_t i = 0; i < cg->nlevels; i++) {
		struct cg_level *l = &cg->level[i];

		r = cg_level_read(root_fd, cg, l, &l->limit, v1 ? "memory.limit_in_bytes" : "memory.max", buf, &len);
		if (r == 0)
			r = v1 ? pressure_parse_cgroup_v1_limit(buf, len, &l->limit_bytes)
			       : pressure_parse_cgroup_v2_max(buf, len, &l->limit_bytes);
		l->limit_err = r;
		if (l->limit.fd >= 0 && !l->limit.pseudo)
			cg->limits_pseudo = false;
		if (r < 0 || l->limit_bytes == PRESSURE_UNLIMITED) {
			/* Only a limited level's usage is read: hold no fds for the others. */
			src_close(&l->usage);
			src_close(&l->stat);
		}
		/* The v2 root (a namespace's included) may have no memory.max: no limit there. */
		if (r < 0 && i == 0 && !(cg->loc.kind == CG_V2 && l->dir_len == strlen(cg->loc.mount))) {
			cg->limits_valid = false;
			return r;
		}
	}
	cg->limits_valid = true;
	cg->limits_ms = now;
	return 0;
}

static int cg_read_usage(int root_fd, struct cg_src *cg, struct cg_level *l, uint64_t *usage, uint64_t *reclaimable,
			 char *buf)
{
	bool v1 = cg->loc.kind == CG_V1;
	size_t len;
	int r;

	r = cg_level_read(root_fd, cg, l, &l->usage, v1 ? "memory.usage_in_bytes" : "memory.current", buf, &len);
	if (r < 0)
		return r;
	r = pressure_parse_u64_file(buf, len, usage);
	if (r < 0)
		return r;
	/* v1's total_ counters are hierarchical like usage_in_bytes; v2's memory.stat always is. */
	*reclaimable = 0;
	if (cg_level_read(root_fd, cg, l, &l->stat, "memory.stat", buf, &len) == 0)
		(void)pressure_parse_keyed_u64(buf, len, v1 ? "total_inactive_file" : "inactive_file", reclaimable);
	return 0;
}

/*
 * The limit that binds: every ancestor's limit caps us too, so take the one
 * with the least room (limit - usage) from the leaf up to the mount point.
 * The limits are re-read every CG_LIMIT_REFRESH_MS, when refresh_limits, and
 * on every poll for plain files; usage on every call. Returns 0, or the
 * leaf's errno when its own files are unreadable.
 */
static int cg_read(int root_fd, struct cg_src *cg, uint64_t now, bool refresh_limits, struct cg_reading *ret,
		   char *buf)
{
	bool best_set = false;
	uint64_t best_room = 0;
	int r;

	memset(ret, 0, sizeof(*ret));
	if (cg->loc.kind == CG_NONE)
		return 0;
	if (refresh_limits || !cg->limits_valid || !cg->limits_pseudo || now - cg->limits_ms >= CG_LIMIT_REFRESH_MS) {
		r = cg_read_limits(root_fd, cg, now, buf);
		if (r < 0)
			return r;
	}
	for (size_t i = 0; i < cg->nlevels; i++) {
		struct cg_level *l = &cg->level[i];
		uint64_t usage, reclaimable, used, room;

		if (l->limit_err < 0 || l->limit_bytes == PRESSURE_UNLIMITED)
			continue;
		r = cg_read_usage(root_fd, cg, l, &usage, &reclaimable, buf);
		if (r < 0) {
			/* The cgroup may be gone: read the limits again next time too. */
			cg->limits_valid = false;
			if (i == 0)
				return r;
			continue;
		}
		used = usage > reclaimable ? usage - reclaimable : 0;
		room = l->limit_bytes > used ? l->limit_bytes - used : 0;
		if (!best_set || room < best_room) {
			best_set = true;
			best_room = room;
			ret->have_limit = true;
			ret->limit_bytes = l->limit_bytes;
			ret->usage_bytes = usage;
			ret->reclaimable_bytes = reclaimable;
		}
	}
	return 0;
}

int pressure_read_host(const char *proc_root, struct pressure_host *ret)
{
	struct meminfo m;
	struct src_file meminfo_f;
	struct cg_src *cg = NULL;
	struct cg_reading reading;
	char *buf;
	int root_fd = -1, r;

	memset(ret, 0, sizeof(*ret));
	src_init(&meminfo_f, true);
	buf = malloc(READ_BUF_BYTES);
	cg = calloc(1, sizeof(*cg));
	if (!buf || !cg) {
		r = -ENOMEM;
		goto out;
	}
	root_fd = open(proc_root && *proc_root ? proc_root : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0) {
		r = -errno;
		goto out;
	}
	r = read_meminfo(root_fd, &meminfo_f, &m, buf);
	src_close(&meminfo_f);
	if (r < 0)
		goto out;
	ret->mem_total_bytes = m.mem_total_bytes;
	ret->mem_available_bytes = m.mem_available_bytes;
	cg_resolve(root_fd, &cg->loc, buf);
	cg_levels_init(cg);
	if (cg_read(root_fd, cg, now_ms(), true, &reading, buf) == 0 && reading.have_limit) {
		ret->cgroup_limit_bytes = reading.limit_bytes;
		ret->cgroup_usage_bytes = reading.usage_bytes;
	}
	cg_close(cg);
	r = 0;
out:
	if (root_fd >= 0)
		close(root_fd);
	free(cg);
	free(buf);
	return r;
}

/* --- warnings once per outage --- */

static void source_failed(struct monitor *m, enum source src, const char *rel, int err, const char *consequence)
{
	if (m->warned & src)
		return;
	m->warned |= src;
	log_warnx("pressure monitor: cannot use %s/%s: %s; %s", m->proc_root, rel,
		  err == -EBADMSG ? "unexpected contents" : strerror(-err), consequence);
}

static void source_ok(struct monitor *m, enum source src, const char *rel)
{
	if (!(m->warned & src))
		return;
	m->warned &= ~(unsigned)src;
	log_info("pressure monitor: %s/%s is readable again", m->proc_root, rel);
}

/* --- PSI triggers --- */

static void triggers_close(struct monitor *m)
{
	if (m->epfd >= 0) {
		ev_io_stop(m->loop, &m->psi_io);
		close(m->epfd);
		m->epfd = -1;
	}
	for (int i = 0; i < 2; i++) {
		if (m->psi_fd[i] >= 0)
			close(m->psi_fd[i]);
		m->psi_fd[i] = -1;
	}
}

/* Open the PSI file and register one trigger on it. Returns the fd or a negative errno. */
static int trigger_open(struct monitor *m, const char *kind, uint32_t stall_us, uint32_t window_us)
{
	char cmd[64];
	struct statfs sfs;
	int fd, n;

	fd = openat(m->root_fd, PSI_REL, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return -errno;
	/*
	 * A write to a fixture's plain file "succeeds" and never fires; only a
	 * file on procfs is a real trigger.
	 */
	if (fstatfs(fd, &sfs) < 0 || sfs.f_type != PROC_SUPER_MAGIC) {
		close(fd);
		return -ENOTSUP;
	}
	n = snprintf(cmd, sizeof(cmd), "%s %u %u", kind, stall_us, window_us);
	/* The kernel overwrites the last byte written with a NUL, so the NUL is part of the write (psi.rst). */
	if (write(fd, cmd, (size_t)n + 1) < 0) {
		n = -errno;
		close(fd);
		return n;
	}
	return fd;
}

static int triggers_open_both(struct monitor *m, uint32_t stall_us, uint32_t window_us)
{
	int some, full;

	some = trigger_open(m, "some", stall_us, window_us);
	if (some < 0)
		return some;
	full = trigger_open(m, "full", stall_us, window_us);
	if (full < 0) {
		close(some);
		return full;
	}
	m->psi_fd[0] = some;
	m->psi_fd[1] = full;
	m->trigger_stall_us = stall_us;
	m->trigger_window_us = window_us;
	return 0;
}

static void psi_cb(struct ev_loop *loop, ev_io *w, int revents);

/* Arm "some" and "full" triggers, or say why the monitor polls instead; the reason goes into mode. */
static void triggers_arm(struct monitor *m)
{
	uint32_t window_us, stall_us, rounded_us;
	struct epoll_event ev = {.events = EPOLLPRI};
	int r;

	triggers_close(m);
	if (!exists_rel(m->root_fd, PSI_REL)) {
		snprintf(m->mode, sizeof(m->mode), "poll (no PSI)");
		log_info("pressure monitor: no %s/%s (kernel without PSI); polling every %u ms", m->proc_root, PSI_REL,
			 m->poll_interval_ms);
		return;
	}
	window_us = m->psi_window_ms > PSI_WINDOW_MAX_US / 1000 ? PSI_WINDOW_MAX_US : m->psi_window_ms * 1000;
	if (window_us < PSI_WINDOW_MIN_US)
		window_us = PSI_WINDOW_MIN_US;
	stall_us = m->psi_stall_ms > window_us / 1000 ? window_us : m->psi_stall_ms * 1000;
	if (stall_us == 0)
		stall_us = 1000;

	r = triggers_open_both(m, stall_us, window_us);
	if (r == 0) {
		snprintf(m->mode, sizeof(m->mode), "psi-trigger");
	} else if ((r == -EPERM || r == -EINVAL) && window_us % PSI_WINDOW_UNPRIV_US != 0) {
		rounded_us = (uint32_t)round_up(window_us, PSI_WINDOW_UNPRIV_US);
		r = triggers_open_both(m, stall_us, rounded_us);
		if (r == 0) {
			snprintf(m->mode, sizeof(m->mode), "psi-trigger-2s");
			log_info("pressure monitor: a %u ms PSI window needs CAP_SYS_RESOURCE; using %u ms, the "
				 "shortest an unprivileged trigger may have",
				 window_us / 1000, rounded_us / 1000);
		}
	}
	if (r < 0) {
		const char *why = r == -ENOTSUP ? "not on procfs" : strerror(-r);

		snprintf(m->mode, sizeof(m->mode), "poll (PSI triggers unavailable: %s)", why);
		log_info("pressure monitor: PSI triggers unavailable (%s); polling every %u ms", why,
			 m->poll_interval_ms);
		return;
	}

	m->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (m->epfd < 0) {
		r = -errno;
		goto fail;
	}
	for (int i = 0; i < 2; i++) {
		ev.data.u32 = (uint32_t)i;
		if (epoll_ctl(m->epfd, EPOLL_CTL_ADD, m->psi_fd[i], &ev) < 0) {
			r = -errno;
			goto fail;
		}
	}
	ev_io_init(&m->psi_io, psi_cb, m->epfd, EV_READ);
	m->psi_io.data = m;
	ev_io_start(m->loop, &m->psi_io);
	log_info("pressure monitor: PSI triggers armed on %s/%s: %u ms of stall in %u ms", m->proc_root, PSI_REL,
		 m->trigger_stall_us / 1000, m->trigger_window_us / 1000);
	return;
fail:
	triggers_close(m);
	snprintf(m->mode, sizeof(m->mode), "poll (PSI triggers unavailable: epoll: %s)", strerror(-r));
	log_warnx("pressure monitor: cannot watch PSI triggers (epoll: %s); polling every %u ms", strerror(-r),
		  m->poll_interval_ms);
}

/* --- sampling and transitions --- */

static void record(struct monitor *m, uint64_t when_ms, const char *text)
{
	struct monitor_event *e = &m->ring[m->ring_next];

	e->when_ms = when_ms;
	snprintf(e->text, sizeof(e->text), "%s", text);
	m->ring_next = (m->ring_next + 1) % RING_SIZE;
	if (m->ring_count < RING_SIZE)
		m->ring_count++;
}

static void transition(struct monitor *m, enum broker_state from, enum broker_state to, const char *why,
		       uint64_t when_ms)
{
	const char *f = pressure_state_name(from), *t = pressure_state_name(to);
	char text[sizeof(m->ring[0].text)];

	m->state = to;
	/* The ring's text is short by design; the log line below carries the whole why. */
	if (snprintf(text, sizeof(text), "%s -> %s: %.*s", f, t, (int)(sizeof(text) - 24), why) < 0)
		text[0] = '\0';
	record(m, when_ms, text);
	/*
	 * One line per transition, as a structured event (MESSAGE_ID, warning
	 * going up, info going down). A log_warnx beside it would print every
	 * transition twice; the event's limiter (20 per 5 s) is far above what
	 * hysteresis lets through, and the ring keeps every one for pinctl.
	 */
	log_event(EV_PRESSURE_TRANSITION, to > from ? LOG_WARNING : LOG_INFO, 0, (uid_t)-1, 0,
		  "memory pressure %s -> %s: %s", f, t, why);
	if (m->fn)
		m->fn(m->ud, from, to, why);
}

/* Poll fast while above normal or shortly after a trigger; otherwise at poll-interval-ms. */
static void timer_retune(struct monitor *m, uint64_t now)
{
	uint32_t want = m->poll_interval_ms ? m->poll_interval_ms : DEFAULT_POLL_MS;

	if ((m->state > BROKER_NORMAL || now < m->fast_until_ms) && want > FAST_POLL_MS)
		want = FAST_POLL_MS;
	if (want == m->timer_ms && ev_is_active(&m->timer))
		return;
	m->timer_ms = want;
	m->timer.repeat = want / 1000.0;
	ev_timer_again(m->loop, &m->timer);
}

/* pswpin/pswpout rates against the newest reference at least RATE_WINDOW_MS old. */
static void sample_vmstat(struct monitor *m, uint64_t now, struct pressure_sample *s, char *buf)
{
	const struct vm_point *base = NULL;
	struct vmstat v;
	size_t len;
	int r;

	/*
	 * No swap, no swap I/O: skip vmstat, the costliest file of a poll
	 * (4 KiB of per-CPU sums: 30 of the 50 us of preads, measured hot on
	 * the development VM). A swapon shows in the next meminfo.
	 */
	if (s->mem.swap_total_bytes == 0) {
		s->have_swapout = true;
		m->vm_old.set = m->vm_new.set = false;
		return;
	}
	r = src_read(m->root_fd, &m->vmstat_f, VMSTAT_REL, buf, READ_BUF_BYTES, &len);
	if (r == 0)
		r = pressure_parse_vmstat(buf, len, &v);
	if (r < 0) {
		source_failed(m, SRC_VMSTAT, VMSTAT_REL, r, "swap-out rate not watched");
		m->vm_old.set = m->vm_new.set = false;
		return;
	}
	source_ok(m, SRC_VMSTAT, VMSTAT_REL);
	if (m->vm_new.set && now - m->vm_new.ms >= RATE_WINDOW_MS)
		base = &m->vm_new;
	else if (m->vm_old.set)
		base = &m->vm_old;
	else if (m->vm_new.set)
		base = &m->vm_new;
	if (base && now > base->ms) {
		s->have_swapout = true;
		s->swapout_pages_s = pressure_rate_per_s(base->v.pswpout, v.pswpout, now - base->ms);
		s->swapin_pages_s = pressure_rate_per_s(base->v.pswpin, v.pswpin, now - base->ms);
	}
	if (!m->vm_new.set) {
		m->vm_new = (struct vm_point){true, now, v};
	} else if (now - m->vm_new.ms >= RATE_WINDOW_MS) {
		m->vm_old = m->vm_new;
		m->vm_new = (struct vm_point){true, now, v};
	}
}

static void psi_merge(struct psi_line *dst, const struct psi_line *src)
{
	if (!src->present)
		return;
	if (!dst->present) {
		*dst = *src;
		return;
	}
	dst->avg10 = fmax(dst->avg10, src->avg10);
	dst->avg60 = fmax(dst->avg60, src->avg60);
	dst->avg300 = fmax(dst->avg300, src->avg300);
}

static void sample_psi(struct monitor *m, struct pressure_sample *s, char *buf)
{
	char rel[REL_PATH_MAX + 32];
	struct psi p;
	size_t len;
	int r;

	r = src_read(m->root_fd, &m->psi_f, PSI_REL, buf, READ_BUF_BYTES, &len);
	if (r == 0)
		r = pressure_parse_psi(buf, len, &p);
	if (r == 0) {
		source_ok(m, SRC_PSI, PSI_REL);
		s->have_psi = true;
		s->psi = p;
	} else if (r != -ENOENT) {
		source_failed(m, SRC_PSI, PSI_REL, r, "PSI not watched");
	}

	/*
	 * A v2 cgroup stalls on its own limit while the host is calm: take the
	 * worse of the two, since either way pinning more makes it worse.
	 */
	if (m->cg.loc.kind != CG_V2 || strcmp(m->cg.loc.dir, m->cg.loc.mount) == 0)
		return;
	snprintf(rel, sizeof(rel), "%s/memory.pressure", m->cg.loc.dir);
	r = src_read(m->root_fd, &m->cg_psi_f, rel, buf, READ_BUF_BYTES, &len);
	if (r == -ENOENT)
		return;
	if (r == 0)
		r = pressure_parse_psi(buf, len, &p);
	if (r < 0) {
		source_failed(m, SRC_CGROUP_PSI, rel, r, "the cgroup's PSI not watched");
		return;
	}
	source_ok(m, SRC_CGROUP_PSI, rel);
	s->have_psi = true;
	psi_merge(&s->psi.some, &p.some);
	psi_merge(&s->psi.full, &p.full);
}

/* refresh_limits: read the cgroup limits now rather than when they are due. */
static void sample(struct monitor *m, bool refresh_limits)
{
	struct pressure_sample s = {0};
	struct cg_reading cg;
	enum broker_state old = m->state, next;
	char buf[READ_BUF_BYTES];
	char why[512];
	uint64_t now = now_ms();
	bool want_why;
	int r;

	r = read_meminfo(m->root_fd, &m->meminfo_f, &s.mem, buf);
	if (r < 0) {
		/* Without meminfo nothing can be judged: keep the state, try again next poll. */
		source_failed(m, SRC_MEMINFO, MEMINFO_REL, r, "keeping the current pressure state");
		timer_retune(m, now);
		return;
	}
	source_ok(m, SRC_MEMINFO, MEMINFO_REL);
	sample_vmstat(m, now, &s, buf);
	sample_psi(m, &s, buf);
	if (m->cg.loc.kind != CG_NONE) {
		r = cg_read(m->root_fd, &m->cg, now, refresh_limits, &cg, buf);
		if (r < 0) {
			source_failed(m, SRC_CGROUP, m->cg.loc.dir, r, "the cgroup limit is not watched");
		} else {
			source_ok(m, SRC_CGROUP, m->cg.loc.dir);
			s.have_cgroup_limit = cg.have_limit;
			s.cgroup_limit_bytes = cg.limit_bytes;
			s.cgroup_usage_bytes = cg.usage_bytes;
			s.cgroup_reclaimable_bytes = cg.reclaimable_bytes;
		}
	}

	/*
	 * The why costs about 30 us a poll on the development VM (vsnprintf of
	 * doubles, cold after 100 ms asleep), a third of an idle poll. From
	 * normal, evaluate moves only when the level is above normal, so a calm
	 * poll needs no why unless the debug line below prints it.
	 */
	why[0] = '\0';
	pressure_figures(&s, &m->figs);
	want_why = old != BROKER_NORMAL || log_level >= LOG_DEBUG ||
		   pressure_level(pressure_get_thresholds(m->policy), &m->figs) != BROKER_NORMAL;
	next = pressure_evaluate(m->policy, &s, now, want_why ? why : NULL, sizeof(why));
	m->sample = s;
	m->have_sample = true;
	if (next != old) {
		transition(m, old, next, why, now);
	} else {
		log_debug("pressure %s: %s", pressure_state_name(next), why);
	}
	timer_retune(m, now);
}

static void timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	sample(w->data, false);
}

static void psi_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct monitor *m = w->data;
	struct epoll_event evs[4];
	bool broken = false;
	int n;

	(void)loop;
	(void)revents;
	/* Reading the events resets the triggers' edge; without this the epoll fd stays readable. */
	n = epoll_wait(m->epfd, evs, 4, 0);
	for (int i = 0; i < n; i++)
		if (evs[i].events & (EPOLLERR | EPOLLHUP))
			broken = true;
	if (broken) {
		/* A trigger in error reports EPOLLERR on every wait: keep it and the loop spins. */
		triggers_close(m);
		snprintf(m->mode, sizeof(m->mode), "poll (PSI trigger failed)");
		log_warnx("pressure monitor: a PSI trigger reported an error; polling every %u ms from now on",
			  m->poll_interval_ms);
	}
	/* The trigger says the stall is building over its window: watch that closely for as long. */
	if (n > 0 && !broken)
		m->fast_until_ms = now_ms() + (m->trigger_window_us > 1000000 ? m->trigger_window_us / 1000 : 1000);
	sample(m, false);
}

/* --- construction and reconfiguration --- */

static void thresholds_from(const struct config *cfg, struct pressure_thresholds *t)
{
	*t = (struct pressure_thresholds){
		.tight_mem_available_pct = cfg->tight_mem_available_pct,
		.critical_mem_available_pct = cfg->critical_mem_available_pct,
		.tight_psi_some_avg10 = cfg->tight_psi_some_avg10,
		.critical_psi_full_avg10 = cfg->critical_psi_full_avg10,
		.tight_swapout_pages_s = cfg->tight_swapout_pages_s,
		.critical_swapout_pages_s = cfg->critical_swapout_pages_s,
		.tight_swap_free_pct = cfg->tight_swap_free_pct,
		.hysteresis_ms = cfg->hysteresis_ms,
	};
}

int monitor_new(struct ev_loop *loop, const struct config *cfg, monitor_state_fn fn, void *ud, struct monitor **ret)
{
	struct pressure_thresholds t;
	struct meminfo mi;
	struct monitor *m;
	char *buf = NULL;
	int r;

	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->loop = loop;
	m->fn = fn;
	m->ud = ud;
	m->root_fd = m->epfd = m->psi_fd[0] = m->psi_fd[1] = -1;
	src_init(&m->meminfo_f, true);
	src_init(&m->vmstat_f, false);
	src_init(&m->psi_f, true);
	src_init(&m->cg_psi_f, true);
	m->proc_root = strdup(cfg->proc_root && *cfg->proc_root ? cfg->proc_root : "/");
	buf = malloc(READ_BUF_BYTES);
	if (!m->proc_root || !buf) {
		r = -ENOMEM;
		goto fail;
	}
	/* Display: "/" + "/proc/meminfo" would read "//proc/meminfo". */
	if (strcmp(m->proc_root, "/") == 0)
		m->proc_root[0] = '\0';
	m->root_fd = open(*m->proc_root ? m->proc_root : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (m->root_fd < 0) {
		r = -errno;
		log_warnx("pressure monitor: proc-root %s: %s", cfg->proc_root, strerror(-r));
		goto fail;
	}
	r = read_meminfo(m->root_fd, &m->meminfo_f, &mi, buf);
	if (r < 0) {
		log_warnx("pressure monitor: cannot use %s/%s: %s", m->proc_root, MEMINFO_REL,
			  r == -EBADMSG ? "MemTotal or MemAvailable missing or malformed" : strerror(-r));
		goto fail;
	}

	thresholds_from(cfg, &t);
	r = pressure_new(&t, &m->policy);
	if (r < 0)
		goto fail;
	m->poll_interval_ms = cfg->poll_interval_ms ? cfg->poll_interval_ms : DEFAULT_POLL_MS;
	m->psi_window_ms = cfg->psi_window_ms;
	m->psi_stall_ms = cfg->psi_stall_ms;
	cg_resolve(m->root_fd, &m->cg.loc, buf);
	cg_levels_init(&m->cg);
	free(buf);
	buf = NULL;

	triggers_arm(m);
	/*
	 * The first evaluation runs from the loop, right away, so fn hears of a
	 * host that is already tight or critical at start like any other change.
	 */
	ev_init(&m->timer, timer_cb);
	m->timer.data = m;
	m->timer_ms = m->poll_interval_ms;
	ev_timer_set(&m->timer, 0., m->poll_interval_ms / 1000.0);
	ev_timer_start(loop, &m->timer);
	*ret = m;
	return 0;
fail:
	free(buf);
	monitor_free(m);
	return r;
}

void monitor_free(struct monitor *m)
{
	if (!m)
		return;
	if (m->loop)
		ev_timer_stop(m->loop, &m->timer);
	triggers_close(m);
	src_close(&m->meminfo_f);
	src_close(&m->vmstat_f);
	src_close(&m->psi_f);
	src_close(&m->cg_psi_f);
	cg_close(&m->cg);
	if (m->root_fd >= 0)
		close(m->root_fd);
	pressure_free(m->policy);
	free(m->proc_root);
	free(m);
}

int monitor_reconfigure(struct monitor *m, const struct config *cfg)
{
	struct pressure_thresholds t;
	bool rearm;

	thresholds_from(cfg, &t);
	pressure_set_thresholds(m->policy, &t);
	rearm = cfg->psi_window_ms != m->psi_window_ms || cfg->psi_stall_ms != m->psi_stall_ms;
	m->poll_interval_ms = cfg->poll_interval_ms ? cfg->poll_interval_ms : DEFAULT_POLL_MS;
	m->psi_window_ms = cfg->psi_window_ms;
	m->psi_stall_ms = cfg->psi_stall_ms;
	if (rearm)
		triggers_arm(m);
	/* Judge the new thresholds now rather than at the next tick; a reload is also when limits get looked at. */
	sample(m, true);
	return 0;
}

void monitor_sample_now(struct monitor *m)
{
	sample(m, true);
}

enum broker_state monitor_state(const struct monitor *m)
{
	return m->state;
}

const char *monitor_state_name(enum broker_state s)
{
	return pressure_state_name(s);
}

const char *monitor_mode(const struct monitor *m)
{
	return m->mode;
}

size_t monitor_signals(const struct monitor *m, struct monitor_signal *out, size_t max)
{
	const struct pressure_thresholds *t = pressure_get_thresholds(m->policy);
	const struct pressure_figures *f = &m->figs;
	const struct pressure_sample *s = &m->sample;
	bool ok = m->have_sample;
	const struct monitor_signal all[] = {
		{"mem_available_pct", f->mem_available_pct, t->tight_mem_available_pct, t->critical_mem_available_pct,
		 "%", ok},
		{"mem_available_bytes", (double)f->mem_available_bytes, NAN, NAN, "bytes", ok},
		{"swap_free_pct", f->swap_free_pct, t->tight_swap_free_pct, NAN, "%", ok && s->mem.swap_total_bytes > 0},
		{"swapout_pages_s", f->swapout_pages_s, t->tight_swapout_pages_s, t->critical_swapout_pages_s, "pages/s",
		 ok && s->have_swapout},
		{"swapin_pages_s", f->swapin_pages_s, NAN, NAN, "pages/s", ok && s->have_swapout},
		{"psi_some_avg10", f->psi_some_avg10, t->tight_psi_some_avg10, NAN, "%", ok && s->have_psi},
		{"psi_full_avg10", f->psi_full_avg10, NAN, t->critical_psi_full_avg10, "%",
		 ok && s->have_psi && s->psi.full.present},
		{"cgroup_usage_pct", f->cgroup_usage_pct, NAN, NAN, "%", ok && s->have_cgroup_limit},
	};
	size_t n = sizeof(all) / sizeof(all[0]);

	for (size_t i = 0; i < n && i < max; i++)
		out[i] = all[i];
	return n;
}

size_t monitor_transitions(const struct monitor *m, struct monitor_event *out, size_t max)
{
	size_t n = m->ring_count < max ? m->ring_count : max;

	for (size_t i = 0; i < n; i++)
		out[i] = m->ring[(m->ring_next + RING_SIZE - 1 - i) % RING_SIZE];
	return n;
}

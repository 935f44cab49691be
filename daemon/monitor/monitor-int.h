/* SPDX-License-Identifier: MIT */
/*
 * The pressure monitor's insides, shared by monitor.c (sampling), monitor-proc.c, monitor-cgroup.c and monitor-psi.c.
 */
#pragma once

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "monitor.h"
#include "pressure.h"

/* vmstat is about 4 KiB on 6.x kernels, meminfo 1.5 KiB, cgroup v1 memory.stat 1 KiB. */
#define READ_BUF_BYTES 16384
/* Ancestors walked for the tightest limit; real hierarchies are a handful deep. */
#define CGROUP_DEPTH_MAX 32
#define REL_PATH_MAX (PRESSURE_CGROUP_PATH_MAX + 64)

#define MEMINFO_REL "proc/meminfo"
#define PSI_REL "proc/pressure/memory"

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
	dev_t dev;       /* which file fd is: a fixture's plain file may be replaced by rename(2) */
	ino_t ino;
};

/* Where the daemon's memory cgroup lives, relative to proc-root. */
struct cg_loc {
	enum cg_kind kind;
	char mount[32];         /* "sys/fs/cgroup/memory" (v1) or "sys/fs/cgroup" (v2): the walk stops here */
	char dir[REL_PATH_MAX]; /* the leaf: mount + the path from /proc/self/cgroup */
};

/* One directory of the walk from the leaf up to the mount point. */
struct cg_level {
	size_t dir_len;       /* the directory is the leaf's first dir_len bytes */
	int limit_err;        /* of the last limit read: 0 or a negative errno */
	uint64_t limit_bytes; /* PRESSURE_UNLIMITED for none */
	struct src_file limit, usage, stat;
};

/* The cgroup's files, kept open, and the limits last read. */
struct cg_src {
	struct cg_loc loc;
	size_t nlevels;
	bool limits_valid;  /* false: read the limits at the next sample */
	bool limits_pseudo; /* every limit file is on cgroupfs; else (a fixture) read them every poll */
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

struct monitor;
/* A PSI trigger fired (or broke): the owner samples now. Set by monitor.c, called by monitor-psi.c. */
typedef void mon_trigger_fn(struct monitor *m);

struct monitor {
	struct ev_loop *loop;
	monitor_state_fn fn;
	void *ud;
	int root_fd; /* proc-root, O_PATH: every read is an openat below it */
	char *proc_root;

	struct pressure *policy;
	uint32_t poll_interval_ms;
	uint32_t psi_window_ms;
	uint32_t psi_stall_ms;

	ev_timer timer;
	uint32_t timer_ms;      /* the period the timer runs at now */
	uint64_t fast_until_ms; /* after a trigger: poll fast until then */

	/*
	 * PSI trigger fds sit in an inner epoll set watched through ev_io:
	 * libev has no POLLPRI watcher, and an ev_io on the PSI fd itself
	 * reports it readable forever, so the loop would spin.
	 */
	ev_io psi_io;
	mon_trigger_fn *on_trigger; /* how monitor-psi.c reports a trigger, so it never calls back into monitor.c */
	int epfd;
	int psi_fd[2]; /* "some", "full"; -1 when not armed */
	uint32_t trigger_stall_us, trigger_window_us;
	char mode[128];

	struct cg_src cg;
	struct src_file meminfo_f, vmstat_f, psi_f, cg_psi_f;
	struct vm_point vm_old, vm_new;
	struct vm_point vm_last; /* the newest reading, for the metrics' swap counters; kept across a swapoff */

	bool have_sample;
	struct pressure_sample sample;
	struct pressure_figures figs;
	unsigned warned; /* enum source bits reported and not yet recovered */

	struct monitor_event ring[MONITOR_EVENTS_MAX];
	size_t ring_next, ring_count;
};

/* monitor-proc.c: files under proc-root. */

/* Read up to cap bytes of rel (below root_fd) with open, read and close. Returns 0 and *len, or a negative errno. */
int mon_read_rel(int root_fd, const char *rel, char *buf, size_t cap, size_t *len);
bool mon_exists_rel(int root_fd, const char *rel);
/* A closed src_file; one_record: see pread_all() in monitor-proc.c. */
void mon_src_init(struct src_file *f, bool one_record);
void mon_src_close(struct src_file *f);
/*
 * Read rel (below root_fd) through f, kept open between calls. Returns 0 and
 * *len, or a negative errno; f is then closed and the next read opens it again.
 */
int mon_src_read(int root_fd, struct src_file *f, const char *rel, char *buf, size_t cap, size_t *len);
/* Read and parse meminfo through f into *m; buf holds READ_BUF_BYTES. Returns 0 or a negative errno. */
int mon_read_meminfo(int root_fd, struct src_file *f, struct meminfo *m, char *buf);

/* monitor-cgroup.c: the daemon's memory cgroup and its ancestors. */

/* Find the memory cgroup below root_fd into *loc (kind CG_NONE when there is none); buf holds READ_BUF_BYTES. */
void mon_cg_resolve(int root_fd, struct cg_loc *loc, char *buf);
/* The levels of the walk from cg->loc's leaf up to its mount point, files closed. */
void mon_cg_levels_init(struct cg_src *cg);
void mon_cg_close(struct cg_src *cg);
/*
 * The binding limit among the levels, and its usage (now: monotonic ms;
 * refresh_limits: read the limits now). Returns 0, or the leaf's errno when
 * its own files are unreadable.
 */
int mon_cg_read(int root_fd, struct cg_src *cg, uint64_t now, bool refresh_limits, struct cg_reading *ret, char *buf);

/* monitor-psi.c: PSI triggers. */

/*
 * Arm "some" and "full" triggers on m's PSI file, or say in m->mode why the
 * monitor polls instead. A firing (or failing) trigger calls m->on_trigger.
 */
void mon_triggers_arm(struct monitor *m);
void mon_triggers_close(struct monitor *m);

/* SPDX-License-Identifier: MIT */
/* What restart's files share: its state, and the state file's and the /proc scans' verbs (restart-scan.c) that start and stop (restart.c) call. */
#pragma once

#include <ev.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "holders.h"
#include "orphans.h"
#include "pool.h"

struct broker;

#define BOOT_ID_BYTES 64
/* A pid the state file names but no pidfd watches (none opened: over the bound, or EMFILE and the like). */
#define PIDFD_NONE (-2)

struct restart {
	struct broker *b;
	char path[PATH_MAX];
	char boot_id[BOOT_ID_BYTES];
	char memfd_name[POOL_MEMFD_NAME_MAX];
	struct orphan *v;
	size_t n;
	bool legacy;      /* some orphans were found by the legacy name: rescans look for it too */
	unsigned backoff; /* the scan interval now, in orphan-rescan-ms ticks: 1, doubled while nothing goes */
	unsigned ticks;   /* ticks since the last scan */
	uid_t *uids;      /* sorted: the uids that own an orphan, and 0 (a process not dumpable shows as root) */
	size_t nuids;
	pid_t *named; /* sorted: every pid the orphans name */
	size_t nnamed;
	ev_timer rescan;
};

/* One scan of /proc: every mapping or fd of our memfd name, and the processes read to the end. */
struct scan {
	struct holders_memfd *m;
	size_t n, cap;
	pid_t *read;
	size_t nread, capread;
	bool oom;
};

/* The file's text, or -ENOENT when there is none; -EPERM (with *why) when it is not one this daemon wrote. */
int restart_read_state(const char *path, char **ret, size_t *len, const char **why);
/* Replace the file atomically with v (or remove it when v is empty). */
void restart_write_state(const struct restart *rs, const struct orphan *v, size_t n);

/* Orders of the scan's sorted arrays: memfds by (ino, dev), pids ascending. */
int restart_memfd_cmp(const void *a, const void *b);
int restart_pid_cmp(const void *a, const void *b);
/*
 * One pass over /proc (two while orphans of the legacy name are counted); a
 * rescan (filtered) reads only the processes of a uid that owns an orphan or
 * that the state file names. Returns 0, or -errno (then nothing may be let go
 * on its word).
 */
int restart_scan_proc(const struct restart *rs, struct scan *s, bool filtered);
/* One unfiltered pass for the legacy name alone. Returns 0 or -errno. */
int restart_scan_legacy(const struct restart *rs, struct scan *s);
void restart_scan_free(struct scan *s);
/*
 * Does anything still hold o? A mapping or fd of one of its memfds seen in
 * scan s does; so does a process it names that still runs and whose /proc
 * this daemon could not read. Pidfds of processes gone are closed on the way.
 */
bool restart_orphan_held(struct orphan *o, const struct scan *s);
/* Close o's pidfds and free it. */
void restart_orphan_close(struct orphan *o);
/* Take o's bytes off the budget and b->orphaned_bytes. */
void restart_uncharge(struct restart *rs, struct orphan *o);
/* Drop what nothing holds any more. Returns how many went. */
size_t restart_let_go(struct restart *rs, const struct scan *s);
/* The uids and pids a rescan reads, from the orphans counted now. */
void restart_filter_build(struct restart *rs);
/* The rescan timer's callback: every orphan-rescan-ms, backing off while nothing goes. */
void restart_rescan_cb(struct ev_loop *loop, ev_timer *w, int revents);

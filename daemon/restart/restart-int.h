/* SPDX-License-Identifier: MIT */
/*
 * What restart's files share: its state, and the state file's and the /proc scans' verbs (restart-scan.c) that start
 * and stop (restart.c) call.
 */
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

/* One scan of /proc: every mapping or fd of our memfd name, and the processes read to the end. */
struct scan {
	struct holders_memfd *m;
	size_t n, cap;
	pid_t *read;
	size_t nread, capread;
	bool oom;
};

/* What the scans cost, for the log, the metrics and tests (each (dev, inode) stat'ed once a pass). */
struct restart_scan_stats {
	uint64_t scans, slices, processes, stats;
};

/* How the state file read at start stood: what the daemon can know of what its predecessor lent. */
enum restart_books {
	RESTART_BOOKS_NONE,     /* nothing to know: no file, or nothing lent at the last stop */
	RESTART_BOOKS_COMPLETE, /* a version 2 file (journaled): every lease that left is named */
	RESTART_BOOKS_PARTIAL,  /* a version 1 file, or from another boot: memfds of our name are looked for too */
	RESTART_BOOKS_UNKNOWN,  /* damaged, unreadable or not ours: what was lent is not known */
};

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
	/* The sliced rescan in progress (NULL: none), its pass (0: our name, 1: the legacy one) and what it found. */
	struct holders_memfd_scan *scanning;
	int pass;
	bool scan_filtered;
	struct scan acc;
	ev_timer slice;
	struct restart_scan_stats stats;
	enum restart_books books;
	bool blind; /* other uids' /proc cannot be read: only what the file names is known, held by its pids */
	/* The state file kept current while the daemon runs (restart-journal.c): its fd, -1 when there is none. */
	int jfd;
	uint64_t jgen;        /* b->generation when it was last rewritten */
	uint64_t jrewrite_us; /* when, and what that cost */
	uint64_t jcost_us;
	uint64_t jbytes; /* appended since */
	uint64_t jsnap_bytes;
	bool jfailed;                 /* the last write failed (said once) and the file was removed */
	bool saved;                   /* restart_save wrote the clean stop's file: nothing rewrites it after */
	size_t foreign;               /* memfds of our name other uids made, not counted */
	char warning[PATH_MAX + 512]; /* what status and doctor say when the books after the restart are not complete */
	ev_prepare jprepare;
	ev_timer jtimer;
};

/*
 * Replace the file atomically with v (or remove it when v is empty), keeping
 * the new file open as rs->jfd for the journal's appends.
 */
void restart_write_state(struct restart *rs, const struct orphan *v, size_t n);

/* Orders of the scan's sorted arrays: memfds by (ino, dev), pids ascending. */
int restart_memfd_cmp(const void *a, const void *b);
int restart_pid_cmp(const void *a, const void *b);
/*
 * One pass over /proc (two while orphans of the legacy name are counted); a
 * rescan (filtered) reads only the processes of a uid that owns an orphan or
 * that the state file names. Returns 0, or -errno (then nothing may be let go
 * on its word).
 */
int restart_scan_proc(struct restart *rs, struct scan *s, bool filtered);
/* One unfiltered pass for the legacy name alone. Returns 0 or -errno. */
int restart_scan_legacy(struct restart *rs, struct scan *s);
/* Start a sliced (filtered) rescan now, unless one runs: enforce-slice-us per loop turn, then restart_let_go. */
void restart_rescan_begin(struct restart *rs);
void restart_slices_init(struct restart *rs);
/* Stop the slices and drop a pass in progress. */
void restart_slices_stop(struct restart *rs);
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
/* The journal (restart-journal.c): start keeping the file current from the loop; stop (the fd closed). */
void restart_journal_start(struct restart *rs);
void restart_journal_stop(struct restart *rs);
/* Rewrite the file now from the orphans and the lease table (an orphan went, or the journal grew). */
void restart_journal_rewrite(struct broker *b);
/* The rescan timer's callback: every orphan-rescan-ms, backing off while nothing goes. */
void restart_rescan_cb(struct ev_loop *loop, ev_timer *w, int revents);

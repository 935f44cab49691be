/* SPDX-License-Identifier: MIT */
/*
 * Restart's state file (read and written atomically) and its /proc scans: which of an earlier daemon's memfds live
 * processes still map, re-checked until none.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker.h"
#include "budget.h"
#include "config.h"
#include "daemon.h"
#include "holders.h"
#include "log.h"
#include "orphans.h"
#include "pool.h"
#include "restart-int.h"
#include "util.h"

/*
 * The name every chunk had before chunks carried their socket's tag
 * (pinbroker-chunk.<hash>). Matched too when no state file is usable, so the
 * upgrade that brings the tag keeps the books of the daemon it replaces. One
 * release of compatibility: remove with the release after.
 */
#define LEGACY_MEMFD_NAME POOL_MEMFD_NAME
/* While no orphan is let go, the rescan interval doubles up to this many times orphan-rescan-ms (2 s: 2 min). */
#define RESCAN_BACKOFF_MAX 60u

/* ------------------------------------------------------------ scanning */

static void on_memfd(const struct holders_memfd *m, void *ud)
{
	struct scan *s = ud;
	struct holders_memfd *nm, *last = s->n ? &s->m[s->n - 1] : NULL;

	/* One process's many mappings of one memfd are one entry: 65,000 of them cost no memory. */
	if (last && last->pid == m->pid && last->dev == m->dev && last->ino == m->ino) {
		if (m->bytes > last->bytes)
			last->bytes = m->bytes;
		if (m->allocated < last->allocated)
			last->allocated = m->allocated;
		last->owner_known |= m->owner_known;
		if (m->owner_known)
			last->owner = m->owner;
		return;
	}
	nm = grow_array(s->m, &s->cap, s->n, sizeof(*nm), 64);

	if (!nm) {
		s->oom = true;
		return;
	}
	s->m = nm;
	s->m[s->n++] = *m;
}

static void on_read(pid_t pid, void *ud)
{
	struct scan *s = ud;

	pid_t *np = grow_array(s->read, &s->capread, s->nread, sizeof(*np), 256);

	if (!np) {
		s->oom = true;
		return;
	}
	s->read = np;
	s->read[s->nread++] = pid;
}

int restart_memfd_cmp(const void *a, const void *b)
{
	const struct holders_memfd *x = a, *y = b;

	if (x->ino != y->ino)
		return x->ino < y->ino ? -1 : 1;
	if (x->dev != y->dev)
		return x->dev < y->dev ? -1 : 1;
	return 0;
}

int restart_pid_cmp(const void *a, const void *b)
{
	pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;

	return x < y ? -1 : x > y;
}

void restart_scan_free(struct scan *s)
{
	free(s->m);
	free(s->read);
	memset(s, 0, sizeof(*s));
}

static int uid_cmp(const void *a, const void *b)
{
	uid_t x = *(const uid_t *)a, y = *(const uid_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * A rescan reads only processes of a uid that owns an orphan (any of its uids in /proc/PID/status), or that the state
 * file names.
 */
static bool want_ids(pid_t pid, const uid_t ids[4], void *ud)
{
	const struct restart *rs = ud;

	if (rs->nnamed && bsearch(&pid, rs->named, rs->nnamed, sizeof(pid_t), restart_pid_cmp))
		return true;
	for (int i = 0; i < 4; i++)
		if (rs->nuids && bsearch(&ids[i], rs->uids, rs->nuids, sizeof(uid_t), uid_cmp))
			return true;
	return false;
}

static void on_memfd_rs(const struct holders_memfd *m, void *ud)
{
	on_memfd(m, &((struct restart *)ud)->acc);
}

static void on_read_rs(pid_t pid, void *ud)
{
	on_read(pid, &((struct restart *)ud)->acc);
}

/* Sort what a pass found, for lookups. Returns 0, or -ENOMEM when it ran out of memory (nothing may go on its word). */
static int scan_finish(struct scan *s)
{
	if (s->oom)
		return -ENOMEM;
	if (s->n > 1)
		qsort(s->m, s->n, sizeof(*s->m), restart_memfd_cmp);
	if (s->nread > 1)
		qsort(s->read, s->nread, sizeof(*s->read), restart_pid_cmp);
	return 0;
}

/* Start a pass for name into rs->acc (kept from an earlier pass of the same scan). */
static int pass_start(struct restart *rs, const char *name)
{
	return holders_memfd_scan_new(daemon_of(rs->b)->cfg->proc_root, name, rs->scan_filtered ? want_ids : NULL,
				      on_memfd_rs, on_read_rs, rs, &rs->scanning);
}

/*
 * One pass over /proc, to the end, here and now (the start's scan when no
 * state names what was lent: nothing may be lent before it is known).
 * Returns 0, or -errno (then nothing may be let go on its word).
 */
int restart_scan_proc(struct restart *rs, struct scan *s, bool filtered)
{
	struct holders_memfd_stats st = { 0 };
	uint64_t t0_us = now_us();
	int r;

	restart_scan_free(&rs->acc);
	rs->scan_filtered = filtered;
	r = pass_start(rs, rs->memfd_name);
	if (r == 0) {
		holders_memfd_scan_step(rs->scanning, UINT64_MAX);
		holders_memfd_scan_stats(rs->scanning, &st);
		holders_memfd_scan_free(rs->scanning);
		rs->scanning = NULL;
	}
	if (r == 0 && rs->legacy && (r = pass_start(rs, LEGACY_MEMFD_NAME)) == 0) {
		holders_memfd_scan_step(rs->scanning, UINT64_MAX);
		holders_memfd_scan_free(rs->scanning);
		rs->scanning = NULL;
	}
	*s = rs->acc;
	memset(&rs->acc, 0, sizeof(rs->acc));
	log_debug("restart: /proc scan for memfds named %s%s: %zu found, %zu processes read, %zu unreadable, "
		  "%zu stats, %.1f ms",
		  rs->memfd_name, rs->legacy ? " and " LEGACY_MEMFD_NAME : "", s->n, st.processes, st.unreadable,
		  st.stats, (double)(now_us() - t0_us) / 1000.0);
	rs->stats.stats += st.stats;
	rs->stats.processes += st.processes;
	if (r == 0)
		r = scan_finish(s);
	if (r < 0)
		restart_scan_free(s);
	return r;
}

static const struct holders_memfd *scan_find(const struct scan *s, dev_t dev, ino_t ino)
{
	struct holders_memfd k = { .dev = dev, .ino = ino };

	return s->n ? bsearch(&k, s->m, s->n, sizeof(*s->m), restart_memfd_cmp) : NULL;
}

static bool scan_read(const struct scan *s, pid_t pid)
{
	return s->nread && bsearch(&pid, s->read, s->nread, sizeof(pid), restart_pid_cmp);
}

/* Whether pid still runs, for a pid no pidfd watches: only ESRCH says it is gone (EPERM: it runs). */
static bool pid_runs(pid_t pid)
{
	return kill(pid, 0) == 0 || errno != ESRCH;
}

static bool pidfd_exited(int pidfd)
{
	struct pollfd p = { .fd = pidfd, .events = POLLIN };

	/* A pidfd polls readable once its process has exited. */
	return poll(&p, 1, 0) > 0;
}

/*
 * Does anything still hold o? A mapping or fd of one of its memfds seen in
 * this scan does; so does a process it names that still runs and whose /proc
 * this daemon could not read (it may map them unseen). Pidfds of processes
 * gone are closed on the way.
 */
bool restart_orphan_held(struct orphan *o, const struct scan *s)
{
	bool held = false;

	for (size_t k = 0; k < o->nkeys && !held; k++)
		held = scan_find(s, o->keys[k].dev, o->keys[k].ino) != NULL;
	for (size_t i = 0; i < o->npids; i++) {
		if (o->pidfds[i] == -1)
			continue;
		if (o->pidfds[i] == PIDFD_NONE ? !pid_runs(o->pids[i]) : pidfd_exited(o->pidfds[i])) {
			if (o->pidfds[i] >= 0)
				close(o->pidfds[i]);
			o->pidfds[i] = -1;
			continue;
		}
		/* Read to the end and none of its memfds seen: that process let go. A registration
		 * (no memfds) is its program's own memory: held while the program runs. */
		if (o->nkeys == 0 || !scan_read(s, o->pids[i]))
			held = true;
	}
	return held;
}

void restart_orphan_close(struct orphan *o)
{
	for (size_t i = 0; o->pidfds && i < o->npids; i++)
		if (o->pidfds[i] >= 0)
			close(o->pidfds[i]);
	orphan_clear(o);
}

/* The uids and pids a rescan reads (want_pid), from the orphans counted now. */
void restart_filter_build(struct restart *rs)
{
	size_t np = 0, nu = 0;
	uid_t *u;
	pid_t *p;

	for (size_t i = 0; i < rs->n; i++)
		np += rs->v[i].npids;
	u = malloc((rs->n ? rs->n : 1) * sizeof(*u));
	p = malloc((np ? np : 1) * sizeof(*p));
	if (!u || !p) {
		/* Without the tables every process is read: slower, never wrong. */
		free(u);
		free(p);
		u = NULL;
		p = NULL;
	}
	free(rs->uids);
	free(rs->named);
	rs->uids = u;
	rs->named = p;
	rs->nuids = rs->nnamed = 0;
	if (!u)
		return;
	np = 0;
	for (size_t i = 0; i < rs->n; i++) {
		u[nu++] = rs->v[i].uid;
		for (size_t k = 0; k < rs->v[i].npids; k++)
			p[np++] = rs->v[i].pids[k];
	}
	qsort(u, nu, sizeof(*u), uid_cmp);
	if (np > 1)
		qsort(p, np, sizeof(*p), restart_pid_cmp);
	rs->nuids = nu;
	rs->nnamed = np;
}

void restart_uncharge(struct restart *rs, struct orphan *o)
{
	struct broker *b = rs->b;

	budget_uncharge(b->budget, o->uid, o->bytes);
	b->orphaned_bytes -= o->bytes;
}

/* Drop what nothing holds any more. Returns how many went. */
size_t restart_let_go(struct restart *rs, const struct scan *s)
{
	size_t kept = 0, gone = 0;

	for (size_t i = 0; i < rs->n; i++) {
		struct orphan *o = &rs->v[i];

		if (restart_orphan_held(o, s)) {
			rs->v[kept++] = *o;
			continue;
		}
		log_event(EV_LEASE_RELEASED, LOG_NOTICE, o->lease_id, o->uid, o->npids ? o->pids[0] : 0,
			  "orphaned memory of the previous daemon (lease %llu, %llu bytes, uid %u) is no longer mapped "
			  "by any live process: no longer counted",
			  (unsigned long long)o->lease_id, (unsigned long long)o->bytes, (unsigned)o->uid);
		restart_uncharge(rs, o);
		restart_orphan_close(o);
		gone++;
	}
	rs->n = kept;
	return gone;
}

/*
 * Has a process the state file names exited since the last look? One poll per
 * pidfd (no /proc read), so no more than the pidfds opened (a share of the fd
 * limit); pids without one are looked at by the scans alone.
 */
static bool named_pid_exited(const struct restart *rs)
{
	for (size_t i = 0; i < rs->n; i++)
		for (size_t k = 0; k < rs->v[i].npids; k++)
			if (rs->v[i].pidfds[k] >= 0 && pidfd_exited(rs->v[i].pidfds[k]))
				return true;
	return false;
}

/* A sliced pass has ended (r < 0: it failed): let go what nothing holds now. */
static void rescan_done(struct restart *rs, int r)
{
	struct scan s = rs->acc;

	memset(&rs->acc, 0, sizeof(rs->acc));
	if (r == 0)
		r = scan_finish(&s);
	if (r < 0) {
		log_debug("restart: cannot scan /proc for orphaned memory (%s); trying again", strerror(-r));
		rs->backoff = 1;
	} else if (restart_let_go(rs, &s) > 0) {
		restart_journal_rewrite(rs->b);
		restart_filter_build(rs);
		broker_memory_freed(rs->b);
		rs->backoff = 1;
	} else {
		rs->backoff = rs->backoff * 2 > RESCAN_BACKOFF_MAX ? RESCAN_BACKOFF_MAX : rs->backoff * 2;
	}
	restart_scan_free(&s);
	if (rs->n == 0)
		ev_timer_stop(daemon_of(rs->b)->loop, &rs->rescan);
}

/*
 * One slice of a rescan: at most enforce-slice-us of /proc reading per loop
 * turn, as enforcement rounds do, so that a uid with huge maps and fd tables
 * delays nobody's request by more than a slice; the slice timer brings the next.
 */
static void slice_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct restart *rs = w->data;
	struct holders_memfd_stats st;
	uint64_t budget_us = daemon_of(rs->b)->cfg->enforce_slice_us ? daemon_of(rs->b)->cfg->enforce_slice_us : 2000;
	int done, r = 0;

	if (!rs->scanning)
		return;
	done = holders_memfd_scan_step(rs->scanning, budget_us);
	if (!done) {
		ev_timer_set(w, 0., 0.);
		ev_timer_start(loop, w);
		return;
	}
	holders_memfd_scan_stats(rs->scanning, &st);
	log_debug("restart: /proc scan for memfds named %s (pass %d, in slices): %zu processes read, %zu unreadable, "
		  "%zu maps lines, %zu stats, %zu slices",
		  rs->pass ? LEGACY_MEMFD_NAME : rs->memfd_name, rs->pass, st.processes, st.unreadable, st.lines,
		  st.stats, st.slices);
	rs->stats.stats += st.stats;
	rs->stats.processes += st.processes;
	rs->stats.slices += st.slices;
	holders_memfd_scan_free(rs->scanning);
	rs->scanning = NULL;
	if (rs->pass == 0 && rs->legacy) {
		rs->pass = 1;
		r = pass_start(rs, LEGACY_MEMFD_NAME);
		if (r == 0) {
			ev_timer_set(w, 0., 0.);
			ev_timer_start(loop, w);
			return;
		}
	}
	rs->stats.scans++;
	rescan_done(rs, r);
}

void restart_rescan_begin(struct restart *rs)
{
	int r;

	if (rs->scanning)
		return;
	restart_scan_free(&rs->acc);
	rs->scan_filtered = rs->uids != NULL;
	rs->pass = 0;
	r = pass_start(rs, rs->memfd_name);
	if (r < 0) {
		rescan_done(rs, r);
		return;
	}
	ev_timer_set(&rs->slice, 0., 0.);
	ev_timer_start(daemon_of(rs->b)->loop, &rs->slice);
}

void restart_slices_init(struct restart *rs)
{
	ev_timer_init(&rs->slice, slice_cb, 0., 0.);
	rs->slice.data = rs;
}

void restart_slices_stop(struct restart *rs)
{
	ev_timer_stop(daemon_of(rs->b)->loop, &rs->slice);
	holders_memfd_scan_free(rs->scanning);
	rs->scanning = NULL;
	restart_scan_free(&rs->acc);
}

void restart_rescan_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct restart *rs = w->data;

	/* orphan-rescan-ms may have changed at a reload: libev re-arms with repeat after this call. */
	w->repeat = daemon_of(rs->b)->cfg->orphan_rescan_ms / 1000.0;
	if (rs->scanning)
		return; /* the last pass is still on its slices */
	/*
	 * A holder that keeps its lease for hours would otherwise cost a pass over /proc every
	 * orphan-rescan-ms: while nothing goes, a pass comes every backoff ticks (doubling up to
	 * RESCAN_BACKOFF_MAX). A process the file names exiting is seen at the next tick (its
	 * pidfd, no /proc read) and brings the pass forward.
	 */
	if (++rs->ticks < rs->backoff && !named_pid_exited(rs))
		return;
	rs->ticks = 0;
	/* Filtered: a uid with nothing orphaned can make processes, never make this scan read them. */
	restart_rescan_begin(rs);
}

/* One unfiltered pass for the legacy name alone. */
int restart_scan_legacy(struct restart *rs, struct scan *s)
{
	int r;

	restart_scan_free(&rs->acc);
	rs->scan_filtered = false;
	r = pass_start(rs, LEGACY_MEMFD_NAME);
	if (r == 0) {
		holders_memfd_scan_step(rs->scanning, UINT64_MAX);
		holders_memfd_scan_free(rs->scanning);
		rs->scanning = NULL;
	}
	*s = rs->acc;
	memset(&rs->acc, 0, sizeof(rs->acc));
	if (r == 0)
		r = scan_finish(s);
	if (r < 0)
		restart_scan_free(s);
	return r;
}

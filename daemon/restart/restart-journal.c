/* SPDX-License-Identifier: MIT */
/*
 * The restart state file kept current while the daemon runs: each lease appended before its fds leave, the whole
 * rewritten from the loop, so a crash without the fd store leaves records.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker.h"
#include "daemon.h"
#include "lease.h"
#include "log.h"
#include "orphans.h"
#include "pool.h"
#include "recovery-int.h"
#include "restart-int.h"
#include "restart.h"
#include "util.h"

/*
 * The rewrite is O(leases) (a fstat per chunk, a new file renamed over the
 * old), so the loop spends at most a hundredth of its time on it: after a
 * rewrite that took t, the next waits 99 t, but no more than a second unless
 * 9 t is longer (a tenth, the old bound). A tenth was a quarter of the loop's
 * own work in a tight acquire/release loop, on the path of the next request.
 * What a crash forgets is then only releases of the last moments: the next
 * daemon holds that memory while its holder lives (or until a scan shows it
 * unmapped), never lends it.
 */
#define REWRITE_SPACING_FACTOR 99u
#define REWRITE_SPACING_MAX_US 1000000u
#define REWRITE_SPACING_MIN_FACTOR 9u
#define JOURNAL_MIN_BYTES (64u * 1024)

/*
 * Replace the file atomically with v (or remove it when v is empty), and keep
 * the new file open (rs->jfd) for the journal's appends. No fsync: the file
 * must outlive the daemon, not the host (a file from another boot is ignored).
 */
/*
 * A write failed: the file on disk may miss leases lent since, and a version 2
 * file is taken as naming every one. Remove it (the next daemon then also
 * looks for memfds by name), and say so once until a write succeeds again.
 */
static void write_failed(struct restart *rs, const char *what, int err)
{
	int was = rs->jfailed;

	if (unlink(rs->path) < 0 && errno != ENOENT && !was)
		log_warn("cannot remove the stale restart state %s either", rs->path);
	rs->jfailed = true;
	if (was)
		log_debug("restart state %s: %s: %s", rs->path, what, strerror(err));
	else
		log_warnx("cannot write the restart state %s (%s: %s): a restart after a crash now counts only the "
			  "memfds of our name it finds in /proc; said once until it works again",
			  rs->path, what, strerror(err));
}

void restart_write_state(struct restart *rs, const struct orphan *v, size_t n)
{
	char tmp[PATH_MAX + 8], *text = NULL;
	size_t len = 0, done = 0;
	int fd, r;

	if (rs->jfd >= 0)
		close(rs->jfd);
	rs->jfd = -1;
	rs->jbytes = 0;
	rs->jsnap_bytes = 0;
	if (n == 0) {
		if (unlink(rs->path) < 0 && errno != ENOENT)
			log_warn("cannot remove the restart state %s, ignoring", rs->path);
		return;
	}
	r = orphans_format(v, n, rs->boot_id, &text, &len);
	if (r < 0) {
		write_failed(rs, "formatting it", -r);
		return;
	}
	snprintf(tmp, sizeof(tmp), "%s.XXXXXX", rs->path);
	/* mkostemp: a new file of mode 0600, never one planted at a guessable name. */
	fd = mkostemp(tmp, O_CLOEXEC | O_APPEND);
	if (fd < 0) {
		write_failed(rs, "creating it", errno);
		free(text);
		return;
	}
	while (done < len) {
		ssize_t w = write(fd, text + done, len - done);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		done += (size_t)w;
	}
	r = done == len ? 0 : -1;
	if (r == 0 && rename(tmp, rs->path) == 0) {
		free(text);
		rs->jfd = fd;
		rs->jsnap_bytes = len;
		if (rs->jfailed)
			log_info("the restart state %s is written again", rs->path);
		rs->jfailed = false;
		return;
	}
	write_failed(rs, "writing it", errno ? errno : EIO);
	close(fd);
	unlink(tmp);
	free(text);
}

/*
 * l as a state line: its chunks' (dev, inode), its holder, attachers and the
 * processes holding it until they exit (through the fd-store writer's hook, so
 * this file never calls the revoker). Returns 0, -ENOENT for a lease with
 * nothing to name (a registration: no memfd), or -ENOMEM.
 */
static int lease_line(const struct broker *b, const struct lease *l, struct orphan *o)
{
	pid_t holds[ORPHAN_PIDS_MAX];
	size_t nh = 0;

	memset(o, 0, sizeof(*o));
	if (l->registration || l->nchunks == 0)
		return -ENOENT;
	o->lease_id = l->id;
	o->uid = l->uid;
	o->bytes = l->bytes;
	o->keys = calloc(l->nchunks, sizeof(*o->keys));
	o->pids = malloc(ORPHAN_PIDS_MAX * sizeof(*o->pids));
	if (!o->keys || !o->pids) {
		orphan_clear(o);
		return -ENOMEM;
	}
	for (size_t k = 0; k < l->nchunks; k++) {
		struct chunk *ch = l->chunks[k].mem;

		/* A memfd's device and inode never change: asked once per chunk, not at every lease and rewrite. */
		if (ch->st_ino == 0) {
			struct stat st;

			if (fstat(ch->fd, &st) < 0) {
				orphan_clear(o);
				return -errno;
			}
			ch->st_dev = st.st_dev;
			ch->st_ino = st.st_ino;
		}
		o->keys[o->nkeys++] = (struct orphan_key){ ch->st_dev, ch->st_ino, ch->bytes };
	}
	/* The holder even when detached: its process may map it still. */
	if (l->pid > 0)
		o->pids[o->npids++] = l->pid;
	for (size_t i = 0; i < l->nattachers && o->npids < ORPHAN_PIDS_MAX; i++)
		if (l->attachers[i].pid > 0)
			o->pids[o->npids++] = l->attachers[i].pid;
	if (l->exit_holds > 0 && daemon_of(b)->recovery && daemon_of(b)->recovery->hold_pids &&
	    o->npids < ORPHAN_PIDS_MAX)
		nh = daemon_of(b)->recovery->hold_pids(b, l->id, holds, ORPHAN_PIDS_MAX - o->npids);
	for (size_t i = 0; i < nh; i++)
		o->pids[o->npids++] = holds[i];
	return 0;
}

void restart_journal_rewrite(struct broker *b)
{
	struct restart *rs = daemon_of(b)->restart;
	struct orphan *v;
	size_t n = 0, cap;
	uint64_t t0_us = now_us();

	if (!rs || !rs->path[0] || rs->saved)
		return;
	cap = rs->n + lease_count(b->leases);
	v = calloc(cap ? cap : 1, sizeof(*v));
	if (!v) {
		log_warnx("cannot rewrite the restart state: out of memory; it names what was lent when last written");
		return;
	}
	for (size_t i = 0; i < rs->n; i++)
		v[n++] = rs->v[i]; /* shallow: written, not freed here */
	for (const struct lease *l = lease_first(b->leases); l && n < cap; l = lease_next(b->leases, l))
		if (lease_line(b, l, &v[n]) == 0)
			n++;
	restart_write_state(rs, v, n);
	for (size_t i = rs->n; i < n; i++)
		orphan_clear(&v[i]);
	free(v);
	rs->jgen = b->generation;
	rs->jrewrite_us = now_us();
	rs->jcost_us = rs->jrewrite_us - t0_us;
}

/* Called by recovery_lent for every lease whose fds are about to leave (acquire, attach, re-declare). */
void restart_journal_lent(struct broker *b, const struct lease *l)
{
	struct restart *rs = daemon_of(b)->restart;
	struct orphan o;
	char *text = NULL;
	size_t len = 0, done = 0;
	int r;

	if (!rs || !rs->path[0] || rs->saved)
		return;
	if (rs->jfd < 0) {
		/* No file yet (nothing was lent): the rewrite names l, which is in the table. After a failed write
		 * the file is gone and the loop's spaced rewrites try again, not every lease. */
		if (!rs->jfailed)
			restart_journal_rewrite(b);
		return;
	}
	r = lease_line(b, l, &o);
	if (r == -ENOENT)
		return;
	if (r == 0)
		r = orphans_format_line(&o, &text, &len);
	orphan_clear(&o);
	while (r == 0 && done < len) {
		ssize_t w = write(rs->jfd, text + done, len - done);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			r = w < 0 ? -errno : -EIO;
			break;
		}
		done += (size_t)w;
	}
	free(text);
	if (r == 0) {
		rs->jbytes += len;
		return;
	}
	log_debug("cannot append lease %llu to the restart state %s (%s): rewriting it whole",
		  (unsigned long long)l->id, rs->path, strerror(-r));
	restart_journal_rewrite(b);
}

static void jtimer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	/* Nothing here: waking the loop runs jprepare_cb, which rewrites. */
}

static void jprepare_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
	struct restart *rs = w->data;
	struct broker *b = rs->b;
	uint64_t since_us, spacing_us, limit_bytes;

	if (b->generation == rs->jgen)
		return;
	since_us = now_us() - rs->jrewrite_us;
	spacing_us = rs->jcost_us * REWRITE_SPACING_FACTOR;
	if (spacing_us > REWRITE_SPACING_MAX_US)
		spacing_us = rs->jcost_us * REWRITE_SPACING_MIN_FACTOR > REWRITE_SPACING_MAX_US
				     ? rs->jcost_us * REWRITE_SPACING_MIN_FACTOR
				     : REWRITE_SPACING_MAX_US;
	limit_bytes = rs->jsnap_bytes > JOURNAL_MIN_BYTES ? rs->jsnap_bytes : JOURNAL_MIN_BYTES;
	if (since_us < spacing_us && rs->jbytes < limit_bytes) {
		if (!ev_is_active(&rs->jtimer)) {
			ev_timer_set(&rs->jtimer, (double)(spacing_us - since_us) / 1e6, 0.);
			ev_timer_start(loop, &rs->jtimer);
		}
		return;
	}
	ev_timer_stop(loop, &rs->jtimer);
	restart_journal_rewrite(b);
}

void restart_journal_start(struct restart *rs)
{
	ev_prepare_init(&rs->jprepare, jprepare_cb);
	rs->jprepare.data = rs;
	ev_timer_init(&rs->jtimer, jtimer_cb, 0., 0.);
	rs->jtimer.data = rs;
	rs->jgen = rs->b->generation;
	if (rs->path[0])
		ev_prepare_start(daemon_of(rs->b)->loop, &rs->jprepare);
}

void restart_journal_stop(struct restart *rs)
{
	ev_prepare_stop(daemon_of(rs->b)->loop, &rs->jprepare);
	ev_timer_stop(daemon_of(rs->b)->loop, &rs->jtimer);
	if (rs->jfd >= 0)
		close(rs->jfd);
	rs->jfd = -1;
}

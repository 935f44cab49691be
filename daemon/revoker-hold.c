/* SPDX-License-Identifier: MIT */
/* Exit holds: leases kept counted until a process that may still map them exits, one pidfd watcher per process. */
#define _GNU_SOURCE
#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "budget.h"
#include "lease.h"
#include "revoker-int.h"
#include "util.h"

void revoker_ghost_free(struct broker *b, struct ghost *g)
{
	struct revoker *rv = b->revoker;

	for (struct ghost **gp = &rv->ghosts; *gp; gp = &(*gp)->next)
		if (*gp == g) {
			*gp = g->next;
			break;
		}
	ev_io_stop(b->loop, &g->io);
	close(g->pidfd);
	if (g->counted && b->budget)
		budget_fd_sub(b->budget, g->uid);
	free(g->ids);
	free(g->holder);
	free(g);
}

bool revoker_hold_end(struct broker *b, struct lease *l)
{
	if (l->exit_holds > 0)
		l->exit_holds--;
	/* Not lease_unmapped: an orphan held for its process is freed here too, once the grace has passed
	 * (until then its holder may still re-declare it, and may still map it). */
	return !l->owner && l->nattachers == 0 && l->exit_holds == 0 &&
	       !(l->state == LEASE_ORPHANED && b->redeclare_grace);
}

static void ghost_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct ghost *g = w->data;
	struct broker *b = g->broker;

	/* The pidfd is readable once the process has exited: its mappings are gone. */
	for (size_t i = 0; i < g->nids; i++) {
		struct lease *l = lease_find(b->leases, g->ids[i]);

		if (!l)
			continue;
		if (revoker_hold_end(b, l))
			revoker_free_lease(b, l, "holder exited");
	}
	/* Its pid leaves the leases' mappers too: the fd-store state is written again (recovery-writer.c). */
	b->generation++;
	revoker_ghost_free(b, g);
	revoker_freed(b);
}

struct ghost *revoker_ghost_find(struct broker *b, pid_t pid)
{
	for (struct ghost *g = b->revoker->ghosts; g; g = g->next) {
		struct pollfd p = { .fd = g->pidfd, .events = POLLIN };

		if (g->pid == pid && poll(&p, 1, 0) == 0)
			return g;
	}
	return NULL;
}

int revoker_hold_process(struct broker *b, int pidfd, bool take_pidfd, pid_t pid, uid_t uid, const uint64_t *ids,
			 const bool *holder, size_t n)
{
	struct revoker *rv = b->revoker;
	struct ghost *g = revoker_ghost_find(b, pid);
	bool fresh = !g;
	int r;

	if (g && take_pidfd)
		close(pidfd);
	if (!g) {
		g = calloc(1, sizeof(*g));
		if (!g) {
			if (take_pidfd)
				close(pidfd);
			return -ENOMEM;
		}
		g->pidfd = take_pidfd ? pidfd : fcntl(pidfd, F_DUPFD_CLOEXEC, 3);
		if (g->pidfd < 0) {
			r = -errno;
			free(g);
			return r;
		}
		g->broker = b;
		g->pid = pid;
		g->uid = uid;
	}
	if (g->nids + n > g->capids) {
		size_t cap = g->capids ? g->capids * 2 : 4;
		uint64_t *p;
		bool *h;

		while (cap < g->nids + n)
			cap *= 2;
		p = realloc(g->ids, cap * sizeof(*p));
		if (p)
			g->ids = p;
		h = p ? realloc(g->holder, cap * sizeof(*h)) : NULL;
		if (h)
			g->holder = h;
		if (!p || !h) {
			if (fresh) {
				close(g->pidfd);
				free(g->ids);
				free(g->holder);
				free(g);
			}
			return -ENOMEM;
		}
		g->capids = cap;
	}
	memcpy(g->ids + g->nids, ids, n * sizeof(*ids));
	for (size_t i = 0; i < n; i++)
		g->holder[g->nids + i] = holder && holder[i];
	g->nids += n;
	for (size_t i = 0; i < n; i++) {
		struct lease *l = lease_find(b->leases, ids[i]);

		if (l)
			l->exit_holds++;
	}
	if (!fresh)
		return 0;
	/* Counted even past the cap: the process holds the memory either way; acquires see it. */
	g->counted = b->budget && budget_fd_add(b->budget, uid) == 0;
	ev_io_init(&g->io, ghost_cb, g->pidfd, EV_READ);
	g->io.data = g;
	ev_io_start(b->loop, &g->io);
	g->next = rv->ghosts;
	rv->ghosts = g;
	return 0;
}

/*
 * The real uid of the process pidfd names, read from /proc/PID/status and confirmed through the pidfd after
 * the read (a pid is reused only once its process is gone, and the pidfd outlives neither): (uid_t)-1 when
 * it cannot be told.
 */
static uid_t pidfd_real_uid(int pidfd, pid_t pid)
{
	char path[64], line[256];
	unsigned long uid = (unsigned long)-1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return (uid_t)-1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Uid: %lu", &uid) == 1)
			break;
	fclose(f);
	if (uid == (unsigned long)-1 || sys_pidfd_send_signal(pidfd, 0, 0) < 0)
		return (uid_t)-1;
	return (uid_t)uid;
}

int revoker_hold_until_exit(struct broker *b, int pidfd, pid_t pid, bool holder, uint64_t id)
{
	/*
	 * A holder or a mapper after a restart: its own uid, not the lease's, which an attacher of another uid
	 * does not share. The pidfd is charged to it, and a revoke the holder starts never signals it (issue
	 * 22, finding 4). One whose uid cannot be told is charged to no real uid and never signalled by a holder.
	 */
	return revoker_hold_process(b, pidfd, true, pid, pidfd_real_uid(pidfd, pid), &id, &holder, 1);
}

bool revoker_unhold(struct broker *b, pid_t pid, uint64_t id)
{
	struct ghost *g = b->revoker ? revoker_ghost_find(b, pid) : NULL;
	struct lease *l;

	/* Only its holder's hold: one it has as a mapper (an attachment of its own, stale) still maps it. */
	for (size_t i = 0; g && i < g->nids; i++) {
		if (g->ids[i] != id || !g->holder[i])
			continue;
		g->nids--;
		g->ids[i] = g->ids[g->nids];
		g->holder[i] = g->holder[g->nids];
		l = lease_find(b->leases, id);
		if (l && l->exit_holds > 0)
			l->exit_holds--;
		if (g->nids == 0)
			revoker_ghost_free(b, g);
		return true;
	}
	return false;
}

size_t revoker_hold_pids(const struct broker *b, uint64_t id, pid_t *out, size_t max)
{
	const struct lease *l = b->revoker ? lease_find(b->leases, id) : NULL;
	size_t n = 0;

	if (!b->revoker)
		return 0;
	/*
	 * Not the hold of the holder the lease line names (its pid): a restart's grace holds that one again if it
	 * still runs, and its re-declare drops it; written as a mapper, its re-declare could not tell it from a
	 * stale attachment of its own. Any other (a holder another process re-declared the lease from) is written.
	 */
	for (const struct ghost *g = b->revoker->ghosts; g && n < max; g = g->next)
		for (size_t i = 0; i < g->nids && n < max; i++)
			if (g->ids[i] == id && !(g->holder[i] && l && !l->holder_detached && g->pid == l->pid))
				out[n++] = g->pid;
	return n;
}

void revoker_foreach_hold(const struct broker *b, void (*fn)(uint64_t id, pid_t pid, void *ud), void *ud)
{
	if (!b->revoker)
		return;
	for (const struct ghost *g = b->revoker->ghosts; g; g = g->next)
		for (size_t i = 0; i < g->nids; i++)
			fn(g->ids[i], g->pid, ud);
}

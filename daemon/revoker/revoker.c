/* SPDX-License-Identifier: MIT */
/*
 * The revoker's top floor: REVOKE, critical-state and cached-idle reclaim, a closing connection's leases, life cycle;
 * rounds, exit holds and freeing are in revoker-*.c.
 */
#define _GNU_SOURCE
#include "revoker.h"

#include <errno.h>
#include <ev.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "daemon.h"
#include "budget.h"
#include "config.h"
#include "conn.h"
#include "lease.h"
#include "log.h"
#include "monitor.h"
#include "pool.h"
#include "reply.h"
#include "revoker-int.h"
#include "revoker-policy.h"
#include "util.h"

/* While critical, look again this often whether more leases must go. */
#define RECLAIM_STEP_MS 100

/* ---------------------------------------------------------------- revoking */

int revoker_revoke(struct broker *b, struct lease *l, uint32_t deadline_ms, enum broker_revocation why,
		   const char *reason)
{
	Pinbroker__V1__Revoke rm = PINBROKER__V1__REVOKE__INIT;
	struct conn *c = revoker_owner(l);
	uint64_t now = now_ms();
	Pinbroker__V1__Reply r;
	int ret;

	/* Its holder cannot give it back: asking would only end in enforcement against it. Unless it is
	 * idle: then it sits in its library's cache, which gives it back at once (lease_revocable). */
	if (l->no_revoke && !lease_revocable(l))
		return -EPERM;
	if (deadline_ms == 0)
		deadline_ms = daemon_of(b)->cfg->revoke_deadline_ms;
	ret = lease_set_state(l, LEASE_REVOKING, now);
	if (ret < 0)
		return ret;
	l->deadline_ms = now + deadline_ms;
	l->revoke_by_holder = why == REVOKED_SELF;
	b->counters.revocations[why]++;
	log_event(EV_LEASE_REVOKED, LOG_WARNING, l->id, l->uid, l->pid,
		  "revoking lease %llu (%llu bytes, pid %d, %s) with a %u ms deadline: %s", (unsigned long long)l->id,
		  (unsigned long long)l->bytes, l->pid, lease_priority_name(l->priority), deadline_ms, reason);
	revoker_record(b, "lease %llu pid %d uid %u %llu bytes: %s", (unsigned long long)l->id, l->pid, l->uid,
		       (unsigned long long)l->bytes, reason);
	if (c) {
		rm.lease_id = l->id;
		rm.deadline_ms = deadline_ms;
		rm.reason = (char *)reason;
		reply_init(&r, 0, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
		r.body_case = PINBROKER__V1__REPLY__BODY_REVOKE;
		r.revoke = &rm;
		reply_send(c, &r, NULL, 0); /* a failed send marks c closing; its reap frees the lease */
	}
	/* Every mapper must let go: each attacher gets the same REVOKE on its own connection. */
	if (l->nattachers > 0) {
		rm.lease_id = l->id;
		rm.deadline_ms = deadline_ms;
		rm.reason = (char *)reason;
		reply_init(&r, 0, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
		r.body_case = PINBROKER__V1__REPLY__BODY_REVOKE;
		r.revoke = &rm;
		for (size_t i = 0; i < l->nattachers; i++) {
			struct conn *ac = l->attachers[i].owner;

			if (!ac->closing)
				reply_send(ac, &r, NULL, 0);
		}
	}
	revoker_round_arm_for(b, deadline_ms);
	return 0;
}

/*
 * One step of critical-state reclaim: estimate how far MemAvailable is below
 * the critical line, subtract what is already being revoked, and revoke
 * victims in DESIGN.md's order until the estimate is covered. Without a
 * memory figure (PSI alone made it critical) revoke one lease per step.
 */
static void reclaim_step(struct broker *b)
{
	struct lease **order = NULL;
	size_t n = 0;
	double avail_pct = daemon_of(b)->monitor ? monitor_mem_available_pct(daemon_of(b)->monitor) : NAN;
	uint64_t deficit, in_flight = revoker_policy_revoking_bytes(b->leases);

	daemon_trim_pool(b, 0);
	deficit = revoker_policy_reclaim_deficit(avail_pct, daemon_of(b)->cfg->tight_mem_available_pct,
						 b->mem_total_bytes);
	if (in_flight >= deficit)
		return;
	if (lease_revoke_order(b->leases, &order, &n) < 0)
		return;
	/* A failed REVOKE send frees nothing before the reap, so the order stays valid. */
	for (size_t i = 0; i < n && in_flight < deficit; i++)
		if (revoker_revoke(b, order[i], 0, REVOKED_PRESSURE, "host memory is critical") == 0)
			in_flight += order[i]->bytes;
	free(order);
}

static void reclaim_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct broker *b = w->data;

	if (b->state == BROKER_CRITICAL)
		reclaim_step(b);
	else
		ev_timer_stop(loop, w);
}

static void shrink_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct broker *b = w->data;

	daemon_trim_pool(b, b->state == BROKER_NORMAL ? b->prewarm_bytes : 0);
}

void revoker_on_pressure(struct broker *b, enum broker_state to)
{
	struct revoker *rv = daemon_of(b)->revoker;

	if (to == BROKER_CRITICAL) {
		reclaim_step(b);
		ev_timer_set(&rv->reclaim_timer, RECLAIM_STEP_MS / 1000.0, RECLAIM_STEP_MS / 1000.0);
		ev_timer_start(daemon_of(b)->loop, &rv->reclaim_timer);
	} else {
		ev_timer_stop(daemon_of(b)->loop, &rv->reclaim_timer);
	}
}

/* Cached-idle leases of other holders that could cover a shortfall. */
uint64_t revoker_reclaim_idle(struct broker *b, struct conn *asker, uint64_t need)
{
	uint64_t got = 0;
	struct lease *l;

	/* A failed REVOKE send frees nothing before the reap, so the walk stays valid. */
	for (l = lease_first(b->leases); l && got < need; l = lease_next(b->leases, l)) {
		if (l->state != LEASE_IDLE || l->owner == asker)
			continue;
		if (revoker_revoke(b, l, 0, REVOKED_IDLE_RECLAIM,
				   "another client needs the memory (cached-idle lease)") == 0)
			got += l->bytes;
	}
	return got;
}

void revoker_conn_closed(struct broker *b, struct conn *c)
{
	struct revoker *rv = daemon_of(b)->revoker;
	struct lease *l, *next;
	uint64_t *held = NULL;
	bool *owned = NULL;
	size_t nheld = 0, freed = 0;
	uint64_t freed_bytes = 0;
	bool holder_alive = false;

	if (c->pidfd >= 0 && c->nleases > 0) {
		struct pollfd p = { .fd = c->pidfd, .events = POLLIN };

		holder_alive = poll(&p, 1, 0) == 0;
	} else if (c->nleases > 0) {
		/*
		 * No pidfd for the peer (a kernel or sandbox without them, valgrind 3.19): whether it still maps
		 * anything, looked at now (revoker_pid_gone): an exiting process (past exit_mm before its fds close)
		 * or a zombie is gone at once, as with a pidfd.
		 * Taking it for gone freed leases whose pages it still mapped and pinned, counted as free.
		 */
		holder_alive = !revoker_pid_gone(c->pid, 0);
	}

	for (l = lease_first(b->leases); l; l = next) {
		bool attached;

		next = lease_next(b->leases, l);
		attached = l->owner != c && lease_attacher_find(l, c);
		if (l->owner != c && !attached)
			continue;
		/* c lets go, as its holder or an attacher; other mappers keep the lease alive. Without a RELEASE: a
		 * clone(CLONE_VM) sibling of its process may map the lease still, so its chunks are never pooled. */
		l->dropped = true;
		if (attached)
			lease_detach(l, c);
		else
			l->owner = NULL;
		conn_lose(c, l, attached);
		b->generation++;
		/*
		 * A process that is still alive may still map (and pin) these pages: the
		 * library keeps mappings valid when a connection drops. Keep them counted,
		 * and out of anyone's reach, until the process exits (an exit hold). A
		 * process that died (its pidfd is readable) has no mappings left.
		 */
		if (holder_alive && rv) {
			uint64_t *ids = realloc(held, (nheld + 1) * sizeof(*ids));
			bool *o = ids ? realloc(owned, (nheld + 1) * sizeof(*o)) : NULL;

			if (ids)
				held = ids;
			if (o)
				owned = o;
			if (ids && o) {
				owned[nheld] = !attached;
				held[nheld++] = l->id;
				continue;
			}
		}
		if (!lease_unmapped(l))
			continue;
		freed++;
		freed_bytes += l->bytes;
		revoker_free_lease(b, l, "connection closed");
	}
	c->nleases = 0;
	c->nattached = 0;
	/* Going to 0 never fails: the uid's entry only shrinks or goes. */
	unbrokered_set(&b->unbrokered, c->uid, c->unbrokered_bytes, 0);
	b->unbrokered_bytes = b->unbrokered.reported_bytes;
	c->unbrokered_bytes = 0;
	if (nheld > 0) {
		bool polled = c->pidfd < 0;

		log_debug("connection of pid %d closed while the process lives: %zu leases stay counted until it exits",
			  c->pid, nheld);
		/*
		 * The connection's own pidfd becomes the process's exit hold (no copy; closed here if the process has
		 * one already). Without one the hold is polled until the process is gone (struct exit_hold).
		 */
		if (revoker_hold_process(b, c->pidfd, c->pidfd >= 0, c->pid, c->uid, held, owned, nheld) == 0) {
			if (polled)
				log_event(
					EV_CLIENT_DIED, LOG_WARNING, 0, c->uid, c->pid,
					"connection of pid %d closed while the process runs, and it cannot be watched "
					"for its exit (no pidfd): %zu leases stay counted, looked at again every %u ms "
					"until that process is gone",
					c->pid, nheld, (unsigned)REVOKER_POLL_MS);
		} else {
			/*
			 * Out of memory even for the hold: counted until the daemon stops, rather than freed under a
			 * live process (which would count its pinned pages as free). Its exit holds never end.
			 */
			for (size_t i = 0; i < nheld; i++) {
				l = lease_find(b->leases, held[i]);
				if (!l)
					continue;
				l->exit_holds++;
				log_event(EV_LEASE_OVERDUE, LOG_WARNING, l->id, l->uid, c->pid,
					  "lease %llu: pid %d may still map it but its exit hold cannot be set up (out "
					  "of "
					  "memory): it stays counted until the daemon stops",
					  (unsigned long long)l->id, c->pid);
			}
		}
		c->pidfd = -1; /* the hold's, or closed by revoker_hold_process */
	}
	free(held);
	free(owned);
	if (freed > 0) {
		log_event(EV_CLIENT_DIED, LOG_NOTICE, 0, c->uid, c->pid,
			  "client pid %d uid %u went away holding %zu leases (%llu bytes); returned to the pool",
			  c->pid, c->uid, freed, (unsigned long long)freed_bytes);
		revoker_freed(b);
	}
}

/* ------------------------------------------------------------- life cycle */

int revoker_init(struct broker *b)
{
	struct revoker *rv = calloc(1, sizeof(*rv));

	if (!rv)
		return -ENOMEM;
	ev_timer_init(&rv->reclaim_timer, reclaim_cb, 0., 0.);
	rv->reclaim_timer.data = b;
	ev_timer_init(&rv->shrink_timer, shrink_cb, 0., 0.);
	rv->shrink_timer.data = b;
	daemon_of(b)->revoker = rv;
	revoker_hold_init(b);
	revoker_round_init(b);
	return 0;
}

void revoker_fini(struct broker *b)
{
	struct revoker *rv = daemon_of(b)->revoker;

	if (!rv)
		return;
	revoker_round_fini(b);
	while (rv->holds)
		revoker_exit_hold_free(b, rv->holds);
	revoker_hold_fini(b);
	/* Shutdown: leases still counted for live or overdue holders (their fds are in the
	 * fd store by now) give their chunks back, so pool_free releases them. */
	for (struct lease *l = lease_first(b->leases), *next; l; l = next) {
		next = lease_next(b->leases, l);
		daemon_free_lease(b, l);
	}
	ev_timer_stop(daemon_of(b)->loop, &rv->deadline_timer);
	ev_timer_stop(daemon_of(b)->loop, &rv->reclaim_timer);
	ev_timer_stop(daemon_of(b)->loop, &rv->shrink_timer);
	free(rv);
	daemon_of(b)->revoker = NULL;
}

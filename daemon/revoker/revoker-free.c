/* SPDX-License-Identifier: MIT */
/*
 * The revoker's lowest floor: freeing leases with their connections' counters, the freed-memory event, and the
 * revocation ring.
 */
#define _GNU_SOURCE
#include <ev.h>
#include <stdarg.h>
#include <stdio.h>

#include "broker.h"
#include "daemon.h"
#include "config.h"
#include "conn.h"
#include "lease.h"
#include "log.h"
#include "pool.h"
#include "reply.h"
#include "revoker-int.h"
#include "util.h"

void revoker_record(struct broker *b, const char *fmt, ...)
{
	struct revoker *rv = daemon_of(b)->revoker;
	struct monitor_event *e = &rv->ring[rv->ring_next];
	va_list ap;

	e->when_ms = now_ms();
	va_start(ap, fmt);
	vsnprintf(e->text, sizeof(e->text), fmt, ap);
	va_end(ap);
	rv->ring_next = (rv->ring_next + 1) % REVOKER_REVOCATIONS_MAX;
	if (rv->ring_count < REVOKER_REVOCATIONS_MAX)
		rv->ring_count++;
}

size_t revoker_revocations(const struct broker *b, struct monitor_event *out, size_t max)
{
	const struct revoker *rv = daemon_of(b)->revoker;
	size_t n = 0;

	if (!rv)
		return 0;
	for (size_t i = 0; i < rv->ring_count && n < max; i++) {
		size_t idx = (rv->ring_next + REVOKER_REVOCATIONS_MAX - 1 - i) % REVOKER_REVOCATIONS_MAX;

		out[n++] = rv->ring[idx];
	}
	return n;
}

/* ------------------------------------------------------------------ freeing */

void revoker_freed(struct broker *b)
{
	struct revoker *rv = daemon_of(b)->revoker;

	/* Under pressure, freed memory leaves the pool at once; otherwise the idle
	 * pool above the warm target shrinks after pool-shrink-delay-ms. */
	if (b->state != BROKER_NORMAL)
		daemon_trim_pool(b, 0);
	else if (rv && pool_idle_bytes(daemon_of(b)->pool) > b->prewarm_bytes) {
		ev_timer_stop(daemon_of(b)->loop, &rv->shrink_timer);
		ev_timer_set(&rv->shrink_timer, daemon_of(b)->cfg->pool_shrink_delay_ms / 1000.0, 0.);
		ev_timer_start(daemon_of(b)->loop, &rv->shrink_timer);
	}
	broker_memory_freed(b); /* the wait queue listens */
}

/* Free one lease, keeping its holder's and attachers' counts right, and log it. */
void revoker_free_lease(struct broker *b, struct lease *l, const char *why)
{
	struct conn *c = revoker_owner(l);

	log_event(EV_LEASE_RELEASED, LOG_INFO, l->id, l->uid, l->pid, "lease %llu released (%s): %llu bytes",
		  (unsigned long long)l->id, why, (unsigned long long)l->bytes);
	if (c)
		conn_lose(c, l, false);
	for (size_t i = 0; i < l->nattachers; i++)
		conn_lose(l->attachers[i].owner, l, true);
	daemon_free_lease(b, l);
}

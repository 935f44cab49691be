/* SPDX-License-Identifier: MIT */
/* Waiting acquires: queued in priority order, granted when the freed-memory event says memory came back, refused at their timeout. */
#define _GNU_SOURCE
#include "waitq.h"

#include <errno.h>
#include <ev.h>
#include <stdio.h>
#include <stdlib.h>

#include "broker.h"
#include "budget.h"
#include "config.h"
#include "conn.h"
#include "reply.h"
#include "text.h"
#include "util.h"

/* An acquire that waits for memory (ACQUIRE_FLAG_WAIT, or behind a reclaim of cached-idle leases). */
struct pending {
	struct pending *next;
	struct broker *broker;
	struct conn *conn;           /* valid while queued: a closing conn's pendings go at its reap */
	uint64_t seq;
	struct acquire_args args;
	char label[LEASE_LABEL_MAX];
	uint64_t enqueued_ms;
	ev_timer timeout;
};

struct waitq {
	struct pending *pending;
	uint32_t npending;
};

static void pending_unlink(struct waitq *wq, struct pending *p)
{
	for (struct pending **pp = &wq->pending; *pp; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			wq->npending--;
			return;
		}
}

static void pending_destroy(struct broker *b, struct pending *p)
{
	struct conn *c = p->conn;

	ev_timer_stop(b->loop, &p->timeout);
	pending_unlink(b->waitq, p);
	if (c->npending > 0)
		c->npending--;
	free(p);
}

static void pending_timeout_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct pending *p = w->data;
	struct broker *b = p->broker;
	struct conn *c = p->conn;
	uint64_t seq = p->seq, size = p->args.size;
	uint64_t held = budget_uid_leased(b->budget, c->uid), quota = budget_uid_quota(b->budget);
	char h[32], q[32], a[32];

	pending_destroy(b, p);
	/* Over its own quota, only this uid's releases could have helped: say so, not "nothing freed up". */
	if (size > quota || held > quota - size) {
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_TIMEOUT,
			     "no pinned memory within the wait timeout: uid %u is over quota, holding %s of its %s "
			     "quota with %s more asked; release some of its leases or ask for less",
			     c->uid, format_size(held, h, sizeof(h)), format_size(quota, q, sizeof(q)),
			     format_size(size, a, sizeof(a)));
		return;
	}
	reply_acquire_error(c, seq, -ETIMEDOUT, size);
}

static int prio_rank(enum lease_priority p)
{
	return p == LEASE_PRIO_CRITICAL ? 0 : p == LEASE_PRIO_NORMAL ? 1 : 2;
}

int waitq_add(struct conn *c, uint64_t seq, const struct acquire_args *a, uint32_t timeout_ms)
{
	struct broker *b = c->broker;
	struct waitq *wq = b->waitq;
	struct pending *p, **pp;

	if (wq->npending >= b->cfg->max_pending_acquires)
		return -EUSERS;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->broker = b;
	p->conn = c;
	p->seq = seq;
	p->args = *a;
	if (a->label)
		snprintf(p->label, sizeof(p->label), "%s", a->label);
	p->args.label = p->label;
	p->enqueued_ms = now_ms();
	ev_timer_init(&p->timeout, pending_timeout_cb, timeout_ms / 1000.0, 0.);
	p->timeout.data = p;
	ev_timer_start(b->loop, &p->timeout);
	/* Priority order, FIFO within a class. */
	for (pp = &wq->pending; *pp && prio_rank((*pp)->args.priority) <= prio_rank(a->priority); pp = &(*pp)->next)
		;
	p->next = *pp;
	*pp = p;
	wq->npending++;
	c->npending++;
	return 0;
}

void waitq_grant(struct broker *b)
{
	struct waitq *wq = b->waitq;
	struct pending *p, *pnext;

	if (!wq || b->state == BROKER_CRITICAL)
		return;
	/* A failed send only marks its connection closing (server_reap frees it later), so the
	 * queue cannot change under us except for the entry destroyed here. */
	for (p = wq->pending; p; p = pnext) {
		struct conn *c = p->conn;
		uint64_t seq = p->seq, size = p->args.size;
		struct lease *l;
		int r;

		pnext = p->next;
		if (c->closing || c->nleases >= b->cfg->max_leases_per_client)
			continue;
		p->args.now_ms = now_ms(); /* granted now, not when it was queued */
		r = broker_acquire(b, &p->args, &l);
		if (r == -EDQUOT || r == -EUSERS)
			continue; /* only this uid's (this job's) own releases can help it */
		if (r == -ENOSPC || r == -EBUSY || r == -ENOLCK)
			break;    /* strict priority: nobody behind may overtake */
		pending_destroy(b, p);
		if (r < 0)
			reply_acquire_error(c, seq, r, size);
		else
			reply_grant(c, seq, l);
	}
}

uint32_t waitq_count(const struct broker *b)
{
	return b->waitq ? b->waitq->npending : 0;
}

void waitq_conn_closed(struct broker *b, struct conn *c)
{
	struct waitq *wq = b->waitq;
	struct pending *p, *pn;

	if (!wq)
		return;
	for (p = wq->pending; p; p = pn) {
		pn = p->next;
		if (p->conn == c)
			pending_destroy(b, p);
	}
}

void waitq_refuse_all(struct broker *b, int err)
{
	struct waitq *wq = b->waitq;

	while (wq && wq->pending) {
		struct pending *p = wq->pending;
		struct conn *c = p->conn;
		uint64_t seq = p->seq, size = p->args.size;

		pending_destroy(b, p);
		reply_acquire_error(c, seq, err, size);
	}
}

int waitq_init(struct broker *b)
{
	struct waitq *wq = calloc(1, sizeof(*wq));
	int r;

	if (!wq)
		return -ENOMEM;
	r = broker_listen_freed(b, waitq_grant);
	if (r < 0) {
		free(wq);
		return r;
	}
	b->waitq = wq;
	return 0;
}

void waitq_fini(struct broker *b)
{
	struct waitq *wq = b->waitq;

	if (!wq)
		return;
	broker_unlisten_freed(b, waitq_grant);
	while (wq->pending)
		pending_destroy(b, wq->pending);
	free(wq);
	b->waitq = NULL;
}

/* SPDX-License-Identifier: MIT */
/*
 * Waiting acquires: queued in priority order, granted when the freed-memory event says memory came back, refused at
 * their timeout.
 */
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
#include "daemon.h"
#include "reply.h"
#include "reservation.h"
#include "text.h"
#include "timer-clock.h"
#include "util.h"
#include "waitq-order.h"

/* An acquire that waits for memory (ACQUIRE_FLAG_WAIT, or behind a reclaim of cached-idle leases). */
struct pending {
	struct waitq_entry q; /* first: the order's entry is the pending */
	struct broker *broker;
	struct conn *conn; /* valid while queued: a closing conn's pendings go at its reap */
	uint64_t seq;
	struct acquire_args args; /* a reserve's: uid, priority and its total size, for the order and the messages */
	char label[LEASE_LABEL_MAX];
	bool reserve; /* a waiting reserve (rargs), not an acquire */
	struct reserve_args rargs;
	char name[RESERVATION_NAME_MAX];
	uint64_t enqueued_ms;
	uint32_t timeout_ms;
	ev_timer timeout;
};

struct waitq {
	struct waitq_entry *pending; /* each a struct pending, in waitq_order's order */
	uint32_t npending;
	unsigned stall_ms; /* WAITQ_STALL_ENV */
};

static void pending_unlink(struct waitq *wq, struct pending *p)
{
	if (waitq_order_remove(&wq->pending, &p->q))
		wq->npending--;
}

static void pending_destroy(struct broker *b, struct pending *p)
{
	struct conn *c = p->conn;

	ev_timer_stop(daemon_of(b)->loop, &p->timeout);
	pending_unlink(daemon_of(b)->waitq, p);
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

	/* A turn that ran long before this acquire came fires it early: the clock decides (timer-clock.h). */
	if (timer_clock_early(loop, w, p->enqueued_ms, p->timeout_ms))
		return;
	pending_destroy(b, p);
	/* Over its own quota, only this uid's releases could have helped: say so, not "nothing freed up". */
	if (waitq_order_over_quota(size, held, quota)) {
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_TIMEOUT,
			     "no pinned memory within the wait timeout: uid %u is over quota, holding %s of its %s "
			     "quota with %s more asked; release some of its leases or ask for less",
			     c->uid, format_size(held, h, sizeof(h)), format_size(quota, q, sizeof(q)),
			     format_size(size, a, sizeof(a)));
		return;
	}
	reply_refusal(c, seq, REFUSAL_TIMEOUT, 0, size);
}

/* Queue a pending of c's; returns 0 and *ret, or as waitq_add. */
static int pending_add(struct conn *c, uint64_t seq, const struct acquire_args *a, uint32_t timeout_ms,
		       struct pending **ret)
{
	struct broker *b = c->broker;
	struct waitq *wq = daemon_of(b)->waitq;
	struct pending *p;

	if (wq->npending >= daemon_of(b)->cfg->max_pending_acquires)
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
	timer_clock_stall(wq->stall_ms); /* a long loop turn before this acquire, as a loaded host gives one */
	p->enqueued_ms = now_ms();
	p->timeout_ms = timeout_ms;
	ev_timer_init(&p->timeout, pending_timeout_cb, timeout_ms / 1000.0, 0.);
	p->timeout.data = p;
	ev_timer_start(daemon_of(b)->loop, &p->timeout);
	/* Priority order, FIFO within a class. */
	p->q.priority = a->priority;
	waitq_order_insert(&wq->pending, &p->q);
	wq->npending++;
	c->npending++;
	*ret = p;
	return 0;
}

int waitq_add(struct conn *c, uint64_t seq, const struct acquire_args *a, uint32_t timeout_ms)
{
	struct pending *p;

	return pending_add(c, seq, a, timeout_ms, &p);
}

int waitq_add_reserve(struct conn *c, uint64_t seq, const struct reserve_args *a, uint32_t timeout_ms)
{
	struct acquire_args order = {
		.uid = a->uid,
		.priority = LEASE_PRIO_NORMAL,
		/* Its whole size, for the timeout's message: a reserve of shares x share_bytes. */
		.size = a->share_bytes * a->shares,
	};
	struct pending *p;
	int r;

	r = pending_add(c, seq, &order, timeout_ms, &p);
	if (r < 0)
		return r;
	p->reserve = true;
	p->rargs = *a;
	snprintf(p->name, sizeof(p->name), "%s", a->name);
	p->rargs.name = p->name;
	return 0;
}

/* A waiting reserve on the grant walk: answered (the reservation, or a refusal for good), or it waits on. */
static enum waitq_verdict try_reserve(struct conn *c, uint64_t seq, struct reserve_args *a)
{
	struct reservation *res = NULL;
	enum reservation_error rerr;
	enum broker_refusal why;
	enum waitq_verdict v;
	bool joined;
	int err;

	a->now_ms = now_ms();
	why = broker_reserve(c->broker, a, &res, &joined, &rerr, &err);
	if (why == REFUSAL_NONE) {
		reply_reservation(c, seq, res, !joined);
		return WAITQ_ANSWERED;
	}
	v = rerr != RESERVATION_OK ? WAITQ_ANSWERED : waitq_order_verdict(why);
	if (v == WAITQ_ANSWERED)
		reply_reserve_error(c, seq, a, why, rerr, res, err);
	return v;
}

/* One waiting acquire on the grant walk. */
static enum waitq_verdict try_grant(struct waitq_entry *e, void *ud)
{
	struct broker *b = ud;
	struct pending *p = (struct pending *)e;
	struct conn *c = p->conn;
	uint64_t seq = p->seq, size = p->args.size;
	enum broker_refusal why;
	enum waitq_verdict v;
	struct lease *l;
	int err = 0;

	if (c->closing)
		return WAITQ_SKIP;
	if (p->reserve) {
		v = try_reserve(c, seq, &p->rargs);
		if (v == WAITQ_ANSWERED)
			pending_destroy(b, p);
		return v;
	}
	if (c->nleases >= daemon_of(b)->cfg->max_leases_per_client)
		return WAITQ_SKIP;
	p->args.now_ms = now_ms(); /* granted now, not when it was queued */
	why = daemon_acquire(b, &p->args, &l, &err);
	v = waitq_order_verdict(why);
	if (v != WAITQ_ANSWERED)
		return v;
	pending_destroy(b, p);
	if (why != REFUSAL_NONE)
		reply_refusal(c, seq, why, err, size);
	else
		reply_grant(c, seq, l);
	return v;
}

void waitq_grant(struct broker *b)
{
	struct waitq *wq = daemon_of(b)->waitq;

	if (!wq || b->state == BROKER_CRITICAL)
		return;
	/* A failed send only marks its connection closing (server_reap frees it later), so the
	 * queue cannot change under us except for the entry destroyed here. */
	waitq_order_walk(&wq->pending, try_grant, b);
}

uint32_t waitq_count(const struct broker *b)
{
	return daemon_of(b)->waitq ? daemon_of(b)->waitq->npending : 0;
}

void waitq_conn_closed(struct broker *b, struct conn *c)
{
	struct waitq *wq = daemon_of(b)->waitq;
	struct waitq_entry *e, *en;

	if (!wq)
		return;
	for (e = wq->pending; e; e = en) {
		struct pending *p = (struct pending *)e;

		en = e->next;
		if (p->conn == c)
			pending_destroy(b, p);
	}
}

void waitq_refuse_all(struct broker *b, enum broker_refusal why)
{
	struct waitq *wq = daemon_of(b)->waitq;

	while (wq && wq->pending) {
		struct pending *p = (struct pending *)wq->pending;
		struct conn *c = p->conn;
		uint64_t seq = p->seq, size = p->args.size;

		pending_destroy(b, p);
		reply_refusal(c, seq, why, 0, size);
	}
}

int waitq_init(struct broker *b)
{
	struct waitq *wq = calloc(1, sizeof(*wq));
	int r;

	if (!wq)
		return -ENOMEM;
	wq->stall_ms = timer_clock_stall_ms(WAITQ_STALL_ENV);
	r = broker_listen_freed(b, waitq_grant);
	if (r < 0) {
		free(wq);
		return r;
	}
	daemon_of(b)->waitq = wq;
	return 0;
}

void waitq_fini(struct broker *b)
{
	struct waitq *wq = daemon_of(b)->waitq;

	if (!wq)
		return;
	broker_unlisten_freed(b, waitq_grant);
	while (wq->pending)
		pending_destroy(b, (struct pending *)wq->pending);
	free(wq);
	daemon_of(b)->waitq = NULL;
}

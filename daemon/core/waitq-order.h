/* SPDX-License-Identifier: MIT */
/*
 * The wait queue's order and its grant walk on plain entries: priority order, FIFO within a class, who may overtake
 * whom; no I/O.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "broker.h"
#include "lease.h"

/* One waiting acquire as the order sees it; embedded in the queue's own entry. */
struct waitq_entry {
	struct waitq_entry *next;
	enum lease_priority priority;
};

/* A class's place in the queue: critical first, then normal, then best-effort. */
int waitq_order_rank(enum lease_priority p);

/* Queue e behind every entry of its class or a better one (FIFO within a class). O(n). */
void waitq_order_insert(struct waitq_entry **head, struct waitq_entry *e);
/* Take e out of the queue; nothing if it is not queued. Returns whether it was. */
bool waitq_order_remove(struct waitq_entry **head, struct waitq_entry *e);

/* What the grant walk does with an entry after trying to grant it. */
enum waitq_verdict {
	WAITQ_ANSWERED, /* granted or refused for good: it has left the queue */
	WAITQ_SKIP, /* it waits on: only its own uid's (job's) releases can help it, or its connection cannot take it */
	WAITQ_STOP, /* the host has no room for it: nobody behind it may overtake (strict priority) */
};

/*
 * What the walk does with a waiting acquire that got why: a grant and refusals other than the ones below answer
 * it; REFUSAL_UID_QUOTA and REFUSAL_JOB_QUOTA (its uid's or job's own limits) skip it; REFUSAL_BUDGET,
 * REFUSAL_TIGHT and REFUSAL_TIGHT_NO_REVOKE (the host's limits) stop the walk. An acquire that would not be
 * answered is one that may wait (handle_acquire queues only those).
 */
enum waitq_verdict waitq_order_verdict(enum broker_refusal why);

/*
 * Walk the queue in order, calling try on each entry (which returns its verdict and, for
 * WAITQ_ANSWERED, has taken it out of the queue), until the end or a WAITQ_STOP. try may
 * remove only the entry it is given.
 */
void waitq_order_walk(struct waitq_entry **head, enum waitq_verdict (*try)(struct waitq_entry *e, void *ud), void *ud);

/*
 * Whether an acquire of size bytes that timed out was over its uid's quota (held of quota
 * bytes): then only that uid's releases could have helped, and its refusal says so.
 */
bool waitq_order_over_quota(uint64_t size, uint64_t held, uint64_t quota);

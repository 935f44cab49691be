/* SPDX-License-Identifier: MIT */
/*
 * The wait queue's order and its grant walk on plain entries: priority order, FIFO within a class, who may overtake
 * whom; no I/O.
 */
#include "waitq-order.h"

#include <errno.h>
#include <stddef.h>

int waitq_order_rank(enum lease_priority p)
{
	return p == LEASE_PRIO_CRITICAL ? 0 : p == LEASE_PRIO_NORMAL ? 1 : 2;
}

void waitq_order_insert(struct waitq_entry **head, struct waitq_entry *e)
{
	struct waitq_entry **pp;

	for (pp = head; *pp && waitq_order_rank((*pp)->priority) <= waitq_order_rank(e->priority); pp = &(*pp)->next)
		;
	e->next = *pp;
	*pp = e;
}

bool waitq_order_remove(struct waitq_entry **head, struct waitq_entry *e)
{
	for (struct waitq_entry **pp = head; *pp; pp = &(*pp)->next)
		if (*pp == e) {
			*pp = e->next;
			return true;
		}
	return false;
}

enum waitq_verdict waitq_order_verdict(enum broker_refusal why)
{
	switch (why) {
	case REFUSAL_UID_QUOTA:
	case REFUSAL_JOB_QUOTA:
		return WAITQ_SKIP; /* only this uid's (this job's) own releases can help it */
	case REFUSAL_BUDGET:
	case REFUSAL_TIGHT:
	case REFUSAL_TIGHT_NO_REVOKE:
		return WAITQ_STOP; /* strict priority: nobody behind may overtake */
	default:
		return WAITQ_ANSWERED;
	}
}

void waitq_order_walk(struct waitq_entry **head, enum waitq_verdict (*try)(struct waitq_entry *e, void *ud), void *ud)
{
	struct waitq_entry *e, *next;

	/* next is read before try: an answered entry leaves the queue (and its memory) inside it. */
	for (e = *head; e; e = next) {
		next = e->next;
		if (try(e, ud) == WAITQ_STOP)
			break;
	}
}

bool waitq_order_over_quota(uint64_t size, uint64_t held, uint64_t quota)
{
	return size > quota || held > quota - size;
}

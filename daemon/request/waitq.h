/* SPDX-License-Identifier: MIT */
/*
 * Waiting acquires: priority order, FIFO within a class, granted on the freed-memory event, refused at their timeout.
 */
#pragma once

#include <stdint.h>

#include "broker.h"

struct conn;

/*
 * Test only: waitq_add sleeps this many ms before it queues an acquire, on the loop's thread, so the loop's cached
 * time is that much behind the clock when the acquire's timeout is set (a long turn on a loaded host).
 */
#define WAITQ_STALL_ENV "PINBROKER_TEST_WAITQ_STALL_MS"

/* The queue, listening to the freed-memory event (broker_listen_freed). Returns 0 or a negative errno. */
int waitq_init(struct broker *b);
/* Drops every waiting acquire unanswered and stops listening. */
void waitq_fini(struct broker *b);

/*
 * Queue c's acquire a (label copied) for up to timeout_ms; at the timeout it
 * is refused with STATUS_TIMEOUT. Returns 0, -EUSERS (max-pending-acquires
 * reached) or -ENOMEM.
 */
int waitq_add(struct conn *c, uint64_t seq, const struct acquire_args *a, uint32_t timeout_ms);

struct reserve_args;
/*
 * Queue c's reserve a (name copied) among the waiting acquires, as an acquire of its whole size with normal
 * priority, for up to timeout_ms. Returns as waitq_add.
 */
int waitq_add_reserve(struct conn *c, uint64_t seq, const struct reserve_args *a, uint32_t timeout_ms);

/* Grant waiting acquires that now fit, in priority order (nothing while critical). A freed-memory listener. */
void waitq_grant(struct broker *b);

/* Refuse every waiting acquire with why (critical: REFUSAL_CRITICAL). */
void waitq_refuse_all(struct broker *b, enum broker_refusal why);

/* c is closing: its waiting acquires go, unanswered. */
void waitq_conn_closed(struct broker *b, struct conn *c);

/* How many acquires wait. */
uint32_t waitq_count(const struct broker *b);

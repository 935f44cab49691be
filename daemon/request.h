/* SPDX-License-Identifier: MIT */
/* Request dispatch: one table row per request kind, one gate for the cross-cutting checks. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "broker.h"

struct conn;

/*
 * Unpack one packet from c and run its handler. Malformed, unknown or
 * out-of-order input closes c (logged at debug); a valid request the daemon
 * cannot serve gets a status code and a human message.
 */
void request_dispatch(struct conn *c, const uint8_t *buf, size_t len);

/* c is closing: free its leases (overdue ones stay counted until its process exits) and drop its waiting acquires. */
void request_conn_closed(struct broker *b, struct conn *c);

/* Set up and tear down the revoker (deadline timer, waiting-acquire queue, ghost watchers). */
int request_init(struct broker *b);
void request_fini(struct broker *b);

/* The pressure monitor's callback (monitor_state_fn). */
void request_on_pressure(void *ud, enum broker_state from, enum broker_state to, const char *why);

/*
 * Send REVOKE(lease, deadline) to its holder and mark it REVOKING. Idle cached
 * leases are included. Returns 0, or -EINVAL if the lease cannot be revoked
 * in its state.
 */
int request_revoke(struct broker *b, struct lease *l, uint32_t deadline_ms, const char *reason);

/*
 * Keep leases ids counted until the process behind pidfd exits (a holder or
 * attacher whose connection closed while it runs, an orphan whose holder is
 * alive but did not re-declare, a former attacher after a restart): each
 * lease gains an exit hold (lease.h), dropped at that exit; a lease that
 * nobody maps then is freed. The caller has already detached the process's
 * connection from them. Takes over pidfd. Returns 0 or -ENOMEM (pidfd
 * closed, leases untouched).
 */
int request_hold_until_exit(struct broker *b, int pidfd, pid_t pid, const uint64_t *ids, size_t n);

/* The pids of the processes holding lease id until they exit: at most max in out. Returns how many. */
size_t request_hold_pids(const struct broker *b, uint64_t id, pid_t *out, size_t max);

/* Memory was freed: grant waiting acquires that now fit, in priority order. */
void request_grant_waiting(struct broker *b);

/* The revocation events kept for request_revocations. */
#define REQUEST_REVOCATIONS_MAX 16
/* Copy of the last revocation events, newest first. Returns how many. */
struct monitor_event;
size_t request_revocations(const struct broker *b, struct monitor_event *out, size_t max);
uint32_t request_waiting_count(const struct broker *b);

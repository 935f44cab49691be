/* SPDX-License-Identifier: MIT */
/*
 * What every request module shares (handlers, the revoker, the wait queue): replies, lease sends, wire conversions, a
 * connection's counters.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "broker.h"
#include "lease.h"
#include "pinbroker.pb-c.h"

struct conn;

/* Send through the broker's conn_io (conn.h): 0, or < 0 with c marked closing. Never frees c. */
int reply_send(struct conn *c, const Pinbroker__V1__Reply *reply, const int *fds, size_t nfds);
/* Close c through the broker's conn_io: marked closing, valid until the reap. */
void reply_close(struct conn *c, const char *why);

/* A reply header: seq echoed, status, and message (not copied; NULL for none). */
void reply_init(Pinbroker__V1__Reply *r, uint64_t seq, Pinbroker__V1__StatusCode status, const char *message);
/* Send a reply of status with a printf-formatted human message (cut at 511 bytes). */
void reply_status(struct conn *c, uint64_t seq, Pinbroker__V1__StatusCode status, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* Why lease id cannot be used by c: -ENOENT (no such lease), -EPERM (someone else's), else its state. */
void reply_lease_error(struct conn *c, uint64_t seq, int r, uint64_t id);
/*
 * Refuse an acquire of size bytes: the status refusal why maps to, and its message, which names what was
 * refused and what to do; err is the errno beside REFUSAL_FAILED (broker.h), else unused. Counted for the metrics.
 */
void reply_refusal(struct conn *c, uint64_t seq, enum broker_refusal why, int err, uint64_t size);
/* The log line of that refusal (the client's pid and uid, and the same message). */
void reply_log_refusal(const struct conn *c, enum broker_refusal why, int err, uint64_t size);

Pinbroker__V1__Priority reply_priority_to_wire(enum lease_priority p);
enum lease_priority reply_priority_from_wire(Pinbroker__V1__Priority p);

/*
 * Send lease l to c: the LEASE reply with the first fd batch, then LEASE_FDS
 * packets for the rest, in order. Recorded as lent (recovery) before any fd
 * leaves. Returns 0, -ENOMEM, or the send's error (c is then closing).
 */
int send_lease(struct conn *c, uint64_t seq, const struct lease *l, bool attached);
/* c is l's new holder: its counters, the grant's log line, and the lease sent. */
void reply_grant(struct conn *c, uint64_t seq, struct lease *l);

struct reservation;
struct reserve_args;
/* The RESERVATION reply: res, made by this call (created) or joined. */
void reply_reservation(struct conn *c, uint64_t seq, const struct reservation *res, bool created);
/*
 * Say why reserve a failed: rerr's own messages (core/reservation.h; res is the existing one for a mismatch), else
 * the refusal why as an acquire of the whole size is refused (logged and counted), err beside REFUSAL_FAILED.
 */
void reply_reserve_error(struct conn *c, uint64_t seq, const struct reserve_args *a, enum broker_refusal why, int rerr,
			 const struct reservation *res, int err);

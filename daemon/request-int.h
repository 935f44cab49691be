/* SPDX-License-Identifier: MIT */
/* What request.c shares with the request modules beside it (req-status.c): reply helpers and their handlers. */
#pragma once

#include <stdint.h>

#include "lease.h"
#include "pinbroker.pb-c.h"

struct conn;

/* A reply header: seq echoed, status, and message (not copied; NULL for none). */
void reply_init(Pinbroker__V1__Reply *r, uint64_t seq, Pinbroker__V1__StatusCode status, const char *message);

Pinbroker__V1__Priority prio_to_wire(enum lease_priority p);

/* ---- req-status.c */

/* STATUS: summary from counters, one bounded page of client rows and one of lease rows. */
void handle_status(struct conn *c, const Pinbroker__V1__Request *req);

/*
 * c now holds l / no longer holds l: keep the connection's status counters
 * (bytes, labels) in step. request.c calls these wherever it changes
 * c->nleases, so a client row never needs a walk over the leases.
 */
void status_conn_add(struct conn *c, const struct lease *l);
void status_conn_remove(struct conn *c, const struct lease *l);

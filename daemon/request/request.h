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

/*
 * c is closing: drop its waiting acquires (waitq.c), then free its leases (revoker.c; a live process's stay counted
 * until it exits).
 */
void request_conn_closed(struct broker *b, struct conn *c);

/*
 * Set up and tear down the revoker (revoker.h) and the wait queue (waitq.h). request_init returns 0 or a negative
 * errno.
 */
int request_init(struct broker *b);
void request_fini(struct broker *b);

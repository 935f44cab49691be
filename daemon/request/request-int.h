/* SPDX-License-Identifier: MIT */
/* The handlers request.c's table names: client verbs (req-client.c), admin verbs (req-admin.c, req-status.c). */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "pinbroker.pb-c.h"

struct broker;
struct conn;

/*
 * Each runs after the gate (request.c): the kind is known, its payload set,
 * HELLO done where the table asks, admin rights checked, and the stopping and
 * pressure gates passed. A handler answers with a status or its reply, or
 * closes c; it never frees c.
 */

/* ---- req-client.c */
void handle_hello(struct conn *c, const Pinbroker__V1__Request *req);
void handle_acquire(struct conn *c, const Pinbroker__V1__Request *req);
void handle_release(struct conn *c, const Pinbroker__V1__Request *req);
void handle_set_idle(struct conn *c, const Pinbroker__V1__Request *req);
void handle_revoke_ack(struct conn *c, const Pinbroker__V1__Request *req);
void handle_redeclare(struct conn *c, const Pinbroker__V1__Request *req);
void handle_share(struct conn *c, const Pinbroker__V1__Request *req);
void handle_attach(struct conn *c, const Pinbroker__V1__Request *req);
void handle_report_unbrokered(struct conn *c, const Pinbroker__V1__Request *req);
/* ReportStaging: a connection's cumulative staged-copy counters, checked (core/staged.h) and summed. */
void handle_report_staging(struct conn *c, const Pinbroker__V1__Request *req);

/* ---- req-headroom.c: what the asking client may still get (broker_headroom) */
void handle_headroom(struct conn *c, const Pinbroker__V1__Request *req);
/* ---- req-reserve.c */
struct reservation;
struct reserve_args;
/* Reserve N shares of B bytes for a group of ranks, or join the group's (core/reservation.h). */
void handle_reserve(struct conn *c, const Pinbroker__V1__Request *req);
void handle_reservation_release(struct conn *c, const Pinbroker__V1__Request *req);
/* AdminRevoke with reservation_id: end it and revoke the leases taken from it. */
void reserve_admin_revoke(struct conn *c, const Pinbroker__V1__Request *req);
/* A connection closes: it leaves its reservations; the last member's leave ends one. */
void reserve_conn_closed(struct broker *b, struct conn *c);

/* ---- req-admin.c */
void handle_admin_revoke(struct conn *c, const Pinbroker__V1__Request *req);
void handle_set_config(struct conn *c, const Pinbroker__V1__Request *req);
void handle_metrics(struct conn *c, const Pinbroker__V1__Request *req);
/* CONFIG: the running config, one key or all, each value with where it came from (pinctl get, config). */
void handle_config(struct conn *c, const Pinbroker__V1__Request *req);

/* ---- req-quota.c */
void handle_quota_set(struct conn *c, const Pinbroker__V1__Request *req);
void handle_quota_list(struct conn *c, const Pinbroker__V1__Request *req);
/* Job rows, largest first, at most max: every job for see_all, else the asker's own connection's. */
size_t quota_fill_jobs(const struct broker *b, const struct conn *asker, bool see_all, Pinbroker__V1__JobInfo *rows,
		       Pinbroker__V1__JobInfo **ptrs, size_t max);

/* ---- req-status.c */
/* STATUS: summary from counters, one bounded page of client rows and one of lease rows. */
void handle_status(struct conn *c, const Pinbroker__V1__Request *req);

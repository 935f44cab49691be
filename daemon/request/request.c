/* SPDX-License-Identifier: MIT */
/*
 * Request dispatch: one table row per request kind, one gate for the cross-cutting checks, and the request modules'
 * life cycle.
 */
#define _GNU_SOURCE
#include "request.h"

#include <errno.h>
#include <stdlib.h>

#include "broker.h"
#include "config.h"
#include "conn.h"
#include "daemon.h"
#include "log.h"
#include "reply.h"
#include "request-int.h"
#include "revoker.h"
#include "waitq.h"

enum {
	REQ_NEEDS_HELLO = 1u << 0,  /* refused before HELLO */
	REQ_ADMIN = 1u << 1,        /* uid 0 or admin-group only */
	REQ_TAKES_MEMORY = 1u << 2, /* charges new bytes (a pool lease or a registration): refused while critical */
	REQ_ALLOWED_WHILE_STOPPING = 1u << 3, /* served while the daemon stops; every other kind is refused */
};

struct request_kind {
	Pinbroker__V1__Request__BodyCase body;
	const char *name;
	unsigned flags;
	void (*handler)(struct conn *c, const Pinbroker__V1__Request *req);
};

static const struct request_kind request_table[] = {
	{ PINBROKER__V1__REQUEST__BODY_HELLO, "hello", 0, handle_hello },
	/* Register-only acquires too: a registration charges the budget for pages it pins. */
	{ PINBROKER__V1__REQUEST__BODY_ACQUIRE, "acquire", REQ_NEEDS_HELLO | REQ_TAKES_MEMORY, handle_acquire },
	/* Giving memory back and looking are what a stopping daemon still answers. */
	{ PINBROKER__V1__REQUEST__BODY_RELEASE, "release", REQ_NEEDS_HELLO | REQ_ALLOWED_WHILE_STOPPING,
	  handle_release },
	{ PINBROKER__V1__REQUEST__BODY_STATUS, "status", REQ_NEEDS_HELLO | REQ_ALLOWED_WHILE_STOPPING, handle_status },
	/* Not REQ_ADMIN: a holder may revoke its own leases; the handler checks other uids'. */
	{ PINBROKER__V1__REQUEST__BODY_ADMIN_REVOKE, "revoke", REQ_NEEDS_HELLO, handle_admin_revoke },
	{ PINBROKER__V1__REQUEST__BODY_SET_CONFIG, "set", REQ_NEEDS_HELLO | REQ_ADMIN, handle_set_config },
	{ PINBROKER__V1__REQUEST__BODY_REVOKE_ACK, "revoke-ack", REQ_NEEDS_HELLO, handle_revoke_ack },
	{ PINBROKER__V1__REQUEST__BODY_SET_IDLE, "set-idle", REQ_NEEDS_HELLO, handle_set_idle },
	{ PINBROKER__V1__REQUEST__BODY_REDECLARE, "redeclare", REQ_NEEDS_HELLO, handle_redeclare },
	{ PINBROKER__V1__REQUEST__BODY_SHARE, "share", REQ_NEEDS_HELLO, handle_share },
	/* Not REQ_TAKES_MEMORY: an attachment maps a lease already counted, once, to its holder. */
	{ PINBROKER__V1__REQUEST__BODY_ATTACH, "attach", REQ_NEEDS_HELLO, handle_attach },
	{ PINBROKER__V1__REQUEST__BODY_REPORT_UNBROKERED, "report-unbrokered", REQ_NEEDS_HELLO,
	  handle_report_unbrokered },
	{ PINBROKER__V1__REQUEST__BODY_METRICS, "metrics", REQ_NEEDS_HELLO | REQ_ALLOWED_WHILE_STOPPING,
	  handle_metrics },
	{ PINBROKER__V1__REQUEST__BODY_QUOTA_SET, "quota-set", REQ_NEEDS_HELLO | REQ_ADMIN, handle_quota_set },
	{ PINBROKER__V1__REQUEST__BODY_QUOTA_LIST, "quota-list", REQ_NEEDS_HELLO | REQ_ALLOWED_WHILE_STOPPING,
	  handle_quota_list },
	/*
	 * Not REQ_ADMIN, as STATUS is not: reading is not changing (set is admin), no key holds a secret
	 * or another uid's data, and the installed config file is world-readable (0644) anyway.
	 */
	{ PINBROKER__V1__REQUEST__BODY_CONFIG, "config", REQ_NEEDS_HELLO | REQ_ALLOWED_WHILE_STOPPING, handle_config },
	/* Served while stopping: a library letting its ring go as the daemon stops still says what it copied. */
	/* Charges new bytes at once for a group of ranks: refused while critical, as an acquire. */
	{ PINBROKER__V1__REQUEST__BODY_RESERVE, "reserve", REQ_NEEDS_HELLO | REQ_TAKES_MEMORY, handle_reserve },
	{ PINBROKER__V1__REQUEST__BODY_RESERVATION_RELEASE, "reservation-release",
	  REQ_NEEDS_HELLO | REQ_ALLOWED_WHILE_STOPPING, handle_reservation_release },
	{ PINBROKER__V1__REQUEST__BODY_REPORT_STAGING, "report-staging", REQ_NEEDS_HELLO | REQ_ALLOWED_WHILE_STOPPING,
	  handle_report_staging },
	/* Any client may ask about itself; it takes nothing, so it is served while critical too. */
	{ PINBROKER__V1__REQUEST__BODY_HEADROOM, "headroom", REQ_NEEDS_HELLO, handle_headroom },
};

/*
 * A registration of shared memory may add no page (other processes registered them already): it pins
 * nothing new, and a server's rank expects it to succeed. broker_acquire refuses one that adds pages while
 * critical, with the same answer, so the gate leaves it to the broker.
 */
static bool shared_registration(const Pinbroker__V1__Request *req)
{
	return req->body_case == PINBROKER__V1__REQUEST__BODY_ACQUIRE && req->acquire->backing &&
	       (req->acquire->flags & PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_REGISTER_ONLY) &&
	       !(req->acquire->flags & PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_WAIT);
}

void request_dispatch(struct conn *c, const uint8_t *buf, size_t len)
{
	struct broker *b = c->broker;
	const struct request_kind *kind = NULL;
	Pinbroker__V1__Request *req;

	req = pinbroker__v1__request__unpack(NULL, len, buf);
	if (!req) {
		log_event(EV_PROTOCOL_ERROR, LOG_DEBUG, 0, c->uid, c->pid, "malformed packet (%zu bytes) from pid %d",
			  len, c->pid);
		reply_close(c, "malformed packet");
		return;
	}
	for (size_t i = 0; i < sizeof(request_table) / sizeof(request_table[0]); i++)
		if (request_table[i].body == req->body_case)
			kind = &request_table[i];

	/* The one gate: every cross-cutting check lives here, never in a handler. */
	if (!kind) {
		reply_close(c, "unknown request kind");
	} else if (c->peer_gone && kind->body != PINBROKER__V1__REQUEST__BODY_RELEASE) {
		/* Its peer closed its end: only the memory it gives back is taken (server.c serve_queued_releases). */
	} else if ((kind->flags & REQ_NEEDS_HELLO) && !c->hello_done) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_NO_HELLO,
			     "send HELLO with the protocol version first");
		reply_close(c, "request before HELLO");
	} else if ((kind->flags & REQ_ADMIN) && !c->admin) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_PERMISSION_DENIED,
			     "'%s' needs uid 0 or membership of the admin group (admin-group = %s), from the daemon's "
			     "own pid and user namespaces (a container's root is an ordinary tenant)",
			     kind->name,
			     daemon_of(b)->cfg->admin_group && daemon_of(b)->cfg->admin_group[0]
				     ? daemon_of(b)->cfg->admin_group
				     : "none set");
	} else if (b->shutting_down && !(kind->flags & REQ_ALLOWED_WHILE_STOPPING)) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_SHUTTING_DOWN, "pinbrokerd is stopping");
	} else if ((kind->flags & REQ_TAKES_MEMORY) && b->state == BROKER_CRITICAL && !shared_registration(req)) {
		reply_refusal(c, req->seq, REFUSAL_CRITICAL, 0, 0); /* the critical answer names no size */
	} else {
		kind->handler(c, req);
	}
	pinbroker__v1__request__free_unpacked(req, NULL);
}

/* ------------------------------------------------------------- life cycle */

void request_conn_closed(struct broker *b, struct conn *c)
{
	/* Its waiting acquires die with it, before its leases go (their freeing grants the others). */
	waitq_conn_closed(b, c);
	revoker_conn_closed(b, c);
	reserve_conn_closed(b, c);
}

int request_init(struct broker *b)
{
	int r;

	r = revoker_init(b);
	if (r < 0)
		return r;
	r = waitq_init(b);
	if (r < 0) {
		revoker_fini(b);
		return r;
	}
	return 0;
}

void request_fini(struct broker *b)
{
	/* Waiting acquires first: the revoker's shutdown frees every lease. */
	waitq_fini(b);
	revoker_fini(b);
}

/* SPDX-License-Identifier: MIT */
/*
 * Reservations for groups of ranks: reserve (or join), release, an admin's revoke of one, and a closing
 * connection's leave. The decisions are core/reservation.c's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"
#include "config.h"
#include "conn.h"
#include "daemon.h"
#include "lease.h"
#include "log.h"
#include "pool.h"
#include "reply.h"
#include "request-int.h"
#include "reservation.h"
#include "revoker.h"
#include "text.h"
#include "util.h"
#include "waitq-order.h"
#include "waitq.h"

/*
 * Reserve or join for c: REFUSAL_NONE (answered with the reservation), REFUSAL_FAILED (answered with an error), or
 * the budget's refusal, answered only with answer_refusal (else the caller may queue it).
 */
static enum broker_refusal reserve_once(struct conn *c, uint64_t seq, struct reserve_args *a, bool answer_refusal)
{
	struct reservation *res = NULL;
	enum reservation_error rerr;
	enum broker_refusal why;
	bool joined;
	int err;

	a->now_ms = now_ms();
	why = broker_reserve(c->broker, a, &res, &joined, &rerr, &err);
	if (why == REFUSAL_NONE) {
		log_debug("reservation %llu \"%s\": pid %d %s (%u of %u shares taken)", (unsigned long long)res->id,
			  res->name, c->pid, joined ? "joined" : "reserved", res->taken, res->shares);
		reply_reservation(c, seq, res, !joined);
		return why;
	}
	if (rerr != RESERVATION_OK || answer_refusal) {
		reply_reserve_error(c, seq, a, why, rerr, res, err);
		return REFUSAL_FAILED; /* answered */
	}
	return why;
}

void handle_reserve(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct broker *b = c->broker;
	const Pinbroker__V1__Reserve *rq = req->reserve;
	struct reserve_args a = {
		.uid = c->uid,
		.owner = c,
		.cgroup = c->cgroup,
		.job_unknown = c->job_unknown,
		.name = rq->name,
		.shares = rq->shares,
		.share_bytes = rq->share_bytes,
		.page_bytes = pool_page_size(daemon_of(b)->pool),
	};
	bool wait = rq->has_flags && (rq->flags & PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_WAIT);
	uint32_t timeout_ms = rq->has_timeout_ms && rq->timeout_ms ? rq->timeout_ms
								   : daemon_of(b)->cfg->acquire_timeout_ms;
	enum broker_refusal why;

	/* The name is shown to others and logged. */
	if (!text_printable(rq->name)) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "the reservation name must be printable UTF-8 text");
		return;
	}
	why = reserve_once(c, req->seq, &a, !wait);
	if (why == REFUSAL_NONE || why == REFUSAL_FAILED)
		return;
	/* Waits as an acquire of its whole size would: ordered with them, so fairness holds. */
	if (waitq_order_verdict(why) != WAITQ_ANSWERED && waitq_add_reserve(c, req->seq, &a, timeout_ms) == 0)
		return;
	if (waitq_order_verdict(why) != WAITQ_ANSWERED) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_LIMIT,
			     "%u acquires are already waiting (max-pending-acquires); try again later", waitq_count(b));
		return;
	}
	reply_reserve_error(c, req->seq, &a, why, RESERVATION_OK, NULL, 0);
}

/* May c end res? A member, or a connection of its uid, or an admin. */
static bool may_end(const struct conn *c, const struct reservation *res)
{
	/* A rank, an admin, or its uid from the same job: not the same uid in another pod or job. */
	return c->admin || reservation_is_member(res, c) || (res->uid == c->uid && reservation_of_job(res, c->cgroup));
}

/* End res, revoking the leases taken from it when revoke; returns how many were revoked into ids (room max). */
static size_t end_reservation(struct conn *c, struct reservation *res, bool revoke, uint32_t deadline_ms, uint64_t *ids,
			      size_t max)
{
	struct broker *b = c->broker;
	uint64_t id = res->id, bytes;
	char reason[64];
	size_t n = 0;

	bytes = broker_reservation_end(b, res);
	log_info("reservation %llu ended by uid %u%s: %llu untaken bytes back", (unsigned long long)id, c->uid,
		 revoke ? " (revoke)" : "", (unsigned long long)bytes);
	if (revoke) {
		snprintf(reason, sizeof(reason), "reservation %llu revoked by uid %u", (unsigned long long)id, c->uid);
		for (struct lease *l = lease_first(b->leases); l; l = lease_next(b->leases, l)) {
			if (l->reservation_id != id || !lease_revocable(l))
				continue;
			if (n < max)
				ids[n] = l->id;
			n++;
			revoker_revoke(b, l, deadline_ms, c->admin ? REVOKED_ADMIN : REVOKED_SELF, reason);
		}
	}
	if (bytes > 0)
		broker_memory_freed(b);
	return n;
}

void handle_reservation_release(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct reservation *res = broker_reservation_find(c->broker, req->reservation_release->reservation_id);

	if (!res || !may_end(c, res)) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_UNKNOWN_LEASE,
			     "no reservation %llu of yours: it was released, revoked, or its ranks all disconnected",
			     (unsigned long long)req->reservation_release->reservation_id);
		return;
	}
	end_reservation(c, res, false, 0, NULL, 0);
	reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, "%s", "");
}

void reserve_admin_revoke(struct conn *c, const Pinbroker__V1__Request *req)
{
	const Pinbroker__V1__AdminRevoke *ar = req->admin_revoke;
	Pinbroker__V1__AdminRevokeReply rr = PINBROKER__V1__ADMIN_REVOKE_REPLY__INIT;
	struct reservation *res = broker_reservation_find(c->broker, ar->reservation_id);
	uint64_t ids[RESERVATION_SHARES_MAX];
	uint32_t deadline_ms;
	Pinbroker__V1__Reply r;
	size_t n;

	if (!res) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_UNKNOWN_LEASE,
			     "no reservation %llu: `pinctl reservations` lists those alive",
			     (unsigned long long)ar->reservation_id);
		return;
	}
	if (!may_end(c, res)) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_PERMISSION_DENIED,
			     "reservation %llu is uid %u's, of another job: ending it needs a rank of it, "
			     "its job, uid 0 or the admin group",
			     (unsigned long long)res->id, res->uid);
		return;
	}
	deadline_ms = broker_revoke_deadline_ms(&c->broker->settings, c->admin,
						ar->has_deadline_ms ? ar->deadline_ms : 0);
	n = end_reservation(c, res, true, deadline_ms, ids, RESERVATION_SHARES_MAX);
	rr.n_lease_ids = n < RESERVATION_SHARES_MAX ? n : RESERVATION_SHARES_MAX;
	rr.lease_ids = ids;
	reply_init(&r, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
	r.body_case = PINBROKER__V1__REPLY__BODY_ADMIN_REVOKE;
	r.admin_revoke = &rr;
	reply_send(c, &r, NULL, 0);
}

void reserve_conn_closed(struct broker *b, struct conn *c)
{
	size_t ended;
	uint64_t bytes = broker_reservations_drop_owner(b, c, &ended);

	if (ended > 0)
		log_info("%zu reservation%s ended with the last rank's connection (pid %d): %llu untaken bytes back",
			 ended, ended == 1 ? "" : "s", c->pid, (unsigned long long)bytes);
	if (bytes > 0)
		broker_memory_freed(b);
}

/* SPDX-License-Identifier: MIT */
/* libpinbroker's reservations: N shares reserved at once for a group of ranks, one share taken per rank. */
#define _GNU_SOURCE
#include "lib-int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pb_reserve(pb_client *c, const char *name, uint32_t shares, uint64_t share_bytes, uint32_t flags,
	       uint32_t timeout_ms, uint64_t *reservation_id)
{
	Pinbroker__V1__Reserve rs = PINBROKER__V1__RESERVE__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	struct waiter w;
	int r;

	if (!reservation_id)
		return err_set(-EINVAL, "pb_reserve: reservation_id is NULL");
	*reservation_id = 0;
	if (!name || !name[0])
		return err_set(-EINVAL, "pb_reserve: a reservation needs a name the ranks agree on");
	if (shares == 0 || share_bytes == 0)
		return err_set(-EINVAL, "pb_reserve: shares and share_bytes must be above 0");
	rs.name = (char *)name;
	rs.shares = shares;
	rs.share_bytes = share_bytes;
	rs.has_flags = (flags & PB_ACQUIRE_WAIT) != 0;
	rs.flags = (flags & PB_ACQUIRE_WAIT) ? PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_WAIT : 0;
	rs.has_timeout_ms = timeout_ms != 0;
	rs.timeout_ms = timeout_ms;
	req.body_case = PINBROKER__V1__REQUEST__BODY_RESERVE;
	req.reserve = &rs;
	r = conn_call_checked(c, &req, &w);
	if (r < 0)
		return r;
	if (w.reply->body_case != PINBROKER__V1__REPLY__BODY_RESERVATION)
		r = err_set(-EPROTO, "the daemon answered RESERVE without a reservation");
	else
		*reservation_id = w.reply->reservation->reservation_id;
	conn_waiter_cleanup(&w);
	return r;
}

int pb_reservation_release(pb_client *c, uint64_t reservation_id)
{
	Pinbroker__V1__ReservationRelease rr = PINBROKER__V1__RESERVATION_RELEASE__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	struct waiter w;
	int r;

	rr.reservation_id = reservation_id;
	req.body_case = PINBROKER__V1__REQUEST__BODY_RESERVATION_RELEASE;
	req.reservation_release = &rr;
	r = conn_call_checked(c, &req, &w);
	if (r < 0)
		return r;
	conn_waiter_cleanup(&w);
	return 0;
}

int pb_acquire_from(pb_client *c, uint64_t reservation_id, size_t size, const struct pb_acquire_opts *opts,
		    pb_lease **ret)
{
	Pinbroker__V1__Acquire acq = PINBROKER__V1__ACQUIRE__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	uint32_t flags = opts ? opts->flags : 0;

	if (!ret)
		return err_set(-EINVAL, "pb_acquire_from: ret is NULL");
	*ret = NULL;
	if (!c)
		return err_set(-ENOTCONN, "not connected to a broker");
	if (size == 0)
		return err_set(-EINVAL, "cannot acquire 0 bytes");
	if (reservation_id == 0)
		return err_set(-EINVAL,
			       "pb_acquire_from: reservation id 0 names no reservation (pb_reserve gives one)");
	/* The share is the reservation's: never from the cache, and never waiting (its bytes are held). */
	flags &= ~(uint32_t)(PB_ACQUIRE_WAIT | PB_ACQUIRE_NO_REVOKE | PB_ACQUIRE_STAGING_RING);
	acquire_message(&acq, size, opts, 0);
	acq.has_flags = true;
	acq.flags &= ~(uint32_t)(PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_WAIT |
				 PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_NO_REVOKE |
				 PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_STAGING_RING);
	acq.has_reservation_id = true;
	acq.reservation_id = reservation_id;
	req.body_case = PINBROKER__V1__REQUEST__BODY_ACQUIRE;
	req.acquire = &acq;
	return acquire_call(c, &req, "ACQUIRE", flags | PB_ACQUIRE_NO_CACHE, false, NULL, ret);
}

int pb_reservations(pb_client *c, struct pb_reservation_info **rows, size_t *n, uint64_t *reserved_bytes)
{
	Pinbroker__V1__StatusRequest sq = PINBROKER__V1__STATUS_REQUEST__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	const Pinbroker__V1__StatusReply *sr;
	struct waiter w;
	int r;

	if (!rows || !n)
		return err_set(-EINVAL, "pb_reservations: rows and n must not be NULL");
	*rows = NULL;
	*n = 0;
	if (reserved_bytes)
		*reserved_bytes = 0;
	sq.has_include_leases = sq.has_include_clients = sq.has_include_events = true;
	sq.include_leases = sq.include_clients = sq.include_events = false;
	req.body_case = PINBROKER__V1__REQUEST__BODY_STATUS;
	req.status = &sq;
	r = conn_call_checked(c, &req, &w);
	if (r < 0)
		return r;
	if (w.reply->body_case != PINBROKER__V1__REPLY__BODY_STATUS_REPLY) {
		r = err_set(-EPROTO, "the daemon answered STATUS without a status");
		goto out;
	}
	sr = w.reply->status_reply;
	if (reserved_bytes)
		*reserved_bytes = sr->reserved_bytes;
	if (sr->n_reservations == 0)
		goto out;
	*rows = calloc(sr->n_reservations, sizeof(**rows));
	if (!*rows) {
		r = err_set(-ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < sr->n_reservations; i++) {
		const Pinbroker__V1__ReservationInfo *x = sr->reservations[i];
		struct pb_reservation_info *o = &(*rows)[i];

		o->id = x->id;
		o->uid = x->uid;
		snprintf(o->name, sizeof(o->name), "%s", x->name);
		snprintf(o->job, sizeof(o->job), "%s", x->job ? x->job : "");
		snprintf(o->state, sizeof(o->state), "%s", x->state ? x->state : "");
		o->shares = x->shares;
		o->share_bytes = x->share_bytes;
		o->taken = x->taken;
		o->bytes_reserved = x->bytes_reserved;
		o->members = x->members;
		o->age_ms = x->age_ms;
	}
	*n = sr->n_reservations;
out:
	conn_waiter_cleanup(&w);
	return r;
}

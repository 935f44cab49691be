/* SPDX-License-Identifier: MIT */
/* libpinbroker's headroom: what this client may still get now, each bound with its reason (HEADROOM). */
#define _GNU_SOURCE
#include "lib-int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

const char *pb_bound_name(int kind)
{
	static const char *const names[] = {
		[PB_BOUND_BUDGET] = "budget",         [PB_BOUND_UID_QUOTA] = "uid_quota",
		[PB_BOUND_JOB_QUOTA] = "job_quota",   [PB_BOUND_JOB_UNKNOWN] = "job_unknown",
		[PB_BOUND_NO_REVOKE] = "no_revoke",   [PB_BOUND_PRESSURE] = "pressure",
		[PB_BOUND_UID_LEASES] = "uid_leases", [PB_BOUND_UID_CHUNKS] = "uid_chunks",
		[PB_BOUND_CAPACITY] = "capacity",     [PB_BOUND_CONN_LEASES] = "connection_leases",
	};

	if (kind < 0 || (size_t)kind >= sizeof(names) / sizeof(names[0]))
		return "unknown";
	return names[kind];
}

int pb_headroom(pb_client *c, unsigned flags, struct pb_headroom *out)
{
	Pinbroker__V1__HeadroomRequest hq = PINBROKER__V1__HEADROOM_REQUEST__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	const Pinbroker__V1__HeadroomReply *hr;
	struct waiter w;
	int r;

	if (!out)
		return err_set(-EINVAL, "pb_headroom: out is NULL");
	if (flags & ~(PB_ACQUIRE_NO_REVOKE | PB_HEADROOM_REGISTER))
		return err_set(-EINVAL, "pb_headroom: flags may be PB_ACQUIRE_NO_REVOKE and PB_HEADROOM_REGISTER only");
	memset(out, 0, sizeof(*out));
	hq.has_flags = true;
	if (flags & PB_ACQUIRE_NO_REVOKE)
		hq.flags |= PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_NO_REVOKE;
	if (flags & PB_HEADROOM_REGISTER)
		hq.flags |= PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_REGISTER_ONLY;
	req.body_case = PINBROKER__V1__REQUEST__BODY_HEADROOM;
	req.headroom = &hq;
	r = conn_call_checked(c, &req, &w);
	if (r == -ECONNRESET)
		return err_set(-EOPNOTSUPP, "pinbrokerd closed the connection on HEADROOM: it predates pb_headroom "
					    "(upgrade it)");
	if (r < 0)
		return r;
	if (w.reply->body_case != PINBROKER__V1__REPLY__BODY_HEADROOM) {
		conn_waiter_cleanup(&w);
		return err_set(-EPROTO, "pinbrokerd answered HEADROOM without the headroom");
	}
	hr = w.reply->headroom;
	out->available_bytes = hr->available_bytes;
	out->page_bytes = hr->page_bytes;
	out->n_bounds = hr->n_bounds < PB_HEADROOM_BOUNDS_MAX ? hr->n_bounds : PB_HEADROOM_BOUNDS_MAX;
	out->binding = hr->binding < out->n_bounds ? hr->binding : 0;
	snprintf(out->state, sizeof(out->state), "%s", hr->state ? hr->state : "");
	for (size_t i = 0; i < out->n_bounds; i++) {
		const Pinbroker__V1__HeadroomBound *b = hr->bounds[i];
		struct pb_headroom_bound *o = &out->bounds[i];

		o->kind = (int)b->kind;
		o->limit = b->limit;
		o->used = b->used;
		o->left_bytes = b->left_bytes;
		snprintf(o->reason, sizeof(o->reason), "%s", b->reason ? b->reason : "");
	}
	conn_waiter_cleanup(&w);
	return 0;
}

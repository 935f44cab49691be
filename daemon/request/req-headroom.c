/* SPDX-License-Identifier: MIT */
/* HEADROOM: how much the asking client may still get now, each bound with its figures and a reason. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "broker.h"
#include "config.h"
#include "conn.h"
#include "daemon.h"
#include "jobs.h"
#include "monitor.h"
#include "pool.h"
#include "reply.h"
#include "request-int.h"
#include "util.h"

#define REASON_MAX 256

/* The one place a bound's reason is written: what it is, and its figures. */
static void bound_reason(const struct conn *c, const struct broker_bound *bd, bool never_revoked, char *msg, size_t len)
{
	const struct broker *b = c->broker;
	const struct job *jb = c->cgroup ? c->cgroup->job : NULL;
	char l[32], u[32], f[32];

	format_size(bd->limit, l, sizeof(l));
	format_size(bd->used, u, sizeof(u));
	format_size(bd->left_bytes, f, sizeof(f));
	switch (bd->kind) {
	case BOUND_BUDGET:
		snprintf(msg, len, "host budget: %s of %s leased, %s left", u, l, f);
		return;
	case BOUND_UID_QUOTA:
		snprintf(msg, len, "uid %u quota (uid-quota): %s of %s held, %s left", c->uid, u, l, f);
		return;
	case BOUND_JOB_QUOTA:
		snprintf(msg, len, "job %s quota (rule %s): %s of %s held, %s left", jb ? jb->key : "?",
			 jb && jb->rule ? jb->rule->pattern : "?", u, l, f);
		return;
	case BOUND_JOB_UNKNOWN:
		snprintf(msg, len,
			 "job unknown: pid %d's cgroup could not be read while job quota rules exist "
			 "(job-unknown = refuse); nothing is lent",
			 c->pid);
		return;
	case BOUND_NO_REVOKE:
		snprintf(msg, len, "never-revoked memory of uid %u (max-no-revoke-per-uid): %s of %s held, %s left",
			 c->uid, u, l, f);
		return;
	case BOUND_PRESSURE:
		if (b->state == BROKER_CRITICAL)
			snprintf(msg, len, "host memory is critical: nothing new is lent until it recovers");
		else if (never_revoked)
			snprintf(msg, len, "host memory is tight: never-revoked memory is not lent until it eases");
		else
			snprintf(msg, len, "host memory is tight: only the free warm pool (%s) is lent", f);
		return;
	case BOUND_UID_LEASES:
	case BOUND_UID_CHUNKS:
	case BOUND_CAPACITY:
	case BOUND_CONN_LEASES: {
		static const char *const what[] = {
			[BOUND_UID_LEASES] = "leases of uid (max-leases-per-uid)",
			[BOUND_UID_CHUNKS] = "fds the daemon keeps for uid (max-chunks-per-uid)",
			[BOUND_CAPACITY] = "fds the daemon keeps for leases (its chunk capacity)",
			[BOUND_CONN_LEASES] = "leases this connection maps (max-leases-per-client)",
		};

		snprintf(msg, len, "%s: %llu of %llu%s", what[bd->kind], (unsigned long long)bd->used,
			 (unsigned long long)bd->limit, bd->left_bytes == 0 ? ", none left" : "");
		if (bd->left_bytes != 0 && bd->left_bytes != UINT64_MAX)
			snprintf(msg + strlen(msg), len - strlen(msg), "; room for %s in chunks of the largest class",
				 f);
		return;
	}
	default:
		snprintf(msg, len, "?");
		return;
	}
}

void handle_headroom(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct broker *b = c->broker;
	uint32_t flags = req->headroom->has_flags ? req->headroom->flags : 0;
	struct acquire_args args = {
		.uid = c->uid,
		.no_revoke = (flags & PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_NO_REVOKE) != 0,
		.registration = (flags & PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_REGISTER_ONLY) != 0,
		.cgroup = c->cgroup,
		.job_unknown = c->job_unknown,
	};
	Pinbroker__V1__HeadroomReply hr = PINBROKER__V1__HEADROOM_REPLY__INIT;
	Pinbroker__V1__HeadroomBound bounds[BOUND_N], *boundp[BOUND_N];
	char reasons[BOUND_N][REASON_MAX];
	struct broker_headroom h;
	struct pool_view pv;
	Pinbroker__V1__Reply r;

	pool_view(daemon_of(b)->pool, &pv);
	broker_headroom(b, &args, &pv, (uint64_t)c->nleases + c->npending, daemon_of(b)->cfg->max_leases_per_client,
			&h);
	for (size_t i = 0; i < h.n; i++) {
		pinbroker__v1__headroom_bound__init(&bounds[i]);
		bounds[i].kind = (Pinbroker__V1__HeadroomBoundKind)h.bounds[i].kind;
		bounds[i].has_limit = bounds[i].has_used = bounds[i].has_left_bytes = true;
		bounds[i].limit = h.bounds[i].limit;
		bounds[i].used = h.bounds[i].used;
		bounds[i].left_bytes = h.bounds[i].left_bytes;
		bound_reason(c, &h.bounds[i], args.no_revoke || args.registration, reasons[i], REASON_MAX);
		bounds[i].reason = reasons[i];
		boundp[i] = &bounds[i];
	}
	hr.available_bytes = h.available_bytes;
	hr.has_page_bytes = true;
	hr.page_bytes = h.page_bytes;
	hr.n_bounds = h.n;
	hr.bounds = boundp;
	hr.has_binding = true;
	hr.binding = (uint32_t)h.binding;
	hr.state = (char *)monitor_state_name(b->state);
	reply_init(&r, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
	r.body_case = PINBROKER__V1__REPLY__BODY_HEADROOM;
	r.headroom = &hr;
	reply_send(c, &r, NULL, 0);
}

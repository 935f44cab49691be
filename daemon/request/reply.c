/* SPDX-License-Identifier: MIT */
/*
 * What every request module shares: reply headers and statuses, lease replies with fd batches, the wire conversions and
 * a connection's counters.
 */
#define _GNU_SOURCE
#include "reply.h"
#include "reservation.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"
#include "budget.h"
#include "config.h"
#include "conn.h"
#include "daemon.h"
#include "jobs.h"
#include "log.h"
#include "pool.h"
#include "recovery.h"
#include "text.h"
#include "util.h"
#include "wire.h"

/* ------------------------------------------------------------ connection */

int reply_send(struct conn *c, const Pinbroker__V1__Reply *reply, const int *fds, size_t nfds)
{
	return daemon_of(c->broker)->conn_io->send(c, reply, fds, nfds);
}

void reply_close(struct conn *c, const char *why)
{
	daemon_of(c->broker)->conn_io->close(c, why);
}

/* ---------------------------------------------------------------- replies */

void reply_init(Pinbroker__V1__Reply *r, uint64_t seq, Pinbroker__V1__StatusCode status, const char *message)
{
	pinbroker__v1__reply__init(r);
	r->has_seq = true;
	r->seq = seq;
	r->status = status;
	r->message = (char *)message;
}

void reply_status(struct conn *c, uint64_t seq, Pinbroker__V1__StatusCode status, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	Pinbroker__V1__Reply r;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	reply_init(&r, seq, status, msg);
	reply_send(c, &r, NULL, 0);
}

void reply_lease_error(struct conn *c, uint64_t seq, int r, uint64_t id)
{
	if (r == -ENOENT)
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_UNKNOWN_LEASE, "no lease %llu",
			     (unsigned long long)id);
	else if (r == -EPERM)
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_NOT_YOUR_LEASE,
			     "lease %llu belongs to another client", (unsigned long long)id);
	else
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "lease %llu cannot do that in its state", (unsigned long long)id);
}

/* ------------------------------------------------------------- refusals */

/* The one mapping of a verdict to the wire. */
static Pinbroker__V1__StatusCode refusal_status(enum broker_refusal why)
{
	switch (why) {
	case REFUSAL_NONE:
		return PINBROKER__V1__STATUS_CODE__STATUS_OK;
	case REFUSAL_INVALID_SIZE:
		return PINBROKER__V1__STATUS_CODE__STATUS_INVALID_SIZE;
	case REFUSAL_TOO_LARGE:
		return PINBROKER__V1__STATUS_CODE__STATUS_TOO_LARGE;
	case REFUSAL_UID_QUOTA:
	case REFUSAL_JOB_QUOTA:
	case REFUSAL_JOB_UNKNOWN:
		return PINBROKER__V1__STATUS_CODE__STATUS_OVER_QUOTA;
	case REFUSAL_BUDGET:
		return PINBROKER__V1__STATUS_CODE__STATUS_OVER_BUDGET;
	case REFUSAL_TIGHT:
	case REFUSAL_TIGHT_NO_REVOKE:
		return PINBROKER__V1__STATUS_CODE__STATUS_PRESSURE;
	case REFUSAL_CRITICAL:
		return PINBROKER__V1__STATUS_CODE__STATUS_CRITICAL;
	case REFUSAL_UID_LEASES:
	case REFUSAL_UID_CHUNKS:
	case REFUSAL_CAPACITY:
	case REFUSAL_UID_NO_REVOKE:
	case REFUSAL_SHARES_TAKEN:
		return PINBROKER__V1__STATUS_CODE__STATUS_LIMIT;
	case REFUSAL_OVER_SHARE:
		return PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT;
	case REFUSAL_TIMEOUT:
		return PINBROKER__V1__STATUS_CODE__STATUS_TIMEOUT;
	default:
		return PINBROKER__V1__STATUS_CODE__STATUS_INTERNAL;
	}
}

/* Why making pool memory failed with err, and what to do. */
static void failure_message(const struct broker *b, int err, char *msg, size_t len)
{
	if (err == -ENOSPC && pool_hugetlb(daemon_of(b)->pool))
		snprintf(msg, len,
			 "the daemon could not create pool memory: the host's 2 MiB huge pages ran out (hugetlb = yes "
			 "keeps the pool on them); ask the admin to raise vm.nr_hugepages (pinbrokerd "
			 "--reserve-hugepages) or to set hugetlb = auto, which falls back to 4 KiB pages");
	else
		snprintf(msg, len, "the daemon could not create pool memory: %s", strerror(-err));
}

/* The one place a refusal's message is written: what was refused, and what to do. */
static void refusal_message(const struct conn *c, enum broker_refusal why, int err, uint64_t size, char *msg,
			    size_t len)
{
	const struct broker *b = c->broker;
	char a[32], q[32], h[32];

	switch (why) {
	case REFUSAL_INVALID_SIZE:
		snprintf(msg, len, "size %llu is not a valid lease size: ask for at least 1 byte and less than 2^63",
			 (unsigned long long)size);
		return;
	case REFUSAL_TOO_LARGE:
		snprintf(msg, len, "%s is more than the budget (%s) or the uid quota (%s) can ever lend",
			 format_size(size, a, sizeof(a)), format_size(budget_limit(b->budget), h, sizeof(h)),
			 format_size(budget_uid_quota(b->budget), q, sizeof(q)));
		return;
	case REFUSAL_UID_QUOTA:
		snprintf(msg, len, "uid %u already holds %s of its %s quota; %s more would exceed it", c->uid,
			 format_size(budget_uid_leased(b->budget, c->uid), h, sizeof(h)),
			 format_size(budget_uid_quota(b->budget), q, sizeof(q)), format_size(size, a, sizeof(a)));
		return;
	case REFUSAL_JOB_QUOTA: {
		const struct job *jb = c->cgroup ? c->cgroup->job : NULL;

		snprintf(msg, len,
			 "job %s already holds %s of its %s quota (rule %s); %s more would exceed it: release some "
			 "of its leases, or ask the admin to raise it (pinctl quota set)",
			 jb ? jb->key : "?", format_size(jb ? jb->bytes : 0, h, sizeof(h)),
			 format_size(jb && jb->rule ? jb->rule->bytes : 0, q, sizeof(q)),
			 jb && jb->rule ? jb->rule->pattern : "?", format_size(size, a, sizeof(a)));
		return;
	}
	case REFUSAL_JOB_UNKNOWN:
		snprintf(
			msg, len,
			"the daemon could not tell which job pid %d belongs to (its /proc/%d/cgroup was unreadable, or "
			"outside the daemon's cgroup namespace, when it connected) while "
			"job quota rules exist, so nothing is lent to it (job-unknown = refuse): ask the admin to "
			"let pinbrokerd read every client's /proc/PID/cgroup (as the shipped unit does: "
			"ProtectProc=default) or to set job-unknown = allow; pinctl doctor names the fix",
			c->pid, c->pid);
		return;
	case REFUSAL_BUDGET:
		snprintf(msg, len, "pinned budget exhausted: %s of %s leased, %s asked",
			 format_size(budget_leased(b->budget), h, sizeof(h)),
			 format_size(budget_limit(b->budget), q, sizeof(q)), format_size(size, a, sizeof(a)));
		return;
	case REFUSAL_TIGHT:
		snprintf(msg, len,
			 "host memory is tight: only the free warm pool (%s) is lent now; use pageable memory",
			 format_size(pool_idle_bytes(daemon_of(b)->pool), a, sizeof(a)));
		return;
	case REFUSAL_TIGHT_NO_REVOKE:
		snprintf(msg, len,
			 "host memory is tight: memory that is never revoked (registrations, PB_ACQUIRE_NO_REVOKE, "
			 "interposed programs) is not lent until it eases; use pageable memory or a revocable "
			 "lease, or retry later");
		return;
	case REFUSAL_CRITICAL:
		snprintf(msg, len, "host memory is critical: no pinned memory is lent until it recovers");
		return;
	case REFUSAL_TIMEOUT:
		snprintf(msg, len, "no pinned memory freed up within the wait timeout");
		return;
	case REFUSAL_UID_LEASES:
		snprintf(msg, len,
			 "uid %u already holds %llu leases (max-leases-per-uid = %llu); release some first, "
			 "or ask the admin to raise max-leases-per-uid",
			 c->uid, (unsigned long long)budget_uid_leases(b->budget, c->uid),
			 (unsigned long long)b->max_leases_per_uid);
		return;
	case REFUSAL_UID_CHUNKS:
		snprintf(msg, len,
			 "uid %u already holds %llu pool chunks and %llu processes' exit holds, each an fd in the "
			 "daemon (max-chunks-per-uid = %llu); release leases, use fewer larger ones, let processes "
			 "that closed their connections exit, or ask the admin to raise max-chunks-per-uid",
			 c->uid, (unsigned long long)budget_uid_chunks(b->budget, c->uid),
			 (unsigned long long)(budget_uid_fds(b->budget, c->uid) - budget_uid_chunks(b->budget, c->uid)),
			 (unsigned long long)b->max_chunks_per_uid);
		return;
	case REFUSAL_UID_NO_REVOKE:
		snprintf(msg, len,
			 "uid %u already holds %s in leases that are never revoked (max-no-revoke-per-uid = %s); "
			 "%s more would exceed it: use a lease that can be revoked, or ask the admin to raise "
			 "max-no-revoke-per-uid",
			 c->uid, format_size(budget_uid_no_revoke(b->budget, c->uid), h, sizeof(h)),
			 format_size(b->max_no_revoke_per_uid_bytes, q, sizeof(q)), format_size(size, a, sizeof(a)));
		return;
	case REFUSAL_SHARES_TAKEN:
		snprintf(msg, len,
			 "every share of this reservation is taken already: a group reserves one share per rank; "
			 "release a share's lease (its bytes go back to the budget, not to the reservation) or reserve "
			 "under a new name");
		return;
	case REFUSAL_OVER_SHARE:
		snprintf(msg, len,
			 "%s is more than one share of this reservation: ask for at most the share bytes it was made "
			 "with",
			 format_size(size, a, sizeof(a)));
		return;
	case REFUSAL_CAPACITY:
		snprintf(msg, len,
			 "the daemon holds %llu fds for leases and exit holds, all its file descriptors and mappings "
			 "allow while keeping reserve-fds (%u) free; try again later, or raise LimitNOFILE / "
			 "vm.max_map_count",
			 (unsigned long long)budget_fds(b->budget), b->settings.reserve_fds);
		return;
	default:
		failure_message(b, err, msg, len);
		return;
	}
}

void reply_refusal(struct conn *c, uint64_t seq, enum broker_refusal why, int err, uint64_t size)
{
	char msg[512];

	c->broker->counters.refused[broker_refusal_reason(why)]++;
	refusal_message(c, why, err, size, msg, sizeof(msg));
	reply_status(c, seq, refusal_status(why), "%s", msg);
}

void reply_log_refusal(const struct conn *c, enum broker_refusal why, int err, uint64_t size)
{
	char msg[512];

	refusal_message(c, why, err, size, msg, sizeof(msg));
	log_event(EV_LEASE_REFUSED, LOG_INFO, 0, c->uid, c->pid, "refused %llu bytes to pid %d uid %u: %s",
		  (unsigned long long)size, c->pid, c->uid, msg);
}

/* ------------------------------------------------------------- wire enums */

Pinbroker__V1__Priority reply_priority_to_wire(enum lease_priority p)
{
	switch (p) {
	case LEASE_PRIO_CRITICAL:
		return PINBROKER__V1__PRIORITY__PRIORITY_CRITICAL;
	case LEASE_PRIO_BEST_EFFORT:
		return PINBROKER__V1__PRIORITY__PRIORITY_BEST_EFFORT;
	default:
		return PINBROKER__V1__PRIORITY__PRIORITY_NORMAL;
	}
}

enum lease_priority reply_priority_from_wire(Pinbroker__V1__Priority p)
{
	switch (p) {
	case PINBROKER__V1__PRIORITY__PRIORITY_CRITICAL:
		return LEASE_PRIO_CRITICAL;
	case PINBROKER__V1__PRIORITY__PRIORITY_BEST_EFFORT:
		return LEASE_PRIO_BEST_EFFORT;
	default:
		return LEASE_PRIO_NORMAL;
	}
}

/* ------------------------------------------------------------- lease send */

int send_lease(struct conn *c, uint64_t seq, const struct lease *l, bool attached)
{
	struct broker *b = c->broker;
	Pinbroker__V1__Lease lm = PINBROKER__V1__LEASE__INIT;
	uint64_t *sizes = NULL;
	int *fds = NULL;
	size_t first, n = l->nchunks;
	bool huge = n > 0, thp = n > 0;
	Pinbroker__V1__Reply r;
	int ret = -ENOMEM;

	sizes = calloc(n ? n : 1, sizeof(*sizes));
	fds = calloc(n ? n : 1, sizeof(*fds));
	if (!sizes || !fds)
		goto out;
	for (size_t i = 0; i < n; i++) {
		sizes[i] = l->chunks[i].mem->bytes;
		fds[i] = l->chunks[i].mem->fd;
		huge = huge && l->chunks[i].mem->hugetlb;
		thp = thp && (l->chunks[i].mem->thp || sizes[i] % POOL_THP_BYTES != 0);
	}
	first = n < PB_MAX_FDS_PER_MSG ? n : PB_MAX_FDS_PER_MSG;
	lm.lease_id = l->id;
	lm.size = l->bytes;
	lm.page_size = pool_page_size(daemon_of(b)->pool);
	lm.n_chunk_bytes = n;
	lm.chunk_bytes = sizes;
	lm.fds_in_reply = (uint32_t)first;
	lm.has_hugetlb = true;
	lm.hugetlb = huge;
	lm.has_thp = thp && !huge;
	lm.thp = lm.has_thp;
	lm.has_priority = true;
	lm.priority = reply_priority_to_wire(l->priority);
	if (attached) {
		lm.has_attached = true;
		lm.attached = true;
	}
	lm.has_registration = l->registration;
	lm.registration = l->registration;
	lm.has_no_revoke = l->no_revoke;
	lm.no_revoke = l->no_revoke;
	lm.has_staging_ring = l->staging_ring;
	lm.staging_ring = l->staging_ring;
	{
		bool misplaced;
		int node = broker_lease_node(l, &misplaced);

		lm.has_numa_node = node >= 0;
		lm.numa_node = node;
		lm.has_misplaced = misplaced;
		lm.misplaced = misplaced;
	}
	/* Recorded as lent before its fds leave: a crash from here on finds these chunks held. */
	recovery_lent(b, l);
	reply_init(&r, seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
	r.body_case = PINBROKER__V1__REPLY__BODY_LEASE;
	r.lease = &lm;
	ret = reply_send(c, &r, fds, first);
	/* The rest of the fds follow in order; SEQPACKET keeps packets in sequence. */
	for (size_t at = first; ret == 0 && at < n; at += PB_MAX_FDS_PER_MSG) {
		Pinbroker__V1__LeaseFds lf = PINBROKER__V1__LEASE_FDS__INIT;
		size_t k = n - at < PB_MAX_FDS_PER_MSG ? n - at : PB_MAX_FDS_PER_MSG;

		lf.lease_id = l->id;
		lf.first_index = (uint32_t)at;
		lf.count = (uint32_t)k;
		reply_init(&r, seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
		r.body_case = PINBROKER__V1__REPLY__BODY_LEASE_FDS;
		r.lease_fds = &lf;
		ret = reply_send(c, &r, fds + at, k);
	}
out:
	free(sizes);
	free(fds);
	return ret;
}

void reply_grant(struct conn *c, uint64_t seq, struct lease *l)
{
	char label[4 * LEASE_LABEL_MAX]; /* escaped: a label from an older daemon's fd store was never checked */

	conn_gain(c, l, false);
	c->broker->counters.granted[l->registration ? GRANTED_REGISTRATION : GRANTED_POOL]++;
	c->broker->counters.granted_bytes[l->registration ? GRANTED_REGISTRATION : GRANTED_POOL] += l->bytes;
	send_lease(c, seq, l, false);
	/* After the reply: the client maps while the line is written. */
	log_event(EV_LEASE_GRANTED, LOG_INFO, l->id, l->uid, l->pid,
		  "lease %llu granted: %llu bytes in %zu chunks to pid %d uid %u%s%s", (unsigned long long)l->id,
		  (unsigned long long)l->bytes, l->nchunks, l->pid, l->uid, l->label[0] ? ", label " : "",
		  text_escape(label, sizeof(label), l->label));
}

/* ---------------------------------------------------------- reservations */

void reply_reservation(struct conn *c, uint64_t seq, const struct reservation *res, bool created)
{
	Pinbroker__V1__ReservationReply rr = PINBROKER__V1__RESERVATION_REPLY__INIT;
	Pinbroker__V1__Reply r;

	rr.reservation_id = res->id;
	rr.name = (char *)res->name;
	rr.shares = res->shares;
	rr.share_bytes = res->share_bytes;
	rr.has_taken = true;
	rr.taken = res->taken;
	rr.has_created = true;
	rr.created = created;
	rr.has_held_bytes = true;
	rr.held_bytes = res->held_bytes;
	reply_init(&r, seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
	r.body_case = PINBROKER__V1__REPLY__BODY_RESERVATION;
	r.reservation = &rr;
	reply_send(c, &r, NULL, 0);
}

/* Say why a reserve failed: the enum reservation_error cases here, the budget's refusals as an acquire's. */
void reply_reserve_error(struct conn *c, uint64_t seq, const struct reserve_args *a, enum broker_refusal why, int rerr,
			 const struct reservation *res, int err)
{
	uint64_t total = a->shares && a->share_bytes <= UINT64_MAX / a->shares ? a->shares * a->share_bytes : 0;
	char s[32];

	switch ((enum reservation_error)rerr) {
	case RESERVATION_MISMATCH:
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "reservation \"%s\" (id %llu) exists with %u shares of %s: every rank of a group must ask "
			     "for the same shares and share bytes, or use another name",
			     res->name, (unsigned long long)res->id, res->shares,
			     format_size(res->share_bytes, s, sizeof(s)));
		return;
	case RESERVATION_INVALID:
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "a reservation needs a name of 1-%d bytes, 1-%d shares and share bytes above 0 whose "
			     "total fits 64 bits",
			     RESERVATION_NAME_MAX - 1, RESERVATION_SHARES_MAX);
		return;
	case RESERVATION_TOO_MANY:
		reply_status(
			c, seq, PINBROKER__V1__STATUS_CODE__STATUS_LIMIT,
			"the daemon holds %d reservations, or this one has %d members, at most; release some first",
			RESERVATIONS_MAX, RESERVATION_MEMBERS_MAX);
		return;
	case RESERVATION_UID_CAP:
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_LIMIT,
			     "uid %u already holds %zu reservations (max-reservations-per-uid = %u): release one "
			     "(pb_reservation_release or `pinctl revoke --reservation ID`; `pinctl reservations` lists "
			     "them), or ask the admin to raise max-reservations-per-uid in pinbrokerd.conf and reload",
			     a->uid, broker_reservations_of_uid(c->broker, a->uid),
			     c->broker->settings.max_reservations_per_uid);
		return;
	case RESERVATION_OK:
		break;
	}
	reply_log_refusal(c, why, err, total);
	reply_refusal(c, seq, why, err, total);
}

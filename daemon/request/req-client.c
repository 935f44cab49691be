/* SPDX-License-Identifier: MIT */
/*
 * The client verbs: hello, acquire, release, set-idle, revoke-ack, redeclare, share, attach, report-unbrokered and
 * report-staging.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "broker.h"
#include "config.h"
#include "conn.h"
#include "daemon.h"
#include "jobs-watch.h"
#include "jobs.h"
#include "lease.h"
#include "log.h"
#include "pool.h"
#include "recovery.h"
#include "reply.h"
#include "reservation.h"
#include "request-int.h"
#include "revoker.h"
#include "tenant.h"
#include "text.h"
#include "util.h"
#include "waitq-order.h"
#include "waitq.h"
#include "wire.h"

void handle_hello(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct broker *b = c->broker;
	Pinbroker__V1__HelloReply hr = PINBROKER__V1__HELLO_REPLY__INIT;
	const Pinbroker__V1__Hello *h = req->hello;
	Pinbroker__V1__Reply r;

	if (c->hello_done) {
		reply_close(c, "second HELLO");
		return;
	}
	if (h->version != PB_PROTOCOL_VERSION) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_VERSION_MISMATCH,
			     "protocol version %u is not supported: this pinbrokerd %s speaks version %d; "
			     "upgrade libpinbroker or pinbrokerd so they match",
			     h->version, PINBROKER_VERSION, PB_PROTOCOL_VERSION);
		reply_close(c, "protocol version mismatch");
		return;
	}
	c->hello_done = true;
	daemon_of(b)->conn_io->hello_done(c);
	if (h->client_name)
		text_sanitize(c->name, sizeof(c->name), h->client_name); /* shown to others: no control characters */
	hr.version = PB_PROTOCOL_VERSION;
	hr.server_version = (char *)PINBROKER_VERSION;
	hr.has_page_size = true;
	hr.page_size = pool_page_size(daemon_of(b)->pool);
	hr.has_chunk_size = true;
	hr.chunk_size = pool_chunk_size(daemon_of(b)->pool);
	hr.has_hugetlb = true;
	hr.hugetlb = pool_hugetlb(daemon_of(b)->pool);
	hr.has_instance_id = true;
	hr.instance_id = recovery_instance_id(b);
	hr.has_registrations = true;
	hr.registrations = true;
	hr.has_staging = true;
	hr.staging = true;
	reply_init(&r, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
	r.body_case = PINBROKER__V1__REPLY__BODY_HELLO;
	r.hello = &hr;
	reply_send(c, &r, NULL, 0);
}

void handle_acquire(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct broker *b = c->broker;
	const Pinbroker__V1__Acquire *a = req->acquire;
	struct acquire_args args = {
		.uid = c->uid,
		.gid = c->gid,
		.pid = c->pid,
		.owner = c,
		.size = a->size,
		.priority = reply_priority_from_wire(a->priority),
		.label = a->label,
		.no_revoke = (a->flags & PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_NO_REVOKE) != 0,
		.registration = (a->flags & PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_REGISTER_ONLY) != 0,
		.staging_ring = (a->flags & PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_STAGING_RING) != 0,
		.numa_node = a->has_numa_node && a->numa_node >= 0 ? a->numa_node : -1,
		.cgroup = c->cgroup,
		.tenant = c->tenant,
		.job_unknown = c->job_unknown,
		/* The client's word on what backs its span (lib-register.c): see the security note in backing.h. */
		.backed = a->backing != NULL,
		.backing_dev = a->backing ? a->backing->dev : 0,
		.backing_ino = a->backing ? a->backing->ino : 0,
		.backing_offset = a->backing ? a->backing->offset : 0,
	};
	bool wait = (a->flags & PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_WAIT) != 0;
	uint32_t timeout_ms = a->has_timeout_ms && a->timeout_ms ? a->timeout_ms
								 : daemon_of(b)->cfg->acquire_timeout_ms;
	enum broker_refusal why;
	struct lease *l;
	int err = 0;

	if (!broker_conn_may_acquire((uint64_t)c->nleases + c->npending, daemon_of(b)->cfg->max_leases_per_client)) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_LIMIT,
			     "this connection already holds %u leases (max-leases-per-client); release some first",
			     c->nleases);
		return;
	}
	/* Labels are shown to other users and logged: a control character could forge a row or a log line. */
	if (a->label && !text_printable(a->label)) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "the label must be printable UTF-8 text: control characters (bytes 0x00-0x1f and 0x7f, "
			     "U+0080-U+009F), line separators and bidirectional controls are refused");
		return;
	}
	/* Stored labels hold LEASE_LABEL_MAX - 1 bytes: cut here, where a character is never split. */
	if (a->label)
		text_truncate(a->label, LEASE_LABEL_MAX - 1);
	if (a->has_reservation_id) {
		args.reservation = broker_reservation_find(b, a->reservation_id);
		if (!args.reservation || !reservation_is_member(args.reservation, c)) {
			reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
				     "no reservation %llu joined on this connection: reserve (or join) it by name on "
				     "the connection that acquires; it may have been released or revoked",
				     (unsigned long long)a->reservation_id);
			return;
		}
		/* Its bytes are held: nothing to wait for, and a waiting entry must not outlive the reservation. */
		wait = false;
	}
	args.now_ms = now_ms();
	if (args.job_unknown)
		jobs_watch_unknown_acquire(b, c->pid, c->uid);
	why = daemon_acquire(b, &args, &l, &err);
	if (why == REFUSAL_NONE) {
		reply_grant(c, req->seq, l);
		return;
	}
	if (why == REFUSAL_BUDGET && !args.reservation) {
		/* Take cached-idle leases back first; the acquire waits for them. */
		uint64_t shortfall = round_up(a->size, pool_page_size(daemon_of(b)->pool));
		uint64_t got = revoker_reclaim_idle(b, c, shortfall);

		if (got > 0 && !wait) {
			wait = true;
			timeout_ms = daemon_of(b)->cfg->revoke_deadline_ms;
		}
	}
	/* What the wait queue would keep waiting (its uid's, job's or the host's limits) may wait. */
	if (wait && waitq_order_verdict(why) != WAITQ_ANSWERED) {
		int q = waitq_add(c, req->seq, &args, timeout_ms);

		if (q == 0)
			return;
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_LIMIT,
			     "%u acquires are already waiting (max-pending-acquires); try again later", waitq_count(b));
		return;
	}
	reply_log_refusal(c, why, err, a->size);
	reply_refusal(c, req->seq, why, err, a->size);
}

static int check_own(struct conn *c, uint64_t id, struct lease **ret)
{
	struct lease *l = lease_find(c->broker->leases, id);

	if (!l)
		return -ENOENT;
	if (l->owner != c)
		return -EPERM;
	*ret = l;
	return 0;
}

void handle_release(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct broker *b = c->broker;
	uint64_t id = req->release->lease_id;
	struct lease *l = lease_find(b->leases, id);
	bool holder, attached;

	if (!l) {
		reply_lease_error(c, req->seq, -ENOENT, id);
		return;
	}
	holder = l->owner == c;
	attached = !holder && lease_attacher_find(l, c);
	/* A child of the process may still map it (PB_ACQUIRE_INHERIT): its memory is never lent again. */
	if ((holder || attached) && req->release->has_forked && req->release->forked)
		l->dropped = true;
	if (holder || attached) {
		/* A mapper lets go; a shared lease lives on while others map it. */
		int r = broker_detach(b, l, c);

		conn_lose(c, l, attached);
		if (r == 0) {
			reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, "%s", "");
			log_event(
				EV_LEASE_RELEASED, LOG_INFO, l->id, l->uid, c->pid,
				"lease %llu: pid %d (%s) let go; it lives on for %zu attachers and %u exited-connection holds",
				(unsigned long long)l->id, c->pid, attached ? "attacher" : "holder", l->nattachers,
				l->exit_holds);
			return;
		}
	} else if (!(l->owner == NULL && l->nattachers == 0 &&
		     (c->admin || (l->uid == c->uid && (l->tenant == TENANT_NONE ||
							tenants_same_pidns(b->tenants, c->tenant, l->tenant)))))) {
		/* A lease with no connection (an orphan nobody re-declared, or one held until its
		 * process exits) may be dropped by an admin or by its own uid from its pid namespace (an
		 * orphan's is not known), unless attachers still map it. Taking a live connection's lease
		 * is what revoke is for: it still maps it. */
		reply_lease_error(c, req->seq, -EPERM, id);
		return;
	}
	/* Its last mapper let go by asking (the library unmapped it first): the chunks may stay warm for its tenant. */
	l->released = holder || attached;
	/*
	 * Answered first: freeing (the pool's check of each chunk for punched pages, the log line) then overlaps
	 * the client's return. Nothing else is read before this handler ends, so no request sees the lease half gone.
	 */
	reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, "%s", "");
	revoker_free_lease(b, l, "released");
	revoker_freed(b);
}

void handle_set_idle(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct lease *l;
	int r;

	r = check_own(c, req->set_idle->lease_id, &l);
	if (r == 0) {
		enum lease_state to = req->set_idle->idle ? LEASE_IDLE : LEASE_ACTIVE;

		/* A cached never-revoked lease taken back into use while its REVOKE was on the way: its
		 * holder cannot give it back now, so it is the holder's again (never enforced against). */
		if (to == LEASE_ACTIVE && l->no_revoke && lease_cancel_revoke(l, now_ms()) == 0) {
			/* Rate-limited: a revoke of many cached leases, all reused at once, is one story. */
			c->broker->counters.revokes_cancelled[CANCELLED_REUSED]++;
			log_event(EV_REVOKE_CANCELLED, LOG_INFO, l->id, l->uid, l->pid,
				  "lease %llu (pid %d): taken back into use from its library's cache before the "
				  "revoke reached it; kept",
				  (unsigned long long)l->id, l->pid);
			r = 0;
		}
		/* Already there, or revoking: nothing to do, not an error. */
		else if (l->state == to || l->state == LEASE_REVOKING || l->state == LEASE_OVERDUE)
			r = 0;
		/* Idle leases are reclaimed first: one that attachers use is not a cached buffer, and a
		 * registration is the program's own memory, which no revoke could take. A never-revoked
		 * lease may be idle: its library keeps it cached and gives it back on a revoke. */
		else if (to == LEASE_IDLE && (l->nattachers > 0 || l->registration))
			r = -EBUSY;
		else
			r = lease_set_state(l, to, now_ms());
	}
	if (r < 0)
		reply_lease_error(c, req->seq, r, req->set_idle->lease_id);
	else
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, "%s", "");
}

void handle_revoke_ack(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct lease *l;
	int r;

	/* The client releases before it acks; an ack for a lease it still holds
	 * changes nothing, and one for a lease it never held is just answered. */
	r = check_own(c, req->revoke_ack->lease_id, &l);
	/* An attacher acks the REVOKE it got as well. */
	if (r == -EPERM && lease_attacher_find(lease_find(c->broker->leases, req->revoke_ack->lease_id), c))
		r = 0;
	if (r < 0)
		reply_lease_error(c, req->seq, r, req->revoke_ack->lease_id);
	else
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, "%s", "");
}

void handle_redeclare(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct broker *b = c->broker;
	const Pinbroker__V1__Redeclare *rd = req->redeclare;
	Pinbroker__V1__RedeclareReply rr = PINBROKER__V1__REDECLARE_REPLY__INIT;
	uint64_t *ok = calloc(rd->n_lease_ids + 1, sizeof(*ok));
	uint64_t *bad = calloc(rd->n_lease_ids + 1, sizeof(*bad));
	Pinbroker__V1__Reply r;

	if (!ok || !bad) {
		free(ok);
		free(bad);
		reply_close(c, "out of memory");
		return;
	}
	for (size_t i = 0; i < rd->n_lease_ids; i++) {
		struct lease *l = lease_find(b->leases, rd->lease_ids[i]);

		/* Only an orphan of the same uid, granted by this instance, can be adopted. */
		if (rd->has_instance_id && rd->instance_id != recovery_instance_id(b))
			l = NULL;
		if (l && l->state == LEASE_ORPHANED && !l->owner && l->uid == c->uid &&
		    lease_set_state(l, LEASE_ACTIVE, now_ms()) == 0) {
			l->owner = c;
			l->pid = c->pid;
			/* Its tenant now (whose rows and revokes reach it); its chunks stay nobody's warm memory. */
			l->tenant = c->tenant;
			/* Charged to the job of the process that re-declares it, as a new lease would be. */
			if (b->jobs && c->cgroup && !l->cgroup) {
				l->cgroup = c->cgroup;
				jobs_charge(b->jobs, l->cgroup, l->charged_bytes);
			}
			conn_gain(c, l, false);
			b->generation++;
			ok[rr.n_adopted++] = l->id;
			log_event(EV_LEASE_GRANTED, LOG_INFO, l->id, l->uid, l->pid,
				  "lease %llu re-adopted by pid %d after restart", (unsigned long long)l->id, c->pid);
			/*
			 * Re-declared after the grace, it was held until this process exits: its connection holds
			 * it now, so its release frees it (and its close, while the process runs, holds it again).
			 */
			/* Held without a pidfd (a polled exit hold), the same: the poll must not free it any more. */
			if (l->exit_holds > 0 && revoker_unhold(b, c->pid, l->id))
				log_info("lease %llu: re-declared after redeclare-grace-ms by pid %d; %s",
					 (unsigned long long)l->id, c->pid,
					 l->exit_holds > 0
						 ? "other exit holds (an attachment of its own, or another "
						   "process's) keep it counted after its release until they end"
						 : "no longer held until that process exits");
		} else {
			bad[rr.n_rejected++] = rd->lease_ids[i];
		}
	}
	rr.adopted = ok;
	rr.rejected = bad;
	reply_init(&r, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
	r.body_case = PINBROKER__V1__REPLY__BODY_REDECLARE;
	r.redeclare = &rr;
	reply_send(c, &r, NULL, 0);
	free(ok);
	free(bad);
}

/* Hex on the wire, bytes in the table. Returns false for anything but exactly 32 hex digits. */
static bool token_parse(const char *hex, uint8_t out[LEASE_TOKEN_BYTES])
{
	if (!hex || strlen(hex) != 2 * LEASE_TOKEN_BYTES)
		return false;
	for (size_t i = 0; i < LEASE_TOKEN_BYTES; i++) {
		int v = 0;

		for (int k = 0; k < 2; k++) {
			char ch = hex[2 * i + (size_t)k];

			v <<= 4;
			if (ch >= '0' && ch <= '9')
				v |= ch - '0';
			else if (ch >= 'a' && ch <= 'f')
				v |= ch - 'a' + 10;
			else if (ch >= 'A' && ch <= 'F')
				v |= ch - 'A' + 10;
			else
				return false;
		}
		out[i] = (uint8_t)v;
	}
	return true;
}

static void token_format(const uint8_t token[LEASE_TOKEN_BYTES], char out[2 * LEASE_TOKEN_BYTES + 1])
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < LEASE_TOKEN_BYTES; i++) {
		out[2 * i] = digits[token[i] >> 4];
		out[2 * i + 1] = digits[token[i] & 15];
	}
	out[2 * LEASE_TOKEN_BYTES] = '\0';
}

void handle_share(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct broker *b = c->broker;
	const Pinbroker__V1__Share *sh = req->share;
	Pinbroker__V1__ShareReply sr = PINBROKER__V1__SHARE_REPLY__INIT;
	uint32_t uids[1 + LEASE_SHARE_UIDS_MAX];
	uint8_t token[LEASE_TOKEN_BYTES];
	char hex[2 * LEASE_TOKEN_BYTES + 1];
	struct lease *l;
	Pinbroker__V1__Reply r;
	int ret;

	ret = check_own(c, sh->lease_id, &l);
	if (ret < 0) {
		reply_lease_error(c, req->seq, ret, sh->lease_id);
		return;
	}
	/* A registration is a charge for the holder's own memory: there is nothing another process could map. */
	if (l->registration) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "lease %llu is a registration (memory its process owns): only pool leases can be shared",
			     (unsigned long long)l->id);
		return;
	}
	if (sh->n_uids > LEASE_SHARE_UIDS_MAX) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "a lease may be shared with at most %d uids besides its holder's; %zu were named",
			     LEASE_SHARE_UIDS_MAX, sh->n_uids);
		return;
	}
	/* 128 bits from the kernel's CSPRNG: the token is the only key, so it must not be guessable. */
	if (!l->share && getrandom(token, sizeof(token), 0) != (ssize_t)sizeof(token)) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INTERNAL,
			     "the daemon could not draw a random share token: %s", strerror(errno));
		return;
	}
	ret = broker_share(b, l, c, token, (const uid_t *)sh->uids, sh->n_uids);
	if (ret == -E2BIG) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "lease %llu would be shared with more than %d uids besides its holder's",
			     (unsigned long long)l->id, LEASE_SHARE_UIDS_MAX);
		return;
	}
	if (ret == -EINVAL) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "lease %llu is %s: only an active or idle lease can be shared", (unsigned long long)l->id,
			     lease_state_name(l->state));
		return;
	}
	if (ret < 0) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INTERNAL, "cannot share lease %llu: %s",
			     (unsigned long long)l->id, strerror(-ret));
		return;
	}
	token_format(l->share->token, hex);
	uids[0] = l->uid;
	for (size_t i = 0; i < l->share->nuids; i++)
		uids[1 + i] = l->share->uids[i];
	sr.token = hex;
	sr.n_uids = 1 + l->share->nuids;
	sr.uids = uids;
	log_event(EV_LEASE_GRANTED, LOG_INFO, l->id, l->uid, c->pid, "lease %llu shared by pid %d with %zu more uids",
		  (unsigned long long)l->id, c->pid, l->share->nuids);
	reply_init(&r, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
	r.body_case = PINBROKER__V1__REPLY__BODY_SHARE;
	r.share = &sr;
	reply_send(c, &r, NULL, 0);
}

void handle_attach(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct broker *b = c->broker;
	uint8_t token[LEASE_TOKEN_BYTES];
	struct lease *l = NULL;
	int r;

	if (!broker_conn_may_acquire((uint64_t)c->nleases + c->npending, daemon_of(b)->cfg->max_leases_per_client)) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_LIMIT,
			     "this connection already maps %u leases (max-leases-per-client, attachments included); "
			     "release some first",
			     c->nleases);
		return;
	}
	/*
	 * A token nobody holds, a malformed one and one whose lease is gone get the same
	 * answer. A uid that is not granted learns the token is live, but only someone who
	 * was handed the token can ask, and 128 bits cannot be guessed.
	 */
	r = token_parse(req->attach->token, token) ? broker_attach(b, token, c, c->uid, c->pid, c->tenant, now_ms(), &l)
						   : -ENOENT;
	switch (r) {
	case 0:
		break;
	case -ENOENT:
		reply_status(
			c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_SHARE_DENIED,
			"no live lease has this share token: it is mistyped, or its lease was released or revoked; "
			"ask the holder for a fresh one");
		return;
	case -EACCES:
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_PERMISSION_DENIED,
			     "uid %u may not attach to this lease: its holder must share it with this uid", c->uid);
		return;
	case -EEXIST:
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "this connection already maps the lease this token names (as its holder or attached)");
		return;
	default:
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INTERNAL, "cannot attach: %s",
			     strerror(-r));
		return;
	}
	conn_gain(c, l, true);
	log_event(EV_LEASE_GRANTED, LOG_INFO, l->id, l->uid, c->pid,
		  "lease %llu attached by pid %d uid %u (%zu attachers); counted once, to uid %u",
		  (unsigned long long)l->id, c->pid, c->uid, l->nattachers, l->uid);
	send_lease(c, req->seq, l, true);
}

/*
 * No process pins 16 TiB outside the broker: a larger report is a bug or a lie. The cap also keeps
 * the host-wide sum from wrapping: 2^44 bytes times max-connections' ceiling (2^20) fits 64 bits.
 * Where MemTotal is known, a report above it is refused too: no process pins more than the host has.
 */
#define UNBROKERED_REPORT_MAX (1ull << 44)

/*
 * A report is the client's word, never verified: it replaces the connection's last one and is summed
 * per uid (unbrokered.h); what status and the metrics show is capped at what the host can hold, so
 * one uid's many connections cannot inflate the host's figure. An impossible report is refused (its
 * last report stands), logged once per connection and rate-limited with the other protocol errors.
 */
void handle_report_unbrokered(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct broker *b = c->broker;
	uint64_t bytes = req->report_unbrokered->bytes;
	int r;

	if (!unbrokered_report_ok(bytes, b->host_mem_total_bytes, UNBROKERED_REPORT_MAX)) {
		bool over_host = b->host_mem_total_bytes && bytes > b->host_mem_total_bytes;

		if (!c->unbrokered_warned) {
			c->unbrokered_warned = true;
			log_event(EV_PROTOCOL_ERROR, LOG_WARNING, 0, c->uid, c->pid,
				  "pid %d uid %u reported %llu bytes pinned outside the broker, more than %s; refused, "
				  "its last report (%llu bytes) stands",
				  c->pid, c->uid, (unsigned long long)bytes,
				  over_host ? "the host's MemTotal" : "16 TiB",
				  (unsigned long long)c->unbrokered_bytes);
		}
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "%llu unbrokered bytes is more than %s (%llu bytes); report the bytes this process pinned "
			     "outside the broker",
			     (unsigned long long)bytes, over_host ? "this host's MemTotal" : "16 TiB",
			     (unsigned long long)(over_host ? b->host_mem_total_bytes : UNBROKERED_REPORT_MAX));
		return;
	}
	r = unbrokered_set(&b->unbrokered, c->uid, c->unbrokered_bytes, bytes);
	if (r < 0) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INTERNAL, "cannot record the report: %s",
			     strerror(-r));
		return;
	}
	b->unbrokered_bytes = b->unbrokered.reported_bytes;
	if (bytes != c->unbrokered_bytes)
		log_debug("pid %d uid %u pins %llu bytes outside the broker", c->pid, c->uid,
			  (unsigned long long)bytes);
	c->unbrokered_bytes = bytes;
	reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, "%s", "");
}

/*
 * A report is the client's word on its own copies: it moves no memory and charges nothing, so it is only
 * checked for sense (staged.h: cumulative, bounded, no faster than a host copies). A refused one leaves the
 * last standing and is logged once per connection; the library sends without waiting and drops the answer.
 */
void handle_report_staging(struct conn *c, const Pinbroker__V1__Request *req)
{
	const Pinbroker__V1__ReportStaging *rs = req->report_staging;
	struct broker *b = c->broker;
	struct staged_counters next = {
		.h2d_bytes = rs->h2d_bytes,
		.d2h_bytes = rs->d2h_bytes,
		.h2d_copies = rs->h2d_copies,
		.d2h_copies = rs->d2h_copies,
		.driver_copies = rs->driver_copies,
		.ring_revoked = rs->ring_revoked,
		.ring_refused = rs->ring_refused,
		.busy_ns = rs->busy_ns,
	};
	uint64_t now = now_ms();
	enum staged_verdict v;
	const char *field;

	if (c->staged.since_ms == 0)
		staged_client_init(&c->staged, c->connected_ms ? c->connected_ms : now);
	v = staged_check(&c->staged, &next, now, &field);
	if (v != STAGED_OK) {
		if (!c->staged.warned) {
			c->staged.warned = true;
			log_event(EV_PROTOCOL_ERROR, LOG_WARNING, 0, c->uid, c->pid,
				  "pid %d uid %u sent a staged-copy report refused at %s: %s; its last report stands "
				  "(logged once per connection)",
				  c->pid, c->uid, field ? field : "?", staged_verdict_text(v));
		}
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "staged-copy report refused (%s: %s); its last report stands: report the counters "
			     "pb_staging_stats gives, cumulative since this connection began",
			     field ? field : "?", staged_verdict_text(v));
		return;
	}
	staged_apply(&c->staged, &b->staged, &next, now);
	reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, "%s", "");
}

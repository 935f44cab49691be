/* SPDX-License-Identifier: MIT */
/* Unit tests for the request modules on an in-memory broker built from the daemon library (tests/lib/reqfix.c): the gate, the pressure gate, lease accounting, the wait queue's freed-memory event, admin rights. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <ev.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "budget.h"
#include "config.h"
#include "lease.h"
#include "monitor.h"
#include "request.h"
#include "revoker.h"
#include "waitq.h"
#include "util.h"
#include "wire.h"
#include "check_main.h"
#include "reqfix.h"
#include "reservation.h"
#include "wirefix.h"

#define KIB 1024ull
/* The fixture's config (tests/lib/reqfix.h): a 2 MiB budget, 1536 KiB per uid, 16 KiB chunks. */
#define BUDGET_BYTES (2048 * KIB)
#define QUOTA_BYTES (1536 * KIB)
#define NO_REPLY (-1)
/* A waiting acquire's timeout where the test waits it out on the real clock. */
#define WAIT_TIMEOUT_MS 200

typedef Pinbroker__V1__Request Request;
typedef Pinbroker__V1__Reply Reply;

static struct rf *F;

/* Hand req to connection i's dispatch, as its peer would send it. Returns its seq. */
static uint64_t send_req(int i, Request *req)
{
	static uint8_t buf[4096];
	size_t len;

	req->has_seq = true;
	req->seq = ++F->seq;
	len = pinbroker__v1__request__get_packed_size(req);
	ck_assert_uint_le(len, sizeof(buf));
	pinbroker__v1__request__pack(req, buf);
	request_dispatch(rf_conn(F, i), buf, len);
	return req->seq;
}

/* A request of body (its oneof case kind) on connection i: its seq. */
static uint64_t send_body(int i, uint32_t kind, ProtobufCMessage *body)
{
	Request req = PINBROKER__V1__REQUEST__INIT;

	wirefix_set_oneof(&req.base, kind, body);
	return send_req(i, &req);
}

/*
 * The reply to seq waiting at connection i's peer, or NULL: packets before it
 * (a REVOKE, another reply) are read and dropped, fds closed. Free with
 * pinbroker__v1__reply__free_unpacked.
 */
static Reply *recv_reply(int i, uint64_t seq)
{
	static uint8_t buf[PB_MAX_MSG_BYTES + 1];

	while (F->peer[i] >= 0) {
		int fds[PB_MAX_FDS_PER_MSG];
		size_t nfds = 0;
		ssize_t n = wire_recv(F->peer[i], buf, sizeof(buf), fds, PB_MAX_FDS_PER_MSG, &nfds);
		Reply *rep;

		if (n <= 0)
			return NULL;
		wire_close_fds(fds, nfds);
		rep = pinbroker__v1__reply__unpack(NULL, (size_t)n, buf);
		ck_assert_ptr_nonnull(rep);
		if (rep->has_seq && rep->seq == seq && rep->body_case != PINBROKER__V1__REPLY__BODY_LEASE_FDS)
			return rep;
		pinbroker__v1__reply__free_unpacked(rep, NULL);
	}
	return NULL;
}

/* The status of the reply to seq on connection i, or NO_REPLY. *body: its body kind (may be NULL). */
static int reply_of(int i, uint64_t seq, Pinbroker__V1__Reply__BodyCase *body, uint64_t *lease_id)
{
	Reply *rep = recv_reply(i, seq);
	int st;

	if (!rep)
		return NO_REPLY;
	st = (int)rep->status;
	if (body)
		*body = rep->body_case;
	if (lease_id && rep->body_case == PINBROKER__V1__REPLY__BODY_LEASE)
		*lease_id = rep->lease->lease_id;
	pinbroker__v1__reply__free_unpacked(rep, NULL);
	return st;
}

static int hello(int i)
{
	Pinbroker__V1__Hello h = PINBROKER__V1__HELLO__INIT;

	h.version = PB_PROTOCOL_VERSION;
	h.client_name = (char *)"check_request";
	return reply_of(i, send_body(i, PINBROKER__V1__REQUEST__BODY_HELLO, &h.base), NULL, NULL);
}

static uint64_t send_acquire(int i, uint64_t size, uint32_t flags, const char *label, uint32_t timeout_ms)
{
	Pinbroker__V1__Acquire a = PINBROKER__V1__ACQUIRE__INIT;

	a.size = size;
	a.has_flags = flags != 0;
	a.flags = flags;
	a.label = (char *)label;
	a.has_timeout_ms = timeout_ms > 0;
	a.timeout_ms = timeout_ms;
	return send_body(i, PINBROKER__V1__REQUEST__BODY_ACQUIRE, &a.base);
}

/* A registration of [off, off + size) of shared file ino (Acquire.backing), as pb_register sends it. */
static uint64_t send_shared_registration(int i, uint64_t size, uint64_t ino, uint64_t off)
{
	Pinbroker__V1__Acquire a = PINBROKER__V1__ACQUIRE__INIT;
	Pinbroker__V1__Backing bk = PINBROKER__V1__BACKING__INIT;

	a.size = size;
	a.has_flags = true;
	a.flags = PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_REGISTER_ONLY |
		  PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_NO_REVOKE;
	bk.dev = 0x2d;
	bk.ino = ino;
	bk.offset = off;
	a.backing = &bk;
	return send_body(i, PINBROKER__V1__REQUEST__BODY_ACQUIRE, &a.base);
}

/* Acquire size bytes on connection i; the lease id, after asserting the grant. */
static uint64_t acquire_ok(int i, uint64_t size)
{
	Pinbroker__V1__Reply__BodyCase body = 0;
	uint64_t id = 0;

	ck_assert_int_eq(reply_of(i, send_acquire(i, size, 0, NULL, 0), &body, &id),
			 PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(body, PINBROKER__V1__REPLY__BODY_LEASE);
	ck_assert_uint_ne(id, 0);
	return id;
}

static uint64_t send_release(int i, uint64_t id)
{
	Pinbroker__V1__Release rel = PINBROKER__V1__RELEASE__INIT;

	rel.lease_id = id;
	return send_body(i, PINBROKER__V1__REQUEST__BODY_RELEASE, &rel.base);
}

static uint64_t send_status(int i)
{
	Pinbroker__V1__StatusRequest sq = PINBROKER__V1__STATUS_REQUEST__INIT;

	return send_body(i, PINBROKER__V1__REQUEST__BODY_STATUS, &sq.base);
}

static uint64_t send_set(int i, const char *key, const char *value)
{
	Pinbroker__V1__SetConfig sc = PINBROKER__V1__SET_CONFIG__INIT;

	sc.key = (char *)key;
	sc.value = (char *)value;
	return send_body(i, PINBROKER__V1__REQUEST__BODY_SET_CONFIG, &sc.base);
}

static uint64_t send_revoke(int i, uint64_t id)
{
	Pinbroker__V1__AdminRevoke ar = PINBROKER__V1__ADMIN_REVOKE__INIT;

	ar.has_lease_id = true;
	ar.lease_id = id;
	return send_body(i, PINBROKER__V1__REQUEST__BODY_ADMIN_REVOKE, &ar.base);
}

static uint64_t send_report_unbrokered(int i, uint64_t bytes)
{
	Pinbroker__V1__ReportUnbrokered ru = PINBROKER__V1__REPORT_UNBROKERED__INIT;

	ru.bytes = bytes;
	return send_body(i, PINBROKER__V1__REQUEST__BODY_REPORT_UNBROKERED, &ru.base);
}

static uint64_t send_report_staging(int i, uint64_t h2d_bytes, uint64_t h2d_copies)
{
	Request req;
	Pinbroker__V1__ReportStaging rs;

	wirefix_report_staging(&req, &rs, h2d_bytes, h2d_copies);
	return send_req(i, &req);
}

/* HEADROOM for connection i: the reply's status; *available and *binding (its kind) when it carries one. */
static int headroom_of(int i, uint32_t flags, uint64_t *available, int *binding)
{
	Pinbroker__V1__HeadroomRequest hq = PINBROKER__V1__HEADROOM_REQUEST__INIT;
	Reply *rep;
	int st;

	hq.has_flags = true;
	hq.flags = flags;
	rep = recv_reply(i, send_body(i, PINBROKER__V1__REQUEST__BODY_HEADROOM, &hq.base));
	if (!rep)
		return NO_REPLY;
	st = (int)rep->status;
	if (rep->body_case == PINBROKER__V1__REPLY__BODY_HEADROOM) {
		const Pinbroker__V1__HeadroomReply *hr = rep->headroom;

		*available = hr->available_bytes;
		*binding = hr->binding < hr->n_bounds ? (int)hr->bounds[hr->binding]->kind : -1;
		ck_assert(hr->bounds[hr->binding]->reason && hr->bounds[hr->binding]->reason[0]);
	}
	pinbroker__v1__reply__free_unpacked(rep, NULL);
	return st;
}

static uint64_t send_reserve(int i, const char *name, uint32_t shares, uint64_t share_bytes)
{
	Pinbroker__V1__Reserve rs = PINBROKER__V1__RESERVE__INIT;

	rs.name = (char *)name;
	rs.shares = shares;
	rs.share_bytes = share_bytes;
	return send_body(i, PINBROKER__V1__REQUEST__BODY_RESERVE, &rs.base);
}

/* Freed-memory events seen by the test's own listener. */
static unsigned freed_events;

static void count_freed(struct broker *b)
{
	(void)b;
	freed_events++;
}

/* ------------------------------------------------------------------ the gate */

START_TEST(test_request_before_hello_is_refused_and_closes)
{
	F = rf_begin(0);
	ck_assert_int_eq(reply_of(0, send_acquire(0, 64 * KIB, 0, NULL, 0), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_NO_HELLO);
	ck_assert(!rf_conn_alive(F, 0));
	ck_assert_uint_eq(lease_count(F->d.broker.leases), 0);
	ck_assert_uint_eq(budget_leased(F->d.broker.budget), 0);
	rf_end(F);
}
END_TEST

START_TEST(test_second_hello_closes_the_connection)
{
	F = rf_begin(0);
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert(rf_conn(F, 0)->hello_done);
	ck_assert_int_eq(hello(0), NO_REPLY);
	ck_assert(!rf_conn_alive(F, 0));
	rf_end(F);
}
END_TEST

START_TEST(test_acquire_and_release_bring_every_counter_back_to_zero)
{
	uint64_t id, id2;
	struct conn *c;

	F = rf_begin(0);
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	id = acquire_ok(0, 64 * KIB);
	id2 = acquire_ok(0, 100 * KIB); /* rounded up to whole pages */
	c = rf_conn(F, 0);
	ck_assert_uint_eq(c->nleases, 2);
	ck_assert_uint_eq(c->lease_bytes, 64 * KIB + 100 * KIB);
	ck_assert_uint_eq(budget_leased(F->d.broker.budget), 164 * KIB);
	ck_assert_uint_eq(budget_uid_leased(F->d.broker.budget, c->uid), 164 * KIB);
	ck_assert_uint_eq(lease_count(F->d.broker.leases), 2);
	rf_check(F);
	ck_assert_int_eq(reply_of(0, send_release(0, id), NULL, NULL), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(reply_of(0, send_release(0, id2), NULL, NULL), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_uint_eq(c->nleases, 0);
	ck_assert_uint_eq(c->lease_bytes, 0);
	ck_assert_uint_eq(budget_leased(F->d.broker.budget), 0);
	ck_assert_uint_eq(budget_uid_leased(F->d.broker.budget, c->uid), 0);
	ck_assert_uint_eq(lease_count(F->d.broker.leases), 0);
	/* Released again: the lease is gone. */
	ck_assert_int_eq(reply_of(0, send_release(0, id), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_UNKNOWN_LEASE);
	rf_check(F);
	rf_end(F);
}
END_TEST

START_TEST(test_stopping_serves_release_and_status)
{
	Pinbroker__V1__Reply__BodyCase body = 0;
	uint64_t id;

	F = rf_begin(0);
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	id = acquire_ok(0, 64 * KIB);
	F->d.broker.shutting_down = true;
	ck_assert_int_eq(reply_of(0, send_status(0), &body, NULL), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(body, PINBROKER__V1__REPLY__BODY_STATUS_REPLY);
	ck_assert_int_eq(reply_of(0, send_release(0, id), NULL, NULL), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_uint_eq(budget_leased(F->d.broker.budget), 0);
	ck_assert_uint_eq(lease_count(F->d.broker.leases), 0);
	F->d.broker.shutting_down = false;
	rf_end(F);
}
END_TEST

START_TEST(test_stopping_refuses_every_other_kind)
{
	F = rf_begin(1); /* connection 0 is admin: refused for stopping, not for rights */
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	F->d.broker.shutting_down = true;
	ck_assert_int_eq(reply_of(0, send_acquire(0, 64 * KIB, 0, NULL, 0), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_SHUTTING_DOWN);
	ck_assert_int_eq(reply_of(0, send_set(0, "acquire-timeout-ms", "7"), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_SHUTTING_DOWN);
	ck_assert_int_eq(reply_of(0, send_report_unbrokered(0, 4096), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_SHUTTING_DOWN);
	ck_assert_uint_eq(lease_count(F->d.broker.leases), 0);
	ck_assert_uint_eq(F->d.cfg->acquire_timeout_ms, 2);
	ck_assert_uint_eq(F->d.broker.unbrokered_bytes, 0);
	ck_assert(rf_conn_alive(F, 0));
	F->d.broker.shutting_down = false;
	rf_end(F);
}
END_TEST

/* ------------------------------------------------------------ the pressure gate */

START_TEST(test_critical_refuses_acquire_at_the_gate)
{
	F = rf_begin(0);
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	rf_set_state(F, BROKER_CRITICAL);
	/*
	 * The label is refused by the handler (INVALID_ARGUMENT) before broker_acquire would say
	 * critical: only the gate answers CRITICAL here.
	 */
	ck_assert_int_eq(reply_of(0, send_acquire(0, 64 * KIB, 0, "bad\nlabel", 0), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_CRITICAL);
	ck_assert_uint_eq(lease_count(F->d.broker.leases), 0);
	ck_assert_uint_eq(budget_leased(F->d.broker.budget), 0);
	rf_set_state(F, BROKER_NORMAL);
	ck_assert_int_eq(reply_of(0, send_acquire(0, 64 * KIB, 0, "bad\nlabel", 0), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT);
	rf_end(F);
}
END_TEST

START_TEST(test_critical_refuses_register_only_and_waiting_acquires)
{
	uint32_t reg = PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_REGISTER_ONLY;
	uint32_t wait = PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_WAIT;

	F = rf_begin(0);
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	rf_set_state(F, BROKER_CRITICAL);
	ck_assert_int_eq(reply_of(0, send_acquire(0, 64 * KIB, reg, "bad\tlabel", 0), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_CRITICAL);
	ck_assert_int_eq(reply_of(0, send_acquire(0, 64 * KIB, wait, NULL, 1000), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_CRITICAL);
	ck_assert_uint_eq(F->d.broker.registered_bytes, 0);
	ck_assert_uint_eq(waitq_count(&F->d.broker), 0);
	ck_assert_uint_eq(lease_count(F->d.broker.leases), 0);
	rf_set_state(F, BROKER_NORMAL);
	rf_end(F);
}
END_TEST

/* A rank registering shared pages another rank registered pins nothing new: granted even while critical. */
START_TEST(test_critical_grants_a_shared_registration_that_adds_no_page)
{
	F = rf_begin(0);
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(hello(1), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(reply_of(0, send_shared_registration(0, 256 * KIB, 5, 0), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_OK);
	rf_set_state(F, BROKER_CRITICAL);
	ck_assert_int_eq(reply_of(1, send_shared_registration(1, 128 * KIB, 5, 64 * KIB), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_OK);
	/* One page past what is registered is new pinning: refused as at the gate. */
	ck_assert_int_eq(reply_of(1, send_shared_registration(1, 4 * KIB, 5, 256 * KIB), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_CRITICAL);
	ck_assert_uint_eq(F->d.broker.registered_bytes, 256 * KIB);
	ck_assert_uint_eq(lease_count(F->d.broker.leases), 2);
	rf_check(F);
	rf_set_state(F, BROKER_NORMAL);
	rf_end(F);
}
END_TEST

START_TEST(test_critical_serves_requests_that_take_no_memory)
{
	uint64_t id;

	F = rf_begin(0);
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	id = acquire_ok(0, 64 * KIB);
	rf_set_state(F, BROKER_CRITICAL); /* reclaim revokes the lease: its REVOKE is skipped below */
	ck_assert_int_eq(reply_of(0, send_report_unbrokered(0, 8192), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_uint_eq(F->d.broker.unbrokered_bytes, 8192);
	ck_assert_int_eq(reply_of(0, send_release(0, id), NULL, NULL), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_uint_eq(budget_leased(F->d.broker.budget), 0);
	rf_set_state(F, BROKER_NORMAL);
	rf_end(F);
}
END_TEST

/* Any client asks about itself, and is answered while critical too (HEADROOM takes nothing): 0 then. */
START_TEST(test_headroom_is_served_to_clients_and_while_critical)
{
	uint64_t available = 1;
	int binding = -1;

	F = rf_begin(0);
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	(void)acquire_ok(0, 64 * KIB);
	ck_assert_int_eq(headroom_of(0, 0, &available, &binding), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_uint_eq(available, QUOTA_BYTES - 64 * KIB);
	ck_assert_int_eq(binding, PINBROKER__V1__HEADROOM_BOUND_KIND__BOUND_UID_QUOTA);
	rf_set_state(F, BROKER_CRITICAL);
	ck_assert_int_eq(headroom_of(0, 0, &available, &binding), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_uint_eq(available, 0);
	ck_assert_int_eq(binding, PINBROKER__V1__HEADROOM_BOUND_KIND__BOUND_PRESSURE);
	rf_set_state(F, BROKER_NORMAL);
	rf_end(F);
}
END_TEST

/* --------------------------------------------------- the freed-memory event */

/* Connection 0 holds its whole quota; connection 1 (another uid) waits for more than the rest of the budget. */
static uint64_t fill_and_wait(uint64_t *waiting_seq, uint32_t timeout_ms)
{
	uint32_t wait = PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_WAIT;
	uint64_t id, sent;

	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(hello(1), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	id = acquire_ok(0, QUOTA_BYTES);
	sent = F->packets_sent;
	*waiting_seq = send_acquire(1, BUDGET_BYTES - QUOTA_BYTES + 64 * KIB, wait, NULL, timeout_ms);
	ck_assert_int_eq(reply_of(1, *waiting_seq, NULL, NULL), NO_REPLY);
	ck_assert_uint_eq(F->packets_sent, sent); /* queued, not answered */
	ck_assert_uint_eq(waitq_count(&F->d.broker), 1);
	ck_assert_uint_eq(rf_conn(F, 1)->npending, 1);
	ck_assert_int_eq(reply_of(1, *waiting_seq, NULL, NULL), NO_REPLY);
	return id;
}

START_TEST(test_revoke_and_release_grant_the_waiting_acquire_through_the_event)
{
	Pinbroker__V1__Reply__BodyCase body = 0;
	uint64_t id, seq;

	F = rf_begin(0);
	freed_events = 0;
	ck_assert_int_eq(broker_listen_freed(&F->d.broker, count_freed), 0);
	ck_assert_int_eq(broker_listen_freed(&F->d.broker, count_freed), -EEXIST);
	id = fill_and_wait(&seq, 60000);
	/* Its holder revokes its own lease, gets the REVOKE and gives the lease back. */
	ck_assert_int_eq(reply_of(0, send_revoke(0, id), &body, NULL), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(body, PINBROKER__V1__REPLY__BODY_ADMIN_REVOKE);
	ck_assert_int_eq(lease_find(F->d.broker.leases, id)->state, LEASE_REVOKING);
	ck_assert_uint_eq(waitq_count(&F->d.broker), 1);
	ck_assert_uint_eq(freed_events, 0);
	ck_assert_int_eq(reply_of(0, send_release(0, id), NULL, NULL), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_uint_eq(freed_events, 1);
	ck_assert_uint_eq(waitq_count(&F->d.broker), 0);
	ck_assert_uint_eq(rf_conn(F, 1)->npending, 0);
	ck_assert_uint_eq(rf_conn(F, 1)->nleases, 1);
	ck_assert_int_eq(reply_of(1, seq, &body, NULL), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(body, PINBROKER__V1__REPLY__BODY_LEASE);
	ck_assert_uint_eq(budget_leased(F->d.broker.budget), BUDGET_BYTES - QUOTA_BYTES + 64 * KIB);
	broker_unlisten_freed(&F->d.broker, count_freed);
	rf_check(F);
	rf_end(F);
}
END_TEST

START_TEST(test_wait_queue_grants_only_on_the_freed_memory_event)
{
	Pinbroker__V1__Reply__BodyCase body = 0;
	uint64_t id, seq;

	F = rf_begin(0);
	id = fill_and_wait(&seq, 60000);
	/* Freed without the revoker's event: the queue does not look. */
	revoker_free_lease(&F->d.broker, lease_find(F->d.broker.leases, id), "check_request");
	ck_assert_uint_eq(waitq_count(&F->d.broker), 1);
	ck_assert_int_eq(reply_of(1, seq, NULL, NULL), NO_REPLY);
	/* The event alone grants it. */
	broker_memory_freed(&F->d.broker);
	ck_assert_uint_eq(waitq_count(&F->d.broker), 0);
	ck_assert_int_eq(reply_of(1, seq, &body, NULL), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(body, PINBROKER__V1__REPLY__BODY_LEASE);
	ck_assert_uint_eq(rf_conn(F, 1)->nleases, 1);
	ck_assert_uint_eq(rf_conn(F, 0)->nleases, 0);
	rf_check(F);
	rf_end(F);
}
END_TEST

/* DESIGN.md, "Pressure and revocation": going critical refuses the acquires already waiting, at once. */
START_TEST(test_going_critical_refuses_the_waiting_acquires)
{
	uint64_t seq;

	F = rf_begin(0);
	(void)fill_and_wait(&seq, 60000);
	rf_set_state(F, BROKER_CRITICAL);
	ck_assert_uint_eq(waitq_count(&F->d.broker), 0);
	ck_assert_uint_eq(rf_conn(F, 1)->npending, 0);
	ck_assert_int_eq(reply_of(1, seq, NULL, NULL), PINBROKER__V1__STATUS_CODE__STATUS_CRITICAL);
	rf_set_state(F, BROKER_NORMAL);
	rf_check(F);
	rf_end(F);
}
END_TEST

START_TEST(test_waiting_acquire_times_out_and_leaves_the_queue)
{
	uint64_t seq, t0;

	F = rf_begin(0);
	(void)fill_and_wait(&seq, WAIT_TIMEOUT_MS);
	/* The real clock: run the loop until the acquire's timer fires, within a bound. */
	t0 = now_ms();
	while (waitq_count(&F->d.broker) > 0 && now_ms() - t0 < 10 * WAIT_TIMEOUT_MS + 5000)
		ev_run(F->d.loop, EVRUN_ONCE);
	ck_assert_uint_eq(waitq_count(&F->d.broker), 0);
	ck_assert_uint_eq(rf_conn(F, 1)->npending, 0);
	ck_assert_int_eq(reply_of(1, seq, NULL, NULL), PINBROKER__V1__STATUS_CODE__STATUS_TIMEOUT);
	rf_end(F);
}
END_TEST

/* ------------------------------------------------------------------ admin */

START_TEST(test_set_is_refused_to_non_admins)
{
	F = rf_begin(0);
	ck_assert(!rf_conn(F, 0)->admin);
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(reply_of(0, send_set(0, "acquire-timeout-ms", "7"), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_PERMISSION_DENIED);
	ck_assert_uint_eq(F->d.cfg->acquire_timeout_ms, 2);
	ck_assert(rf_conn_alive(F, 0));
	rf_end(F);
}
END_TEST

START_TEST(test_set_is_served_to_admins)
{
	F = rf_begin(1); /* connection 0 is uid 0 */
	ck_assert(rf_conn(F, 0)->admin);
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(reply_of(0, send_set(0, "acquire-timeout-ms", "7"), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_uint_eq(F->d.cfg->acquire_timeout_ms, 7);
	rf_end(F);
}
END_TEST

START_TEST(test_revoking_another_uids_lease_needs_admin)
{
	uint64_t id;

	F = rf_begin(0);
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(hello(1), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	id = acquire_ok(0, 64 * KIB);
	ck_assert_int_eq(reply_of(1, send_revoke(1, id), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_PERMISSION_DENIED);
	ck_assert_int_eq(lease_find(F->d.broker.leases, id)->state, LEASE_ACTIVE);
	ck_assert_uint_eq(revoker_revocations(&F->d.broker, (struct monitor_event[REVOKER_REVOCATIONS_MAX]){ 0 },
					      REVOKER_REVOCATIONS_MAX),
			  0);
	rf_end(F);
}
END_TEST

START_TEST(test_admin_revokes_another_uids_lease)
{
	uint64_t id;

	F = rf_begin(2); /* connection 1 is uid 0 */
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(hello(1), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	id = acquire_ok(0, 64 * KIB);
	ck_assert_int_eq(reply_of(1, send_revoke(1, id), NULL, NULL), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(lease_find(F->d.broker.leases, id)->state, LEASE_REVOKING);
	ck_assert_uint_eq(revoker_revocations(&F->d.broker, (struct monitor_event[REVOKER_REVOCATIONS_MAX]){ 0 },
					      REVOKER_REVOCATIONS_MAX),
			  1);
	rf_end(F);
}
END_TEST

/* ------------------------------------------------------------------ job quotas */

/* QUOTA_SET from connection i; the reply's status, its message into msg. */
static int quota_set(int i, const char *cgroup, uint64_t bytes, bool clear, char *msg, size_t msglen)
{
	Pinbroker__V1__QuotaSet qs = PINBROKER__V1__QUOTA_SET__INIT;
	Reply *rep;
	int st;

	qs.cgroup = (char *)cgroup;
	qs.has_bytes = !clear;
	qs.bytes = bytes;
	qs.has_clear = clear;
	qs.clear = clear;
	rep = recv_reply(i, send_body(i, PINBROKER__V1__REQUEST__BODY_QUOTA_SET, &qs.base));
	ck_assert_ptr_nonnull(rep);
	st = (int)rep->status;
	snprintf(msg, msglen, "%s", rep->message ? rep->message : "");
	pinbroker__v1__reply__free_unpacked(rep, NULL);
	return st;
}

/* QUOTA_LIST from connection i: its rule and job counts. */
static void quota_list(int i, size_t *nrules, size_t *njobs)
{
	Pinbroker__V1__QuotaList ql = PINBROKER__V1__QUOTA_LIST__INIT;
	Reply *rep;

	rep = recv_reply(i, send_body(i, PINBROKER__V1__REQUEST__BODY_QUOTA_LIST, &ql.base));
	ck_assert_ptr_nonnull(rep);
	ck_assert_int_eq(rep->status, PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(rep->body_case, PINBROKER__V1__REPLY__BODY_QUOTA);
	*nrules = rep->quota->n_rules;
	*njobs = rep->quota->n_jobs;
	pinbroker__v1__reply__free_unpacked(rep, NULL);
}

/* Regression: the fuzz harness had no jobs, so every QUOTA_SET the fuzzer made was "not set up". */
START_TEST(test_quota_handlers_are_served_in_the_harness)
{
	char msg[512];
	size_t nrules, njobs;

	F = rf_begin(1); /* connection 0 is admin */
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(hello(1), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(quota_set(0, "/fz/job_1", 128 * KIB, false, msg, sizeof(msg)),
			 PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_str_eq(msg, "");
	acquire_ok(0, 128 * KIB);
	ck_assert_int_eq(reply_of(0, send_acquire(0, 4 * KIB, 0, NULL, 0), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_OVER_QUOTA);
	/* The non-admin (default visibility) sees no rules and not the other job. */
	quota_list(1, &nrules, &njobs);
	ck_assert_uint_eq(nrules, 0);
	ck_assert_uint_eq(njobs, 0);
	quota_list(0, &nrules, &njobs);
	ck_assert_uint_eq(nrules, 1);
	ck_assert_uint_eq(njobs, 1);
	ck_assert_int_eq(quota_set(1, "/fz/job_2", 1, false, msg, sizeof(msg)),
			 PINBROKER__V1__STATUS_CODE__STATUS_PERMISSION_DENIED);
	rf_check(F);
	rf_end(F);
}
END_TEST

/* Regression: a quota over the whole budget was taken silently, and a long path's reason was cut off. */
START_TEST(test_quota_set_warns_over_the_budget_and_names_a_bad_path)
{
	char msg[512], path[2048];

	F = rf_begin(1);
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(quota_set(0, "/fz/job_1", 64ull << 30, false, msg, sizeof(msg)),
			 PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_msg(strstr(msg, "more than the whole budget"), "no warning: '%s'", msg);
	memset(path, 'x', sizeof(path) - 1);
	path[0] = '/';
	path[sizeof(path) - 1] = '\0';
	ck_assert_int_eq(quota_set(0, path, 1, false, msg, sizeof(msg)),
			 PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT);
	ck_assert_msg(strstr(msg, "too long"), "reason cut off: '%s'", msg);
	ck_assert_int_eq(quota_set(0, "/fz/a b", 1, false, msg, sizeof(msg)),
			 PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT);
	ck_assert_int_eq(quota_set(0, "/fz/nothing", 0, true, msg, sizeof(msg)),
			 PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(msg, "pinctl quota list"));
	rf_end(F);
}
END_TEST

/* ---------------------------------------------------------- staged copies */

START_TEST(test_staging_ring_is_counted_apart_and_reports_only_go_up)
{
	uint64_t ring = 0, plain;
	struct conn *c;

	F = rf_begin(0);
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(reply_of(0,
				  send_acquire(0, 64 * KIB, PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_STAGING_RING,
					       "staging ring", 0),
				  NULL, &ring),
			 PINBROKER__V1__STATUS_CODE__STATUS_OK);
	plain = acquire_ok(0, 32 * KIB);
	c = rf_conn(F, 0);
	ck_assert(lease_find(F->d.broker.leases, ring)->staging_ring);
	ck_assert(!lease_find(F->d.broker.leases, plain)->staging_ring);
	/* A ring is revocable like any pool lease. */
	ck_assert(!lease_find(F->d.broker.leases, ring)->no_revoke);
	ck_assert_uint_eq(F->d.broker.staging_rings, 1);
	ck_assert_uint_eq(F->d.broker.staging_ring_bytes, 64 * KIB);
	ck_assert_uint_eq(c->rings, 1);
	ck_assert_uint_eq(c->ring_bytes, 64 * KIB);

	ck_assert_int_eq(reply_of(0, send_report_staging(0, 100 * KIB, 2), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(reply_of(0, send_report_staging(0, 50 * KIB, 2), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT);
	ck_assert(rf_conn_alive(F, 0));
	ck_assert_uint_eq(c->staged.last.h2d_bytes, 100 * KIB);
	ck_assert_uint_eq(F->d.broker.staged.sum.h2d_bytes, 100 * KIB);
	ck_assert_int_eq(reply_of(0, send_report_staging(0, 300 * KIB, 5), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_uint_eq(F->d.broker.staged.sum.h2d_bytes, 300 * KIB);
	ck_assert_uint_eq(F->d.broker.staged.sum.h2d_copies, 5);

	/* The ring released: gone from the books; the totals stay. */
	ck_assert_int_eq(reply_of(0, send_release(0, ring), NULL, NULL), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_uint_eq(F->d.broker.staging_rings, 0);
	ck_assert_uint_eq(F->d.broker.staging_ring_bytes, 0);
	ck_assert_uint_eq(c->rings, 0);
	ck_assert_uint_eq(c->ring_bytes, 0);
	ck_assert_uint_eq(F->d.broker.staged.sum.h2d_bytes, 300 * KIB);
	ck_assert_int_eq(reply_of(0, send_release(0, plain), NULL, NULL), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	rf_end(F);
}
END_TEST

/* A reserve takes memory: refused at the gate while critical; granted, it is in the books; its connection's close ends
 * it and raises the freed-memory event. */
START_TEST(test_reserve_is_gated_booked_and_ends_with_its_connection)
{
	Pinbroker__V1__Reply__BodyCase body;

	F = rf_begin(0);
	ck_assert_int_eq(reply_of(0, send_reserve(0, "grp", 2, 64 * KIB), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_NO_HELLO);
	rf_end(F);
	F = rf_begin(0);
	ck_assert_int_eq(hello(0), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(hello(1), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	rf_set_state(F, BROKER_CRITICAL);
	ck_assert_int_eq(reply_of(0, send_reserve(0, "grp", 2, 64 * KIB), NULL, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_CRITICAL);
	rf_set_state(F, BROKER_NORMAL);
	ck_assert_int_eq(reply_of(0, send_reserve(0, "grp", 2, 64 * KIB), &body, NULL),
			 PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(body, PINBROKER__V1__REPLY__BODY_RESERVATION);
	ck_assert_uint_eq(broker_reserved_bytes(&F->d.broker), 128 * KIB);
	rf_check(F);
	ck_assert(broker_listen_freed(&F->d.broker, count_freed) == 0);
	freed_events = 0;
	close(F->peer[0]);
	F->peer[0] = -1;
	rf_run_loop(F);
	ck_assert_uint_eq(broker_reserved_bytes(&F->d.broker), 0);
	ck_assert_uint_ge(freed_events, 1);
	broker_unlisten_freed(&F->d.broker, count_freed);
	rf_check(F);
	rf_end(F);
}
END_TEST

/* Each test builds the fixture's broker in its own forked child. */
CHECK_SUITE(request_suite, "request", "core", NULL, NULL, 30, test_request_before_hello_is_refused_and_closes,
	    test_second_hello_closes_the_connection, test_acquire_and_release_bring_every_counter_back_to_zero,
	    test_stopping_serves_release_and_status, test_stopping_refuses_every_other_kind,
	    test_critical_refuses_acquire_at_the_gate, test_critical_grants_a_shared_registration_that_adds_no_page,
	    test_critical_refuses_register_only_and_waiting_acquires, test_critical_serves_requests_that_take_no_memory,
	    test_headroom_is_served_to_clients_and_while_critical,
	    test_revoke_and_release_grant_the_waiting_acquire_through_the_event,
	    test_wait_queue_grants_only_on_the_freed_memory_event, test_going_critical_refuses_the_waiting_acquires,
	    test_waiting_acquire_times_out_and_leaves_the_queue, test_set_is_refused_to_non_admins,
	    test_set_is_served_to_admins, test_revoking_another_uids_lease_needs_admin,
	    test_admin_revokes_another_uids_lease, test_quota_handlers_are_served_in_the_harness,
	    test_quota_set_warns_over_the_budget_and_names_a_bad_path,
	    test_staging_ring_is_counted_apart_and_reports_only_go_up,
	    test_reserve_is_gated_booked_and_ends_with_its_connection)

CHECK_MAIN(request_suite)

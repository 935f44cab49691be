/* SPDX-License-Identifier: MIT */
/*
 * Writes the seed corpora of valid request sequences for fuzz_request and fuzz_fdpath (see each harness for the
 * format): one row of seed_table a seed, its steps a script of the request builders and harness ops below.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "pinbroker.pb-c.h"

typedef Pinbroker__V1__Request Request;

struct seed {
	uint8_t buf[8192];
	size_t n;
	bool fdpath;
};

static void put(struct seed *s, uint8_t b)
{
	if (s->n >= sizeof(s->buf)) {
		fprintf(stderr, "seed too long\n");
		exit(1);
	}
	s->buf[s->n++] = b;
}

static void put_len(struct seed *s, size_t len)
{
	if (len < 0x80) {
		put(s, (uint8_t)len);
	} else {
		put(s, (uint8_t)(0x80 | (len >> 8)));
		put(s, (uint8_t)(len & 0xff));
	}
}

/* A packet on connection conn with the given fd kinds (fdpath only). */
static void pkt_fds(struct seed *s, int conn, const Request *r, const uint8_t *kinds, size_t nkinds)
{
	uint8_t tmp[4096];
	size_t len = pinbroker__v1__request__pack(r, tmp);

	put(s, (uint8_t)(conn << 3));
	if (s->fdpath) {
		put(s, (uint8_t)nkinds);
		for (size_t i = 0; i < nkinds; i++)
			put(s, kinds[i]);
	}
	put_len(s, len);
	for (size_t i = 0; i < len; i++)
		put(s, tmp[i]);
}

static void pkt(struct seed *s, int conn, const Request *r)
{
	pkt_fds(s, conn, r, NULL, 0);
}

#define K 1024ull
/*
 * The harness runs a 2 MiB budget with a 1.5 MiB uid quota and 16 KiB chunks
 * (fuzz/harness.c): seed sizes are written for an 8 MiB budget and scaled.
 */
#define M (256ull * 1024)
#define CHUNK (16 * K)

/* One step of a seed's script: its words, the step's name first, then (mostly) the connection, 0 or 1. */
struct step {
	char *w[12];
	int n;
};

static _Noreturn void bad_step(const struct step *st, const char *why)
{
	fprintf(stderr, "gen_corpus: step '%s': %s\n", st->w[0], why);
	exit(2);
}

/* Names a script may use in a number, for the flags the requests carry. */
static const struct {
	const char *name;
	uint64_t value;
} symbols[] = {
	{ "WAIT", PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_WAIT },
	{ "NO_REVOKE", PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_NO_REVOKE },
	{ "REGISTER_ONLY", PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_REGISTER_ONLY },
	{ "STAGING_RING", PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_STAGING_RING },
	{ "MAX", UINT64_MAX },
};

/*
 * Word i of the step as a number (dflt where the step has fewer words): terms joined by + (added) or | (or-ed), each a
 * flag's name or a number (C's bases) with an optional unit K (1 KiB), M (the scaled MiB) or C (a chunk); a leading -
 * negates the whole.
 */
static uint64_t arg(const struct step *st, int i, int64_t dflt)
{
	const char *p;
	uint64_t v = 0;
	char op = '+';
	bool neg;

	if (i >= st->n)
		return (uint64_t)dflt;
	p = st->w[i];
	neg = *p == '-';
	p += neg;
	for (;;) {
		uint64_t t = 0;
		char *end = NULL;

		for (size_t k = 0; k < sizeof(symbols) / sizeof(symbols[0]) && !end; k++) {
			size_t len = strlen(symbols[k].name);

			if (strncmp(p, symbols[k].name, len) == 0 && !isalnum((unsigned char)p[len])) {
				t = symbols[k].value;
				end = (char *)p + len;
			}
		}
		if (!end) {
			if (!isdigit((unsigned char)*p))
				bad_step(st, "a word is not a number");
			t = strtoull(p, &end, 0);
			if (*end == 'K' || *end == 'M' || *end == 'C')
				t *= *end == 'K' ? K : *end == 'M' ? M : CHUNK;
			end += *end == 'K' || *end == 'M' || *end == 'C';
		}
		v = op == '+' ? v + t : v | t;
		if (!*end)
			break;
		if (*end != '+' && *end != '|')
			bad_step(st, "a number has a stray character");
		op = *end;
		p = end + 1;
	}
	return neg ? -v : v;
}

static int conn_of(const struct step *st)
{
	return (int)arg(st, 1, 0);
}

static uint64_t seqno;

/* The request with the next seq and the body msg in its field FIELD (oneof case CASE), as a packet on conn. */
#define SEND(s, conn, field, CASE, msg)                             \
	do {                                                        \
		Request r_ = PINBROKER__V1__REQUEST__INIT;          \
		r_.has_seq = true;                                  \
		r_.seq = ++seqno;                                   \
		r_.body_case = PINBROKER__V1__REQUEST__BODY_##CASE; \
		r_.field = (msg);                                   \
		pkt((s), (conn), &r_);                              \
	} while (0)

/* hello CONN [VERSION=1] */
static void op_hello(struct seed *s, const struct step *st, int sub)
{
	Pinbroker__V1__Hello h = PINBROKER__V1__HELLO__INIT;

	(void)sub;
	h.version = (uint32_t)arg(st, 2, 1);
	h.client_name = (char *)"seed";
	SEND(s, conn_of(st), hello, HELLO, &h);
}

/* acquire CONN SIZE [FLAGS=0 [TIMEOUT_MS=0 [PRIORITY=-1, none]]]; 0 and -1 leave the field out. */
static void op_acquire(struct seed *s, const struct step *st, int sub)
{
	Pinbroker__V1__Acquire a = PINBROKER__V1__ACQUIRE__INIT;
	int prio = (int)arg(st, 5, -1);

	(void)sub;
	a.size = arg(st, 2, 0);
	a.flags = (uint32_t)arg(st, 3, 0);
	a.has_flags = a.flags != 0;
	a.timeout_ms = (uint32_t)arg(st, 4, 0);
	a.has_timeout_ms = a.timeout_ms != 0;
	a.has_priority = prio >= 0;
	a.priority = prio >= 0 ? (Pinbroker__V1__Priority)prio : 0;
	a.label = (char *)"seed-label";
	SEND(s, conn_of(st), acquire, ACQUIRE, &a);
}

/*
 * register_shared CONN SIZE INO OFFSET: a registration of [OFFSET, OFFSET + SIZE) of shared file INO
 * (Acquire.backing), charged once per page with others.
 */
static void op_register_shared(struct seed *s, const struct step *st, int sub)
{
	Pinbroker__V1__Acquire a = PINBROKER__V1__ACQUIRE__INIT;
	Pinbroker__V1__Backing bk = PINBROKER__V1__BACKING__INIT;

	(void)sub;
	a.size = arg(st, 2, 0);
	a.has_flags = true;
	a.flags = PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_REGISTER_ONLY |
		  PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_NO_REVOKE;
	a.label = (char *)"seed-shm";
	bk.dev = 0x2d;
	bk.ino = arg(st, 3, 0);
	bk.offset = arg(st, 4, 0);
	a.backing = &bk;
	SEND(s, conn_of(st), acquire, ACQUIRE, &a);
}

/* acquire_share CONN RESERVATION_ID SIZE: one share of a reservation. */
static void op_acquire_share(struct seed *s, const struct step *st, int sub)
{
	Pinbroker__V1__Acquire a = PINBROKER__V1__ACQUIRE__INIT;

	(void)sub;
	a.size = arg(st, 3, 0);
	a.has_reservation_id = true;
	a.reservation_id = arg(st, 2, 0);
	SEND(s, conn_of(st), acquire, ACQUIRE, &a);
}

/*
 * The requests that name one lease or reservation (word 2): release, set_idle (idle true), revoke_ack,
 * reservation_release (sub picks which).
 */
enum { ID_RELEASE, ID_SET_IDLE, ID_REVOKE_ACK, ID_RESERVATION_RELEASE };

static void op_by_id(struct seed *s, const struct step *st, int sub)
{
	Pinbroker__V1__Release rel = PINBROKER__V1__RELEASE__INIT;
	Pinbroker__V1__SetIdle idle = PINBROKER__V1__SET_IDLE__INIT;
	Pinbroker__V1__RevokeAck ack = PINBROKER__V1__REVOKE_ACK__INIT;
	Pinbroker__V1__ReservationRelease rr = PINBROKER__V1__RESERVATION_RELEASE__INIT;
	uint64_t id = arg(st, 2, 0);

	rel.lease_id = idle.lease_id = ack.lease_id = id;
	idle.idle = true;
	rr.reservation_id = id;
	if (sub == ID_RELEASE)
		SEND(s, conn_of(st), release, RELEASE, &rel);
	else if (sub == ID_SET_IDLE)
		SEND(s, conn_of(st), set_idle, SET_IDLE, &idle);
	else if (sub == ID_REVOKE_ACK)
		SEND(s, conn_of(st), revoke_ack, REVOKE_ACK, &ack);
	else
		SEND(s, conn_of(st), reservation_release, RESERVATION_RELEASE, &rr);
}

/* status CONN */
static void op_status(struct seed *s, const struct step *st, int sub)
{
	Pinbroker__V1__StatusRequest m = PINBROKER__V1__STATUS_REQUEST__INIT;

	(void)sub;
	SEND(s, conn_of(st), status, STATUS, &m);
}

/* admin_revoke CONN LEASE_ID UID ALL DEADLINE_MS; -1 (ids), 0 (all, deadline) leave the field out. */
static void op_admin_revoke(struct seed *s, const struct step *st, int sub)
{
	Pinbroker__V1__AdminRevoke m = PINBROKER__V1__ADMIN_REVOKE__INIT;
	int64_t id = (int64_t)arg(st, 2, -1), uid = (int64_t)arg(st, 3, -1);

	(void)sub;
	m.has_lease_id = id >= 0;
	m.lease_id = id >= 0 ? (uint64_t)id : 0;
	m.has_uid = uid >= 0;
	m.uid = uid >= 0 ? (uint32_t)uid : 0;
	m.all = arg(st, 4, 0) != 0;
	m.has_all = m.all;
	m.deadline_ms = (uint32_t)arg(st, 5, 0);
	m.has_deadline_ms = m.deadline_ms != 0;
	SEND(s, conn_of(st), admin_revoke, ADMIN_REVOKE, &m);
}

/* set_config CONN KEY VALUE */
static void op_set_config(struct seed *s, const struct step *st, int sub)
{
	Pinbroker__V1__SetConfig m = PINBROKER__V1__SET_CONFIG__INIT;

	(void)sub;
	if (st->n != 4)
		bad_step(st, "takes a connection, a key and a value");
	m.key = st->w[2];
	m.value = st->w[3];
	SEND(s, conn_of(st), set_config, SET_CONFIG, &m);
}

/* redeclare CONN: leases 1, 2, 3 and 1000. */
static void op_redeclare(struct seed *s, const struct step *st, int sub)
{
	Pinbroker__V1__Redeclare m = PINBROKER__V1__REDECLARE__INIT;
	uint64_t ids[] = { 1, 2, 3, 1000 };

	(void)sub;
	m.n_lease_ids = 4;
	m.lease_ids = ids;
	SEND(s, conn_of(st), redeclare, REDECLARE, &m);
}

/* report_staging CONN H2D_BYTES D2H_BYTES: cumulative counters, one copy each way per MiB. */
static void op_report_staging(struct seed *s, const struct step *st, int sub)
{
	Pinbroker__V1__ReportStaging m = PINBROKER__V1__REPORT_STAGING__INIT;

	(void)sub;
	m.has_h2d_bytes = m.has_d2h_bytes = m.has_h2d_copies = m.has_d2h_copies = true;
	m.h2d_bytes = arg(st, 2, 0);
	m.d2h_bytes = arg(st, 3, 0);
	m.h2d_copies = m.h2d_bytes >> 20;
	m.d2h_copies = m.d2h_bytes >> 20;
	m.has_busy_ns = true;
	m.busy_ns = m.h2d_bytes + m.d2h_bytes;
	SEND(s, conn_of(st), report_staging, REPORT_STAGING, &m);
}

/* headroom CONN FLAGS: a HEADROOM of these AcquireFlag bits. */
static void op_headroom(struct seed *s, const struct step *st, int sub)
{
	Pinbroker__V1__HeadroomRequest m = PINBROKER__V1__HEADROOM_REQUEST__INIT;

	(void)sub;
	m.has_flags = true;
	m.flags = (uint32_t)arg(st, 2, 0);
	SEND(s, conn_of(st), headroom, HEADROOM, &m);
}

/* reserve CONN NAME SHARES SHARE_BYTES [FLAGS=0]: flags (ACQUIRE_FLAG_WAIT) come with a 50 ms timeout. */
static void op_reserve(struct seed *s, const struct step *st, int sub)
{
	Pinbroker__V1__Reserve m = PINBROKER__V1__RESERVE__INIT;

	(void)sub;
	if (st->n < 5)
		bad_step(st, "takes a connection, a name, shares and share bytes");
	m.name = st->w[2];
	m.shares = (uint32_t)arg(st, 3, 0);
	m.share_bytes = arg(st, 4, 0);
	m.flags = (uint32_t)arg(st, 5, 0);
	m.has_flags = m.has_timeout_ms = m.flags != 0;
	m.timeout_ms = 50;
	SEND(s, conn_of(st), reserve, RESERVE, &m);
}

/* status_fds CONN KIND...: a STATUS without a seq carrying fds of these kinds (fdpath only). */
static void op_status_fds(struct seed *s, const struct step *st, int sub)
{
	Request r = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__StatusRequest m = PINBROKER__V1__STATUS_REQUEST__INIT;
	uint8_t kinds[12];

	(void)sub;
	for (int i = 2; i < st->n; i++)
		kinds[i - 2] = (uint8_t)arg(st, i, 0);
	r.body_case = PINBROKER__V1__REQUEST__BODY_STATUS;
	r.status = &m;
	pkt_fds(s, conn_of(st), &r, kinds, (size_t)(st->n - 2));
}

/* put BYTE...: raw bytes of the harness's input. */
static void op_put(struct seed *s, const struct step *st, int sub)
{
	(void)sub;
	for (int i = 1; i < st->n; i++)
		put(s, (uint8_t)arg(st, i, 0));
}

/* The harness's own ops (fuzz/harness.h): drain (4), state ST (5), loop_sleep (6, 3 ms), close_peer CONN (7). */
static void op_drain(struct seed *s, const struct step *st, int sub)
{
	(void)st;
	(void)sub;
	put(s, 4);
}

static void op_state(struct seed *s, const struct step *st, int sub)
{
	(void)sub;
	put(s, (uint8_t)(5 | (arg(st, 1, 0) << 3)));
}

static void op_loop_sleep(struct seed *s, const struct step *st, int sub)
{
	(void)st;
	(void)sub;
	put(s, 6 | 8);
	put(s, 4);
}

static void op_close_peer(struct seed *s, const struct step *st, int sub)
{
	(void)sub;
	put(s, (uint8_t)(7 | (conn_of(st) << 3)));
}

/*
 * Bulk ops (fz_bulk_op in fuzz/harness.h): op 3, connection bit 3, sub-op bits 4-5, argument bits 6-7; the bulk op's
 * own bytes follow.
 */
static void bulk(struct seed *s, int conn, int sub, int arg)
{
	put(s, (uint8_t)(3 | conn << 3 | sub << 4 | arg << 6));
}

/*
 * burst CONN N PAGES PRIORITY: N leases (up to 255, or a multiple of 1024 up to 16384) of 1 or 4 pages of 4 KiB,
 * priority 0 normal, 1 critical, 2 best-effort, 3 none.
 */
static void op_burst(struct seed *s, const struct step *st, int sub)
{
	uint64_t n = arg(st, 2, 0);

	(void)sub;
	bulk(s, conn_of(st), 0, 0);
	put(s, n <= 255 ? (uint8_t)(n - 1) : 0xff);
	put(s, (uint8_t)((arg(st, 3, 1) == 4 ? 0xf0 : 0) | arg(st, 4, 0)));
	if (n > 255)
		put(s, (uint8_t)(n / 1024 - 1));
}

/* sweep CONN KIND BASE N: KIND 0 RELEASE, 1 SET_IDLE, 2 REVOKE_ACK, 3 admin REVOKE of ids BASE .. BASE + N - 1. */
static void op_sweep(struct seed *s, const struct step *st, int sub)
{
	uint64_t base = arg(st, 3, 0);

	(void)sub;
	bulk(s, conn_of(st), 1, (int)arg(st, 2, 0));
	put(s, (uint8_t)(base & 0xff));
	put(s, (uint8_t)(base >> 8));
	put(s, (uint8_t)(arg(st, 4, 0) - 1));
}

/* release_seen CONN HOW: 0 forward, 1 reverse, 2 every other one, 3 SET_IDLE each. */
static void op_release_seen(struct seed *s, const struct step *st, int sub)
{
	(void)sub;
	bulk(s, conn_of(st), 2, (int)arg(st, 2, 0));
}

/* clock_jump TENS_OF_MS */
static void op_clock_jump(struct seed *s, const struct step *st, int sub)
{
	(void)sub;
	bulk(s, 0, 3, 0);
	put(s, (uint8_t)arg(st, 1, 0));
}

/*
 * Sharing across the two uids (bulk sub-op 3; sub 1 SHARE, 2 ATTACH, 3 let go) CONN K: SHARE the K-th seen lease, ATTACH
 * with the other's token, let go.
 */
static void op_sharing(struct seed *s, const struct step *st, int sub)
{
	bulk(s, conn_of(st), 3, sub);
	put(s, (uint8_t)arg(st, 2, 0));
}

static const struct op {
	const char *name;
	void (*fn)(struct seed *s, const struct step *st, int sub);
	int sub;
} ops[] = {
	{ "hello", op_hello, 0 },
	{ "acquire", op_acquire, 0 },
	{ "register_shared", op_register_shared, 0 },
	{ "acquire_share", op_acquire_share, 0 },
	{ "release", op_by_id, ID_RELEASE },
	{ "set_idle", op_by_id, ID_SET_IDLE },
	{ "revoke_ack", op_by_id, ID_REVOKE_ACK },
	{ "reservation_release", op_by_id, ID_RESERVATION_RELEASE },
	{ "status", op_status, 0 },
	{ "admin_revoke", op_admin_revoke, 0 },
	{ "set_config", op_set_config, 0 },
	{ "redeclare", op_redeclare, 0 },
	{ "report_staging", op_report_staging, 0 },
	{ "headroom", op_headroom, 0 },
	{ "reserve", op_reserve, 0 },
	{ "status_fds", op_status_fds, 0 },
	{ "put", op_put, 0 },
	{ "drain", op_drain, 0 },
	{ "state", op_state, 0 },
	{ "loop_sleep", op_loop_sleep, 0 },
	{ "close_peer", op_close_peer, 0 },
	{ "burst", op_burst, 0 },
	{ "sweep", op_sweep, 0 },
	{ "release_seen", op_release_seen, 0 },
	{ "clock_jump", op_clock_jump, 0 },
	{ "share", op_sharing, 1 },
	{ "attach", op_sharing, 2 },
	{ "let_go", op_sharing, 3 },
};

/* Which corpora a seed goes in. */
enum { BOTH, FDPATH_ONLY, SLOW };

/* The huge profile (flags): the many-leases flag and the magic in bits 3-7 (fuzz/harness.h). */
#define HUGE (0x04 | 0x58)

/*
 * The seeds: name, the input's flags byte (bit 0 and 1: the connections' uids; bit 2 the many-leases profile), where it
 * goes, and its steps, separated by ';'; "N * STEP" repeats a step N times.
 */
static const struct seed_row {
	const char *name;
	uint8_t flags;
	int where;
	const char *steps;
} seed_table[] = {
	{ "hello-status", 0, BOTH, "hello 0; status 0; drain" },
	{ "acquire-release", 0, BOTH, "hello 0; acquire 0 100K; drain; release 0 1; drain" },
	{ "wait-timeout", 0, BOTH,
	  "hello 0; acquire 0 5M 0 0 1; hello 1; acquire 1 4M WAIT 1 2; drain; loop_sleep; release 0 1; drain" },
	{ "wait-granted", 0, BOTH,
	  "hello 0; acquire 0 5M; hello 1; acquire 1 2M WAIT 500; release 0 1; drain; status 1; drain" },
	{ "idle-reclaim", 0, BOTH,
	  "hello 0; acquire 0 3M; set_idle 0 1; hello 1; acquire 1 6M; drain; release 0 1; revoke_ack 0 1; drain;"
	  "loop_sleep" },
	{ "admin-revoke-all", 1, BOTH,
	  "hello 0; acquire 0 1M; hello 1; acquire 1 1M; admin_revoke 0 -1 -1 1 1; drain; loop_sleep; loop_sleep;"
	  "status 0; drain" },
	{ "admin-revoke-by", 1, BOTH,
	  "hello 0; hello 1; acquire 1 200K; admin_revoke 0 1 -1 0 0; admin_revoke 0 -1 1001 0 0;"
	  "admin_revoke 0 77 -1 0 0; admin_revoke 0 -1 -1 0 0; drain" },
	{ "set-config", 1, BOTH,
	  "hello 0; set_config 0 budget 1M; set_config 0 max-pending-acquires 0; set_config 0 no-such-key 1;"
	  "set_config 0 chunk-size 4K; set_config 0 budget 100%; set_config 0 revoke-enforce sigterm; drain" },
	{ "set-config-denied", 0, BOTH, "hello 0; set_config 0 budget 1G; drain" },
	{ "redeclare", 0, BOTH, "hello 0; redeclare 0; drain" },
	{ "handshake-errors", 0, BOTH, "acquire 0 4096; hello 1 7; hello 0; hello 0; drain" },
	{ "invalid-values", 0, BOTH,
	  "hello 0; acquire 0 0; acquire 0 0x8000000000000000; acquire 0 MAX; acquire 0 7M; release 0 999; hello 1;"
	  "acquire 1 1C; release 0 1; revoke_ack 0 1; set_idle 0 1; revoke_ack 0 12345; drain" },
	{ "pressure", 0, BOTH,
	  "hello 0; hello 1; acquire 0 1M; state 1; acquire 1 2M; acquire 1 100K WAIT 50; state 2; drain; loop_sleep;"
	  "state 0; acquire 1 100K; drain" },
	{ "peer-gone", 0, BOTH,
	  "hello 0; acquire 0 1C; close_peer 0; acquire 0 1C; hello 1; acquire 1 1C; close_peer 1; status 1" },
	{ "max-leases", 0, BOTH, "hello 0; 18 * acquire 0 1C; drain; status 0; drain" },
	{ "max-pending", 0, BOTH, "hello 0; acquire 0 6M; 6 * acquire 0 1M WAIT 100; drain; release 0 1; drain" },
	/*
	 * The many-leases profile: hundreds of live leases, with lookups of ids around them (the table once broke when
	 * it grew past 64, 128 ... leases).
	 */
	{ "many-64", 4, BOTH, "hello 0; burst 0 64 1 0; status 0; drain; release_seen 0 0" },
	{ "many-200", 4, BOTH,
	  "hello 0; burst 0 200 1 1; hello 1; release 1 133; sweep 1 0 190 100; status 0; drain; release_seen 0 2;"
	  "release_seen 0 1; drain" },
	{ "many-revoke", 5, BOTH,
	  "hello 0; hello 1; burst 1 240 1 2; burst 0 32 4 3; admin_revoke 0 -1 1001 0 0; drain; release_seen 1 3;"
	  "loop_sleep; clock_jump 10; status 0; drain" },
	/*
	 * Shared leases across two uids: the attacher lets go, then the holder, who acquires again; the checks hold
	 * that no chunk the other uid mapped comes back. The same with both connections root (nothing tainted), with
	 * refused and forged attaches, and in bulk.
	 */
	{ "share-attach-let-go", 0, BOTH,
	  "hello 0; hello 1; acquire 0 3C+4K; drain; share 0 0; attach 1 0; drain; let_go 1 0xc0; status 0; drain" },
	{ "share-same-uid", 3, BOTH,
	  "hello 0; hello 1; acquire 0 3C+4K; drain; share 0 0x80; attach 1 0; drain; let_go 1 0xc0; drain" },
	{ "share-refused-forged-hangup", 0, BOTH,
	  "hello 0; hello 1; acquire 0 2C; drain; share 0 0x80; attach 1 0; share 0 0; attach 1 2; attach 1 0;"
	  "attach 1 0; drain; close_peer 1; release 0 1; acquire 0 2C; drain" },
	{ "many-share", 4, BOTH,
	  "hello 0; hello 1; burst 0 32 4 0; share 0 5; attach 1 0; share 0 9; attach 1 0; let_go 1 0x41;"
	  "release_seen 1 0; release_seen 0 1; burst 0 32 4 0; drain" },
	/* Fds of every kind beside a STATUS, and hand-made packets: with credentials, and oversize. */
	{ "status-with-memfd", 0, FDPATH_ONLY, "hello 0; status_fds 0 0; drain" },
	{ "status-with-mixed-fds", 0, FDPATH_ONLY,
	  "hello 0; status_fds 0 1 2 3 4 5 6 7; hello 1; status_fds 1 1 2 3; drain" },
	{ "credentials", 0, FDPATH_ONLY, "hello 0; acquire 0 1C; put 0 0x40 2 0x08 0x01; drain" },
	{ "oversize", 0, FDPATH_ONLY, "hello 0; put 0 0 0x84 0x01 0x08 0x01; drain" },
	/* Ranks of both connections registering one shared file, overlapping; the first lets go, the other closes. */
	{ "shared-registrations", 0, BOTH,
	  "hello 0; hello 1; register_shared 0 2M 7 0; register_shared 1 2M 7 0; register_shared 1 1M 7 1M+128K;"
	  "register_shared 0 1M 8 0; drain; release 0 1; drain; close_peer 1; drain" },
	/* A staging ring and its holder's reports: forward, then back (refused), then the holder goes. */
	{ "staging-ring-report", 0, BOTH,
	  "hello 0; hello 1; acquire 0 1M STAGING_RING 0 0; drain; report_staging 0 64M 16M;"
	  "report_staging 0 128M 16M; report_staging 0 32M 16M; report_staging 1 8M 0; drain; status 1; drain;"
	  "close_peer 0; drain; status 1; drain" },
	/* Headroom asked before and after an acquire, for each kind of lease, and before a HELLO (refused). */
	{ "headroom", 0, BOTH,
	  "headroom 1 0; hello 0; headroom 0 0; acquire 0 1M 0 0 0; drain; headroom 0 NO_REVOKE;"
	  "headroom 0 REGISTER_ONLY|0x80000000; drain" },
	/*
	 * Two ranks of one group: reserve and join, a share each, one over a share, a ninth; a waiting reserve of
	 * another name; one rank releases, the other closes.
	 */
	{ "reservation-group", 0, BOTH,
	  "hello 0; hello 1; reserve 0 grp 2 2M; reserve 1 grp 2 2M; reserve 1 grp 3 2M; drain;"
	  "acquire_share 0 1 2M; acquire_share 1 1 2M+1; acquire_share 1 1 1M; acquire_share 1 1 1M;"
	  "reserve 1 big 64 64M WAIT; drain; status 1; drain; release 0 1; reservation_release 0 1; drain;"
	  "reserve 0 late 4 1M; drain; close_peer 0; drain; status 1; drain" },
	/*
	 * Seeds too slow to fuzz from (a quarter of a second each: at that price they would take most of the run),
	 * replayed by run-ci.sh and ctest instead: 10,240 live leases of one connection, probed and released in reverse.
	 */
	{ "many-10k", HUGE, SLOW, "hello 0; burst 0 10240 1 0; drain; sweep 0 0 10200 100; release_seen 0 1" },
	{ "many-16k-two-conns", HUGE, SLOW,
	  "hello 0; hello 1; burst 0 8192 1 3; burst 1 8192 1 2; sweep 1 0 8000 256; sweep 0 3 16300 100;"
	  "release_seen 0 2; drain" },
};

/* Runs one step ("[N *] NAME WORD...") onto the seed. */
static void run_step(struct seed *s, char *text)
{
	struct step st = { .n = 0 };
	char *save = NULL;
	unsigned long times = 1;

	for (char *w = strtok_r(text, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
		if (st.n == (int)(sizeof(st.w) / sizeof(st.w[0])))
			bad_step(&st, "too many words");
		st.w[st.n++] = w;
	}
	if (st.n >= 3 && strcmp(st.w[1], "*") == 0) {
		times = strtoul(st.w[0], NULL, 10);
		memmove(st.w, st.w + 2, sizeof(st.w[0]) * (size_t)(st.n - 2));
		st.n -= 2;
	}
	if (st.n == 0) {
		fprintf(stderr, "gen_corpus: an empty step\n");
		exit(2);
	}
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		if (strcmp(ops[i].name, st.w[0]) == 0) {
			while (times--)
				ops[i].fn(s, &st, ops[i].sub);
			return;
		}
	}
	bad_step(&st, "no such step");
}

static void write_seed(const char *outdir, const struct seed_row *row, bool fdpath)
{
	static struct seed s;
	char steps[1024], path[512];
	char *save = NULL;
	FILE *f;

	memset(&s, 0, sizeof(s));
	s.fdpath = fdpath;
	put(&s, row->flags);
	seqno = 0;
	if (strlen(row->steps) >= sizeof(steps)) {
		fprintf(stderr, "gen_corpus: %s: too many steps\n", row->name);
		exit(2);
	}
	strcpy(steps, row->steps);
	for (char *t = strtok_r(steps, ";", &save); t; t = strtok_r(NULL, ";", &save))
		run_step(&s, t);
	snprintf(path, sizeof(path), "%s/%s", outdir, row->name);
	f = fopen(path, "wb");
	if (!f || fwrite(s.buf, 1, s.n, f) != s.n || fclose(f) != 0) {
		perror(path);
		exit(1);
	}
}

int main(int argc, char **argv)
{
	bool slow, fdpath;

	if (argc != 3) {
		fprintf(stderr, "usage: %s request|fdpath|request-slow|fdpath-slow OUTDIR\n", argv[0]);
		return 2;
	}
	if (mkdir(argv[2], 0755) < 0 && errno != EEXIST) {
		perror(argv[2]);
		return 1;
	}
	slow = strstr(argv[1], "-slow") != NULL;
	fdpath = slow ? strncmp(argv[1], "fdpath", 6) == 0 : strcmp(argv[1], "fdpath") == 0;
	for (size_t i = 0; i < sizeof(seed_table) / sizeof(seed_table[0]); i++) {
		const struct seed_row *row = &seed_table[i];

		if ((row->where == SLOW) == slow && (row->where != FDPATH_ONLY || fdpath))
			write_seed(argv[2], row, fdpath);
	}
	return 0;
}

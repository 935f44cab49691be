/* SPDX-License-Identifier: MIT */
/* check_client's scripted stand-in daemon: a forked process serving one socket as each test configures it. */
#pragma once

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pinbroker.h"
#include "pinbroker.pb-c.h"
#include "util.h"
#include "wire.h"
#include "check_main.h"
#include "wirefix.h"

typedef Pinbroker__V1__Request Request;
typedef Pinbroker__V1__Reply Reply;

#define MOCK_PAGE_BYTES 4096
#define MOCK_MAX_LEASES 64
#define MOCK_MAX_EVENTS 256

/* What the stand-in daemon does; each test picks. */
struct mock_cfg {
	uint64_t chunk_bytes;    /* leases are cut into chunks of this size */
	size_t fds_per_packet;   /* < chunks forces LeaseFds packets */
	uint64_t quota_bytes;    /* bigger acquires get OVER_QUOTA */
	bool version_mismatch;   /* answer HELLO with VERSION_MISMATCH */
	bool revoke_on_grant;    /* revoke each lease before its last fd packet: the grant/revoke race, made certain */
	bool revoke_after_grant; /* revoke each lease right after its last packet, the caller's read done */
	uint64_t instance_id;    /* sent in HELLO when not 0 */
	bool restart_per_conn;   /* each connection is a new daemon instance: new instance id, ids from 1 again */
	bool keep_leases;        /* leases outlive a connection (a restart that kept the fd store) */
};

struct mock_lease {
	uint64_t id;
	int fd0; /* the first chunk, to read back what the client wrote */
};

/* The stand-in's memory: leases alive and a log the tests read through STATUS transitions. */
static struct mock_lease mock_leases[MOCK_MAX_LEASES];
static char *mock_events[MOCK_MAX_EVENTS];
static size_t mock_nevents;
static uint64_t mock_next_id = 1;

static char sock_path[108];
static pid_t mock_pid;
static uint64_t mock_instance; /* of the connection being served */

__attribute__((format(printf, 1, 2))) static void mock_event(const char *fmt, ...)
{
	va_list ap;
	char *s;

	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) < 0)
		abort();
	va_end(ap);
	if (mock_nevents < MOCK_MAX_EVENTS)
		mock_events[mock_nevents++] = s;
	else
		free(s);
}

static void mock_send(int s, Reply *rep, const int *fds, size_t nfds)
{
	size_t len = pinbroker__v1__reply__get_packed_size(rep);
	uint8_t *buf = malloc(len);

	pinbroker__v1__reply__pack(rep, buf);
	/* A client that hung up is not an error: its next read shows EOF. */
	wire_send(s, buf, len, fds, nfds);
	free(buf);
}

static void mock_status(int s, uint64_t seq, Pinbroker__V1__StatusCode st, const char *msg)
{
	Reply rep = PINBROKER__V1__REPLY__INIT;

	rep.has_seq = 1;
	rep.seq = seq;
	rep.status = st;
	rep.message = (char *)msg;
	mock_send(s, &rep, NULL, 0);
}

/* An OK reply to seq with body (its oneof case kind) and nfds fds. */
static void mock_reply(int s, uint64_t seq, uint32_t kind, ProtobufCMessage *body, const int *fds, size_t nfds)
{
	Reply rep = PINBROKER__V1__REPLY__INIT;

	rep.has_seq = 1;
	rep.seq = seq;
	wirefix_set_oneof(&rep.base, kind, body);
	mock_send(s, &rep, fds, nfds);
}

static void mock_revoke(int s, uint64_t id)
{
	Pinbroker__V1__Revoke rv = PINBROKER__V1__REVOKE__INIT;
	Reply rep = PINBROKER__V1__REPLY__INIT;

	rv.lease_id = id;
	rv.deadline_ms = 5000;
	rep.body_case = PINBROKER__V1__REPLY__BODY_REVOKE;
	rep.revoke = &rv;
	mock_send(s, &rep, NULL, 0);
}

/*
 * rep (with its fds), then a REVOKE of lease id, queued by one sendmmsg: the REVOKE is in the socket microseconds
 * after the reply, long before a client that read the reply has mapped the lease.
 */
static void mock_send_then_revoke(int s, Reply *rep, const int *fds, size_t nfds, uint64_t id)
{
	Pinbroker__V1__Revoke rv = PINBROKER__V1__REVOKE__INIT;
	Reply rrep = PINBROKER__V1__REPLY__INIT;
	union {
		char buf[CMSG_SPACE(sizeof(int) * PB_MAX_FDS_PER_MSG)];
		struct cmsghdr align;
	} control;
	struct mmsghdr mm[2];
	struct iovec iov[2];
	uint8_t *bufs[2];
	Reply *reps[2] = { rep, &rrep };

	rv.lease_id = id;
	rv.deadline_ms = 5000;
	rrep.body_case = PINBROKER__V1__REPLY__BODY_REVOKE;
	rrep.revoke = &rv;
	memset(mm, 0, sizeof(mm));
	memset(&control, 0, sizeof(control));
	for (int i = 0; i < 2; i++) {
		size_t len = pinbroker__v1__reply__get_packed_size(reps[i]);

		bufs[i] = malloc(len);
		pinbroker__v1__reply__pack(reps[i], bufs[i]);
		iov[i] = (struct iovec){ .iov_base = bufs[i], .iov_len = len };
		mm[i].msg_hdr.msg_iov = &iov[i];
		mm[i].msg_hdr.msg_iovlen = 1;
	}
	if (nfds > 0) {
		struct cmsghdr *cm;

		mm[0].msg_hdr.msg_control = control.buf;
		mm[0].msg_hdr.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		cm = CMSG_FIRSTHDR(&mm[0].msg_hdr);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
	}
	/* A client that hung up is not an error: its next read shows EOF. */
	(void)sendmmsg(s, mm, 2, MSG_NOSIGNAL);
	free(bufs[0]);
	free(bufs[1]);
}

static struct mock_lease *mock_find(uint64_t id)
{
	for (size_t i = 0; i < MOCK_MAX_LEASES; i++)
		if (mock_leases[i].id == id)
			return &mock_leases[i];
	return NULL;
}

static void mock_acquire(int s, const struct mock_cfg *cfg, uint64_t seq, const Pinbroker__V1__Acquire *a)
{
	Pinbroker__V1__Lease ls = PINBROKER__V1__LEASE__INIT;
	uint64_t size = round_up(a->size, MOCK_PAGE_BYTES), left = size;
	size_t n = (size_t)((size + cfg->chunk_bytes - 1) / cfg->chunk_bytes), sent;
	uint64_t *chunks = calloc(n, sizeof(*chunks));
	int *fds = calloc(n, sizeof(*fds));
	struct mock_lease *ml = mock_find(0);

	if (a->size > cfg->quota_bytes) {
		mock_status(s, seq, PINBROKER__V1__STATUS_CODE__STATUS_OVER_QUOTA, "uid 1000 would exceed its quota");
		free(chunks);
		free(fds);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		chunks[i] = left < cfg->chunk_bytes ? left : cfg->chunk_bytes;
		left -= chunks[i];
		fds[i] = memfd_create("mock-chunk", MFD_CLOEXEC);
		if (fds[i] < 0 || ftruncate(fds[i], (off_t)chunks[i]) < 0)
			_exit(4);
	}
	ml->id = mock_next_id++;
	ml->fd0 = dup(fds[0]);
	mock_event("acquire %llu %llu %s", (unsigned long long)ml->id, (unsigned long long)a->size,
		   a->label ? a->label : "");
	ls.lease_id = ml->id;
	ls.size = size;
	ls.page_size = MOCK_PAGE_BYTES;
	ls.n_chunk_bytes = n;
	ls.chunk_bytes = chunks;
	ls.fds_in_reply = (uint32_t)(n < cfg->fds_per_packet ? n : cfg->fds_per_packet);
	mock_reply(s, seq, PINBROKER__V1__REPLY__BODY_LEASE, &ls.base, fds, ls.fds_in_reply);
	for (sent = ls.fds_in_reply; sent < n;) {
		Pinbroker__V1__LeaseFds lf = PINBROKER__V1__LEASE_FDS__INIT;
		Reply more = PINBROKER__V1__REPLY__INIT;
		size_t k = n - sent < cfg->fds_per_packet ? n - sent : cfg->fds_per_packet;

		lf.lease_id = ml->id;
		lf.first_index = (uint32_t)sent;
		lf.count = (uint32_t)k;
		more.has_seq = 1;
		more.seq = seq;
		more.body_case = PINBROKER__V1__REPLY__BODY_LEASE_FDS;
		more.lease_fds = &lf;
		if (cfg->revoke_on_grant && sent + k == n)
			mock_revoke(s, ml->id);
		if (cfg->revoke_after_grant && sent + k == n)
			mock_send_then_revoke(s, &more, fds + sent, k, ml->id);
		else
			mock_send(s, &more, fds + sent, k);
		sent += k;
	}
	wire_close_fds(fds, n);
	free(fds);
	free(chunks);
}

static void mock_status_reply(int s, uint64_t seq)
{
	Pinbroker__V1__StatusReply sr = PINBROKER__V1__STATUS_REPLY__INIT;
	Pinbroker__V1__SignalInfo sg = PINBROKER__V1__SIGNAL_INFO__INIT, *sgs[] = { &sg };
	Pinbroker__V1__EventInfo *evs = calloc(mock_nevents + 1, sizeof(*evs));
	Pinbroker__V1__EventInfo **pevs = calloc(mock_nevents + 1, sizeof(*pevs));

	for (size_t i = 0; i < mock_nevents; i++) {
		pinbroker__v1__event_info__init(&evs[i]);
		evs[i].text = mock_events[i];
		pevs[i] = &evs[i];
	}
	sg.name = (char *)"mem_available";
	sg.value = 42.5;
	sg.has_critical = 1;
	sg.critical = 5;
	sg.unit = (char *)"%";
	sr.schema_version = 1;
	sr.server_version = (char *)"mock";
	sr.budget_bytes = 1u << 30;
	sr.page_size_bytes = MOCK_PAGE_BYTES;
	sr.n_signals = 1;
	sr.signals = sgs;
	sr.n_transitions = mock_nevents;
	sr.transitions = pevs;
	mock_reply(s, seq, PINBROKER__V1__REPLY__BODY_STATUS_REPLY, &sr.base, NULL, 0);
	free(pevs);
	free(evs);
}

/* Returns false when the client should be hung up on. */
static bool mock_handle(int s, const struct mock_cfg *cfg, const Request *req)
{
	uint64_t seq = req->seq;
	struct mock_lease *ml;

	switch (req->body_case) {
	case PINBROKER__V1__REQUEST__BODY_HELLO: {
		Pinbroker__V1__HelloReply hr = PINBROKER__V1__HELLO_REPLY__INIT;

		if (cfg->version_mismatch) {
			mock_status(s, seq, PINBROKER__V1__STATUS_CODE__STATUS_VERSION_MISMATCH,
				    "pinbrokerd 9.0 speaks protocol 9 only");
			return false;
		}
		mock_event("hello %s", req->hello->client_name ? req->hello->client_name : "");
		hr.version = PB_PROTOCOL_VERSION;
		hr.has_page_size = 1;
		hr.page_size = MOCK_PAGE_BYTES;
		hr.has_instance_id = mock_instance != 0;
		hr.instance_id = mock_instance;
		mock_reply(s, seq, PINBROKER__V1__REPLY__BODY_HELLO, &hr.base, NULL, 0);
		return true;
	}
	case PINBROKER__V1__REQUEST__BODY_ACQUIRE:
		mock_acquire(s, cfg, seq, req->acquire);
		return true;
	case PINBROKER__V1__REQUEST__BODY_RELEASE:
		ml = mock_find(req->release->lease_id);
		if (!ml) {
			mock_event("release-unknown %llu", (unsigned long long)req->release->lease_id);
			mock_status(s, seq, PINBROKER__V1__STATUS_CODE__STATUS_UNKNOWN_LEASE, "no such lease");
			return true;
		}
		{
			char first = 0;

			if (pread(ml->fd0, &first, 1, 0) != 1)
				first = '?';
			mock_event("release %llu first=%d", (unsigned long long)ml->id, first);
		}
		close(ml->fd0);
		ml->id = 0;
		mock_status(s, seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
		return true;
	case PINBROKER__V1__REQUEST__BODY_SET_IDLE:
		mock_event("idle %llu %d", (unsigned long long)req->set_idle->lease_id, req->set_idle->idle);
		mock_status(s, seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
		return true;
	case PINBROKER__V1__REQUEST__BODY_REVOKE_ACK:
		mock_event("ack %llu", (unsigned long long)req->revoke_ack->lease_id);
		mock_status(s, seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
		return true;
	case PINBROKER__V1__REQUEST__BODY_STATUS:
		mock_status_reply(s, seq);
		return true;
	case PINBROKER__V1__REQUEST__BODY_ADMIN_REVOKE: {
		Pinbroker__V1__AdminRevokeReply arr = PINBROKER__V1__ADMIN_REVOKE_REPLY__INIT;
		uint64_t ids[MOCK_MAX_LEASES];

		for (size_t i = 0; i < MOCK_MAX_LEASES; i++)
			if (mock_leases[i].id)
				ids[arr.n_lease_ids++] = mock_leases[i].id;
		arr.lease_ids = ids;
		mock_reply(s, seq, PINBROKER__V1__REPLY__BODY_ADMIN_REVOKE, &arr.base, NULL, 0);
		for (size_t i = 0; i < arr.n_lease_ids; i++)
			mock_revoke(s, ids[i]);
		return true;
	}
	case PINBROKER__V1__REQUEST__BODY_REDECLARE: {
		Pinbroker__V1__RedeclareReply rr = PINBROKER__V1__REDECLARE_REPLY__INIT;
		const Pinbroker__V1__Redeclare *rd = req->redeclare;
		uint64_t ok[MOCK_MAX_LEASES], bad[MOCK_MAX_LEASES];
		char line[512];
		size_t at;

		at = (size_t)snprintf(line, sizeof(line), "redeclare");
		for (size_t i = 0; i < rd->n_lease_ids && i < MOCK_MAX_LEASES; i++) {
			/* Only the instance that granted an id may take it back. */
			bool mine = mock_find(rd->lease_ids[i]) && rd->has_instance_id &&
				    rd->instance_id == mock_instance;

			if (mine)
				ok[rr.n_adopted++] = rd->lease_ids[i];
			else
				bad[rr.n_rejected++] = rd->lease_ids[i];
			at += (size_t)snprintf(line + at, sizeof(line) - at, " %llu%s",
					       (unsigned long long)rd->lease_ids[i], mine ? "" : "!");
		}
		mock_event("%s", line);
		rr.adopted = ok;
		rr.rejected = bad;
		mock_reply(s, seq, PINBROKER__V1__REPLY__BODY_REDECLARE, &rr.base, NULL, 0);
		return true;
	}
	case PINBROKER__V1__REQUEST__BODY_SET_CONFIG:
		/* Test hooks: "drop" hangs up mid-conversation, "deny" refuses like a non-admin caller,
		 * "forget" drops a lease as a restarted daemon that lost it would. */
		if (strcmp(req->set_config->key, "drop") == 0)
			return false;
		if (strcmp(req->set_config->key, "forget") == 0) {
			ml = mock_find(strtoull(req->set_config->value, NULL, 10));
			if (ml) {
				close(ml->fd0);
				ml->id = 0;
			}
			mock_status(s, seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
			return true;
		}
		if (strcmp(req->set_config->key, "deny") == 0) {
			mock_status(s, seq, PINBROKER__V1__STATUS_CODE__STATUS_PERMISSION_DENIED,
				    "set needs uid 0 or group pinbroker-admin");
			return true;
		}
		mock_event("set %s=%s", req->set_config->key, req->set_config->value);
		mock_status(s, seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
		return true;
	default:
		mock_status(s, seq, PINBROKER__V1__STATUS_CODE__STATUS_BAD_REQUEST, "unexpected request");
		return true;
	}
}

static void mock_serve(int lsock, const struct mock_cfg *cfg)
{
	uint8_t *buf = malloc(PB_MAX_MSG_BYTES);
	unsigned nconn = 0;

	mock_instance = cfg->instance_id;
	for (;;) {
		int s = accept4(lsock, NULL, NULL, SOCK_CLOEXEC), fds[PB_MAX_FDS_PER_MSG];
		bool alive = true;
		size_t nfds;

		if (s < 0)
			_exit(2);
		if (cfg->restart_per_conn && nconn++ > 0) {
			/* A daemon that started clean: another instance, and its ids start at 1 again. */
			mock_instance++;
			mock_next_id = 1;
		}
		while (alive) {
			ssize_t n = wire_recv(s, buf, PB_MAX_MSG_BYTES, fds, PB_MAX_FDS_PER_MSG, &nfds);
			Request *req;

			if (n <= 0)
				break;
			wire_close_fds(fds, nfds);
			req = pinbroker__v1__request__unpack(NULL, (size_t)n, buf);
			if (!req)
				break;
			alive = mock_handle(s, cfg, req);
			pinbroker__v1__request__free_unpacked(req, NULL);
		}
		close(s);
		for (size_t i = 0; !cfg->keep_leases && i < MOCK_MAX_LEASES; i++)
			if (mock_leases[i].id) {
				mock_event("closed-with %llu", (unsigned long long)mock_leases[i].id);
				close(mock_leases[i].fd0);
				mock_leases[i].id = 0;
			}
	}
}

/* Fork the stand-in daemon before any library thread exists. */
static void mock_start(const struct mock_cfg *cfg)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int lsock;

	snprintf(sock_path, sizeof(sock_path), "/tmp/check_client.%d.sock", (int)getpid());
	unlink(sock_path);
	memcpy(sa.sun_path, sock_path, strlen(sock_path) + 1);
	lsock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(lsock, 0);
	ck_assert_int_eq(bind(lsock, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(lsock, 8), 0);
	mock_pid = fork();
	ck_assert_int_ge(mock_pid, 0);
	if (mock_pid == 0) {
		/* Never outlive the test, even one that failed before mock_stop(). */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		mock_serve(lsock, cfg);
		_exit(0);
	}
	close(lsock);
}

static void mock_stop(void)
{
	if (mock_pid > 0) {
		kill(mock_pid, SIGKILL);
		waitpid(mock_pid, NULL, 0);
		mock_pid = 0;
	}
	unlink(sock_path);
}

static const struct mock_cfg default_cfg = {
	.chunk_bytes = 64 * 1024,
	.fds_per_packet = 7,
	.quota_bytes = 64u << 20,
};

static pb_client *connect_mock(const struct mock_cfg *cfg)
{
	pb_client *c = NULL;

	mock_start(cfg);
	ck_assert_msg(pb_connect(sock_path, &c) == 0, "pb_connect: %s", pb_last_error());
	return c;
}

/* The client's end and the stand-in's. */
static void disconnect_mock(pb_client *c)
{
	pb_disconnect(c);
	mock_stop();
}

/* The stand-in logs what it saw; async requests land a moment later, so poll for the line. */
static bool mock_saw(pb_client *c, const char *line)
{
	for (int tries = 0; tries < 200; tries++) {
		struct pb_status *s;
		bool found = false;

		ck_assert_int_eq(pb_status_get(c, &s), 0);
		for (size_t i = 0; i < s->n_transitions; i++)
			found |= strcmp(s->transitions[i].text, line) == 0;
		pb_status_free(s);
		if (found)
			return true;
		usleep(5000);
	}
	return false;
}

/* Whether the stand-in has logged a line starting with prefix by now (no waiting: for what must not happen). */
static bool mock_saw_prefix_now(pb_client *c, const char *prefix)
{
	struct pb_status *s;
	bool found = false;

	ck_assert_int_eq(pb_status_get(c, &s), 0);
	for (size_t i = 0; i < s->n_transitions; i++)
		found |= strncmp(s->transitions[i].text, prefix, strlen(prefix)) == 0;
	pb_status_free(s);
	return found;
}

/* ---------------------------------------------------------------- tests */

/* SPDX-License-Identifier: MIT */
/* Check suite for the wire protocol: every message kind round-trips over a SOCK_SEQPACKET socketpair, with and without fds. */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pinbroker.pb-c.h"
#include "wire.h"
#include "check_main.h"
#include "fdlimit.h"
#include "wirefix.h"

/* The kernel's per-message limit (SCM_MAX_FD): one more than wire_recv makes room for. */
#define KERNEL_SCM_MAX_FD 253

static int sv[2];

static void pair_setup(void)
{
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

static void pair_teardown(void)
{
	if (sv[0] >= 0)
		close(sv[0]);
	if (sv[1] >= 0)
		close(sv[1]);
}

/* A memfd holding text, to prove a received fd is the same file. */
static int memfd_with(const char *text)
{
	int fd = memfd_create("check_wire", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	return fd;
}

static void assert_fd_holds(int fd, const char *text)
{
	size_t n = strlen(text);
	char *p;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	p = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(p, MAP_FAILED);
	ck_assert_int_eq(memcmp(p, text, n), 0);
	munmap(p, n);
}

/*
 * Send packed bytes with nfds memfds, receive them on the other end, and
 * return the received bytes (malloc'd) after checking the fds came through.
 */
static uint8_t *transfer(const uint8_t *buf, size_t len, size_t nfds, size_t *got_len)
{
	int out[PB_MAX_FDS_PER_MSG], in[PB_MAX_FDS_PER_MSG];
	uint8_t *rx = malloc(PB_MAX_MSG_BYTES);
	size_t got_fds = 99;
	ssize_t n;

	ck_assert_ptr_nonnull(rx);
	for (size_t i = 0; i < nfds; i++)
		out[i] = memfd_with("chunk payload");
	ck_assert_int_eq(wire_send(sv[0], buf, len, out, nfds), 0);
	wire_close_fds(out, nfds);
	n = wire_recv(sv[1], rx, PB_MAX_MSG_BYTES, in, PB_MAX_FDS_PER_MSG, &got_fds);
	ck_assert_int_eq(n, (ssize_t)len);
	ck_assert_uint_eq(got_fds, nfds);
	for (size_t i = 0; i < got_fds; i++)
		assert_fd_holds(in[i], "chunk payload");
	wire_close_fds(in, got_fds);
	*got_len = (size_t)n;
	return rx;
}

/*
 * Sends m packed with nfds memfds and unpacks what arrived, for the caller to check and free. Re-packed, it must be
 * the same bytes: protobuf-c packs fields in a fixed order, so equal bytes mean an exact round trip.
 */
static ProtobufCMessage *roundtrip(const ProtobufCMessage *m, size_t nfds)
{
	size_t len = protobuf_c_message_get_packed_size(m), got;
	uint8_t *buf = malloc(len ? len : 1), *rx, *again;
	ProtobufCMessage *back;

	protobuf_c_message_pack(m, buf);
	rx = transfer(buf, len, nfds, &got);
	back = protobuf_c_message_unpack(m->descriptor, NULL, got, rx);
	ck_assert_ptr_nonnull(back);
	ck_assert_uint_eq(protobuf_c_message_get_packed_size(back), len);
	again = malloc(len ? len : 1);
	protobuf_c_message_pack(back, again);
	ck_assert_int_eq(memcmp(again, buf, len), 0);
	free(again);
	free(rx);
	free(buf);
	return back;
}

static void roundtrip_request(const Pinbroker__V1__Request *req, size_t nfds)
{
	Pinbroker__V1__Request *back = (Pinbroker__V1__Request *)roundtrip(&req->base, nfds);

	ck_assert_int_eq(back->body_case, req->body_case);
	ck_assert_uint_eq(back->seq, req->seq);
	pinbroker__v1__request__free_unpacked(back, NULL);
}

static void roundtrip_reply(const Pinbroker__V1__Reply *rep, size_t nfds)
{
	Pinbroker__V1__Reply *back = (Pinbroker__V1__Reply *)roundtrip(&rep->base, nfds);

	ck_assert_int_eq(back->body_case, rep->body_case);
	ck_assert_int_eq(back->status, rep->status);
	ck_assert_uint_eq(back->seq, rep->seq);
	pinbroker__v1__reply__free_unpacked(back, NULL);
}

/* A body of a message's oneof: its case (protobuf-c numbers a oneof's cases by their fields) and the message. */
struct body {
	uint32_t kind;
	ProtobufCMessage *msg;
};

static void set_body(ProtobufCMessage *msg, const struct body *body)
{
	wirefix_set_oneof(msg, body->kind, body->msg);
}

/* Every Request body kind, each sent once bare and once carrying an fd. */
START_TEST(test_every_request_kind_round_trips)
{
	Pinbroker__V1__Hello hello = PINBROKER__V1__HELLO__INIT;
	Pinbroker__V1__Acquire acq = PINBROKER__V1__ACQUIRE__INIT;
	Pinbroker__V1__Release rel = PINBROKER__V1__RELEASE__INIT;
	Pinbroker__V1__StatusRequest st = PINBROKER__V1__STATUS_REQUEST__INIT;
	Pinbroker__V1__AdminRevoke ar = PINBROKER__V1__ADMIN_REVOKE__INIT;
	Pinbroker__V1__SetConfig sc = PINBROKER__V1__SET_CONFIG__INIT;
	Pinbroker__V1__RevokeAck ack = PINBROKER__V1__REVOKE_ACK__INIT;
	Pinbroker__V1__SetIdle si = PINBROKER__V1__SET_IDLE__INIT;
	Pinbroker__V1__Redeclare rd = PINBROKER__V1__REDECLARE__INIT;
	Pinbroker__V1__Share sh = PINBROKER__V1__SHARE__INIT;
	Pinbroker__V1__Attach at = PINBROKER__V1__ATTACH__INIT;
	uint32_t share_uids[] = { 1001, 4294967294u };
	uint64_t ids[] = { 3, 7, 1ull << 40 };
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;

	hello.version = PB_PROTOCOL_VERSION;
	hello.client_name = (char *)"trainer \"quoted\" \xc3\xa9";
	acq.size = 3ull << 30;
	acq.has_flags = 1;
	acq.flags = PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_WAIT;
	acq.has_timeout_ms = 1;
	acq.timeout_ms = 2500;
	acq.has_priority = 1;
	acq.priority = PINBROKER__V1__PRIORITY__PRIORITY_BEST_EFFORT;
	acq.label = (char *)"kv-offload";
	rel.lease_id = 42;
	st.has_include_leases = 1;
	st.include_leases = 0;
	ar.has_uid = 1;
	ar.uid = 1000;
	ar.has_deadline_ms = 1;
	ar.deadline_ms = 5000;
	sc.key = (char *)"budget";
	sc.value = (char *)"8G";
	ack.lease_id = 43;
	si.lease_id = 44;
	si.idle = 1;
	rd.n_lease_ids = 3;
	rd.lease_ids = ids;
	sh.lease_id = 45;
	sh.n_uids = 2;
	sh.uids = share_uids;
	at.token = (char *)"0123456789abcdef0123456789abcdef";

	const struct body bodies[] = {
		{ PINBROKER__V1__REQUEST__BODY_HELLO, &hello.base },
		{ PINBROKER__V1__REQUEST__BODY_ACQUIRE, &acq.base },
		{ PINBROKER__V1__REQUEST__BODY_RELEASE, &rel.base },
		{ PINBROKER__V1__REQUEST__BODY_STATUS, &st.base },
		{ PINBROKER__V1__REQUEST__BODY_ADMIN_REVOKE, &ar.base },
		{ PINBROKER__V1__REQUEST__BODY_SET_CONFIG, &sc.base },
		{ PINBROKER__V1__REQUEST__BODY_REVOKE_ACK, &ack.base },
		{ PINBROKER__V1__REQUEST__BODY_SET_IDLE, &si.base },
		{ PINBROKER__V1__REQUEST__BODY_REDECLARE, &rd.base },
		{ PINBROKER__V1__REQUEST__BODY_SHARE, &sh.base },
		{ PINBROKER__V1__REQUEST__BODY_ATTACH, &at.base },
	};

	for (size_t nfds = 0; nfds <= 1; nfds++) {
		req.has_seq = 1;
		req.seq = 100 + nfds;
		for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
			set_body(&req.base, &bodies[i]);
			roundtrip_request(&req, nfds);
		}
		/* A request with no body at all is well-formed on the wire; the daemon's gate rejects it. */
		req.body_case = PINBROKER__V1__REQUEST__BODY__NOT_SET;
		roundtrip_request(&req, nfds);
	}
}
END_TEST

START_TEST(test_every_reply_kind_round_trips)
{
	Pinbroker__V1__HelloReply hr = PINBROKER__V1__HELLO_REPLY__INIT;
	Pinbroker__V1__Lease lease = PINBROKER__V1__LEASE__INIT;
	Pinbroker__V1__StatusReply sr = PINBROKER__V1__STATUS_REPLY__INIT;
	Pinbroker__V1__ClientInfo ci = PINBROKER__V1__CLIENT_INFO__INIT, *cis[] = { &ci };
	Pinbroker__V1__LeaseInfo li = PINBROKER__V1__LEASE_INFO__INIT, *lis[] = { &li };
	Pinbroker__V1__SignalInfo sg = PINBROKER__V1__SIGNAL_INFO__INIT, *sgs[] = { &sg };
	Pinbroker__V1__EventInfo ev = PINBROKER__V1__EVENT_INFO__INIT, *evs[] = { &ev, &ev };
	Pinbroker__V1__AdminRevokeReply arr = PINBROKER__V1__ADMIN_REVOKE_REPLY__INIT;
	Pinbroker__V1__RedeclareReply rdr = PINBROKER__V1__REDECLARE_REPLY__INIT;
	Pinbroker__V1__Revoke rv = PINBROKER__V1__REVOKE__INIT;
	Pinbroker__V1__LeaseFds lf = PINBROKER__V1__LEASE_FDS__INIT;
	Pinbroker__V1__ShareReply shr = PINBROKER__V1__SHARE_REPLY__INIT;
	Pinbroker__V1__Lease attached = PINBROKER__V1__LEASE__INIT;
	Pinbroker__V1__Reply rep = PINBROKER__V1__REPLY__INIT;
	uint32_t shr_uids[] = { 1000, 1001 };
	int32_t attacher_pids[] = { 4321, 4322 };
	uint64_t chunks[] = { 2u << 20, 2u << 20, 1u << 20 };
	uint64_t ids[] = { 5, 6 };
	char *labels[] = { (char *)"train", (char *)"a,b" };

	hr.version = PB_PROTOCOL_VERSION;
	hr.server_version = (char *)"0.1.0";
	hr.has_page_size = hr.has_chunk_size = hr.has_hugetlb = 1;
	hr.page_size = 4096;
	hr.chunk_size = 2u << 20;
	hr.hugetlb = 0;
	lease.lease_id = 9;
	lease.size = 5u << 20;
	lease.page_size = 4096;
	lease.n_chunk_bytes = 3;
	lease.chunk_bytes = chunks;
	lease.fds_in_reply = 1;
	ci.pid = 1234;
	ci.uid = 1000;
	ci.leases = 2;
	ci.bytes = 5u << 20;
	ci.n_labels = 2;
	ci.labels = labels;
	ci.name = (char *)"python3";
	li.id = 9;
	li.pid = 1234;
	li.uid = 1000;
	li.bytes = 5u << 20;
	li.label = (char *)"train";
	li.age_ms = 1500;
	li.state = (char *)"revoking";
	li.has_deadline_left_ms = 1;
	li.deadline_left_ms = -250;
	li.has_shared = li.has_attachers = li.has_holder_detached = 1;
	li.shared = 1;
	li.attachers = 2;
	li.n_attacher_pids = 2;
	li.attacher_pids = attacher_pids;
	li.holder_detached = 1;
	ci.has_attached = 1;
	ci.attached = 1;
	sg.name = (char *)"mem_available";
	sg.value = 12.5;
	sg.has_tight = 1;
	sg.tight = 10;
	sg.unit = (char *)"%";
	ev.age_ms = 60000;
	ev.text = (char *)"normal -> tight: MemAvailable 9.8%";
	sr.schema_version = 1;
	sr.budget_bytes = 8ull << 30;
	sr.uid_quota_bytes = 4ull << 30;
	sr.leased_bytes = 5u << 20;
	sr.pool_bytes = 64u << 20;
	sr.pool_idle_bytes = 59u << 20;
	sr.page_size_bytes = 4096;
	sr.chunk_size_bytes = 2u << 20;
	sr.pressure_state = (char *)"normal";
	sr.n_clients = 1;
	sr.clients = cis;
	sr.n_leases = 1;
	sr.leases = lis;
	sr.n_signals = 1;
	sr.signals = sgs;
	sr.n_transitions = 2;
	sr.transitions = evs;
	sr.n_revocations = 1;
	sr.revocations = evs;
	arr.n_lease_ids = 2;
	arr.lease_ids = ids;
	rdr.n_adopted = 1;
	rdr.adopted = ids;
	rdr.n_rejected = 1;
	rdr.rejected = ids + 1;
	rv.lease_id = 9;
	rv.deadline_ms = 3000;
	rv.reason = (char *)"host memory critical";
	lf.lease_id = 9;
	lf.first_index = 1;
	lf.count = 2;
	shr.token = (char *)"fedcba9876543210fedcba9876543210";
	shr.n_uids = 2;
	shr.uids = shr_uids;
	attached = lease;
	attached.has_attached = 1;
	attached.attached = 1;

	const struct body bodies[] = {
		{ PINBROKER__V1__REPLY__BODY_HELLO, &hr.base },
		{ PINBROKER__V1__REPLY__BODY_LEASE, &lease.base },
		{ PINBROKER__V1__REPLY__BODY_STATUS_REPLY, &sr.base },
		{ PINBROKER__V1__REPLY__BODY_ADMIN_REVOKE, &arr.base },
		{ PINBROKER__V1__REPLY__BODY_REDECLARE, &rdr.base },
		{ PINBROKER__V1__REPLY__BODY_LEASE_FDS, &lf.base },
		{ PINBROKER__V1__REPLY__BODY_SHARE, &shr.base },
		{ PINBROKER__V1__REPLY__BODY_LEASE, &attached.base },
	};

	for (size_t nfds = 0; nfds <= 2; nfds += 2) {
		rep.has_seq = 1;
		rep.seq = 7;
		rep.status = PINBROKER__V1__STATUS_CODE__STATUS_OK;
		for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
			set_body(&rep.base, &bodies[i]);
			roundtrip_reply(&rep, nfds);
		}
		rep.seq = 0; /* revokes are unsolicited */
		rep.body_case = PINBROKER__V1__REPLY__BODY_REVOKE;
		rep.revoke = &rv;
		roundtrip_reply(&rep, nfds);
		/* A refusal: a status and the daemon's words, no body. */
		rep.seq = 8;
		rep.status = PINBROKER__V1__STATUS_CODE__STATUS_OVER_QUOTA;
		rep.message = (char *)"uid 1000 holds 4 GiB of its 4 GiB quota";
		rep.body_case = PINBROKER__V1__REPLY__BODY__NOT_SET;
		roundtrip_reply(&rep, nfds);
		rep.status = PINBROKER__V1__STATUS_CODE__STATUS_SHARE_DENIED;
		rep.message = (char *)"no live lease has this share token";
		roundtrip_reply(&rep, nfds);
		rep.message = NULL;
	}
}
END_TEST

/* The shape of a real grant: a Lease reply with its memfd; the bytes are readable through the received fd. */
START_TEST(test_lease_memfd_contents_survive_the_trip)
{
	Pinbroker__V1__Lease lease = PINBROKER__V1__LEASE__INIT;
	Pinbroker__V1__Reply rep = PINBROKER__V1__REPLY__INIT, *back;
	uint64_t chunks[] = { 4096 };
	uint8_t buf[256], rx[256];
	int fd = memfd_with("pinned bytes from the daemon"), in[4];
	size_t len, nfds;
	ssize_t n;

	lease.lease_id = 1;
	lease.size = 4096;
	lease.page_size = 4096;
	lease.n_chunk_bytes = 1;
	lease.chunk_bytes = chunks;
	lease.fds_in_reply = 1;
	rep.has_seq = 1;
	rep.seq = 2;
	rep.body_case = PINBROKER__V1__REPLY__BODY_LEASE;
	rep.lease = &lease;
	len = pinbroker__v1__reply__pack(&rep, buf);
	ck_assert_int_eq(wire_send(sv[0], buf, len, &fd, 1), 0);
	/* Writes after sending show through too: it is the same file, not a copy. */
	ck_assert_int_eq(pwrite(fd, "P", 1, 0), 1);
	close(fd);
	n = wire_recv(sv[1], rx, sizeof(rx), in, 4, &nfds);
	ck_assert_int_eq(n, (ssize_t)len);
	ck_assert_uint_eq(nfds, 1);
	back = pinbroker__v1__reply__unpack(NULL, (size_t)n, rx);
	ck_assert_ptr_nonnull(back);
	ck_assert_uint_eq(back->lease->fds_in_reply, nfds);
	assert_fd_holds(in[0], "Pinned bytes from the daemon");
	pinbroker__v1__reply__free_unpacked(back, NULL);
	close(in[0]);
}
END_TEST

START_TEST(test_250_fds_in_one_packet)
{
	int out[PB_MAX_FDS_PER_MSG], in[PB_MAX_FDS_PER_MSG];
	int base = memfd_with("same file 250 times"), before;
	struct stat st0, st;
	char msg[] = "fds";
	size_t nfds;

	ck_assert_int_eq(fstat(base, &st0), 0);
	for (int i = 0; i < PB_MAX_FDS_PER_MSG; i++)
		ck_assert_int_ge(out[i] = dup(base), 0);
	before = fdlimit_open_count();
	ck_assert_int_eq(wire_send(sv[0], msg, sizeof(msg), out, PB_MAX_FDS_PER_MSG), 0);
	ck_assert_int_eq(wire_recv(sv[1], msg, sizeof(msg), in, PB_MAX_FDS_PER_MSG, &nfds), (ssize_t)sizeof(msg));
	ck_assert_uint_eq(nfds, PB_MAX_FDS_PER_MSG);
	ck_assert_int_eq(fdlimit_open_count(), before + PB_MAX_FDS_PER_MSG);
	for (size_t i = 0; i < nfds; i++) {
		ck_assert_int_eq(fstat(in[i], &st), 0);
		ck_assert_uint_eq(st.st_ino, st0.st_ino);
		ck_assert_int_eq(fcntl(in[i], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	}
	assert_fd_holds(in[PB_MAX_FDS_PER_MSG - 1], "same file 250 times");
	wire_close_fds(in, nfds);
	wire_close_fds(out, PB_MAX_FDS_PER_MSG);
	close(base);
}
END_TEST

START_TEST(test_more_than_250_fds_refused_by_sender)
{
	int fds[PB_MAX_FDS_PER_MSG + 1];

	for (int i = 0; i <= PB_MAX_FDS_PER_MSG; i++)
		fds[i] = 0;
	ck_assert_int_eq(wire_send(sv[0], "x", 1, fds, PB_MAX_FDS_PER_MSG + 1), -E2BIG);
}
END_TEST

/*
 * The next packet is refused with err, with no fd of it left open; the receiver makes room for buf_bytes and max_fds.
 */
static void assert_refused_without_leak(size_t buf_bytes, size_t max_fds, ssize_t err)
{
	char buf[4096];
	int in[PB_MAX_FDS_PER_MSG], before = fdlimit_open_count();
	size_t nfds = 99;

	ck_assert_uint_le(buf_bytes, sizeof(buf));
	ck_assert_int_eq(wire_recv(sv[1], buf, buf_bytes, in, max_fds, &nfds), err);
	ck_assert_uint_eq(nfds, 0);
	ck_assert_int_eq(fdlimit_open_count(), before);
}

/* The stream goes on after a refused packet: the next one arrives whole. */
static void assert_next_packet_whole(const char *text, size_t buf_bytes, size_t max_fds)
{
	char buf[4096];
	int in[PB_MAX_FDS_PER_MSG];
	size_t nfds;

	ck_assert_int_eq(wire_send(sv[0], text, strlen(text), NULL, 0), 0);
	ck_assert_int_eq(wire_recv(sv[1], buf, buf_bytes, in, max_fds, &nfds), (ssize_t)strlen(text));
	ck_assert_int_eq(memcmp(buf, text, strlen(text)), 0);
}

/* More fds than the receiver asked for: refused, and every one that arrived is closed. */
START_TEST(test_fds_beyond_max_fds_give_ebadmsg_without_leak)
{
	int out[8];

	for (int i = 0; i < 8; i++)
		out[i] = memfd_with("x");
	ck_assert_int_eq(wire_send(sv[0], "hello", 5, out, 8), 0);
	wire_close_fds(out, 8);
	assert_refused_without_leak(16, 2, -EBADMSG);
	assert_next_packet_whole("next", 16, 2);
}
END_TEST

/* An empty packet carrying fds is malformed: refused with every fd closed, not read as the peer's hang-up. */
START_TEST(test_empty_packet_with_fds_gives_ebadmsg_without_leak)
{
	int out[2];

	out[0] = memfd_with("x");
	out[1] = memfd_with("y");
	ck_assert_int_eq(wire_send(sv[0], "", 0, out, 2), 0);
	wire_close_fds(out, 2);
	assert_refused_without_leak(16, 4, -EBADMSG);
	assert_next_packet_whole("next", 16, 4);
}
END_TEST

/* A peer that bypasses wire_send and attaches SCM_MAX_FD fds overflows the control buffer: MSG_CTRUNC. */
START_TEST(test_kernel_ctrunc_gives_ebadmsg_without_leak)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * KERNEL_SCM_MAX_FD)];
		struct cmsghdr align;
	} control;
	struct iovec iov = { .iov_base = (void *)"raw", .iov_len = 3 };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf };
	int out[KERNEL_SCM_MAX_FD];
	int base = memfd_with("x");
	struct cmsghdr *cmsg;

	for (int i = 0; i < KERNEL_SCM_MAX_FD; i++)
		ck_assert_int_ge(out[i] = dup(base), 0);
	memset(&control, 0, sizeof(control));
	msg.msg_controllen = sizeof(control.buf);
	cmsg = CMSG_FIRSTHDR(&msg);
	cmsg->cmsg_level = SOL_SOCKET;
	cmsg->cmsg_type = SCM_RIGHTS;
	cmsg->cmsg_len = CMSG_LEN(sizeof(int) * KERNEL_SCM_MAX_FD);
	memcpy(CMSG_DATA(cmsg), out, sizeof(out));
	ck_assert_int_eq(sendmsg(sv[0], &msg, 0), 3);
	wire_close_fds(out, KERNEL_SCM_MAX_FD);
	close(base);
	assert_refused_without_leak(16, PB_MAX_FDS_PER_MSG, -EBADMSG);
}
END_TEST

START_TEST(test_oversized_packet_gives_emsgsize_without_leak)
{
	size_t big_bytes = 4096;
	char *big = calloc(1, big_bytes);
	int fd = memfd_with("x");

	ck_assert_int_eq(wire_send(sv[0], big, big_bytes, &fd, 1), 0);
	close(fd);
	assert_refused_without_leak(64, 4, -EMSGSIZE);
	/* SEQPACKET discards the rest of a truncated packet; the next one is whole. */
	assert_next_packet_whole("ok", 64, 4);
	free(big);
}
END_TEST

START_TEST(test_peer_close_reads_as_eof)
{
	char buf[16];
	int in[1];
	size_t nfds;

	ck_assert_int_eq(wire_send(sv[0], "last", 4, NULL, 0), 0);
	close(sv[0]);
	sv[0] = -1;
	ck_assert_int_eq(wire_recv(sv[1], buf, sizeof(buf), in, 1, &nfds), 4);
	ck_assert_int_eq(wire_recv(sv[1], buf, sizeof(buf), in, 1, &nfds), 0);
}
END_TEST

START_TEST(test_send_to_closed_peer_is_epipe_not_sigpipe)
{
	/* Default SIGPIPE disposition would kill the test; wire_send must use MSG_NOSIGNAL. */
	signal(SIGPIPE, SIG_DFL);
	close(sv[1]);
	sv[1] = -1;
	ck_assert_int_eq(wire_send(sv[0], "x", 1, NULL, 0), -EPIPE);
}
END_TEST

START_TEST(test_nonblocking_empty_socket_is_eagain)
{
	char buf[16];
	int in[1];
	size_t nfds;

	ck_assert_int_eq(fcntl(sv[1], F_SETFL, O_NONBLOCK), 0);
	ck_assert_int_eq(wire_recv(sv[1], buf, sizeof(buf), in, 1, &nfds), -EAGAIN);
}
END_TEST

/* What a hostile peer might send must fail to unpack, not crash: the daemon then drops the connection. */
START_TEST(test_garbage_does_not_unpack)
{
	static const uint8_t junk[] = { 0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01 };
	static const uint8_t missing_required[] = { 0x08, 0x01 }; /* Reply.seq only: status is required */

	ck_assert_ptr_null(pinbroker__v1__request__unpack(NULL, sizeof(junk), junk));
	ck_assert_ptr_null(pinbroker__v1__reply__unpack(NULL, sizeof(missing_required), missing_required));
}
END_TEST

CHECK_SUITE(wire_suite, "wire", "socketpair", pair_setup, pair_teardown, 20, test_every_request_kind_round_trips,
	    test_every_reply_kind_round_trips, test_lease_memfd_contents_survive_the_trip, test_250_fds_in_one_packet,
	    test_more_than_250_fds_refused_by_sender, test_fds_beyond_max_fds_give_ebadmsg_without_leak,
	    test_empty_packet_with_fds_gives_ebadmsg_without_leak, test_kernel_ctrunc_gives_ebadmsg_without_leak,
	    test_oversized_packet_gives_emsgsize_without_leak, test_peer_close_reads_as_eof,
	    test_send_to_closed_peer_is_epipe_not_sigpipe, test_nonblocking_empty_socket_is_eagain,
	    test_garbage_does_not_unpack)

CHECK_MAIN(wire_suite)

/* SPDX-License-Identifier: MIT */
/* Helpers for integration tests: the raw protocol, one packet at a time, with no library in between (itest.h). */
#define _GNU_SOURCE
#include "itest.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pinbroker.h"
#include "wire.h"

int raw_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

int raw_send(int fd, const Pinbroker__V1__Request *req, const int *fds, size_t nfds)
{
	size_t len = pinbroker__v1__request__get_packed_size(req);
	uint8_t *buf = malloc(len ? len : 1);
	int r;

	if (!buf)
		return -ENOMEM;
	pinbroker__v1__request__pack(req, buf);
	r = wire_send(fd, buf, len, fds, nfds);
	free(buf);
	return r;
}

Pinbroker__V1__Reply *raw_recv(int fd, int *fds, size_t max_fds, size_t *nfds, int timeout_ms, int *err)
{
	static uint8_t buf[PB_MAX_MSG_BYTES];
	struct pollfd p = { .fd = fd, .events = POLLIN };
	size_t dummy;
	ssize_t n;
	int pr;

	if (!nfds)
		nfds = &dummy;
	*nfds = 0;
	pr = poll(&p, 1, timeout_ms);
	if (pr <= 0) {
		if (err)
			*err = pr == 0 ? -ETIMEDOUT : -errno;
		return NULL;
	}
	n = wire_recv(fd, buf, sizeof(buf), fds, max_fds, nfds);
	if (n <= 0) {
		if (err)
			*err = n == 0 ? -ECONNRESET : (int)n;
		return NULL;
	}
	if (err)
		*err = 0;
	return pinbroker__v1__reply__unpack(NULL, (size_t)n, buf);
}

int raw_call(int fd, Pinbroker__V1__Request *req, uint64_t seq, char *msg, size_t msglen, int timeout_ms)
{
	Pinbroker__V1__Reply *rep;
	int fds[16], err, st;
	size_t nfds = 0;

	req->has_seq = true;
	req->seq = seq;
	if (raw_send(fd, req, NULL, 0) < 0)
		return -EPIPE;
	rep = raw_recv(fd, fds, 16, &nfds, timeout_ms, &err);
	if (!rep)
		return err ? err : -EPROTO; /* err is 0 when the reply did not unpack */
	wire_close_fds(fds, nfds);
	st = rep->status;
	if (msg)
		snprintf(msg, msglen, "%s", rep->message ? rep->message : "");
	pinbroker__v1__reply__free_unpacked(rep, NULL);
	return st;
}

int raw_hello_as(int fd, const char *client_name)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Hello h = PINBROKER__V1__HELLO__INIT;

	h.version = PB_PROTOCOL_VERSION;
	h.client_name = (char *)client_name;
	req.body_case = PINBROKER__V1__REQUEST__BODY_HELLO;
	req.hello = &h;
	return raw_call(fd, &req, 1, NULL, 0, 5000);
}

int raw_hello(int fd)
{
	return raw_hello_as(fd, "itest");
}

int raw_status(int fd)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__StatusRequest sr = PINBROKER__V1__STATUS_REQUEST__INIT;

	req.body_case = PINBROKER__V1__REQUEST__BODY_STATUS;
	req.status = &sr;
	return raw_call(fd, &req, 2, NULL, 0, 5000);
}

/*
 * One request about lease_id: RELEASE, SET_IDLE (to idle), ADMIN_REVOKE or REVOKE_ACK, by kind, with seq; the
 * reply's status or -errno. The bodies live here, so one switch serves the four.
 */
static int raw_lease_call(int fd, Pinbroker__V1__Request__BodyCase kind, uint64_t lease_id, bool idle, uint64_t seq,
			  int timeout_ms)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Release rel = PINBROKER__V1__RELEASE__INIT;
	Pinbroker__V1__SetIdle si = PINBROKER__V1__SET_IDLE__INIT;
	Pinbroker__V1__AdminRevoke ar = PINBROKER__V1__ADMIN_REVOKE__INIT;
	Pinbroker__V1__RevokeAck ack = PINBROKER__V1__REVOKE_ACK__INIT;

	req.body_case = kind;
	switch (kind) {
	case PINBROKER__V1__REQUEST__BODY_RELEASE:
		rel.lease_id = lease_id;
		req.release = &rel;
		break;
	case PINBROKER__V1__REQUEST__BODY_SET_IDLE:
		si.lease_id = lease_id;
		si.idle = idle;
		req.set_idle = &si;
		break;
	case PINBROKER__V1__REQUEST__BODY_ADMIN_REVOKE:
		ar.has_lease_id = true;
		ar.lease_id = lease_id;
		req.admin_revoke = &ar;
		break;
	case PINBROKER__V1__REQUEST__BODY_REVOKE_ACK:
		ack.lease_id = lease_id;
		req.revoke_ack = &ack;
		break;
	default:
		ck_abort_msg("raw_lease_call: request kind %d has no lease id", (int)kind);
	}
	return raw_call(fd, &req, seq, NULL, 0, timeout_ms);
}

int raw_release_seq(int fd, uint64_t lease_id, uint64_t seq, int timeout_ms)
{
	return raw_lease_call(fd, PINBROKER__V1__REQUEST__BODY_RELEASE, lease_id, false, seq, timeout_ms);
}

int raw_release(int fd, uint64_t lease_id)
{
	return raw_release_seq(fd, lease_id, 9, 5000);
}

int raw_set_idle(int fd, uint64_t lease_id, bool idle)
{
	return raw_lease_call(fd, PINBROKER__V1__REQUEST__BODY_SET_IDLE, lease_id, idle, 11, 5000);
}

int raw_admin_revoke(int fd, uint64_t lease_id, int timeout_ms)
{
	return raw_lease_call(fd, PINBROKER__V1__REQUEST__BODY_ADMIN_REVOKE, lease_id, false, 5, timeout_ms);
}

int raw_revoke_ack(int fd, uint64_t lease_id)
{
	return raw_lease_call(fd, PINBROKER__V1__REQUEST__BODY_REVOKE_ACK, lease_id, false, 9, 5000);
}

int raw_acquire_msg(int fd, uint64_t size, const char *label, uint64_t seq, char *msg, size_t msglen, int timeout_ms)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Acquire a = PINBROKER__V1__ACQUIRE__INIT;

	a.size = size;
	a.label = (char *)label;
	req.body_case = PINBROKER__V1__REQUEST__BODY_ACQUIRE;
	req.acquire = &a;
	return raw_call(fd, &req, seq, msg, msglen, timeout_ms);
}

int raw_acquire_flags(int fd, uint64_t size, uint32_t flags, uint64_t *lease_id, int *fds, size_t max_fds, size_t *nfds)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Acquire a = PINBROKER__V1__ACQUIRE__INIT;
	Pinbroker__V1__Reply *rep;
	size_t got = 0, k, total;
	int err, st;

	a.size = size;
	a.has_flags = flags != 0;
	a.flags = flags;
	req.has_seq = true;
	req.seq = 7;
	req.body_case = PINBROKER__V1__REQUEST__BODY_ACQUIRE;
	req.acquire = &a;
	if (raw_send(fd, &req, NULL, 0) < 0)
		return -EPIPE;
	rep = raw_recv(fd, fds, max_fds, &k, 5000, &err);
	if (!rep)
		return err;
	st = rep->status;
	if (st != 0 || rep->body_case != PINBROKER__V1__REPLY__BODY_LEASE) {
		pinbroker__v1__reply__free_unpacked(rep, NULL);
		return st ? st : -EPROTO;
	}
	*lease_id = rep->lease->lease_id;
	total = rep->lease->n_chunk_bytes;
	got = k;
	pinbroker__v1__reply__free_unpacked(rep, NULL);
	while (got < total) {
		rep = raw_recv(fd, fds + got, max_fds - got, &k, 5000, &err);
		if (!rep)
			return err;
		pinbroker__v1__reply__free_unpacked(rep, NULL);
		got += k;
	}
	*nfds = got;
	return 0;
}

int raw_acquire(int fd, uint64_t size, uint64_t *lease_id, int *fds, size_t max_fds, size_t *nfds)
{
	return raw_acquire_flags(fd, size, 0, lease_id, fds, max_fds, nfds);
}

int raw_lease_held(const char *socket_path, uint64_t size, uint64_t *lease_id)
{
	int fds[PB_MAX_FDS_PER_MSG], fd = raw_connect(socket_path);
	size_t nfds;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(raw_hello(fd), 0);
	ck_assert_int_eq(raw_acquire(fd, size, lease_id, fds, PB_MAX_FDS_PER_MSG, &nfds), 0);
	for (size_t i = 0; i < nfds; i++)
		close(fds[i]);
	return fd;
}

bool raw_closed_by_peer(int fd, int timeout_ms)
{
	uint64_t t0 = itest_now_ms();

	/* Drain replies until EOF; a reply (e.g. an error status) may come first. */
	while (itest_now_ms() - t0 < (uint64_t)timeout_ms) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		char buf[65536];
		ssize_t n;

		if (poll(&p, 1, timeout_ms) <= 0)
			return false;
		n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n == 0)
			return true;
		if (n < 0 && errno != EAGAIN)
			return errno == ECONNRESET;
	}
	return false;
}

/* SPDX-License-Identifier: MIT */
/* libpinbroker's connection: sending requests, waiting for replies, dispatching what the receiver reads. */
#define _GNU_SOURCE
#include "lib-int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util.h"
#include "wire.h"

/* Sanity bound on one lease's chunk count: 2^20 chunks of 2 MiB is 2 TiB. */
#define MAX_CHUNKS_PER_LEASE (1u << 20)
/* Requests are a few dozen bytes; pack them on the stack unless they are unusually large. */
#define REQUEST_STACK_BYTES 512

bool conn_on_receiver_thread(const pb_client *c)
{
	return c->receiver_started && pthread_equal(pthread_self(), c->receiver);
}

int conn_send_packed(int sock, const Request *req)
{
	uint8_t stack[REQUEST_STACK_BYTES];
	size_t len = pinbroker__v1__request__get_packed_size(req);
	uint8_t *buf = len <= sizeof(stack) ? stack : malloc(len);
	int r;

	if (!buf)
		return -ENOMEM;
	pinbroker__v1__request__pack(req, buf);
	/* SEQPACKET sends are atomic per packet, so threads need no lock to share the socket. */
	r = wire_send(sock, buf, len, NULL, 0);
	if (buf != stack)
		free(buf);
	return r;
}

/*
 * Under c->lock: may a request go out now? -ECONNRESET while the connection is
 * down; -ESTALE when gen (a lease's connection generation, 0 for requests that
 * name no lease) is not the current connection's: the lease belongs to a
 * daemon instance, or a connection, that is gone, and its id may now name
 * another lease.
 */
static int may_send_locked(const pb_client *c, uint64_t gen)
{
	if (c->dead)
		return -ECONNRESET;
	if (gen && gen != c->conn_gen)
		return -ESTALE;
	return 0;
}

static void wake_receiver(pb_client *c);

/* How long a call waits for the receiver to hang up a connection another call found broken. */
#define HANGUP_WAIT_MS 100

/*
 * Under c->lock: a send on connection gen failed with r. When the daemon is gone (EPIPE, ECONNRESET, ...), the receiver
 * is told to hang up and reconnect, as when a read finds the connection broken: it leaves the socket to the calls
 * for CONN_WATCH_MS after each, so calls that only ever fail to send would otherwise keep it from seeing the
 * hang-up, and every call would fail until they paused.
 */
static void send_failed_locked(pb_client *c, uint64_t gen, int r)
{
	bool gone = r == -EPIPE || r == -ECONNRESET || r == -ENOTCONN || r == -ECONNREFUSED;

	if (!gone || c->conn_gen != gen || c->dead || c->rx_failed || c->closing)
		return;
	snprintf(c->rx_failed_reason, sizeof(c->rx_failed_reason), "sending: %s", strerror(-r));
	c->rx_failed = -ECONNRESET;
	wake_receiver(c);
}

/* Fire and forget: the receiver thread drops the reply, which has no waiter. gen as for may_send_locked. */
static int send_async(pb_client *c, Request *req, uint64_t gen)
{
	uint64_t sent_on;
	int r;

	pthread_rwlock_rdlock(&c->sock_lock);
	pthread_mutex_lock(&c->lock);
	r = may_send_locked(c, gen);
	if (r == 0) {
		req->has_seq = 1;
		req->seq = c->next_seq++;
	}
	sent_on = c->conn_gen;
	pthread_mutex_unlock(&c->lock);
	if (r == 0)
		r = conn_send_packed(c->sock, req);
	pthread_rwlock_unlock(&c->sock_lock);
	if (r < 0) {
		pthread_mutex_lock(&c->lock);
		send_failed_locked(c, sent_on, r);
		pthread_mutex_unlock(&c->lock);
	}
	return r == -EPIPE ? -ECONNRESET : r;
}

int conn_send_nowait(pb_client *c, Request *req)
{
	uint8_t stack[REQUEST_STACK_BYTES];
	uint64_t sent_on;
	size_t len;
	ssize_t n;
	int r;

	/* A reconnect holds the socket exclusively for as long as it takes: this caller does not wait for it. */
	if (pthread_rwlock_tryrdlock(&c->sock_lock) != 0)
		return -EAGAIN;
	pthread_mutex_lock(&c->lock);
	r = may_send_locked(c, 0);
	if (r == 0) {
		req->has_seq = 1;
		req->seq = c->next_seq++;
	}
	sent_on = c->conn_gen;
	pthread_mutex_unlock(&c->lock);
	/* Sized with its seq: the packet is what the daemon unpacks. */
	len = r == 0 ? pinbroker__v1__request__get_packed_size(req) : 0;
	if (r == 0 && len > sizeof(stack))
		r = -EMSGSIZE;
	if (r == 0) {
		pinbroker__v1__request__pack(req, stack);
		do {
			n = send(c->sock, stack, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		} while (n < 0 && errno == EINTR);
		r = n < 0 ? -errno : 0;
	}
	pthread_rwlock_unlock(&c->sock_lock);
	if (r < 0) {
		pthread_mutex_lock(&c->lock);
		send_failed_locked(c, sent_on, r);
		pthread_mutex_unlock(&c->lock);
	}
	if (r == -EWOULDBLOCK)
		r = -EAGAIN;
	return r == -EPIPE ? -ECONNRESET : r;
}

void conn_unlink_waiter_locked(pb_client *c, struct waiter *w)
{
	for (struct waiter **p = &c->waiters; *p; p = &(*p)->next)
		if (*p == w) {
			*p = w->next;
			return;
		}
}

/* Free what a finished waiter still holds: the reply and any fds nobody took. */
void conn_waiter_cleanup(struct waiter *w)
{
	if (w->fds) {
		wire_close_fds(w->fds, w->nfds);
		free(w->fds);
		w->fds = NULL;
	}
	if (w->reply)
		pinbroker__v1__reply__free_unpacked(w->reply, NULL);
	w->reply = NULL;
}

/*
 * Under c->lock, with the connection down: have the receiver thread try to
 * reconnect now, and wait until an attempt that began after this request has
 * ended, so that "the next call reconnects" holds whatever the backoff.
 */
static void await_reconnect_locked(pb_client *c)
{
	uint64_t mine;

	if (!c->receiver_started || c->closing)
		return;
	mine = ++c->kick_gen;
	pthread_cond_broadcast(&c->cond);
	while (c->dead && !c->closing && c->served_gen < mine)
		pthread_cond_wait(&c->cond, &c->lock);
}

/* Under c->lock: may a caller read the socket for its reply now (no one else does, the connection is up)? */
static bool may_read_locked(const pb_client *c)
{
	return c->receiver_started && !c->reading && !c->dead && !c->rx_failed && !c->closing;
}

void conn_end_read_locked(pb_client *c)
{
	c->reading = false;
	__atomic_store_n(&c->rx_got, false, __ATOMIC_RELAXED);
	/* A caller waiting to read, or the receiver waiting to hang up, goes on now. */
	if (c->readers_waiting || c->dead || c->rx_failed)
		pthread_cond_broadcast(&c->cond);
}

/* The receiver is wanted (a revoke to run, a broken connection): it polls wake_fd whenever it waits. */
static void wake_receiver(pb_client *c)
{
	uint64_t one = 1;

	/* Never blocks; a failure leaves the receiver to its next look, at most CONN_WATCH_MS away. */
	if (write(c->wake_fd, &one, sizeof(one)) < 0)
		return;
}

/*
 * Under c->lock, holding the read side: read one packet (unlocked; recvmsg flags, MSG_DONTWAIT to only look) and
 * dispatch it; the read side stays held. Returns the recv's result. A broken connection is the receiver's to hang
 * up and report (c->rx_failed), as if it had read it.
 */
static ssize_t read_one_held_locked(pb_client *c, int flags)
{
	int fds[PB_MAX_FDS_PER_MSG];
	uint64_t gen = c->conn_gen;
	Reply *rep = NULL;
	size_t nfds = 0;
	ssize_t n;

	pthread_mutex_unlock(&c->lock);
	n = wire_recv_flags(c->sock, c->rxbuf, PB_MAX_MSG_BYTES, fds, PB_MAX_FDS_PER_MSG, &nfds, flags);
	if (n > 0) {
		__atomic_store_n(&c->rx_got, true, __ATOMIC_RELEASE);
		rep = pinbroker__v1__reply__unpack(NULL, (size_t)n, c->rxbuf);
		if (rep)
			conn_dispatch(c, rep, fds, nfds);
		else
			wire_close_fds(fds, nfds);
	}
	pthread_mutex_lock(&c->lock);
	if (!rep && n != -EAGAIN && c->conn_gen == gen && !c->dead && !c->rx_failed) {
		if (n == 0)
			snprintf(c->rx_failed_reason, sizeof(c->rx_failed_reason), "pinbrokerd closed the connection");
		else if (n < 0)
			snprintf(c->rx_failed_reason, sizeof(c->rx_failed_reason), "receiving: %s", strerror((int)-n));
		else
			snprintf(c->rx_failed_reason, sizeof(c->rx_failed_reason), "malformed packet from pinbrokerd");
		c->rx_failed = n < 0 ? (int)n : n == 0 ? -ECONNRESET : -EPROTO;
		wake_receiver(c);
	}
	return rep ? n : n > 0 ? -EPROTO : n;
}

/*
 * Under c->lock: wait until w is done, reading the socket while no one else does (reading: this caller holds the
 * read side already). The caller whose own read completed w reads on, without waiting, what is queued behind its
 * reply: a REVOKE sent right after a grant then marks the waiter before pb_acquire publishes the lease, as when
 * the receiver read every packet. Then wait for the revokes read before the reply to have run on the receiver
 * thread (those after it are the receiver's to run, as they were).
 */
static void wait_reply_locked(pb_client *c, struct waiter *w, bool reading)
{
	for (;;) {
		if (reading) {
			ssize_t n = read_one_held_locked(c, 0);

			if (w->done)
				while (n > 0 && !c->rx_failed)
					n = read_one_held_locked(c, MSG_DONTWAIT);
			conn_end_read_locked(c);
		}
		if (w->done)
			break;
		reading = may_read_locked(c);
		if (reading) {
			c->reading = true;
			continue;
		}
		c->readers_waiting++;
		pthread_cond_wait(&c->cond, &c->lock);
		c->readers_waiting--;
	}
	while (c->revokes_run < w->revokes_at_done)
		pthread_cond_wait(&c->cond, &c->lock);
}

/* Under c->lock: has the daemon sent something no one has read yet (a packet, or its hang-up)? */
static bool unread_locked(const pb_client *c)
{
	char byte;

	return recv(c->sock, &byte, 1, MSG_PEEK | MSG_DONTWAIT) >= 0;
}

void conn_drain_locked(pb_client *c)
{
	for (;;) {
		if (may_read_locked(c)) {
			c->reading = true;
			while (read_one_held_locked(c, MSG_DONTWAIT) > 0 && !c->rx_failed)
				;
			conn_end_read_locked(c);
			return;
		}
		if (!c->receiver_started || c->dead || c->rx_failed || c->closing ||
		    !(__atomic_load_n(&c->rx_got, __ATOMIC_ACQUIRE) || unread_locked(c)))
			return;
		/* Another thread reads and has a packet, or one is waiting: it is dispatched (a REVOKE marked) once that
		 * read ends. */
		c->readers_waiting++;
		pthread_cond_wait(&c->cond, &c->lock);
		c->readers_waiting--;
	}
}

int conn_call(pb_client *c, Request *req, struct waiter *w, bool keep, uint64_t gen)
{
	uint64_t sent_on;
	bool reading;
	int r;

	memset(w, 0, sizeof(*w));
	if (conn_on_receiver_thread(c))
		return err_set(-EDEADLK, "cannot wait for pinbrokerd inside a revoke callback");
	if (getpid() != c->pid)
		return err_set(-ECHILD,
			       "this pb_client was connected by process %d, before a fork: call pb_connect in "
			       "this process",
			       (int)c->pid);
	pthread_mutex_lock(&c->lock);
	/*
	 * A call found the connection broken: give the receiver a moment to hang up, so this call has it reconnect.
	 * Bounded: the receiver may be in a revoke callback that waits for this very thread's pb_release; then this
	 * call fails at once, as it would have, and a later one reconnects.
	 */
	if (c->rx_failed && !c->dead && !c->closing && c->receiver_started) {
		struct timespec until;

		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += HANGUP_WAIT_MS * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		while (c->rx_failed && !c->dead && !c->closing &&
		       pthread_cond_timedwait(&c->cond, &c->lock, &until) != ETIMEDOUT)
			;
	}
	if (c->dead)
		await_reconnect_locked(c);
	pthread_mutex_unlock(&c->lock);

	pthread_rwlock_rdlock(&c->sock_lock);
	pthread_mutex_lock(&c->lock);
	r = may_send_locked(c, gen);
	if (r < 0) {
		if (r == -ECONNRESET)
			err_set(r, "connection to pinbrokerd lost: %s", c->dead_reason);
		else
			err_set(r, "the lease belongs to a pinbrokerd connection that is gone");
		pthread_mutex_unlock(&c->lock);
		pthread_rwlock_unlock(&c->sock_lock);
		return r;
	}
	w->seq = c->next_seq++;
	req->has_seq = 1;
	req->seq = w->seq;
	/* Linked before sending: the reply may arrive before this thread gets to wait. */
	w->next = c->waiters;
	c->waiters = w;
	c->last_call_ms = now_ms();
	/* The read side taken before sending: the reply wakes this thread, not the receiver. */
	reading = may_read_locked(c);
	c->reading |= reading;
	sent_on = c->conn_gen;
	pthread_mutex_unlock(&c->lock);

	r = conn_send_packed(c->sock, req);
	pthread_rwlock_unlock(&c->sock_lock);

	pthread_mutex_lock(&c->lock);
	if (r < 0) {
		conn_unlink_waiter_locked(c, w);
		if (reading)
			conn_end_read_locked(c);
		send_failed_locked(c, sent_on, r);
		pthread_mutex_unlock(&c->lock);
		if (r == -EPIPE)
			r = -ECONNRESET;
		return err_set(r, "cannot send to pinbrokerd: %s", strerror(-r));
	}
	wait_reply_locked(c, w, reading);
	if (!keep || w->err || !w->reply)
		conn_unlink_waiter_locked(c, w);
	r = w->err;
	if (r == -ECONNRESET)
		err_set(r, "connection to pinbrokerd lost: %s", c->dead_reason);
	pthread_mutex_unlock(&c->lock);
	if (r == 0)
		return 0;
	if (r != -ECONNRESET)
		err_set(r, "unusable reply from pinbrokerd: %s", pb_strerror(r));
	/* A lease the daemon granted but we cannot take is still counted there: hand it back. */
	if (w->reply && w->reply->status == PINBROKER__V1__STATUS_CODE__STATUS_OK &&
	    w->reply->body_case == PINBROKER__V1__REPLY__BODY_LEASE)
		conn_send_release(c, w->reply->lease->lease_id, w->conn_gen, false);
	conn_waiter_cleanup(w);
	return r;
}

int conn_send_release(pb_client *c, uint64_t id, uint64_t gen, bool forked)
{
	Pinbroker__V1__Release rel = PINBROKER__V1__RELEASE__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;

	rel.lease_id = id;
	rel.has_forked = forked;
	rel.forked = forked;
	req.body_case = PINBROKER__V1__REQUEST__BODY_RELEASE;
	req.release = &rel;
	return send_async(c, &req, gen);
}

int conn_send_revoke_ack(pb_client *c, uint64_t id, uint64_t gen)
{
	Pinbroker__V1__RevokeAck ack = PINBROKER__V1__REVOKE_ACK__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;

	ack.lease_id = id;
	req.body_case = PINBROKER__V1__REQUEST__BODY_REVOKE_ACK;
	req.revoke_ack = &ack;
	return send_async(c, &req, gen);
}

int conn_send_set_idle(pb_client *c, uint64_t id, bool idle, uint64_t gen)
{
	Pinbroker__V1__SetIdle si = PINBROKER__V1__SET_IDLE__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;

	si.lease_id = id;
	si.idle = idle;
	req.body_case = PINBROKER__V1__REQUEST__BODY_SET_IDLE;
	req.set_idle = &si;
	return send_async(c, &req, gen);
}

/* Send an admin or status request and check the status; *w holds the reply on success. */
int conn_call_checked(pb_client *c, Request *req, struct waiter *w)
{
	int r;

	if (!c)
		return err_set(-ENOTCONN, "not connected to a broker");
	r = conn_call(c, req, w, false, 0);
	if (r < 0)
		return r;
	if (w->reply->status != PINBROKER__V1__STATUS_CODE__STATUS_OK) {
		r = err_reply(w->reply);
		conn_waiter_cleanup(w);
	}
	return r;
}

bool conn_knows_staging(const pb_client *c)
{
	return __atomic_load_n(&c->knows_staging, __ATOMIC_ACQUIRE);
}

/* An older daemon would drop the never-revoke flag, or close the connection: ask it for neither. */
int conn_need_registrations(const pb_client *c, const char *what)
{
	if (__atomic_load_n(&c->registrations, __ATOMIC_ACQUIRE))
		return 0;
	return err_set(-EOPNOTSUPP, "this pinbrokerd predates %s: upgrade it (the library asked for nothing)", what);
}

/*
 * Under c->lock: remember that lease id of instance was let go while the connection was down. A daemon that
 * dies frees a closed connection's leases only if it comes back without them; one restarted from systemd's fd
 * store keeps them counted while this process runs, until told. Only the newest instance's ids are kept.
 */
void conn_note_away_locked(pb_client *c, uint64_t instance, uint64_t id)
{
	if (instance == 0)
		return;
	if (instance != c->away_instance) {
		c->n_away = 0;
		c->away_instance = instance;
	}
	if (c->n_away == c->cap_away) {
		size_t cap = c->cap_away ? c->cap_away * 2 : 16;
		uint64_t *ids = realloc(c->away_ids, cap * sizeof(*ids));

		if (!ids)
			return; /* then it stays counted until this process exits, as before */
		c->away_ids = ids;
		c->cap_away = cap;
	}
	c->away_ids[c->n_away++] = id;
}

static struct waiter *waiter_find_locked(pb_client *c, uint64_t seq)
{
	for (struct waiter *w = c->waiters; w; w = w->next)
		if (w->seq == seq)
			return w;
	return NULL;
}

/* A LeaseFds packet: append its fds to the lease being collected. Under c->lock. */
static void collect_lease_fds_locked(struct waiter *w, const Pinbroker__V1__LeaseFds *lf, int *fds, size_t nfds)
{
	if (w->done || !w->fds || !w->reply || w->reply->lease->lease_id != lf->lease_id ||
	    lf->first_index != w->nfds || lf->count != nfds || nfds > w->fds_expected - w->nfds) {
		wire_close_fds(fds, nfds);
		if (!w->done) {
			w->err = -EPROTO;
			w->done = true;
		}
		return;
	}
	memcpy(w->fds + w->nfds, fds, nfds * sizeof(int));
	w->nfds += nfds;
	if (w->nfds == w->fds_expected)
		w->done = true;
}

/* A reply to w's request. Takes rep; under c->lock. */
static void deliver_reply_locked(struct waiter *w, Reply *rep, int *fds, size_t nfds)
{
	const Pinbroker__V1__Lease *ls;

	w->reply = rep;
	w->done = true;
	if (rep->status != PINBROKER__V1__STATUS_CODE__STATUS_OK ||
	    rep->body_case != PINBROKER__V1__REPLY__BODY_LEASE) {
		wire_close_fds(fds, nfds);
		return;
	}
	ls = rep->lease;
	/* A registration charge is the one lease with no memory to map. */
	if (ls->has_registration && ls->registration && ls->n_chunk_bytes == 0 && nfds == 0 && ls->fds_in_reply == 0)
		return;
	if (ls->n_chunk_bytes == 0 || ls->n_chunk_bytes > MAX_CHUNKS_PER_LEASE || ls->fds_in_reply != nfds ||
	    nfds > ls->n_chunk_bytes) {
		wire_close_fds(fds, nfds);
		w->err = -EPROTO;
		return;
	}
	w->fds = malloc(ls->n_chunk_bytes * sizeof(int));
	if (!w->fds) {
		wire_close_fds(fds, nfds);
		w->err = -ENOMEM;
		return;
	}
	memcpy(w->fds, fds, nfds * sizeof(int));
	w->nfds = nfds;
	w->fds_expected = ls->n_chunk_bytes;
	/* The rest arrive in LeaseFds packets; the caller wakes only when it has them all. */
	w->done = nfds == ls->n_chunk_bytes;
}

void conn_mark_revoked_locked(pb_client *c, uint64_t id)
{
	for (struct waiter *w = c->waiters; w; w = w->next)
		if (w->reply && w->reply->body_case == PINBROKER__V1__REPLY__BODY_LEASE &&
		    w->reply->lease->lease_id == id)
			w->revoked = true;
}

/* A caller read a REVOKE: the receiver thread runs it (a full queue waits for it to catch up). */
static void queue_revoke(pb_client *c, uint64_t id, uint32_t deadline_ms)
{
	pthread_mutex_lock(&c->lock);
	while (c->n_revokes == CONN_REVOKES_MAX && c->receiver_started)
		pthread_cond_wait(&c->cond, &c->lock);
	c->revokes[c->n_revokes++] = (struct conn_revoke){ id, deadline_ms };
	c->revokes_queued++;
	wake_receiver(c);
	pthread_mutex_unlock(&c->lock);
}

void conn_run_revokes_locked(pb_client *c)
{
	while (c->n_revokes > 0) {
		struct conn_revoke rv = c->revokes[0];

		c->n_revokes--;
		memmove(c->revokes, c->revokes + 1, c->n_revokes * sizeof(rv));
		pthread_mutex_unlock(&c->lock);
		c->hooks->revoke(c, rv.lease_id, rv.deadline_ms);
		pthread_mutex_lock(&c->lock);
		c->revokes_run++;
		pthread_cond_broadcast(&c->cond);
	}
}

void conn_dispatch(pb_client *c, Reply *rep, int *fds, size_t nfds)
{
	struct waiter *w;
	uint64_t seq = rep->has_seq ? rep->seq : 0;

	if (seq == 0) {
		wire_close_fds(fds, nfds);
		if (rep->body_case == PINBROKER__V1__REPLY__BODY_REVOKE) {
			if (conn_on_receiver_thread(c)) {
				c->hooks->revoke(c, rep->revoke->lease_id, rep->revoke->deadline_ms);
			} else {
				/* A lease granted and not yet published is given back by its pb_acquire, as the hook
				 * would have it: marked now, not when the receiver gets to the queue. */
				pthread_mutex_lock(&c->lock);
				conn_mark_revoked_locked(c, rep->revoke->lease_id);
				pthread_mutex_unlock(&c->lock);
				queue_revoke(c, rep->revoke->lease_id, rep->revoke->deadline_ms);
			}
		}
		pinbroker__v1__reply__free_unpacked(rep, NULL);
		return;
	}
	pthread_mutex_lock(&c->lock);
	w = waiter_find_locked(c, seq);
	if (!w || (w->reply && rep->body_case != PINBROKER__V1__REPLY__BODY_LEASE_FDS)) {
		/* The answer to a fire-and-forget request, or leftovers of an abandoned lease. */
		pthread_mutex_unlock(&c->lock);
		wire_close_fds(fds, nfds);
		pinbroker__v1__reply__free_unpacked(rep, NULL);
		return;
	}
	/* The connection a lease came on decides where requests naming it may go. */
	w->instance_id = c->instance_id;
	w->conn_gen = c->conn_gen;
	if (rep->body_case == PINBROKER__V1__REPLY__BODY_LEASE_FDS) {
		collect_lease_fds_locked(w, rep->lease_fds, fds, nfds);
		pinbroker__v1__reply__free_unpacked(rep, NULL);
	} else {
		deliver_reply_locked(w, rep, fds, nfds);
	}
	if (w->done) {
		w->revokes_at_done = c->revokes_queued;
		pthread_cond_broadcast(&c->cond);
	}
	pthread_mutex_unlock(&c->lock);
}

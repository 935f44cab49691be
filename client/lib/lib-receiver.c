/* SPDX-License-Identifier: MIT */
/* libpinbroker's receiver thread: HELLO, reading the daemon's packets, reconnecting and re-declaring leases. */
#define _GNU_SOURCE
#include "lib-int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "util.h"
#include "wire.h"

/* How long pb_disconnect waits for the daemon to answer its RELEASEs and close. */
#define DISCONNECT_DRAIN_MS 2000
/* A daemon that does not answer HELLO in this time is wedged; fail pb_connect instead of hanging. */
#define HELLO_TIMEOUT_MS 10000
/* After losing the daemon, keep trying this long: systemd restarts it within seconds
 * (RestartSec=1s), and the daemon keeps our leases for redeclare-grace-ms (10 s). */
#define RECONNECT_WINDOW_MS 60000
#define RECONNECT_BACKOFF_MIN_MS 20
#define RECONNECT_BACKOFF_MAX_MS 1000

/*
 * HELLO is read here, before the receiver thread exists (or on it, when it
 * reconnects): nothing else can arrive first. *instance_id gets the daemon's
 * instance, 0 if it names none.
 */
int receiver_hello(pb_client *c, const char *path, uint64_t *instance_id)
{
	Pinbroker__V1__Hello hello = PINBROKER__V1__HELLO__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	struct timeval tv = { .tv_sec = HELLO_TIMEOUT_MS / 1000, .tv_usec = (HELLO_TIMEOUT_MS % 1000) * 1000 };
	struct timeval forever = { 0, 0 };
	int fds[PB_MAX_FDS_PER_MSG];
	Reply *rep;
	size_t nfds;
	ssize_t n;
	int r;

	hello.version = PB_PROTOCOL_VERSION;
	hello.client_name = program_invocation_short_name;
	req.has_seq = 1;
	req.seq = c->next_seq++;
	req.body_case = PINBROKER__V1__REQUEST__BODY_HELLO;
	req.hello = &hello;
	r = conn_send_packed(c->sock, &req);
	if (r < 0)
		return err_set(r == -EPIPE ? -ECONNRESET : r, "cannot send HELLO to %s: %s", path, strerror(-r));

	setsockopt(c->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	n = wire_recv(c->sock, c->rxbuf, PB_MAX_MSG_BYTES, fds, PB_MAX_FDS_PER_MSG, &nfds);
	setsockopt(c->sock, SOL_SOCKET, SO_RCVTIMEO, &forever, sizeof(forever));
	if (n == -EAGAIN)
		return err_set(-ETIMEDOUT, "pinbrokerd at %s did not answer HELLO within %d ms", path,
			       HELLO_TIMEOUT_MS);
	if (n == 0)
		return err_set(-ECONNRESET, "pinbrokerd at %s closed the connection during HELLO", path);
	if (n < 0)
		return err_set((int)n, "reading HELLO reply from %s: %s", path, strerror((int)-n));
	wire_close_fds(fds, nfds);
	rep = pinbroker__v1__reply__unpack(NULL, (size_t)n, c->rxbuf);
	if (!rep)
		return err_set(-EPROTO, "malformed HELLO reply from %s", path);
	if (rep->status == PINBROKER__V1__STATUS_CODE__STATUS_VERSION_MISMATCH) {
		r = err_set(-EPROTONOSUPPORT, "pinbrokerd does not speak protocol version %d: %s", PB_PROTOCOL_VERSION,
			    rep->message ? rep->message : "version mismatch");
	} else if (rep->status != PINBROKER__V1__STATUS_CODE__STATUS_OK) {
		r = err_reply(rep);
	} else if (rep->body_case != PINBROKER__V1__REPLY__BODY_HELLO || !rep->has_seq || rep->seq != req.seq) {
		r = err_set(-EPROTO, "unexpected answer to HELLO from %s", path);
	} else {
		*instance_id = rep->hello->has_instance_id ? rep->hello->instance_id : 0;
		__atomic_store_n(&c->registrations, rep->hello->has_registrations && rep->hello->registrations,
				 __ATOMIC_RELEASE);
		__atomic_store_n(&c->knows_staging, rep->hello->has_staging && rep->hello->staging, __ATOMIC_RELEASE);
		r = 0;
	}
	pinbroker__v1__reply__free_unpacked(rep, NULL);
	return r;
}

/*
 * Wait for the next reconnect attempt: up to ms (0: until asked), or at once
 * when a call asked for one. Returns false once pb_disconnect started; else
 * *attempt_for says which asks the attempt will answer.
 */
static bool wait_for_attempt(pb_client *c, unsigned ms, uint64_t *attempt_for)
{
	struct timespec until;
	bool go_on;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += ms / 1000;
	until.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&c->lock);
	while (!c->closing && c->kick_gen <= c->served_gen) {
		if (ms == 0)
			pthread_cond_wait(&c->cond, &c->lock);
		else if (pthread_cond_timedwait(&c->cond, &c->lock, &until) == ETIMEDOUT)
			break;
	}
	go_on = !c->closing;
	*attempt_for = c->kick_gen;
	pthread_mutex_unlock(&c->lock);
	return go_on;
}

/*
 * Re-declare ids to the daemon instance that granted them and wait for its
 * answer here, on the receiver thread, dispatching whatever else arrives
 * meanwhile. *adopted (malloc'd, *nadopted) lists the ids it took back.
 * Returns 0, or a negative errno when no answer came.
 */
static int redeclare(pb_client *c, uint64_t *ids, size_t n, uint64_t instance_id, uint64_t **adopted, size_t *nadopted)
{
	Pinbroker__V1__Redeclare rd = PINBROKER__V1__REDECLARE__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	uint64_t give_up = now_ms() + HELLO_TIMEOUT_MS;
	int r;

	*adopted = NULL;
	*nadopted = 0;
	rd.n_lease_ids = n;
	rd.lease_ids = ids;
	rd.has_instance_id = instance_id != 0;
	rd.instance_id = instance_id;
	pthread_mutex_lock(&c->lock);
	req.has_seq = 1;
	req.seq = c->next_seq++;
	pthread_mutex_unlock(&c->lock);
	req.body_case = PINBROKER__V1__REQUEST__BODY_REDECLARE;
	req.redeclare = &rd;
	r = conn_send_packed(c->sock, &req);
	if (r < 0)
		return r;
	for (;;) {
		struct pollfd p = { .fd = c->sock, .events = POLLIN };
		int fds[PB_MAX_FDS_PER_MSG];
		uint64_t now = now_ms();
		size_t nfds;
		Reply *rep;
		ssize_t len;

		if (now >= give_up)
			return -ETIMEDOUT;
		if (poll(&p, 1, (int)(give_up - now)) <= 0)
			continue;
		len = wire_recv(c->sock, c->rxbuf, PB_MAX_MSG_BYTES, fds, PB_MAX_FDS_PER_MSG, &nfds);
		if (len <= 0)
			return len == 0 ? -ECONNRESET : (int)len;
		rep = pinbroker__v1__reply__unpack(NULL, (size_t)len, c->rxbuf);
		if (!rep) {
			wire_close_fds(fds, nfds);
			return -EPROTO;
		}
		if (rep->has_seq && rep->seq == req.seq) {
			wire_close_fds(fds, nfds);
			if (rep->status == PINBROKER__V1__STATUS_CODE__STATUS_OK &&
			    rep->body_case == PINBROKER__V1__REPLY__BODY_REDECLARE && rep->redeclare->n_adopted > 0) {
				*adopted = malloc(rep->redeclare->n_adopted * sizeof(**adopted));
				if (*adopted) {
					memcpy(*adopted, rep->redeclare->adopted,
					       rep->redeclare->n_adopted * sizeof(**adopted));
					*nadopted = rep->redeclare->n_adopted;
				}
			}
			pinbroker__v1__reply__free_unpacked(rep, NULL);
			return 0;
		}
		conn_dispatch(c, rep, fds, nfds);
	}
}

/*
 * One reconnect attempt: connect again on the same path, say HELLO, and,
 * when it is the daemon instance that granted our leases (a restart that
 * adopted systemd's fd store), re-declare them so it keeps counting them.
 * Every other lease becomes stale (through c->hooks): still mapped here (the
 * new daemon counts it as orphaned while it is), no longer a lease, and never
 * named on the wire again (its id may be reused by the new instance).
 * The new socket replaces the old one at the same fd number (dup3) under
 * sock_lock, so no request checked against the old connection can reach it.
 * Returns 0 when connected again.
 */
static int try_reconnect(pb_client *c)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	uint64_t instance_id = 0, *ids = NULL, *adopted = NULL, *away = NULL;
	pb_lease *drop = NULL;
	size_t n = 0, nadopted = 0, n_away = 0;
	bool same;
	int s, r;

	memcpy(sa.sun_path, c->path, sizeof(c->path));
	s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		close(s);
		return err_set(r, "no pinbrokerd at %s: %s", c->path, strerror(-r));
	}
	pthread_rwlock_wrlock(&c->sock_lock);
	r = dup3(s, c->sock, O_CLOEXEC) < 0 ? -errno : 0;
	pthread_rwlock_unlock(&c->sock_lock);
	close(s);
	if (r < 0)
		return r;
	r = receiver_hello(c, c->path, &instance_id);
	if (r < 0)
		goto fail;

	pthread_mutex_lock(&c->lock);
	/* A daemon that names no instance is taken for a new one: re-declaring to it could adopt someone's id. */
	same = instance_id != 0 && instance_id == c->instance_id;
	if (same)
		ids = c->hooks->redeclare_ids_locked(c, instance_id, &n);
	pthread_mutex_unlock(&c->lock);

	if (n > 0) {
		r = redeclare(c, ids, n, instance_id, &adopted, &nadopted);
		if (r == -ECONNRESET || r == -EPROTO)
			goto fail;
		/* No answer in time: nothing counts as adopted; those leases go stale below. */
	}

	pthread_mutex_lock(&c->lock);
	if (same && c->away_instance == instance_id && c->n_away > 0) {
		away = c->away_ids;
		n_away = c->n_away;
		c->away_ids = NULL;
		c->n_away = c->cap_away = 0;
	} else if (!same) {
		c->n_away = 0; /* another instance: what the old one held died with it */
	}
	c->conn_gen++;
	drop = c->hooks->reconnected_locked(c, same, instance_id, adopted, nadopted);
	if (same)
		cache_retell_locked(c); /* the cached leases left are adopted ones: tell them idle again */
	c->instance_id = instance_id;
	c->dead = 0;
	c->dead_reason[0] = '\0';
	pthread_mutex_unlock(&c->lock);
	c->hooks->drop(drop);
	/* What was let go while we were away: the restarted daemon holds it for this pid until told. Replies
	 * (OK, or not-found where the old daemon had already freed it) have no waiter and are dropped. */
	/* Whether a child kept one is not remembered: each is said to be, so its memory is never lent again. */
	for (size_t i = 0; i < n_away; i++)
		conn_send_release(c, away[i], 0, true);
	free(away);
	free(ids);
	free(adopted);
	return 0;
fail:
	free(ids);
	free(adopted);
	/* Whatever answered is not usable: hang up so the next attempt starts clean. */
	shutdown(c->sock, SHUT_RDWR);
	return r;
}

/*
 * The daemon went away (crash, restart): try again with backoff for
 * RECONNECT_WINDOW_MS (systemd restarts it within seconds, RestartSec=1s, and
 * it keeps our leases for redeclare-grace-ms), then only when a call asks.
 * Returns 0 when connected again, -ECANCELED when pb_disconnect started.
 */
static int reconnect(pb_client *c)
{
	uint64_t give_up = now_ms() + RECONNECT_WINDOW_MS;
	unsigned wait_ms = RECONNECT_BACKOFF_MIN_MS;

	for (;;) {
		uint64_t attempt_for;
		int r;

		if (!wait_for_attempt(c, now_ms() > give_up ? 0 : wait_ms, &attempt_for))
			return -ECANCELED;
		wait_ms = wait_ms * 2 > RECONNECT_BACKOFF_MAX_MS ? RECONNECT_BACKOFF_MAX_MS : wait_ms * 2;
		r = try_reconnect(c);
		pthread_mutex_lock(&c->lock);
		if (attempt_for > c->served_gen)
			c->served_gen = attempt_for;
		if (r < 0)
			snprintf(c->dead_reason, sizeof(c->dead_reason), "reconnecting failed: %.120s",
				 pb_last_error());
		pthread_cond_broadcast(&c->cond);
		pthread_mutex_unlock(&c->lock);
		if (r == 0)
			return 0;
	}
}

/* What the receiver's wait found. */
enum rx_wait {
	RX_LOOK_AGAIN, /* a tick, a wake, a caller reading: nothing to read now */
	RX_READ,       /* the receiver holds the read side: a packet is there, or it waits in its lone recv */
	RX_BROKEN,     /* a caller's read found the connection broken (c->rx_failed) */
};

/*
 * While a cached lease has not been told idle, wake every c->cache_idle_ms to tell the daemon which cached leases
 * sat idle a tick, so a lease reused at once never costs a message. Otherwise wait untimed: an idle client (cache
 * empty, or all of it told) never wakes; pb_release caching a lease then wakes this thread through c->wake_fd.
 * Within CONN_WATCH_MS of a call, or while a caller reads, leave the socket to the calls and wait on wake_fd
 * alone: neither a call's reply nor its end wakes this thread. With no cache at all, nothing cached and no call
 * for CONN_WATCH_MS, wait in the recv alone (*blocking, c->rx_blocking): nothing then wakes this thread but a
 * packet, and pb_release tells the daemon itself of a lease cached meanwhile.
 */
static enum rx_wait receiver_wait(pb_client *c, bool *blocking)
{
	struct pollfd p[2] = { { .fd = c->wake_fd, .events = POLLIN }, { .fd = c->sock, .events = POLLIN } };
	int timeout_ms = -1;
	nfds_t nfds = 2;
	unsigned idle_ms;
	uint64_t now;
	bool ticking;

	*blocking = false;
	pthread_mutex_lock(&c->lock);
	conn_run_revokes_locked(c);
	if (c->rx_failed) {
		pthread_mutex_unlock(&c->lock);
		return RX_BROKEN;
	}
	ticking = cache_untold_locked(c);
	c->rx_ticking = ticking;
	idle_ms = c->cache_idle_ms;
	if (c->cache_tick_reset) {
		c->cache_tick_reset = false;
		c->cache_tick_at_ms = 0;
	}
	now = now_ms();
	if (ticking) {
		/* Ticks keep time however busy the connection is: a status poll must not hold them off. */
		if (c->cache_tick_at_ms == 0)
			c->cache_tick_at_ms = now + idle_ms;
		if (now >= c->cache_tick_at_ms) {
			pthread_mutex_unlock(&c->lock);
			cache_tick(c);
			c->cache_tick_at_ms = now + idle_ms;
			return RX_LOOK_AGAIN; /* what is left untold decides whether to go on ticking */
		}
		timeout_ms = (int)(c->cache_tick_at_ms - now);
	} else {
		c->cache_tick_at_ms = 0;
	}
	if (c->reading || (!c->closing && now < c->last_call_ms + CONN_WATCH_MS)) {
		/* The calls read what comes: look again once they have stopped (a caller reading: a while later). */
		uint64_t wait_ms = c->reading ? CONN_WATCH_MS : c->last_call_ms + CONN_WATCH_MS - now;

		if (timeout_ms < 0 || wait_ms < (uint64_t)timeout_ms)
			timeout_ms = (int)wait_ms;
		nfds = 1;
	} else if (!ticking && c->cache_limit_bytes == 0) {
		c->reading = true;
		c->rx_blocking = true;
		pthread_mutex_unlock(&c->lock);
		c->cache_tick_at_ms = 0;
		*blocking = true;
		return RX_READ;
	}
	pthread_mutex_unlock(&c->lock);
	if (poll(p, nfds, timeout_ms) < 0 && errno != EINTR)
		p[1].revents = POLLERR; /* the recv says what is wrong */
	if (p[0].revents & POLLIN) {
		uint64_t n;

		/* Level-triggered: a write before this poll (or during it) is never lost. */
		if (read(c->wake_fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
			p[1].revents = POLLERR;
	}
	/* Readable, hung up or failed: the recv says which, unless a caller took the read side first. */
	if (nfds < 2 || !p[1].revents)
		return RX_LOOK_AGAIN;
	pthread_mutex_lock(&c->lock);
	if (c->reading) {
		pthread_mutex_unlock(&c->lock);
		return RX_LOOK_AGAIN;
	}
	c->reading = true;
	pthread_mutex_unlock(&c->lock);
	return RX_READ;
}

static void *receiver_main(void *arg)
{
	pb_client *c = arg;
	int fds[PB_MAX_FDS_PER_MSG];
	char reason[sizeof(c->dead_reason)];
	size_t nfds;
	ssize_t n;

	for (;;) {
		for (;;) {
			enum rx_wait how;
			bool blocking;
			Reply *rep;

			how = receiver_wait(c, &blocking);
			if (how == RX_LOOK_AGAIN)
				continue;
			if (how == RX_BROKEN) {
				pthread_mutex_lock(&c->lock);
				snprintf(reason, sizeof(reason), "%s", c->rx_failed_reason);
				pthread_mutex_unlock(&c->lock);
				break;
			}
			/* Not blocking: a caller may have read what the poll saw. */
			n = wire_recv_flags(c->sock, c->rxbuf, PB_MAX_MSG_BYTES, fds, PB_MAX_FDS_PER_MSG, &nfds,
					    blocking ? 0 : MSG_DONTWAIT);
			if (n > 0)
				__atomic_store_n(&c->rx_got, true, __ATOMIC_RELEASE);
			rep = n > 0 ? pinbroker__v1__reply__unpack(NULL, (size_t)n, c->rxbuf) : NULL;
			/* Dispatched before the read side goes: packets are delivered in the order they came. */
			if (rep)
				conn_dispatch(c, rep, fds, nfds);
			else if (n > 0)
				wire_close_fds(fds, nfds);
			pthread_mutex_lock(&c->lock);
			c->rx_blocking = false;
			conn_end_read_locked(c);
			pthread_mutex_unlock(&c->lock);
			if (rep || n == -EAGAIN)
				continue;
			if (n == 0)
				snprintf(reason, sizeof(reason), "pinbrokerd closed the connection");
			else if (n < 0)
				snprintf(reason, sizeof(reason), "receiving: %s", strerror((int)-n));
			else
				snprintf(reason, sizeof(reason), "malformed packet from pinbrokerd");
			break;
		}

		/* The revokes callers read before the hang-up send their releases while the connection still takes them. */
		pthread_mutex_lock(&c->lock);
		conn_run_revokes_locked(c);
		pthread_mutex_unlock(&c->lock);
		/* Hang up for real, so the daemon returns our leases even if it was we who saw garbage. */
		shutdown(c->sock, SHUT_RDWR);
		pthread_mutex_lock(&c->lock);
		c->dead = -ECONNRESET;
		snprintf(c->dead_reason, sizeof(c->dead_reason), "%s", reason);
		/* Every call in flight fails now; the next one reconnects. */
		for (struct waiter *w = c->waiters; w; w = w->next)
			if (!w->done) {
				w->err = -ECONNRESET;
				w->done = true;
				w->revokes_at_done = c->revokes_queued;
			}
		pthread_cond_broadcast(&c->cond);
		/* A caller in its recv sees the hang-up too: the socket is not replaced under it. Then the revokes it read. */
		while (c->reading) {
			/* A reader may wait on a full revoke queue: empty it, or each waits for the other. */
			conn_run_revokes_locked(c);
			if (c->reading)
				pthread_cond_wait(&c->cond, &c->lock);
		}
		conn_run_revokes_locked(c);
		c->rx_failed = 0;
		if (c->closing) {
			pthread_mutex_unlock(&c->lock);
			break;
		}
		snprintf(c->dead_reason, sizeof(c->dead_reason), "%.140s; reconnecting", reason);
		pthread_mutex_unlock(&c->lock);
		if (reconnect(c) < 0)
			break;
	}
	/* No more revokes will run: no call waits for them. */
	pthread_mutex_lock(&c->lock);
	c->revokes_run = c->revokes_queued;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

int receiver_start(pb_client *c)
{
	sigset_t all, old;
	int r;

	/* The receiver thread takes no signals: they belong to the application's threads. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	r = -pthread_create(&c->receiver, NULL, receiver_main, c);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r < 0)
		return err_set(r, "cannot start the receiver thread: %s", strerror(-r));
	c->receiver_started = true;
	return 0;
}

void receiver_stop(pb_client *c)
{
	pthread_mutex_lock(&c->lock);
	c->closing = true;
	pthread_cond_broadcast(&c->cond); /* wakes a reconnect backoff */
	pthread_mutex_unlock(&c->lock);
	{
		uint64_t one = 1;
		/* And a receiver leaving the socket to the calls: it watches it now, for the daemon's close. */
		ssize_t w = write(c->wake_fd, &one, sizeof(one));

		(void)w;
	}
	/*
	 * Half-close, so the daemon still reads the pipelined RELEASEs and answers
	 * them (a full shutdown made its first answer fail, and it dropped the
	 * connection with the later RELEASEs unread: those leases then stayed
	 * counted until this process exited). The receiver drains the answers and
	 * sees EOF when the daemon closes; a daemon that does not close within
	 * DISCONNECT_DRAIN_MS is cut off.
	 */
	shutdown(c->sock, SHUT_WR);
	if (c->receiver_started) {
		struct timespec until;

		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += DISCONNECT_DRAIN_MS / 1000;
		until.tv_nsec += (long)(DISCONNECT_DRAIN_MS % 1000) * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		if (pthread_timedjoin_np(c->receiver, NULL, &until) != 0) {
			shutdown(c->sock, SHUT_RDWR);
			pthread_join(c->receiver, NULL);
		}
	} else {
		shutdown(c->sock, SHUT_RDWR);
	}
}

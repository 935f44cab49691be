/* SPDX-License-Identifier: MIT */
/* The socket shell: listening, accepting with peer credentials, per-connection packet I/O and limits. */
#define _GNU_SOURCE
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "admin.h"
#include "broker.h"
#include "config.h"
#include "daemon.h"
#include "jobs-watch.h"
#include "jobs.h"
#include "listen.h"
#include "log.h"
#include "peer-ns.h"
#include "peer-tenant.h"
#include "request.h"
#include "tenant.h"
#include "timer-clock.h"
#include "util.h"
#include "wire.h"

/* Supplementary groups read from a peer; the kernel truncates beyond this. */
#define NGROUPS_MAX_PEER 1024
/* Packets read per wake-up per connection, so one busy client cannot starve the rest. */
#define READS_PER_WAKEUP 32
/* Packets read, at its reap, from a peer that closed its end first (serve_queued_releases). */
#define QUEUED_RELEASES_MAX 4096

/* Linux 6.5: a pidfd for the peer, taken by the kernel at connect(), immune to pid reuse. */
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

struct outpkt {
	struct outpkt *next;
	size_t len;
	size_t nfds;
	int fds[PB_MAX_FDS_PER_MSG];
	uint8_t buf[];
};

struct server {
	struct broker *broker;
	int listen_fd;
	bool own_socket; /* we created (and will unlink) the path */
	char *path;
	ev_io accept_io;
	struct conn *conns; /* live */
	size_t nconns;
	struct conn *dead; /* closed, waiting for server_reap */
	ev_check reap_check;
	size_t queued_bytes; /* over every connection's reply queue */
	size_t queued_fds;
	uint64_t next_conn_id;
	uint8_t *rxbuf; /* max-message-bytes + 1: one byte more tells "too long" */
	size_t rxcap;
	char admin_group[64]; /* the admin-group value admin_gid was resolved for */
	bool admin_gid_known;
	gid_t admin_gid;
	bool admin_unreadable_warned; /* the first root peer refused for unreadable namespaces is a warning */
	unsigned stall_ms;            /* SERVER_ACCEPT_STALL_ENV */
	struct tenants *tenants;      /* the connections' tenants (conn's tenant) */
};

static void conn_io_cb(struct ev_loop *loop, ev_io *w, int revents);
static void conn_handshake_cb(struct ev_loop *loop, ev_timer *w, int revents);

/* A member of admin-group: its primary group, or among the supplementary groups the kernel recorded at connect. */
static bool peer_in_admin_group(struct server *s, int fd, gid_t gid)
{
	const struct config *cfg = daemon_of(s->broker)->cfg;
	gid_t groups[NGROUPS_MAX_PEER];
	socklen_t len = sizeof(groups);

	if (!cfg->admin_group || !cfg->admin_group[0])
		return false;
	/* The group name is resolved once per configured value, not on every accept. */
	if (strcmp(s->admin_group, cfg->admin_group) != 0) {
		struct group *gr = getgrnam(cfg->admin_group);

		snprintf(s->admin_group, sizeof(s->admin_group), "%s", cfg->admin_group);
		s->admin_gid_known = gr != NULL;
		if (gr)
			s->admin_gid = gr->gr_gid;
		else
			log_warnx("admin-group '%s' does not exist: only root is admin", cfg->admin_group);
	}
	if (!s->admin_gid_known)
		return false;
	if (gid == s->admin_gid)
		return true;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0)
		return false;
	for (size_t i = 0; i < len / sizeof(gid_t); i++)
		if (groups[i] == s->admin_gid)
			return true;
	return false;
}

/*
 * uid 0 or a member of admin-group, from the daemon's own pid and user namespaces (core/admin.h). A root
 * process of a container is an ordinary tenant; one whose namespaces cannot be read is refused too, with a
 * warning the first time (then at debug, so a container cannot flood the journal).
 */
static bool peer_is_admin(struct server *s, int fd, const struct ucred *cred, int pidfd)
{
	struct admin_facts f = { .root = cred->uid == 0 };
	enum admin_verdict v;
	char why[256];

	f.in_group = !f.root && peer_in_admin_group(s, fd, cred->gid);
	if (!admin_candidate(&f))
		return false;
	peer_ns_read(pidfd, cred->pid, &f, why, sizeof(why));
	v = admin_decide(&f);
	if (v == ADMIN_NS_UNREADABLE && !s->admin_unreadable_warned) {
		s->admin_unreadable_warned = true;
		log_warnx("uid %u pid %d is not admin: %s: %s; it is served as an ordinary tenant (further ones are "
			  "logged at debug level)",
			  cred->uid, cred->pid, admin_verdict_text(v), why);
	} else if (v != ADMIN_YES) {
		log_debug("uid %u pid %d is not admin: %s%s%s", cred->uid, cred->pid, admin_verdict_text(v),
			  why[0] ? ": " : "", why);
	}
	return v == ADMIN_YES;
}

/*
 * A pidfd for the peer. SO_PEERPIDFD (Linux 6.5) names the process that
 * called connect(), whatever happened to its pid since. Older kernels fall
 * back to pidfd_open() of SO_PEERCRED's pid: if the peer exited and its pid
 * was reused before accept, that pidfd names the wrong process, so revoke
 * enforcement additionally checks the process's uid and its mappings of the
 * lease (holders.c) before it signals anything. -1 without pidfds at all.
 */
static int peer_pidfd(int fd, pid_t pid, bool *from_peer)
{
	socklen_t len = sizeof(int);
	int pidfd = -1;

	*from_peer = false;
	/* Test only (PINBROKER_TEST_NO_PIDFD=all): no pidfd of any kind, as on a kernel without them. */
	if (sys_pidfd_disabled())
		return -1;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0 && pidfd >= 0) {
		*from_peer = true;
		fcntl(pidfd, F_SETFD, FD_CLOEXEC);
		return pidfd;
	}
	/* ESRCH: the peer is already gone; nothing to watch or signal. */
	if (errno == ESRCH)
		return -1;
	pidfd = sys_pidfd_open(pid, 0);
	if (pidfd >= 0)
		fcntl(pidfd, F_SETFD, FD_CLOEXEC);
	return pidfd;
}

static size_t conns_of_uid(const struct server *s, uid_t uid)
{
	size_t n = 0;

	for (struct conn *c = s->conns; c; c = c->next)
		if (c->uid == uid && !c->closing)
			n++;
	return n;
}

int server_adopt(struct server *s, int fd, const struct ucred *cred, struct conn **ret)
{
	const struct config *cfg = daemon_of(s->broker)->cfg;
	struct ev_loop *loop = daemon_of(s->broker)->loop;
	struct conn *c;

	c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return -ENOMEM;
	}
	c->srv = s;
	c->broker = s->broker;
	c->id = ++s->next_conn_id;
	c->fd = fd;
	c->pid = cred->pid;
	c->uid = cred->uid;
	c->gid = cred->gid;
	timer_clock_stall(s->stall_ms); /* a long loop turn before this connection came */
	c->connected_ms = now_ms();
	c->pidfd = peer_pidfd(fd, cred->pid, &c->pidfd_from_peer);
	c->admin = peer_is_admin(s, fd, cred, c->pidfd);
	c->cgroup = jobs_watch_cgroup_of(s->broker, cred->pid);
	c->tenant = peer_tenant(s->tenants, c->uid, c->pidfd, c->pid, c->cgroup, cfg->proc_root);
	c->job_unknown = s->broker->jobs && !c->cgroup;
	s->broker->job_unknown_clients += c->job_unknown;
	ev_io_init(&c->io, conn_io_cb, fd, EV_READ);
	c->io.data = c;
	ev_io_start(loop, &c->io);
	ev_timer_init(&c->handshake, conn_handshake_cb, cfg->handshake_timeout_ms / 1000.0, 0.);
	c->handshake.data = c;
	ev_timer_start(loop, &c->handshake);

	c->next = s->conns;
	if (s->conns)
		s->conns->prev = c;
	s->conns = c;
	s->nconns++;
	log_debug("connection %llu from pid %d uid %u%s, pidfd %s", (unsigned long long)c->id, c->pid, c->uid,
		  c->admin ? " (admin)" : "",
		  c->pidfd_from_peer ? "from SO_PEERPIDFD"
		  : c->pidfd >= 0    ? "from pidfd_open (pid reuse possible)"
				     : "none");
	if (ret)
		*ret = c;
	return 0;
}

/* Close the oldest connection (of uid, or of anyone for (uid_t)-1) still waiting to say HELLO. */
static void evict_silent(struct server *s, uid_t uid)
{
	struct conn *victim = NULL;

	for (struct conn *c = s->conns; c; c = c->next)
		if (!c->hello_done && !c->closing && (uid == (uid_t)-1 || c->uid == uid) &&
		    (!victim || c->connected_ms <= victim->connected_ms))
			victim = c;
	if (victim)
		server_close(victim, "evicted: connection limit reached and it never sent HELLO");
}

static void accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct server *s = w->data;
	const struct config *cfg = daemon_of(s->broker)->cfg;

	for (int i = 0; i < 64; i++) {
		struct ucred cred;
		socklen_t len = sizeof(cred);
		int fd;

		fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)
				return;
			if (errno == EMFILE || errno == ENFILE) {
				/* Out of fds: stop accepting until a connection closes, or the loop spins. */
				log_warn("accept failed, pausing new connections");
				ev_io_stop(loop, &s->accept_io);
				return;
			}
			log_warn("accept failed, ignoring");
			return;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
			log_warn("SO_PEERCRED failed, dropping connection");
			close(fd);
			continue;
		}
		/*
		 * At a limit, a peer that never said HELLO gives way to the newcomer
		 * (oldest first), so a flood of silent connections cannot lock out
		 * pinctl; only when every slot is a live client is the newcomer refused.
		 */
		if (s->nconns >= cfg->max_connections)
			evict_silent(s, (uid_t)-1);
		if (conns_of_uid(s, cred.uid) >= cfg->max_connections_per_uid)
			evict_silent(s, cred.uid);
		if (s->nconns >= cfg->max_connections || conns_of_uid(s, cred.uid) >= cfg->max_connections_per_uid) {
			log_debug("refusing connection from pid %d uid %u: connection limit reached", cred.pid,
				  cred.uid);
			close(fd);
			continue;
		}
		server_adopt(s, fd, &cred, NULL);
	}
}

static void outq_drop(struct conn *c)
{
	struct server *s = c->srv;
	struct outpkt *p, *next;

	for (p = c->outq_head; p; p = next) {
		next = p->next;
		wire_close_fds(p->fds, p->nfds);
		free(p);
	}
	s->queued_bytes -= c->outq_bytes;
	s->queued_fds -= c->outq_fds;
	c->outq_head = c->outq_tail = NULL;
	c->outq_len = c->outq_bytes = c->outq_fds = 0;
}

void server_close(struct conn *c, const char *why)
{
	struct server *s = c->srv;
	struct ev_loop *loop = daemon_of(s->broker)->loop;

	if (c->closing)
		return;
	c->closing = true;
	log_debug("closing connection %llu (pid %d uid %u): %s", (unsigned long long)c->id, c->pid, c->uid, why);
	ev_io_stop(loop, &c->io);
	ev_timer_stop(loop, &c->handshake);
	outq_drop(c);
	/* Off the live list, onto the dead one: nothing finds it any more, but its memory stays
	 * valid for whoever is still holding the pointer in this callback. */
	if (c->prev)
		c->prev->next = c->next;
	else
		s->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	s->nconns--;
	c->prev = NULL;
	c->next = s->dead;
	s->dead = c;
}

/*
 * An error that says the peer's end is closed: EPIPE, or ECONNRESET when it closed with answers of ours unread. The
 * kernel reports that reset once, before the packets still queued here, which the next receive returns.
 */
static bool peer_closed(int r)
{
	return r == -EPIPE || r == -ECONNRESET;
}

/*
 * A send found the peer's end closed (EPIPE), perhaps with requests still queued here: pb_disconnect pipelines a
 * RELEASE per lease, each unmapped first, and closes without awaiting the answers. At the reap, before its leases
 * go, those are served (request_dispatch serves nothing else once peer_gone is set; no answer is sent to a closing
 * connection), so their memory stays warm for the tenant rather than counting as ended without a release. What
 * lies past QUEUED_RELEASES_MAX packets, or fails to read, goes with the connection as before.
 */
static void serve_queued_releases(struct server *s, struct conn *c)
{
	for (int i = 0; i < QUEUED_RELEASES_MAX; i++) {
		size_t nfds = 0;
		int fds[1];
		ssize_t n = wire_recv(c->fd, s->rxbuf, s->rxcap, fds, 0, &nfds);

		if (n == -ECONNRESET)
			continue;
		if (n <= 0 || (size_t)n >= s->rxcap)
			break;
		request_dispatch(c, s->rxbuf, (size_t)n);
	}
}

void server_reap(struct server *s)
{
	struct ev_loop *loop = daemon_of(s->broker)->loop;
	struct conn *c;
	bool freed = false;

	/* Returning leases can grant waiting acquires, whose sends can close more connections. */
	while ((c = s->dead)) {
		s->dead = c->next;
		if (c->peer_gone)
			serve_queued_releases(s, c);
		request_conn_closed(s->broker, c);
		if (s->broker->jobs)
			jobs_cgroup_put(s->broker->jobs, c->cgroup);
		tenants_put(s->tenants, c->tenant);
		s->broker->job_unknown_clients -= c->job_unknown;
		close(c->fd);
		if (c->pidfd >= 0)
			close(c->pidfd);
		free(c);
		freed = true;
	}
	/* A slot freed: accept again if EMFILE had paused us. */
	if (freed && !ev_is_active(&s->accept_io) && s->listen_fd >= 0)
		ev_io_start(loop, &s->accept_io);
}

static void reap_cb(struct ev_loop *loop, ev_check *w, int revents)
{
	struct server *s = w->data;

	if (s->dead)
		server_reap(s);
}

static int flush_outq(struct conn *c)
{
	struct outpkt *p;
	int r;

	while ((p = c->outq_head)) {
		r = wire_send(c->fd, p->buf, p->len, p->fds, p->nfds);
		if (r == -EAGAIN)
			return 0;
		if (r < 0)
			return r;
		c->outq_head = p->next;
		if (!c->outq_head)
			c->outq_tail = NULL;
		c->outq_len--;
		c->outq_bytes -= p->len;
		c->outq_fds -= p->nfds;
		c->srv->queued_bytes -= p->len;
		c->srv->queued_fds -= p->nfds;
		wire_close_fds(p->fds, p->nfds);
		free(p);
	}
	return 0;
}

static void update_events(struct conn *c)
{
	struct ev_loop *loop = daemon_of(c->srv->broker)->loop;
	int want = EV_READ | (c->outq_head ? EV_WRITE : 0);

	if (c->io.events != want) {
		ev_io_stop(loop, &c->io);
		ev_io_set(&c->io, c->fd, want);
		ev_io_start(loop, &c->io);
	}
}

/* All queues together are over max-queued-bytes: drop the connection holding the most. */
static void enforce_total_queue(struct server *s)
{
	const struct config *cfg = daemon_of(s->broker)->cfg;
	struct conn *worst = NULL;

	if (s->queued_bytes <= cfg->max_queued_bytes)
		return;
	for (struct conn *c = s->conns; c; c = c->next)
		if (!worst || c->outq_bytes > worst->outq_bytes)
			worst = c;
	if (!worst)
		return;
	log_warnx("closing connection %llu (pid %d uid %u): %zu reply bytes unread while all clients together "
		  "have %zu queued (max-queued-bytes = %llu)",
		  (unsigned long long)worst->id, worst->pid, worst->uid, worst->outq_bytes, s->queued_bytes,
		  (unsigned long long)cfg->max_queued_bytes);
	server_close(worst, "max-queued-bytes reached");
}

int server_send(struct conn *c, const Pinbroker__V1__Reply *reply, const int *fds, size_t nfds)
{
	const struct config *cfg = daemon_of(c->broker)->cfg;
	size_t len = pinbroker__v1__reply__get_packed_size(reply);
	struct server *s = c->srv;
	struct outpkt *p;
	int r;

	if (c->closing)
		return -ECONNRESET;
	if (len > PB_MAX_MSG_BYTES) {
		log_warnx("reply of %zu bytes is over the %d byte packet limit, dropping connection %llu", len,
			  PB_MAX_MSG_BYTES, (unsigned long long)c->id);
		server_close(c, "reply too large");
		return -EMSGSIZE;
	}
	p = malloc(sizeof(*p) + len);
	if (!p) {
		server_close(c, "out of memory");
		return -ENOMEM;
	}
	p->next = NULL;
	p->len = pinbroker__v1__reply__pack(reply, p->buf);
	p->nfds = 0;

	if (!c->outq_head) {
		r = wire_send(c->fd, p->buf, p->len, fds, nfds);
		if (r == 0) {
			free(p);
			return 0;
		}
		if (r != -EAGAIN) {
			free(p);
			c->peer_gone = peer_closed(r);
			server_close(c, "send failed");
			return r;
		}
	}
	if (c->outq_bytes + p->len > cfg->max_queued_bytes_per_conn) {
		log_warnx("closing connection %llu (pid %d uid %u): it does not read its replies, %zu bytes queued "
			  "(max-queued-bytes-per-connection = %llu)",
			  (unsigned long long)c->id, c->pid, c->uid, c->outq_bytes + p->len,
			  (unsigned long long)cfg->max_queued_bytes_per_conn);
		free(p);
		server_close(c, "max-queued-bytes-per-connection reached");
		return -ENOBUFS;
	}
	if (s->queued_fds + nfds > BROKER_QUEUED_FDS_MAX) {
		log_warnx("closing connection %llu (pid %d uid %u): %zu file descriptors already wait in unread "
			  "replies of all clients (at most %d)",
			  (unsigned long long)c->id, c->pid, c->uid, s->queued_fds, BROKER_QUEUED_FDS_MAX);
		free(p);
		server_close(c, "too many queued file descriptors");
		return -ENOBUFS;
	}
	/* Queued packets own duplicates: the originals belong to pool chunks. */
	for (size_t i = 0; i < nfds; i++) {
		p->fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
		if (p->fds[i] < 0) {
			r = -errno;
			p->nfds = i;
			wire_close_fds(p->fds, p->nfds);
			free(p);
			server_close(c, "out of file descriptors");
			return r;
		}
	}
	p->nfds = nfds;
	if (c->outq_tail)
		c->outq_tail->next = p;
	else
		c->outq_head = p;
	c->outq_tail = p;
	c->outq_len++;
	c->outq_bytes += p->len;
	c->outq_fds += nfds;
	s->queued_bytes += p->len;
	s->queued_fds += nfds;
	update_events(c);
	enforce_total_queue(s);
	return c->closing ? -ENOBUFS : 0;
}

static void conn_handshake_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct conn *c = w->data;

	/* Accepted late in a long loop turn, the timer fires early: the clock decides (timer-clock.h). */
	if (timer_clock_early(loop, w, c->connected_ms, daemon_of(c->broker)->cfg->handshake_timeout_ms))
		return;
	if (!c->hello_done)
		server_close(c, "no HELLO within handshake-timeout-ms");
}

static void conn_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct conn *c = w->data;
	struct server *s = c->srv;

	if (revents & EV_WRITE) {
		int r = flush_outq(c);

		if (r < 0) {
			c->peer_gone = peer_closed(r);
			server_close(c, "send failed");
			return;
		}
		update_events(c);
	}
	if (!(revents & EV_READ))
		return;

	for (int i = 0; i < READS_PER_WAKEUP; i++) {
		size_t nfds = 0;
		int fds[1];
		ssize_t n;

		n = wire_recv(c->fd, s->rxbuf, s->rxcap, fds, 0, &nfds);
		if (n == -EAGAIN)
			return;
		if (n == 0 || n == -ECONNRESET) {
			c->peer_gone |= n ==
					-ECONNRESET; /* its queued RELEASEs come after the reset: served at the reap */
			server_close(c, "peer closed the connection");
			return;
		}
		if (n < 0) {
			server_close(c, n == -EMSGSIZE  ? "packet over max-message-bytes"
					: n == -EBADMSG ? "packet carried file descriptors or bad control data"
							: "receive failed");
			return;
		}
		if ((size_t)n >= s->rxcap) {
			server_close(c, "packet over max-message-bytes");
			return;
		}
		request_dispatch(c, s->rxbuf, (size_t)n);
		/* The handler may have closed the connection; c itself lives until the reaper runs. */
		if (c->closing)
			return;
	}
}

int server_new(struct broker *b, int listen_fd, struct server **ret)
{
	struct server *s;
	int r;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->broker = b;
	s->stall_ms = timer_clock_stall_ms(SERVER_ACCEPT_STALL_ENV);
	s->rxcap = (size_t)daemon_of(b)->cfg->max_message_bytes + 1;
	s->rxbuf = malloc(s->rxcap);
	r = tenants_new(&s->tenants);
	b->tenants = s->tenants;
	if (!s->rxbuf || r < 0) {
		r = -ENOMEM;
		goto fail;
	}
	if (listen_fd >= 0) {
		int flags = fcntl(listen_fd, F_GETFL);

		if (flags >= 0)
			fcntl(listen_fd, F_SETFL, flags | O_NONBLOCK);
		s->listen_fd = listen_fd;
	} else {
		r = listen_unix_socket(daemon_of(b)->cfg->socket_path, &s->listen_fd);
		if (r < 0)
			goto fail;
		s->own_socket = true;
		s->path = strdup(daemon_of(b)->cfg->socket_path);
	}
	ev_io_init(&s->accept_io, accept_cb, s->listen_fd, EV_READ);
	s->accept_io.data = s;
	ev_io_start(daemon_of(b)->loop, &s->accept_io);
	/* Lowest priority: runs after every other callback of the iteration that closed a connection. */
	ev_check_init(&s->reap_check, reap_cb);
	ev_set_priority(&s->reap_check, EV_MINPRI);
	s->reap_check.data = s;
	ev_check_start(daemon_of(b)->loop, &s->reap_check);
	ev_unref(daemon_of(b)->loop); /* the reaper alone must not keep the loop running */
	daemon_of(b)->conn_io = &server_conn_io;
	*ret = s;
	return 0;
fail:
	b->tenants = NULL;
	tenants_free(s->tenants);
	free(s->rxbuf);
	free(s);
	return r;
}

void server_free(struct server *s)
{
	if (!s)
		return;
	while (s->conns)
		server_close(s->conns, "daemon stopping");
	server_reap(s);
	ev_ref(daemon_of(s->broker)->loop);
	ev_check_stop(daemon_of(s->broker)->loop, &s->reap_check);
	ev_io_stop(daemon_of(s->broker)->loop, &s->accept_io);
	if (s->listen_fd >= 0)
		close(s->listen_fd);
	if (s->own_socket && s->path)
		listen_unlink(s->path);
	free(s->path);
	free(s->rxbuf);
	s->broker->tenants = NULL;
	tenants_free(s->tenants);
	free(s);
}

int server_listen_fd(const struct server *s)
{
	return s->listen_fd;
}

struct conn *server_conns(const struct server *s)
{
	return s->conns;
}

size_t server_conn_count(const struct server *s)
{
	return s->nconns;
}

struct conn *server_find_conn(const struct server *s, uint64_t id)
{
	for (struct conn *c = s->conns; c; c = c->next)
		if (c->id == id)
			return c;
	return NULL;
}

static void conn_hello_done(struct conn *c)
{
	ev_timer_stop(daemon_of(c->broker)->loop, &c->handshake);
}

static struct conn *broker_conns(const struct broker *b)
{
	return daemon_of(b)->server ? server_conns(daemon_of(b)->server) : NULL;
}

static size_t broker_conn_count(const struct broker *b)
{
	return daemon_of(b)->server ? server_conn_count(daemon_of(b)->server) : 0;
}

const struct conn_io server_conn_io = {
	.send = server_send,
	.close = server_close,
	.hello_done = conn_hello_done,
	.first = broker_conns,
	.count = broker_conn_count,
};

void server_broadcast(struct server *s, const Pinbroker__V1__Reply *reply)
{
	struct conn *c, *next;

	for (c = s->conns; c; c = next) {
		next = c->next; /* a failed send moves c to the dead list */
		server_send(c, reply, NULL, 0);
	}
}

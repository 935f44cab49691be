/* SPDX-License-Identifier: MIT */
/* Request dispatch (one table, one gate), lease replies with fd batches, revocation and waiting acquires. */
#define _GNU_SOURCE
#include "request.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "budget.h"
#include "config.h"
#include "holders.h"
#include "lease.h"
#include "log.h"
#include "monitor.h"
#include "pool.h"
#include "recovery.h"
#include "reload.h"
#include "request-int.h"
#include "server.h"
#include "text.h"
#include "util.h"
#include "wire.h"

/* While critical, look again this often whether more leases must go. */
#define RECLAIM_STEP_MS 100

enum {
	REQ_NEEDS_HELLO = 1u << 0,            /* refused before HELLO */
	REQ_ADMIN = 1u << 1,                  /* uid 0 or admin-group only */
	REQ_TAKES_MEMORY = 1u << 2,           /* charges new bytes (a pool lease or a registration): refused while critical */
	REQ_ALLOWED_WHILE_STOPPING = 1u << 3, /* served while the daemon stops; every other kind is refused */
};

typedef Pinbroker__V1__Request Request;
typedef Pinbroker__V1__Reply Reply;

struct request_kind {
	Pinbroker__V1__Request__BodyCase body;
	const char *name;
	unsigned flags;
	void (*handler)(struct conn *c, const Request *req);
};

/* An acquire that waits for memory (ACQUIRE_FLAG_WAIT, or behind a reclaim of cached-idle leases). */
struct pending {
	struct pending *next;
	struct broker *broker;
	struct conn *conn;           /* valid while queued: a closing conn's pendings go at its reap */
	uint64_t seq;
	struct acquire_args args;
	char label[LEASE_LABEL_MAX];
	uint64_t enqueued_ms;
	ev_timer timeout;
};

/* Leases of a closed connection that were overdue: their process may still map them. */
struct ghost {
	struct ghost *next;
	struct broker *broker;
	int pidfd;
	pid_t pid;
	ev_io io;
	size_t nids;
	uint64_t *ids;
};

struct revoker {
	ev_timer deadline_timer;
	ev_timer reclaim_timer;
	ev_timer shrink_timer;
	struct pending *pending;
	uint32_t npending;
	struct ghost *ghosts;
	struct monitor_event ring[REQUEST_REVOCATIONS_MAX];
	size_t ring_count;
	size_t ring_next;
};

static void arm_deadline_timer(struct broker *b);

/* ---------------------------------------------------------------- replies */

void reply_init(Reply *r, uint64_t seq, Pinbroker__V1__StatusCode status, const char *message)
{
	pinbroker__v1__reply__init(r);
	r->has_seq = true;
	r->seq = seq;
	r->status = status;
	r->message = (char *)message;
}

static void reply_status(struct conn *c, uint64_t seq, Pinbroker__V1__StatusCode status, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void reply_status(struct conn *c, uint64_t seq, Pinbroker__V1__StatusCode status, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	Reply r;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	reply_init(&r, seq, status, msg);
	server_send(c, &r, NULL, 0);
}

static struct conn *owner_conn(const struct broker *b, const struct lease *l)
{
	/* owner is a struct conn * while the connection lives; NULL for ghosts and orphans. */
	return l->owner;
}

static void record_revocation(struct broker *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void record_revocation(struct broker *b, const char *fmt, ...)
{
	struct revoker *rv = b->revoker;
	struct monitor_event *e = &rv->ring[rv->ring_next];
	va_list ap;

	e->when_ms = now_ms();
	va_start(ap, fmt);
	vsnprintf(e->text, sizeof(e->text), fmt, ap);
	va_end(ap);
	rv->ring_next = (rv->ring_next + 1) % REQUEST_REVOCATIONS_MAX;
	if (rv->ring_count < REQUEST_REVOCATIONS_MAX)
		rv->ring_count++;
}

size_t request_revocations(const struct broker *b, struct monitor_event *out, size_t max)
{
	const struct revoker *rv = b->revoker;
	size_t n = 0;

	if (!rv)
		return 0;
	for (size_t i = 0; i < rv->ring_count && n < max; i++) {
		size_t idx = (rv->ring_next + REQUEST_REVOCATIONS_MAX - 1 - i) % REQUEST_REVOCATIONS_MAX;

		out[n++] = rv->ring[idx];
	}
	return n;
}

uint32_t request_waiting_count(const struct broker *b)
{
	return b->revoker ? b->revoker->npending : 0;
}

/* ------------------------------------------------------------- lease send */

Pinbroker__V1__Priority prio_to_wire(enum lease_priority p)
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

static int send_lease(struct conn *c, uint64_t seq, const struct lease *l, bool attached)
{
	struct broker *b = c->broker;
	Pinbroker__V1__Lease lm = PINBROKER__V1__LEASE__INIT;
	uint64_t *sizes = NULL;
	int *fds = NULL;
	size_t first, n = l->nchunks;
	bool huge = n > 0;
	Reply r;
	int ret = -ENOMEM;

	sizes = calloc(n ? n : 1, sizeof(*sizes));
	fds = calloc(n ? n : 1, sizeof(*fds));
	if (!sizes || !fds)
		goto out;
	for (size_t i = 0; i < n; i++) {
		sizes[i] = l->chunks[i]->bytes;
		fds[i] = l->chunks[i]->fd;
		huge = huge && l->chunks[i]->hugetlb;
	}
	first = n < PB_MAX_FDS_PER_MSG ? n : PB_MAX_FDS_PER_MSG;
	lm.lease_id = l->id;
	lm.size = l->bytes;
	lm.page_size = pool_page_size(b->pool);
	lm.n_chunk_bytes = n;
	lm.chunk_bytes = sizes;
	lm.fds_in_reply = (uint32_t)first;
	lm.has_hugetlb = true;
	lm.hugetlb = huge;
	lm.has_priority = true;
	lm.priority = prio_to_wire(l->priority);
	if (attached) {
		lm.has_attached = true;
		lm.attached = true;
	}
	lm.has_registration = l->registration;
	lm.registration = l->registration;
	lm.has_no_revoke = l->no_revoke;
	lm.no_revoke = l->no_revoke;
	/* Recorded as lent before its fds leave: a crash from here on finds these chunks held. */
	recovery_lent(b, l);
	reply_init(&r, seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
	r.body_case = PINBROKER__V1__REPLY__BODY_LEASE;
	r.lease = &lm;
	ret = server_send(c, &r, fds, first);
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
		ret = server_send(c, &r, fds + at, k);
	}
out:
	free(sizes);
	free(fds);
	return ret;
}

/* ------------------------------------------------------------ free + grant */

static void after_free(struct broker *b)
{
	struct revoker *rv = b->revoker;

	/* Under pressure, freed memory leaves the pool at once; otherwise the idle
	 * pool above the warm target shrinks after pool-shrink-delay-ms. */
	if (b->state != BROKER_NORMAL)
		broker_trim_pool(b, 0);
	else if (rv && pool_idle_bytes(b->pool) > b->prewarm_bytes) {
		ev_timer_stop(b->loop, &rv->shrink_timer);
		ev_timer_set(&rv->shrink_timer, b->cfg->pool_shrink_delay_ms / 1000.0, 0.);
		ev_timer_start(b->loop, &rv->shrink_timer);
	}
	request_grant_waiting(b);
}

/* c no longer maps l (as its holder, or attached): its counters follow. */
static void conn_lose(struct conn *c, const struct lease *l, bool attached)
{
	if (c->nleases > 0) {
		c->nleases--;
		status_conn_remove(c, l);
	}
	if (attached && c->nattached > 0)
		c->nattached--;
}

/* Free one lease, keeping its holder's and attachers' counts right, and log it. */
static void free_lease(struct broker *b, struct lease *l, const char *why)
{
	struct conn *c = owner_conn(b, l);

	log_event(EV_LEASE_RELEASED, LOG_INFO, l->id, l->uid, l->pid, "lease %llu released (%s): %llu bytes",
		  (unsigned long long)l->id, why, (unsigned long long)l->bytes);
	if (c)
		conn_lose(c, l, false);
	for (size_t i = 0; i < l->nattachers; i++)
		conn_lose(l->attachers[i].owner, l, true);
	broker_free_lease(b, l);
}

/* ----------------------------------------------------------- error mapping */

static void reply_acquire_error(struct conn *c, uint64_t seq, int err, uint64_t size)
{
	struct broker *b = c->broker;
	char a[32], q[32], h[32];

	switch (err) {
	case -EINVAL:
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_SIZE,
			     "size %llu is not a valid lease size: ask for at least 1 byte and less than 2^63",
			     (unsigned long long)size);
		return;
	case -EFBIG:
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_TOO_LARGE,
			     "%s is more than the budget (%s) or the uid quota (%s) can ever lend",
			     format_size(size, a, sizeof(a)), format_size(budget_limit(b->budget), h, sizeof(h)),
			     format_size(budget_uid_quota(b->budget), q, sizeof(q)));
		return;
	case -EDQUOT:
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_OVER_QUOTA,
			     "uid %u already holds %s of its %s quota; %s more would exceed it", c->uid,
			     format_size(budget_uid_leased(b->budget, c->uid), h, sizeof(h)),
			     format_size(budget_uid_quota(b->budget), q, sizeof(q)), format_size(size, a, sizeof(a)));
		return;
	case -ENOSPC:
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_OVER_BUDGET,
			     "pinned budget exhausted: %s of %s leased, %s asked", format_size(budget_leased(b->budget), h, sizeof(h)),
			     format_size(budget_limit(b->budget), q, sizeof(q)), format_size(size, a, sizeof(a)));
		return;
	case -EBUSY:
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_PRESSURE,
			     "host memory is tight: only the free warm pool (%s) is lent now; use pageable memory",
			     format_size(pool_idle_bytes(b->pool), a, sizeof(a)));
		return;
	case -EAGAIN:
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_CRITICAL,
			     "host memory is critical: no pinned memory is lent until it recovers");
		return;
	case -ETIMEDOUT:
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_TIMEOUT,
			     "no pinned memory freed up within the wait timeout");
		return;
	case -EMLINK:
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_LIMIT,
			     "uid %u already holds %llu leases (max-leases-per-uid = %llu); release some first, "
			     "or ask the admin to raise max-leases-per-uid",
			     c->uid, (unsigned long long)budget_uid_leases(b->budget, c->uid),
			     (unsigned long long)b->max_leases_per_uid);
		return;
	case -EMFILE:
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_LIMIT,
			     "uid %u already holds %llu pool chunks (max-chunks-per-uid = %llu); release leases, use "
			     "fewer larger ones, or ask the admin to raise max-chunks-per-uid",
			     c->uid, (unsigned long long)budget_uid_chunks(b->budget, c->uid),
			     (unsigned long long)b->max_chunks_per_uid);
		return;
	case -EXFULL:
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_LIMIT,
			     "uid %u already holds %s in leases that are never revoked (max-no-revoke-per-uid = %s); "
			     "%s more would exceed it: use a lease that can be revoked, or ask the admin to raise "
			     "max-no-revoke-per-uid",
			     c->uid, format_size(budget_uid_no_revoke(b->budget, c->uid), h, sizeof(h)),
			     format_size(b->max_no_revoke_per_uid_bytes, q, sizeof(q)), format_size(size, a, sizeof(a)));
		return;
	case -ENFILE:
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_LIMIT,
			     "the daemon holds %llu pool chunks, all its file descriptors and mappings allow while keeping "
			     "reserve-fds (%u) free; try again later, or raise LimitNOFILE / vm.max_map_count",
			     (unsigned long long)budget_chunks(b->budget), b->cfg->reserve_fds);
		return;
	default:
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_INTERNAL,
			     "the daemon could not create pool memory: %s", strerror(-err));
		return;
	}
}

/* -------------------------------------------------------- waiting acquires */

static void pending_unlink(struct revoker *rv, struct pending *p)
{
	for (struct pending **pp = &rv->pending; *pp; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			rv->npending--;
			return;
		}
}

static void pending_destroy(struct broker *b, struct pending *p)
{
	struct conn *c = p->conn;

	ev_timer_stop(b->loop, &p->timeout);
	pending_unlink(b->revoker, p);
	if (c->npending > 0)
		c->npending--;
	free(p);
}

static void pending_timeout_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct pending *p = w->data;
	struct broker *b = p->broker;
	struct conn *c = p->conn;
	uint64_t seq = p->seq, size = p->args.size;
	uint64_t held = budget_uid_leased(b->budget, c->uid), quota = budget_uid_quota(b->budget);
	char h[32], q[32], a[32];

	pending_destroy(b, p);
	/* Over its own quota, only this uid's releases could have helped: say so, not "nothing freed up". */
	if (size > quota || held > quota - size) {
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_TIMEOUT,
			     "no pinned memory within the wait timeout: uid %u is over quota, holding %s of its %s "
			     "quota with %s more asked; release some of its leases or ask for less",
			     c->uid, format_size(held, h, sizeof(h)), format_size(quota, q, sizeof(q)),
			     format_size(size, a, sizeof(a)));
		return;
	}
	reply_acquire_error(c, seq, -ETIMEDOUT, size);
}

static int prio_rank(enum lease_priority p)
{
	return p == LEASE_PRIO_CRITICAL ? 0 : p == LEASE_PRIO_NORMAL ? 1 : 2;
}

static int pending_add(struct conn *c, uint64_t seq, const struct acquire_args *a, uint32_t timeout_ms)
{
	struct broker *b = c->broker;
	struct revoker *rv = b->revoker;
	struct pending *p, **pp;

	if (rv->npending >= b->cfg->max_pending_acquires)
		return -EUSERS;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->broker = b;
	p->conn = c;
	p->seq = seq;
	p->args = *a;
	if (a->label)
		snprintf(p->label, sizeof(p->label), "%s", a->label);
	p->args.label = p->label;
	p->enqueued_ms = now_ms();
	ev_timer_init(&p->timeout, pending_timeout_cb, timeout_ms / 1000.0, 0.);
	p->timeout.data = p;
	ev_timer_start(b->loop, &p->timeout);
	/* Priority order, FIFO within a class. */
	for (pp = &rv->pending; *pp && prio_rank((*pp)->args.priority) <= prio_rank(a->priority); pp = &(*pp)->next)
		;
	p->next = *pp;
	*pp = p;
	rv->npending++;
	c->npending++;
	return 0;
}

static void grant(struct conn *c, uint64_t seq, struct lease *l)
{
	char label[4 * LEASE_LABEL_MAX]; /* escaped: a label from an older daemon's fd store was never checked */

	c->nleases++;
	status_conn_add(c, l);
	log_event(EV_LEASE_GRANTED, LOG_INFO, l->id, l->uid, l->pid, "lease %llu granted: %llu bytes in %zu chunks to pid %d uid %u%s%s",
		  (unsigned long long)l->id, (unsigned long long)l->bytes, l->nchunks, l->pid, l->uid,
		  l->label[0] ? ", label " : "", text_escape(label, sizeof(label), l->label));
	send_lease(c, seq, l, false);
}

void request_grant_waiting(struct broker *b)
{
	struct revoker *rv = b->revoker;
	struct pending *p, *pnext;

	if (!rv || b->state == BROKER_CRITICAL)
		return;
	/* A failed send only marks its connection closing (server_reap frees it later), so the
	 * queue cannot change under us except for the entry destroyed here. */
	for (p = rv->pending; p; p = pnext) {
		struct conn *c = p->conn;
		uint64_t seq = p->seq, size = p->args.size;
		struct lease *l;
		int r;

		pnext = p->next;
		if (c->closing || c->nleases >= b->cfg->max_leases_per_client)
			continue;
		r = broker_acquire(b, &p->args, &l);
		if (r == -EDQUOT)
			continue; /* only this uid's own releases can help it */
		if (r == -ENOSPC || r == -EBUSY)
			break;    /* strict priority: nobody behind may overtake */
		pending_destroy(b, p);
		if (r < 0)
			reply_acquire_error(c, seq, r, size);
		else
			grant(c, seq, l);
	}
}

/* ---------------------------------------------------------------- revoking */

int request_revoke(struct broker *b, struct lease *l, uint32_t deadline_ms, const char *reason)
{
	Pinbroker__V1__Revoke rm = PINBROKER__V1__REVOKE__INIT;
	struct conn *c = owner_conn(b, l);
	uint64_t now = now_ms();
	Reply r;
	int ret;

	/* Its holder cannot give it back: asking would only end in enforcement against it. */
	if (l->no_revoke)
		return -EPERM;
	if (deadline_ms == 0)
		deadline_ms = b->cfg->revoke_deadline_ms;
	ret = lease_set_state(l, LEASE_REVOKING, now);
	if (ret < 0)
		return ret;
	l->deadline_ms = now + deadline_ms;
	log_event(EV_LEASE_REVOKED, LOG_WARNING, l->id, l->uid, l->pid,
		  "revoking lease %llu (%llu bytes, pid %d, %s) with a %u ms deadline: %s", (unsigned long long)l->id,
		  (unsigned long long)l->bytes, l->pid, lease_priority_name(l->priority), deadline_ms, reason);
	record_revocation(b, "lease %llu pid %d uid %u %llu bytes: %s", (unsigned long long)l->id, l->pid, l->uid,
			  (unsigned long long)l->bytes, reason);
	if (c) {
		rm.lease_id = l->id;
		rm.deadline_ms = deadline_ms;
		rm.reason = (char *)reason;
		reply_init(&r, 0, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
		r.body_case = PINBROKER__V1__REPLY__BODY_REVOKE;
		r.revoke = &rm;
		server_send(c, &r, NULL, 0); /* a failed send marks c closing; its reap frees the lease */
	}
	/* Every mapper must let go: each attacher gets the same REVOKE on its own connection. */
	if (l->nattachers > 0) {
		rm.lease_id = l->id;
		rm.deadline_ms = deadline_ms;
		rm.reason = (char *)reason;
		reply_init(&r, 0, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
		r.body_case = PINBROKER__V1__REPLY__BODY_REVOKE;
		r.revoke = &rm;
		for (size_t i = 0; i < l->nattachers; i++) {
			struct conn *ac = l->attachers[i].owner;

			if (!ac->closing)
				server_send(ac, &r, NULL, 0);
		}
	}
	arm_deadline_timer(b);
	return 0;
}

/*
 * Signal whoever else still maps or holds the lease's memfds, as fuser -k would
 * within the lease's uid: a child forked after the acquire keeps the memory
 * past its parent's exit, and a ghost or orphaned lease has no connection to
 * signal at all. signalled: the connection's pid, already reached through its
 * own pidfd (0: none). One /proc scan per enforcement (cost in holders.h).
 */
static void enforce_holders(struct broker *b, const struct lease *l, int sig, pid_t signalled)
{
	struct holder_key *keys = calloc(l->nchunks ? l->nchunks : 1, sizeof(*keys));
	struct holder *h = NULL;
	size_t nkeys = 0, nh = 0, unreadable = 0;
	uint64_t t0 = now_us();
	int r;

	if (!keys) {
		log_warnx("cannot look for other holders of overdue lease %llu: out of memory, ignoring",
			  (unsigned long long)l->id);
		return;
	}
	for (size_t i = 0; i < l->nchunks; i++) {
		struct stat st;

		if (fstat(l->chunks[i]->fd, &st) == 0)
			keys[nkeys++] = (struct holder_key){ .dev = st.st_dev, .ino = st.st_ino };
	}
	r = holders_find(b->cfg->proc_root, l->uid, keys, nkeys, signalled, &h, &nh, &unreadable);
	free(keys);
	if (r < 0) {
		log_warnx("cannot look for other holders of overdue lease %llu in %s/proc: %s; check proc-root, ignoring",
			  (unsigned long long)l->id, b->cfg->proc_root, strerror(-r));
		return;
	}
	log_debug("holder scan for overdue lease %llu (uid %u): %zu other processes in %llu us",
		  (unsigned long long)l->id, l->uid, nh, (unsigned long long)(now_us() - t0));
	for (size_t i = 0; i < nh; i++) {
		if (sys_pidfd_send_signal(h[i].pidfd, sig, 0) < 0)
			log_warn("pidfd_send_signal(%d, %s) for overdue lease %llu failed, ignoring", h[i].pid,
				 strsignal(sig), (unsigned long long)l->id);
		else
			log_event(EV_LEASE_OVERDUE, LOG_WARNING, l->id, l->uid, h[i].pid,
				  "sent %s to pid %d for overdue lease %llu: it still maps or holds the lease's memory",
				  sigabbrev_np(sig), h[i].pid, (unsigned long long)l->id);
	}
	holders_free(h, nh);
	if (l->uid != geteuid() && !holders_can_inspect_all())
		log_warnx("overdue lease %llu: cannot read the /proc/PID/maps of uid %u without CAP_SYS_PTRACE, so "
			  "processes other than its connection's that still map it were not signalled; grant the "
			  "capability or run as root",
			  (unsigned long long)l->id, l->uid);
	else if (unreadable > 0)
		log_warnx("overdue lease %llu: %zu processes could not be inspected for its memory, ignoring",
			  (unsigned long long)l->id, unreadable);
}

/* Signal one mapper of an overdue lease through its pidfd. Returns true if the signal went. */
static bool signal_mapper(const struct lease *l, int pidfd, pid_t pid, int sig)
{
	/* Only through a pidfd: a bare pid may have been reused by an innocent process. */
	if (pidfd < 0) {
		log_warnx("cannot signal pid %d for overdue lease %llu: no pidfd on this kernel, ignoring", pid,
			  (unsigned long long)l->id);
		return false;
	}
	if (sys_pidfd_send_signal(pidfd, sig, 0) < 0) {
		log_warn("pidfd_send_signal(%d, %s) for overdue lease %llu failed, ignoring", pid, strsignal(sig),
			 (unsigned long long)l->id);
		return false;
	}
	log_event(EV_LEASE_OVERDUE, LOG_WARNING, l->id, l->uid, pid, "sent %s to pid %d for overdue lease %llu",
		  sigabbrev_np(sig), pid, (unsigned long long)l->id);
	return true;
}

/*
 * The attachers of an overdue lease, and the processes whose connections
 * closed while they mapped it (ghosts): an attacher of another uid is out of
 * the /proc scan's reach, so each is signalled through its own pidfd.
 */
static void enforce_mappers(struct broker *b, const struct lease *l, int sig)
{
	for (size_t i = 0; i < l->nattachers; i++) {
		const struct conn *ac = l->attachers[i].owner;

		signal_mapper(l, ac->pidfd, ac->pid, sig);
	}
	for (struct ghost *g = b->revoker->ghosts; g; g = g->next)
		for (size_t i = 0; i < g->nids; i++)
			if (g->ids[i] == l->id)
				signal_mapper(l, g->pidfd, g->pid, sig);
}

static void enforce(struct broker *b, struct lease *l)
{
	struct conn *c = owner_conn(b, l);
	pid_t signalled = 0;
	int sig = 0;

	switch (b->cfg->revoke_enforce) {
	case ENFORCE_NONE:
		return;
	case ENFORCE_DISCONNECT:
		if (c)
			server_close(c, "revoke deadline passed (revoke-enforce=disconnect)");
		/* Closing only marks them: the attachers array stays as it is until the reap. */
		for (size_t i = 0; i < l->nattachers; i++)
			server_close(l->attachers[i].owner, "revoke deadline passed (revoke-enforce=disconnect)");
		return;
	case ENFORCE_SIGTERM:
		sig = SIGTERM;
		break;
	case ENFORCE_SIGKILL:
		sig = SIGKILL;
		break;
	}
	if (c && signal_mapper(l, c->pidfd, c->pid, sig))
		signalled = c->pid;
	enforce_mappers(b, l, sig);
	enforce_holders(b, l, sig, signalled);
}

static void deadline_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct broker *b = w->data;
	uint64_t now = now_ms();
	struct lease *l, *next;

	/* Enforcement may close connections, but their leases go back only at the reap. */
	for (l = lease_first(b->leases); l; l = next) {
		next = lease_next(b->leases, l);
		if (l->state != LEASE_REVOKING || l->deadline_ms > now)
			continue;
		lease_set_state(l, LEASE_OVERDUE, now);
		log_event(EV_LEASE_OVERDUE, LOG_WARNING, l->id, l->uid, l->pid,
			  "lease %llu (%llu bytes, pid %d) is overdue: its holder did not let go within the deadline; "
			  "it stays counted until it does (revoke-enforce=%s)",
			  (unsigned long long)l->id, (unsigned long long)l->bytes, l->pid,
			  config_enforce_name(b->cfg->revoke_enforce));
		record_revocation(b, "lease %llu pid %d overdue", (unsigned long long)l->id, l->pid);
		enforce(b, l);
	}
	arm_deadline_timer(b);
}

static void arm_deadline_timer(struct broker *b)
{
	struct revoker *rv = b->revoker;
	uint64_t earliest = UINT64_MAX, now = now_ms();

	if (!rv)
		return;
	for (struct lease *l = lease_first(b->leases); l; l = lease_next(b->leases, l))
		if (l->state == LEASE_REVOKING && l->deadline_ms < earliest)
			earliest = l->deadline_ms;
	ev_timer_stop(b->loop, &rv->deadline_timer);
	if (earliest == UINT64_MAX)
		return;
	ev_timer_set(&rv->deadline_timer, earliest > now ? (earliest - now) / 1000.0 : 0., 0.);
	ev_timer_start(b->loop, &rv->deadline_timer);
}

/* Bytes already on their way back. */
static uint64_t revoking_bytes(const struct broker *b)
{
	uint64_t sum = 0;

	for (struct lease *l = lease_first(b->leases); l; l = lease_next(b->leases, l))
		if (l->state == LEASE_REVOKING)
			sum += l->bytes;
	return sum;
}

/*
 * One step of critical-state reclaim: estimate how far MemAvailable is below
 * the critical line, subtract what is already being revoked, and revoke
 * victims in DESIGN.md's order until the estimate is covered. Without a
 * memory figure (PSI alone made it critical) revoke one lease per step.
 */
static void reclaim_step(struct broker *b)
{
	struct lease **order = NULL;
	size_t n = 0;
	double avail_pct = b->monitor ? monitor_mem_available_pct(b->monitor) : NAN;
	uint64_t deficit, in_flight = revoking_bytes(b);

	broker_trim_pool(b, 0);
	if (!isnan(avail_pct) && avail_pct < b->cfg->tight_mem_available_pct) {
		/* Aim for the tight line, so hysteresis can carry the state down. */
		double d = (b->cfg->tight_mem_available_pct - avail_pct) / 100.0 * (double)b->mem_total_bytes;

		deficit = (uint64_t)d;
	} else {
		deficit = 1; /* PSI-driven: one lease at a time */
	}
	if (in_flight >= deficit)
		return;
	if (lease_revoke_order(b->leases, &order, &n) < 0)
		return;
	/* A failed REVOKE send frees nothing before the reap, so the order stays valid. */
	for (size_t i = 0; i < n && in_flight < deficit; i++)
		if (request_revoke(b, order[i], 0, "host memory is critical") == 0)
			in_flight += order[i]->bytes;
	free(order);
}

static void reclaim_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct broker *b = w->data;

	if (b->state == BROKER_CRITICAL)
		reclaim_step(b);
	else
		ev_timer_stop(loop, w);
}

static void shrink_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct broker *b = w->data;

	broker_trim_pool(b, b->state == BROKER_NORMAL ? b->prewarm_bytes : 0);
}

void request_on_pressure(void *ud, enum broker_state from, enum broker_state to, const char *why)
{
	struct broker *b = ud;
	struct revoker *rv = b->revoker;

	b->state = to;
	if (to >= BROKER_TIGHT)
		broker_trim_pool(b, 0);
	if (to == BROKER_CRITICAL) {
		/* Waiting acquires are refused at once while critical. */
		while (rv->pending) {
			struct pending *p = rv->pending;
			struct conn *c = p->conn;
			uint64_t seq = p->seq, size = p->args.size;

			pending_destroy(b, p);
			reply_acquire_error(c, seq, -EAGAIN, size);
		}
		reclaim_step(b);
		ev_timer_set(&rv->reclaim_timer, RECLAIM_STEP_MS / 1000.0, RECLAIM_STEP_MS / 1000.0);
		ev_timer_start(b->loop, &rv->reclaim_timer);
	} else {
		ev_timer_stop(b->loop, &rv->reclaim_timer);
	}
	if (to == BROKER_NORMAL)
		request_grant_waiting(b); /* the pool regrows on demand */
}

/* ------------------------------------------------------------------ ghosts */

static void ghost_free(struct broker *b, struct ghost *g)
{
	struct revoker *rv = b->revoker;

	for (struct ghost **gp = &rv->ghosts; *gp; gp = &(*gp)->next)
		if (*gp == g) {
			*gp = g->next;
			break;
		}
	ev_io_stop(b->loop, &g->io);
	close(g->pidfd);
	free(g->ids);
	free(g);
}

static void ghost_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct ghost *g = w->data;
	struct broker *b = g->broker;

	/* The pidfd is readable once the process has exited: its mappings are gone. */
	for (size_t i = 0; i < g->nids; i++) {
		struct lease *l = lease_find(b->leases, g->ids[i]);

		if (!l)
			continue;
		if (l->exit_holds > 0)
			l->exit_holds--;
		/* Not lease_unmapped: an orphan held for its process is freed here too. */
		if (!l->owner && l->nattachers == 0 && l->exit_holds == 0)
			free_lease(b, l, "holder exited");
	}
	ghost_free(b, g);
	after_free(b);
}

/* Watch pidfd (taken over) and free leases ids once that process exits. Returns 0 or -ENOMEM. */
int request_hold_until_exit(struct broker *b, int pidfd, pid_t pid, const uint64_t *ids, size_t n)
{
	struct revoker *rv = b->revoker;
	struct ghost *g = calloc(1, sizeof(*g));

	if (!g || !(g->ids = calloc(n ? n : 1, sizeof(*g->ids)))) {
		free(g);
		close(pidfd);
		return -ENOMEM;
	}
	g->broker = b;
	g->pid = pid;
	g->pidfd = pidfd;
	memcpy(g->ids, ids, n * sizeof(*ids));
	g->nids = n;
	for (size_t i = 0; i < n; i++) {
		struct lease *l = lease_find(b->leases, ids[i]);

		if (l)
			l->exit_holds++;
	}
	ev_io_init(&g->io, ghost_cb, g->pidfd, EV_READ);
	g->io.data = g;
	ev_io_start(b->loop, &g->io);
	g->next = rv->ghosts;
	rv->ghosts = g;
	return 0;
}

size_t request_hold_pids(const struct broker *b, uint64_t id, pid_t *out, size_t max)
{
	size_t n = 0;

	if (!b->revoker)
		return 0;
	for (const struct ghost *g = b->revoker->ghosts; g && n < max; g = g->next)
		for (size_t i = 0; i < g->nids && n < max; i++)
			if (g->ids[i] == id)
				out[n++] = g->pid;
	return n;
}

void request_conn_closed(struct broker *b, struct conn *c)
{
	struct revoker *rv = b->revoker;
	struct lease *l, *next;
	uint64_t *held = NULL;
	size_t nheld = 0, freed = 0;
	uint64_t freed_bytes = 0;
	bool holder_alive = false;

	if (c->pidfd >= 0 && c->nleases > 0) {
		struct pollfd p = { .fd = c->pidfd, .events = POLLIN };

		holder_alive = poll(&p, 1, 0) == 0;
	}

	/* Its waiting acquires die with it. */
	if (rv) {
		struct pending *p, *pn;

		for (p = rv->pending; p; p = pn) {
			pn = p->next;
			if (p->conn == c)
				pending_destroy(b, p);
		}
	}

	for (l = lease_first(b->leases); l; l = next) {
		bool attached;

		next = lease_next(b->leases, l);
		attached = l->owner != c && lease_attacher_find(l, c);
		if (l->owner != c && !attached)
			continue;
		/* c lets go, as its holder or an attacher; other mappers keep the lease alive. */
		if (attached)
			lease_detach(l, c);
		else
			l->owner = NULL;
		conn_lose(c, l, attached);
		b->generation++;
		/*
		 * A process that is still alive may still map (and pin) these pages: the
		 * library keeps mappings valid when a connection drops. Keep them counted,
		 * and out of anyone's reach, until the process exits (an exit hold). A
		 * process that died (its pidfd is readable) has no mappings left.
		 */
		if (holder_alive && rv) {
			uint64_t *ids = realloc(held, (nheld + 1) * sizeof(*ids));

			if (ids) {
				held = ids;
				held[nheld++] = l->id;
				continue;
			}
		}
		if (!lease_unmapped(l))
			continue;
		freed++;
		freed_bytes += l->bytes;
		free_lease(b, l, "connection closed");
	}
	c->nleases = 0;
	c->nattached = 0;
	b->unbrokered_bytes -= c->unbrokered_bytes;
	c->unbrokered_bytes = 0;
	if (nheld > 0) {
		int pidfd = fcntl(c->pidfd, F_DUPFD_CLOEXEC, 3);

		log_debug("connection of pid %d closed while the process lives: %zu leases stay counted until it exits",
			  c->pid, nheld);
		if (pidfd < 0 || request_hold_until_exit(b, pidfd, c->pid, held, nheld) < 0) {
			/* Cannot watch the process: better to free than to leak the bytes forever. */
			for (size_t i = 0; i < nheld; i++) {
				l = lease_find(b->leases, held[i]);
				if (l && lease_unmapped(l))
					free_lease(b, l, "connection closed (cannot watch the holder)");
			}
		}
	}
	free(held);
	if (freed > 0) {
		log_event(EV_CLIENT_DIED, LOG_NOTICE, 0, c->uid, c->pid,
			  "client pid %d uid %u went away holding %zu leases (%llu bytes); returned to the pool", c->pid,
			  c->uid, freed, (unsigned long long)freed_bytes);
		after_free(b);
	}
}

/* ---------------------------------------------------------------- handlers */

static void handle_hello(struct conn *c, const Request *req)
{
	struct broker *b = c->broker;
	Pinbroker__V1__HelloReply hr = PINBROKER__V1__HELLO_REPLY__INIT;
	const Pinbroker__V1__Hello *h = req->hello;
	Reply r;

	if (c->hello_done) {
		server_close(c, "second HELLO");
		return;
	}
	if (h->version != PB_PROTOCOL_VERSION) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_VERSION_MISMATCH,
			     "protocol version %u is not supported: this pinbrokerd %s speaks version %d; "
			     "upgrade libpinbroker or pinbrokerd so they match",
			     h->version, PINBROKER_VERSION, PB_PROTOCOL_VERSION);
		server_close(c, "protocol version mismatch");
		return;
	}
	c->hello_done = true;
	ev_timer_stop(b->loop, &c->handshake);
	if (h->client_name)
		text_sanitize(c->name, sizeof(c->name), h->client_name); /* shown to others: no control characters */
	hr.version = PB_PROTOCOL_VERSION;
	hr.server_version = (char *)PINBROKER_VERSION;
	hr.has_page_size = true;
	hr.page_size = pool_page_size(b->pool);
	hr.has_chunk_size = true;
	hr.chunk_size = pool_chunk_size(b->pool);
	hr.has_hugetlb = true;
	hr.hugetlb = pool_hugetlb(b->pool);
	hr.has_instance_id = true;
	hr.instance_id = recovery_instance_id(b);
	hr.has_registrations = true;
	hr.registrations = true;
	reply_init(&r, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
	r.body_case = PINBROKER__V1__REPLY__BODY_HELLO;
	r.hello = &hr;
	server_send(c, &r, NULL, 0);
}

static enum lease_priority prio_from_wire(Pinbroker__V1__Priority p)
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

/* Cached-idle leases of other holders that could cover a shortfall. */
static uint64_t reclaim_idle_for(struct broker *b, struct conn *asker, uint64_t need)
{
	uint64_t got = 0;
	struct lease *l;

	/* A failed REVOKE send frees nothing before the reap, so the walk stays valid. */
	for (l = lease_first(b->leases); l && got < need; l = lease_next(b->leases, l)) {
		if (l->state != LEASE_IDLE || l->owner == asker)
			continue;
		if (request_revoke(b, l, 0, "another client needs the memory (cached-idle lease)") == 0)
			got += l->bytes;
	}
	return got;
}

static void handle_acquire(struct conn *c, const Request *req)
{
	struct broker *b = c->broker;
	const Pinbroker__V1__Acquire *a = req->acquire;
	struct acquire_args args = {
		.uid = c->uid,
		.gid = c->gid,
		.pid = c->pid,
		.owner = c,
		.size = a->size,
		.priority = prio_from_wire(a->priority),
		.label = a->label,
		.no_revoke = (a->flags & PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_NO_REVOKE) != 0,
		.registration = (a->flags & PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_REGISTER_ONLY) != 0,
	};
	bool wait = (a->flags & PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_WAIT) != 0;
	uint32_t timeout_ms = a->has_timeout_ms && a->timeout_ms ? a->timeout_ms : b->cfg->acquire_timeout_ms;
	struct lease *l;
	int r;

	if (c->nleases + c->npending >= b->cfg->max_leases_per_client) {
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
	r = broker_acquire(b, &args, &l);
	if (r == 0) {
		grant(c, req->seq, l);
		return;
	}
	if (r == -ENOSPC) {
		/* Take cached-idle leases back first; the acquire waits for them. */
		uint64_t shortfall = round_up(a->size, pool_page_size(b->pool));
		uint64_t got = reclaim_idle_for(b, c, shortfall);

		if (got > 0 && !wait) {
			wait = true;
			timeout_ms = b->cfg->revoke_deadline_ms;
		}
	}
	if (wait && (r == -ENOSPC || r == -EDQUOT || r == -EBUSY)) {
		int q = pending_add(c, req->seq, &args, timeout_ms);

		if (q == 0)
			return;
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_LIMIT,
			     "%u acquires are already waiting (max-pending-acquires); try again later", b->revoker->npending);
		return;
	}
	log_event(EV_LEASE_REFUSED, LOG_INFO, 0, c->uid, c->pid, "refused %llu bytes to pid %d uid %u: %s",
		  (unsigned long long)a->size, c->pid, c->uid, strerror(-r));
	reply_acquire_error(c, req->seq, r, a->size);
}

static void reply_lease_error(struct conn *c, uint64_t seq, int r, uint64_t id)
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

static void handle_release(struct conn *c, const Request *req)
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
	if (holder || attached) {
		/* A mapper lets go; a shared lease lives on while others map it. */
		int r = broker_detach(b, l, c);

		conn_lose(c, l, attached);
		if (r == 0) {
			log_event(EV_LEASE_RELEASED, LOG_INFO, l->id, l->uid, c->pid,
				  "lease %llu: pid %d (%s) let go; it lives on for %zu attachers and %u exited-connection holds",
				  (unsigned long long)l->id, c->pid, attached ? "attacher" : "holder", l->nattachers,
				  l->exit_holds);
			reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, "%s", "");
			return;
		}
	} else if (!(l->owner == NULL && l->nattachers == 0 && (c->admin || l->uid == c->uid))) {
		/* A lease with no connection (an orphan nobody re-declared, or one held until its
		 * process exits) may be dropped by an admin or by its own uid, unless attachers still
		 * map it. Taking a live connection's lease is what revoke is for: it still maps it. */
		reply_lease_error(c, req->seq, -EPERM, id);
		return;
	}
	free_lease(b, l, "released");
	reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, "%s", "");
	after_free(b);
}

static void handle_set_idle(struct conn *c, const Request *req)
{
	struct lease *l;
	int r;

	r = check_own(c, req->set_idle->lease_id, &l);
	if (r == 0) {
		enum lease_state to = req->set_idle->idle ? LEASE_IDLE : LEASE_ACTIVE;

		/* Already there, or revoking: nothing to do, not an error. */
		if (l->state == to || l->state == LEASE_REVOKING || l->state == LEASE_OVERDUE)
			r = 0;
		/* Idle leases are reclaimed first: one that attachers use is not a cached buffer, and one
		 * that is never revoked could not be reclaimed at all. */
		else if (to == LEASE_IDLE && (l->nattachers > 0 || l->no_revoke))
			r = -EBUSY;
		else
			r = lease_set_state(l, to, now_ms());
	}
	if (r < 0)
		reply_lease_error(c, req->seq, r, req->set_idle->lease_id);
	else
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, "%s", "");
}

static void handle_revoke_ack(struct conn *c, const Request *req)
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

static void handle_admin_revoke(struct conn *c, const Request *req)
{
	struct broker *b = c->broker;
	const Pinbroker__V1__AdminRevoke *ar = req->admin_revoke;
	Pinbroker__V1__AdminRevokeReply rr = PINBROKER__V1__ADMIN_REVOKE_REPLY__INIT;
	uint64_t *ids = NULL;
	size_t n = 0, cap = 0;
	struct lease *l, *target = NULL;
	char reason[64];
	Reply r;

	if (!ar->has_lease_id && !ar->has_uid && !(ar->has_all && ar->all)) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "revoke needs a lease id, a uid, or all");
		return;
	}
	if (ar->has_lease_id && !(target = lease_find(b->leases, ar->lease_id))) {
		reply_lease_error(c, req->seq, -ENOENT, ar->lease_id);
		return;
	}
	/* Anyone may revoke a lease of their own uid, or all of them (--uid self); other uids'
	 * leases, and "all", need admin rights. */
	if (!c->admin && ((target && target->uid != c->uid) || (ar->has_uid && ar->uid != c->uid) ||
			  (!target && !ar->has_uid))) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_PERMISSION_DENIED,
			     "revoking other uids' leases needs uid 0 or membership of the admin group "
			     "(admin-group = %s); you may revoke your own: a lease id of yours, or --uid %u",
			     b->cfg->admin_group && b->cfg->admin_group[0] ? b->cfg->admin_group : "none set", c->uid);
		return;
	}
	if (target && target->no_revoke) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "lease %llu is held by pid %d, which cannot give memory back (%s); it is freed when that "
			     "process frees it or exits: stop the process to free it now",
			     (unsigned long long)target->id, target->pid,
			     target->registration ? "a cudaHostRegister charge" : "a program run under the interposer");
		return;
	}
	snprintf(reason, sizeof(reason), "revoked by %suid %u", c->admin ? "admin " : "", c->uid);
	/* A failed REVOKE send only marks its connection closing, so the walk stays valid. */
	for (l = target ? target : lease_first(b->leases); l; l = target ? NULL : lease_next(b->leases, l)) {
		if (ar->has_uid && l->uid != ar->uid)
			continue;
		if ((l->state != LEASE_ACTIVE && l->state != LEASE_IDLE) || l->no_revoke)
			continue;
		if (n == cap) {
			uint64_t *nid = realloc(ids, (cap ? cap * 2 : 16) * sizeof(*ids));

			if (!nid)
				break;
			ids = nid;
			cap = cap ? cap * 2 : 16;
		}
		ids[n++] = l->id;
		request_revoke(b, l, ar->has_deadline_ms ? ar->deadline_ms : 0, reason);
	}
	rr.n_lease_ids = n;
	rr.lease_ids = ids;
	reply_init(&r, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
	r.body_case = PINBROKER__V1__REPLY__BODY_ADMIN_REVOKE;
	r.admin_revoke = &rr;
	server_send(c, &r, NULL, 0);
	free(ids);
}

static void handle_set_config(struct conn *c, const Request *req)
{
	struct broker *b = c->broker;
	struct config *n = NULL;
	char *err = NULL;
	int r;

	r = reload_prepare_set(b->cfg, req->set_config->key, req->set_config->value, &n, &err);
	if (r == 0)
		r = reload_apply(b, n, &err);
	if (r < 0) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT, "%s",
			     err ? err : strerror(-r));
		config_free(n);
	} else {
		log_info("%s set to %s by uid %u; it overrides the config file, also on reload, until restart",
			 req->set_config->key, req->set_config->value, c->uid);
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, "%s", "");
	}
	free(err);
}

static void handle_redeclare(struct conn *c, const Request *req)
{
	struct broker *b = c->broker;
	const Pinbroker__V1__Redeclare *rd = req->redeclare;
	Pinbroker__V1__RedeclareReply rr = PINBROKER__V1__REDECLARE_REPLY__INIT;
	uint64_t *ok = calloc(rd->n_lease_ids + 1, sizeof(*ok));
	uint64_t *bad = calloc(rd->n_lease_ids + 1, sizeof(*bad));
	Reply r;

	if (!ok || !bad) {
		free(ok);
		free(bad);
		server_close(c, "out of memory");
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
			c->nleases++;
			status_conn_add(c, l);
			b->generation++;
			ok[rr.n_adopted++] = l->id;
			log_event(EV_LEASE_GRANTED, LOG_INFO, l->id, l->uid, l->pid,
				  "lease %llu re-adopted by pid %d after restart", (unsigned long long)l->id, c->pid);
		} else {
			bad[rr.n_rejected++] = rd->lease_ids[i];
		}
	}
	rr.adopted = ok;
	rr.rejected = bad;
	reply_init(&r, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
	r.body_case = PINBROKER__V1__REPLY__BODY_REDECLARE;
	r.redeclare = &rr;
	server_send(c, &r, NULL, 0);
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

static void handle_share(struct conn *c, const Request *req)
{
	struct broker *b = c->broker;
	const Pinbroker__V1__Share *sh = req->share;
	Pinbroker__V1__ShareReply sr = PINBROKER__V1__SHARE_REPLY__INIT;
	uint32_t uids[1 + LEASE_SHARE_UIDS_MAX];
	uint8_t token[LEASE_TOKEN_BYTES];
	char hex[2 * LEASE_TOKEN_BYTES + 1];
	struct lease *l;
	Reply r;
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
	server_send(c, &r, NULL, 0);
}

static void handle_attach(struct conn *c, const Request *req)
{
	struct broker *b = c->broker;
	uint8_t token[LEASE_TOKEN_BYTES];
	struct lease *l = NULL;
	int r;

	if (c->nleases + c->npending >= b->cfg->max_leases_per_client) {
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
	r = token_parse(req->attach->token, token) ? broker_attach(b, token, c, c->uid, c->pid, &l) : -ENOENT;
	switch (r) {
	case 0:
		break;
	case -ENOENT:
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_SHARE_DENIED,
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
	c->nleases++;
	c->nattached++;
	status_conn_add(c, l);
	log_event(EV_LEASE_GRANTED, LOG_INFO, l->id, l->uid, c->pid,
		  "lease %llu attached by pid %d uid %u (%zu attachers); counted once, to uid %u", (unsigned long long)l->id,
		  c->pid, c->uid, l->nattachers, l->uid);
	send_lease(c, req->seq, l, true);
}

/* ------------------------------------------------------------------- table */

/*
 * No process pins 16 TiB outside the broker: a larger report is a bug or a lie. The cap also keeps
 * the host-wide sum from wrapping: 2^44 bytes times max-connections' ceiling (2^20) fits 64 bits.
 */
#define UNBROKERED_REPORT_MAX (1ull << 44)

static void handle_report_unbrokered(struct conn *c, const Request *req)
{
	struct broker *b = c->broker;
	uint64_t bytes = req->report_unbrokered->bytes;

	if (bytes > UNBROKERED_REPORT_MAX) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "%llu unbrokered bytes is more than 16 TiB; report the bytes this process pinned outside the broker",
			     (unsigned long long)bytes);
		return;
	}
	b->unbrokered_bytes = b->unbrokered_bytes - c->unbrokered_bytes + bytes;
	if (bytes != c->unbrokered_bytes)
		log_debug("pid %d uid %u pins %llu bytes outside the broker", c->pid, c->uid, (unsigned long long)bytes);
	c->unbrokered_bytes = bytes;
	reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, "%s", "");
}

static const struct request_kind request_table[] = {
	{ PINBROKER__V1__REQUEST__BODY_HELLO, "hello", 0, handle_hello },
	/* Register-only acquires too: a registration charges the budget for pages it pins. */
	{ PINBROKER__V1__REQUEST__BODY_ACQUIRE, "acquire", REQ_NEEDS_HELLO | REQ_TAKES_MEMORY, handle_acquire },
	/* Giving memory back and looking are what a stopping daemon still answers. */
	{ PINBROKER__V1__REQUEST__BODY_RELEASE, "release", REQ_NEEDS_HELLO | REQ_ALLOWED_WHILE_STOPPING, handle_release },
	{ PINBROKER__V1__REQUEST__BODY_STATUS, "status", REQ_NEEDS_HELLO | REQ_ALLOWED_WHILE_STOPPING, handle_status },
	/* Not REQ_ADMIN: a holder may revoke its own leases; the handler checks other uids'. */
	{ PINBROKER__V1__REQUEST__BODY_ADMIN_REVOKE, "revoke", REQ_NEEDS_HELLO, handle_admin_revoke },
	{ PINBROKER__V1__REQUEST__BODY_SET_CONFIG, "set", REQ_NEEDS_HELLO | REQ_ADMIN, handle_set_config },
	{ PINBROKER__V1__REQUEST__BODY_REVOKE_ACK, "revoke-ack", REQ_NEEDS_HELLO, handle_revoke_ack },
	{ PINBROKER__V1__REQUEST__BODY_SET_IDLE, "set-idle", REQ_NEEDS_HELLO, handle_set_idle },
	{ PINBROKER__V1__REQUEST__BODY_REDECLARE, "redeclare", REQ_NEEDS_HELLO, handle_redeclare },
	{ PINBROKER__V1__REQUEST__BODY_SHARE, "share", REQ_NEEDS_HELLO, handle_share },
	/* Not REQ_TAKES_MEMORY: an attachment maps a lease already counted, once, to its holder. */
	{ PINBROKER__V1__REQUEST__BODY_ATTACH, "attach", REQ_NEEDS_HELLO, handle_attach },
	{ PINBROKER__V1__REQUEST__BODY_REPORT_UNBROKERED, "report-unbrokered", REQ_NEEDS_HELLO,
	  handle_report_unbrokered },
};

void request_dispatch(struct conn *c, const uint8_t *buf, size_t len)
{
	struct broker *b = c->broker;
	const struct request_kind *kind = NULL;
	Request *req;

	req = pinbroker__v1__request__unpack(NULL, len, buf);
	if (!req) {
		log_event(EV_PROTOCOL_ERROR, LOG_DEBUG, 0, c->uid, c->pid, "malformed packet (%zu bytes) from pid %d",
			  len, c->pid);
		server_close(c, "malformed packet");
		return;
	}
	for (size_t i = 0; i < sizeof(request_table) / sizeof(request_table[0]); i++)
		if (request_table[i].body == req->body_case)
			kind = &request_table[i];

	/* The one gate: every cross-cutting check lives here, never in a handler. */
	if (!kind) {
		server_close(c, "unknown request kind");
	} else if ((kind->flags & REQ_NEEDS_HELLO) && !c->hello_done) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_NO_HELLO,
			     "send HELLO with the protocol version first");
		server_close(c, "request before HELLO");
	} else if ((kind->flags & REQ_ADMIN) && !c->admin) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_PERMISSION_DENIED,
			     "'%s' needs uid 0 or membership of the admin group (admin-group = %s)", kind->name,
			     b->cfg->admin_group && b->cfg->admin_group[0] ? b->cfg->admin_group : "none set");
	} else if (b->shutting_down && !(kind->flags & REQ_ALLOWED_WHILE_STOPPING)) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_SHUTTING_DOWN, "pinbrokerd is stopping");
	} else if ((kind->flags & REQ_TAKES_MEMORY) && b->state == BROKER_CRITICAL) {
		reply_acquire_error(c, req->seq, -EAGAIN, 0); /* the critical answer names no size */
	} else {
		kind->handler(c, req);
	}
	pinbroker__v1__request__free_unpacked(req, NULL);
}

/* ------------------------------------------------------------- life cycle */

int request_init(struct broker *b)
{
	struct revoker *rv = calloc(1, sizeof(*rv));

	if (!rv)
		return -ENOMEM;
	ev_timer_init(&rv->deadline_timer, deadline_cb, 0., 0.);
	rv->deadline_timer.data = b;
	ev_timer_init(&rv->reclaim_timer, reclaim_cb, 0., 0.);
	rv->reclaim_timer.data = b;
	ev_timer_init(&rv->shrink_timer, shrink_cb, 0., 0.);
	rv->shrink_timer.data = b;
	b->revoker = rv;
	return 0;
}

void request_fini(struct broker *b)
{
	struct revoker *rv = b->revoker;

	if (!rv)
		return;
	while (rv->pending)
		pending_destroy(b, rv->pending);
	while (rv->ghosts)
		ghost_free(b, rv->ghosts);
	/* Shutdown: leases still counted for live or overdue holders (their fds are in the
	 * fd store by now) give their chunks back, so pool_free releases them. */
	for (struct lease *l = lease_first(b->leases), *next; l; l = next) {
		next = lease_next(b->leases, l);
		broker_free_lease(b, l);
	}
	ev_timer_stop(b->loop, &rv->deadline_timer);
	ev_timer_stop(b->loop, &rv->reclaim_timer);
	ev_timer_stop(b->loop, &rv->shrink_timer);
	free(rv);
	b->revoker = NULL;
}

/* SPDX-License-Identifier: MIT */
/* The revoker: REVOKE and its deadlines, enforcement on overdue holders, critical-state reclaim, the revocation ring, freeing leases, and leases held until a process exits. */
#define _GNU_SOURCE
#include "revoker.h"

#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker.h"
#include "config.h"
#include "conn.h"
#include "holders.h"
#include "lease.h"
#include "log.h"
#include "monitor.h"
#include "pool.h"
#include "reply.h"
#include "util.h"

/* While critical, look again this often whether more leases must go. */
#define RECLAIM_STEP_MS 100

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
	struct ghost *ghosts;
	struct monitor_event ring[REVOKER_REVOCATIONS_MAX];
	size_t ring_count;
	size_t ring_next;
};

static void arm_deadline_timer(struct broker *b);
static void ghost_free(struct broker *b, struct ghost *g);

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
	rv->ring_next = (rv->ring_next + 1) % REVOKER_REVOCATIONS_MAX;
	if (rv->ring_count < REVOKER_REVOCATIONS_MAX)
		rv->ring_count++;
}

size_t revoker_revocations(const struct broker *b, struct monitor_event *out, size_t max)
{
	const struct revoker *rv = b->revoker;
	size_t n = 0;

	if (!rv)
		return 0;
	for (size_t i = 0; i < rv->ring_count && n < max; i++) {
		size_t idx = (rv->ring_next + REVOKER_REVOCATIONS_MAX - 1 - i) % REVOKER_REVOCATIONS_MAX;

		out[n++] = rv->ring[idx];
	}
	return n;
}

/* ------------------------------------------------------------------ freeing */

void revoker_freed(struct broker *b)
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
	broker_memory_freed(b); /* the wait queue listens */
}

/* Free one lease, keeping its holder's and attachers' counts right, and log it. */
void revoker_free_lease(struct broker *b, struct lease *l, const char *why)
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

/* ---------------------------------------------------------------- revoking */

int revoker_revoke(struct broker *b, struct lease *l, uint32_t deadline_ms, enum broker_revocation why,
		   const char *reason)
{
	Pinbroker__V1__Revoke rm = PINBROKER__V1__REVOKE__INIT;
	struct conn *c = owner_conn(b, l);
	uint64_t now = now_ms();
	Pinbroker__V1__Reply r;
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
	b->counters.revocations[why]++;
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
		reply_send(c, &r, NULL, 0); /* a failed send marks c closing; its reap frees the lease */
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
				reply_send(ac, &r, NULL, 0);
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
		b->counters.enforcements[ENFORCED_DISCONNECT]++;
		if (c)
			reply_close(c, "revoke deadline passed (revoke-enforce=disconnect)");
		/* Closing only marks them: the attachers array stays as it is until the reap. */
		for (size_t i = 0; i < l->nattachers; i++)
			reply_close(l->attachers[i].owner, "revoke deadline passed (revoke-enforce=disconnect)");
		return;
	case ENFORCE_SIGTERM:
		b->counters.enforcements[ENFORCED_SIGTERM]++;
		sig = SIGTERM;
		break;
	case ENFORCE_SIGKILL:
		b->counters.enforcements[ENFORCED_SIGKILL]++;
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
		if (revoker_revoke(b, order[i], 0, REVOKED_PRESSURE, "host memory is critical") == 0)
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

void revoker_on_pressure(struct broker *b, enum broker_state to)
{
	struct revoker *rv = b->revoker;

	if (to == BROKER_CRITICAL) {
		reclaim_step(b);
		ev_timer_set(&rv->reclaim_timer, RECLAIM_STEP_MS / 1000.0, RECLAIM_STEP_MS / 1000.0);
		ev_timer_start(b->loop, &rv->reclaim_timer);
	} else {
		ev_timer_stop(b->loop, &rv->reclaim_timer);
	}
}

/* Cached-idle leases of other holders that could cover a shortfall. */
uint64_t revoker_reclaim_idle(struct broker *b, struct conn *asker, uint64_t need)
{
	uint64_t got = 0;
	struct lease *l;

	/* A failed REVOKE send frees nothing before the reap, so the walk stays valid. */
	for (l = lease_first(b->leases); l && got < need; l = lease_next(b->leases, l)) {
		if (l->state != LEASE_IDLE || l->owner == asker)
			continue;
		if (revoker_revoke(b, l, 0, REVOKED_IDLE_RECLAIM,
				   "another client needs the memory (cached-idle lease)") == 0)
			got += l->bytes;
	}
	return got;
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
			revoker_free_lease(b, l, "holder exited");
	}
	ghost_free(b, g);
	revoker_freed(b);
}

/* Watch pidfd (taken over) and free leases ids once that process exits. Returns 0 or -ENOMEM. */
int revoker_hold_until_exit(struct broker *b, int pidfd, pid_t pid, const uint64_t *ids, size_t n)
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

size_t revoker_hold_pids(const struct broker *b, uint64_t id, pid_t *out, size_t max)
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

void revoker_conn_closed(struct broker *b, struct conn *c)
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
		revoker_free_lease(b, l, "connection closed");
	}
	c->nleases = 0;
	c->nattached = 0;
	/* Going to 0 never fails: the uid's entry only shrinks or goes. */
	unbrokered_set(&b->unbrokered, c->uid, c->unbrokered_bytes, 0);
	b->unbrokered_bytes = b->unbrokered.reported_bytes;
	c->unbrokered_bytes = 0;
	if (nheld > 0) {
		int pidfd = fcntl(c->pidfd, F_DUPFD_CLOEXEC, 3);

		log_debug("connection of pid %d closed while the process lives: %zu leases stay counted until it exits",
			  c->pid, nheld);
		if (pidfd < 0 || revoker_hold_until_exit(b, pidfd, c->pid, held, nheld) < 0) {
			/* Cannot watch the process: better to free than to leak the bytes forever. */
			for (size_t i = 0; i < nheld; i++) {
				l = lease_find(b->leases, held[i]);
				if (l && lease_unmapped(l))
					revoker_free_lease(b, l, "connection closed (cannot watch the holder)");
			}
		}
	}
	free(held);
	if (freed > 0) {
		log_event(EV_CLIENT_DIED, LOG_NOTICE, 0, c->uid, c->pid,
			  "client pid %d uid %u went away holding %zu leases (%llu bytes); returned to the pool", c->pid,
			  c->uid, freed, (unsigned long long)freed_bytes);
		revoker_freed(b);
	}
}

/* ------------------------------------------------------------- life cycle */

int revoker_init(struct broker *b)
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

void revoker_fini(struct broker *b)
{
	struct revoker *rv = b->revoker;

	if (!rv)
		return;
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

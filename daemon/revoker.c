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
#include "budget.h"
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

/*
 * A process whose leases stay counted until it exits (an exit hold): its
 * connection closed while it ran, or it was detached from another uid's
 * overdue lease. One per process, however many connections and leases it
 * had: its one pidfd is an fd the daemon keeps for uid, counted against
 * uid's caps (budget_fd_add), so exit holds cannot eat the admin reserve
 * (issue 22, finding 3).
 */
struct ghost {
	struct ghost *next;
	struct broker *broker;
	int pidfd;
	pid_t pid;
	uid_t uid;
	bool counted; /* budget_fd_add done */
	ev_io io;
	size_t nids, capids;
	uint64_t *ids;
};

/*
 * One deadline round of enforcement, run in slices of enforce-slice-us per
 * loop turn (issue 22, finding 2): first every lease past its deadline is
 * marked overdue and its connections reached (MARK, resuming after cursor),
 * then one /proc scan looks for other processes mapping any of their chunks
 * (SCAN), then those are signalled (SIGNAL). Leases are named by id between
 * turns: one may be freed meanwhile. Incremental on the loop thread rather
 * than a scan thread: the lease table, the chunk fds and the pidfds stay
 * single-threaded with no locks, and a slice boundary is simply the next
 * /proc entry; a thread would need a copy of the keys, a hand-back of its
 * pidfds through the loop, and a way to stop it when the daemon does.
 */
enum round_phase { ROUND_IDLE, ROUND_MARK, ROUND_SCAN, ROUND_SIGNAL };

struct enforce_round {
	enum round_phase phase;
	uint64_t started_ms;
	uint64_t cursor;         /* MARK: the last lease id looked at */
	size_t overdue;          /* leases marked in this round */
	struct holder_key *keys; /* the overdue leases' chunks, each with its lease's uid */
	uint64_t *key_lease;     /* the lease id of each key */
	size_t nkeys, capkeys;
	uint64_t *held;          /* leases kept (an exit hold each) until the round ends, so none is freed and
				  * its chunks lent again while the scan still looks for their mappers */
	size_t nheld, capheld;
	pid_t *signalled;        /* connection processes already reached: the scan skips them */
	size_t nsignalled, capsignalled;
	bool other_uids;         /* some lease is not the daemon's uid's */
	struct holders_scan *scan;
	struct holder *found;
	size_t nfound, next_found, unreadable;
};

struct revoker {
	ev_timer deadline_timer;
	ev_timer reclaim_timer;
	ev_timer shrink_timer;
	ev_timer slice_timer; /* 0 s: the next slice of a round, after the loop has served I/O */
	struct enforce_round round;
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

/*
 * A lease now falls due in deadline_ms: fire the deadline timer by then. Not
 * arm_deadline_timer's walk of every lease, which would make a revoke of
 * thousands quadratic. A round under way re-arms when it ends.
 */
/*
 * A deadline round starts this long after the earliest deadline it serves, so that leases revoked
 * together (one REVOKE of a uid's 500 leases takes tens of ms on a loaded host, each lease stamped as
 * it is revoked) fall overdue in one round and one /proc scan, not in several. Enforcement being
 * this much late is harmless; being early would cut a holder's deadline short.
 */
#define ROUND_COALESCE_MS 100

static void arm_deadline_timer_for(struct broker *b, uint32_t deadline_ms)
{
	struct revoker *rv = b->revoker;

	if (!rv || rv->round.phase != ROUND_IDLE)
		return;
	if (ev_is_active(&rv->deadline_timer) &&
	    ev_timer_remaining(b->loop, &rv->deadline_timer) * 1000.0 <= (double)deadline_ms + ROUND_COALESCE_MS)
		return;
	ev_timer_stop(b->loop, &rv->deadline_timer);
	ev_timer_set(&rv->deadline_timer, (deadline_ms + ROUND_COALESCE_MS) / 1000.0, 0.);
	ev_timer_start(b->loop, &rv->deadline_timer);
}

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
	l->revoke_by_holder = why == REVOKED_SELF;
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
	arm_deadline_timer_for(b, deadline_ms);
	return 0;
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

static int hold_process(struct broker *b, int pidfd, bool take_pidfd, pid_t pid, uid_t uid, const uint64_t *ids,
			size_t n);

/*
 * An attacher of another uid on a lease whose holder revoked it: not
 * signalled (issue 22, finding 4). It got the REVOKE on its own connection;
 * now the lease leaves that connection's books, and since its process may
 * still map the pages, they stay counted until that process exits (an exit
 * hold on the attacher's process, its one pidfd counted to its own uid).
 */
static void detach_foreign_attacher(struct broker *b, struct lease *l, struct conn *ac)
{
	int r;

	lease_detach(l, ac);
	conn_lose(ac, l, true);
	b->generation++;
	r = ac->pidfd >= 0 ? hold_process(b, ac->pidfd, false, ac->pid, ac->uid, &l->id, 1) : -EBADF;
	log_event(EV_LEASE_OVERDUE, LOG_WARNING, l->id, ac->uid, ac->pid,
		  "overdue lease %llu: attacher pid %d of uid %u detached, not signalled: a revoke its holder (uid %u) "
		  "started does not reach other uids%s",
		  (unsigned long long)l->id, ac->pid, ac->uid, l->uid,
		  r == 0 ? "; it stays counted until that process exits" : "");
}

/* Note that pid was signalled in this round, so the scan skips it. */
static void round_add_signalled(struct enforce_round *rd, pid_t pid)
{
	if (rd->nsignalled == rd->capsignalled) {
		size_t cap = rd->capsignalled ? rd->capsignalled * 2 : 16;
		pid_t *p = realloc(rd->signalled, cap * sizeof(*p));

		if (!p)
			return; /* it may get a second signal: harmless */
		rd->signalled = p;
		rd->capsignalled = cap;
	}
	rd->signalled[rd->nsignalled++] = pid;
}

/* Add l's chunks to the round's scan, and hold l until the round ends. Returns 0 or -ENOMEM. */
static int round_add_keys(struct enforce_round *rd, struct lease *l)
{
	if (l->nchunks == 0)
		return 0;
	if (rd->nheld == rd->capheld) {
		size_t cap = rd->capheld ? rd->capheld * 2 : 64;
		uint64_t *p = realloc(rd->held, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		rd->held = p;
		rd->capheld = cap;
	}
	rd->held[rd->nheld++] = l->id;
	l->exit_holds++;
	for (size_t i = 0; i < l->nchunks; i++) {
		struct stat st;

		if (fstat(l->chunks[i]->fd, &st) < 0)
			continue;
		if (rd->nkeys == rd->capkeys) {
			size_t cap = rd->capkeys ? rd->capkeys * 2 : 64;
			struct holder_key *k = realloc(rd->keys, cap * sizeof(*k));
			uint64_t *ids;

			if (!k)
				return -ENOMEM;
			rd->keys = k;
			ids = realloc(rd->key_lease, cap * sizeof(*ids));
			if (!ids)
				return -ENOMEM;
			rd->key_lease = ids;
			rd->capkeys = cap;
		}
		rd->keys[rd->nkeys] = (struct holder_key){ .dev = st.st_dev, .ino = st.st_ino, .uid = l->uid };
		rd->key_lease[rd->nkeys++] = l->id;
	}
	if (l->uid != geteuid())
		rd->other_uids = true;
	return 0;
}

static int enforce_signal(const struct config *cfg)
{
	return cfg->revoke_enforce == ENFORCE_SIGKILL ? SIGKILL : cfg->revoke_enforce == ENFORCE_SIGTERM ? SIGTERM : 0;
}

/*
 * The cheap half of enforcing one overdue lease, in the MARK phase: its
 * connection, its attachers and the processes holding it until they exit are
 * reached through pidfds the daemon has; the /proc scan for the rest is the
 * round's (round_add_keys). A revoke the holder started never reaches a
 * process of another uid (broker_enforce_may_signal): such attachers are
 * detached instead.
 */
static void enforce(struct broker *b, struct lease *l)
{
	struct enforce_round *rd = &b->revoker->round;
	struct conn *c = owner_conn(b, l);
	int sig = enforce_signal(b->cfg);

	if (b->cfg->revoke_enforce == ENFORCE_NONE)
		return;
	/* From the last, since detaching moves the last entry into the hole. */
	for (size_t i = l->nattachers; i-- > 0;) {
		struct conn *ac = l->attachers[i].owner;

		if (!broker_enforce_may_signal(l, ac->uid))
			detach_foreign_attacher(b, l, ac);
	}
	if (b->cfg->revoke_enforce == ENFORCE_DISCONNECT) {
		b->counters.enforcements[ENFORCED_DISCONNECT]++;
		if (c)
			reply_close(c, "revoke deadline passed (revoke-enforce=disconnect)");
		/* Closing only marks them: the attachers array stays as it is until the reap. */
		for (size_t i = 0; i < l->nattachers; i++)
			reply_close(l->attachers[i].owner, "revoke deadline passed (revoke-enforce=disconnect)");
		return;
	}
	b->counters.enforcements[sig == SIGKILL ? ENFORCED_SIGKILL : ENFORCED_SIGTERM]++;
	if (c && signal_mapper(l, c->pidfd, c->pid, sig))
		round_add_signalled(rd, c->pid);
	/* An attacher of another uid is out of the /proc scan's reach: each is signalled through its own pidfd. */
	for (size_t i = 0; i < l->nattachers; i++) {
		const struct conn *ac = l->attachers[i].owner;

		if (signal_mapper(l, ac->pidfd, ac->pid, sig))
			round_add_signalled(rd, ac->pid);
	}
	for (struct ghost *g = b->revoker->ghosts; g; g = g->next)
		for (size_t i = 0; i < g->nids; i++) {
			if (g->ids[i] != l->id)
				continue;
			if (!broker_enforce_may_signal(l, g->uid))
				log_event(EV_LEASE_OVERDUE, LOG_WARNING, l->id, g->uid, g->pid,
					  "overdue lease %llu: pid %d of uid %u still holds it and is not signalled: a "
					  "revoke its holder started does not reach other uids",
					  (unsigned long long)l->id, g->pid, g->uid);
			else if (signal_mapper(l, g->pidfd, g->pid, sig))
				round_add_signalled(rd, g->pid);
		}
	if (round_add_keys(rd, l) < 0)
		log_warnx("cannot look for other holders of overdue lease %llu: out of memory, ignoring",
			  (unsigned long long)l->id);
}

/* The round is over: its holds end, and a lease nobody maps any more (its process exited meanwhile) is freed. */
static void round_release(struct broker *b, struct enforce_round *rd)
{
	size_t freed = 0;

	for (size_t i = 0; i < rd->nheld; i++) {
		struct lease *l = lease_find(b->leases, rd->held[i]);

		if (!l)
			continue; /* released by its uid meanwhile */
		if (l->exit_holds > 0)
			l->exit_holds--;
		if (!l->owner && l->nattachers == 0 && l->exit_holds == 0) {
			revoker_free_lease(b, l, "holder exited");
			freed++;
		}
	}
	rd->nheld = 0;
	if (freed > 0)
		revoker_freed(b);
}

static void round_reset(struct enforce_round *rd)
{
	holders_scan_free(rd->scan);
	for (size_t i = rd->next_found; i < rd->nfound; i++)
		if (rd->found[i].pidfd >= 0)
			close(rd->found[i].pidfd);
	free(rd->found);
	free(rd->keys);
	free(rd->key_lease);
	free(rd->held);
	free(rd->signalled);
	*rd = (struct enforce_round){ .phase = ROUND_IDLE };
}

/* The round's scan is over: say what it could not see. */
static void round_report(struct broker *b, struct enforce_round *rd)
{
	if (rd->other_uids && !holders_can_inspect_all())
		log_warnx("%zu overdue leases: cannot read the /proc/PID/maps of other uids without CAP_SYS_PTRACE, so "
			  "processes other than their connections' that still map them were not signalled; grant the "
			  "capability or run as root",
			  rd->overdue);
	else if (rd->unreadable > 0)
		log_warnx("%zu processes could not be inspected for the memory of %zu overdue leases, ignoring",
			  rd->unreadable, rd->overdue);
}

/* MARK: leases past their deadline, from the cursor on. Returns true when the walk is done. */
static bool round_mark(struct broker *b, struct enforce_round *rd, uint64_t t0, uint64_t budget_us)
{
	struct lease *l;

	while ((l = lease_next_after(b->leases, rd->cursor))) {
		rd->cursor = l->id;
		if (l->state != LEASE_REVOKING || l->deadline_ms > rd->started_ms)
			continue;
		lease_set_state(l, LEASE_OVERDUE, now_ms());
		rd->overdue++;
		log_event(EV_LEASE_OVERDUE, LOG_WARNING, l->id, l->uid, l->pid,
			  "lease %llu (%llu bytes, pid %d) is overdue: its holder did not let go within the deadline; "
			  "it stays counted until it does (revoke-enforce=%s)",
			  (unsigned long long)l->id, (unsigned long long)l->bytes, l->pid,
			  config_enforce_name(b->cfg->revoke_enforce));
		record_revocation(b, "lease %llu pid %d overdue", (unsigned long long)l->id, l->pid);
		/* Enforcement may close connections, but their leases go back only at the reap. */
		enforce(b, l);
		if (now_us() - t0 >= budget_us)
			return false;
	}
	return true;
}

/* SIGNAL: the processes the scan found, each if its lease is still overdue. Returns true when done. */
static bool round_signal(struct broker *b, struct enforce_round *rd, uint64_t t0, uint64_t budget_us)
{
	int sig = enforce_signal(b->cfg);

	while (rd->next_found < rd->nfound) {
		struct holder *h = &rd->found[rd->next_found++];
		const struct lease *l = lease_find(b->leases, rd->key_lease[h->key]);

		/*
		 * Freed (its chunks may be another lease's by now) or given back
		 * meanwhile: leave it be. The scan matched only processes of the
		 * lease's own uid, which every revoke may reach.
		 */
		if (sig && l && l->state == LEASE_OVERDUE) {
			if (sys_pidfd_send_signal(h->pidfd, sig, 0) < 0)
				log_warn("pidfd_send_signal(%d, %s) for overdue lease %llu failed, ignoring", h->pid,
					 strsignal(sig), (unsigned long long)l->id);
			else
				log_event(EV_LEASE_OVERDUE, LOG_WARNING, l->id, l->uid, h->pid,
					  "sent %s to pid %d for overdue lease %llu: it still maps or holds the lease's "
					  "memory",
					  sigabbrev_np(sig), h->pid, (unsigned long long)l->id);
		}
		close(h->pidfd);
		h->pidfd = -1;
		if (now_us() - t0 >= budget_us)
			return rd->next_found == rd->nfound;
	}
	return true;
}

/*
 * One slice of the round: at most enforce-slice-us of work (one process's
 * /proc entry may pass it), then the loop serves everyone else and the
 * slice timer brings the next slice. The whole round scans /proc once,
 * whatever the number of overdue leases.
 */
static void round_step(struct broker *b)
{
	struct revoker *rv = b->revoker;
	struct enforce_round *rd = &rv->round;
	uint64_t t0 = now_us(), budget_us = b->cfg->enforce_slice_us;
	int r;

	if (rd->phase == ROUND_MARK) {
		if (!round_mark(b, rd, t0, budget_us))
			goto more;
		rd->phase = ROUND_SCAN;
		if (rd->nkeys == 0 || !enforce_signal(b->cfg))
			goto done;
		r = holders_scan_new(b->cfg->proc_root, rd->keys, rd->nkeys, rd->signalled, rd->nsignalled, &rd->scan);
		if (r < 0) {
			log_warnx("cannot look for other holders of %zu overdue leases in %s/proc: %s; check proc-root, "
				  "ignoring",
				  rd->overdue, b->cfg->proc_root, strerror(-r));
			goto done;
		}
		if (now_us() - t0 >= budget_us)
			goto more;
	}
	if (rd->phase == ROUND_SCAN) {
		uint64_t spent = now_us() - t0;

		r = holders_scan_step(rd->scan, budget_us > spent ? budget_us - spent : 1);
		if (r == 0)
			goto more;
		if (r < 0) {
			log_warnx("the holder scan for %zu overdue leases ran out of memory, ignoring", rd->overdue);
			goto done;
		}
		holders_scan_take(rd->scan, &rd->found, &rd->nfound, &rd->unreadable, NULL);
		b->counters.holder_scans++;
		log_debug("holder scan for %zu overdue leases (%zu chunks): %zu other processes, %llu ms since the "
			  "deadline round began",
			  rd->overdue, rd->nkeys, rd->nfound, (unsigned long long)(now_ms() - rd->started_ms));
		holders_scan_free(rd->scan);
		rd->scan = NULL;
		round_report(b, rd);
		rd->phase = ROUND_SIGNAL;
		if (now_us() - t0 >= budget_us)
			goto more;
	}
	if (rd->phase == ROUND_SIGNAL && !round_signal(b, rd, t0, budget_us))
		goto more;
done:
	round_release(b, rd);
	round_reset(rd);
	arm_deadline_timer(b);
	return;
more:
	ev_timer_stop(b->loop, &rv->slice_timer);
	ev_timer_set(&rv->slice_timer, 0., 0.);
	ev_timer_start(b->loop, &rv->slice_timer);
}

static void slice_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct broker *b = w->data;

	if (b->revoker->round.phase != ROUND_IDLE)
		round_step(b);
}

static void deadline_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct broker *b = w->data;
	struct enforce_round *rd = &b->revoker->round;

	/* A round under way picks up nothing new; the next one starts when it ends (arm_deadline_timer). */
	if (rd->phase != ROUND_IDLE)
		return;
	rd->phase = ROUND_MARK;
	rd->started_ms = now_ms();
	rd->cursor = 0;
	round_step(b);
}

static void arm_deadline_timer(struct broker *b)
{
	struct revoker *rv = b->revoker;
	uint64_t earliest = UINT64_MAX, now = now_ms();

	if (!rv || rv->round.phase != ROUND_IDLE)
		return; /* the round re-arms when it ends */
	for (struct lease *l = lease_first(b->leases); l; l = lease_next(b->leases, l))
		if (l->state == LEASE_REVOKING && l->deadline_ms < earliest)
			earliest = l->deadline_ms;
	ev_timer_stop(b->loop, &rv->deadline_timer);
	if (earliest == UINT64_MAX)
		return;
	ev_timer_set(&rv->deadline_timer, (earliest > now ? earliest - now : 0) / 1000.0 + ROUND_COALESCE_MS / 1000.0,
		     0.);
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
	if (g->counted && b->budget)
		budget_fd_sub(b->budget, g->uid);
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

/* The exit hold of pid if it has one and the process still runs (then the pid cannot name another). */
static struct ghost *ghost_find(struct broker *b, pid_t pid)
{
	for (struct ghost *g = b->revoker->ghosts; g; g = g->next) {
		struct pollfd p = { .fd = g->pidfd, .events = POLLIN };

		if (g->pid == pid && poll(&p, 1, 0) == 0)
			return g;
	}
	return NULL;
}

/*
 * Hold leases ids until the process behind pidfd exits. A process keeps one
 * exit hold, with one pidfd, however many of its connections closed and
 * leases it held: a second call for a live pid adds its ids to the first.
 * take_pidfd: pidfd is the caller's to give (kept or closed here); otherwise
 * a copy is made only when the process has no hold yet. The pidfd is counted
 * against uid's fd caps. Returns 0, -ENOMEM or -errno of the copy (the
 * leases untouched, a taken pidfd closed).
 */
static int hold_process(struct broker *b, int pidfd, bool take_pidfd, pid_t pid, uid_t uid, const uint64_t *ids,
			size_t n)
{
	struct revoker *rv = b->revoker;
	struct ghost *g = ghost_find(b, pid);
	bool fresh = !g;
	int r;

	if (g && take_pidfd)
		close(pidfd);
	if (!g) {
		g = calloc(1, sizeof(*g));
		if (!g) {
			if (take_pidfd)
				close(pidfd);
			return -ENOMEM;
		}
		g->pidfd = take_pidfd ? pidfd : fcntl(pidfd, F_DUPFD_CLOEXEC, 3);
		if (g->pidfd < 0) {
			r = -errno;
			free(g);
			return r;
		}
		g->broker = b;
		g->pid = pid;
		g->uid = uid;
	}
	if (g->nids + n > g->capids) {
		size_t cap = g->capids ? g->capids * 2 : 4;
		uint64_t *p;

		while (cap < g->nids + n)
			cap *= 2;
		p = realloc(g->ids, cap * sizeof(*p));
		if (!p) {
			if (fresh) {
				close(g->pidfd);
				free(g);
			}
			return -ENOMEM;
		}
		g->ids = p;
		g->capids = cap;
	}
	memcpy(g->ids + g->nids, ids, n * sizeof(*ids));
	g->nids += n;
	for (size_t i = 0; i < n; i++) {
		struct lease *l = lease_find(b->leases, ids[i]);

		if (l)
			l->exit_holds++;
	}
	if (!fresh)
		return 0;
	/* Counted even past the cap: the process holds the memory either way; acquires see it. */
	g->counted = b->budget && budget_fd_add(b->budget, uid) == 0;
	ev_io_init(&g->io, ghost_cb, g->pidfd, EV_READ);
	g->io.data = g;
	ev_io_start(b->loop, &g->io);
	g->next = rv->ghosts;
	rv->ghosts = g;
	return 0;
}

/*
 * The real uid of the process pidfd names, read from /proc/PID/status and confirmed through the pidfd after
 * the read (a pid is reused only once its process is gone, and the pidfd outlives neither): (uid_t)-1 when
 * it cannot be told.
 */
static uid_t pidfd_real_uid(int pidfd, pid_t pid)
{
	char path[64], line[256];
	unsigned long uid = (unsigned long)-1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return (uid_t)-1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Uid: %lu", &uid) == 1)
			break;
	fclose(f);
	if (uid == (unsigned long)-1 || sys_pidfd_send_signal(pidfd, 0, 0) < 0)
		return (uid_t)-1;
	return (uid_t)uid;
}

int revoker_hold_until_exit(struct broker *b, int pidfd, pid_t pid, const uint64_t *ids, size_t n)
{
	/*
	 * A holder or a mapper after a restart: its own uid, not the lease's, which an attacher of another uid
	 * does not share. The pidfd is charged to it, and a revoke the holder starts never signals it (issue
	 * 22, finding 4). One whose uid cannot be told is charged to no real uid and never signalled by a holder.
	 */
	return hold_process(b, pidfd, true, pid, pidfd_real_uid(pidfd, pid), ids, n);
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

void revoker_foreach_hold(const struct broker *b, void (*fn)(uint64_t id, pid_t pid, void *ud), void *ud)
{
	if (!b->revoker)
		return;
	for (const struct ghost *g = b->revoker->ghosts; g; g = g->next)
		for (size_t i = 0; i < g->nids; i++)
			fn(g->ids[i], g->pid, ud);
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
		bool had_hold = ghost_find(b, c->pid) != NULL;

		log_debug("connection of pid %d closed while the process lives: %zu leases stay counted until it exits",
			  c->pid, nheld);
		/* The connection's own pidfd becomes the process's exit hold (no copy); a second connection's
		 * pidfd is closed with it at the reap, as the process has one already. */
		if (hold_process(b, c->pidfd, !had_hold, c->pid, c->uid, held, nheld) == 0) {
			if (!had_hold)
				c->pidfd = -1;
		} else {
			if (!had_hold)
				c->pidfd = -1; /* closed by hold_process */
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
	ev_timer_init(&rv->slice_timer, slice_cb, 0., 0.);
	rv->slice_timer.data = b;
	b->revoker = rv;
	return 0;
}

void revoker_fini(struct broker *b)
{
	struct revoker *rv = b->revoker;

	if (!rv)
		return;
	ev_timer_stop(b->loop, &rv->slice_timer);
	round_reset(&rv->round);
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

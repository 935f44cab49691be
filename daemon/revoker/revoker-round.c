/* SPDX-License-Identifier: MIT */
/*
 * Deadline rounds: leases past their REVOKE deadline marked overdue and enforced (disconnect or signal), with one
 * sliced /proc scan for their other mappers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ev.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker.h"
#include "config.h"
#include "conn.h"
#include "daemon.h"
#include "holders.h"
#include "lease.h"
#include "log.h"
#include "pool.h"
#include "reply.h"
#include "revoker-int.h"
#include "revoker-policy.h"
#include "util.h"

static void arm_deadline_timer(struct broker *b);

/*
 * A lease now falls due in deadline_ms: fire the deadline timer by then. Not
 * arm_deadline_timer's walk of every lease, which would make a revoke of
 * thousands quadratic. A round under way re-arms when it ends.
 */
void revoker_round_arm_for(struct broker *b, uint32_t deadline_ms)
{
	struct revoker *rv = daemon_of(b)->revoker;

	if (!rv || rv->round.phase != ROUND_IDLE)
		return;
	if (revoker_policy_timer_serves(ev_is_active(&rv->deadline_timer),
					ev_timer_remaining(daemon_of(b)->loop, &rv->deadline_timer) * 1000.0,
					deadline_ms))
		return;
	ev_timer_stop(daemon_of(b)->loop, &rv->deadline_timer);
	ev_timer_set(&rv->deadline_timer, (deadline_ms + REVOKER_ROUND_COALESCE_MS) / 1000.0, 0.);
	ev_timer_start(daemon_of(b)->loop, &rv->deadline_timer);
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
 * An attacher of another uid on a lease whose holder revoked it: not
 * signalled (a holder must not reach another uid's process). It got the REVOKE on its own connection;
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
	/* Without a pidfd for it (none on this kernel), a polled hold: not freed under a process that may map it. */
	r = revoker_hold_process(b, ac->pidfd, false, ac->pid, ac->uid, &l->id, NULL, 1);
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

		if (fstat(l->chunks[i].mem->fd, &st) < 0)
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
	struct enforce_round *rd = &daemon_of(b)->revoker->round;
	struct conn *c = revoker_owner(l);
	int sig = revoker_policy_signal(daemon_of(b)->cfg->revoke_enforce);

	if (daemon_of(b)->cfg->revoke_enforce == ENFORCE_NONE)
		return;
	/* From the last, since detaching moves the last entry into the hole. */
	for (size_t i = l->nattachers; i-- > 0;) {
		struct conn *ac = l->attachers[i].owner;

		if (!broker_enforce_may_signal(l, ac->uid))
			detach_foreign_attacher(b, l, ac);
	}
	if (daemon_of(b)->cfg->revoke_enforce == ENFORCE_DISCONNECT) {
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
	for (struct exit_hold *g = daemon_of(b)->revoker->holds; g; g = g->next)
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
		if (revoker_hold_end(b, l)) {
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

	while ((l = revoker_policy_next_overdue(b->leases, &rd->cursor, rd->started_ms))) {
		if (l->no_revoke) {
			/* Revoked while cached, and its holder neither gave it back nor took it back into use:
			 * a library bug or a hung process. Its holder cannot give memory back on request, so it
			 * is never signalled: the lease is counted as in use again. */
			lease_cancel_revoke(l, now_ms());
			b->counters.revokes_cancelled[CANCELLED_NOT_GIVEN_BACK]++;
			log_event(EV_REVOKE_CANCELLED, LOG_WARNING, l->id, l->uid, l->pid,
				  "lease %llu (pid %d): a never-revoked lease revoked while cached was not given back "
				  "within its deadline; kept as in use, its holder is not signalled",
				  (unsigned long long)l->id, l->pid);
			continue;
		}
		lease_set_state(l, LEASE_OVERDUE, now_ms());
		rd->overdue++;
		log_event(EV_LEASE_OVERDUE, LOG_WARNING, l->id, l->uid, l->pid,
			  "lease %llu (%llu bytes, pid %d) is overdue: its holder did not let go within the deadline; "
			  "it stays counted until it does (revoke-enforce=%s)",
			  (unsigned long long)l->id, (unsigned long long)l->bytes, l->pid,
			  config_enforce_name(daemon_of(b)->cfg->revoke_enforce));
		revoker_record(b, "lease %llu pid %d overdue", (unsigned long long)l->id, l->pid);
		/* Enforcement may close connections, but their leases go back only at the reap. */
		enforce(b, l);
		if (revoker_policy_slice_spent(t0, now_us(), budget_us))
			return false;
	}
	return true;
}

/* SIGNAL: the processes the scan found, each if its lease is still overdue. Returns true when done. */
static bool round_signal(struct broker *b, struct enforce_round *rd, uint64_t t0, uint64_t budget_us)
{
	int sig = revoker_policy_signal(daemon_of(b)->cfg->revoke_enforce);

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
				log_event(
					EV_LEASE_OVERDUE, LOG_WARNING, l->id, l->uid, h->pid,
					"sent %s to pid %d for overdue lease %llu: it still maps or holds the lease's "
					"memory",
					sigabbrev_np(sig), h->pid, (unsigned long long)l->id);
		}
		close(h->pidfd);
		h->pidfd = -1;
		if (revoker_policy_slice_spent(t0, now_us(), budget_us))
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
	struct revoker *rv = daemon_of(b)->revoker;
	struct enforce_round *rd = &rv->round;
	uint64_t t0 = now_us(), budget_us = daemon_of(b)->cfg->enforce_slice_us;
	int r;

	if (rd->phase == ROUND_MARK) {
		if (!round_mark(b, rd, t0, budget_us))
			goto more;
		rd->phase = ROUND_SCAN;
		if (rd->nkeys == 0 || !revoker_policy_signal(daemon_of(b)->cfg->revoke_enforce))
			goto done;
		r = holders_scan_new(daemon_of(b)->cfg->proc_root, rd->keys, rd->nkeys, rd->signalled, rd->nsignalled,
				     &rd->scan);
		if (r < 0) {
			log_warnx(
				"cannot look for other holders of %zu overdue leases in %s/proc: %s; check proc-root, "
				"ignoring",
				rd->overdue, daemon_of(b)->cfg->proc_root, strerror(-r));
			goto done;
		}
		if (revoker_policy_slice_spent(t0, now_us(), budget_us))
			goto more;
	}
	if (rd->phase == ROUND_SCAN) {
		r = holders_scan_step(rd->scan, revoker_policy_slice_left(t0, now_us(), budget_us));
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
		if (revoker_policy_slice_spent(t0, now_us(), budget_us))
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
	ev_timer_stop(daemon_of(b)->loop, &rv->slice_timer);
	ev_timer_set(&rv->slice_timer, 0., 0.);
	ev_timer_start(daemon_of(b)->loop, &rv->slice_timer);
}

static void slice_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct broker *b = w->data;

	if (daemon_of(b)->revoker->round.phase != ROUND_IDLE)
		round_step(b);
}

static void deadline_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct broker *b = w->data;
	struct enforce_round *rd = &daemon_of(b)->revoker->round;

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
	struct revoker *rv = daemon_of(b)->revoker;
	uint64_t earliest, now = now_ms();

	if (!rv || rv->round.phase != ROUND_IDLE)
		return; /* the round re-arms when it ends */
	earliest = revoker_policy_earliest_deadline(b->leases);
	ev_timer_stop(daemon_of(b)->loop, &rv->deadline_timer);
	if (earliest == UINT64_MAX)
		return;
	ev_timer_set(&rv->deadline_timer, revoker_policy_round_delay_ms(earliest, now) / 1000.0, 0.);
	ev_timer_start(daemon_of(b)->loop, &rv->deadline_timer);
}

void revoker_round_init(struct broker *b)
{
	struct revoker *rv = daemon_of(b)->revoker;

	ev_timer_init(&rv->deadline_timer, deadline_cb, 0., 0.);
	rv->deadline_timer.data = b;
	ev_timer_init(&rv->slice_timer, slice_cb, 0., 0.);
	rv->slice_timer.data = b;
}

void revoker_round_fini(struct broker *b)
{
	struct revoker *rv = daemon_of(b)->revoker;

	ev_timer_stop(daemon_of(b)->loop, &rv->slice_timer);
	round_reset(&rv->round);
}

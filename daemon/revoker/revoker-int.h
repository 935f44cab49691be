/* SPDX-License-Identifier: MIT */
/*
 * What the revoker's files share: its state, and the verbs of the lower files (freeing, exit holds, rounds) that the
 * upper ones call.
 */
#pragma once

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "broker.h"
#include "lease.h"
#include "monitor.h"
#include "revoker.h"

/*
 * The files call one way: revoker.c (revoke, reclaim, a closing connection, life cycle) →
 * revoker-round.c (deadline rounds and enforcement) → revoker-hold.c (exit holds) →
 * revoker-free.c (freeing, the revocation ring) → revoker-policy.c (the decisions, no I/O).
 */

/*
 * An exit hold: a process whose leases stay counted until it exits (its connection closed while it ran, it was
 * detached from an overdue lease, or recovery found it mapping an adopted lease), one per process. It is watched
 * through its pidfd, an fd counted against its uid's caps; without one (ENOSYS, EMFILE, a sandbox) it is polled
 * every REVOKER_POLL_MS, uncounted, its start time telling its process from a later one with the same pid.
 */
struct exit_hold {
	struct exit_hold *next;
	struct broker *broker;
	int pidfd; /* -1: polled */
	pid_t pid;
	uid_t uid;          /* (uid_t)-1 when it could not be told (recovery's holds, until a pidfd confirms it) */
	uint64_t starttime; /* polled: its process's /proc start time when the hold was made (0: unknown) */
	bool counted;       /* budget_fd_add done */
	bool polled;        /* pidfd -1: counted in the revoker's npolled */
	ev_io io;           /* started only with a pidfd */
	size_t nids, capids;
	uint64_t *ids;
	bool *holder; /* per id: held for the lease's holder (re-declaring it ends that), not a mapper */
};

/*
 * One deadline round of enforcement, run in slices of enforce-slice-us per
 * loop turn, so other clients are served between slices: first every lease past its deadline is
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
	uint64_t *held; /* leases kept (an exit hold each) until the round ends, so none is freed and
				  * its chunks lent again while the scan still looks for their mappers */
	size_t nheld, capheld;
	pid_t *signalled; /* connection processes already reached: the scan skips them */
	size_t nsignalled, capsignalled;
	bool other_uids; /* some lease is not the daemon's uid's */
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
	struct exit_hold *holds;
	ev_timer poll_timer; /* every REVOKER_POLL_MS while npolled > 0 */
	size_t npolled;      /* holds without a pidfd */
	bool no_pidfd;       /* test only: exit holds' pidfd_open fails with ENOSYS (REVOKER_NO_PIDFD_ENV) */
	struct monitor_event ring[REVOKER_REVOCATIONS_MAX];
	size_t ring_count;
	size_t ring_next;
};

/* l's holder's connection: owner is a struct conn * while the connection lives; NULL for holds and orphans. */
static inline struct conn *revoker_owner(const struct lease *l)
{
	return l->owner;
}

/* revoker-free.c: add an event to the revocation ring (pinctl status shows the last ones). */
void revoker_record(struct broker *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * revoker-hold.c: hold leases ids until the process behind pidfd exits. A process keeps one
 * exit hold, with one pidfd, however many of its connections closed and
 * leases it held: a second call for a live pid adds its ids to the first.
 * take_pidfd: pidfd is the caller's to give (kept or closed here); otherwise
 * a copy is made only when the process has no hold yet (or a polled one).
 * pidfd -1 (none can be had), or a copy that fails: the hold is polled (struct
 * exit_hold), so pid must be alive. holder[i] (NULL: all
 * false): ids[i] is held for its holder, whose re-declare ends the hold, not for
 * a mapper (revoker_unhold). The pidfd is counted
 * against uid's fd caps. Returns 0 or -ENOMEM (the leases untouched, a taken pidfd closed).
 */
int revoker_hold_process(struct broker *b, int pidfd, bool take_pidfd, pid_t pid, uid_t uid, const uint64_t *ids,
			 const bool *holder, size_t n);
/* The exit hold of pid if it has one and the process still runs (then the pid cannot name another); else NULL. */
struct exit_hold *revoker_exit_hold_find(struct broker *b, pid_t pid);
/* Drop exit hold g: its watcher, pidfd and fd count go; its leases' exit_holds are the caller's. */
void revoker_exit_hold_free(struct broker *b, struct exit_hold *g);

/* revoker-hold.c: the poll of holds without a pidfd (revoker_init / revoker_fini). */
void revoker_hold_init(struct broker *b);
void revoker_hold_fini(struct broker *b);

/* revoker-round.c: the deadline and slice timers (revoker_init / revoker_fini). */
void revoker_round_init(struct broker *b);
void revoker_round_fini(struct broker *b);
/* A lease now falls due in deadline_ms: fire the deadline timer by then (plus the coalescing window). */
void revoker_round_arm_for(struct broker *b, uint32_t deadline_ms);

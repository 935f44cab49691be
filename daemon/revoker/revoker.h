/* SPDX-License-Identifier: MIT */
/*
 * The revoker: REVOKE with deadlines, enforcement, critical-state reclaim, the revocation ring, freeing leases, and
 * exit holds.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "broker.h"

struct conn;
struct lease;
struct monitor_event;

/* Its deadline, reclaim and pool-shrink timers; exit hold watchers come with hold_until_exit. Returns 0 or -ENOMEM. */
int revoker_init(struct broker *b);
/* Stops the timers and the exit hold watchers, and frees every lease left (shutdown: the fd store has them). */
void revoker_fini(struct broker *b);

/*
 * Send REVOKE(lease, deadline) to its holder and every attacher and mark it
 * REVOKING (deadline 0: revoke-deadline-ms). Idle cached leases are included.
 * why is counted in pinbroker_revocations_total{reason}; reason is the text
 * the holder, the journal and pinctl status see. Returns 0, -EPERM (a
 * never-revoked lease) or -EINVAL if the lease cannot be revoked in its state.
 */
int revoker_revoke(struct broker *b, struct lease *l, uint32_t deadline_ms, enum broker_revocation why,
		   const char *reason);

/* Revoke cached-idle leases of holders other than asker until need bytes are on their way back. Returns the bytes. */
uint64_t revoker_reclaim_idle(struct broker *b, struct conn *asker, uint64_t need);

/* Free one lease, keeping its holder's and attachers' counters right, and log why. */
void revoker_free_lease(struct broker *b, struct lease *l, const char *why);
/*
 * Leases were freed: trim the pool (at once under pressure, after
 * pool-shrink-delay-ms otherwise) and raise the freed-memory event
 * (broker_memory_freed), which the wait queue listens to.
 */
void revoker_freed(struct broker *b);

/*
 * c is closing: free its leases (a live process's stay counted until it exits). Its waiting acquires are gone already.
 */
void revoker_conn_closed(struct broker *b, struct conn *c);

/* The pressure state is now to (b->state set): while critical, reclaim every RECLAIM_STEP_MS. */
void revoker_on_pressure(struct broker *b, enum broker_state to);

/*
 * Test only: "1" makes the pidfd_open of exit holds (recovery's, and the poll's below) fail with ENOSYS, as under
 * valgrind 3.19, an old kernel or a seccomp sandbox; "all" makes every pidfd the daemon would take fail so
 * (SO_PEERPIDFD and pidfd_open alike: connections, holders.c, restart.c too). Read once, by revoker_init.
 */
#define REVOKER_NO_PIDFD_ENV "PINBROKER_TEST_NO_PIDFD"

/*
 * How often an exit hold without a pidfd looks at its process again: its leases stay counted up to this long after it
 * exits.
 */
#define REVOKER_POLL_MS 1000

/* pidfd_open of pid for an exit hold: the pidfd, or -errno (the test hook above: -ENOSYS). */
int revoker_open_pidfd(const struct broker *b, pid_t pid);

/*
 * Whether the process a hold was made for no longer maps anything, so its leases can go: err (a -errno, or 0) is
 * why it could not be watched through a pidfd, ESRCH saying it is gone. Gone too when kill(pid, 0) says ESRCH,
 * when pid's /proc start time is not starttime (0: unknown, no check; the pid was reused), or when its leader has
 * no mm and is its only thread (a zombie, or a process already past exit_mm: it exits). Any other failure (EPERM
 * from kill: it runs as another user; /proc unreadable, or another pid namespace's) leaves it alive: counted
 * longer, never freed early.
 */
bool revoker_process_gone(pid_t pid, int err, uint64_t starttime);
/* revoker_process_gone with no start time to compare (a process looked at once, not a hold's). */
bool revoker_pid_gone(pid_t pid, int err);
/* pid's start time from /proc/PID/stat (clock ticks since boot), or 0 when it cannot be read. */
uint64_t revoker_pid_starttime(pid_t pid);

/*
 * Keep lease id counted until the process behind pidfd exits (an orphan whose
 * holder is alive but did not re-declare: holder; a former attacher after a
 * restart: not holder): the lease gains an exit hold (lease.h), dropped at that
 * exit; a lease that nobody maps then is freed (an orphan only once the
 * re-declare grace is over). A holder's hold ends too when that process
 * re-declares the lease (revoker_unhold); a mapper's does not, as a stale
 * attachment of its own may still map it. Takes over pidfd. pidfd -1: the
 * process (alive) cannot be watched, and is polled every REVOKER_POLL_MS until
 * it is gone or a pidfd can be had. Returns 0 or -ENOMEM (pidfd closed, lease
 * untouched).
 */
int revoker_hold_until_exit(struct broker *b, int pidfd, pid_t pid, bool holder, uint64_t id);

/*
 * One exit hold on l ended (its process exited, a round's hold is over, or the poll found a process it
 * could not watch gone): l->exit_holds drops by one. Returns whether nobody maps l now, so the caller frees it (an
 * orphan only once the re-declare grace is over).
 */
bool revoker_hold_end(struct broker *b, struct lease *l);
/*
 * Free orphan l (never re-declared after a restart) whose holder and mappers are gone, said so in the journal: the
 * grace's end and an exit hold's end alike.
 */
void revoker_reclaim_orphan(struct broker *b, struct lease *l);

/*
 * Drop pid's exit hold on lease id: the process holds the lease through a live connection again (a re-declare
 * after redeclare-grace-ms), whose close or exit is what ends it now. Returns whether there was one.
 */
bool revoker_unhold(struct broker *b, pid_t pid, uint64_t id);

/*
 * The pids of the processes holding lease id until they exit (watched or polled): at most max in out. Returns how many.
 */
size_t revoker_hold_pids(const struct broker *b, uint64_t id, pid_t *out, size_t max);

/*
 * Every (lease id, pid) exit hold, polled ones included, to fn: one walk, for a caller that needs them all
 * (restart_save).
 */
void revoker_foreach_hold(const struct broker *b, void (*fn)(uint64_t id, pid_t pid, void *ud), void *ud);

/* The revocation events kept for revoker_revocations. */
#define REVOKER_REVOCATIONS_MAX 16
/* Copy of the last revocation events, newest first. Returns how many. */
size_t revoker_revocations(const struct broker *b, struct monitor_event *out, size_t max);

/* SPDX-License-Identifier: MIT */
/* Crash and restart recovery through systemd's fd store: pool memfds plus a small state memfd; the instance id. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct broker;
struct lease;

/*
 * Test only: recovery_init sleeps this many ms after it set the re-declare grace, as a slow start-up does
 * (the restart scan, the pool's warm-up before ready) before the loop answers anyone.
 */
#define RECOVERY_STALL_ENV "PINBROKER_TEST_RECOVERY_STALL_MS"

/*
 * Always call it, after the pool and lease table exist and before prewarming
 * and before the loop answers anyone. It picks this daemon's instance id.
 *
 * Under systemd (with FileDescriptorStoreMax=): adopt the chunks and leases a
 * previous instance kept in the fd store (leases come back ORPHANED until
 * their clients re-declare them, and are reclaimed after redeclare-grace-ms,
 * counted from the loop's first turn, when clients can be answered again),
 * then keep storing every new chunk and a state memfd describing who holds
 * what. A stored chunk that the state cannot prove idle (torn or unreadable
 * state, a lease line that does not add up, a chunk no line names) is
 * quarantined: never lent, and replaced by a fresh memfd when
 * redeclare-grace-ms ends. A lease whose holder (at the grace's end) or former
 * attacher still runs stays counted until that process exits, watched through
 * a pidfd, or, where none can be had (ENOSYS, EMFILE), looked at again every
 * second (the revoker's exit holds, revoker.h; test hook REVOKER_NO_PIDFD_ENV). A readable state keeps the previous
 * instance id.
 * Without systemd a restart starts clean, with a new instance id.
 */
void recovery_init(struct broker *b);
/* Stop watching; at a clean stop the pool's destroy hook empties the store. */
void recovery_fini(struct broker *b);

/*
 * The instance id: random and never 0, picked at a clean start and kept across
 * a restart that adopts the fd store. A lease is named by (instance id, lease
 * id); lease ids start at 1 again in a new instance. 0 before recovery_init.
 */
uint64_t recovery_instance_id(const struct broker *b);

/*
 * Whether recovery_init read a committed state from the fd store and
 * re-adopted every lease it names: then every chunk the previous instance
 * lent is the pool's again, and restart.c need not look for others by name.
 */
bool recovery_adopted_state(const struct broker *b);

/*
 * Record lease l as lent, synchronously, before any of its chunk fds leave the
 * daemon: a crash after this call finds its chunks held, never idle. Costs one
 * short append to the state memfd (O(l->nchunks)); the full state is rewritten
 * from the loop, spaced so that it takes at most a tenth of the loop's time.
 * If the record cannot be written
 * the state is made unreadable, so that recovery quarantines every chunk
 * instead of trusting stale lines. No-op without an fd store.
 */
void recovery_lent(struct broker *b, const struct lease *l);

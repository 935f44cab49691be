/* SPDX-License-Identifier: MIT */
/* Exact accounting of leased bytes against the host budget and per-uid quotas. Pure: no I/O. */
#pragma once

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "refusal.h"

struct budget;

/* Returns 0 and *ret, or -ENOMEM. */
int budget_new(uint64_t limit_bytes, uint64_t uid_quota_bytes, struct budget **ret);
void budget_free(struct budget *b);

/* Change limits (config reload). Current charges stay; a limit below them only refuses new ones. */
void budget_set_limits(struct budget *b, uint64_t limit_bytes, uint64_t uid_quota_bytes);

/*
 * May uid lease `bytes` more? Idle pool memory counts as available, because the pool shrinks to make room.
 * Decided from budget_left and budget_uid_left, as the headroom is. Returns:
 *   REFUSAL_NONE          yes;
 *   REFUSAL_INVALID_SIZE  bytes is 0;
 *   REFUSAL_TOO_LARGE     bytes exceeds the whole budget or the uid quota: never satisfiable;
 *   REFUSAL_UID_QUOTA     over uid's quota with what it already holds;
 *   REFUSAL_BUDGET        over the budget with what is leased now.
 */
enum broker_refusal budget_check(const struct budget *b, uid_t uid, uint64_t bytes);

/* What the budget has left now: limit - leased, 0 when over; *limit and *used (leased) beside it. */
uint64_t budget_left(const struct budget *b, uint64_t *limit, uint64_t *used);
/*
 * What uid's quota has left now (quota - held, 0 when over), with *limit and *used (held). Returns false when no
 * uid quota binds (none is set, or it is at or above the budget: the budget is then the true bound).
 */
bool budget_uid_left(const struct budget *b, uid_t uid, uint64_t *limit, uint64_t *used, uint64_t *left);

/* Record a lease of bytes for uid. The caller ran budget_check() first; returns 0 or -ENOMEM. */
int budget_charge(struct budget *b, uid_t uid, uint64_t bytes);

/* Return bytes charged to uid. Asserts they were charged. */
void budget_uncharge(struct budget *b, uid_t uid, uint64_t bytes);

uint64_t budget_limit(const struct budget *b);
uint64_t budget_uid_quota(const struct budget *b);
uint64_t budget_leased(const struct budget *b);
uint64_t budget_uid_leased(const struct budget *b, uid_t uid);
/* The i-th uid holding anything (in uid order) into *uid; false past the last. */
bool budget_uid_at(const struct budget *b, size_t i, uid_t *uid);

/*
 * Count one lease of nchunks pool chunks for uid, or take one back. Kept
 * beside the bytes for the per-uid caps on leases and chunks (each chunk is
 * a file descriptor in the daemon). add returns 0 or -ENOMEM; sub aborts if
 * it was never counted.
 */
int budget_count_add(struct budget *b, uid_t uid, size_t nchunks);
void budget_count_sub(struct budget *b, uid_t uid, size_t nchunks);

/*
 * Of a uid's charged bytes, those in leases that are never revoked (for the
 * max-no-revoke-per-uid cap). Add after budget_charge, sub before
 * budget_uncharge: the bytes must be charged while they are counted here.
 */
void budget_no_revoke_add(struct budget *b, uid_t uid, uint64_t bytes);
void budget_no_revoke_sub(struct budget *b, uid_t uid, uint64_t bytes);
uint64_t budget_uid_no_revoke(const struct budget *b, uid_t uid);
uint64_t budget_no_revoke(const struct budget *b);
uint64_t budget_uid_leases(const struct budget *b, uid_t uid);
uint64_t budget_uid_chunks(const struct budget *b, uid_t uid);
uint64_t budget_leases(const struct budget *b);

/*
 * Count one more (or one fewer) fd the daemon keeps on uid's behalf besides
 * its chunks: the pidfd of a process whose leases are held until it exits.
 * They meet the same per-uid and daemon-wide fd caps as chunks do, so the
 * admin reserve (reserve-fds) stays free. add returns 0 or -ENOMEM; sub
 * aborts if none was counted.
 */
int budget_fd_add(struct budget *b, uid_t uid);
void budget_fd_sub(struct budget *b, uid_t uid);
/* The fds the daemon keeps for uid: its chunks plus its held fds. */
uint64_t budget_uid_fds(const struct budget *b, uid_t uid);
/* The same over every uid. */
uint64_t budget_fds(const struct budget *b);
uint64_t budget_chunks(const struct budget *b);

/* Bytes the idle pool may hold right now: limit - leased, 0 when over. */
uint64_t budget_pool_allowance(const struct budget *b);

/* SPDX-License-Identifier: MIT */
/*
 * The revoker's decisions on plain values: when a deadline round runs, which leases it marks, its slices, the reclaim
 * deficit.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "settings.h"
#include "lease.h"

/*
 * A deadline round starts this long after the earliest deadline it serves, so that leases revoked
 * together (one REVOKE of a uid's 500 leases takes tens of ms on a loaded host, each lease stamped as
 * it is revoked) fall overdue in one round and one /proc scan, not in several. Enforcement being
 * this much late is harmless; being early would cut a holder's deadline short.
 */
#define REVOKER_ROUND_COALESCE_MS 100

/* The deadline timer's delay at now_ms for a round that serves earliest_ms (never before it): ms. */
uint64_t revoker_policy_round_delay_ms(uint64_t earliest_ms, uint64_t now_ms);

/*
 * A lease now falls due in deadline_ms: whether the deadline timer (active, firing in remaining_ms)
 * already serves it, within the coalescing window. Otherwise the timer is set to deadline_ms plus
 * the window; it is never moved earlier than that, so a revoke of thousands costs no walk each.
 */
bool revoker_policy_timer_serves(bool active, double remaining_ms, uint32_t deadline_ms);

/* The earliest deadline among t's REVOKING leases; UINT64_MAX when none is. */
uint64_t revoker_policy_earliest_deadline(const struct lease_table *t);

/*
 * The next lease after *cursor (in id order) that a round started at started_ms marks overdue: one
 * still REVOKING whose deadline is at or before started_ms. *cursor moves past every lease looked
 * at, so a round resumes where its last slice stopped. NULL when the walk is done.
 */
struct lease *revoker_policy_next_overdue(const struct lease_table *t, uint64_t *cursor, uint64_t started_ms);

/* Whether a slice that began at t0_us has spent its budget_us by now_us. */
bool revoker_policy_slice_spent(uint64_t t0_us, uint64_t now_us, uint64_t budget_us);
/* What is left of the slice's budget at now_us; at least 1 µs, so a step always makes progress. */
uint64_t revoker_policy_slice_left(uint64_t t0_us, uint64_t now_us, uint64_t budget_us);

/* The signal revoke-enforce sends an overdue holder: SIGKILL, SIGTERM, or 0 (none, or disconnect). */
int revoker_policy_signal(enum config_enforce e);

/*
 * Bytes critical-state reclaim should bring back: how far MemAvailable (avail_pct of
 * mem_total_bytes) is below the tight line (aiming there lets hysteresis carry the state down);
 * 1, i.e. one lease, when there is no memory figure (NAN: PSI alone made it critical) or it is not
 * below the line.
 */
uint64_t revoker_policy_reclaim_deficit(double avail_pct, double tight_pct, uint64_t mem_total_bytes);

/* Bytes already on their way back: t's REVOKING leases. */
uint64_t revoker_policy_revoking_bytes(const struct lease_table *t);

/* SPDX-License-Identifier: MIT */
/*
 * The revoker's decisions on plain values: when a deadline round runs, which leases it marks, its slices, the reclaim
 * deficit.
 */
#include "revoker-policy.h"

#include <math.h>
#include <signal.h>

uint64_t revoker_policy_round_delay_ms(uint64_t earliest_ms, uint64_t now_ms)
{
	return (earliest_ms > now_ms ? earliest_ms - now_ms : 0) + REVOKER_ROUND_COALESCE_MS;
}

bool revoker_policy_timer_serves(bool active, double remaining_ms, uint32_t deadline_ms)
{
	return active && remaining_ms <= (double)deadline_ms + REVOKER_ROUND_COALESCE_MS;
}

uint64_t revoker_policy_earliest_deadline(const struct lease_table *t)
{
	uint64_t earliest = UINT64_MAX;

	for (struct lease *l = lease_first(t); l; l = lease_next(t, l))
		if (l->state == LEASE_REVOKING && l->deadline_ms < earliest)
			earliest = l->deadline_ms;
	return earliest;
}

struct lease *revoker_policy_next_overdue(const struct lease_table *t, uint64_t *cursor, uint64_t started_ms)
{
	struct lease *l;

	while ((l = lease_next_after(t, *cursor))) {
		*cursor = l->id;
		/* Given back (or revoked again later) since: not this round's. */
		if (l->state == LEASE_REVOKING && l->deadline_ms <= started_ms)
			return l;
	}
	return NULL;
}

bool revoker_policy_slice_spent(uint64_t t0_us, uint64_t now_us, uint64_t budget_us)
{
	return now_us - t0_us >= budget_us;
}

uint64_t revoker_policy_slice_left(uint64_t t0_us, uint64_t now_us, uint64_t budget_us)
{
	uint64_t spent = now_us - t0_us;

	return budget_us > spent ? budget_us - spent : 1;
}

int revoker_policy_signal(enum config_enforce e)
{
	return e == ENFORCE_SIGKILL ? SIGKILL : e == ENFORCE_SIGTERM ? SIGTERM : 0;
}

uint64_t revoker_policy_reclaim_deficit(double avail_pct, double tight_pct, uint64_t mem_total_bytes)
{
	if (!isnan(avail_pct) && avail_pct < tight_pct)
		return (uint64_t)((tight_pct - avail_pct) / 100.0 * (double)mem_total_bytes);
	return 1;
}

uint64_t revoker_policy_revoking_bytes(const struct lease_table *t)
{
	uint64_t sum = 0;

	for (struct lease *l = lease_first(t); l; l = lease_next(t, l))
		if (l->state == LEASE_REVOKING)
			sum += l->bytes;
	return sum;
}

/* SPDX-License-Identifier: MIT */
/*
 * Clients' reports of memory pinned outside the broker, summed per uid and capped at what the host can hold. Pure: no
 * I/O.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * Nothing here is verified: a report is a client's word. One uid can open many
 * connections and report on each, so the figures shown are capped (per uid and
 * in all) at what the host can pin outside the broker: its MemTotal less the
 * memory the daemon knows to be pinned (the pool and registrations).
 */
struct unbrokered_uid {
	uid_t uid;
	uint32_t connections;    /* its connections whose last report is not 0 */
	uint64_t reported_bytes; /* the sum of their last reports */
};

/* Embedded in struct broker; all zero is an empty table. Entries at 0 connections are dropped. */
struct unbrokered {
	struct unbrokered_uid *uids; /* sorted by uid; freed when the last entry goes */
	size_t nuids;
	size_t cap_uids;
	uint64_t reported_bytes; /* the sum over every uid, before any cap */
};

/*
 * One connection of uid changed its report from old_bytes (0 for none yet) to
 * new_bytes (0 when it closes or reports nothing). Returns 0, or -ENOMEM with
 * nothing changed (only when uid had no entry and new_bytes is not 0). Going to
 * 0 never fails. The caller bounds each report (unbrokered_report_ok), so the
 * sums cannot wrap.
 */
int unbrokered_set(struct unbrokered *u, uid_t uid, uint64_t old_bytes, uint64_t new_bytes);

/* Forget everything (the daemon's teardown). */
void unbrokered_clear(struct unbrokered *u);

/*
 * What the reports may add up to: mem_total_bytes (the host's MemTotal) less
 * pinned_bytes (what the daemon itself knows is pinned), 0 when that is more
 * than MemTotal. mem_total_bytes 0 (unknown) gives UINT64_MAX: no cap.
 */
uint64_t unbrokered_cap(uint64_t mem_total_bytes, uint64_t pinned_bytes);

/*
 * May one connection report bytes? false when bytes is more than
 * mem_total_bytes (no process pins more than the host has) or than max_bytes
 * (the wire's hard bound, kept when MemTotal is unknown: mem_total_bytes 0).
 */
bool unbrokered_report_ok(uint64_t bytes, uint64_t mem_total_bytes, uint64_t max_bytes);

/* A uid's reported sum (0 when it has none) and what of it counts under cap. */
uint64_t unbrokered_uid_reported(const struct unbrokered *u, uid_t uid);
uint64_t unbrokered_uid_counted(const struct unbrokered *u, uid_t uid, uint64_t cap);

/* The host's figure: each uid's sum capped at cap, their total capped at cap again. O(uids). */
uint64_t unbrokered_counted(const struct unbrokered *u, uint64_t cap);

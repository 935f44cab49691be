/* SPDX-License-Identifier: MIT */
/* For a config suite walking the key table: a value of each key, other than the running one, that validates. */
#pragma once

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

/*
 * Set k in c to a value other than base's that config_validate accepts, and
 * copy that value's text to *value. Every type's candidates are tried on every
 * key: config_set refuses the ones of another type. Returns false when none fits.
 */
static inline bool config_set_other_value(struct config *c, const struct config *base, const struct config_key *k,
					  const char **value)
{
	static const char *const common[] = {
		"1",
		"2",
		"50",
		"100",
		"1000",
		"3000",
		"4M",
		"8K",
		"50%",
		"1M",
		"no",
		"yes",
		"debug",
		"err",
		"/tmp/pinbroker-check",
		"/pinbroker-check/*:1M",
		NULL,
	};

	for (int pass = 0; pass < 2; pass++) {
		const char *const *cand = pass == 0 ? common : k->choices;

		for (size_t i = 0; cand && cand[i]; i++) {
			char *err = NULL;
			bool ok = config_set(c, k->name, cand[i], &err) == 0 && !config_key_equal(c, base, k) &&
				  config_validate(c, &err) == 0;

			free(err);
			if (ok) {
				*value = cand[i];
				return true;
			}
		}
	}
	return false;
}

/*
 * Which keys a reload applies and which need a restart, written out here (docs/operations.md's
 * table as of issue 24) rather than read from the key table's `reloadable` flags, so that a flag
 * flipped in daemon/config/config.c fails check_config and check_reload. A new key goes in one list.
 */
static const char *const config_reloadable_keys[] = {
	"budget",
	"uid-quota",
	"max-no-revoke-per-uid",
	"prewarm",
	"pool-shrink-delay-ms",
	"admin-group",
	"job-quota",
	"job-unknown",
	"metrics-path",
	"metrics-interval-ms",
	"metrics-detail",
	"log-level",
	"max-connections",
	"max-connections-per-uid",
	"handshake-timeout-ms",
	"max-leases-per-client",
	"max-leases-per-uid",
	"max-chunks-per-uid",
	"max-registrants-per-file",
	"max-reservations-per-uid",
	"max-queued-bytes-per-connection",
	"max-queued-bytes",
	"max-pending-acquires",
	"acquire-timeout-ms",
	"status-visibility",
	"tight-mem-available-pct",
	"critical-mem-available-pct",
	"tight-psi-some-avg10",
	"critical-psi-full-avg10",
	"tight-swapout-pages-per-s",
	"critical-swapout-pages-per-s",
	"tight-swap-free-pct",
	"hysteresis-ms",
	"poll-interval-ms",
	"revoke-deadline-ms",
	"revoke-min-deadline-ms",
	"enforce-slice-us",
	"revoke-enforce",
	"orphan-rescan-ms",
	NULL,
};
static const char *const config_restart_keys[] = {
	"socket",        "chunk-size",           "chunk-max",        "hugetlb",      "thp",
	"numa",          "numa-prewarm",         "prewarm-threads",  "proc-root",    "lock-memory",
	"reserve-fds",   "max-message-bytes",    "psi-window-ms",    "psi-stall-ms", "redeclare-grace-ms",
	"restart-state", "prewarm-before-ready", "warmup-batch-max", NULL,
};

static inline bool config_in_list(const char *const *list, const char *name)
{
	for (size_t i = 0; list[i]; i++)
		if (strcmp(list[i], name) == 0)
			return true;
	return false;
}

/* 1: a reload applies name; 0: it needs a restart; -1: in neither list (or in both). */
static inline int config_expect_reloadable(const char *name)
{
	bool rl = config_in_list(config_reloadable_keys, name), rs = config_in_list(config_restart_keys, name);

	return rl == rs ? -1 : rl;
}

/* SPDX-License-Identifier: MIT */
/* The config values the core decides with: a copy of the shell's config (config.h), taken at start and reload. */
#pragma once

#include <stdint.h>

/* What enforcement does to a holder past its REVOKE deadline (revoke-enforce). */
enum config_enforce { ENFORCE_NONE, ENFORCE_DISCONNECT, ENFORCE_SIGTERM, ENFORCE_SIGKILL };
/* What an acquire gets while job quota rules exist and its client's job could not be read (job-unknown). */
enum config_job_unknown { JOB_UNKNOWN_REFUSE, JOB_UNKNOWN_ALLOW };

/* The keys of the same names; the shell's config_settings fills them. */
struct broker_settings {
	uint32_t max_connections;
	uint32_t max_leases_per_uid; /* 0: derived (broker_resolve_limits) */
	uint32_t max_chunks_per_uid; /* 0: derived */
	uint32_t max_reservations_per_uid;
	uint32_t reserve_fds;
	uint32_t revoke_deadline_ms;
	uint32_t revoke_min_deadline_ms;
	enum config_job_unknown job_unknown;
};

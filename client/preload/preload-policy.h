/* SPDX-License-Identifier: MIT */
/*
 * The interposer's fallback policy (PINBROKER_PRELOAD_FALLBACK): what it does when the broker cannot serve a
 * request. Its words are the interposer's face to pinctl, whose `run --fallback` checks them before it sets the
 * variable; nothing else here is pinctl's.
 */
#pragma once

enum pbp_policy {
	PBP_FALLBACK_CUDA,     /* the real driver call, its bytes reported as unbrokered (default) */
	PBP_FALLBACK_ERROR,    /* CUDA's out-of-memory error */
	PBP_FALLBACK_PAGEABLE, /* ordinary memory, where the request needs no device pointer */
};

/* NULL or "" is the default (cuda). Returns 0, or -EINVAL for anything else. */
int pbp_policy_parse(const char *s, enum pbp_policy *out);
const char *pbp_policy_name(enum pbp_policy p);

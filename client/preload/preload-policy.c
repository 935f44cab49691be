/* SPDX-License-Identifier: MIT */
/* The fallback policy's words, shared by the interposer and `pinctl run --fallback`. */
#include "preload-policy.h"

#include <errno.h>
#include <string.h>

static const char *const policy_names[] = {
	[PBP_FALLBACK_CUDA] = "cuda",
	[PBP_FALLBACK_ERROR] = "error",
	[PBP_FALLBACK_PAGEABLE] = "pageable",
};

int pbp_policy_parse(const char *s, enum pbp_policy *out)
{
	if (!s || !*s) {
		*out = PBP_FALLBACK_CUDA;
		return 0;
	}
	for (size_t i = 0; i < sizeof(policy_names) / sizeof(policy_names[0]); i++) {
		if (strcmp(s, policy_names[i]) == 0) {
			*out = (enum pbp_policy)i;
			return 0;
		}
	}
	return -EINVAL;
}

const char *pbp_policy_name(enum pbp_policy p)
{
	return policy_names[p];
}

/* SPDX-License-Identifier: MIT */
/* For a config suite walking the key table: a value of each key, other than the running one, that validates. */
#pragma once

#include <stdbool.h>
#include <stdlib.h>

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
		"1",    "2",   "50",    "100", "1000",
		"3000", "4M",  "8K",    "50%", "1M",
		"no",   "yes", "debug", "err", "/tmp/pinbroker-check", "/pinbroker-check/*:1M",
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

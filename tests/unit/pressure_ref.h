/* SPDX-License-Identifier: MIT */
/* The pressure suites' shared thresholds (check_pressure.c, check_pressure_policy.c). */
#pragma once

#include "pressure.h"

#define KIB 1024ull
#define MIB (1024ull * KIB)
#define GIB (1024ull * MIB)

/*
 * Fixed thresholds these tests were written against: the config table's
 * defaults (config.c, where the daemon takes its thresholds from), except a
 * hysteresis of 10 s where the table has 5 s.
 */
static inline void reference_thresholds(struct pressure_thresholds *ret)
{
	*ret = (struct pressure_thresholds){
		.tight_mem_available_pct = 10,
		.critical_mem_available_pct = 5,
		.tight_psi_some_avg10 = 10,
		.critical_psi_full_avg10 = 5,
		.tight_swapout_pages_s = 1000,
		.critical_swapout_pages_s = 10000,
		.tight_swap_free_pct = 20,
		.hysteresis_ms = 10000,
	};
}

/* SPDX-License-Identifier: MIT */
/* The shell that carries out the broker's decision on a new pressure state: trim, refuse, revoke, grant. */
#pragma once

#include "pressure.h"

/*
 * The pressure state is now to (a monitor_state_fn: ud is the struct broker).
 * broker_set_pressure records it and decides; this carries out its actions:
 * trims the idle pool, refuses or grants waiting acquires (waitq.c), starts or
 * stops reclaim (revoker.c). from and why are the monitor's, unused here.
 */
void react_pressure(void *ud, enum broker_state from, enum broker_state to, const char *why);

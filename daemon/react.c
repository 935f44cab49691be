/* SPDX-License-Identifier: MIT */
/* The shell that carries out the broker's decision on a new pressure state: trim, refuse, revoke, grant. */
#include "react.h"

#include <errno.h>

#include "broker.h"
#include "daemon.h"
#include "revoker.h"
#include "waitq.h"

void react_pressure(void *ud, enum broker_state from, enum broker_state to, const char *why)
{
	struct broker *b = ud;
	unsigned act;

	(void)from;
	(void)why;
	act = broker_set_pressure(b, to);
	if (act & BROKER_ACT_TRIM_POOL)
		daemon_trim_pool(b, 0);
	if (act & BROKER_ACT_REFUSE_WAITERS)
		waitq_refuse_all(b, REFUSAL_CRITICAL);
	/* The revoker starts its reclaim steps on critical and stops them on anything else. */
	if (act & (BROKER_ACT_START_RECLAIM | BROKER_ACT_STOP_RECLAIM))
		revoker_on_pressure(b, to);
	if (act & BROKER_ACT_GRANT_WAITERS)
		waitq_grant(b);
}

/* SPDX-License-Identifier: MIT */
/* One-shot libev timers that end by the clock, not by libev's cached loop time (timer-clock.h). */
#include "timer-clock.h"

#include <stdlib.h>
#include <unistd.h>

#include "util.h"

bool timer_clock_early(struct ev_loop *loop, ev_timer *w, uint64_t since_ms, uint64_t timeout_ms)
{
	uint64_t waited_ms = now_ms() - since_ms;

	if (waited_ms >= timeout_ms)
		return false;
	/* From this turn's cached time again: if this turn too ran long before us, we come back and check. */
	ev_timer_stop(loop, w);
	ev_timer_set(w, (double)(timeout_ms - waited_ms) / 1000.0, 0.);
	ev_timer_start(loop, w);
	return true;
}

unsigned timer_clock_stall_ms(const char *name)
{
	const char *v = getenv(name);

	return v ? (unsigned)strtoul(v, NULL, 10) : 0;
}

void timer_clock_stall(unsigned ms)
{
	if (ms)
		usleep((useconds_t)ms * 1000);
}

/* SPDX-License-Identifier: MIT */
/* One-shot libev timers that end by the clock, not by libev's cached loop time. */
#pragma once

#include <ev.h>
#include <stdbool.h>
#include <stdint.h>

/*
 * libev starts a timer from ev_now(), the time it cached when the loop turn began (or, before ev_run, when
 * it last read the clock): a timer started late in a long turn (a big chunk made, the CPU taken away on a
 * loaded host, the start-up's work) fires that much early, at once if the turn outlasted it.
 *
 * Call it first in the callback of a one-shot timer w that stands for timeout_ms counted from since_ms (a
 * now_ms() stamp): returns true, with w started again for the rest, while the clock says less than
 * timeout_ms has passed (the callback then returns, doing nothing); false when the time is up.
 */
bool timer_clock_early(struct ev_loop *loop, ev_timer *w, uint64_t since_ms, uint64_t timeout_ms);

/*
 * Test hooks (tests/integration): the stall, in ms, that the environment variable name asks for (0 when unset);
 * read once, at start (warmup.c reads its test delays with it too). timer_clock_stall sleeps that long on the loop's
 * thread, as a long loop turn would.
 */
unsigned timer_clock_stall_ms(const char *name);
void timer_clock_stall(unsigned ms);

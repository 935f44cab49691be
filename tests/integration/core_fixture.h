/* SPDX-License-Identifier: MIT */
/* The core suites' daemon (check_itest_core.c, check_itest_holders.c): one per test case, stopped cleanly. */
#pragma once

#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fdstore.h"
#include "itest.h"
#include "pinbroker.h"
#include "check_main.h"

#define MiB (1024ull * 1024ull)

static struct daemon d;

static inline void start_default(void)
{
	daemon_start(&d, NULL);
}

/* The daemon must exit 0 (ck_assert): a clean stop is part of every case. */
static inline void stop_daemon(void)
{
	ck_assert_int_eq(daemon_stop(&d), 0);
}

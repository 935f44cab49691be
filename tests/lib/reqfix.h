/* SPDX-License-Identifier: MIT */
/* A broker built in memory from the real daemon library, with two client connections over socketpairs, for the request modules' unit suite. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "broker.h"
#include "daemon.h"
#include "server.h"

#define RF_CONNS 2

/*
 * The broker's config: a 2 MiB budget of a pretend 64 MiB host, 1536 KiB per
 * uid, 16 KiB chunks, a 512 KiB warm pool (unlocked memfds), short timeouts.
 */
#define RF_BUDGET_BYTES (2048ull * 1024)
#define RF_QUOTA_BYTES (1536ull * 1024)

struct rf {
	struct daemon d;             /* its broker is the request modules' */
	struct conn *conn[RF_CONNS]; /* NULL once the daemon closed it */
	uint64_t conn_id[RF_CONNS];
	int peer[RF_CONNS]; /* our end of each socketpair, -1 once closed */
	uid_t uid[RF_CONNS];
	uint64_t seq;          /* for the requests a test builds */
	uint64_t packets_sent; /* by the request modules, through the fixture's conn_io */
	pid_t holder_pid;      /* a child whose pid the connections carry: enforcement never reaches the test */
	int baseline_fds;
};

/*
 * Build the broker (real clock, real pool, real server) and its request modules.
 * flags: bit i makes connection i uid 0 (an admin); else it is uid 1000 + i.
 * One per test: Check's fork mode gives each test its own process.
 */
struct rf *rf_begin(unsigned flags);
/* Connection i (made on first use, charged to the cgroup /fz/job_<i+1>/step_0 for job quotas). */
struct conn *rf_conn(struct rf *f, int i);
/* Is connection i open (not closed by the daemon)? */
bool rf_conn_alive(struct rf *f, int i);
/* Run the loop's ready callbacks once, without waiting. */
void rf_run_loop(struct rf *f);
/* The pressure state is now to, as the monitor would report it (react_pressure). */
void rf_set_state(struct rf *f, enum broker_state to);
/* Check the books: leases against the budget, the pool, the connections and the wait queue (Check asserts). */
void rf_check(struct rf *f);
/* Close everything, check the books are back at zero and no fd leaked, and free the broker. */
void rf_end(struct rf *f);

/* SPDX-License-Identifier: MIT */
/* Shared fuzz harness core: a broker built in memory with real modules, connections over socketpairs, and accounting checks. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "broker.h"
#include "server.h"

#define FZ_CONNS 2

struct fz {
	struct broker b;
	struct conn *conn[FZ_CONNS];    /* NULL once the daemon closed it */
	uint64_t conn_id[FZ_CONNS];
	int peer[FZ_CONNS];             /* our end of each socketpair, -1 once closed */
	uid_t uid[FZ_CONNS];
	char token[40];                 /* the last share token a SHARE reply carried ("" until one did) */
};

/* Abort with a message: libFuzzer records the input as a crash. */
#define FZ_ASSERT(cond, ...)                                                                              \
	do {                                                                                              \
		if (!(cond))                                                                              \
			fz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                                  \
	} while (0)
void fz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
	__attribute__((format(printf, 4, 5), noreturn));

/* One-time process set-up (signals, the victim process whose pid connections carry). */
void fz_global_init(void);

/*
 * Build a fresh broker: budget 8 MiB of a pretend 64 MiB host, 64 KiB chunks,
 * unlocked memfds, short timeouts, plus the given "key=value" overrides
 * (NULL-terminated, may be NULL). flags bit i set makes connection i uid 0.
 */
void fz_setup(struct fz *f, unsigned flags, const char *const *overrides);
/* Tear everything down and check that nothing leaked: bytes, leases, fds. */
void fz_teardown(struct fz *f);

/* Connection i, (re)created if the daemon closed it or its peer went away. */
struct conn *fz_conn(struct fz *f, int i);
/* True if connection i is still open on the daemon's side. */
bool fz_conn_alive(struct fz *f, int i);
/* Close our end of connection i: the daemon's next send fails with EPIPE. */
void fz_close_peer(struct fz *f, int i);

/* Run the loop once without blocking (flush queues, fire due timers, read input). */
void fz_run_loop(struct fz *f);
/* Read and check every reply waiting at each peer, closing any fds that came. */
void fz_drain(struct fz *f);
/* Put the broker in a pressure state, as the monitor would. */
void fz_set_state(struct fz *f, enum broker_state to);

/* Check the accounting invariants; aborts on a mismatch. */
void fz_check(struct fz *f);

/* Open fds of this process. */
int fz_count_fds(void);
/* List open fds on stderr (for a leak report). */
void fz_dump_fds(void);

/*
 * The operations both harnesses share, ops 4-7 of an input byte: drain the
 * peers, flip the pressure state, run the loop (sometimes after a sleep so
 * timers fire), hang up peer i, or with op 7 and bit 4 set, send ATTACH with
 * the last share token a drain saw on connection i (a fuzzer cannot guess a
 * token; this is how it reaches live attachments). Returns false for any
 * other op.
 */
bool fz_common_op(struct fz *f, uint8_t op, int i);

/* End of an input: run the loop, drain, tear down, and assert no fd leaked since baseline_fds. */
void fz_finish(struct fz *f, int baseline_fds);

/* SPDX-License-Identifier: MIT */
/* systemd integration through libsystemd: readiness, status, watchdog from the loop, socket activation, fd store. */
#pragma once

#include <stdbool.h>

struct ev_loop;

/* Start the watchdog timer if the service manager asked for one (WatchdogSec=). Returns 0 or -errno. */
int notify_init(struct ev_loop *loop);
void notify_fini(struct ev_loop *loop);

/* True when started by systemd with a notify socket. */
bool notify_enabled(void);

void notify_ready(void);
void notify_stopping(void);
/* RELOADING=1 with MONOTONIC_USEC, as systemd's reload protocol asks. */
void notify_reloading(void);
void notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * The socket passed by socket activation: the fd named "pinbroker", or the
 * only SOCK_SEQPACKET one. Returns the fd, -ENOENT when not socket-activated,
 * or another negative errno.
 */
int notify_listen_fd(void);

/* Fds we stored earlier in systemd's fd store, by name prefix. Each call gives the whole set; caller owns fds. */
struct notify_stored {
	int fd;
	char name[64];
};
int notify_stored_fds(struct notify_stored **ret, int *n);

/* Store fd under name (FDSTORE=1, FDNAME=); returns 0, -EOPNOTSUPP without systemd, or -errno. */
int notify_fdstore(int fd, const char *name);
/* Remove stored fds with this name (FDSTOREREMOVE=1). */
int notify_fdstore_remove(const char *name);

/* SPDX-License-Identifier: MIT */
/* A stand-in for systemd's side of sd_notify and the fd store, so recovery can be tested without a booted systemd. */
#pragma once

#include <stddef.h>

#include "itest.h"

/*
 * What it does, as systemd 252 does for a Type=notify service with
 * NotifyAccess=main, FileDescriptorStoreMax= and a .socket unit
 * (FileDescriptorName=pinbroker):
 * - a NOTIFY_SOCKET datagram socket (SO_PASSCRED) read by a thread; messages
 *   from any process but the daemon are dropped;
 * - FDSTORE=1 keeps the fds sent with it under FDNAME= (default "stored"),
 *   ignoring one already stored (same inode), up to FDSTORE_MAX;
 *   FDSTOREREMOVE=1 closes every fd stored under FDNAME=; fds sent with any
 *   other message are closed;
 * - READY=1 is noted;
 * - the listening socket at d->socket is created and held here, as the
 *   socket unit holds it, so clients queue in its backlog while the daemon
 *   is down;
 * - at each start the daemon gets LISTEN_FDS / LISTEN_FDNAMES / LISTEN_PID with
 *   the listening socket ("pinbroker") first, then every stored fd in the
 *   order stored, from fd 3, as sd_listen_fds_with_names(3) expects.
 * Messages already queued when the daemon dies are applied before the next
 * start, as systemd dispatches its notify socket before the SIGCHLD.
 */
#define FDSTORE_MAX 16384

struct fdstore;

/* For d after daemon_prepare(): makes the sockets in d->dir and starts the reader thread. */
struct fdstore *fdstore_new(struct daemon *d);
/* Stops the thread and closes everything it holds. NULL is fine. */
void fdstore_free(struct fdstore *fs);

/* Start (or restart) pinbrokerd under the store with extra arguments; returns once it answers HELLO. */
void fdstore_daemon_start(struct fdstore *fs, const char *const *extra_args);
/* kill -9 the daemon, reap it, and apply whatever it had queued on the notify socket. */
void fdstore_daemon_kill(struct fdstore *fs);
/* A crash and restart under the store, then c's next calls until one is answered: the library reconnects and
 * re-declares c's leases on the way. Fails the test when none is answered in 2 s. */
void fdstore_daemon_crash_restart(struct fdstore *fs, const char *const *extra_args, pb_client *c);
/* Fds stored now, and how many of them have names that start with prefix (NULL: all). */
size_t fdstore_count(struct fdstore *fs, const char *prefix);
/* A dup of the first fd stored under name, or -1. The caller closes it. */
int fdstore_get(struct fdstore *fs, const char *name);
/* Replace whatever is stored under name by a dup of fd (a crafted state or chunk). Returns 0 or -errno. */
int fdstore_replace(struct fdstore *fs, const char *name, int fd);
/* Drop whatever is stored under name, as FDSTOREREMOVE=1 would. */
void fdstore_remove(struct fdstore *fs, const char *name);
/* Has the daemon said READY=1 since its last start? */
int fdstore_ready(struct fdstore *fs);

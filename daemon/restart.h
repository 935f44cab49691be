/* SPDX-License-Identifier: MIT */
/* Restarts that keep the books: the state file a clean stop leaves, and the memory live processes still map after it. */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct broker;
struct config;

/*
 * The chunk memfd name for this daemon: "pinbroker-chunk." and a hash of the
 * configured socket path, so that a restarted daemon finds its predecessor's
 * chunks in /proc and never another instance's (tests run many at once).
 */
void restart_memfd_name(const struct config *cfg, char *buf, size_t len);

/*
 * After recovery_init (the fd store's chunks are the pool's by then) and
 * before prewarming. Reads the state file the last clean stop left (ignored
 * with a warning when it is not a regular file of this uid, is writable by
 * others, names another boot or does not parse), then scans /proc once for
 * processes that map or hold the memfds it names, or any memfd called
 * restart_memfd_name() that is not the pool's (after a crash without the fd
 * store). What is still held is charged to the budget and its uid as
 * orphaned (b->orphaned_bytes) and re-checked every orphan-rescan-ms until
 * nothing holds it. A process whose /proc this daemon may not read (another
 * uid, without CAP_SYS_PTRACE) holds what it held at the stop until it exits.
 */
void restart_init(struct broker *b);

/*
 * At a clean stop, while the leases still exist (before the server closes
 * connections): write the state file naming every lease's memfds, bytes, uid
 * and the processes that map it, and the orphans still held. Removes the file
 * when there is nothing to name.
 */
void restart_save(struct broker *b);

/* Stop the re-scan timer, close pidfds and free; the charges go with the budget. */
void restart_fini(struct broker *b);

/* The state file's path: restart-state, else $RUNTIME_DIRECTORY/restart-state, else the socket path + ".state". */
int restart_state_path(const struct config *cfg, char *buf, size_t len);

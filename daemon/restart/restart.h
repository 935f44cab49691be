/* SPDX-License-Identifier: MIT */
/*
 * Restarts that keep the books: the state file a clean stop leaves, and the memory live processes still map after it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct broker;
struct config;
struct lease;

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

/*
 * Record lease l in the state file before its fds leave (recovery_lent calls
 * it): one short append, so a crash without the fd store (kill -9, no systemd)
 * leaves the file naming every lease lent, with its memfds and processes.
 */
void restart_journal_lent(struct broker *b, const struct lease *l);

/* How the state read at start stood: "none", "complete", "partial" or "unknown" (status's restart_books). */
const char *restart_books_name(const struct broker *b);
/* A sentence for status and doctor when the daemon cannot see all its predecessor lent; NULL when it can. */
const char *restart_warning(const struct broker *b);
/* What the orphan scans cost so far: passes ended, slices run, memfd stats made. */
void restart_scan_counts(const struct broker *b, uint64_t *scans, uint64_t *slices, uint64_t *stats);
/*
 * Stop counting orphaned memory (an admin's `pinctl revoke --orphans`): all of it, or uid's. The
 * processes keep what they map. *count and *bytes say what went. Returns 0.
 */
int restart_drop_orphans(struct broker *b, bool all, uid_t uid, size_t *count, uint64_t *bytes);

/* The state file's path: restart-state, else $RUNTIME_DIRECTORY/restart-state, else the socket path + ".state". */
int restart_state_path(const struct config *cfg, char *buf, size_t len);

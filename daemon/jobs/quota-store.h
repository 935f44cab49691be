/* SPDX-License-Identifier: MIT */
/* The quota rules file: the rules `pinctl quota set` made, kept over restarts, crashes and upgrades (quota-rules.h). */
#pragma once

#include <stddef.h>

struct broker;
struct config;

/*
 * The file's path: $RUNTIME_DIRECTORY/quota-rules under systemd (RuntimeDirectory=, kept across stops; gone at a
 * reboot, as the jobs the rules are for), else the socket path with ".quota-rules" appended. Returns 0 or
 * -ENAMETOOLONG.
 */
int quota_store_path(const struct config *cfg, char *buf, size_t len);

/*
 * After jobs_watch_start and before the loop serves a request: make the daemon's quota_store and add the file's rules
 * to
 * b->jobs as set rules (a bad line is logged as path:line and skipped; a file that is not a regular file of
 * this uid, or that others may write, is ignored with a warning). Nothing to do without b->jobs. Returns 0 or
 * -ENOMEM.
 */
int quota_store_start(struct broker *b);

/*
 * Write the set rules of b->jobs to the file if they differ from what it holds: a new file of mode 0600,
 * fsynced, renamed over the old one (removed when there are none). A failure is logged at warning (once per
 * cause) and said in why (unless NULL), for the admin's reply. Returns 0, or a negative errno.
 */
int quota_store_save(struct broker *b, char *why, size_t whylen);

/*
 * From a sweep: quota_store_save without a reason, except that after a failed write it waits a sweep interval
 * before it tries again (an admin's change, through quota_store_save, tries at once).
 */
void quota_store_sweep(struct broker *b);

/* Free the daemon's quota_store (the file stays for the next daemon). */
void quota_store_stop(struct broker *b);

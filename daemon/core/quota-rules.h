/* SPDX-License-Identifier: MIT */
/*
 * The quota rules file's text: the rules `pinctl quota set` made (jobs.h's JOB_RULE_SET), written on each
 * change so that a restart, a crash or an upgrade keeps them. Pure: no I/O (quota-store.c reads and writes it).
 *
 *   pinbroker-quota-rules 1
 *   boot 0f6d7c1e-...
 *   # PATTERN BYTES [seen]
 *   /system.slice/slurmstepd.scope/job_42 8589934592 seen
 *   /kubepods.slice/pod_* 1073741824
 *
 * One rule a line, in the order they were set; "seen": the literal rule's cgroup was seen to exist, so the
 * sweep releases it once the cgroup is gone. "boot": the kernel's boot id when it was written; a file of another
 * boot is not loaded, since its jobs ended with that boot. Config rules (job-quota) are not written: the config
 * holds them.
 */
#pragma once

#include <stddef.h>

#include "jobs.h"

/* The first line's word and the one format this daemon reads and writes. */
#define QUOTA_RULES_MAGIC "pinbroker-quota-rules"
#define QUOTA_RULES_FORMAT 1
/* No file this daemon writes is larger: JOBS_RULES_MAX lines of a path, a number and a word, and the header. */
#define QUOTA_RULES_MAX_BYTES ((size_t)JOBS_RULES_MAX * (JOBS_PATH_MAX + 32) + 256)
/* A boot id longer than this is not written (the kernel's is a 36-character uuid). */
#define QUOTA_RULES_BOOT_ID_MAX 64

/*
 * The SET rules of j as the file's text, NUL-terminated, into *ret (malloc'd) and its length into *len;
 * "" (length 0) when there are none. boot_id (NULL or "": unknown, no boot line) names the boot. Returns 0 or
 * -ENOMEM.
 */
int quota_rules_format(const struct jobs *j, const char *boot_id, char **ret, size_t *len);

/* A problem on line (1-based) of the text: what is wrong, as a phrase ("not a size: 'x'"). */
typedef void (*quota_rules_warn_fn)(void *ctx, unsigned line, const char *what);

/*
 * Add the rules of text (len bytes; NULs and any byte may be in it) to j as SET rules, each marked seen as
 * the file says. A bad line is skipped with a warning through warn; a missing header is warned about and the
 * lines are read anyway. A file whose boot line names another boot than boot_id (NULL or "": unknown, not
 * checked) adds nothing. Returns how many rules were added, -EPROTONOSUPPORT (the header names another format:
 * nothing added, warned), -ESTALE (another boot: nothing added, warned) or -ENOMEM (those added before it stay).
 */
int quota_rules_load(struct jobs *j, const char *text, size_t len, const char *boot_id, quota_rules_warn_fn warn,
		     void *ctx);

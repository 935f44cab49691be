/* SPDX-License-Identifier: MIT */
/* Swapping in a new config at run time (SIGHUP, pinctl set): one path, gated by the key table's reloadable flag. */
#pragma once

struct broker;
struct config;

/*
 * What the I/O shell does around a reload (main.c; the fuzz harness has its
 * own). Every hook may be NULL.
 */
struct reload_hooks {
	/* Re-derive the broker's fd and mapping limits once the sizes are resolved (main.c: RLIMIT_NOFILE). */
	void (*resolve_limits)(struct broker *b);
	/* Re-tune what samples pressure. Returns 0, or a negative errno that rolls the reload back. */
	int (*reconfigure)(struct broker *b, const struct config *cfg);
	/* The new config is in and the pool trimmed: grow toward prewarm, grant waiting acquires, report. */
	void (*applied)(struct broker *b);
};

/*
 * Budget, uid quota, prewarm and the never-revoked cap from c, against
 * b->mem_total_bytes: prewarm and the uid quota at most the budget, the budget
 * at most b->budget_cap_bytes when that is set; and the rest of b->settings (core/settings.h).
 */
void reload_resolve_sizes(struct broker *b, const struct config *c);

/*
 * Keep in n the running value of every key the table marks not reloadable
 * (config_keep_fixed), warning for each that changed: it takes effect at the
 * next restart. Returns 0 or -ENOMEM.
 */
int reload_keep_fixed(struct config *n, const struct config *running);

/*
 * The config `pinctl set key value` asks for: a copy of running with key set,
 * validated, and marked as set at run time so a reload keeps it. Only keys the
 * table marks reloadable may be set. Returns 0 and *ret (the caller's), or
 * -ENOENT (unknown key), -EPERM (the key needs a restart), -ENOMEM, or
 * config_set's and config_validate's errors; *err (malloc'd) then says why.
 */
int reload_prepare_set(const struct config *running, const char *key, const char *value, struct config **ret,
		       char **err);

/*
 * Swap in a validated config n (SIGHUP, `pinctl set`): keep the keys that need
 * a restart (reload_keep_fixed), recompute budget, quota and prewarm, apply
 * the log level, run the daemon's reload_hooks, and trim the pool to the new prewarm.
 * Takes ownership of n on success and frees the old config. On failure the
 * running config stays and n is the caller's. Returns 0 or a negative errno
 * with *err (malloc'd, may stay NULL) set.
 */
int reload_apply(struct broker *b, struct config *n, char **err);
/* Log a warning for each job-quota rule larger than the whole budget (it can never bind). */
void reload_warn_job_quotas(const struct broker *b);

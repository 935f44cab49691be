/* SPDX-License-Identifier: MIT */
/*
 * Per-job quotas. Leases are charged to their client's cgroup, and quota rules over cgroup paths sum
 * them into jobs: a Slurm job's cgroup, a Kubernetes pod's. Pure: no I/O (jobs-watch.c reads
 * /proc/PID/cgroup and looks for vanished cgroups).
 *
 * A rule is a cgroup path pattern and a size. Each '/'-separated component may be an fnmatch(3)
 * glob. A cgroup matches a rule of N components when its first N components match; the job it
 * belongs to is then those N components: "/kubepods.slice" followed by a "*" component gives every
 * pod its own quota, "/system.slice/slurmstepd.scope/job_42" sums a job with its steps. Where rules overlap, the one of
 * most components wins, then a rule set at run time over one from the config, then a literal path
 * over a glob of its depth. A cgroup no rule
 * matches is a job of its own, without a quota.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "refusal.h"

/* Room for a cgroup path, as /proc/PID/cgroup names one. */
#define JOBS_PATH_MAX 512
/* Rules at most: each costs a match per connecting client. */
#define JOBS_RULES_MAX 1024

enum job_rule_source {
	JOB_RULE_CONFIG, /* the job-quota config key */
	JOB_RULE_SET,    /* pinctl quota set: kept over reloads until cleared or its cgroup goes */
};

struct job_rule {
	char *pattern;
	uint64_t bytes;
	enum job_rule_source source;
	unsigned ncomp; /* path components: "/" has 0 */
	bool literal;   /* no glob characters */
	bool seen;      /* a literal SET rule's cgroup was seen to exist (it is released once gone) */
};

/* A job: what one rule (or, without one, one cgroup) sums leases over. */
struct job {
	char *key;                   /* the cgroup path, or its first rule->ncomp components */
	const struct job_rule *rule; /* NULL: no rule, no quota */
	uint64_t bytes;              /* charged to it now */
	uint32_t leases;
	uint32_t ncgroups; /* client cgroups summed into it */
	struct job *next;
};

/* A client cgroup, interned: each connection and each lease charged to it holds a reference. */
struct job_cgroup {
	char *path;
	struct job *job;
	uint64_t bytes;
	uint32_t leases;
	uint32_t refs;
	struct job_cgroup *next;
};

struct jobs;

int jobs_new(struct jobs **ret);
/* Frees everything; references still held become dangling, so drop the connections first. */
void jobs_free(struct jobs *j);

/*
 * Check a cgroup path or pattern: absolute, no empty, "." or ".." components, no trailing '/',
 * printable, shorter than JOBS_PATH_MAX. Returns 0, or -EINVAL with *why a static reason.
 */
int jobs_path_check(const char *path, bool pattern, const char **why);

/* True if cgroup path (its first n components, n those of pattern) matches pattern. */
bool jobs_pattern_matches(const char *pattern, const char *path);

/*
 * The cgroup to charge, from a /proc/PID/cgroup text: the v1 memory controller's path where
 * there is one (v1 and hybrid hosts: Slurm's and the kubelet's cgroups live there), else the
 * unified hierarchy's ("0::"). Writes it to out. Returns 0, -ENOENT if neither line is there,
 * or -EINVAL if the path fails jobs_path_check or does not fit; *v1 says which it was.
 */
int jobs_parse_proc_cgroup(const char *text, char *out, size_t outlen, bool *v1);
/*
 * The same line's path as the kernel wrote it, unchecked: in a cgroup namespace of the reader's own it may
 * climb ("/../../kubepods.slice/..."), which cgns_resolve (cgns.h) turns into the host's path. Returns 0,
 * -ENOENT (no memory or unified line) or -EINVAL (it does not fit outlen).
 */
int jobs_proc_cgroup_raw(const char *text, char *out, size_t outlen, bool *v1);

/* Intern path (checked by the caller): a new reference, made or found. Returns 0 or -ENOMEM. */
int jobs_cgroup_get(struct jobs *j, const char *path, struct job_cgroup **ret);
/* Drop a reference (NULL: nothing); the last one frees it and, with its last cgroup, a job without a rule. */
void jobs_cgroup_put(struct jobs *j, struct job_cgroup *cg);

/*
 * Would bytes more fit cg's job's quota? REFUSAL_NONE, or REFUSAL_JOB_QUOTA (the job's quota is full). NULL cg:
 * REFUSAL_NONE. Decided from jobs_left. The job's quota bounds only new charges: lowering it revokes nothing.
 */
enum broker_refusal jobs_check(const struct job_cgroup *cg, uint64_t bytes);
/*
 * What cg's job's quota has left now (0 when over), with *limit (the rule's bytes) and *used (the job's
 * charges). Returns false when no quota binds (NULL cg, or no rule covers its job).
 */
bool jobs_left(const struct job_cgroup *cg, uint64_t *limit, uint64_t *used, uint64_t *left);
/* Charge or uncharge a lease of bytes (a reference is taken or dropped with it). NULL cg: nothing. */
void jobs_charge(struct jobs *j, struct job_cgroup *cg, uint64_t bytes);
void jobs_uncharge(struct jobs *j, struct job_cgroup *cg, uint64_t bytes);
/*
 * Move bytes of a charge from one lease's cgroup to another's (a shared registration's pages passing to the
 * next registrant, backing.h): bytes only; each lease keeps its reference and its count. NULL: that side
 * has no job.
 */
void jobs_move(struct jobs *j, struct job_cgroup *from, struct job_cgroup *to, uint64_t bytes);

/*
 * Set (add or replace) the rule of this pattern and source; the jobs are regrouped. Returns 0,
 * -EINVAL (bad pattern: *why), -ENOSPC (JOBS_RULES_MAX rules) or -ENOMEM.
 */
int jobs_rule_set(struct jobs *j, const char *pattern, uint64_t bytes, enum job_rule_source src, const char **why);
/* Remove the rule of this pattern (a SET one first, else a CONFIG one). Returns 0 or -ENOENT. */
int jobs_rule_clear(struct jobs *j, const char *pattern, enum job_rule_source *src);

/*
 * Parse the job-quota config value: entries "PATTERN:SIZE" apart by blanks, SIZE as
 * config sizes are written (8G) or a share of budget ("10%"). Calls fn for each entry; with
 * fn NULL it only checks. More than JOBS_RULES_MAX entries is an error. Returns 0, or -EINVAL
 * with *err a malloc'd message naming the entry.
 */
int jobs_parse_config(const char *spec, uint64_t budget, int (*fn)(void *ctx, const char *pattern, uint64_t bytes),
		      void *ctx, char **err);
/*
 * Replace every CONFIG rule with spec's (checked first: on an error nothing changes). Returns 0,
 * -EINVAL (spec does not parse), -ENOSPC (spec's entries and the SET rules are more than
 * JOBS_RULES_MAX) or -ENOMEM, with *err a malloc'd message.
 */
int jobs_set_config(struct jobs *j, const char *spec, uint64_t budget, char **err);

/*
 * Release literal SET rules whose cgroup went away: exists(path) is asked for each; a rule
 * whose cgroup exists is marked seen, and a seen one whose cgroup is gone is removed (a rule
 * set before its job started stays until then). gone(pattern) hears each removal first.
 * Returns how many were removed.
 */
size_t jobs_sweep(struct jobs *j, bool (*exists)(void *ctx, const char *path),
		  void (*gone)(void *ctx, const struct job_rule *rule), void *ctx);

/*
 * Add (or replace) the SET rule of pattern, as a rules file kept over a restart holds it (quota-rules.h): seen
 * (a literal rule's cgroup was seen, so the sweep releases it if the cgroup went while no daemon ran) as given,
 * and without regrouping, so that loading many costs one regroup: call jobs_regroup after the last. Returns as
 * jobs_rule_set.
 */
int jobs_rule_restore(struct jobs *j, const char *pattern, uint64_t bytes, bool seen, const char **why);
/* Group every cgroup into jobs again, after jobs_rule_restore. */
void jobs_regroup(struct jobs *j);

/* The rules, in the order set (config rules first after a reload). */
size_t jobs_rule_count(const struct jobs *j);
const struct job_rule *jobs_rule_at(const struct jobs *j, size_t i);
/* The jobs: those with charges, and one per literal rule. */
const struct job *jobs_first(const struct jobs *j);
size_t jobs_count(const struct jobs *j);
/* The job key would be for cgroup path (for showing; NULL rule: none matches). */
const struct job_rule *jobs_best_rule(const struct jobs *j, const char *path);

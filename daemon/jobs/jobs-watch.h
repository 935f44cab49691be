/* SPDX-License-Identifier: MIT */
/* The I/O of job quotas (jobs.h): a client's cgroup from /proc/PID/cgroup, and the sweep for cgroups that went away. */
#pragma once

#include <sys/types.h>

struct broker;
struct cgns_probe;
struct job_cgroup;

/* How often quota rules set for a cgroup are checked for the cgroup having gone. */
#define JOBS_SWEEP_MS 5000

/*
 * Make b->jobs (with the config's job-quota rules) and the daemon's jobs_watch, and start the sweep.
 * Returns 0, -EINVAL (job-quota does not parse: logged) or -ENOMEM.
 */
int jobs_watch_start(struct broker *b);
/* Stop the sweep and free the daemon's jobs_watch and b->jobs (every connection and lease must be gone). */
void jobs_watch_stop(struct broker *b);

/*
 * The cgroup pid runs in, read from <proc-root>/proc/PID/cgroup and named as the host names it (cgns.h: the
 * daemon's cgroup namespace, learned at start, may not be the host's): a new reference (put it with
 * jobs_cgroup_put), or NULL when there are no job quotas or it cannot be read (the client is then
 * charged to no job: logged at debug).
 */
struct job_cgroup *jobs_watch_cgroup_of(struct broker *b, pid_t pid);

/*
 * An acquire of a client whose job is unknown (conn.h job_unknown): while quota rules exist, counted in
 * counters.job_unknown and logged at warning, at most once a minute (JOBS_UNKNOWN_WARN_MS), saying what
 * job-unknown does with it and how to fix it. Without rules nothing happens.
 */
void jobs_watch_unknown_acquire(struct broker *b, pid_t pid, uid_t uid);

/* Run the sweep now (the QUOTA request does, before it lists). */
void jobs_watch_sweep(struct broker *b);

/* The daemon's cgroup namespace as learned at start (cgns-probe.h), or NULL before jobs_watch_start. */
const struct cgns_probe *jobs_watch_cgns(const struct broker *b);

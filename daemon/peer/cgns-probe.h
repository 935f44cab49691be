/* SPDX-License-Identifier: MIT */
/* The I/O of cgns.h: which cgroup namespace the daemon is in and where its root sits in the host's tree. */
#pragma once

#include <limits.h>
#include <stdbool.h>

#include "cgns.h"

/* Directories the search of a host tree mount looks at, at most: a node's kubepods tree is a few thousand. */
#define CGNS_PROBE_DIRS_MAX 100000

struct cgns_probe {
	struct cgns ns;
	char host_mount[PATH_MAX]; /* a mount of the host's tree (proc-root relative), "" when none was found */
	char host_mount_root[JOBS_PATH_MAX]; /* its root's host path: "/", or the prefix a partial mount lacks */
	char via[PATH_MAX + 64];             /* how the root was learned, or why it was not (for the log and status) */
};

/*
 * Learn ret once, at start: pid 1's <proc_root>/proc/1/cgroup says whether the daemon's namespace is the
 * host's. If not, its root's host path comes from a setns into pid 1's namespace and back (only where
 * proc_root is the real "/", with CAP_SYS_ADMIN and access to /proc/1/ns/cgroup), else from a host tree mount
 * in mountinfo in which the daemon finds itself (cgroup.procs). Logs what it found; without a root, a warning.
 * Never fails: a host namespace is assumed where pid 1's cgroup cannot be read.
 */
void cgns_probe(const char *proc_root, struct cgns_probe *ret);

/*
 * Whether the cgroup of this host path still exists: under the host tree mount where it lies below that mount's
 * root (host_mount_root taken off its front), else under the daemon's own mounts (mounts: paths relative to proc_root,
 * n of them) when it lies in its namespace.
 */
bool cgns_probe_exists(const struct cgns_probe *p, const char *proc_root, const char *const *mounts, size_t n,
		       const char *path);

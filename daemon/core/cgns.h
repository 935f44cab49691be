/* SPDX-License-Identifier: MIT */
/*
 * Clients' cgroups named as the host names them, whatever cgroup namespace the daemon runs in. Pure: no I/O
 * (jobs-watch.c reads /proc and mountinfo, looks for its own cgroup in the host's tree, and calls setns).
 *
 * The kernel writes /proc/PID/cgroup and mountinfo's root field relative to the reader's cgroup namespace root
 * (proc_cgroup_show, cgroup_show_path). A daemon in a namespace of its own (containerd and CRI-O on cgroup v2,
 * Docker's default --cgroupns=private there, systemd's ProtectControlGroups=private) reads a client of another
 * pod as "/../../kubepods-besteffort.slice/...": ".." up from its root to the common ancestor, then names down.
 * The names of its root's ancestors never appear in what it reads, so the root's host path must be learned once
 * (cgns_root_from_self after a setns into pid 1's namespace, or a host tree mounted in: cgns_find_host_mount),
 * and every client path is joined to it (cgns_resolve). "The host" is pid 1's namespace (with hostPID, the
 * node's), which is what quota rules and pod cgroups found under the host's /sys/fs/cgroup name.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "jobs.h"

enum cgns_mode {
	CGNS_HOST,       /* the daemon reads cgroups as pid 1 does: every path is already the host's */
	CGNS_PRIVATE,    /* a namespace of its own whose root's host path is known: paths are resolved */
	CGNS_UNRESOLVED, /* a namespace of its own, root unknown: a path climbing out of it has no host name */
};

struct cgns {
	enum cgns_mode mode;
	char root[JOBS_PATH_MAX]; /* CGNS_PRIVATE: the namespace root's host path ("/" otherwise) */
};

/* "host", "private" or "unresolved" (the status key cgroup_namespace). */
const char *cgns_mode_name(enum cgns_mode mode);

/*
 * Split a path as the kernel writes one: how many ".." it starts with ("/../../x": 2) and where the rest
 * starts ("x", or "" when nothing follows). Returns 0, or -EINVAL when it is not absolute or a ".." follows
 * a name (the kernel never writes that).
 */
int cgns_ups(const char *path, unsigned *ups, const char **rest);

/*
 * From pid 1's /proc/1/cgroup text as the daemon reads it: CGNS_UNRESOLVED when its path climbs (pid 1 is
 * outside the daemon's namespace, which is therefore not the host's), else CGNS_HOST. Returns 0, or
 * -ENOENT (no memory or unified line) or -EINVAL (an odd path).
 */
int cgns_detect(const char *pid1_cgroup, enum cgns_mode *ret);

/*
 * How many levels the host's root is above the daemon's namespace root, from the same /proc/1/cgroup text:
 * the ".." pid 1's path starts with. With hostPID pid 1 is the host's init, in "/" or "/init.scope", so the
 * kernel climbs from our root all the way to the host's root to name it. Returns 0 or what cgns_detect does.
 */
int cgns_host_depth(const char *pid1_cgroup, unsigned *depth);

/* How many components an absolute path has ("/": 0): a namespace root's depth below the host's root. */
unsigned cgns_depth(const char *path);

/*
 * The namespace root's host path from the daemon's own cgroup read in the host's namespace (host_self,
 * "/kubepods.slice/.../cri-containerd-1.scope") and in its own (ns_self, "/" or a path below its root): the
 * root is host_self without ns_self's components at its end. Returns 0, or -EINVAL when ns_self is not
 * host_self's end, either climbs, or the root does not fit len.
 */
int cgns_root_from_self(const char *host_self, const char *ns_self, char *root, size_t len);

/*
 * In a /proc/self/mountinfo text, a mount of the host's tree of the hierarchy clients are charged in
 * (v1_memory: a v1 "cgroup" mount with memory among its options; else "cgroup2"): one whose root only climbs
 * ("/../.."), so it is an ancestor of the daemon's namespace root, the highest where there are several.
 * A root that climbs fewer than depth levels (cgns_host_depth) is an ancestor below the host's root (a hostPath
 * of /sys/fs/cgroup/kubepods.slice, not of /sys/fs/cgroup): the names between it and the host's root are
 * nowhere to be read, so it is no host tree. Writes its mount point (mountinfo's escapes undone) and how far
 * its root is above the namespace root. Returns 0, -ENOENT when there is none, -ERANGE when the only climbing
 * ones stop short of depth (the highest of them written, for the log and for cgns_mount_root), or
 * -ENAMETOOLONG when the mount point does not fit len.
 */
int cgns_find_host_mount(const char *mountinfo, bool v1_memory, unsigned depth, char *mnt, size_t len, unsigned *ups);

/*
 * The host's path of the root of a mount ups levels above a CGNS_PRIVATE namespace's root (ns->root less its
 * last ups components): "/" for a whole host tree, the prefix a partial one lacks otherwise. Returns 0, or
 * -ERANGE when ups climbs above the host's root, -EINVAL when ns is not CGNS_PRIVATE or out is too short.
 */
int cgns_mount_root(const struct cgns *ns, unsigned ups, char *out, size_t len);

/* Whether a cgroup.procs text lists pid. */
bool cgns_procs_has(const char *procs, long pid);

/*
 * The host's path of a path read in the daemon's namespace (raw: jobs_proc_cgroup_raw), written to out and
 * checked (jobs_path_check). CGNS_HOST and CGNS_UNRESOLVED pass a path that does not climb as it is (under
 * CGNS_UNRESOLVED that is the namespace's name for it, the best there is). Returns 0, -ENXIO when it climbs
 * and the root is unknown, -ERANGE when it climbs above the host's root, or -EINVAL (odd, or too long).
 */
int cgns_resolve(const struct cgns *ns, const char *raw, char *out, size_t len);

/*
 * The reverse, for looking a host path up under the daemon's own cgroup mounts: the path below the namespace
 * root ("/" for the root itself). Returns 0, or -ENXIO when host is not at or under the root.
 */
int cgns_to_ns(const struct cgns *ns, const char *host, char *out, size_t len);

/*
 * The cgroup to charge a client to, from its /proc/PID/cgroup text: jobs_proc_cgroup_raw, then cgns_resolve.
 * Returns 0 or what those return.
 */
int cgns_client_cgroup(const struct cgns *ns, const char *text, char *out, size_t len, bool *v1);

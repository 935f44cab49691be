/* SPDX-License-Identifier: MIT */
/* A client's tenant (core/tenant.h) at connect: its pid namespace, found without trusting the peer, and its cgroup. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct tenants;
struct job_cgroup;

/*
 * The pid namespace of the process pidfd (-1: none) or pid names, as a text into buf: "id:N" (NS_GET_ID, Linux
 * 6.18: never given to another namespace), "self" (the daemon's own), or "ino:N" (its nsfs inode, which a later
 * namespace may get once this one is gone; *kept false). Found by:
 *   1. ioctl(PIDFD_GET_PID_NAMESPACE) on the pidfd (Linux 6.11+; ptrace read access to the peer, as root has, or
 *      CAP_SYS_PTRACE);
 *   2. <proc_root>/proc/PID/ns/pid (the same access), trusted only while the pidfd says the process lives;
 *   3. /proc/PID/status's NSpid with one pid, while the daemon's own has one too: the peer is in the pid namespace
 *      of that /proc, the daemon's. Needs no access beyond a visible /proc/PID (ProtectProc=default), and tells no
 *      nested namespace from another.
 * Never a guess: false when it cannot be told, and the peer is then a tenant of its own.
 */
bool peer_pidns(int pidfd, pid_t pid, const char *proc_root, char *buf, size_t len, bool *kept);

/* The tenant of a peer (uid, pidfd, pid) in cgroup cg (NULL: unknown): a reference from tenants_get. */
uint64_t peer_tenant(struct tenants *t, uid_t uid, int pidfd, pid_t pid, const struct job_cgroup *cg,
		     const char *proc_root);

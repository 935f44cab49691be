/* SPDX-License-Identifier: MIT */
/* A client's tenant (core/tenant.h) at connect: its pid namespace, found without trusting the peer, and its cgroup. */
#pragma once

#include <stdint.h>
#include <sys/types.h>

struct tenants;
struct job_cgroup;

/*
 * The nsfs inode of the pid namespace of the process pidfd (-1: none) or pid names, or 0 when it cannot be told:
 *   1. ioctl(PIDFD_GET_PID_NAMESPACE) on the pidfd (Linux 6.11+; ptrace read access to the peer, as root has, or
 *      CAP_SYS_PTRACE);
 *   2. stat of <proc_root>/proc/PID/ns/pid (the same access), trusted only while the pidfd says the process lives;
 *   3. /proc/PID/status's NSpid with one pid, while the daemon's own has one too: the peer is in the pid namespace
 *      of that /proc, which is the daemon's (its inode from /proc/self/ns/pid). Needs no access beyond a visible
 *      /proc/PID (ProtectProc=default), and tells no nested namespace from another.
 * Never a guess: 0 makes the peer a tenant of its own.
 */
uint64_t peer_pidns(int pidfd, pid_t pid, const char *proc_root);

/* The tenant of a peer (uid, pidfd, pid) in cgroup cg (NULL: unknown): a reference from tenants_get. */
uint64_t peer_tenant(struct tenants *t, uid_t uid, int pidfd, pid_t pid, const struct job_cgroup *cg,
		     const char *proc_root);

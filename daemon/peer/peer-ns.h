/* SPDX-License-Identifier: MIT */
/* A peer's pid and user namespaces compared with the daemon's own, for the admin check (core/admin.h). */
#pragma once

#include <stddef.h>
#include <sys/types.h>

#include "admin.h"

/*
 * Fill f->pidns and f->userns for the peer: its pidfd (from SO_PEERPIDFD or pidfd_open; -1 without one) and
 * SO_PEERCRED's pid. The pid namespace comes from the pidfd's own fdinfo, which needs no access to the peer;
 * the user namespace from PIDFD_GET_USER_NAMESPACE (Linux 6.11), else /proc/PID/ns/user, both of which need
 * ptrace read access to the peer (for a root peer: the daemon's uid 0 with its capabilities, or
 * CAP_SYS_PTRACE). Where one stays ADMIN_NS_UNKNOWN, why (len bytes) says what failed.
 */
void peer_ns_read(int pidfd, pid_t pid, struct admin_facts *f, char *why, size_t len);

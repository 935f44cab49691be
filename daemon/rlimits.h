/* SPDX-License-Identifier: MIT */
/* The daemon's own limits: the memory it may lend against, and the fds, mappings and locked pages it may hold. */
#pragma once

#include <stdint.h>

struct broker;
struct config;

/*
 * What the daemon may lend against: MemTotal under proc_root, or its cgroup's
 * memory limit when lower (in a container, meminfo shows the host). Sets
 * *host_total to MemTotal itself: clients outside the daemon's cgroup can pin
 * up to that. Returns 0 (and *host_total 0) when meminfo is unreadable.
 */
uint64_t rlimits_memory_base(const char *proc_root, uint64_t *host_total);

/* Raise RLIMIT_NOFILE's soft limit to the hard one: one fd per pool chunk (16 GiB of 2 MiB chunks is 8192). */
void rlimits_raise_nofile(void);

/* Count the fds and mappings the daemon holds before any chunk exists (rlimits_resolve leaves them room). */
void rlimits_count_start(void);

/*
 * The per-uid caps and the daemon's chunk capacity (broker_resolve_limits)
 * from RLIMIT_NOFILE and vm.max_map_count, warning when they bind. Also
 * reload's resolve_limits hook.
 */
void rlimits_resolve(struct broker *b);

/* mlockall the daemon's own pages when lock-memory is on (not under ASan), warning if that fails. */
void rlimits_lock_self(const struct config *c);

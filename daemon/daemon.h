/* SPDX-License-Identifier: MIT */
/* struct daemon, the shell's objects around the core's struct broker, and the broker's verbs that reach memory. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "broker.h"

struct config;
struct conn_io;
struct ev_loop;
struct jobs_watch;
struct monitor;
struct numa_topology;
struct pool;
struct quota_store;
struct recovery;
struct reload_hooks;
struct restart;
struct revoker;
struct server;
struct waitq;

/*
 * The daemon: the core's state (broker: budget, leases, jobs, the pressure state, the counters) and the shell's
 * objects that act on its decisions. main.c owns one and builds it in dependency order. The shell's modules take
 * the broker and reach the rest through daemon_of; the core never sees this struct.
 */
struct daemon {
	struct broker broker;
	struct config *cfg;
	struct pool *pool;
	struct monitor *monitor;       /* samplers and PSI triggers */
	struct server *server;         /* the socket: connections, packets, their limits */
	struct revoker *revoker;       /* REVOKE deadlines, enforcement, reclaim, exit holds */
	struct waitq *waitq;           /* acquires waiting for memory */
	const struct conn_io *conn_io; /* how the request modules send and close (conn.h); set by server_new */
	struct jobs_watch *jobs_watch; /* clients' cgroups, and rules whose cgroup went away */
	struct recovery *recovery;     /* instance id, and the fd-store state for crash recovery under systemd */
	struct restart *restart;       /* the restart state file, and what live processes still map of an earlier one */
	struct quota_store *quota_store; /* the file the quota rules pinctl quota set made are kept in */
	struct ev_loop *loop;
	const char *config_path;                 /* for SIGHUP; NULL when none */
	const struct reload_hooks *reload_hooks; /* what reload_apply runs around a new config (reload.h) */
	const struct numa_topology *numa;        /* the NUMA topology the pool places on; NULL in tests */
};

/* The daemon b is the broker of. b must be a struct daemon's: every broker of the shell is. */
static inline struct daemon *daemon_of(const struct broker *b)
{
	return (struct daemon *)((const char *)b - offsetof(struct daemon, broker));
}

/*
 * An acquire, decided by broker_acquire and carried out on the pool: returns REFUSAL_NONE and *ret, a refusal
 * (nothing changed), or REFUSAL_FAILED with *err the negative errno of what failed (memfd_create, ftruncate,
 * fallocate, mmap, mlock, or an allocation; huge pages that ran out with hugetlb = yes are -ENOSPC here).
 */
enum broker_refusal daemon_acquire(struct broker *b, const struct acquire_args *a, struct lease **ret, int *err);

/* End lease l, whatever its state: its chunks back to the pool (retired unless broker_lease_reusable), uncharged. */
void daemon_free_lease(struct broker *b, struct lease *l);

/* Bring the idle pool toward target_idle_bytes, bounded by the budget (broker_trim_pool decides). */
void daemon_trim_pool(struct broker *b, uint64_t target_idle_bytes);

/* broker_unbrokered_cap with the pool's resident bytes now. */
uint64_t daemon_unbrokered_cap(const struct broker *b);

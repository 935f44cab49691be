/* SPDX-License-Identifier: MIT */
/*
 * Tenants: who may be handed the pages another lease left behind. A tenant is a uid in one pid namespace and one
 * cgroup; the pool reuses a chunk only for the tenant it was last lent to (pool.h), and any other tenant gets
 * fresh memory. No I/O: the shell finds a peer's pid namespace and cgroup and passes them in.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * No tenant: a chunk adopted after a restart (its tenant is not kept), or a caller of the pool that knows only the
 * uid (the unit tests). tenants_get never returns it, so no peer is ever handed such a chunk as its own.
 */
#define TENANT_NONE UINT64_C(0)

/*
 * Tenants nobody connected holds, kept so that a job's next process is the same tenant as its last (its idle chunks
 * stay warm for it): the oldest idle one beyond this many is dropped, and its chunks are then nobody's.
 */
#define TENANTS_IDLE_KEPT 256

struct tenants;

/* Returns 0 and *ret, or -ENOMEM. */
int tenants_new(struct tenants **ret);
/* Frees the table (references still held become meaningless numbers). */
void tenants_free(struct tenants *t);

/*
 * The tenant of a peer of uid in pid namespace pidns and cgroup (texts naming them; NULL: unknown): a reference to an
 * id, never TENANT_NONE. Peers with the same three known values share an id while its entry lives. A peer with an
 * unknown namespace or cgroup is a tenant of its own (a fresh id that no other peer gets), so memory passes to it
 * only fresh. kept: the names are never given to another namespace or cgroup while the daemon runs (a namespace's
 * 64-bit id, the daemon's own namespace, a cgroup's id), so the entry may outlive its last reference, as one of the
 * TENANTS_IDLE_KEPT idle ones, and a job's next process is the same tenant as its last; otherwise (an nsfs inode or
 * a cgroup path, which a later namespace or cgroup may get) it goes with its last reference. A dropped entry's id is
 * never handed out again: a chunk left to it is reused by nobody. Out of memory, the peer is a tenant of its own.
 */
uint64_t tenants_get(struct tenants *t, uid_t uid, const char *pidns, const char *cgroup, bool kept);
/* Drop a reference tenants_get gave (TENANT_NONE: nothing). */
void tenants_put(struct tenants *t, uint64_t id);
/*
 * Whether tenants a and b are in one pid namespace, as far as the table knows: a == b, or both entries are there
 * and name the same namespace. False when either is unknown (a tenant of its own, or an entry dropped since): a
 * process in one pid namespace must not reach leases held from another, whatever its uid.
 */
bool tenants_same_pidns(const struct tenants *t, uint64_t a, uint64_t b);
/* Entries kept (referenced and idle), and of them the idle ones (for the tests). */
size_t tenants_count(const struct tenants *t);
size_t tenants_idle(const struct tenants *t);

/*
 * The number of pids on the NSpid line of a /proc/PID/status text (len bytes): 1 when the process is in the pid
 * namespace of that /proc's mount, more when it is nested below it. 0 when there is no NSpid line (a kernel before
 * 4.1) or it does not parse.
 */
unsigned tenant_parse_nspid(const char *buf, size_t len);

/* SPDX-License-Identifier: MIT */
/* The broker's verbs: grant, release and reclaim leases across budget, pool and lease table, with no I/O. */
#include "broker.h"
#include "backing.h"
#include "jobs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "budget.h"
#include "config.h"
#include "lease.h"
#include "pool.h"
#include "util.h"

bool broker_resolve_limits(struct broker *b, uint64_t nofile, uint64_t max_map_count, uint64_t fds_in_use,
			   uint64_t maps_in_use)
{
	const struct config *cfg = b->cfg;
	uint64_t fixed_fds = fds_in_use + cfg->reserve_fds + 2ull * cfg->max_connections + BROKER_QUEUED_FDS_MAX;
	uint64_t cap = nofile > fixed_fds ? nofile - fixed_fds : 0;
	bool clamped = false;

	if (max_map_count > 0) {
		uint64_t fixed_maps = maps_in_use + cfg->reserve_fds;
		uint64_t map_cap = max_map_count > fixed_maps ? max_map_count - fixed_maps : 0;

		if (map_cap < cap)
			cap = map_cap;
	}
	if (cap < BROKER_CHUNK_CAPACITY_MIN) {
		cap = BROKER_CHUNK_CAPACITY_MIN;
		clamped = true;
	}
	b->chunk_capacity = cap;
	b->max_chunks_per_uid = cfg->max_chunks_per_uid ? cfg->max_chunks_per_uid : cap / 2;
	b->max_leases_per_uid = cfg->max_leases_per_uid ? cfg->max_leases_per_uid : b->max_chunks_per_uid;
	return clamped;
}

uint32_t broker_revoke_deadline_ms(const struct config *cfg, bool admin, uint32_t asked_ms)
{
	uint32_t d = asked_ms ? asked_ms : cfg->revoke_deadline_ms;

	if (!admin && d < cfg->revoke_min_deadline_ms)
		d = cfg->revoke_min_deadline_ms;
	return d;
}

bool broker_enforce_may_signal(const struct lease *l, uid_t target_uid)
{
	return !l->revoke_by_holder || target_uid == l->uid;
}

/* Chunks a lease of size_bytes takes: the fewest of the pool's classes, plus a tail for the remainder. */
static uint64_t chunks_for(const struct broker *b, uint64_t size_bytes)
{
	return pool_chunks_for(b->pool, size_bytes);
}

/* The caps on file descriptors and mappings: per uid, then the daemon's own. */
static int check_counts(const struct broker *b, uid_t uid, uint64_t need)
{
	if (b->max_leases_per_uid && budget_uid_leases(b->budget, uid) >= b->max_leases_per_uid)
		return -EMLINK;
	/* Chunks and the pidfds of exit holds alike: each is an fd the daemon keeps for uid. */
	if (b->max_chunks_per_uid && budget_uid_fds(b->budget, uid) + need > b->max_chunks_per_uid)
		return -EMFILE;
	if (b->chunk_capacity && budget_fds(b->budget) + need > b->chunk_capacity)
		return -ENFILE;
	return 0;
}

int broker_lease_node(const struct lease *l, bool *misplaced)
{
	*misplaced = false;
	if (l->nchunks == 0 || l->chunks[0]->node < 0)
		return -1;
	for (size_t i = 0; i < l->nchunks && l->numa_node >= 0; i++)
		if (l->chunks[i]->mixed || l->chunks[i]->node != l->numa_node)
			*misplaced = true;
	return l->chunks[0]->node;
}

/*
 * A charge for bytes of a shared registration passes from lease from_key to to_key (backing.h): the uid,
 * its never-revoked share and the job move with it; the registered total stays.
 */
static void move_charge(void *ctx, uint64_t from_key, uint64_t to_key, uint64_t bytes)
{
	struct broker *b = ctx;
	struct lease *from = lease_find(b->leases, from_key), *to = lease_find(b->leases, to_key);

	/* Both are live registrations of the file: the backing table holds only those. */
	if (!from || !to || from->charged_bytes < bytes)
		abort();
	budget_no_revoke_sub(b->budget, from->uid, bytes);
	budget_uncharge(b->budget, from->uid, bytes);
	/* to is counted (budget_count_add), so its uid has an entry: this cannot fail. */
	if (budget_charge(b->budget, to->uid, bytes) < 0)
		abort();
	budget_no_revoke_add(b->budget, to->uid, bytes);
	if (b->jobs)
		jobs_move(b->jobs, from->cgroup, to->cgroup, bytes);
	from->charged_bytes -= bytes;
	to->charged_bytes += bytes;
}

/* The bytes a registration of [start, start + bytes) of a shared file adds: those no live one covers. */
static uint64_t backed_charge(const struct broker *b, const struct acquire_args *a, uint64_t bytes)
{
	if (!b->backings)
		return bytes;
	return backing_uncovered(b->backings, a->backing_dev, a->backing_ino, a->backing_offset,
				 a->backing_offset + bytes);
}

/* Record a backed registration l (its charge not yet made). Returns 0, or -ENOMEM with nothing recorded. */
static int backed_add(struct broker *b, struct lease *l, uint64_t *added)
{
	int r;

	if (!b->backings) {
		r = backing_table_new(&b->backings);
		if (r < 0)
			return r;
	}
	r = backing_add(b->backings, l->backing_dev, l->backing_ino, l->id, l->backing_offset,
			l->backing_offset + l->bytes, added, move_charge, b);
	if (r < 0 && backing_objects(b->backings) == 0) {
		backing_table_free(b->backings);
		b->backings = NULL;
	}
	return r;
}

int broker_acquire(struct broker *b, const struct acquire_args *a, struct lease **ret)
{
	struct chunk **chunks = NULL;
	struct lease *l = NULL;
	uint64_t size_bytes, charge_bytes, added;
	bool backed = a->registration && a->backed &&
		      (!b->backings ||
		       backing_registrants(b->backings, a->backing_dev, a->backing_ino) < b->max_registrants_per_file);
	size_t nchunks = 0;
	int r;

	if (a->size == 0)
		return -EINVAL;
	/* A registration locks the program's own pages, not the pool's (which may be 2 MiB ones). */
	size_bytes = round_up(a->size, a->registration ? (uint64_t)sysconf(_SC_PAGESIZE) : pool_page_size(b->pool));
	if (size_bytes == 0)
		return -EINVAL;
	if (backed && a->backing_offset > UINT64_MAX - size_bytes)
		return -EINVAL;
	/* Shared memory others registered already is pinned and charged once: only new pages count. */
	charge_bytes = backed ? backed_charge(b, a, size_bytes) : size_bytes;

	if (charge_bytes > 0) {
		r = budget_check(b->budget, a->uid, charge_bytes);
		if (r < 0)
			return r;
		r = jobs_check(a->cgroup, charge_bytes);
		if (r < 0)
			return r;
		/* Unknown is not unlimited: a rule may well cover that client's job. */
		if (a->job_unknown && b->jobs && jobs_rule_count(b->jobs) > 0 &&
		    b->cfg->job_unknown == JOB_UNKNOWN_REFUSE)
			return -ENOKEY;
	}
	r = check_counts(b, a->uid, a->registration ? 0 : chunks_for(b, size_bytes));
	if (r < 0)
		return r;
	/* Only the holder's exit frees a never-revoked lease: a uid gets a bounded share of them. */
	if ((a->no_revoke || a->registration) &&
	    budget_uid_no_revoke(b->budget, a->uid) + charge_bytes > b->max_no_revoke_per_uid_bytes)
		return -EXFULL;

	/* Under pressure, lend only memory that is already locked; new pinning would add to it. A rank
	 * registering pages another already pinned adds nothing (the servers expect it to succeed). */
	if (b->state == BROKER_CRITICAL && charge_bytes > 0)
		return -EAGAIN;
	/* Nor memory that could not be taken back if it got worse: a never-revoked lease (an interposed
	 * program's) or a registration (which pins new pages as well). Only cooperative leases, which
	 * the revoker can reclaim when critical, are lent from the idle pool. */
	if (b->state == BROKER_TIGHT && (a->no_revoke || a->registration) && charge_bytes > 0)
		return -ENOLCK;
	if (b->state == BROKER_TIGHT && !a->registration && size_bytes > pool_idle_bytes(b->pool))
		return -EBUSY;

	if (!a->registration) {
		uint64_t need = chunks_for(b, size_bytes);

		/* Idle chunks hold fds and mappings too: room for this lease's fresh ones comes out of them. */
		if (b->chunk_capacity > need && pool_chunk_count(b->pool) + need > b->chunk_capacity &&
		    pool_trim_chunks(b->pool, (size_t)(b->chunk_capacity - need)) > 0)
			b->generation++;
		/* Tight: from idle chunks alone, smaller ones standing in for missing classes, so no new memory is
		 * pinned (the fd and mapping cap still bounds what that costs). */
		r = pool_take_tenant(b->pool, a->uid, a->tenant, b->state == BROKER_TIGHT, size_bytes, a->numa_node,
				     &chunks, &nchunks);
		if (r == -ENOSPC || r == -ENOMEM)
			b->generation++; /* idle chunks may have gone to make room, though the lease did not come */
		if (r < 0)
			return r;
		/* More chunks than the fewest (counted above) cost more fds: they must fit the caps as well. */
		r = nchunks > chunks_for(b, size_bytes) ? check_counts(b, a->uid, nchunks) : 0;
		if (r < 0) {
			pool_put(b->pool, chunks, nchunks);
			free(chunks);
			return r;
		}
	}

	r = lease_add(b->leases, a->uid, a->gid, a->pid, a->owner, size_bytes, a->priority, a->label, chunks, nchunks,
		      a->now_ms, &l);
	if (r < 0)
		goto fail;
	l->tenant = a->tenant;
	/* So the pool's hole-punch reports can name the lease (pool.h). */
	for (size_t i = 0; i < nchunks; i++)
		chunks[i]->lease_id = l->id;

	r = budget_count_add(b->budget, a->uid, nchunks);
	if (r < 0)
		goto fail;
	r = budget_charge(b->budget, a->uid, charge_bytes);
	if (r < 0) {
		budget_count_sub(b->budget, a->uid, nchunks);
		goto fail;
	}
	if (backed) {
		l->backed = true;
		l->backing_dev = a->backing_dev;
		l->backing_ino = a->backing_ino;
		l->backing_offset = a->backing_offset;
		l->charged_bytes = 0; /* move_charge must not see it charged before it is */
		/* Its id is the newest, so it takes no page over: added is what backed_charge saw. */
		r = backed_add(b, l, &added);
		if (r < 0 || added != charge_bytes) {
			if (r == 0)
				abort();
			budget_uncharge(b->budget, a->uid, charge_bytes);
			budget_count_sub(b->budget, a->uid, nchunks);
			goto fail;
		}
	}
	l->charged_bytes = charge_bytes;

	l->registration = a->registration;
	l->no_revoke = a->no_revoke || a->registration;
	/* A node the pool does not place on was served as "any": nothing to be misplaced from. */
	l->numa_node = pool_places_on(b->pool, a->numa_node) ? a->numa_node : -1;
	if (l->registration)
		b->registered_bytes += charge_bytes;
	/* A registration is the program's own memory: never a ring. */
	l->staging_ring = a->staging_ring && !a->registration;
	if (l->staging_ring) {
		b->staging_rings++;
		b->staging_ring_bytes += l->bytes;
	}
	if (l->no_revoke)
		budget_no_revoke_add(b->budget, a->uid, charge_bytes);
	if (b->jobs && a->cgroup) {
		l->cgroup = a->cgroup;
		jobs_charge(b->jobs, l->cgroup, charge_bytes);
	}
	b->generation++;
	broker_trim_pool(b, UINT64_MAX);
	*ret = l;
	return 0;

fail:
	pool_put(b->pool, chunks, nchunks);
	if (l)
		lease_remove(b->leases, l); /* frees the chunks array it took over */
	else
		free(chunks);
	broker_trim_pool(b, UINT64_MAX);
	return r;
}

void broker_free_lease(struct broker *b, struct lease *l)
{
	if (l->backed && b->backings) {
		uint64_t uncovered;

		/* Pages others still cover pass to them (move_charge); what stays is what nobody covers. */
		if (backing_remove(b->backings, l->backing_dev, l->backing_ino, l->id, &uncovered, move_charge, b) ==
			    0 &&
		    uncovered != l->charged_bytes)
			abort();
		if (backing_objects(b->backings) == 0) {
			backing_table_free(b->backings);
			b->backings = NULL;
		}
	}
	if (l->no_revoke)
		budget_no_revoke_sub(b->budget, l->uid, l->charged_bytes);
	if (l->registration)
		b->registered_bytes -= l->charged_bytes;
	if (l->staging_ring) {
		b->staging_rings--;
		b->staging_ring_bytes -= l->bytes;
	}
	budget_uncharge(b->budget, l->uid, l->charged_bytes);
	if (b->jobs)
		jobs_uncharge(b->jobs, l->cgroup, l->charged_bytes);
	l->cgroup = NULL;
	budget_count_sub(b->budget, l->uid, l->nchunks);
	/*
	 * The chunks stay warm for the tenant only when every mapper let go by a request: the library unmaps before
	 * it releases, and its mappings are MADV_DONTFORK, so no child of it keeps them. A mapper that closed or
	 * exited instead may share its memory with a clone(CLONE_VM) sibling, which maps the chunks still.
	 */
	if (!l->released || l->dropped || l->nattachers || l->exit_holds)
		for (size_t i = 0; i < l->nchunks; i++)
			l->chunks[i]->retired = true;
	pool_put(b->pool, l->chunks, l->nchunks);
	lease_remove(b->leases, l);
	b->generation++;
	/* A reload may have lowered the limit below what is held: the returned chunks may not all fit. */
	broker_trim_pool(b, UINT64_MAX);
}

int broker_release(struct broker *b, uint64_t id, uid_t uid, void *owner, bool admin)
{
	struct lease *l;

	l = lease_find(b->leases, id);
	if (!l)
		return -ENOENT;
	if (!admin && !(l->uid == uid && l->owner == owner))
		return -EPERM;
	/* Its holder's own release: the library unmapped it first. Anyone else's leaves the holder mapping it. */
	if (l->owner == owner && l->nattachers == 0 && l->exit_holds == 0)
		l->released = true;
	broker_free_lease(b, l);
	return 0;
}

size_t broker_drop_owner(struct broker *b, void *owner)
{
	struct lease *l, *next;
	size_t nfreed = 0;

	/* Orphaned leases have no owner; they wait for their client's re-declare, not for this. */
	if (!owner)
		return 0;
	for (l = lease_first(b->leases); l; l = next) {
		next = lease_next(b->leases, l);
		if (l->owner == owner || lease_attacher_find(l, owner))
			l->dropped = true;
		if (broker_detach(b, l, owner) == 1) {
			broker_free_lease(b, l);
			nfreed++;
		}
	}
	return nfreed;
}

int broker_share(struct broker *b, struct lease *l, const void *owner, const uint8_t token[LEASE_TOKEN_BYTES],
		 const uid_t *uids, size_t n)
{
	if (!owner || l->owner != owner)
		return -EPERM;
	if (l->state != LEASE_ACTIVE && l->state != LEASE_IDLE)
		return -EINVAL;
	return lease_share(b->leases, l, token, uids, n);
}

int broker_attach(struct broker *b, const uint8_t token[LEASE_TOKEN_BYTES], void *owner, uid_t uid, pid_t pid,
		  uint64_t tenant, uint64_t now_ms, struct lease **ret)
{
	struct lease *l = lease_find_token(b->leases, token);
	int r;

	/* A lease on its way back is as good as gone: a new mapper would only delay it. */
	if (!l || (l->state != LEASE_ACTIVE && l->state != LEASE_IDLE))
		return -ENOENT;
	if (!lease_share_allows(l, uid))
		return -EACCES;
	r = lease_attach(l, owner, pid, uid);
	if (r < 0)
		return r;
	/*
	 * Its fds go to another uid next (the caller sends them). That uid may keep a view of the
	 * pages past its release: a second mapping (mremap), a forked child, the fd passed on,
	 * /proc/PID/map_files. Only destroying the chunks when the lease ends keeps the holder's
	 * later leases, which pool_take would otherwise hand the same pages, out of its reach. A
	 * process of the holder's own uid may read the holder's memory anyway (ptrace,
	 * process_vm_readv) when it is of the holder's tenant too (its pid namespace and cgroup): its attachment
	 * taints nothing, so sharing within a tenant keeps the warm pool.
	 */
	if (uid != l->uid || tenant != l->tenant)
		for (size_t i = 0; i < l->nchunks; i++)
			l->chunks[i]->tainted = true;
	/* Someone uses it now: not a cached buffer to reclaim first. */
	if (l->state == LEASE_IDLE)
		lease_set_state(l, LEASE_ACTIVE, now_ms);
	b->generation++;
	*ret = l;
	return 0;
}

int broker_detach(struct broker *b, struct lease *l, const void *owner)
{
	int r = lease_detach(l, owner);

	if (r < 0)
		return r;
	b->generation++;
	return lease_unmapped(l) ? 1 : 0;
}

unsigned broker_set_pressure(struct broker *b, enum broker_state to)
{
	unsigned act = 0;

	b->state = to;
	if (to >= BROKER_TIGHT)
		act |= BROKER_ACT_TRIM_POOL;
	/* Waiting acquires are refused at once while critical: new pinning would add to the pressure. */
	if (to == BROKER_CRITICAL)
		act |= BROKER_ACT_REFUSE_WAITERS | BROKER_ACT_START_RECLAIM;
	else
		act |= BROKER_ACT_STOP_RECLAIM;
	if (to == BROKER_NORMAL)
		act |= BROKER_ACT_GRANT_WAITERS;
	return act;
}

void broker_trim_pool(struct broker *b, uint64_t target_idle_bytes)
{
	/* Leased plus idle must fit the budget: idle chunks are locked memory too. */
	uint64_t allowance_bytes = budget_pool_allowance(b->budget);
	uint64_t keep_bytes = target_idle_bytes < allowance_bytes ? target_idle_bytes : allowance_bytes;

	if (pool_idle_bytes(b->pool) > keep_bytes) {
		pool_shrink(b->pool, keep_bytes);
		b->generation++;
	}
}

uint64_t broker_overdue_bytes(const struct broker *b)
{
	uint64_t overdue_bytes = 0;
	const struct lease *l;

	for (l = lease_first(b->leases); l; l = lease_next(b->leases, l))
		if (l->state == LEASE_OVERDUE)
			overdue_bytes += l->bytes;
	return overdue_bytes;
}

int broker_listen_freed(struct broker *b, broker_freed_fn *fn)
{
	for (size_t i = 0; i < BROKER_FREED_LISTENERS_MAX; i++)
		if (b->freed_listeners[i] == fn)
			return -EEXIST;
	for (size_t i = 0; i < BROKER_FREED_LISTENERS_MAX; i++)
		if (!b->freed_listeners[i]) {
			b->freed_listeners[i] = fn;
			return 0;
		}
	return -ENOSPC;
}

void broker_unlisten_freed(struct broker *b, broker_freed_fn *fn)
{
	for (size_t i = 0; i < BROKER_FREED_LISTENERS_MAX; i++)
		if (b->freed_listeners[i] == fn)
			b->freed_listeners[i] = NULL;
}

void broker_memory_freed(struct broker *b)
{
	/* A copy: a listener may add or drop listeners (its own, or another's) while it runs. */
	broker_freed_fn *fns[BROKER_FREED_LISTENERS_MAX];

	memcpy(fns, b->freed_listeners, sizeof(fns));
	for (size_t i = 0; i < BROKER_FREED_LISTENERS_MAX; i++)
		if (fns[i])
			fns[i](b);
}

uint64_t broker_unbrokered_cap(const struct broker *b)
{
	/* Orphaned memory (an earlier instance's chunks, still mapped) is pinned too, and in no pool. */
	return unbrokered_cap(b->host_mem_total_bytes,
			      (b->pool ? pool_resident_bytes(b->pool) : 0) + b->registered_bytes + b->orphaned_bytes);
}

/* SPDX-License-Identifier: MIT */
/* The broker's verbs: grant, release and reclaim leases across budget, pool and lease table, with no I/O. */
#include "broker.h"
#include "backing.h"
#include "jobs.h"
#include "reservation.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "lease.h"
#include "util.h"

bool broker_resolve_limits(struct broker *b, uint64_t nofile, uint64_t max_map_count, uint64_t fds_in_use,
			   uint64_t maps_in_use)
{
	const struct broker_settings *cfg = &b->settings;
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

uint32_t broker_revoke_deadline_ms(const struct broker_settings *cfg, bool admin, uint32_t asked_ms)
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

enum broker_refusal_reason broker_refusal_reason(enum broker_refusal why)
{
	switch (why) {
	case REFUSAL_INVALID_SIZE:
		return REFUSED_INVALID;
	case REFUSAL_TOO_LARGE:
		return REFUSED_TOO_LARGE;
	case REFUSAL_UID_QUOTA:
		return REFUSED_OVER_QUOTA;
	case REFUSAL_JOB_QUOTA:
	case REFUSAL_JOB_UNKNOWN:
		return REFUSED_JOB_QUOTA;
	case REFUSAL_BUDGET:
		return REFUSED_OVER_BUDGET;
	case REFUSAL_TIGHT:
	case REFUSAL_TIGHT_NO_REVOKE:
		return REFUSED_PRESSURE;
	case REFUSAL_CRITICAL:
		return REFUSED_CRITICAL;
	case REFUSAL_UID_LEASES:
	case REFUSAL_UID_CHUNKS:
	case REFUSAL_CAPACITY:
	case REFUSAL_UID_NO_REVOKE:
		return REFUSED_LIMIT;
	case REFUSAL_TIMEOUT:
		return REFUSED_TIMEOUT;
	default:
		return REFUSED_OTHER;
	}
}

/* The fd and lease-count caps, in the order broker_acquire checks them: limit 0 is none. */
#define COUNT_CAPS 3
static const enum broker_refusal count_refusals[COUNT_CAPS] = { REFUSAL_UID_LEASES, REFUSAL_UID_CHUNKS,
								REFUSAL_CAPACITY };

static void count_caps(const struct broker *b, uid_t uid, struct broker_bound caps[COUNT_CAPS])
{
	caps[0] = (struct broker_bound){ BOUND_UID_LEASES, b->max_leases_per_uid, budget_uid_leases(b->budget, uid),
					 0 };
	/* Chunks and the pidfds of exit holds alike: each is an fd the daemon keeps for uid. */
	caps[1] = (struct broker_bound){ BOUND_UID_CHUNKS, b->max_chunks_per_uid, budget_uid_fds(b->budget, uid), 0 };
	caps[2] = (struct broker_bound){ BOUND_CAPACITY, b->chunk_capacity, budget_fds(b->budget), 0 };
}

/* What a count cap has room for: UINT64_MAX without a limit. */
static uint64_t cap_room(const struct broker_bound *cap)
{
	if (!cap->limit)
		return UINT64_MAX;
	return cap->used < cap->limit ? cap->limit - cap->used : 0;
}

/* Whether need more fit the cap: not when it is over already (a lowered cap, exit holds), even for none. */
static bool cap_fits(const struct broker_bound *cap, uint64_t need)
{
	return !cap->limit || (cap->used <= cap->limit && need <= cap_room(cap));
}

/* The caps on file descriptors and mappings for one lease of need chunks: per uid, then the daemon's own. */
static enum broker_refusal check_counts(const struct broker *b, uid_t uid, uint64_t need)
{
	struct broker_bound caps[COUNT_CAPS];

	count_caps(b, uid, caps);
	for (unsigned i = 0; i < COUNT_CAPS; i++)
		if (!cap_fits(&caps[i], i == 0 ? 1 : need))
			return count_refusals[i];
	return REFUSAL_NONE;
}

/* What uid may still hold in never-revoked leases (max-no-revoke-per-uid), *used beside it. */
static uint64_t no_revoke_left(const struct broker *b, uid_t uid, uint64_t *used)
{
	*used = budget_uid_no_revoke(b->budget, uid);
	return *used < b->max_no_revoke_per_uid_bytes ? b->max_no_revoke_per_uid_bytes - *used : 0;
}

/* Whether charge_bytes more never-revoked bytes fit uid's cap: not when it is over already, even for none. */
static bool no_revoke_fits(const struct broker *b, uid_t uid, uint64_t charge_bytes)
{
	uint64_t used, left = no_revoke_left(b, uid, &used);

	return used <= b->max_no_revoke_per_uid_bytes && charge_bytes <= left;
}

/* Unknown is not unlimited: a rule may well cover that client's job. */
static bool job_unknown_refused(const struct broker *b, const struct acquire_args *a)
{
	return a->job_unknown && b->jobs && jobs_rule_count(b->jobs) > 0 &&
	       b->settings.job_unknown == JOB_UNKNOWN_REFUSE;
}

/*
 * What the pressure state lends an acquire of a's kind: under pressure, only memory that is already locked (the
 * free warm pool) and none that could not be taken back if it got worse. *why is the refusal past it
 * (REFUSAL_NONE: no bound); REFUSAL_TIGHT bounds the lease's bytes, the others its new charge.
 */
static uint64_t pressure_left(const struct broker *b, const struct acquire_args *a, const struct pool_view *pv,
			      enum broker_refusal *why)
{
	*why = REFUSAL_NONE;
	if (b->state == BROKER_CRITICAL)
		*why = REFUSAL_CRITICAL;
	else if (b->state == BROKER_TIGHT && (a->no_revoke || a->registration))
		*why = REFUSAL_TIGHT_NO_REVOKE;
	else if (b->state == BROKER_TIGHT)
		*why = REFUSAL_TIGHT;
	return *why == REFUSAL_TIGHT ? pv->idle_bytes : *why != REFUSAL_NONE ? 0 : UINT64_MAX;
}

int broker_lease_node(const struct lease *l, bool *misplaced)
{
	*misplaced = false;
	if (l->nchunks == 0 || l->chunks[0].node < 0)
		return -1;
	for (size_t i = 0; i < l->nchunks && l->numa_node >= 0; i++)
		if (l->chunks[i].mixed || l->chunks[i].node != l->numa_node)
			*misplaced = true;
	return l->chunks[0].node;
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

/* Whether the pool places chunks on node (pv's nodes). */
static bool places_on(const struct pool_view *pv, int node)
{
	for (size_t i = 0; node >= 0 && i < pv->n_nodes; i++)
		if (pv->nodes[i] == node)
			return true;
	return false;
}

/*
 * The pool's step 1 (acquire_plan): idle chunks destroyed smallest class first until it holds at most max
 * chunks, as avail (idle chunks per class) then counts them.
 */
static void trim_avail(const struct pool_view *pv, size_t max, uint64_t avail[CLASSES_MAX])
{
	size_t chunks = pv->chunks;

	for (unsigned k = 0; k < pv->classes->n && chunks > max; k++)
		while (avail[k] > 0 && chunks > max) {
			avail[k]--;
			chunks--;
		}
}

enum broker_refusal broker_acquire(struct broker *b, const struct acquire_args *a, const struct pool_view *pv,
				   struct acquire_plan *plan)
{
	uint64_t size_bytes, charge_bytes, need = 0, left;
	bool backed = a->registration && a->backed &&
		      (!b->backings ||
		       backing_registrants(b->backings, a->backing_dev, a->backing_ino) < b->max_registrants_per_file);
	enum broker_refusal v;

	*plan = (struct acquire_plan){ .trim_to_chunks = SIZE_MAX, .node = -1 };
	if (a->size == 0)
		return REFUSAL_INVALID_SIZE;
	/* A registration locks the program's own pages, not the pool's (which may be 2 MiB ones). */
	size_bytes = round_up(a->size, a->registration ? pv->host_page_bytes : pv->page_bytes);
	if (size_bytes == 0)
		return REFUSAL_INVALID_SIZE;
	if (backed && a->backing_offset > UINT64_MAX - size_bytes)
		return REFUSAL_INVALID_SIZE;
	/* Shared memory others registered already is pinned and charged once: only new pages count. */
	charge_bytes = backed ? backed_charge(b, a, size_bytes) : size_bytes;
	if (a->reservation) {
		if (a->registration)
			return REFUSAL_INVALID_SIZE;
		v = broker_reservation_check(b, a->reservation, size_bytes);
		if (v != REFUSAL_NONE)
			return v;
	}

	/* A share of a reservation was charged, budget, uid and job, when the reservation was made. */
	if (charge_bytes > 0 && !a->reservation) {
		v = budget_check(b->budget, a->uid, charge_bytes);
		if (v == REFUSAL_NONE)
			v = jobs_check(a->cgroup, charge_bytes);
		if (v == REFUSAL_NONE && job_unknown_refused(b, a))
			v = REFUSAL_JOB_UNKNOWN;
		if (v != REFUSAL_NONE)
			return v;
	}
	if (!a->registration)
		need = classes_chunks_for(pv->classes, size_bytes);
	v = check_counts(b, a->uid, need);
	if (v != REFUSAL_NONE)
		return v;
	/* Only the holder's exit frees a never-revoked lease: a uid gets a bounded share of them. */
	if ((a->no_revoke || a->registration) && !no_revoke_fits(b, a->uid, charge_bytes))
		return REFUSAL_UID_NO_REVOKE;

	/* Under pressure new pinning would add to it. A rank registering pages another already pinned adds nothing
	 * (the servers expect it to succeed), and a revocable lease may have what the warm pool holds. */
	left = pressure_left(b, a, pv, &v);
	if (v != REFUSAL_NONE && (v == REFUSAL_TIGHT ? size_bytes : charge_bytes) > left)
		return v;

	if (!a->registration) {
		uint64_t avail[CLASSES_MAX], n;

		memcpy(avail, pv->idle_chunks, sizeof(avail));
		/* Idle chunks hold fds and mappings too: room for this lease's fresh ones comes out of them. */
		if (b->chunk_capacity > need && pv->chunks + need > b->chunk_capacity) {
			plan->trim_to_chunks = (size_t)(b->chunk_capacity - need);
			trim_avail(pv, plan->trim_to_chunks, avail);
		}
		/* Tight: from idle chunks alone, smaller ones standing in for missing classes, so no new memory is
		 * pinned (the fd and mapping cap still bounds what that costs). */
		if (b->state == BROKER_TIGHT)
			n = classes_split_avail(pv->classes, size_bytes, avail, plan->counts, &plan->tail_bytes);
		else
			n = classes_split(pv->classes, size_bytes, plan->counts, &plan->tail_bytes);
		if (n == 0)
			return REFUSAL_TIGHT;
		/* More chunks than the fewest (counted above) cost more fds: they must fit the caps as well. */
		v = n > need ? check_counts(b, a->uid, n) : REFUSAL_NONE;
		if (v != REFUSAL_NONE)
			return v;
		plan->nchunks = (size_t)n;
		/* A node the pool does not place on is served as "any": nothing to be misplaced from. */
		plan->node = places_on(pv, a->numa_node) ? a->numa_node : -1;
	}
	plan->bytes = size_bytes;
	plan->charge_bytes = charge_bytes;
	plan->backed = backed;
	return REFUSAL_NONE;
}

static void add_bound(struct broker_headroom *h, enum broker_bound_kind kind, uint64_t limit, uint64_t used,
		      uint64_t left)
{
	h->bounds[h->n++] = (struct broker_bound){ kind, limit, used, left };
}

/* The most bytes, up to bytes, of a lease split into at most room chunks (largest class first, then a tail). */
static uint64_t fit_chunks(const struct classes *c, uint64_t bytes, uint64_t room, uint64_t page)
{
	uint64_t s = 0;

	if (classes_chunks_for(c, bytes) <= room)
		return bytes;
	for (unsigned k = c->n; k-- > 0 && room > 0;) {
		uint64_t n = (bytes - s) / c->bytes[k];

		n = n < room ? n : room;
		s += n * c->bytes[k];
		room -= n;
	}
	if (room > 0)
		s += (bytes - s) / page * page;
	return s;
}

void broker_headroom(const struct broker *b, const struct acquire_args *a, const struct pool_view *pv,
		     uint64_t conn_leases, uint64_t conn_max, struct broker_headroom *out)
{
	uint64_t page = a->registration ? pv->host_page_bytes : pv->page_bytes, limit, used, left, least, room;
	struct broker_bound caps[COUNT_CAPS];
	enum broker_refusal why;
	int chunk_cap = -1;

	*out = (struct broker_headroom){ .page_bytes = page, .binding = 0 };
	/* In broker_acquire's order (the handler's per-connection cap first): a tie binds as its refusal would. */
	add_bound(out, BOUND_CONN_LEASES, conn_max, conn_leases,
		  broker_conn_may_acquire(conn_leases, conn_max) ? UINT64_MAX : 0);
	if (budget_uid_left(b->budget, a->uid, &limit, &used, &left))
		add_bound(out, BOUND_UID_QUOTA, limit, used, left);
	left = budget_left(b->budget, &limit, &used);
	add_bound(out, BOUND_BUDGET, limit, used, left);
	if (jobs_left(a->cgroup, &limit, &used, &left))
		add_bound(out, BOUND_JOB_QUOTA, limit, used, left);
	if (job_unknown_refused(b, a))
		add_bound(out, BOUND_JOB_UNKNOWN, 0, 0, 0);
	count_caps(b, a->uid, caps);
	for (unsigned i = 0; i < COUNT_CAPS; i++) {
		if (!caps[i].limit)
			continue;
		room = cap_room(&caps[i]);
		if (i == 0 || a->registration)
			/* A lease count, or a registration's chunks (none): the cap is reached or it is not. */
			left = cap_fits(&caps[i], i == 0 ? 1 : 0) ? UINT64_MAX : 0;
		else
			left = room > UINT64_MAX / classes_max(pv->classes) ? UINT64_MAX
									    : room * classes_max(pv->classes);
		if (i > 0 && !a->registration && (chunk_cap < 0 || room < cap_room(&caps[chunk_cap - 1])))
			chunk_cap = (int)i + 1; /* its index in caps, plus one */
		add_bound(out, caps[i].kind, caps[i].limit, caps[i].used, left);
	}
	if (a->no_revoke || a->registration) {
		left = no_revoke_left(b, a->uid, &used);
		add_bound(out, BOUND_NO_REVOKE, b->max_no_revoke_per_uid_bytes, used, left);
	}
	left = pressure_left(b, a, pv, &why);
	if (why != REFUSAL_NONE)
		add_bound(out, BOUND_PRESSURE, why == REFUSAL_TIGHT ? pv->idle_bytes : 0, 0, left);

	least = UINT64_MAX;
	for (size_t i = 0; i < out->n; i++)
		if (out->bounds[i].left_bytes < least) {
			least = out->bounds[i].left_bytes;
			out->binding = (int)i;
		}
	out->available_bytes = least / page * page;
	/* Fewer bytes than a chunk cap allows may still need more chunks than it has room for. */
	if (chunk_cap > 0) {
		room = cap_room(&caps[chunk_cap - 1]);
		left = fit_chunks(pv->classes, out->available_bytes, room, page);
		for (size_t i = 0; left < out->available_bytes && i < out->n; i++)
			if (out->bounds[i].kind == caps[chunk_cap - 1].kind)
				out->binding = (int)i;
		out->available_bytes = left;
	}
}

enum broker_refusal broker_acquire_done(struct broker *b, const struct acquire_args *a, const struct acquire_plan *plan,
					size_t trimmed, int err, struct lease_chunk *chunks, struct lease **ret,
					int *errp)
{
	struct lease *l = NULL;
	uint64_t charge_bytes = plan->charge_bytes, added;
	size_t nchunks = chunks ? plan->nchunks : 0;
	int r;

	if (trimmed > 0)
		b->generation++;
	if (err < 0) {
		/* Idle chunks may have gone to make room, though the lease did not come. */
		b->generation++;
		*errp = err;
		return REFUSAL_FAILED;
	}
	r = lease_add(b->leases, a->uid, a->gid, a->pid, a->owner, plan->bytes, a->priority, a->label, chunks, nchunks,
		      a->now_ms, &l);
	if (r < 0)
		goto fail;
	l->tenant = a->tenant;

	r = budget_count_add(b->budget, a->uid, nchunks);
	if (r < 0)
		goto fail;
	r = budget_charge(b->budget, a->uid, charge_bytes);
	if (r < 0) {
		budget_count_sub(b->budget, a->uid, nchunks);
		goto fail;
	}
	if (plan->backed) {
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
	l->numa_node = plan->node;
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
	if (a->reservation) {
		l->reservation_id = a->reservation->id;
		broker_reservation_take(b, a->reservation);
	}
	b->generation++;
	*ret = l;
	return REFUSAL_NONE;

fail:
	if (l) {
		l->chunks = NULL; /* the caller's again */
		l->nchunks = 0;
		lease_remove(b->leases, l);
	}
	*errp = r;
	return REFUSAL_FAILED;
}

bool broker_lease_reusable(const struct lease *l)
{
	/*
	 * Every mapper let go by a request: the library unmaps before it releases, and its mappings are
	 * MADV_DONTFORK, so no child of it keeps them. A mapper that closed or exited instead may share its memory
	 * with a clone(CLONE_VM) sibling, which maps the chunks still.
	 */
	return l->released && !l->dropped && l->nattachers == 0 && l->exit_holds == 0;
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
	lease_remove(b->leases, l);
	b->generation++;
}

int broker_release(struct broker *b, uint64_t id, uid_t uid, void *owner, bool admin, struct lease **ret)
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
	*ret = l;
	return 0;
}

size_t broker_drop_owner(struct broker *b, void *owner, struct lease **out, size_t max)
{
	struct lease *l;
	size_t n = 0;

	/* Orphaned leases have no owner; they wait for their client's re-declare, not for this. */
	if (!owner)
		return 0;
	for (l = lease_first(b->leases); l; l = lease_next(b->leases, l)) {
		if (l->owner == owner || lease_attacher_find(l, owner))
			l->dropped = true;
		if (broker_detach(b, l, owner) == 1 && n++ < max)
			out[n - 1] = l;
	}
	return n;
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
			l->chunks[i].tainted = true;
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

bool broker_trim_pool(struct broker *b, uint64_t target_idle_bytes, uint64_t idle_bytes, uint64_t *keep_bytes)
{
	/* Leased plus idle must fit the budget: idle chunks are locked memory too. */
	uint64_t allowance_bytes = budget_pool_allowance(b->budget);

	*keep_bytes = target_idle_bytes < allowance_bytes ? target_idle_bytes : allowance_bytes;
	if (idle_bytes <= *keep_bytes)
		return false;
	b->generation++; /* the idle pool moves: the fd-store state follows */
	return true;
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

uint64_t broker_unbrokered_cap(const struct broker *b, uint64_t pool_resident_bytes)
{
	/* Orphaned memory (an earlier instance's chunks, still mapped) is pinned too, and in no pool. */
	return unbrokered_cap(b->host_mem_total_bytes, pool_resident_bytes + b->registered_bytes + b->orphaned_bytes);
}

/* SPDX-License-Identifier: MIT */
/* libpinbroker's leases: the lease list, release, what a revoke or reconnect does to them, the accessors. */
#define _GNU_SOURCE
#include "lib-int.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

void lease_link_locked(pb_client *c, pb_lease *l)
{
	l->prev = NULL;
	l->next = c->leases;
	if (c->leases)
		c->leases->prev = l;
	c->leases = l;
}

void lease_unlink_locked(pb_client *c, pb_lease *l)
{
	if (l->prev)
		l->prev->next = l->next;
	else if (c->leases == l)
		c->leases = l->next;
	if (l->next)
		l->next->prev = l->prev;
	l->prev = l->next = NULL;
}

bool lease_is_stale(const pb_lease *l)
{
	return __atomic_load_n(&l->stale, __ATOMIC_ACQUIRE);
}

/* A lease of the current connection by id: a stale handle may carry an id that now names another lease. */
static pb_lease *lease_find_locked(pb_client *c, uint64_t id)
{
	for (pb_lease *l = c->leases; l; l = l->next)
		if (l->id == id && l->state != LEASE_GONE && !lease_is_stale(l) && l->conn_gen == c->conn_gen)
			return l;
	return NULL;
}

void lease_free(pb_lease *l)
{
	free(l->fallback_reason);
	free(l);
}

/*
 * Unmap, free, and RELEASE on the wire; waits for the daemon's answer when it
 * may. A stale lease is only unmapped and freed: its id may name someone
 * else's lease now, so nothing is sent. One let go while the connection is
 * down is remembered, and given back by the reconnect (try_reconnect).
 */
int lease_release_now(pb_client *c, pb_lease *l, bool wait)
{
	Pinbroker__V1__Release rel = PINBROKER__V1__RELEASE__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	uint64_t id = l->id, instance = l->instance_id, gen;
	bool forked = map_forked(l);
	struct waiter w;
	bool stale;
	int r;

	pthread_mutex_lock(&c->lock);
	gen = l->conn_gen;
	stale = lease_is_stale(l) || gen != c->conn_gen;
	r = c->dead;
	if (r && !stale)
		conn_note_away_locked(c, instance, id);
	pthread_mutex_unlock(&c->lock);
	map_release(l);
	lease_free(l);
	if (r || stale)
		return 0;
	if (!wait || conn_on_receiver_thread(c)) {
		r = conn_send_release(c, id, gen, forked);
		if (r == -ECONNRESET) {
			pthread_mutex_lock(&c->lock);
			conn_note_away_locked(c, instance, id);
			pthread_mutex_unlock(&c->lock);
		}
		return r == -ESTALE || r == -ECONNRESET ? 0 : r;
	}

	rel.lease_id = id;
	rel.has_forked = forked;
	rel.forked = forked;
	req.body_case = PINBROKER__V1__REQUEST__BODY_RELEASE;
	req.release = &rel;
	r = conn_call(c, &req, &w, false, gen);
	if (r == -ECONNRESET) {
		/* The daemon may or may not have seen it: saying it again after the restart is harmless. */
		pthread_mutex_lock(&c->lock);
		if (c->conn_gen == gen)
			conn_note_away_locked(c, instance, id);
		pthread_mutex_unlock(&c->lock);
	}
	if (r == -ECONNRESET || r == -ESTALE)
		return 0;
	if (r < 0)
		return r;
	if (w.reply->status != PINBROKER__V1__STATUS_CODE__STATUS_OK)
		r = err_reply(w.reply);
	conn_waiter_cleanup(&w);
	return r;
}

/* The revoke hook. Runs on the receiver thread, which must never wait for a reply: everything it sends is async. */
static void lease_on_revoke(pb_client *c, uint64_t id, uint32_t deadline_ms)
{
	pb_revoke_fn fn;
	void *userdata;
	bool forked;
	uint64_t gen;
	pb_lease *l;

	pthread_mutex_lock(&c->lock);
	l = lease_find_locked(c, id);
	if (!l) {
		/* Granted but not yet handed to the application: pb_acquire gives it back. */
		conn_mark_revoked_locked(c, id);
		pthread_mutex_unlock(&c->lock);
		return;
	}
	gen = l->conn_gen;
	if (l->state == LEASE_CACHED) {
		/* Cached memory is the library's own: give it back at once. */
		cache_index_remove_locked(c, l);
		c->cache_stats.revoked++;
		lease_unlink_locked(c, l);
		pthread_mutex_unlock(&c->lock);
		forked = map_forked(l);
		map_release(l);
		lease_free(l);
		conn_send_release(c, id, gen, forked);
		conn_send_revoke_ack(c, id, gen);
		return;
	}
	if (l->state != LEASE_ACTIVE) {
		pthread_mutex_unlock(&c->lock);
		return;
	}
	l->revoke_pending = true;
	/* Only the library's own ring: a program's lease acquired with the flag is revoked as any other. */
	if (l->staging_ring && c->staging_revoke && c->staging_owns && c->staging_owns(c, l)) {
		/* The library's own ring: staging gives it back once the copy in flight is done. */
		void (*hook)(pb_client *, pb_lease *, uint32_t) = c->staging_revoke;

		pthread_mutex_unlock(&c->lock);
		hook(c, l, deadline_ms);
		conn_send_revoke_ack(c, id, gen);
		return;
	}
	fn = c->revoke_fn;
	userdata = c->revoke_userdata;
	if (fn) {
		pthread_mutex_unlock(&c->lock);
		fn(c, l, deadline_ms, userdata);
		conn_send_revoke_ack(c, id, gen);
		return;
	}
	if (__atomic_load_n(&l->idle, __ATOMIC_ACQUIRE)) {
		l->state = LEASE_REVOKING;
		pthread_mutex_unlock(&c->lock);
		map_retire(l);
		conn_send_release(c, id, gen, map_forked(l));
		conn_send_revoke_ack(c, id, gen);
		pthread_mutex_lock(&c->lock);
		l->state = LEASE_GONE;
		pthread_cond_broadcast(&c->cond);
		pthread_mutex_unlock(&c->lock);
		return;
	}
	/* Busy and no callback: nothing safe to do. The daemon counts it overdue at the deadline. */
	pthread_mutex_unlock(&c->lock);
}

/* Under c->lock: the ids to re-declare to instance_id, the instance that granted them. */
static uint64_t *lease_redeclare_ids_locked(pb_client *c, uint64_t instance_id, size_t *n)
{
	uint64_t *ids;

	*n = 0;
	for (pb_lease *l = c->leases; l; l = l->next)
		(*n)++;
	ids = calloc(*n ? *n : 1, sizeof(*ids));
	*n = 0;
	for (pb_lease *l = c->leases; ids && l; l = l->next)
		/* An attachment is not the connection's to re-declare: re-adopting it would make this
		 * process the holder. It goes stale on reconnecting; the daemon holds the lease until we exit. */
		if (l->state != LEASE_GONE && !lease_is_stale(l) && l->instance_id == instance_id && !l->attached)
			ids[(*n)++] = l->id;
	return ids;
}

static bool id_in(const uint64_t *ids, size_t n, uint64_t id)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] == id)
			return true;
	return false;
}

/*
 * Under c->lock, reconnected: a lease the same instance adopted moves to the new connection; every other lease
 * becomes stale: still mapped here (the new daemon counts it as orphaned while it is), no longer a lease, and
 * never named on the wire again (its id may be reused by the new instance). Returns the cached ones, unlinked.
 */
static pb_lease *lease_reconnected_locked(pb_client *c, bool same, uint64_t instance_id, const uint64_t *adopted,
					  size_t nadopted)
{
	pb_lease *drop = NULL;

	for (pb_lease *l = c->leases, *next; l; l = next) {
		next = l->next;
		if (l->state == LEASE_GONE)
			continue;
		if (same && !lease_is_stale(l) && l->instance_id == instance_id && !l->attached &&
		    id_in(adopted, nadopted, l->id)) {
			l->conn_gen = c->conn_gen;
			continue;
		}
		__atomic_store_n(&l->stale, true, __ATOMIC_RELEASE);
		if (l->state == LEASE_CACHED) {
			/* Cached memory is the library's own: nobody counts it any more, so let it go here. */
			cache_index_remove_locked(c, l);
			lease_unlink_locked(c, l);
			l->next = drop;
			drop = l;
		}
	}
	return drop;
}

static void lease_drop(pb_lease *chain)
{
	while (chain) {
		pb_lease *l = chain;

		chain = l->next;
		map_release(l);
		lease_free(l);
	}
}

static const struct conn_hooks lease_hooks = {
	.revoke = lease_on_revoke,
	.redeclare_ids_locked = lease_redeclare_ids_locked,
	.reconnected_locked = lease_reconnected_locked,
	.drop = lease_drop,
};

void lease_install_hooks(pb_client *c)
{
	c->hooks = &lease_hooks;
}

void lease_release_all(pb_client *c)
{
	pb_lease *list;

	pthread_mutex_lock(&c->lock);
	for (;;) {
		bool revoking = false;

		for (pb_lease *l = c->leases; l; l = l->next)
			revoking |= l->state == LEASE_REVOKING;
		if (!revoking)
			break;
		pthread_cond_wait(&c->cond, &c->lock);
	}
	list = c->leases;
	c->leases = NULL;
	cache_index_clear_locked(c);
	pthread_mutex_unlock(&c->lock);

	/* Closing the socket returns every lease anyway; the explicit RELEASEs are pipelined, not awaited. */
	while (list) {
		pb_lease *l = list;

		list = l->next;
		if (l->state == LEASE_GONE) {
			if (l->map_base)
				munmap(l->map_base, l->map_bytes);
			lease_free(l);
		} else {
			lease_release_now(c, l, false);
		}
	}
}

void pb_set_revoke_callback(pb_client *c, pb_revoke_fn fn, void *userdata)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->lock);
	c->revoke_fn = fn;
	c->revoke_userdata = userdata;
	pthread_mutex_unlock(&c->lock);
}

int pb_lease_set_idle(pb_lease *l, int idle)
{
	pb_client *c;
	uint64_t gen;
	bool changed;
	int r = 0;

	if (!l)
		return err_set(-EINVAL, "pb_lease_set_idle: lease is NULL");
	if (l->client == NULL)
		return 0; /* fallback memory: nobody to tell */
	c = l->client;
	pthread_mutex_lock(&c->lock);
	switch (l->state) {
	case LEASE_ACTIVE:
		break;
	case LEASE_CACHED:
		r = err_set(-EINVAL, "lease %llu was released: the handle is no longer valid",
			    (unsigned long long)l->id);
		break;
	case LEASE_REVOKING:
	case LEASE_GONE:
		r = err_set(-ESTALE,
			    "lease %llu was revoked and given back by the library: its memory is gone "
			    "(pb_lease_data is NULL); call pb_release on it",
			    (unsigned long long)l->id);
		break;
	}
	if (r == 0 && (lease_is_stale(l) || l->conn_gen != c->conn_gen))
		r = err_set(-ESTALE,
			    "lease %llu is from a pinbrokerd that is gone: still mapped here but no longer "
			    "counted by the broker",
			    (unsigned long long)l->id);
	if (r < 0) {
		pthread_mutex_unlock(&c->lock);
		return r;
	}
	changed = __atomic_exchange_n(&l->idle, idle ? 1 : 0, __ATOMIC_ACQ_REL) != (idle ? 1 : 0);
	gen = l->conn_gen;
	pthread_mutex_unlock(&c->lock);
	/* Idle leases are what the daemon revokes first; tell it only on a change. A shared lease
	 * is never idle there (its attachers may be using it): the flag only tells this library
	 * that it may give the memory back itself on a revoke. */
	if (changed && !l->shared && !l->attached)
		conn_send_set_idle(c, l->id, idle != 0, gen);
	return 0;
}

int pb_lease_numa_node(const pb_lease *l, int *misplaced)
{
	if (misplaced)
		*misplaced = l && l->misplaced;
	return l && l->client ? l->numa_node : -1;
}

int pb_lease_stale(const pb_lease *l)
{
	return l && l->client && lease_is_stale(l);
}

void *pb_lease_data(const pb_lease *l)
{
	return l ? __atomic_load_n(&l->data, __ATOMIC_ACQUIRE) : NULL;
}

size_t pb_lease_size(const pb_lease *l)
{
	return l ? l->size_bytes : 0;
}

size_t pb_lease_page_size(const pb_lease *l)
{
	return l ? l->page_size_bytes : 0;
}

uint64_t pb_lease_id(const pb_lease *l)
{
	return l ? l->id : 0;
}

enum pb_memory_kind pb_lease_kind(const pb_lease *l)
{
	return l ? __atomic_load_n(&l->kind, __ATOMIC_ACQUIRE) : PB_MEM_FALLBACK;
}

int pb_lease_cuda_registered(const pb_lease *l)
{
	return l && l->cuda_registered;
}

int pb_lease_hugetlb(const pb_lease *l)
{
	return l && l->hugetlb;
}

size_t pb_lease_chunks(const pb_lease *l)
{
	return l ? l->chunks : 0;
}

const char *pb_lease_fallback_reason(const pb_lease *l)
{
	return l && l->kind == PB_MEM_FALLBACK ? l->fallback_reason : NULL;
}

/* SPDX-License-Identifier: MIT */
/* libpinbroker's cache: released leases kept mapped and registered, so a like-sized re-acquire costs microseconds. */
#define _GNU_SOURCE
#include "lib-int.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "util.h"

#define CACHE_FLAGS (PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_REVOKE | PB_ACQUIRE_MAPPED | PB_ACQUIRE_INHERIT)

size_t cache_limit_from_env(void)
{
	const char *s = getenv("PINBROKER_CACHE_BYTES");
	uint64_t v;

	if (!s || parse_size(s, &v) < 0 || v > SIZE_MAX)
		return 0;
	return (size_t)v;
}

unsigned cache_idle_ms_from_env(void)
{
	const char *s = getenv("PINBROKER_CACHE_IDLE_MS");
	unsigned long v;
	char *end;

	if (!s || !*s)
		return CACHE_IDLE_MS_DEFAULT;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || v < CACHE_IDLE_MS_MIN || v > CACHE_IDLE_MS_MAX)
		return CACHE_IDLE_MS_DEFAULT;
	return (unsigned)v;
}

/* Under c->lock: wake the receiver if it is not ticking, so it looks at the cache again. */
static void cache_wake_locked(pb_client *c)
{
	uint64_t one = 1;

	if (c->rx_ticking)
		return;
	/* An eventfd write never blocks (its counter is far from full); the receiver reads it back. A failed
	 * one (it cannot fail on a live eventfd) is tried again by the next lease cached. */
	c->rx_ticking = write(c->wake_fd, &one, sizeof(one)) == (ssize_t)sizeof(one);
}

/* The acquire flags a cached lease was granted with: a hit must ask for the same. */
static uint32_t cache_flags_of(const pb_lease *l)
{
	return (l->no_cuda ? PB_ACQUIRE_NO_CUDA : 0) | (l->no_revoke ? PB_ACQUIRE_NO_REVOKE : 0) |
	       (l->mapped ? PB_ACQUIRE_MAPPED : 0) | (l->inherit ? PB_ACQUIRE_INHERIT : 0);
}

/* Does a cached lease of have bytes serve a request of need (page-rounded) bytes, with slack_pct? */
static bool cache_fits(uint64_t have, uint64_t need, unsigned slack_pct)
{
	return have >= need && have - need <= need / 100 * slack_pct + need % 100 * slack_pct / 100;
}

pb_lease *cache_take(pb_client *c, size_t size, uint32_t flags, enum pb_priority prio)
{
	pb_lease *best = NULL;
	uint64_t gen = 0;
	bool tell = false;

	pthread_mutex_lock(&c->lock);
again:
	if (c->cached_bytes == 0) {
		if (c->cache_limit_bytes > 0)
			c->cache_stats.misses++;
		pthread_mutex_unlock(&c->lock);
		return NULL;
	}
	best = NULL;
	/* The smallest that fits, page size by page size: a lease's size is the request rounded to its pages. */
	for (uint64_t m = c->cache_page_mask; m; m &= m - 1) {
		size_t page_size_bytes = (size_t)1 << __builtin_ctzll(m);
		uint64_t need;
		pb_lease *l;

		need = round_up(size, page_size_bytes);
		if (need == 0)
			continue;
		l = cache_index_lower_bound_locked(c, flags & CACHE_FLAGS, prio, page_size_bytes, need);
		/* The smallest of at least need: if it is too big for the slack, every larger one is too. */
		if (!l || !cache_fits(l->size_bytes, need, c->cache_slack_pct))
			continue;
		if (!best || l->size_bytes < best->size_bytes)
			best = l;
	}
	if (best && best->idle_told && c->tells_in_flight > 0) {
		/* Its SET_IDLE 1 may not have left yet (pb_release's, or the tick's): a SET_IDLE 0 sent before it
		 * would leave the lease idle at the daemon while it is in use. Wait for those sends, look again. */
		pthread_cond_wait(&c->cond, &c->lock);
		goto again;
	}
	if (best) {
		cache_index_remove_locked(c, best);
		best->state = LEASE_ACTIVE;
		__atomic_store_n(&best->idle, 0, __ATOMIC_RELEASE);
		gen = best->conn_gen;
		tell = best->idle_told;
		best->idle_told = false;
		c->cache_stats.hits++;
	} else {
		c->cache_stats.misses++;
	}
	pthread_mutex_unlock(&c->lock);
	/*
	 * Not awaited: this is what makes a cached re-acquire cost microseconds. A lease that never sat a
	 * tick in the cache was never told idle, so nothing is sent at all. One told idle is told busy
	 * again: a REVOKE the daemon sent meanwhile finds it active here and is left alone (the daemon
	 * keeps a never-revoked lease that comes back into use; it counts any other one overdue).
	 */
	if (tell)
		conn_send_set_idle(c, best->id, false, gen);
	return best;
}

/* Under c->lock: unlink a cached lease onto *list, for cache_release_evicted. */
static void cache_evict_locked(pb_client *c, pb_lease *l, pb_lease **list)
{
	cache_index_remove_locked(c, l);
	c->cache_stats.evicted++;
	lease_unlink_locked(c, l);
	l->next = *list;
	*list = l;
}

bool cache_keep_locked(pb_client *c, pb_lease *l, pb_lease **evicted, bool *tell_now)
{
	*tell_now = false;
	/* A stale lease is never cached: no broker counts it, and its id may name another lease. A
	 * registration is the program's own memory, and a shared or attached lease others may use. A staging
	 * ring is counted as one by the daemon: cached, it could serve an ordinary acquire. A lease with a slice
	 * registered would serve a PB_ACQUIRE_NO_CUDA acquire already registered. */
	if (l->revoke_pending || l->shared || l->attached || l->registration || l->staging_ring || c->dead ||
	    l->cuda_slice_bytes || lease_is_stale(l) || l->conn_gen != c->conn_gen ||
	    l->size_bytes > c->cache_limit_bytes)
		return false;
	/* Room for the newest: the longest-cached go back first. */
	while (c->cached_bytes > c->cache_limit_bytes - l->size_bytes) {
		if (!c->cache_head)
			return false;
		cache_evict_locked(c, c->cache_head, evicted);
	}
	if (cache_index_add_locked(c, l, cache_flags_of(l)) < 0)
		return false;
	l->state = LEASE_CACHED;
	c->cache_stats.kept++;
	__atomic_store_n(&l->idle, 1, __ATOMIC_RELEASE);
	/* The receiver tells the daemon at its second tick, if the lease is still here. */
	l->idle_told = false;
	if (c->rx_blocking) {
		/* Caching came on while the receiver sat in its recv: no tick until the next message, so now. */
		l->idle_told = true;
		c->cache_stats.told_idle++;
		c->tells_in_flight++;
		*tell_now = true;
	} else {
		cache_wake_locked(c);
	}
	return true;
}

void cache_told(pb_client *c)
{
	pthread_mutex_lock(&c->lock);
	if (--c->tells_in_flight == 0)
		pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

void cache_release_evicted(pb_client *c, pb_lease *evicted)
{
	while (evicted) {
		pb_lease *l = evicted;

		evicted = l->next;
		/* Not awaited: the caller is on its way to reuse the room. */
		lease_release_now(c, l, false);
	}
}

void cache_tick(pb_client *c)
{
	enum { TELL_BATCH = 64 };
	uint64_t ids[TELL_BATCH], gens[TELL_BATCH];
	size_t n;

	do {
		n = 0;
		pthread_mutex_lock(&c->lock);
		/* In cache order from the first untold: stop at the first not cached before the last tick. */
		for (pb_lease *l = c->cache_untold; l && n < TELL_BATCH && l->cached_seq <= c->cache_told_seq;
		     l = c->cache_untold) {
			c->cache_untold = l->cache_next;
			if (l->idle_told)
				continue; /* told by pb_release, while the receiver waited in its recv */
			l->idle_told = true;
			ids[n] = l->id;
			gens[n++] = l->conn_gen;
		}
		c->cache_stats.told_idle += n;
		if (n < TELL_BATCH)
			c->cache_told_seq = c->cache_seq;
		if (n > 0)
			c->tells_in_flight++;
		pthread_mutex_unlock(&c->lock);
		/* Shared and attached leases are never cached, so every one of these is idle at the daemon too. */
		for (size_t i = 0; i < n; i++)
			conn_send_set_idle(c, ids[i], true, gens[i]);
		if (n > 0)
			cache_told(c);
	} while (n == TELL_BATCH);
}

void cache_retell_locked(pb_client *c)
{
	/* Re-declared leases come back in use at a restarted daemon (its saved state keeps no idle marks), and a
	 * tell sent as the connection dropped may never have arrived: the next tick tells every cached lease again.
	 * The daemon takes a second SET_IDLE 1 for a lease already idle as a no-op. */
	for (pb_lease *l = c->cache_head; l; l = l->cache_next)
		l->idle_told = false;
	c->cache_untold = c->cache_head;
}

bool cache_untold_locked(const pb_client *c)
{
	return c->cache_untold != NULL;
}

void pb_set_cache_limit(pb_client *c, size_t bytes)
{
	pb_lease *evict = NULL;

	if (!c)
		return;
	pthread_mutex_lock(&c->lock);
	c->cache_limit_bytes = bytes;
	while (c->cached_bytes > bytes && c->cache_head)
		cache_evict_locked(c, c->cache_head, &evict);
	pthread_mutex_unlock(&c->lock);
	while (evict) {
		pb_lease *l = evict;

		evict = l->next;
		lease_release_now(c, l, true);
	}
}

void pb_set_cache_slack(pb_client *c, unsigned percent)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->lock);
	c->cache_slack_pct = percent;
	pthread_mutex_unlock(&c->lock);
}

void pb_set_cache_idle_ms(pb_client *c, unsigned ms)
{
	if (!c)
		return;
	if (ms < CACHE_IDLE_MS_MIN)
		ms = CACHE_IDLE_MS_MIN;
	if (ms > CACHE_IDLE_MS_MAX)
		ms = CACHE_IDLE_MS_MAX;
	pthread_mutex_lock(&c->lock);
	c->cache_idle_ms = ms;
	/* A tick an hour away must not hold a shorter one off: the receiver, woken, starts its schedule again. */
	c->cache_tick_reset = true;
	c->rx_ticking = false;
	cache_wake_locked(c);
	pthread_mutex_unlock(&c->lock);
}

int pb_cache_stats(pb_client *c, struct pb_cache_stats *out)
{
	if (!c || !out)
		return err_set(-EINVAL, "pb_cache_stats: %s is NULL", c ? "out" : "the client");
	pthread_mutex_lock(&c->lock);
	*out = c->cache_stats;
	out->limit_bytes = c->cache_limit_bytes;
	out->cached_bytes = c->cached_bytes;
	out->slack_pct = c->cache_slack_pct;
	out->cached_leases = c->cached_leases;
	pthread_mutex_unlock(&c->lock);
	return 0;
}

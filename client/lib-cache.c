/* SPDX-License-Identifier: MIT */
/* libpinbroker's cache: released leases kept mapped and registered, so a like-sized re-acquire costs microseconds. */
#define _GNU_SOURCE
#include "lib-int.h"

#include <stdint.h>
#include <stdlib.h>

#include "util.h"

size_t cache_limit_from_env(void)
{
	const char *s = getenv("PINBROKER_CACHE_BYTES");
	uint64_t v;

	if (!s || parse_size(s, &v) < 0 || v > SIZE_MAX)
		return 0;
	return (size_t)v;
}

/* Best fit among cached leases: big enough, at most twice the size, same CUDA and priority choice. */
pb_lease *cache_take(pb_client *c, size_t size, bool no_cuda, enum pb_priority prio, uint64_t *gen)
{
	pb_lease *best = NULL;

	pthread_mutex_lock(&c->lock);
	for (pb_lease *l = c->leases; l; l = l->next) {
		uint64_t need;

		if (l->state != LEASE_CACHED || l->no_cuda != no_cuda || l->priority != prio)
			continue;
		need = round_up(size, l->page_size_bytes);
		if (need == 0 || l->size_bytes < need || l->size_bytes / 2 > need)
			continue;
		if (!best || l->size_bytes < best->size_bytes)
			best = l;
	}
	if (best) {
		best->state = LEASE_ACTIVE;
		c->cached_bytes -= best->size_bytes;
		__atomic_store_n(&best->idle, 0, __ATOMIC_RELEASE);
		*gen = best->conn_gen;
	}
	pthread_mutex_unlock(&c->lock);
	return best;
}

bool cache_keep_locked(pb_client *c, pb_lease *l)
{
	/* A stale lease is never cached: no broker counts it, and its id may name another lease. */
	if (l->revoke_pending || l->shared || l->attached || l->no_revoke || c->dead || lease_is_stale(l) ||
	    l->conn_gen != c->conn_gen || c->cached_bytes > c->cache_limit_bytes ||
	    l->size_bytes > c->cache_limit_bytes - c->cached_bytes)
		return false;
	l->state = LEASE_CACHED;
	c->cached_bytes += l->size_bytes;
	__atomic_store_n(&l->idle, 1, __ATOMIC_RELEASE);
	return true;
}

void pb_set_cache_limit(pb_client *c, size_t bytes)
{
	pb_lease *evict = NULL;

	if (!c)
		return;
	pthread_mutex_lock(&c->lock);
	c->cache_limit_bytes = bytes;
	for (pb_lease *l = c->leases, *next; l && c->cached_bytes > bytes; l = next) {
		next = l->next;
		if (l->state != LEASE_CACHED)
			continue;
		c->cached_bytes -= l->size_bytes;
		lease_unlink_locked(c, l);
		l->next = evict;
		evict = l;
	}
	pthread_mutex_unlock(&c->lock);
	while (evict) {
		pb_lease *l = evict;

		evict = l->next;
		lease_release_now(c, l, true);
	}
}

/* SPDX-License-Identifier: MIT */
/* libpinbroker's acquire and release: a granted lease mapped or registered, the cache hit, the fallback memory. */
#define _GNU_SOURCE
#include "lib-int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda.h"
#include "util.h"
#include "wire.h"

/* A granted registration charge: nothing to map; register the caller's range unless it does that itself. */
static int registration_from_reply(pb_client *c, const Pinbroker__V1__Lease *ls, uint32_t flags,
				   const struct reg_span *reg, pb_lease *l)
{
	int r;

	if (!(ls->has_registration && ls->registration))
		return err_set(-EPROTO, "pinbrokerd answered a registration with a pool lease");
	l->client = c;
	l->id = ls->lease_id;
	l->data = reg->p;
	l->size_bytes = ls->size;
	l->page_size_bytes = ls->page_size;
	l->registration = true;
	l->no_revoke = true;
	l->no_cuda = flags & PB_REGISTER_CHARGE_ONLY;
	l->kind = PB_MEM_PINNED;
	if (l->no_cuda)
		return 0;
	r = map_cuda_register(l, reg->p, reg->bytes, NULL, 0, flags & PB_ACQUIRE_MAPPED);
	if (r < 0)
		return err_set(r, "%s", pbcuda_strerror());
	return 0;
}

/*
 * Turn a granted lease (w holds the reply and all fds) into a mapped, registered pb_lease,
 * or, for reg, into a registration of the caller's memory.
 */
static int lease_from_reply(pb_client *c, struct waiter *w, uint32_t flags, const struct reg_span *reg, pb_lease **ret)
{
	const Pinbroker__V1__Lease *ls = w->reply->lease;
	pb_lease *l;
	int r;

	l = calloc(1, sizeof(*l));
	if (!l)
		return err_set(-ENOMEM, "out of memory");
	if (reg) {
		wire_close_fds(w->fds, w->nfds);
		r = registration_from_reply(c, ls, flags, reg, l);
		if (r < 0) {
			free(l);
			return r;
		}
		*ret = l;
		return 0;
	}
	/* Read before the mapping exists: a fork from now on may pass it to a child, and is counted. */
	l->inherit = (flags & PB_ACQUIRE_INHERIT) != 0;
	l->forks_at_map = map_forks();
	r = map_chunks(ls, w->fds, l->inherit, &l->map_base, &l->map_bytes);
	/* Mapped or not, the fds have done their job: the mapping keeps the memory. */
	wire_close_fds(w->fds, w->nfds);
	if (r < 0) {
		free(l);
		return r;
	}
	l->client = c;
	l->id = ls->lease_id;
	l->data = l->map_base;
	l->size_bytes = ls->size;
	l->page_size_bytes = ls->page_size;
	l->chunks = ls->n_chunk_bytes;
	l->hugetlb = ls->has_hugetlb ? ls->hugetlb : ls->page_size >= (2u << 20);
	l->priority = ls->has_priority ? (enum pb_priority)ls->priority : PB_PRIORITY_NORMAL;
	l->no_cuda = flags & PB_ACQUIRE_NO_CUDA;
	l->no_revoke = ls->has_no_revoke && ls->no_revoke;
	l->mapped = flags & PB_ACQUIRE_MAPPED;
	/* Asked for as a ring (an old daemon's reply does not say so: the revoke must still reach staging). */
	l->staging_ring = (flags & PB_ACQUIRE_STAGING_RING) || (ls->has_staging_ring && ls->staging_ring);
	l->numa_node = ls->has_numa_node ? ls->numa_node : -1;
	l->misplaced = ls->has_misplaced && ls->misplaced;
	l->kind = PB_MEM_LOCKED;
	if (!l->no_cuda && pbcuda_available(NULL)) {
		/* Register the whole range (in pieces past the driver's per-call cap); the lease is still good
		 * (locked) if the driver refuses. */
		if (map_cuda_register(l, l->map_base, l->map_bytes, ls->chunk_bytes, ls->n_chunk_bytes,
				      flags & PB_ACQUIRE_MAPPED) == 0) {
			l->kind = PB_MEM_PINNED;
		} else {
			err_set(0, "%s", pbcuda_strerror());
		}
	}
	*ret = l;
	return 0;
}

int acquire_call(pb_client *c, Request *req, const char *verb, uint32_t flags, bool attached,
		 const struct reg_span *reg, pb_lease **ret)
{
	struct waiter w;
	pb_lease *l = NULL;
	uint64_t id;
	bool revoked;
	int r;

	r = conn_call(c, req, &w, true, 0);
	if (r < 0)
		return r;
	if (w.reply->status != PINBROKER__V1__STATUS_CODE__STATUS_OK) {
		r = err_reply(w.reply);
		goto out;
	}
	if (w.reply->body_case != PINBROKER__V1__REPLY__BODY_LEASE) {
		r = err_set(-EPROTO, "pinbrokerd answered %s without a lease", verb);
		goto out;
	}
	id = w.reply->lease->lease_id;
	r = lease_from_reply(c, &w, flags, reg, &l);

	pthread_mutex_lock(&c->lock);
	/* A REVOKE sent while the lease was being mapped marks the waiter before it is published. */
	conn_drain_locked(c);
	conn_unlink_waiter_locked(c, &w);
	revoked = w.revoked;
	if (r == 0) {
		l->attached = attached;
		l->instance_id = w.instance_id;
		l->conn_gen = w.conn_gen;
		/* Granted on a connection that has gone since: that daemon did not get to re-adopt it. */
		if (w.conn_gen != c->conn_gen)
			__atomic_store_n(&l->stale, true, __ATOMIC_RELEASE);
		if (!revoked)
			lease_link_locked(c, l);
	}
	pthread_mutex_unlock(&c->lock);

	if (r < 0) {
		conn_send_release(c, id, w.conn_gen, false); /* give back (or detach) what we could not map */
		goto out;
	}
	if (revoked) {
		lease_release_now(c, l, true);
		conn_send_revoke_ack(c, id, w.conn_gen);
		r = attached ? err_set(-ENOENT, "lease %llu was revoked while attaching", (unsigned long long)id)
			     : err_set(-EAGAIN,
				       "lease %llu was revoked before it could be used: host memory is critical",
				       (unsigned long long)id);
		goto out;
	}
	*ret = l;
	r = 0;
out:
	pthread_mutex_lock(&c->lock);
	conn_unlink_waiter_locked(c, &w);
	pthread_mutex_unlock(&c->lock);
	conn_waiter_cleanup(&w);
	return r;
}

/* An ACQUIRE for size bytes as opts asks, with the wire flags extra on top. */
void acquire_message(Pinbroker__V1__Acquire *acq, uint64_t size, const struct pb_acquire_opts *opts, uint32_t extra)
{
	uint32_t flags = opts ? opts->flags : 0;
	enum pb_priority prio = opts ? opts->priority : PB_PRIORITY_NORMAL;

	acq->size = size;
	acq->flags = extra;
	if (flags & PB_ACQUIRE_WAIT) {
		acq->flags |= PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_WAIT;
		acq->has_timeout_ms = opts->timeout_ms != 0;
		acq->timeout_ms = opts->timeout_ms;
	}
	if (flags & PB_ACQUIRE_NO_REVOKE)
		acq->flags |= PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_NO_REVOKE;
	if (flags & PB_ACQUIRE_STAGING_RING)
		acq->flags |= PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_STAGING_RING;
	acq->has_flags = acq->flags != 0;
	acq->has_priority = prio != PB_PRIORITY_NORMAL;
	acq->priority = (Pinbroker__V1__Priority)prio;
	acq->label = opts && opts->label ? (char *)opts->label : NULL;
	{
		int node = gpu_acquire_node(opts);

		acq->has_numa_node = node >= 0;
		acq->numa_node = node;
	}
}

int pb_acquire(pb_client *c, size_t size, const struct pb_acquire_opts *opts, pb_lease **ret)
{
	Pinbroker__V1__Acquire acq = PINBROKER__V1__ACQUIRE__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	uint32_t flags = opts ? opts->flags : 0;
	enum pb_priority prio = opts ? opts->priority : PB_PRIORITY_NORMAL;
	pb_lease *l = NULL;

	if (!ret)
		return err_set(-EINVAL, "pb_acquire: ret is NULL");
	*ret = NULL;
	if (!c)
		return err_set(-ENOTCONN, "not connected to a broker");
	if (size == 0)
		return err_set(-EINVAL, "cannot acquire 0 bytes");
	if ((flags & PB_ACQUIRE_NO_REVOKE) && conn_need_registrations(c, "never-revoked leases") < 0)
		return -EOPNOTSUPP;

	/* A cached lease granted with the same flags serves it, without a word to the daemon; a ring is the
	 * daemon's to count, so it always asks. */
	if (!(flags & (PB_ACQUIRE_NO_CACHE | PB_ACQUIRE_STAGING_RING))) {
		l = cache_take(c, size, flags, prio);
		if (l) {
			*ret = l;
			return 0;
		}
	}

	acquire_message(&acq, size, opts, 0);
	req.body_case = PINBROKER__V1__REQUEST__BODY_ACQUIRE;
	req.acquire = &acq;

	return acquire_call(c, &req, "ACQUIRE", flags, false, NULL, ret);
}

static bool is_refusal(int err)
{
	switch (err) {
	case -EDQUOT:
	case -ENOSPC:
	case -EFBIG:
	case -EBUSY:
	case -EAGAIN:
	case -EINVAL:
	case -ETIMEDOUT:
	case -EUSERS:
	case -ESHUTDOWN:
	case -EACCES:
		return true;
	default:
		return false;
	}
}

pb_lease *pb_acquire_or_fallback(pb_client *c, size_t size, const struct pb_acquire_opts *opts)
{
	size_t page_bytes = (size_t)sysconf(_SC_PAGESIZE);
	char reason[ERR_CONNECT_FAILURE_LEN + 64];
	pb_lease *l = NULL;
	uint64_t bytes;
	int r;

	/* Size 0 is the caller's mistake, not a lack of pinned memory: no fallback hides it. */
	if (size == 0) {
		err_set(-EINVAL, "size 0: a lease needs at least 1 byte");
		return NULL;
	}
	if (c) {
		err_forget_daemon_message();
		r = pb_acquire(c, size, opts, &l);
		if (r == 0)
			return l;
		if (is_refusal(r) && err_daemon_message()[0] && strcmp(err_daemon_message(), pb_strerror(r)) != 0)
			snprintf(reason, sizeof(reason), "broker refused: %s (%s)", pb_strerror(r),
				 err_daemon_message());
		else if (is_refusal(r))
			snprintf(reason, sizeof(reason), "broker refused: %s", pb_strerror(r));
		else
			snprintf(reason, sizeof(reason), "broker failed: %s", pb_last_error());
	} else {
		err_connect_failure(reason, sizeof(reason));
	}

	bytes = round_up(size, page_bytes);
	l = calloc(1, sizeof(*l));
	if (!l || bytes == 0 || bytes > SIZE_MAX)
		goto fail;
	l->fallback_reason = strdup(reason);
	if (!l->fallback_reason || posix_memalign(&l->data, page_bytes, (size_t)bytes) != 0)
		goto fail;
	l->kind = PB_MEM_FALLBACK;
	l->size_bytes = (size_t)bytes;
	l->page_size_bytes = page_bytes;
	l->priority = opts ? opts->priority : PB_PRIORITY_NORMAL;
	err_set(0, "using ordinary memory: %s", reason);
	return l;
fail:
	if (l)
		lease_free(l);
	err_set(-ENOMEM, "out of memory (and no pinned memory: %s)", reason);
	return NULL;
}

int pb_release(pb_client *c, pb_lease *l)
{
	if (!l)
		return 0;
	if (l->kind == PB_MEM_FALLBACK) {
		free(l->data);
		lease_free(l);
		return 0;
	}
	/* The lease knows its client; c is accepted for symmetry and may be NULL. */
	c = l->client;
	pthread_mutex_lock(&c->lock);
	while (l->state == LEASE_REVOKING)
		pthread_cond_wait(&c->cond, &c->lock);
	if (l->state == LEASE_GONE) {
		lease_unlink_locked(c, l);
		pthread_mutex_unlock(&c->lock);
		if (l->map_base)
			munmap(l->map_base, l->map_bytes);
		lease_free(l);
		return 0;
	}
	if (l->state == LEASE_CACHED) {
		pthread_mutex_unlock(&c->lock);
		return err_set(-EINVAL, "lease %llu released twice", (unsigned long long)l->id);
	}
	if (c->cache_limit_bytes > 0) {
		pb_lease *evicted = NULL;
		uint64_t id = l->id, gen = l->conn_gen;
		bool tell_now;

		/* The receiver's tick tells the daemon it may take this one back first (or, see tell_now, we do). */
		if (cache_keep_locked(c, l, &evicted, &tell_now)) {
			pthread_mutex_unlock(&c->lock);
			if (tell_now) {
				conn_send_set_idle(c, id, true, gen);
				cache_told(c);
			}
			cache_release_evicted(c, evicted);
			return 0;
		}
		if (evicted) {
			pthread_mutex_unlock(&c->lock);
			cache_release_evicted(c, evicted);
			pthread_mutex_lock(&c->lock);
		}
	}
	lease_unlink_locked(c, l);
	pthread_mutex_unlock(&c->lock);
	return lease_release_now(c, l, true);
}

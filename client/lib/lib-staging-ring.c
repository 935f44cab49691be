/* SPDX-License-Identifier: MIT */
/* Staged copies' resources: the ring lease, its slots' events, the copy threads, revocation, fork, reports. */
#define _GNU_SOURCE
#include "lib-staging-int.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda.h"
#include "pinbroker-internal.h"
#include "staging-copy.h"
#include "util.h"

/* Every client's state, for fork; all_lock also serialises making one. */
static pthread_mutex_t all_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pbst_state *all_states;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
/* The settings' complaint is printed once per process, not once per client. */
static bool env_warned;

static const char *env_get(const char *name, void *arg)
{
	(void)arg;
	return getenv(name);
}

static void watch_forks(void)
{
	pthread_atfork(pbst_before_fork, pbst_after_fork_parent, pbst_after_fork_child);
}

static void ring_revoked(pb_client *c, pb_lease *l, uint32_t deadline_ms);
static bool owns_ring(pb_client *c, const pb_lease *l);

struct pbst_state *staging_state(pb_client *c)
{
	struct pbst_state *st = __atomic_load_n(&c->staging, __ATOMIC_ACQUIRE);
	const char *threads;
	char why[512];

	if (st)
		return st;
	pthread_once(&fork_once, watch_forks);
	pthread_mutex_lock(&all_lock);
	st = c->staging;
	if (st)
		goto out;
	st = calloc(1, sizeof(*st));
	if (!st)
		goto out;
	st->c = c;
	pthread_mutex_init(&st->lock, NULL);
	pthread_mutex_init(&st->ring_lock, NULL);
	pthread_mutex_init(&st->pool.lock, NULL);
	pthread_cond_init(&st->pool.go, NULL);
	pthread_cond_init(&st->pool.done, NULL);
	if (pbst_settings_from_env(&st->set, env_get, NULL, why, sizeof(why)) < 0 && !env_warned) {
		env_warned = true;
		fprintf(stderr, "libpinbroker: staged copies: %s\n", why);
	}
	threads = env_get("PINBROKER_STAGING_THREADS", NULL);
	if (!threads || !*threads)
		st->set.threads = pbst_threads_for_cpus(sysconf(_SC_NPROCESSORS_ONLN));
	staging_settings_changed_locked(st);
	st->next = all_states;
	all_states = st;
	c->staging_revoke = ring_revoked;
	c->staging_owns = owns_ring;
	__atomic_store_n(&c->staging, st, __ATOMIC_RELEASE);
out:
	pthread_mutex_unlock(&all_lock);
	return st;
}

void staging_settings_changed_locked(struct pbst_state *st)
{
	size_t min = !st->set.enabled ? SIZE_MAX : st->set.threshold_bytes > 0 ? st->set.threshold_bytes : 1;

	__atomic_store_n(&st->min_bytes, min, __ATOMIC_RELEASE);
}

void staging_report(struct pbst_state *st, bool force)
{
	struct pb_staging_stats s;
	uint64_t now = now_ms();

	pthread_mutex_lock(&st->lock);
	if (!st->reported || (!force && now < st->report_at_ms)) {
		pthread_mutex_unlock(&st->lock);
		return;
	}
	st->reported = false;
	st->report_at_ms = now + STAGING_REPORT_MS;
	s = st->stats;
	pthread_mutex_unlock(&st->lock);
	/* Fire and forget: the counters are cumulative, so a report lost (an old daemon, no connection) costs nothing. */
	staging_report_send(st->c, &s);
}

/* "staging ring", with the program's label (PINBROKER_LABEL, as pinctl run --label sets it) when there is one. */
static void ring_label(char *buf, size_t len)
{
	const char *label = getenv("PINBROKER_LABEL");

	if (label && *label)
		snprintf(buf, len, "staging ring: %s", label);
	else
		snprintf(buf, len, "staging ring");
}

/* Give l back at once, never to the client cache (it was asked for with PB_ACQUIRE_NO_CACHE, and is the library's). */
static void ring_release(pb_client *c, pb_lease *l)
{
	pthread_mutex_lock(&c->lock);
	lease_unlink_locked(c, l);
	pthread_mutex_unlock(&c->lock);
	lease_release_now(c, l, true);
}

static void back_off_locked(struct pbst_state *st)
{
	st->retry_at_ms = now_ms() + STAGING_BACKOFF_MS;
}

int staging_ring_take(struct pbst_state *st)
{
	struct pb_acquire_opts opts = { .flags = PB_ACQUIRE_NO_CACHE | PB_ACQUIRE_STAGING_RING };
	struct pbst_settings set;
	struct staging_slot *slots;
	char label[160];
	unsigned nslots;
	size_t bytes;
	pb_lease *l = NULL;
	bool going;
	int r;

	pthread_mutex_lock(&st->lock);
	if (st->ring && !lease_is_stale(st->ring) && !__atomic_load_n(&st->going, __ATOMIC_ACQUIRE)) {
		pthread_mutex_unlock(&st->lock);
		return 0;
	}
	pthread_mutex_unlock(&st->lock);
	/* A ring from a daemon that is gone, or one revoked while a copy used it: let it go first. */
	if (st->ring)
		staging_ring_drop(st, __atomic_load_n(&st->going, __ATOMIC_ACQUIRE));

	pthread_mutex_lock(&st->lock);
	if (now_ms() < st->retry_at_ms) {
		pthread_mutex_unlock(&st->lock);
		return -EAGAIN;
	}
	set = st->set;
	st->acquiring = true;
	__atomic_store_n(&st->going, false, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&st->lock);

	nslots = pbst_settings_slots(&set);
	bytes = (size_t)nslots * set.slot_bytes;
	ring_label(label, sizeof(label));
	opts.label = label;
	slots = calloc(nslots, sizeof(*slots));
	r = slots ? pb_acquire(st->c, bytes, &opts, &l) : -ENOMEM;
	/* Only memory the driver copies at full speed is worth staging through. */
	if (r == 0 && (pb_lease_kind(l) != PB_MEM_PINNED || pb_lease_size(l) < bytes)) {
		ring_release(st->c, l);
		l = NULL;
		r = -ENODEV;
	}

	pthread_mutex_lock(&st->lock);
	st->acquiring = false;
	if (r < 0) {
		st->stats.ring_refused++;
		st->reported = true;
		back_off_locked(st);
		pthread_mutex_unlock(&st->lock);
		free(slots);
		staging_report(st, false);
		return r;
	}
	st->ring = l;
	st->ring_base = pb_lease_data(l);
	st->nslots = nslots;
	st->slot_bytes = set.slot_bytes;
	st->slots = slots;
	st->next_slot = 0;
	st->stats.ring_leases++;
	st->stats.ring_bytes = bytes;
	st->reported = true;
	going = __atomic_load_n(&st->going, __ATOMIC_ACQUIRE);
	pthread_mutex_unlock(&st->lock);
	if (going) {
		/* Revoked before its first copy. */
		staging_ring_drop(st, true);
		return -EAGAIN;
	}
	staging_report(st, true);
	return 0;
}

/* Wait until the GPU no longer reads or writes any slot (a drop; before the ring's memory goes). */
static void slots_drain(struct pbst_state *st)
{
	void *cur = NULL;

	if (!st->slots)
		return;
	pbcuda_ctx_current(&cur);
	for (unsigned i = 0; i < st->nslots; i++) {
		struct staging_slot *s = &st->slots[i];
		bool pushed = false;

		if (!s->pending)
			continue;
		/* The receiver thread has no context: wait in the event's own. */
		if (s->pending_ctx != cur && pbcuda_ctx_push(s->pending_ctx) == 0)
			pushed = true;
		pbcuda_event_sync(s->pending);
		if (pushed)
			pbcuda_ctx_pop();
		s->pending = NULL;
	}
}

void staging_ring_drop(struct pbst_state *st, bool revoked)
{
	struct staging_slot *slots = st->slots;
	pb_lease *l;

	slots_drain(st);
	pthread_mutex_lock(&st->lock);
	l = st->ring;
	st->ring = NULL;
	st->ring_base = NULL;
	st->slots = NULL;
	st->nslots = 0;
	st->stats.ring_bytes = 0;
	st->reported = true;
	if (revoked)
		back_off_locked(st);
	__atomic_store_n(&st->going, false, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&st->lock);
	free(slots);
	if (l)
		ring_release(st->c, l);
	staging_report(st, true);
}

void staging_ring_unlock(struct pbst_state *st)
{
	pthread_mutex_unlock(&st->ring_lock);
	/*
	 * A revoke that came while this copy held the ring found ring_lock taken and left the drop to us; one that
	 * comes now finds it free and drops the ring itself. Seen from both sides (going set before its trylock, ours
	 * read after our unlock), one of the two always does it.
	 */
	if (__atomic_load_n(&st->going, __ATOMIC_SEQ_CST) && pthread_mutex_trylock(&st->ring_lock) == 0) {
		if (st->ring && __atomic_load_n(&st->going, __ATOMIC_SEQ_CST))
			staging_ring_drop(st, true);
		pthread_mutex_unlock(&st->ring_lock);
	}
}

static bool owns_ring(pb_client *c, const pb_lease *l)
{
	struct pbst_state *st = __atomic_load_n(&c->staging, __ATOMIC_ACQUIRE);
	bool owned;

	if (!st)
		return false;
	pthread_mutex_lock(&st->lock);
	owned = st->ring == l || st->acquiring;
	pthread_mutex_unlock(&st->lock);
	return owned;
}

/* The lease room's hook, on the receiver thread: the daemon wants the ring back within deadline_ms. */
static void ring_revoked(pb_client *c, pb_lease *l, uint32_t deadline_ms)
{
	struct pbst_state *st = __atomic_load_n(&c->staging, __ATOMIC_ACQUIRE);

	(void)deadline_ms; /* a copy in flight is one ring's worth of pieces from done: far inside any deadline */
	if (!st)
		return;
	pthread_mutex_lock(&st->lock);
	if (st->ring != l && !st->acquiring) {
		pthread_mutex_unlock(&st->lock);
		return;
	}
	st->stats.ring_revoked++;
	st->reported = true;
	__atomic_store_n(&st->going, true, __ATOMIC_SEQ_CST);
	pthread_mutex_unlock(&st->lock);
	/* No copy uses it: give it back now. Else the copy in flight does when it ends (staging_ring_unlock). */
	if (pthread_mutex_trylock(&st->ring_lock) == 0) {
		if (st->ring == l)
			staging_ring_drop(st, true);
		pthread_mutex_unlock(&st->ring_lock);
	}
}

void **staging_events(struct pbst_state *st, void *ctx)
{
	struct staging_events *e;

	for (e = st->events; e; e = e->next)
		if (e->ctx == ctx)
			break;
	if (!e) {
		e = calloc(1, sizeof(*e));
		if (!e)
			return NULL;
		e->ctx = ctx;
		e->next = st->events;
		st->events = e;
	}
	if (e->n < st->nslots) {
		void **ev = realloc(e->ev, st->nslots * sizeof(*ev));

		if (!ev)
			return NULL;
		e->ev = ev;
		for (; e->n < st->nslots; e->n++)
			if (pbcuda_event_create(&e->ev[e->n]) != 0)
				return NULL;
	}
	return e->ev;
}

/* Forget every event; with destroy, give them to the driver too (not in a forked child: CUDA stayed behind). */
static void events_free(struct pbst_state *st, bool destroy)
{
	void *cur = NULL;

	if (destroy && st->events) /* events exist only where the driver does */
		pbcuda_ctx_current(&cur);
	while (st->events) {
		struct staging_events *e = st->events;

		st->events = e->next;
		if (destroy) {
			bool pushed = e->ctx != cur && pbcuda_ctx_push(e->ctx) == 0;

			for (unsigned i = 0; i < e->n; i++)
				pbcuda_event_destroy(e->ev[i]);
			if (pushed)
				pbcuda_ctx_pop();
		}
		free(e->ev);
		free(e);
	}
}

static void part_copy(bool stream, void *dst, const void *src, size_t len)
{
	if (stream)
		pbst_stream_copy(dst, src, len);
	else
		memcpy(dst, src, len);
}

/* Take the next part of the job in hand and copy it, until none is left. Called with p->lock held; returns so. */
static void pool_work_locked(struct staging_pool *p)
{
	while (p->next_part < p->nparts) {
		unsigned i = p->next_part++;
		uint8_t *dst = p->dst;
		const uint8_t *src = p->src;
		bool stream = p->stream;
		size_t off, len;

		pbst_split_part(p->bytes, p->nparts, i, &off, &len);
		pthread_mutex_unlock(&p->lock);
		part_copy(stream, dst + off, src + off, len);
		pthread_mutex_lock(&p->lock);
		if (--p->left == 0)
			pthread_cond_signal(&p->done);
	}
}

static void *pool_main(void *arg)
{
	struct staging_pool *p = arg;
	uint64_t seen;

	pthread_mutex_lock(&p->lock);
	seen = p->gen;
	for (;;) {
		while (!p->stop && p->gen == seen)
			pthread_cond_wait(&p->go, &p->lock);
		if (p->stop)
			break;
		seen = p->gen;
		pool_work_locked(p);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

int staging_pool_start(struct pbst_state *st)
{
	struct staging_pool *p = &st->pool;
	unsigned want = st->set.threads > 0 ? st->set.threads - 1 : 0;
	sigset_t all, old;
	int r = 0;

	if (p->n >= want)
		return 0;
	if (!p->tids) {
		p->tids = calloc(PBST_THREADS_MAX, sizeof(*p->tids));
		if (!p->tids)
			return -ENOMEM;
	}
	/* The copy threads take no signals: they belong to the application's threads. */
	sigfillset(&all);
	/* A fault in a worker's memcpy is the program's (a handler for guarded memory must see it), never masked. */
	sigdelset(&all, SIGSEGV);
	sigdelset(&all, SIGBUS);
	sigdelset(&all, SIGFPE);
	sigdelset(&all, SIGILL);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	while (p->n < want && r == 0) {
		r = -pthread_create(&p->tids[p->n], NULL, pool_main, p);
		if (r == 0)
			p->n++;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return r;
}

void staging_pool_copy(struct pbst_state *st, void *dst, const void *src, size_t bytes, unsigned n, bool stream)
{
	struct staging_pool *p = &st->pool;

	if (n > p->n + 1)
		n = p->n + 1;
	if (n <= 1) {
		part_copy(stream, dst, src, bytes);
		return;
	}
	pthread_mutex_lock(&p->lock);
	p->stream = stream;
	p->dst = dst;
	p->src = src;
	p->bytes = bytes;
	p->nparts = n;
	p->next_part = 0;
	p->left = n;
	p->gen++;
	pthread_cond_broadcast(&p->go);
	pool_work_locked(p);
	while (p->left > 0)
		pthread_cond_wait(&p->done, &p->lock);
	pthread_mutex_unlock(&p->lock);
}

void staging_pool_stop(struct pbst_state *st)
{
	struct staging_pool *p = &st->pool;

	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->lock);
	for (unsigned i = 0; i < p->n; i++)
		pthread_join(p->tids[i], NULL);
	p->n = 0;
	p->stop = false;
}

void staging_client_close(pb_client *c)
{
	struct pbst_state *st = __atomic_load_n(&c->staging, __ATOMIC_ACQUIRE);

	if (!st)
		return;
	pthread_mutex_lock(&st->ring_lock);
	if (st->ring)
		staging_ring_drop(st, false);
	/* No ring is taken again: the connection is closing. */
	pthread_mutex_lock(&st->lock);
	st->retry_at_ms = UINT64_MAX;
	pthread_mutex_unlock(&st->lock);
	staging_pool_stop(st);
	events_free(st, true);
	pthread_mutex_unlock(&st->ring_lock);
}

void staging_client_free(pb_client *c)
{
	struct pbst_state *st = c->staging;

	if (!st)
		return;
	pthread_mutex_lock(&all_lock);
	for (struct pbst_state **pp = &all_states; *pp; pp = &(*pp)->next)
		if (*pp == st) {
			*pp = st->next;
			break;
		}
	c->staging = NULL;
	pthread_mutex_unlock(&all_lock);
	pthread_cond_destroy(&st->pool.go);
	pthread_cond_destroy(&st->pool.done);
	pthread_mutex_destroy(&st->pool.lock);
	pthread_mutex_destroy(&st->ring_lock);
	pthread_mutex_destroy(&st->lock);
	free(st->pool.tids);
	free(st);
}

/*
 * Around fork. The forking thread holds every state's lock, so the child copies consistent states; not ring_lock,
 * which a copy holds for its whole length (the child takes it over fresh). Registered by the library itself, on
 * first use; a second call from the same thread (an interposer's own handlers) does nothing.
 */
static __thread unsigned fork_depth;

void pbst_before_fork(void)
{
	if (fork_depth++ > 0)
		return;
	pthread_mutex_lock(&all_lock);
	for (struct pbst_state *st = all_states; st; st = st->next) {
		pthread_mutex_lock(&st->lock);
		pthread_mutex_lock(&st->pool.lock);
	}
}

void pbst_after_fork_parent(void)
{
	if (fork_depth == 0 || --fork_depth > 0)
		return;
	for (struct pbst_state *st = all_states; st; st = st->next) {
		pthread_mutex_unlock(&st->pool.lock);
		pthread_mutex_unlock(&st->lock);
	}
	pthread_mutex_unlock(&all_lock);
}

/* The child has no ring (its memory is not mapped here: leases are MADV_DONTFORK), no threads and no CUDA. */
void pbst_after_fork_child(void)
{
	if (fork_depth == 0 || --fork_depth > 0)
		return;
	for (struct pbst_state *st = all_states; st; st = st->next) {
		pthread_mutex_init(&st->lock, NULL);
		pthread_mutex_init(&st->ring_lock, NULL);
		pthread_mutex_init(&st->pool.lock, NULL);
		pthread_cond_init(&st->pool.go, NULL);
		pthread_cond_init(&st->pool.done, NULL);
		st->ring = NULL; /* the parent's lease: the parent gives it back */
		st->ring_base = NULL;
		free(st->slots);
		st->slots = NULL;
		st->nslots = 0;
		events_free(st, false);
		st->pool.n = 0;
		st->pool.stop = false;
		__atomic_store_n(&st->going, false, __ATOMIC_RELAXED);
		st->acquiring = false;
		st->retry_at_ms = 0;
		/* A new process: its counters start at nothing. */
		memset(&st->stats, 0, sizeof(st->stats));
		st->reported = false;
	}
	pthread_mutex_init(&all_lock, NULL);
}

/* SPDX-License-Identifier: MIT */
/*
 * The warm-up beside the event loop (warmup.h). One thread walks the jobs and makes a batch of chunks at a
 * time with pool_make_warm (itself parallel: a chunk a thread, as many chunks as the pool has threads); a batch
 * made is queued under a mutex and the loop is woken by an ev_async. Only the loop's callback takes chunks
 * off the queue and adds them to the pool, so the pool's books stay the loop's alone.
 */
#define _GNU_SOURCE
#include "warmup.h"

#include <errno.h>
#include <ev.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "pool.h"
#include "timer-clock.h"
#include "util.h"

/* Chunks of sizes[] (pool_warm_plan's) to make on node (-1: any). */
struct warmup_job {
	int node;
	uint64_t *sizes;
	size_t n;
};

/*
 * A batch: a chunk for every warm-up thread (each fills its own chunk whole, which is what scales: threads
 * sharing one chunk's segments serialise on the machine-wide LRU drain of every collapse call, 3.7 GiB/s with
 * 16 threads on an H100 host), and at least WARMUP_BATCH_MIN_BYTES; at most the operator's warmup-batch-max
 * (16 GiB by default: the 16 threads of the H100 host above on 1 GiB chunks; more threads share the batch's
 * chunks in segments), but always one chunk, even one larger than that. A batch is pinned before the loop
 * admits it (against the prewarm target, the budget and pressure), and the thread makes the next only once the
 * loop has taken this one: what the warm-up holds that no book counts is one batch at most, so
 * max(warmup-batch-max, the largest chunk).
 */
#define WARMUP_BATCH_MIN_BYTES (UINT64_C(1) << 30)

struct warmup {
	struct ev_loop *loop;
	struct pool *pool;
	struct warmup_job *jobs;
	size_t njobs;
	struct warmup_hooks hooks;
	ev_async async;
	pthread_t thread;
	bool started;             /* thread created (and not yet joined) */
	bool over;                /* done called, or never to be */
	uint64_t t0_us;           /* when it started */
	uint64_t added;           /* bytes the loop added to the pool */
	uint64_t batch_max_bytes; /* warmup-batch-max: most bytes of a batch, unless its one chunk is larger */
	unsigned delay_ms;        /* WARMUP_DELAY_ENV */
	unsigned hold_ms;         /* WARMUP_HOLD_ENV */

	/* Shared with the thread, under lock. */
	pthread_mutex_t lock;
	pthread_cond_t cond;  /* the stop flag (a delay cut short), a batch taken by the loop */
	struct chunk **queue; /* made, not yet handed over */
	size_t nqueue, capqueue;
	bool stop;            /* the loop wants no more */
	bool finished;        /* the thread made its last batch */
	uint64_t sent, taken; /* batches handed over, and taken in (admitted or dropped) by the loop */
	int error;            /* first error of the thread */
};

static bool stopping(struct warmup *w)
{
	bool s;

	pthread_mutex_lock(&w->lock);
	s = w->stop;
	pthread_mutex_unlock(&w->lock);
	return s;
}

/* Queue a batch's chunks for the loop. Out of memory, the chunks are dropped (the warm-up ends short). */
static void hand_over(struct warmup *w, struct chunk **made, size_t n, int r)
{
	pthread_mutex_lock(&w->lock);
	if (r < 0 && w->error == 0)
		w->error = r;
	if (w->nqueue + n > w->capqueue) {
		size_t cap = (w->nqueue + n) * 2;
		struct chunk **q = realloc(w->queue, cap * sizeof(*q));

		if (!q) {
			if (w->error == 0)
				w->error = -ENOMEM;
			w->stop = true;
			pthread_mutex_unlock(&w->lock);
			for (size_t i = 0; i < n; i++)
				if (made[i])
					pool_drop_warm(made[i]);
			return;
		}
		w->queue = q;
		w->capqueue = cap;
	}
	for (size_t i = 0; i < n; i++)
		if (made[i])
			w->queue[w->nqueue++] = made[i];
	if (r < 0)
		w->stop = true;
	w->sent++;
	pthread_mutex_unlock(&w->lock);
}

/* Until the loop has taken every batch handed over (or wants no more). */
static void wait_taken(struct warmup *w)
{
	pthread_mutex_lock(&w->lock);
	while (!w->stop && w->taken < w->sent)
		pthread_cond_wait(&w->cond, &w->lock);
	pthread_mutex_unlock(&w->lock);
}

/* A test delay (WARMUP_DELAY_ENV, WARMUP_HOLD_ENV): sleep ms, or less when the loop stops the warm-up. */
static void test_delay(struct warmup *w, unsigned ms)
{
	struct timespec ts;

	if (ms == 0)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&w->lock);
	while (!w->stop && pthread_cond_timedwait(&w->cond, &w->lock, &ts) == 0)
		;
	pthread_mutex_unlock(&w->lock);
}

static void *warmup_thread(void *arg)
{
	struct warmup *w = arg;
	struct chunk **made = NULL;
	size_t cap = 0, per_batch = pool_threads(w->pool);

	for (size_t j = 0; j < w->njobs && !stopping(w); j++) {
		const struct warmup_job *job = &w->jobs[j];

		for (size_t i = 0; i < job->n && !stopping(w);) {
			uint64_t bytes = 0;
			size_t k = 0;
			int r;

			/* A chunk a thread, at least the batch's bytes, at most its cap (sizes are largest first). */
			while (i + k < job->n && (k < per_batch || bytes < WARMUP_BATCH_MIN_BYTES) &&
			       (k == 0 || bytes + job->sizes[i + k] <= w->batch_max_bytes))
				bytes += job->sizes[i + k++];
			if (k > cap) {
				struct chunk **v = realloc(made, k * sizeof(*v));

				if (!v) {
					hand_over(w, made, 0, -ENOMEM);
					goto out;
				}
				made = v;
				cap = k;
			}
			r = pool_make_warm(w->pool, job->sizes + i, k, job->node, made, NULL, NULL);
			test_delay(w, w->hold_ms);
			hand_over(w, made, k, r);
			ev_async_send(w->loop, &w->async);
			wait_taken(w);
			i += k;
			test_delay(w, w->delay_ms);
		}
	}
out:
	free(made);
	pthread_mutex_lock(&w->lock);
	w->finished = true;
	pthread_mutex_unlock(&w->lock);
	ev_async_send(w->loop, &w->async);
	return NULL;
}

/* Loop: take what the thread made into the pool, as far as the hooks admit it. */
static void warmup_async_cb(struct ev_loop *loop, ev_async *a, int revents)
{
	struct warmup *w = a->data;
	struct chunk **q;
	uint64_t sent;
	size_t n;
	bool finished, grew = false;
	int err;

	(void)revents;
	pthread_mutex_lock(&w->lock);
	q = w->queue;
	n = w->nqueue;
	w->queue = NULL;
	w->nqueue = w->capqueue = 0;
	finished = w->finished;
	err = w->error;
	sent = w->sent;
	pthread_mutex_unlock(&w->lock);

	for (size_t i = 0; i < n; i++) {
		uint64_t bytes = q[i]->bytes;

		if (!stopping(w) && w->hooks.admit(bytes, w->hooks.ud)) {
			pool_add_warm(w->pool, q[i]);
			w->added += bytes;
			grew = true;
			continue;
		}
		pthread_mutex_lock(&w->lock);
		w->stop = true;
		pthread_cond_broadcast(&w->cond);
		pthread_mutex_unlock(&w->lock);
		pool_drop_warm(q[i]);
	}
	free(q);
	/* Taken only now, after the admission decided stop: the thread's next batch sees it. */
	pthread_mutex_lock(&w->lock);
	w->taken = sent;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	if (grew && w->hooks.grown)
		w->hooks.grown(w->hooks.ud);
	if (finished && !w->over) {
		pthread_join(w->thread, NULL);
		w->started = false;
		w->over = true;
		ev_async_stop(loop, &w->async);
		if (w->hooks.done)
			w->hooks.done(w->added, now_us() - w->t0_us, err, w->hooks.ud);
	}
}

/*
 * The jobs: each node's share (a list larger than bytes is cut), then a top-up on any node so the idle pool
 * ends at least bytes warm, as without NUMA (pool_warm_plan counts the idle chunks there are, not these).
 */
static int plan(struct pool *p, uint64_t bytes, const int *nodes, const uint64_t *split, size_t n,
		struct warmup_job **ret, size_t *nret)
{
	uint64_t left = bytes, planned = 0;
	struct warmup_job *jobs;
	size_t nj = 0;
	int r = 0;

	jobs = calloc(n + 1, sizeof(*jobs));
	if (!jobs)
		return -ENOMEM;
	for (size_t i = 0; i < n && r == 0; i++) {
		uint64_t want = split[i] < left ? split[i] : left;

		left -= want;
		jobs[nj].node = nodes[i];
		r = want ? pool_warm_plan(p, want, nodes[i], &jobs[nj].sizes, &jobs[nj].n) : 0;
		for (size_t k = 0; k < jobs[nj].n; k++)
			planned += jobs[nj].sizes[k];
		nj++;
	}
	if (r == 0 && planned < bytes) {
		jobs[nj].node = -1;
		r = pool_warm_plan(p, bytes - planned, -1, &jobs[nj].sizes, &jobs[nj].n);
		nj++;
	}
	*ret = jobs;
	*nret = nj;
	return r;
}

int warmup_start(struct ev_loop *loop, struct pool *p, uint64_t bytes, const int *nodes, const uint64_t *split,
		 size_t n, uint64_t batch_max_bytes, const struct warmup_hooks *hooks, struct warmup **ret)
{
	struct warmup *w;
	int r;

	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->over = true; /* until the thread runs: warmup_free has nothing to join */
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	r = plan(p, bytes, nodes, split, n, &w->jobs, &w->njobs);
	if (r < 0) {
		warmup_free(w);
		return r;
	}
	w->loop = loop;
	w->pool = p;
	w->hooks = *hooks;
	w->t0_us = now_us();
	w->batch_max_bytes = batch_max_bytes;
	w->delay_ms = timer_clock_stall_ms(WARMUP_DELAY_ENV);
	w->hold_ms = timer_clock_stall_ms(WARMUP_HOLD_ENV);
	ev_async_init(&w->async, warmup_async_cb);
	w->async.data = w;
	ev_async_start(loop, &w->async);
	r = pthread_create(&w->thread, NULL, warmup_thread, w);
	if (r != 0) {
		warmup_free(w);
		return -r;
	}
	w->started = true;
	w->over = false;
	*ret = w;
	return 0;
}

bool warmup_running(const struct warmup *w)
{
	return w && !w->over;
}

void warmup_free(struct warmup *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	if (w->started)
		pthread_join(w->thread, NULL);
	if (w->loop && ev_is_active(&w->async))
		ev_async_stop(w->loop, &w->async);
	/* Made but never handed over: in no book of the pool, nowhere but here. */
	for (size_t i = 0; i < w->nqueue; i++)
		pool_drop_warm(w->queue[i]);
	free(w->queue);
	for (size_t j = 0; j < w->njobs; j++)
		free(w->jobs[j].sizes);
	free(w->jobs);
	pthread_cond_destroy(&w->cond);
	pthread_mutex_destroy(&w->lock);
	free(w);
}

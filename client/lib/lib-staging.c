/* SPDX-License-Identifier: MIT */
/* Staged copies: the pipelined copy through the ring (staging.h) and the public pb_copy_* calls. */
#define _GNU_SOURCE
#include "lib-staging-int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cuda.h"
#include "pinbroker-internal.h"
#include "util.h"

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Under ring_lock: wait until the GPU is done with slot s (its last copy's event), so it may be filled again. */
static int slot_wait(struct staging_slot *s)
{
	int r;

	if (!s->pending)
		return 0;
	r = pbcuda_event_sync(s->pending);
	s->pending = NULL;
	/*
	 * The event's context is gone (the program destroyed or reset it): so is the copy it marked, and the slot
	 * is free. That is no error of this copy's.
	 */
	if (r == PBCU_INVALID_HANDLE || r == PBCU_CONTEXT_IS_DESTROYED || r == PBCU_INVALID_CONTEXT)
		return 0;
	return r;
}

/* Under ring_lock: s's GPU copy was just queued on stream; mark it with the slot's event. */
static int slot_mark(struct staging_slot *s, void *ev, void *ctx, void *stream)
{
	int r = pbcuda_event_record(ev, stream);

	if (r != 0) {
		/*
		 * The copy is queued but cannot be waited for alone: wait for the whole stream, so the slot is free.
		 * The copy is good if the stream is: the broker's own event failing is no error of the program's.
		 */
		return pbcuda_stream_sync(stream);
	}
	s->pending = ev;
	s->pending_ctx = ctx;
	return 0;
}

static uint8_t *slot_data(const struct pbst_state *st, unsigned slot)
{
	return st->ring_base + (size_t)slot * st->slot_bytes;
}

/* The daemon revoked the ring: the copy in flight leaves the rest to the driver, so the ring goes in time. */
static bool ring_going(struct pbst_state *st)
{
	return __atomic_load_n(&st->going, __ATOMIC_ACQUIRE);
}

/*
 * Host to device: fill each slot (the threads together) once the GPU is done with it, then queue its copy to the
 * device and its event on stream. Returns when the last slot is filled: src may be reused, the GPU may still copy
 * (as the driver's own staging does for pageable memory). *staged: the bytes that went through the ring; after a
 * revoke the driver copies the rest, queued behind them on the stream. The first failing call's CUresult, or 0.
 */
static int copy_h2d(struct pbst_state *st, uint64_t dst, const uint8_t *src, size_t bytes, void *stream, void *ctx,
		    void **ev, const struct pbst_settings *set, size_t *staged)
{
	size_t n = pbst_piece_count(bytes, st->slot_bytes);
	unsigned first = st->next_slot;
	int r = 0;

	*staged = 0;
	for (size_t k = 0; k < n && r == 0; k++) {
		struct pbst_piece p = pbst_piece_at(bytes, st->slot_bytes, st->nslots, first, k);
		struct staging_slot *s = &st->slots[p.slot];
		uint8_t *buf = slot_data(st, p.slot);

		if (ring_going(st)) {
			r = pbcuda_htod_async(dst + p.off, src + p.off, bytes - p.off, stream);
			n = k;
			break;
		}
		r = slot_wait(s);
		if (r != 0)
			break;
		staging_pool_copy(st, buf, src + p.off, p.bytes, pbst_split_threads(p.bytes, set->threads),
				  set->stream_h2d && bytes >= st->slot_bytes);
		r = pbcuda_htod_async(dst + p.off, buf, p.bytes, stream);
		if (r == 0)
			r = slot_mark(s, ev[p.slot], ctx, stream);
		if (r == 0)
			*staged += p.bytes;
	}
	st->next_slot = (unsigned)((first + n) % st->nslots);
	return r;
}

/*
 * Device to host: keep up to a ring of pieces queued (the GPU copies into slots), and take the oldest out as soon
 * as its event says it is there. Returns when every byte is in dst. *staged as for copy_h2d: after a revoke no
 * more pieces are queued, those queued are taken out, and the driver copies the rest (into pageable memory, it
 * returns when done). The first failing call's CUresult, or 0; on a failure the pieces still queued are waited
 * for, so no slot is left in the GPU's hands.
 */
static int copy_d2h(struct pbst_state *st, uint8_t *dst, uint64_t src, size_t bytes, void *stream, void *ctx, void **ev,
		    const struct pbst_settings *set, size_t *staged)
{
	size_t n = pbst_piece_count(bytes, st->slot_bytes), issued = 0, done = 0;
	unsigned first = st->next_slot;
	int r = 0;

	*staged = 0;
	while (done < n) {
		if (r == 0 && issued < n && ring_going(st))
			n = issued;
		while (r == 0 && issued < n && issued - done < st->nslots) {
			struct pbst_piece p = pbst_piece_at(bytes, st->slot_bytes, st->nslots, first, issued);
			struct staging_slot *s = &st->slots[p.slot];

			r = slot_wait(s);
			if (r == 0)
				r = pbcuda_dtoh_async(slot_data(st, p.slot), src + p.off, p.bytes, stream);
			if (r == 0)
				r = slot_mark(s, ev[p.slot], ctx, stream);
			if (r == 0)
				issued++;
		}
		if (done == issued)
			break; /* failed, or revoked, before anything more was queued */
		{
			struct pbst_piece p = pbst_piece_at(bytes, st->slot_bytes, st->nslots, first, done);
			struct staging_slot *s = &st->slots[p.slot];
			int w = slot_wait(s);

			if (r == 0 && w != 0)
				r = w;
			if (r == 0) {
				staging_pool_copy(st, dst + p.off, slot_data(st, p.slot), p.bytes,
						  pbst_split_threads(p.bytes, set->threads),
						  set->stream_d2h && bytes >= st->slot_bytes);
				*staged += p.bytes;
			}
			done++;
		}
	}
	st->next_slot = (unsigned)((first + issued) % st->nslots);
	if (r == 0 && *staged < bytes)
		r = pbcuda_dtoh_async(dst + *staged, src + *staged, bytes - *staged, stream);
	return r;
}

/* What the driver says of dst and src and the stream, for pbst_decide. 0, or the first failing call's CUresult. */
static int gather_facts(struct pbst_copy_facts *f, void *dst, const void *src, void *stream)
{
	int r = pbcuda_pointer_facts(dst, &f->dst.memory_type, &f->dst.managed);

	if (r == 0)
		r = pbcuda_pointer_facts(src, &f->src.memory_type, &f->src.managed);
	if (r == 0)
		r = pbcuda_stream_capturing(stream, &f->capturing);
	return r;
}

/* Count a copy the ring should have taken but the driver did. */
static void count_driver_copy(struct pbst_state *st)
{
	pthread_mutex_lock(&st->lock);
	st->stats.driver_copies++;
	st->reported = true;
	pthread_mutex_unlock(&st->lock);
}

bool pbst_copy(pb_client *c, void *dst, const void *src, size_t bytes, void *stream, unsigned flags, int *cu)
{
	struct pbst_copy_facts f = { .flags = flags, .bytes = bytes };
	struct pbst_state *st;
	struct pbst_settings set;
	enum pbst_verdict v;
	void *ctx = NULL, *sctx = NULL, **ev;
	size_t staged = 0;
	uint64_t t0;
	int r;

	if (!c)
		return false;
	st = staging_state(c);
	/* The common small copy costs two atomic loads: no lock, no driver call. */
	if (!st || bytes < __atomic_load_n(&st->min_bytes, __ATOMIC_ACQUIRE))
		return false;
	pthread_mutex_lock(&st->lock);
	set = st->set;
	pthread_mutex_unlock(&st->lock);
	if (!pbst_size_qualifies(&set, bytes) || !pbcuda_staging_available(NULL))
		return false;
	if (!stream && (flags & PBST_PTDS))
		stream = pbcuda_per_thread_stream();
	if (gather_facts(&f, dst, src, stream) != 0)
		return false;
	v = pbst_decide(&set, &f);
	if (v != PBST_STAGE_H2D && v != PBST_STAGE_D2H)
		return false;
	/* Events are recorded in the stream's context: it must be the calling thread's current one. */
	if (pbcuda_ctx_current(&ctx) != 0 || !ctx || pbcuda_stream_ctx(stream, &sctx) != 0 || sctx != ctx) {
		count_driver_copy(st);
		return false;
	}
	/* Another thread's copy holds the ring: the driver copies this one rather than anyone waiting. */
	if (pthread_mutex_trylock(&st->ring_lock) != 0) {
		count_driver_copy(st);
		return false;
	}
	if (staging_ring_take(st) < 0 || !(ev = staging_events(st, ctx))) {
		staging_ring_unlock(st);
		count_driver_copy(st);
		return false;
	}
	if (set.threads > 1 && staging_pool_start(st) < 0)
		set.threads = st->pool.n + 1; /* copy with the threads there are */

	t0 = mono_ns();
	/*
	 * A synchronous copy from pageable memory to the device (cuMemcpyHtoD, cudaMemcpy) first synchronises its
	 * stream, as CUDA's does: work queued before it has finished when it returns.
	 */
	r = (flags & PBST_SYNC) && v == PBST_STAGE_H2D ? pbcuda_stream_sync(stream) : 0;
	if (r == 0 && v == PBST_STAGE_H2D)
		r = copy_h2d(st, (uint64_t)(uintptr_t)dst, src, bytes, stream, ctx, ev, &set, &staged);
	else if (r == 0)
		r = copy_d2h(st, dst, (uint64_t)(uintptr_t)src, bytes, stream, ctx, ev, &set, &staged);

	pthread_mutex_lock(&st->lock);
	if (v == PBST_STAGE_H2D) {
		st->stats.h2d_bytes += staged;
		st->stats.h2d_copies++;
	} else {
		st->stats.d2h_bytes += staged;
		st->stats.d2h_copies++;
	}
	st->stats.busy_ns += mono_ns() - t0;
	st->reported = true;
	pthread_mutex_unlock(&st->lock);
	staging_ring_unlock(st);
	staging_report(st, false);
	*cu = r;
	return true;
}

/* The driver's copy, for pb_copy_*: a failure as -EIO, naming the call and the driver's words. */
static int driver_result(int r, const char *call)
{
	if (r == 0)
		return 0;
	return err_set(-EIO, "%s failed: %s (CUDA error %d)", call, pbcuda_result_text(r), r);
}

/* pb_copy_* need the driver whether they stage or not: -ENODEV without it. */
static int need_driver(const char *call, const void *host, uint64_t dptr, size_t bytes)
{
	const char *why = NULL;

	if (bytes > 0 && (!host || !dptr))
		return err_set(-EINVAL, "%s: a NULL pointer for %zu bytes", call, bytes);
	if (!pbcuda_staging_available(&why))
		return err_set(-ENODEV, "%s: no usable CUDA driver here: %s", call, why ? why : "unknown reason");
	return 0;
}

int pb_copy_to_device(pb_client *c, uint64_t dptr, const void *src, size_t bytes, void *stream)
{
	int r = need_driver("pb_copy_to_device", src, dptr, bytes), cu;

	if (r < 0 || bytes == 0)
		return r;
	if (pbst_copy(c, (void *)(uintptr_t)dptr, src, bytes, stream, PBST_H2D, &cu))
		return driver_result(cu, "a staged copy to the device");
	/*
	 * The driver's own: from pageable memory it returns once src is staged (as above); from pinned or registered
	 * memory it returns at once and reads src while the copy runs on the stream, as cuMemcpyHtoDAsync does.
	 */
	return driver_result(pbcuda_htod_async(dptr, src, bytes, stream), "cuMemcpyHtoDAsync");
}

int pb_copy_from_device(pb_client *c, void *dst, uint64_t dptr, size_t bytes, void *stream)
{
	int r = need_driver("pb_copy_from_device", dst, dptr, bytes), cu;

	if (r < 0 || bytes == 0)
		return r;
	if (pbst_copy(c, dst, (void *)(uintptr_t)dptr, bytes, stream, PBST_D2H, &cu))
		return driver_result(cu, "a staged copy from the device");
	/*
	 * Return only with the data in dst. On the legacy default stream the synchronous cuMemcpyDtoH does that for
	 * pageable and pinned memory alike. On another stream cuMemcpyDtoHAsync returns at once for pinned dst, so
	 * wait for the stream (the copy and what was queued on it before; work queued later by other threads too).
	 */
	if (!stream)
		return driver_result(pbcuda_dtoh(dst, dptr, bytes), "cuMemcpyDtoH");
	r = driver_result(pbcuda_dtoh_async(dst, dptr, bytes, stream), "cuMemcpyDtoHAsync");
	if (r < 0)
		return r;
	return driver_result(pbcuda_stream_sync(stream), "cuStreamSynchronize");
}

int pb_staging_configure(pb_client *c, const struct pb_staging_opts *opts)
{
	struct pbst_state *st;
	char why[256];
	int r;

	if (!c || !opts)
		return err_set(-EINVAL, "pb_staging_configure: %s is NULL", c ? "opts" : "the client");
	st = staging_state(c);
	if (!st)
		return err_set(-ENOMEM, "out of memory");
	/* ring_lock: no copy is using the ring or the threads meanwhile. */
	if (pthread_mutex_trylock(&st->ring_lock) != 0)
		return err_set(-EBUSY, "pb_staging_configure: a staged copy is running; configure before the first");
	pthread_mutex_lock(&st->lock);
	if (st->ring) {
		pthread_mutex_unlock(&st->lock);
		staging_ring_unlock(st); /* a revoke that came meanwhile is carried out */
		return err_set(-EBUSY,
			       "pb_staging_configure: a staging ring of %zu bytes is held; configure before "
			       "the first staged copy",
			       (size_t)st->stats.ring_bytes);
	}
	r = pbst_settings_apply(&st->set, opts, why, sizeof(why));
	if (r == 0)
		staging_settings_changed_locked(st);
	pthread_mutex_unlock(&st->lock);
	/* Fewer threads than are running: stop them; the next copy starts as many as it wants. */
	if (r == 0 && st->pool.n + 1 > st->set.threads)
		staging_pool_stop(st);
	staging_ring_unlock(st);
	if (r < 0)
		return err_set(r, "pb_staging_configure: %s", why);
	return 0;
}

int pb_staging_stats(pb_client *c, struct pb_staging_stats *out)
{
	struct pbst_state *st;

	if (!c || !out)
		return err_set(-EINVAL, "pb_staging_stats: %s is NULL", c ? "out" : "the client");
	st = __atomic_load_n(&c->staging, __ATOMIC_ACQUIRE);
	if (!st) {
		memset(out, 0, sizeof(*out));
		return 0;
	}
	pthread_mutex_lock(&st->lock);
	*out = st->stats;
	pthread_mutex_unlock(&st->lock);
	return 0;
}

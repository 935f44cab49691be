/* SPDX-License-Identifier: MIT */
/*
 * The stand-in libcuda.so.1's device memory, streams, events and copies (part of stub_cuda.c's library), with
 * CUDA's semantics for pageable memory, so the staged copies (issue 39) can be checked on machines without a GPU:
 * - device memory (cuMemAlloc_v2, cuMemAllocManaged) is host memory the driver tracks, so pointer attributes know
 *   it; a program that synchronised may read it directly (a test's independent check of what a copy wrote);
 * - every stream runs its work on a thread of its own, in order, STUB_CUDA_STREAM_DELAY_US (or
 *   stub_cuda_set_stream_delay_us) microseconds before each operation: code that reuses a buffer before its copy
 *   ran, or reads one before it is written, sees the wrong bytes. Stream 0 and CU_STREAM_LEGACY are the legacy
 *   stream, which waits for every blocking stream's earlier work and they for its; CU_STREAM_PER_THREAD is the
 *   calling thread's own stream;
 * - a copy whose host side is pageable returns, host to device, once the source has been copied away (the DMA
 *   may still run), device to host once the data is in place, sync and async forms alike; with pinned or
 *   registered host memory an async copy runs later on the stream's thread, reading and writing the host memory
 *   then, and a sync one waits for it;
 * - a stream being captured records its work (counted), runs none of it;
 * - every copy call is logged by the kind of its host side (stub_cuda_copy_get_stats);
 * - STUB_CUDA_COPY_FAIL_AT=N (read at each call) makes the process's Nth copy call fail with
 *   CUDA_ERROR_ILLEGAL_ADDRESS, N+ every call from the Nth on (sticky, as the real error is); a device pointer the
 *   driver does not know gets CUDA_ERROR_INVALID_VALUE;
 * - stub_cuda_copy_gate(1) holds every stream before its next copy until stub_cuda_copy_gate(0): a test's way to
 *   have a copy in the middle for as long as it needs (revocation).
 * After fork() the child's streams are empty and idle, their threads started again on first use.
 */
#define _GNU_SOURCE
#include "stub_cuda.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "stub_cuda_copy.h"

/* ---- Device memory ---- */

struct dev {
	uintptr_t p;
	size_t bytes;
	bool managed;
	CUcontext ctx;
};

static pthread_mutex_t dlock = PTHREAD_MUTEX_INITIALIZER;
static struct dev devs[4096];
static size_t n_devs;

/* The device allocation holding [p, p + n) (n 0: holding p), copied to *out. */
static bool dev_find(uintptr_t p, size_t n, struct dev *out)
{
	bool found = false;

	pthread_mutex_lock(&dlock);
	for (size_t i = 0; i < n_devs && !found; i++)
		if (p - devs[i].p < devs[i].bytes && (n == 0 || n <= devs[i].bytes - (p - devs[i].p))) {
			*out = devs[i];
			found = true;
		}
	pthread_mutex_unlock(&dlock);
	return found;
}

static CUcontext current_ctx(void)
{
	CUcontext c = NULL;

	cuCtxGetCurrent(&c);
	return c;
}

static CUresult dev_alloc(CUdeviceptr *dptr, size_t bytes, bool managed)
{
	CUcontext ctx = current_ctx();
	void *p;

	if (!ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!dptr || bytes == 0)
		return CUDA_ERROR_INVALID_VALUE;
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&dlock);
	if (n_devs == sizeof(devs) / sizeof(devs[0])) {
		pthread_mutex_unlock(&dlock);
		munmap(p, bytes);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	devs[n_devs++] = (struct dev){ (uintptr_t)p, bytes, managed, ctx };
	pthread_mutex_unlock(&dlock);
	*dptr = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

STUB CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
	return dev_alloc(dptr, bytes, false);
}

STUB CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned flags)
{
	(void)flags;
	return dev_alloc(dptr, bytes, true);
}

CUresult cuCtxSynchronize(void);

/* cuMemFree of an allocation of cuMemAlloc (after the device's work, as the real one waits), else a pool's. */
STUB CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	struct dev d;
	bool found = false;

	if (!dev_find((uintptr_t)dptr, 0, &d) || d.p != (uintptr_t)dptr)
		return cuMemFreeAsync(dptr, NULL);
	cuCtxSynchronize();
	pthread_mutex_lock(&dlock);
	for (size_t i = 0; i < n_devs; i++)
		if (devs[i].p == (uintptr_t)dptr) {
			devs[i] = devs[--n_devs];
			found = true;
			break;
		}
	pthread_mutex_unlock(&dlock);
	if (found)
		munmap((void *)(uintptr_t)dptr, d.bytes);
	return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- Pointer attributes ---- */

/* One attribute of ptr into data; false for an attribute this stand-in does not know. */
static bool attribute(int attr, void *data, uintptr_t ptr, bool *known)
{
	struct dev d;
	bool dev = dev_find(ptr, 0, &d), host = !dev && stub_cuda_host_pinned(ptr);

	*known = dev || host;
	switch (attr) {
	case ATTR_CONTEXT:
		*(CUcontext *)data = dev ? d.ctx : host ? current_ctx() : NULL;
		return true;
	case ATTR_MEMORY_TYPE:
		*(unsigned *)data = dev ? MEMORYTYPE_DEVICE : host ? MEMORYTYPE_HOST : 0;
		return true;
	case ATTR_IS_MANAGED:
		*(unsigned *)data = dev && d.managed;
		return true;
	case ATTR_DEVICE_ORDINAL:
		*(int *)data = dev || host ? 0 : -2;
		return true;
	default:
		return false;
	}
}

/* The one-attribute form answers CUDA_ERROR_INVALID_VALUE for a pointer the driver does not know. */
STUB CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr ptr)
{
	unsigned char scratch[sizeof(void *)];
	bool known;

	if (!data || !attribute(attr, scratch, (uintptr_t)ptr, &known) || !known)
		return CUDA_ERROR_INVALID_VALUE;
	attribute(attr, data, (uintptr_t)ptr, &known);
	return CUDA_SUCCESS;
}

/* The many-attribute form gives zeros (NULL) for an unknown pointer, and CUDA_SUCCESS, as the real one does. */
STUB CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr ptr)
{
	bool known;

	if (!attrs || !data)
		return CUDA_ERROR_INVALID_VALUE;
	for (unsigned i = 0; i < n; i++)
		if (!data[i] || !attribute(attrs[i], data[i], (uintptr_t)ptr, &known))
			return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

/* ---- Streams ---- */

enum op_kind { OP_COPY, OP_FILL, OP_ADD, OP_WAIT };

struct op {
	enum op_kind kind;
	void *dst;
	const void *src;
	size_t n;
	unsigned char byte;
	void *owned;       /* freed once run: a pageable source copied away */
	struct stream *on; /* OP_WAIT: until on->done reaches seq */
	uint64_t seq;
	struct op *next;
};

struct stream {
	bool legacy, nonblocking, destroyed, running, capturing;
	CUcontext ctx;
	pthread_t thread;
	struct op *head, *tail;
	uint64_t submitted, done; /* operations handed in, operations finished (waits included) */
	struct stream *next;      /* every stream ever made, kept so events may still name a destroyed one */
};

struct CUevent_st {
	struct stream *s; /* NULL: never recorded (complete) */
	uint64_t seq;
	CUcontext ctx;
};

static pthread_mutex_t slock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t scond = PTHREAD_COND_INITIALIZER;
static struct stream legacy_stream = { .legacy = true };
static struct stream *streams = &legacy_stream;
static __thread struct stream *per_thread;
static atomic_uint delay_us;
static atomic_int gate_closed, gate_waiting;
static struct stub_cuda_copy_stats cstats;

STUB void stub_cuda_set_stream_delay_us(unsigned us)
{
	atomic_store(&delay_us, us);
}

STUB void stub_cuda_copy_gate(int closed)
{
	pthread_mutex_lock(&slock);
	atomic_store(&gate_closed, closed);
	pthread_cond_broadcast(&scond);
	pthread_mutex_unlock(&slock);
}

STUB int stub_cuda_copy_gate_waiting(void)
{
	return atomic_load(&gate_waiting);
}

STUB void stub_cuda_copy_get_stats(struct stub_cuda_copy_stats *s)
{
	pthread_mutex_lock(&slock);
	*s = cstats;
	pthread_mutex_unlock(&slock);
}

static void run_op(struct op *op)
{
	unsigned char *d = op->dst;

	switch (op->kind) {
	case OP_COPY:
		memcpy(op->dst, op->src, op->n);
		break;
	case OP_FILL:
		memset(op->dst, op->byte, op->n);
		break;
	case OP_ADD:
		for (size_t i = 0; i < op->n; i++)
			d[i] = (unsigned char)(d[i] + op->byte);
		break;
	case OP_WAIT:
		break;
	}
}

static void *stream_main(void *arg)
{
	struct stream *s = arg;

	pthread_mutex_lock(&slock);
	for (;;) {
		struct op *op;

		while (!s->head && !s->destroyed)
			pthread_cond_wait(&scond, &slock);
		if (!s->head)
			break;
		op = s->head;
		if (op->kind == OP_WAIT) {
			while (op->on->done < op->seq)
				pthread_cond_wait(&scond, &slock);
		} else {
			unsigned us = atomic_load(&delay_us);

			if (op->kind == OP_COPY && atomic_load(&gate_closed)) {
				atomic_fetch_add(&gate_waiting, 1);
				while (atomic_load(&gate_closed))
					pthread_cond_wait(&scond, &slock);
				atomic_fetch_sub(&gate_waiting, 1);
			}
			pthread_mutex_unlock(&slock);
			if (us)
				usleep(us);
			run_op(op);
			pthread_mutex_lock(&slock);
		}
		s->head = op->next;
		if (!s->head)
			s->tail = NULL;
		s->done++;
		pthread_cond_broadcast(&scond);
		free(op->owned);
		free(op);
	}
	s->running = false;
	pthread_mutex_unlock(&slock);
	return NULL;
}

/* Append op to s. Under slock. */
static void append(struct stream *s, struct op *op)
{
	op->next = NULL;
	if (s->tail)
		s->tail->next = op;
	else
		s->head = op;
	s->tail = op;
	s->submitted++;
	if (!s->running) {
		pthread_attr_t a;

		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		s->running = pthread_create(&s->thread, &a, stream_main, s) == 0;
		pthread_attr_destroy(&a);
		if (!s->running)
			abort(); /* a stand-in that cannot run its streams would make every test meaningless */
	}
}

/* A wait on t's work handed in so far, put on s, when t has some left. Under slock. */
static void wait_for(struct stream *s, struct stream *t)
{
	struct op *w;

	if (t == s || t->done >= t->submitted || !(w = calloc(1, sizeof(*w))))
		return;
	*w = (struct op){ .kind = OP_WAIT, .on = t, .seq = t->submitted };
	append(s, w);
}

/*
 * Hand op to s, after the legacy stream's implicit waits: the legacy stream waits for every blocking stream's
 * earlier work, and a blocking stream for the legacy stream's. Returns false when s is being captured: then op
 * is recorded, not run, and freed.
 */
static bool submit(struct stream *s, struct op *op)
{
	pthread_mutex_lock(&slock);
	if (s->capturing) {
		pthread_mutex_unlock(&slock);
		free(op->owned);
		free(op);
		return false;
	}
	if (s->legacy) {
		for (struct stream *t = streams; t; t = t->next)
			if (!t->nonblocking)
				wait_for(s, t);
	} else if (!s->nonblocking) {
		wait_for(s, &legacy_stream);
	}
	append(s, op);
	pthread_cond_broadcast(&scond);
	pthread_mutex_unlock(&slock);
	return true;
}

/* Wait until s has done its work up to seq (0: all handed in so far). */
static void wait_done(struct stream *s, uint64_t seq)
{
	pthread_mutex_lock(&slock);
	if (seq == 0)
		seq = s->submitted;
	while (s->done < seq)
		pthread_cond_wait(&scond, &slock);
	pthread_mutex_unlock(&slock);
}

/* The stream a handle names (ptds: the handle 0 is the caller's per-thread stream), or NULL. */
static struct stream *resolve(struct stream *h, bool ptds)
{
	struct stream *found = NULL;

	if (h == CU_STREAM_LEGACY || (!h && !ptds))
		return &legacy_stream;
	if (h == CU_STREAM_PER_THREAD || !h) {
		if (!per_thread) {
			struct stream *s = calloc(1, sizeof(*s));

			if (!s)
				return NULL;
			pthread_mutex_lock(&slock);
			s->next = streams;
			streams = s;
			pthread_mutex_unlock(&slock);
			per_thread = s;
		}
		return per_thread;
	}
	pthread_mutex_lock(&slock);
	for (struct stream *t = streams; t; t = t->next)
		if (t == h && !t->destroyed)
			found = t;
	pthread_mutex_unlock(&slock);
	return found;
}

STUB CUresult cuStreamCreate(struct stream **ph, unsigned flags)
{
	struct stream *s;

	if (!ph)
		return CUDA_ERROR_INVALID_VALUE;
	if (!current_ctx())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!(s = calloc(1, sizeof(*s))))
		return CUDA_ERROR_OUT_OF_MEMORY;
	s->nonblocking = flags & CU_STREAM_NON_BLOCKING;
	s->ctx = current_ctx();
	pthread_mutex_lock(&slock);
	s->next = streams;
	streams = s;
	pthread_mutex_unlock(&slock);
	*ph = s;
	return CUDA_SUCCESS;
}

STUB CUresult cuStreamCreateWithPriority(struct stream **ph, unsigned flags, int priority)
{
	(void)priority;
	return cuStreamCreate(ph, flags);
}

/* Its work still runs; then its thread ends. The struct stays, for the events that name it. */
STUB CUresult cuStreamDestroy_v2(struct stream *h)
{
	struct stream *s = h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD || !h ? NULL : resolve(h, false);

	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&slock);
	s->destroyed = true;
	pthread_cond_broadcast(&scond);
	pthread_mutex_unlock(&slock);
	return CUDA_SUCCESS;
}

static CUresult stream_sync(struct stream *h, bool ptds)
{
	struct stream *s = resolve(h, ptds);

	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	if (s->capturing)
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	wait_done(s, 0);
	return CUDA_SUCCESS;
}

STUB CUresult cuStreamSynchronize(struct stream *h)
{
	return stream_sync(h, false);
}

STUB CUresult cuStreamSynchronize_ptsz(struct stream *h)
{
	return stream_sync(h, true);
}

STUB CUresult cuStreamQuery(struct stream *h)
{
	struct stream *s = resolve(h, false);
	bool idle;

	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&slock);
	idle = s->done >= s->submitted;
	pthread_mutex_unlock(&slock);
	return idle ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

/* Every stream's work handed in so far. */
STUB CUresult cuCtxSynchronize(void)
{
	pthread_mutex_lock(&slock);
	for (struct stream *t = streams; t; t = t->next) {
		uint64_t seq = t->submitted;

		while (t->done < seq)
			pthread_cond_wait(&scond, &slock);
	}
	pthread_mutex_unlock(&slock);
	return CUDA_SUCCESS;
}

/* ---- Stream capture ---- */

static CUresult begin_capture(struct stream *h, bool ptds)
{
	struct stream *s = resolve(h, ptds);
	CUresult r = CUDA_SUCCESS;

	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&slock);
	if (s->legacy)
		r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	else if (s->capturing)
		r = CUDA_ERROR_ILLEGAL_STATE;
	else
		s->capturing = true;
	pthread_mutex_unlock(&slock);
	return r;
}

STUB CUresult cuStreamBeginCapture_v2(struct stream *h, int mode)
{
	(void)mode;
	return begin_capture(h, false);
}

STUB CUresult cuStreamBeginCapture_v2_ptsz(struct stream *h, int mode)
{
	(void)mode;
	return begin_capture(h, true);
}

STUB CUresult cuStreamBeginCapture(struct stream *h)
{
	return begin_capture(h, false);
}

static CUresult end_capture(struct stream *h, void **graph, bool ptds)
{
	struct stream *s = resolve(h, ptds);
	bool was;

	if (!s || !graph)
		return s ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&slock);
	was = s->capturing;
	s->capturing = false;
	pthread_mutex_unlock(&slock);
	if (!was)
		return CUDA_ERROR_ILLEGAL_STATE;
	return cuGraphCreate(graph, 0);
}

STUB CUresult cuStreamEndCapture(struct stream *h, void **graph)
{
	return end_capture(h, graph, false);
}

STUB CUresult cuStreamEndCapture_ptsz(struct stream *h, void **graph)
{
	return end_capture(h, graph, true);
}

static CUresult is_capturing(struct stream *h, int *status, bool ptds)
{
	struct stream *s = resolve(h, ptds);

	if (!s || !status)
		return s ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&slock);
	*status = s->capturing; /* CU_STREAM_CAPTURE_STATUS_NONE 0, _ACTIVE 1 */
	pthread_mutex_unlock(&slock);
	return CUDA_SUCCESS;
}

STUB CUresult cuStreamIsCapturing(struct stream *h, int *status)
{
	return is_capturing(h, status, false);
}

STUB CUresult cuStreamIsCapturing_ptsz(struct stream *h, int *status)
{
	return is_capturing(h, status, true);
}

/* ---- Events ---- */

STUB CUresult cuEventCreate(struct CUevent_st **pe, unsigned flags)
{
	CUcontext ctx = current_ctx();

	(void)flags;
	if (!pe)
		return CUDA_ERROR_INVALID_VALUE;
	if (!ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!(*pe = calloc(1, sizeof(**pe))))
		return CUDA_ERROR_OUT_OF_MEMORY;
	(*pe)->ctx = ctx;
	return CUDA_SUCCESS;
}

/* An event marks the stream's work handed in so far; on a stream being captured it marks nothing here. */
static CUresult event_record(struct CUevent_st *e, struct stream *h, bool ptds)
{
	struct stream *s = resolve(h, ptds);

	if (!e || !s)
		return CUDA_ERROR_INVALID_HANDLE;
	/* An event and the stream it is recorded on belong to one context. */
	if (e->ctx != (s->ctx ? s->ctx : current_ctx()))
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&slock);
	if (!s->capturing) {
		e->s = s;
		e->seq = s->submitted;
	}
	pthread_mutex_unlock(&slock);
	return CUDA_SUCCESS;
}

STUB CUresult cuEventRecord(struct CUevent_st *e, struct stream *h)
{
	return event_record(e, h, false);
}

STUB CUresult cuEventRecord_ptsz(struct CUevent_st *e, struct stream *h)
{
	return event_record(e, h, true);
}

STUB CUresult cuEventQuery(struct CUevent_st *e)
{
	bool done;

	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&slock);
	done = !e->s || e->s->done >= e->seq;
	pthread_mutex_unlock(&slock);
	return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

STUB CUresult cuEventSynchronize(struct CUevent_st *e)
{
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	if (e->s)
		wait_done(e->s, e->seq);
	return CUDA_SUCCESS;
}

STUB CUresult cuEventDestroy_v2(struct CUevent_st *e)
{
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	free(e);
	return CUDA_SUCCESS;
}

static CUresult wait_event(struct stream *h, struct CUevent_st *e, bool ptds)
{
	struct stream *s = resolve(h, ptds);
	struct op *w;

	if (!s || !e)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&slock);
	if (s->capturing || !e->s || e->s->done >= e->seq) {
		pthread_mutex_unlock(&slock);
		return CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&slock);
	if (!(w = calloc(1, sizeof(*w))))
		return CUDA_ERROR_OUT_OF_MEMORY;
	*w = (struct op){ .kind = OP_WAIT, .on = e->s, .seq = e->seq };
	submit(s, w);
	return CUDA_SUCCESS;
}

STUB CUresult cuStreamWaitEvent(struct stream *h, struct CUevent_st *e, unsigned flags)
{
	(void)flags;
	return wait_event(h, e, false);
}

STUB CUresult cuStreamWaitEvent_ptsz(struct stream *h, struct CUevent_st *e, unsigned flags)
{
	(void)flags;
	return wait_event(h, e, true);
}

/* ---- Kernels (test functions) ---- */

static CUresult launch(struct stream *h, CUdeviceptr dptr, unsigned char byte, size_t bytes, enum op_kind kind)
{
	struct stream *s = resolve(h, false);
	struct dev d;
	struct op *op;

	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!dev_find((uintptr_t)dptr, bytes, &d))
		return CUDA_ERROR_INVALID_VALUE;
	if (!(op = calloc(1, sizeof(*op))))
		return CUDA_ERROR_OUT_OF_MEMORY;
	*op = (struct op){ .kind = kind, .dst = (void *)(uintptr_t)dptr, .n = bytes, .byte = byte };
	pthread_mutex_lock(&slock);
	cstats.kernels++;
	pthread_mutex_unlock(&slock);
	submit(s, op);
	return CUDA_SUCCESS;
}

STUB CUresult stub_cuda_launch_fill(void *stream, CUdeviceptr dptr, int byte, size_t bytes)
{
	return launch(stream, dptr, (unsigned char)byte, bytes, OP_FILL);
}

STUB CUresult stub_cuda_launch_add(void *stream, CUdeviceptr dptr, int addend, size_t bytes)
{
	return launch(stream, dptr, (unsigned char)addend, bytes, OP_ADD);
}

/* ---- Copies ---- */

enum side { SIDE_PAGEABLE, SIDE_PINNED, SIDE_DEVICE, SIDE_MANAGED };

/* What the driver sees at [p, p + n). */
static enum side side_of(uintptr_t p, size_t n)
{
	struct dev d;

	if (dev_find(p, n, &d))
		return d.managed ? SIDE_MANAGED : SIDE_DEVICE;
	if (dev_find(p, 0, &d))
		return SIDE_DEVICE; /* starts in device memory, runs past its end: not a host range either */
	return stub_cuda_host_pinned(p) ? SIDE_PINNED : SIDE_PAGEABLE;
}

static bool is_host(enum side k)
{
	return k == SIDE_PAGEABLE || k == SIDE_PINNED;
}

/* The log's record of one call: by its host side (or none), and whether it ran. Under slock. */
static void log_copy(enum side dst, enum side src, size_t n, bool captured)
{
	bool h2d = is_host(src) && !is_host(dst), d2h = is_host(dst) && !is_host(src);
	enum side host = h2d ? src : dst;

	if (captured)
		cstats.captured_copies++;
	if (is_host(dst) && is_host(src)) {
		cstats.host_copies++;
	} else if ((h2d || d2h) && host == SIDE_PAGEABLE) {
		cstats.pageable_copies++;
		cstats.pageable_bytes += n;
		if (h2d)
			cstats.pageable_h2d_bytes += n;
		else
			cstats.pageable_d2h_bytes += n;
	} else if ((h2d || d2h) && host == SIDE_PINNED) {
		cstats.pinned_copies++;
		cstats.pinned_bytes += n;
	} else {
		cstats.device_copies++;
		cstats.device_bytes += n;
	}
}

/*
 * STUB_CUDA_COPY_FAIL_AT: whether the process's nth copy call is to fail: "N" fails the Nth call only, "N+" every
 * call from the Nth on (as a real CUDA_ERROR_ILLEGAL_ADDRESS is sticky: the context's later calls fail too).
 */
static bool fail_at(uint64_t nth)
{
	const char *v = getenv("STUB_CUDA_COPY_FAIL_AT");
	char *end;
	uint64_t at;

	if (!v || !*v)
		return false;
	at = strtoull(v, &end, 10);
	return *end == '+' ? nth >= at : nth == at;
}

CUresult stub_copy(void *dst, const void *src, size_t n, struct stream *h, unsigned how)
{
	enum side dk = side_of((uintptr_t)dst, n), sk = side_of((uintptr_t)src, n);
	bool h2d = is_host(sk) && !is_host(dk), d2h = is_host(dk) && !is_host(sk);
	struct stream *s;
	struct op *op;
	uint64_t nth;

	pthread_mutex_lock(&slock);
	nth = ++cstats.calls;
	pthread_mutex_unlock(&slock);
	if (fail_at(nth)) {
		pthread_mutex_lock(&slock);
		cstats.failed_calls++;
		pthread_mutex_unlock(&slock);
		return CUDA_ERROR_ILLEGAL_ADDRESS;
	}
	if (!current_ctx())
		return CUDA_ERROR_INVALID_CONTEXT;
	/* cuMemcpyHtoD needs device memory at dst (managed counts), cuMemcpyDtoH at src. */
	if (!dst || !src || ((how & COPY_H2D) && is_host(dk)) || ((how & COPY_D2H) && is_host(sk)) ||
	    (dk == SIDE_DEVICE && !dev_find((uintptr_t)dst, n, &(struct dev){ 0 })) ||
	    (sk == SIDE_DEVICE && !dev_find((uintptr_t)src, n, &(struct dev){ 0 }))) {
		pthread_mutex_lock(&slock);
		cstats.failed_calls++;
		pthread_mutex_unlock(&slock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (!(s = resolve(h, how & COPY_PTDS)))
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&slock);
	log_copy(dk, sk, n, s->capturing);
	pthread_mutex_unlock(&slock);
	if (n == 0)
		return CUDA_SUCCESS;
	if (is_host(dk) && is_host(sk)) {
		/* Host to host: fully synchronous. */
		wait_done(s, 0);
		memmove(dst, src, n);
		return CUDA_SUCCESS;
	}
	if (!(op = calloc(1, sizeof(*op))))
		return CUDA_ERROR_OUT_OF_MEMORY;
	*op = (struct op){ .kind = OP_COPY, .dst = dst, .src = src, .n = n };
	if (h2d && sk == SIDE_PAGEABLE) {
		/* Staged: the source is copied away now, and may be reused once this returns. */
		if (!(op->owned = malloc(n))) {
			free(op);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		memcpy(op->owned, src, n);
		op->src = op->owned;
		submit(s, op);
		return CUDA_SUCCESS;
	}
	if (submit(s, op) && ((d2h && dk == SIDE_PAGEABLE) || ((how & COPY_SYNC) && (h2d || d2h))))
		wait_done(s, 0);
	return CUDA_SUCCESS;
}

/* ---- Fork ---- */

static void before_fork(void)
{
	pthread_mutex_lock(&slock);
	pthread_mutex_lock(&dlock);
}

static void after_fork_parent(void)
{
	pthread_mutex_unlock(&dlock);
	pthread_mutex_unlock(&slock);
}

/*
 * The child has none of the stream threads: its streams start empty and idle (what was queued is dropped), and
 * the condition variable starts afresh (glibc's would wait for the parent's waiters, who are not here).
 */
static void after_fork_child(void)
{
	pthread_cond_init(&scond, NULL);
	for (struct stream *t = streams; t; t = t->next) {
		t->head = t->tail = NULL;
		t->done = t->submitted;
		t->running = false;
	}
	atomic_store(&gate_waiting, 0);
	pthread_mutex_unlock(&dlock);
	pthread_mutex_unlock(&slock);
}

__attribute__((constructor)) static void copy_init(void)
{
	const char *v = getenv("STUB_CUDA_STREAM_DELAY_US");

	if (v && *v)
		atomic_store(&delay_us, (unsigned)strtoul(v, NULL, 10));
	pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* SPDX-License-Identifier: MIT */
/*
 * copy_target's modes beyond the copies themselves (copy_target.c has the program's usage): pass-through of what
 * must reach the driver untouched, two contexts in turn, a failing copy's error, the revoke dialogue, hold, and
 * the stand-in driver's self-test.
 */
#define _GNU_SOURCE
#include "copy_target.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A copy that must reach the driver as made: one call of its kind in the log, n bytes, none staged. */
#define UNTOUCHED(field_copies, field_bytes, n, what)                                                          \
	CHECK(b.field_copies - a.field_copies == 1 && b.field_bytes - a.field_bytes == (n) &&                  \
		      (b.pinned_copies - a.pinned_copies) + (b.pageable_copies - a.pageable_copies) +          \
				      (b.device_copies - a.device_copies) + (b.host_copies - a.host_copies) == \
			      1,                                                                               \
	      "%s: the driver saw %llu pageable, %llu pinned, %llu device and %llu host copies", what,         \
	      (unsigned long long)(b.pageable_copies - a.pageable_copies),                                     \
	      (unsigned long long)(b.pinned_copies - a.pinned_copies),                                         \
	      (unsigned long long)(b.device_copies - a.device_copies),                                         \
	      (unsigned long long)(b.host_copies - a.host_copies))

/* The one copy between a and b reached the driver as made, logged by the kind of its host side. */
static void untouched_by_kind(const struct stub_cuda_copy_stats *pa, const struct stub_cuda_copy_stats *pb, size_t n,
			      const char *what, bool pinned_host, bool managed_host)
{
	struct stub_cuda_copy_stats a = *pa, b = *pb;

	if (managed_host)
		UNTOUCHED(device_copies, device_bytes, n, what);
	else if (pinned_host)
		UNTOUCHED(pinned_copies, pinned_bytes, n, what);
	else
		UNTOUCHED(pageable_copies, pageable_bytes, n, what);
}

/* Copy n bytes of src (of kind what) to the device and back through dst with form f, logging what the driver saw. */
static void pass_one(const char *what, unsigned char *src, unsigned char *dst, size_t n, enum form f, CUstream st,
		     bool pinned_host, bool managed_host)
{
	CUdeviceptr d = dev_alloc(n);
	struct stub_cuda_copy_stats a, b;
	size_t bad;

	fill_pat(src, n, 40 + f);
	memset(dst, 0, n);
	a = copy_stats();
	CHECK(h2d(f, d, src, n, st) == 0, "%s: H2D", what);
	b = copy_stats();
	untouched_by_kind(&a, &b, n, what, pinned_host, managed_host);
	CHECK(cu.ctx_sync() == 0, "synchronise");
	a = copy_stats();
	CHECK(d2h(f, dst, d, n, st) == 0, "%s: D2H", what);
	CHECK(cu.ctx_sync() == 0, "synchronise");
	b = copy_stats();
	untouched_by_kind(&a, &b, n, what, pinned_host, managed_host);
	bad = first_bad(dst, n, 40 + f, 0);
	CHECK(bad == n, "%s (%s): byte %zu differs", what, form_names[f], bad);
	cu.mem_free(d);
}

int mode_passthrough(void)
{
	size_t n = 3 * slot + 1, page = (size_t)sysconf(_SC_PAGESIZE), span = (n + page - 1) / page * page;
	CUstream st = stream_new();
	unsigned char *pinned = NULL, *pinned2 = NULL, *reg = NULL, *plain = malloc(n), *plain2 = malloc(n);
	CUdeviceptr managed = 0, managed2 = 0;
	struct stub_cuda_copy_stats a, b;
	CUresult r;

	CHECK(cu.host_alloc((void **)&pinned, n, 0) == 0 && cu.host_alloc((void **)&pinned2, n, 0) == 0,
	      "cuMemHostAlloc");
	CHECK(posix_memalign((void **)&reg, page, span) == 0 && cu.host_register(reg, span, 0) == 0,
	      "cuMemHostRegister");
	CHECK(cu.mem_alloc_managed(&managed, n, 1) == 0 && cu.mem_alloc_managed(&managed2, n, 1) == 0,
	      "cuMemAllocManaged");
	for (enum form f = 0; f < N_FORMS; f++) {
		pass_one("under the threshold", plain, plain2, threshold - 1, f, st, false, false);
		pass_one("pinned memory", pinned, pinned2, n, f, st, true, false);
		pass_one("registered memory", reg, pinned2, n, f, st, true, false);
		pass_one("managed memory", (unsigned char *)(uintptr_t)managed, (unsigned char *)(uintptr_t)managed2, n,
			 f, st, false, true);
	}
	/* Device to device and host to host (unified addressing) are the driver's. */
	{
		CUdeviceptr d1 = dev_alloc(n), d2 = dev_alloc(n);

		CHECK(cu.fill(st, d1, 0x77, n) == 0 && cu.stream_sync(st) == 0, "fill");
		a = copy_stats();
		CHECK(w.copy(d2, d1, n) == 0 && cu.ctx_sync() == 0, "device to device");
		b = copy_stats();
		UNTOUCHED(device_copies, device_bytes, n, "device to device");
		CHECK(first_not((unsigned char *)(uintptr_t)d2, n, 0x77) == n, "device to device: bytes");
		fill_pat(plain, n, 50);
		a = copy_stats();
		CHECK(w.copy((CUdeviceptr)(uintptr_t)plain2, (CUdeviceptr)(uintptr_t)plain, n) == 0, "host to host");
		b = copy_stats();
		CHECK(b.host_copies - a.host_copies == 1 && b.pinned_copies == a.pinned_copies,
		      "host to host: the driver saw %llu host copies",
		      (unsigned long long)(b.host_copies - a.host_copies));
		CHECK(first_bad(plain2, n, 50, 0) == n, "host to host: bytes");
		cu.mem_free(d1);
		cu.mem_free(d2);
	}
	/* A device pointer the driver does not know: the driver's own CUDA_ERROR_INVALID_VALUE. */
	a = copy_stats();
	r = w.h2d((CUdeviceptr)(uintptr_t)plain2, plain, n);
	b = copy_stats();
	CHECK(r == 1, "H2D to a pointer that is no device memory: error %d, expected 1 (CUDA_ERROR_INVALID_VALUE)", r);
	CHECK(b.failed_calls - a.failed_calls == 1, "the driver did not see the bad copy");
	r = w.d2h_async(plain2, (CUdeviceptr)(uintptr_t)plain, n, st);
	CHECK(r == 1, "D2H from a pointer that is no device memory: error %d, expected 1", r);
	cu.host_unregister(reg);
	free(reg);
	cu.free_host(pinned);
	cu.free_host(pinned2);
	cu.mem_free(managed);
	cu.mem_free(managed2);
	cu.stream_destroy(st);
	free(plain);
	free(plain2);
	printf("passthrough %s: %d failures\n", BUILD, atomic_load(&failures));
	return atomic_load(&failures) ? 1 : 0;
}

/*
 * Two contexts, taken in turn on one thread: each copy's device memory and stream belong to the context current
 * at the time (the stand-in driver refuses an event recorded on another context's stream, as CUDA does).
 */
int mode_contexts(void)
{
	size_t n = 2 * slot + 3;
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), *other = NULL, *both[2];
	CUresult (*create)(void **, unsigned, int) = NULL;
	CUdeviceptr dev[2];
	CUstream st[2];

	*(void **)&create = need(h, "cuCtxCreate_v2");
	CHECK(create(&other, 0, 0) == 0 && other, "cuCtxCreate");
	both[0] = ctx;
	both[1] = other;
	for (int c = 0; c < 2; c++) {
		CHECK(cu.set_current(both[c]) == 0, "cuCtxSetCurrent");
		dev[c] = dev_alloc(n + 64 + GUARD);
		st[c] = stream_new();
	}
	for (unsigned i = 0; i < 16; i++) {
		int c = (int)(i % 2);

		CHECK(cu.set_current(both[c]) == 0, "cuCtxSetCurrent");
		round_trip(dev[c], i % 3, n, i % 5, i % N_FORMS, (i / 2) % N_FORMS, i % 4 < 2 ? st[c] : NULL, 90 + i,
			   true);
	}
	for (int c = 0; c < 2; c++) {
		CHECK(cu.set_current(both[c]) == 0, "cuCtxSetCurrent");
		cu.stream_destroy(st[c]);
		cu.mem_free(dev[c]);
	}
	cu.set_current(ctx);
	printf("contexts %s: %d failures\n", BUILD, atomic_load(&failures));
	return atomic_load(&failures) ? 1 : 0;
}

/*
 * Make the kth copy call from now fail (STUB_CUDA_COPY_FAIL_AT, read by the driver at each call); sticky: every
 * call from it on, until unset, as a real CUDA_ERROR_ILLEGAL_ADDRESS spoils the context (a runtime copy that the
 * interposer hands back to the real runtime after a staged failure then fails there too, as it would on a GPU).
 */
static void fail_in(unsigned k, bool sticky)
{
	char v[32];

	snprintf(v, sizeof(v), "%llu%s", (unsigned long long)copy_stats().calls + k, sticky ? "+" : "");
	setenv("STUB_CUDA_COPY_FAIL_AT", v, 1);
}

int mode_fail(void)
{
	size_t n = 4 * slot + 3, small = threshold > 1 ? threshold - 1 : 1;
	CUdeviceptr d = dev_alloc(n + 64 + GUARD);
	CUstream st = stream_new();
	unsigned char *buf = malloc(n);
	/* Staged, the copy is several driver calls: the second fails, in the middle. Else the one call. */
	unsigned k = expect_staged ? 2 : 1;
	CUresult r;

	fill_pat(buf, n, 60);
	for (enum form f = 0; f < N_FORMS; f++) {
		fail_in(k, true);
		r = h2d(f, d, buf, n, st);
		CHECK(r == 700, "H2D (%s) whose copy %u fails: error %d, expected 700", form_names[f], k, r);
		unsetenv("STUB_CUDA_COPY_FAIL_AT");
		cu.ctx_sync();
		fail_in(k, true);
		r = d2h(f, buf, d, n, st);
		CHECK(r == 700, "D2H (%s) whose copy %u fails: error %d, expected 700", form_names[f], k, r);
		unsetenv("STUB_CUDA_COPY_FAIL_AT");
		cu.ctx_sync();
		fail_in(1, false);
		r = h2d(f, d, buf, small, st);
		CHECK(r == 700, "H2D (%s) under the threshold that fails: error %d, expected 700", form_names[f], r);
		unsetenv("STUB_CUDA_COPY_FAIL_AT");
		/* Nothing is left broken: the next copies are exact. */
		round_trip(d, 0, n, 1, f, (f + 1) % N_FORMS, st, 61 + f, false);
	}
	cu.stream_destroy(st);
	cu.mem_free(d);
	free(buf);
	printf("fail %s: %d failures\n", BUILD, atomic_load(&failures));
	return atomic_load(&failures) ? 1 : 0;
}

/* The next line from the test on stdin must be want; else fail and exit. */
static void hear(const char *want)
{
	char buf[64];

	if (!fgets(buf, sizeof(buf), stdin) || strncmp(buf, want, strlen(want)) != 0) {
		fprintf(stderr, "FAIL: expected \"%s\" from the test\n", want);
		exit(1);
	}
}

static void say(const char *line)
{
	printf("%s\n", line);
	fflush(stdout);
}

struct held_copy {
	CUdeviceptr d;
	size_t n;
	unsigned char *src;
	CUresult r;
};

static void *long_copy(void *arg)
{
	struct held_copy *h = arg;

	enter();
	h->r = w.h2d(h->d, h->src, h->n);
	return NULL;
}

int mode_revoke(void)
{
	size_t n = 4 * ring + 13, small = 2 * slot + 1;
	struct held_copy h = { .d = dev_alloc(n + 64 + GUARD), .n = n, .src = malloc(n) };
	struct stub_cuda_copy_stats a, b;
	unsigned char *out = malloc(n);
	pthread_t t;
	bool retaken = false;

	round_trip(h.d, 0, small, 0, FORM_SYNC, FORM_SYNC, NULL, 1, true); /* the ring is taken */
	say("ready");
	hear("go");
	/* A long copy, held at the driver's gate after its first pieces: in the middle while the ring is revoked. */
	fill_pat(h.src, n, 70);
	cu.gate(1);
	pthread_create(&t, NULL, long_copy, &h);
	while (cu.gate_waiting() == 0)
		usleep(1000);
	say("copying");
	hear("open");
	cu.gate(0);
	pthread_join(t, NULL);
	/* Its DMA may still run on the copying thread's stream (its per-thread one, in the ptds ways): wait for it. */
	CHECK(cu.ctx_sync() == 0, "synchronise");
	memset(h.src, 0xCC, n);
	CHECK(h.r == 0, "the copy held while its ring was revoked: error %d", h.r);
	CHECK(w.d2h(out, h.d, n) == 0 && first_bad(out, n, 70, 0) == n,
	      "the copy held while its ring was revoked: bytes");
	say("copied");
	/* Once the ring is given back, copies go to the driver, exact. */
	hear("released");
	a = copy_stats();
	round_trip(h.d, 0, small, 5, FORM_ASYNC, FORM_SYNC, NULL, 2, false);
	b = copy_stats();
	CHECK(b.pageable_bytes - a.pageable_bytes == 2 * small && b.pinned_bytes == a.pinned_bytes,
	      "after the revocation: the driver saw %llu pageable and %llu pinned bytes, expected the two copies "
	      "as made",
	      (unsigned long long)(b.pageable_bytes - a.pageable_bytes),
	      (unsigned long long)(b.pinned_bytes - a.pinned_bytes));
	say("passed");
	/* Then a ring is taken again, after the engine's back-off: within 30 s a copy is staged. */
	for (int i = 0; i < 300 && !retaken; i++) {
		a = copy_stats();
		round_trip(h.d, 0, small, 0, FORM_SYNC, FORM_SYNC, NULL, 3, false);
		b = copy_stats();
		retaken = b.pinned_bytes - a.pinned_bytes == 2 * small;
		if (!retaken)
			usleep(100 * 1000);
	}
	CHECK(retaken, "no copy was staged again within 30 s of the revocation");
	say(retaken ? "retaken" : "not retaken");
	hear("done");
	cu.mem_free(h.d);
	free(h.src);
	free(out);
	return atomic_load(&failures) ? 1 : 0;
}

int mode_hold(void)
{
	size_t n = 2 * slot + 1;
	CUdeviceptr d = dev_alloc(n + 64 + GUARD);
	struct stub_cuda_stats s;
	char buf[64], line[128];

	round_trip(d, 0, n, 0, FORM_SYNC, FORM_ASYNC, NULL, 1, true);
	cu.stats(&s);
	snprintf(line, sizeof(line), "ready pinned=%llu failures=%d",
		 (unsigned long long)(s.alloc_bytes + s.registered_bytes), atomic_load(&failures));
	say(line);
	while (fgets(buf, sizeof(buf), stdin))
		;
	cu.mem_free(d);
	return atomic_load(&failures) ? 1 : 0;
}

/*
 * The stand-in driver's own behaviour, checked directly (no interposer): what makes the other modes able to
 * fail. Async copies with pinned host memory really run later, pageable ones as CUDA's, events and the legacy
 * stream order work, pointer attributes, capture and the injected failure answer as the real driver.
 */
int mode_selftest(void)
{
	size_t n = 3 * slot + 1;
	CUdeviceptr d = dev_alloc(n), m = 0;
	CUstream st = stream_new(), st2 = stream_new();
	unsigned char *pinned = NULL, *plain = malloc(n), *out = malloc(n);
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	CUresult (*attrs)(unsigned, int *, void **, CUdeviceptr) = NULL;
	CUresult (*attr)(void *, int, CUdeviceptr) = NULL;
	CUresult (*is_capturing)(CUstream, int *) = NULL;
	CUresult (*event_query)(CUevent) = NULL;
	CUresult (*stream_query)(CUstream) = NULL;
	unsigned type = 9, managed = 9;
	void *owner = (void *)1;
	int kinds[] = { 2, 8, 1 }, capturing = 9;
	void *data[] = { &type, &managed, &owner };
	CUevent e = NULL;

	*(void **)&attrs = need(h, "cuPointerGetAttributes");
	*(void **)&attr = need(h, "cuPointerGetAttribute");
	*(void **)&is_capturing = need(h, "cuStreamIsCapturing");
	*(void **)&event_query = need(h, "cuEventQuery");
	*(void **)&stream_query = need(h, "cuStreamQuery");
	CHECK(cu.host_alloc((void **)&pinned, n, 0) == 0, "cuMemHostAlloc");
	CHECK(cu.mem_alloc_managed(&m, n, 1) == 0, "cuMemAllocManaged");
	CHECK(cu.event_create(&e, 2) == 0, "cuEventCreate");
	cu.set_delay(20000);

	/* Pinned H2D async reads its source when it runs: a change made after the call reaches the device. */
	memset(pinned, 1, n);
	CHECK(w.h2d_async(d, pinned, n, st) == 0, "pinned H2D");
	memset(pinned, 2, n);
	CHECK(cu.stream_sync(st) == 0, "sync");
	CHECK(first_not((unsigned char *)(uintptr_t)d, n, 2) == n, "pinned H2D async ran at once");
	/* Pinned D2H async writes when it runs: right after the call, the old bytes; after the event, the new. */
	memset(pinned, 3, n);
	CHECK(w.d2h_async(pinned, d, n, st) == 0 && cu.event_record(e, st) == 0, "pinned D2H");
	CHECK(event_query(e) == 600, "the event of pending work is not ready (CUDA_ERROR_NOT_READY)");
	CHECK(first_not(pinned, n, 3) == n, "pinned D2H async was in place at once");
	CHECK(cu.event_sync(e) == 0 && event_query(e) == 0 && first_not(pinned, n, 2) == n,
	      "pinned D2H async: not in place after its event");
	/* Pageable H2D returns with the source copied away; pageable D2H returns with the data in place. */
	memset(plain, 4, n);
	CHECK(w.h2d_async(d, plain, n, st) == 0, "pageable H2D");
	memset(plain, 5, n);
	CHECK(w.d2h_async(out, d, n, st) == 0 && first_not(out, n, 4) == n, "pageable H2D then D2H: wrong bytes");
	/* The legacy stream waits for a blocking stream's kernel; another stream does not without an event. */
	CHECK(cu.fill(w.ptds ? PER_THREAD : st, d, 6, n) == 0 && w.d2h(out, d, n) == 0 && first_not(out, n, 6) == n,
	      "a sync D2H on the default stream did not wait for a kernel on a stream it waits for");
	/* Twenty kernels (400 ms) on one stream; a D2H (20 ms) on another finishes while most are still to run. */
	for (int i = 0; i < 20; i++)
		CHECK(cu.fill(st, d, 7, n) == 0, "fill");
	CHECK(w.d2h_async(pinned, d, n, st2) == 0 && cu.stream_sync(st2) == 0, "two streams");
	CHECK(stream_query(st) == 600,
	      "a D2H on another stream waited for kernels it has no event for (streams are not concurrent)");
	CHECK(cu.ctx_sync() == 0, "synchronise");
	cu.set_delay(0);

	/* Pointer attributes, as the engine asks them. */
	CHECK(attrs(3, kinds, data, d) == 0 && type == 2 && managed == 0 && owner == ctx, "device memory: %u %u", type,
	      managed);
	CHECK(attrs(3, kinds, data, m) == 0 && type == 2 && managed == 1, "managed memory: %u %u", type, managed);
	CHECK(attrs(3, kinds, data, (CUdeviceptr)(uintptr_t)(pinned + 5)) == 0 && type == 1 && managed == 0,
	      "pinned memory: %u %u", type, managed);
	CHECK(attrs(3, kinds, data, (CUdeviceptr)(uintptr_t)plain) == 0 && type == 0 && managed == 0 && !owner,
	      "pageable memory: %u %u %p", type, managed, owner);
	CHECK(attr(&type, 2, (CUdeviceptr)(uintptr_t)plain) == 1, "cuPointerGetAttribute of pageable memory");
	CHECK(attr(&type, 2, d + 1) == 0 && type == 2, "cuPointerGetAttribute of device memory");

	/* Capture: recorded, not run. */
	CHECK(cu.begin_capture(st, 0) == 0 && is_capturing(st, &capturing) == 0 && capturing == 1, "capture");
	{
		void *g = NULL;

		memset(plain, 8, n);
		CHECK(w.h2d_async(d, plain, n, st) == 0 && cu.end_capture(st, &g) == 0 && g, "captured copy");
		CHECK(is_capturing(st, &capturing) == 0 && capturing == 0, "capture ended");
		CHECK(cu.ctx_sync() == 0 && first_not((unsigned char *)(uintptr_t)d, n, 7) == n, "a captured copy ran");
		cu.graph_destroy(g);
	}
	/* An event belongs to its context: recording it on another context's stream is CUDA_ERROR_INVALID_HANDLE. */
	{
		CUresult (*create)(void **, unsigned, int) = NULL;
		void *other = NULL;
		CUevent e2 = NULL;

		*(void **)&create = need(h, "cuCtxCreate_v2");
		CHECK(create(&other, 0, 0) == 0 && cu.event_create(&e2, 2) == 0, "a second context and its event");
		CHECK(cu.event_record(e2, st) == 400, "an event recorded on another context's stream");
		cu.event_destroy(e2);
		enter();
	}
	/* Errors: the injected one, and a pointer that is no device memory. */
	fail_in(1, false);
	CHECK(w.h2d(d, plain, n) == 700 && w.h2d(d, plain, n) == 0, "STUB_CUDA_COPY_FAIL_AT=N");
	fail_in(2, true);
	CHECK(w.h2d(d, plain, n) == 0 && w.h2d(d, plain, n) == 700 && w.h2d(d, plain, n) == 700,
	      "STUB_CUDA_COPY_FAIL_AT=N+");
	unsetenv("STUB_CUDA_COPY_FAIL_AT");
	CHECK(w.h2d((CUdeviceptr)(uintptr_t)out, plain, n) == 1, "H2D to host memory");
	CHECK(w.h2d(d + 1, plain, n) == 1, "H2D past the end of device memory");

	cu.event_destroy(e);
	cu.stream_destroy(st);
	cu.stream_destroy(st2);
	cu.free_host(pinned);
	cu.mem_free(d);
	cu.mem_free(m);
	free(plain);
	free(out);
	printf("selftest %s: %d failures\n", BUILD, atomic_load(&failures));
	return atomic_load(&failures) ? 1 : 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * An unmodified CUDA program that copies between ordinary (pageable) memory and the device, for the staged
 * copies' end-to-end checks (issue 39; tests/integration/check_itest_staging.c runs it under the interposer with
 * the real daemon, and bare on the stand-in driver). It knows nothing of pinbroker. Built three ways, as
 * target.c is: the driver API linked to libcuda.so.1 (TARGET_DRIVER), the runtime as a shared library, and the
 * runtime compiled in (its calls reach the driver only through cuGetProcAddress).
 *
 *   copy_target MODE WAY [ARG]
 * WAY, how the program reaches its copies: driver (cuMemcpy* symbols), driver-ptds (their _ptds/_ptsz forms),
 * dlsym (dlsym on a libcuda.so.1 handle), gpa and gpa-ptds (cuGetProcAddress, without and with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) in the driver build; runtime, runtime-ptds (cudaMemcpy*,
 * cudaMemcpy*_ptds/_ptsz) and dlsym-runtime (dlsym(RTLD_DEFAULT, "cudaMemcpy")) in the runtime builds. Every
 * mode rotates through the synchronous, asynchronous and unified-addressing (cuMemcpy, cudaMemcpyDefault) forms.
 * MODE:
 *   sizes      round trips of every size around the slot, ring and threshold, at host offsets 0..63 and
 *              device offsets: bytes exact, nothing written outside, the source reusable at H2D's return
 *   order      staged copies between stand-in kernels on one stream, on others with events, on the legacy
 *              and the per-thread default streams (streams slowed to 2 ms an operation)
 *   threads N  N threads copying at once, each its own buffers, half on their own streams
 *   fork       children forked while a thread copies, each copying too
 *   contexts   copies in two contexts taken in turn, each with its own device memory and stream
 *   capture    copies on a stream being captured reach the driver untouched and do not run
 *   passthrough  under the threshold, pinned, registered, managed, device-to-device and host-to-host copies
 *              reach the driver untouched; a bad device pointer gets the driver's CUDA_ERROR_INVALID_VALUE
 *   fail       STUB_CUDA_COPY_FAIL_AT: a failing piece's error comes back (700), and copies work after
 *   revoke     a copy held in the middle (the stand-in's gate) while the test revokes the ring: a dialogue on
 *              stdin/stdout (ready / go, copying / open, copied / released, passed, retaken)
 *   hold       one staged round trip, then "ready pinned=BYTES" (what the driver holds pinned) until stdin ends
 *   selftest   the stand-in driver's own semantics (run bare): what lets the other modes fail
 * env PB_EXPECT=staged|driver: where copies at or over $PINBROKER_STAGING_THRESHOLD must go (staged: through
 * pinned memory, the driver seeing no pageable byte of them; driver: to the driver as made). Copies under the
 * threshold must reach the driver as made either way. The sizes come from $PINBROKER_STAGING_SLOT, _RING and
 * _THRESHOLD (defaults 8M, 64M, 1M). Exit 0 when every check held, 1 otherwise (each failure on stderr).
 */
#define _GNU_SOURCE
#include "stub_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef uint64_t cuuint64_t;
typedef void *CUstream;
typedef void *CUevent;

#define PER_THREAD ((CUstream)0x2)

#ifdef TARGET_DRIVER
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s);
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream s);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
#define BUILD "driver"
#else
typedef int cudaError_t;
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind);
cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t n, int kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream);
cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t n, int kind, void *stream);
#define BUILD "runtime"
#endif

/* One way in: the six copy forms, as the program's way of reaching them gives them. */
struct way {
	CUresult (*h2d)(CUdeviceptr, const void *, size_t);
	CUresult (*d2h)(void *, CUdeviceptr, size_t);
	CUresult (*h2d_async)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*d2h_async)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*copy)(CUdeviceptr, CUdeviceptr, size_t);
	CUresult (*copy_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
	bool ptds; /* stream 0 and the sync forms are the calling thread's per-thread stream */
};

static struct way w;

/* The driver entry points for everything but the copies, from dlsym on a libcuda.so.1 handle. */
static struct {
	CUresult (*init)(unsigned);
	CUresult (*retain)(void **, int);
	CUresult (*set_current)(void *);
	CUresult (*mem_alloc)(CUdeviceptr *, size_t);
	CUresult (*mem_alloc_managed)(CUdeviceptr *, size_t, unsigned);
	CUresult (*mem_free)(CUdeviceptr);
	CUresult (*host_alloc)(void **, size_t, unsigned);
	CUresult (*free_host)(void *);
	CUresult (*host_register)(void *, size_t, unsigned);
	CUresult (*host_unregister)(void *);
	CUresult (*stream_create)(CUstream *, unsigned);
	CUresult (*stream_destroy)(CUstream);
	CUresult (*stream_sync)(CUstream);
	CUresult (*ctx_sync)(void);
	CUresult (*event_create)(CUevent *, unsigned);
	CUresult (*event_record)(CUevent, CUstream);
	CUresult (*event_sync)(CUevent);
	CUresult (*event_destroy)(CUevent);
	CUresult (*wait_event)(CUstream, CUevent, unsigned);
	CUresult (*begin_capture)(CUstream, int);
	CUresult (*end_capture)(CUstream, void **);
	CUresult (*graph_destroy)(void *);
	int (*fill)(void *, CUdeviceptr, int, size_t);
	int (*add)(void *, CUdeviceptr, int, size_t);
	void (*copy_stats)(struct stub_cuda_copy_stats *);
	void (*stats)(struct stub_cuda_stats *);
	void (*set_delay)(unsigned);
	void (*gate)(int);
	int (*gate_waiting)(void);
} cu;

static void *ctx;
static size_t slot, ring, threshold;
static bool expect_staged;
static atomic_int failures;

#define CHECK(cond, ...)                                                                \
	do {                                                                            \
		if (!(cond)) {                                                          \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                                   \
			fputc('\n', stderr);                                            \
			atomic_fetch_add(&failures, 1);                                 \
		}                                                                       \
	} while (0)

/* A size from the environment ("64K", "8M", digits for bytes), or def. */
static size_t env_size(const char *name, size_t def)
{
	const char *v = getenv(name);
	char *end;
	size_t n;

	if (!v || !*v)
		return def;
	n = strtoull(v, &end, 10);
	if (*end == 'K' || *end == 'k')
		n <<= 10;
	else if (*end == 'M' || *end == 'm')
		n <<= 20;
	else if (*end == 'G' || *end == 'g')
		n <<= 30;
	return n ? n : def;
}

static void *need(void *h, const char *name)
{
	void *f = dlsym(h, name);

	if (!f) {
		fprintf(stderr, "the driver lacks %s\n", name);
		exit(2);
	}
	return f;
}

static void load_driver(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

	if (!h) {
		fprintf(stderr, "no libcuda.so.1: %s\n", dlerror());
		exit(2);
	}
	*(void **)&cu.init = need(h, "cuInit");
	*(void **)&cu.retain = need(h, "cuDevicePrimaryCtxRetain");
	*(void **)&cu.set_current = need(h, "cuCtxSetCurrent");
	*(void **)&cu.mem_alloc = need(h, "cuMemAlloc_v2");
	*(void **)&cu.mem_alloc_managed = need(h, "cuMemAllocManaged");
	*(void **)&cu.mem_free = need(h, "cuMemFree_v2");
	*(void **)&cu.host_alloc = need(h, "cuMemHostAlloc");
	*(void **)&cu.free_host = need(h, "cuMemFreeHost");
	*(void **)&cu.host_register = need(h, "cuMemHostRegister_v2");
	*(void **)&cu.host_unregister = need(h, "cuMemHostUnregister");
	*(void **)&cu.stream_create = need(h, "cuStreamCreate");
	*(void **)&cu.stream_destroy = need(h, "cuStreamDestroy_v2");
	*(void **)&cu.stream_sync = need(h, "cuStreamSynchronize");
	*(void **)&cu.ctx_sync = need(h, "cuCtxSynchronize");
	*(void **)&cu.event_create = need(h, "cuEventCreate");
	*(void **)&cu.event_record = need(h, "cuEventRecord");
	*(void **)&cu.event_sync = need(h, "cuEventSynchronize");
	*(void **)&cu.event_destroy = need(h, "cuEventDestroy_v2");
	*(void **)&cu.wait_event = need(h, "cuStreamWaitEvent");
	*(void **)&cu.begin_capture = need(h, "cuStreamBeginCapture_v2");
	*(void **)&cu.end_capture = need(h, "cuStreamEndCapture");
	*(void **)&cu.graph_destroy = need(h, "cuGraphDestroy");
	*(void **)&cu.fill = need(h, "stub_cuda_launch_fill");
	*(void **)&cu.add = need(h, "stub_cuda_launch_add");
	*(void **)&cu.copy_stats = need(h, "stub_cuda_copy_get_stats");
	*(void **)&cu.stats = need(h, "stub_cuda_get_stats");
	*(void **)&cu.set_delay = need(h, "stub_cuda_set_stream_delay_us");
	*(void **)&cu.gate = need(h, "stub_cuda_copy_gate");
	*(void **)&cu.gate_waiting = need(h, "stub_cuda_copy_gate_waiting");
	if (cu.init(0) != 0 || cu.retain(&ctx, 0) != 0) {
		fprintf(stderr, "the driver did not start\n");
		exit(2);
	}
}

/* Each thread that copies makes the device's context current, as a CUDA program does. */
static void enter(void)
{
	if (cu.set_current(ctx) != 0) {
		fprintf(stderr, "cuCtxSetCurrent failed\n");
		exit(2);
	}
}

/* ---- The ways in ---- */

#ifdef TARGET_DRIVER
static void *from_dlsym(const char *name)
{
	static void *h;

	if (!h)
		h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	return need(h, name);
}

static void *from_gpa(const char *name, bool ptds)
{
	void *f = NULL;

	if (cuGetProcAddress(name, &f, 13000, ptds ? 2 : 0) != 0 || !f) {
		fprintf(stderr, "cuGetProcAddress(%s) failed\n", name);
		exit(2);
	}
	return f;
}

static bool pick_way(const char *name)
{
	if (strcmp(name, "driver") == 0) {
		w = (struct way){ cuMemcpyHtoD_v2,
				  cuMemcpyDtoH_v2,
				  cuMemcpyHtoDAsync_v2,
				  cuMemcpyDtoHAsync_v2,
				  cuMemcpy,
				  cuMemcpyAsync,
				  false };
	} else if (strcmp(name, "driver-ptds") == 0) {
		w = (struct way){ cuMemcpyHtoD_v2_ptds,
				  cuMemcpyDtoH_v2_ptds,
				  cuMemcpyHtoDAsync_v2_ptsz,
				  cuMemcpyDtoHAsync_v2_ptsz,
				  cuMemcpy_ptds,
				  cuMemcpyAsync_ptsz,
				  true };
	} else if (strcmp(name, "dlsym") == 0) {
		*(void **)&w.h2d = from_dlsym("cuMemcpyHtoD_v2");
		*(void **)&w.d2h = from_dlsym("cuMemcpyDtoH_v2");
		*(void **)&w.h2d_async = from_dlsym("cuMemcpyHtoDAsync_v2");
		*(void **)&w.d2h_async = from_dlsym("cuMemcpyDtoHAsync_v2");
		*(void **)&w.copy = from_dlsym("cuMemcpy");
		*(void **)&w.copy_async = from_dlsym("cuMemcpyAsync");
	} else if (strcmp(name, "gpa") == 0 || strcmp(name, "gpa-ptds") == 0) {
		w.ptds = strcmp(name, "gpa-ptds") == 0;
		*(void **)&w.h2d = from_gpa("cuMemcpyHtoD", w.ptds);
		*(void **)&w.d2h = from_gpa("cuMemcpyDtoH", w.ptds);
		*(void **)&w.h2d_async = from_gpa("cuMemcpyHtoDAsync", w.ptds);
		*(void **)&w.d2h_async = from_gpa("cuMemcpyDtoHAsync", w.ptds);
		*(void **)&w.copy = from_gpa("cuMemcpy", w.ptds);
		*(void **)&w.copy_async = from_gpa("cuMemcpyAsync", w.ptds);
	} else {
		return false;
	}
	return true;
}
#else
/* The runtime's two calls, as the way in found them; the six forms are made of them. */
static cudaError_t (*rt_memcpy)(void *, const void *, size_t, int);
static cudaError_t (*rt_memcpy_async)(void *, const void *, size_t, int, void *);

enum { H2D = 1, D2H = 2, DEFAULT = 4 };

static CUresult rt_h2d(CUdeviceptr d, const void *s, size_t n)
{
	return rt_memcpy((void *)(uintptr_t)d, s, n, H2D);
}

static CUresult rt_d2h(void *d, CUdeviceptr s, size_t n)
{
	return rt_memcpy(d, (void *)(uintptr_t)s, n, D2H);
}

static CUresult rt_h2d_async(CUdeviceptr d, const void *s, size_t n, CUstream st)
{
	return rt_memcpy_async((void *)(uintptr_t)d, s, n, H2D, st);
}

static CUresult rt_d2h_async(void *d, CUdeviceptr s, size_t n, CUstream st)
{
	return rt_memcpy_async(d, (void *)(uintptr_t)s, n, D2H, st);
}

static CUresult rt_copy(CUdeviceptr d, CUdeviceptr s, size_t n)
{
	return rt_memcpy((void *)(uintptr_t)d, (void *)(uintptr_t)s, n, DEFAULT);
}

static CUresult rt_copy_async(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
{
	return rt_memcpy_async((void *)(uintptr_t)d, (void *)(uintptr_t)s, n, DEFAULT, st);
}

static bool pick_way(const char *name)
{
	if (strcmp(name, "runtime") == 0) {
		rt_memcpy = cudaMemcpy;
		rt_memcpy_async = cudaMemcpyAsync;
	} else if (strcmp(name, "runtime-ptds") == 0) {
		rt_memcpy = cudaMemcpy_ptds;
		rt_memcpy_async = cudaMemcpyAsync_ptsz;
		w.ptds = true;
	} else if (strcmp(name, "dlsym-runtime") == 0) {
		/* RTLD_DEFAULT: the interposer's own export, where there is one, comes before the runtime's. */
		*(void **)&rt_memcpy = dlsym(RTLD_DEFAULT, "cudaMemcpy");
		*(void **)&rt_memcpy_async = dlsym(RTLD_DEFAULT, "cudaMemcpyAsync");
		if (!rt_memcpy || !rt_memcpy_async)
			return false;
	} else {
		return false;
	}
	w.h2d = rt_h2d;
	w.d2h = rt_d2h;
	w.h2d_async = rt_h2d_async;
	w.d2h_async = rt_d2h_async;
	w.copy = rt_copy;
	w.copy_async = rt_copy_async;
	return true;
}
#endif

/* ---- Copies, checked ---- */

enum form { FORM_SYNC, FORM_ASYNC, FORM_UNIFIED, FORM_UNIFIED_ASYNC, N_FORMS };
static const char *const form_names[] = { "sync", "async", "unified", "unified-async" };

static CUresult h2d(enum form f, CUdeviceptr d, const void *s, size_t n, CUstream st)
{
	switch (f) {
	case FORM_SYNC:
		return w.h2d(d, s, n);
	case FORM_ASYNC:
		return w.h2d_async(d, s, n, st);
	case FORM_UNIFIED:
		return w.copy(d, (CUdeviceptr)(uintptr_t)s, n);
	default:
		return w.copy_async(d, (CUdeviceptr)(uintptr_t)s, n, st);
	}
}

static CUresult d2h(enum form f, void *d, CUdeviceptr s, size_t n, CUstream st)
{
	switch (f) {
	case FORM_SYNC:
		return w.d2h(d, s, n);
	case FORM_ASYNC:
		return w.d2h_async(d, s, n, st);
	case FORM_UNIFIED:
		return w.copy((CUdeviceptr)(uintptr_t)d, s, n);
	default:
		return w.copy_async((CUdeviceptr)(uintptr_t)d, s, n, st);
	}
}

static struct stub_cuda_copy_stats copy_stats(void)
{
	struct stub_cuda_copy_stats s;

	cu.copy_stats(&s);
	return s;
}

/*
 * What the driver saw of one copy of n bytes, from the log before and after it: at or over the threshold and
 * staged, no pageable byte and n bytes through pinned memory; otherwise the copy itself, pageable, once.
 */
static void expect_route(const struct stub_cuda_copy_stats *a, const struct stub_cuda_copy_stats *b, size_t n,
			 const char *what)
{
	uint64_t pageable = b->pageable_bytes - a->pageable_bytes, pinned = b->pinned_bytes - a->pinned_bytes;

	if (expect_staged && n >= threshold) {
		CHECK(pageable == 0 && pinned == n,
		      "%s of %zu bytes: the driver saw %llu pageable and %llu pinned bytes; "
		      "staged, it should see %zu pinned bytes only",
		      what, n, (unsigned long long)pageable, (unsigned long long)pinned, n);
	} else {
		CHECK(pageable == n && pinned == 0 && b->pageable_copies - a->pageable_copies == 1,
		      "%s of %zu bytes: the driver saw %llu pageable bytes in %llu copies and %llu pinned bytes; it "
		      "should see the program's one pageable copy",
		      what, n, (unsigned long long)pageable,
		      (unsigned long long)(b->pageable_copies - a->pageable_copies), (unsigned long long)pinned);
	}
}

/* The pattern of case seed at byte i. */
static unsigned char pat(unsigned seed, size_t i)
{
	uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)seed * 0xBF58476D1CE4E5B9ull;

	return (unsigned char)(x >> 29 ^ x >> 7);
}

static void fill_pat(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = pat(seed, i);
}

/* The first byte of p[0..n) that is not seed's pattern from byte from on (plus add), or n. */
static size_t first_bad_from(const unsigned char *p, size_t n, unsigned seed, int add, size_t from)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (unsigned char)(pat(seed, from + i) + add))
			return i;
	return n;
}

static size_t first_bad(const unsigned char *p, size_t n, unsigned seed, int add)
{
	return first_bad_from(p, n, seed, add, 0);
}

static size_t first_not(const unsigned char *p, size_t n, unsigned char byte)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != byte)
			return i;
	return n;
}

#define GUARD 64

/*
 * One round trip of n bytes: host (pageable, at hoff) to device (at doff of dev, which holds doff + n + GUARD)
 * and back to other host memory, with forms fh and fd on stream st. Checks the bytes at each end, that nothing
 * around them was written, that the source could be reused when H2D returned (it is scribbled over at once) and
 * that D2H's data was in place when it returned; route: also what the driver saw of each copy.
 */
static void round_trip(CUdeviceptr dev, size_t doff, size_t n, size_t hoff, enum form fh, enum form fd, CUstream st,
		       unsigned seed, bool route)
{
	unsigned char *src = malloc(n + hoff + GUARD), *dst = malloc(n + hoff + GUARD);
	struct stub_cuda_copy_stats a, b;
	size_t bad;
	CUresult r;

	if (!src || !dst) {
		fprintf(stderr, "out of memory\n");
		exit(2);
	}
	/* The per-thread default stream of the ptds forms is ordered with no other stream but the legacy one: a
	 * round trip that uses it uses it throughout. */
	if (w.ptds && (fh == FORM_SYNC || fh == FORM_UNIFIED || fd == FORM_SYNC || fd == FORM_UNIFIED))
		st = PER_THREAD;
	/* The device window and its edges (one byte before, GUARD after) set to 0xEE first. */
	CHECK(cu.fill(st, dev + doff - (doff ? 1 : 0), 0xEE, n + GUARD + (doff ? 1 : 0)) == 0 &&
		      cu.stream_sync(st) == 0,
	      "fill");
	fill_pat(src + hoff, n, seed);
	memset(dst, 0x5A, n + hoff + GUARD);
	a = copy_stats();
	r = h2d(fh, dev + doff, src + hoff, n, st);
	b = copy_stats();
	CHECK(r == 0, "H2D (%s) of %zu bytes at offsets %zu/%zu: error %d", form_names[fh], n, hoff, doff, r);
	memset(src + hoff, 0xCC, n); /* the source may be reused once H2D returned */
	if (route)
		expect_route(&a, &b, n, "H2D");
	a = copy_stats();
	r = d2h(fd, dst + hoff, dev + doff, n, st);
	b = copy_stats();
	CHECK(r == 0, "D2H (%s) of %zu bytes at offsets %zu/%zu: error %d", form_names[fd], n, hoff, doff, r);
	if (route)
		expect_route(&a, &b, n, "D2H");
	/* D2H into pageable memory returns with the data in place: look before any synchronisation. */
	bad = first_bad(dst + hoff, n, seed, 0);
	CHECK(bad == n, "round trip (%s, %s) of %zu bytes at host offset %zu, device offset %zu: byte %zu differs",
	      form_names[fh], form_names[fd], n, hoff, doff, bad);
	CHECK(first_not(dst, hoff, 0x5A) == hoff && first_not(dst + hoff + n, GUARD, 0x5A) == GUARD,
	      "D2H of %zu bytes at host offset %zu wrote outside its destination", n, hoff);
	/* The device memory itself (the stand-in's is host memory): exact, and nothing beyond the window. */
	CHECK(cu.stream_sync(st) == 0 && cu.ctx_sync() == 0, "synchronise");
	bad = first_bad((const unsigned char *)(uintptr_t)(dev + doff), n, seed, 0);
	CHECK(bad == n, "device memory after H2D (%s) of %zu bytes at offsets %zu/%zu: byte %zu differs",
	      form_names[fh], n, hoff, doff, bad);
	CHECK(first_not((const unsigned char *)(uintptr_t)(dev + doff + n), GUARD, 0xEE) == GUARD &&
		      (!doff || *(const unsigned char *)(uintptr_t)(dev + doff - 1) == 0xEE),
	      "H2D of %zu bytes at device offset %zu wrote outside its destination", n, doff);
	free(src);
	free(dst);
}

static CUdeviceptr dev_alloc(size_t n)
{
	CUdeviceptr d = 0;

	if (cu.mem_alloc(&d, n) != 0) {
		fprintf(stderr, "cuMemAlloc of %zu bytes failed\n", n);
		exit(2);
	}
	return d;
}

static CUstream stream_new(void)
{
	CUstream s = NULL;

	if (cu.stream_create(&s, 0) != 0) {
		fprintf(stderr, "cuStreamCreate failed\n");
		exit(2);
	}
	return s;
}

/* ---- Modes ---- */

static int mode_sizes(void)
{
	size_t sizes[] = { 1,        threshold - 1, threshold, slot - 1,        slot,
			   slot + 1, 2 * slot - 1,  2 * slot,  2 * slot + 1,    3 * slot + 7,
			   ring - 1, ring,          ring + 1,  ring + slot + 1, 3 * ring + 7 };
	size_t unaligned[] = { slot - 1, slot, slot + 1, 2 * slot + 1 };
	size_t dev_offsets[] = { 0, 1, 7, 63 };
	size_t most = 3 * ring + 7 + 64 + GUARD;
	CUdeviceptr dev = dev_alloc(most);
	CUstream st = stream_new();
	unsigned seed = 1, k = 0;

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		for (enum form f = 0; f < N_FORMS; f++, k++)
			round_trip(dev, 0, sizes[i], 0, f, (f + k) % N_FORMS, w.ptds && k % 2 ? NULL : st, seed++,
				   true);
	for (size_t i = 0; i < sizeof(unaligned) / sizeof(unaligned[0]); i++)
		for (size_t hoff = 1; hoff < 64; hoff++, k++)
			round_trip(dev, dev_offsets[k % 4], unaligned[i], hoff, k % N_FORMS, (k / N_FORMS) % N_FORMS,
				   st, seed++, true);
	cu.stream_destroy(st);
	cu.mem_free(dev);
	printf("sizes %s: %u round trips, %d failures\n", BUILD, k, atomic_load(&failures));
	return atomic_load(&failures) ? 1 : 0;
}

/* n bytes of device memory at d, read back (a plain D2H on st, itself checked elsewhere), must be byte. */
static void expect_device(CUdeviceptr d, size_t n, CUstream st, unsigned seed, int add, int byte, const char *what)
{
	unsigned char *out = malloc(n);
	size_t bad;

	CHECK(out && d2h(FORM_ASYNC, out, d, n, st) == 0, "%s: read back", what);
	bad = byte >= 0 ? first_not(out, n, (unsigned char)byte) : first_bad(out, n, seed, add);
	CHECK(bad == n, "%s: byte %zu of %zu is %#x", what, bad, n, bad < n ? out[bad] : 0);
	free(out);
}

static int mode_order(void)
{
	size_t n = 3 * slot + 5;
	CUdeviceptr d = dev_alloc(n);
	CUstream s1 = stream_new(), s2 = stream_new(), own = w.ptds ? PER_THREAD : s1;
	unsigned char *src = malloc(n);
	CUevent e = NULL;
	struct stub_cuda_copy_stats a = copy_stats(), b;

	CHECK(cu.event_create(&e, 2) == 0, "cuEventCreate");
	/* Every stream operation 2 ms late: the copies must wait for the kernels, and they for them. */
	cu.set_delay(2000);
	for (enum form f = 0; f < N_FORMS; f++) {
		/* One stream: a kernel, the copy in, a kernel on what it wrote, the copy out. */
		fill_pat(src, n, 10 + f);
		CHECK(cu.fill(own, d, 0x11, n) == 0, "fill");
		CHECK(h2d(f, d, src, n, own) == 0, "H2D");
		memset(src, 0xCC, n);
		CHECK(cu.add(own, d, 1, n) == 0, "add");
		expect_device(d, n, own, 10 + f, 1, -1, "kernel, H2D, kernel on one stream");

		/* A kernel after the copy in overwrites half of it; the copy out sees both. */
		fill_pat(src, n, 20 + f);
		CHECK(h2d(f, d, src, n, own) == 0, "H2D");
		CHECK(cu.fill(own, d, 0x22, n / 2) == 0, "fill");
		{
			unsigned char *out = malloc(n);

			CHECK(d2h(f, out, d, n, own) == 0, "D2H");
			CHECK(first_not(out, n / 2, 0x22) == n / 2 &&
				      first_bad_from(out + n / 2, n - n / 2, 20 + f, 0, n / 2) == n - n / 2,
			      "H2D, kernel, D2H (%s) on one stream: the kernel's half or the copy's is wrong",
			      form_names[f]);
			free(out);
		}

		/* Another stream's kernel, ordered by an event, before this stream's copy out. */
		CHECK(cu.fill(s1, d, 0x33, n) == 0, "fill");
		CHECK(cu.event_record(e, s1) == 0, "record");
		CHECK(cu.wait_event(s2, e, 0) == 0, "wait");
		expect_device(d, n, s2, 0, 0, 0x33, "kernel on one stream, event, D2H on another");

		/* This stream's copy in, an event, another stream's kernel on it. */
		fill_pat(src, n, 30 + f);
		CHECK(h2d(f == FORM_SYNC || f == FORM_UNIFIED ? FORM_ASYNC : f, d, src, n, s2) == 0, "H2D");
		memset(src, 0xCC, n);
		CHECK(cu.event_record(e, s2) == 0, "record");
		CHECK(cu.wait_event(s1, e, 0) == 0, "wait");
		CHECK(cu.add(s1, d, 2, n) == 0, "add");
		expect_device(d, n, s1, 30 + f, 2, -1, "H2D on one stream, event, kernel on another");

		/* The default stream of the sync forms (legacy: it waits for the blocking streams; per-thread: its own). */
		CHECK(cu.fill(own, d, 0x44, n) == 0, "fill");
		{
			unsigned char *out = malloc(n);

			CHECK(d2h(FORM_SYNC, out, d, n, NULL) == 0, "D2H");
			CHECK(first_not(out, n, 0x44) == n, "kernel on %s, then a synchronous D2H: it ran first",
			      w.ptds ? "the per-thread stream" : "a blocking stream");
			/* The copy out is done before the kernel after it runs. */
			CHECK(cu.fill(own, d, 0x55, n) == 0, "fill");
			CHECK(first_not(out, n, 0x44) == n, "a kernel after D2H changed what D2H returned");
			free(out);
		}
		CHECK(cu.ctx_sync() == 0, "synchronise");
	}
	cu.set_delay(0);
	/* Every copy here is over the threshold: staged, the driver saw none of their pageable bytes. */
	b = copy_stats();
	if (expect_staged)
		CHECK(b.pageable_bytes == a.pageable_bytes && b.pinned_bytes > a.pinned_bytes,
		      "the driver saw %llu pageable bytes of copies that should have been staged",
		      (unsigned long long)(b.pageable_bytes - a.pageable_bytes));
	cu.event_destroy(e);
	cu.stream_destroy(s1);
	cu.stream_destroy(s2);
	cu.mem_free(d);
	free(src);
	printf("order %s: %d failures\n", BUILD, atomic_load(&failures));
	return atomic_load(&failures) ? 1 : 0;
}

struct worker {
	pthread_t t;
	unsigned id;
};

static void *copier(void *arg)
{
	struct worker *k = arg;
	size_t sizes[] = { slot - 1, slot + 1, 3 * slot + 7, threshold, threshold / 2 + 1, ring + 3 };
	size_t most = ring + 3 + 64 + GUARD;
	CUdeviceptr d;
	CUstream st = NULL;

	enter();
	d = dev_alloc(most);
	if (k->id % 2)
		st = stream_new();
	for (unsigned i = 0; i < 24; i++) {
		size_t n = sizes[(i + k->id) % (sizeof(sizes) / sizeof(sizes[0]))];

		round_trip(d, (i * 7) % 64, n, (i * 13 + k->id) % 64, st ? (i % N_FORMS) : FORM_SYNC,
			   st ? ((i + 1) % N_FORMS) : FORM_UNIFIED, st, k->id * 1000 + i, false);
	}
	if (st)
		cu.stream_destroy(st);
	cu.mem_free(d);
	return NULL;
}

static int mode_threads(int n)
{
	struct worker ws[64];
	struct stub_cuda_copy_stats a = copy_stats(), b;

	if (n < 1 || n > 64)
		n = 8;
	for (int i = 0; i < n; i++) {
		ws[i].id = (unsigned)i;
		pthread_create(&ws[i].t, NULL, copier, &ws[i]);
	}
	for (int i = 0; i < n; i++)
		pthread_join(ws[i].t, NULL);
	b = copy_stats();
	/* Each thread's copies are exact; staged, some went through pinned memory (the ring is one per process: the
	 * others may go to the driver, never wait for it). */
	if (expect_staged)
		CHECK(b.pinned_bytes > a.pinned_bytes, "no copy of %d threads was staged", n);
	printf("threads %s: %d threads, pageable %llu bytes, pinned %llu bytes, %d failures\n", BUILD, n,
	       (unsigned long long)(b.pageable_bytes - a.pageable_bytes),
	       (unsigned long long)(b.pinned_bytes - a.pinned_bytes), atomic_load(&failures));
	return atomic_load(&failures) ? 1 : 0;
}

static atomic_bool stop_copying;

static void *copy_loop(void *arg)
{
	unsigned i = 0;

	(void)arg;
	enter();
	{
		CUdeviceptr d = dev_alloc(3 * slot + 3 + 64 + GUARD);
		CUstream st = stream_new();

		for (; !atomic_load(&stop_copying); i++)
			round_trip(d, 0, 3 * slot + 3, i % 64, FORM_ASYNC, FORM_ASYNC, st, 5000 + i, false);
		cu.stream_destroy(st);
		cu.mem_free(d);
	}
	return NULL;
}

static int mode_fork(void)
{
	size_t n = 3 * slot + 3;
	CUdeviceptr d = dev_alloc(n + 64 + GUARD);
	CUstream st = stream_new();
	int hung = 0, bad = 0;
	pthread_t t;

	alarm(120);
	round_trip(d, 0, n, 0, FORM_SYNC, FORM_SYNC, st, 1, true); /* the parent has its ring */
	/* Forked while nothing copies: the child has no ring of the parent's, and stages through one of its own. */
	{
		int status;
		pid_t pid;

		fflush(NULL);
		pid = fork();
		if (pid == 0) {
			alarm(20);
			round_trip(d, 3, n, 5, FORM_ASYNC, FORM_SYNC, st, 50, true);
			round_trip(d, 0, n, 0, FORM_SYNC, FORM_UNIFIED, NULL, 51, true);
			_exit(atomic_load(&failures) ? 1 : 0);
		}
		CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "a child forked while nothing copied: its copies were not exact, or not staged");
	}
	pthread_create(&t, NULL, copy_loop, NULL);
	for (int i = 0; i < 6; i++) {
		int status;
		pid_t pid;

		fflush(NULL);
		pid = fork();
		if (pid == 0) {
			/* The child copies exactly, with the parent's copying thread gone (through a ring of its own or the
			 * driver: it may have been forked in the middle of the thread's copy). */
			alarm(20);
			for (unsigned j = 0; j < 3; j++)
				round_trip(d, j, n, j * 5, j % N_FORMS, (j + 1) % N_FORMS, j % 2 ? st : NULL, 100 + j,
					   false);
			_exit(atomic_load(&failures) ? 1 : 0);
		}
		if (pid < 0 || waitpid(pid, &status, 0) != pid) {
			bad++;
			continue;
		}
		if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
			hung++;
		else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
			bad++;
	}
	atomic_store(&stop_copying, true);
	pthread_join(t, NULL);
	CHECK(hung == 0, "%d of 6 children hung", hung);
	CHECK(bad == 0, "%d of 6 children failed their copies", bad);
	round_trip(d, 0, n, 0, FORM_ASYNC, FORM_SYNC, st, 2, true); /* and the parent's still work */
	cu.stream_destroy(st);
	cu.mem_free(d);
	printf("fork %s: %d failures\n", BUILD, atomic_load(&failures));
	return atomic_load(&failures) ? 1 : 0;
}

static int mode_capture(void)
{
	size_t n = 2 * slot + 1;
	CUdeviceptr d = dev_alloc(n);
	CUstream st = stream_new();
	unsigned char *src = malloc(n), *out = malloc(n);
	struct stub_cuda_copy_stats a, b;
	void *graph = NULL;

	CHECK(cu.fill(st, d, 0x66, n) == 0 && cu.stream_sync(st) == 0, "fill");
	fill_pat(src, n, 7);
	memset(out, 0x5A, n);
	CHECK(cu.begin_capture(st, 0) == 0, "cuStreamBeginCapture");
	a = copy_stats();
	CHECK(h2d(FORM_ASYNC, d, src, n, st) == 0, "H2D while capturing");
	CHECK(d2h(FORM_UNIFIED_ASYNC, out, d, n, st) == 0, "D2H while capturing");
	b = copy_stats();
	CHECK(cu.end_capture(st, &graph) == 0 && graph, "cuStreamEndCapture");
	/* The driver saw both copies as the program made them, recorded into the graph. */
	CHECK(b.captured_copies - a.captured_copies == 2 && b.pageable_copies - a.pageable_copies == 2 &&
		      b.pageable_bytes - a.pageable_bytes == 2 * n && b.pinned_bytes == a.pinned_bytes,
	      "captured copies: the driver saw %llu captured, %llu pageable (%llu bytes), %llu pinned bytes",
	      (unsigned long long)(b.captured_copies - a.captured_copies),
	      (unsigned long long)(b.pageable_copies - a.pageable_copies),
	      (unsigned long long)(b.pageable_bytes - a.pageable_bytes),
	      (unsigned long long)(b.pinned_bytes - a.pinned_bytes));
	/* Nothing ran. */
	CHECK(cu.ctx_sync() == 0, "synchronise");
	CHECK(first_not((unsigned char *)(uintptr_t)d, n, 0x66) == n, "a captured H2D ran");
	CHECK(first_not(out, n, 0x5A) == n, "a captured D2H ran");
	if (graph)
		cu.graph_destroy(graph);
	/* After the capture, the stream's copies are ordinary again. */
	{
		CUdeviceptr d2 = dev_alloc(n + 64 + GUARD);

		round_trip(d2, 0, n, 3, FORM_ASYNC, FORM_ASYNC, st, 8, true);
		cu.mem_free(d2);
	}
	cu.stream_destroy(st);
	cu.mem_free(d);
	free(src);
	free(out);
	printf("capture %s: %d failures\n", BUILD, atomic_load(&failures));
	return atomic_load(&failures) ? 1 : 0;
}

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
	if (managed_host)
		UNTOUCHED(device_copies, device_bytes, n, what);
	else if (pinned_host)
		UNTOUCHED(pinned_copies, pinned_bytes, n, what);
	else
		UNTOUCHED(pageable_copies, pageable_bytes, n, what);
	CHECK(cu.ctx_sync() == 0, "synchronise");
	a = copy_stats();
	CHECK(d2h(f, dst, d, n, st) == 0, "%s: D2H", what);
	CHECK(cu.ctx_sync() == 0, "synchronise");
	b = copy_stats();
	if (managed_host)
		UNTOUCHED(device_copies, device_bytes, n, what);
	else if (pinned_host)
		UNTOUCHED(pinned_copies, pinned_bytes, n, what);
	else
		UNTOUCHED(pageable_copies, pageable_bytes, n, what);
	bad = first_bad(dst, n, 40 + f, 0);
	CHECK(bad == n, "%s (%s): byte %zu differs", what, form_names[f], bad);
	cu.mem_free(d);
}

static int mode_passthrough(void)
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
static int mode_contexts(void)
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

static int mode_fail(void)
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

static int mode_revoke(void)
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

static int mode_hold(void)
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
static int mode_selftest(void)
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

int main(int argc, char **argv)
{
	const char *e = getenv("PB_EXPECT");

	if (argc < 3) {
		fprintf(stderr,
			"usage: %s sizes|order|threads N|fork|contexts|capture|passthrough|fail|revoke|hold|selftest WAY\n",
			argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	slot = env_size("PINBROKER_STAGING_SLOT", 8 << 20);
	ring = env_size("PINBROKER_STAGING_RING", 64 << 20);
	threshold = env_size("PINBROKER_STAGING_THRESHOLD", 1 << 20);
	expect_staged = e && strcmp(e, "staged") == 0;
	load_driver();
	enter();
	if (!pick_way(argv[2])) {
		fprintf(stderr, "no way %s in the %s build\n", argv[2], BUILD);
		return 2;
	}
	if (strcmp(argv[1], "sizes") == 0)
		return mode_sizes();
	if (strcmp(argv[1], "order") == 0)
		return mode_order();
	if (strcmp(argv[1], "threads") == 0)
		return mode_threads(argc > 3 ? atoi(argv[3]) : 8);
	if (strcmp(argv[1], "fork") == 0)
		return mode_fork();
	if (strcmp(argv[1], "capture") == 0)
		return mode_capture();
	if (strcmp(argv[1], "passthrough") == 0)
		return mode_passthrough();
	if (strcmp(argv[1], "fail") == 0)
		return mode_fail();
	if (strcmp(argv[1], "revoke") == 0)
		return mode_revoke();
	if (strcmp(argv[1], "hold") == 0)
		return mode_hold();
	if (strcmp(argv[1], "contexts") == 0)
		return mode_contexts();
	if (strcmp(argv[1], "selftest") == 0)
		return mode_selftest();
	fprintf(stderr, "unknown mode %s\n", argv[1]);
	return 2;
}

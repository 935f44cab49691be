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
#include "copy_target.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct way w;
struct driver cu;
void *ctx;
size_t slot, ring, threshold;
bool expect_staged;
atomic_int failures;

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

void *need(void *h, const char *name)
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
void enter(void)
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

const char *const form_names[] = { "sync", "async", "unified", "unified-async" };

CUresult h2d(enum form f, CUdeviceptr d, const void *s, size_t n, CUstream st)
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

CUresult d2h(enum form f, void *d, CUdeviceptr s, size_t n, CUstream st)
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

struct stub_cuda_copy_stats copy_stats(void)
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

void fill_pat(unsigned char *p, size_t n, unsigned seed)
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

size_t first_bad(const unsigned char *p, size_t n, unsigned seed, int add)
{
	return first_bad_from(p, n, seed, add, 0);
}

size_t first_not(const unsigned char *p, size_t n, unsigned char byte)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != byte)
			return i;
	return n;
}

/*
 * One round trip of n bytes: host (pageable, at hoff) to device (at doff of dev, which holds doff + n + GUARD)
 * and back to other host memory, with forms fh and fd on stream st. Checks the bytes at each end, that nothing
 * around them was written, that the source could be reused when H2D returned (it is scribbled over at once) and
 * that D2H's data was in place when it returned; route: also what the driver saw of each copy.
 */
void round_trip(CUdeviceptr dev, size_t doff, size_t n, size_t hoff, enum form fh, enum form fd, CUstream st,
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

CUdeviceptr dev_alloc(size_t n)
{
	CUdeviceptr d = 0;

	if (cu.mem_alloc(&d, n) != 0) {
		fprintf(stderr, "cuMemAlloc of %zu bytes failed\n", n);
		exit(2);
	}
	return d;
}

CUstream stream_new(void)
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
		tally_child(pid, &bad, &hung);
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

/* The modes by name (threads, which takes its ARG, apart). */
static const struct {
	const char *name;
	int (*run)(void);
} modes[] = {
	{ "sizes", mode_sizes },
	{ "order", mode_order },
	{ "fork", mode_fork },
	{ "capture", mode_capture },
	{ "passthrough", mode_passthrough },
	{ "fail", mode_fail },
	{ "revoke", mode_revoke },
	{ "hold", mode_hold },
	{ "contexts", mode_contexts },
	{ "selftest", mode_selftest },
};

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
	if (strcmp(argv[1], "threads") == 0)
		return mode_threads(argc > 3 ? atoi(argv[3]) : 8);
	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++)
		if (strcmp(argv[1], modes[i].name) == 0)
			return modes[i].run();
	fprintf(stderr, "unknown mode %s\n", argv[1]);
	return 2;
}

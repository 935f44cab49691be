/* SPDX-License-Identifier: MIT */
/*
 * An unmodified CUDA runtime program: it includes nothing of pinbroker and uses every pinned-memory entry point of
 * the runtime, so run under `pinctl run` it tests libpinbroker-preload.so, and run bare it is the baseline.
 *
 * usage: preload_prog probe              print the GPU; exit 0, or 77 without one
 *        preload_prog check              every check, PASS/FAIL lines; exit 0 when all passed, 1 if not
 *        preload_prog hold SIZE...       cudaHostAlloc each SIZE (a "pinned BYTES in S s, written in S s" line
 *                                        each), print "hold PTR...", wait, free, print "released", exit 0
 *        preload_prog expect-oom SIZE    exit 0 when cudaHostAlloc and cudaMallocHost of SIZE fail with
 *                                        cudaErrorMemoryAllocation
 *        preload_prog bench              "bench NAME BYTES VALUE" lines: H2D GB/s, alloc/free ms
 * env:   PB_HOLD_RELEASE   hold frees once this file exists (without it: once stdin closes)
 *        PB_HOLD_EXIT      after freeing, hold exits only once this file exists (so a script can look at the
 *                          broker while the freed process still lives)
 *        PB_HOLD_START     hold first makes its CUDA context, prints "ready" and pins only once this file exists
 *                          (so a script can measure the host's memory with the context alone, then with the pins)
 *        PB_HOLD_KIND      what hold pins: alloc (cudaHostAlloc, default), register (posix_memalign +
 *                          cudaHostRegister), wc (cudaHostAlloc WriteCombined), mapped (cudaHostAlloc Mapped)
 *        PB_HOLD_TIMEOUT_S hold gives up after this long in each wait (default 300), exit 1
 * Exits 77 without a usable GPU.
 */
#include <cuda_runtime.h>

#include "preload_common.h"

#define THREAD_ROUNDS 24
#define BENCH_COPY_REPS 9 /* medians of 9, as in /work/shared/GPU.md's anchors */
#define BENCH_ALLOC_REPS 5

/* A CUDA call that must succeed: a FAIL line naming it, and false, when it does not. */
#define OK(call) cuda_ok((call), #call, __LINE__)
static int cuda_ok(cudaError_t e, const char *what, int line)
{
	if (e == cudaSuccess)
		return 1;
	report(0, "line %d: %s: %s (%d)", line, what, cudaGetErrorString(e), (int)e);
	return 0;
}

/* Reads and writes host memory through its device pointer: p[i] = p[i] * 3 + add + i. */
__global__ void bump(uint32_t *p, size_t n, uint32_t add)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n)
		p[i] = p[i] * 3u + add + (uint32_t)i;
}

/*
 * Host memory h of bytes (pinned, by alloc or registration): the kernel goes through cudaHostGetDevicePointer's
 * pointer, the host checks every word. At most max_words words (write-combined memory reads slowly on the host).
 */
static int mapped_kernel_ok(const char *what, void *h, size_t bytes, size_t max_words, cudaStream_t st)
{
	size_t n = bytes / 4 < max_words ? bytes / 4 : max_words;
	uint32_t *w = (uint32_t *)h, add = 0x5bd1e995u;
	void *d = NULL;
	unsigned blocks;

	if (n == 0)
		return 1;
	if (!OK(cudaHostGetDevicePointer(&d, h, 0)))
		return report(0, "%s: no device pointer", what);
	for (size_t i = 0; i < n; i++)
		w[i] = (uint32_t)(i * 2654435761u);
	blocks = (unsigned)((n + 255) / 256);
	bump<<<blocks, 256, 0, st>>>((uint32_t *)d, n, add);
	if (!OK(cudaGetLastError()) || !OK(cudaStreamSynchronize(st)))
		return 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t want = (uint32_t)(i * 2654435761u) * 3u + add + (uint32_t)i;
		if (w[i] != want)
			return report(0, "%s: mapped kernel: word %zu is %#x, want %#x", what, i, w[i], want);
	}
	return 1;
}

/* H2D from pinned src, D2H into pinned dst (both bytes long), on st; dst must equal src. */
static int copy_round_ok(const char *what, void *src, void *dst, size_t bytes, uint64_t seed, cudaStream_t st)
{
	void *dev = NULL;
	long long bad;
	int ok = 1;

	if (!OK(cudaMalloc(&dev, bytes)))
		return 0;
	fill(src, bytes, seed);
	memset(dst, 0xa5, bytes);
	ok = OK(cudaMemcpyAsync(dev, src, bytes, cudaMemcpyHostToDevice, st)) &&
	     OK(cudaMemcpyAsync(dst, dev, bytes, cudaMemcpyDeviceToHost, st)) && OK(cudaStreamSynchronize(st));
	if (ok && (bad = unlike(dst, bytes, seed)) >= 0)
		ok = report(0, "%s: H2D+D2H of %zu bytes: byte %lld differs", what, bytes, bad);
	cudaFree(dev);
	return ok;
}

static const char *flag_name(unsigned f)
{
	switch (f) {
	case cudaHostAllocDefault:
		return "Default";
	case cudaHostAllocPortable:
		return "Portable";
	case cudaHostAllocMapped:
		return "Mapped";
	case cudaHostAllocWriteCombined:
		return "WriteCombined";
	default:
		return "?";
	}
}

/*
 * cudaHostGetFlags must succeed and include the Mapped/WriteCombined bits asked for. Portable is not
 * judged: under UVA all pinned memory is portable, and the H200's driver once answered 0x2 for a
 * Portable allocation made by a second thread (run-preload.sh, bare, 2026-12-03).
 */
static int flags_ok(const char *what, void *p, unsigned asked)
{
	unsigned got = 0, want = asked & (cudaHostAllocMapped | cudaHostAllocWriteCombined);

	if (!OK(cudaHostGetFlags(&got, p)))
		return report(0, "%s: cudaHostGetFlags failed", what);
	if ((got & want) != want)
		return report(0, "%s: cudaHostGetFlags = %#x lacks %#x", what, got, want);
	return 1;
}

/* ---------------------------------------------------------------- check */

/* What cudaPointerGetAttributes (torch's is_pinned) says: pinned host memory, or (want_pinned 0) not. */
static int pinned_ok(const char *what, void *p, int want_pinned)
{
	struct cudaPointerAttributes at;
	cudaError_t e = cudaPointerGetAttributes(&at, p);
	int pinned = e == cudaSuccess && at.type == cudaMemoryTypeHost;

	(void)cudaGetLastError();
	if (pinned == want_pinned)
		return 1;
	return report(0, "%s: cudaPointerGetAttributes: %s (error %d, type %d)", what,
		      want_pinned ? "not pinned host memory" : "still pinned", (int)e,
		      e == cudaSuccess ? (int)at.type : -1);
}

/* cudaHostGetFlags on registered memory is the driver's business (documented for cudaHostAlloc memory only): noted,
 * not judged, so a bare run and an interposed run can be compared line by line. */
static void note_flags(const char *what, void *p)
{
	unsigned got = 0;
	cudaError_t e = cudaHostGetFlags(&got, p);

	(void)cudaGetLastError();
	pthread_mutex_lock(&g_out_lock);
	printf("INFO %s: cudaHostGetFlags = %d, flags %#x\n", what, (int)e, e == cudaSuccess ? got : 0);
	pthread_mutex_unlock(&g_out_lock);
}

static void check_host_alloc(cudaStream_t st)
{
	static const unsigned flags[] = { cudaHostAllocDefault, cudaHostAllocPortable, cudaHostAllocMapped,
					  cudaHostAllocWriteCombined };
	static const size_t sizes[] = { 1, 4097, 3 * MIB + 5, 64 * MIB + 123 };

	for (size_t fi = 0; fi < sizeof(flags) / sizeof(flags[0]); fi++) {
		for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
			unsigned f = flags[fi];
			size_t n = sizes[si];
			int wc = f == cudaHostAllocWriteCombined;
			void *a = NULL, *b = NULL;
			char what[96];
			int ok;

			snprintf(what, sizeof(what), "cudaHostAlloc(%zu, %s)", n, flag_name(f));
			if (!OK(cudaHostAlloc(&a, n, f)) || !OK(cudaHostAlloc(&b, n, f))) {
				cudaFreeHost(a);
				continue;
			}
			ok = flags_ok(what, a, f) && flags_ok(what, b, f) && pinned_ok(what, a, 1);
			/* Write-combined reads are uncached: verify it in full only up to 3 MiB. */
			ok = ok &&
			     (!wc || n <= 3 * MIB + 5 ? copy_round_ok(what, a, b, n, 1000 + fi * 10 + si, st) : 1);
			ok = ok && mapped_kernel_ok(what, a, n, wc ? 65536 : (size_t)-1, st);
			ok = OK(cudaFreeHost(a)) && ok;
			ok = OK(cudaFreeHost(b)) && ok;
			report(ok, "%s: flags, H2D/D2H, mapped kernel, free", what);
		}
	}
}

static void check_malloc_host(cudaStream_t st)
{
	static const size_t sizes[] = { 1, 4097, 64 * MIB + 123 };

	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		size_t n = sizes[si];
		void *a = NULL, *b = NULL;
		char what[64];
		int ok;

		snprintf(what, sizeof(what), "cudaMallocHost(%zu)", n);
		if (!OK(cudaMallocHost(&a, n)) || !OK(cudaMallocHost(&b, n))) {
			cudaFreeHost(a);
			continue;
		}
		ok = flags_ok(what, a, 0) && pinned_ok(what, a, 1) && copy_round_ok(what, a, b, n, 2000 + si, st) &&
		     mapped_kernel_ok(what, b, n, (size_t)-1, st);
		ok = OK(cudaFreeHost(a)) && ok;
		ok = OK(cudaFreeHost(b)) && ok;
		report(ok, "%s: flags, H2D/D2H, mapped kernel, free", what);
	}
	report(cudaFreeHost(NULL) == cudaSuccess, "cudaFreeHost(NULL) succeeds");
}

static void check_register(cudaStream_t st)
{
	static const unsigned flags[] = { cudaHostRegisterDefault, cudaHostRegisterPortable, cudaHostRegisterMapped };
	static const size_t sizes[] = { PAGE_BYTES, 4 * MIB + PAGE_BYTES, 64 * MIB };

	for (size_t fi = 0; fi < sizeof(flags) / sizeof(flags[0]); fi++) {
		for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
			unsigned f = flags[fi];
			size_t n = sizes[si];
			void *a = NULL, *b = NULL;
			char what[96];
			cudaError_t e;
			int ok;

			snprintf(what, sizeof(what), "cudaHostRegister(%zu, %s)", n,
				 f == cudaHostRegisterMapped ? "Mapped"
				 : f                         ? "Portable"
							     : "Default");
			if (posix_memalign(&a, PAGE_BYTES, n) || posix_memalign(&b, PAGE_BYTES, n)) {
				report(0, "%s: posix_memalign: out of memory", what);
				free(a);
				continue;
			}
			ok = OK(cudaHostRegister(a, n, f));
			ok = ok && OK(cudaHostRegister(b, n, f));
			if (ok)
				note_flags(what, a);
			ok = ok && pinned_ok(what, a, 1) && copy_round_ok(what, a, b, n, 3000 + fi * 10 + si, st) &&
			     mapped_kernel_ok(what, a, n, (size_t)-1, st);
			if (ok) {
				e = cudaHostRegister(a, n, f);
				(void)cudaGetLastError();
				ok = report(
					e == cudaErrorHostMemoryAlreadyRegistered,
					"%s: registering it again gives cudaErrorHostMemoryAlreadyRegistered (got %d)",
					what, (int)e);
			}
			ok = OK(cudaHostUnregister(a)) && ok;
			ok = OK(cudaHostUnregister(b)) && ok;
			ok = pinned_ok(what, a, 0) && ok; /* not pinned after unregister */
			e = cudaHostUnregister(a);
			(void)cudaGetLastError();
			ok = report(e == cudaErrorHostMemoryNotRegistered,
				    "%s: unregistering twice gives cudaErrorHostMemoryNotRegistered (got %d)", what,
				    (int)e) &&
			     ok;
			free(a);
			free(b);
			report(ok, "%s: flags, H2D/D2H, mapped kernel, unregister", what);
		}
	}
}

static void check_pageable_flags(void)
{
	void *p = malloc(PAGE_BYTES);
	unsigned got = 0;
	cudaError_t e = cudaHostGetFlags(&got, p);

	(void)cudaGetLastError();
	report(e != cudaSuccess, "cudaHostGetFlags on malloc'd memory fails (got %d)", (int)e);
	free(p);
}

struct worker {
	int id;
	int ok;
};

/* Every entry point again, from several threads at once, each on its own stream. */
static void *worker_main(void *arg)
{
	static const unsigned flags[] = { cudaHostAllocDefault, cudaHostAllocPortable, cudaHostAllocMapped,
					  cudaHostAllocWriteCombined };
	struct worker *w = (struct worker *)arg;
	uint64_t rng = 77 + (uint64_t)w->id;
	cudaStream_t st;
	char what[96];

	w->ok = 1;
	if (!OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking))) {
		w->ok = 0;
		return NULL;
	}
	for (int r = 0; r < THREAD_ROUNDS && w->ok; r++) {
		size_t n = 1 + (size_t)(mix(&rng) % (8 * MIB));
		unsigned f = flags[mix(&rng) % 4];
		size_t rn = PAGE_BYTES * (1 + (size_t)(mix(&rng) % 512));
		void *a = NULL, *b = NULL, *reg = NULL;
		int ok;

		snprintf(what, sizeof(what), "thread %d round %d: cudaHostAlloc(%zu, %s)", w->id, r, n, flag_name(f));
		if (!OK(cudaHostAlloc(&a, n, f))) {
			w->ok = 0;
			break;
		}
		ok = OK(r % 2 ? cudaMallocHost(&b, n) : cudaHostAlloc(&b, n, cudaHostAllocPortable));
		ok = ok && flags_ok(what, a, f) && copy_round_ok(what, a, b, n, mix(&rng), st) &&
		     mapped_kernel_ok(what, a, n, f == cudaHostAllocWriteCombined ? 4096 : (size_t)-1, st);
		if (ok && posix_memalign(&reg, PAGE_BYTES, rn) == 0) {
			ok = OK(cudaHostRegister(reg, rn, r % 3 == 0 ? cudaHostRegisterMapped : 0)) &&
			     copy_round_ok(what, reg, b, rn < n ? rn : n, mix(&rng), st) &&
			     mapped_kernel_ok(what, reg, rn, (size_t)-1, st);
			ok = OK(cudaHostUnregister(reg)) && ok;
			free(reg);
		}
		ok = OK(cudaFreeHost(a)) && ok;
		if (b)
			ok = OK(cudaFreeHost(b)) && ok;
		w->ok = ok;
	}
	cudaStreamDestroy(st);
	return NULL;
}

static void check_threads(void)
{
	pthread_t t[THREADS];
	struct worker w[THREADS];
	int ok = 1;

	for (int i = 0; i < THREADS; i++) {
		w[i].id = i;
		w[i].ok = 0;
		if (pthread_create(&t[i], NULL, worker_main, &w[i]))
			return (void)report(0, "pthread_create failed");
	}
	for (int i = 0; i < THREADS; i++) {
		pthread_join(t[i], NULL);
		ok = ok && w[i].ok;
	}
	report(ok, "%d threads x %d rounds: cudaHostAlloc/cudaMallocHost/cudaHostRegister, copies, mapped kernels",
	       THREADS, THREAD_ROUNDS);
}

static int cmd_check(void)
{
	cudaStream_t st;

	if (!OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)))
		return 1;
	check_host_alloc(st);
	check_malloc_host(st);
	check_register(st);
	check_pageable_flags();
	check_threads();
	report(cudaDeviceSynchronize() == cudaSuccess, "no asynchronous error left");
	cudaStreamDestroy(st);
	printf("preload_prog: %d passed, %d failed\n", g_pass, g_fail);
	return g_fail ? 1 : 0;
}

/* ---------------------------------------------------------------- hold, expect-oom */

static int rt_alloc(void **p, size_t bytes, unsigned flags)
{
	return (int)cudaHostAlloc(p, bytes, flags);
}

static int rt_alloc_host(void **p, size_t bytes)
{
	return (int)cudaMallocHost(p, bytes);
}

static int rt_register(void *p, size_t bytes)
{
	return (int)cudaHostRegister(p, bytes, cudaHostRegisterDefault);
}

static int rt_free(void *p)
{
	return (int)cudaFreeHost(p);
}

static int rt_unregister(void *p)
{
	return (int)cudaHostUnregister(p);
}

static const char *rt_error(int e)
{
	return cudaGetErrorString((cudaError_t)e);
}

/* A refused allocation leaves its error as the last one: cleared, so later calls are judged on their own. */
static void rt_clear(void)
{
	(void)cudaGetLastError();
}

static const struct pin_api runtime_api = {
	"cudaHostAlloc",
	"cudaMallocHost",
	"cudaHostRegister",
	"cudaFreeHost",
	"cudaHostUnregister",
	"cudaErrorMemoryAllocation",
	cudaErrorMemoryAllocation,
	rt_alloc,
	rt_alloc_host,
	rt_register,
	rt_free,
	rt_unregister,
	rt_error,
	rt_clear,
	cudaHostAllocDefault,
	cudaHostAllocWriteCombined,
	cudaHostAllocMapped,
	1,
};

/* PB_HOLD_START: the context made first ("ready"), then the pinning waits for that file. */
static int hold_start(double timeout_s)
{
	cudaError_t e;

	if (!getenv("PB_HOLD_START"))
		return 0;
	e = cudaFree(0);
	if (e != cudaSuccess) {
		printf("FAIL cudaFree(0): %s (%d)\n", cudaGetErrorString(e), (int)e);
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	if (wait_release("PB_HOLD_START", timeout_s) < 0) {
		printf("FAIL hold: no start file in time\n");
		return 1;
	}
	return 0;
}

/* ---------------------------------------------------------------- bench */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int cmd_bench(void)
{
	static const size_t copy_sizes[] = { 64 * MIB, 256 * MIB, 1024 * MIB };
	static const size_t alloc_sizes[] = { 64 * MIB, 1024 * MIB };
	cudaStream_t st;
	cudaEvent_t e0, e1;
	void *p = NULL;

	if (!OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)) || !OK(cudaEventCreate(&e0)) ||
	    !OK(cudaEventCreate(&e1)))
		return 1;
	/* First use pays for the context (and, interposed, the broker connection): not part of any figure. */
	if (!OK(cudaHostAlloc(&p, PAGE_BYTES, 0)) || !OK(cudaFreeHost(p)))
		return 1;
	for (size_t si = 0; si < sizeof(copy_sizes) / sizeof(copy_sizes[0]); si++) {
		size_t n = copy_sizes[si];
		double ms[BENCH_COPY_REPS];
		void *d = NULL;
		float f;

		if (!OK(cudaHostAlloc(&p, n, 0)))
			return 1;
		if (!OK(cudaMalloc(&d, n))) {
			cudaFreeHost(p);
			return 1;
		}
		memset(p, 1, n);
		if (!OK(cudaMemcpyAsync(d, p, n, cudaMemcpyHostToDevice, st)) || !OK(cudaStreamSynchronize(st)))
			return 1;
		for (int r = 0; r < BENCH_COPY_REPS; r++) {
			if (!OK(cudaEventRecord(e0, st)) || !OK(cudaMemcpyAsync(d, p, n, cudaMemcpyHostToDevice, st)) ||
			    !OK(cudaEventRecord(e1, st)) || !OK(cudaEventSynchronize(e1)) ||
			    !OK(cudaEventElapsedTime(&f, e0, e1)))
				return 1;
			ms[r] = f;
		}
		printf("bench h2d_gbps %zu %.2f\n", n, (double)n / 1e6 / median(ms, BENCH_COPY_REPS));
		fflush(stdout);
		cudaFree(d);
		cudaFreeHost(p);
	}
	for (size_t si = 0; si < sizeof(alloc_sizes) / sizeof(alloc_sizes[0]); si++) {
		size_t n = alloc_sizes[si];
		double a[BENCH_ALLOC_REPS], fr[BENCH_ALLOC_REPS], both[BENCH_ALLOC_REPS];

		for (int r = 0; r < BENCH_ALLOC_REPS; r++) {
			double t0 = now_ms(), t1, t2;

			if (!OK(cudaHostAlloc(&p, n, 0)))
				return 1;
			t1 = now_ms();
			if (!OK(cudaFreeHost(p)))
				return 1;
			t2 = now_ms();
			a[r] = t1 - t0;
			fr[r] = t2 - t1;
			both[r] = t2 - t0;
		}
		printf("bench alloc_ms %zu %.3f\n", n, median(a, BENCH_ALLOC_REPS));
		printf("bench free_ms %zu %.3f\n", n, median(fr, BENCH_ALLOC_REPS));
		printf("bench alloc_free_ms %zu %.3f\n", n, median(both, BENCH_ALLOC_REPS));
		fflush(stdout);
	}
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	cudaStreamDestroy(st);
	return 0;
}

int main(int argc, char **argv)
{
	int count = 0;
	cudaError_t e;

	if (argc < 2) {
		fprintf(stderr, "usage: %s probe | check | hold SIZE... | expect-oom SIZE | bench\n", argv[0]);
		return 2;
	}
	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess || count == 0) {
		printf("SKIP: no usable CUDA device: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "none");
		return EXIT_SKIP;
	}
	if (!strcmp(argv[1], "probe")) {
		struct cudaDeviceProp prop;
		int drv = 0, rt = 0;

		if (!OK(cudaGetDeviceProperties(&prop, 0)))
			return 1;
		cudaDriverGetVersion(&drv);
		cudaRuntimeGetVersion(&rt);
		printf("GPU: %s (sm_%d%d, %d device%s), driver API %d.%d, runtime %d.%d\n", prop.name, prop.major,
		       prop.minor, count, count == 1 ? "" : "s", drv / 1000, drv % 1000 / 10, rt / 1000,
		       rt % 1000 / 10);
		return 0;
	}
	if (!strcmp(argv[1], "check"))
		return cmd_check();
	if (!strcmp(argv[1], "hold"))
		return hold_pinned(&runtime_api, argc - 2, argv + 2, hold_start);
	if (!strcmp(argv[1], "expect-oom") && argc == 3)
		return expect_oom(&runtime_api, argv[2]);
	if (!strcmp(argv[1], "bench"))
		return cmd_bench();
	fprintf(stderr, "usage: %s probe | check | hold SIZE... | expect-oom SIZE | bench\n", argv[0]);
	return 2;
}

/* SPDX-License-Identifier: MIT */
/*
 * An unmodified CUDA driver-API program (libcuda only, nothing of pinbroker) that uses every pinned-memory entry
 * point of the driver, so run under `pinctl run` it tests libpinbroker-preload.so's cuMem* hooks.
 *
 * usage: preload_driver check            every check, PASS/FAIL lines; exit 0 when all passed, 1 if not
 *        preload_driver hold SIZE...     cuMemHostAlloc each SIZE, print "hold PTR...", wait, free, print
 *                                        "released", exit 0
 *        preload_driver expect-oom SIZE  exit 0 when cuMemHostAlloc and cuMemAllocHost of SIZE fail with
 *                                        CUDA_ERROR_OUT_OF_MEMORY
 * env:   PB_HOLD_RELEASE   hold frees once this file exists (without it: once stdin closes)
 *        PB_HOLD_EXIT      after freeing, hold exits only once this file exists
 *        PB_HOLD_KIND      what hold pins: alloc (cuMemHostAlloc 0, default), register (posix_memalign +
 *                          cuMemHostRegister), wc (WRITECOMBINED), mapped (DEVICEMAP)
 *        PB_HOLD_TIMEOUT_S hold gives up after this long in each wait (default 300), exit 1
 * Exits 77 without a usable GPU. cuda.h maps cuMemAllocHost, cuMemHostRegister, cuMemHostGetDevicePointer,
 * cuMemcpyHtoD and cuMemcpyDtoH to their _v2 symbols; cuMemHostAlloc, cuMemFreeHost, cuMemHostGetFlags and
 * cuMemHostUnregister keep their plain names.
 */
#include <cuda.h>

#include "preload_common.h"

#define THREAD_ROUNDS 16

/* p[i] = p[i] * 3 + add + i over n 32-bit words: the kernel that reads and writes host memory via its device
 * pointer. Hand-written PTX (checked with ptxas for sm_90), JIT-compiled by the driver: no nvcc needed here. */
static const char bump_ptx[] = ".version 7.0\n"
			       ".target sm_52\n"
			       ".address_size 64\n"
			       ".visible .entry bump(.param .u64 p, .param .u64 n, .param .u32 add)\n"
			       "{\n"
			       "	.reg .pred %p1;\n"
			       "	.reg .b32 %r<8>;\n"
			       "	.reg .b64 %rd<8>;\n"
			       "	ld.param.u64 %rd1, [p];\n"
			       "	ld.param.u64 %rd2, [n];\n"
			       "	ld.param.u32 %r1, [add];\n"
			       "	mov.u32 %r2, %ctaid.x;\n"
			       "	mov.u32 %r3, %ntid.x;\n"
			       "	mov.u32 %r4, %tid.x;\n"
			       "	cvt.u64.u32 %rd4, %r4;\n"
			       "	mad.wide.u32 %rd3, %r2, %r3, %rd4;\n"
			       "	setp.ge.u64 %p1, %rd3, %rd2;\n"
			       "	@%p1 bra DONE;\n"
			       "	cvta.to.global.u64 %rd7, %rd1;\n"
			       "	shl.b64 %rd5, %rd3, 2;\n"
			       "	add.s64 %rd6, %rd7, %rd5;\n"
			       "	ld.global.u32 %r5, [%rd6];\n"
			       "	mul.lo.u32 %r5, %r5, 3;\n"
			       "	add.u32 %r6, %r5, %r1;\n"
			       "	cvt.u32.u64 %r7, %rd3;\n"
			       "	add.u32 %r6, %r6, %r7;\n"
			       "	st.global.u32 [%rd6], %r6;\n"
			       "DONE:\n"
			       "	ret;\n"
			       "}\n";

static CUcontext g_ctx;
static CUfunction g_bump;

#define OK(call) cu_ok((call), #call, __LINE__)
static int cu_ok(CUresult r, const char *what, int line)
{
	const char *s = NULL;

	if (r == CUDA_SUCCESS)
		return 1;
	cuGetErrorName(r, &s);
	report(0, "line %d: %s: %s (%d)", line, what, s ? s : "?", (int)r);
	return 0;
}

/* The bump kernel on h through cuMemHostGetDevicePointer's pointer; the host checks at most max_words words. */
static int mapped_kernel_ok(const char *what, void *h, size_t bytes, size_t max_words, CUstream st)
{
	size_t n = bytes / 4 < max_words ? bytes / 4 : max_words;
	uint32_t *w = h, add = 0x5bd1e995u;
	CUdeviceptr d = 0;
	void *args[3];

	if (n == 0)
		return 1;
	if (!OK(cuMemHostGetDevicePointer(&d, h, 0)))
		return report(0, "%s: no device pointer", what);
	for (size_t i = 0; i < n; i++)
		w[i] = (uint32_t)(i * 2654435761u);
	args[0] = &d;
	args[1] = &n;
	args[2] = &add;
	if (!OK(cuLaunchKernel(g_bump, (unsigned)((n + 255) / 256), 1, 1, 256, 1, 1, 0, st, args, NULL)) ||
	    !OK(cuStreamSynchronize(st)))
		return 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t want = (uint32_t)(i * 2654435761u) * 3u + add + (uint32_t)i;

		if (w[i] != want)
			return report(0, "%s: mapped kernel: word %zu is %#x, want %#x", what, i, w[i], want);
	}
	return 1;
}

/* cuMemcpyHtoD from src, cuMemcpyDtoH into dst; dst must equal src. */
static int copy_round_ok(const char *what, void *src, void *dst, size_t bytes, uint64_t seed)
{
	CUdeviceptr dev = 0;
	long long bad;
	int ok;

	if (!OK(cuMemAlloc(&dev, bytes)))
		return 0;
	fill(src, bytes, seed);
	memset(dst, 0xa5, bytes);
	ok = OK(cuMemcpyHtoD(dev, src, bytes)) && OK(cuMemcpyDtoH(dst, dev, bytes));
	if (ok && (bad = unlike(dst, bytes, seed)) >= 0)
		ok = report(0, "%s: HtoD+DtoH of %zu bytes: byte %lld differs", what, bytes, bad);
	cuMemFree(dev);
	return ok;
}

/* Whether this process runs under libpinbroker-preload.so (pinctl run sets LD_PRELOAD to it). */
static int interposed(void)
{
	const char *p = getenv("LD_PRELOAD");

	return p && strstr(p, "pinbroker-preload");
}

/* cuMemHostGetFlags must succeed and include the PORTABLE/DEVICEMAP/WRITECOMBINED bits asked for. The bare driver
 * (580.159, H200) now and then leaves PORTABLE out for allocations made from several threads at once, though with
 * unified addressing every pinned allocation is portable: bare, a missing PORTABLE bit is noted; interposed, the
 * answer comes from the interposer's table and must have every bit. */
static int flags_ok(const char *what, void *p, unsigned asked)
{
	unsigned got = 0,
		 want = asked & (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED);

	if (!OK(cuMemHostGetFlags(&got, p)))
		return report(0, "%s: cuMemHostGetFlags failed", what);
	if (!interposed() && (want & ~got) == CU_MEMHOSTALLOC_PORTABLE) {
		pthread_mutex_lock(&g_out_lock);
		printf("INFO %s: the bare driver's cuMemHostGetFlags = %#x lacks PORTABLE (not judged)\n", what, got);
		pthread_mutex_unlock(&g_out_lock);
		return 1;
	}
	if ((got & want) != want)
		return report(0, "%s: cuMemHostGetFlags = %#x lacks %#x", what, got, want);
	return 1;
}

/* What cuPointerGetAttribute says: pinned host memory, or (want_pinned 0) not. */
static int pinned_ok(const char *what, void *p, int want_pinned)
{
	unsigned type = 0;
	CUresult r = cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p);
	int pinned = r == CUDA_SUCCESS && type == CU_MEMORYTYPE_HOST;

	if (pinned == want_pinned)
		return 1;
	return report(0, "%s: cuPointerGetAttribute(MEMORY_TYPE): %s (error %d, type %u)", what,
		      want_pinned ? "not pinned host memory" : "still pinned", (int)r, type);
}

/* cuMemHostGetFlags on registered memory is the driver's business (documented for cuMemHostAlloc memory only):
 * noted, not judged, so a bare run and an interposed run can be compared line by line. */
static void note_flags(const char *what, void *p)
{
	unsigned got = 0;
	CUresult r = cuMemHostGetFlags(&got, p);

	pthread_mutex_lock(&g_out_lock);
	printf("INFO %s: cuMemHostGetFlags = %d, flags %#x\n", what, (int)r, r == CUDA_SUCCESS ? got : 0);
	pthread_mutex_unlock(&g_out_lock);
}

static const char *flag_name(unsigned f)
{
	switch (f) {
	case 0:
		return "0";
	case CU_MEMHOSTALLOC_PORTABLE:
		return "PORTABLE";
	case CU_MEMHOSTALLOC_DEVICEMAP:
		return "DEVICEMAP";
	case CU_MEMHOSTALLOC_WRITECOMBINED:
		return "WRITECOMBINED";
	default:
		return "?";
	}
}

static void check_host_alloc(CUstream st)
{
	static const unsigned flags[] = { 0, CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_DEVICEMAP,
					  CU_MEMHOSTALLOC_WRITECOMBINED };
	static const size_t sizes[] = { 1, 4097, 3 * MIB + 5, 64 * MIB + 123 };

	for (size_t fi = 0; fi < sizeof(flags) / sizeof(flags[0]); fi++) {
		for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
			unsigned f = flags[fi];
			size_t n = sizes[si];
			int wc = f == CU_MEMHOSTALLOC_WRITECOMBINED;
			void *a = NULL, *b = NULL;
			char what[96];
			int ok;

			snprintf(what, sizeof(what), "cuMemHostAlloc(%zu, %s)", n, flag_name(f));
			if (!OK(cuMemHostAlloc(&a, n, f)))
				continue;
			if (!OK(cuMemHostAlloc(&b, n, f))) {
				cuMemFreeHost(a);
				continue;
			}
			ok = flags_ok(what, a, f) && flags_ok(what, b, f) && pinned_ok(what, a, 1);
			/* Write-combined reads are uncached: verify it in full only up to 3 MiB. */
			ok = ok && (!wc || n <= 3 * MIB + 5 ? copy_round_ok(what, a, b, n, 1000 + fi * 10 + si) : 1);
			ok = ok && mapped_kernel_ok(what, a, n, wc ? 65536 : (size_t)-1, st);
			ok = OK(cuMemFreeHost(a)) && ok;
			ok = OK(cuMemFreeHost(b)) && ok;
			report(ok, "%s: flags, HtoD/DtoH, mapped kernel, free", what);
		}
	}
}

static void check_alloc_host(CUstream st)
{
	static const size_t sizes[] = { 1, 4097, 64 * MIB + 123 };

	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		size_t n = sizes[si];
		void *a = NULL, *b = NULL;
		char what[64];
		int ok;

		snprintf(what, sizeof(what), "cuMemAllocHost(%zu)", n);
		if (!OK(cuMemAllocHost(&a, n)))
			continue;
		if (!OK(cuMemAllocHost(&b, n))) {
			cuMemFreeHost(a);
			continue;
		}
		ok = flags_ok(what, a, 0) && pinned_ok(what, a, 1) && copy_round_ok(what, a, b, n, 2000 + si) &&
		     mapped_kernel_ok(what, b, n, (size_t)-1, st);
		ok = OK(cuMemFreeHost(a)) && ok;
		ok = OK(cuMemFreeHost(b)) && ok;
		report(ok, "%s: flags, HtoD/DtoH, mapped kernel, free", what);
	}
}

static void check_register(CUstream st)
{
	static const unsigned flags[] = { 0, CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_DEVICEMAP };
	static const size_t sizes[] = { PAGE_BYTES, 4 * MIB + PAGE_BYTES, 64 * MIB };

	for (size_t fi = 0; fi < sizeof(flags) / sizeof(flags[0]); fi++) {
		for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
			unsigned f = flags[fi];
			size_t n = sizes[si];
			void *a = NULL, *b = NULL;
			char what[96];
			CUresult r;
			int ok;

			snprintf(what, sizeof(what), "cuMemHostRegister(%zu, %s)", n,
				 f == CU_MEMHOSTREGISTER_DEVICEMAP ? "DEVICEMAP"
				 : f                               ? "PORTABLE"
								   : "0");
			if (posix_memalign(&a, PAGE_BYTES, n) || posix_memalign(&b, PAGE_BYTES, n)) {
				report(0, "%s: posix_memalign: out of memory", what);
				free(a);
				continue;
			}
			ok = OK(cuMemHostRegister(a, n, f));
			ok = ok && OK(cuMemHostRegister(b, n, f));
			if (ok)
				note_flags(what, a);
			ok = ok && pinned_ok(what, a, 1) && copy_round_ok(what, a, b, n, 3000 + fi * 10 + si) &&
			     mapped_kernel_ok(what, a, n, (size_t)-1, st);
			if (ok) {
				r = cuMemHostRegister(a, n, f);
				ok = report(r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
					    "%s: registering it again gives CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED "
					    "(got %d)",
					    what, (int)r);
			}
			ok = OK(cuMemHostUnregister(a)) && ok;
			ok = OK(cuMemHostUnregister(b)) && ok;
			ok = pinned_ok(what, a, 0) && ok; /* not pinned after unregister */
			r = cuMemHostUnregister(a);
			ok = report(r == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
				    "%s: unregistering twice gives CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED (got %d)",
				    what, (int)r) &&
			     ok;
			free(a);
			free(b);
			report(ok, "%s: flags, HtoD/DtoH, mapped kernel, unregister", what);
		}
	}
}

struct worker {
	int id;
	int ok;
};

static void *worker_main(void *arg)
{
	static const unsigned flags[] = { 0, CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_DEVICEMAP,
					  CU_MEMHOSTALLOC_WRITECOMBINED };
	struct worker *w = arg;
	uint64_t rng = 177 + (uint64_t)w->id;
	CUstream st;
	char what[96];

	w->ok = OK(cuCtxSetCurrent(g_ctx)) && OK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
	if (!w->ok)
		return NULL;
	for (int r = 0; r < THREAD_ROUNDS && w->ok; r++) {
		size_t n = 1 + (size_t)(mix(&rng) % (8 * MIB));
		unsigned f = flags[mix(&rng) % 4];
		size_t rn = PAGE_BYTES * (1 + (size_t)(mix(&rng) % 512));
		void *a = NULL, *b = NULL, *reg = NULL;
		int ok;

		snprintf(what, sizeof(what), "thread %d round %d: cuMemHostAlloc(%zu, %s)", w->id, r, n, flag_name(f));
		if (!OK(cuMemHostAlloc(&a, n, f))) {
			w->ok = 0;
			break;
		}
		ok = OK(r % 2 ? cuMemAllocHost(&b, n) : cuMemHostAlloc(&b, n, CU_MEMHOSTALLOC_PORTABLE));
		ok = ok && flags_ok(what, a, f) && copy_round_ok(what, a, b, n, mix(&rng)) &&
		     mapped_kernel_ok(what, a, n, f == CU_MEMHOSTALLOC_WRITECOMBINED ? 4096 : (size_t)-1, st);
		if (ok && posix_memalign(&reg, PAGE_BYTES, rn) == 0) {
			ok = OK(cuMemHostRegister(reg, rn, r % 3 == 0 ? CU_MEMHOSTREGISTER_DEVICEMAP : 0)) &&
			     copy_round_ok(what, reg, b, rn < n ? rn : n, mix(&rng)) &&
			     mapped_kernel_ok(what, reg, rn, (size_t)-1, st);
			ok = OK(cuMemHostUnregister(reg)) && ok;
			free(reg);
		}
		ok = OK(cuMemFreeHost(a)) && ok;
		if (b)
			ok = OK(cuMemFreeHost(b)) && ok;
		w->ok = ok;
	}
	cuStreamDestroy(st);
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
		if (pthread_create(&t[i], NULL, worker_main, &w[i])) {
			report(0, "pthread_create failed");
			return;
		}
	}
	for (int i = 0; i < THREADS; i++) {
		pthread_join(t[i], NULL);
		ok = ok && w[i].ok;
	}
	report(ok, "%d threads x %d rounds: cuMemHostAlloc/cuMemAllocHost/cuMemHostRegister, copies, mapped kernels",
	       THREADS, THREAD_ROUNDS);
}

static int cmd_check(void)
{
	CUmodule mod;
	CUstream st;
	unsigned got = 0;
	void *p;

	if (!OK(cuModuleLoadData(&mod, bump_ptx)) || !OK(cuModuleGetFunction(&g_bump, mod, "bump")) ||
	    !OK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING)))
		return 1;
	check_host_alloc(st);
	check_alloc_host(st);
	check_register(st);
	p = malloc(PAGE_BYTES);
	report(cuMemHostGetFlags(&got, p) != CUDA_SUCCESS, "cuMemHostGetFlags on malloc'd memory fails");
	free(p);
	check_threads();
	report(cuCtxSynchronize() == CUDA_SUCCESS, "no asynchronous error left");
	cuStreamDestroy(st);
	cuModuleUnload(mod);
	printf("preload_driver: %d passed, %d failed\n", g_pass, g_fail);
	return g_fail ? 1 : 0;
}

static int drv_alloc(void **p, size_t bytes, unsigned flags)
{
	return (int)cuMemHostAlloc(p, bytes, flags);
}

static int drv_alloc_host(void **p, size_t bytes)
{
	return (int)cuMemAllocHost(p, bytes);
}

static int drv_register(void *p, size_t bytes)
{
	return (int)cuMemHostRegister(p, bytes, 0);
}

static int drv_free(void *p)
{
	return (int)cuMemFreeHost(p);
}

static int drv_unregister(void *p)
{
	return (int)cuMemHostUnregister(p);
}

static const char *drv_error(int r)
{
	const char *s = NULL;

	cuGetErrorName((CUresult)r, &s);
	return s ? s : "?";
}

static const struct pin_api driver_api = {
	"cuMemHostAlloc",
	"cuMemAllocHost",
	"cuMemHostRegister",
	"cuMemFreeHost",
	"cuMemHostUnregister",
	"CUDA_ERROR_OUT_OF_MEMORY",
	CUDA_ERROR_OUT_OF_MEMORY,
	drv_alloc,
	drv_alloc_host,
	drv_register,
	drv_free,
	drv_unregister,
	drv_error,
	NULL,
	0,
	CU_MEMHOSTALLOC_WRITECOMBINED,
	CU_MEMHOSTALLOC_DEVICEMAP,
	0,
};

int main(int argc, char **argv)
{
	const char *s = NULL;
	CUdevice dev;
	int count = 0, rc;
	CUresult r;

	if (argc < 2 ||
	    (strcmp(argv[1], "check") && strcmp(argv[1], "hold") && (strcmp(argv[1], "expect-oom") || argc != 3))) {
		fprintf(stderr, "usage: %s check | hold SIZE... | expect-oom SIZE\n", argv[0]);
		return 2;
	}
	r = cuInit(0);
	if (r == CUDA_SUCCESS)
		r = cuDeviceGetCount(&count);
	if (r != CUDA_SUCCESS || count == 0) {
		if (r != CUDA_SUCCESS)
			cuGetErrorName(r, &s);
		printf("SKIP: no usable CUDA device: %s\n", r != CUDA_SUCCESS ? (s ? s : "?") : "none");
		return EXIT_SKIP;
	}
	/* Mapped host memory wants CU_CTX_MAP_HOST (implied with unified addressing; set it anyway while it can be). */
	if (!OK(cuDeviceGet(&dev, 0)))
		return 1;
	(void)cuDevicePrimaryCtxSetFlags(dev, CU_CTX_MAP_HOST);
	if (!OK(cuDevicePrimaryCtxRetain(&g_ctx, dev)) || !OK(cuCtxSetCurrent(g_ctx)))
		return 1;
	rc = !strcmp(argv[1], "check")  ? cmd_check()
	     : !strcmp(argv[1], "hold") ? hold_pinned(&driver_api, argc - 2, argv + 2, NULL)
					: expect_oom(&driver_api, argv[2]);
	cuDevicePrimaryCtxRelease(dev);
	return rc;
}

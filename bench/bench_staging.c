/* SPDX-License-Identifier: MIT */
/*
 * Staged copies on a real GPU (issue 39): host<->device rates of pinned memory (cuMemHostAlloc, the ceiling),
 * ordinary pageable memory through the driver (stock) and pageable memory through pinbroker's staging ring
 * (pb_copy_to_device / pb_copy_from_device), beside the host's own memcpy bandwidth, in one run with the sides
 * alternated. The CUDA driver is loaded at run time (dlopen libcuda.so.1): nothing links CUDA.
 *
 * usage: bench_staging [--reps N] [--max-size BYTES] [--raw FILE]    the table of sizes 256K .. 1G
 *        bench_staging --sweep [--reps N] [--raw FILE]                threads x slot x ring at 64 MiB and 1 GiB
 * The daemon is found as pb_connect finds it ($PINBROKER_SOCKET). Exits 77 without a GPU or a daemon.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pinbroker.h"
#include "staging-copy.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;

static struct {
	CUresult (*Init)(unsigned);
	CUresult (*DeviceGet)(int *, int);
	CUresult (*DeviceGetName)(char *, int, int);
	CUresult (*DriverGetVersion)(int *);
	CUresult (*PrimaryCtxRetain)(CUcontext *, int);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*CtxSynchronize)(void);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*MemHostAlloc)(void **, size_t, unsigned);
	CUresult (*MemFreeHost)(void *);
	CUresult (*HtoD)(CUdeviceptr, const void *, size_t);
	CUresult (*DtoH)(void *, CUdeviceptr, size_t);
} cu;

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

static FILE *raw;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
	qsort(v, n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void die(const char *what, int code)
{
	fprintf(stderr, "bench_staging: %s failed (%d)\n", what, code);
	exit(1);
}

#define CU(call)                        \
	do {                            \
		CUresult r_ = (call);   \
		if (r_ != 0)            \
			die(#call, r_); \
	} while (0)

/* Load the driver and make device 0's primary context current; 77 (skip) when there is none. */
static void cuda_open(char *name, size_t name_len, int *driver)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!h) {
		printf("SKIP bench_staging: no libcuda.so.1 (%s): needs the GPU host\n", dlerror());
		exit(77);
	}
#define SYM(field, sym)                                                                 \
	do {                                                                            \
		*(void **)&cu.field = dlsym(h, sym);                                    \
		if (!cu.field) {                                                        \
			fprintf(stderr, "bench_staging: libcuda.so.1 lacks %s\n", sym); \
			exit(1);                                                        \
		}                                                                       \
	} while (0)
	SYM(Init, "cuInit");
	SYM(DeviceGet, "cuDeviceGet");
	SYM(DeviceGetName, "cuDeviceGetName");
	SYM(DriverGetVersion, "cuDriverGetVersion");
	SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	SYM(CtxSetCurrent, "cuCtxSetCurrent");
	SYM(CtxSynchronize, "cuCtxSynchronize");
	SYM(MemAlloc, "cuMemAlloc_v2");
	SYM(MemFree, "cuMemFree_v2");
	SYM(MemHostAlloc, "cuMemHostAlloc");
	SYM(MemFreeHost, "cuMemFreeHost");
	SYM(HtoD, "cuMemcpyHtoD_v2");
	SYM(DtoH, "cuMemcpyDtoH_v2");
#undef SYM
	int dev, r = cu.Init(0);
	if (r != 0) {
		printf("SKIP bench_staging: cuInit failed (%d): no usable GPU\n", r);
		exit(77);
	}
	CUcontext ctx;
	CU(cu.DeviceGet(&dev, 0));
	CU(cu.PrimaryCtxRetain(&ctx, dev));
	CU(cu.CtxSetCurrent(ctx));
	CU(cu.DeviceGetName(name, (int)name_len, dev));
	CU(cu.DriverGetVersion(driver));
}

/* ---------------------------------------------------------------- host memcpy bandwidth */

struct memcpy_job {
	char *dst;
	const char *src;
	size_t n;
	bool stream;
};

static void *memcpy_worker(void *arg)
{
	struct memcpy_job *j = arg;
	if (j->stream)
		pbst_stream_copy(j->dst, j->src, j->n);
	else
		memcpy(j->dst, j->src, j->n);
	return NULL;
}

/*
 * GB/s of copying bytes between two faulted buffers with threads threads (median of reps); stream: with the
 * staging threads' streaming stores instead of memcpy.
 */
static double memcpy_rate(char *dst, const char *src, size_t bytes, unsigned threads, unsigned reps, bool stream)
{
	double v[64];
	pthread_t th[64];
	struct memcpy_job jobs[64];
	if (reps > 64)
		reps = 64;
	for (unsigned r = 0; r < reps; r++) {
		size_t per = (bytes / threads + 4095) & ~(size_t)4095;
		uint64_t t0 = now_ns();
		unsigned started = 0;
		for (unsigned i = 0; i < threads; i++) {
			size_t off = per * i;
			if (off >= bytes)
				break;
			jobs[i] = (struct memcpy_job){ dst + off, src + off, off + per > bytes ? bytes - off : per,
						       stream };
			if (pthread_create(&th[i], NULL, memcpy_worker, &jobs[i]) != 0)
				die("pthread_create", errno);
			started++;
		}
		for (unsigned i = 0; i < started; i++)
			pthread_join(th[i], NULL);
		v[r] = (double)bytes / (double)(now_ns() - t0);
	}
	return median(v, reps);
}

/* ---------------------------------------------------------------- one copy, timed to completion */

enum way { PINNED, STOCK, STAGED, N_WAYS };
static const char *const way_name[N_WAYS] = { "pinned", "stock", "staged" };

struct bufs {
	char *pinned, *pageable;
	CUdeviceptr dev;
};

/* Seconds one copy of bytes took, including the GPU finishing it. */
static double copy_once(pb_client *c, const struct bufs *b, enum way w, int h2d, size_t bytes)
{
	char *host = w == PINNED ? b->pinned : b->pageable;
	uint64_t t0 = now_ns();
	if (w == STAGED) {
		int r = h2d ? pb_copy_to_device(c, b->dev, host, bytes, NULL)
			    : pb_copy_from_device(c, host, b->dev, bytes, NULL);
		if (r < 0) {
			fprintf(stderr, "bench_staging: staged %s of %zu bytes: %s\n", h2d ? "H2D" : "D2H", bytes,
				pb_last_error());
			exit(1);
		}
	} else if (h2d) {
		CU(cu.HtoD(b->dev, host, bytes));
	} else {
		CU(cu.DtoH(host, b->dev, bytes));
	}
	CU(cu.CtxSynchronize());
	return (double)(now_ns() - t0) / 1e9;
}

/* Bytes exact both ways through the ring for this size (a pattern, the driver's own copy as the judge). */
static int check_bytes(pb_client *c, const struct bufs *b, size_t bytes)
{
	for (size_t i = 0; i < bytes; i++)
		b->pageable[i] = (char)(i * 131 + (i >> 12) + 7);
	if (pb_copy_to_device(c, b->dev, b->pageable, bytes, NULL) < 0)
		return -1;
	CU(cu.CtxSynchronize());
	memset(b->pinned, 0, bytes);
	CU(cu.DtoH(b->pinned, b->dev, bytes));
	if (memcmp(b->pinned, b->pageable, bytes) != 0)
		return 1;
	memset(b->pageable, 0, bytes);
	if (pb_copy_from_device(c, b->pageable, b->dev, bytes, NULL) < 0)
		return -1;
	return memcmp(b->pinned, b->pageable, bytes) != 0 ? 2 : 0;
}

/* rate[w][dir] in GB/s: medians of reps runs, the order of the ways rotated each run. */
static void measure(pb_client *c, const struct bufs *b, size_t bytes, unsigned reps, const char *tag,
		    double rate[N_WAYS][2])
{
	double *v[N_WAYS][2];
	for (int w = 0; w < N_WAYS; w++)
		for (int d = 0; d < 2; d++)
			v[w][d] = calloc(reps, sizeof(double));
	for (int w = 0; w < N_WAYS; w++) /* warm-up: first touch of the ring, the driver's staging buffers */
		for (int d = 0; d < 2; d++)
			copy_once(c, b, (enum way)w, d == 0, bytes);
	for (unsigned r = 0; r < reps; r++)
		for (int k = 0; k < N_WAYS; k++) {
			enum way w = (enum way)((r + (unsigned)k) % N_WAYS);
			for (int d = 0; d < 2; d++) {
				int dir = (int)((r + (unsigned)d) % 2); /* H2D first on even runs, D2H first on odd */
				double s = copy_once(c, b, w, dir == 0, bytes);
				v[w][dir][r] = (double)bytes / s / 1e9;
				if (raw)
					fprintf(raw, "%s size=%zu way=%s dir=%s run=%u seconds=%.6f GBps=%.3f\n", tag,
						bytes, way_name[w], dir == 0 ? "H2D" : "D2H", r, s, v[w][dir][r]);
			}
		}
	for (int w = 0; w < N_WAYS; w++)
		for (int d = 0; d < 2; d++) {
			rate[w][d] = median(v[w][d], reps);
			free(v[w][d]);
		}
}

static const char *size_text(size_t n, char *buf, size_t len)
{
	if (n >= GIB && n % GIB == 0)
		snprintf(buf, len, "%zu GiB", n / GIB);
	else if (n >= MIB && n % MIB == 0)
		snprintf(buf, len, "%zu MiB", n / MIB);
	else
		snprintf(buf, len, "%zu KiB", n / KIB);
	return buf;
}

static pb_client *connect_with(const struct pb_staging_opts *o)
{
	pb_client *c;
	int r = pb_connect(NULL, &c);
	if (r < 0) {
		printf("SKIP bench_staging: no pinbrokerd ($PINBROKER_SOCKET): %s\n", pb_last_error());
		exit(77);
	}
	if (o && pb_staging_configure(c, o) < 0) {
		fprintf(stderr, "bench_staging: pb_staging_configure: %s\n", pb_last_error());
		pb_disconnect(c);
		return NULL;
	}
	return c;
}

static void alloc_bufs(struct bufs *b, size_t max)
{
	CU(cu.MemHostAlloc((void **)&b->pinned, max, 0));
	b->pageable = malloc(max);
	if (!b->pageable)
		die("malloc", ENOMEM);
	memset(b->pageable, 1, max); /* faulted in: the copies are timed, not the first touch */
	memset(b->pinned, 1, max);
	CU(cu.MemAlloc(&b->dev, max));
}

static void print_stats(pb_client *c)
{
	struct pb_staging_stats s;
	if (pb_staging_stats(c, &s) == 0)
		printf("staging counters: h2d %llu copies %llu bytes, d2h %llu copies %llu bytes, to the driver %llu, ring %llu "
		       "bytes held, %llu leased, %llu revoked, %llu refused\n",
		       (unsigned long long)s.h2d_copies, (unsigned long long)s.h2d_bytes,
		       (unsigned long long)s.d2h_copies, (unsigned long long)s.d2h_bytes,
		       (unsigned long long)s.driver_copies, (unsigned long long)s.ring_bytes,
		       (unsigned long long)s.ring_leases, (unsigned long long)s.ring_revoked,
		       (unsigned long long)s.ring_refused);
}

static int table(unsigned reps, size_t max_size)
{
	static const size_t sizes[] = { 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB, GIB };
	size_t n = sizeof sizes / sizeof sizes[0], max = 0;
	for (size_t i = 0; i < n; i++)
		if (sizes[i] <= max_size)
			max = sizes[i];
	struct bufs b;
	alloc_bufs(&b, max);
	pb_client *c = connect_with(NULL);

	/* The host's own ceiling: memcpy between two faulted buffers of the largest size. */
	char *other = malloc(max);
	if (!other)
		die("malloc", ENOMEM);
	memset(other, 2, max);
	static const unsigned mt[] = { 1, 2, 4, 8, 16 };
	for (int stream = 0; stream < 2; stream++) {
		printf(stream ? "host copy of %zu MiB with streaming stores, as the staging threads copy (median of 5):"
			      : "host memcpy of %zu MiB (median of 5):",
		       max / MIB);
		for (size_t i = 0; i < sizeof mt / sizeof mt[0]; i++) {
			double g = memcpy_rate(other, b.pageable, max, mt[i], 5, stream);
			printf(" %u thread%s %.1f GB/s%s", mt[i], mt[i] > 1 ? "s" : "", g,
			       i + 1 < sizeof mt / sizeof mt[0] ? "," : "\n");
			if (raw)
				fprintf(raw, "%s size=%zu threads=%u GBps=%.3f\n", stream ? "stream" : "memcpy", max,
					mt[i], g);
		}
	}
	free(other);

	int bad = 0;
	printf("\n| size | dir | pinned GB/s | stock GB/s | staged GB/s | staged/stock | staged/pinned | bytes |\n");
	printf("|---|---|---:|---:|---:|---:|---:|---|\n");
	for (size_t i = 0; i < n && sizes[i] <= max; i++) {
		char st[32];
		double rate[N_WAYS][2];
		int chk = check_bytes(c, &b, sizes[i]);
		if (chk != 0)
			bad = 1;
		unsigned r = sizes[i] <= 16 * MIB ? reps * 3 : reps;
		measure(c, &b, sizes[i], r, "table", rate);
		for (int d = 0; d < 2; d++)
			printf("| %s | %s | %.1f | %.1f | %.1f | %.2f× | %.2f× | %s |\n",
			       size_text(sizes[i], st, sizeof st), d == 0 ? "H2D" : "D2H", rate[PINNED][d],
			       rate[STOCK][d], rate[STAGED][d], rate[STAGED][d] / rate[STOCK][d],
			       rate[STAGED][d] / rate[PINNED][d],
			       chk == 0  ? "exact"
			       : chk < 0 ? "copy failed"
					 : "DIFFER");
		fflush(stdout);
	}
	print_stats(c);
	pb_disconnect(c);
	CU(cu.MemFree(b.dev));
	CU(cu.MemFreeHost(b.pinned));
	free(b.pageable);
	return bad;
}

static int sweep(unsigned reps)
{
	static const unsigned threads[] = { 2, 4, 8, 12 };
	static const size_t slots[] = { 4 * MIB, 8 * MIB, 16 * MIB, 32 * MIB };
	static const size_t rings[] = { 16 * MIB, 32 * MIB, 64 * MIB };
	static const size_t sizes[] = { 64 * MIB, GIB };
	struct bufs b;
	alloc_bufs(&b, GIB);
	printf("| threads | slot | ring | 64 MiB H2D | 64 MiB D2H | 1 GiB H2D | 1 GiB D2H |\n|---:|---:|---:|---:|---:|---:|---:|\n");
	double base[2][N_WAYS][2];
	{
		pb_client *c = connect_with(NULL);
		for (size_t s = 0; s < 2; s++)
			measure(c, &b, sizes[s], reps, "sweep-defaults", base[s]);
		pb_disconnect(c);
	}
	for (int w = 0; w < N_WAYS; w++)
		printf("| %s | | | %.1f | %.1f | %.1f | %.1f |\n", w == STAGED ? "defaults (staged)" : way_name[w],
		       base[0][w][0], base[0][w][1], base[1][w][0], base[1][w][1]);
	for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++)
		for (size_t s = 0; s < sizeof slots / sizeof slots[0]; s++)
			for (size_t g = 0; g < sizeof rings / sizeof rings[0]; g++) {
				if (rings[g] / slots[s] < 2)
					continue;
				struct pb_staging_opts o = { .ring_bytes = rings[g],
							     .slot_bytes = slots[s],
							     .threads = threads[t] };
				pb_client *c = connect_with(&o);
				if (!c)
					continue;
				double rate[2][2];
				for (size_t z = 0; z < 2; z++)
					for (int d = 0; d < 2; d++) {
						double v[32];
						unsigned n = reps > 32 ? 32 : reps;
						copy_once(c, &b, STAGED, d == 0, sizes[z]); /* the ring's first use */
						for (unsigned r = 0; r < n; r++) {
							double sec = copy_once(c, &b, STAGED, d == 0, sizes[z]);
							v[r] = (double)sizes[z] / sec / 1e9;
							if (raw)
								fprintf(raw,
									"sweep threads=%u slot=%zu ring=%zu size=%zu dir=%s run=%u "
									"GBps=%.3f\n",
									threads[t], slots[s], rings[g], sizes[z],
									d == 0 ? "H2D" : "D2H", r, v[r]);
						}
						rate[z][d] = median(v, n);
					}
				printf("| %u | %zu MiB | %zu MiB | %.1f | %.1f | %.1f | %.1f |\n", threads[t],
				       slots[s] / MIB, rings[g] / MIB, rate[0][0], rate[0][1], rate[1][0], rate[1][1]);
				fflush(stdout);
				pb_disconnect(c);
			}
	CU(cu.MemFree(b.dev));
	CU(cu.MemFreeHost(b.pinned));
	free(b.pageable);
	return 0;
}

int main(int argc, char **argv)
{
	unsigned reps = 9;
	size_t max_size = GIB;
	int do_sweep = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--sweep"))
			do_sweep = 1;
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			reps = (unsigned)strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--max-size") && i + 1 < argc)
			max_size = (size_t)strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--raw") && i + 1 < argc) {
			raw = fopen(argv[++i], "w");
			if (!raw) {
				perror(argv[i]);
				return 2;
			}
		} else {
			fprintf(stderr, "usage: %s [--sweep] [--reps N] [--max-size BYTES] [--raw FILE]\n", argv[0]);
			return 2;
		}
	}
	if (reps < 1 || reps > 100 || max_size < 256 * KIB) {
		fprintf(stderr, "bench_staging: --reps takes 1..100, --max-size at least 262144\n");
		return 2;
	}
	char name[256] = "";
	int driver = 0;
	cuda_open(name, sizeof name, &driver);
	printf("bench_staging: %s, driver API %d.%d, %ld cores, staging settings from the environment "
	       "(PINBROKER_STAGING_RING=%s SLOT=%s THREADS=%s THRESHOLD=%s)\n",
	       name, driver / 1000, driver % 1000 / 10, sysconf(_SC_NPROCESSORS_ONLN),
	       getenv("PINBROKER_STAGING_RING") ? getenv("PINBROKER_STAGING_RING") : "default",
	       getenv("PINBROKER_STAGING_SLOT") ? getenv("PINBROKER_STAGING_SLOT") : "default",
	       getenv("PINBROKER_STAGING_THREADS") ? getenv("PINBROKER_STAGING_THREADS") : "default",
	       getenv("PINBROKER_STAGING_THRESHOLD") ? getenv("PINBROKER_STAGING_THRESHOLD") : "default");
	int rc = do_sweep ? sweep(reps) : table(reps, max_size);
	if (raw)
		fclose(raw);
	return rc;
}

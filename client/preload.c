/* SPDX-License-Identifier: MIT */
/*
 * libpinbroker-preload.so: puts an unmodified CUDA program's pinned memory
 * under pinbrokerd's budget (LD_PRELOAD, or `pinctl run -- CMD`).
 *
 * Three ways in, because CUDA programs reach the driver three ways:
 * - the runtime's and the driver's host-memory functions, exported here, which
 *   win over libcudart.so's and libcuda.so's for every object in the process;
 * - dlsym(): the CUDA runtime, shared or static (nvcc's default), dlopen()s
 *   libcuda.so.1 and looks its entry points up, so a dlsym() of a host-memory
 *   function or of cuGetProcAddress from anyone but libpinbroker answers with
 *   the wrapper here;
 * - cuGetProcAddress(_v2): what it returns for a host-memory function is
 *   swapped for the wrapper with the same ABI (matched by address against the
 *   driver's exported versions);
 * - dlopen() with RTLD_DEEPBIND (preload-deepbind.c): such a library binds to
 *   its own dependencies first, the driver included, so its imports of these
 *   functions, dlsym and dlopen are pointed at the wrappers once it is loaded.
 *
 * An allocation (cudaHostAlloc, cudaMallocHost, cuMemHostAlloc,
 * cuMemAllocHost) becomes a never-revoked broker lease of the page-rounded
 * size, registered PORTABLE | DEVICEMAP; a registration (cudaHostRegister,
 * cuMemHostRegister) is charged as a registration lease and then done by the
 * driver. Write-combined memory cannot come from the pool (WC is a property
 * of the driver's own allocation), so the driver allocates it and the broker
 * is charged for it. When the broker refuses, PINBROKER_PRELOAD_FALLBACK
 * decides (preload-table.h). Pointers not in the table pass to the driver.
 *
 * Never recursing: a thread-local depth makes every wrapper reached from
 * inside a wrapper (the runtime calling the driver, libpinbroker registering
 * a lease) call straight through.
 */
#define _GNU_SOURCE
#include "pinbroker.h"
#include "preload-deepbind.h"
#include "preload-table.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
/*
 * dlsym() runs from the sanitizers' own start-up (they look their interceptors up with it), before
 * their shadow memory exists: what it reaches here must not be instrumented.
 */
#define UNSANITIZED __attribute__((no_sanitize("address", "undefined")))

/* From cuda.h and driver_types.h: the values are ABI. The runtime's and the driver's coincide for these. */
typedef int CUresult;
typedef int cudaError_t;
typedef uint64_t cuuint64_t;
#define CU_OK 0
#define CU_INVALID_VALUE 1
#define CU_OUT_OF_MEMORY 2
#define CU_NOT_INITIALIZED 3
#define CU_HOST_MEMORY_NOT_REGISTERED 713

/* The functions exported here, with the ABI of cuda.h and cuda_runtime_api.h. */
EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags);
EXPORT CUresult cuMemAllocHost(void **pp, unsigned int bytesize);
EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
EXPORT CUresult cuMemFreeHost(void *p);
EXPORT CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int flags);
EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags);
EXPORT CUresult cuMemHostUnregister(void *p);
EXPORT CUresult cuMemHostGetFlags(unsigned int *flags, void *p);
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags, int *status);
EXPORT cudaError_t cudaHostAlloc(void **pp, size_t size, unsigned int flags);
EXPORT cudaError_t cudaMallocHost(void **pp, size_t size);
EXPORT cudaError_t cudaFreeHost(void *p);
EXPORT cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags);
EXPORT cudaError_t cudaHostUnregister(void *p);
EXPORT cudaError_t cudaHostGetFlags(unsigned int *flags, void *p);
EXPORT void *dlsym(void *handle, const char *name);

/* Every function this file stands in for. The driver's come first, then the runtime's. */
enum fn {
	F_cuMemHostAlloc,
	F_cuMemAllocHost,    /* CUDA 3.1's: unsigned int bytesize */
	F_cuMemAllocHost_v2,
	F_cuMemFreeHost,
	F_cuMemHostRegister, /* same ABI as _v2 */
	F_cuMemHostRegister_v2,
	F_cuMemHostUnregister,
	F_cuMemHostGetFlags,
	F_cuGetProcAddress,
	F_cuGetProcAddress_v2,
	F_DRIVER_END,
	F_cudaHostAlloc = F_DRIVER_END,
	F_cudaMallocHost,
	F_cudaFreeHost,
	F_cudaHostRegister,
	F_cudaHostUnregister,
	F_cudaHostGetFlags,
	F_END,
};

static const char *const fn_names[F_END] = {
	"cuMemHostAlloc",     "cuMemAllocHost",     "cuMemAllocHost_v2",    "cuMemFreeHost",
	"cuMemHostRegister",  "cuMemHostRegister_v2", "cuMemHostUnregister", "cuMemHostGetFlags",
	"cuGetProcAddress",   "cuGetProcAddress_v2", "cudaHostAlloc",       "cudaMallocHost",
	"cudaFreeHost",       "cudaHostRegister",   "cudaHostUnregister",   "cudaHostGetFlags",
};

/* The wrappers (their addresses are what dlsym and cuGetProcAddress hand out): the table follows them. */
static void *wrapper(enum fn f);
/* The real functions: the driver's from our own handle on libcuda.so.1, the runtime's as found. */
static void *_Atomic fn_real[F_END];

/* Hidden, so the assembly below reaches them without the GOT. */
__attribute__((visibility("hidden"))) void *(*pbp_real_dlsym)(void *, const char *);
__attribute__((visibility("hidden"))) void *pbp_dlsym_override(void *handle, const char *name, void *caller);

static __thread int depth; /* > 0 inside a wrapper: every wrapper then calls straight through */

static struct {
	enum pbp_policy policy;
	char label[96];
	bool verbose;
	bool off;               /* PINBROKER_PRELOAD=0: forward everything */
	uintptr_t self_base;    /* this object's load address, to know our own dlsym() calls */
} cfg;

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pbp_table table;
static unsigned generation = 1;     /* bumped in a forked child: what it inherited is not its own */
static uint64_t unbrokered_bytes;   /* live PBP_DRIVER_* bytes of this process */

static pthread_mutex_t client_lock = PTHREAD_MUTEX_INITIALIZER;
static pb_client *client;
static int64_t next_connect_ms;
static int warnings_left = 5;

/* Taken before client_lock and table_lock when nested (report_unbrokered, before_fork). */
static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A few warnings by default (a fallback, a refusal), everything with PINBROKER_PRELOAD_LOG=1. */
__attribute__((format(printf, 2, 3))) static void say(bool warning, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (!cfg.verbose) {
		if (!warning)
			return;
		pthread_mutex_lock(&client_lock);
		bool quiet = warnings_left <= 0;
		if (!quiet && --warnings_left == 0)
			fprintf(stderr, "pinbroker-preload: further warnings muted (PINBROKER_PRELOAD_LOG=1 shows all)\n");
		pthread_mutex_unlock(&client_lock);
		if (quiet)
			return;
	}
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "pinbroker-preload[%d]: %s\n", (int)getpid(), msg);
}

UNSANITIZED static void *resolve_real_dlsym(void)
{
	static const char *const versions[] = { "GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0" };
	void *p = NULL;

	for (size_t i = 0; !p && i < sizeof(versions) / sizeof(versions[0]); i++)
		p = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
	return p;
}

UNSANITIZED static void *real_dlsym(void *handle, const char *name)
{
	if (!pbp_real_dlsym)
		pbp_real_dlsym = (void *(*)(void *, const char *))(uintptr_t)resolve_real_dlsym();
	return pbp_real_dlsym ? pbp_real_dlsym(handle, name) : NULL;
}

/* ---- Finding the real functions ---- */

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

static void load_driver(void)
{
	/* The program has it loaded already when it reaches a driver wrapper; this only takes a handle. */
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

	if (!h) {
		say(false, "libcuda.so.1: %s", dlerror());
		return;
	}
	for (int f = 0; f < F_DRIVER_END; f++)
		atomic_store(&fn_real[f], real_dlsym(h, fn_names[f]));
}

static int find_cudart(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	const char *slash = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
	const char *base = slash ? slash + 1 : info->dlpi_name;

	if (base && strncmp(base, "libcudart.so", 12) == 0) {
		*(const char **)arg = info->dlpi_name;
		return 1;
	}
	return 0;
}

static void *real_fn(enum fn f)
{
	void *p;

	if (f < F_DRIVER_END) {
		pthread_once(&driver_once, load_driver);
		return atomic_load(&fn_real[f]);
	}
	p = atomic_load(&fn_real[f]);
	if (p)
		return p;
	/* The next definition after ours: libcudart.so when the program linked it. */
	p = real_dlsym(RTLD_NEXT, fn_names[f]);
	if (!p) {
		/* Or a libcudart.so loaded into a local scope (a Python extension's dependency). */
		const char *path = NULL;
		void *h;

		dl_iterate_phdr(find_cudart, &path);
		h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
		if (h) {
			p = real_dlsym(h, fn_names[f]);
			dlclose(h);
		}
	}
	if (p)
		atomic_store(&fn_real[f], p);
	return p;
}

/* ---- The broker ---- */

static pb_client *get_client(void)
{
	pb_client *c;

	pthread_mutex_lock(&client_lock);
	c = client;
	if (!c && mono_ms() >= next_connect_ms) {
		int r = pb_connect(NULL, &c);

		if (r < 0) {
			c = NULL;
			next_connect_ms = mono_ms() + 5000; /* asked again at most every 5 s */
			pthread_mutex_unlock(&client_lock);
			say(true, "%s: pinned memory follows the fallback (%s) until a broker answers",
			    pb_last_error(), pbp_policy_name(cfg.policy));
			return NULL;
		}
		client = c;
	}
	pthread_mutex_unlock(&client_lock);
	return c;
}

static void report_unbrokered(void)
{
	pb_client *c = get_client();
	uint64_t bytes;

	if (!c)
		return;
	/* Serialised, so the daemon's last report is the last total. */
	pthread_mutex_lock(&report_lock);
	pthread_mutex_lock(&table_lock);
	bytes = unbrokered_bytes;
	pthread_mutex_unlock(&table_lock);
	depth++;
	if (pb_report_unbrokered(c, bytes) < 0)
		say(false, "reporting %llu unbrokered bytes: %s", (unsigned long long)bytes, pb_last_error());
	depth--;
	pthread_mutex_unlock(&report_lock);
}

static size_t page_size(void)
{
	static size_t ps;

	if (!ps)
		ps = (size_t)sysconf(_SC_PAGESIZE);
	return ps;
}

/* Track e; on failure (out of memory) the caller undoes what e stands for. */
static int track(struct pbp_entry e)
{
	int r;

	pthread_mutex_lock(&table_lock);
	e.gen = generation;
	r = pbp_table_put(&table, &e);
	if (r == 0 && pbp_kind_unbrokered(e.kind))
		unbrokered_bytes += e.bytes;
	pthread_mutex_unlock(&table_lock);
	if (r < 0)
		say(true, "cannot track %p: %s", (void *)e.base, strerror(-r));
	else if (pbp_kind_unbrokered(e.kind))
		report_unbrokered();
	return r;
}

/* Take the entry at base. *inherited: made before this process forked from its parent. */
static bool untrack(uintptr_t base, bool alloc, struct pbp_entry *e, bool *inherited)
{
	bool found;

	pthread_mutex_lock(&table_lock);
	found = pbp_table_take(&table, base, alloc, e);
	*inherited = found && e->gen != generation;
	if (found && !*inherited && pbp_kind_unbrokered(e->kind))
		unbrokered_bytes -= e->bytes;
	pthread_mutex_unlock(&table_lock);
	if (found && !*inherited && pbp_kind_unbrokered(e->kind))
		report_unbrokered();
	return found;
}

static void release_lease(pb_lease *l, bool registration)
{
	pb_client *c = get_client();

	depth++;
	if (registration)
		pb_unregister(c, l);
	else
		pb_release(c, l);
	depth--;
}

/* ---- Calling the real functions (always one level down: nothing they reach comes back here) ---- */

#define CALL(type, f, ...) ((type)(uintptr_t)real_fn(f))(__VA_ARGS__)

static int driver_alloc(enum fn f, void **pp, size_t size, unsigned flags)
{
	int r;

	if (!real_fn(f))
		return CU_NOT_INITIALIZED;
	depth++;
	switch (f) {
	case F_cuMemHostAlloc:
		r = CALL(CUresult(*)(void **, size_t, unsigned), f, pp, size, flags);
		break;
	case F_cuMemAllocHost:
		r = CALL(CUresult(*)(void **, unsigned), f, pp, (unsigned)size);
		break;
	case F_cuMemAllocHost_v2:
		r = CALL(CUresult(*)(void **, size_t), f, pp, size);
		break;
	case F_cudaHostAlloc:
		r = CALL(cudaError_t(*)(void **, size_t, unsigned), f, pp, size, flags);
		break;
	case F_cudaMallocHost:
		r = CALL(cudaError_t(*)(void **, size_t), f, pp, size);
		break;
	default:
		r = CU_INVALID_VALUE;
		break;
	}
	depth--;
	return r;
}

/* cuMemFreeHost, cudaFreeHost, cuMemHostUnregister and cudaHostUnregister share the ABI. */
static int driver_ptr_call(enum fn f, void *p)
{
	int r;

	if (!real_fn(f))
		return CU_NOT_INITIALIZED;
	depth++;
	r = CALL(int (*)(void *), f, p);
	depth--;
	return r;
}

static int driver_register(enum fn f, void *p, size_t size, unsigned flags)
{
	int r;

	if (!real_fn(f))
		return CU_NOT_INITIALIZED;
	depth++;
	r = CALL(int (*)(void *, size_t, unsigned), f, p, size, flags);
	depth--;
	return r;
}

static int driver_get_flags(enum fn f, unsigned *flags, void *p)
{
	int r;

	if (!real_fn(f))
		return CU_NOT_INITIALIZED;
	depth++;
	r = CALL(int (*)(unsigned *, void *), f, flags, p);
	depth--;
	return r;
}

/* The free function that matches an allocating one. */
static enum fn free_of(enum fn alloc)
{
	return alloc >= F_DRIVER_END ? F_cudaFreeHost : F_cuMemFreeHost;
}

static bool passthrough(void)
{
	return depth > 0 || cfg.off;
}

/* ---- Allocation ---- */

static int pageable_alloc(void **pp, size_t size)
{
	size_t span = pbp_page_span(0, size, page_size());
	void *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return CU_OUT_OF_MEMORY;
	if (track((struct pbp_entry){ .base = (uintptr_t)p, .bytes = span, .kind = PBP_PAGEABLE_ALLOC }) < 0) {
		munmap(p, span);
		return CU_OUT_OF_MEMORY;
	}
	*pp = p;
	return CU_OK;
}

/* The broker said no (why): the policy picks the memory. */
static int fallback_alloc(enum fn f, void **pp, size_t size, unsigned flags, const char *why)
{
	enum pbp_action a = pbp_fallback(cfg.policy, flags, false);
	int r;

	switch (a) {
	case PBP_DO_ERROR:
		say(true, "%s of %zu bytes refused (%s): out-of-memory error (fallback=error)", fn_names[f], size, why);
		return CU_OUT_OF_MEMORY;
	case PBP_DO_PAGEABLE:
		say(true, "%s of %zu bytes: %s: ordinary pageable memory (fallback=pageable)", fn_names[f], size, why);
		return pageable_alloc(pp, size);
	case PBP_DO_DRIVER:
		break;
	}
	r = driver_alloc(f, pp, size, flags);
	if (r != CU_OK)
		return r;
	say(true, "%s of %zu bytes: %s: pinned by the CUDA driver, outside the budget (reported as unbrokered)",
	    fn_names[f], size, why);
	if (track((struct pbp_entry){ .base = (uintptr_t)*pp, .bytes = pbp_page_span(0, size, page_size()),
				      .flags = flags, .kind = PBP_DRIVER_ALLOC }) < 0) {
		driver_ptr_call(free_of(f), *pp);
		return CU_OUT_OF_MEMORY;
	}
	return CU_OK;
}

static struct pb_acquire_opts lease_opts(uint32_t flags)
{
	return (struct pb_acquire_opts){ .flags = flags, .label = cfg.label[0] ? cfg.label : NULL };
}

/* Write-combined: the driver allocates, the broker is charged. */
static int charged_driver_alloc(enum fn f, void **pp, size_t size, unsigned flags)
{
	struct pb_acquire_opts o = lease_opts(PB_REGISTER_CHARGE_ONLY);
	pb_client *c = get_client();
	pb_lease *l = NULL;
	char why[256];
	int r = driver_alloc(f, pp, size, flags);

	if (r != CU_OK)
		return r;
	if (c) {
		depth++;
		r = pb_register(c, *pp, size, &o, &l);
		depth--;
		if (r == 0) {
			if (track((struct pbp_entry){ .base = (uintptr_t)*pp, .bytes = pb_lease_size(l), .flags = flags,
						      .kind = PBP_CHARGED_DRIVER, .lease = l }) == 0)
				return CU_OK;
			release_lease(l, true);
			driver_ptr_call(free_of(f), *pp);
			return CU_OUT_OF_MEMORY;
		}
		snprintf(why, sizeof(why), "charge refused: %s", pb_last_error());
	} else {
		snprintf(why, sizeof(why), "no broker");
	}
	switch (pbp_fallback(cfg.policy, flags, false)) {
	case PBP_DO_DRIVER:
		say(true, "%s of %zu write-combined bytes: %s: kept outside the budget (reported as unbrokered)",
		    fn_names[f], size, why);
		if (track((struct pbp_entry){ .base = (uintptr_t)*pp, .bytes = pbp_page_span(0, size, page_size()),
					      .flags = flags, .kind = PBP_DRIVER_ALLOC }) == 0)
			return CU_OK;
		driver_ptr_call(free_of(f), *pp);
		return CU_OUT_OF_MEMORY;
	case PBP_DO_ERROR:
		driver_ptr_call(free_of(f), *pp);
		say(true, "%s of %zu write-combined bytes refused (%s): out-of-memory error (fallback=error)",
		    fn_names[f], size, why);
		return CU_OUT_OF_MEMORY;
	case PBP_DO_PAGEABLE:
		driver_ptr_call(free_of(f), *pp);
		return pageable_alloc(pp, size);
	}
	return CU_OUT_OF_MEMORY;
}

static int host_alloc(enum fn f, void **pp, size_t size, unsigned flags)
{
	struct pb_acquire_opts o = lease_opts(PB_ACQUIRE_NO_REVOKE | PB_ACQUIRE_MAPPED);
	pb_client *c;
	pb_lease *l = NULL;
	char why[256];
	int r;

	if (passthrough() || !pp || size == 0)
		return driver_alloc(f, pp, size, flags);
	if (flags & PBP_HOST_WRITECOMBINED)
		return charged_driver_alloc(f, pp, size, flags);
	c = get_client();
	if (!c)
		return fallback_alloc(f, pp, size, flags, "no broker");
	depth++;
	r = pb_acquire(c, size, &o, &l);
	depth--;
	if (r < 0) {
		snprintf(why, sizeof(why), "broker refused: %s", pb_last_error());
		return fallback_alloc(f, pp, size, flags, why);
	}
	if (!pb_lease_cuda_registered(l)) {
		const char *reason = NULL;

		pb_cuda_available(&reason);
		snprintf(why, sizeof(why), "the lease could not be registered with CUDA: %s",
			 reason ? reason : pb_last_error());
		release_lease(l, false);
		return fallback_alloc(f, pp, size, flags, why);
	}
	if (track((struct pbp_entry){ .base = (uintptr_t)pb_lease_data(l), .bytes = pb_lease_size(l), .flags = flags,
				      .kind = PBP_LEASE, .lease = l }) < 0) {
		release_lease(l, false);
		return CU_OUT_OF_MEMORY;
	}
	*pp = pb_lease_data(l);
	say(false, "%s: %zu bytes as lease %llu", fn_names[f], size, (unsigned long long)pb_lease_id(l));
	return CU_OK;
}

static int host_free(enum fn f, void *p)
{
	struct pbp_entry e;
	bool inherited;
	int r;

	if (passthrough() || !p || !untrack((uintptr_t)p, true, &e, &inherited))
		return driver_ptr_call(f, p);
	if (inherited) {
		/* Our parent's memory: its lease is the parent's to give back; only drop this copy. */
		if (e.kind == PBP_LEASE || e.kind == PBP_PAGEABLE_ALLOC)
			return munmap(p, e.bytes) == 0 ? CU_OK : CU_INVALID_VALUE;
		return driver_ptr_call(f, p);
	}
	switch (e.kind) {
	case PBP_LEASE:
		release_lease(e.lease, false);
		return CU_OK;
	case PBP_CHARGED_DRIVER:
		r = driver_ptr_call(f, p);
		release_lease(e.lease, true);
		return r;
	case PBP_PAGEABLE_ALLOC:
		munmap(p, e.bytes);
		return CU_OK;
	default:
		return driver_ptr_call(f, p);
	}
}

/* ---- Registration ---- */

static int host_register(enum fn f, void *p, size_t size, unsigned flags)
{
	struct pb_acquire_opts o = lease_opts(PB_REGISTER_CHARGE_ONLY);
	size_t span;
	pb_client *c;
	pb_lease *l = NULL;
	char why[256];
	int r;

	if (passthrough() || !p || size == 0)
		return driver_register(f, p, size, flags);
	span = pbp_page_span((uintptr_t)p, size, page_size());
	c = get_client();
	if (c) {
		depth++;
		r = pb_register(c, p, size, &o, &l);
		depth--;
		if (r == 0) {
			r = driver_register(f, p, size, flags);
			if (r != CU_OK) {
				release_lease(l, true);
				return r;
			}
			if (track((struct pbp_entry){ .base = (uintptr_t)p, .bytes = pb_lease_size(l), .flags = flags,
						      .kind = PBP_REGISTRATION, .lease = l }) < 0) {
				driver_ptr_call(f == F_cudaHostRegister ? F_cudaHostUnregister : F_cuMemHostUnregister, p);
				release_lease(l, true);
				return CU_OUT_OF_MEMORY;
			}
			return CU_OK;
		}
		snprintf(why, sizeof(why), "broker refused: %s", pb_last_error());
	} else {
		snprintf(why, sizeof(why), "no broker");
	}
	switch (pbp_fallback(cfg.policy, flags, true)) {
	case PBP_DO_ERROR:
		say(true, "%s of %zu bytes refused (%s): out-of-memory error (fallback=error)", fn_names[f], size, why);
		return CU_OUT_OF_MEMORY;
	case PBP_DO_PAGEABLE:
		say(true, "%s of %zu bytes: %s: left pageable (fallback=pageable)", fn_names[f], size, why);
		return track((struct pbp_entry){ .base = (uintptr_t)p, .bytes = span, .flags = flags,
						 .kind = PBP_PAGEABLE_REG }) == 0 ? CU_OK : CU_OUT_OF_MEMORY;
	case PBP_DO_DRIVER:
		break;
	}
	r = driver_register(f, p, size, flags);
	if (r != CU_OK)
		return r;
	say(true, "%s of %zu bytes: %s: registered by the CUDA driver outside the budget (reported as unbrokered)",
	    fn_names[f], size, why);
	track((struct pbp_entry){ .base = (uintptr_t)p, .bytes = span, .flags = flags, .kind = PBP_DRIVER_REG });
	return CU_OK;
}

static int host_unregister(enum fn f, void *p)
{
	struct pbp_entry e;
	bool inherited;
	int r;

	if (passthrough() || !p || !untrack((uintptr_t)p, false, &e, &inherited))
		return driver_ptr_call(f, p);
	if (e.kind == PBP_PAGEABLE_REG)
		return CU_OK;
	r = driver_ptr_call(f, p);
	if (e.kind == PBP_REGISTRATION && !inherited)
		release_lease(e.lease, true);
	return r;
}

static int host_get_flags(enum fn f, unsigned *flags, void *p)
{
	const struct pbp_entry *e;
	int v = -2;

	if (!passthrough() && flags) {
		pthread_mutex_lock(&table_lock);
		e = pbp_table_find(&table, (uintptr_t)p);
		if (e && pbp_kind_is_alloc(e->kind))
			v = pbp_reported_flags(e);
		else if (e)
			v = e->kind == PBP_PAGEABLE_REG ? -1 : -2;
		pthread_mutex_unlock(&table_lock);
	}
	if (v == -1)
		return CU_INVALID_VALUE; /* pageable memory: what the driver says of any unpinned pointer */
	if (v >= 0) {
		*flags = (unsigned)v;
		return CU_OK;
	}
	return driver_get_flags(f, flags, p);
}

/* ---- The exported functions ---- */

EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)
{
	return host_alloc(F_cuMemHostAlloc, pp, bytesize, flags);
}

EXPORT CUresult cuMemAllocHost(void **pp, unsigned int bytesize)
{
	return host_alloc(F_cuMemAllocHost, pp, bytesize, 0);
}

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
	return host_alloc(F_cuMemAllocHost_v2, pp, bytesize, 0);
}

EXPORT CUresult cuMemFreeHost(void *p)
{
	return host_free(F_cuMemFreeHost, p);
}

EXPORT CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int flags)
{
	return host_register(F_cuMemHostRegister, p, bytesize, flags);
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags)
{
	return host_register(F_cuMemHostRegister_v2, p, bytesize, flags);
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
	return host_unregister(F_cuMemHostUnregister, p);
}

EXPORT CUresult cuMemHostGetFlags(unsigned int *flags, void *p)
{
	return host_get_flags(F_cuMemHostGetFlags, flags, p);
}

EXPORT cudaError_t cudaHostAlloc(void **pp, size_t size, unsigned int flags)
{
	return host_alloc(F_cudaHostAlloc, pp, size, flags);
}

EXPORT cudaError_t cudaMallocHost(void **pp, size_t size)
{
	return host_alloc(F_cudaMallocHost, pp, size, 0);
}

EXPORT cudaError_t cudaFreeHost(void *p)
{
	return host_free(F_cudaFreeHost, p);
}

EXPORT cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags)
{
	return host_register(F_cudaHostRegister, p, size, flags);
}

EXPORT cudaError_t cudaHostUnregister(void *p)
{
	return host_unregister(F_cudaHostUnregister, p);
}

EXPORT cudaError_t cudaHostGetFlags(unsigned int *flags, void *p)
{
	return host_get_flags(F_cudaHostGetFlags, flags, p);
}

/*
 * What cuGetProcAddress answered for symbol, swapped for our wrapper of the
 * same ABI. Matched by address against the driver's exported versions; when
 * the driver hands out an address it does not export, by name and the CUDA
 * version asked (the versions at which cuda.h moved to _v2).
 */
static void *substitute(const char *symbol, void *p, int cuda_version)
{
	if (!symbol || !p || cfg.off)
		return p;
	for (int f = 0; f < F_DRIVER_END; f++)
		if (real_fn((enum fn)f) == p)
			return wrapper(f);
	if (strcmp(symbol, "cuMemAllocHost") == 0)
		return wrapper(cuda_version >= 3020 ? F_cuMemAllocHost_v2 : F_cuMemAllocHost);
	if (strcmp(symbol, "cuMemHostRegister") == 0)
		return wrapper(cuda_version >= 6050 ? F_cuMemHostRegister_v2 : F_cuMemHostRegister);
	if (strcmp(symbol, "cuGetProcAddress") == 0)
		return wrapper(cuda_version >= 12000 ? F_cuGetProcAddress_v2 : F_cuGetProcAddress);
	for (int f = 0; f < F_DRIVER_END; f++)
		if (strcmp(symbol, fn_names[f]) == 0)
			return wrapper(f);
	return p;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags)
{
	CUresult r;

	if (!real_fn(F_cuGetProcAddress))
		return CU_NOT_INITIALIZED;
	r = CALL(CUresult(*)(const char *, void **, int, cuuint64_t), F_cuGetProcAddress, symbol, pfn, cuda_version,
		 flags);
	if (r == CU_OK && pfn)
		*pfn = substitute(symbol, *pfn, cuda_version);
	return r;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags, int *status)
{
	CUresult r;

	if (!real_fn(F_cuGetProcAddress_v2))
		return CU_NOT_INITIALIZED;
	r = CALL(CUresult(*)(const char *, void **, int, cuuint64_t, int *), F_cuGetProcAddress_v2, symbol, pfn,
		 cuda_version, flags, status);
	if (r == CU_OK && pfn)
		*pfn = substitute(symbol, *pfn, cuda_version);
	return r;
}

UNSANITIZED static void *wrapper(enum fn f)
{
	typedef void (*any_fn)(void);
	/* A static table, so a dlsym() made before our constructor ran (another library's) is served too. */
	static const any_fn wrappers[F_END] = {
		[F_cuMemHostAlloc] = (any_fn)cuMemHostAlloc,
		[F_cuMemAllocHost] = (any_fn)cuMemAllocHost,
		[F_cuMemAllocHost_v2] = (any_fn)cuMemAllocHost_v2,
		[F_cuMemFreeHost] = (any_fn)cuMemFreeHost,
		[F_cuMemHostRegister] = (any_fn)cuMemHostRegister,
		[F_cuMemHostRegister_v2] = (any_fn)cuMemHostRegister_v2,
		[F_cuMemHostUnregister] = (any_fn)cuMemHostUnregister,
		[F_cuMemHostGetFlags] = (any_fn)cuMemHostGetFlags,
		[F_cuGetProcAddress] = (any_fn)cuGetProcAddress,
		[F_cuGetProcAddress_v2] = (any_fn)cuGetProcAddress_v2,
		[F_cudaHostAlloc] = (any_fn)cudaHostAlloc,
		[F_cudaMallocHost] = (any_fn)cudaMallocHost,
		[F_cudaFreeHost] = (any_fn)cudaFreeHost,
		[F_cudaHostRegister] = (any_fn)cudaHostRegister,
		[F_cudaHostUnregister] = (any_fn)cudaHostUnregister,
		[F_cudaHostGetFlags] = (any_fn)cudaHostGetFlags,
	};

	return (void *)(uintptr_t)wrappers[f];
}

/* ---- dlsym ---- */

/* Calls from this object, and from libpinbroker itself (registering its own leases), get the real thing. */
UNSANITIZED static bool caller_is_ours(void *caller)
{
	Dl_info info;
	const char *base;

	if (!cfg.self_base && dladdr((void *)(uintptr_t)caller_is_ours, &info))
		cfg.self_base = (uintptr_t)info.dli_fbase;
	if (!dladdr(caller, &info) || !info.dli_fname)
		return false;
	if ((uintptr_t)info.dli_fbase == cfg.self_base)
		return true;
	base = strrchr(info.dli_fname, '/');
	base = base ? base + 1 : info.dli_fname;
	return strncmp(base, "libpinbroker", 12) == 0;
}

/* An address inside this object (one of our own exports). */
UNSANITIZED static bool addr_is_ours(void *p)
{
	Dl_info info;

	if (!cfg.self_base && dladdr((void *)(uintptr_t)caller_is_ours, &info))
		cfg.self_base = (uintptr_t)info.dli_fbase;
	return dladdr(p, &info) && (uintptr_t)info.dli_fbase == cfg.self_base;
}

/*
 * Called by dlsym() below with dlsym's own arguments and return address.
 * Returns our wrapper, or NULL for "let the real dlsym answer", which the
 * assembly then tail-calls so that RTLD_NEXT keeps meaning the caller's next.
 */
UNSANITIZED void *pbp_dlsym_override(void *handle, const char *name, void *caller)
{
	void *real;
	int f;

	if (!pbp_real_dlsym)
		pbp_real_dlsym = (void *(*)(void *, const char *))(uintptr_t)resolve_real_dlsym();
	if (cfg.off || !name || name[0] != 'c' || name[1] != 'u')
		return NULL;
	for (f = 0; f < F_END; f++)
		if (strcmp(name, fn_names[f]) == 0)
			break;
	if (f == F_END || caller_is_ours(caller))
		return NULL;
	real = real_dlsym(handle, name);
	if (!real)
		return NULL;
	/* RTLD_DEFAULT or RTLD_NEXT may find our own export first: that is no runtime to call. */
	if (f >= F_DRIVER_END && !atomic_load(&fn_real[f]) && !addr_is_ours(real))
		atomic_store(&fn_real[f], real);
	return wrapper(f);
}

/* ---- For preload-deepbind.c ---- */

extern void *dlopen(const char *file, int mode);

/*
 * The runtime's functions are not among the stand-ins: a deep-bound library's own libcudart reaches the
 * driver through dlsym and cuGetProcAddress, which are.
 */
UNSANITIZED void *pbp_stand_in(const char *name)
{
	if (cfg.off)
		return NULL;
	if (strcmp(name, "dlsym") == 0)
		return (void *)(uintptr_t)dlsym;
	if (strcmp(name, "dlopen") == 0)
		return (void *)(uintptr_t)dlopen;
	if (name[0] != 'c' || name[1] != 'u')
		return NULL;
	for (int f = 0; f < F_DRIVER_END; f++)
		if (strcmp(name, fn_names[f]) == 0)
			return wrapper(f);
	return NULL;
}

UNSANITIZED bool pbp_caller_is_ours(void *caller)
{
	return caller_is_ours(caller);
}

void pbp_note(const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	say(false, "%s", msg);
}

#if defined(__x86_64__)
/* dlsym(handle, name): ask the override (passing our return address), else jump to the real one. */
__asm__(".text\n"
	".globl dlsym\n"
	".type dlsym, @function\n"
	"dlsym:\n"
	"	.cfi_startproc\n"
	"	pushq %rdi\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	pushq %rsi\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	subq $8, %rsp\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	movq 24(%rsp), %rdx\n"
	"	call pbp_dlsym_override\n"
	"	addq $8, %rsp\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	popq %rsi\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	popq %rdi\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	testq %rax, %rax\n"
	"	jz 1f\n"
	"	ret\n"
	"1:	jmp *pbp_real_dlsym(%rip)\n"
	"	.cfi_endproc\n"
	".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
__asm__(".text\n"
	".globl dlsym\n"
	".type dlsym, %function\n"
	"dlsym:\n"
	"	stp x29, x30, [sp, #-32]!\n"
	"	mov x29, sp\n"
	"	stp x0, x1, [sp, #16]\n"
	"	mov x2, x30\n"
	"	bl pbp_dlsym_override\n"
	"	mov x9, x0\n"
	"	ldp x0, x1, [sp, #16]\n"
	"	ldp x29, x30, [sp], #32\n"
	"	cbz x9, 1f\n"
	"	mov x0, x9\n"
	"	ret\n"
	"1:	adrp x9, pbp_real_dlsym\n"
	"	ldr x9, [x9, #:lo12:pbp_real_dlsym]\n"
	"	br x9\n"
	".size dlsym, .-dlsym\n");
#else
#error "libpinbroker-preload: dlsym's tail call is written for x86_64 and aarch64 only"
#endif

/* ---- Set-up ---- */

/*
 * Every lock the child may need, held across fork() so that none is copied
 * held by a thread the child does not have. The order is the one the code
 * nests them in: report_lock (held over say(), which takes client_lock, and
 * over reading the count under table_lock), then client_lock, then table_lock.
 */
static void before_fork(void)
{
	pthread_mutex_lock(&report_lock);
	pthread_mutex_lock(&client_lock);
	pthread_mutex_lock(&table_lock);
}

static void after_fork_parent(void)
{
	pthread_mutex_unlock(&table_lock);
	pthread_mutex_unlock(&client_lock);
	pthread_mutex_unlock(&report_lock);
}

/*
 * The child shares its parent's connection: it must not speak on it. It gets
 * its own on first need; what it inherited stays the parent's (freeing it here
 * only unmaps this copy), and its unbrokered count starts from nothing.
 */
static void after_fork_child(void)
{
	generation++;
	client = NULL;
	next_connect_ms = 0;
	unbrokered_bytes = 0;
	pthread_mutex_unlock(&table_lock);
	pthread_mutex_unlock(&client_lock);
	pthread_mutex_unlock(&report_lock);
}

__attribute__((constructor)) static void preload_init(void)
{
	const char *fb = getenv("PINBROKER_PRELOAD_FALLBACK");
	const char *label = getenv("PINBROKER_LABEL");
	const char *log = getenv("PINBROKER_PRELOAD_LOG");
	const char *off = getenv("PINBROKER_PRELOAD");

	cfg.verbose = log && *log && strcmp(log, "0") != 0;
	cfg.off = off && strcmp(off, "0") == 0;
	if (pbp_policy_parse(fb, &cfg.policy) < 0) {
		fprintf(stderr,
			"pinbroker-preload: PINBROKER_PRELOAD_FALLBACK=%s is not cuda, error or pageable; using cuda\n",
			fb);
		cfg.policy = PBP_FALLBACK_CUDA;
	}
	if (label && *label)
		snprintf(cfg.label, sizeof(cfg.label), "%s", label);
	else {
		/* The daemon takes printable labels only: a program name with other bytes must not cost every lease. */
		snprintf(cfg.label, sizeof(cfg.label), "preload:%s", program_invocation_short_name);
		for (char *c = cfg.label; *c; c++)
			if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
				*c = '?';
	}
	pthread_atfork(before_fork, after_fork_parent, after_fork_child);
	if (!pbp_real_dlsym)
		pbp_real_dlsym = (void *(*)(void *, const char *))(uintptr_t)resolve_real_dlsym();
	say(false, "loaded: fallback=%s label=%s", pbp_policy_name(cfg.policy), cfg.label);
}

/* SPDX-License-Identifier: MIT */
/*
 * What libpinbroker-preload.so's wrappers do with pinned memory (preload.c has the wrappers): find the
 * real functions, take leases and registrations from the broker or follow the fallback policy, and keep
 * the table of what this process holds, across fork() too.
 */
#define _GNU_SOURCE
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

#include "pinbroker-internal.h"
#include "pinbroker.h"
#include "preload-table.h"
#include "preload.h"

const char *const pbp_fn_names[F_END] = {
	[F_cuMemHostAlloc] = "cuMemHostAlloc",
	[F_cuMemAllocHost] = "cuMemAllocHost",
	[F_cuMemAllocHost_v2] = "cuMemAllocHost_v2",
	[F_cuMemFreeHost] = "cuMemFreeHost",
	[F_cuMemHostRegister] = "cuMemHostRegister",
	[F_cuMemHostRegister_v2] = "cuMemHostRegister_v2",
	[F_cuMemHostUnregister] = "cuMemHostUnregister",
	[F_cuMemHostGetFlags] = "cuMemHostGetFlags",
	[F_cuGetProcAddress] = "cuGetProcAddress",
	[F_cuGetProcAddress_v2] = "cuGetProcAddress_v2",
	[F_cuMemCreate] = "cuMemCreate",
	[F_cuMemRelease] = "cuMemRelease",
	[F_cuMemRetainAllocationHandle] = "cuMemRetainAllocationHandle",
	[F_cuMemMap] = "cuMemMap",
	[F_cuMemUnmap] = "cuMemUnmap",
	[F_cuMemPoolCreate] = "cuMemPoolCreate",
	[F_cuMemPoolDestroy] = "cuMemPoolDestroy",
	[F_cuMemPoolTrimTo] = "cuMemPoolTrimTo",
	[F_cuMemGetDefaultMemPool] = "cuMemGetDefaultMemPool",
	[F_cuMemGetMemPool] = "cuMemGetMemPool",
	[F_cuMemAllocFromPoolAsync] = "cuMemAllocFromPoolAsync",
	[F_cuMemAllocFromPoolAsync_ptsz] = "cuMemAllocFromPoolAsync_ptsz",
	[F_cuMemFreeAsync] = "cuMemFreeAsync",
	[F_cuMemFreeAsync_ptsz] = "cuMemFreeAsync_ptsz",
	[F_cuMemFree_v2] = "cuMemFree_v2",
	[F_cuGraphAddMemAllocNode] = "cuGraphAddMemAllocNode",
	[F_cuGraphAddNode] = "cuGraphAddNode",
	[F_cuGraphAddNode_v2] = "cuGraphAddNode_v2",
	[F_cuGraphDestroy] = "cuGraphDestroy",
	[F_cuMemcpyHtoD_v2] = "cuMemcpyHtoD_v2",
	[F_cuMemcpyHtoD_v2_ptds] = "cuMemcpyHtoD_v2_ptds",
	[F_cuMemcpyDtoH_v2] = "cuMemcpyDtoH_v2",
	[F_cuMemcpyDtoH_v2_ptds] = "cuMemcpyDtoH_v2_ptds",
	[F_cuMemcpyHtoDAsync_v2] = "cuMemcpyHtoDAsync_v2",
	[F_cuMemcpyHtoDAsync_v2_ptsz] = "cuMemcpyHtoDAsync_v2_ptsz",
	[F_cuMemcpyDtoHAsync_v2] = "cuMemcpyDtoHAsync_v2",
	[F_cuMemcpyDtoHAsync_v2_ptsz] = "cuMemcpyDtoHAsync_v2_ptsz",
	[F_cuMemcpy] = "cuMemcpy",
	[F_cuMemcpy_ptds] = "cuMemcpy_ptds",
	[F_cuMemcpyAsync] = "cuMemcpyAsync",
	[F_cuMemcpyAsync_ptsz] = "cuMemcpyAsync_ptsz",
	[F_cudaHostAlloc] = "cudaHostAlloc",
	[F_cudaMallocHost] = "cudaMallocHost",
	[F_cudaFreeHost] = "cudaFreeHost",
	[F_cudaHostRegister] = "cudaHostRegister",
	[F_cudaHostUnregister] = "cudaHostUnregister",
	[F_cudaHostGetFlags] = "cudaHostGetFlags",
	[F_cudaMemcpy] = "cudaMemcpy",
	[F_cudaMemcpy_ptds] = "cudaMemcpy_ptds",
	[F_cudaMemcpyAsync] = "cudaMemcpyAsync",
	[F_cudaMemcpyAsync_ptsz] = "cudaMemcpyAsync_ptsz",
};

/* The real functions: the driver's from our own handle on libcuda.so.1, the runtime's as found. */
void *_Atomic pbp_fn_real[F_END];

/* The real dlsym once known. */
void *(*pbp_real_dlsym)(void *, const char *);

static __thread int depth; /* > 0 inside a wrapper: every wrapper then calls straight through */

/* Written by the constructor (preload.c) before any wrapper runs, then only self_base (once, the same value). */
struct pbp_cfg pbp_cfg;

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pbp_table table;
static unsigned generation = 1;   /* bumped in a forked child: what it inherited is not its own */
static uint64_t unbrokered_bytes; /* live PBP_DRIVER_* bytes of this process */

static pthread_mutex_t client_lock = PTHREAD_MUTEX_INITIALIZER;
static pb_client *client;
static int64_t next_connect_ms;
static int warnings_left = 5;

/* Taken before client_lock and table_lock when nested (report_unbrokered, pbp_before_fork). */
static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void pbp_say(bool warning, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (!pbp_cfg.verbose) {
		if (!warning)
			return;
		pthread_mutex_lock(&client_lock);
		bool quiet = warnings_left <= 0;
		if (!quiet && --warnings_left == 0)
			fprintf(stderr,
				"pinbroker-preload: further warnings muted (PINBROKER_PRELOAD_LOG=1 shows all)\n");
		pthread_mutex_unlock(&client_lock);
		if (quiet)
			return;
	}
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "pinbroker-preload[%d]: %s\n", (int)getpid(), msg);
}

UNSANITIZED void *pbp_resolve_real_dlsym(void)
{
	static const char *const versions[] = { "GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0" };
	void *p = NULL;

	for (size_t i = 0; !p && i < sizeof(versions) / sizeof(versions[0]); i++)
		p = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
	return p;
}

UNSANITIZED void *pbp_call_real_dlsym(void *handle, const char *name)
{
	if (!pbp_real_dlsym)
		pbp_real_dlsym = (void *(*)(void *, const char *))(uintptr_t)pbp_resolve_real_dlsym();
	return pbp_real_dlsym ? pbp_real_dlsym(handle, name) : NULL;
}

/* ---- Finding the real functions ---- */

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

static void load_driver(void)
{
	/* The program has it loaded already when it reaches a driver wrapper; this only takes a handle. */
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

	if (!h) {
		pbp_say(false, "libcuda.so.1: %s", dlerror());
		return;
	}
	for (int f = 0; f < F_DRIVER_END; f++)
		atomic_store(&pbp_fn_real[f], pbp_call_real_dlsym(h, pbp_fn_names[f]));
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

void *pbp_real_fn(enum fn f)
{
	void *p;

	if (f < F_DRIVER_END) {
		pthread_once(&driver_once, load_driver);
		return atomic_load(&pbp_fn_real[f]);
	}
	p = atomic_load(&pbp_fn_real[f]);
	if (p)
		return p;
	/* The next definition after ours: libcudart.so when the program linked it. */
	p = pbp_call_real_dlsym(RTLD_NEXT, pbp_fn_names[f]);
	if (!p) {
		/* Or a libcudart.so loaded into a local scope (a Python extension's dependency). */
		const char *path = NULL;
		void *h;

		dl_iterate_phdr(find_cudart, &path);
		h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
		if (h) {
			p = pbp_call_real_dlsym(h, pbp_fn_names[f]);
			dlclose(h);
		}
	}
	if (p)
		atomic_store(&pbp_fn_real[f], p);
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
			pbp_say(true, "%s: pinned memory follows the fallback (%s) until a broker answers",
				pb_last_error(), pbp_policy_name(pbp_cfg.policy));
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
		pbp_say(false, "reporting %llu unbrokered bytes: %s", (unsigned long long)bytes, pb_last_error());
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
		pbp_say(true, "cannot track %p: %s", (void *)e.base, strerror(-r));
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

pb_client *pbp_client(void)
{
	return get_client();
}

/* ---- For preload-cudapaths.c's rooms (preload-vmm.c, preload-pools.c, preload-graph.c) ---- */

bool pbp_passthrough(void)
{
	return depth > 0 || pbp_cfg.off;
}

void pbp_enter(void)
{
	depth++;
}

void pbp_leave(void)
{
	depth--;
}

size_t pbp_page_size(void)
{
	return page_size();
}

int pbp_charge(size_t bytes, pb_lease **out, char *why, size_t why_len)
{
	struct pb_acquire_opts o = { .label = pbp_cfg.label[0] ? pbp_cfg.label : NULL };
	pb_client *c = get_client();
	int r;

	*out = NULL;
	if (!c) {
		snprintf(why, why_len, "no broker");
		return -ENOTCONN;
	}
	depth++;
	r = register_charge_bytes(c, bytes, &o, out);
	depth--;
	if (r < 0)
		snprintf(why, why_len, "broker refused: %s", pb_last_error());
	return r;
}

void pbp_uncharge(pb_lease *l)
{
	if (l)
		release_lease(l, true);
}

void pbp_unbrokered_adjust(uint64_t add, uint64_t sub)
{
	if (add == sub)
		return;
	pthread_mutex_lock(&table_lock);
	unbrokered_bytes += add;
	unbrokered_bytes -= sub < unbrokered_bytes ? sub : unbrokered_bytes;
	pthread_mutex_unlock(&table_lock);
	report_unbrokered();
}

/* ---- Calling the real functions (always one level down: nothing they reach comes back here) ---- */

static int driver_alloc(enum fn f, void **pp, size_t size, unsigned flags)
{
	int r;

	if (!pbp_real_fn(f))
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

	if (!pbp_real_fn(f))
		return CU_NOT_INITIALIZED;
	depth++;
	r = CALL(int (*)(void *), f, p);
	depth--;
	return r;
}

static int driver_register(enum fn f, void *p, size_t size, unsigned flags)
{
	int r;

	if (!pbp_real_fn(f))
		return CU_NOT_INITIALIZED;
	depth++;
	r = CALL(int (*)(void *, size_t, unsigned), f, p, size, flags);
	depth--;
	return r;
}

static int driver_get_flags(enum fn f, unsigned *flags, void *p)
{
	int r;

	if (!pbp_real_fn(f))
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
	return depth > 0 || pbp_cfg.off;
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
	enum pbp_action a = pbp_fallback(pbp_cfg.policy, flags, false);
	int r;

	switch (a) {
	case PBP_DO_ERROR:
		pbp_say(true, "%s of %zu bytes refused (%s): out-of-memory error (fallback=error)", pbp_fn_names[f],
			size, why);
		return CU_OUT_OF_MEMORY;
	case PBP_DO_PAGEABLE:
		pbp_say(true, "%s of %zu bytes: %s: ordinary pageable memory (fallback=pageable)", pbp_fn_names[f],
			size, why);
		return pageable_alloc(pp, size);
	case PBP_DO_DRIVER:
		break;
	}
	r = driver_alloc(f, pp, size, flags);
	if (r != CU_OK)
		return r;
	pbp_say(true, "%s of %zu bytes: %s: pinned by the CUDA driver, outside the budget (reported as unbrokered)",
		pbp_fn_names[f], size, why);
	if (track((struct pbp_entry){ .base = (uintptr_t)*pp,
				      .bytes = pbp_page_span(0, size, page_size()),
				      .flags = flags,
				      .kind = PBP_DRIVER_ALLOC }) < 0) {
		driver_ptr_call(free_of(f), *pp);
		return CU_OUT_OF_MEMORY;
	}
	return CU_OK;
}

static struct pb_acquire_opts lease_opts(uint32_t flags)
{
	return (struct pb_acquire_opts){ .flags = flags, .label = pbp_cfg.label[0] ? pbp_cfg.label : NULL };
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
			if (track((struct pbp_entry){ .base = (uintptr_t)*pp,
						      .bytes = pb_lease_size(l),
						      .flags = flags,
						      .kind = PBP_CHARGED_DRIVER,
						      .lease = l }) == 0)
				return CU_OK;
			release_lease(l, true);
			driver_ptr_call(free_of(f), *pp);
			return CU_OUT_OF_MEMORY;
		}
		snprintf(why, sizeof(why), "charge refused: %s", pb_last_error());
	} else {
		snprintf(why, sizeof(why), "no broker");
	}
	switch (pbp_fallback(pbp_cfg.policy, flags, false)) {
	case PBP_DO_DRIVER:
		pbp_say(true, "%s of %zu write-combined bytes: %s: kept outside the budget (reported as unbrokered)",
			pbp_fn_names[f], size, why);
		if (track((struct pbp_entry){ .base = (uintptr_t)*pp,
					      .bytes = pbp_page_span(0, size, page_size()),
					      .flags = flags,
					      .kind = PBP_DRIVER_ALLOC }) == 0)
			return CU_OK;
		driver_ptr_call(free_of(f), *pp);
		return CU_OUT_OF_MEMORY;
	case PBP_DO_ERROR:
		driver_ptr_call(free_of(f), *pp);
		pbp_say(true, "%s of %zu write-combined bytes refused (%s): out-of-memory error (fallback=error)",
			pbp_fn_names[f], size, why);
		return CU_OUT_OF_MEMORY;
	case PBP_DO_PAGEABLE:
		driver_ptr_call(free_of(f), *pp);
		return pageable_alloc(pp, size);
	}
	return CU_OUT_OF_MEMORY;
}

int pbp_host_alloc(enum fn f, void **pp, size_t size, unsigned flags)
{
	/* As cudaHostAlloc's memory, the lease is there in a forked child. */
	struct pb_acquire_opts o = lease_opts(PB_ACQUIRE_NO_REVOKE | PB_ACQUIRE_MAPPED | PB_ACQUIRE_INHERIT);
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
	if (track((struct pbp_entry){ .base = (uintptr_t)pb_lease_data(l),
				      .bytes = pb_lease_size(l),
				      .flags = flags,
				      .kind = PBP_LEASE,
				      .lease = l }) < 0) {
		release_lease(l, false);
		return CU_OUT_OF_MEMORY;
	}
	*pp = pb_lease_data(l);
	pbp_say(false, "%s: %zu bytes as lease %llu", pbp_fn_names[f], size, (unsigned long long)pb_lease_id(l));
	return CU_OK;
}

int pbp_host_free(enum fn f, void *p)
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

int pbp_host_register(enum fn f, void *p, size_t size, unsigned flags)
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
			if (track((struct pbp_entry){ .base = (uintptr_t)p,
						      .bytes = pb_lease_size(l),
						      .flags = flags,
						      .kind = PBP_REGISTRATION,
						      .lease = l }) < 0) {
				driver_ptr_call(f == F_cudaHostRegister ? F_cudaHostUnregister : F_cuMemHostUnregister,
						p);
				release_lease(l, true);
				return CU_OUT_OF_MEMORY;
			}
			return CU_OK;
		}
		snprintf(why, sizeof(why), "broker refused: %s", pb_last_error());
	} else {
		snprintf(why, sizeof(why), "no broker");
	}
	switch (pbp_fallback(pbp_cfg.policy, flags, true)) {
	case PBP_DO_ERROR:
		pbp_say(true, "%s of %zu bytes refused (%s): out-of-memory error (fallback=error)", pbp_fn_names[f],
			size, why);
		return CU_OUT_OF_MEMORY;
	case PBP_DO_PAGEABLE:
		pbp_say(true, "%s of %zu bytes: %s: left pageable (fallback=pageable)", pbp_fn_names[f], size, why);
		return track((struct pbp_entry){
			       .base = (uintptr_t)p, .bytes = span, .flags = flags, .kind = PBP_PAGEABLE_REG }) == 0
			       ? CU_OK
			       : CU_OUT_OF_MEMORY;
	case PBP_DO_DRIVER:
		break;
	}
	r = driver_register(f, p, size, flags);
	if (r != CU_OK)
		return r;
	pbp_say(true, "%s of %zu bytes: %s: registered by the CUDA driver outside the budget (reported as unbrokered)",
		pbp_fn_names[f], size, why);
	track((struct pbp_entry){ .base = (uintptr_t)p, .bytes = span, .flags = flags, .kind = PBP_DRIVER_REG });
	return CU_OK;
}

int pbp_host_unregister(enum fn f, void *p)
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

int pbp_host_get_flags(enum fn f, unsigned *flags, void *p)
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

/*
 * Every lock the child may need, held across fork() so that none is copied
 * held by a thread the child does not have. The order is the one the code
 * nests them in: report_lock (held over pbp_say(), which takes client_lock, and
 * over reading the count under table_lock), then client_lock, then table_lock.
 */
void pbp_before_fork(void)
{
	pthread_mutex_lock(&report_lock);
	pthread_mutex_lock(&client_lock);
	pthread_mutex_lock(&table_lock);
}

void pbp_after_fork_parent(void)
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
void pbp_after_fork_child(void)
{
	generation++;
	client = NULL;
	next_connect_ms = 0;
	unbrokered_bytes = 0;
	pthread_mutex_unlock(&table_lock);
	pthread_mutex_unlock(&client_lock);
	pthread_mutex_unlock(&report_lock);
}

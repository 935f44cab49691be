/* SPDX-License-Identifier: MIT */
/*
 * An unmodified CUDA driver-API program that pins host memory the ways where the driver owns the pages, for the
 * interposer's CPU tests (check_itest_cudapaths) on the stand-in libcuda. Built twice from this file: linked to
 * libcuda.so.1 (CUDAPATHS_LINKED: its symbols), and not linked at all, reaching the driver with dlopen() and then
 * dlsym() or cuGetProcAddress.
 *
 *   cudapaths WAY PATH SIZE [MAXSIZE]
 *
 * WAY: link (the linked build only), dlsym, gpa (every function from cuGetProcAddress_v2, itself from dlsym),
 * gpa-ptsz (the same, asking for the per-thread default stream's versions, as cudart built for it does).
 * PATH and its steps, one line each ("STEP r=CUresult vmm=B pool=B graph=B", the stand-in driver's host bytes),
 * the program waiting for a line on stdin before each step after the first (EOF: it goes on):
 *   vmm           created (cuMemCreate host, reserve, map), released (cuMemRelease: still mapped),
 *                 unmapped (cuMemRetainAllocationHandle + cuMemRelease, then cuMemUnmap)
 *   vmm-race      raced (cuMemMap on a thread of its own, cuMemRelease of the handle on the main thread while
 *                 the stand-in driver sleeps in the map: run with STUB_CUDA_MAP_SLEEP_MS), unmapped (cuMemUnmap)
 *   pool          created (cuMemPoolCreate host with MAXSIZE or none, one allocation of SIZE), alloc2 (another),
 *                 freed (the first, cuMemFreeAsync), trimmed (cuMemPoolTrimTo 0), destroyed (cuMemPoolDestroy
 *                 with the second live), gone (the second freed with cuMemFree)
 *   default-pool  as pool from CUDA 13's default host pool (cuMemGetDefaultMemPool), ending with
 *                 done (the second freed with cuMemFree, then trimmed to 0)
 *   graph         created (cuGraphCreate, a host memory node of SIZE by cuGraphAddMemAllocNode, another by
 *                 cuGraphAddNode), destroyed (cuGraphDestroy)
 *   free-race     created (a host pool with one allocation of SIZE, a device pool with FREE_THREADS x
 *                 FREES_PER_THREAD allocations), raced (the device allocations freed from FREE_THREADS threads,
 *                 cuMemFree and cuMemFreeAsync in turn, while the main thread allocates SIZE from the host pool
 *                 and frees it, FREES_PER_THREAD times; run with STUB_CUDA_FREE_SLEEP_MS, r=FREES_SERIALISED
 *                 when the frees took half as long as one after another or more), done (the first freed, the
 *                 pool trimmed to 0 and destroyed)
 *   vmm-device-race
 *                 created (a host VMM allocation of SIZE, mapped), raced (VMM_THREADS threads each create a
 *                 device VMM allocation, map, unmap and release it, VMM_ROUNDS times, while the main thread
 *                 creates, maps, unmaps and releases another host one of SIZE, VMM_ROUNDS times; run with
 *                 STUB_CUDA_VMM_SLEEP_MS, r=VMM_SERIALISED when the device calls took half as long as one after
 *                 another or more), done (the first unmapped and released)
 * A step whose call fails prints its line, waits for the go-ahead as any other (so its charges can be read
 * while it lives), and the program exits 3.
 */
#define _GNU_SOURCE
#include "cuda_vmm_types.h"
#include "stub_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The driver's functions this program calls, however it found them. */
static struct {
	CUresult (*init)(unsigned);
	CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t, const struct cu_alloc_prop *,
			       unsigned long long);
	CUresult (*mem_release)(CUmemGenericAllocationHandle);
	CUresult (*address_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*address_free)(CUdeviceptr, size_t);
	CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
	CUresult (*mem_unmap)(CUdeviceptr, size_t);
	CUresult (*retain)(CUmemGenericAllocationHandle *, void *);
	CUresult (*set_access)(CUdeviceptr, size_t, const struct cu_access_desc *, size_t);
	CUresult (*pool_create)(void **, const struct cu_pool_props *);
	CUresult (*pool_destroy)(void *);
	CUresult (*pool_trim)(void *, size_t);
	CUresult (*default_pool)(void **, struct cu_location *, int);
	CUresult (*alloc_from_pool)(CUdeviceptr *, size_t, void *, void *);
	CUresult (*free_async)(CUdeviceptr, void *);
	CUresult (*mem_free)(CUdeviceptr);
	CUresult (*stream_sync)(void *);
	CUresult (*graph_create)(void **, unsigned);
	CUresult (*graph_add_alloc)(void **, void *, const void *, size_t, struct cu_alloc_node_params *);
	CUresult (*graph_add_node)(void **, void *, const void *, const void *, size_t, struct cu_graph_node_params *);
	CUresult (*graph_destroy)(void *);
} cu;

#ifdef CUDAPATHS_LINKED
CUresult cuInit(unsigned flags);
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const struct cu_alloc_prop *prop,
		     unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle h);
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr p, size_t size);
CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr p, size_t size);
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr);
CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const struct cu_access_desc *desc, size_t count);
CUresult cuMemPoolCreate(void **pool, const struct cu_pool_props *props);
CUresult cuMemPoolDestroy(void *pool);
CUresult cuMemPoolTrimTo(void *pool, size_t keep);
CUresult cuMemGetDefaultMemPool(void **pool, struct cu_location *loc, int type);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, void *pool, void *stream);
CUresult cuMemFreeAsync(CUdeviceptr p, void *stream);
CUresult cuMemFree_v2(CUdeviceptr p);
CUresult cuStreamSynchronize(void *stream);
CUresult cuGraphCreate(void **g, unsigned flags);
CUresult cuGraphAddMemAllocNode(void **n, void *g, const void *deps, size_t nd, struct cu_alloc_node_params *p);
CUresult cuGraphAddNode_v2(void **n, void *g, const void *deps, const void *edges, size_t nd,
			   struct cu_graph_node_params *p);
CUresult cuGraphDestroy(void *g);

static void bind_linked(void)
{
	cu.init = cuInit;
	cu.mem_create = cuMemCreate;
	cu.mem_release = cuMemRelease;
	cu.address_reserve = cuMemAddressReserve;
	cu.address_free = cuMemAddressFree;
	cu.mem_map = cuMemMap;
	cu.mem_unmap = cuMemUnmap;
	cu.retain = cuMemRetainAllocationHandle;
	cu.set_access = cuMemSetAccess;
	cu.pool_create = cuMemPoolCreate;
	cu.pool_destroy = cuMemPoolDestroy;
	cu.pool_trim = cuMemPoolTrimTo;
	cu.default_pool = cuMemGetDefaultMemPool;
	cu.alloc_from_pool = cuMemAllocFromPoolAsync;
	cu.free_async = cuMemFreeAsync;
	cu.mem_free = cuMemFree_v2;
	cu.stream_sync = cuStreamSynchronize;
	cu.graph_create = cuGraphCreate;
	cu.graph_add_alloc = cuGraphAddMemAllocNode;
	cu.graph_add_node = cuGraphAddNode_v2;
	cu.graph_destroy = cuGraphDestroy;
}
#endif

static void *handle;

/* name's function: from dlsym on the driver's handle, or (gpa) from cuGetProcAddress_v2 at CUDA 13.0. */
static void *lookup(const char *name, const char *way)
{
	static CUresult (*gpa)(const char *, void **, int, cuuint64_t, int *);
	cuuint64_t flags = strcmp(way, "gpa-ptsz") == 0 ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0u;
	void *p = NULL;

	if (strcmp(way, "dlsym") == 0)
		return dlsym(handle, name);
	if (!gpa)
		*(void **)&gpa = dlsym(handle, "cuGetProcAddress_v2");
	if (!gpa || gpa(name, &p, 13000, flags, NULL) != 0)
		return NULL;
	return p;
}

static int bind_looked_up(const char *way)
{
	static const struct {
		const char *name;
		size_t offset;
	} names[] = {
#define E(n, f) { n, offsetof(__typeof__(cu), f) }
		E("cuInit", init),
		E("cuMemCreate", mem_create),
		E("cuMemRelease", mem_release),
		E("cuMemAddressReserve", address_reserve),
		E("cuMemAddressFree", address_free),
		E("cuMemMap", mem_map),
		E("cuMemUnmap", mem_unmap),
		E("cuMemRetainAllocationHandle", retain),
		E("cuMemSetAccess", set_access),
		E("cuMemPoolCreate", pool_create),
		E("cuMemPoolDestroy", pool_destroy),
		E("cuMemPoolTrimTo", pool_trim),
		E("cuMemGetDefaultMemPool", default_pool),
		E("cuMemAllocFromPoolAsync", alloc_from_pool),
		E("cuMemFreeAsync", free_async),
		E("cuMemFree_v2", mem_free),
		E("cuStreamSynchronize", stream_sync),
		E("cuGraphCreate", graph_create),
		E("cuGraphAddMemAllocNode", graph_add_alloc),
		E("cuGraphAddNode_v2", graph_add_node),
		E("cuGraphDestroy", graph_destroy),
#undef E
	};

	handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!handle) {
		fprintf(stderr, "cudapaths: %s\n", dlerror());
		return -1;
	}
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		/* cuGetProcAddress knows base names: cuMemFree and cuGraphAddNode answer their current versions. */
		const char *name = names[i].name;
		void *p;

		if (strcmp(way, "dlsym") != 0 && strcmp(name, "cuMemFree_v2") == 0)
			name = "cuMemFree";
		if (strcmp(way, "dlsym") != 0 && strcmp(name, "cuGraphAddNode_v2") == 0)
			name = "cuGraphAddNode";
		p = lookup(name, way);
		if (!p) {
			fprintf(stderr, "cudapaths: %s: not found by %s\n", name, way);
			return -1;
		}
		memcpy((char *)&cu + names[i].offset, &p, sizeof(p));
	}
	return 0;
}

/* The stand-in driver's own figures. */
static struct stub_cuda_vmm_stats stats(void)
{
	struct stub_cuda_vmm_stats s = { 0 };
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	void (*get)(struct stub_cuda_vmm_stats *) = NULL;

	if (h) {
		*(void **)&get = dlsym(h, "stub_cuda_vmm_get_stats");
		if (get)
			get(&s);
		dlclose(h);
	}
	return s;
}

/* Print a step and wait for the go-ahead; a failed call then ends the program (exit 3). */
static void step(const char *name, CUresult r, int last)
{
	struct stub_cuda_vmm_stats s = stats();
	int c;

	printf("%s r=%d vmm=%llu pool=%llu graph=%llu\n", name, r, (unsigned long long)s.vmm_host_bytes,
	       (unsigned long long)s.pool_host_bytes, (unsigned long long)s.graph_host_bytes);
	fflush(stdout);
	if (last && r == 0)
		return;
	while ((c = getchar()) != EOF && c != '\n')
		;
	if (r != 0)
		exit(3);
}

#define HOST_LOCATION ((struct cu_location){ .type = CU_MEM_LOCATION_TYPE_HOST })

static int run_vmm(size_t size)
{
	struct cu_alloc_prop prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				      .location = { .type = CU_MEM_LOCATION_TYPE_HOST_NUMA, .id = 0 } };
	struct cu_access_desc access = { .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
					 .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	CUmemGenericAllocationHandle h = 0, again = 0;
	CUdeviceptr va = 0;
	CUresult r;

	r = cu.mem_create(&h, size, &prop, 0);
	if (r == 0 && (r = cu.address_reserve(&va, size, 0, 0, 0)) == 0 && (r = cu.mem_map(va, size, 0, h, 0)) == 0)
		r = cu.set_access(va, size, &access, 1);
	step("created", r, 0);
	step("released", cu.mem_release(h), 0);
	r = cu.retain(&again, (void *)(uintptr_t)va);
	if (r == 0)
		r = cu.mem_release(again);
	if (r == 0)
		r = cu.mem_unmap(va, size);
	if (r == 0)
		r = cu.address_free(va, size);
	step("unmapped", r, 1);
	return 0;
}

struct map_args {
	CUdeviceptr va;
	size_t size;
	CUmemGenericAllocationHandle h;
	CUresult r;
};

static void *map_thread(void *arg)
{
	struct map_args *m = arg;

	m->r = cu.mem_map(m->va, m->size, 0, m->h, 0);
	return NULL;
}

/*
 * The handle released while its mapping is being made on another thread: the driver keeps the memory (mapped),
 * so the charge must stay. The release comes 100 ms into the map, which the stand-in driver makes last longer.
 */
static int run_vmm_race(size_t size)
{
	struct cu_alloc_prop prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED, .location = HOST_LOCATION };
	struct map_args m = { .size = size };
	pthread_t t;
	CUresult r;

	r = cu.mem_create(&m.h, size, &prop, 0);
	if (r == 0)
		r = cu.address_reserve(&m.va, size, 0, 0, 0);
	if (r == 0 && pthread_create(&t, NULL, map_thread, &m) != 0)
		r = 2;
	if (r == 0) {
		usleep(100 * 1000);
		r = cu.mem_release(m.h);
		pthread_join(t, NULL);
		if (r == 0)
			r = m.r;
	}
	step("raced", r, 0);
	r = cu.mem_unmap(m.va, size);
	if (r == 0)
		r = cu.address_free(m.va, size);
	step("unmapped", r, 1);
	return 0;
}

static int run_pool(size_t size, size_t max_size, int use_default)
{
	struct cu_pool_props props = { .alloc_type = CU_MEM_ALLOCATION_TYPE_PINNED,
				       .location = HOST_LOCATION,
				       .max_size = max_size };
	struct cu_location where = HOST_LOCATION;
	CUdeviceptr a = 0, b = 0;
	void *pool = NULL;
	CUresult r;

	r = use_default ? cu.default_pool(&pool, &where, CU_MEM_ALLOCATION_TYPE_PINNED) : cu.pool_create(&pool, &props);
	if (r == 0)
		r = cu.alloc_from_pool(&a, size, pool, NULL);
	step("created", r, 0);
	step("alloc2", cu.alloc_from_pool(&b, size, pool, NULL), 0);
	r = cu.free_async(a, NULL);
	if (r == 0)
		r = cu.stream_sync(NULL);
	step("freed", r, 0);
	step("trimmed", cu.pool_trim(pool, 0), 0);
	if (use_default) {
		r = cu.mem_free(b);
		if (r == 0)
			r = cu.pool_trim(pool, 0);
		step("done", r, 1);
		return 0;
	}
	step("destroyed", cu.pool_destroy(pool), 0);
	step("gone", cu.mem_free(b), 1);
	return 0;
}

#define FREE_THREADS 8
#define FREES_PER_THREAD 4
#define FREES_SERIALISED 1000 /* not a CUresult: the device frees ran one after another */

static struct {
	CUdeviceptr p[FREE_THREADS][FREES_PER_THREAD];
	CUresult r[FREE_THREADS];
} dev;

static void *free_thread(void *arg)
{
	CUdeviceptr *p = arg;
	size_t t = (size_t)(p - dev.p[0]) / FREES_PER_THREAD;

	for (int i = 0; i < FREES_PER_THREAD && dev.r[t] == 0; i++)
		dev.r[t] = i % 2 ? cu.free_async(p[i], NULL) : cu.mem_free(p[i]);
	return NULL;
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/*
 * Device frees on many threads while a host-pool allocation lives and another comes and goes: the host pool's
 * charge must stay exact, and the device frees must not wait for one another in the interposer (each sleeps in
 * the stand-in driver: serialised, they take FREE_THREADS times as long).
 */
static int run_free_race(size_t size)
{
	struct cu_pool_props host = { .alloc_type = CU_MEM_ALLOCATION_TYPE_PINNED, .location = HOST_LOCATION };
	struct cu_pool_props device = { .alloc_type = CU_MEM_ALLOCATION_TYPE_PINNED,
					.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 } };
	const char *sleep_ms = getenv("STUB_CUDA_FREE_SLEEP_MS");
	pthread_t t[FREE_THREADS];
	void *hpool = NULL, *dpool = NULL;
	CUdeviceptr a = 0, b = 0;
	double start, took_ms;
	int started = 0;
	CUresult r;

	/*
	 * The device allocations first: the stand-in maps downwards, so the host pool's come below them and its
	 * span, as with a real driver, where every pool reserves address space of its own. A device pointer inside
	 * the span would take the lock, rightly.
	 */
	r = cu.pool_create(&dpool, &device);
	for (int i = 0; r == 0 && i < FREE_THREADS * FREES_PER_THREAD; i++)
		r = cu.alloc_from_pool(&dev.p[i / FREES_PER_THREAD][i % FREES_PER_THREAD], 4096, dpool, NULL);
	if (r == 0)
		r = cu.pool_create(&hpool, &host);
	if (r == 0)
		r = cu.alloc_from_pool(&a, size, hpool, NULL);
	step("created", r, 0);
	start = now_ms();
	for (; started < FREE_THREADS && pthread_create(&t[started], NULL, free_thread, dev.p[started]) == 0; started++)
		;
	if (started < FREE_THREADS)
		r = 2;
	for (int i = 0; r == 0 && i < FREES_PER_THREAD; i++) {
		r = cu.alloc_from_pool(&b, size, hpool, NULL);
		if (r == 0)
			r = cu.free_async(b, NULL);
	}
	for (int i = 0; i < started; i++) {
		pthread_join(t[i], NULL);
		if (r == 0)
			r = dev.r[i];
	}
	took_ms = now_ms() - start;
	if (r == 0 && sleep_ms && took_ms >= FREE_THREADS * FREES_PER_THREAD * atof(sleep_ms) / 2)
		r = FREES_SERIALISED;
	fprintf(stderr, "cudapaths: %d device frees on %d threads took %.0f ms\n", FREE_THREADS * FREES_PER_THREAD,
		FREE_THREADS, took_ms);
	step("raced", r, 0);
	r = cu.mem_free(a);
	if (r == 0)
		r = cu.pool_trim(hpool, 0);
	if (r == 0)
		r = cu.pool_destroy(hpool);
	if (r == 0)
		r = cu.pool_destroy(dpool);
	step("done", r, 1);
	return 0;
}

#define VMM_THREADS 8
#define VMM_ROUNDS 2
#define VMM_SERIALISED 1001 /* not a CUresult: the device VMM calls ran one after another */

struct vmm_thread {
	pthread_t t;
	CUdeviceptr va;
	CUresult r;
};

/* Device VMM as PyTorch's expandable segments use it: a handle mapped into reserved space, unmapped, released. */
static void *vmm_thread(void *arg)
{
	struct vmm_thread *d = arg;
	struct cu_alloc_prop prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				      .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 } };
	CUmemGenericAllocationHandle h;

	for (int i = 0; i < VMM_ROUNDS && d->r == 0; i++) {
		d->r = cu.mem_create(&h, 2 * 1024 * 1024, &prop, 0);
		if (d->r == 0 && (d->r = cu.mem_map(d->va, 2 * 1024 * 1024, 0, h, 0)) == 0)
			d->r = cu.mem_unmap(d->va, 2 * 1024 * 1024);
		if (d->r == 0)
			d->r = cu.mem_release(h);
	}
	return NULL;
}

/* One host VMM allocation: created, reserved and mapped at *va. */
static CUresult host_vmm(CUmemGenericAllocationHandle *h, CUdeviceptr *va, size_t size)
{
	struct cu_alloc_prop prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED, .location = HOST_LOCATION };
	CUresult r = cu.mem_create(h, size, &prop, 0);

	if (r == 0 && !*va)
		r = cu.address_reserve(va, size, 0, 0, 0);
	return r == 0 ? cu.mem_map(*va, size, 0, *h, 0) : r;
}

/*
 * Device VMM maps, unmaps and releases on many threads while a host VMM allocation lives and another comes and
 * goes: the host charge must stay exact, and the device calls must not wait for one another in the interposer
 * (each sleeps in the stand-in driver: serialised, they take VMM_THREADS times as long).
 */
static int run_vmm_device_race(size_t size)
{
	const char *sleep_ms = getenv("STUB_CUDA_VMM_SLEEP_MS");
	struct vmm_thread d[VMM_THREADS] = { 0 };
	CUmemGenericAllocationHandle a = 0, b = 0;
	CUdeviceptr va_a = 0, va_b = 0;
	double start, took_ms;
	int started = 0;
	CUresult r = 0;

	/* The device space first: the stand-in maps downwards, so the host mappings' span lies below it. */
	for (int i = 0; r == 0 && i < VMM_THREADS; i++)
		r = cu.address_reserve(&d[i].va, 2 * 1024 * 1024, 0, 0, 0);
	if (r == 0)
		r = cu.address_reserve(&va_b, size, 0, 0, 0);
	if (r == 0)
		r = host_vmm(&a, &va_a, size);
	step("created", r, 0);
	start = now_ms();
	for (; r == 0 && started < VMM_THREADS && pthread_create(&d[started].t, NULL, vmm_thread, &d[started]) == 0;
	     started++)
		;
	if (r == 0 && started < VMM_THREADS)
		r = 2;
	for (int i = 0; r == 0 && i < VMM_ROUNDS; i++) {
		r = host_vmm(&b, &va_b, size);
		if (r == 0)
			r = cu.mem_unmap(va_b, size);
		if (r == 0)
			r = cu.mem_release(b);
	}
	for (int i = 0; i < started; i++) {
		pthread_join(d[i].t, NULL);
		if (r == 0)
			r = d[i].r;
	}
	took_ms = now_ms() - start;
	if (r == 0 && sleep_ms && took_ms >= VMM_THREADS * VMM_ROUNDS * 3 * atof(sleep_ms) / 2)
		r = VMM_SERIALISED;
	fprintf(stderr, "cudapaths: %d device VMM calls on %d threads took %.0f ms\n", VMM_THREADS * VMM_ROUNDS * 3,
		VMM_THREADS, took_ms);
	step("raced", r, 0);
	r = cu.mem_unmap(va_a, size);
	if (r == 0)
		r = cu.mem_release(a);
	for (int i = 0; r == 0 && i < VMM_THREADS; i++)
		r = cu.address_free(d[i].va, 2 * 1024 * 1024);
	if (r == 0)
		r = cu.address_free(va_a, size);
	if (r == 0)
		r = cu.address_free(va_b, size);
	step("done", r, 1);
	return 0;
}

static int run_graph(size_t size)
{
	struct cu_alloc_node_params p = { .pool_props = { .alloc_type = CU_MEM_ALLOCATION_TYPE_PINNED,
							  .location = HOST_LOCATION },
					  .bytesize = size };
	struct cu_graph_node_params np = { .type = CU_GRAPH_NODE_TYPE_MEM_ALLOC };
	void *g = NULL, *n1 = NULL, *n2 = NULL;
	CUresult r;

	np.alloc = p;
	r = cu.graph_create(&g, 0);
	if (r == 0)
		r = cu.graph_add_alloc(&n1, g, NULL, 0, &p);
	if (r == 0)
		r = cu.graph_add_node(&n2, g, NULL, NULL, 0, &np);
	step("created", r, 0);
	step("destroyed", cu.graph_destroy(g), 1);
	return 0;
}

int main(int argc, char **argv)
{
	size_t size, max_size;

	if (argc < 4) {
		fprintf(stderr,
			"usage: cudapaths link|dlsym|gpa|gpa-ptsz vmm|vmm-race|pool|default-pool|graph|free-race|"
			"vmm-device-race SIZE [MAXSIZE]\n");
		return 2;
	}
	size = strtoull(argv[3], NULL, 0);
	max_size = argc > 4 ? strtoull(argv[4], NULL, 0) : 0;
	if (strcmp(argv[1], "link") == 0) {
#ifdef CUDAPATHS_LINKED
		bind_linked();
#else
		fprintf(stderr, "cudapaths: this build is not linked to libcuda.so.1\n");
		return 2;
#endif
	} else if (bind_looked_up(argv[1]) < 0) {
		return 2;
	}
	if (cu.init(0) != 0)
		return 2;
	if (strcmp(argv[2], "vmm") == 0)
		return run_vmm(size);
	if (strcmp(argv[2], "vmm-race") == 0)
		return run_vmm_race(size);
	if (strcmp(argv[2], "pool") == 0 || strcmp(argv[2], "default-pool") == 0)
		return run_pool(size, max_size, strcmp(argv[2], "default-pool") == 0);
	if (strcmp(argv[2], "graph") == 0)
		return run_graph(size);
	if (strcmp(argv[2], "free-race") == 0)
		return run_free_race(size);
	if (strcmp(argv[2], "vmm-device-race") == 0)
		return run_vmm_device_race(size);
	fprintf(stderr, "cudapaths: unknown path %s\n", argv[2]);
	return 2;
}

/* SPDX-License-Identifier: MIT */
/*
 * A stand-in libcuda.so.1 for the interposer's CPU tests: the driver entry
 * points libpinbroker and the interposer use, with the real ABI and error
 * codes, over ordinary memory. It records what the "driver" itself pinned
 * (allocations and registrations) so a test can tell memory the broker served
 * from memory that reached the driver. Linked -Bsymbolic, as a driver is: its
 * own references never reach the interposer's functions of the same names.
 */
#define _GNU_SOURCE
#include "stub_cuda.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>

#include "stub_cuda_int.h"

typedef int CUdevice;

#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713
#define DEVICEMAP 0x2u

struct range {
	uintptr_t p;
	size_t bytes;
	unsigned flags;
	bool alloc; /* else a registration */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct range ranges[4096];
static size_t n_ranges;
static struct stub_cuda_stats stats;
static struct stub_cuda_register_call reg_log[1024];
static size_t n_reg_calls;
static int initialised;
static __thread CUcontext current;
static struct CUctx_st {
	int dummy;
} primary;

/* Held across fork(), so a child forked while another thread is in here can still call in (the fork tests). */
static void lock_for_fork(void)
{
	pthread_mutex_lock(&lock);
}

static void unlock_after_fork(void)
{
	pthread_mutex_unlock(&lock);
}

__attribute__((constructor)) static void stub_init(void)
{
	pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork);
}

/* Index of the range holding p (exactly at its start when exact), or -1. Under lock. */
static int find(uintptr_t p, bool exact)
{
	for (size_t i = 0; i < n_ranges; i++)
		if (exact ? ranges[i].p == p : p - ranges[i].p < ranges[i].bytes)
			return (int)i;
	return -1;
}

static CUresult add(void *p, size_t bytes, unsigned flags, bool alloc)
{
	CUresult r = CUDA_SUCCESS;

	pthread_mutex_lock(&lock);
	if (!alloc && (find((uintptr_t)p, false) >= 0 || find((uintptr_t)p + bytes - 1, false) >= 0))
		r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
	else if (n_ranges == sizeof(ranges) / sizeof(ranges[0]))
		r = CUDA_ERROR_OUT_OF_MEMORY;
	if (r == CUDA_SUCCESS) {
		ranges[n_ranges++] = (struct range){ (uintptr_t)p, bytes, flags, alloc };
		if (alloc) {
			stats.alloc_bytes += bytes;
			stats.alloc_calls++;
		} else {
			stats.registered_bytes += bytes;
			stats.register_calls++;
		}
	}
	pthread_mutex_unlock(&lock);
	return r;
}

static bool take(void *p, bool alloc, struct range *out)
{
	int i;

	pthread_mutex_lock(&lock);
	i = find((uintptr_t)p, true);
	if (i >= 0 && ranges[i].alloc == alloc) {
		*out = ranges[i];
		ranges[i] = ranges[--n_ranges];
		if (alloc)
			stats.alloc_bytes -= out->bytes;
		else
			stats.registered_bytes -= out->bytes;
	} else {
		i = -1;
	}
	pthread_mutex_unlock(&lock);
	return i >= 0;
}

STUB void stub_cuda_get_stats(struct stub_cuda_stats *s)
{
	pthread_mutex_lock(&lock);
	*s = stats;
	pthread_mutex_unlock(&lock);
}

STUB CUresult cuInit(unsigned flags)
{
	(void)flags;
	initialised = 1;
	return CUDA_SUCCESS;
}

STUB CUresult cuDriverGetVersion(int *v)
{
	*v = 13000;
	return CUDA_SUCCESS;
}

STUB CUresult cuDeviceGetCount(int *n)
{
	if (!initialised)
		return CUDA_ERROR_NOT_INITIALIZED;
	*n = 1;
	return CUDA_SUCCESS;
}

STUB CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
	if (ordinal != 0)
		return CUDA_ERROR_INVALID_VALUE;
	*d = 0;
	return CUDA_SUCCESS;
}

/* One 16 GiB GPU, for pinctl doctor's budget check. */
/*
 * NUMA placement's entry points. The one device's PCI bus id is STUB_CUDA_PCI_BUS_ID (default
 * 0000:3b:00.0). CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID (134) answers STUB_CUDA_HOST_NUMA_ID, and is refused as a
 * driver before CUDA 12.2 refuses it (CUDA_ERROR_INVALID_VALUE) while that is unset.
 */
static const char *stub_bus_id(void)
{
	const char *b = getenv("STUB_CUDA_PCI_BUS_ID");

	return b && *b ? b : "0000:3b:00.0";
}

STUB CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice d)
{
	const char *v = getenv("STUB_CUDA_HOST_NUMA_ID");

	if (!initialised)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (d != 0 || attribute != 134 || !v || !*v)
		return CUDA_ERROR_INVALID_VALUE;
	*value = atoi(v);
	return CUDA_SUCCESS;
}

STUB CUresult cuDeviceGetPCIBusId(char *buf, int len, CUdevice d)
{
	if (!initialised)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (d != 0 || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(buf, (size_t)len, "%s", stub_bus_id());
	return CUDA_SUCCESS;
}

STUB CUresult cuDeviceGetByPCIBusId(CUdevice *d, const char *bus)
{
	const char *mine = stub_bus_id();
	size_t skip = strchr(bus, ':') == strrchr(bus, ':') ? 5 : 0; /* "3b:00.0" against "0000:3b:00.0" */

	if (!initialised)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (strlen(mine) < skip || strcasecmp(mine + skip, bus) != 0)
		return CUDA_ERROR_INVALID_VALUE;
	*d = 0;
	return CUDA_SUCCESS;
}

STUB CUresult cuCtxGetDevice(CUdevice *d)
{
	if (!current)
		return 201; /* CUDA_ERROR_INVALID_CONTEXT */
	*d = 0;
	return CUDA_SUCCESS;
}

STUB CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d)
{
	if (d != 0)
		return CUDA_ERROR_INVALID_VALUE;
	*bytes = (size_t)16 << 30;
	return CUDA_SUCCESS;
}

STUB CUresult cuGetErrorString(CUresult r, const char **s)
{
	switch (r) {
	case CUDA_SUCCESS:
		*s = "no error";
		break;
	case CUDA_ERROR_OUT_OF_MEMORY:
		*s = "out of memory";
		break;
	case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
		*s = "part or all of the requested memory range is already mapped";
		break;
	case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED:
		*s = "pointer does not correspond to a registered memory region";
		break;
	default:
		*s = "invalid argument";
		break;
	}
	return CUDA_SUCCESS;
}

STUB CUresult cuCtxGetCurrent(CUcontext *c)
{
	*c = current;
	return CUDA_SUCCESS;
}

STUB CUresult cuCtxSetCurrent(CUcontext c)
{
	current = c;
	return CUDA_SUCCESS;
}

STUB CUresult cuCtxPushCurrent_v2(CUcontext c)
{
	current = c;
	return CUDA_SUCCESS;
}

STUB CUresult cuCtxPopCurrent_v2(CUcontext *c)
{
	if (c)
		*c = current;
	current = NULL;
	return CUDA_SUCCESS;
}

/* Every context cuCtxCreate_v2 made: never freed (a handle used after cuCtxDestroy stays harmless here), and held
 * here so the leak checker sees them kept, not lost. */
static CUcontext made_contexts[64];
static unsigned n_made_contexts;

/* A context of its own, made current (staged copies keep events per context: a test needs two). */
STUB CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice d)
{
	(void)flags;
	if (!c || d != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (n_made_contexts == sizeof(made_contexts) / sizeof(made_contexts[0]))
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (!(*c = calloc(1, sizeof(**c))))
		return CUDA_ERROR_OUT_OF_MEMORY;
	made_contexts[n_made_contexts++] = *c;
	current = *c;
	return CUDA_SUCCESS;
}

STUB CUresult cuCtxDestroy_v2(CUcontext c)
{
	if (!c || c == &primary)
		return CUDA_ERROR_INVALID_VALUE;
	if (current == c)
		current = NULL;
	return CUDA_SUCCESS;
}

STUB CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
	(void)d;
	*c = &primary;
	return CUDA_SUCCESS;
}

static CUresult host_alloc(void **pp, size_t bytes, unsigned flags)
{
	void *p;
	CUresult r;

	if (!pp || bytes == 0)
		return CUDA_ERROR_INVALID_VALUE;
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = add(p, bytes, flags, true);
	if (r != CUDA_SUCCESS) {
		munmap(p, bytes);
		return r;
	}
	*pp = p;
	return CUDA_SUCCESS;
}

/* Memory the interposer never saw: its frees must reach the driver untouched. */
STUB CUresult stub_cuda_alloc_untracked(void **pp, size_t bytes)
{
	return host_alloc(pp, bytes, 0);
}

STUB CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned flags)
{
	return host_alloc(pp, bytes, flags);
}

STUB CUresult cuMemAllocHost(void **pp, unsigned int bytes)
{
	return host_alloc(pp, bytes, 0);
}

STUB CUresult cuMemAllocHost_v2(void **pp, size_t bytes)
{
	return host_alloc(pp, bytes, 0);
}

STUB CUresult cuMemFreeHost(void *p)
{
	struct range r;

	if (!take(p, true, &r))
		return CUDA_ERROR_INVALID_VALUE;
	munmap(p, r.bytes);
	return CUDA_SUCCESS;
}

STUB size_t stub_cuda_register_log(struct stub_cuda_register_call *calls, size_t max)
{
	size_t n;

	pthread_mutex_lock(&lock);
	n = n_reg_calls;
	for (size_t i = 0; i < max && i < n && i < sizeof(reg_log) / sizeof(reg_log[0]); i++)
		calls[i] = reg_log[i];
	pthread_mutex_unlock(&lock);
	return n;
}

/* A size from the environment ("6M", "512G", digits alone for bytes), or 0 when unset or not a size. */
static uint64_t env_size(const char *name)
{
	const char *v = getenv(name);
	char *end;
	uint64_t n;

	if (!v || !*v)
		return 0;
	n = strtoull(v, &end, 10);
	switch (*end) {
	case 'K':
		n <<= 10;
		break;
	case 'M':
		n <<= 20;
		break;
	case 'G':
		n <<= 30;
		break;
	case '\0':
		break;
	default:
		return 0;
	}
	return n;
}

/* stub_cuda_register_gate: registrations wait here while it is closed (its own lock: lock is held across fork). */
static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static bool gate_closed;
static int gate_waiting;

STUB void stub_cuda_register_gate(int closed)
{
	pthread_mutex_lock(&gate_lock);
	gate_closed = closed;
	pthread_cond_broadcast(&gate_cond);
	pthread_mutex_unlock(&gate_lock);
}

STUB int stub_cuda_register_gate_wait(int n, int timeout_ms)
{
	struct timespec until;
	int seen;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += timeout_ms / 1000;
	until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&gate_lock);
	while (gate_waiting < n && pthread_cond_timedwait(&gate_cond, &gate_lock, &until) == 0)
		;
	seen = gate_waiting;
	pthread_mutex_unlock(&gate_lock);
	return seen;
}

static void pass_register_gate(void)
{
	pthread_mutex_lock(&gate_lock);
	if (gate_closed) {
		gate_waiting++;
		pthread_cond_broadcast(&gate_cond);
		while (gate_closed)
			pthread_cond_wait(&gate_cond, &gate_lock);
		gate_waiting--;
	}
	pthread_mutex_unlock(&gate_lock);
}

/* The refusals a test asks for (STUB_CUDA_REGISTER_CAP, STUB_CUDA_REGISTER_FAIL_AT), and the call's record. */
static CUresult register_call(void *p, size_t bytes, unsigned flags)
{
	uint64_t cap = env_size("STUB_CUDA_REGISTER_CAP"), fail_at = env_size("STUB_CUDA_REGISTER_FAIL_AT");
	CUresult r = CUDA_SUCCESS;
	size_t nth;

	pass_register_gate();
	pthread_mutex_lock(&lock);
	nth = ++n_reg_calls;
	pthread_mutex_unlock(&lock);
	if ((cap && bytes >= cap) || nth == fail_at)
		r = CUDA_ERROR_OUT_OF_MEMORY;
	else if (!p || bytes == 0)
		r = CUDA_ERROR_INVALID_VALUE;
	else
		r = add(p, bytes, flags, false);
	pthread_mutex_lock(&lock);
	if (nth <= sizeof(reg_log) / sizeof(reg_log[0]))
		reg_log[nth - 1] = (struct stub_cuda_register_call){ (uintptr_t)p, bytes, r };
	pthread_mutex_unlock(&lock);
	return r;
}

STUB CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned flags)
{
	return register_call(p, bytes, flags);
}

STUB CUresult cuMemHostRegister(void *p, size_t bytes, unsigned flags)
{
	return cuMemHostRegister_v2(p, bytes, flags);
}

STUB CUresult cuMemHostUnregister(void *p)
{
	struct range r;

	if (!take(p, false, &r))
		return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
	pthread_mutex_lock(&lock);
	stats.unregister_calls++;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

STUB CUresult cuMemHostGetFlags(unsigned *flags, void *p)
{
	int i;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	pthread_mutex_lock(&lock);
	i = find((uintptr_t)p, false);
	if (i >= 0 && ranges[i].alloc) {
		*flags = ranges[i].flags;
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

/* Mapped memory's device address is its host address (as under UVA): only DEVICEMAP memory has one. */
STUB CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags)
{
	int i;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	(void)flags;
	pthread_mutex_lock(&lock);
	i = find((uintptr_t)p, false);
	if (i >= 0 && (ranges[i].flags & DEVICEMAP)) {
		*d = (CUdeviceptr)(uintptr_t)p;
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

/* Whether p lies in memory the driver pinned: an allocation or a registration (stub_cuda_copy.c's pointer facts). */
bool stub_cuda_host_pinned(uintptr_t p)
{
	bool pinned;

	pthread_mutex_lock(&lock);
	pinned = find(p, false) >= 0;
	pthread_mutex_unlock(&lock);
	return pinned;
}

STUB CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status);
/* The VMM, pool, graph, stream and copy entry points (stub_cuda_vmm.c, stub_cuda_copy.c), for a name this table
 * does not know. */
void *stub_cuda_vmm_proc(const char *symbol, int version, cuuint64_t flags);

/*
 * What cuGetProcAddress hands out for cuMemHostRegister before CUDA 6.5: an
 * address the driver does not export (a real driver may do that), so only the
 * name and the version asked can tell an interposer which ABI it is.
 */
static CUresult host_register_pre_6050(void *p, size_t bytes, unsigned flags)
{
	return cuMemHostRegister_v2(p, bytes, flags);
}

/* Base name -> the version cuda.h maps it to at this CUDA version, as the real driver answers. */
STUB CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	typedef void (*any_fn)(void);
	static const struct {
		const char *name;
		int since; /* the CUDA version from which this entry answers the name */
		any_fn fn;
	} table[] = {
		{ "cuMemHostAlloc", 0, (any_fn)cuMemHostAlloc },
		{ "cuMemAllocHost", 3020, (any_fn)cuMemAllocHost_v2 },
		{ "cuMemAllocHost", 0, (any_fn)cuMemAllocHost },
		{ "cuMemFreeHost", 0, (any_fn)cuMemFreeHost },
		{ "cuMemHostRegister", 6050, (any_fn)cuMemHostRegister_v2 },
		{ "cuMemHostRegister", 0, (any_fn)host_register_pre_6050 },
		{ "cuMemHostUnregister", 0, (any_fn)cuMemHostUnregister },
		{ "cuMemHostGetFlags", 0, (any_fn)cuMemHostGetFlags },
		{ "cuMemHostGetDevicePointer", 3020, (any_fn)cuMemHostGetDevicePointer_v2 },
		{ "cuGetProcAddress", 12000, (any_fn)cuGetProcAddress_v2 },
		{ "cuGetProcAddress", 0, (any_fn)cuGetProcAddress },
		{ "cuInit", 0, (any_fn)cuInit },
		{ "cuGetErrorString", 0, (any_fn)cuGetErrorString },
		{ "cuCtxGetCurrent", 0, (any_fn)cuCtxGetCurrent },
		{ "cuCtxSetCurrent", 0, (any_fn)cuCtxSetCurrent },
		{ "cuDevicePrimaryCtxRetain", 0, (any_fn)cuDevicePrimaryCtxRetain },
	};

	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		if (strcmp(symbol, table[i].name) == 0 && version >= table[i].since) {
			*pfn = (void *)(uintptr_t)table[i].fn;
			return CUDA_SUCCESS;
		}
	}
	*pfn = stub_cuda_vmm_proc(symbol, version, flags);
	return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

STUB CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status)
{
	CUresult r = cuGetProcAddress(symbol, pfn, version, flags);

	if (status)
		*status = r == CUDA_SUCCESS ? 0 : 1; /* CU_GET_PROC_ADDRESS_SUCCESS / _SYMBOL_NOT_FOUND */
	return r;
}

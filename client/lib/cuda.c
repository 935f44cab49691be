/* SPDX-License-Identifier: MIT */
/* CUDA driver binding for libpinbroker: dlopen("libcuda.so.1") at run time, so the library never links CUDA. */
#define _GNU_SOURCE
#include "cuda.h"

#include <dlfcn.h>
#include <stddef.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "util.h"

/* The few driver API types and constants used here, from cuda.h (ABI-stable since CUDA 4). */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_PERMITTED 800
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_MEMORYTYPE_HOST 1
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_STREAM_CAPTURE_STATUS_NONE 0
/* The special stream handles: the legacy default stream (as 0) and the calling thread's per-thread one. */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
/* CUDA 12.2+: the host node nearest the GPU, -1 where the system has no NUMA; older drivers refuse it. */
#define CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID 134

static struct {
	CUresult (*init)(unsigned int flags);
	CUresult (*device_get_count)(int *count);
	CUresult (*device_get)(CUdevice *dev, int ordinal);
	CUresult (*get_error_string)(CUresult r, const char **str);
	CUresult (*mem_host_register)(void *p, size_t bytes, unsigned int flags);
	CUresult (*mem_host_unregister)(void *p);
	CUresult (*pointer_get_attribute)(void *data, int attribute, CUdeviceptr ptr);
	CUresult (*ctx_get_current)(CUcontext *ctx);
	CUresult (*ctx_push_current)(CUcontext ctx);
	CUresult (*ctx_pop_current)(CUcontext *ctx);
	CUresult (*primary_ctx_retain)(CUcontext *ctx, CUdevice dev);
	/* Optional: NUMA placement only. */
	CUresult (*ctx_get_device)(CUdevice *dev);
	CUresult (*device_get_pci_bus_id)(char *buf, int len, CUdevice dev);
	CUresult (*device_get_uuid)(unsigned char uuid[16], CUdevice dev);
	CUresult (*device_get_attribute)(int *value, int attribute, CUdevice dev);
	CUresult (*device_get_by_pci_bus_id)(CUdevice *dev, const char *bus);
	/* Optional: staged copies (pbcuda_staging_available says whether all are there). */
	CUresult (*pointer_get_attributes)(unsigned n, int *attrs, void **data, CUdeviceptr ptr);
	CUresult (*stream_is_capturing)(CUstream s, int *status);
	CUresult (*stream_get_ctx)(CUstream s, CUcontext *ctx);
	CUresult (*stream_synchronize)(CUstream s);
	CUresult (*event_create)(CUevent *ev, unsigned flags);
	CUresult (*event_record)(CUevent ev, CUstream s);
	CUresult (*event_synchronize)(CUevent ev);
	CUresult (*event_query)(CUevent ev);
	CUresult (*event_destroy)(CUevent ev);
	CUresult (*memcpy_htod_async)(CUdeviceptr dst, const void *src, size_t bytes, CUstream s);
	CUresult (*memcpy_dtoh_async)(void *dst, CUdeviceptr src, size_t bytes, CUstream s);
	CUresult (*memcpy_dtoh)(void *dst, CUdeviceptr src, size_t bytes);
} cu;

/* Which staged-copy entry point is missing, or NULL when all are there (set by load_driver). */
static const char *staging_missing = "the CUDA driver is not loaded";

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int cuda_ok;
static char cuda_reason[256];

/* Device 0's primary context, retained on first need and kept for the life of the
 * process: releasing it would destroy the context and every registration made in it. */
static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primary_ctx;

static __thread char cuda_error[256];

static const char *result_string(CUresult r)
{
	const char *s = NULL;

	if (cu.get_error_string && cu.get_error_string(r, &s) == CUDA_SUCCESS && s)
		return s;
	return "unknown CUDA error";
}

/* Prefer the versioned entry point: cuda.h maps the plain name to it. */
static void *sym(void *h, const char *versioned, const char *plain)
{
	void *p = versioned ? dlsym(h, versioned) : NULL;

	return p ? p : dlsym(h, plain);
}

/* The staged copies' entry points, each by the name cuda.h maps the plain one to (CUDA 13's ABI). */
static void load_staging(void *h)
{
	static const struct {
		const char *versioned, *plain;
		size_t offset;
	} syms[] = {
		{ NULL, "cuPointerGetAttributes", offsetof(__typeof__(cu), pointer_get_attributes) },
		{ NULL, "cuStreamIsCapturing", offsetof(__typeof__(cu), stream_is_capturing) },
		{ NULL, "cuStreamSynchronize", offsetof(__typeof__(cu), stream_synchronize) },
		{ NULL, "cuEventCreate", offsetof(__typeof__(cu), event_create) },
		{ NULL, "cuEventRecord", offsetof(__typeof__(cu), event_record) },
		{ NULL, "cuEventSynchronize", offsetof(__typeof__(cu), event_synchronize) },
		{ NULL, "cuEventQuery", offsetof(__typeof__(cu), event_query) },
		{ "cuEventDestroy_v2", "cuEventDestroy", offsetof(__typeof__(cu), event_destroy) },
		{ "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync", offsetof(__typeof__(cu), memcpy_htod_async) },
		{ "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync", offsetof(__typeof__(cu), memcpy_dtoh_async) },
		{ "cuMemcpyDtoH_v2", "cuMemcpyDtoH", offsetof(__typeof__(cu), memcpy_dtoh) },
	};

	staging_missing = NULL;
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		void *p = sym(h, syms[i].versioned, syms[i].plain);

		memcpy((char *)&cu + syms[i].offset, &p, sizeof(p));
		if (!p && !staging_missing)
			staging_missing = syms[i].plain;
	}
	/* Optional even here: without it a stream is taken to belong to the current context. */
	*(void **)&cu.stream_get_ctx = sym(h, NULL, "cuStreamGetCtx");
}

static void load_driver(void)
{
	const char *env = getenv("PINBROKER_NO_CUDA");
	void *h;
	int count = 0;
	CUresult r;

	if (env && *env && strcmp(env, "0") != 0) {
		snprintf(cuda_reason, sizeof(cuda_reason), "disabled by PINBROKER_NO_CUDA");
		return;
	}
	/* RTLD_LOCAL: the application's own CUDA runtime loads the same driver object; we must not
	 * inject its symbols into the global namespace. The handle is never closed, on purpose. */
	h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(cuda_reason, sizeof(cuda_reason), "libcuda.so.1 not found: no NVIDIA driver on this host");
		return;
	}
	*(void **)&cu.init = sym(h, NULL, "cuInit");
	*(void **)&cu.device_get_count = sym(h, NULL, "cuDeviceGetCount");
	*(void **)&cu.device_get = sym(h, NULL, "cuDeviceGet");
	*(void **)&cu.get_error_string = sym(h, NULL, "cuGetErrorString");
	*(void **)&cu.mem_host_register = sym(h, "cuMemHostRegister_v2", "cuMemHostRegister");
	*(void **)&cu.mem_host_unregister = sym(h, NULL, "cuMemHostUnregister");
	*(void **)&cu.pointer_get_attribute = sym(h, NULL, "cuPointerGetAttribute");
	*(void **)&cu.ctx_get_current = sym(h, NULL, "cuCtxGetCurrent");
	*(void **)&cu.ctx_push_current = sym(h, "cuCtxPushCurrent_v2", "cuCtxPushCurrent");
	*(void **)&cu.ctx_pop_current = sym(h, "cuCtxPopCurrent_v2", "cuCtxPopCurrent");
	*(void **)&cu.primary_ctx_retain = sym(h, NULL, "cuDevicePrimaryCtxRetain");
	*(void **)&cu.ctx_get_device = sym(h, NULL, "cuCtxGetDevice");
	*(void **)&cu.device_get_pci_bus_id = sym(h, NULL, "cuDeviceGetPCIBusId");
	*(void **)&cu.device_get_uuid = sym(h, "cuDeviceGetUuid_v2", "cuDeviceGetUuid");
	*(void **)&cu.device_get_attribute = sym(h, NULL, "cuDeviceGetAttribute");
	*(void **)&cu.device_get_by_pci_bus_id = sym(h, NULL, "cuDeviceGetByPCIBusId");
	load_staging(h);
	if (!cu.init || !cu.device_get_count || !cu.device_get || !cu.mem_host_register || !cu.mem_host_unregister ||
	    !cu.ctx_get_current || !cu.ctx_push_current || !cu.ctx_pop_current || !cu.primary_ctx_retain) {
		snprintf(cuda_reason, sizeof(cuda_reason), "libcuda.so.1 lacks a required entry point: %s",
			 dlerror() ?: "driver too old");
		return;
	}
	r = cu.init(0);
	if (r != CUDA_SUCCESS) {
		snprintf(cuda_reason, sizeof(cuda_reason), "cuInit failed: %s (%d)", result_string(r), r);
		return;
	}
	r = cu.device_get_count(&count);
	if (r != CUDA_SUCCESS || count <= 0) {
		snprintf(cuda_reason, sizeof(cuda_reason), "no CUDA devices");
		return;
	}
	cuda_ok = 1;
}

int pbcuda_available(const char **reason)
{
	pthread_once(&init_once, load_driver);
	if (reason)
		*reason = cuda_ok ? NULL : cuda_reason;
	return cuda_ok;
}

static int result_to_errno(CUresult r)
{
	switch (r) {
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_INVALID_VALUE:
		return -EINVAL;
	case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
		return -EEXIST;
	case CUDA_ERROR_NOT_SUPPORTED:
		return -EOPNOTSUPP;
	case CUDA_ERROR_NOT_PERMITTED:
		return -EPERM;
	default:
		return -EIO;
	}
}

/*
 * The driver API acts on the calling thread's current context. An application
 * thread that has not touched CUDA has none, so borrow device 0's primary
 * context, which is the one the CUDA runtime (and PyTorch) uses, for the call.
 * Returns 1 when a context was pushed and must be popped, 0 when the thread's
 * own was used, or a negative errno.
 */
static int enter_context(void)
{
	CUcontext cur = NULL;
	CUresult r;

	if (cu.ctx_get_current(&cur) == CUDA_SUCCESS && cur)
		return 0;
	pthread_mutex_lock(&primary_lock);
	if (!primary_ctx) {
		CUdevice dev;

		r = cu.device_get(&dev, 0);
		if (r == CUDA_SUCCESS)
			r = cu.primary_ctx_retain(&primary_ctx, dev);
		if (r != CUDA_SUCCESS) {
			primary_ctx = NULL;
			pthread_mutex_unlock(&primary_lock);
			snprintf(cuda_error, sizeof(cuda_error), "cuDevicePrimaryCtxRetain failed: %s",
				 result_string(r));
			return result_to_errno(r);
		}
	}
	cur = primary_ctx;
	pthread_mutex_unlock(&primary_lock);
	r = cu.ctx_push_current(cur);
	if (r != CUDA_SUCCESS) {
		snprintf(cuda_error, sizeof(cuda_error), "cuCtxPushCurrent failed: %s", result_string(r));
		return result_to_errno(r);
	}
	return 1;
}

static void leave_context(int pushed)
{
	CUcontext dummy;

	if (pushed == 1)
		cu.ctx_pop_current(&dummy);
}

static pthread_once_t piece_once = PTHREAD_ONCE_INIT;
static size_t piece_max_bytes;

static size_t sys_page_bytes(void)
{
	long page = sysconf(_SC_PAGESIZE);

	return page > 0 ? (size_t)page : 4096;
}

/* The default, or $PINBROKER_CUDA_REGISTER_PIECE (tests make it small); read once per process. */
static void load_piece_max(void)
{
	const char *env = getenv("PINBROKER_CUDA_REGISTER_PIECE");
	size_t page = sys_page_bytes();
	uint64_t v = PBCUDA_REGISTER_PIECE_MAX;

	/* A value that is not a size is ignored: the library prints nothing, and the default is safe. */
	if (env && *env && (parse_size(env, &v) < 0 || v == 0))
		v = PBCUDA_REGISTER_PIECE_MAX;
	if (v > SIZE_MAX / 2)
		v = SIZE_MAX / 2;
	v -= v % page;
	piece_max_bytes = v < page ? page : (size_t)v;
}

size_t pbcuda_piece_max(void)
{
	pthread_once(&piece_once, load_piece_max);
	return piece_max_bytes;
}

size_t pbcuda_plan_stride(size_t bytes, size_t max_piece, size_t align, const uint64_t *chunk_bytes, size_t n_chunks)
{
	uint64_t biggest = 0, next, start = 0, stride, cut;

	if (align == 0)
		align = 1;
	if (bytes <= max_piece)
		return 0;
	stride = max_piece - max_piece % align;
	if (stride < align)
		stride = align;
	for (size_t i = 0; i < n_chunks; i++)
		if (chunk_bytes[i] > biggest)
			biggest = chunk_bytes[i];
	/* Chunks bigger than a piece: no boundary to cut at, so page (or huge-page) alignment is all there is. */
	if (biggest == 0 || biggest > stride || stride % align != 0)
		return (size_t)stride;
	/*
	 * A multiple of the biggest chunk falls on chunk boundaries wherever the chunks are that size, and
	 * wherever smaller power-of-two chunks follow bigger ones (the daemon puts whole chunks first, the tail
	 * last). Check it rather than trust the layout: a stride that would cut a chunk falls back to the
	 * aligned one, which the driver takes as well (one registration may span several chunk mappings, and a
	 * chunk mapping may span two registrations; only the alignment matters to it).
	 */
	next = stride - stride % biggest;
	if (next % align != 0)
		return (size_t)stride;
	cut = next;
	for (size_t i = 0; i < n_chunks && cut < bytes; i++) {
		uint64_t end = start + chunk_bytes[i];

		for (; cut < end; cut += next)
			if (cut != start)
				return (size_t)stride;
		start = end;
	}
	return (size_t)next;
}

/* The pieces of [p, p + bytes) at stride: the first starts at p, the others every stride from p's page. */
struct pieces {
	uintptr_t p, first, end;
	size_t stride, n;
};

static struct pieces pieces_of(void *p, size_t bytes, size_t stride)
{
	uintptr_t page = sys_page_bytes();
	struct pieces ps = { .p = (uintptr_t)p, .stride = stride, .n = 1 };

	ps.first = ps.p & ~(page - 1);
	ps.end = ps.p + bytes;
	if (stride > 0 && ps.end > ps.first)
		ps.n = (ps.end - ps.first + stride - 1) / stride;
	return ps;
}

static void piece_at(const struct pieces *ps, size_t k, void **start, size_t *bytes)
{
	uintptr_t s = k == 0 ? ps->p : ps->first + k * ps->stride;
	uintptr_t e = ps->n == 1 ? ps->end : ps->first + (k + 1) * ps->stride;

	if (e > ps->end)
		e = ps->end;
	*start = (void *)s;
	*bytes = e - s;
}

int pbcuda_register(void *p, size_t bytes, bool mapped, size_t stride)
{
	/* PORTABLE: every context in this process sees the range as pinned, not just this one. */
	unsigned flags = CU_MEMHOSTREGISTER_PORTABLE | (mapped ? CU_MEMHOSTREGISTER_DEVICEMAP : 0);
	struct pieces ps = pieces_of(p, bytes, stride);
	const char *reason;
	CUresult r = CUDA_SUCCESS;
	size_t k;
	int pushed;

	if (!pbcuda_available(&reason)) {
		snprintf(cuda_error, sizeof(cuda_error), "%s", reason);
		return -ENODEV;
	}
	pushed = enter_context();
	if (pushed < 0)
		return pushed;
	for (k = 0; k < ps.n && r == CUDA_SUCCESS; k++) {
		void *s;
		size_t n;

		piece_at(&ps, k, &s, &n);
		r = cu.mem_host_register(s, n, flags);
		if (r != CUDA_SUCCESS && ps.n > 1)
			snprintf(cuda_error, sizeof(cuda_error),
				 "cuMemHostRegister failed on piece %zu of %zu (bytes %zu to %zu of %zu): %s (%d)",
				 k + 1, ps.n, (size_t)((uintptr_t)s - ps.p), (size_t)((uintptr_t)s - ps.p) + n, bytes,
				 result_string(r), r);
	}
	/* No partial registration is left: the pieces before the one refused go back. */
	if (r != CUDA_SUCCESS)
		for (size_t i = 0; i + 1 < k; i++) {
			void *s;
			size_t n;

			piece_at(&ps, i, &s, &n);
			cu.mem_host_unregister(s);
		}
	leave_context(pushed);
	if (r != CUDA_SUCCESS) {
		if (ps.n == 1)
			snprintf(cuda_error, sizeof(cuda_error), "cuMemHostRegister failed: %s (%d)", result_string(r),
				 r);
		return result_to_errno(r);
	}
	return 0;
}

void pbcuda_unregister(void *p, size_t bytes, size_t stride)
{
	struct pieces ps = pieces_of(p, bytes, stride);
	int pushed;

	if (!pbcuda_available(NULL))
		return;
	pushed = enter_context();
	if (pushed < 0)
		return;
	for (size_t k = 0; k < ps.n; k++) {
		void *s;
		size_t n;

		piece_at(&ps, k, &s, &n);
		cu.mem_host_unregister(s);
	}
	leave_context(pushed);
}

int pbcuda_is_registered(const void *p)
{
	unsigned int type = 0;
	int pushed, ok;

	if (!pbcuda_available(NULL) || !cu.pointer_get_attribute)
		return 0;
	pushed = enter_context();
	if (pushed < 0)
		return 0;
	ok = cu.pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p) ==
		     CUDA_SUCCESS &&
	     type == CU_MEMORYTYPE_HOST;
	leave_context(pushed);
	return ok;
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it. */
static void uuid_text(const unsigned char u[16], char *out, size_t len)
{
	snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
		 u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

/* The device gpu names (see pbcuda_bus_id; also a PCI bus id), or -ENODEV. */
static int resolve_device(const char *gpu, CUdevice *ret)
{
	CUdevice dev = -1;
	int count = 0;

	if (!pbcuda_available(NULL))
		return -ENODEV;
	if (!gpu) {
		CUcontext cur = NULL;

		if (!cu.ctx_get_device || cu.ctx_get_current(&cur) != CUDA_SUCCESS || !cur ||
		    cu.ctx_get_device(&dev) != CUDA_SUCCESS)
			return -ENODEV;
	} else if (strncasecmp(gpu, "GPU-", 4) == 0) {
		if (!cu.device_get_uuid || cu.device_get_count(&count) != CUDA_SUCCESS)
			return -ENODEV;
		for (int i = 0; i < count && dev < 0; i++) {
			unsigned char u[16];
			char text[64];
			CUdevice d;

			if (cu.device_get(&d, i) == CUDA_SUCCESS && cu.device_get_uuid(u, d) == CUDA_SUCCESS) {
				uuid_text(u, text, sizeof(text));
				if (strncasecmp(text, gpu, strlen(gpu)) == 0)
					dev = d;
			}
		}
	} else if (strchr(gpu, ':')) {
		if (!cu.device_get_by_pci_bus_id || cu.device_get_by_pci_bus_id(&dev, gpu) != CUDA_SUCCESS)
			return -ENODEV;
	} else {
		char *end;
		long i = strtol(gpu, &end, 10);

		if (end == gpu || *end || i < 0 || i > INT32_MAX || cu.device_get(&dev, (int)i) != CUDA_SUCCESS)
			return -ENODEV;
	}
	if (dev < 0)
		return -ENODEV;
	*ret = dev;
	return 0;
}

int pbcuda_bus_id(const char *gpu, char *buf, size_t len)
{
	CUdevice dev;

	if (resolve_device(gpu, &dev) < 0 || !cu.device_get_pci_bus_id ||
	    cu.device_get_pci_bus_id(buf, (int)len, dev) != CUDA_SUCCESS)
		return -ENODEV;
	return 0;
}

int pbcuda_host_numa_node(const char *gpu)
{
	CUdevice dev;
	int node = -1;

	if (resolve_device(gpu, &dev) < 0 || !cu.device_get_attribute ||
	    cu.device_get_attribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev) != CUDA_SUCCESS)
		return -1;
	return node >= 0 ? node : -1;
}

const char *pbcuda_strerror(void)
{
	return cuda_error[0] ? cuda_error : "no CUDA error";
}

int pbcuda_staging_available(const char **reason)
{
	static __thread char why[128];
	const char *r = NULL;

	if (!pbcuda_available(&r)) {
		if (reason)
			*reason = r;
		return 0;
	}
	if (staging_missing) {
		snprintf(why, sizeof(why), "libcuda.so.1 lacks %s", staging_missing);
		if (reason)
			*reason = why;
		return 0;
	}
	if (reason)
		*reason = NULL;
	return 1;
}

/* The staged copies' calls below are made only after pbcuda_staging_available() said 1. */

const char *pbcuda_result_text(int r)
{
	return result_string(r);
}

int pbcuda_pointer_facts(const void *p, unsigned *memory_type, bool *managed)
{
	int attrs[2] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED };
	unsigned type = 0;
	int is_managed = 0; /* the driver writes a bool-sized int here (CUDA's docs: "unsigned int" / "bool") */
	void *data[2] = { &type, &is_managed };
	CUresult r;

	r = cu.pointer_get_attributes(2, attrs, data, (CUdeviceptr)(uintptr_t)p);
	*memory_type = type;
	*managed = (is_managed & 0xff) != 0;
	return r;
}

int pbcuda_stream_capturing(void *stream, bool *capturing)
{
	int status = CU_STREAM_CAPTURE_STATUS_NONE;
	CUresult r = cu.stream_is_capturing((CUstream)stream, &status);

	*capturing = r != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
	return r;
}

int pbcuda_ctx_current(void **ctx)
{
	CUcontext cur = NULL;
	CUresult r = cu.ctx_get_current(&cur);

	*ctx = cur;
	return r;
}

int pbcuda_stream_ctx(void *stream, void **ctx)
{
	CUcontext c = NULL;
	CUresult r;

	if (!stream || stream == (void *)CU_STREAM_LEGACY || stream == (void *)CU_STREAM_PER_THREAD ||
	    !cu.stream_get_ctx)
		return pbcuda_ctx_current(ctx);
	r = cu.stream_get_ctx((CUstream)stream, &c);
	*ctx = c;
	return r;
}

int pbcuda_ctx_push(void *ctx)
{
	return cu.ctx_push_current((CUcontext)ctx);
}

void pbcuda_ctx_pop(void)
{
	CUcontext dummy;

	cu.ctx_pop_current(&dummy);
}

void *pbcuda_per_thread_stream(void)
{
	return (void *)CU_STREAM_PER_THREAD;
}

int pbcuda_event_create(void **ev)
{
	CUevent e = NULL;
	CUresult r = cu.event_create(&e, CU_EVENT_DISABLE_TIMING);

	*ev = e;
	return r;
}

int pbcuda_event_record(void *ev, void *stream)
{
	return cu.event_record((CUevent)ev, (CUstream)stream);
}

int pbcuda_event_sync(void *ev)
{
	return cu.event_synchronize((CUevent)ev);
}

int pbcuda_event_query(void *ev)
{
	return cu.event_query((CUevent)ev);
}

void pbcuda_event_destroy(void *ev)
{
	cu.event_destroy((CUevent)ev);
}

int pbcuda_htod_async(uint64_t dst, const void *src, size_t bytes, void *stream)
{
	return cu.memcpy_htod_async((CUdeviceptr)dst, src, bytes, (CUstream)stream);
}

int pbcuda_dtoh_async(void *dst, uint64_t src, size_t bytes, void *stream)
{
	return cu.memcpy_dtoh_async(dst, (CUdeviceptr)src, bytes, (CUstream)stream);
}

int pbcuda_dtoh(void *dst, uint64_t src, size_t bytes)
{
	return cu.memcpy_dtoh(dst, (CUdeviceptr)src, bytes);
}

int pbcuda_stream_sync(void *stream)
{
	return cu.stream_synchronize((CUstream)stream);
}

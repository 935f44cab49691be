/* SPDX-License-Identifier: MIT */
/*
 * libpinbroker-preload.so: puts an unmodified CUDA program's pinned memory
 * under pinbrokerd's budget (LD_PRELOAD, or `pinctl run -- CMD`). This file
 * is the interposition (the exported functions, cuGetProcAddress, dlsym, the
 * set-up); what the wrappers do with the memory is preload-memory.c's.
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
 * - the driver's functions through which it allocates host memory itself
 *   (VMM allocations, memory pools and graph memory nodes with a host
 *   location: preload-cudapaths.c and its rooms), on the same three ways in;
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
#include "preload.h"

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

/* The wrappers (their addresses are what dlsym and cuGetProcAddress hand out): the table follows them. */
static void *wrapper(enum fn f);

/* Hidden, so the assembly below reaches it without the GOT. */
__attribute__((visibility("hidden"))) void *pbp_dlsym_override(void *handle, const char *name, void *caller);

/* ---- The exported functions ---- */

EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)
{
	return pbp_host_alloc(F_cuMemHostAlloc, pp, bytesize, flags);
}

EXPORT CUresult cuMemAllocHost(void **pp, unsigned int bytesize)
{
	return pbp_host_alloc(F_cuMemAllocHost, pp, bytesize, 0);
}

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
	return pbp_host_alloc(F_cuMemAllocHost_v2, pp, bytesize, 0);
}

EXPORT CUresult cuMemFreeHost(void *p)
{
	return pbp_host_free(F_cuMemFreeHost, p);
}

EXPORT CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int flags)
{
	return pbp_host_register(F_cuMemHostRegister, p, bytesize, flags);
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags)
{
	return pbp_host_register(F_cuMemHostRegister_v2, p, bytesize, flags);
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
	return pbp_host_unregister(F_cuMemHostUnregister, p);
}

EXPORT CUresult cuMemHostGetFlags(unsigned int *flags, void *p)
{
	return pbp_host_get_flags(F_cuMemHostGetFlags, flags, p);
}

EXPORT cudaError_t cudaHostAlloc(void **pp, size_t size, unsigned int flags)
{
	return pbp_host_alloc(F_cudaHostAlloc, pp, size, flags);
}

EXPORT cudaError_t cudaMallocHost(void **pp, size_t size)
{
	return pbp_host_alloc(F_cudaMallocHost, pp, size, 0);
}

EXPORT cudaError_t cudaFreeHost(void *p)
{
	return pbp_host_free(F_cudaFreeHost, p);
}

EXPORT cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags)
{
	return pbp_host_register(F_cudaHostRegister, p, size, flags);
}

EXPORT cudaError_t cudaHostUnregister(void *p)
{
	return pbp_host_unregister(F_cudaHostUnregister, p);
}

EXPORT cudaError_t cudaHostGetFlags(unsigned int *flags, void *p)
{
	return pbp_host_get_flags(F_cudaHostGetFlags, flags, p);
}

/*
 * What cuGetProcAddress answered for symbol, swapped for our wrapper of the
 * same ABI. Matched by address against the driver's exported versions; when
 * the driver hands out an address it does not export, by name and the CUDA
 * version asked (the versions at which cuda.h moved to _v2).
 */
static void *substitute(const char *symbol, void *p, int cuda_version, cuuint64_t flags)
{
	/* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: the per-thread default stream's versions (cuda.h). */
	bool ptsz = flags & 2u;

	if (!symbol || !p || pbp_cfg.off)
		return p;
	for (int f = 0; f < F_DRIVER_END; f++)
		if (pbp_real_fn((enum fn)f) == p)
			return wrapper(f);
	if (strcmp(symbol, "cuMemAllocHost") == 0)
		return wrapper(cuda_version >= 3020 ? F_cuMemAllocHost_v2 : F_cuMemAllocHost);
	if (strcmp(symbol, "cuMemHostRegister") == 0)
		return wrapper(cuda_version >= 6050 ? F_cuMemHostRegister_v2 : F_cuMemHostRegister);
	if (strcmp(symbol, "cuGetProcAddress") == 0)
		return wrapper(cuda_version >= 12000 ? F_cuGetProcAddress_v2 : F_cuGetProcAddress);
	if (strcmp(symbol, "cuMemAllocFromPoolAsync") == 0)
		return wrapper(ptsz ? F_cuMemAllocFromPoolAsync_ptsz : F_cuMemAllocFromPoolAsync);
	if (strcmp(symbol, "cuMemFreeAsync") == 0)
		return wrapper(ptsz ? F_cuMemFreeAsync_ptsz : F_cuMemFreeAsync);
	/* Before 3.2 cuMemFree took a 32-bit pointer: not ours to stand in for. */
	if (strcmp(symbol, "cuMemFree") == 0)
		return cuda_version >= 3020 ? wrapper(F_cuMemFree_v2) : p;
	if (strcmp(symbol, "cuGraphAddNode") == 0)
		return wrapper(cuda_version >= 12030 ? F_cuGraphAddNode_v2 : F_cuGraphAddNode);
	/* Before 3.2 these took a 32-bit device pointer: not ours to stand in for. */
	if (strcmp(symbol, "cuMemcpyHtoD") == 0)
		return cuda_version >= 3020 ? wrapper(ptsz ? F_cuMemcpyHtoD_v2_ptds : F_cuMemcpyHtoD_v2) : p;
	if (strcmp(symbol, "cuMemcpyDtoH") == 0)
		return cuda_version >= 3020 ? wrapper(ptsz ? F_cuMemcpyDtoH_v2_ptds : F_cuMemcpyDtoH_v2) : p;
	if (strcmp(symbol, "cuMemcpyHtoDAsync") == 0)
		return cuda_version >= 3020 ? wrapper(ptsz ? F_cuMemcpyHtoDAsync_v2_ptsz : F_cuMemcpyHtoDAsync_v2) : p;
	if (strcmp(symbol, "cuMemcpyDtoHAsync") == 0)
		return cuda_version >= 3020 ? wrapper(ptsz ? F_cuMemcpyDtoHAsync_v2_ptsz : F_cuMemcpyDtoHAsync_v2) : p;
	if (strcmp(symbol, "cuMemcpy") == 0)
		return wrapper(ptsz ? F_cuMemcpy_ptds : F_cuMemcpy);
	if (strcmp(symbol, "cuMemcpyAsync") == 0)
		return wrapper(ptsz ? F_cuMemcpyAsync_ptsz : F_cuMemcpyAsync);
	for (int f = 0; f < F_DRIVER_END; f++)
		if (strcmp(symbol, pbp_fn_names[f]) == 0)
			return wrapper(f);
	return p;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags)
{
	CUresult r;

	if (!pbp_real_fn(F_cuGetProcAddress))
		return CU_NOT_INITIALIZED;
	r = CALL(CUresult(*)(const char *, void **, int, cuuint64_t), F_cuGetProcAddress, symbol, pfn, cuda_version,
		 flags);
	if (r == CU_OK && pfn)
		*pfn = substitute(symbol, *pfn, cuda_version, flags);
	return r;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags, int *status)
{
	CUresult r;

	if (!pbp_real_fn(F_cuGetProcAddress_v2))
		return CU_NOT_INITIALIZED;
	r = CALL(CUresult(*)(const char *, void **, int, cuuint64_t, int *), F_cuGetProcAddress_v2, symbol, pfn,
		 cuda_version, flags, status);
	if (r == CU_OK && pfn)
		*pfn = substitute(symbol, *pfn, cuda_version, flags);
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

	if (f >= F_cuMemCreate && f <= F_cuGraphDestroy)
		return pbp_cudapaths_wrapper(f);
	if ((f > F_cuGraphDestroy && f < F_DRIVER_END) || f > F_cudaHostGetFlags)
		return pbp_copy_wrapper(f);
	return (void *)(uintptr_t)wrappers[f];
}

/* ---- dlsym ---- */

/* Calls from this object, and from libpinbroker itself (registering its own leases), get the real thing. */
UNSANITIZED static bool caller_is_ours(void *caller)
{
	Dl_info info;
	const char *base;

	if (!pbp_cfg.self_base && dladdr((void *)(uintptr_t)caller_is_ours, &info))
		pbp_cfg.self_base = (uintptr_t)info.dli_fbase;
	if (!dladdr(caller, &info) || !info.dli_fname)
		return false;
	if ((uintptr_t)info.dli_fbase == pbp_cfg.self_base)
		return true;
	base = strrchr(info.dli_fname, '/');
	base = base ? base + 1 : info.dli_fname;
	return strncmp(base, "libpinbroker", 12) == 0;
}

/* An address inside this object (one of our own exports). */
UNSANITIZED static bool addr_is_ours(void *p)
{
	Dl_info info;

	if (!pbp_cfg.self_base && dladdr((void *)(uintptr_t)caller_is_ours, &info))
		pbp_cfg.self_base = (uintptr_t)info.dli_fbase;
	return dladdr(p, &info) && (uintptr_t)info.dli_fbase == pbp_cfg.self_base;
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
		pbp_real_dlsym = (void *(*)(void *, const char *))(uintptr_t)pbp_resolve_real_dlsym();
	if (pbp_cfg.off || !name || name[0] != 'c' || name[1] != 'u')
		return NULL;
	for (f = 0; f < F_END; f++)
		if (strcmp(name, pbp_fn_names[f]) == 0)
			break;
	if (f == F_END || caller_is_ours(caller))
		return NULL;
	real = pbp_call_real_dlsym(handle, name);
	if (!real)
		return NULL;
	/* RTLD_DEFAULT or RTLD_NEXT may find our own export first: that is no runtime to call. */
	if (f >= F_DRIVER_END && !atomic_load(&pbp_fn_real[f]) && !addr_is_ours(real))
		atomic_store(&pbp_fn_real[f], real);
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
	if (pbp_cfg.off)
		return NULL;
	if (strcmp(name, "dlsym") == 0)
		return (void *)(uintptr_t)dlsym;
	if (strcmp(name, "dlopen") == 0)
		return (void *)(uintptr_t)dlopen;
	if (name[0] != 'c' || name[1] != 'u')
		return NULL;
	for (int f = 0; f < F_DRIVER_END; f++)
		if (strcmp(name, pbp_fn_names[f]) == 0)
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
	pbp_say(false, "%s", msg);
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

__attribute__((constructor)) static void preload_init(void)
{
	const char *fb = getenv("PINBROKER_PRELOAD_FALLBACK");
	const char *label = getenv("PINBROKER_LABEL");
	const char *log = getenv("PINBROKER_PRELOAD_LOG");
	const char *off = getenv("PINBROKER_PRELOAD");

	pbp_cfg.verbose = log && *log && strcmp(log, "0") != 0;
	pbp_cfg.off = off && strcmp(off, "0") == 0;
	if (pbp_policy_parse(fb, &pbp_cfg.policy) < 0) {
		fprintf(stderr,
			"pinbroker-preload: PINBROKER_PRELOAD_FALLBACK=%s is not cuda, error or pageable; using cuda\n",
			fb);
		pbp_cfg.policy = PBP_FALLBACK_CUDA;
	}
	if (label && *label)
		snprintf(pbp_cfg.label, sizeof(pbp_cfg.label), "%s", label);
	else {
		/* The daemon takes printable labels only: a program name with other bytes must not cost every lease. */
		snprintf(pbp_cfg.label, sizeof(pbp_cfg.label), "preload:%s", program_invocation_short_name);
		for (char *c = pbp_cfg.label; *c; c++)
			if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
				*c = '?';
	}
	pthread_atfork(pbp_before_fork, pbp_after_fork_parent, pbp_after_fork_child);
	if (!pbp_real_dlsym)
		pbp_real_dlsym = (void *(*)(void *, const char *))(uintptr_t)pbp_resolve_real_dlsym();
	pbp_say(false, "loaded: fallback=%s label=%s", pbp_policy_name(pbp_cfg.policy), pbp_cfg.label);
}

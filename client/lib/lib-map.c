/* SPDX-License-Identifier: MIT */
/* libpinbroker's lease mapping: a lease's chunks mapped back to back into one range, registered, unmapped, retired. */
#define _GNU_SOURCE
#include "lib-int.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda.h"
#include "wire.h"

/* A PMD's worth of memory: the alignment that lets a mapping use 2 MiB pages. */
#define HUGE_PMD_BYTES (UINT64_C(2) * 1024 * 1024)

static uint64_t forks;
static pthread_once_t forks_once = PTHREAD_ONCE_INIT;

static void count_fork(void)
{
	__atomic_add_fetch(&forks, 1, __ATOMIC_RELAXED);
}

static void watch_forks(void)
{
	pthread_atfork(NULL, count_fork, NULL);
}

uint64_t map_forks(void)
{
	return __atomic_load_n(&forks, __ATOMIC_RELAXED);
}

bool map_forked(const pb_lease *l)
{
	return l->inherit && map_forks() != l->forks_at_map;
}

int map_chunks(const Pinbroker__V1__Lease *ls, const int *fds, bool inherit, void **base_ret, size_t *map_bytes_ret)
{
	uint64_t sys_page_bytes = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t page = ls->page_size, total = 0, align, reserve_bytes;
	uint8_t *res, *base, *end;
	const char *sim;
	size_t off = 0;
	int populate;
	bool thp;

	if (page < sys_page_bytes || (page & (page - 1)) != 0)
		return err_set(-EPROTO, "pinbrokerd sent a lease with page size %llu", (unsigned long long)page);
	for (size_t i = 0; i < ls->n_chunk_bytes; i++) {
		uint64_t cb = ls->chunk_bytes[i];
		struct stat st;

		if (cb == 0 || cb % page != 0 || total + cb < total)
			return err_set(-EPROTO, "pinbrokerd sent a bad chunk size %llu", (unsigned long long)cb);
		/* A chunk shorter than announced would SIGBUS the application on first touch. */
		if (fstat(fds[i], &st) < 0 || (uint64_t)st.st_size < cb)
			return err_set(-EPROTO, "lease chunk %zu is shorter than announced", i);
		total += cb;
	}
	if (ls->size == 0 || ls->size > total || total > SIZE_MAX / 2)
		return err_set(-EPROTO, "pinbrokerd sent a lease of %llu bytes in %llu bytes of chunks",
			       (unsigned long long)ls->size, (unsigned long long)total);

	/*
	 * hugetlb mappings must start on a huge-page boundary, and THP-collapsed chunks are PMD-mapped
	 * only from one (the daemon puts whole chunks first, the tail last): over-reserve, then trim.
	 */
	align = page > sys_page_bytes ? page : total >= HUGE_PMD_BYTES ? HUGE_PMD_BYTES : 0;
	reserve_bytes = total + align;
	res = mmap(NULL, reserve_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (res == MAP_FAILED)
		return err_set(-errno, "cannot reserve %llu bytes of address space: %m", (unsigned long long)total);
	base = align ? (uint8_t *)(((uintptr_t)res + align - 1) & ~(uintptr_t)(align - 1)) : res;
	end = res + reserve_bytes;
	if (base > res)
		munmap(res, (size_t)(base - res));
	if (base + total < end)
		munmap(base + total, (size_t)(end - (base + total)));

	/*
	 * MAP_POPULATE: the daemon's pages are resident already; this only fills page tables, so the application's
	 * first touch costs nothing. Not for huge-page chunks (hugetlb, or THP-collapsed where the daemon says so, a
	 * best-effort mark): their first touch maps 2 MiB in one fault, and pre-faulting a lease the caller never
	 * touches whole was most of a round trip's cost. A process with THP turned off (PR_SET_THP_DISABLE) maps
	 * THP chunks 4 KiB at a time, so it pre-faults them too. Not against a simulated pool (PB_SIMULATE_ENV),
	 * whose pages do not exist yet.
	 */
	sim = secure_getenv(PB_SIMULATE_ENV);
	populate = sim && strcmp(sim, "1") == 0 ? 0 : MAP_POPULATE;
	thp = ls->has_thp && ls->thp && prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 0;
	for (size_t i = 0; i < ls->n_chunk_bytes; i++) {
		bool huge = (ls->has_hugetlb && ls->hugetlb) || (thp && ls->chunk_bytes[i] % HUGE_PMD_BYTES == 0);

		if (mmap(base + off, ls->chunk_bytes[i], PROT_READ | PROT_WRITE,
			 MAP_SHARED | MAP_FIXED | (huge ? 0 : populate), fds[i], 0) == MAP_FAILED) {
			int err = -errno;

			munmap(base, total);
			return err_set(err, "cannot map lease chunk %zu: %s", i, strerror(-err));
		}
		off += ls->chunk_bytes[i];
	}
	/*
	 * A child forked from here does not inherit the lease: it would keep mapping the chunks after the lease
	 * ended, and see what the next lease of them is written with. A shared lease reaches another process only by
	 * pb_attach, whose mapping the daemon counts. An inheritable one (PB_ACQUIRE_INHERIT) has its forks counted
	 * instead, so that its release says a child may map it still.
	 */
	if (inherit)
		pthread_once(&forks_once, watch_forks);
	else if (madvise(base, total, MADV_DONTFORK) < 0) {
		int err = -errno;

		munmap(base, total);
		return err_set(err, "cannot keep the lease out of forked children (madvise MADV_DONTFORK): %s",
			       strerror(-err));
	}
	*base_ret = base;
	*map_bytes_ret = total;
	return 0;
}

int map_cuda_register(pb_lease *l, void *p, size_t bytes, const uint64_t *chunk_bytes, size_t n_chunks, bool mapped)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), first = (uintptr_t)p & ~(page - 1);
	/* Pieces are counted from the first page the range touches (a registration may start mid-page). */
	size_t span = (size_t)((((uintptr_t)p + bytes + page - 1) & ~(page - 1)) - first);
	size_t align = !l->registration && l->page_size_bytes > page ? l->page_size_bytes : page;
	size_t stride = pbcuda_plan_stride(span, pbcuda_piece_max(), align, chunk_bytes, n_chunks);
	int r;

	r = pbcuda_register(p, bytes, mapped, stride);
	if (r < 0)
		return r;
	l->cuda_registered = true;
	l->cuda_piece_bytes = stride;
	return 0;
}

/* Every piece map_cuda_register made of l's range (its data, for a registration; else its mapping). */
static void cuda_unregister(pb_lease *l)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);

	if (!l->cuda_registered)
		return;
	if (l->registration)
		/* size_bytes counts from the first page; the pieces end where it does. */
		pbcuda_unregister(l->data, l->size_bytes - ((uintptr_t)l->data & (page - 1)), l->cuda_piece_bytes);
	else if (l->cuda_slice_bytes)
		pbcuda_unregister((char *)l->map_base + l->cuda_slice_off, l->cuda_slice_bytes, l->cuda_piece_bytes);
	else
		pbcuda_unregister(l->map_base, l->map_bytes, l->cuda_piece_bytes);
	l->cuda_registered = false;
	l->cuda_slice_off = l->cuda_slice_bytes = 0;
}

size_t pb_lease_cuda_piece_bytes(const pb_lease *l)
{
	return l && l->cuda_registered ? l->cuda_piece_bytes : 0;
}

void map_release(pb_lease *l)
{
	if (l->registration) {
		cuda_unregister(l);
		__atomic_store_n(&l->data, NULL, __ATOMIC_RELEASE);
		return;
	}
	cuda_unregister(l);
	if (l->map_base)
		munmap(l->map_base, l->map_bytes);
	l->map_base = NULL;
	__atomic_store_n(&l->data, NULL, __ATOMIC_RELEASE);
}

/*
 * Give up the memory of a lease the application still holds a pointer to: its
 * range becomes PROT_NONE rather than unmapped, so a stale access faults
 * instead of landing in whatever the process maps there next.
 */
void map_retire(pb_lease *l)
{
	/* The caller's own memory is never ours to take away: only the charge goes. */
	if (l->registration) {
		map_release(l);
		__atomic_store_n(&l->kind, PB_MEM_REVOKED, __ATOMIC_RELEASE);
		return;
	}
	cuda_unregister(l);
	/* Data first: whoever sees PB_MEM_REVOKED also sees NULL data. */
	__atomic_store_n(&l->data, NULL, __ATOMIC_RELEASE);
	__atomic_store_n(&l->kind, PB_MEM_REVOKED, __ATOMIC_RELEASE);
	if (mmap(l->map_base, l->map_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
		 0) == MAP_FAILED) {
		munmap(l->map_base, l->map_bytes);
		l->map_base = NULL;
	}
}

int pb_lease_register_slice(pb_lease *l, size_t offset, size_t length, uint32_t flags)
{
	const char *why = NULL;
	size_t end;
	int r;

	if (!l || length == 0)
		return err_set(-EINVAL, "pb_lease_register_slice: %s", l ? "length is 0" : "lease is NULL");
	if (flags & ~PB_ACQUIRE_MAPPED)
		return err_set(-EINVAL, "pb_lease_register_slice: flags may hold PB_ACQUIRE_MAPPED only");
	if (!l->client || l->registration)
		return err_set(-EINVAL, "this lease is %s: only broker memory has slices to register",
			       l->registration ? "the program's own memory (pb_register)" : "ordinary memory");
	/* Whole pages of the lease: the driver pins pages, and a slice's neighbour registers the next ones. */
	if (offset % l->page_size_bytes)
		return err_set(-EINVAL, "slice offset %zu is not a multiple of the lease's page size (%zu bytes)",
			       offset, l->page_size_bytes);
	if (__builtin_add_overflow(offset, length, &end) || end > l->size_bytes)
		return err_set(-ERANGE, "slice [%zu, +%zu) ends past the lease's %zu bytes", offset, length,
			       l->size_bytes);
	end = (end + l->page_size_bytes - 1) / l->page_size_bytes * l->page_size_bytes;
	if (end > l->map_bytes)
		end = l->map_bytes;
	pthread_mutex_lock(&l->client->lock);
	if (l->state != LEASE_ACTIVE)
		r = err_set(-EINVAL, "lease %llu was released or revoked: nothing to register",
			    (unsigned long long)l->id);
	else if (l->cuda_registered)
		r = err_set(-EALREADY,
			    "lease %llu is already registered with CUDA here (%s); acquire or attach it "
			    "with PB_ACQUIRE_NO_CUDA to register a slice only",
			    (unsigned long long)l->id, l->cuda_slice_bytes ? "a slice" : "whole");
	else if (l->cuda_registering)
		r = err_set(-EBUSY,
			    "another thread is registering a slice of lease %llu with CUDA now; one registration per "
			    "process: use that one",
			    (unsigned long long)l->id);
	else
		r = 0;
	/* Claimed under the lock, so that a second caller is refused rather than registering too. */
	if (r == 0)
		l->cuda_registering = true;
	pthread_mutex_unlock(&l->client->lock);
	if (r < 0)
		return r;
	if (!pbcuda_available(&why))
		r = err_set(-ENODEV, "cannot register a slice with CUDA: %s", why ? why : "no usable CUDA driver");
	else {
		/* No chunk sizes: a slice's cuts need not fall on chunk boundaries below the driver's per-call cap. */
		r = map_cuda_register(l, (char *)l->map_base + offset, end - offset, NULL, 0,
				      flags & PB_ACQUIRE_MAPPED);
		if (r < 0)
			r = err_set(r, "registering slice [%zu, +%zu) of lease %llu with CUDA: %s", offset,
				    end - offset, (unsigned long long)l->id, pbcuda_strerror());
	}
	pthread_mutex_lock(&l->client->lock);
	if (r == 0) {
		l->cuda_slice_off = offset;
		l->cuda_slice_bytes = end - offset;
		l->mapped = flags & PB_ACQUIRE_MAPPED;
		__atomic_store_n(&l->kind, PB_MEM_PINNED, __ATOMIC_RELEASE);
	}
	l->cuda_registering = false;
	pthread_mutex_unlock(&l->client->lock);
	return r;
}

int pb_lease_cuda_slice(const pb_lease *l, size_t *offset, size_t *length)
{
	if (!l || !l->cuda_registered || !l->cuda_slice_bytes)
		return 0;
	if (offset)
		*offset = l->cuda_slice_off;
	if (length)
		*length = l->cuda_slice_bytes;
	return 1;
}

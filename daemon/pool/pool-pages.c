/* SPDX-License-Identifier: MIT */
/*
 * The pool's bottom floor, page kinds: how many huge pages the host has free, mapping a chunk 2 MiB-aligned,
 * collapsing it into THPs and checking the collapse in smaps, pre-faulting, and reading pagemap for pages
 * a mapping lost. No pool state: addresses, fds and /proc only (see pool-int.h for the floors).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pool-int.h"
#include "pressure.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older headers lack it */
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif
/* /proc/self/pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst). Swapped covers
 * migration entries too: a locked page being moved by compaction is not a punched one. */
#define PM_PRESENT (1ull << 63)
#define PM_SWAPPED (1ull << 62)
/* pagemap entries read per pread: one 2 MiB chunk of 4 KiB pages (measured ~10 us). */
#define PAGEMAP_BATCH 512u

/* HugePages_Free from <proc_root>/proc/meminfo, parsed as the monitor parses it; 0 when it can't tell. */
uint64_t pages_huge_free(const char *proc_root)
{
	/* meminfo is about 1.5 KiB on 6.x kernels; a cut last line is ignored by the parser. */
	char path[4096], buf[16384];
	struct meminfo m;
	size_t len;
	FILE *f;

	snprintf(path, sizeof(path), "%s/proc/meminfo", proc_root ? proc_root : "");
	f = fopen(path, "re");
	if (!f)
		return 0;
	len = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	if (pressure_parse_meminfo(buf, len, &m) < 0 || m.hugepage_size_bytes == 0)
		return 0;
	return m.hugepages_free_bytes / m.hugepage_size_bytes;
}

uint64_t pool_host_page_size(enum pool_hugetlb mode, const char *proc_root)
{
	switch (mode) {
	case POOL_HUGETLB_NO:
		return PAGE_4K_BYTES;
	case POOL_HUGETLB_YES:
		return HUGE_2M_BYTES;
	case POOL_HUGETLB_AUTO:
		break;
	}
	return pages_huge_free(proc_root) > 0 ? HUGE_2M_BYTES : PAGE_4K_BYTES;
}

/*
 * A 4 KiB-page chunk mapped at a 2 MiB boundary, so its THPs (if any) are PMD-mapped here: over-reserve
 * address space, map the memfd inside it, trim the rest. NULL (errno set) on failure.
 */
void *pages_map_aligned(int fd, uint64_t bytes)
{
	uint8_t *res, *base;
	size_t reserve = bytes + HUGE_2M_BYTES;

	res = mmap(NULL, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (res == MAP_FAILED)
		return NULL;
	base = (uint8_t *)(((uintptr_t)res + HUGE_2M_BYTES - 1) & ~(uintptr_t)(HUGE_2M_BYTES - 1));
	if (mmap(base, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
		int err = errno;

		munmap(res, reserve);
		errno = err;
		return NULL;
	}
	if (base > res)
		munmap(res, (size_t)(base - res));
	if (base + bytes < res + reserve)
		munmap(base + bytes, (size_t)(res + reserve - (base + bytes)));
	return base;
}

/*
 * Collapse a fresh or resident chunk into THPs. One touch per 2 MiB is enough: the collapse allocates
 * each huge page and fills what was never touched with zeros (19 ms per 64 MiB here, against 52 ms to
 * populate it on 4 KiB pages). Returns true when the whole chunk is THP-backed.
 */
bool pages_collapse(void *addr, uint64_t bytes)
{
	volatile uint8_t *b = addr;

	if (bytes % HUGE_2M_BYTES != 0 || ((uintptr_t)addr & (HUGE_2M_BYTES - 1)) != 0)
		return false;
	for (uint64_t off = 0; off < bytes; off += HUGE_2M_BYTES)
		b[off] = b[off];
	return madvise(addr, bytes, MADV_COLLAPSE) == 0;
}

/* Whether this kernel collapses shmem into THP: one 2 MiB memfd, tried and thrown away. */
bool pages_thp_supported(void)
{
	int fd = memfd_create("pinbroker-thp-probe", MFD_CLOEXEC);
	void *a;
	bool ok = false;

	if (fd < 0)
		return false;
	if (ftruncate(fd, HUGE_2M_BYTES) == 0 && (a = pages_map_aligned(fd, HUGE_2M_BYTES)) != NULL) {
		ok = pages_collapse(a, HUGE_2M_BYTES);
		munmap(a, HUGE_2M_BYTES);
	}
	close(fd);
	return ok;
}

int pool_parse_smaps_pmd(const char *buf, size_t len, const uintptr_t *starts, size_t n, uint64_t *pmd_bytes)
{
	const char *line = buf, *end = buf + len;
	ptrdiff_t cur = -1; /* index into starts of the VMA being read, or -1 */
	bool header = false;
	int found = 0;

	for (size_t i = 0; i < n; i++)
		pmd_bytes[i] = UINT64_MAX;
	while (line < end) {
		const char *nl = memchr(line, '\n', (size_t)(end - line));
		size_t ll = nl ? (size_t)(nl - line) : (size_t)(end - line);
		char text[256];
		unsigned long long lo, hi, kb;

		/* Lines past 255 bytes (a long path) matter only for their start, which fits. */
		memcpy(text, line, ll < sizeof(text) - 1 ? ll : sizeof(text) - 1);
		text[ll < sizeof(text) - 1 ? ll : sizeof(text) - 1] = 0;
		line = nl ? nl + 1 : end;
		/* A VMA's header: "7f...000-7f...000 rw-s 00000000 00:01 1234   /memfd:... (deleted)". */
		if (strchr(text, '-') && strchr(text, ' ') && strchr(text, '-') < strchr(text, ' ') &&
		    sscanf(text, "%llx-%llx ", &lo, &hi) == 2) {
			size_t a = 0, b = n;

			header = true;
			cur = -1;
			while (a < b) { /* starts[] is ascending */
				size_t mid = a + (b - a) / 2;

				if (starts[mid] < (uintptr_t)lo)
					a = mid + 1;
				else
					b = mid;
			}
			if (a < n && starts[a] == (uintptr_t)lo) {
				cur = (ptrdiff_t)a;
				pmd_bytes[a] = 0;
				found++;
			}
			continue;
		}
		if (cur < 0)
			continue;
		if (sscanf(text, "ShmemPmdMapped: %llu kB", &kb) == 1 ||
		    sscanf(text, "FilePmdMapped: %llu kB", &kb) == 1)
			pmd_bytes[cur] += kb * 1024;
	}
	return header || len == 0 ? found : -EINVAL;
}

/* /proc/self/smaps, whole, in a malloc'd buffer (*len bytes); NULL when it cannot be read. */
char *pages_read_smaps(size_t *len)
{
	size_t cap = 1 << 20, n = 0;
	char *buf = malloc(cap);
	int fd = open("/proc/self/smaps", O_RDONLY | O_CLOEXEC);

	if (!buf || fd < 0)
		goto fail;
	for (;;) {
		ssize_t got;

		if (cap - n < 65536) {
			char *nb = realloc(buf, cap * 2);

			if (!nb)
				goto fail;
			buf = nb;
			cap *= 2;
		}
		got = read(fd, buf + n, cap - n);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			goto fail;
		if (got == 0)
			break;
		n += (size_t)got;
	}
	close(fd);
	*len = n;
	return buf;
fail:
	if (fd >= 0)
		close(fd);
	free(buf);
	return NULL;
}

/* Fault every page in writable now, so no client ever pays for a first touch. */
int pages_prefault(void *addr, uint64_t bytes, uint64_t page_bytes)
{
	volatile char *b = addr;

	if (madvise(addr, bytes, MADV_POPULATE_WRITE) == 0)
		return 0;
	if (errno != EINVAL)
		return -errno;
	/* Kernels before 5.14 don't know MADV_POPULATE_WRITE: touch each page instead. */
	for (uint64_t off = 0; off < bytes; off += page_bytes)
		b[off] = 0;
	return 0;
}

uint64_t pool_hugepages_target(uint64_t want_bytes, uint64_t nr_now, uint64_t free_now)
{
	uint64_t want = (want_bytes + HUGE_2M_BYTES - 1) / HUGE_2M_BYTES;

	return want > free_now ? nr_now + (want - free_now) : nr_now;
}

/* One pread per PAGEMAP_BATCH pages; an entry neither present nor swapped is a page the mapping lost. */
uint64_t pages_unmapped(int *pagemap_fd, const void *addr, uint64_t bytes)
{
	uint64_t entries[PAGEMAP_BATCH], missing_bytes = 0;
	uint64_t first = (uintptr_t)addr / PAGE_4K_BYTES, npages = bytes / PAGE_4K_BYTES;

	if (*pagemap_fd == -1) {
		*pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
		if (*pagemap_fd < 0)
			*pagemap_fd = -2;
	}
	if (*pagemap_fd < 0)
		return 0;
	for (uint64_t i = 0; i < npages;) {
		size_t n = npages - i < PAGEMAP_BATCH ? (size_t)(npages - i) : PAGEMAP_BATCH;
		ssize_t got = pread(*pagemap_fd, entries, n * sizeof(entries[0]),
				    (off_t)((first + i) * sizeof(entries[0])));

		if (got != (ssize_t)(n * sizeof(entries[0])))
			return 0;
		for (size_t k = 0; k < n; k++)
			if (!(entries[k] & (PM_PRESENT | PM_SWAPPED)))
				missing_bytes += PAGE_4K_BYTES;
		i += n;
	}
	return missing_bytes;
}

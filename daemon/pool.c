/* SPDX-License-Identifier: MIT */
/* The warm pool: makes sealed, pre-faulted, locked memfd chunks and lends them to one uid at a time. */
#define _GNU_SOURCE
#include "pool.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/memfd.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <linux/magic.h>
#include <unistd.h>

#include "numa.h"
#include "pressure.h"
#include "util.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older headers lack it */
#endif
#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21U << 26) /* log2(2 MiB) << MFD_HUGE_SHIFT */
#endif

#define PAGE_4K_BYTES 4096u
#define HUGE_2M_BYTES (2u * 1024 * 1024)
#define DEFAULT_CHUNK_BYTES HUGE_2M_BYTES
/* Below this a single thread faults faster than threads can be started and joined. */
#define PARALLEL_MIN_BYTES (64ull * 1024 * 1024)
#define MAX_THREADS 16u
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif
/* <numaif.h>'s policy modes, without libnuma. */
#define PB_MPOL_DEFAULT 0
#define PB_MPOL_PREFERRED 1
/* Pages of a chunk whose node move_pages is asked (spread over it). */
#define PLACEMENT_SAMPLES 64
/*
 * Free memory a node keeps before it counts as full for a take: below it the kernel reclaims on the
 * node (its watermarks are ~0.1-0.5% of it: some hundreds of MiB on a 100+ GiB socket) or, under
 * MPOL_PREFERRED, places fresh pages on another node anyway.
 */
#define NODE_RESERVE_BYTES (256ull * 1024 * 1024)
#define CHUNK_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
/* /proc/self/pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst). Swapped covers
 * migration entries too: a locked page being moved by compaction is not a punched one. */
#define PM_PRESENT (1ull << 63)
#define PM_SWAPPED (1ull << 62)
/* pagemap entries read per pread: one 2 MiB chunk of 4 KiB pages (measured ~10 us). */
#define PAGEMAP_BATCH 512u

struct punch_count {
	uid_t uid;
	uint64_t n;
};

struct pool {
	uint64_t chunk_bytes;
	uint64_t page_bytes;
	bool hugetlb;             /* try MFD_HUGETLB first */
	bool hugetlb_required;    /* POOL_HUGETLB_YES: no fallback to 4 KiB pages */
	bool thp;                 /* collapse 4 KiB chunks to THP */
	int nodes[NUMA_MAX_NODES]; /* NUMA placement: the nodes chunks go on */
	size_t n_nodes;           /* 0: no placement */
	/* Per placement node (by index into nodes): chunks on it, idle ones, misplaced ones. Kept as they move. */
	uint64_t node_all[NUMA_MAX_NODES], node_idle[NUMA_MAX_NODES], node_misplaced[NUMA_MAX_NODES];
	bool lock;
	unsigned threads;
	char memfd_name[POOL_MEMFD_NAME_MAX];

	struct chunk *idle;       /* most recently returned first */
	uint64_t idle_bytes;
	uint64_t lent_bytes;
	size_t nchunks;           /* idle and lent */
	uint64_t thp_bytes;       /* chunks (idle and lent) collapsed to THP; under id_lock while growing */
	uint64_t thp_failures;
	uint64_t thp_unverified;  /* of thp_failures: collapse said yes, smaps said not PMD-mapped */
	uint64_t hugetlb_bytes;   /* hugetlb chunks, idle and lent; under id_lock while growing */

	pthread_mutex_t id_lock;  /* chunk ids are handed out from grow threads */
	uint64_t next_chunk_id;
	struct pool_hooks hooks;
	struct pool_numa_hooks numa_hooks;

	struct chunk *all;        /* every chunk, idle and lent (all_next links) */
	struct chunk *audit_next; /* where the next pool_audit slice starts; NULL = at the head */
	int pagemap_fd;           /* /proc/self/pagemap, opened on first use; -2 = unavailable */
	pool_punch_fn punch_fn;
	void *punch_ud;
	uint64_t punched;
	uint64_t tainted_destroyed; /* chunks destroyed on return because another uid had mapped them */
	struct punch_count *punched_uid;
	size_t npunched_uid;
};

static int node_slot(const struct pool *p, int node);
static int placement_node(const struct pool *p, int node);

/* HugePages_Free from <proc_root>/proc/meminfo, parsed as the monitor parses it; 0 when it can't tell. */
static uint64_t huge_pages_free(const char *proc_root)
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
	return huge_pages_free(proc_root) > 0 ? HUGE_2M_BYTES : PAGE_4K_BYTES;
}

/*
 * A 4 KiB-page chunk mapped at a 2 MiB boundary, so its THPs (if any) are PMD-mapped here: over-reserve
 * address space, map the memfd inside it, trim the rest. NULL (errno set) on failure.
 */
static void *map_aligned(int fd, uint64_t bytes)
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
static bool collapse(void *addr, uint64_t bytes)
{
	volatile uint8_t *b = addr;

	if (bytes % HUGE_2M_BYTES != 0 || ((uintptr_t)addr & (HUGE_2M_BYTES - 1)) != 0)
		return false;
	for (uint64_t off = 0; off < bytes; off += HUGE_2M_BYTES)
		b[off] = b[off];
	return madvise(addr, bytes, MADV_COLLAPSE) == 0;
}

/* Whether this kernel collapses shmem into THP: one 2 MiB memfd, tried and thrown away. */
static bool thp_supported(void)
{
	int fd = memfd_create("pinbroker-thp-probe", MFD_CLOEXEC);
	void *a;
	bool ok = false;

	if (fd < 0)
		return false;
	if (ftruncate(fd, HUGE_2M_BYTES) == 0 && (a = map_aligned(fd, HUGE_2M_BYTES)) != NULL) {
		ok = collapse(a, HUGE_2M_BYTES);
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
		if (sscanf(text, "ShmemPmdMapped: %llu kB", &kb) == 1 || sscanf(text, "FilePmdMapped: %llu kB", &kb) == 1)
			pmd_bytes[cur] += kb * 1024;
	}
	return header || len == 0 ? found : -EINVAL;
}

/* /proc/self/smaps, whole, in a malloc'd buffer (*len bytes); NULL when it cannot be read. */
static char *read_smaps(size_t *len)
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

static int cmp_chunk_addr(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t)(*(struct chunk *const *)a)->addr, y = (uintptr_t)(*(struct chunk *const *)b)->addr;

	return x < y ? -1 : x > y;
}

static void count_kind(struct pool *p, const struct chunk *c, int sign);
static int prefault(void *addr, uint64_t bytes, uint64_t page_bytes);

/*
 * madvise(MADV_COLLAPSE) answering 0 is not the last word: after a warm-up batch (pool_grow_on) is made, one
 * read of /proc/self/smaps says how much of each collapsed chunk's VMA the kernel maps with PMDs
 * (ShmemPmdMapped). A collapsed chunk that is not whole huge pages counts as 4 KiB pages (and as a THP
 * failure). One read per batch, not per chunk, and never for an acquire's fresh chunks: smaps walks every
 * VMA of the daemon. Without a readable smaps the collapse's answer stands.
 */
static void verify_collapsed(struct pool *p, struct chunk **v, size_t n)
{
	struct chunk **thp = NULL;
	uintptr_t *starts = NULL;
	uint64_t *pmd = NULL;
	size_t k = 0, len = 0;
	char *buf = NULL;

	for (size_t i = 0; i < n; i++)
		if (v[i] && v[i]->thp && v[i]->bytes >= HUGE_2M_BYTES)
			k++;
	if (k == 0)
		return;
	thp = malloc(k * sizeof(*thp));
	starts = malloc(k * sizeof(*starts));
	pmd = malloc(k * sizeof(*pmd));
	if (!thp || !starts || !pmd)
		goto out;
	k = 0;
	for (size_t i = 0; i < n; i++)
		if (v[i] && v[i]->thp && v[i]->bytes >= HUGE_2M_BYTES)
			thp[k++] = v[i];
	qsort(thp, k, sizeof(*thp), cmp_chunk_addr);
	for (size_t i = 0; i < k; i++)
		starts[i] = (uintptr_t)thp[i]->addr;
	buf = read_smaps(&len);
	if (!buf || pool_parse_smaps_pmd(buf, len, starts, k, pmd) < 0)
		goto out;
	for (size_t i = 0; i < k; i++) {
		struct chunk *c = thp[i];

		if (pmd[i] == UINT64_MAX || pmd[i] >= c->bytes)
			continue;
		pthread_mutex_lock(&p->id_lock);
		count_kind(p, c, -1);
		c->thp = false;
		count_kind(p, c, 1);
		p->thp_failures++;
		p->thp_unverified++;
		pthread_mutex_unlock(&p->id_lock);
		/* Whatever the collapse left, every page is there and locked before anyone is lent it. */
		(void)prefault(c->addr, c->bytes, PAGE_4K_BYTES);
	}
out:
	free(buf);
	free(pmd);
	free(starts);
	free(thp);
}

uint64_t pool_hugepages_target(uint64_t want_bytes, uint64_t nr_now, uint64_t free_now)
{
	uint64_t want = (want_bytes + HUGE_2M_BYTES - 1) / HUGE_2M_BYTES;

	return want > free_now ? nr_now + (want - free_now) : nr_now;
}

int pool_new(const struct pool_opts *opts, struct pool **ret)
{
	bool have_huge = huge_pages_free(opts->proc_root) > 0;
	struct pool *p;
	long ncpu;

	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	switch (opts->hugetlb) {
	case POOL_HUGETLB_YES:
		if (!have_huge) {
			free(p);
			return -ENOTSUP;
		}
		p->hugetlb = p->hugetlb_required = true;
		break;
	case POOL_HUGETLB_AUTO:
		p->hugetlb = have_huge;
		break;
	case POOL_HUGETLB_NO:
		break;
	default:
		free(p);
		return -EINVAL;
	}
	p->page_bytes = p->hugetlb ? HUGE_2M_BYTES : PAGE_4K_BYTES;
	p->chunk_bytes = opts->chunk_bytes ? opts->chunk_bytes : DEFAULT_CHUNK_BYTES;
	if (p->chunk_bytes % p->page_bytes != 0) {
		free(p);
		return -EINVAL;
	}
	/*
	 * THP for whole 2 MiB chunks of 4 KiB pages: the pool's own when it is not on hugetlb, and
	 * the fallback's when huge pages run out.
	 */
	if (opts->thp != POOL_THP_NO && p->chunk_bytes % HUGE_2M_BYTES == 0) {
		p->thp = thp_supported();
		if (!p->thp && opts->thp == POOL_THP_YES && !p->hugetlb) {
			free(p);
			return -EOPNOTSUPP;
		}
	}
	p->lock = opts->lock;
	snprintf(p->memfd_name, sizeof(p->memfd_name), "%s", opts->memfd_name ? opts->memfd_name : POOL_MEMFD_NAME);
	p->n_nodes = opts->n_nodes < NUMA_MAX_NODES ? opts->n_nodes : NUMA_MAX_NODES;
	for (size_t i = 0; i < p->n_nodes; i++)
		p->nodes[i] = opts->nodes[i];
	p->threads = opts->threads;
	if (p->threads == 0) {
		ncpu = sysconf(_SC_NPROCESSORS_ONLN);
		p->threads = ncpu > 0 ? (unsigned)ncpu : 1;
	}
	if (p->threads > MAX_THREADS)
		p->threads = MAX_THREADS;
	pthread_mutex_init(&p->id_lock, NULL);
	p->pagemap_fd = -1;
	*ret = p;
	return 0;
}

static void chunk_destroy(struct chunk *c);

static void all_link(struct pool *p, struct chunk *c)
{
	c->all_prev = NULL;
	c->all_next = p->all;
	if (p->all)
		p->all->all_prev = c;
	p->all = c;
}

static void all_unlink(struct pool *p, struct chunk *c)
{
	if (p->audit_next == c)
		p->audit_next = c->all_next;
	if (c->all_prev)
		c->all_prev->all_next = c->all_next;
	else
		p->all = c->all_next;
	if (c->all_next)
		c->all_next->all_prev = c->all_prev;
	c->all_prev = c->all_next = NULL;
}

/* Destroy a chunk the pool had announced through the created hook. */
static void count_kind(struct pool *p, const struct chunk *c, int sign);

static void pool_destroy(struct pool *p, struct chunk *c)
{
	all_unlink(p, c);
	count_kind(p, c, -1);
	if (p->hooks.destroyed)
		p->hooks.destroyed(c, p->hooks.ud);
	chunk_destroy(c);
}

/* A chunk joins the pool: the audit sees it from now on, and so do the hooks. */
static void announce(struct pool *p, struct chunk *c)
{
	all_link(p, c);
	if (p->hooks.created)
		p->hooks.created(c, p->hooks.ud);
}

static void chunk_destroy(struct chunk *c)
{
	if (c->addr)
		munmap(c->addr, c->bytes);
	if (c->fd >= 0)
		close(c->fd);
	free(c);
}

void pool_free(struct pool *p)
{
	struct chunk *c, *next;

	if (!p)
		return;
	for (c = p->idle; c; c = next) {
		next = c->next;
		pool_destroy(p, c);
	}
	if (p->pagemap_fd >= 0)
		close(p->pagemap_fd);
	free(p->punched_uid);
	pthread_mutex_destroy(&p->id_lock);
	free(p);
}

uint64_t pool_page_size(const struct pool *p)
{
	return p->page_bytes;
}

uint64_t pool_chunk_size(const struct pool *p)
{
	return p->chunk_bytes;
}

bool pool_hugetlb(const struct pool *p)
{
	return p->hugetlb;
}

bool pool_thp(const struct pool *p)
{
	return p->thp && !p->hugetlb;
}

uint64_t pool_thp_bytes(const struct pool *p)
{
	return p->thp_bytes;
}

uint64_t pool_thp_failures(const struct pool *p)
{
	return p->thp_failures;
}

uint64_t pool_thp_unverified(const struct pool *p)
{
	return p->thp_unverified;
}

void pool_set_numa_hooks(struct pool *p, const struct pool_numa_hooks *h)
{
	if (h)
		p->numa_hooks = *h;
	else
		memset(&p->numa_hooks, 0, sizeof(p->numa_hooks));
}

uint64_t pool_hugetlb_bytes(const struct pool *p)
{
	return p->hugetlb_bytes;
}

void pool_node_bytes(const struct pool *p, int node, struct pool_node_bytes *ret)
{
	int slot = node_slot(p, node);

	*ret = (struct pool_node_bytes){ 0 };
	if (slot < 0)
		return;
	ret->idle = p->node_idle[slot];
	ret->lent = p->node_all[slot] - p->node_idle[slot];
	ret->misplaced = p->node_misplaced[slot];
}

bool pool_places_on(const struct pool *p, int node)
{
	return placement_node(p, node) >= 0;
}

size_t pool_nodes(const struct pool *p, const int **nodes)
{
	*nodes = p->nodes;
	return p->n_nodes;
}

const char *pool_page_kind(const struct pool *p)
{
	return p->hugetlb ? "hugetlb" : pool_thp(p) ? "thp" : "4k";
}

/* Fault every page in writable now, so no client ever pays for a first touch. */
static int prefault(void *addr, uint64_t bytes, uint64_t page_bytes)
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

/* A node mask for mbind/set_mempolicy: the one bit of node. */
struct node_mask {
	unsigned long bits[NUMA_MAX_NODES / (8 * sizeof(unsigned long)) + 1];
};

static struct node_mask mask_of(int node)
{
	struct node_mask m = { { 0 } };

	if (node < 0 || node >= NUMA_MAX_NODES) /* numa_read never lists one: an empty mask, the local node */
		return m;
	m.bits[(size_t)node / (8 * sizeof(unsigned long))] = 1ul << ((size_t)node % (8 * sizeof(unsigned long)));
	return m;
}

/* Prefer node for the range's pages from now on (shmem keeps the policy with the file). */
static int prefer_range(void *addr, uint64_t bytes, int node)
{
	struct node_mask m = mask_of(node);

	return syscall(SYS_mbind, addr, bytes, PB_MPOL_PREFERRED, m.bits, NUMA_MAX_NODES + 1, 0) == 0 ? 0 : -errno;
}

/* Prefer node for this thread's allocations (hugetlb's fallocate), or back to the default (node < 0). */
static void prefer_thread(int node)
{
	struct node_mask m = node >= 0 ? mask_of(node) : (struct node_mask){ { 0 } };

	(void)syscall(SYS_set_mempolicy, node >= 0 ? PB_MPOL_PREFERRED : PB_MPOL_DEFAULT, node >= 0 ? m.bits : NULL,
		      node >= 0 ? NUMA_MAX_NODES + 1 : 0);
}

/*
 * Where a resident range's pages are: the node of its first page (-1 if it cannot tell), and in
 * *mixed whether any of PLACEMENT_SAMPLES pages spread over it is on another node than that one.
 */
static int range_node(void *addr, uint64_t bytes, bool *mixed)
{
	void *pages[PLACEMENT_SAMPLES];
	int status[PLACEMENT_SAMPLES];
	size_t n = bytes / PAGE_4K_BYTES < PLACEMENT_SAMPLES ? bytes / PAGE_4K_BYTES : PLACEMENT_SAMPLES;

	*mixed = false;
	if (n == 0)
		return -1;
	for (size_t i = 0; i < n; i++)
		pages[i] = (uint8_t *)addr + (bytes / n * i) / PAGE_4K_BYTES * PAGE_4K_BYTES;
	if (syscall(SYS_move_pages, 0, n, pages, NULL, status, 0) != 0)
		return -1;
	for (size_t i = 1; i < n; i++)
		if (status[i] != status[0])
			*mixed = true;
	return status[0] >= 0 ? status[0] : -1;
}

/* range_node for a chunk, mapping a hugetlb one (which the daemon does not map) for the question. */
static void chunk_locate(struct chunk *c, int want)
{
	void *a = c->addr;

	if (!a) {
		a = mmap(NULL, c->bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, c->fd, 0);
		if (a == MAP_FAILED) {
			c->node = -1;
			return;
		}
	}
	c->node = range_node(a, c->bytes, &c->mixed);
	c->misplaced = want >= 0 && (c->node != want || c->mixed);
	if (!c->addr)
		munmap(a, c->bytes);
}

/* One memfd of bytes with the given page kind; on failure nothing is left behind. */
static int chunk_make_one(const char *name, uint64_t bytes, bool hugetlb, bool thp, bool lock, int node,
			  struct chunk *c)
{
	unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
	int r;

	if (hugetlb)
		flags |= MFD_HUGETLB | MFD_HUGE_2MB;
	c->fd = memfd_create(name, flags);
	if (c->fd < 0) {
		r = -errno;
		goto fail;
	}
	if (ftruncate(c->fd, (off_t)bytes) < 0) {
		r = -errno;
		goto fail;
	}
	/*
	 * hugetlb: allocate (and zero) every page through the file, not through a
	 * mapping: no faults and no mmap_lock, so prewarm threads do not serialise
	 * on the address space. On the H200 host this took a 16 GiB warm-up from
	 * 2.9 s to 0.4 s. ENOSPC here means huge pages ran out. (For 4 KiB shmem
	 * the same call was 3x slower there than populating through the mapping.)
	 */
	if (hugetlb) {
		/* Huge pages come from the node this (maker) thread prefers. */
		if (node >= 0)
			prefer_thread(node);
		r = fallocate(c->fd, 0, 0, (off_t)bytes) < 0 ? -errno : 0;
		if (node >= 0)
			prefer_thread(-1);
		if (r < 0)
			goto fail;
	}
	/* Sealed so a client can neither shrink the file under the daemon (SIGBUS) nor grow it. */
	if (fcntl(c->fd, F_ADD_SEALS, CHUNK_SEALS) < 0) {
		r = -errno;
		goto fail;
	}
	if (!hugetlb) {
		/*
		 * shmem pages are swappable until something locks them: map them and
		 * mlock the mapping (which also builds its page tables). hugetlb pages
		 * are never swapped or reclaimed, so they need neither.
		 */
		c->addr = map_aligned(c->fd, bytes);
		if (!c->addr) {
			r = -errno;
			goto fail;
		}
		/*
		 * Placed before any page exists: every fault and the collapse then allocate on node. A node
		 * the kernel refuses (offline, or a fixture's) places nothing; the check below then says
		 * where the pages went.
		 */
		if (node >= 0)
			(void)prefer_range(c->addr, bytes, node);
		/* Fewer TLB misses where shmem THP is enabled; harmless where it is not. */
		(void)madvise(c->addr, bytes, MADV_HUGEPAGE);
		/* Collapsed, every page is allocated (zeroed) already; otherwise, or if it fails, populate. */
		c->thp = thp && collapse(c->addr, bytes);
		r = c->thp ? 0 : prefault(c->addr, bytes, PAGE_4K_BYTES);
		if (r < 0)
			goto fail;
		if (lock && mlock(c->addr, bytes) < 0) {
			r = -errno;
			goto fail;
		}
	}
	c->bytes = bytes;
	c->hugetlb = hugetlb;
	return 0;

fail:
	if (c->addr)
		munmap(c->addr, bytes);
	if (c->fd >= 0)
		close(c->fd);
	c->addr = NULL;
	c->fd = -1;
	c->thp = false;
	return r;
}

/* The index of node in p->nodes, or -1. */
static int node_slot(const struct pool *p, int node)
{
	for (size_t i = 0; node >= 0 && i < p->n_nodes; i++)
		if (p->nodes[i] == node)
			return (int)i;
	return -1;
}

static void add_signed(uint64_t *counter, int sign, uint64_t bytes)
{
	*counter = sign > 0 ? *counter + bytes : *counter - bytes;
}

/* Add (sign 1) or remove (-1) c from the page-kind and node counters. Grow threads hold id_lock. */
static void count_kind(struct pool *p, const struct chunk *c, int sign)
{
	uint64_t *counter = c->hugetlb ? &p->hugetlb_bytes : c->thp ? &p->thp_bytes : NULL;
	int slot = node_slot(p, c->node);

	if (counter)
		add_signed(counter, sign, c->bytes);
	if (slot >= 0) {
		add_signed(&p->node_all[slot], sign, c->bytes);
		if (c->misplaced)
			add_signed(&p->node_misplaced[slot], sign, c->bytes);
	}
}

/* A new chunk owned by owner_uid. Thread-safe: called from grow threads. */
static int chunk_new(struct pool *p, uint64_t bytes, uid_t owner_uid, bool tail, int node, struct chunk **ret)
{
	struct chunk *c;
	int r;

	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fd = -1;
	if (p->n_nodes == 0)
		node = -1;
	r = chunk_make_one(p->memfd_name, bytes, p->hugetlb, p->thp && !tail, p->lock, node, c);
	/* Huge pages ran out (or were never reserved): 4 KiB pages (THP where it can) serve as well. */
	if (r < 0 && p->hugetlb && !p->hugetlb_required && (r == -ENOMEM || r == -ENOSPC))
		r = chunk_make_one(p->memfd_name, bytes, false, p->thp && !tail, p->lock, node, c);
	if (r < 0) {
		free(c);
		return r;
	}
	c->node = -1;
	if (p->n_nodes > 0)
		chunk_locate(c, node);
	c->owner_uid = owner_uid;
	c->tail = tail;
	pthread_mutex_lock(&p->id_lock);
	c->id = ++p->next_chunk_id;
	count_kind(p, c, 1);
	if (p->thp && !tail && !c->hugetlb && !c->thp)
		p->thp_failures++;
	pthread_mutex_unlock(&p->id_lock);
	*ret = c;
	return 0;
}

/* Shared state of one parallel make_chunks() run. */
struct maker {
	struct pool *p;
	struct chunk **out;
	const uint64_t *sizes;
	uid_t owner_uid;
	int node;                 /* placement, or -1 */
	size_t n;
	size_t tail_index;        /* index of the tail chunk, or n for none */

	pthread_mutex_t lock;
	pthread_cond_t cond;
	size_t next;              /* next index to make */
	unsigned running;         /* workers not yet finished */
	uint64_t done_bytes;
	int error;                /* first failure; stops handing out work */
};

static void *maker_thread(void *arg)
{
	struct maker *m = arg;

	for (;;) {
		size_t i;
		int r;

		pthread_mutex_lock(&m->lock);
		if (m->error < 0 || m->next >= m->n) {
			m->running--;
			pthread_cond_signal(&m->cond);
			pthread_mutex_unlock(&m->lock);
			return NULL;
		}
		i = m->next++;
		pthread_mutex_unlock(&m->lock);

		r = chunk_new(m->p, m->sizes[i], m->owner_uid, i == m->tail_index, m->node, &m->out[i]);

		pthread_mutex_lock(&m->lock);
		if (r < 0 && m->error == 0)
			m->error = r;
		if (r == 0)
			m->done_bytes += m->sizes[i];
		pthread_cond_signal(&m->cond);
		pthread_mutex_unlock(&m->lock);
	}
}

/*
 * Make n chunks of sizes[i] into out[i] (NULL where not made), in parallel for
 * large batches. Returns 0 or the first error; made chunks stay in out.
 */
static int make_chunks(struct pool *p, const uint64_t *sizes, size_t n, size_t tail_index, uid_t owner_uid, int node,
		       struct chunk **out, void (*progress)(uint64_t, uint64_t, void *), void *ud)
{
	struct maker m = {
		.p = p, .out = out, .sizes = sizes, .owner_uid = owner_uid, .node = node, .n = n, .tail_index = tail_index,
	};
	pthread_t tids[MAX_THREADS];
	uint64_t total_bytes = 0;
	unsigned nthreads, started = 0;

	for (size_t i = 0; i < n; i++) {
		out[i] = NULL;
		total_bytes += sizes[i];
	}
	nthreads = total_bytes < PARALLEL_MIN_BYTES ? 1 : p->threads;
	if (nthreads > n)
		nthreads = (unsigned)n;
	pthread_mutex_init(&m.lock, NULL);
	pthread_cond_init(&m.cond, NULL);

	if (nthreads > 1) {
		m.running = nthreads;
		for (; started < nthreads; started++)
			if (pthread_create(&tids[started], NULL, maker_thread, &m) != 0)
				break;
		pthread_mutex_lock(&m.lock);
		m.running -= nthreads - started;
		while (m.running > 0) {
			uint64_t done = m.done_bytes;

			if (progress) {
				pthread_mutex_unlock(&m.lock);
				progress(done, total_bytes, ud);
				pthread_mutex_lock(&m.lock);
			}
			if (m.running > 0 && m.done_bytes == done)
				pthread_cond_wait(&m.cond, &m.lock);
		}
		pthread_mutex_unlock(&m.lock);
		for (unsigned i = 0; i < started; i++)
			pthread_join(tids[i], NULL);
	}
	if (started == 0) {
		/* Small batch, or no thread could start: do the work here. */
		m.running = 1;
		maker_thread(&m);
	}
	if (progress)
		progress(m.done_bytes, total_bytes, ud);

	pthread_cond_destroy(&m.cond);
	pthread_mutex_destroy(&m.lock);
	return m.error;
}

static void idle_push(struct pool *p, struct chunk *c)
{
	int slot = node_slot(p, c->node);

	c->next = p->idle;
	p->idle = c;
	p->idle_bytes += c->bytes;
	if (slot >= 0)
		p->node_idle[slot] += c->bytes;
}

static void idle_unlink(struct pool *p, struct chunk **pp)
{
	struct chunk *c = *pp;
	int slot = node_slot(p, c->node);

	*pp = c->next;
	c->next = NULL;
	p->idle_bytes -= c->bytes;
	if (slot >= 0)
		p->node_idle[slot] -= c->bytes;
}

/* node if chunks are placed on it, else -1 (any): a node the pool does not place on is no request. */
static int placement_node(const struct pool *p, int node)
{
	for (size_t i = 0; node >= 0 && i < p->n_nodes; i++)
		if (p->nodes[i] == node)
			return node;
	return -1;
}

/* Whether chunk c counts as on node (-1, or no placement: every chunk does). */
static bool on_node(const struct pool *p, const struct chunk *c, int node)
{
	return node < 0 || p->n_nodes == 0 || c->node == node;
}

/* Idle bytes on node. */
static uint64_t idle_bytes_on(const struct pool *p, int node)
{
	int slot = node_slot(p, node);

	return slot < 0 ? p->idle_bytes : p->node_idle[slot];
}

/*
 * Idle chunks for uid, up to limit: for each node of nodes[] in turn (-1: any), first those last lent to
 * uid, then never-lent ones. Counts them (take NULL), or unlinks them into take[] (owned by uid now), in
 * the same order, so a count and the take after it agree. Returns how many.
 */
static size_t idle_pick(struct pool *p, uid_t uid, const int *nodes, size_t nn, size_t limit, struct chunk **take)
{
	size_t got = 0;

	for (size_t k = 0; k < nn; k++)
		for (int pass = 0; pass < 2; pass++) {
			uid_t want = pass == 0 ? uid : POOL_NO_OWNER;
			struct chunk **pp = &p->idle;

			while (*pp && got < limit) {
				struct chunk *c = *pp;

				if (c->owner_uid != want || !on_node(p, c, nodes[k])) {
					pp = &c->next;
					continue;
				}
				if (take) {
					idle_unlink(p, pp);
					c->owner_uid = uid;
					take[got] = c;
				} else {
					pp = &c->next;
				}
				got++;
			}
		}
	return got;
}

/*
 * The nodes whose idle chunks serve a take for node, into out[]: node itself, then, when node's free
 * memory cannot hold short_bytes of fresh chunks and still keep NODE_RESERVE_BYTES, the nodes the
 * numa hooks say stand in for it, nearest first. Returns the count (1 without a node or hooks).
 */
static size_t take_nodes(const struct pool *p, int node, uint64_t short_bytes, int *out)
{
	const struct pool_numa_hooks *h = &p->numa_hooks;
	uint64_t free_bytes;
	size_t n = 0;

	out[n++] = node;
	if (node < 0 || p->n_nodes == 0 || short_bytes == 0 || !h->free_bytes || !h->fallback)
		return n;
	free_bytes = h->free_bytes(node, h->ud);
	if (free_bytes == UINT64_MAX || free_bytes >= short_bytes + NODE_RESERVE_BYTES)
		return n;
	{
		size_t got = h->fallback(node, out + 1, NUMA_MAX_NODES - 1, h->ud);

		/* Keeping the order: only nodes the pool places on, node itself once. */
		for (size_t i = 1; i <= got; i++)
			if (out[i] != node && pool_places_on(p, out[i]))
				out[n++] = out[i];
	}
	return n;
}

int pool_grow(struct pool *p, uint64_t bytes, void (*progress)(uint64_t done, uint64_t total, void *ud), void *ud)
{
	return pool_grow_on(p, bytes, -1, progress, ud);
}

int pool_grow_on(struct pool *p, uint64_t bytes, int node, void (*progress)(uint64_t done, uint64_t total, void *ud),
		 void *ud)
{
	struct chunk **made = NULL;
	uint64_t *sizes = NULL;
	uint64_t want_bytes, have_bytes;
	size_t n;
	int r;

	node = placement_node(p, node);
	have_bytes = idle_bytes_on(p, node);
	want_bytes = round_up(bytes, p->chunk_bytes);
	if (want_bytes == 0 && bytes != 0)
		return -EINVAL;
	if (want_bytes <= have_bytes)
		return 0;
	n = (size_t)((want_bytes - have_bytes) / p->chunk_bytes);
	made = calloc(n, sizeof(*made));
	sizes = malloc(n * sizeof(*sizes));
	if (!made || !sizes) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		sizes[i] = p->chunk_bytes;

	r = make_chunks(p, sizes, n, n, POOL_NO_OWNER, node, made, progress, ud);
	/* Warm-up only: chunks an acquire makes trust the collapse's answer, so no acquire reads smaps. */
	if (p->thp)
		verify_collapsed(p, made, n);
	/* What was made stays, even after a failure: a partly warm pool still helps. */
	for (size_t i = 0; i < n; i++)
		if (made[i]) {
			idle_push(p, made[i]);
			p->nchunks++;
			announce(p, made[i]);
		}
out:
	free(sizes);
	free(made);
	return r;
}

int pool_take(struct pool *p, uid_t uid, uint64_t bytes, struct chunk ***ret, size_t *n)
{
	return pool_take_on(p, uid, bytes, -1, ret, n);
}

int pool_take_on(struct pool *p, uid_t uid, uint64_t bytes, int node, struct chunk ***ret, size_t *n)
{
	node = placement_node(p, node);
	uint64_t full = bytes / p->chunk_bytes, tail_bytes = bytes % p->chunk_bytes;
	size_t nfull, nreused = 0, nfresh, nreplace, ntotal;
	struct chunk **v = NULL, **fresh = NULL, **pp;
	uint64_t *sizes = NULL;
	int from[NUMA_MAX_NODES];
	size_t nfrom;
	int r;

	if (bytes == 0 || bytes % p->page_bytes != 0 || full > SIZE_MAX / sizeof(*v) - 1)
		return -EINVAL;
	nfull = (size_t)full;
	ntotal = nfull + (tail_bytes ? 1 : 0);
	v = calloc(ntotal, sizeof(*v));
	if (!v)
		return -ENOMEM;

	/*
	 * Count what the idle list can give without copying anyone's pages:
	 * first chunks this uid had before, then never-lent ones. Nothing is
	 * unlinked until every new chunk exists, so a failure changes nothing.
	 */
	nreused = idle_pick(p, uid, &node, 1, nfull, NULL);
	nfrom = take_nodes(p, node, (nfull - nreused) * p->chunk_bytes + tail_bytes, from);
	if (nfrom > 1)
		nreused = idle_pick(p, uid, from, nfrom, nfull, NULL);

	nfresh = ntotal - nreused;
	if (nfresh > 0) {
		fresh = calloc(nfresh, sizeof(*fresh));
		sizes = malloc(nfresh * sizeof(*sizes));
		if (!fresh || !sizes) {
			r = -ENOMEM;
			goto fail;
		}
		for (size_t i = 0; i < nfresh; i++)
			sizes[i] = p->chunk_bytes;
		if (tail_bytes)
			sizes[nfresh - 1] = tail_bytes;
		r = make_chunks(p, sizes, nfresh, tail_bytes ? nfresh - 1 : nfresh, uid, node, fresh, NULL, NULL);
		if (r < 0)
			goto fail;
	}

	/* Commit: unlink the reused chunks in preference order. */
	ntotal = idle_pick(p, uid, from, nfrom, nreused, v);
	for (size_t i = 0; i < nfresh; i++) {
		v[ntotal++] = fresh[i];
		p->nchunks++;
		p->lent_bytes += fresh[i]->bytes;
		announce(p, fresh[i]);
	}
	for (size_t i = 0; i < nreused; i++)
		p->lent_bytes += v[i]->bytes;

	/*
	 * Each fresh full chunk stands in for an idle chunk last lent to another
	 * uid: that one goes, so the pool holds no more than before.
	 */
	nreplace = nfresh - (tail_bytes ? 1 : 0);
	pp = &p->idle;
	while (*pp && nreplace > 0) {
		struct chunk *c = *pp;

		/* Replaced first: chunks another uid had, or (asked for a node) chunks on another node. */
		if ((c->owner_uid == POOL_NO_OWNER || c->owner_uid == uid) && on_node(p, c, node)) {
			pp = &c->next;
			continue;
		}
		idle_unlink(p, pp);
		p->nchunks--;
		pool_destroy(p, c);
		nreplace--;
	}

	free(sizes);
	free(fresh);
	*ret = v;
	*n = ntotal;
	return 0;

fail:
	if (fresh)
		for (size_t i = 0; i < nfresh; i++)
			if (fresh[i]) {
				count_kind(p, fresh[i], -1);
				chunk_destroy(fresh[i]);
			}
	free(sizes);
	free(fresh);
	free(v);
	return r;
}

/* Bytes of c's range that the daemon's own mapping no longer has a page for; 0 when it can't tell. */
static uint64_t unmapped_bytes(struct pool *p, const struct chunk *c)
{
	uint64_t entries[PAGEMAP_BATCH], missing_bytes = 0;
	uint64_t first = (uintptr_t)c->addr / PAGE_4K_BYTES, npages = c->bytes / PAGE_4K_BYTES;

	if (p->pagemap_fd == -1) {
		p->pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
		if (p->pagemap_fd < 0)
			p->pagemap_fd = -2;
	}
	if (p->pagemap_fd < 0)
		return 0;
	for (uint64_t i = 0; i < npages;) {
		size_t n = npages - i < PAGEMAP_BATCH ? (size_t)(npages - i) : PAGEMAP_BATCH;
		ssize_t got = pread(p->pagemap_fd, entries, n * sizeof(entries[0]),
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

/*
 * How much of c a holder has punched out (see pool.h): pages the file no longer
 * has, or, for a locked chunk, pages our locked mapping no longer maps. Without
 * locking, reclaim may unmap our pages on its own, so only st_blocks counts.
 */
static uint64_t missing_bytes(struct pool *p, const struct chunk *c)
{
	struct stat st;
	uint64_t have_bytes;

	if (fstat(c->fd, &st) < 0)
		return 0;
	have_bytes = (uint64_t)st.st_blocks * 512u;
	if (have_bytes < c->bytes)
		return c->bytes - have_bytes;
	if (c->addr && p->lock)
		return unmapped_bytes(p, c);
	return 0;
}

/* Put every page back, locked through our mapping; -EAGAIN if some are missing again already. */
static int chunk_repair(struct pool *p, struct chunk *c)
{
	int r;

	if (!c->addr) {
		/* hugetlb: nothing of ours maps it; allocating the holes is the whole repair. */
		if (fallocate(c->fd, 0, 0, (off_t)c->bytes) < 0)
			return -errno;
	} else {
		/* A fault in our VM_LOCKED mapping locks the page, whoever faulted it into the file. */
		r = prefault(c->addr, c->bytes, PAGE_4K_BYTES);
		if (r < 0)
			return r;
		if (p->lock && mlock(c->addr, c->bytes) < 0)
			return -errno;
		/* A hole punched in a THP split it: the chunk is whole again, so collapse it again. */
		if (c->thp) {
			count_kind(p, c, -1);
			c->thp = collapse(c->addr, c->bytes);
			count_kind(p, c, 1);
		}
	}
	return missing_bytes(p, c) ? -EAGAIN : 0;
}

static void count_punch(struct pool *p, uid_t uid)
{
	struct punch_count *v;

	p->punched++;
	for (size_t i = 0; i < p->npunched_uid; i++)
		if (p->punched_uid[i].uid == uid) {
			p->punched_uid[i].n++;
			return;
		}
	/* One slot per uid that ever punched: bounded by the host's users. Out of memory, only the total counts. */
	v = realloc(p->punched_uid, (p->npunched_uid + 1) * sizeof(*v));
	if (!v)
		return;
	p->punched_uid = v;
	v[p->npunched_uid++] = (struct punch_count){ uid, 1 };
}

/*
 * Check c. A punched chunk is counted and reported once until it is whole again,
 * and repaired when repair is set. Returns 0 when c was whole, 1 when it was
 * punched and is whole again, or -EIO when pages are still missing.
 */
static int chunk_check(struct pool *p, struct chunk *c, bool repair)
{
	uint64_t missing = missing_bytes(p, c);

	if (!missing) {
		c->punched = false;
		return 0;
	}
	if (!c->punched) {
		c->punched = true;
		count_punch(p, c->owner_uid);
		if (p->punch_fn)
			p->punch_fn(c, missing, p->punch_ud);
	}
	if (!repair || chunk_repair(p, c) < 0)
		return -EIO;
	c->punched = false;
	return 1;
}

/* Take c off the idle list if it is there. */
static bool idle_remove(struct pool *p, struct chunk *c)
{
	for (struct chunk **pp = &p->idle; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			idle_unlink(p, pp);
			return true;
		}
	return false;
}

void pool_put(struct pool *p, struct chunk **chunks, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct chunk *c = chunks[i];
		int r;

		if (!c)
			continue;
		p->lent_bytes -= c->bytes;
		/* A tail or tainted chunk is destroyed anyway, but checked still, so its holder's punch is counted. */
		r = chunk_check(p, c, !c->tail && !c->tainted);
		c->lease_id = 0;
		/* Another uid may still map a tainted chunk (its mremap or fork outlives a release): nobody
		 * gets its pages again, as nobody gets a tail's. */
		if (c->tainted)
			p->tainted_destroyed++;
		if (c->tail || c->tainted || r < 0) {
			p->nchunks--;
			pool_destroy(p, c);
		} else {
			idle_push(p, c);
		}
	}
}

size_t pool_audit(struct pool *p, uint64_t max_bytes)
{
	size_t found = 0, left = p->nchunks;
	uint64_t done_bytes = 0;

	/* One round at most, so a large max_bytes checks each chunk once. */
	while (p->all && left-- > 0) {
		struct chunk *c = p->audit_next ? p->audit_next : p->all;
		int r;

		p->audit_next = c->all_next;
		done_bytes += c->bytes;
		r = chunk_check(p, c, true);
		if (r != 0)
			found++;
		/* A lent chunk stays with its holder (and in the books) until it comes back. */
		if (r < 0 && idle_remove(p, c)) {
			p->nchunks--;
			pool_destroy(p, c);
		}
		if (done_bytes >= max_bytes)
			break;
	}
	return found;
}

void pool_set_punch_hook(struct pool *p, pool_punch_fn fn, void *ud)
{
	p->punch_fn = fn;
	p->punch_ud = ud;
}

uint64_t pool_punched_count(const struct pool *p)
{
	return p->punched;
}

uint64_t pool_punched_count_uid(const struct pool *p, uid_t uid)
{
	for (size_t i = 0; i < p->npunched_uid; i++)
		if (p->punched_uid[i].uid == uid)
			return p->punched_uid[i].n;
	return 0;
}

uint64_t pool_tainted_destroyed(const struct pool *p)
{
	return p->tainted_destroyed;
}

uint64_t pool_shrink(struct pool *p, uint64_t keep_bytes)
{
	uint64_t released_bytes = 0;

	/*
	 * Chunks last lent to some uid go first: only that uid can reuse them
	 * without a fresh memfd, while never-lent ones serve anybody.
	 */
	for (int pass = 0; pass < 2 && p->idle_bytes > keep_bytes; pass++) {
		struct chunk **pp = &p->idle;

		while (*pp && p->idle_bytes > keep_bytes) {
			struct chunk *c = *pp;

			if (pass == 0 && c->owner_uid == POOL_NO_OWNER) {
				pp = &c->next;
				continue;
			}
			idle_unlink(p, pp);
			released_bytes += c->bytes;
			p->nchunks--;
			pool_destroy(p, c);
		}
	}
	return released_bytes;
}

uint64_t pool_idle_bytes(const struct pool *p)
{
	return p->idle_bytes;
}

uint64_t pool_resident_bytes(const struct pool *p)
{
	return p->idle_bytes + p->lent_bytes;
}

size_t pool_chunk_count(const struct pool *p)
{
	return p->nchunks;
}

void pool_set_hooks(struct pool *p, const struct pool_hooks *h)
{
	if (h)
		p->hooks = *h;
	else
		memset(&p->hooks, 0, sizeof(p->hooks));
}

void pool_foreach_idle(const struct pool *p, void (*fn)(const struct chunk *c, void *ud), void *ud)
{
	for (const struct chunk *c = p->idle; c; c = c->next)
		fn(c, ud);
}

void pool_foreach_chunk(const struct pool *p, void (*fn)(const struct chunk *c, void *ud), void *ud)
{
	for (const struct chunk *c = p->all; c; c = c->all_next)
		fn(c, ud);
}

int pool_adopt(struct pool *p, int fd, uint64_t id, uid_t owner_uid, bool tail, bool idle, struct chunk **ret)
{
	struct statfs sfs;
	struct stat st;
	struct chunk *c;
	int seals, r;

	if (fstat(fd, &st) < 0 || fstatfs(fd, &sfs) < 0)
		return -errno;
	seals = fcntl(fd, F_GET_SEALS);
	/* Only what this daemon made: a sealed memfd of whole pages. */
	if (st.st_size <= 0 || seals < 0 || (seals & CHUNK_SEALS) != CHUNK_SEALS ||
	    (uint64_t)st.st_size % PAGE_4K_BYTES != 0)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fd = fd;
	c->id = id;
	c->bytes = (uint64_t)st.st_size;
	c->owner_uid = owner_uid;
	c->tail = tail;
	c->hugetlb = sfs.f_type == HUGETLBFS_MAGIC;
	c->node = -1;
	if (!c->hugetlb) {
		c->addr = map_aligned(fd, c->bytes);
		if (!c->addr) {
			r = -errno;
			free(c);
			return r;
		}
		/*
		 * An idle chunk is (re)collapsed: quick when the last daemon made it THP already. A lent
		 * one is left as it is: a client's CUDA registration pins its pages, which no collapse moves.
		 */
		c->thp = idle && !tail && p->thp && collapse(c->addr, c->bytes);
		/* Still resident: locking only rebuilds our page tables. */
		r = p->lock ? (mlock(c->addr, c->bytes) < 0 ? -errno : 0) : prefault(c->addr, c->bytes, PAGE_4K_BYTES);
		if (r < 0) {
			munmap(c->addr, c->bytes);
			free(c);
			return r;
		}
	}
	pthread_mutex_lock(&p->id_lock);
	if (id > p->next_chunk_id)
		p->next_chunk_id = id;
	pthread_mutex_unlock(&p->id_lock);
	if (p->n_nodes > 0)
		chunk_locate(c, -1);
	p->nchunks++;
	all_link(p, c);
	count_kind(p, c, 1);
	/*
	 * Pages punched while no daemon ran: locking above refilled shmem holes, hugetlb
	 * ones are allocated here. An idle chunk that stays short is refused (the fd
	 * stays the caller's); a lent one stays marked and is dropped when it comes back.
	 */
	if (chunk_check(p, c, true) < 0 && idle) {
		all_unlink(p, c);
		count_kind(p, c, -1);
		p->nchunks--;
		if (c->addr)
			munmap(c->addr, c->bytes);
		free(c);
		return -EIO;
	}
	if (idle) {
		idle_push(p, c);
	} else {
		p->lent_bytes += c->bytes;
		*ret = c;
	}
	return 0;
}

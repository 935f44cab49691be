/* SPDX-License-Identifier: MIT */
/*
 * The pool's chunk floor: one chunk made (memfd, size, seals, placement, pre-fault or THP collapse, mlock),
 * in parallel threads for a warm-up batch, or adopted from a kept memfd; and a chunk checked for pages a
 * holder punched out, counted, reported and repaired. Calls the placement and pages floors only
 * (see pool-int.h); the idle pool above books what it makes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/memfd.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "pool-int.h"
#include "warmseg.h"

#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21U << 26) /* log2(2 MiB) << MFD_HUGE_SHIFT */
#endif
/* Below this a single thread faults faster than threads can be started and joined. */
#define PARALLEL_MIN_BYTES (64ull * 1024 * 1024)

static void add_signed(uint64_t *counter, int sign, uint64_t bytes)
{
	*counter = sign > 0 ? *counter + bytes : *counter - bytes;
}

/* Add (sign 1) or remove (-1) c from the page-kind and node counters; the caller holds id_lock. */
static void count_kind(struct pool *p, const struct chunk *c, int sign)
{
	uint64_t *counter = c->hugetlb ? &p->hugetlb_bytes : c->thp ? &p->thp_bytes : NULL;
	int slot = place_slot(p, c->node);

	if (counter)
		add_signed(counter, sign, c->bytes);
	if (slot >= 0) {
		add_signed(&p->node_all[slot], sign, c->bytes);
		if (c->misplaced)
			add_signed(&p->node_misplaced[slot], sign, c->bytes);
	}
}

/* The counters are shared with warm-up threads (a background warm-up books its chunks as they come): locked. */
void chunk_count_kind(struct pool *p, const struct chunk *c, int sign)
{
	pthread_mutex_lock(&p->id_lock);
	count_kind(p, c, sign);
	pthread_mutex_unlock(&p->id_lock);
}

void chunk_destroy(struct chunk *c)
{
	if (c->addr)
		munmap(c->addr, c->bytes);
	if (c->fd >= 0)
		close(c->fd);
	free(c);
}

/* Unmap and close what chunk_open made of c, leaving it empty. */
static void chunk_close(struct chunk *c, uint64_t bytes)
{
	if (c->addr)
		munmap(c->addr, bytes);
	if (c->fd >= 0)
		close(c->fd);
	c->addr = NULL;
	c->fd = -1;
	c->thp = false;
}

/*
 * One memfd of bytes with the given page kind, sealed, and (4 KiB pages) mapped and placed, but not yet
 * filled: chunk_fill does that, a segment at a time. On failure nothing is left behind.
 */
static int chunk_open(const struct pool *p, uint64_t bytes, bool hugetlb, int node, struct chunk *c)
{
	const char *name = p->memfd_name;
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
			place_prefer_thread(node);
		if (p->huge_alloc)
			r = p->huge_alloc(c->fd, bytes);
		else
			r = fallocate(c->fd, 0, 0, (off_t)bytes) < 0 ? -errno : 0;
		if (node >= 0)
			place_prefer_thread(-1);
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
		c->addr = pages_map_aligned(c->fd, bytes);
		if (!c->addr) {
			r = -errno;
			goto fail;
		}
		/*
		 * Placed before any page exists: every fault and the collapse then allocate on node, whichever
		 * warm-up thread fills which segment (the policy is the mapping's, not the thread's). A node
		 * the kernel refuses (offline, or a fixture's) places nothing; place_locate then says where
		 * the pages went.
		 */
		if (node >= 0)
			(void)place_prefer_range(c->addr, bytes, node);
		/* Fewer TLB misses where shmem THP is enabled; harmless where it is not. */
		(void)madvise(c->addr, bytes, MADV_HUGEPAGE);
	}
	c->bytes = bytes;
	c->hugetlb = hugetlb;
	return 0;

fail:
	chunk_close(c, bytes);
	return r;
}

/*
 * Fill len bytes of c's mapping at off (a warmseg segment): collapsed into THPs when thp is asked (every page
 * allocated, zeroed), else, or if that fails, faulted in. Segments of one chunk are filled by several threads
 * at once. Returns 1 when the range is THP, 0 when faulted, or -errno. A hugetlb chunk was filled by
 * chunk_open; a simulated one stays empty.
 */
static int chunk_fill(const struct chunk *c, uint64_t off, uint64_t len, bool thp, bool populate)
{
	void *a;
	int r;

	if (!c->addr || !populate)
		return 0;
	a = (char *)c->addr + off;
	if (thp && pages_collapse(a, len))
		return 1;
	r = pages_prefault(a, len, PAGE_4K_BYTES);
	return r < 0 ? r : 0;
}

/*
 * A new chunk of bytes, opened (chunk_open) but not filled: hugetlb first where the pool has it, else (huge
 * pages ran out, or were never reserved) 4 KiB pages, THP where it can, which serve as well.
 */
static int chunk_start(struct pool *p, uint64_t bytes, int node, struct chunk **ret)
{
	struct chunk *c;
	int r;

	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fd = -1;
	r = chunk_open(p, bytes, p->hugetlb, node, c);
	if (r < 0 && p->hugetlb && !p->hugetlb_required && (r == -ENOMEM || r == -ENOSPC))
		r = chunk_open(p, bytes, false, node, c);
	if (r < 0) {
		free(c);
		return r;
	}
	*ret = c;
	return 0;
}

/*
 * A filled chunk is locked, located and booked (id, page kind) for owner_uid; thp says every segment was
 * collapsed. On failure it is destroyed. Thread-safe: called from grow threads.
 */
static int chunk_finish(struct pool *p, struct chunk *c, uid_t owner_uid, bool tail, int node, bool thp)
{
	c->thp = thp && c->addr;
	if (c->addr && p->lock && mlock(c->addr, c->bytes) < 0) {
		int r = -errno;

		chunk_close(c, c->bytes);
		free(c);
		return r;
	}
	c->node = -1;
	if (p->n_nodes > 0)
		place_locate(c, node);
	c->owner_uid = owner_uid;
	c->tail = tail;
	pthread_mutex_lock(&p->id_lock);
	c->id = ++p->next_chunk_id;
	count_kind(p, c, 1);
	if (p->thp && !tail && !c->hugetlb && !c->thp)
		p->thp_failures++;
	pthread_mutex_unlock(&p->id_lock);
	return 0;
}

/*
 * A chunk being filled: its segments (warmseg) go to whichever warm-up thread is free, so in a batch of fewer
 * chunks than threads a 1 GiB chunk is faulted by many threads, not one (in a bigger batch each chunk is one
 * segment); the thread that completes its last segment finishes it (chunk_finish).
 */
struct filling {
	struct chunk *c;
	uint64_t seg_bytes;        /* warmseg_pick for the batch's threads and chunks */
	uint64_t nseg, next, done; /* segments in all, handed out, completed */
	bool want_thp;             /* collapse (a whole chunk of a THP pool) */
	bool thp;                  /* every segment so far collapsed */
	int state;                 /* 0: not open yet; 1: segments to hand out; 2: all handed out, or failed */
	int error;                 /* a segment's failure: the chunk is dropped when its last segment is done */
};

/* Shared state of one chunk_make_batch() run. */
struct maker {
	struct pool *p;
	struct chunk **out;
	const uint64_t *sizes;
	uid_t owner_uid;
	int node; /* placement, or -1 */
	size_t n;
	size_t tail_index;     /* index of the tail chunk, or n for none */
	unsigned nthreads;     /* threads filling this batch */
	struct filling *fills; /* one per chunk, NULL for a batch made one chunk per thread */

	pthread_mutex_t lock;
	pthread_cond_t cond;
	size_t next;      /* next index to open */
	size_t seg_from;  /* the chunks before it have no segment left to hand out */
	unsigned running; /* workers not yet finished */
	uint64_t done_bytes;
	int error; /* first failure; stops opening chunks (those open are completed) */
};

/* The next segment to fill: (chunk index, segment), or false when none is waiting. Under m->lock. */
static bool maker_next_segment(struct maker *m, size_t *idx, uint64_t *seg)
{
	while (m->seg_from < m->next && m->fills[m->seg_from].state == 2)
		m->seg_from++;
	for (size_t i = m->seg_from; i < m->next; i++) {
		struct filling *f = &m->fills[i];

		if (f->state == 1) {
			*idx = i;
			*seg = f->next++;
			if (f->next == f->nseg)
				f->state = 2;
			return true;
		}
	}
	return false;
}

/* Fill segment seg of chunk i, and finish the chunk if that was its last one. */
static void maker_fill(struct maker *m, size_t i, uint64_t seg)
{
	struct filling *f = &m->fills[i];
	uint64_t off = 0, len = 0;
	bool last;
	int r;

	(void)warmseg_get(f->c->bytes, f->seg_bytes, seg, &off, &len);
	r = chunk_fill(f->c, off, len, f->want_thp, !m->p->simulate);

	pthread_mutex_lock(&m->lock);
	if (r < 0 && f->error == 0)
		f->error = r;
	if (r != 1)
		f->thp = false;
	last = ++f->done == f->nseg;
	if (r >= 0)
		m->done_bytes += len;
	pthread_mutex_unlock(&m->lock);
	if (!last)
		return;
	/* The last segment's thread alone touches f from here: every other one is done with it. */
	r = f->error;
	if (r < 0) {
		chunk_close(f->c, f->c->bytes);
		free(f->c);
	} else {
		r = chunk_finish(m->p, f->c, m->owner_uid, i == m->tail_index, m->node, f->want_thp && f->thp);
	}
	pthread_mutex_lock(&m->lock);
	if (r == 0)
		m->out[i] = f->c;
	else if (m->error == 0)
		m->error = r;
	f->c = NULL;
	pthread_cond_signal(&m->cond);
	pthread_mutex_unlock(&m->lock);
}

static void *maker_thread(void *arg)
{
	struct maker *m = arg;

	for (;;) {
		struct chunk *c = NULL;
		uint64_t seg;
		size_t i;
		int r;

		pthread_mutex_lock(&m->lock);
		/* Segments of chunks already open first: chunks complete (and can be lent) in order. */
		if (maker_next_segment(m, &i, &seg)) {
			pthread_mutex_unlock(&m->lock);
			maker_fill(m, i, seg);
			continue;
		}
		if (m->error < 0 || m->next >= m->n) {
			m->running--;
			pthread_cond_signal(&m->cond);
			pthread_mutex_unlock(&m->lock);
			return NULL;
		}
		i = m->next++;
		pthread_mutex_unlock(&m->lock);

		r = chunk_start(m->p, m->sizes[i], m->node, &c);

		pthread_mutex_lock(&m->lock);
		if (r < 0) {
			m->fills[i].state = 2;
			if (m->error == 0)
				m->error = r;
		} else {
			struct filling *f = &m->fills[i];

			f->c = c;
			f->seg_bytes = warmseg_pick(c->bytes, m->nthreads, m->n);
			f->nseg = c->addr && !m->p->simulate ? warmseg_count(c->bytes, f->seg_bytes) : 1;
			/* A tail is not collapsed: it is no whole class of THPs. */
			f->want_thp = m->p->thp && i != m->tail_index && c->addr;
			f->thp = true;
			f->state = 1;
		}
		pthread_cond_broadcast(&m->cond);
		pthread_mutex_unlock(&m->lock);
	}
}

/*
 * Make n chunks of sizes[i] into out[i] (NULL where not made), in parallel for
 * large batches. Returns 0 or the first error; made chunks stay in out.
 */
int chunk_make_batch(struct pool *p, const uint64_t *sizes, size_t n, size_t tail_index, uid_t owner_uid, int node,
		     struct chunk **out, void (*progress)(uint64_t, uint64_t, void *), void *ud)
{
	struct maker m = {
		.p = p,
		.out = out,
		.sizes = sizes,
		.owner_uid = owner_uid,
		.node = p->n_nodes == 0 ? -1 : node,
		.n = n,
		.tail_index = tail_index,
	};
	pthread_t tids[MAX_THREADS];
	uint64_t total_bytes = 0;
	unsigned nthreads, started = 0;

	for (size_t i = 0; i < n; i++) {
		out[i] = NULL;
		total_bytes += sizes[i];
	}
	m.fills = calloc(n ? n : 1, sizeof(*m.fills));
	if (!m.fills)
		return -ENOMEM;
	nthreads = total_bytes < PARALLEL_MIN_BYTES ? 1 : p->threads;
	/* More threads than segments would have nothing to do. */
	if (nthreads > total_bytes / WARMSEG_DEFAULT_BYTES + n)
		nthreads = (unsigned)(total_bytes / WARMSEG_DEFAULT_BYTES + n);
	m.nthreads = nthreads;
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
	free(m.fills);
	return m.error;
}

static int cmp_chunk_addr(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t)(*(struct chunk *const *)a)->addr, y = (uintptr_t)(*(struct chunk *const *)b)->addr;

	return x < y ? -1 : x > y;
}

/*
 * madvise(MADV_COLLAPSE) answering 0 is not the last word: after a warm-up batch (pool_grow_on) is made, one
 * read of /proc/self/smaps says how much of each collapsed chunk's VMA the kernel maps with PMDs
 * (ShmemPmdMapped). A collapsed chunk that is not whole huge pages counts as 4 KiB pages (and as a THP
 * failure). One read per batch, not per chunk, and never for an acquire's fresh chunks: smaps walks every
 * VMA of the daemon. Without a readable smaps the collapse's answer stands.
 */
void chunk_verify_collapsed(struct pool *p, struct chunk **v, size_t n)
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
	buf = pages_read_smaps(&len);
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
		(void)pages_prefault(c->addr, c->bytes, PAGE_4K_BYTES);
	}
out:
	free(buf);
	free(pmd);
	free(starts);
	free(thp);
}

int chunk_adopt(struct pool *p, int fd, uint64_t id, uid_t owner_uid, bool tail, bool idle, struct chunk **ret)
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
		c->addr = pages_map_aligned(fd, c->bytes);
		if (!c->addr) {
			r = -errno;
			free(c);
			return r;
		}
		/*
		 * An idle chunk is (re)collapsed: quick when the last daemon made it THP already. A lent
		 * one is left as it is: a client's CUDA registration pins its pages, which no collapse moves.
		 */
		c->thp = idle && !tail && p->thp && pages_collapse(c->addr, c->bytes);
		/* Still resident: locking only rebuilds our page tables. */
		r = p->lock       ? (mlock(c->addr, c->bytes) < 0 ? -errno : 0)
		    : p->simulate ? 0
				  : pages_prefault(c->addr, c->bytes, PAGE_4K_BYTES);
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
		place_locate(c, -1);
	*ret = c;
	return 0;
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
		return pages_unmapped(&p->pagemap_fd, c->addr, c->bytes);
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
		r = pages_prefault(c->addr, c->bytes, PAGE_4K_BYTES);
		if (r < 0)
			return r;
		if (p->lock && mlock(c->addr, c->bytes) < 0)
			return -errno;
		/* A hole punched in a THP split it: the chunk is whole again, so collapse it again. */
		if (c->thp) {
			chunk_count_kind(p, c, -1);
			c->thp = pages_collapse(c->addr, c->bytes);
			chunk_count_kind(p, c, 1);
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
int chunk_check(struct pool *p, struct chunk *c, bool repair)
{
	/* A simulated chunk was never populated: every page is "missing" and none is to be put back. */
	uint64_t missing = p->simulate ? 0 : missing_bytes(p, c);

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

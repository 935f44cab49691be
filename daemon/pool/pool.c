/* SPDX-License-Identifier: MIT */
/*
 * The warm pool's top floor, the idle pool: lends chunks to one uid at a time (take, put), grows and
 * shrinks the idle list, audits every chunk for punched pages round robin, adopts kept memfds, and keeps
 * the books (idle and lent bytes, per node, the create/destroy hooks). Chunks are made and repaired by
 * pool-chunk.c, placed by pool-place.c, paged by pool-pages.c (see pool-int.h for the floors).
 */
#define _GNU_SOURCE
#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "broker.h"
#include "lease.h"
#include "pool-int.h"
#include "tenant.h"
#include "util.h"

#define DEFAULT_CHUNK_BYTES HUGE_2M_BYTES

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
static void pool_destroy(struct pool *p, struct chunk *c)
{
	all_unlink(p, c);
	chunk_count_kind(p, c, -1);
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

int pool_new(const struct pool_opts *opts, struct pool **ret)
{
	bool have_huge = pages_huge_free(opts->proc_root) > 0;
	struct pool *p;
	cpu_set_t cpus;
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
	/* Nothing of a simulated pool is allocated: hugetlb would take its pages at creation (fallocate). */
	p->simulate = opts->simulate;
	if (p->simulate) {
		if (p->hugetlb_required) {
			free(p);
			return -ENOTSUP;
		}
		p->hugetlb = false;
	}
	p->page_bytes = p->hugetlb ? HUGE_2M_BYTES : PAGE_4K_BYTES;
	p->chunk_bytes = opts->chunk_bytes ? opts->chunk_bytes : DEFAULT_CHUNK_BYTES;
	if (p->chunk_bytes % p->page_bytes != 0 ||
	    classes_init(&p->classes, p->chunk_bytes, opts->chunk_max_bytes) < 0) {
		free(p);
		return -EINVAL;
	}
	/*
	 * THP for whole 2 MiB chunks of 4 KiB pages: the pool's own when it is not on hugetlb, and
	 * the fallback's when huge pages run out.
	 */
	if (opts->thp != POOL_THP_NO && p->chunk_bytes % HUGE_2M_BYTES == 0 && !p->simulate) {
		p->thp = pages_thp_supported();
		if (!p->thp && opts->thp == POOL_THP_YES && !p->hugetlb) {
			free(p);
			return -EOPNOTSUPP;
		}
	}
	p->lock = opts->lock && !p->simulate;
	p->huge_alloc = opts->huge_alloc;
	snprintf(p->memfd_name, sizeof(p->memfd_name), "%s", opts->memfd_name ? opts->memfd_name : POOL_MEMFD_NAME);
	p->n_nodes = opts->n_nodes < NUMA_MAX_NODES ? opts->n_nodes : NUMA_MAX_NODES;
	for (size_t i = 0; i < p->n_nodes; i++)
		p->nodes[i] = opts->nodes[i];
	/* The cores this daemon may run on (its affinity mask, a cgroup's cpuset), not the host's. */
	if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0)
		ncpu = CPU_COUNT(&cpus);
	else
		ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	p->threads = warmseg_threads(opts->threads, ncpu);
	pthread_mutex_init(&p->id_lock, NULL);
	p->pagemap_fd = -1;
	*ret = p;
	return 0;
}

void pool_free(struct pool *p)
{
	struct chunk *c, *next;

	if (!p)
		return;
	for (unsigned k = 0; k < CLASSES_MAX; k++)
		for (c = p->idle[k]; c; c = next) {
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

const struct classes *pool_classes(const struct pool *p)
{
	return &p->classes;
}

uint64_t pool_chunk_max(const struct pool *p)
{
	return classes_max(&p->classes);
}

bool pool_is_class(const struct pool *p, uint64_t bytes)
{
	return classes_index(&p->classes, bytes) >= 0;
}

uint64_t pool_chunks_for(const struct pool *p, uint64_t bytes)
{
	return classes_chunks_for(&p->classes, bytes);
}

int pool_raise_chunk_max(struct pool *p, uint64_t max_bytes)
{
	if (max_bytes < classes_max(&p->classes))
		return -EINVAL;
	/* The new classes double the old largest: every class there is stays, at the same index. */
	return classes_init(&p->classes, p->chunk_bytes, max_bytes);
}

unsigned pool_threads(const struct pool *p)
{
	return p->threads;
}

bool pool_simulated(const struct pool *p)
{
	return p->simulate;
}

uint64_t pool_idle_class_bytes(const struct pool *p, unsigned k)
{
	uint64_t bytes = 0;

	if (k >= p->classes.n)
		return 0;
	for (const struct chunk *c = p->idle[k]; c; c = c->next)
		bytes += c->bytes;
	return bytes;
}

/* A counter warm-up threads also write (under id_lock, see chunk_count_kind). */
static uint64_t locked_read(const struct pool *p, const uint64_t *v)
{
	uint64_t r;

	pthread_mutex_lock((pthread_mutex_t *)&p->id_lock);
	r = *v;
	pthread_mutex_unlock((pthread_mutex_t *)&p->id_lock);
	return r;
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
	return locked_read(p, &p->thp_bytes);
}

uint64_t pool_thp_failures(const struct pool *p)
{
	return locked_read(p, &p->thp_failures);
}

uint64_t pool_thp_unverified(const struct pool *p)
{
	return locked_read(p, &p->thp_unverified);
}

uint64_t pool_hugetlb_bytes(const struct pool *p)
{
	return locked_read(p, &p->hugetlb_bytes);
}

const char *pool_page_kind(const struct pool *p)
{
	return p->hugetlb ? "hugetlb" : pool_thp(p) ? "thp" : "4k";
}

/* c must be of a class (pool_is_class). */
static void idle_push(struct pool *p, struct chunk *c)
{
	int slot = place_slot(p, c->node);
	int k = classes_index(&p->classes, c->bytes);

	c->next = p->idle[k];
	p->idle[k] = c;
	p->idle_count[k]++;
	p->idle_bytes += c->bytes;
	if (slot >= 0)
		p->node_idle[slot] += c->bytes;
}

static void idle_unlink(struct pool *p, struct chunk **pp)
{
	struct chunk *c = *pp;
	int slot = place_slot(p, c->node);

	*pp = c->next;
	c->next = NULL;
	p->idle_count[classes_index(&p->classes, c->bytes)]--;
	p->idle_bytes -= c->bytes;
	if (slot >= 0)
		p->node_idle[slot] -= c->bytes;
}

/* Idle bytes on node. */
static uint64_t idle_bytes_on(const struct pool *p, int node)
{
	int slot = place_slot(p, node);

	return slot < 0 ? p->idle_bytes : p->node_idle[slot];
}

/* Idle bytes of class k on node (-1: any). */
static uint64_t idle_class_bytes_on(const struct pool *p, unsigned k, int node)
{
	uint64_t bytes = 0;

	for (const struct chunk *c = p->idle[k]; c; c = c->next)
		if (place_on_node(p, c, node))
			bytes += c->bytes;
	return bytes;
}

/* c was last lent to (uid, tenant), or never lent: its pages are nobody else's. */
static bool owned_by(const struct chunk *c, uid_t uid, uint64_t tenant)
{
	return c->owner_uid == POOL_NO_OWNER || (c->owner_uid == uid && c->owner_tenant == tenant);
}

/*
 * Idle chunks of class cls for (uid, tenant), up to limit: for each node of nodes[] in turn (-1: any), first
 * those last lent to that tenant, then never-lent ones. Counts them (take NULL), or unlinks them into take[]
 * (owned by the tenant now), in the same order, so a count and the take after it agree. Returns how many.
 */
static size_t idle_pick(struct pool *p, unsigned cls, uid_t uid, uint64_t tenant, const int *nodes, size_t nn,
			size_t limit, struct chunk **take)
{
	size_t got = 0;

	for (size_t k = 0; k < nn; k++)
		for (int pass = 0; pass < 2; pass++) {
			uid_t want = pass == 0 ? uid : POOL_NO_OWNER;
			struct chunk **pp = &p->idle[cls];

			while (*pp && got < limit) {
				struct chunk *c = *pp;

				if (c->owner_uid != want || (pass == 0 && c->owner_tenant != tenant) ||
				    !place_on_node(p, c, nodes[k])) {
					pp = &c->next;
					continue;
				}
				if (take) {
					idle_unlink(p, pp);
					c->owner_uid = uid;
					c->owner_tenant = tenant;
					take[got] = c;
				} else {
					pp = &c->next;
				}
				got++;
			}
		}
	return got;
}

int pool_grow(struct pool *p, uint64_t bytes, void (*progress)(uint64_t done, uint64_t total, void *ud), void *ud)
{
	return pool_grow_on(p, bytes, -1, progress, ud);
}

int pool_warm_plan(struct pool *p, uint64_t bytes, int node, uint64_t **sizes, size_t *nsizes)
{
	uint64_t target[CLASSES_MAX], need[CLASSES_MAX], base = p->chunk_bytes, left;
	size_t n = 0, i = 0;
	uint64_t *v;

	*sizes = NULL;
	*nsizes = 0;
	node = place_node(p, node);
	if (bytes > UINT64_MAX - classes_max(&p->classes))
		return -EINVAL;
	if (bytes <= idle_bytes_on(p, node))
		return 0;
	/*
	 * What is missing, in whole chunks of the smallest class: the pool grows by exactly that (a prewarm
	 * raised step by step ends where it was asked to). Each class, largest first, gets what it lacks of its
	 * share of bytes (classes_warm_split) as far as that fits; what a class holds beyond its share (chunks
	 * leases gave back) stays. Whatever the shares leave is made of the smallest class.
	 */
	left = (bytes - idle_bytes_on(p, node) + base - 1) / base * base;
	classes_warm_split(&p->classes, bytes, target);
	for (unsigned k = p->classes.n; k-- > 0;) {
		uint64_t have = idle_class_bytes_on(p, k, node), size = p->classes.bytes[k];

		need[k] = target[k] > have ? (target[k] - have + size - 1) / size : 0;
		if (need[k] > left / size)
			need[k] = left / size;
		left -= need[k] * size;
	}
	need[0] += left / base;
	for (unsigned k = 0; k < p->classes.n; k++)
		n += need[k];
	if (n == 0)
		return 0;
	v = malloc(n * sizeof(*v));
	if (!v)
		return -ENOMEM;
	/* Largest first: a warm-up cut short leaves the chunks big leases need most. */
	for (unsigned k = p->classes.n; k-- > 0;)
		for (uint64_t j = 0; j < need[k]; j++)
			v[i++] = p->classes.bytes[k];
	*sizes = v;
	*nsizes = n;
	return 0;
}

int pool_make_warm(struct pool *p, const uint64_t *sizes, size_t n, int node, struct chunk **out,
		   void (*progress)(uint64_t done, uint64_t total, void *ud), void *ud)
{
	int r;

	node = place_node(p, node);
	r = chunk_make_batch(p, sizes, n, n, POOL_NO_OWNER, node, out, progress, ud);
	/* Warm-up only: chunks an acquire makes trust the collapse's answer, so no acquire reads smaps. */
	if (p->thp)
		chunk_verify_collapsed(p, out, n);
	/* Not in the pool's books until pool_add_warm: a chunk still on its way counts nowhere. */
	for (size_t i = 0; i < n; i++)
		if (out[i])
			chunk_count_kind(p, out[i], -1);
	return r;
}

void pool_add_warm(struct pool *p, struct chunk *c)
{
	chunk_count_kind(p, c, 1);
	idle_push(p, c);
	p->nchunks++;
	announce(p, c);
}

void pool_drop_warm(struct chunk *c)
{
	chunk_destroy(c);
}

int pool_grow_on(struct pool *p, uint64_t bytes, int node, void (*progress)(uint64_t done, uint64_t total, void *ud),
		 void *ud)
{
	struct chunk **made = NULL;
	uint64_t *sizes = NULL;
	size_t n = 0;
	int r;

	r = pool_warm_plan(p, bytes, node, &sizes, &n);
	if (r < 0 || n == 0)
		return r;
	made = calloc(n, sizeof(*made));
	if (!made) {
		free(sizes);
		return -ENOMEM;
	}
	r = pool_make_warm(p, sizes, n, node, made, progress, ud);
	/* What was made stays, even after a failure: a partly warm pool still helps. */
	for (size_t i = 0; i < n; i++)
		if (made[i])
			pool_add_warm(p, made[i]);
	free(sizes);
	free(made);
	return r;
}

int pool_take(struct pool *p, uid_t uid, uint64_t bytes, struct chunk ***ret, size_t *n)
{
	return pool_take_on(p, uid, bytes, -1, ret, n);
}

/* Chunks made for a lease that will not have them (made before a failure): destroyed, their slots NULL. */
static void fresh_destroy(struct pool *p, struct chunk **fresh, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (fresh[i]) {
			chunk_count_kind(p, fresh[i], -1);
			chunk_destroy(fresh[i]);
			fresh[i] = NULL;
		}
}

/*
 * Destroy idle chunks of class k that a lease for (uid, tenant) on node would replace (last lent to another
 * tenant, or on another node), up to max chunks and until *freed reaches need bytes. Returns how many went.
 */
static uint64_t idle_drop_replaceable(struct pool *p, unsigned k, uid_t uid, uint64_t tenant, int node, uint64_t max,
				      uint64_t need, uint64_t *freed)
{
	struct chunk **pp = &p->idle[k];
	uint64_t n = 0;

	while (*pp && n < max && *freed < need) {
		struct chunk *c = *pp;

		if (owned_by(c, uid, tenant) && place_on_node(p, c, node)) {
			pp = &c->next;
			continue;
		}
		if (c->owner_uid == uid && c->owner_tenant != tenant)
			p->tenant_replaced_bytes += c->bytes;
		idle_unlink(p, pp);
		p->nchunks--;
		*freed += c->bytes;
		pool_destroy(p, c);
		n++;
	}
	return n;
}

/*
 * Memory ran out making the chunks a lease lacks: on hugetlb every huge page may sit in idle chunks, and the
 * pool's own idle memory is what the lease may use. Destroyed first, the chunks the commit would replace
 * anyway (of the lease's classes, last lent to another uid or on another node, up to what it makes fresh of
 * each; counted in replaced[k] so the commit destroys no more), then idle chunks of classes the lease takes
 * none of, largest first, until need bytes are freed. Returns what was freed.
 */
static uint64_t idle_release_for(struct pool *p, uid_t uid, uint64_t tenant, int node, const uint64_t *counts,
				 const uint64_t *reused, uint64_t *replaced, uint64_t need)
{
	uint64_t freed = 0;

	for (unsigned k = p->classes.n; k-- > 0 && freed < need;)
		replaced[k] += idle_drop_replaceable(p, k, uid, tenant, node, counts[k] - reused[k] - replaced[k], need,
						     &freed);
	for (unsigned k = p->classes.n; k-- > 0 && freed < need;) {
		if (counts[k])
			continue;
		while (p->idle[k] && freed < need) {
			struct chunk *c = p->idle[k];

			idle_unlink(p, &p->idle[k]);
			p->nchunks--;
			freed += c->bytes;
			pool_destroy(p, c);
		}
	}
	return freed;
}

/*
 * Take counts[k] chunks of each class and a tail of tail_bytes (0: none) for (uid, tenant) on node: idle ones
 * where there are, each fresh chunk replacing an idle one of its class (another uid's, or on another node).
 */
static int take_split(struct pool *p, uid_t uid, uint64_t tenant, const uint64_t *counts, uint64_t tail_bytes, int node,
		      struct chunk ***ret, size_t *n)
{
	uint64_t reused[CLASSES_MAX], replaced[CLASSES_MAX] = { 0 };
	uint64_t short_bytes = 0, nall = tail_bytes ? 1 : 0;
	size_t nreused = 0, nfresh, ntotal, f = 0;
	struct chunk **v = NULL, **fresh = NULL;
	uint64_t *sizes = NULL;
	int from[NUMA_MAX_NODES];
	size_t nfrom;
	int r;

	node = place_node(p, node);
	for (unsigned k = 0; k < p->classes.n; k++)
		nall += counts[k];
	if (nall == 0 || nall > SIZE_MAX / sizeof(*v) - 1 || tail_bytes >= p->chunk_bytes ||
	    tail_bytes % p->page_bytes != 0)
		return -EINVAL;
	ntotal = (size_t)nall;
	v = calloc(ntotal, sizeof(*v));
	if (!v)
		return -ENOMEM;

	/*
	 * Count what each class's idle list can give without copying anyone's pages:
	 * first chunks this uid had before, then never-lent ones. Nothing is
	 * unlinked until every new chunk exists, so a failure changes nothing.
	 */
	for (unsigned k = 0; k < p->classes.n; k++) {
		reused[k] = counts[k] ? idle_pick(p, k, uid, tenant, &node, 1, (size_t)counts[k], NULL) : 0;
		short_bytes += (counts[k] - reused[k]) * p->classes.bytes[k];
	}
	nfrom = place_take_nodes(p, node, short_bytes + tail_bytes, from);
	for (unsigned k = 0; k < p->classes.n; k++) {
		if (nfrom > 1 && counts[k])
			reused[k] = idle_pick(p, k, uid, tenant, from, nfrom, (size_t)counts[k], NULL);
		nreused += reused[k];
	}

	/* An empty class is refilled by making its chunks: a lease the budget allows never fails for want of one. */
	nfresh = ntotal - nreused;
	if (nfresh > 0) {
		size_t i = 0;

		fresh = calloc(nfresh, sizeof(*fresh));
		sizes = malloc(nfresh * sizeof(*sizes));
		if (!fresh || !sizes) {
			r = -ENOMEM;
			goto fail;
		}
		for (unsigned k = p->classes.n; k-- > 0;)
			for (uint64_t j = reused[k]; j < counts[k]; j++)
				sizes[i++] = p->classes.bytes[k];
		if (tail_bytes)
			sizes[i++] = tail_bytes;
		r = chunk_make_batch(p, sizes, nfresh, tail_bytes ? nfresh - 1 : nfresh, uid, node, fresh, NULL, NULL);
		if ((r == -ENOSPC || r == -ENOMEM) &&
		    idle_release_for(p, uid, tenant, node, counts, reused, replaced, short_bytes + tail_bytes) > 0) {
			fresh_destroy(p, fresh, nfresh);
			r = chunk_make_batch(p, sizes, nfresh, tail_bytes ? nfresh - 1 : nfresh, uid, node, fresh, NULL,
					     NULL);
		}
		if (r < 0)
			goto fail;
	}

	/*
	 * Commit, largest class first and the tail last (the client maps them in this order; whole chunks
	 * first keep its THP mappings PMD-aligned): the reused chunks unlinked in preference order, then the
	 * fresh ones of the class. Each fresh chunk of a class stands in for an idle chunk of that class last
	 * lent to another uid (or, asked for a node, on another node): that one goes, so the pool holds no
	 * more than before.
	 */
	ntotal = 0;
	for (unsigned k = p->classes.n; k-- > 0;) {
		uint64_t dropped = 0;

		ntotal += idle_pick(p, k, uid, tenant, from, nfrom, (size_t)reused[k], v + ntotal);
		for (uint64_t j = reused[k]; j < counts[k]; j++)
			v[ntotal++] = fresh[f++];
		(void)idle_drop_replaceable(p, k, uid, tenant, node, counts[k] - reused[k] - replaced[k], UINT64_MAX,
					    &dropped);
	}
	if (tail_bytes)
		v[ntotal++] = fresh[f++];
	for (size_t i = 0; i < ntotal; i++)
		p->lent_bytes += v[i]->bytes;
	for (size_t i = 0; i < nfresh; i++) {
		fresh[i]->owner_tenant = tenant;
		p->nchunks++;
		announce(p, fresh[i]);
	}

	free(sizes);
	free(fresh);
	*ret = v;
	*n = ntotal;
	return 0;

fail:
	if (fresh)
		fresh_destroy(p, fresh, nfresh);
	free(sizes);
	free(fresh);
	free(v);
	return r;
}

/*
 * pool_take_on, or with warm, from the idle pool alone: idle chunks of any class (smaller ones standing in for
 * bigger ones that are not there), each fresh chunk replacing an idle one of its class, and a fresh tail;
 * -EBUSY when the idle chunks cannot cover bytes.
 */
static int take(struct pool *p, uid_t uid, uint64_t tenant, uint64_t bytes, int node, bool warm, struct chunk ***ret,
		size_t *n)
{
	uint64_t counts[CLASSES_MAX], tail_bytes;

	if (bytes == 0 || bytes % p->page_bytes != 0)
		return -EINVAL;
	if (!warm)
		(void)classes_split(&p->classes, bytes, counts, &tail_bytes);
	else if (classes_split_avail(&p->classes, bytes, p->idle_count, counts, &tail_bytes) == 0)
		return -EBUSY;
	return take_split(p, uid, tenant, counts, tail_bytes, node, ret, n);
}

int pool_take_on(struct pool *p, uid_t uid, uint64_t bytes, int node, struct chunk ***ret, size_t *n)
{
	return take(p, uid, TENANT_NONE, bytes, node, false, ret, n);
}

int pool_take_warm_on(struct pool *p, uid_t uid, uint64_t bytes, int node, struct chunk ***ret, size_t *n)
{
	return take(p, uid, TENANT_NONE, bytes, node, true, ret, n);
}

int pool_take_tenant(struct pool *p, uid_t uid, uint64_t tenant, bool warm, uint64_t bytes, int node,
		     struct chunk ***ret, size_t *n)
{
	return take(p, uid, tenant, bytes, node, warm, ret, n);
}

int pool_take_split(struct pool *p, uid_t uid, uint64_t tenant, const uint64_t counts[CLASSES_MAX], uint64_t tail_bytes,
		    int node, struct chunk ***ret, size_t *n)
{
	return take_split(p, uid, tenant, counts, tail_bytes, node, ret, n);
}

void pool_view(const struct pool *p, struct pool_view *v)
{
	static uint64_t host_page_bytes;

	if (!host_page_bytes)
		host_page_bytes = (uint64_t)sysconf(_SC_PAGESIZE);
	v->page_bytes = p->page_bytes;
	v->host_page_bytes = host_page_bytes;
	v->classes = &p->classes;
	v->idle_bytes = p->idle_bytes;
	memcpy(v->idle_chunks, p->idle_count, sizeof(v->idle_chunks));
	v->resident_bytes = p->idle_bytes + p->lent_bytes;
	v->chunks = p->nchunks;
	v->nodes = p->nodes;
	v->n_nodes = p->n_nodes;
}

/* Take c off the idle list if it is there. */
static bool idle_remove(struct pool *p, struct chunk *c)
{
	int k = classes_index(&p->classes, c->bytes);

	if (c->tail || k < 0)
		return false;
	for (struct chunk **pp = &p->idle[k]; *pp; pp = &(*pp)->next)
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
		/*
		 * A tail, tainted or retired chunk is destroyed anyway, but checked still, so its holder's punch is
		 * counted.
		 */
		r = chunk_check(p, c, !c->tail && !c->tainted && !c->retired);
		c->lease_id = 0;
		/* Another uid may still map a tainted chunk (its mremap or fork outlives a release): nobody
		 * gets its pages again, as nobody gets a tail's. */
		if (c->tainted)
			p->tainted_destroyed++;
		else if (c->retired && !c->tail)
			p->retired_bytes += c->bytes;
		/* A chunk of no class (an earlier instance's, lent when it stopped) serves no later lease. */
		if (c->tail || c->tainted || c->retired || r < 0 || !pool_is_class(p, c->bytes)) {
			p->nchunks--;
			pool_destroy(p, c);
		} else {
			idle_push(p, c);
		}
	}
}

void pool_lease_chunk(struct chunk *c, struct lease_chunk *ret)
{
	*ret = (struct lease_chunk){
		.mem = c,
		.id = c->id,
		.bytes = c->bytes,
		.node = c->node,
		.mixed = c->mixed,
		.tail = c->tail,
	};
}

void pool_put_lease(struct pool *p, const struct lease_chunk *chunks, size_t n, bool retire)
{
	for (size_t i = 0; i < n; i++) {
		struct chunk *c = chunks[i].mem;

		if (!c)
			continue;
		c->tainted = c->tainted || chunks[i].tainted;
		c->retired = c->retired || retire;
		pool_put(p, &c, 1);
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

uint64_t pool_tainted_destroyed(const struct pool *p)
{
	return p->tainted_destroyed;
}

void pool_tenant_bytes(const struct pool *p, struct pool_tenant_bytes *ret)
{
	ret->replaced = p->tenant_replaced_bytes;
	ret->retired = p->retired_bytes;
}

/*
 * Destroy idle chunks of pass's kind (0: last lent to some uid; 1: never lent) while idle bytes are above
 * keep_bytes: the largest class first, of chunks no bigger than the excess (fit), or, smallest class first,
 * any chunk (!fit) to take the last bit off. Returns bytes released.
 */
static uint64_t shrink_pass(struct pool *p, uint64_t keep_bytes, int pass, bool fit)
{
	uint64_t released_bytes = 0;

	for (unsigned i = 0; i < p->classes.n && p->idle_bytes > keep_bytes; i++) {
		unsigned k = fit ? p->classes.n - 1 - i : i;
		struct chunk **pp = &p->idle[k];

		if (fit && p->classes.bytes[k] > p->idle_bytes - keep_bytes)
			continue;
		while (*pp && p->idle_bytes > keep_bytes) {
			struct chunk *c = *pp;

			if ((pass == 0 && c->owner_uid == POOL_NO_OWNER) ||
			    (fit && c->bytes > p->idle_bytes - keep_bytes)) {
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

uint64_t pool_shrink(struct pool *p, uint64_t keep_bytes)
{
	uint64_t released_bytes = 0;

	/*
	 * Chunks last lent to some uid go first: only that uid can reuse them
	 * without a fresh memfd, while never-lent ones serve anybody. Chunks that
	 * fit the excess go before one that would take the pool below keep_bytes
	 * (a 1 GiB chunk for a 2 MiB excess).
	 */
	for (int fit = 1; fit >= 0; fit--)
		for (int pass = 0; pass < 2; pass++)
			released_bytes += shrink_pass(p, keep_bytes, pass, fit);
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

size_t pool_trim_chunks(struct pool *p, size_t max_chunks)
{
	size_t destroyed = 0;

	for (unsigned k = 0; k < p->classes.n && p->nchunks > max_chunks; k++)
		while (p->idle[k] && p->nchunks > max_chunks) {
			struct chunk *c = p->idle[k];

			idle_unlink(p, &p->idle[k]);
			p->nchunks--;
			pool_destroy(p, c);
			destroyed++;
		}
	return destroyed;
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
	for (unsigned k = 0; k < CLASSES_MAX; k++)
		for (const struct chunk *c = p->idle[k]; c; c = c->next)
			fn(c, ud);
}

void pool_foreach_chunk(const struct pool *p, void (*fn)(const struct chunk *c, void *ud), void *ud)
{
	for (const struct chunk *c = p->all; c; c = c->all_next)
		fn(c, ud);
}

int pool_adopt(struct pool *p, int fd, uint64_t id, uid_t owner_uid, bool tail, bool idle, struct chunk **ret)
{
	struct chunk *c;
	int r;

	r = chunk_adopt(p, fd, id, owner_uid, tail, idle, &c);
	if (r < 0)
		return r;
	p->nchunks++;
	all_link(p, c);
	chunk_count_kind(p, c, 1);
	/*
	 * Pages punched while no daemon ran: locking in chunk_adopt refilled shmem holes, hugetlb
	 * ones are allocated here. An idle chunk that stays short is refused (the fd
	 * stays the caller's); a lent one stays marked and is dropped when it comes back.
	 */
	/* An idle chunk must be of a class to be lent again (recovery checks it too). */
	if (idle && (tail || !pool_is_class(p, c->bytes)))
		r = -EINVAL;
	else if (chunk_check(p, c, true) < 0 && idle)
		r = -EIO;
	else
		r = 0;
	if (r < 0) {
		all_unlink(p, c);
		chunk_count_kind(p, c, -1);
		p->nchunks--;
		if (c->addr)
			munmap(c->addr, c->bytes);
		free(c);
		return r;
	}
	if (idle) {
		idle_push(p, c);
	} else {
		p->lent_bytes += c->bytes;
		*ret = c;
	}
	return 0;
}

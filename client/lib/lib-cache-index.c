/* SPDX-License-Identifier: MIT */
/* libpinbroker's cache index: the cached leases in cache order and by size, so no cache verb walks every lease. */
#include "lib-int.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

/*
 * Two structures over the same cached leases, both intrusive (no allocation while caching):
 * - a list in cache order, oldest at the head: eviction takes the head, and the receiver's tick walks from the
 *   first lease not yet told idle and stops at the first one not yet old enough;
 * - a treap of sizes, keyed by (flags, priority, page size, size): one node per distinct key, the most recently
 *   cached lease of that key, the others on its dup list (newest first). The smallest lease that can serve a
 *   request is a lower-bound search over distinct sizes, so a cache of many leases of a few sizes (a training
 *   loop's) costs what a cache of a few leases does.
 * Counters (bytes, leases) are kept with them, so pb_cache_stats reads them in O(1).
 */

struct index_key {
	uint32_t flags;
	enum pb_priority priority;
	size_t page_size_bytes;
	size_t size_bytes;
};

static struct index_key key_of(const pb_lease *l)
{
	return (struct index_key){ .flags = l->cache_flags,
				   .priority = l->priority,
				   .page_size_bytes = l->page_size_bytes,
				   .size_bytes = l->size_bytes };
}

static int key_cmp(const struct index_key *a, const struct index_key *b)
{
	if (a->flags != b->flags)
		return a->flags < b->flags ? -1 : 1;
	if (a->priority != b->priority)
		return a->priority < b->priority ? -1 : 1;
	if (a->page_size_bytes != b->page_size_bytes)
		return a->page_size_bytes < b->page_size_bytes ? -1 : 1;
	if (a->size_bytes != b->size_bytes)
		return a->size_bytes < b->size_bytes ? -1 : 1;
	return 0;
}

static int lease_cmp(const pb_lease *a, const pb_lease *b)
{
	struct index_key ka = key_of(a), kb = key_of(b);

	return key_cmp(&ka, &kb);
}

/*
 * A treap's heap priority: a mix of the key (splitmix64's finaliser), so a lease that takes its key's node over
 * keeps the node's place in the heap.
 */
static uint64_t heap_prio(const pb_lease *l)
{
	uint64_t z = (uint64_t)l->size_bytes ^ ((uint64_t)l->page_size_bytes << 20) ^ ((uint64_t)l->cache_flags << 48) ^
		     ((uint64_t)l->priority << 56);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* n takes over old's place as its key's node; old becomes the first of its dups (n is the newest). */
static pb_lease *node_push(pb_lease *old, pb_lease *n)
{
	n->idx_left = old->idx_left;
	n->idx_right = old->idx_right;
	n->dup_prev = NULL;
	n->dup_next = old;
	n->idx_node = true;
	old->idx_left = old->idx_right = NULL;
	old->dup_prev = n;
	old->idx_node = false;
	return n;
}

static pb_lease *tree_insert(pb_lease *root, pb_lease *n)
{
	int cmp;

	if (!root) {
		n->idx_left = n->idx_right = n->dup_prev = n->dup_next = NULL;
		n->idx_node = true;
		return n;
	}
	cmp = lease_cmp(n, root);
	if (cmp == 0)
		return node_push(root, n);
	if (cmp < 0) {
		root->idx_left = tree_insert(root->idx_left, n);
		if (heap_prio(root->idx_left) > heap_prio(root)) {
			pb_lease *x = root->idx_left;

			root->idx_left = x->idx_right;
			x->idx_right = root;
			root = x;
		}
	} else {
		root->idx_right = tree_insert(root->idx_right, n);
		if (heap_prio(root->idx_right) > heap_prio(root)) {
			pb_lease *x = root->idx_right;

			root->idx_right = x->idx_left;
			x->idx_left = root;
			root = x;
		}
	}
	return root;
}

/* Joins two treaps, every key of a before every key of b. */
static pb_lease *tree_merge(pb_lease *a, pb_lease *b)
{
	if (!a)
		return b;
	if (!b)
		return a;
	if (heap_prio(a) > heap_prio(b)) {
		a->idx_right = tree_merge(a->idx_right, b);
		return a;
	}
	b->idx_left = tree_merge(a, b->idx_left);
	return b;
}

/* Takes node n (its key's node) out of the treap rooted at root: its first dup takes its place, if any. */
static pb_lease *tree_remove(pb_lease *root, pb_lease *n)
{
	int cmp;

	if (!root)
		return NULL;
	if (root == n) {
		pb_lease *d = n->dup_next, *m;

		if (d) {
			d->idx_left = n->idx_left;
			d->idx_right = n->idx_right;
			d->dup_prev = NULL;
			d->idx_node = true;
			m = d;
		} else {
			m = tree_merge(n->idx_left, n->idx_right);
		}
		n->idx_left = n->idx_right = n->dup_next = NULL;
		n->idx_node = false;
		return m;
	}
	cmp = lease_cmp(n, root);
	if (cmp < 0)
		root->idx_left = tree_remove(root->idx_left, n);
	else
		root->idx_right = tree_remove(root->idx_right, n);
	return root;
}

/* The slot of page_size_bytes in c->cache_page_leases (its log2), or -1 when it is not a power of two. */
static int page_shift(size_t page_size_bytes)
{
	if (page_size_bytes == 0 || (page_size_bytes & (page_size_bytes - 1)) != 0)
		return -1;
	return __builtin_ctzll((unsigned long long)page_size_bytes);
}

int cache_index_add_locked(pb_client *c, pb_lease *l, uint32_t flags)
{
	int k = page_shift(l->page_size_bytes);

	if (k < 0)
		return -EINVAL;
	c->cache_page_leases[k]++;
	c->cache_page_mask |= UINT64_C(1) << k;
	l->cache_flags = flags;
	l->cached_seq = ++c->cache_seq;
	l->cache_next = NULL;
	l->cache_prev = c->cache_tail;
	if (c->cache_tail)
		c->cache_tail->cache_next = l;
	else
		c->cache_head = l;
	c->cache_tail = l;
	/* The tick tells the oldest first, so what it has told is a prefix of the list and the newest joins the
	 * untold part (one pb_release told at once, tell_now, sits there too: the tick passes it by). */
	if (!c->cache_untold)
		c->cache_untold = l;
	c->cache_root = tree_insert(c->cache_root, l);
	c->cached_bytes += l->size_bytes;
	c->cached_leases++;
	return 0;
}

void cache_index_remove_locked(pb_client *c, pb_lease *l)
{
	int k = page_shift(l->page_size_bytes);

	/* Only a lease cache_index_add_locked took is removed: its page size had a slot. */
	if (k >= 0 && c->cache_page_leases[k] > 0 && --c->cache_page_leases[k] == 0)
		c->cache_page_mask &= ~(UINT64_C(1) << k);
	if (c->cache_untold == l)
		c->cache_untold = l->cache_next;
	if (l->cache_prev)
		l->cache_prev->cache_next = l->cache_next;
	else
		c->cache_head = l->cache_next;
	if (l->cache_next)
		l->cache_next->cache_prev = l->cache_prev;
	else
		c->cache_tail = l->cache_prev;
	l->cache_prev = l->cache_next = NULL;
	if (l->idx_node) {
		c->cache_root = tree_remove(c->cache_root, l);
	} else {
		/* A dup: off its key's list, the tree untouched. */
		l->dup_prev->dup_next = l->dup_next;
		if (l->dup_next)
			l->dup_next->dup_prev = l->dup_prev;
		l->dup_prev = l->dup_next = NULL;
	}
	c->cached_bytes -= l->size_bytes;
	c->cached_leases--;
}

pb_lease *cache_index_lower_bound_locked(pb_client *c, uint32_t flags, enum pb_priority prio, size_t page_size_bytes,
					 size_t need_bytes)
{
	struct index_key probe = {
		.flags = flags,
		.priority = prio,
		.page_size_bytes = page_size_bytes,
		.size_bytes = need_bytes,
	};
	pb_lease *best = NULL;

	for (pb_lease *x = c->cache_root; x;) {
		struct index_key kx = key_of(x);

		if (key_cmp(&kx, &probe) >= 0) {
			best = x;
			x = x->idx_left;
		} else {
			x = x->idx_right;
		}
	}
	if (best && (best->cache_flags != flags || best->priority != prio || best->page_size_bytes != page_size_bytes))
		return NULL;
	return best;
}

void cache_index_clear_locked(pb_client *c)
{
	c->cache_head = c->cache_tail = c->cache_untold = c->cache_root = NULL;
	c->cached_bytes = 0;
	c->cached_leases = 0;
	memset(c->cache_page_leases, 0, sizeof(c->cache_page_leases));
	c->cache_page_mask = 0;
}

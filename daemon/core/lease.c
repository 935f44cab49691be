/* SPDX-License-Identifier: MIT */
/*
 * The lease table (a hash for lookup, a list and a tree in id order for walks and cursors) and the lease state machine.
 */
#include "lease.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/*
 * Leases are allocated inside nodes so that links stay out of struct lease.
 * Each node is in three structures at once: a hash chain (lookup by id), a
 * list in id order (O(1) walks both ways) and an AVL tree keyed by id (the
 * place of an out-of-order adopted id, and lease_next_after for an id that
 * is gone, both O(log n) worst case).
 */
struct lease_node {
	struct lease lease; /* first, so a lease pointer is a node pointer */
	struct lease_node *hash_next;
	struct lease_node *token_next;   /* the token hash, while shared */
	struct lease_node *prev, *next;  /* id order */
	struct lease_node *left, *right; /* AVL tree by id */
	int height;                      /* of the subtree rooted here; a leaf is 1 */
};

struct lease_table {
	struct lease_node **buckets;
	size_t nbuckets; /* a power of two */
	size_t count;
	struct lease_node *head, *tail; /* id order */
	struct lease_node *root;        /* AVL tree */
	uint64_t last_id;               /* ids handed out are > last_id */
	size_t state_count[LEASE__STATE_MAX];
	uint64_t state_bytes[LEASE__STATE_MAX];
	struct lease_node **token_buckets; /* shared leases by token; NULL until the first share */
	size_t ntoken_buckets;             /* a power of two */
	size_t ntokens;
};

#define LEASE_BUCKETS_MIN 64

/*
 * A broken table is a daemon bug: a cycle in a chain spins the loop, a
 * freed node left reachable is a use-after-free. Abort (the unit restarts
 * and recovers from the fd store) even where NDEBUG drops assert().
 */
#define LEASE_INVARIANT(cond)    \
	do {                     \
		assert(cond);    \
		if (!(cond))     \
			abort(); \
	} while (0)

static const bool edges[LEASE__STATE_MAX][LEASE__STATE_MAX] = {
	[LEASE_ACTIVE] = { [LEASE_IDLE] = true, [LEASE_REVOKING] = true, [LEASE_FREED] = true },
	[LEASE_IDLE] = { [LEASE_ACTIVE] = true, [LEASE_REVOKING] = true, [LEASE_FREED] = true },
	/* A revoked lease never becomes ACTIVE again: the client must let go first. */
	[LEASE_REVOKING] = { [LEASE_OVERDUE] = true, [LEASE_FREED] = true },
	[LEASE_OVERDUE] = { [LEASE_FREED] = true },
	[LEASE_ORPHANED] = { [LEASE_ACTIVE] = true, [LEASE_IDLE] = true, [LEASE_FREED] = true },
	[LEASE_FREED] = { 0 },
};

static void token_unlink(struct lease_table *t, struct lease_node *n);

static struct lease_node *node_of(const struct lease *l)
{
	return (struct lease_node *)l;
}

/* Fibonacci hashing: ids are sequential, so spread them with a multiplicative hash. */
static size_t bucket_of(const struct lease_table *t, uint64_t id)
{
	return (size_t)((id * UINT64_C(0x9E3779B97F4A7C15)) >> 32) & (t->nbuckets - 1);
}

int lease_table_new(struct lease_table **ret)
{
	struct lease_table *t;

	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->nbuckets = LEASE_BUCKETS_MIN;
	t->buckets = calloc(t->nbuckets, sizeof(*t->buckets));
	if (!t->buckets) {
		free(t);
		return -ENOMEM;
	}
	*ret = t;
	return 0;
}

static void node_free(struct lease_node *n)
{
	free(n->lease.share);
	free(n->lease.attachers);
	free(n->lease.chunks);
	free(n);
}

void lease_table_free(struct lease_table *t)
{
	struct lease_node *n, *next;

	if (!t)
		return;
	for (n = t->head; n; n = next) {
		next = n->next;
		node_free(n);
	}
	free(t->buckets);
	free(t->token_buckets);
	free(t);
}

static int height(const struct lease_node *n)
{
	return n ? n->height : 0;
}

static void fix_height(struct lease_node *n)
{
	int hl = height(n->left), hr = height(n->right);

	n->height = 1 + (hl > hr ? hl : hr);
}

static struct lease_node *rotate_right(struct lease_node *n)
{
	struct lease_node *l = n->left;

	n->left = l->right;
	l->right = n;
	fix_height(n);
	fix_height(l);
	return l;
}

static struct lease_node *rotate_left(struct lease_node *n)
{
	struct lease_node *r = n->right;

	n->right = r->left;
	r->left = n;
	fix_height(n);
	fix_height(r);
	return r;
}

/* Restore the AVL property at n, whose subtrees differ in height by at most 2. Returns the subtree's new root. */
static struct lease_node *rebalance(struct lease_node *n)
{
	int bf;

	fix_height(n);
	bf = height(n->left) - height(n->right);
	if (bf > 1) {
		if (height(n->left->left) < height(n->left->right))
			n->left = rotate_left(n->left);
		return rotate_right(n);
	}
	if (bf < -1) {
		if (height(n->right->right) < height(n->right->left))
			n->right = rotate_right(n->right);
		return rotate_left(n);
	}
	return n;
}

/* Recursion depth is the tree height, at most 1.44 log2(n): under 50 for any table that fits in memory. */
static struct lease_node *tree_insert(struct lease_node *root, struct lease_node *n)
{
	if (!root) {
		n->left = n->right = NULL;
		n->height = 1;
		return n;
	}
	if (n->lease.id < root->lease.id)
		root->left = tree_insert(root->left, n);
	else
		root->right = tree_insert(root->right, n);
	return rebalance(root);
}

static struct lease_node *tree_remove_min(struct lease_node *root, struct lease_node **min)
{
	if (!root->left) {
		*min = root;
		return root->right;
	}
	root->left = tree_remove_min(root->left, min);
	return rebalance(root);
}

/* Remove node n (present in the tree): its place goes to its in-order successor. */
static struct lease_node *tree_remove(struct lease_node *root, struct lease_node *n)
{
	struct lease_node *succ, *right;

	LEASE_INVARIANT(root != NULL);
	if (n->lease.id < root->lease.id) {
		root->left = tree_remove(root->left, n);
		return rebalance(root);
	}
	if (n->lease.id > root->lease.id) {
		root->right = tree_remove(root->right, n);
		return rebalance(root);
	}
	LEASE_INVARIANT(root == n);
	if (!n->right)
		return n->left;
	right = tree_remove_min(n->right, &succ);
	succ->left = n->left;
	succ->right = right;
	return rebalance(succ);
}

/* The node with the largest id below id, or NULL. */
static struct lease_node *tree_below(const struct lease_table *t, uint64_t id)
{
	struct lease_node *n = t->root, *best = NULL;

	while (n) {
		if (n->lease.id < id) {
			best = n;
			n = n->right;
		} else {
			n = n->left;
		}
	}
	return best;
}

/* The node with the smallest id above id, or NULL. */
static struct lease_node *tree_above(const struct lease_table *t, uint64_t id)
{
	struct lease_node *n = t->root, *best = NULL;

	while (n) {
		if (n->lease.id > id) {
			best = n;
			n = n->left;
		} else {
			n = n->right;
		}
	}
	return best;
}

static void hash_insert(struct lease_node **buckets, size_t b, struct lease_node *n)
{
	n->hash_next = buckets[b];
	buckets[b] = n;
}

/*
 * Keep chains short: double at load factor 1, rehashing every linked node
 * once. Failure to grow only costs speed.
 */
static void maybe_grow(struct lease_table *t)
{
	struct lease_node **nb, *n;
	size_t old = t->nbuckets;

	if (t->count < t->nbuckets)
		return;
	nb = calloc(old * 2, sizeof(*nb));
	if (!nb)
		return;
	t->nbuckets = old * 2;
	for (n = t->head; n; n = n->next)
		hash_insert(nb, bucket_of(t, n->lease.id), n);
	free(t->buckets);
	t->buckets = nb;
}

/*
 * Link a node whose id is not in the table into the list, the tree and the
 * hash, then count it. The hash is filled before maybe_grow, which rehashes
 * from the list: hashing the node after a rehash would link it twice, and
 * its chain would loop onto itself.
 */
static void link_node(struct lease_table *t, struct lease_node *n)
{
	struct lease_node *after;

	/* lease_add's ids always go last; only adopted ones need the tree. */
	if (!t->tail || t->tail->lease.id < n->lease.id)
		after = t->tail;
	else
		after = tree_below(t, n->lease.id);
	n->prev = after;
	n->next = after ? after->next : t->head;
	if (n->next)
		n->next->prev = n;
	else
		t->tail = n;
	if (after)
		after->next = n;
	else
		t->head = n;
	t->root = tree_insert(t->root, n);
	hash_insert(t->buckets, bucket_of(t, n->lease.id), n);

	n->lease.table = t;
	t->count++;
	t->state_count[n->lease.state]++;
	t->state_bytes[n->lease.state] += n->lease.bytes;
	maybe_grow(t);
}

static void copy_label(struct lease *l, const char *label)
{
	size_t len;

	if (!label)
		label = "";
	len = strnlen(label, LEASE_LABEL_MAX - 1);
	memcpy(l->label, label, len);
	l->label[len] = '\0';
}

int lease_add(struct lease_table *t, uid_t uid, gid_t gid, pid_t pid, void *owner, uint64_t bytes,
	      enum lease_priority prio, const char *label, struct lease_chunk *chunks, size_t nchunks, uint64_t now_ms,
	      struct lease **ret)
{
	struct lease_node *n;

	/* UINT64_MAX would leave no id to hand out after it; a daemon never gets near. */
	if (t->last_id == UINT64_MAX)
		return -ENOSPC;
	n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->lease = (struct lease){
		.id = ++t->last_id,
		.numa_node = -1,
		.uid = uid,
		.gid = gid,
		.pid = pid,
		.owner = owner,
		.bytes = bytes,
		.charged_bytes = bytes,
		.priority = prio,
		.state = LEASE_ACTIVE,
		.created_ms = now_ms,
		.last_used_ms = now_ms,
		.chunks = chunks,
		.nchunks = nchunks,
	};
	copy_label(&n->lease, label);
	link_node(t, n);
	*ret = &n->lease;
	return 0;
}

int lease_adopt(struct lease_table *t, uint64_t id, uid_t uid, uint64_t bytes, enum lease_priority prio,
		const char *label, struct lease_chunk *chunks, size_t nchunks, uint64_t now_ms, struct lease **ret)
{
	struct lease_node *n;

	if (id == 0)
		return -EINVAL;
	if (lease_find(t, id))
		return -EEXIST;
	n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->lease = (struct lease){
		.id = id,
		.numa_node = -1,
		.uid = uid,
		.bytes = bytes,
		.charged_bytes = bytes,
		.priority = prio,
		.state = LEASE_ORPHANED,
		.created_ms = now_ms,
		.last_used_ms = now_ms,
		.chunks = chunks,
		.nchunks = nchunks,
	};
	copy_label(&n->lease, label);
	link_node(t, n);
	/* Fresh ids must never collide with an adopted one. */
	if (id > t->last_id)
		t->last_id = id;
	*ret = &n->lease;
	return 0;
}

void lease_table_set_next_id(struct lease_table *t, uint64_t id)
{
	/* Only ever raise it: lowering could hand out an id that is still live. */
	if (id > t->last_id)
		t->last_id = id;
}

struct lease *lease_find(const struct lease_table *t, uint64_t id)
{
	struct lease_node *n;

	for (n = t->buckets[bucket_of(t, id)]; n; n = n->hash_next)
		if (n->lease.id == id)
			return &n->lease;
	return NULL;
}

bool lease_edge_legal(enum lease_state from, enum lease_state to)
{
	if ((unsigned)from >= LEASE__STATE_MAX || (unsigned)to >= LEASE__STATE_MAX)
		return false;
	return edges[from][to];
}

int lease_set_state(struct lease *l, enum lease_state to, uint64_t now_ms)
{
	struct lease_table *t = l->table;

	if (!lease_edge_legal(l->state, to))
		return -EINVAL;
	if (t) {
		t->state_count[l->state]--;
		t->state_bytes[l->state] -= l->bytes;
		t->state_count[to]++;
		t->state_bytes[to] += l->bytes;
	}
	l->state = to;
	if (to == LEASE_ACTIVE)
		l->last_used_ms = now_ms;
	return 0;
}

int lease_cancel_revoke(struct lease *l, uint64_t now_ms)
{
	struct lease_table *t = l->table;

	if (!l->no_revoke || l->registration || (l->state != LEASE_REVOKING && l->state != LEASE_OVERDUE))
		return -EINVAL;
	if (t) {
		t->state_count[l->state]--;
		t->state_bytes[l->state] -= l->bytes;
		t->state_count[LEASE_ACTIVE]++;
		t->state_bytes[LEASE_ACTIVE] += l->bytes;
	}
	l->state = LEASE_ACTIVE;
	l->deadline_ms = 0;
	l->revoke_by_holder = false;
	l->last_used_ms = now_ms;
	return 0;
}

bool lease_revocable(const struct lease *l)
{
	if (l->state != LEASE_ACTIVE && l->state != LEASE_IDLE)
		return false;
	/* A holder that cannot give memory back can still give back what its library keeps cached. */
	return !l->no_revoke || (l->state == LEASE_IDLE && !l->registration);
}

void lease_remove(struct lease_table *t, struct lease *l)
{
	struct lease_node *n = node_of(l), **pp;

	LEASE_INVARIANT(l->table == t);
	if (l->share)
		token_unlink(t, n);
	for (pp = &t->buckets[bucket_of(t, l->id)]; *pp && *pp != n; pp = &(*pp)->hash_next)
		;
	/* Unlinking from the list and tree alone would leave the freed node in its chain. */
	LEASE_INVARIANT(*pp == n);
	*pp = n->hash_next;
	if (n->prev)
		n->prev->next = n->next;
	else
		t->head = n->next;
	if (n->next)
		n->next->prev = n->prev;
	else
		t->tail = n->prev;
	t->root = tree_remove(t->root, n);
	t->count--;
	t->state_count[l->state]--;
	t->state_bytes[l->state] -= l->bytes;
	node_free(n);
}

size_t lease_count(const struct lease_table *t)
{
	return t->count;
}

size_t lease_state_count(const struct lease_table *t, enum lease_state s)
{
	return (unsigned)s < LEASE__STATE_MAX ? t->state_count[s] : 0;
}

uint64_t lease_state_bytes(const struct lease_table *t, enum lease_state s)
{
	return (unsigned)s < LEASE__STATE_MAX ? t->state_bytes[s] : 0;
}

struct lease *lease_first(const struct lease_table *t)
{
	return t->head ? &t->head->lease : NULL;
}

struct lease *lease_next(const struct lease_table *t, const struct lease *l)
{
	struct lease_node *n = node_of(l)->next;

	(void)t;
	return n ? &n->lease : NULL;
}

struct lease *lease_last(const struct lease_table *t)
{
	return t->tail ? &t->tail->lease : NULL;
}

struct lease *lease_prev(const struct lease_table *t, const struct lease *l)
{
	struct lease_node *n = node_of(l)->prev;

	(void)t;
	return n ? &n->lease : NULL;
}

struct lease *lease_next_after(const struct lease_table *t, uint64_t id)
{
	struct lease *l;
	struct lease_node *n;

	if (id == 0)
		return lease_first(t);
	l = lease_find(t, id);
	if (l)
		return lease_next(t, l);
	n = tree_above(t, id);
	return n ? &n->lease : NULL;
}

/* Lower revokes sooner. Cached-idle leases cost their client nothing but a re-acquire. */
static int revoke_class(const struct lease *l)
{
	if (l->priority == LEASE_PRIO_BEST_EFFORT)
		return 0;
	if (l->state == LEASE_IDLE)
		return 1;
	if (l->priority == LEASE_PRIO_NORMAL)
		return 2;
	return 3;
}

static int revoke_cmp(const void *a, const void *b)
{
	const struct lease *x = *(struct lease *const *)a, *y = *(struct lease *const *)b;
	int cx = revoke_class(x), cy = revoke_class(y);

	if (cx != cy)
		return cx < cy ? -1 : 1;
	if (x->bytes != y->bytes)
		return x->bytes > y->bytes ? -1 : 1;
	if (x->last_used_ms != y->last_used_ms)
		return x->last_used_ms < y->last_used_ms ? -1 : 1;
	/* Ties broken by id so the order is deterministic. */
	return x->id < y->id ? -1 : x->id > y->id;
}

int lease_revoke_order(const struct lease_table *t, struct lease ***ret, size_t *n)
{
	struct lease **v;
	struct lease_node *node;
	size_t k = 0;

	/* One slot more than needed so an empty table still gets a valid pointer to free. */
	v = malloc((t->count + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (node = t->head; node; node = node->next)
		if (lease_revocable(&node->lease))
			v[k++] = &node->lease;
	qsort(v, k, sizeof(*v), revoke_cmp);
	*ret = v;
	*n = k;
	return 0;
}

/* ------------------------------------------------------------------ sharing */

/* Tokens are random: their first bytes are already a uniform hash. */
static size_t token_bucket(size_t nbuckets, const uint8_t *token)
{
	uint64_t h;

	memcpy(&h, token, sizeof(h));
	return (size_t)h & (nbuckets - 1);
}

/* Constant time, so how long a refusal takes says nothing about how close a guess came. */
static bool token_eq(const uint8_t *a, const uint8_t *b)
{
	uint8_t d = 0;

	for (size_t i = 0; i < LEASE_TOKEN_BYTES; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

/*
 * Grow the token hash at load factor 1 (or create it). Returns 0 or -ENOMEM; failing to grow a live one only costs
 * speed.
 */
static int token_grow(struct lease_table *t)
{
	size_t nb = t->ntoken_buckets ? t->ntoken_buckets * 2 : LEASE_BUCKETS_MIN;
	struct lease_node **b, *n, *next;

	if (t->token_buckets && t->ntokens < t->ntoken_buckets)
		return 0;
	b = calloc(nb, sizeof(*b));
	if (!b)
		return t->token_buckets ? 0 : -ENOMEM;
	for (size_t i = 0; i < t->ntoken_buckets; i++)
		for (n = t->token_buckets[i]; n; n = next) {
			size_t k = token_bucket(nb, n->lease.share->token);

			next = n->token_next;
			n->token_next = b[k];
			b[k] = n;
		}
	free(t->token_buckets);
	t->token_buckets = b;
	t->ntoken_buckets = nb;
	return 0;
}

static void token_unlink(struct lease_table *t, struct lease_node *n)
{
	struct lease_node **pp = &t->token_buckets[token_bucket(t->ntoken_buckets, n->lease.share->token)];

	for (; *pp && *pp != n; pp = &(*pp)->token_next)
		;
	LEASE_INVARIANT(*pp == n);
	*pp = n->token_next;
	t->ntokens--;
}

struct lease *lease_find_token(const struct lease_table *t, const uint8_t token[LEASE_TOKEN_BYTES])
{
	struct lease_node *n;

	if (!t->token_buckets)
		return NULL;
	for (n = t->token_buckets[token_bucket(t->ntoken_buckets, token)]; n; n = n->token_next)
		if (token_eq(n->lease.share->token, token))
			return &n->lease;
	return NULL;
}

static bool share_has(const struct lease_share *s, uid_t uid)
{
	for (size_t i = 0; i < s->nuids; i++)
		if (s->uids[i] == uid)
			return true;
	return false;
}

int lease_share(struct lease_table *t, struct lease *l, const uint8_t token[LEASE_TOKEN_BYTES], const uid_t *uids,
		size_t n)
{
	struct lease_share add = { .nuids = 0 }, *s = l->share;
	struct lease_node *node = node_of(l);
	size_t k;
	int r;

	if (l->table != t || !t)
		return -EINVAL;
	/* Work on a copy, so a refusal leaves the grant as it was. */
	if (s)
		add = *s;
	for (size_t i = 0; i < n; i++) {
		if (uids[i] == l->uid || share_has(&add, uids[i]))
			continue;
		if (add.nuids == LEASE_SHARE_UIDS_MAX)
			return -E2BIG;
		add.uids[add.nuids++] = uids[i];
	}
	if (s) {
		*s = add;
		return 0;
	}
	if (lease_find_token(t, token))
		return -EEXIST;
	r = token_grow(t);
	if (r < 0)
		return r;
	s = malloc(sizeof(*s));
	if (!s)
		return -ENOMEM;
	*s = add;
	memcpy(s->token, token, LEASE_TOKEN_BYTES);
	l->share = s;
	k = token_bucket(t->ntoken_buckets, s->token);
	node->token_next = t->token_buckets[k];
	t->token_buckets[k] = node;
	t->ntokens++;
	return 0;
}

bool lease_share_allows(const struct lease *l, uid_t uid)
{
	return l->share && (uid == l->uid || share_has(l->share, uid));
}

struct lease_attacher *lease_attacher_find(const struct lease *l, const void *owner)
{
	for (size_t i = 0; i < l->nattachers; i++)
		if (l->attachers[i].owner == owner)
			return &l->attachers[i];
	return NULL;
}

int lease_attach(struct lease *l, void *owner, pid_t pid, uid_t uid)
{
	struct lease_attacher *v;

	if ((l->owner && l->owner == owner) || lease_attacher_find(l, owner))
		return -EEXIST;
	v = realloc(l->attachers, (l->nattachers + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	l->attachers = v;
	v[l->nattachers++] = (struct lease_attacher){ .owner = owner, .pid = pid, .uid = uid };
	return 0;
}

int lease_detach(struct lease *l, const void *owner)
{
	struct lease_attacher *a;

	if (owner && l->owner == owner) {
		l->owner = NULL;
		l->holder_detached = true;
		return 0;
	}
	a = lease_attacher_find(l, owner);
	if (!a)
		return -ENOENT;
	/* Order does not matter: move the last entry into the hole. */
	*a = l->attachers[--l->nattachers];
	return 0;
}

bool lease_unmapped(const struct lease *l)
{
	/* An orphan waits for its holder's re-declare, not for this. */
	return l->state != LEASE_ORPHANED && !l->owner && l->nattachers == 0 && l->exit_holds == 0;
}

const char *lease_state_name(enum lease_state s)
{
	static const char *const names[LEASE__STATE_MAX] = {
		[LEASE_ACTIVE] = "active",   [LEASE_IDLE] = "idle",         [LEASE_REVOKING] = "revoking",
		[LEASE_OVERDUE] = "overdue", [LEASE_ORPHANED] = "orphaned", [LEASE_FREED] = "freed",
	};

	return (unsigned)s < LEASE__STATE_MAX ? names[s] : "unknown";
}

const char *lease_priority_name(enum lease_priority p)
{
	switch (p) {
	case LEASE_PRIO_NORMAL:
		return "normal";
	case LEASE_PRIO_CRITICAL:
		return "critical";
	case LEASE_PRIO_BEST_EFFORT:
		return "best-effort";
	}
	return "unknown";
}

/* SPDX-License-Identifier: MIT */
/* Shared-memory registrations charged once: per backing object, its registrants' page ranges (backing.h). */
#include "backing.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A power of two. Objects are few (one per shared file a program registers), so chains stay short. */
#define BACKING_BUCKETS 64u

struct backing_reg {
	uint64_t key;
	uint64_t start, end; /* [start, end) in the object, bytes */
};

struct backing_obj {
	uint64_t dev, ino;
	struct backing_reg *regs; /* in the order they came */
	size_t nregs, cap;
	struct backing_obj *next;
};

struct backing_table {
	struct backing_obj *buckets[BACKING_BUCKETS];
	size_t nobjs;
};

int backing_table_new(struct backing_table **ret)
{
	struct backing_table *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	*ret = t;
	return 0;
}

void backing_table_free(struct backing_table *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < BACKING_BUCKETS; i++)
		while (t->buckets[i]) {
			struct backing_obj *o = t->buckets[i];

			t->buckets[i] = o->next;
			free(o->regs);
			free(o);
		}
	free(t);
}

static size_t bucket_of(uint64_t dev, uint64_t ino)
{
	uint64_t h = (ino ^ (dev * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;

	return (size_t)(h >> 58) & (BACKING_BUCKETS - 1);
}

static struct backing_obj *obj_find(const struct backing_table *t, uint64_t dev, uint64_t ino)
{
	for (struct backing_obj *o = t->buckets[bucket_of(dev, ino)]; o; o = o->next)
		if (o->dev == dev && o->ino == ino)
			return o;
	return NULL;
}

/*
 * The end of the piece that starts at cur: the nearest registrant boundary past cur, at most limit. No
 * boundary lies inside a piece, so a registrant covers all of it or none of it.
 */
static uint64_t piece_end(const struct backing_obj *o, uint64_t cur, uint64_t limit)
{
	uint64_t nb = limit;

	for (size_t i = 0; i < o->nregs; i++) {
		if (o->regs[i].start > cur && o->regs[i].start < nb)
			nb = o->regs[i].start;
		if (o->regs[i].end > cur && o->regs[i].end < nb)
			nb = o->regs[i].end;
	}
	return nb;
}

/* The smallest key covering pos, skipping key skip when skipping; false when none covers it. */
static bool owner_at(const struct backing_obj *o, uint64_t pos, bool skipping, uint64_t skip, uint64_t *key)
{
	bool found = false;

	for (size_t i = 0; i < o->nregs; i++) {
		const struct backing_reg *g = &o->regs[i];

		if (skipping && g->key == skip)
			continue;
		if (g->start <= pos && pos < g->end && (!found || g->key < *key)) {
			*key = g->key;
			found = true;
		}
	}
	return found;
}

static struct backing_reg *reg_find(const struct backing_obj *o, uint64_t key)
{
	for (size_t i = 0; i < o->nregs; i++)
		if (o->regs[i].key == key)
			return &o->regs[i];
	return NULL;
}

static uint64_t obj_uncovered(const struct backing_obj *o, uint64_t start, uint64_t end)
{
	uint64_t bytes = 0, owner;

	for (uint64_t cur = start, nb; cur < end; cur = nb) {
		nb = piece_end(o, cur, end);
		if (!owner_at(o, cur, false, 0, &owner))
			bytes += nb - cur;
	}
	return bytes;
}

uint64_t backing_uncovered(const struct backing_table *t, uint64_t dev, uint64_t ino, uint64_t start, uint64_t end)
{
	const struct backing_obj *o = obj_find(t, dev, ino);

	if (start >= end)
		return 0;
	return o ? obj_uncovered(o, start, end) : end - start;
}

int backing_add(struct backing_table *t, uint64_t dev, uint64_t ino, uint64_t key, uint64_t start, uint64_t end,
		uint64_t *added, backing_move_fn *move, void *ctx)
{
	struct backing_obj *o = obj_find(t, dev, ino);
	bool made = false;
	uint64_t bytes = 0, owner;

	*added = 0;
	if (start >= end)
		return -EINVAL;
	if (!o) {
		o = calloc(1, sizeof(*o));
		if (!o)
			return -ENOMEM;
		o->dev = dev;
		o->ino = ino;
		made = true;
	} else if (reg_find(o, key)) {
		return -EEXIST;
	}
	if (o->nregs == o->cap) {
		size_t cap = o->cap ? 2 * o->cap : 4;
		struct backing_reg *regs = realloc(o->regs, cap * sizeof(*regs));

		if (!regs) {
			if (made)
				free(o);
			return -ENOMEM;
		}
		o->regs = regs;
		o->cap = cap;
	}
	/* Before it is in: each piece nobody covers is new; one covered by a younger key comes to this one. */
	for (uint64_t cur = start, nb; cur < end; cur = nb) {
		nb = piece_end(o, cur, end);
		if (!owner_at(o, cur, false, 0, &owner))
			bytes += nb - cur;
		else if (key < owner && move)
			move(ctx, owner, key, nb - cur);
	}
	o->regs[o->nregs++] = (struct backing_reg){ .key = key, .start = start, .end = end };
	if (made) {
		size_t h = bucket_of(dev, ino);

		o->next = t->buckets[h];
		t->buckets[h] = o;
		t->nobjs++;
	}
	*added = bytes;
	return 0;
}

static void obj_unlink(struct backing_table *t, struct backing_obj *o)
{
	struct backing_obj **pp = &t->buckets[bucket_of(o->dev, o->ino)];

	while (*pp != o)
		pp = &(*pp)->next;
	*pp = o->next;
	t->nobjs--;
	free(o->regs);
	free(o);
}

int backing_remove(struct backing_table *t, uint64_t dev, uint64_t ino, uint64_t key, uint64_t *uncovered,
		   backing_move_fn *move, void *ctx)
{
	struct backing_obj *o = obj_find(t, dev, ino);
	struct backing_reg *g = o ? reg_find(o, key) : NULL;
	uint64_t bytes = 0, owner, heir;

	*uncovered = 0;
	if (!g)
		return -ENOENT;
	/* Only the pieces it carries (it is their smallest key) change hands. */
	for (uint64_t cur = g->start, nb; cur < g->end; cur = nb) {
		nb = piece_end(o, cur, g->end);
		if (!owner_at(o, cur, false, 0, &owner) || owner != key)
			continue;
		if (!owner_at(o, cur, true, key, &heir))
			bytes += nb - cur;
		else if (move)
			move(ctx, key, heir, nb - cur);
	}
	/* Keep the order they came in: status lists registrants that way. */
	memmove(g, g + 1, (size_t)(o->regs + o->nregs - (g + 1)) * sizeof(*g));
	o->nregs--;
	if (o->nregs == 0)
		obj_unlink(t, o);
	*uncovered = bytes;
	return 0;
}

uint64_t backing_charged(const struct backing_table *t, uint64_t dev, uint64_t ino, uint64_t key)
{
	const struct backing_obj *o = obj_find(t, dev, ino);
	const struct backing_reg *g = o ? reg_find(o, key) : NULL;
	uint64_t bytes = 0, owner;

	if (!g)
		return 0;
	for (uint64_t cur = g->start, nb; cur < g->end; cur = nb) {
		nb = piece_end(o, cur, g->end);
		if (owner_at(o, cur, false, 0, &owner) && owner == key)
			bytes += nb - cur;
	}
	return bytes;
}

size_t backing_registrants(const struct backing_table *t, uint64_t dev, uint64_t ino)
{
	const struct backing_obj *o = obj_find(t, dev, ino);

	return o ? o->nregs : 0;
}

uint64_t backing_covered(const struct backing_table *t, uint64_t dev, uint64_t ino)
{
	const struct backing_obj *o = obj_find(t, dev, ino);
	uint64_t lo = UINT64_MAX, hi = 0;

	if (!o)
		return 0;
	for (size_t i = 0; i < o->nregs; i++) {
		lo = o->regs[i].start < lo ? o->regs[i].start : lo;
		hi = o->regs[i].end > hi ? o->regs[i].end : hi;
	}
	return (hi - lo) - obj_uncovered(o, lo, hi);
}

bool backing_registrant_at(const struct backing_table *t, uint64_t dev, uint64_t ino, size_t i, uint64_t *key)
{
	const struct backing_obj *o = obj_find(t, dev, ino);

	if (!o || i >= o->nregs)
		return false;
	*key = o->regs[i].key;
	return true;
}

size_t backing_objects(const struct backing_table *t)
{
	return t->nobjs;
}

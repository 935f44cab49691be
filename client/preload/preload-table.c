/* SPDX-License-Identifier: MIT */
/* The interposer's decisions: its table of pinned ranges, the fallback policy, and the flags it reports. */
#include "preload-table.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void pbp_table_free(struct pbp_table *t)
{
	free(t->v);
	t->v = NULL;
	t->n = t->cap = 0;
}

/* The index of the first entry whose base is >= p. */
static size_t lower_bound(const struct pbp_table *t, uintptr_t p)
{
	size_t lo = 0, hi = t->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (t->v[mid].base < p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int pbp_table_put(struct pbp_table *t, const struct pbp_entry *e)
{
	size_t i = lower_bound(t, e->base);

	if (i < t->n && t->v[i].base == e->base)
		return -EEXIST;
	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 64;
		struct pbp_entry *v = realloc(t->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		t->v = v;
		t->cap = cap;
	}
	memmove(&t->v[i + 1], &t->v[i], (t->n - i) * sizeof(*t->v));
	t->v[i] = *e;
	t->n++;
	return 0;
}

bool pbp_table_take(struct pbp_table *t, uintptr_t base, bool alloc, struct pbp_entry *out)
{
	size_t i = lower_bound(t, base);

	if (i == t->n || t->v[i].base != base || pbp_kind_is_alloc(t->v[i].kind) != alloc)
		return false;
	*out = t->v[i];
	memmove(&t->v[i], &t->v[i + 1], (t->n - i - 1) * sizeof(*t->v));
	t->n--;
	return true;
}

const struct pbp_entry *pbp_table_find(const struct pbp_table *t, uintptr_t p)
{
	size_t i = lower_bound(t, p);

	if (i < t->n && t->v[i].base == p)
		return &t->v[i];
	/* Otherwise the one starting below p, if it reaches p. */
	if (i == 0)
		return NULL;
	i--;
	return p - t->v[i].base < t->v[i].bytes ? &t->v[i] : NULL;
}

bool pbp_kind_is_alloc(enum pbp_kind k)
{
	return k == PBP_LEASE || k == PBP_CHARGED_DRIVER || k == PBP_DRIVER_ALLOC || k == PBP_PAGEABLE_ALLOC;
}

bool pbp_kind_unbrokered(enum pbp_kind k)
{
	return k == PBP_DRIVER_ALLOC || k == PBP_DRIVER_REG;
}

enum pbp_action pbp_fallback(enum pbp_policy p, unsigned flags, bool registration)
{
	unsigned needs_driver = PBP_HOST_MAPPED | (registration ? PBP_REGISTER_IOMEMORY : 0);

	switch (p) {
	case PBP_FALLBACK_ERROR:
		return PBP_DO_ERROR;
	case PBP_FALLBACK_PAGEABLE:
		return (flags & needs_driver) ? PBP_DO_DRIVER : PBP_DO_PAGEABLE;
	case PBP_FALLBACK_CUDA:
		break;
	}
	return PBP_DO_DRIVER;
}

int pbp_reported_flags(const struct pbp_entry *e)
{
	switch (e->kind) {
	case PBP_LEASE:
		/* Registered PORTABLE | DEVICEMAP whatever was asked: what cudaHostAlloc gives under UVA. */
		return (int)(e->flags | PBP_HOST_PORTABLE | PBP_HOST_MAPPED);
	case PBP_PAGEABLE_ALLOC:
	case PBP_PAGEABLE_REG:
		return -1;
	case PBP_REGISTRATION:
	case PBP_CHARGED_DRIVER:
	case PBP_DRIVER_ALLOC:
	case PBP_DRIVER_REG:
		break;
	}
	return -2;
}

size_t pbp_page_span(uintptr_t p, size_t bytes, size_t page_size)
{
	uintptr_t first = p & ~(uintptr_t)(page_size - 1);
	uintptr_t end = (p + bytes + page_size - 1) & ~(uintptr_t)(page_size - 1);

	return end - first;
}

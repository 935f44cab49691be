/* SPDX-License-Identifier: MIT */
/* The interposer's lock-free filters (see preload-filter.h): stores with release, loads with acquire. */
#include "preload-filter.h"

void pbp_span_set(struct pbp_span *s, uintptr_t lo, uintptr_t hi)
{
	if (lo >= hi) {
		lo = UINTPTR_MAX;
		hi = 0;
	}
	atomic_store_explicit(&s->lo, lo, memory_order_release);
	atomic_store_explicit(&s->hi, hi, memory_order_release);
}

bool pbp_span_may_hold(struct pbp_span *s, uintptr_t p)
{
	return p >= atomic_load_explicit(&s->lo, memory_order_acquire) &&
	       p < atomic_load_explicit(&s->hi, memory_order_acquire);
}

bool pbp_span_may_meet(struct pbp_span *s, uintptr_t p, size_t len)
{
	uintptr_t lo = atomic_load_explicit(&s->lo, memory_order_acquire);
	uintptr_t hi = atomic_load_explicit(&s->hi, memory_order_acquire);

	/* Written without p + len, which may wrap. */
	if (len == 0 || lo >= hi)
		return false;
	return p >= lo ? p < hi : lo - p < len;
}

void pbp_slots_add(struct pbp_slots *s, void *h)
{
	for (size_t i = 0; i < PBP_SLOTS; i++)
		if (!atomic_load_explicit(&s->v[i], memory_order_relaxed)) {
			/* The slot before the bound that uncovers it. */
			atomic_store_explicit(&s->v[i], h, memory_order_release);
			if (i >= atomic_load_explicit(&s->used, memory_order_relaxed))
				atomic_store_explicit(&s->used, i + 1, memory_order_release);
			return;
		}
	/* Writers are serialised: a plain increment. */
	atomic_store_explicit(&s->over, atomic_load_explicit(&s->over, memory_order_relaxed) + 1, memory_order_release);
}

void pbp_slots_remove(struct pbp_slots *s, void *h)
{
	for (size_t i = 0; i < PBP_SLOTS; i++)
		if (atomic_load_explicit(&s->v[i], memory_order_relaxed) == h) {
			atomic_store_explicit(&s->v[i], NULL, memory_order_release);
			return;
		}
	/* Not in a slot: one of the counted ones (see pbp_slots_remove's contract). */
	if (atomic_load_explicit(&s->over, memory_order_relaxed) > 0)
		atomic_store_explicit(&s->over, atomic_load_explicit(&s->over, memory_order_relaxed) - 1,
				      memory_order_release);
}

bool pbp_slots_may_hold(struct pbp_slots *s, void *h)
{
	size_t used = atomic_load_explicit(&s->used, memory_order_acquire);

	if (atomic_load_explicit(&s->over, memory_order_acquire) > 0)
		return true;
	for (size_t i = 0; i < used; i++)
		if (atomic_load_explicit(&s->v[i], memory_order_acquire) == h)
			return true;
	return false;
}

void pbp_slots_reset(struct pbp_slots *s)
{
	for (size_t i = 0; i < PBP_SLOTS; i++)
		atomic_store_explicit(&s->v[i], NULL, memory_order_relaxed);
	atomic_store_explicit(&s->used, 0, memory_order_relaxed);
	atomic_store_explicit(&s->over, 0, memory_order_relaxed);
}

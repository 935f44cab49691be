/* SPDX-License-Identifier: MIT */
/*
 * Filters the interposer's hooks read without a lock, so that calls device memory makes too (frees, allocations
 * from device pools, VMM maps, unmaps and releases) learn that a pointer, a pool or a VMM handle is none of theirs
 * and call straight through: the span of a set of addresses, and a small set of handles. Writers are serialised by
 * their caller (preload-cudapaths-state.c's lock).
 * A reader may answer "maybe" wrongly (then the caller takes its lock and looks), never "no": whatever a writer
 * stored before the program was given the pointer or handle is seen by a reader the program then calls from.
 */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* [lo, hi): empty as PBP_SPAN_EMPTY. */
struct pbp_span {
	_Atomic uintptr_t lo, hi;
};
#define PBP_SPAN_EMPTY         \
	{                      \
		UINTPTR_MAX, 0 \
	}

/*
 * Set the span to [lo, hi) (lo > hi or lo == hi: empty). Each bound is stored alone: a reader that mixes one
 * call's lo with another's hi still finds every address that lay inside both spans.
 */
void pbp_span_set(struct pbp_span *s, uintptr_t lo, uintptr_t hi);
/* Whether p may lie in the span; false means it does not. */
bool pbp_span_may_hold(struct pbp_span *s, uintptr_t p);
/* Whether [p, p + len) may meet the span (len 0: nothing); false means it does not. */
bool pbp_span_may_meet(struct pbp_span *s, uintptr_t p, size_t len);

#define PBP_SLOTS 64 /* handles kept at once: a process has a few host pools and host VMM allocations */

/*
 * A set of non-NULL handles in slots that never move (a reader's scan could miss a moved one). Past PBP_SLOTS
 * handles at once the ones that find no slot are only counted, and the set answers "maybe" to every handle until
 * they are all removed again. Zero-initialised: empty.
 */
struct pbp_slots {
	void *_Atomic v[PBP_SLOTS];
	_Atomic size_t used; /* the slots below it may be set */
	_Atomic size_t over; /* handles held that found no slot */
};

void pbp_slots_add(struct pbp_slots *s, void *h);
/*
 * Forget h, a handle added once and not yet removed (one slot cleared, or one of the counted ones): removing
 * anything else could make the count forget a handle still held, and the set say a wrong "no".
 */
void pbp_slots_remove(struct pbp_slots *s, void *h);
/* Whether h may be in the set; false means it is not. */
bool pbp_slots_may_hold(struct pbp_slots *s, void *h);
/* Empty again (a forked child). */
void pbp_slots_reset(struct pbp_slots *s);

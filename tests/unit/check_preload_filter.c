/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the interposer's lock-free filters: an address span (an address in it, a range meeting it) and a
 * set of handles in fixed slots, past which handles are counted. Past PBP_SLOTS live handles a model of the interposer
 * (its own table behind the lock) checks every answer after every add and remove, and that the filter's "no" comes
 * back without the lock once the handles that found no slot are gone.
 */
#include <check.h>
#include <stdbool.h>
#include <stdint.h>

#include "check_main.h"
#include "preload-filter.h"

START_TEST(test_an_empty_span_holds_nothing)
{
	struct pbp_span s = PBP_SPAN_EMPTY;

	ck_assert(!pbp_span_may_hold(&s, 0));
	ck_assert(!pbp_span_may_hold(&s, 0x10000));
	ck_assert(!pbp_span_may_hold(&s, UINTPTR_MAX));
	pbp_span_set(&s, 0x10000, 0x10000);
	ck_assert(!pbp_span_may_hold(&s, 0x10000));
}
END_TEST

START_TEST(test_a_span_holds_its_range_only)
{
	struct pbp_span s = PBP_SPAN_EMPTY;

	pbp_span_set(&s, 0x10000, 0x30000);
	ck_assert(!pbp_span_may_hold(&s, 0xffff));
	ck_assert(pbp_span_may_hold(&s, 0x10000));
	ck_assert(pbp_span_may_hold(&s, 0x2ffff));
	ck_assert(!pbp_span_may_hold(&s, 0x30000));
	/* Emptied again (the last allocation freed). */
	pbp_span_set(&s, 0, 0);
	ck_assert(!pbp_span_may_hold(&s, 0x10000));
}
END_TEST

/* An unmap of [p, p + len) meets the span of live mappings when the two overlap at all. */
START_TEST(test_a_range_meets_a_span_it_overlaps)
{
	struct pbp_span s = PBP_SPAN_EMPTY;

	ck_assert(!pbp_span_may_meet(&s, 0, UINTPTR_MAX));
	pbp_span_set(&s, 0x10000, 0x30000);
	ck_assert(pbp_span_may_meet(&s, 0x20000, 0x1000));
	/* Starting below it and reaching in; covering it whole. */
	ck_assert(pbp_span_may_meet(&s, 0xf000, 0x1001));
	ck_assert(pbp_span_may_meet(&s, 0, UINTPTR_MAX));
	/* Ending where it starts; starting where it ends; empty. */
	ck_assert(!pbp_span_may_meet(&s, 0xf000, 0x1000));
	ck_assert(!pbp_span_may_meet(&s, 0x30000, 0x1000));
	ck_assert(!pbp_span_may_meet(&s, 0x20000, 0));
	/* Above it, with a length that wraps past the top of the address space. */
	ck_assert(!pbp_span_may_meet(&s, UINTPTR_MAX - 0xfff, 0x2000));
}
END_TEST

START_TEST(test_slots_hold_what_was_added_until_removed)
{
	static struct pbp_slots s;
	int a, b, c;

	ck_assert(!pbp_slots_may_hold(&s, &a));
	pbp_slots_add(&s, &a);
	pbp_slots_add(&s, &b);
	ck_assert(pbp_slots_may_hold(&s, &a));
	ck_assert(pbp_slots_may_hold(&s, &b));
	ck_assert(!pbp_slots_may_hold(&s, &c));
	/* a's slot is cleared and reused; b, in the slot after it, stays found. */
	pbp_slots_remove(&s, &a);
	ck_assert(!pbp_slots_may_hold(&s, &a));
	ck_assert(pbp_slots_may_hold(&s, &b));
	pbp_slots_add(&s, &c);
	ck_assert(pbp_slots_may_hold(&s, &c));
	ck_assert(pbp_slots_may_hold(&s, &b));
	pbp_slots_reset(&s);
	ck_assert(!pbp_slots_may_hold(&s, &b));
	ck_assert(!pbp_slots_may_hold(&s, &c));
}
END_TEST

/* Past PBP_SLOTS handles at once, an unknown handle is a "maybe": never a wrong "no". */
START_TEST(test_full_slots_answer_maybe_to_every_handle)
{
	static struct pbp_slots s;
	static char h[PBP_SLOTS + 1];
	int other;

	for (size_t i = 0; i < PBP_SLOTS + 1; i++)
		pbp_slots_add(&s, &h[i]);
	ck_assert(pbp_slots_may_hold(&s, &h[PBP_SLOTS]));
	ck_assert(pbp_slots_may_hold(&s, &other));
}
END_TEST

/*
 * The handles past PBP_SLOTS are counted: while one of them is held every handle is a "maybe", and once they are
 * all removed (in whatever order, slot holders too) the set says "no" again.
 */
START_TEST(test_full_slots_answer_no_again_once_emptied)
{
	static struct pbp_slots s;
	static char h[PBP_SLOTS + 2];
	int other;

	for (size_t i = 0; i < PBP_SLOTS + 2; i++)
		pbp_slots_add(&s, &h[i]);
	/* A slot holder goes, then one of the counted: one counted is still held. */
	pbp_slots_remove(&s, &h[0]);
	pbp_slots_remove(&s, &h[PBP_SLOTS + 1]);
	ck_assert(pbp_slots_may_hold(&s, &other));
	ck_assert(pbp_slots_may_hold(&s, &h[PBP_SLOTS]));
	/* A new handle takes the freed slot; the last counted one goes. */
	pbp_slots_add(&s, &other);
	pbp_slots_remove(&s, &h[PBP_SLOTS]);
	ck_assert(pbp_slots_may_hold(&s, &other));
	ck_assert(pbp_slots_may_hold(&s, &h[1]));
	ck_assert(!pbp_slots_may_hold(&s, &h[0]));
	ck_assert(!pbp_slots_may_hold(&s, &h[PBP_SLOTS]));
	for (size_t i = 1; i < PBP_SLOTS; i++)
		pbp_slots_remove(&s, &h[i]);
	pbp_slots_remove(&s, &other);
	ck_assert(!pbp_slots_may_hold(&s, &other));
	ck_assert(!pbp_slots_may_hold(&s, &h[1]));
}
END_TEST

/*
 * The interposer past PBP_SLOTS live handles (issue 27's bound, kept a constant): the filter's "maybe" sends a call
 * to the lock, where the caller's own table gives the answer; its "no" is the answer, with no lock. The model
 * below is that caller: held[] is the table the lock guards, and in_slot[] says which handles the header's
 * contract puts in a slot (one was free when it was added) and which are only counted.
 */
#define MANY (PBP_SLOTS + 36)

struct slots_model {
	struct pbp_slots s;
	char h[MANY + 8]; /* the handles: distinct addresses; the last 8 are never added */
	bool held[MANY + 8], in_slot[MANY + 8];
	size_t slotted, counted; /* held handles in a slot, and counted without one */
	size_t locked;           /* lookups of a handle not held that took the lock all the same */
};

static void model_add(struct slots_model *m, size_t i)
{
	ck_assert(!m->held[i]);
	pbp_slots_add(&m->s, &m->h[i]);
	m->held[i] = true;
	m->in_slot[i] = m->slotted < PBP_SLOTS;
	if (m->in_slot[i])
		m->slotted++;
	else
		m->counted++;
}

static void model_remove(struct slots_model *m, size_t i)
{
	ck_assert(m->held[i]);
	pbp_slots_remove(&m->s, &m->h[i]);
	m->held[i] = false;
	if (m->in_slot[i])
		m->slotted--;
	else
		m->counted--;
}

/*
 * Every handle's answer, as the interposer gives it, is right: the filter never says "no" to a held handle, and
 * while no handle is only counted it says "no" to every handle not held, so those calls never take the lock.
 */
static void model_check(struct slots_model *m, const char *when)
{
	for (size_t i = 0; i < MANY + 8; i++) {
		bool maybe = pbp_slots_may_hold(&m->s, &m->h[i]);

		if (m->held[i])
			ck_assert_msg(maybe,
				      "%s: handle %zu (%s, %zu slotted, %zu counted) is held, the filter says no", when,
				      i, m->in_slot[i] ? "in a slot" : "counted", m->slotted, m->counted);
		else if (maybe)
			m->locked++;
		if (!m->held[i] && m->counted == 0)
			ck_assert_msg(!maybe,
				      "%s: handle %zu is not held and no handle is over the slots (%zu held), "
				      "yet the filter says maybe: the lock is taken for nothing",
				      when, i, m->slotted);
	}
}

START_TEST(test_past_the_slots_every_answer_stays_right)
{
	static struct slots_model m;
	size_t locked;

	/* MANY live handles: PBP_SLOTS in slots, the rest counted. */
	for (size_t i = 0; i < MANY; i++) {
		model_add(&m, i);
		model_check(&m, "adding");
	}
	ck_assert_uint_eq(m.slotted, PBP_SLOTS);
	ck_assert_uint_eq(m.counted, MANY - PBP_SLOTS);
	/* Over the slots, a handle never added is a "maybe" (slower): the lock says no. */
	locked = m.locked;
	model_check(&m, "full");
	ck_assert_uint_eq(m.locked, locked + 8);

	/* Some go, slot holders and counted ones alike: every third, then the first counted one. */
	for (size_t i = 0; i < MANY; i += 3) {
		model_remove(&m, i);
		model_check(&m, "removing every third");
	}
	if (m.held[PBP_SLOTS])
		model_remove(&m, PBP_SLOTS);
	model_check(&m, "removing");
	ck_assert_uint_gt(m.counted, 0);

	/* Added again: the freed slots are taken first, so these are found in slots. */
	for (size_t i = 0; i < PBP_SLOTS; i += 3) {
		model_add(&m, i);
		ck_assert(m.in_slot[i]);
		model_check(&m, "re-adding");
	}
	/* And past the slots again: counted once more. */
	model_add(&m, PBP_SLOTS);
	model_check(&m, "re-adding past the slots");

	/*
	 * The extra handles go (those that found no slot): the set is back to answering from its slots alone, a
	 * handle not held is a "no" with no lock, and every slot holder is still found.
	 */
	for (size_t i = 0; i < MANY; i++)
		if (m.held[i] && !m.in_slot[i]) {
			model_remove(&m, i);
			model_check(&m, "removing the extra handles");
		}
	ck_assert_uint_eq(m.counted, 0);
	locked = m.locked;
	model_check(&m, "back within the slots");
	ck_assert_uint_eq(m.locked, locked);
	ck_assert(!pbp_slots_may_hold(&m.s, &m.h[MANY]));

	/* A slot freed now is taken by the next handle, which is found, and the answers stay lock-free. */
	for (size_t i = 0; i < MANY; i++)
		if (m.held[i]) {
			model_remove(&m, i);
			break;
		}
	model_add(&m, MANY + 1);
	ck_assert(m.in_slot[MANY + 1]);
	model_check(&m, "a freed slot reused");
	ck_assert_uint_eq(m.locked, locked);
}
END_TEST

/* Adds and removes in a random order (a fixed seed), around and far past the slots: no answer is ever wrong. */
START_TEST(test_random_adds_and_removes_past_the_slots_stay_right)
{
	static struct slots_model m;
	uint64_t x = 0x9e3779b97f4a7c15ull;
	bool over_seen = false, exact_again = false;

	for (int step = 0; step < 4000; step++) {
		size_t i;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		i = (size_t)(x % MANY);
		/* Held handles drift up past the slots in the first half, and back down to none in the second. */
		if (!m.held[i] && (step < 2000 || (x >> 32) % 4 == 0))
			model_add(&m, i);
		else if (m.held[i] && (step >= 2000 || (x >> 32) % 3 == 0))
			model_remove(&m, i);
		model_check(&m, "a random step");
		over_seen |= m.counted > 0;
		exact_again |= over_seen && step >= 2000 && m.counted == 0;
	}
	for (size_t i = 0; i < MANY; i++)
		if (m.held[i])
			model_remove(&m, i);
	model_check(&m, "all removed");
	ck_assert(over_seen && exact_again);
	for (size_t i = 0; i < MANY + 8; i++)
		ck_assert(!pbp_slots_may_hold(&m.s, &m.h[i]));
}
END_TEST

CHECK_SUITE(suite, "preload-filter", "filter", NULL, NULL, 10, test_an_empty_span_holds_nothing,
	    test_a_span_holds_its_range_only, test_a_range_meets_a_span_it_overlaps,
	    test_slots_hold_what_was_added_until_removed, test_full_slots_answer_maybe_to_every_handle,
	    test_full_slots_answer_no_again_once_emptied, test_past_the_slots_every_answer_stays_right,
	    test_random_adds_and_removes_past_the_slots_stay_right)

CHECK_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the interposer's lock-free filters: an address span (an address in it, a range meeting it) and a
 * set of handles in fixed slots, past which handles are counted.
 */
#include <check.h>
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

CHECK_SUITE(suite, "preload-filter", "filter", NULL, NULL, 10, test_an_empty_span_holds_nothing,
	    test_a_span_holds_its_range_only, test_a_range_meets_a_span_it_overlaps,
	    test_slots_hold_what_was_added_until_removed, test_full_slots_answer_maybe_to_every_handle,
	    test_full_slots_answer_no_again_once_emptied)

CHECK_MAIN(suite)

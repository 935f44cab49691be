/* SPDX-License-Identifier: MIT */
/* Unit tests for the interposer's lock-free filters: an address span and a set of handles in fixed slots. */
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

CHECK_SUITE(suite, "preload-filter", "filter", NULL, NULL, 10, test_an_empty_span_holds_nothing,
	    test_a_span_holds_its_range_only, test_slots_hold_what_was_added_until_removed,
	    test_full_slots_answer_maybe_to_every_handle)

CHECK_MAIN(suite)

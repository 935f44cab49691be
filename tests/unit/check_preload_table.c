/* SPDX-License-Identifier: MIT */
/* Unit tests for the interposer's decisions: its range table, the fallback policy, and the flags it reports. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>

#include "preload-table.h"
#include "check_main.h"

static struct pbp_entry entry(uintptr_t base, size_t bytes, enum pbp_kind kind)
{
	return (struct pbp_entry){ .base = base, .bytes = bytes, .kind = kind };
}

START_TEST(test_table_finds_exact_and_inner_pointers_and_takes_by_kind)
{
	struct pbp_table t = { 0 };
	struct pbp_entry e;

	ck_assert_int_eq(pbp_table_put(&t, &(struct pbp_entry){ .base = 0x10000, .bytes = 0x2000, .kind = PBP_LEASE }),
			 0);
	e = entry(0x40000, 0x1000, PBP_REGISTRATION);
	ck_assert_int_eq(pbp_table_put(&t, &e), 0);
	e = entry(0x20000, 0x1000, PBP_DRIVER_ALLOC);
	ck_assert_int_eq(pbp_table_put(&t, &e), 0);
	ck_assert_int_eq(pbp_table_put(&t, &e), -EEXIST);
	ck_assert_uint_eq(t.n, 3);
	/* Sorted, so inner pointers find their range and gaps find none. */
	ck_assert_uint_eq(t.v[0].base, 0x10000);
	ck_assert_uint_eq(t.v[1].base, 0x20000);
	ck_assert_ptr_eq(pbp_table_find(&t, 0x10000), &t.v[0]);
	ck_assert_ptr_eq(pbp_table_find(&t, 0x11fff), &t.v[0]);
	ck_assert_ptr_null(pbp_table_find(&t, 0x12000));
	ck_assert_ptr_null(pbp_table_find(&t, 0xffff));
	ck_assert_ptr_eq(pbp_table_find(&t, 0x40fff), &t.v[2]);
	ck_assert_ptr_null(pbp_table_find(&t, 0x41000));
	/* A free never takes a registration, an unregister never takes an allocation, an inner pointer neither. */
	ck_assert(!pbp_table_take(&t, 0x40000, true, &e));
	ck_assert(!pbp_table_take(&t, 0x10000, false, &e));
	ck_assert(!pbp_table_take(&t, 0x10001, true, &e));
	ck_assert(pbp_table_take(&t, 0x10000, true, &e));
	ck_assert_int_eq(e.kind, PBP_LEASE);
	ck_assert(pbp_table_take(&t, 0x40000, false, &e));
	ck_assert_uint_eq(t.n, 1);
	pbp_table_free(&t);
	ck_assert_uint_eq(t.n, 0);
}
END_TEST

START_TEST(test_table_grows_and_stays_sorted)
{
	struct pbp_table t = { 0 };
	struct pbp_entry e;

	/* Inserted out of order, 1000 of them: well past the first allocation of 64. */
	for (uintptr_t i = 0; i < 1000; i++) {
		e = entry(((i * 7919) % 1000 + 1) * 0x10000, 0x1000, PBP_LEASE);
		ck_assert_int_eq(pbp_table_put(&t, &e), 0);
	}
	for (size_t i = 1; i < t.n; i++)
		ck_assert_uint_lt(t.v[i - 1].base, t.v[i].base);
	for (uintptr_t i = 1; i <= 1000; i++)
		ck_assert(pbp_table_take(&t, i * 0x10000, true, &e));
	ck_assert_uint_eq(t.n, 0);
	pbp_table_free(&t);
}
END_TEST

/* PINBROKER_PRELOAD_FALLBACK's names: unset and empty mean cuda; anything else is refused, case and spaces too. */
static const struct policy_row {
	const char *text; /* NULL: unset */
	int rc;
	enum pbp_policy policy; /* when rc is 0 */
} policy_rows[] = {
	{ NULL, 0, PBP_FALLBACK_CUDA },         { "pageable", 0, PBP_FALLBACK_PAGEABLE },
	{ "error", 0, PBP_FALLBACK_ERROR },     { "", 0, PBP_FALLBACK_CUDA },
	{ "CUDA", -EINVAL, PBP_FALLBACK_CUDA }, { "cuda ", -EINVAL, PBP_FALLBACK_CUDA },
};

START_TEST(test_policy_names_parse_and_anything_else_is_refused)
{
	const struct policy_row *r = &policy_rows[_i];
	/* Anything but the expected policy, so a parse must write it. */
	enum pbp_policy p = r->policy == PBP_FALLBACK_ERROR ? PBP_FALLBACK_PAGEABLE : PBP_FALLBACK_ERROR;
	int rc = pbp_policy_parse(r->text, &p);

	ck_assert_msg(rc == r->rc, "'%s': parse gave %d, expected %d", r->text ? r->text : "(unset)", rc, r->rc);
	if (rc == 0)
		ck_assert_msg(p == r->policy, "'%s': policy %d, expected %d", r->text ? r->text : "(unset)", p,
			      r->policy);
	/* A name parsed is the name the interposer prints. */
	if (rc == 0 && r->text && r->text[0])
		ck_assert_str_eq(pbp_policy_name(p), r->text);
}
END_TEST

START_TEST(test_pageable_is_never_given_where_a_device_pointer_is_needed)
{
	ck_assert_int_eq(pbp_fallback(PBP_FALLBACK_CUDA, 0, false), PBP_DO_DRIVER);
	ck_assert_int_eq(pbp_fallback(PBP_FALLBACK_ERROR, PBP_HOST_MAPPED, false), PBP_DO_ERROR);
	ck_assert_int_eq(pbp_fallback(PBP_FALLBACK_PAGEABLE, 0, false), PBP_DO_PAGEABLE);
	ck_assert_int_eq(pbp_fallback(PBP_FALLBACK_PAGEABLE, PBP_HOST_PORTABLE | PBP_HOST_WRITECOMBINED, false),
			 PBP_DO_PAGEABLE);
	ck_assert_int_eq(pbp_fallback(PBP_FALLBACK_PAGEABLE, PBP_HOST_MAPPED, false), PBP_DO_DRIVER);
	ck_assert_int_eq(pbp_fallback(PBP_FALLBACK_PAGEABLE, PBP_HOST_MAPPED, true), PBP_DO_DRIVER);
	/* IOMEMORY is the WRITECOMBINED bit: only for registrations does it need the driver. */
	ck_assert_int_eq(pbp_fallback(PBP_FALLBACK_PAGEABLE, PBP_REGISTER_IOMEMORY, true), PBP_DO_DRIVER);
	ck_assert_int_eq(pbp_fallback(PBP_FALLBACK_PAGEABLE, PBP_REGISTER_READONLY, true), PBP_DO_PAGEABLE);
}
END_TEST

START_TEST(test_reported_flags_tell_what_the_memory_is)
{
	struct pbp_entry e = entry(0x1000, 0x1000, PBP_LEASE);

	ck_assert_int_eq(pbp_reported_flags(&e), PBP_HOST_PORTABLE | PBP_HOST_MAPPED);
	e.flags = PBP_HOST_MAPPED;
	ck_assert_int_eq(pbp_reported_flags(&e), PBP_HOST_PORTABLE | PBP_HOST_MAPPED);
	e.kind = PBP_PAGEABLE_ALLOC;
	ck_assert_int_eq(pbp_reported_flags(&e), -1);
	e.kind = PBP_CHARGED_DRIVER;
	ck_assert_int_eq(pbp_reported_flags(&e), -2);
	e.kind = PBP_DRIVER_ALLOC;
	ck_assert_int_eq(pbp_reported_flags(&e), -2);
	ck_assert(pbp_kind_unbrokered(PBP_DRIVER_ALLOC) && pbp_kind_unbrokered(PBP_DRIVER_REG));
	ck_assert(!pbp_kind_unbrokered(PBP_LEASE) && !pbp_kind_unbrokered(PBP_CHARGED_DRIVER));
	ck_assert(!pbp_kind_is_alloc(PBP_REGISTRATION) && !pbp_kind_is_alloc(PBP_PAGEABLE_REG));
}
END_TEST

START_TEST(test_page_span_covers_every_touched_page)
{
	ck_assert_uint_eq(pbp_page_span(0x1000, 1, 4096), 4096);
	ck_assert_uint_eq(pbp_page_span(0x1000, 4097, 4096), 8192);
	ck_assert_uint_eq(pbp_page_span(0x1ffc, 8, 4096), 8192);
	ck_assert_uint_eq(pbp_page_span(0, 4096, 4096), 4096);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("preload-table");

	CHECK_CASE(s, "decisions", NULL, NULL, 0, test_table_finds_exact_and_inner_pointers_and_takes_by_kind,
		   test_table_grows_and_stays_sorted, test_pageable_is_never_given_where_a_device_pointer_is_needed,
		   test_reported_flags_tell_what_the_memory_is, test_page_span_covers_every_touched_page);
	CHECK_LOOP_CASE(s, "policy-names", NULL, NULL, 0, (int)(sizeof(policy_rows) / sizeof(policy_rows[0])),
			test_policy_names_parse_and_anything_else_is_refused);
	return s;
}

CHECK_MAIN(suite)

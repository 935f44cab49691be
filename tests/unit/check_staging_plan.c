/* SPDX-License-Identifier: MIT */
/*
 * Unit: staged copies' decisions (client/lib/staging-plan.c): the settings from the environment and from
 * pb_staging_configure, whether a copy is staged given what the driver says of its pointers, and how a copy is
 * cut into slot pieces and a piece among threads. Expected values come from docs/staging.md and the plan
 * (defaults 64M ring, 16M slot, 8 threads, 1M threshold; ring at most 1G, at least 2 slots, 1..64 threads).
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "staging-copy.h"
#include "staging-plan.h"
#include "pinbroker-internal.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* A fake environment: NULL-terminated name, value pairs. */
static const char *table_get(const char *name, void *arg)
{
	const char *const *kv = arg;

	for (; kv[0]; kv += 2)
		if (strcmp(kv[0], name) == 0)
			return kv[1];
	return NULL;
}

static int from_env(struct pbst_settings *s, const char *const *kv, char *why, size_t len)
{
	return pbst_settings_from_env(s, table_get, (void *)kv, why, len);
}

START_TEST(test_defaults_are_64m_ring_16m_slot_8_threads_1m_threshold)
{
	const char *kv[] = { NULL };
	struct pbst_settings s;
	char why[256];

	ck_assert_int_eq(from_env(&s, kv, why, sizeof(why)), 0);
	ck_assert(s.enabled);
	ck_assert_uint_eq(s.ring_bytes, 64 * MiB);
	ck_assert_uint_eq(s.slot_bytes, 16 * MiB);
	ck_assert_uint_eq(s.threads, 8);
	ck_assert_uint_eq(s.threshold_bytes, 1 * MiB);
	ck_assert_uint_eq(pbst_settings_slots(&s), 4);
	ck_assert(!s.stream_h2d);
	ck_assert(s.stream_d2h);
	ck_assert_str_eq(why, "");
}
END_TEST

/*
 * PINBROKER_STAGING_STREAM_STORES names the directions that stream (d2h, h2d, both or none, or an on/off word for
 * both); anything else keeps the default (device to host only) and says so.
 */
static const struct {
	const char *value;
	bool h2d, d2h, good;
} stream_rows[] = {
	{ "d2h", false, true, true },      { "h2d", true, false, true },  { "both", true, true, true },
	{ "none", false, false, true },    { "1", true, true, true },     { "ON", true, true, true },
	{ "0", false, false, true },       { "off", false, false, true }, { "fast", false, true, false },
	{ "d2h,h2d", false, true, false },
};

START_TEST(test_stream_stores_env)
{
	const char *kv[] = { "PINBROKER_STAGING_STREAM_STORES", stream_rows[_i].value, NULL };
	struct pbst_settings s;
	char why[256];

	ck_assert_int_eq(from_env(&s, kv, why, sizeof(why)), stream_rows[_i].good ? 0 : -EINVAL);
	ck_assert_msg(s.stream_h2d == stream_rows[_i].h2d && s.stream_d2h == stream_rows[_i].d2h,
		      "%s: streams h2d %d d2h %d, want %d %d", stream_rows[_i].value, s.stream_h2d, s.stream_d2h,
		      stream_rows[_i].h2d, stream_rows[_i].d2h);
	if (!stream_rows[_i].good)
		ck_assert_msg(strstr(why, "is not d2h, h2d, both (1) or none (0); using the default d2h") != NULL,
			      "%s: why: %s", stream_rows[_i].value, why);
	else
		ck_assert_str_eq(why, "");
}
END_TEST

/* The default thread count leaves half the host's CPUs to the program: 8 at most, 1 at least. */
START_TEST(test_threads_for_cpus)
{
	ck_assert_uint_eq(pbst_threads_for_cpus(-1), 1);
	ck_assert_uint_eq(pbst_threads_for_cpus(1), 1);
	ck_assert_uint_eq(pbst_threads_for_cpus(2), 1);
	ck_assert_uint_eq(pbst_threads_for_cpus(6), 3);
	ck_assert_uint_eq(pbst_threads_for_cpus(16), 8);
	ck_assert_uint_eq(pbst_threads_for_cpus(128), 8);
}
END_TEST

START_TEST(test_env_values_are_read_as_sizes)
{
	const char *kv[] = { "PINBROKER_STAGING_RING",
			     "256M",
			     "PINBROKER_STAGING_SLOT",
			     "4MiB",
			     "PINBROKER_STAGING_THRESHOLD",
			     "65536",
			     "PINBROKER_STAGING_THREADS",
			     "16",
			     NULL };
	struct pbst_settings s;
	char why[256];

	ck_assert_int_eq(from_env(&s, kv, why, sizeof(why)), 0);
	ck_assert_uint_eq(s.ring_bytes, 256 * MiB);
	ck_assert_uint_eq(s.slot_bytes, 4 * MiB);
	ck_assert_uint_eq(s.threshold_bytes, 64 * KiB);
	ck_assert_uint_eq(s.threads, 16);
	ck_assert_uint_eq(pbst_settings_slots(&s), 64);
}
END_TEST

/*
 * One environment and what from_env makes of it: its result, the fields it must leave (0, or -1 for enabled: not
 * checked) and what the reason must say. A bad value names its variable and falls back to its default.
 */
static const struct env_case {
	const char *kv[5];
	int r;
	uint64_t ring, slot;
	unsigned threads;
	int enabled;
	const char *why[3];
} env_cases[] = {
	/* PINBROKER_STAGING=0 turns it off and 1 on. */
	{ { "PINBROKER_STAGING", "0" }, 0, 0, 0, 0, 0, { NULL } },
	{ { "PINBROKER_STAGING", "1" }, 0, 0, 0, 0, 1, { NULL } },
	{ { "PINBROKER_STAGING", "maybe" }, -EINVAL, 0, 0, 0, 1, { "PINBROKER_STAGING=maybe" } },
	{ { "PINBROKER_STAGING_RING", "lots", "PINBROKER_STAGING_THREADS", "65" },
	  -EINVAL,
	  64 * MiB,
	  0,
	  8,
	  -1,
	  { "PINBROKER_STAGING_RING=lots", "PINBROKER_STAGING_THREADS=65", "default" } },
	/* The bounds: a ring of 1 GiB at most, threads above 0, a slot of 64 KiB at least. */
	{ { "PINBROKER_STAGING_RING", "2G" }, -EINVAL, 64 * MiB, 0, 0, -1, { NULL } },
	{ { "PINBROKER_STAGING_RING", "1G" }, 0, 1 * GiB, 0, 0, -1, { NULL } },
	{ { "PINBROKER_STAGING_THREADS", "0" }, -EINVAL, 0, 0, 8, -1, { NULL } },
	{ { "PINBROKER_STAGING_THREADS", "-4" }, -EINVAL, 0, 0, 8, -1, { NULL } },
	{ { "PINBROKER_STAGING_SLOT", "32K" }, -EINVAL, 0, 16 * MiB, 0, -1, { NULL } },
	/* A ring of fewer than 2 slots takes both defaults. */
	{ { "PINBROKER_STAGING_RING", "8M", "PINBROKER_STAGING_SLOT", "8M" },
	  -EINVAL,
	  64 * MiB,
	  16 * MiB,
	  0,
	  -1,
	  { "fewer than 2 slots" } },
};

START_TEST(test_env_values_are_bounded_and_a_bad_one_falls_back_to_its_default)
{
	const struct env_case *e = &env_cases[_i];
	struct pbst_settings s;
	char why[512] = "";

	ck_assert_int_eq(from_env(&s, e->kv, why, sizeof(why)), e->r);
	if (e->ring)
		ck_assert_uint_eq(s.ring_bytes, e->ring);
	if (e->slot)
		ck_assert_uint_eq(s.slot_bytes, e->slot);
	if (e->threads)
		ck_assert_uint_eq(s.threads, e->threads);
	if (e->enabled >= 0)
		ck_assert_int_eq(s.enabled, e->enabled);
	for (int k = 0; k < 3 && e->why[k]; k++)
		ck_assert_msg(strstr(why, e->why[k]) != NULL, "%s: \"%s\" does not say %s", e->kv[0], why, e->why[k]);
}
END_TEST

START_TEST(test_configure_applies_nonzero_fields_and_keeps_the_rest)
{
	struct pb_staging_opts o = { .slot_bytes = 2 * MiB, .threads = 8 };
	struct pbst_settings s;
	char why[256];

	pbst_settings_default(&s);
	ck_assert_int_eq(pbst_settings_apply(&s, &o, why, sizeof(why)), 0);
	ck_assert_uint_eq(s.ring_bytes, 64 * MiB);
	ck_assert_uint_eq(s.slot_bytes, 2 * MiB);
	ck_assert_uint_eq(s.threads, 8);
	ck_assert_uint_eq(s.threshold_bytes, 1 * MiB);
	ck_assert_uint_eq(pbst_settings_slots(&s), 32);
}
END_TEST

START_TEST(test_configure_refuses_bad_values_and_changes_nothing)
{
	struct pb_staging_opts bad[] = {
		{ .ring_bytes = 1 * GiB + 1 },
		{ .slot_bytes = 4 * KiB },
		{ .threads = 65 },
		{ .ring_bytes = 16 * MiB, .slot_bytes = 9 * MiB },
	};
	struct pbst_settings s, before;
	char why[256];

	pbst_settings_default(&s);
	before = s;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(pbst_settings_apply(&s, &bad[i], why, sizeof(why)), -EINVAL);
		ck_assert_mem_eq(&s, &before, sizeof(s));
		ck_assert_str_ne(why, "");
	}
}
END_TEST

/* A device pointer, a pageable one, a pinned one and a managed one, as cuPointerGetAttributes fills them. */
static const struct pbst_ptr_facts DEV = { PBST_MEMTYPE_DEVICE, false }, PAGE = { PBST_MEMTYPE_UNKNOWN, false },
				   PIN = { PBST_MEMTYPE_HOST, false }, MANAGED = { PBST_MEMTYPE_DEVICE, true },
				   MANAGED_HOST = { PBST_MEMTYPE_HOST, true }, ARRAY = { PBST_MEMTYPE_ARRAY, false };

static enum pbst_verdict decide(unsigned flags, size_t bytes, struct pbst_ptr_facts dst, struct pbst_ptr_facts src,
				bool capturing)
{
	struct pbst_settings s;
	struct pbst_copy_facts f = { .flags = flags, .bytes = bytes, .dst = dst, .src = src, .capturing = capturing };

	pbst_settings_default(&s);
	return pbst_decide(&s, &f);
}

START_TEST(test_pageable_to_device_over_the_threshold_is_staged)
{
	ck_assert_int_eq(decide(PBST_H2D, 1 * MiB, DEV, PAGE, false), PBST_STAGE_H2D);
	ck_assert_int_eq(decide(PBST_D2H, 1 * MiB, PAGE, DEV, false), PBST_STAGE_D2H);
	ck_assert_int_eq(decide(PBST_H2D | PBST_SYNC, 64 * MiB + 3, DEV, PAGE, false), PBST_STAGE_H2D);
	ck_assert_int_eq(decide(PBST_D2H | PBST_PTDS, 1 * GiB, PAGE, DEV, false), PBST_STAGE_D2H);
}
END_TEST

START_TEST(test_threshold_minus_one_passes_threshold_stages)
{
	ck_assert_int_eq(decide(PBST_H2D, 1 * MiB - 1, DEV, PAGE, false), PBST_PASS_SMALL);
	ck_assert_int_eq(decide(PBST_H2D, 1 * MiB, DEV, PAGE, false), PBST_STAGE_H2D);
	ck_assert_int_eq(decide(PBST_D2H, 1, PAGE, DEV, false), PBST_PASS_SMALL);
	ck_assert_int_eq(decide(PBST_D2H, 0, PAGE, DEV, false), PBST_PASS_SMALL);
}
END_TEST

START_TEST(test_a_threshold_of_0_still_passes_0_bytes)
{
	struct pbst_settings s;
	struct pbst_copy_facts f = { .flags = PBST_H2D, .bytes = 0, .dst = DEV, .src = PAGE };

	pbst_settings_default(&s);
	s.threshold_bytes = 0;
	ck_assert_int_eq(pbst_decide(&s, &f), PBST_PASS_SMALL);
	f.bytes = 1;
	ck_assert_int_eq(pbst_decide(&s, &f), PBST_STAGE_H2D);
	ck_assert(!pbst_size_qualifies(&s, 0));
	ck_assert(pbst_size_qualifies(&s, 1));
}
END_TEST

START_TEST(test_staging_off_passes_everything)
{
	struct pbst_settings s;
	struct pbst_copy_facts f = { .flags = PBST_H2D, .bytes = 64 * MiB, .dst = DEV, .src = PAGE };

	pbst_settings_default(&s);
	s.enabled = false;
	ck_assert_int_eq(pbst_decide(&s, &f), PBST_PASS_DISABLED);
	ck_assert(!pbst_size_qualifies(&s, 64 * MiB));
}
END_TEST

START_TEST(test_pinned_or_registered_host_memory_goes_to_the_driver)
{
	ck_assert_int_eq(decide(PBST_H2D, 8 * MiB, DEV, PIN, false), PBST_PASS_NOT_PAGEABLE);
	ck_assert_int_eq(decide(PBST_D2H, 8 * MiB, PIN, DEV, false), PBST_PASS_NOT_PAGEABLE);
	ck_assert_int_eq(decide(0, 8 * MiB, DEV, PIN, false), PBST_PASS_NOT_PAGEABLE);
	ck_assert_int_eq(decide(0, 8 * MiB, PIN, DEV, false), PBST_PASS_NOT_PAGEABLE);
}
END_TEST

START_TEST(test_managed_memory_on_either_side_goes_to_the_driver)
{
	ck_assert_int_eq(decide(PBST_H2D, 8 * MiB, MANAGED, PAGE, false), PBST_PASS_MANAGED);
	ck_assert_int_eq(decide(PBST_D2H, 8 * MiB, PAGE, MANAGED, false), PBST_PASS_MANAGED);
	ck_assert_int_eq(decide(PBST_H2D, 8 * MiB, DEV, MANAGED_HOST, false), PBST_PASS_MANAGED);
	ck_assert_int_eq(decide(0, 8 * MiB, MANAGED, PAGE, false), PBST_PASS_MANAGED);
}
END_TEST

START_TEST(test_a_stream_being_captured_goes_to_the_driver)
{
	ck_assert_int_eq(decide(PBST_H2D, 8 * MiB, DEV, PAGE, true), PBST_PASS_CAPTURING);
	ck_assert_int_eq(decide(PBST_D2H, 8 * MiB, PAGE, DEV, true), PBST_PASS_CAPTURING);
	ck_assert_int_eq(decide(0, 8 * MiB, DEV, PAGE, true), PBST_PASS_CAPTURING);
}
END_TEST

START_TEST(test_unified_addressing_takes_the_direction_from_the_pointers)
{
	ck_assert_int_eq(decide(0, 8 * MiB, DEV, PAGE, false), PBST_STAGE_H2D);
	ck_assert_int_eq(decide(0, 8 * MiB, PAGE, DEV, false), PBST_STAGE_D2H);
	ck_assert_int_eq(decide(0, 8 * MiB, PAGE, PAGE, false), PBST_PASS_NOT_DEVICE);
	ck_assert_int_eq(decide(0, 8 * MiB, DEV, DEV, false), PBST_PASS_DEVICE_BOTH);
	ck_assert_int_eq(decide(0, 8 * MiB, ARRAY, PAGE, false), PBST_PASS_NOT_DEVICE);
}
END_TEST

START_TEST(test_a_direction_the_pointers_contradict_goes_to_the_driver)
{
	/* cuMemcpyHtoD whose "device" side is host memory, or whose host side is device memory. */
	ck_assert_int_eq(decide(PBST_H2D, 8 * MiB, PAGE, PAGE, false), PBST_PASS_NOT_DEVICE);
	ck_assert_int_eq(decide(PBST_H2D, 8 * MiB, PAGE, DEV, false), PBST_PASS_MISMATCH);
	ck_assert_int_eq(decide(PBST_D2H, 8 * MiB, DEV, PAGE, false), PBST_PASS_MISMATCH);
	ck_assert_int_eq(decide(PBST_H2D, 8 * MiB, DEV, DEV, false), PBST_PASS_DEVICE_BOTH);
	ck_assert_int_eq(decide(PBST_H2D | PBST_D2H, 8 * MiB, DEV, PAGE, false), PBST_PASS_MISMATCH);
	ck_assert_int_eq(decide(PBST_H2D, 8 * MiB, ARRAY, PAGE, false), PBST_PASS_NOT_DEVICE);
}
END_TEST

START_TEST(test_verdicts_have_names)
{
	for (int v = PBST_STAGE_H2D; v <= PBST_PASS_MISMATCH; v++)
		ck_assert_str_ne(pbst_verdict_name((enum pbst_verdict)v), "?");
}
END_TEST

/*
 * Pieces cover [0, bytes) back to back, slots in ring order from first_slot; each is the ramp's size (first << k)
 * until a whole slot, then whole slots, the last what is left.
 */
static void check_pieces(size_t bytes, size_t slot, unsigned nslots, unsigned first, size_t ramp_first,
			 size_t want_pieces, size_t want_last)
{
	size_t n = pbst_piece_count(bytes, slot), next = 0;

	ck_assert_uint_eq(n, want_pieces);
	for (size_t k = 0; k < n; k++) {
		struct pbst_piece p = pbst_piece_at(bytes, slot, nslots, first, k);
		size_t full = k < 3 && (ramp_first << k) < slot ? ramp_first << k : slot;

		ck_assert_uint_eq(p.off, next);
		ck_assert_uint_eq(p.bytes, k + 1 < n ? full : want_last);
		ck_assert_uint_le(p.bytes, slot);
		ck_assert_uint_eq(p.slot, (first + k) % nslots);
		next += p.bytes;
	}
	ck_assert_uint_eq(next, bytes);
}

START_TEST(test_pieces_around_slot_boundaries)
{
	/* 8 MiB slots ramp 1, 2, 4 MiB (7 MiB) before the first whole slot. */
	check_pieces(1, 8 * MiB, 8, 0, 1 * MiB, 1, 1);
	check_pieces(1 * MiB, 8 * MiB, 8, 0, 1 * MiB, 1, 1 * MiB);
	check_pieces(1 * MiB + 1, 8 * MiB, 8, 0, 1 * MiB, 2, 1);
	check_pieces(7 * MiB, 8 * MiB, 8, 0, 1 * MiB, 3, 4 * MiB);
	check_pieces(7 * MiB + 1, 8 * MiB, 8, 0, 1 * MiB, 4, 1);
	check_pieces(8 * MiB - 1, 8 * MiB, 8, 0, 1 * MiB, 4, 1 * MiB - 1);
	check_pieces(8 * MiB, 8 * MiB, 8, 0, 1 * MiB, 4, 1 * MiB);
	check_pieces(15 * MiB, 8 * MiB, 8, 3, 1 * MiB, 4, 8 * MiB);
	check_pieces(15 * MiB + 1, 8 * MiB, 8, 3, 1 * MiB, 5, 1);
	check_pieces(64 * MiB, 8 * MiB, 8, 0, 1 * MiB, 11, 1 * MiB);
	/* More pieces than slots: round the ring again, from where the last copy left it. */
	check_pieces(1 * GiB + 4097, 8 * MiB, 8, 5, 1 * MiB, 131, 1 * MiB + 4097);
	/* Small slots ramp less: none under 512 KiB (1 MiB slots: 512 KiB once; 64 KiB slots: not at all). */
	check_pieces(3 * MiB, 1 * MiB, 4, 0, 512 * KiB, 4, 512 * KiB);
	check_pieces(64 * KiB * 3 + 1, 64 * KiB, 4, 1, 64 * KiB, 4, 1);
	ck_assert_uint_eq(pbst_piece_count(0, 8 * MiB), 0);
}
END_TEST

START_TEST(test_a_piece_past_the_end_is_empty)
{
	struct pbst_piece p = pbst_piece_at(10 * MiB, 8 * MiB, 8, 0, 4);

	ck_assert_uint_eq(p.bytes, 0);
}
END_TEST

START_TEST(test_small_pieces_take_fewer_threads)
{
	ck_assert_uint_eq(pbst_split_threads(1, 4), 1);
	ck_assert_uint_eq(pbst_split_threads(PBST_SPLIT_MIN_BYTES - 1, 4), 1);
	ck_assert_uint_eq(pbst_split_threads(2 * PBST_SPLIT_MIN_BYTES, 4), 2);
	ck_assert_uint_eq(pbst_split_threads(8 * MiB, 4), 4);
	ck_assert_uint_eq(pbst_split_threads(8 * MiB, 64), 32);
	ck_assert_uint_eq(pbst_split_threads(8 * MiB, 0), 1);
}
END_TEST

/* Parts are back to back from 0 to bytes, every cut on a 64-byte multiple. */
static void check_split(size_t bytes, unsigned n)
{
	size_t next = 0;

	for (unsigned i = 0; i < n; i++) {
		size_t off, len;

		pbst_split_part(bytes, n, i, &off, &len);
		ck_assert_uint_eq(off, next);
		if (off < bytes)
			ck_assert_uint_eq(off % 64, 0);
		if (i + 1 < n && off + len < bytes)
			ck_assert_uint_eq((off + len) % 64, 0);
		next = off + len;
	}
	ck_assert_uint_eq(next, bytes);
}

START_TEST(test_a_piece_splits_among_threads_at_64_byte_cuts)
{
	static const size_t sizes[] = { 1, 63, 64, 65, 4095, 4096, 1 * MiB - 1, 1 * MiB, 8 * MiB - 3, 8 * MiB };

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		for (unsigned n = 1; n <= 7; n++)
			check_split(sizes[i], n);
}
END_TEST

START_TEST(test_an_even_piece_splits_evenly)
{
	size_t off, len;

	pbst_split_part(8 * MiB, 4, 2, &off, &len);
	ck_assert_uint_eq(off, 4 * MiB);
	ck_assert_uint_eq(len, 2 * MiB);
}
END_TEST

/*
 * The streaming copy is memcpy: every byte of dst[0, n) is src's, nothing around it is written, for sizes on
 * both sides of PBST_STREAM_MIN_BYTES and of a 64-byte line, and every misalignment of dst and src.
 */
START_TEST(test_stream_copy_is_memcpy)
{
	static const size_t sizes[] = { 0,
					1,
					63,
					64,
					65,
					PBST_STREAM_MIN_BYTES - 1,
					PBST_STREAM_MIN_BYTES,
					PBST_STREAM_MIN_BYTES + 1,
					PBST_STREAM_MIN_BYTES + 63,
					MiB - 3,
					MiB };
	static const size_t dst_offs[] = { 0, 1, 15, 16, 63 }, src_offs[] = { 0, 3, 64 };
	const size_t guard = 128, cap = MiB + 2 * guard;
	uint8_t *src = malloc(cap), *dst = malloc(cap), *untouched = malloc(cap);

	ck_assert(src && dst && untouched);
	memset(untouched, 0xAA, cap);
	for (size_t i = 0; i < cap; i++)
		src[i] = (uint8_t)(i * 131 + (i >> 8) * 7 + 1);
	for (size_t a = 0; a < sizeof(sizes) / sizeof(sizes[0]); a++)
		for (size_t b = 0; b < sizeof(dst_offs) / sizeof(dst_offs[0]); b++)
			for (size_t c = 0; c < sizeof(src_offs) / sizeof(src_offs[0]); c++) {
				size_t n = sizes[a], d = guard + dst_offs[b], so = src_offs[c];

				memset(dst, 0xAA, cap);
				pbst_stream_copy(dst + d, src + so, n);
				ck_assert_msg(memcmp(dst + d, src + so, n) == 0, "n %zu dst+%zu src+%zu differs", n,
					      dst_offs[b], so);
				ck_assert_msg(memcmp(dst, untouched, d) == 0 &&
						      memcmp(dst + d + n, untouched, cap - d - n) == 0,
					      "n %zu dst+%zu: a byte outside dst[0, n) was written", n, dst_offs[b]);
			}
	free(src);
	free(dst);
	free(untouched);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("staging_plan");
	TCase *settings;

	settings = CHECK_CASE(s, "settings", NULL, NULL, 10, test_defaults_are_64m_ring_16m_slot_8_threads_1m_threshold,
			      test_threads_for_cpus, test_env_values_are_read_as_sizes,
			      test_configure_applies_nonzero_fields_and_keeps_the_rest,
			      test_configure_refuses_bad_values_and_changes_nothing);
	tcase_add_loop_test(settings, test_env_values_are_bounded_and_a_bad_one_falls_back_to_its_default, 0,
			    (int)(sizeof(env_cases) / sizeof(env_cases[0])));
	tcase_add_loop_test(settings, test_stream_stores_env, 0, (int)(sizeof(stream_rows) / sizeof(stream_rows[0])));
	CHECK_CASE(s, "decide", NULL, NULL, 10, test_pageable_to_device_over_the_threshold_is_staged,
		   test_threshold_minus_one_passes_threshold_stages, test_a_threshold_of_0_still_passes_0_bytes,
		   test_staging_off_passes_everything, test_pinned_or_registered_host_memory_goes_to_the_driver,
		   test_managed_memory_on_either_side_goes_to_the_driver,
		   test_a_stream_being_captured_goes_to_the_driver,
		   test_unified_addressing_takes_the_direction_from_the_pointers,
		   test_a_direction_the_pointers_contradict_goes_to_the_driver, test_verdicts_have_names);
	CHECK_CASE(s, "plan", NULL, NULL, 10, test_pieces_around_slot_boundaries, test_a_piece_past_the_end_is_empty,
		   test_small_pieces_take_fewer_threads, test_a_piece_splits_among_threads_at_64_byte_cuts,
		   test_an_even_piece_splits_evenly);
	CHECK_CASE(s, "copy", NULL, NULL, 30, test_stream_copy_is_memcpy);
	return s;
}

CHECK_MAIN(suite)

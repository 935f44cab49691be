/* SPDX-License-Identifier: MIT */
/* Check suite for common/text: UTF-8 decoding, what counts as printable, sanitising and C-style escaping. */
#include <check.h>
#include <stdint.h>
#include <string.h>

#include "text.h"
#include "check_main.h"

#define TIMEOUT_S 10

START_TEST(test_decode_accepts_every_valid_length)
{
	uint32_t cp;

	ck_assert_uint_eq(text_decode("A", 1, &cp), 1);
	ck_assert_uint_eq(cp, 'A');
	ck_assert_uint_eq(text_decode("\xc3\xa9", 2, &cp), 2); /* é */
	ck_assert_uint_eq(cp, 0xe9);
	ck_assert_uint_eq(text_decode("\xe2\x82\xac", 3, &cp), 3); /* € */
	ck_assert_uint_eq(cp, 0x20ac);
	ck_assert_uint_eq(text_decode("\xf0\x9f\x98\x80", 4, &cp), 4); /* U+1F600 */
	ck_assert_uint_eq(cp, 0x1f600);
}
END_TEST

START_TEST(test_decode_rejects_malformed_sequences)
{
	uint32_t cp;

	ck_assert_uint_eq(text_decode("\x80", 1, &cp), 0);             /* stray continuation */
	ck_assert_uint_eq(text_decode("\xc0\xaf", 2, &cp), 0);         /* overlong '/' */
	ck_assert_uint_eq(text_decode("\xe0\x80\xaf", 3, &cp), 0);     /* overlong, 3 bytes */
	ck_assert_uint_eq(text_decode("\xed\xa0\x80", 3, &cp), 0);     /* surrogate U+D800 */
	ck_assert_uint_eq(text_decode("\xf4\x90\x80\x80", 4, &cp), 0); /* above U+10FFFF */
	ck_assert_uint_eq(text_decode("\xe2\x82", 2, &cp), 0);         /* cut short */
	ck_assert_uint_eq(text_decode("\xc3(", 2, &cp), 0);            /* bad continuation */
	ck_assert_uint_eq(text_decode("\xff", 1, &cp), 0);
}
END_TEST

START_TEST(test_printable_refuses_controls_separators_and_bidi)
{
	ck_assert(text_printable(""));
	ck_assert(text_printable("trainer-7 batch #3"));
	ck_assert(text_printable("caf\xc3\xa9 \xe2\x82\xac \xe6\x97\xa5\xe6\x9c\xac"));
	ck_assert(!text_printable("evil\nID 999 fake"));
	ck_assert(!text_printable("a\tb"));
	ck_assert(!text_printable("\x1b[2J"));
	ck_assert(!text_printable("del\x7f"));
	ck_assert(!text_printable("c1 \xc2\x9b"
				  "31m"));                 /* U+009B, CSI */
	ck_assert(!text_printable("line\xe2\x80\xa8sep")); /* U+2028 */
	ck_assert(!text_printable("\xe2\x80\xae"
				  "txt.exe"));      /* U+202E, right-to-left override */
	ck_assert(!text_printable("\xe2\x81\xa6")); /* U+2066 */
	ck_assert(!text_printable("bad \xff byte"));
}
END_TEST

START_TEST(test_sanitize_replaces_each_bad_byte_and_keeps_good_text)
{
	char buf[64];

	text_sanitize(buf, sizeof(buf), "job\n\x1b[2Jx");
	ck_assert_str_eq(buf, "job??[2Jx");
	text_sanitize(buf, sizeof(buf), "caf\xc3\xa9\xff");
	ck_assert_str_eq(buf, "caf\xc3\xa9?");
	/* Cut at a character boundary: é would not fit whole in 5 bytes. */
	text_sanitize(buf, 5, "caf\xc3\xa9");
	ck_assert_str_eq(buf, "caf");
	text_sanitize(buf, 1, "x");
	ck_assert_str_eq(buf, "");
}
END_TEST

START_TEST(test_escape_is_c_style_and_unambiguous)
{
	char buf[128];

	ck_assert_str_eq(text_escape(buf, sizeof(buf), "evil\nID 999 fake"), "evil\\nID 999 fake");
	ck_assert_str_eq(text_escape(buf, sizeof(buf), "\x1b[31mred"), "\\x1b[31mred");
	ck_assert_str_eq(text_escape(buf, sizeof(buf), "a\\nb"), "a\\\\nb");
	ck_assert_str_eq(text_escape(buf, sizeof(buf), "t\tr\r"), "t\\tr\\r");
	ck_assert_str_eq(text_escape(buf, sizeof(buf), "caf\xc3\xa9"), "caf\xc3\xa9");
	ck_assert_str_eq(text_escape(buf, sizeof(buf), "\xe2\x80\xa8"), "\\xe2\\x80\\xa8");
	ck_assert_str_eq(text_escape(buf, sizeof(buf), "\xff"), "\\xff");
	/* Never half an escape: "ab\x1b" in 6 bytes keeps "ab" and drops the 4-byte escape. */
	ck_assert_str_eq(text_escape(buf, 6, "ab\x1b"), "ab");
	ck_assert_ptr_null(memchr(text_escape(buf, sizeof(buf), "x\x01y\x7fz"), 0x01, strlen(buf)));
	ck_assert_str_eq(buf, "x\\x01y\\x7fz");
}
END_TEST

START_TEST(test_truncate_never_splits_a_character)
{
	char s[] = "ab\xe2\x82\xac"
		   "cd";

	text_truncate(s, 4); /* would cut the euro sign after its second byte */
	ck_assert_str_eq(s, "ab");
	{
		char t[] = "abcdef";

		text_truncate(t, 3);
		ck_assert_str_eq(t, "abc");
		text_truncate(t, 10);
		ck_assert_str_eq(t, "abc");
	}
}
END_TEST

CHECK_SUITE(suite, "text", "text", NULL, NULL, TIMEOUT_S, test_decode_accepts_every_valid_length,
	    test_decode_rejects_malformed_sequences, test_printable_refuses_controls_separators_and_bidi,
	    test_sanitize_replaces_each_bad_byte_and_keeps_good_text, test_escape_is_c_style_and_unambiguous,
	    test_truncate_never_splits_a_character)

CHECK_MAIN(suite)

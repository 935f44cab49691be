/* SPDX-License-Identifier: MIT */
/* Unit tests for orphans: the restart state file's text, written and read back, and every way a damaged one is refused. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>

#include "orphans.h"
#include "check_main.h"

#define BOOT "3054f1ec-3764-464c-8ff7-1e94ebf4e824"

static int parse(const char *text, struct orphan **v, size_t *n)
{
	return orphans_parse(text, strlen(text), BOOT, v, n);
}

START_TEST(test_written_state_reads_back_the_same)
{
	struct orphan_key keys[2] = { { makedev(0, 1), 13348, 2u << 20 }, { makedev(0, 1), 13349, 2u << 20 } };
	pid_t pids[2] = { 3046, 4100 };
	struct orphan in[2] = {
		{ .lease_id = 7, .uid = 61001, .bytes = 4u << 20, .nkeys = 2, .keys = keys, .npids = 2, .pids = pids },
		/* A registration: no memfds, held while its pid lives. */
		{ .lease_id = 9, .uid = 61002, .bytes = 12345, .nkeys = 0, .keys = NULL, .npids = 1, .pids = pids },
	};
	struct orphan *out;
	size_t n, len;
	char *text;

	ck_assert_int_eq(orphans_format(in, 2, BOOT, &text, &len), 0);
	ck_assert_uint_eq(strlen(text), len);
	ck_assert_int_eq(orphans_parse(text, len, BOOT, &out, &n), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert_uint_eq(out[0].lease_id, 7);
	ck_assert_uint_eq(out[0].uid, 61001);
	ck_assert_uint_eq(out[0].bytes, 4u << 20);
	ck_assert_uint_eq(out[0].nkeys, 2);
	ck_assert(out[0].keys[1].dev == makedev(0, 1));
	ck_assert_uint_eq(out[0].keys[1].ino, 13349);
	ck_assert_uint_eq(out[0].npids, 2);
	ck_assert_int_eq(out[0].pids[1], 4100);
	ck_assert_int_eq(out[0].pidfds[0], -1);
	ck_assert(out[0].verified);
	ck_assert_uint_eq(out[1].nkeys, 0);
	ck_assert_uint_eq(out[1].bytes, 12345);
	orphans_free(out, n);
	free(text);
}
END_TEST

START_TEST(test_empty_list_reads_back_empty)
{
	struct orphan *out = (struct orphan *)1;
	size_t n = 9;

	ck_assert_int_eq(parse("pinbroker-restart 1\nboot " BOOT "\nend\n", &out, &n), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_ptr_null(out);
}
END_TEST

START_TEST(test_another_boot_is_stale)
{
	struct orphan *out;
	size_t n;

	ck_assert_int_eq(parse("pinbroker-restart 1\nboot 00000000-0000-0000-0000-000000000000\n"
			       "o 1 61001 4096 p5 k0:1:9:4096\nend\n",
			       &out, &n),
			 -ESTALE);
}
END_TEST

START_TEST(test_damaged_states_are_refused)
{
	static const char *const bad[] = {
		"",                                                                          /* empty */
		"pinbroker-restart 3\nboot " BOOT "\nend\n",                                 /* another version */
		"pinbroker-restart 1\nboot " BOOT "\no 1 61001 4096 p5 k0:1:9:4096\n",       /* torn: no end */
		"pinbroker-restart 1\nboot " BOOT "\nend\no 1 61001 4096 p5 k0:1:9:4096\n",  /* after end */
		"pinbroker-restart 1\nboot " BOOT "\nend",                                   /* end without newline */
		"pinbroker-restart 1\nboot " BOOT "\no 1 61001 8192 p5 k0:1:9:4096\nend\n",  /* keys do not add up */
		"pinbroker-restart 1\nboot " BOOT "\no 1 61001 0 p5 k\nend\n",               /* no bytes */
		"pinbroker-restart 1\nboot " BOOT "\no 1 61001 4096 p k\nend\n",             /* nothing holds it */
		"pinbroker-restart 1\nboot " BOOT "\no 1 61001 4096 p5, k0:1:9:4096\nend\n", /* trailing comma */
		"pinbroker-restart 1\nboot " BOOT "\no 1 61001 4096 p5 k0:1:9:4096,\nend\n", /* trailing comma */
		"pinbroker-restart 1\nboot " BOOT "\no 1 61001 4096 p0 k0:1:9:4096\nend\n",  /* pid 0 */
		"pinbroker-restart 1\nboot " BOOT "\no 1 61001 4096 p5 k0:1:0:4096\nend\n",  /* inode 0 */
		"pinbroker-restart 1\nboot " BOOT "\no 1 4294967295 4096 p5 k0:1:9:4096\nend\n",     /* uid -1 */
		"pinbroker-restart 1\nboot " BOOT "\no 1 61001 99999999999999999999999 p5 k\nend\n", /* overflow */
		"pinbroker-restart 1\nboot " BOOT "\no 1 61001 4096 p5 k0:1:9:4096 x\nend\n",        /* junk */
		"pinbroker-restart 1\nboot " BOOT "\nx 1 61001 4096 p5 k0:1:9:4096\nend\n",          /* unknown line */
		"pinbroker-restart 1\nbot " BOOT "\nend\n",                                          /* no boot line */
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct orphan *out = NULL;
		size_t n = 0;

		ck_assert_msg(parse(bad[i], &out, &n) == -EBADMSG, "case %zu was not refused", i);
		ck_assert_ptr_null(out);
	}
}
END_TEST

START_TEST(test_too_many_pids_are_refused)
{
	char text[2048] = "pinbroker-restart 1\nboot " BOOT "\no 1 61001 4096 p";
	struct orphan *out;
	size_t n;

	for (unsigned i = 1; i <= ORPHAN_PIDS_MAX + 1; i++)
		snprintf(text + strlen(text), sizeof(text) - strlen(text), "%s%u", i > 1 ? "," : "", i + 100);
	strcat(text, " k0:1:9:4096\nend\n");
	ck_assert_int_eq(parse(text, &out, &n), -EBADMSG);
}
END_TEST

/*
 * Version 2 goes on after "end" with lines journaled while the daemon ran: each a lease lent after the
 * snapshot; a lease journaled again (an attach) adds its pids to its first line; a last line without its
 * newline (a crash mid-append, before that lease's fds left) is not trusted, and the file still reads.
 */
START_TEST(test_journal_lines_after_end_are_leases_lent_since)
{
	const char *text = "pinbroker-restart 2\nboot " BOOT "\n"
			   "o 1 61001 4096 p5 k0:1:9:4096\n"
			   "end\n"
			   "o 2 61001 8192 p6 k0:1:10:8192\n"
			   "o 1 61001 4096 p5,7 k0:1:9:4096\n"
			   "o 3 61002 4096 p8 k0:1:1";
	struct orphan *out = NULL;
	unsigned version = 0;
	size_t n = 0;

	ck_assert_int_eq(orphans_parse_version(text, strlen(text), BOOT, &out, &n, &version), 0);
	ck_assert_uint_eq(version, 2);
	ck_assert_uint_eq(n, 2);
	ck_assert_uint_eq(out[0].lease_id, 1);
	ck_assert_uint_eq(out[0].npids, 2);
	ck_assert_int_eq(out[0].pids[0], 5);
	ck_assert_int_eq(out[0].pids[1], 7);
	ck_assert_uint_eq(out[1].lease_id, 2);
	ck_assert_uint_eq(out[1].bytes, 8192);
	orphans_free(out, n);
	/* A chunk a later line names was lent again: the earlier lease had ended. */
	text = "pinbroker-restart 2\nboot " BOOT "\n"
	       "end\n"
	       "o 4 61001 8192 p6 k0:1:10:4096,0:1:11:4096\n"
	       "o 5 61002 4096 p9 k0:1:11:4096\n";
	ck_assert_int_eq(parse(text, &out, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(out[0].lease_id, 5);
	orphans_free(out, n);
	/* A version 1 file has nothing after "end". */
	ck_assert_int_eq(parse("pinbroker-restart 1\nboot " BOOT "\nend\no 2 61001 8192 p6 k0:1:10:8192\n", &out, &n),
			 -EBADMSG);
	/* A damaged journal line is a damaged file. */
	text = "pinbroker-restart 2\nboot " BOOT "\nend\no 2 61001 8192 p6 k0:1:10:4096\n";
	ck_assert_int_eq(parse(text, &out, &n), -EBADMSG);
}
END_TEST

CHECK_SUITE(suite, "orphans", "state file", NULL, NULL, 10, test_written_state_reads_back_the_same,
	    test_empty_list_reads_back_empty, test_another_boot_is_stale, test_damaged_states_are_refused,
	    test_too_many_pids_are_refused, test_journal_lines_after_end_are_leases_lent_since)

CHECK_MAIN(suite)

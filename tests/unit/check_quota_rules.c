/* SPDX-License-Identifier: MIT */
/* Unit tests for the quota rules file's text (quota-rules.c): what is written, read back, and bad lines skipped. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs.h"
#include "quota-rules.h"
#include "check_main.h"

#define MIB (1024ull * 1024)
#define GIB (1024ull * MIB)

/* The warnings a load gave: "LINE: what" each, one a line, after a first newline (so each starts "\nLINE: "). */
static char warned[65536];
static size_t nwarned;

static void record(void *ctx, unsigned line, const char *what)
{
	size_t n = strlen(warned);

	(void)ctx;
	snprintf(warned + n, sizeof(warned) - n, "%u: %s\n", line, what);
	nwarned++;
}

static struct jobs *new_jobs(void)
{
	struct jobs *j;

	ck_assert_int_eq(jobs_new(&j), 0);
	snprintf(warned, sizeof(warned), "\n");
	nwarned = 0;
	return j;
}

static void set_rule(struct jobs *j, const char *pattern, uint64_t bytes, enum job_rule_source src)
{
	const char *why = NULL;

	ck_assert_msg(jobs_rule_set(j, pattern, bytes, src, &why) == 0, "%s: %s", pattern, why ? why : "?");
}

/* The rule of pattern and source in j, or NULL. */
static const struct job_rule *rule_of(const struct jobs *j, const char *pattern, enum job_rule_source src)
{
	for (size_t i = 0; i < jobs_rule_count(j); i++) {
		const struct job_rule *r = jobs_rule_at(j, i);

		if (r->source == src && strcmp(r->pattern, pattern) == 0)
			return r;
	}
	return NULL;
}

static int load(struct jobs *j, const char *text)
{
	return quota_rules_load(j, text, strlen(text), NULL, record, NULL);
}

static bool no_cgroup(void *ctx, const char *path)
{
	(void)ctx;
	(void)path;
	return false;
}

START_TEST(test_only_set_rules_are_written_in_order_with_seen)
{
	struct jobs *j = new_jobs();
	const char *why = NULL;
	char *text;
	size_t len;

	set_rule(j, "/kubepods.slice/*", 1 * GIB, JOB_RULE_CONFIG);
	set_rule(j, "/system.slice/slurmstepd.scope/job_42", 8 * GIB, JOB_RULE_SET);
	set_rule(j, "/slurm/uid_*/job_*", 2 * GIB, JOB_RULE_SET);
	set_rule(j, "/slurm/uid_1000/job_7", 512 * MIB, JOB_RULE_SET);
	ck_assert_int_eq(jobs_rule_restore(j, "/system.slice/slurmstepd.scope/job_42", 8 * GIB, true, &why), 0);
	/* A glob is never released by the sweep: it has no seen to keep. */
	ck_assert_int_eq(jobs_rule_restore(j, "/slurm/uid_*/job_*", 2 * GIB, true, &why), 0);
	jobs_regroup(j);
	ck_assert_int_eq(quota_rules_format(j, NULL, &text, &len), 0);
	ck_assert_uint_eq(len, strlen(text));
	ck_assert_str_eq(text,
			 "pinbroker-quota-rules 1\n"
			 "# PATTERN BYTES [seen]: set by pinctl quota set, written by pinbrokerd; change them with "
			 "pinctl quota set and clear\n"
			 "/system.slice/slurmstepd.scope/job_42 8589934592 seen\n"
			 "/slurm/uid_*/job_* 2147483648\n"
			 "/slurm/uid_1000/job_7 536870912\n");
	free(text);
	jobs_free(j);
}
END_TEST

START_TEST(test_no_set_rules_is_an_empty_text)
{
	struct jobs *j = new_jobs();
	char *text;
	size_t len = 99;

	set_rule(j, "/kubepods.slice/*", 1 * GIB, JOB_RULE_CONFIG);
	ck_assert_int_eq(quota_rules_format(j, NULL, &text, &len), 0);
	ck_assert_uint_eq(len, 0);
	ck_assert_str_eq(text, "");
	free(text);
	jobs_free(j);
}
END_TEST

START_TEST(test_rules_read_back_are_set_rules_that_bind)
{
	struct jobs *j = new_jobs(), *k;
	struct job_cgroup *cg;
	const char *why = NULL;
	char *text, *again;
	size_t len, len2;

	set_rule(j, "/system.slice/slurmstepd.scope/job_42", 8 * MIB, JOB_RULE_SET);
	set_rule(j, "/kubepods.slice/*", 4 * MIB, JOB_RULE_SET);
	set_rule(j, "/slurm/uid_1000/job_9", UINT64_MAX, JOB_RULE_SET);
	ck_assert_int_eq(jobs_rule_restore(j, "/system.slice/slurmstepd.scope/job_42", 8 * MIB, true, &why), 0);
	jobs_regroup(j);
	ck_assert_int_eq(quota_rules_format(j, NULL, &text, &len), 0);

	k = new_jobs();
	/* A config rule of the same path stays apart: the file's rule is a set one and wins. */
	set_rule(k, "/system.slice/slurmstepd.scope/job_42", 64 * MIB, JOB_RULE_CONFIG);
	ck_assert_int_eq(quota_rules_load(k, text, len, NULL, record, NULL), 3);
	ck_assert_msg(nwarned == 0, "warned: %s", warned);
	ck_assert_uint_eq(jobs_rule_count(k), 4);
	ck_assert_uint_eq(rule_of(k, "/system.slice/slurmstepd.scope/job_42", JOB_RULE_SET)->bytes, 8 * MIB);
	ck_assert(rule_of(k, "/system.slice/slurmstepd.scope/job_42", JOB_RULE_SET)->seen);
	ck_assert(!rule_of(k, "/slurm/uid_1000/job_9", JOB_RULE_SET)->seen);
	ck_assert_uint_eq(rule_of(k, "/slurm/uid_1000/job_9", JOB_RULE_SET)->bytes, UINT64_MAX);
	ck_assert_uint_eq(rule_of(k, "/system.slice/slurmstepd.scope/job_42", JOB_RULE_CONFIG)->bytes, 64 * MIB);
	/* They bind: 8 MiB for job 42's steps, not the config's 64 MiB. */
	ck_assert_int_eq(jobs_cgroup_get(k, "/system.slice/slurmstepd.scope/job_42/step_0", &cg), 0);
	ck_assert_int_eq(jobs_check(cg, 8 * MIB), REFUSAL_NONE);
	ck_assert_int_eq(jobs_check(cg, 8 * MIB + 1), REFUSAL_JOB_QUOTA);
	jobs_cgroup_put(k, cg);
	/* And the same text comes out again. */
	ck_assert_int_eq(quota_rules_format(k, NULL, &again, &len2), 0);
	ck_assert_str_eq(again, text);
	free(again);
	free(text);
	jobs_free(k);
	jobs_free(j);
}
END_TEST

START_TEST(test_bad_lines_are_warned_with_their_line_and_skipped)
{
	struct jobs *j = new_jobs();
	static const char text[] = "pinbroker-quota-rules 1\n"        /* 1 */
				   "# a comment\n"                    /* 2 */
				   "/good/one 1048576\n"              /* 3 */
				   "\n"                               /* 4 */
				   "relative/path 1024\n"             /* 5 */
				   "/no/size\n"                       /* 6 */
				   "/bad/size 8G\n"                   /* 7 */
				   "/overflow 18446744073709551616\n" /* 8 */
				   "/odd/word 1024 maybe\n"           /* 9 */
				   "/too/many 1024 seen extra\n"      /* 10 */
				   "/dot/../dot 1024\n"               /* 11 */
				   "   /good/two\t2048   seen  \n"    /* 12 */
				   "/trailing/ 1024\n"                /* 13 */
				   "/good/glob/* 4096 seen\n"         /* 14 */
				   "/negative -5\n"                   /* 15 */
				   "/good/three 0";                   /* 16: no newline at the end */
	const struct job_rule *r;

	ck_assert_int_eq(load(j, text), 4);
	ck_assert_uint_eq(jobs_rule_count(j), 4);
	ck_assert_uint_eq(rule_of(j, "/good/one", JOB_RULE_SET)->bytes, 1 * MIB);
	r = rule_of(j, "/good/two", JOB_RULE_SET);
	ck_assert(r && r->bytes == 2048 && r->seen);
	r = rule_of(j, "/good/glob/*", JOB_RULE_SET);
	ck_assert(r && r->bytes == 4096 && !r->seen);
	ck_assert_uint_eq(rule_of(j, "/good/three", JOB_RULE_SET)->bytes, 0);
	ck_assert_msg(nwarned == 9, "%zu warnings:\n%s", nwarned, warned);
	for (unsigned line = 5; line <= 15; line++) {
		char want[16];

		snprintf(want, sizeof(want), "\n%u: ", line);
		if (line == 12 || line == 14)
			ck_assert_msg(!strstr(warned, want), "line %u warned:\n%s", line, warned);
		else
			ck_assert_msg(strstr(warned, want) && strstr(strstr(warned, want), "skipped"),
				      "line %u not warned as skipped:\n%s", line, warned);
	}
	ck_assert_ptr_nonnull(strstr(warned, "'8G' is not a number of bytes"));
	ck_assert_ptr_nonnull(strstr(warned, "'maybe' is not 'seen'"));
	jobs_free(j);
}
END_TEST

START_TEST(test_a_missing_header_is_warned_and_the_lines_read)
{
	struct jobs *j = new_jobs();

	ck_assert_int_eq(load(j, "/a/b 1024\n/c 2048\n"), 2);
	ck_assert_uint_eq(nwarned, 1);
	ck_assert_ptr_nonnull(strstr(warned, "1: no 'pinbroker-quota-rules 1' header"));
	jobs_free(j);
}
END_TEST

START_TEST(test_another_format_loads_nothing)
{
	struct jobs *j = new_jobs();

	ck_assert_int_eq(load(j, "pinbroker-quota-rules 2\n/a/b 1024 seen\n"), -EPROTONOSUPPORT);
	ck_assert_uint_eq(jobs_rule_count(j), 0);
	ck_assert_ptr_nonnull(strstr(warned, "1: 'pinbroker-quota-rules 2' names a format"));
	jobs_free(j);
}
END_TEST

START_TEST(test_nul_bytes_and_long_lines_are_skipped)
{
	struct jobs *j = new_jobs();
	static const char text[] = "pinbroker-quota-rules 1\n/a/b\0x 1024\n/ok 1\n";
	size_t big = 3 * JOBS_PATH_MAX;
	char *huge = malloc(big + 64);

	ck_assert_int_eq(quota_rules_load(j, text, sizeof(text) - 1, NULL, record, NULL), 1);
	ck_assert_ptr_nonnull(strstr(warned, "2: the line holds a NUL byte; skipped"));
	ck_assert_ptr_nonnull(rule_of(j, "/ok", JOB_RULE_SET));
	ck_assert_ptr_nonnull(huge);
	huge[0] = '/';
	memset(huge + 1, 'x', big);
	strcpy(huge + 1 + big, " 1024\n/ok2 2\n");
	ck_assert_int_eq(load(j, huge), 1);
	ck_assert_ptr_nonnull(strstr(warned, "longer than any rule; skipped"));
	ck_assert_ptr_nonnull(rule_of(j, "/ok2", JOB_RULE_SET));
	free(huge);
	jobs_free(j);
}
END_TEST

START_TEST(test_a_pattern_twice_keeps_the_later_line)
{
	struct jobs *j = new_jobs();

	ck_assert_int_eq(load(j, "pinbroker-quota-rules 1\n/a/b 1024\n/a/b 2048\n"), 1);
	ck_assert_uint_eq(jobs_rule_count(j), 1);
	ck_assert_uint_eq(rule_of(j, "/a/b", JOB_RULE_SET)->bytes, 2048);
	ck_assert_ptr_nonnull(strstr(warned, "3: a second rule for /a/b"));
	jobs_free(j);
}
END_TEST

START_TEST(test_past_the_rule_limit_lines_are_skipped)
{
	struct jobs *j = new_jobs();
	size_t cap = (JOBS_RULES_MAX + 2) * 32 + 64, at = 0;
	char *text = malloc(cap);

	ck_assert_ptr_nonnull(text);
	at += (size_t)snprintf(text + at, cap - at, "pinbroker-quota-rules 1\n");
	for (unsigned i = 0; i < JOBS_RULES_MAX + 2; i++)
		at += (size_t)snprintf(text + at, cap - at, "/job_%u 1024\n", i);
	ck_assert_int_eq(load(j, text), JOBS_RULES_MAX);
	ck_assert_uint_eq(jobs_rule_count(j), JOBS_RULES_MAX);
	ck_assert_uint_eq(nwarned, 2);
	ck_assert_ptr_nonnull(strstr(warned, "too many quota rules; skipped"));
	free(text);
	jobs_free(j);
}
END_TEST

/* A rule seen before a restart whose cgroup went while no daemon ran goes at the first sweep; one never seen stays. */
START_TEST(test_a_seen_rule_read_back_is_released_by_the_sweep)
{
	struct jobs *j = new_jobs();

	ck_assert_int_eq(load(j, "pinbroker-quota-rules 1\n/job/seen 1024 seen\n/job/not_yet 1024\n"), 2);
	ck_assert_uint_eq(jobs_sweep(j, no_cgroup, NULL, NULL), 1);
	ck_assert_ptr_null(rule_of(j, "/job/seen", JOB_RULE_SET));
	ck_assert_ptr_nonnull(rule_of(j, "/job/not_yet", JOB_RULE_SET));
	jobs_free(j);
}
END_TEST

/* Whatever bytes the file holds, the load returns (a bounded fuzz: random text of rule-like characters). */
START_TEST(test_random_text_never_crashes)
{
	static const char alphabet[] = "/ab*?[]\\.0123456789 \t\n#seen-\x01\xff:";
	char text[2048];
	unsigned seed = 12345;

	for (int round = 0; round < 2000; round++) {
		struct jobs *j = new_jobs();
		size_t n = (size_t)(rand_r(&seed) % (int)sizeof(text));
		int r;

		for (size_t i = 0; i < n; i++)
			text[i] = alphabet[rand_r(&seed) % (int)(sizeof(alphabet) - 1)];
		if (round % 3 == 0 && n > 24)
			memcpy(text, "pinbroker-quota-rules 1\n", 24);
		r = quota_rules_load(j, text, n, NULL, record, NULL);
		ck_assert_int_ge(r, 0);
		ck_assert_int_le(r, (int)jobs_rule_count(j));
		jobs_free(j);
	}
}
END_TEST

#define BOOT_A "11111111-2222-3333-4444-555555555555"
#define BOOT_B "99999999-8888-7777-6666-555555555555"

/* The file names the boot it was written in; one of another boot loads nothing, one of this boot all. */
START_TEST(test_a_file_of_another_boot_loads_nothing)
{
	struct jobs *j = new_jobs(), *k;
	char *text;
	size_t len;

	set_rule(j, "/job/a", 1024, JOB_RULE_SET);
	ck_assert_int_eq(quota_rules_format(j, BOOT_A, &text, &len), 0);
	ck_assert_ptr_nonnull(strstr(text, "pinbroker-quota-rules 1\nboot " BOOT_A "\n"));

	k = new_jobs();
	ck_assert_int_eq(quota_rules_load(k, text, len, BOOT_B, record, NULL), -ESTALE);
	ck_assert_uint_eq(jobs_rule_count(k), 0);
	ck_assert_msg(strstr(warned, "2: written before a reboot (boot " BOOT_A ", now " BOOT_B "):"), "%s", warned);
	jobs_free(k);

	k = new_jobs();
	ck_assert_int_eq(quota_rules_load(k, text, len, BOOT_A, record, NULL), 1);
	ck_assert_msg(nwarned == 0, "warned: %s", warned);
	jobs_free(k);
	/* This daemon's boot unknown: nothing to compare, the rules load. */
	k = new_jobs();
	ck_assert_int_eq(quota_rules_load(k, text, len, "", record, NULL), 1);
	jobs_free(k);
	/* No boot line (its boot unknown when written): the rules load. */
	k = new_jobs();
	ck_assert_int_eq(quota_rules_load(k, "pinbroker-quota-rules 1\n/job/a 1024\n", 36, BOOT_B, record, NULL), 1);
	ck_assert_msg(nwarned == 0, "warned: %s", warned);
	jobs_free(k);
	free(text);
	jobs_free(j);
}
END_TEST

CHECK_SUITE(suite, "quota_rules", "file", NULL, NULL, 60, test_only_set_rules_are_written_in_order_with_seen,
	    test_no_set_rules_is_an_empty_text, test_rules_read_back_are_set_rules_that_bind,
	    test_bad_lines_are_warned_with_their_line_and_skipped, test_a_missing_header_is_warned_and_the_lines_read,
	    test_another_format_loads_nothing, test_nul_bytes_and_long_lines_are_skipped,
	    test_a_pattern_twice_keeps_the_later_line, test_past_the_rule_limit_lines_are_skipped,
	    test_a_seen_rule_read_back_is_released_by_the_sweep, test_random_text_never_crashes,
	    test_a_file_of_another_boot_loads_nothing)

CHECK_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/* Check suite for daemon/config's files: loading, file:line errors, the sample config, dumps, the markdown table and reloads (the keys and values: check_config.c). */
#define _GNU_SOURCE /* open_memstream */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

#include "config.h"
#include "config_values.h"
#include "config_fixture.h"
#include "check_main.h"

/* --- files --- */

START_TEST(test_file_with_comments_and_blank_lines_loads)
{
	char *path = write_temp("# pinbrokerd.conf\n"
				"\n"
				"budget = 8G   # half the host\n"
				"  hugetlb=no\n"
				"admin-group = gpu#ops\n"
				"log-level = debug\r\n"
				"socket = \"\"x\n"
				"\t# indented comment\n"
				"proc-root = /srv/proc # fixtures\n"
				"lock-memory = off");
	struct config *c = defaults();
	char *err = NULL;

	/* "socket = """x" is not a quoted value, so it stays and fails as a relative path. */
	ck_assert_int_eq(config_load_file(c, path, &err), -EINVAL);
	ck_assert_ptr_nonnull(err);
	ck_assert_uint_eq(count_lines(err), 1);
	ck_assert_ptr_nonnull(strstr(err, ":7: socket: "));
	ck_assert_uint_eq(c->budget.bytes, UINT64_C(8) << 30);
	ck_assert_int_eq(c->hugetlb, CONFIG_HUGETLB_NO);
	ck_assert_str_eq(c->admin_group, "gpu#ops");
	ck_assert_int_eq(c->log_level, LOG_DEBUG);
	ck_assert_str_eq(c->proc_root, "/srv/proc");
	ck_assert(!c->lock_memory);
	free(err);
	config_free(c);
	drop_temp(path);
}
END_TEST

START_TEST(test_file_quotes_allow_an_empty_value)
{
	char *path = write_temp("admin-group = \"\"\nsocket = \"/tmp/a b.sock\"\n");
	struct config *c = defaults();
	char *err = NULL;

	set_ok(c, "admin-group", "wheel");
	ck_assert_int_eq(config_load_file(c, path, &err), 0);
	ck_assert_ptr_null(err);
	ck_assert_str_eq(c->admin_group, "");
	ck_assert_str_eq(c->socket_path, "/tmp/a b.sock");
	config_free(c);
	drop_temp(path);
}
END_TEST

START_TEST(test_file_errors_carry_path_and_line_and_are_all_collected)
{
	char *path = write_temp("budget = 12Q\n"
				"# fine\n"
				"chunk-size = 4K\n"
				"no equals sign here\n"
				"prewarm-threads = -3\n"
				"= 5\n"
				"hugetlb = sometimes\n");
	struct config *c = defaults();
	char *err = NULL, expect[1024];

	ck_assert_int_eq(config_load_file(c, path, &err), -EINVAL);
	snprintf(expect, sizeof(expect),
		 "%s:1: budget: '12Q' is not a size; write a number with an optional K, M, G or T suffix, or a "
		 "percentage like 25%%\n"
		 "%s:4: expected 'key = value', got 'no equals sign here'\n"
		 "%s:5: prewarm-threads: '-3' is not a whole number; write digits only, like 0\n"
		 "%s:6: no key before '='\n"
		 "%s:7: hugetlb: 'sometimes' is not a choice; write one of auto, yes, no\n",
		 path, path, path, path, path);
	ck_assert_str_eq(err, expect);
	/* Good lines still applied: the caller parses into a copy and discards it on error. */
	ck_assert_uint_eq(c->chunk_bytes, 4096);
	free(err);
	config_free(c);
	drop_temp(path);
}
END_TEST

/* Was a constant (256): a key with bounds, and file:line errors like every key's. */
START_TEST(test_max_registrants_per_file_defaults_to_256_and_is_bounded)
{
	char *path = write_temp("max-registrants-per-file = 4097\n");
	struct config *c = defaults();

	ck_assert_uint_eq(c->max_registrants_per_file, 256);
	expect_file_error_and_free(
		c, path, 1, "max-registrants-per-file: '4097' is out of range; write a whole number from 0 to 4096");
}
END_TEST

/* One uid may not fill the host's 1024 reservations: 16 by default, 1 to 1024, file:line errors. */
START_TEST(test_max_reservations_per_uid_defaults_to_16_and_is_bounded)
{
	char *path = write_temp("# a comment\nmax-reservations-per-uid = 1025\n");
	struct config *c = defaults();

	ck_assert_uint_eq(c->max_reservations_per_uid, 16);
	expect_file_error_and_free(
		c, path, 2, "max-reservations-per-uid: '1025' is out of range; write a whole number from 1 to 1024");
}
END_TEST

/*
 * Was a constant (1 GiB): the largest start warm-up finished before READY. A size from 0 (always beside the
 * loop) up, whole pages, restart-only (its values: check_config.c's tables); errors carry file:line.
 */
START_TEST(test_prewarm_before_ready_defaults_to_1g_and_is_a_size)
{
	char *path = write_temp("# warm-up\nprewarm-before-ready = 6000\n");
	struct config *c = defaults();
	char *err = NULL;

	ck_assert_uint_eq(c->prewarm_before_ready_bytes, 1ull << 30);
	ck_assert(!config_key_find("prewarm-before-ready")->reloadable);
	set_ok(c, "prewarm-before-ready", "1024T");
	ck_assert_int_eq(config_validate(c, &err), 0);
	expect_file_error_and_free(c, path, 2,
				   "prewarm-before-ready: '6000' is not a multiple of 4K (the page size); round it");
}
END_TEST

/*
 * Was a constant (16 GiB): the most a start warm-up pins before the pool's books count it. A size from 2M (a
 * batch always holds one chunk, so less would mean the same) up, whole pages, restart-only (its values:
 * check_config.c's tables); errors carry file:line.
 */
START_TEST(test_warmup_batch_max_defaults_to_16g_and_is_a_size)
{
	char *path = write_temp("# warm-up\nprewarm-before-ready = 0\n\nwarmup-batch-max = 1M\n");
	struct config *c = defaults();
	char *err = NULL;

	ck_assert_uint_eq(c->warmup_batch_max_bytes, 16ull << 30);
	ck_assert(!config_key_find("warmup-batch-max")->reloadable);
	set_ok(c, "warmup-batch-max", "1024T");
	ck_assert_int_eq(config_validate(c, &err), 0);
	/* Below the minimum in a file: the error names the file and the key's line, not the first line. */
	expect_file_error_and_free(c, path, 4, "warmup-batch-max: '1M' is out of range; write a size from 2M to 1024T");
	path = write_temp("prewarm = 1G\nwarmup-batch-max = 6001K\n");
	expect_file_error_and_free(defaults(), path, 2,
				   "warmup-batch-max: '6001K' is not a multiple of 4K (the page size); round it");
}
END_TEST

START_TEST(test_file_unknown_key_suggests_the_closest)
{
	char *path = write_temp("bugdet = 1G\nmax-conections = 5\nfrobnicate = 1\n");
	struct config *c = defaults();
	char *err = NULL, expect[1024];

	ck_assert_int_eq(config_load_file(c, path, &err), -EINVAL);
	snprintf(expect, sizeof(expect),
		 "%s:1: unknown key 'bugdet' (did you mean 'budget'?)\n"
		 "%s:2: unknown key 'max-conections' (did you mean 'max-connections'?)\n"
		 "%s:3: unknown key 'frobnicate'; 'pinbrokerd --help' lists the keys\n",
		 path, path, path);
	ck_assert_str_eq(err, expect);
	free(err);
	config_free(c);
	drop_temp(path);
}
END_TEST

START_TEST(test_file_duplicate_key_names_the_first_line)
{
	char *path = write_temp("budget = 1G\n\nbudget = 2G\n");
	struct config *c = defaults();
	char *err = NULL, expect[512];

	ck_assert_int_eq(config_load_file(c, path, &err), -EINVAL);
	snprintf(expect, sizeof(expect), "%s:3: 'budget' already set on line 1\n", path);
	ck_assert_str_eq(err, expect);
	ck_assert_uint_eq(c->budget.bytes, 1u << 30);
	free(err);
	config_free(c);
	drop_temp(path);
}
END_TEST

START_TEST(test_missing_file_is_enoent_with_message)
{
	struct config *c = defaults();
	char *err = NULL;

	ck_assert_int_eq(config_load_file(c, "/nonexistent/pinbrokerd.conf", &err), -ENOENT);
	ck_assert_str_eq(err, "/nonexistent/pinbrokerd.conf: cannot open: No such file or directory");
	free(err);
	config_free(c);
}
END_TEST

START_TEST(test_empty_file_loads_nothing)
{
	char *path = write_temp("");
	struct config *c = defaults(), *d = defaults();
	char *err = NULL;

	ck_assert_int_eq(config_load_file(c, path, &err), 0);
	assert_config_equal(c, d);
	config_free(c);
	config_free(d);
	drop_temp(path);
}
END_TEST

/* Uncomments the "#key = value" lines of a sample; the "# help" lines keep their '#'. */
static char *uncomment_sample(const char *sample, unsigned *nkeys)
{
	char *out = malloc(strlen(sample) + 1), *o = out;
	bool bol = true;

	*nkeys = 0;
	for (const char *s = sample; *s; s++) {
		if (bol && s[0] == '#' && s[1] >= 'a' && s[1] <= 'z') {
			(*nkeys)++;
			bol = false;
			continue;
		}
		*o++ = *s;
		bol = *s == '\n';
	}
	*o = '\0';
	return out;
}

START_TEST(test_sample_config_round_trips_to_defaults)
{
	struct config *c = scrambled(), *d = defaults();
	char *sample = NULL, *text, *path, *err = NULL;
	size_t len = 0, n;
	unsigned nkeys;
	FILE *f = open_memstream(&sample, &len);

	config_write_sample(f);
	fclose(f);
	text = uncomment_sample(sample, &nkeys);
	config_keys(&n);
	ck_assert_uint_eq(nkeys, n);
	path = write_temp(text);
	ck_assert_msg(config_load_file(c, path, &err) == 0, "%s", err);
	assert_config_equal(c, d);
	config_free(c);
	config_free(d);
	drop_temp(path);
	free(text);
	free(sample);
}
END_TEST

START_TEST(test_sample_config_loads_as_is_without_changes)
{
	struct config *c = scrambled(), *d = scrambled();
	char *sample = NULL, *path, *err = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&sample, &len);

	config_write_sample(f);
	fclose(f);
	ck_assert_ptr_nonnull(strstr(sample, "#revoke-enforce = sigterm\n"));
	ck_assert_ptr_nonnull(strstr(sample, "#admin-group = \"\"\n"));
	ck_assert_ptr_nonnull(strstr(sample, "the job gets to clean up"));
	path = write_temp(sample);
	ck_assert_int_eq(config_load_file(c, path, &err), 0);
	assert_config_equal(c, d);
	config_free(c);
	config_free(d);
	drop_temp(path);
	free(sample);
}
END_TEST

START_TEST(test_dump_round_trips_any_config)
{
	struct config *src = scrambled(), *dst = defaults();
	char *dump = NULL, *path, *err = NULL;
	size_t len = 0, n;
	FILE *f = open_memstream(&dump, &len);

	set_ok(src, "tight-swapout-pages-per-s", "0.1");
	set_ok(src, "budget", "33.333333333333336%");
	set_ok(src, "prewarm", "1536K");
	config_dump(src, f);
	fclose(f);
	config_keys(&n);
	ck_assert_uint_eq(count_lines(dump), n);
	ck_assert_ptr_nonnull(strstr(dump, "prewarm = 1536K\n"));
	path = write_temp(dump);
	ck_assert_msg(config_load_file(dst, path, &err) == 0, "%s", err);
	assert_config_equal(src, dst);
	config_free(src);
	config_free(dst);
	drop_temp(path);
	free(dump);
}
END_TEST

START_TEST(test_dump_writes_defaults_as_in_the_table)
{
	struct config *c = defaults();
	char *dump = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&dump, &len);

	config_dump(c, f);
	fclose(f);
	ck_assert_ptr_nonnull(strstr(dump, "uid-quota = 100%\n"));
	ck_assert_ptr_nonnull(strstr(dump, "tight-mem-available-pct = 10\n"));
	ck_assert_ptr_nonnull(strstr(dump, "chunk-size = 2M\n"));
	ck_assert_ptr_nonnull(strstr(dump, "admin-group = \"\"\n"));
	ck_assert_ptr_nonnull(strstr(dump, "log-level = info\n"));
	config_free(c);
	free(dump);
}
END_TEST

START_TEST(test_markdown_has_a_row_per_key)
{
	char *md = NULL, row[128];
	size_t len = 0, n;
	const struct config_key *keys = config_keys(&n);
	FILE *f = open_memstream(&md, &len);

	config_write_markdown(f);
	fclose(f);
	ck_assert_uint_eq(count_lines(md), n + 2);
	ck_assert_ptr_eq(strstr(md, "| key | default | reloadable | meaning |\n|---|---|---|---|\n"), md);
	for (size_t i = 0; i < n; i++) {
		snprintf(row, sizeof(row), "| `%s` | `%s` | %s | ", keys[i].name, keys[i].def[0] ? keys[i].def : "\"\"",
			 config_expect_reloadable(keys[i].name) ? "yes" : "no");
		ck_assert_msg(strstr(md, row), "no row '%s'", row);
	}
	free(md);
}
END_TEST

START_TEST(test_validate_errors_carry_the_file_line)
{
	char *path = write_temp("# pressure\ntight-mem-available-pct = 5\ncritical-mem-available-pct = 8\n"
				"budget = 1G\nprewarm = 2G\n");
	struct config *c = defaults();
	char *err = NULL, *want = NULL;

	ck_assert_int_eq(config_load_file(c, path, &err), 0);
	ck_assert_int_eq(config_validate_file(c, path, &err), -EINVAL);
	ck_assert_int_ge(asprintf(&want,
				  "%s:3: critical-mem-available-pct (8) must be below tight-mem-available-pct (5): "
				  "critical is the deeper state\n"
				  "%s:5: prewarm (2 GiB) is above budget (1 GiB); lower prewarm or raise budget\n",
				  path, path),
			 0);
	ck_assert_str_eq(err, want);
	free(err);
	free(want);
	/* A value set later (command line, pinctl set) has no line to name. */
	set_ok(c, "critical-mem-available-pct", "9");
	ck_assert_int_eq(config_validate_file(c, path, &err), -EINVAL);
	ck_assert(strncmp(err, "critical-mem-available-pct (9)", 30) == 0);
	free(err);
	/* Nor has one from pinctl set or the environment (their origins are not line numbers). */
	ck_assert_int_eq(config_mark_runtime(c, "critical-mem-available-pct"), 0);
	ck_assert_int_eq(config_validate_file(c, path, &err), -EINVAL);
	ck_assert_msg(strncmp(err, "critical-mem-available-pct (9)", 30) == 0, "%s", err);
	free(err);
	ck_assert_int_eq(config_mark_env(c, "critical-mem-available-pct"), 0);
	ck_assert_int_eq(config_validate_file(c, path, &err), -EINVAL);
	ck_assert_msg(strncmp(err, "critical-mem-available-pct (9)", 30) == 0, "%s", err);
	free(err);
	drop_temp(path);
	config_free(c);
}
END_TEST

static void count_note(const char *key, const char *value, void *ud)
{
	ck_assert_str_eq(key, "budget");
	ck_assert_str_eq(value, "1G");
	(*(unsigned *)ud)++;
}

START_TEST(test_runtime_values_are_kept_over_a_reloaded_file)
{
	char *path = write_temp("budget = 2G\nadmin-group = file\n");
	struct config *running = defaults(), *n = defaults();
	unsigned notes = 0;
	char *err = NULL;

	set_ok(running, "budget", "1G");
	ck_assert_int_eq(config_mark_runtime(running, "budget"), 0);
	ck_assert_int_eq(config_mark_runtime(running, "no-such-key"), -ENOENT);
	set_ok(running, "admin-group", "cmdline"); /* set, but not at run time: the file wins */
	ck_assert_int_eq(config_load_file(n, path, &err), 0);
	ck_assert_int_eq(config_keep_runtime(n, running, count_note, &notes), 0);
	ck_assert_uint_eq(notes, 1);
	ck_assert(!n->budget.is_pct);
	ck_assert_uint_eq(n->budget.bytes, 1u << 30);
	ck_assert_str_eq(n->admin_group, "file");
	/* The mark travels, so the next reload keeps it too. */
	ck_assert_uint_eq(n->origin[config_key_find("budget") - config_keys(NULL)], CONFIG_ORIGIN_RUNTIME);
	drop_temp(path);
	config_free(running);
	config_free(n);
}
END_TEST

static Suite *config_files_suite(void)
{
	Suite *s = suite_create("config_files");

	CHECK_CASE(s, "files", NULL, NULL, TIMEOUT_S, test_file_with_comments_and_blank_lines_loads,
		   test_file_quotes_allow_an_empty_value, test_file_errors_carry_path_and_line_and_are_all_collected,
		   test_max_registrants_per_file_defaults_to_256_and_is_bounded,
		   test_max_reservations_per_uid_defaults_to_16_and_is_bounded,
		   test_prewarm_before_ready_defaults_to_1g_and_is_a_size,
		   test_warmup_batch_max_defaults_to_16g_and_is_a_size, test_file_unknown_key_suggests_the_closest,
		   test_file_duplicate_key_names_the_first_line, test_missing_file_is_enoent_with_message,
		   test_empty_file_loads_nothing, test_sample_config_round_trips_to_defaults,
		   test_sample_config_loads_as_is_without_changes, test_dump_round_trips_any_config,
		   test_dump_writes_defaults_as_in_the_table, test_markdown_has_a_row_per_key);

	CHECK_CASE(s, "reload", NULL, NULL, TIMEOUT_S, test_validate_errors_carry_the_file_line,
		   test_runtime_values_are_kept_over_a_reloaded_file);
	return s;
}

CHECK_MAIN(config_files_suite)

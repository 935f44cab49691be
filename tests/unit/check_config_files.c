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

/* tmpl with each '@' replaced by path (the errors a table row expects name the file it wrote). */
static char *with_path(const char *tmpl, const char *path)
{
	size_t n = 1;
	char *out, *o;

	for (const char *t = tmpl; *t; t++)
		n += *t == '@' ? strlen(path) : 1;
	out = o = malloc(n);
	ck_assert_ptr_nonnull(out);
	for (const char *t = tmpl; *t; t++) {
		if (*t == '@')
			o = stpcpy(o, path);
		else
			*o++ = *t;
	}
	*o = '\0';
	return out;
}

static void chunk_size_applied(const struct config *c)
{
	/* Good lines still applied: the caller parses into a copy and discards it on error. */
	ck_assert_uint_eq(c->chunk_bytes, 4096);
}

static void first_budget_kept(const struct config *c)
{
	ck_assert_uint_eq(c->budget.bytes, 1u << 30);
}

/*
 * A file that fails to load: the load's result, every error with the file's path ('@') and line, then what its good
 * lines set. text NULL: no file, at /nonexistent/pinbrokerd.conf.
 */
static const struct file_errors_row {
	const char *name;
	const char *text;
	int rc;
	const char *errors;
	void (*also)(const struct config *c); /* or NULL */
} file_errors_rows[] = {
	{ "errors carry path and line and are all collected",
	  "budget = 12Q\n"
	  "# fine\n"
	  "chunk-size = 4K\n"
	  "no equals sign here\n"
	  "prewarm-threads = -3\n"
	  "= 5\n"
	  "hugetlb = sometimes\n",
	  -EINVAL,
	  "@:1: budget: '12Q' is not a size; write a number with an optional K, M, G or T suffix, or a percentage "
	  "like 25%\n"
	  "@:4: expected 'key = value', got 'no equals sign here'\n"
	  "@:5: prewarm-threads: '-3' is not a whole number; write digits only, like 0\n"
	  "@:6: no key before '='\n"
	  "@:7: hugetlb: 'sometimes' is not a choice; write one of auto, yes, no\n",
	  chunk_size_applied },
	{ "an unknown key suggests the closest", "bugdet = 1G\nmax-conections = 5\nfrobnicate = 1\n", -EINVAL,
	  "@:1: unknown key 'bugdet' (did you mean 'budget'?)\n"
	  "@:2: unknown key 'max-conections' (did you mean 'max-connections'?)\n"
	  "@:3: unknown key 'frobnicate'; 'pinbrokerd --help' lists the keys\n",
	  NULL },
	{ "a duplicate key names the first line", "budget = 1G\n\nbudget = 2G\n", -EINVAL,
	  "@:3: 'budget' already set on line 1\n", first_budget_kept },
	{ "a missing file is ENOENT with a message", NULL, -ENOENT, "@: cannot open: No such file or directory", NULL },
};

START_TEST(test_file_errors_name_the_file_and_line)
{
	const struct file_errors_row *r = &file_errors_rows[_i];
	char *path = r->text ? write_temp(r->text) : strdup("/nonexistent/pinbrokerd.conf");
	char *want = with_path(r->errors, path), *err = NULL;
	struct config *c = defaults();
	int rc = config_load_file(c, path, &err);

	ck_assert_msg(rc == r->rc, "%s: load gave %d, expected %d", r->name, rc, r->rc);
	ck_assert_msg(err && strcmp(err, want) == 0, "%s: errors\n%s\nexpected\n%s", r->name, err ? err : "(none)",
		      want);
	if (r->also)
		r->also(c);
	free(want);
	free(err);
	config_free(c);
	if (r->text)
		drop_temp(path);
	else
		free(path);
}
END_TEST

/*
 * Keys that were constants: their defaults (the old constants), their bounds in a file (file:line errors like every
 * key's), and for the warm-up sizes (restart-only, whole pages, from 0 or 2M up; their values: check_config.c's
 * tables) that the largest size validates.
 */
static const struct former_constant_row {
	const char *key;
	uint64_t def;
	const char *largest; /* set, then validated; NULL: not checked (nor is reloadable) */
	struct {
		const char *text;
		int line;
		const char *msg;
	} files[2]; /* each fails with its one error; text NULL: no file */
} former_constant_rows[] = {
	/* One file may not take every registrant slot: 256 by default. */
	{ "max-registrants-per-file",
	  256,
	  NULL,
	  { { "max-registrants-per-file = 4097\n", 1,
	      "max-registrants-per-file: '4097' is out of range; write a whole number from 0 to 4096" } } },
	/* One uid may not fill the host's 1024 reservations: 16 by default, 1 to 1024. */
	{ "max-reservations-per-uid",
	  16,
	  NULL,
	  { { "# a comment\nmax-reservations-per-uid = 1025\n", 2,
	      "max-reservations-per-uid: '1025' is out of range; write a whole number from 1 to 1024" } } },
	/* The largest start warm-up finished before READY (was 1 GiB): a size from 0 up. */
	{ "prewarm-before-ready",
	  1ull << 30,
	  "1024T",
	  { { "# warm-up\nprewarm-before-ready = 6000\n", 2,
	      "prewarm-before-ready: '6000' is not a multiple of 4K (the page size); round it" } } },
	/*
	 * The most a start warm-up pins before the pool's books count it (was 16 GiB): from 2M (a batch always holds
	 * one chunk, so less would mean the same). Below the minimum in a file: the error names the key's line.
	 */
	{ "warmup-batch-max",
	  16ull << 30,
	  "1024T",
	  { { "# warm-up\nprewarm-before-ready = 0\n\nwarmup-batch-max = 1M\n", 4,
	      "warmup-batch-max: '1M' is out of range; write a size from 2M to 1024T" },
	    { "prewarm = 1G\nwarmup-batch-max = 6001K\n", 2,
	      "warmup-batch-max: '6001K' is not a multiple of 4K (the page size); round it" } } },
};

START_TEST(test_former_constants_have_their_default_and_bounds)
{
	const struct former_constant_row *r = &former_constant_rows[_i];
	const struct config_key *k = config_key_find(r->key);
	struct config *c = defaults();
	uint64_t v;

	ck_assert_msg(k, "%s: no such key", r->key);
	v = k->type == CT_UINT ? *(const uint32_t *)at(c, k) : *(const uint64_t *)at(c, k);
	ck_assert_msg(v == r->def, "%s: default %llu, expected %llu", r->key, (unsigned long long)v,
		      (unsigned long long)r->def);
	if (r->largest) {
		char *err = NULL;

		ck_assert_msg(!k->reloadable, "%s: reloadable, expected restart-only", r->key);
		set_ok(c, r->key, r->largest);
		ck_assert_msg(config_validate(c, &err) == 0, "%s = %s: %s", r->key, r->largest, err);
	}
	config_free(c);
	for (size_t f = 0; f < 2 && r->files[f].text; f++) {
		char *path = write_temp(r->files[f].text), *err = NULL, want[1024];
		int rc;

		c = defaults();
		rc = config_load_file(c, path, &err);
		snprintf(want, sizeof(want), "%s:%d: %s\n", path, r->files[f].line, r->files[f].msg);
		ck_assert_msg(rc == -EINVAL && err && strcmp(err, want) == 0,
			      "%s, file %zu: load gave %d, %s, expected %s", r->key, f, rc, err ? err : "(no error)",
			      want);
		free(err);
		config_free(c);
		drop_temp(path);
	}
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

/* What config_write_sample writes (c NULL) or config_dump writes for c, as a string to free. */
static char *written(const struct config *c)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	ck_assert_ptr_nonnull(f);
	if (c)
		config_dump(c, f);
	else
		config_write_sample(f);
	fclose(f);
	return text;
}

/* Loads text as a config file into c, which must succeed, and compares every key with want; frees both. */
static void load_and_compare(struct config *c, const char *text, struct config *want)
{
	char *path = write_temp(text), *err = NULL;

	ck_assert_msg(config_load_file(c, path, &err) == 0, "%s", err);
	assert_config_equal(c, want);
	drop_temp(path);
	config_free(c);
	config_free(want);
}

START_TEST(test_sample_config_round_trips_to_defaults)
{
	struct config *c = scrambled(), *d = defaults();
	char *sample = written(NULL), *text;
	size_t n;
	unsigned nkeys;

	text = uncomment_sample(sample, &nkeys);
	config_keys(&n);
	ck_assert_uint_eq(nkeys, n);
	load_and_compare(c, text, d);
	free(text);
	free(sample);
}
END_TEST

START_TEST(test_sample_config_loads_as_is_without_changes)
{
	struct config *c = scrambled(), *d = scrambled();
	char *sample = written(NULL);

	ck_assert_ptr_nonnull(strstr(sample, "#revoke-enforce = sigterm\n"));
	ck_assert_ptr_nonnull(strstr(sample, "#admin-group = \"\"\n"));
	ck_assert_ptr_nonnull(strstr(sample, "the job gets to clean up"));
	load_and_compare(c, sample, d);
	free(sample);
}
END_TEST

START_TEST(test_dump_round_trips_any_config)
{
	struct config *src = scrambled(), *dst = defaults();
	char *dump;
	size_t n;

	set_ok(src, "tight-swapout-pages-per-s", "0.1");
	set_ok(src, "budget", "33.333333333333336%");
	set_ok(src, "prewarm", "1536K");
	dump = written(src);
	config_keys(&n);
	ck_assert_uint_eq(count_lines(dump), n);
	ck_assert_ptr_nonnull(strstr(dump, "prewarm = 1536K\n"));
	load_and_compare(dst, dump, src);
	free(dump);
}
END_TEST

START_TEST(test_dump_writes_defaults_as_in_the_table)
{
	struct config *c = defaults();
	char *dump = written(c);

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
	TCase *tc;

	tc = CHECK_CASE(s, "files", NULL, NULL, TIMEOUT_S, test_file_with_comments_and_blank_lines_loads,
			test_file_quotes_allow_an_empty_value, test_empty_file_loads_nothing,
			test_sample_config_round_trips_to_defaults, test_sample_config_loads_as_is_without_changes,
			test_dump_round_trips_any_config, test_dump_writes_defaults_as_in_the_table,
			test_markdown_has_a_row_per_key);
	tcase_add_loop_test(tc, test_file_errors_name_the_file_and_line, 0,
			    sizeof(file_errors_rows) / sizeof(file_errors_rows[0]));
	tcase_add_loop_test(tc, test_former_constants_have_their_default_and_bounds, 0,
			    sizeof(former_constant_rows) / sizeof(former_constant_rows[0]));

	CHECK_CASE(s, "reload", NULL, NULL, TIMEOUT_S, test_validate_errors_carry_the_file_line,
		   test_runtime_values_are_kept_over_a_reloaded_file);
	return s;
}

CHECK_MAIN(config_files_suite)

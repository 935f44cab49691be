/* SPDX-License-Identifier: MIT */
/* Check suite for daemon/config: the key table, value parsing, file errors, validation and the sample config. */
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
#include "check_main.h"

#define TIMEOUT_S 10

static struct config *defaults(void)
{
	struct config *c = NULL;

	ck_assert_int_eq(config_new(&c), 0);
	ck_assert_ptr_nonnull(c);
	return c;
}

/* Writes text to a fresh temp file and returns its malloc'd path. */
static char *write_temp(const char *text)
{
	char *path = strdup("/tmp/check_config.XXXXXX");
	int fd = mkstemp(path);
	size_t len = strlen(text);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, len), (ssize_t)len);
	close(fd);
	return path;
}

/* Loading path into c fails with the one error "path:line: msg"; then c and the file are gone. */
static void expect_file_error_and_free(struct config *c, char *path, int line, const char *msg)
{
	char *err = NULL, expect[1024];

	ck_assert_int_eq(config_load_file(c, path, &err), -EINVAL);
	snprintf(expect, sizeof(expect), "%s:%d: %s\n", path, line, msg);
	ck_assert_str_eq(err, expect);
	free(err);
	config_free(c);
	unlink(path);
	free(path);
}

static unsigned count_lines(const char *s)
{
	unsigned n = 0;

	for (; *s; s++)
		n += *s == '\n';
	return n;
}

static const void *at(const struct config *c, const struct config_key *k)
{
	return (const char *)c + k->offset;
}

static bool key_equal(const struct config *a, const struct config *b, const struct config_key *k)
{
	const void *pa = at(a, k), *pb = at(b, k);

	switch (k->type) {
	case CT_STRING:
		return strcmp(*(char *const *)pa, *(char *const *)pb) == 0;
	case CT_SIZE:
		return *(const uint64_t *)pa == *(const uint64_t *)pb;
	case CT_SIZE_PCT: {
		const struct size_spec *x = pa, *y = pb;
		return x->is_pct == y->is_pct && (x->is_pct ? x->pct == y->pct : x->bytes == y->bytes);
	}
	case CT_UINT:
		return *(const uint32_t *)pa == *(const uint32_t *)pb;
	case CT_DOUBLE:
		return *(const double *)pa == *(const double *)pb;
	case CT_BOOL:
		return *(const bool *)pa == *(const bool *)pb;
	case CT_ENUM:
	case CT_LOGLEVEL:
		return *(const int *)pa == *(const int *)pb;
	}
	return false;
}

static void assert_config_equal(const struct config *a, const struct config *b)
{
	size_t n;
	const struct config_key *keys = config_keys(&n);

	for (size_t i = 0; i < n; i++)
		ck_assert_msg(key_equal(a, b, &keys[i]), "key '%s' differs", keys[i].name);
}

/* A value of k that differs from its default and passes validation with the others changed the same way. */
static const char *other_value(const struct config_key *k, char *buf, size_t len)
{
	switch (k->type) {
	case CT_STRING:
		return strcmp(k->name, "job-quota") == 0 ? "/alt:1M" : "/alt";
	case CT_SIZE:
		/* The smallest size of every key but those whose floor is above a page (warmup-batch-max: 2M). */
		if (k->min <= 4096)
			return "4K";
		snprintf(buf, len, "%.0f", k->min);
		return buf;
	case CT_SIZE_PCT:
		return "1%";
	case CT_UINT:
	case CT_DOUBLE:
		snprintf(buf, len, "%.0f", k->min == 0 ? 1 : k->min);
		if (strcmp(buf, k->def) == 0)
			snprintf(buf, len, "%.0f", k->min + 1);
		return buf;
	case CT_BOOL:
		return strcmp(k->def, "yes") == 0 ? "no" : "yes";
	case CT_ENUM:
		return strcmp(k->def, k->choices[0]) == 0 ? k->choices[1] : k->choices[0];
	case CT_LOGLEVEL:
		return "debug";
	}
	return NULL;
}

/* Every key set to a non-default value. */
static struct config *scrambled(void)
{
	struct config *c = defaults(), *d = defaults();
	size_t n;
	const struct config_key *keys = config_keys(&n);

	for (size_t i = 0; i < n; i++) {
		char buf[64], *err = NULL;
		const char *v = other_value(&keys[i], buf, sizeof(buf));

		ck_assert_msg(config_set(c, keys[i].name, v, &err) == 0, "%s = %s: %s", keys[i].name, v, err);
		ck_assert_msg(!key_equal(c, d, &keys[i]), "key '%s' still at its default", keys[i].name);
	}
	config_free(d);
	return c;
}

/* Sets key to value, expecting failure r and an error starting with "key: '...'". */
static char *set_fails(const char *key, const char *value, int r)
{
	struct config *c = defaults(), *d = defaults();
	char *err = NULL, prefix[256];

	ck_assert_msg(config_set(c, key, value, &err) == r, "%s = '%s' should fail with %d", key, value, r);
	ck_assert_ptr_nonnull(err);
	snprintf(prefix, sizeof(prefix), "%s: ", key);
	ck_assert_msg(strncmp(err, prefix, strlen(prefix)) == 0, "message '%s'", err);
	/* A failed set leaves the old value. */
	assert_config_equal(c, d);
	config_free(c);
	config_free(d);
	return err;
}

static void set_ok(struct config *c, const char *key, const char *value)
{
	char *err = NULL;

	ck_assert_msg(config_set(c, key, value, &err) == 0, "%s = '%s': %s", key, value, err);
	ck_assert_ptr_null(err);
}

/* --- the table --- */

START_TEST(test_table_keys_are_unique_and_documented)
{
	size_t n;
	const struct config_key *keys = config_keys(&n);

	ck_assert_uint_eq(n, 56); /* one per field of struct config */
	for (size_t i = 0; i < n; i++) {
		ck_assert_ptr_nonnull(keys[i].help);
		ck_assert_uint_gt(strlen(keys[i].help), 10);
		ck_assert_ptr_nonnull(keys[i].def);
		ck_assert_ptr_eq(config_key_find(keys[i].name), &keys[i]);
		if (keys[i].type == CT_ENUM)
			ck_assert_ptr_nonnull(keys[i].choices);
		for (size_t j = i + 1; j < n; j++)
			ck_assert_str_ne(keys[i].name, keys[j].name);
	}
	ck_assert_ptr_null(config_key_find("bugdet"));
	ck_assert_ptr_null(config_key_find(NULL));
}
END_TEST

/*
 * The table's reloadable flags are today's split (config_values.h's two lists, from the docs), key by
 * key: a flag flipped, or a key added without deciding, fails here.
 */
START_TEST(test_reloadable_flags_match_the_written_out_lists)
{
	size_t n, listed = 0;
	const struct config_key *keys = config_keys(&n);

	for (size_t i = 0; i < n; i++) {
		int want = config_expect_reloadable(keys[i].name);

		ck_assert_msg(want >= 0, "%s: in neither or both of config_values.h's lists", keys[i].name);
		ck_assert_msg(keys[i].reloadable == (want == 1), "%s: the table says %s, the docs say %s", keys[i].name,
			      keys[i].reloadable ? "reloadable" : "needs a restart",
			      want ? "reloadable" : "needs a restart");
	}
	for (const char *const *l = config_reloadable_keys; *l; l++, listed++)
		ck_assert_msg(config_key_find(*l), "%s: listed, but no such key", *l);
	for (const char *const *l = config_restart_keys; *l; l++, listed++)
		ck_assert_msg(config_key_find(*l), "%s: listed, but no such key", *l);
	ck_assert_uint_eq(listed, n);
}
END_TEST

/* The table's reloadable flag decides what a reload keeps: every key that is not reloadable, and no other. */
START_TEST(test_keep_fixed_keeps_exactly_the_unreloadable_keys)
{
	size_t n;
	const struct config_key *keys = config_keys(&n);

	for (size_t i = 0; i < n; i++) {
		struct config *running = defaults(), *next = defaults();
		const char *value = NULL;

		ck_assert_msg(config_set_other_value(next, running, &keys[i], &value), "%s: no other value validates",
			      keys[i].name);
		ck_assert_int_eq(config_keep_fixed(next, running, NULL, NULL), 0);
		int reloadable = config_expect_reloadable(keys[i].name);

		ck_assert_msg(config_key_equal(next, running, &keys[i]) == !reloadable,
			      "%s = %s: %s, yet the running value was%s kept", keys[i].name, value,
			      reloadable ? "reloadable" : "needs a restart", reloadable ? "" : " not");
		/* Only that key moved. */
		for (size_t j = 0; j < n; j++)
			if (j != i)
				ck_assert_msg(config_key_equal(next, running, &keys[j]), "%s", keys[j].name);
		config_free(running);
		config_free(next);
	}
}
END_TEST

static void note_kept(const char *key, const char *wanted, const char *kept, void *ud)
{
	char *seen = ud;

	snprintf(seen + strlen(seen), 256 - strlen(seen), "%s:%s>%s;", key, wanted, kept);
}

START_TEST(test_keep_fixed_notes_each_kept_key)
{
	struct config *running = defaults(), *next = defaults();
	char seen[256] = "";

	set_ok(next, "chunk-size", "4M");
	set_ok(next, "socket", "/tmp/other.sock");
	set_ok(next, "budget", "1G");
	ck_assert_int_eq(config_keep_fixed(next, running, note_kept, seen), 0);
	ck_assert_str_eq(seen, "socket:/tmp/other.sock>/run/pinbroker/pinbroker.sock;chunk-size:4M>2M;");
	ck_assert_str_eq(next->socket_path, "/run/pinbroker/pinbroker.sock");
	ck_assert_uint_eq(next->chunk_bytes, 2u << 20);
	ck_assert_uint_eq(next->budget.bytes, 1u << 30);
	config_free(running);
	config_free(next);
}
END_TEST

START_TEST(test_every_default_parses)
{
	struct config *c = defaults();
	size_t n;
	const struct config_key *keys = config_keys(&n);

	for (size_t i = 0; i < n; i++)
		set_ok(c, keys[i].name, keys[i].def);
	config_free(c);
}
END_TEST

START_TEST(test_defaults_validate)
{
	struct config *c = defaults();
	char *err = (char *)"unset";

	ck_assert_int_eq(config_validate(c, &err), 0);
	ck_assert_ptr_null(err);
	config_free(c);
}
END_TEST

START_TEST(test_defaults_hold_documented_values)
{
	struct config *c = defaults();

	ck_assert_str_eq(c->socket_path, "/run/pinbroker/pinbroker.sock");
	ck_assert(c->budget.is_pct);
	ck_assert_double_eq(c->budget.pct, 25);
	ck_assert(c->uid_quota.is_pct);
	ck_assert_double_eq(c->uid_quota.pct, 100);
	ck_assert(!c->prewarm.is_pct);
	ck_assert_uint_eq(c->prewarm.bytes, 256u << 20);
	ck_assert_uint_eq(c->chunk_bytes, 2u << 20);
	ck_assert_int_eq(c->hugetlb, CONFIG_HUGETLB_AUTO);
	ck_assert_uint_eq(c->prewarm_threads, 0);
	ck_assert_str_eq(c->admin_group, "");
	ck_assert_int_eq(c->log_level, LOG_INFO);
	ck_assert_str_eq(c->proc_root, "/");
	ck_assert(c->lock_memory);
	ck_assert_uint_eq(c->max_connections, 1024);
	ck_assert_uint_eq(c->max_message_bytes, 65536);
	ck_assert_double_eq(c->critical_mem_available_pct, 5);
	ck_assert_double_eq(c->critical_swapout_pages_s, 10000);
	ck_assert_uint_eq(c->poll_interval_ms, 100);
	ck_assert_int_eq(c->revoke_enforce, ENFORCE_SIGTERM);
	ck_assert_uint_eq(c->redeclare_grace_ms, 10000);
	config_free(c);
}
END_TEST

/* --- values, type by type --- */

START_TEST(test_size_accepts_suffixes_within_range)
{
	struct config *c = defaults();

	set_ok(c, "chunk-size", "4K");
	ck_assert_uint_eq(c->chunk_bytes, 4096);
	set_ok(c, "chunk-size", "1G");
	ck_assert_uint_eq(c->chunk_bytes, 1u << 30);
	set_ok(c, "chunk-size", "8192");
	ck_assert_uint_eq(c->chunk_bytes, 8192);
	config_free(c);
}
END_TEST

START_TEST(test_size_rejects_garbage_range_and_odd_pages)
{
	char *err;

	err = set_fails("chunk-size", "12Q", -EINVAL);
	ck_assert_str_eq(err, "chunk-size: '12Q' is not a size; write a number with an optional K, M, G or T suffix");
	free(err);
	err = set_fails("chunk-size", "2K", -ERANGE);
	ck_assert_str_eq(err, "chunk-size: '2K' is out of range; write a size from 4K to 1G");
	free(err);
	free(set_fails("chunk-size", "2G", -ERANGE));
	free(set_fails("chunk-size", "99999999999T", -ERANGE));
	free(set_fails("chunk-size", "25%", -EINVAL));
	free(set_fails("chunk-size", "", -EINVAL));
	err = set_fails("chunk-size", "5000", -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "multiple of 4K"));
	free(err);
}
END_TEST

START_TEST(test_size_or_pct_accepts_both_forms)
{
	struct config *c = defaults();

	set_ok(c, "budget", "64G");
	ck_assert(!c->budget.is_pct);
	ck_assert_uint_eq(c->budget.bytes, UINT64_C(64) << 30);
	set_ok(c, "budget", "12.5%");
	ck_assert(c->budget.is_pct);
	ck_assert_double_eq(c->budget.pct, 12.5);
	set_ok(c, "prewarm", "0");
	ck_assert(!c->prewarm.is_pct);
	ck_assert_uint_eq(c->prewarm.bytes, 0);
	config_free(c);
}
END_TEST

START_TEST(test_size_or_pct_says_what_to_write)
{
	char *err;

	err = set_fails("budget", "12Q", -EINVAL);
	ck_assert_str_eq(err, "budget: '12Q' is not a size; write a number with an optional K, M, G or T suffix, "
			      "or a percentage like 25%");
	free(err);
	err = set_fails("budget", "150%", -ERANGE);
	ck_assert_str_eq(err, "budget: '150%' is out of range; a percentage must be from 0% to 100%");
	free(err);
	free(set_fails("uid-quota", "99999999999T", -ERANGE));
	free(set_fails("prewarm", "-5%", -EINVAL));
}
END_TEST

START_TEST(test_uint_accepts_range_bounds)
{
	struct config *c = defaults();

	set_ok(c, "prewarm-threads", "64");
	ck_assert_uint_eq(c->prewarm_threads, 64);
	set_ok(c, "prewarm-threads", "0");
	ck_assert_uint_eq(c->prewarm_threads, 0);
	set_ok(c, "poll-interval-ms", "50");
	ck_assert_uint_eq(c->poll_interval_ms, 50);
	set_ok(c, "max-message-bytes", "256");
	set_ok(c, "max-message-bytes", "1048576");
	ck_assert_uint_eq(c->max_message_bytes, 1048576);
	set_ok(c, "pool-shrink-delay-ms", "4294967295");
	ck_assert_uint_eq(c->pool_shrink_delay_ms, UINT32_MAX);
	config_free(c);
}
END_TEST

START_TEST(test_uint_rejects_negatives_garbage_and_out_of_range)
{
	char *err;

	err = set_fails("prewarm-threads", "65", -ERANGE);
	ck_assert_str_eq(err, "prewarm-threads: '65' is out of range; write a whole number from 0 to 64");
	free(err);
	err = set_fails("prewarm-threads", "-1", -EINVAL);
	ck_assert_str_eq(err, "prewarm-threads: '-1' is not a whole number; write digits only, like 0");
	free(err);
	free(set_fails("prewarm-threads", "four", -EINVAL));
	free(set_fails("prewarm-threads", " 4", -EINVAL));
	free(set_fails("prewarm-threads", "4.0", -EINVAL));
	free(set_fails("poll-interval-ms", "49", -ERANGE));
	free(set_fails("max-message-bytes", "255", -ERANGE));
	free(set_fails("max-message-bytes", "1048577", -ERANGE));
	free(set_fails("pool-shrink-delay-ms", "4294967296", -ERANGE));
	free(set_fails("pool-shrink-delay-ms", "99999999999999999999999", -ERANGE));
	free(set_fails("max-connections", "0", -ERANGE));
}
END_TEST

START_TEST(test_double_accepts_decimals)
{
	struct config *c = defaults();

	set_ok(c, "tight-mem-available-pct", "12.5");
	ck_assert_double_eq(c->tight_mem_available_pct, 12.5);
	set_ok(c, "critical-mem-available-pct", ".5");
	ck_assert_double_eq(c->critical_mem_available_pct, 0.5);
	set_ok(c, "tight-swapout-pages-per-s", "1e4");
	ck_assert_double_eq(c->tight_swapout_pages_s, 10000);
	set_ok(c, "tight-psi-some-avg10", "100");
	config_free(c);
}
END_TEST

START_TEST(test_double_rejects_non_numbers_and_out_of_range)
{
	char *err;

	err = set_fails("tight-mem-available-pct", "ten", -EINVAL);
	ck_assert_str_eq(err, "tight-mem-available-pct: 'ten' is not a number; write a decimal like 10 or 2.5");
	free(err);
	err = set_fails("tight-mem-available-pct", "101", -ERANGE);
	ck_assert_str_eq(err, "tight-mem-available-pct: '101' is out of range; write a number from 0 to 100");
	free(err);
	free(set_fails("tight-mem-available-pct", "nan", -EINVAL));
	free(set_fails("tight-mem-available-pct", "inf", -EINVAL));
	free(set_fails("tight-mem-available-pct", "-1", -EINVAL));
	free(set_fails("tight-mem-available-pct", "5%", -EINVAL));
	free(set_fails("tight-mem-available-pct", "", -EINVAL));
}
END_TEST

START_TEST(test_bool_accepts_every_spelling)
{
	static const char *const yes[] = { "yes", "true", "on", "1", "YES", "True" };
	static const char *const no[] = { "no", "false", "off", "0", "Off" };
	struct config *c = defaults();

	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		c->lock_memory = false;
		set_ok(c, "lock-memory", yes[i]);
		ck_assert(c->lock_memory);
	}
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
		c->lock_memory = true;
		set_ok(c, "lock-memory", no[i]);
		ck_assert(!c->lock_memory);
	}
	config_free(c);
}
END_TEST

START_TEST(test_bool_rejects_other_words)
{
	char *err = set_fails("lock-memory", "maybe", -EINVAL);

	ck_assert_str_eq(err,
			 "lock-memory: 'maybe' is not a boolean; write yes or no (true/false, on/off, 1/0 work too)");
	free(err);
	free(set_fails("lock-memory", "2", -EINVAL));
}
END_TEST

START_TEST(test_enum_maps_choices_in_order)
{
	struct config *c = defaults();

	set_ok(c, "hugetlb", "yes");
	ck_assert_int_eq(c->hugetlb, CONFIG_HUGETLB_YES);
	set_ok(c, "hugetlb", "NO");
	ck_assert_int_eq(c->hugetlb, CONFIG_HUGETLB_NO);
	set_ok(c, "revoke-enforce", "none");
	ck_assert_int_eq(c->revoke_enforce, ENFORCE_NONE);
	set_ok(c, "revoke-enforce", "disconnect");
	ck_assert_int_eq(c->revoke_enforce, ENFORCE_DISCONNECT);
	set_ok(c, "revoke-enforce", "sigkill");
	ck_assert_int_eq(c->revoke_enforce, ENFORCE_SIGKILL);
	ck_assert_str_eq(config_enforce_name(ENFORCE_SIGKILL), "sigkill");
	ck_assert_str_eq(config_enforce_name(ENFORCE_SIGTERM), "sigterm");
	ck_assert_str_eq(config_enforce_name((enum config_enforce)17), "unknown");
	config_free(c);
}
END_TEST

START_TEST(test_enum_rejects_unknown_choice_and_lists_them)
{
	char *err = set_fails("revoke-enforce", "kill", -EINVAL);

	ck_assert_str_eq(err,
			 "revoke-enforce: 'kill' is not a choice; write one of none, disconnect, sigterm, sigkill");
	free(err);
}
END_TEST

START_TEST(test_log_level_takes_names_err_to_debug)
{
	struct config *c = defaults();
	char *err;

	set_ok(c, "log-level", "debug");
	ck_assert_int_eq(c->log_level, LOG_DEBUG);
	set_ok(c, "log-level", "err");
	ck_assert_int_eq(c->log_level, LOG_ERR);
	set_ok(c, "log-level", "warning");
	ck_assert_int_eq(c->log_level, LOG_WARNING);
	config_free(c);
	err = set_fails("log-level", "loud", -EINVAL);
	ck_assert_str_eq(err, "log-level: 'loud' is not a log level; write one of debug, info, notice, warning, err");
	free(err);
}
END_TEST

START_TEST(test_string_paths_must_be_absolute)
{
	struct config *c = defaults();
	char longpath[200];
	char *err;

	set_ok(c, "socket", "/tmp/x.sock");
	ck_assert_str_eq(c->socket_path, "/tmp/x.sock");
	set_ok(c, "admin-group", "");
	set_ok(c, "admin-group", "wheel");
	ck_assert_str_eq(c->admin_group, "wheel");
	config_free(c);

	err = set_fails("socket", "run/x.sock", -EINVAL);
	ck_assert_str_eq(err, "socket: 'run/x.sock' is not an absolute path; write one starting with /");
	free(err);
	memset(longpath, 'a', sizeof(longpath) - 1);
	longpath[0] = '/';
	longpath[sizeof(longpath) - 1] = '\0';
	free(set_fails("socket", longpath, -ERANGE));
	free(set_fails("proc-root", "", -EINVAL));
	free(set_fails("admin-group", "a\tb", -EINVAL));
}
END_TEST

START_TEST(test_unknown_key_is_enoent)
{
	struct config *c = defaults();
	char *err = NULL;

	ck_assert_int_eq(config_set(c, "bugdet", "1G", &err), -ENOENT);
	ck_assert_str_eq(err, "unknown key 'bugdet'");
	free(err);
	ck_assert_int_eq(config_set(c, "budget", "1G", NULL), 0);
	ck_assert_int_eq(config_set(c, "budget", "bad", NULL), -EINVAL);
	config_free(c);
}
END_TEST

START_TEST(test_resolve_applies_percentages)
{
	struct size_spec pct = { .pct = 25, .is_pct = true }, abs = { .bytes = 4096 };
	struct size_spec all = { .pct = 100, .is_pct = true };

	ck_assert_uint_eq(config_resolve(&pct, 1000), 250);
	ck_assert_uint_eq(config_resolve(&abs, 1000), 4096);
	ck_assert_uint_eq(config_resolve(&all, UINT64_MAX), UINT64_MAX);
	ck_assert_uint_eq(config_resolve(&all, (UINT64_C(1) << 53) + 1), (UINT64_C(1) << 53) + 1);
}
END_TEST

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
	unlink(path);
	free(path);
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
	unlink(path);
	free(path);
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
	unlink(path);
	free(path);
}
END_TEST

/* Was a constant (256): a key with bounds, and file:line errors like every key's. */
START_TEST(test_max_registrants_per_file_defaults_to_256_and_is_bounded)
{
	char *path = write_temp("max-registrants-per-file = 4097\n");
	struct config *c = defaults();

	ck_assert_uint_eq(c->max_registrants_per_file, 256);
	set_ok(c, "max-registrants-per-file", "0");
	ck_assert_uint_eq(c->max_registrants_per_file, 0);
	set_ok(c, "max-registrants-per-file", "4096");
	ck_assert_uint_eq(c->max_registrants_per_file, 4096);
	expect_file_error_and_free(
		c, path, 1, "max-registrants-per-file: '4097' is out of range; write a whole number from 0 to 4096");
}
END_TEST

/*
 * Was a constant (1 GiB, issue 27): the largest start warm-up finished before READY. A size from 0 (always
 * beside the loop) up, whole pages, restart-only; errors carry file:line like every key's.
 */
START_TEST(test_prewarm_before_ready_defaults_to_1g_and_is_a_size)
{
	char *path = write_temp("# warm-up\nprewarm-before-ready = 6000\n");
	struct config *c = defaults();
	char *err = NULL;

	ck_assert_uint_eq(c->prewarm_before_ready_bytes, 1ull << 30);
	ck_assert(!config_key_find("prewarm-before-ready")->reloadable);
	set_ok(c, "prewarm-before-ready", "0");
	ck_assert_uint_eq(c->prewarm_before_ready_bytes, 0);
	set_ok(c, "prewarm-before-ready", "64G");
	ck_assert_uint_eq(c->prewarm_before_ready_bytes, 64ull << 30);
	set_ok(c, "prewarm-before-ready", "1024T");
	ck_assert_uint_eq(c->prewarm_before_ready_bytes, 1ull << 50);
	ck_assert_int_eq(config_validate(c, &err), 0);
	err = set_fails("prewarm-before-ready", "1025T", -ERANGE);
	ck_assert_str_eq(err, "prewarm-before-ready: '1025T' is out of range; write a size from 0 to 1024T");
	free(err);
	err = set_fails("prewarm-before-ready", "all", -EINVAL);
	ck_assert_str_eq(err, "prewarm-before-ready: 'all' is not a size; write a number with an optional K, M, G or "
			      "T suffix");
	free(err);
	free(set_fails("prewarm-before-ready", "-1G", -EINVAL));
	free(set_fails("prewarm-before-ready", "1.5G", -EINVAL));
	free(set_fails("prewarm-before-ready", "50%", -EINVAL));

	expect_file_error_and_free(c, path, 2,
				   "prewarm-before-ready: '6000' is not a multiple of 4K (the page size); round it");
}
END_TEST

/*
 * Was a constant (16 GiB): the most a start warm-up pins before the pool's books count it. A size from 2M (a
 * batch always holds one chunk, so less would mean the same) up, whole pages, restart-only; errors carry
 * file:line like every key's.
 */
START_TEST(test_warmup_batch_max_defaults_to_16g_and_is_a_size)
{
	char *path = write_temp("# warm-up\nprewarm-before-ready = 0\n\nwarmup-batch-max = 1M\n");
	struct config *c = defaults();
	char *err = NULL;

	ck_assert_uint_eq(c->warmup_batch_max_bytes, 16ull << 30);
	ck_assert(!config_key_find("warmup-batch-max")->reloadable);
	set_ok(c, "warmup-batch-max", "2M");
	ck_assert_uint_eq(c->warmup_batch_max_bytes, 2ull << 20);
	set_ok(c, "warmup-batch-max", "6M");
	ck_assert_uint_eq(c->warmup_batch_max_bytes, 6ull << 20);
	set_ok(c, "warmup-batch-max", "1024T");
	ck_assert_uint_eq(c->warmup_batch_max_bytes, 1ull << 50);
	ck_assert_int_eq(config_validate(c, &err), 0);
	err = set_fails("warmup-batch-max", "1025T", -ERANGE);
	ck_assert_str_eq(err, "warmup-batch-max: '1025T' is out of range; write a size from 2M to 1024T");
	free(err);
	err = set_fails("warmup-batch-max", "0", -ERANGE);
	ck_assert_str_eq(err, "warmup-batch-max: '0' is out of range; write a size from 2M to 1024T");
	free(err);
	err = set_fails("warmup-batch-max", "lots", -EINVAL);
	ck_assert_str_eq(err, "warmup-batch-max: 'lots' is not a size; write a number with an optional K, M, G or "
			      "T suffix");
	free(err);
	free(set_fails("warmup-batch-max", "-1G", -EINVAL));
	free(set_fails("warmup-batch-max", "1.5G", -EINVAL));
	free(set_fails("warmup-batch-max", "50%", -EINVAL));
	free(set_fails("warmup-batch-max", "2M+1", -EINVAL));

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
	unlink(path);
	free(path);
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
	unlink(path);
	free(path);
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
	unlink(path);
	free(path);
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
	unlink(path);
	free(path);
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
	unlink(path);
	free(path);
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
	unlink(path);
	free(path);
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

/* --- cross-key validation --- */

static char *validate_fails(struct config *c)
{
	char *err = NULL;

	ck_assert_int_eq(config_validate(c, &err), -EINVAL);
	ck_assert_ptr_nonnull(err);
	return err;
}

START_TEST(test_validate_critical_mem_must_be_below_tight)
{
	struct config *c = defaults();
	char *err;

	set_ok(c, "critical-mem-available-pct", "10");
	err = validate_fails(c);
	ck_assert_str_eq(err, "critical-mem-available-pct (10) must be below tight-mem-available-pct (10): "
			      "critical is the deeper state\n");
	free(err);
	/* 0 turns the critical signal off, whatever tight is. */
	set_ok(c, "critical-mem-available-pct", "0");
	set_ok(c, "tight-mem-available-pct", "0");
	ck_assert_int_eq(config_validate(c, NULL), 0);
	config_free(c);
}
END_TEST

START_TEST(test_validate_critical_swapout_must_not_be_below_tight)
{
	struct config *c = defaults();
	char *err;

	set_ok(c, "critical-swapout-pages-per-s", "500");
	err = validate_fails(c);
	ck_assert_ptr_nonnull(strstr(err, "critical-swapout-pages-per-s (500) must not be below"));
	free(err);
	set_ok(c, "critical-swapout-pages-per-s", "1000");
	ck_assert_int_eq(config_validate(c, NULL), 0);
	config_free(c);
}
END_TEST

START_TEST(test_validate_prewarm_not_above_absolute_budget)
{
	struct config *c = defaults();
	char *err;

	set_ok(c, "budget", "1G");
	set_ok(c, "prewarm", "2G");
	err = validate_fails(c);
	ck_assert_str_eq(err, "prewarm (2 GiB) is above budget (1 GiB); lower prewarm or raise budget\n");
	free(err);
	/* A percentage of the budget can't exceed it; an absolute prewarm against a % budget is resolved at run time. */
	set_ok(c, "prewarm", "50%");
	ck_assert_int_eq(config_validate(c, NULL), 0);
	set_ok(c, "prewarm", "2G");
	set_ok(c, "budget", "25%");
	ck_assert_int_eq(config_validate(c, NULL), 0);
	config_free(c);
}
END_TEST

START_TEST(test_validate_other_cross_key_limits)
{
	struct config *c;
	char *err;

	c = defaults();
	set_ok(c, "budget", "1G");
	set_ok(c, "uid-quota", "2G");
	err = validate_fails(c);
	ck_assert_ptr_nonnull(strstr(err, "uid-quota (2 GiB) is above budget (1 GiB)"));
	free(err);
	config_free(c);

	c = defaults();
	set_ok(c, "budget", "1M");
	set_ok(c, "prewarm", "0");
	err = validate_fails(c);
	ck_assert_ptr_nonnull(strstr(err, "smaller than chunk-size"));
	free(err);
	config_free(c);

	c = defaults();
	set_ok(c, "max-connections-per-uid", "2000");
	free(validate_fails(c));
	config_free(c);

	c = defaults();
	set_ok(c, "psi-stall-ms", "3000");
	free(validate_fails(c));
	config_free(c);

	c = defaults();
	set_ok(c, "hugetlb", "yes");
	set_ok(c, "chunk-size", "64K");
	err = validate_fails(c);
	ck_assert_str_eq(err, "chunk-size (64 KiB) is not a multiple of 2M, which hugetlb = yes needs\n");
	free(err);
	config_free(c);
}
END_TEST

START_TEST(test_validate_collects_every_error)
{
	struct config *c = defaults();
	char *err;

	set_ok(c, "critical-mem-available-pct", "50");
	set_ok(c, "critical-swapout-pages-per-s", "1");
	set_ok(c, "max-connections-per-uid", "5000");
	set_ok(c, "psi-stall-ms", "5000");
	err = validate_fails(c);
	ck_assert_uint_eq(count_lines(err), 4);
	free(err);
	config_free(c);
}
END_TEST

START_TEST(test_validate_default_prewarm_yields_to_a_smaller_budget)
{
	struct config *c = defaults();
	char *err;

	/* budget 128M alone: the embedded prewarm (256M) yields instead of refusing the start. */
	set_ok(c, "budget", "128M");
	ck_assert(config_prewarm_yields(c));
	ck_assert_int_eq(config_validate(c, NULL), 0);
	ck_assert(!config_is_user_set(c, "prewarm"));
	ck_assert(config_is_user_set(c, "budget"));
	/* Both set by the user and in conflict: still an error. */
	set_ok(c, "prewarm", "256M");
	ck_assert(!config_prewarm_yields(c));
	err = validate_fails(c);
	ck_assert_str_eq(err, "prewarm (256 MiB) is above budget (128 MiB); lower prewarm or raise budget\n");
	free(err);
	config_free(c);
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
	unlink(path);
	free(path);
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
	unlink(path);
	free(path);
	config_free(running);
	config_free(n);
}
END_TEST

/* --- copies --- */

START_TEST(test_dup_copies_deeply)
{
	struct config *c = scrambled(), *d = NULL;

	ck_assert_int_eq(config_dup(c, &d), 0);
	assert_config_equal(c, d);
	ck_assert_ptr_ne(c->socket_path, d->socket_path);
	ck_assert_ptr_ne(c->admin_group, d->admin_group);
	ck_assert_ptr_ne(c->proc_root, d->proc_root);
	set_ok(c, "admin-group", "changed");
	set_ok(c, "budget", "3G");
	ck_assert_str_eq(d->admin_group, "/alt");
	ck_assert(d->budget.is_pct);
	config_free(c);
	/* d outlives c: under ASan a shared string would be a use-after-free here. */
	ck_assert_str_eq(d->socket_path, "/alt");
	config_free(d);
	config_free(NULL);
}
END_TEST

/* ---------------------------------------------------------------- sources */

static enum config_source source_of(const struct config *c, const char *key, unsigned *line)
{
	const struct config_key *k = config_key_find(key);

	ck_assert_ptr_nonnull(k);
	return config_source_of(c, k, line);
}

START_TEST(test_source_is_default_until_something_sets_the_key)
{
	struct config *c = defaults();
	unsigned line = 99;

	ck_assert_int_eq(source_of(c, "budget", &line), CONFIG_SOURCE_DEFAULT);
	ck_assert_uint_eq(line, 0);
	ck_assert_ptr_null(config_file_path(c));
	ck_assert_str_eq(config_source_name(CONFIG_SOURCE_DEFAULT), "default");
	config_free(c);
}
END_TEST

START_TEST(test_source_file_carries_the_path_and_line)
{
	char *path = write_temp("# comment\n\nbudget = 8G\nuid-quota = 50%\n");
	struct config *c = defaults(), *d = NULL;
	unsigned line = 0;
	char *err = NULL;

	ck_assert_int_eq(config_load_file(c, path, &err), 0);
	ck_assert_int_eq(source_of(c, "budget", &line), CONFIG_SOURCE_FILE);
	ck_assert_uint_eq(line, 3);
	ck_assert_int_eq(source_of(c, "uid-quota", &line), CONFIG_SOURCE_FILE);
	ck_assert_uint_eq(line, 4);
	ck_assert_int_eq(source_of(c, "prewarm", &line), CONFIG_SOURCE_DEFAULT);
	ck_assert_str_eq(config_file_path(c), path);
	ck_assert_str_eq(config_source_name(CONFIG_SOURCE_FILE), "file");
	/* A copy keeps the file: a reload's dup still says where each value came from. */
	ck_assert_int_eq(config_dup(c, &d), 0);
	ck_assert_ptr_ne(config_file_path(d), config_file_path(c));
	ck_assert_str_eq(config_file_path(d), path);
	ck_assert_int_eq(source_of(d, "budget", &line), CONFIG_SOURCE_FILE);
	ck_assert_uint_eq(line, 3);
	config_free(d);
	config_free(c);
	unlink(path);
	free(path);
}
END_TEST

START_TEST(test_source_command_line_environment_and_set_are_told_apart)
{
	struct config *c = defaults();
	char *err = NULL;

	ck_assert_int_eq(config_set(c, "budget", "4G", &err), 0);
	ck_assert_int_eq(source_of(c, "budget", NULL), CONFIG_SOURCE_COMMAND_LINE);
	ck_assert_str_eq(config_source_name(CONFIG_SOURCE_COMMAND_LINE), "command line");
	ck_assert_int_eq(config_set(c, "socket", "/run/x.sock", &err), 0);
	ck_assert_int_eq(config_mark_env(c, "socket"), 0);
	ck_assert_int_eq(source_of(c, "socket", NULL), CONFIG_SOURCE_ENVIRONMENT);
	ck_assert_str_eq(config_source_name(CONFIG_SOURCE_ENVIRONMENT), "environment");
	ck_assert_int_eq(config_mark_env(c, "no-such-key"), -ENOENT);
	ck_assert_int_eq(config_mark_runtime(c, "budget"), 0);
	ck_assert_int_eq(source_of(c, "budget", NULL), CONFIG_SOURCE_SET);
	ck_assert_str_eq(config_source_name(CONFIG_SOURCE_SET), "set");
	config_free(c);
}
END_TEST

/* SIGHUP: a fresh file load, then the set values copied over it; each keeps its own source. */
START_TEST(test_source_survives_reload_keep_runtime_and_keep_fixed)
{
	char *path = write_temp("max-connections = 500\nbudget = 2G\nchunk-size = 4M\n");
	struct config *running = defaults(), *n = defaults();
	unsigned line = 0;
	char *err = NULL;

	ck_assert_int_eq(config_set(running, "max-connections", "900", &err), 0);
	ck_assert_int_eq(config_mark_runtime(running, "max-connections"), 0);
	ck_assert_int_eq(config_load_file(n, path, &err), 0);
	ck_assert_int_eq(config_keep_runtime(n, running, NULL, NULL), 0);
	ck_assert_int_eq(source_of(n, "max-connections", NULL), CONFIG_SOURCE_SET);
	ck_assert_int_eq(source_of(n, "budget", &line), CONFIG_SOURCE_FILE);
	ck_assert_uint_eq(line, 2);
	/* chunk-size is fixed at start: the running value is kept, and so is its source. */
	ck_assert_int_eq(config_keep_fixed(n, running, NULL, NULL), 0);
	ck_assert_int_eq(source_of(n, "chunk-size", NULL), CONFIG_SOURCE_DEFAULT);
	config_free(n);
	config_free(running);
	unlink(path);
	free(path);
}
END_TEST

START_TEST(test_format_value_spells_values_as_the_file_does)
{
	struct config *c = defaults();
	char buf[64], *err = NULL;

	ck_assert_int_eq(config_set(c, "budget", "8G", &err), 0);
	config_format_value(c, config_key_find("budget"), buf, sizeof(buf));
	ck_assert_str_eq(buf, "8G");
	config_format_value(c, config_key_find("uid-quota"), buf, sizeof(buf));
	ck_assert_str_eq(buf, "100%");
	config_format_value(c, config_key_find("admin-group"), buf, sizeof(buf));
	ck_assert_str_eq(buf, "\"\"");
	config_format_value(c, config_key_find("pool-shrink-delay-ms"), buf, sizeof(buf));
	ck_assert_str_eq(buf, "30000");
	config_free(c);
}
END_TEST

START_TEST(test_suggest_key_names_a_close_key_only)
{
	ck_assert_str_eq(config_suggest_key("bugdet"), "budget");
	ck_assert_str_eq(config_suggest_key("max-conections"), "max-connections");
	ck_assert_ptr_null(config_suggest_key("zzzzzzzzzzzz"));
	ck_assert_ptr_null(config_suggest_key(NULL));
}
END_TEST

/* Issue 23: a daemon installed with `cmake --install --prefix P` reads P's config without --config. */
START_TEST(test_default_path_follows_the_install_prefix)
{
	char p[PATH_MAX], tiny[8];

	ck_assert_int_eq(config_default_path_for("/home/u/pb/sbin/pinbrokerd", p, sizeof(p)), 0);
	ck_assert_str_eq(p, "/home/u/pb/etc/pinbroker/pinbrokerd.conf");
	ck_assert_int_eq(config_default_path_for("/usr/local/sbin/pinbrokerd", p, sizeof(p)), 0);
	ck_assert_str_eq(p, "/usr/local/etc/pinbroker/pinbrokerd.conf");
	/* The distribution's prefixes keep /etc, as GNUInstallDirs and the install rules do. */
	ck_assert_int_eq(config_default_path_for("/usr/sbin/pinbrokerd", p, sizeof(p)), 0);
	ck_assert_str_eq(p, "/etc/pinbroker/pinbrokerd.conf");
	ck_assert_int_eq(config_default_path_for("/sbin/pinbrokerd", p, sizeof(p)), 0);
	ck_assert_str_eq(p, "/etc/pinbroker/pinbrokerd.conf");
	/* Not an installed layout (a build tree, a folder merely ending in "sbin"): the system path. */
	ck_assert_int_eq(config_default_path_for("/src/pinbroker/build/daemon/pinbrokerd", p, sizeof(p)), 0);
	ck_assert_str_eq(p, "/etc/pinbroker/pinbrokerd.conf");
	ck_assert_int_eq(config_default_path_for("/opt/notsbin/pinbrokerd", p, sizeof(p)), 0);
	ck_assert_str_eq(p, "/etc/pinbroker/pinbrokerd.conf");
	ck_assert_int_eq(config_default_path_for(NULL, p, sizeof(p)), 0);
	ck_assert_str_eq(p, "/etc/pinbroker/pinbrokerd.conf");
	ck_assert_int_eq(config_default_path_for("/home/u/pb/sbin/pinbrokerd", tiny, sizeof(tiny)), -ENAMETOOLONG);
}
END_TEST

static Suite *config_suite(void)
{
	Suite *s = suite_create("config");

	CHECK_CASE(s, "table", NULL, NULL, TIMEOUT_S, test_table_keys_are_unique_and_documented,
		   test_reloadable_flags_match_the_written_out_lists,
		   test_keep_fixed_keeps_exactly_the_unreloadable_keys, test_keep_fixed_notes_each_kept_key,
		   test_every_default_parses, test_defaults_validate, test_defaults_hold_documented_values);

	CHECK_CASE(s, "values", NULL, NULL, TIMEOUT_S, test_size_accepts_suffixes_within_range,
		   test_size_rejects_garbage_range_and_odd_pages, test_size_or_pct_accepts_both_forms,
		   test_size_or_pct_says_what_to_write, test_uint_accepts_range_bounds,
		   test_uint_rejects_negatives_garbage_and_out_of_range, test_double_accepts_decimals,
		   test_double_rejects_non_numbers_and_out_of_range, test_bool_accepts_every_spelling,
		   test_bool_rejects_other_words, test_enum_maps_choices_in_order,
		   test_enum_rejects_unknown_choice_and_lists_them, test_log_level_takes_names_err_to_debug,
		   test_string_paths_must_be_absolute, test_unknown_key_is_enoent, test_resolve_applies_percentages);

	CHECK_CASE(s, "files", NULL, NULL, TIMEOUT_S, test_file_with_comments_and_blank_lines_loads,
		   test_file_quotes_allow_an_empty_value, test_file_errors_carry_path_and_line_and_are_all_collected,
		   test_max_registrants_per_file_defaults_to_256_and_is_bounded,
		   test_prewarm_before_ready_defaults_to_1g_and_is_a_size,
		   test_warmup_batch_max_defaults_to_16g_and_is_a_size, test_file_unknown_key_suggests_the_closest,
		   test_file_duplicate_key_names_the_first_line, test_missing_file_is_enoent_with_message,
		   test_empty_file_loads_nothing, test_sample_config_round_trips_to_defaults,
		   test_sample_config_loads_as_is_without_changes, test_dump_round_trips_any_config,
		   test_dump_writes_defaults_as_in_the_table, test_markdown_has_a_row_per_key);

	CHECK_CASE(s, "validate", NULL, NULL, TIMEOUT_S, test_validate_critical_mem_must_be_below_tight,
		   test_validate_critical_swapout_must_not_be_below_tight,
		   test_validate_prewarm_not_above_absolute_budget, test_validate_other_cross_key_limits,
		   test_validate_collects_every_error, test_validate_default_prewarm_yields_to_a_smaller_budget,
		   test_validate_errors_carry_the_file_line, test_runtime_values_are_kept_over_a_reloaded_file,
		   test_dup_copies_deeply);

	CHECK_CASE(s, "sources", NULL, NULL, TIMEOUT_S, test_source_is_default_until_something_sets_the_key,
		   test_source_file_carries_the_path_and_line,
		   test_source_command_line_environment_and_set_are_told_apart,
		   test_source_survives_reload_keep_runtime_and_keep_fixed,
		   test_format_value_spells_values_as_the_file_does, test_suggest_key_names_a_close_key_only,
		   test_default_path_follows_the_install_prefix);
	return s;
}

CHECK_MAIN(config_suite)

/* SPDX-License-Identifier: MIT */
/* Check suite for daemon/config: the key table, value parsing, cross-key validation, copies and sources (files: check_config_files.c). */
#include <check.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

#include "config.h"
#include "config_values.h"
#include "config_fixture.h"
#include "check_main.h"

/* --- the table --- */

START_TEST(test_table_keys_are_unique_and_documented)
{
	size_t n;
	const struct config_key *keys = config_keys(&n);

	ck_assert_uint_eq(n, 57); /* one per field of struct config */
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

/* A value the key takes, and where it lands: the field's offset in struct config and what it then holds
 * (num for numbers, sizes and choices; pct for a percentage of a size-or-percentage; str for strings). */
struct accept_row {
	const char *key, *value;
	size_t field;
	double num;
	bool pct;
	const char *str;
};

#define NUM(key, value, member, num)                                          \
	{                                                                     \
		key, value, offsetof(struct config, member), num, false, NULL \
	}
#define PCT(key, value, member, num)                                         \
	{                                                                    \
		key, value, offsetof(struct config, member), num, true, NULL \
	}
#define STR(key, value, member, str)                                       \
	{                                                                  \
		key, value, offsetof(struct config, member), 0, false, str \
	}

static const struct accept_row accept_rows[] = {
	/* Sizes take K, M, G and T suffixes within the key's range. */
	NUM("chunk-size", "4K", chunk_bytes, 4096),
	NUM("chunk-size", "1G", chunk_bytes, 1u << 30),
	NUM("chunk-size", "8192", chunk_bytes, 8192),
	NUM("prewarm-before-ready", "0", prewarm_before_ready_bytes, 0),
	NUM("prewarm-before-ready", "64G", prewarm_before_ready_bytes, 64ull << 30),
	NUM("prewarm-before-ready", "1024T", prewarm_before_ready_bytes, 1ull << 50),
	NUM("warmup-batch-max", "2M", warmup_batch_max_bytes, 2ull << 20),
	NUM("warmup-batch-max", "6M", warmup_batch_max_bytes, 6ull << 20),
	NUM("warmup-batch-max", "1024T", warmup_batch_max_bytes, 1ull << 50),
	/* A size or a percentage. */
	NUM("budget", "64G", budget, 64ull << 30),
	PCT("budget", "12.5%", budget, 12.5),
	NUM("prewarm", "0", prewarm, 0),
	/* Whole numbers up to their bounds. */
	NUM("prewarm-threads", "64", prewarm_threads, 64),
	NUM("prewarm-threads", "0", prewarm_threads, 0),
	NUM("poll-interval-ms", "50", poll_interval_ms, 50),
	NUM("max-message-bytes", "256", max_message_bytes, 256),
	NUM("max-message-bytes", "1048576", max_message_bytes, 1048576),
	NUM("pool-shrink-delay-ms", "4294967295", pool_shrink_delay_ms, UINT32_MAX),
	NUM("max-registrants-per-file", "0", max_registrants_per_file, 0),
	NUM("max-registrants-per-file", "4096", max_registrants_per_file, 4096),
	NUM("max-reservations-per-uid", "1", max_reservations_per_uid, 1),
	NUM("max-reservations-per-uid", "1024", max_reservations_per_uid, 1024),
	/* Decimals. */
	NUM("tight-mem-available-pct", "12.5", tight_mem_available_pct, 12.5),
	NUM("critical-mem-available-pct", ".5", critical_mem_available_pct, 0.5),
	NUM("tight-swapout-pages-per-s", "1e4", tight_swapout_pages_s, 10000),
	NUM("tight-psi-some-avg10", "100", tight_psi_some_avg10, 100),
	/* Choices, in any case, map in order. */
	NUM("hugetlb", "yes", hugetlb, CONFIG_HUGETLB_YES),
	NUM("hugetlb", "NO", hugetlb, CONFIG_HUGETLB_NO),
	NUM("revoke-enforce", "none", revoke_enforce, ENFORCE_NONE),
	NUM("revoke-enforce", "disconnect", revoke_enforce, ENFORCE_DISCONNECT),
	NUM("revoke-enforce", "sigkill", revoke_enforce, ENFORCE_SIGKILL),
	/* Log levels by name, err to debug. */
	NUM("log-level", "debug", log_level, LOG_DEBUG),
	NUM("log-level", "err", log_level, LOG_ERR),
	NUM("log-level", "warning", log_level, LOG_WARNING),
	/* Strings: paths absolute, a group name or nothing. */
	STR("socket", "/tmp/x.sock", socket_path, "/tmp/x.sock"),
	STR("admin-group", "", admin_group, ""),
	STR("admin-group", "wheel", admin_group, "wheel"),
};

/* The number a field of k's type holds at p (a size-or-percentage: its percentage or its bytes). */
static double field_number(const struct config_key *k, const void *p, bool *is_pct)
{
	*is_pct = false;
	switch (k->type) {
	case CT_SIZE:
		return (double)*(const uint64_t *)p;
	case CT_SIZE_PCT: {
		const struct size_spec *s = p;

		*is_pct = s->is_pct;
		return s->is_pct ? s->pct : (double)s->bytes;
	}
	case CT_UINT:
		return *(const uint32_t *)p;
	case CT_DOUBLE:
		return *(const double *)p;
	case CT_BOOL:
		return *(const bool *)p;
	case CT_ENUM:
	case CT_LOGLEVEL:
		return *(const int *)p;
	case CT_STRING:
		break;
	}
	return NAN;
}

START_TEST(test_value_is_accepted_into_its_field)
{
	const struct accept_row *r = &accept_rows[_i];
	const struct config_key *k = config_key_find(r->key);
	struct config *c = defaults();
	const void *p = (const char *)c + r->field;
	bool is_pct;

	ck_assert_ptr_nonnull(k);
	ck_assert_msg(k->offset == r->field, "%s: stored at %zu, not in its field at %zu", r->key, k->offset, r->field);
	set_ok(c, r->key, r->value);
	if (r->str) {
		ck_assert_str_eq(*(char *const *)p, r->str);
	} else {
		double got = field_number(k, p, &is_pct);

		ck_assert_msg(got == r->num && is_pct == r->pct, "%s = '%s' holds %g%s, want %g%s", r->key, r->value,
			      got, is_pct ? "%" : "", r->num, r->pct ? "%" : "");
	}
	config_free(c);
}
END_TEST

/* A value the key refuses: the error, and the whole message or a phrase of it (neither: any "key: ..."). */
struct refuse_row {
	const char *key, *value;
	int rc;
	const char *msg, *part;
};

static const struct refuse_row refuse_rows[] = {
	{ "chunk-size", "12Q", -EINVAL,
	  "chunk-size: '12Q' is not a size; write a number with an optional K, M, G or T suffix", NULL },
	{ "chunk-size", "2K", -ERANGE, "chunk-size: '2K' is out of range; write a size from 4K to 1G", NULL },
	{ "chunk-size", "2G", -ERANGE, NULL, NULL },
	{ "chunk-size", "99999999999T", -ERANGE, NULL, NULL },
	{ "chunk-size", "25%", -EINVAL, NULL, NULL },
	{ "chunk-size", "", -EINVAL, NULL, NULL },
	{ "chunk-size", "5000", -EINVAL, NULL, "multiple of 4K" },
	{ "budget", "12Q", -EINVAL,
	  "budget: '12Q' is not a size; write a number with an optional K, M, G or T suffix, or a percentage like 25%",
	  NULL },
	{ "budget", "150%", -ERANGE, "budget: '150%' is out of range; a percentage must be from 0% to 100%", NULL },
	{ "uid-quota", "99999999999T", -ERANGE, NULL, NULL },
	{ "prewarm", "-5%", -EINVAL, NULL, NULL },
	{ "prewarm-threads", "65", -ERANGE, "prewarm-threads: '65' is out of range; write a whole number from 0 to 64",
	  NULL },
	{ "prewarm-threads", "-1", -EINVAL, "prewarm-threads: '-1' is not a whole number; write digits only, like 0",
	  NULL },
	{ "prewarm-threads", "four", -EINVAL, NULL, NULL },
	{ "max-reservations-per-uid", "0", -ERANGE,
	  "max-reservations-per-uid: '0' is out of range; write a whole number from 1 to 1024", NULL },
	{ "max-reservations-per-uid", "1025", -ERANGE, NULL, NULL },
	{ "prewarm-threads", " 4", -EINVAL, NULL, NULL },
	{ "prewarm-threads", "4.0", -EINVAL, NULL, NULL },
	{ "poll-interval-ms", "49", -ERANGE, NULL, NULL },
	{ "max-message-bytes", "255", -ERANGE, NULL, NULL },
	{ "max-message-bytes", "1048577", -ERANGE, NULL, NULL },
	{ "pool-shrink-delay-ms", "4294967296", -ERANGE, NULL, NULL },
	{ "pool-shrink-delay-ms", "99999999999999999999999", -ERANGE, NULL, NULL },
	{ "max-connections", "0", -ERANGE, NULL, NULL },
	{ "tight-mem-available-pct", "ten", -EINVAL,
	  "tight-mem-available-pct: 'ten' is not a number; write a decimal like 10 or 2.5", NULL },
	{ "tight-mem-available-pct", "101", -ERANGE,
	  "tight-mem-available-pct: '101' is out of range; write a number from 0 to 100", NULL },
	{ "tight-mem-available-pct", "nan", -EINVAL, NULL, NULL },
	{ "tight-mem-available-pct", "inf", -EINVAL, NULL, NULL },
	{ "tight-mem-available-pct", "-1", -EINVAL, NULL, NULL },
	{ "tight-mem-available-pct", "5%", -EINVAL, NULL, NULL },
	{ "tight-mem-available-pct", "", -EINVAL, NULL, NULL },
	{ "lock-memory", "maybe", -EINVAL,
	  "lock-memory: 'maybe' is not a boolean; write yes or no (true/false, on/off, 1/0 work too)", NULL },
	{ "lock-memory", "2", -EINVAL, NULL, NULL },
	{ "revoke-enforce", "kill", -EINVAL,
	  "revoke-enforce: 'kill' is not a choice; write one of none, disconnect, sigterm, sigkill", NULL },
	{ "log-level", "loud", -EINVAL,
	  "log-level: 'loud' is not a log level; write one of debug, info, notice, warning, err", NULL },
	{ "socket", "run/x.sock", -EINVAL, "socket: 'run/x.sock' is not an absolute path; write one starting with /",
	  NULL },
	{ "proc-root", "", -EINVAL, NULL, NULL },
	{ "admin-group", "a\tb", -EINVAL, NULL, NULL },
	{ "prewarm-before-ready", "1025T", -ERANGE,
	  "prewarm-before-ready: '1025T' is out of range; write a size from 0 to 1024T", NULL },
	{ "prewarm-before-ready", "all", -EINVAL,
	  "prewarm-before-ready: 'all' is not a size; write a number with an optional K, M, G or T suffix", NULL },
	{ "prewarm-before-ready", "-1G", -EINVAL, NULL, NULL },
	{ "prewarm-before-ready", "1.5G", -EINVAL, NULL, NULL },
	{ "prewarm-before-ready", "50%", -EINVAL, NULL, NULL },
	{ "warmup-batch-max", "1025T", -ERANGE,
	  "warmup-batch-max: '1025T' is out of range; write a size from 2M to 1024T", NULL },
	{ "warmup-batch-max", "0", -ERANGE, "warmup-batch-max: '0' is out of range; write a size from 2M to 1024T",
	  NULL },
	{ "warmup-batch-max", "lots", -EINVAL,
	  "warmup-batch-max: 'lots' is not a size; write a number with an optional K, M, G or T suffix", NULL },
	{ "warmup-batch-max", "-1G", -EINVAL, NULL, NULL },
	{ "warmup-batch-max", "1.5G", -EINVAL, NULL, NULL },
	{ "warmup-batch-max", "50%", -EINVAL, NULL, NULL },
	{ "warmup-batch-max", "2M+1", -EINVAL, NULL, NULL },
};

START_TEST(test_value_is_refused_with_what_to_write)
{
	const struct refuse_row *r = &refuse_rows[_i];
	char *err = set_fails(r->key, r->value, r->rc);

	if (r->msg)
		ck_assert_str_eq(err, r->msg);
	if (r->part)
		ck_assert_msg(strstr(err, r->part), "%s = '%s': \"%s\" lacks \"%s\"", r->key, r->value, err, r->part);
	free(err);
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

START_TEST(test_enforce_names)
{
	ck_assert_str_eq(config_enforce_name(ENFORCE_SIGKILL), "sigkill");
	ck_assert_str_eq(config_enforce_name(ENFORCE_SIGTERM), "sigterm");
	ck_assert_str_eq(config_enforce_name((enum config_enforce)17), "unknown");
}
END_TEST

START_TEST(test_string_path_too_long_is_out_of_range)
{
	char longpath[200];

	memset(longpath, 'a', sizeof(longpath) - 1);
	longpath[0] = '/';
	longpath[sizeof(longpath) - 1] = '\0';
	free(set_fails("socket", longpath, -ERANGE));
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

/* --- cross-key validation --- */

static char *validate_fails(struct config *c)
{
	char *err = NULL;

	ck_assert_int_eq(config_validate(c, &err), -EINVAL);
	ck_assert_ptr_nonnull(err);
	return err;
}

struct kv {
	const char *key, *value;
};

/* Keys set so that validation fails, the whole message or a phrase of it (neither: any), then groups of keys
 * set in turn after each of which it validates again. */
struct validate_row {
	struct kv set[2];
	const char *msg, *part;
	struct kv fix[2][2];
};

static const struct validate_row validate_rows[] = {
	/* 0 turns the critical signal off, whatever tight is. */
	{ .set = { { "critical-mem-available-pct", "10" } },
	  .msg = "critical-mem-available-pct (10) must be below tight-mem-available-pct (10): critical is the deeper "
		 "state\n",
	  .fix = { { { "critical-mem-available-pct", "0" }, { "tight-mem-available-pct", "0" } } } },
	{ .set = { { "critical-swapout-pages-per-s", "500" } },
	  .part = "critical-swapout-pages-per-s (500) must not be below",
	  .fix = { { { "critical-swapout-pages-per-s", "1000" } } } },
	/* A percentage of the budget can't exceed it; an absolute prewarm against a % budget is resolved at run time. */
	{ .set = { { "budget", "1G" }, { "prewarm", "2G" } },
	  .msg = "prewarm (2 GiB) is above budget (1 GiB); lower prewarm or raise budget\n",
	  .fix = { { { "prewarm", "50%" } }, { { "prewarm", "2G" }, { "budget", "25%" } } } },
	{ .set = { { "budget", "1G" }, { "uid-quota", "2G" } }, .part = "uid-quota (2 GiB) is above budget (1 GiB)" },
	{ .set = { { "budget", "1M" }, { "prewarm", "0" } }, .part = "smaller than chunk-size" },
	{ .set = { { "max-connections-per-uid", "2000" } } },
	{ .set = { { "psi-stall-ms", "3000" } } },
	{ .set = { { "hugetlb", "yes" }, { "chunk-size", "64K" } },
	  .msg = "chunk-size (64 KiB) is not a multiple of 2M, which hugetlb = yes needs\n" },
};

START_TEST(test_validate_cross_key_limits)
{
	const struct validate_row *r = &validate_rows[_i];
	struct config *c = defaults();
	char *err;

	for (size_t i = 0; i < 2 && r->set[i].key; i++)
		set_ok(c, r->set[i].key, r->set[i].value);
	err = validate_fails(c);
	if (r->msg)
		ck_assert_str_eq(err, r->msg);
	if (r->part)
		ck_assert_msg(strstr(err, r->part), "row %d: \"%s\" lacks \"%s\"", _i, err, r->part);
	free(err);
	for (size_t g = 0; g < 2 && r->fix[g][0].key; g++) {
		for (size_t i = 0; i < 2 && r->fix[g][i].key; i++)
			set_ok(c, r->fix[g][i].key, r->fix[g][i].value);
		ck_assert_msg(config_validate(c, NULL) == 0, "row %d: still invalid after fix %zu", _i, g);
	}
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
	drop_temp(path);
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
	drop_temp(path);
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
	TCase *tc;

	CHECK_CASE(s, "table", NULL, NULL, TIMEOUT_S, test_table_keys_are_unique_and_documented,
		   test_reloadable_flags_match_the_written_out_lists,
		   test_keep_fixed_keeps_exactly_the_unreloadable_keys, test_keep_fixed_notes_each_kept_key,
		   test_every_default_parses, test_defaults_validate, test_defaults_hold_documented_values);

	tc = CHECK_CASE(s, "values", NULL, NULL, TIMEOUT_S, test_bool_accepts_every_spelling, test_enforce_names,
			test_string_path_too_long_is_out_of_range, test_unknown_key_is_enoent,
			test_resolve_applies_percentages);
	tcase_add_loop_test(tc, test_value_is_accepted_into_its_field, 0,
			    (int)(sizeof(accept_rows) / sizeof(accept_rows[0])));
	tcase_add_loop_test(tc, test_value_is_refused_with_what_to_write, 0,
			    (int)(sizeof(refuse_rows) / sizeof(refuse_rows[0])));

	tc = CHECK_CASE(s, "validate", NULL, NULL, TIMEOUT_S, test_validate_collects_every_error,
			test_validate_default_prewarm_yields_to_a_smaller_budget, test_dup_copies_deeply);
	tcase_add_loop_test(tc, test_validate_cross_key_limits, 0,
			    (int)(sizeof(validate_rows) / sizeof(validate_rows[0])));

	CHECK_CASE(s, "sources", NULL, NULL, TIMEOUT_S, test_source_is_default_until_something_sets_the_key,
		   test_source_file_carries_the_path_and_line,
		   test_source_command_line_environment_and_set_are_told_apart,
		   test_source_survives_reload_keep_runtime_and_keep_fixed,
		   test_format_value_spells_values_as_the_file_does, test_suggest_key_names_a_close_key_only,
		   test_default_path_follows_the_install_prefix);
	return s;
}

CHECK_MAIN(config_suite)

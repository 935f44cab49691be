/* SPDX-License-Identifier: MIT */
/* reload: SIGHUP and pinctl set take their one gate from the key table, and agree on every key. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"
#include "budget.h"
#include "config.h"
#include "daemon.h"
#include "config_values.h"
#include "reload.h"
#include "check_main.h"

#define TIMEOUT_S 10

static struct config *defaults(void)
{
	struct config *c = NULL;

	ck_assert_int_eq(config_new(&c), 0);
	return c;
}

/* For every key, a reload applies a new value exactly when `set` accepts one: when the key is reloadable. */
START_TEST(test_reload_and_set_agree_on_every_key)
{
	size_t n;
	const struct config_key *keys = config_keys(&n);

	for (size_t i = 0; i < n; i++) {
		struct config *running = defaults(), *next = defaults(), *set = NULL;
		const char *value = NULL;
		char *err = NULL;
		bool reload_applies, set_applies;
		int r;

		ck_assert_msg(config_set_other_value(next, running, &keys[i], &value), "%s: no other value validates",
			      keys[i].name);
		ck_assert_int_eq(reload_keep_fixed(next, running), 0);
		reload_applies = !config_key_equal(next, running, &keys[i]);

		r = reload_prepare_set(running, keys[i].name, value, &set, &err);
		set_applies = r == 0;
		ck_assert_msg(r == 0 || r == -EPERM, "%s = %s: %d %s", keys[i].name, value, r, err ? err : "");
		if (r == 0) {
			ck_assert(!config_key_equal(set, running, &keys[i]));
			ck_assert(config_key_equal(set, next, &keys[i]));
		} else {
			ck_assert_ptr_nonnull(strstr(err, "cannot change while the daemon runs"));
		}

		ck_assert_msg(reload_applies == set_applies, "%s = %s: reload %s it, set %s it", keys[i].name, value,
			      reload_applies ? "applies" : "keeps", set_applies ? "applies" : "refuses");
		ck_assert_msg(set_applies == (config_expect_reloadable(keys[i].name) == 1),
			      "%s: set %s it, yet the docs say it %s", keys[i].name,
			      set_applies ? "applies" : "refuses",
			      config_expect_reloadable(keys[i].name) == 1 ? "is reloadable" : "needs a restart");
		ck_assert_msg(reload_applies == (config_expect_reloadable(keys[i].name) == 1),
			      "%s: reload %s it, yet the docs say it %s", keys[i].name,
			      reload_applies ? "applies" : "keeps",
			      reload_applies ? "needs a restart" : "is reloadable");
		free(err);
		config_free(set);
		config_free(running);
		config_free(next);
	}
}
END_TEST

START_TEST(test_set_refuses_unknown_and_bad_values)
{
	struct config *running = defaults(), *n = NULL;
	char *err = NULL;

	ck_assert_int_eq(reload_prepare_set(running, "bugdet", "1G", &n, &err), -ENOENT);
	ck_assert_str_eq(err, "unknown setting 'bugdet'");
	ck_assert_ptr_null(n);
	free(err);
	ck_assert_int_eq(reload_prepare_set(running, "budget", "12Q", &n, &err), -EINVAL);
	ck_assert_ptr_nonnull(err);
	ck_assert_ptr_null(n);
	free(err);
	/* Cross-key validation: critical above tight. */
	ck_assert_int_eq(reload_prepare_set(running, "critical-mem-available-pct", "50", &n, &err), -EINVAL);
	ck_assert_ptr_null(n);
	free(err);
	ck_assert_int_eq(reload_prepare_set(running, "budget", "1G", &n, &err), 0);
	ck_assert(config_is_user_set(n, "budget"));
	free(err);
	config_free(n);
	config_free(running);
}
END_TEST

START_TEST(test_resolve_sizes_clamps_to_budget_and_cap)
{
	struct config *c = defaults();
	struct broker b = { .mem_total_bytes = UINT64_C(16) << 30 };
	char *err = NULL;

	ck_assert_int_eq(config_set(c, "prewarm", "8G", &err), 0);
	reload_resolve_sizes(&b, c);
	ck_assert_uint_eq(b.budget_bytes, UINT64_C(4) << 30);
	ck_assert_uint_eq(b.uid_quota_bytes, UINT64_C(4) << 30);
	ck_assert_uint_eq(b.prewarm_bytes, UINT64_C(4) << 30);
	ck_assert_uint_eq(b.max_no_revoke_per_uid_bytes, UINT64_C(2) << 30);
	b.budget_cap_bytes = UINT64_C(1) << 30;
	reload_resolve_sizes(&b, c);
	ck_assert_uint_eq(b.budget_bytes, UINT64_C(1) << 30);
	ck_assert_uint_eq(b.prewarm_bytes, UINT64_C(1) << 30);
	ck_assert_uint_eq(b.max_no_revoke_per_uid_bytes, UINT64_C(512) << 20);
	config_free(c);
}
END_TEST

static int failing_reconfigure(struct broker *b, const struct config *cfg)
{
	(void)b;
	(void)cfg;
	return -EIO;
}

/* A hook that fails rolls the whole swap back: the running config, the sizes and the budget's limits stay. */
START_TEST(test_apply_rolls_back_when_a_hook_fails)
{
	static const struct reload_hooks hooks = { .reconfigure = failing_reconfigure };
	struct daemon d = { .broker = { .mem_total_bytes = UINT64_C(16) << 30 }, .reload_hooks = &hooks };
	struct broker *b = &d.broker;
	struct config *n = NULL;
	char *err = NULL;

	d.cfg = defaults();
	reload_resolve_sizes(b, d.cfg);
	ck_assert_int_eq(budget_new(b->budget_bytes, b->uid_quota_bytes, &b->budget), 0);
	ck_assert_int_eq(reload_prepare_set(d.cfg, "budget", "1G", &n, &err), 0);
	ck_assert_int_eq(reload_apply(b, n, &err), -EIO);
	ck_assert_str_eq(err, "cannot apply the monitor settings: Input/output error");
	ck_assert_uint_eq(b->budget_bytes, UINT64_C(4) << 30);
	ck_assert_uint_eq(budget_limit(b->budget), UINT64_C(4) << 30);
	ck_assert(d.cfg != n);
	free(err);
	config_free(n);
	config_free(d.cfg);
	budget_free(b->budget);
}
END_TEST

CHECK_SUITE(reload_suite, "reload", "gate", NULL, NULL, TIMEOUT_S, test_reload_and_set_agree_on_every_key,
	    test_set_refuses_unknown_and_bad_values, test_resolve_sizes_clamps_to_budget_and_cap,
	    test_apply_rolls_back_when_a_hook_fails)

CHECK_MAIN(reload_suite)

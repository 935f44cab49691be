/* SPDX-License-Identifier: MIT */
/* Swapping in a new config at run time: the one path SIGHUP and pinctl set share. */
#define _GNU_SOURCE
#include "reload.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"
#include "daemon.h"
#include "budget.h"
#include "config.h"
#include "jobs.h"
#include "log.h"
#include "util.h"

void reload_resolve_sizes(struct broker *b, const struct config *c)
{
	b->budget_bytes = config_resolve(&c->budget, b->mem_total_bytes);
	if (b->budget_cap_bytes && b->budget_bytes > b->budget_cap_bytes)
		b->budget_bytes = b->budget_cap_bytes;
	b->uid_quota_bytes = config_resolve(&c->uid_quota, b->budget_bytes);
	b->prewarm_bytes = config_resolve(&c->prewarm, b->budget_bytes);
	if (b->prewarm_bytes > b->budget_bytes)
		b->prewarm_bytes = b->budget_bytes;
	if (b->uid_quota_bytes > b->budget_bytes)
		b->uid_quota_bytes = b->budget_bytes;
	b->max_no_revoke_per_uid_bytes = config_resolve(&c->max_no_revoke_per_uid, b->uid_quota_bytes);
	b->max_registrants_per_file = c->max_registrants_per_file;
	config_settings(c, &b->settings);
}

static void note_fixed(const char *key, const char *wanted, const char *kept, void *ud)
{
	(void)ud;
	log_warnx("%s changed to '%s': it takes effect at the next restart, keeping '%s'", key, wanted, kept);
}

int reload_keep_fixed(struct config *n, const struct config *running)
{
	return config_keep_fixed(n, running, note_fixed, NULL);
}

int reload_prepare_set(const struct config *running, const char *key, const char *value, struct config **ret,
		       char **err)
{
	const struct config_key *k = config_key_find(key);
	struct config *n = NULL;
	int r;

	*err = NULL;
	if (!k) {
		if (asprintf(err, "unknown setting '%s'", key ? key : "") < 0)
			*err = NULL;
		return -ENOENT;
	}
	if (!k->reloadable) {
		if (asprintf(err, "'%s' cannot change while the daemon runs; set it in the config file and restart",
			     k->name) < 0)
			*err = NULL;
		return -EPERM;
	}
	r = config_dup(running, &n);
	if (r == 0)
		r = config_set(n, k->name, value, err);
	if (r == 0)
		r = config_validate(n, err);
	/* A reload keeps the value until restart, as it keeps command-line values. */
	if (r == 0)
		r = config_mark_runtime(n, k->name);
	if (r < 0) {
		config_free(n);
		return r;
	}
	*ret = n;
	return 0;
}

void reload_warn_job_quotas(const struct broker *b)
{
	char q[32], h[32];

	for (size_t i = 0; b->jobs && i < jobs_rule_count(b->jobs); i++) {
		const struct job_rule *r = jobs_rule_at(b->jobs, i);

		if (r->source == JOB_RULE_CONFIG && r->bytes > b->budget_bytes)
			log_warnx("job-quota: %s's %s is more than the whole budget (%s): the budget binds first, so "
				  "it limits nothing; give it a smaller size",
				  r->pattern, format_size(r->bytes, q, sizeof(q)),
				  format_size(b->budget_bytes, h, sizeof(h)));
	}
}

int reload_apply(struct broker *b, struct config *n, char **err)
{
	const struct reload_hooks *h = daemon_of(b)->reload_hooks;
	struct config *old = daemon_of(b)->cfg;
	int r;

	r = reload_keep_fixed(n, old);
	if (r < 0)
		return r;
	daemon_of(b)->cfg = n;
	reload_resolve_sizes(b, n);
	if (h && h->resolve_limits)
		h->resolve_limits(b);
	budget_set_limits(b->budget, b->budget_bytes, b->uid_quota_bytes);
	log_level = n->log_level;
	if (h && h->reconfigure) {
		r = h->reconfigure(b, n);
		if (r < 0) {
			daemon_of(b)->cfg = old;
			reload_resolve_sizes(b, old);
			if (h->resolve_limits)
				h->resolve_limits(b);
			budget_set_limits(b->budget, b->budget_bytes, b->uid_quota_bytes);
			log_level = old->log_level;
			if (err && asprintf(err, "cannot apply the monitor settings: %s", strerror(-r)) < 0)
				*err = NULL;
			return r;
		}
	}
	config_free(old);
	/* Job quotas: the config's rules are replaced (percentages follow the budget); pinctl quota set's stay. */
	if (b->jobs) {
		char *jerr = NULL;

		if (jobs_set_config(b->jobs, n->job_quota, b->budget_bytes, &jerr) < 0)
			log_warnx("%s; the job quotas of the config file are left as they were",
				  jerr ? jerr : "job-quota: out of memory");
		free(jerr);
		reload_warn_job_quotas(b);
	}
	/* A smaller budget shrinks the idle pool; a larger one lets waiting acquires through (applied). */
	daemon_trim_pool(b, b->state == BROKER_NORMAL ? b->prewarm_bytes : 0);
	if (h && h->applied)
		h->applied(b);
	return 0;
}

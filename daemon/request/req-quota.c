/* SPDX-License-Identifier: MIT */
/* QUOTA_SET and QUOTA_LIST: per-job quota rules (jobs.h), and the job rows STATUS shows too. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"
#include "budget.h"
#include "config.h"
#include "conn.h"
#include "daemon.h"
#include "jobs-watch.h"
#include "jobs.h"
#include "lease.h"
#include "log.h"
#include "quota-store.h"
#include "reply.h"
#include "request-int.h"
#include "revoker.h"
#include "util.h"

/* Job rows in a QUOTA_LIST reply: every job with a quota or leases fits under the reply limit. */
#define QUOTA_LIST_JOBS_MAX 512
/* Bytes of a refused path echoed back: enough to recognise it, short enough for the reason to fit. */
#define QUOTA_ECHO_MAX 80

static const char *source_name(enum job_rule_source s)
{
	return s == JOB_RULE_SET ? "set" : "config";
}

static int job_larger_first(const void *a, const void *b)
{
	const struct job *x = *(const struct job *const *)a, *y = *(const struct job *const *)b;

	if (x->bytes != y->bytes)
		return x->bytes < y->bytes ? 1 : -1;
	return strcmp(x->key, y->key);
}

size_t quota_fill_jobs(const struct broker *b, const struct conn *asker, bool see_all, Pinbroker__V1__JobInfo *rows,
		       Pinbroker__V1__JobInfo **ptrs, size_t max)
{
	const struct job **all, *own = NULL;
	size_t n = 0, k = 0;

	if (!b->jobs || max == 0)
		return 0;
	/* Someone who sees only their own rows sees their own connection's job, nothing else. */
	if (!see_all) {
		own = asker->cgroup ? asker->cgroup->job : NULL;
		all = &own;
		n = own && (own->leases || own->rule) ? 1 : 0;
	} else {
		all = calloc(jobs_count(b->jobs) + 1, sizeof(*all));
		if (!all)
			return 0;
		/* Connections alone make jobs too: list those that hold something or have a quota. */
		for (const struct job *jb = jobs_first(b->jobs); jb; jb = jb->next)
			if (jb->leases || jb->rule)
				all[n++] = jb;
		qsort(all, n, sizeof(*all), job_larger_first);
	}
	for (; k < n && k < max; k++) {
		Pinbroker__V1__JobInfo *x = &rows[k];
		const struct job *jb = all[k];

		pinbroker__v1__job_info__init(x);
		x->job = jb->key;
		x->has_bytes = true;
		x->bytes = jb->bytes;
		x->has_leases = true;
		x->leases = jb->leases;
		if (jb->rule) {
			x->has_quota_bytes = true;
			x->quota_bytes = jb->rule->bytes;
			x->rule = jb->rule->pattern;
			x->source = (char *)source_name(jb->rule->source);
		}
		ptrs[k] = x;
	}
	if (see_all)
		free(all);
	return k;
}

/* Revoke the revocable leases charged to a cgroup pattern matches; their ids into *ids. */
static size_t revoke_matching(struct conn *c, const char *pattern, uint32_t deadline_ms, uint64_t **ids)
{
	struct broker *b = c->broker;
	size_t n = 0, cap = 0;
	char reason[96];

	snprintf(reason, sizeof(reason), "job quota of %.60s taken back by uid %u", pattern, c->uid);
	*ids = NULL;
	/* A failed REVOKE send only marks its connection closing, so the walk stays valid. */
	for (struct lease *l = lease_first(b->leases); l; l = lease_next(b->leases, l)) {
		if (!l->cgroup || !jobs_pattern_matches(pattern, l->cgroup->path))
			continue;
		if ((l->state != LEASE_ACTIVE && l->state != LEASE_IDLE) || l->no_revoke)
			continue;
		if (n == cap) {
			uint64_t *nid = realloc(*ids, (cap ? cap * 2 : 16) * sizeof(**ids));

			if (!nid)
				break;
			*ids = nid;
			cap = cap ? cap * 2 : 16;
		}
		(*ids)[n++] = l->id;
		revoker_revoke(b, l, deadline_ms, REVOKED_JOB_QUOTA, reason);
	}
	return n;
}

/*
 * The reply to both: every rule, and the jobs the asker may see, with status (OK, or the failure to keep a change
 * made) and warning (NULL: none) as its message.
 */
static void reply_quota(struct conn *c, uint64_t seq, Pinbroker__V1__StatusCode status, const uint64_t *revoked,
			size_t nrevoked, const char *warning)
{
	struct broker *b = c->broker;
	Pinbroker__V1__QuotaReply qr = PINBROKER__V1__QUOTA_REPLY__INIT;
	bool see_all = c->admin || daemon_of(b)->cfg->status_visibility == VISIBILITY_ALL;
	size_t nrules = see_all ? jobs_rule_count(b->jobs) : 0;
	Pinbroker__V1__QuotaRule *rules = calloc(nrules + 1, sizeof(*rules));
	Pinbroker__V1__QuotaRule **rulep = calloc(nrules + 1, sizeof(*rulep));
	Pinbroker__V1__JobInfo *rows = calloc(QUOTA_LIST_JOBS_MAX, sizeof(*rows));
	Pinbroker__V1__JobInfo **rowp = calloc(QUOTA_LIST_JOBS_MAX, sizeof(*rowp));
	Pinbroker__V1__Reply r;

	if (!rules || !rulep || !rows || !rowp) {
		reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_INTERNAL, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < nrules; i++) {
		const struct job_rule *jr = jobs_rule_at(b->jobs, i);

		pinbroker__v1__quota_rule__init(&rules[i]);
		rules[i].pattern = jr->pattern;
		rules[i].bytes = jr->bytes;
		rules[i].source = (char *)source_name(jr->source);
		rules[i].has_seen = jr->source == JOB_RULE_SET && jr->literal;
		rules[i].seen = jr->seen;
		rulep[i] = &rules[i];
	}
	qr.n_rules = nrules;
	qr.rules = rulep;
	qr.n_jobs = quota_fill_jobs(b, c, see_all, rows, rowp, QUOTA_LIST_JOBS_MAX);
	qr.jobs = rowp;
	qr.n_revoked_lease_ids = nrevoked;
	qr.revoked_lease_ids = (uint64_t *)revoked;
	reply_init(&r, seq, status, warning);
	r.body_case = PINBROKER__V1__REPLY__BODY_QUOTA;
	r.quota = &qr;
	reply_send(c, &r, NULL, 0);
out:
	free(rules);
	free(rulep);
	free(rows);
	free(rowp);
}

static bool quotas_on(struct conn *c, uint64_t seq)
{
	if (c->broker->jobs)
		return true;
	reply_status(c, seq, PINBROKER__V1__STATUS_CODE__STATUS_INTERNAL, "job quotas are not set up in this daemon");
	return false;
}

void handle_quota_set(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct broker *b = c->broker;
	const Pinbroker__V1__QuotaSet *qs = req->quota_set;
	bool clear = qs->has_clear && qs->clear;
	enum job_rule_source src = JOB_RULE_SET;
	uint64_t *revoked = NULL;
	size_t nrevoked = 0;
	const char *why = NULL;
	Pinbroker__V1__StatusCode status = PINBROKER__V1__STATUS_CODE__STATUS_OK;
	char sz[32], bsz[32], warning[JOBS_PATH_MAX + PATH_MAX + 256] = "", saved[PATH_MAX + 128];
	int r;

	if (!quotas_on(c, req->seq))
		return;
	if (!clear && !qs->has_bytes) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "quota: give a size to set, or clear");
		return;
	}
	if (jobs_path_check(qs->cgroup, true, &why) < 0) {
		/* Cut: a path of kilobytes would push the reason out of the reply. */
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "quota: '%.*s%s': %s; write a cgroup path as /proc/PID/cgroup shows it, components may be "
			     "globs",
			     QUOTA_ECHO_MAX, qs->cgroup, strlen(qs->cgroup) > QUOTA_ECHO_MAX ? "..." : "", why);
		return;
	}
	if (clear) {
		r = jobs_rule_clear(b->jobs, qs->cgroup, &src);
		/* Clearing nothing is fine with --revoke (an epilog after a restart): the leases still go. */
		if (r == -ENOENT && !(qs->has_revoke && qs->revoke)) {
			reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
				     "quota: no rule for %s (pinctl quota list shows them)", qs->cgroup);
			return;
		}
		if (r == 0) {
			log_info("job quota %s cleared by uid %u%s", qs->cgroup, c->uid,
				 src == JOB_RULE_CONFIG ? " (a job-quota rule: back on the next reload)" : "");
			if (src == JOB_RULE_CONFIG)
				log_info("job quota %s comes from the config file: edit job-quota there to drop it for "
					 "good",
					 qs->cgroup);
		}
	} else {
		r = jobs_rule_set(b->jobs, qs->cgroup, qs->bytes, JOB_RULE_SET, &why);
		if (r < 0) {
			reply_status(c, req->seq,
				     r == -ENOMEM ? PINBROKER__V1__STATUS_CODE__STATUS_INTERNAL
						  : PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
				     "quota: %s: %s", qs->cgroup, r == -ENOMEM ? "out of memory" : why);
			return;
		}
		log_info("job quota %s set to %s by uid %u", qs->cgroup, format_size(qs->bytes, sz, sizeof(sz)),
			 c->uid);
		/* Accepted, not refused: a prolog written for a larger node must not fail the job's start. */
		if (qs->bytes > budget_limit(b->budget)) {
			snprintf(warning, sizeof(warning),
				 "the quota of %s (%s) is more than the whole budget (%s): the budget binds first, so "
				 "this quota limits nothing until the budget grows; set a smaller one to bound the job",
				 qs->cgroup, sz, format_size(budget_limit(b->budget), bsz, sizeof(bsz)));
			log_warnx("job quota: %s", warning);
		}
	}
	b->generation++;
	/* Kept before the reply: a crash right after it must not lose what the admin was told is done. */
	if (r == 0 && quota_store_save(b, saved, sizeof(saved)) < 0) {
		status = PINBROKER__V1__STATUS_CODE__STATUS_INTERNAL;
		if (clear)
			snprintf(warning, sizeof(warning),
				 "quota: the rule for %s is cleared, but the quota rules file was not rewritten (%s): "
				 "the rule comes back at the next restart of pinbrokerd; fix that (the log says more) "
				 "and clear it again",
				 qs->cgroup, saved);
		else
			snprintf(warning, sizeof(warning),
				 "quota: the rule for %s is in force, but it was not saved (%s): it will not survive a "
				 "restart of pinbrokerd; fix that (the log says more) and set it again",
				 qs->cgroup, saved);
	}
	if (qs->has_revoke && qs->revoke)
		nrevoked = revoke_matching(c, qs->cgroup, qs->has_deadline_ms ? qs->deadline_ms : 0, &revoked);
	/* A raised or cleared quota may let waiting acquires of the job through. */
	broker_memory_freed(b);
	reply_quota(c, req->seq, status, revoked, nrevoked, warning[0] ? warning : NULL);
	free(revoked);
}

void handle_quota_list(struct conn *c, const Pinbroker__V1__Request *req)
{
	if (!quotas_on(c, req->seq))
		return;
	jobs_watch_sweep(c->broker);
	reply_quota(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL, 0, NULL);
}

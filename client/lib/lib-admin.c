/* SPDX-License-Identifier: MIT */
/* libpinbroker's administration: metrics, the daemon's config, admin revoke and set, and job quotas. */
#define _GNU_SOURCE
#include "lib-int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pb_metrics(pb_client *c, char **text)
{
	Pinbroker__V1__MetricsRequest mr = PINBROKER__V1__METRICS_REQUEST__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	struct waiter w;
	int r;

	if (!text)
		return err_set(-EINVAL, "pb_metrics: text is NULL");
	*text = NULL;
	req.body_case = PINBROKER__V1__REQUEST__BODY_METRICS;
	req.metrics = &mr;
	r = conn_call_checked(c, &req, &w);
	if (r == -ECONNRESET)
		return err_set(r, "pinbrokerd closed the connection on METRICS: it may predate metrics (upgrade it)");
	if (r < 0)
		return r;
	if (w.reply->body_case != PINBROKER__V1__REPLY__BODY_METRICS || !w.reply->metrics->text)
		r = err_set(-EPROTO, "pinbrokerd answered METRICS without the metrics");
	else if (!(*text = strdup(w.reply->metrics->text)))
		r = err_set(-ENOMEM, "out of memory");
	conn_waiter_cleanup(&w);
	return r;
}

void pb_config_free(struct pb_config_entry *e, size_t n)
{
	if (!e)
		return;
	for (size_t i = 0; i < n; i++) {
		free(e[i].key);
		free(e[i].value);
		free(e[i].source);
		free(e[i].file);
	}
	free(e);
}

int pb_config_get(pb_client *c, const char *key, struct pb_config_entry **ret, size_t *n)
{
	Pinbroker__V1__ConfigRequest cq = PINBROKER__V1__CONFIG_REQUEST__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	const Pinbroker__V1__ConfigReply *cr;
	struct pb_config_entry *e;
	bool oom = false;
	struct waiter w;
	size_t count;
	int r;

	if (!ret || !n)
		return err_set(-EINVAL, "pb_config_get: ret and n are required");
	*ret = NULL;
	*n = 0;
	cq.key = (char *)key;
	req.body_case = PINBROKER__V1__REQUEST__BODY_CONFIG;
	req.config = &cq;
	r = conn_call_checked(c, &req, &w);
	if (r == -ECONNRESET)
		return err_set(-EOPNOTSUPP, "pinbrokerd closed the connection on CONFIG: it predates pinctl get and "
					    "pinctl config (upgrade it)");
	if (r < 0)
		return r;
	if (w.reply->body_case != PINBROKER__V1__REPLY__BODY_CONFIG) {
		conn_waiter_cleanup(&w);
		return err_set(-EPROTO, "pinbrokerd answered CONFIG without the config");
	}
	cr = w.reply->config;
	e = calloc(cr->n_entries ? cr->n_entries : 1, sizeof(*e));
	if (!e) {
		conn_waiter_cleanup(&w);
		return err_set(-ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < cr->n_entries; i++) {
		const Pinbroker__V1__ConfigEntry *ce = cr->entries[i];

		e[i].key = status_strdup(ce->key, &oom);
		e[i].value = status_strdup(ce->value, &oom);
		e[i].source = status_strdup(ce->source, &oom);
		e[i].file = status_strdup(ce->file, &oom);
		e[i].line = ce->has_line ? ce->line : 0;
		e[i].reloadable = ce->has_reloadable && ce->reloadable;
	}
	count = cr->n_entries;
	conn_waiter_cleanup(&w);
	if (oom) {
		pb_config_free(e, count);
		return err_set(-ENOMEM, "out of memory");
	}
	*ret = e;
	*n = count;
	return 0;
}

int pb_admin_revoke(pb_client *c, int what, uint64_t lease_id, uint32_t uid, uint32_t deadline_ms, uint64_t **ids,
		    size_t *n)
{
	Pinbroker__V1__AdminRevoke ar = PINBROKER__V1__ADMIN_REVOKE__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	const Pinbroker__V1__AdminRevokeReply *arr;
	struct waiter w;
	int r;

	if (ids)
		*ids = NULL;
	if (n)
		*n = 0;
	switch (what) {
	case PB_REVOKE_LEASE:
		ar.has_lease_id = 1;
		ar.lease_id = lease_id;
		break;
	case PB_REVOKE_UID:
		ar.has_uid = 1;
		ar.uid = uid;
		break;
	case PB_REVOKE_ALL:
		ar.has_all = 1;
		ar.all = 1;
		break;
	case PB_REVOKE_RESERVATION:
		ar.has_reservation_id = 1;
		ar.reservation_id = lease_id;
		break;
	case PB_REVOKE_ORPHANS_UID:
		ar.has_orphans_uid = 1;
		ar.orphans_uid = uid;
		/* fall through */
	case PB_REVOKE_ORPHANS:
		ar.has_orphans = 1;
		ar.orphans = 1;
		break;
	default:
		return err_set(-EINVAL, "pb_admin_revoke: unknown target %d", what);
	}
	ar.has_deadline_ms = deadline_ms != 0;
	ar.deadline_ms = deadline_ms;
	req.body_case = PINBROKER__V1__REQUEST__BODY_ADMIN_REVOKE;
	req.admin_revoke = &ar;
	r = conn_call_checked(c, &req, &w);
	if (r < 0)
		return r;
	/* A reply without a body is an empty list: nothing matched. */
	arr = w.reply->body_case == PINBROKER__V1__REPLY__BODY_ADMIN_REVOKE ? w.reply->admin_revoke : NULL;
	if (arr && arr->n_lease_ids > 0 && ids) {
		*ids = malloc(arr->n_lease_ids * sizeof(**ids));
		if (!*ids) {
			r = err_set(-ENOMEM, "out of memory");
		} else {
			memcpy(*ids, arr->lease_ids, arr->n_lease_ids * sizeof(**ids));
		}
	}
	if (r == 0 && n && arr)
		*n = arr->has_orphans_dropped ? arr->orphans_dropped : arr->n_lease_ids;
	conn_waiter_cleanup(&w);
	return r;
}

int pb_admin_set(pb_client *c, const char *key, const char *value)
{
	Pinbroker__V1__SetConfig sc = PINBROKER__V1__SET_CONFIG__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	struct waiter w;
	int r;

	if (!key || !value)
		return err_set(-EINVAL, "pb_admin_set: key and value are required");
	sc.key = (char *)key;
	sc.value = (char *)value;
	req.body_case = PINBROKER__V1__REQUEST__BODY_SET_CONFIG;
	req.set_config = &sc;
	r = conn_call_checked(c, &req, &w);
	if (r == 0)
		conn_waiter_cleanup(&w);
	return r;
}

/* ------------------------------------------------------------ job quotas */

static int quota_copy(const Pinbroker__V1__QuotaReply *qr, struct pb_quota_rule **rules, size_t *nrules,
		      struct pb_job **jobs, size_t *njobs)
{
	if (rules) {
		*rules = calloc(qr->n_rules + 1, sizeof(**rules));
		if (!*rules)
			return err_set(-ENOMEM, "out of memory");
		for (size_t i = 0; i < qr->n_rules; i++) {
			snprintf((*rules)[i].pattern, sizeof((*rules)[i].pattern), "%s", qr->rules[i]->pattern);
			(*rules)[i].bytes = qr->rules[i]->bytes;
			snprintf((*rules)[i].source, sizeof((*rules)[i].source), "%s", qr->rules[i]->source);
			(*rules)[i].seen = qr->rules[i]->seen;
		}
		*nrules = qr->n_rules;
	}
	if (jobs) {
		*jobs = calloc(qr->n_jobs + 1, sizeof(**jobs));
		if (!*jobs) {
			if (rules) {
				free(*rules);
				*rules = NULL;
				*nrules = 0;
			}
			return err_set(-ENOMEM, "out of memory");
		}
		for (size_t i = 0; i < qr->n_jobs; i++)
			status_job_copy(&(*jobs)[i], qr->jobs[i]);
		*njobs = qr->n_jobs;
	}
	return 0;
}

/* Send a quota request and check its reply is a QuotaReply. */
static int quota_call(pb_client *c, Request *req, const char *what, struct waiter *w)
{
	int r = conn_call_checked(c, req, w);

	if (r == -ECONNRESET)
		return err_set(r, "pinbrokerd closed the connection on %s: it may predate job quotas (upgrade it)",
			       what);
	if (r < 0)
		return r;
	if (w->reply->body_case != PINBROKER__V1__REPLY__BODY_QUOTA) {
		conn_waiter_cleanup(w);
		return err_set(-EPROTO, "pinbrokerd answered %s without the quota list", what);
	}
	return 0;
}

int pb_quota_set(pb_client *c, const char *cgroup, uint64_t bytes, unsigned flags, uint32_t deadline_ms, uint64_t **ids,
		 size_t *n)
{
	Pinbroker__V1__QuotaSet qs = PINBROKER__V1__QUOTA_SET__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	const Pinbroker__V1__QuotaReply *qr;
	struct waiter w;
	int r;

	if (ids)
		*ids = NULL;
	if (n)
		*n = 0;
	err_clear();
	if (!cgroup)
		return err_set(-EINVAL, "pb_quota_set: cgroup is NULL");
	qs.cgroup = (char *)cgroup;
	qs.has_bytes = !(flags & PB_QUOTA_CLEAR);
	qs.bytes = bytes;
	qs.has_clear = (flags & PB_QUOTA_CLEAR) != 0;
	qs.clear = qs.has_clear;
	qs.has_revoke = (flags & PB_QUOTA_REVOKE) != 0;
	qs.revoke = qs.has_revoke;
	qs.has_deadline_ms = deadline_ms != 0;
	qs.deadline_ms = deadline_ms;
	req.body_case = PINBROKER__V1__REQUEST__BODY_QUOTA_SET;
	req.quota_set = &qs;
	r = quota_call(c, &req, "QUOTA_SET", &w);
	if (r < 0)
		return r;
	qr = w.reply->quota;
	/* A message on success is a warning (a quota over the budget): pb_last_error() gives it. */
	err_clear();
	if (w.reply->message && w.reply->message[0])
		err_set(0, "%s", w.reply->message);
	if (ids && qr->n_revoked_lease_ids) {
		*ids = malloc(qr->n_revoked_lease_ids * sizeof(**ids));
		if (!*ids)
			r = err_set(-ENOMEM, "out of memory");
		else
			memcpy(*ids, qr->revoked_lease_ids, qr->n_revoked_lease_ids * sizeof(**ids));
	}
	if (r == 0 && n)
		*n = qr->n_revoked_lease_ids;
	conn_waiter_cleanup(&w);
	return r;
}

int pb_quota_list(pb_client *c, struct pb_quota_rule **rules, size_t *nrules, struct pb_job **jobs, size_t *njobs)
{
	Pinbroker__V1__QuotaList ql = PINBROKER__V1__QUOTA_LIST__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	struct waiter w;
	int r;

	if ((rules && !nrules) || (jobs && !njobs))
		return err_set(-EINVAL, "pb_quota_list: a list without its count");
	if (rules) {
		*rules = NULL;
		*nrules = 0;
	}
	if (jobs) {
		*jobs = NULL;
		*njobs = 0;
	}
	req.body_case = PINBROKER__V1__REQUEST__BODY_QUOTA_LIST;
	req.quota_list = &ql;
	r = quota_call(c, &req, "QUOTA_LIST", &w);
	if (r < 0)
		return r;
	r = quota_copy(w.reply->quota, rules, nrules, jobs, njobs);
	conn_waiter_cleanup(&w);
	return r;
}

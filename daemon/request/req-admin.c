/* SPDX-License-Identifier: MIT */
/*
 * The admin verbs: revoke (one's own leases, or anyone's for an admin), set, config (reading it back)
 * and metrics; status is req-status.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker.h"
#include "config.h"
#include "conn.h"
#include "daemon.h"
#include "lease.h"
#include "log.h"
#include "metrics.h"
#include "reload.h"
#include "reply.h"
#include "restart.h"
#include "request-int.h"
#include "revoker.h"
#include "tenant.h"

/* revoke --orphans: an admin stops counting orphaned memory (memory found by name that is not ours, say). */
static void drop_orphans(struct conn *c, const Pinbroker__V1__Request *req)
{
	const Pinbroker__V1__AdminRevoke *ar = req->admin_revoke;
	Pinbroker__V1__AdminRevokeReply rr = PINBROKER__V1__ADMIN_REVOKE_REPLY__INIT;
	Pinbroker__V1__Reply r;
	uint64_t bytes;
	size_t n;

	if (!c->admin) {
		reply_status(
			c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_PERMISSION_DENIED,
			"dropping orphaned memory needs uid 0 or membership of the admin group; a process of yours "
			"stops being counted when it unmaps what it holds");
		return;
	}
	if (ar->has_lease_id || ar->has_uid || (ar->has_all && ar->all)) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "orphans are named by their uid (orphans_uid) or all of them, not by a lease id");
		return;
	}
	restart_drop_orphans(c->broker, !ar->has_orphans_uid, ar->orphans_uid, &n, &bytes);
	log_info("uid %u dropped %zu orphan%s (%llu bytes)%s", c->uid, n, n == 1 ? "" : "s", (unsigned long long)bytes,
		 ar->has_orphans_uid ? " of one uid" : "");
	rr.has_orphans_dropped = true;
	rr.orphans_dropped = (uint32_t)n;
	rr.has_orphaned_bytes_dropped = true;
	rr.orphaned_bytes_dropped = bytes;
	reply_init(&r, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
	r.body_case = PINBROKER__V1__REPLY__BODY_ADMIN_REVOKE;
	r.admin_revoke = &rr;
	reply_send(c, &r, NULL, 0);
}

void handle_admin_revoke(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct broker *b = c->broker;
	const Pinbroker__V1__AdminRevoke *ar = req->admin_revoke;
	Pinbroker__V1__AdminRevokeReply rr = PINBROKER__V1__ADMIN_REVOKE_REPLY__INIT;
	uint64_t *ids = NULL;
	size_t n = 0, cap = 0;
	struct lease *l, *target = NULL;
	char reason[64];
	uint32_t deadline_ms;
	Pinbroker__V1__Reply r;

	if (ar->has_orphans && ar->orphans) {
		drop_orphans(c, req);
		return;
	}
	if (ar->has_reservation_id) {
		reserve_admin_revoke(c, req);
		return;
	}
	if (!ar->has_lease_id && !ar->has_uid && !(ar->has_all && ar->all)) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "revoke needs a lease id, a uid, or all");
		return;
	}
	if (ar->has_lease_id && !(target = lease_find(b->leases, ar->lease_id))) {
		reply_lease_error(c, req->seq, -ENOENT, ar->lease_id);
		return;
	}
	/* Anyone may revoke a lease of their own uid, or all of them (--uid self); other uids'
	 * leases, and "all", need admin rights. */
	if (!c->admin &&
	    ((target && target->uid != c->uid) || (ar->has_uid && ar->uid != c->uid) || (!target && !ar->has_uid))) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_PERMISSION_DENIED,
			     "revoking other uids' leases needs uid 0 or membership of the admin group "
			     "(admin-group = %s); you may revoke your own: a lease id of yours, or --uid %u",
			     daemon_of(b)->cfg->admin_group && daemon_of(b)->cfg->admin_group[0]
				     ? daemon_of(b)->cfg->admin_group
				     : "none set",
			     c->uid);
		return;
	}
	/* Of one's own uid, only leases held from one's own pid namespace: a container's root is not the host's. */
	if (!c->admin && target && target->tenant != TENANT_NONE &&
	    !tenants_same_pidns(b->tenants, c->tenant, target->tenant)) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_PERMISSION_DENIED,
			     "lease %llu was taken from another pid namespace than yours (another container, or the "
			     "host): only an admin may revoke it",
			     (unsigned long long)target->id);
		return;
	}
	/* A never-revoked lease can be revoked only while its library keeps it cached (idle). */
	if (target && target->no_revoke && !lease_revocable(target)) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
			     "lease %llu is held by pid %d, which cannot give memory back (%s); it is freed when that "
			     "process frees it or exits: stop the process to free it now",
			     (unsigned long long)target->id, target->pid,
			     target->registration ? "a cudaHostRegister charge" : "a program run under the interposer");
		return;
	}
	snprintf(reason, sizeof(reason), "revoked by %suid %u", c->admin ? "admin " : "", c->uid);
	/* A holder's own revoke gets at least revoke-min-deadline-ms: a 1 ms one would make all its leases overdue. */
	deadline_ms = broker_revoke_deadline_ms(&b->settings, c->admin, ar->has_deadline_ms ? ar->deadline_ms : 0);
	/* A failed REVOKE send only marks its connection closing, so the walk stays valid. */
	for (l = target ? target : lease_first(b->leases); l; l = target ? NULL : lease_next(b->leases, l)) {
		if (ar->has_uid && l->uid != ar->uid)
			continue;
		if (!c->admin && l->tenant != TENANT_NONE && !tenants_same_pidns(b->tenants, c->tenant, l->tenant))
			continue;
		if (!lease_revocable(l))
			continue;
		if (n == cap) {
			uint64_t *nid = realloc(ids, (cap ? cap * 2 : 16) * sizeof(*ids));

			if (!nid)
				break;
			ids = nid;
			cap = cap ? cap * 2 : 16;
		}
		ids[n++] = l->id;
		revoker_revoke(b, l, deadline_ms, c->admin ? REVOKED_ADMIN : REVOKED_SELF, reason);
	}
	rr.n_lease_ids = n;
	rr.lease_ids = ids;
	reply_init(&r, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
	r.body_case = PINBROKER__V1__REPLY__BODY_ADMIN_REVOKE;
	r.admin_revoke = &rr;
	reply_send(c, &r, NULL, 0);
	free(ids);
}

void handle_set_config(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct broker *b = c->broker;
	struct config *n = NULL;
	char *err = NULL;
	int r;

	r = reload_prepare_set(daemon_of(b)->cfg, req->set_config->key, req->set_config->value, &n, &err);
	if (r == 0)
		r = reload_apply(b, n, &err);
	if (r < 0) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT, "%s",
			     err ? err : strerror(-r));
		config_free(n);
	} else {
		log_info("%s set to %s by uid %u; it overrides the config file, also on reload, until restart",
			 req->set_config->key, req->set_config->value, c->uid);
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, "%s", "");
	}
	free(err);
}

/*
 * The metrics-path text, for `pinctl metrics` and the HTTP endpoint; the per-uid and per-job series as
 * metrics-detail says: for every client (all), for whom status shows every uid (admin), or for none.
 */
void handle_metrics(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct broker *b = c->broker;
	Pinbroker__V1__MetricsReply mr = PINBROKER__V1__METRICS_REPLY__INIT;
	enum config_metrics_detail detail = daemon_of(b)->cfg->metrics_detail;
	bool see_all = detail == METRICS_DETAIL_ALL ||
		       (detail == METRICS_DETAIL_ADMIN &&
			(c->admin || daemon_of(b)->cfg->status_visibility == VISIBILITY_ALL));
	struct timespec ts;
	char *text = NULL;
	size_t len = 0;
	Pinbroker__V1__Reply r;
	int e;

	clock_gettime(CLOCK_REALTIME, &ts);
	e = metrics_render(b, see_all, (double)ts.tv_sec + ts.tv_nsec / 1e9, &text, &len);
	if (e < 0) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INTERNAL, "cannot render the metrics: %s",
			     strerror(-e));
		return;
	}
	mr.text = text;
	reply_init(&r, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
	r.body_case = PINBROKER__V1__REPLY__BODY_METRICS;
	r.metrics = &mr;
	reply_send(c, &r, NULL, 0);
	free(text);
}

/* Room for one value as config text: a path is the longest. */
#define CONFIG_VALUE_BYTES (PATH_MAX + 8)

void handle_config(struct conn *c, const Pinbroker__V1__Request *req)
{
	struct broker *b = c->broker;
	const char *want = req->config->key;
	Pinbroker__V1__ConfigReply cr = PINBROKER__V1__CONFIG_REPLY__INIT;
	Pinbroker__V1__ConfigEntry *ents = NULL, **ptrs = NULL;
	const struct config_key *keys, *only = NULL;
	char *values = NULL;
	size_t nkeys, n = 0;
	Pinbroker__V1__Reply r;

	keys = config_keys(&nkeys);
	if (want) {
		const char *hint;

		only = config_key_find(want);
		if (!only) {
			hint = config_suggest_key(want);
			reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
				     "unknown key '%s'%s%s%s; pinctl config lists the keys", want,
				     hint ? " (did you mean '" : "", hint ? hint : "", hint ? "'?)" : "");
			return;
		}
	}
	ents = calloc(nkeys, sizeof(*ents));
	ptrs = calloc(nkeys, sizeof(*ptrs));
	values = malloc(nkeys * CONFIG_VALUE_BYTES);
	if (!ents || !ptrs || !values) {
		reply_status(c, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_INTERNAL, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < nkeys; i++) {
		const struct config_key *k = &keys[i];
		Pinbroker__V1__ConfigEntry *e = &ents[n];
		char *v = values + n * CONFIG_VALUE_BYTES;
		enum config_source src;
		unsigned line;

		if (only && k != only)
			continue;
		pinbroker__v1__config_entry__init(e);
		config_format_value(daemon_of(b)->cfg, k, v, CONFIG_VALUE_BYTES);
		src = config_source_of(daemon_of(b)->cfg, k, &line);
		e->key = (char *)k->name;
		e->value = v;
		e->source = (char *)config_source_name(src);
		if (src == CONFIG_SOURCE_FILE && config_file_path(daemon_of(b)->cfg)) {
			e->file = (char *)config_file_path(daemon_of(b)->cfg);
			e->has_line = true;
			e->line = line;
		}
		e->has_reloadable = true;
		e->reloadable = k->reloadable;
		ptrs[n++] = e;
	}
	cr.n_entries = n;
	cr.entries = ptrs;
	reply_init(&r, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
	r.body_case = PINBROKER__V1__REPLY__BODY_CONFIG;
	r.config = &cr;
	reply_send(c, &r, NULL, 0);
out:
	free(values);
	free(ptrs);
	free(ents);
}

/* SPDX-License-Identifier: MIT */
/* libpinbroker's STATUS: the paged status reply turned into struct pb_status and lease rows, and their frees. */
#define _GNU_SOURCE
#include "lib-int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *status_strdup(const char *s, bool *oom)
{
	char *d = strdup(s ? s : "");

	if (!d)
		*oom = true;
	return d;
}

static char *join_labels(char **labels, size_t n, bool *oom)
{
	size_t len = 1;
	char *s, *p;

	for (size_t i = 0; i < n; i++)
		len += strlen(labels[i]) + 1;
	s = p = malloc(len);
	if (!s) {
		*oom = true;
		return NULL;
	}
	*p = '\0';
	for (size_t i = 0; i < n; i++)
		p += sprintf(p, "%s%s", i ? "," : "", labels[i]);
	return s;
}

static void copy_events(Pinbroker__V1__EventInfo **src, size_t n, struct pb_event_info **dst, size_t *ndst, bool *oom)
{
	*dst = calloc(n ? n : 1, sizeof(**dst));
	if (!*dst) {
		*oom = true;
		return;
	}
	*ndst = n;
	for (size_t i = 0; i < n; i++) {
		(*dst)[i].age_ms = src[i]->age_ms;
		(*dst)[i].text = status_strdup(src[i]->text, oom);
	}
}

/* One job row, as STATUS and the quota replies carry it. */
void status_job_copy(struct pb_job *y, const Pinbroker__V1__JobInfo *x)
{
	snprintf(y->job, sizeof(y->job), "%s", x->job);
	y->bytes = x->has_bytes ? x->bytes : 0;
	y->leases = x->has_leases ? x->leases : 0;
	y->has_quota = x->has_quota_bytes;
	y->quota_bytes = x->has_quota_bytes ? x->quota_bytes : 0;
	snprintf(y->rule, sizeof(y->rule), "%s", x->rule ? x->rule : "");
	snprintf(y->source, sizeof(y->source), "%s", x->source ? x->source : "");
}

/*
 * What struct pb_status does not hold, so that its layout stays as programs built against it know it; read
 * through pb_status_cgroup_namespace. Every pb_status the library returns is one of these.
 */
struct status_hidden {
	struct pb_status s; /* first: a struct pb_status * of the library's points at one */
	char *cgroup_namespace;
	char *cgroup_ns_root;
	uint32_t job_unknown_clients;
	uint64_t job_unknown_total;
	char *restart_books; /* pb_status_restart_warning */
	char *restart_warning;
	/* pb_status_client_staging: one per client row, grown with s.clients; present[i]: the row carried any */
	struct pb_client_staging *client_staging;
	bool *client_staged;
	/* pb_status_staging */
	struct pb_status_staging staging;
};

/* A client row's staged copies, all 0 when the daemon sent none; true when it sent them. */
static bool staging_copy(struct pb_client_staging *d, const Pinbroker__V1__ClientStaging *x)
{
	memset(d, 0, sizeof(*d));
	if (!x)
		return false;
	d->h2d_bytes = x->h2d_bytes;
	d->d2h_bytes = x->d2h_bytes;
	d->h2d_copies = x->h2d_copies;
	d->d2h_copies = x->d2h_copies;
	d->driver_copies = x->driver_copies;
	d->ring_revoked = x->ring_revoked;
	d->ring_refused = x->ring_refused;
	d->busy_ns = x->busy_ns;
	d->h2d_bytes_per_s = x->h2d_bytes_per_s;
	d->d2h_bytes_per_s = x->d2h_bytes_per_s;
	d->ring_bytes = x->ring_bytes;
	d->rings = x->rings;
	return true;
}

/* Append sr's client rows to s->clients. */
static void append_clients(struct pb_status *s, const Pinbroker__V1__StatusReply *sr, bool *oom)
{
	struct status_hidden *h = (struct status_hidden *)s;
	struct pb_client_staging *st;
	struct pb_client_info *v;
	bool *staged;
	char **cg;

	if (sr->n_clients == 0)
		return;
	v = realloc(s->clients, (s->n_clients + sr->n_clients) * sizeof(*v));
	if (!v) {
		*oom = true;
		return;
	}
	s->clients = v;
	cg = realloc(s->client_cgroups, (s->n_clients + sr->n_clients) * sizeof(*cg));
	if (!cg) {
		*oom = true;
		return;
	}
	s->client_cgroups = cg;
	st = realloc(h->client_staging, (s->n_clients + sr->n_clients) * sizeof(*st));
	if (st)
		h->client_staging = st;
	staged = realloc(h->client_staged, (s->n_clients + sr->n_clients) * sizeof(*staged));
	if (staged)
		h->client_staged = staged;
	if (!st || !staged) {
		*oom = true;
		return;
	}
	for (size_t i = 0; i < sr->n_clients; i++) {
		const Pinbroker__V1__ClientInfo *ci = sr->clients[i];
		struct pb_client_info *d = &s->clients[s->n_clients];

		s->client_cgroups[s->n_clients++] = status_strdup(ci->cgroup, oom);
		d->pid = ci->pid;
		d->uid = ci->uid;
		d->leases = ci->leases;
		d->bytes = ci->bytes;
		d->labels = join_labels(ci->labels, ci->n_labels, oom);
		d->name = status_strdup(ci->name, oom);
		d->attached = ci->has_attached ? ci->attached : 0;
		d->unbrokered_bytes = ci->has_unbrokered_bytes ? ci->unbrokered_bytes : 0;
		h->client_staged[s->n_clients - 1] = staging_copy(&h->client_staging[s->n_clients - 1], ci->staging);
	}
}

static void lease_info_copy(struct pb_lease_info *d, const Pinbroker__V1__LeaseInfo *li, bool *oom)
{
	d->id = li->id;
	d->pid = li->pid;
	d->uid = li->uid;
	d->bytes = li->bytes;
	d->label = status_strdup(li->label, oom);
	d->age_ms = li->age_ms;
	d->priority = li->has_priority ? (enum pb_priority)li->priority : PB_PRIORITY_NORMAL;
	d->state = status_strdup(li->state ? li->state : "active", oom);
	d->idle_ms = li->has_idle_ms ? li->idle_ms : 0;
	d->deadline_left_ms = li->has_deadline_left_ms ? li->deadline_left_ms : 0;
	d->shared = li->has_shared && li->shared;
	d->holder_detached = li->has_holder_detached && li->holder_detached;
	d->attachers = li->has_attachers ? li->attachers : 0;
	d->n_attacher_pids = 0;
	for (size_t i = 0; i < li->n_attacher_pids && i < PB_LEASE_INFO_PIDS; i++)
		d->attacher_pids[d->n_attacher_pids++] = li->attacher_pids[i];
	d->registration = li->has_registration && li->registration;
	d->no_revoke = li->has_no_revoke && li->no_revoke;
	d->numa_node = li->has_numa_node ? li->numa_node : -1;
	d->misplaced = li->has_misplaced && li->misplaced;
	d->job = status_strdup(li->job ? li->job : "", oom);
	/* An old daemon sends no charge: every lease then carries its bytes. */
	d->charged_bytes = li->has_charged_bytes ? li->charged_bytes : li->bytes;
	d->registrants = li->has_registrants ? li->registrants : 0;
	d->staging_ring = li->has_staging_ring && li->staging_ring;
	d->n_registrant_pids = 0;
	for (size_t i = 0; i < li->n_registrant_pids && i < PB_LEASE_INFO_PIDS; i++)
		d->registrant_pids[d->n_registrant_pids++] = li->registrant_pids[i];
}

/* Append sr's lease rows to (*rows, *n). */
static void append_leases(struct pb_lease_info **rows, size_t *n, const Pinbroker__V1__StatusReply *sr, bool *oom)
{
	struct pb_lease_info *v;

	if (sr->n_leases == 0)
		return;
	v = realloc(*rows, (*n + sr->n_leases) * sizeof(*v));
	if (!v) {
		*oom = true;
		return;
	}
	*rows = v;
	for (size_t i = 0; i < sr->n_leases; i++)
		lease_info_copy(&v[(*n)++], sr->leases[i], oom);
}

static int status_convert(const Pinbroker__V1__StatusReply *sr, struct pb_status **ret)
{
	struct status_hidden *h = calloc(1, sizeof(*h));
	struct pb_status *s = h ? &h->s : NULL;
	bool oom = false;

	if (!s)
		return err_set(-ENOMEM, "out of memory");
	/* NULL from an older daemon, which does not say. */
	h->cgroup_namespace = sr->cgroup_namespace ? status_strdup(sr->cgroup_namespace, &oom) : NULL;
	h->cgroup_ns_root = sr->cgroup_ns_root ? status_strdup(sr->cgroup_ns_root, &oom) : NULL;
	h->job_unknown_clients = sr->has_job_unknown_clients ? sr->job_unknown_clients : 0;
	h->job_unknown_total = sr->has_job_unknown_total ? sr->job_unknown_total : 0;
	h->restart_books = sr->restart_books ? status_strdup(sr->restart_books, &oom) : NULL;
	h->restart_warning = sr->restart_warning ? status_strdup(sr->restart_warning, &oom) : NULL;
	h->staging.rings = sr->has_staging_rings ? sr->staging_rings : 0;
	h->staging.ring_bytes = sr->has_staging_ring_bytes ? sr->staging_ring_bytes : 0;
	h->staging.h2d_bytes = sr->has_staged_h2d_bytes ? sr->staged_h2d_bytes : 0;
	h->staging.d2h_bytes = sr->has_staged_d2h_bytes ? sr->staged_d2h_bytes : 0;
	s->schema_version = sr->schema_version;
	s->server_version = status_strdup(sr->server_version, &oom);
	s->budget_bytes = sr->budget_bytes;
	s->uid_quota_bytes = sr->uid_quota_bytes;
	s->leased_bytes = sr->leased_bytes;
	s->pool_bytes = sr->pool_bytes;
	s->pool_idle_bytes = sr->pool_idle_bytes;
	s->page_size_bytes = sr->page_size_bytes;
	s->chunk_size_bytes = sr->chunk_size_bytes;
	s->hugetlb = sr->has_hugetlb && sr->hugetlb;
	s->overdue_bytes = sr->has_overdue_bytes ? sr->overdue_bytes : 0;
	s->cached_idle_bytes = sr->has_cached_idle_bytes ? sr->cached_idle_bytes : 0;
	s->prewarm_bytes = sr->has_prewarm_bytes ? sr->prewarm_bytes : 0;
	s->waiting_acquires = sr->has_waiting_acquires ? sr->waiting_acquires : 0;
	s->pressure_state = status_strdup(sr->pressure_state ? sr->pressure_state : "unknown", &oom);
	s->monitor_mode = status_strdup(sr->monitor_mode ? sr->monitor_mode : "unknown", &oom);
	s->uptime_ms = sr->has_uptime_ms ? sr->uptime_ms : 0;
	s->registered_bytes = sr->has_registered_bytes ? sr->registered_bytes : 0;
	s->no_revoke_bytes = sr->has_no_revoke_bytes ? sr->no_revoke_bytes : 0;
	s->unbrokered_bytes = sr->has_unbrokered_bytes ? sr->unbrokered_bytes : 0;
	/* An older daemon sends no reported sum: its figure is the sum. */
	s->unbrokered_reported_bytes = sr->has_unbrokered_reported_bytes ? sr->unbrokered_reported_bytes
									 : s->unbrokered_bytes;
	s->unbrokered_cap_bytes = sr->has_unbrokered_cap_bytes ? sr->unbrokered_cap_bytes : 0;
	s->unbrokered_uids = calloc(sr->n_unbrokered_uids + 1, sizeof(*s->unbrokered_uids));
	if (!s->unbrokered_uids)
		oom = true;
	for (size_t i = 0; s->unbrokered_uids && i < sr->n_unbrokered_uids; i++) {
		const Pinbroker__V1__UnbrokeredUid *ui = sr->unbrokered_uids[i];

		s->unbrokered_uids[s->n_unbrokered_uids++] = (struct pb_unbrokered_uid){
			.uid = ui->uid,
			.connections = ui->has_connections ? ui->connections : 0,
			.reported_bytes = ui->reported_bytes,
			.counted_bytes = ui->counted_bytes
		};
	}
	s->orphaned_bytes = sr->has_orphaned_bytes ? sr->orphaned_bytes : 0;
	s->chunk_max_bytes = sr->has_chunk_max_bytes ? sr->chunk_max_bytes : sr->chunk_size_bytes;
	s->chunk_capacity = sr->has_chunk_capacity ? sr->chunk_capacity : 0;
	s->pool_warming = sr->has_pool_warming && sr->pool_warming ? 1 : 0;
	s->page_kind = status_strdup(sr->page_kind ? sr->page_kind : "unknown", &oom);
	s->thp_bytes = sr->has_thp_bytes ? sr->thp_bytes : 0;
	s->thp_failures = sr->has_thp_failures ? sr->thp_failures : 0;
	s->hugetlb_bytes = sr->has_hugetlb_bytes ? sr->hugetlb_bytes : 0;
	s->huge_pages_free_bytes = sr->has_huge_pages_free_bytes ? sr->huge_pages_free_bytes : 0;
	s->nodes = calloc(sr->n_nodes ? sr->n_nodes : 1, sizeof(*s->nodes));
	if (!s->nodes)
		oom = true;
	for (size_t i = 0; s->nodes && i < sr->n_nodes; i++) {
		const Pinbroker__V1__NodeInfo *ni = sr->nodes[i];

		s->nodes[i] = (struct pb_node_info){ .node = ni->node,
						     .idle_bytes = ni->idle_bytes,
						     .lent_bytes = ni->lent_bytes,
						     .misplaced_bytes = ni->misplaced_bytes,
						     .gpus = ni->gpus,
						     .mem_free_bytes = ni->mem_free_bytes };
		s->n_nodes++;
	}
	s->jobs = calloc(sr->n_jobs + 1, sizeof(*s->jobs));
	if (!s->jobs)
		oom = true;
	for (size_t i = 0; s->jobs && i < sr->n_jobs; i++)
		status_job_copy(&s->jobs[s->n_jobs++], sr->jobs[i]);

	/* Never NULL, even empty: callers index them by n_*. */
	s->clients = calloc(1, sizeof(*s->clients));
	s->client_cgroups = calloc(1, sizeof(*s->client_cgroups));
	s->leases = calloc(1, sizeof(*s->leases));
	if (!s->clients || !s->client_cgroups || !s->leases)
		oom = true;
	append_clients(s, sr, &oom);
	append_leases(&s->leases, &s->n_leases, sr, &oom);

	s->signals = calloc(sr->n_signals ? sr->n_signals : 1, sizeof(*s->signals));
	if (!s->signals)
		oom = true;
	else
		s->n_signals = sr->n_signals;
	for (size_t i = 0; s->signals && i < sr->n_signals; i++) {
		const Pinbroker__V1__SignalInfo *si = sr->signals[i];
		struct pb_signal_info *d = &s->signals[i];

		d->name = status_strdup(si->name, &oom);
		d->value = si->value;
		/* An absent threshold is NaN: "no threshold", which pinctl prints as null or "-". */
		d->tight = si->has_tight ? si->tight : NAN;
		d->critical = si->has_critical ? si->critical : NAN;
		d->unit = status_strdup(si->unit, &oom);
		d->available = si->has_available ? si->available : 1;
	}

	copy_events(sr->transitions, sr->n_transitions, &s->transitions, &s->n_transitions, &oom);
	copy_events(sr->revocations, sr->n_revocations, &s->revocations, &s->n_revocations, &oom);
	if (oom) {
		pb_status_free(s);
		return err_set(-ENOMEM, "out of memory");
	}
	*ret = s;
	return 0;
}

/* Paging state of one pass over the daemon's rows. */
struct status_pages {
	uint64_t lease_cursor; /* 0 with want_leases false: no lease rows wanted (any more) */
	uint64_t client_cursor;
	bool want_leases, want_clients, first;
};

/* One STATUS round trip; *w holds a STATUS reply on success. */
static int status_call(pb_client *c, const struct status_pages *p, uint32_t lease_limit, struct waiter *w)
{
	Pinbroker__V1__StatusRequest sreq = PINBROKER__V1__STATUS_REQUEST__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	int r;

	sreq.has_include_leases = 1;
	sreq.include_leases = p->want_leases;
	sreq.has_lease_cursor = p->lease_cursor != 0;
	sreq.lease_cursor = p->lease_cursor;
	sreq.has_lease_limit = lease_limit != 0;
	sreq.lease_limit = lease_limit;
	sreq.has_include_clients = 1;
	sreq.include_clients = p->want_clients;
	sreq.has_client_cursor = p->client_cursor != 0;
	sreq.client_cursor = p->client_cursor;
	/* Signals and events are the same on every page: only the first asks for them. */
	sreq.has_include_events = 1;
	sreq.include_events = p->first;
	req.body_case = PINBROKER__V1__REQUEST__BODY_STATUS;
	req.status = &sreq;
	r = conn_call_checked(c, &req, w);
	if (r < 0)
		return r;
	if (w->reply->body_case != PINBROKER__V1__REPLY__BODY_STATUS_REPLY || !w->reply->status_reply) {
		conn_waiter_cleanup(w);
		return err_set(-EPROTO, "pinbrokerd answered STATUS without a status");
	}
	return 0;
}

/*
 * Where the next page starts, from a reply. A daemon that does not page sends
 * no cursor (0: done). A cursor that does not move on would loop forever:
 * lease ids only grow, connection ids only shrink, page to page.
 */
static int status_advance(struct status_pages *p, const Pinbroker__V1__StatusReply *sr)
{
	uint64_t nl = sr->has_next_lease_cursor ? sr->next_lease_cursor : 0;
	uint64_t nc = sr->has_next_client_cursor ? sr->next_client_cursor : 0;

	if (p->want_leases && nl && nl <= p->lease_cursor)
		return err_set(-EPROTO, "pinbrokerd sent a lease cursor that does not advance (%llu after %llu)",
			       (unsigned long long)nl, (unsigned long long)p->lease_cursor);
	if (p->want_clients && nc && p->client_cursor && nc >= p->client_cursor)
		return err_set(-EPROTO, "pinbrokerd sent a client cursor that does not advance");
	p->want_leases = p->want_leases && nl != 0;
	p->lease_cursor = nl;
	p->want_clients = p->want_clients && nc != 0;
	p->client_cursor = nc;
	p->first = false;
	return 0;
}

int pb_status_query(pb_client *c, unsigned flags, struct pb_status **ret)
{
	struct status_pages p = { .want_leases = (flags & PB_STATUS_LEASES) != 0, .want_clients = true, .first = true };
	struct pb_status *s = NULL;
	struct waiter w;
	bool oom = false;
	int r;

	if (!ret)
		return err_set(-EINVAL, "pb_status_query: ret is NULL");
	*ret = NULL;
	r = status_call(c, &p, 0, &w);
	if (r < 0)
		return r;
	r = status_convert(w.reply->status_reply, &s);
	if (r == 0)
		r = status_advance(&p, w.reply->status_reply);
	conn_waiter_cleanup(&w);
	while (r == 0 && (p.want_leases || p.want_clients)) {
		r = status_call(c, &p, 0, &w);
		if (r < 0)
			break;
		if (p.want_clients)
			append_clients(s, w.reply->status_reply, &oom);
		if (p.want_leases)
			append_leases(&s->leases, &s->n_leases, w.reply->status_reply, &oom);
		r = oom ? err_set(-ENOMEM, "out of memory") : status_advance(&p, w.reply->status_reply);
		conn_waiter_cleanup(&w);
	}
	if (r < 0) {
		pb_status_free(s);
		return r;
	}
	*ret = s;
	return 0;
}

int pb_status_get(pb_client *c, struct pb_status **ret)
{
	return pb_status_query(c, PB_STATUS_LEASES, ret);
}

int pb_leases_page(pb_client *c, uint64_t cursor, size_t max_rows, struct pb_lease_info **rows, size_t *n,
		   uint64_t *next)
{
	struct status_pages p = { .lease_cursor = cursor, .want_leases = true };
	struct pb_lease_info *v = NULL;
	struct waiter w;
	size_t k = 0;
	bool oom = false;
	int r;

	if (!rows || !n || !next)
		return err_set(-EINVAL, "pb_leases_page: rows, n and next are required");
	*rows = NULL;
	*n = 0;
	*next = 0;
	r = status_call(c, &p, max_rows > UINT32_MAX ? UINT32_MAX : (uint32_t)max_rows, &w);
	if (r < 0)
		return r;
	append_leases(&v, &k, w.reply->status_reply, &oom);
	r = oom ? err_set(-ENOMEM, "out of memory") : status_advance(&p, w.reply->status_reply);
	conn_waiter_cleanup(&w);
	if (r < 0) {
		pb_lease_info_free(v, k);
		return r;
	}
	*rows = v;
	*n = k;
	*next = p.lease_cursor;
	return 0;
}

void pb_lease_info_free(struct pb_lease_info *rows, size_t n)
{
	for (size_t i = 0; rows && i < n; i++) {
		free(rows[i].label);
		free(rows[i].state);
		free(rows[i].job);
	}
	free(rows);
}

static void free_events(struct pb_event_info *e, size_t n)
{
	for (size_t i = 0; e && i < n; i++)
		free(e[i].text);
	free(e);
}

void pb_status_free(struct pb_status *s)
{
	if (!s)
		return;
	free(s->server_version);
	free(s->pressure_state);
	free(s->monitor_mode);
	free(s->page_kind);
	free(s->nodes);
	free(s->jobs);
	free(s->unbrokered_uids);
	for (size_t i = 0; s->clients && i < s->n_clients; i++) {
		free(s->clients[i].labels);
		free(s->clients[i].name);
	}
	for (size_t i = 0; s->client_cgroups && i < s->n_clients; i++)
		free(s->client_cgroups[i]);
	free(s->client_cgroups);
	free(s->clients);
	pb_lease_info_free(s->leases, s->n_leases);
	for (size_t i = 0; s->signals && i < s->n_signals; i++) {
		free(s->signals[i].name);
		free(s->signals[i].unit);
	}
	free(s->signals);
	free_events(s->transitions, s->n_transitions);
	free_events(s->revocations, s->n_revocations);
	free(((struct status_hidden *)s)->cgroup_namespace);
	free(((struct status_hidden *)s)->cgroup_ns_root);
	free(((struct status_hidden *)s)->restart_books);
	free(((struct status_hidden *)s)->restart_warning);
	free(((struct status_hidden *)s)->client_staging);
	free(((struct status_hidden *)s)->client_staged);
	free(s);
}

int pb_status_pool_warming(const struct pb_status *s)
{
	return s->pool_warming;
}

const char *pb_status_cgroup_namespace(const struct pb_status *s, const char **root)
{
	const struct status_hidden *h = (const struct status_hidden *)s;

	if (root)
		*root = h->cgroup_ns_root;
	return h->cgroup_namespace;
}

uint32_t pb_status_job_unknown(const struct pb_status *s, uint64_t *acquires)
{
	const struct status_hidden *h = (const struct status_hidden *)s;

	if (acquires)
		*acquires = h->job_unknown_total;
	return h->job_unknown_clients;
}

const char *pb_status_restart_warning(const struct pb_status *s, const char **books)
{
	const struct status_hidden *h = (const struct status_hidden *)s;

	if (books)
		*books = h->restart_books;
	return h->restart_warning;
}

int pb_status_client_staging(const struct pb_status *s, size_t i, struct pb_client_staging *out)
{
	const struct status_hidden *h = (const struct status_hidden *)s;

	if (!s || !out || i >= s->n_clients)
		return -EINVAL;
	*out = h->client_staging[i];
	return h->client_staged[i] ? 1 : 0;
}

int pb_status_staging(const struct pb_status *s, struct pb_status_staging *out)
{
	if (!s || !out)
		return -EINVAL;
	*out = ((const struct status_hidden *)s)->staging;
	return 0;
}

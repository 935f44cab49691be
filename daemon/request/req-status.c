/* SPDX-License-Identifier: MIT */
/* STATUS: the summary from counters and bounded pages of client and lease rows, never a walk over every lease. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "backing.h"
#include "broker.h"
#include "daemon.h"
#include "budget.h"
#include "cgns-probe.h"
#include "config.h"
#include "conn.h"
#include "jobs-watch.h"
#include "jobs.h"
#include "reservation.h"
#include "lease.h"
#include "monitor.h"
#include "numa.h"
#include "pool.h"
#include "reply.h"
#include "restart.h"
#include "request-int.h"
#include "revoker.h"
#include "tenant.h"
#include "util.h"
#include "waitq.h"

/* Rows of each kind in one reply: a page costs the loop a bounded time whatever the lease count. */
#define STATUS_PAGE_MAX_ROWS 1024
/*
 * Largest STATUS reply. A SEQPACKET packet larger than the socket's send
 * buffer fails with EMSGSIZE (unix_dgram_sendmsg refuses len > sk_sndbuf - 32),
 * which dropped the admin connection at about 7k leases when STATUS sent every
 * row at once; the default buffer is net.core.wmem_default, 212992 bytes.
 */
#define STATUS_MAX_BYTES (96 * 1024)
/* Headroom kept under SO_SNDBUF, for the kernel's own accounting of a packet. */
#define STATUS_SNDBUF_SLACK_BYTES 1024
/* What one element of a repeated message field adds beyond the message: a tag of 2 bytes, a length of 3. */
#define ROW_OVERHEAD_BYTES 5
/*
 * Leases looked at for one page when a non-admin sees only its own uid's rows:
 * its few leases among many others' then cost a bounded walk, and the page's
 * cursor says where to go on (such a page may hold fewer rows, even none).
 */
#define STATUS_SCAN_MAX (8 * STATUS_PAGE_MAX_ROWS)
/* Uids' unbrokered rows, the largest reports: enough to name who inflates the figure. */
#define STATUS_UNBROKERED_UIDS_MAX 64
/* Job rows, the largest: pinctl jobs lists them all. */
#define STATUS_JOBS_MAX 64
/* Reservation rows, the newest: a host has a few groups of ranks at once. */
#define STATUS_RESERVATIONS_MAX 64
/* Attacher pids listed on one lease row; the count says how many there are in all. */
#define STATUS_ATTACHER_PIDS_MAX 16

/* One STATUS reply under construction: the storage its pointers lead into, and its size so far. */
struct status_build {
	struct broker *b;
	const struct conn *asker;
	bool see_all; /* admin, or status-visibility = all */
	uint64_t now;
	size_t bytes; /* packed size of the reply so far (rows at their upper bound) */
	size_t max_bytes;

	Pinbroker__V1__SignalInfo si[MONITOR_SIGNALS_MAX], *sip[MONITOR_SIGNALS_MAX];
	Pinbroker__V1__EventInfo ti[MONITOR_EVENTS_MAX], *tip[MONITOR_EVENTS_MAX];
	Pinbroker__V1__EventInfo vi[REVOKER_REVOCATIONS_MAX], *vip[REVOKER_REVOCATIONS_MAX];
	struct monitor_signal sig[MONITOR_SIGNALS_MAX];
	struct monitor_event tev[MONITOR_EVENTS_MAX], rev[REVOKER_REVOCATIONS_MAX];
	Pinbroker__V1__JobInfo ji[STATUS_JOBS_MAX], *jip[STATUS_JOBS_MAX];
	Pinbroker__V1__ReservationInfo ri[STATUS_RESERVATIONS_MAX], *rip[STATUS_RESERVATIONS_MAX];
	Pinbroker__V1__UnbrokeredUid ui[STATUS_UNBROKERED_UIDS_MAX], *uip[STATUS_UNBROKERED_UIDS_MAX];
	struct unbrokered_uid *uids; /* the visible uids reporting, largest first */

	struct conn **conns; /* candidates for client rows */
	Pinbroker__V1__ClientInfo *ci, **cip;
	Pinbroker__V1__ClientStaging *cs; /* one per client row */
	char **labels;                    /* CONN_LABELS_MAX per client row */
	Pinbroker__V1__LeaseInfo *li, **lip;
	int32_t *pids; /* STATUS_ATTACHER_PIDS_MAX per lease row */
};

/* ------------------------------------------------------------------ parts */

static bool visible(const struct status_build *sb, uid_t uid)
{
	return sb->see_all || uid == sb->asker->uid;
}

/*
 * A connection's or lease's row of tenant: its uid's, and from the asker's own pid namespace (a container's root
 * sees none of the host's root rows, nor another container's). A lease whose tenant is not known (an orphan after
 * a restart) is shown to its uid.
 */
static bool visible_row(const struct status_build *sb, uid_t uid, uint64_t tenant)
{
	return sb->see_all || (visible(sb, uid) && (tenant == TENANT_NONE ||
						    tenants_same_pidns(sb->b->tenants, sb->asker->tenant, tenant)));
}

/* The reply must fit the asker's send buffer, whatever the host set it to. */
static size_t reply_max_bytes(const struct conn *c)
{
	int sndbuf = 0;
	socklen_t len = sizeof(sndbuf);

	if (getsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &len) < 0 || sndbuf <= STATUS_SNDBUF_SLACK_BYTES)
		return STATUS_MAX_BYTES;
	return (size_t)sndbuf - STATUS_SNDBUF_SLACK_BYTES < STATUS_MAX_BYTES
		       ? (size_t)sndbuf - STATUS_SNDBUF_SLACK_BYTES
		       : STATUS_MAX_BYTES;
}

/* One row per NUMA node the pool places on, from the pool's per-node counters (O(nodes)). */
static void fill_nodes(struct broker *b, Pinbroker__V1__StatusReply *sr)
{
	/* Built and packed within one request: the loop is single-threaded, so static rows serve. */
	static Pinbroker__V1__NodeInfo rows[NUMA_MAX_NODES];
	static Pinbroker__V1__NodeInfo *ptrs[NUMA_MAX_NODES];
	const int *nodes;
	size_t n = pool_nodes(daemon_of(b)->pool, &nodes);

	for (size_t i = 0; i < n; i++) {
		struct pool_node_bytes nb;
		int t = daemon_of(b)->numa ? numa_index(daemon_of(b)->numa, nodes[i]) : -1;

		pool_node_bytes(daemon_of(b)->pool, nodes[i], &nb);
		pinbroker__v1__node_info__init(&rows[i]);
		rows[i].node = nodes[i];
		rows[i].has_idle_bytes = rows[i].has_lent_bytes = rows[i].has_misplaced_bytes = true;
		rows[i].idle_bytes = nb.idle;
		rows[i].lent_bytes = nb.lent;
		rows[i].misplaced_bytes = nb.misplaced;
		if (t >= 0) {
			rows[i].has_gpus = rows[i].has_mem_free_bytes = true;
			rows[i].gpus = daemon_of(b)->numa->node[t].gpus;
			rows[i].mem_free_bytes = daemon_of(b)->numa->node[t].mem_free_bytes;
		}
		ptrs[i] = &rows[i];
	}
	sr->n_nodes = n;
	sr->nodes = ptrs;
}

/* Every figure here is a counter: O(1) whatever the lease count (and the node rows, O(nodes)). */
static void fill_summary(struct status_build *sb, Pinbroker__V1__StatusReply *sr)
{
	struct broker *b = sb->b;
	const struct cgns_probe *cgp;

	sr->schema_version = 1;
	sr->server_version = (char *)PINBROKER_VERSION;
	sr->budget_bytes = budget_limit(b->budget);
	sr->uid_quota_bytes = budget_uid_quota(b->budget);
	sr->leased_bytes = budget_leased(b->budget);
	sr->pool_bytes = pool_resident_bytes(daemon_of(b)->pool);
	sr->pool_idle_bytes = pool_idle_bytes(daemon_of(b)->pool);
	sr->page_size_bytes = pool_page_size(daemon_of(b)->pool);
	sr->chunk_size_bytes = pool_chunk_size(daemon_of(b)->pool);
	sr->has_hugetlb = true;
	sr->hugetlb = pool_hugetlb(daemon_of(b)->pool);
	sr->has_overdue_bytes = true;
	sr->overdue_bytes = lease_state_bytes(b->leases, LEASE_OVERDUE);
	sr->has_cached_idle_bytes = true;
	sr->cached_idle_bytes = lease_state_bytes(b->leases, LEASE_IDLE);
	sr->pressure_state = (char *)monitor_state_name(b->state);
	sr->monitor_mode = (char *)(daemon_of(b)->monitor ? monitor_mode(daemon_of(b)->monitor) : "off");
	sr->has_registered_bytes = true;
	sr->registered_bytes = b->registered_bytes;
	sr->has_no_revoke_bytes = true;
	sr->no_revoke_bytes = budget_no_revoke(b->budget);
	sr->page_kind = (char *)pool_page_kind(daemon_of(b)->pool);
	sr->has_thp_bytes = true;
	sr->thp_bytes = pool_thp_bytes(daemon_of(b)->pool);
	sr->has_thp_failures = true;
	sr->thp_failures = pool_thp_failures(daemon_of(b)->pool);
	sr->has_hugetlb_bytes = true;
	sr->hugetlb_bytes = pool_hugetlb_bytes(daemon_of(b)->pool);
	sr->has_chunk_max_bytes = true;
	sr->chunk_max_bytes = pool_chunk_max(daemon_of(b)->pool);
	sr->has_chunk_capacity = true;
	sr->chunk_capacity = b->chunk_capacity;
	sr->has_pool_warming = true;
	sr->pool_warming = b->pool_warming;
	sr->has_huge_pages_free_bytes = true;
	sr->huge_pages_free_bytes = daemon_of(b)->monitor ? monitor_huge_pages_free_bytes(daemon_of(b)->monitor) : 0;
	sr->has_unbrokered_bytes = true;
	sr->unbrokered_bytes = unbrokered_counted(&b->unbrokered, daemon_unbrokered_cap(b));
	sr->has_unbrokered_reported_bytes = true;
	sr->unbrokered_reported_bytes = b->unbrokered.reported_bytes;
	sr->has_unbrokered_cap_bytes = true;
	sr->unbrokered_cap_bytes = daemon_unbrokered_cap(b);
	sr->has_orphaned_bytes = true;
	sr->orphaned_bytes = b->orphaned_bytes;
	sr->has_job_unknown_total = true;
	sr->job_unknown_total = b->counters.job_unknown;
	sr->has_job_unknown_clients = true;
	sr->job_unknown_clients = b->job_unknown_clients;
	sr->has_staging_rings = sr->has_staging_ring_bytes = true;
	sr->staging_rings = b->staging_rings;
	sr->staging_ring_bytes = b->staging_ring_bytes;
	sr->has_staged_h2d_bytes = sr->has_staged_d2h_bytes = true;
	sr->staged_h2d_bytes = b->staged.sum.h2d_bytes;
	sr->staged_d2h_bytes = b->staged.sum.d2h_bytes;
	sr->restart_books = (char *)restart_books_name(b);
	sr->restart_warning = (char *)restart_warning(b);
	cgp = jobs_watch_cgns(b);
	if (cgp) {
		sr->cgroup_namespace = (char *)cgns_mode_name(cgp->ns.mode);
		if (cgp->ns.mode == CGNS_PRIVATE)
			sr->cgroup_ns_root = (char *)cgp->ns.root;
	}
	sr->has_uptime_ms = true;
	sr->uptime_ms = sb->now - b->started_ms;
	sr->has_prewarm_bytes = true;
	sr->prewarm_bytes = b->prewarm_bytes;
	sr->has_waiting_acquires = true;
	sr->waiting_acquires = waitq_count(b);
	fill_nodes(b, sr);
	sr->n_jobs = quota_fill_jobs(b, sb->asker, sb->see_all, sb->ji, sb->jip, STATUS_JOBS_MAX);
	sr->jobs = sb->jip;
	sr->has_quota_rules = b->jobs != NULL;
	sr->quota_rules = b->jobs ? (uint32_t)jobs_rule_count(b->jobs) : 0;
}

/* Reservation rows the asker may see (its uid's, or all), newest first, at most STATUS_RESERVATIONS_MAX. */
static void fill_reservations(struct status_build *sb, Pinbroker__V1__StatusReply *sr)
{
	size_t n = 0, total = 0;

	for (const struct reservation *res = reservation_first(sb->b); res; res = res->next) {
		Pinbroker__V1__ReservationInfo *x = &sb->ri[n];

		total++;
		if (n >= STATUS_RESERVATIONS_MAX || !visible(sb, res->uid))
			continue;
		pinbroker__v1__reservation_info__init(x);
		x->id = res->id;
		x->uid = res->uid;
		if (res->cgroup)
			x->job = res->cgroup->job ? res->cgroup->job->key : res->cgroup->path;
		x->name = (char *)res->name;
		x->shares = res->shares;
		x->share_bytes = res->share_bytes;
		x->has_taken = x->has_bytes_reserved = x->has_members = x->has_age_ms = true;
		x->taken = res->taken;
		x->bytes_reserved = res->held_bytes;
		x->state = (char *)(res->taken < res->shares ? "open" : "taken");
		x->members = (uint32_t)res->nmembers;
		x->age_ms = sb->now - res->created_ms;
		sb->rip[n++] = x;
	}
	sr->n_reservations = n;
	sr->reservations = sb->rip;
	sr->has_reserved_bytes = sr->has_reservation_count = true;
	sr->reserved_bytes = broker_reserved_bytes(sb->b);
	sr->reservation_count = (uint32_t)total;
}

static int larger_report_first(const void *a, const void *b)
{
	const struct unbrokered_uid *x = a, *y = b;

	return x->reported_bytes < y->reported_bytes ? 1 : x->reported_bytes > y->reported_bytes ? -1 : 0;
}

/*
 * One row per uid reporting unbrokered memory that the asker may see, the largest reports first, at most
 * STATUS_UNBROKERED_UIDS_MAX. O(uids log uids); uids are bounded by the connections. Returns 0 or -ENOMEM.
 */
static int fill_unbrokered_uids(struct status_build *sb, Pinbroker__V1__StatusReply *sr)
{
	const struct unbrokered *u = &sb->b->unbrokered;
	uint64_t cap = daemon_unbrokered_cap(sb->b);
	size_t n = 0;

	if (u->nuids == 0)
		return 0;
	sb->uids = calloc(u->nuids, sizeof(*sb->uids));
	if (!sb->uids)
		return -ENOMEM;
	for (size_t i = 0; i < u->nuids; i++)
		if (visible(sb, u->uids[i].uid))
			sb->uids[n++] = u->uids[i];
	qsort(sb->uids, n, sizeof(*sb->uids), larger_report_first);
	if (n > STATUS_UNBROKERED_UIDS_MAX)
		n = STATUS_UNBROKERED_UIDS_MAX;
	for (size_t i = 0; i < n; i++) {
		Pinbroker__V1__UnbrokeredUid *x = &sb->ui[i];

		pinbroker__v1__unbrokered_uid__init(x);
		x->uid = sb->uids[i].uid;
		x->reported_bytes = sb->uids[i].reported_bytes;
		x->counted_bytes = x->reported_bytes < cap ? x->reported_bytes : cap;
		x->has_connections = true;
		x->connections = sb->uids[i].connections;
		sb->uip[i] = x;
	}
	sr->n_unbrokered_uids = n;
	sr->unbrokered_uids = sb->uip;
	return 0;
}

/* Pressure signals and transitions; revocations, which name pids and uids, only for who sees every row. */
static void fill_events(struct status_build *sb, Pinbroker__V1__StatusReply *sr)
{
	struct broker *b = sb->b;

	if (daemon_of(b)->monitor) {
		size_t ns = monitor_signals(daemon_of(b)->monitor, sb->sig, MONITOR_SIGNALS_MAX);

		for (size_t i = 0; i < ns; i++) {
			Pinbroker__V1__SignalInfo *x = &sb->si[i];

			pinbroker__v1__signal_info__init(x);
			x->name = (char *)sb->sig[i].name;
			x->value = sb->sig[i].value;
			x->has_tight = !isnan(sb->sig[i].tight);
			x->tight = sb->sig[i].tight;
			x->has_critical = !isnan(sb->sig[i].critical);
			x->critical = sb->sig[i].critical;
			x->unit = (char *)sb->sig[i].unit;
			x->has_available = true;
			x->available = sb->sig[i].available;
			sb->sip[i] = x;
		}
		sr->n_signals = ns;
		sr->signals = sb->sip;
		sr->n_transitions = monitor_transitions(daemon_of(b)->monitor, sb->tev, MONITOR_EVENTS_MAX);
		for (size_t i = 0; i < sr->n_transitions; i++) {
			pinbroker__v1__event_info__init(&sb->ti[i]);
			sb->ti[i].age_ms = sb->now - sb->tev[i].when_ms;
			sb->ti[i].text = sb->tev[i].text;
			sb->tip[i] = &sb->ti[i];
		}
		sr->transitions = sb->tip;
	}
	if (!sb->see_all)
		return;
	sr->n_revocations = revoker_revocations(b, sb->rev, REVOKER_REVOCATIONS_MAX);
	for (size_t i = 0; i < sr->n_revocations; i++) {
		pinbroker__v1__event_info__init(&sb->vi[i]);
		sb->vi[i].age_ms = sb->now - sb->rev[i].when_ms;
		sb->vi[i].text = sb->rev[i].text;
		sb->vip[i] = &sb->vi[i];
	}
	sr->revocations = sb->vip;
}

/* A connection's staged copies: its last report, the rate from its reports, and the rings it holds. */
static void fill_client_staging(Pinbroker__V1__ClientStaging *s, const struct conn *cc, uint64_t now)
{
	const struct staged_counters *k = &cc->staged.last;

	pinbroker__v1__client_staging__init(s);
	s->has_h2d_bytes = s->has_d2h_bytes = s->has_h2d_copies = s->has_d2h_copies = true;
	s->h2d_bytes = k->h2d_bytes;
	s->d2h_bytes = k->d2h_bytes;
	s->h2d_copies = k->h2d_copies;
	s->d2h_copies = k->d2h_copies;
	s->has_driver_copies = s->has_ring_revoked = s->has_ring_refused = s->has_busy_ns = true;
	s->driver_copies = k->driver_copies;
	s->ring_revoked = k->ring_revoked;
	s->ring_refused = k->ring_refused;
	s->busy_ns = k->busy_ns;
	s->has_h2d_bytes_per_s = s->has_d2h_bytes_per_s = true;
	staged_rate(&cc->staged, now, &s->h2d_bytes_per_s, &s->d2h_bytes_per_s);
	s->has_ring_bytes = s->has_rings = true;
	s->ring_bytes = cc->ring_bytes;
	s->rings = cc->rings;
}

/*
 * A connection's row, from its own counters: each lease counts on the connection holding it and on each attached one.
 */
static void fill_client(Pinbroker__V1__ClientInfo *x, struct conn *cc, char **labels)
{
	pinbroker__v1__client_info__init(x);
	x->pid = cc->pid;
	x->uid = cc->uid;
	x->has_gid = true;
	x->gid = cc->gid;
	x->name = cc->name;
	x->leases = cc->nleases;
	x->bytes = cc->lease_bytes;
	x->has_attached = true;
	x->attached = cc->nattached;
	x->cgroup = cc->cgroup ? cc->cgroup->path : NULL;
	x->has_unbrokered_bytes = cc->unbrokered_bytes > 0;
	x->unbrokered_bytes = cc->unbrokered_bytes;
	for (size_t i = 0; i < CONN_LABELS_MAX; i++)
		if (cc->labels[i].leases)
			labels[x->n_labels++] = cc->labels[i].text;
	x->labels = labels;
}

static int conn_newest_first(const void *a, const void *b)
{
	const struct conn *x = *(struct conn *const *)a, *y = *(struct conn *const *)b;

	return x->id < y->id ? 1 : x->id > y->id ? -1 : 0;
}

/*
 * Client rows, newest connection first, for connections older than cursor
 * (0: from the newest). Bounded by max-connections, and by the page.
 * Returns 0 or -ENOMEM.
 */
static int fill_clients(struct status_build *sb, Pinbroker__V1__StatusReply *sr, uint64_t cursor)
{
	const struct broker *b = sb->b;
	size_t nconn = daemon_of(b)->conn_io->count(b), n = 0, k = 0, max;
	bool sorted = true;

	sb->conns = calloc(nconn + 1, sizeof(*sb->conns));
	if (!sb->conns)
		return -ENOMEM;
	for (struct conn *cc = daemon_of(b)->conn_io->first(b); cc && n < nconn; cc = cc->next) {
		if (cc->closing || (cursor && cc->id >= cursor) || !visible_row(sb, cc->uid, cc->tenant))
			continue;
		sorted = sorted && (n == 0 || sb->conns[n - 1]->id > cc->id);
		sb->conns[n++] = cc;
	}
	/* The list is kept newest first; sort only if that ever changes. */
	if (!sorted)
		qsort(sb->conns, n, sizeof(*sb->conns), conn_newest_first);
	max = n < STATUS_PAGE_MAX_ROWS ? n : STATUS_PAGE_MAX_ROWS;
	sb->ci = calloc(max + 1, sizeof(*sb->ci));
	sb->cip = calloc(max + 1, sizeof(*sb->cip));
	sb->labels = calloc((max + 1) * CONN_LABELS_MAX, sizeof(*sb->labels));
	sb->cs = calloc(max + 1, sizeof(*sb->cs));
	if (!sb->ci || !sb->cip || !sb->labels || !sb->cs)
		return -ENOMEM;
	for (; k < max; k++) {
		Pinbroker__V1__ClientInfo *x = &sb->ci[k];
		size_t row;

		fill_client(x, sb->conns[k], &sb->labels[k * CONN_LABELS_MAX]);
		/* Only a connection that staged or holds a ring carries the part: the others' rows stay as small. */
		if (sb->conns[k]->staged.reports || sb->conns[k]->rings) {
			fill_client_staging(&sb->cs[k], sb->conns[k], sb->now);
			x->staging = &sb->cs[k];
		}
		row = pinbroker__v1__client_info__get_packed_size(x) + ROW_OVERHEAD_BYTES;
		/* At least one row per page, so paging always moves on. */
		if (k > 0 && sb->bytes + row > sb->max_bytes)
			break;
		sb->bytes += row;
		sb->cip[k] = x;
	}
	sr->n_clients = k;
	sr->clients = sb->cip;
	sr->has_next_client_cursor = true;
	sr->next_client_cursor = k < n ? sb->conns[k - 1]->id : 0;
	return 0;
}

static void fill_lease(Pinbroker__V1__LeaseInfo *x, const struct lease *l, uint64_t now, int32_t *pids)
{
	pinbroker__v1__lease_info__init(x);
	x->id = l->id;
	x->pid = l->pid;
	x->uid = l->uid;
	x->bytes = l->bytes;
	x->label = (char *)l->label;
	x->age_ms = now - l->created_ms;
	x->has_priority = true;
	x->priority = reply_priority_to_wire(l->priority);
	x->state = (char *)lease_state_name(l->state);
	x->job = l->cgroup && l->cgroup->job ? l->cgroup->job->key : NULL;
	x->has_registration = l->registration;
	x->registration = l->registration;
	x->has_no_revoke = l->no_revoke;
	x->no_revoke = l->no_revoke;
	x->has_staging_ring = l->staging_ring;
	x->staging_ring = l->staging_ring;
	{
		bool misplaced;
		int node = broker_lease_node(l, &misplaced);

		x->has_numa_node = node >= 0;
		x->numa_node = node;
		x->has_misplaced = misplaced;
		x->misplaced = misplaced;
	}
	if (l->state == LEASE_IDLE) {
		x->has_idle_ms = true;
		x->idle_ms = now - l->last_used_ms;
	}
	if (l->state == LEASE_REVOKING || l->state == LEASE_OVERDUE) {
		x->has_deadline_left_ms = true;
		x->deadline_left_ms = (int64_t)l->deadline_ms - (int64_t)now;
	}
	if (l->share) {
		x->has_shared = true;
		x->shared = true;
		x->has_attachers = true;
		x->attachers = (uint32_t)l->nattachers;
		for (size_t i = 0; i < l->nattachers && i < STATUS_ATTACHER_PIDS_MAX; i++)
			pids[x->n_attacher_pids++] = l->attachers[i].pid;
		x->attacher_pids = pids;
	}
	if (l->holder_detached) {
		x->has_holder_detached = true;
		x->holder_detached = true;
	}
}

/*
 * A registration of shared memory: what this row carries of the region's charge, and the registrations
 * of the same file (a registration is never shared, so the attacher pid slots are free for their pids).
 * Pids of uids the asker may not see are counted, not listed.
 */
static void fill_registrants(const struct status_build *sb, Pinbroker__V1__LeaseInfo *x, const struct lease *l,
			     int32_t *pids)
{
	const struct backing_table *bt = sb->b->backings;
	uint64_t key;

	x->has_charged_bytes = true;
	x->charged_bytes = l->charged_bytes;
	if (!l->backed || !bt)
		return;
	x->has_registrants = true;
	x->registrants = (uint32_t)backing_registrants(bt, l->backing_dev, l->backing_ino);
	x->registrant_pids = pids;
	for (size_t i = 0; backing_registrant_at(bt, l->backing_dev, l->backing_ino, i, &key) &&
			   x->n_registrant_pids < STATUS_ATTACHER_PIDS_MAX;
	     i++) {
		const struct lease *o = lease_find(sb->b->leases, key);

		if (o && visible_row(sb, o->uid, o->tenant))
			pids[x->n_registrant_pids++] = o->pid;
	}
}

/*
 * Lease rows in id order from the first id above cursor: at most limit (0:
 * the page maximum), as many as fit the packet. Returns 0 or -ENOMEM.
 */
static int fill_leases(struct status_build *sb, Pinbroker__V1__StatusReply *sr, uint64_t cursor, uint32_t limit)
{
	struct lease_table *t = sb->b->leases;
	size_t max = limit && limit < STATUS_PAGE_MAX_ROWS ? limit : STATUS_PAGE_MAX_ROWS, k = 0, scanned = 0;
	const struct lease *l, *last = NULL;

	sb->li = calloc(max + 1, sizeof(*sb->li));
	sb->lip = calloc(max + 1, sizeof(*sb->lip));
	sb->pids = calloc((max + 1) * STATUS_ATTACHER_PIDS_MAX, sizeof(*sb->pids));
	if (!sb->li || !sb->lip || !sb->pids)
		return -ENOMEM;
	for (l = lease_next_after(t, cursor); l; l = lease_next(t, l)) {
		Pinbroker__V1__LeaseInfo *x = &sb->li[k];
		size_t row;

		if (k == max || scanned == STATUS_SCAN_MAX)
			break;
		scanned++;
		if (!visible_row(sb, l->uid, l->tenant)) {
			last = l;
			continue;
		}
		fill_lease(x, l, sb->now, &sb->pids[k * STATUS_ATTACHER_PIDS_MAX]);
		if (l->registration)
			fill_registrants(sb, x, l, &sb->pids[k * STATUS_ATTACHER_PIDS_MAX]);
		row = pinbroker__v1__lease_info__get_packed_size(x) + ROW_OVERHEAD_BYTES;
		if (k > 0 && sb->bytes + row > sb->max_bytes)
			break;
		sb->bytes += row;
		sb->lip[k++] = x;
		last = l;
	}
	sr->n_leases = k;
	sr->leases = sb->lip;
	sr->has_next_lease_cursor = true;
	/* Stopped early: the next page starts after the last lease this one looked at. */
	sr->next_lease_cursor = l && last ? last->id : 0;
	return 0;
}

/* ---------------------------------------------------------------- handler */

void handle_status(struct conn *c, const Pinbroker__V1__Request *req)
{
	const Pinbroker__V1__StatusRequest *q = req->status;
	Pinbroker__V1__StatusReply sr = PINBROKER__V1__STATUS_REPLY__INIT;
	struct status_build *sb = calloc(1, sizeof(*sb));
	Pinbroker__V1__Reply r;
	int ret = -ENOMEM;

	if (!sb)
		goto out;
	sb->b = c->broker;
	sb->asker = c;
	sb->see_all = c->admin || daemon_of(c->broker)->cfg->status_visibility == VISIBILITY_ALL;
	sb->now = now_ms();
	sb->max_bytes = reply_max_bytes(c);

	reply_init(&r, req->seq, PINBROKER__V1__STATUS_CODE__STATUS_OK, NULL);
	r.body_case = PINBROKER__V1__REPLY__BODY_STATUS_REPLY;
	r.status_reply = &sr;
	fill_summary(sb, &sr);
	/* The uid rows go with the first page only: the library reads them from it, later pages add rows. */
	if (!(q->has_client_cursor && q->client_cursor) && !(q->has_lease_cursor && q->lease_cursor) &&
	    fill_unbrokered_uids(sb, &sr) < 0)
		goto out;
	if (!(q->has_client_cursor && q->client_cursor) && !(q->has_lease_cursor && q->lease_cursor))
		fill_reservations(sb, &sr);
	if (!q->has_include_events || q->include_events)
		fill_events(sb, &sr);
	/* Both cursors are sent even when 0, so a client can tell "no more" from a daemon that does not page. */
	sr.has_next_client_cursor = true;
	sr.has_next_lease_cursor = true;
	sb->bytes = pinbroker__v1__reply__get_packed_size(&r) + 2 * 11;
	ret = 0;
	if (!q->has_include_clients || q->include_clients)
		ret = fill_clients(sb, &sr, q->has_client_cursor ? q->client_cursor : 0);
	if (ret == 0 && (!q->has_include_leases || q->include_leases))
		ret = fill_leases(sb, &sr, q->has_lease_cursor ? q->lease_cursor : 0,
				  q->has_lease_limit ? q->lease_limit : 0);
	if (ret == 0)
		reply_send(c, &r, NULL, 0);
out:
	if (ret < 0)
		reply_close(c, "out of memory building status");
	if (sb) {
		free(sb->conns);
		free(sb->ci);
		free(sb->cip);
		free(sb->labels);
		free(sb->cs);
		free(sb->li);
		free(sb->lip);
		free(sb->pids);
		free(sb->uids);
	}
	free(sb);
}

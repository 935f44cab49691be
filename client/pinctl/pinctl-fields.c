/* SPDX-License-Identifier: MIT */
/*
 * pinctl leases and status for scripts: each field named and valued as its --json key is (numbers in base
 * units, true/false), printed as aligned columns or CSV. Part of the output room: it asks nothing of the daemon.
 */
#define _GNU_SOURCE
#include "pinctl-fields.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pinbroker.h"
#include "pinctl-output.h"
#include "util.h"

#define LEASE(row) ((const struct pb_lease_info *)(row))
#define STATUS(row) ((const struct pb_status *)(row))
#define JOB(row) ((const struct pb_job *)(row))
#define RULE(row) ((const struct pb_quota_rule *)(row))
#define CONF(row) ((const struct pb_config_entry *)(row))
#define SAMPLE(row) ((const struct metric_sample *)(row))

/* One accessor per field; the macros write the plain ones. */
#define FIELD_U64(kind, cast, member)                                              \
	static const char *kind##_##member(const void *row, char *buf, size_t len) \
	{                                                                          \
		snprintf(buf, len, "%" PRIu64, (uint64_t)cast(row)->member);       \
		return buf;                                                        \
	}
#define FIELD_I64(kind, cast, member)                                              \
	static const char *kind##_##member(const void *row, char *buf, size_t len) \
	{                                                                          \
		snprintf(buf, len, "%" PRId64, (int64_t)cast(row)->member);        \
		return buf;                                                        \
	}
#define FIELD_BOOL(kind, cast, member)                                             \
	static const char *kind##_##member(const void *row, char *buf, size_t len) \
	{                                                                          \
		snprintf(buf, len, "%s", cast(row)->member ? "true" : "false");    \
		return buf;                                                        \
	}
#define FIELD_STR(kind, cast, member)                                                 \
	static const char *kind##_##member(const void *row, char *buf, size_t len)    \
	{                                                                             \
		snprintf(buf, len, "%s", cast(row)->member ? cast(row)->member : ""); \
		return buf;                                                           \
	}

/* A table's row for the field named as its member, and a table with its length (as pinctl-fields.h declares them). */
/* clang-format off */
#define FIELD(kind, member) { #member, kind##_##member }
/* clang-format on */
#define FIELD_TABLE(kind, ...)                                       \
	const struct pinctl_field kind##_fields[] = { __VA_ARGS__ }; \
	const size_t n_##kind##_fields = sizeof(kind##_fields) / sizeof(kind##_fields[0])

FIELD_U64(lease, LEASE, id)
FIELD_I64(lease, LEASE, pid)
FIELD_U64(lease, LEASE, uid)
FIELD_U64(lease, LEASE, bytes)
FIELD_STR(lease, LEASE, label)
FIELD_U64(lease, LEASE, age_ms)
FIELD_STR(lease, LEASE, state)
FIELD_U64(lease, LEASE, idle_ms)
FIELD_I64(lease, LEASE, deadline_left_ms)
FIELD_BOOL(lease, LEASE, shared)
FIELD_BOOL(lease, LEASE, holder_detached)
FIELD_BOOL(lease, LEASE, registration)
FIELD_BOOL(lease, LEASE, no_revoke)
FIELD_BOOL(lease, LEASE, misplaced)
FIELD_BOOL(lease, LEASE, staging_ring)
FIELD_U64(lease, LEASE, attachers)
FIELD_U64(lease, LEASE, charged_bytes)
FIELD_U64(lease, LEASE, registrants)

static const char *lease_user(const void *row, char *buf, size_t len)
{
	return user_name(LEASE(row)->uid, buf, len);
}

static const char *lease_priority(const void *row, char *buf, size_t len)
{
	snprintf(buf, len, "%s", priority_name(LEASE(row)->priority));
	return buf;
}

static const char *lease_numa_node(const void *row, char *buf, size_t len)
{
	if (LEASE(row)->numa_node < 0)
		return NULL;
	snprintf(buf, len, "%d", LEASE(row)->numa_node);
	return buf;
}

static const char *lease_job(const void *row, char *buf, size_t len)
{
	const char *job = LEASE(row)->job;

	if (!job || !job[0])
		return NULL;
	snprintf(buf, len, "%s", job);
	return buf;
}

/* A JSON array of pids as one value: joined by spaces. */
static const char *join_pids(const int32_t *pids, size_t n, char *buf, size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (size_t k = 0; k < n && used < len; k++)
		used += (size_t)snprintf(buf + used, len - used, "%s%" PRId32, k ? " " : "", pids[k]);
	return buf;
}

static const char *lease_attacher_pids(const void *row, char *buf, size_t len)
{
	return join_pids(LEASE(row)->attacher_pids, LEASE(row)->n_attacher_pids, buf, len);
}

static const char *lease_registrant_pids(const void *row, char *buf, size_t len)
{
	return join_pids(LEASE(row)->registrant_pids, LEASE(row)->n_registrant_pids, buf, len);
}

/* In the order of pinctl leases --json. */
const struct pinctl_field lease_fields[] = {
	{ "id", lease_id },
	{ "pid", lease_pid },
	{ "uid", lease_uid },
	{ "user", lease_user },
	{ "bytes", lease_bytes },
	{ "label", lease_label },
	{ "age_ms", lease_age_ms },
	{ "priority", lease_priority },
	{ "state", lease_state },
	{ "idle_ms", lease_idle_ms },
	{ "deadline_left_ms", lease_deadline_left_ms },
	{ "shared", lease_shared },
	{ "holder_detached", lease_holder_detached },
	{ "registration", lease_registration },
	{ "no_revoke", lease_no_revoke },
	{ "numa_node", lease_numa_node },
	{ "misplaced", lease_misplaced },
	{ "job", lease_job },
	{ "attachers", lease_attachers },
	{ "attacher_pids", lease_attacher_pids },
	{ "charged_bytes", lease_charged_bytes },
	{ "registrants", lease_registrants },
	{ "registrant_pids", lease_registrant_pids },
	{ "staging_ring", lease_staging_ring },
};
const size_t n_lease_fields = sizeof(lease_fields) / sizeof(lease_fields[0]);

FIELD_STR(status, STATUS, server_version)
FIELD_U64(status, STATUS, budget_bytes)
FIELD_U64(status, STATUS, uid_quota_bytes)
FIELD_U64(status, STATUS, leased_bytes)
FIELD_U64(status, STATUS, pool_bytes)
FIELD_U64(status, STATUS, pool_idle_bytes)
FIELD_U64(status, STATUS, page_size_bytes)
FIELD_U64(status, STATUS, chunk_size_bytes)
FIELD_BOOL(status, STATUS, hugetlb)
FIELD_STR(status, STATUS, page_kind)
FIELD_U64(status, STATUS, thp_bytes)
FIELD_U64(status, STATUS, thp_failures)
FIELD_U64(status, STATUS, hugetlb_bytes)
FIELD_U64(status, STATUS, huge_pages_free_bytes)
FIELD_U64(status, STATUS, overdue_bytes)
FIELD_U64(status, STATUS, cached_idle_bytes)
FIELD_U64(status, STATUS, registered_bytes)
FIELD_U64(status, STATUS, no_revoke_bytes)
FIELD_U64(status, STATUS, unbrokered_bytes)
FIELD_U64(status, STATUS, unbrokered_reported_bytes)
FIELD_U64(status, STATUS, unbrokered_cap_bytes)
FIELD_U64(status, STATUS, orphaned_bytes)
FIELD_U64(status, STATUS, chunk_max_bytes)
FIELD_U64(status, STATUS, chunk_capacity)
FIELD_BOOL(status, STATUS, pool_warming)
FIELD_U64(status, STATUS, prewarm_bytes)
FIELD_U64(status, STATUS, waiting_acquires)
FIELD_STR(status, STATUS, pressure_state)
FIELD_STR(status, STATUS, monitor_mode)
FIELD_U64(status, STATUS, uptime_ms)

/* pb_status_cgroup_namespace's two strings: empty from an older daemon (null in --json). */
static const char *status_cgroup_namespace(const void *row, char *buf, size_t len)
{
	const char *ns = pb_status_cgroup_namespace(STATUS(row), NULL);

	snprintf(buf, len, "%s", ns ? ns : "");
	return buf;
}

static const char *status_cgroup_ns_root(const void *row, char *buf, size_t len)
{
	const char *root = NULL;

	pb_status_cgroup_namespace(STATUS(row), &root);
	snprintf(buf, len, "%s", root ? root : "");
	return buf;
}

/* pb_status_job_unknown's two figures: 0 from an older daemon. */
static const char *status_job_unknown_clients(const void *row, char *buf, size_t len)
{
	snprintf(buf, len, "%" PRIu32, pb_status_job_unknown(STATUS(row), NULL));
	return buf;
}

static const char *status_job_unknown_total(const void *row, char *buf, size_t len)
{
	uint64_t acquires;

	pb_status_job_unknown(STATUS(row), &acquires);
	snprintf(buf, len, "%" PRIu64, acquires);
	return buf;
}

/* pb_status_staging's figures: 0 from an older daemon. */
static const char *status_staging_field(const void *row, char *buf, size_t len, int which)
{
	struct pb_status_staging st;
	uint64_t v[] = { 0, 0, 0, 0 };

	if (pb_status_staging(STATUS(row), &st) == 0) {
		v[0] = st.rings;
		v[1] = st.ring_bytes;
		v[2] = st.h2d_bytes;
		v[3] = st.d2h_bytes;
	}
	snprintf(buf, len, "%" PRIu64, v[which]);
	return buf;
}

static const char *status_staging_rings(const void *row, char *buf, size_t len)
{
	return status_staging_field(row, buf, len, 0);
}

static const char *status_staging_ring_bytes(const void *row, char *buf, size_t len)
{
	return status_staging_field(row, buf, len, 1);
}

static const char *status_staged_h2d_bytes(const void *row, char *buf, size_t len)
{
	return status_staging_field(row, buf, len, 2);
}

static const char *status_staged_d2h_bytes(const void *row, char *buf, size_t len)
{
	return status_staging_field(row, buf, len, 3);
}

/* As status --json computes it: the budget less what is leased, never negative. */
static const char *status_free_bytes(const void *row, char *buf, size_t len)
{
	const struct pb_status *s = STATUS(row);

	snprintf(buf, len, "%" PRIu64, s->budget_bytes > s->leased_bytes ? s->budget_bytes - s->leased_bytes : 0);
	return buf;
}

/* The scalar keys of pinctl status --json, in its order; its arrays (nodes, clients, leases, ...) are not fields. */
const struct pinctl_field status_fields[] = {
	{ "version", status_server_version },
	{ "budget_bytes", status_budget_bytes },
	{ "uid_quota_bytes", status_uid_quota_bytes },
	{ "leased_bytes", status_leased_bytes },
	{ "pool_bytes", status_pool_bytes },
	{ "pool_idle_bytes", status_pool_idle_bytes },
	{ "free_bytes", status_free_bytes },
	{ "page_size_bytes", status_page_size_bytes },
	{ "chunk_size_bytes", status_chunk_size_bytes },
	{ "chunk_max_bytes", status_chunk_max_bytes },
	{ "chunk_capacity", status_chunk_capacity },
	{ "pool_warming", status_pool_warming },
	{ "hugetlb", status_hugetlb },
	{ "page_kind", status_page_kind },
	{ "thp_bytes", status_thp_bytes },
	{ "thp_failures", status_thp_failures },
	{ "hugetlb_bytes", status_hugetlb_bytes },
	{ "huge_pages_free_bytes", status_huge_pages_free_bytes },
	{ "overdue_bytes", status_overdue_bytes },
	{ "cached_idle_bytes", status_cached_idle_bytes },
	{ "registered_bytes", status_registered_bytes },
	{ "no_revoke_bytes", status_no_revoke_bytes },
	{ "unbrokered_bytes", status_unbrokered_bytes },
	{ "unbrokered_reported_bytes", status_unbrokered_reported_bytes },
	{ "unbrokered_cap_bytes", status_unbrokered_cap_bytes },
	{ "orphaned_bytes", status_orphaned_bytes },
	{ "prewarm_bytes", status_prewarm_bytes },
	{ "waiting_acquires", status_waiting_acquires },
	{ "pressure_state", status_pressure_state },
	{ "monitor_mode", status_monitor_mode },
	{ "uptime_ms", status_uptime_ms },
	{ "cgroup_namespace", status_cgroup_namespace },
	{ "cgroup_ns_root", status_cgroup_ns_root },
	{ "job_unknown_clients", status_job_unknown_clients },
	{ "job_unknown_total", status_job_unknown_total },
	{ "staging_rings", status_staging_rings },
	{ "staging_ring_bytes", status_staging_ring_bytes },
	{ "staged_h2d_bytes", status_staged_h2d_bytes },
	{ "staged_d2h_bytes", status_staged_d2h_bytes },
};
const size_t n_status_fields = sizeof(status_fields) / sizeof(status_fields[0]);

/* ---------------------------------------------------------------- jobs, quota rules, config */

FIELD_STR(job, JOB, job)
FIELD_U64(job, JOB, bytes)
FIELD_U64(job, JOB, leases)

/* null without a quota, as --json has it. */
static const char *job_quota_bytes(const void *row, char *buf, size_t len)
{
	if (!JOB(row)->has_quota)
		return NULL;
	snprintf(buf, len, "%" PRIu64, JOB(row)->quota_bytes);
	return buf;
}

static const char *job_rule(const void *row, char *buf, size_t len)
{
	return JOB(row)->has_quota ? JOB(row)->rule : NULL;
}

static const char *job_source(const void *row, char *buf, size_t len)
{
	return JOB(row)->has_quota ? JOB(row)->source : NULL;
}

const struct pinctl_field job_fields[] = {
	{ "job", job_job },   { "bytes", job_bytes },   { "leases", job_leases }, { "quota_bytes", job_quota_bytes },
	{ "rule", job_rule }, { "source", job_source },
};
const size_t n_job_fields = sizeof(job_fields) / sizeof(job_fields[0]);

/* headroom: one row per bound; left_bytes null where a count cap bounds no bytes, as --json has it. */
#define HROW(row) ((const struct headroom_row *)(row))
#define HBOUND(row) (&HROW(row)->h->bounds[HROW(row)->i])

static const char *headroom_bound(const void *row, char *buf, size_t len)
{
	return pb_bound_name(HBOUND(row)->kind);
}

static const char *headroom_limit(const void *row, char *buf, size_t len)
{
	snprintf(buf, len, "%" PRIu64, HBOUND(row)->limit);
	return buf;
}

static const char *headroom_used(const void *row, char *buf, size_t len)
{
	snprintf(buf, len, "%" PRIu64, HBOUND(row)->used);
	return buf;
}

static const char *headroom_left_bytes(const void *row, char *buf, size_t len)
{
	if (HBOUND(row)->left_bytes == PB_HEADROOM_UNBOUNDED)
		return NULL;
	snprintf(buf, len, "%" PRIu64, HBOUND(row)->left_bytes);
	return buf;
}

static const char *headroom_binding(const void *row, char *buf, size_t len)
{
	snprintf(buf, len, "%s", HROW(row)->i == HROW(row)->h->binding ? "true" : "false");
	return buf;
}

static const char *headroom_reason(const void *row, char *buf, size_t len)
{
	return HBOUND(row)->reason;
}

static const char *headroom_available_bytes(const void *row, char *buf, size_t len)
{
	snprintf(buf, len, "%" PRIu64, HROW(row)->h->available_bytes);
	return buf;
}

const struct pinctl_field headroom_fields[] = {
	{ "bound", headroom_bound },
	{ "limit", headroom_limit },
	{ "used", headroom_used },
	{ "left_bytes", headroom_left_bytes },
	{ "binding", headroom_binding },
	{ "reason", headroom_reason },
	{ "available_bytes", headroom_available_bytes },
};
const size_t n_headroom_fields = sizeof(headroom_fields) / sizeof(headroom_fields[0]);
#define RES(row) ((const struct pb_reservation_info *)(row))
FIELD_U64(res, RES, id)
FIELD_U64(res, RES, uid)
FIELD_STR(res, RES, name)
FIELD_U64(res, RES, shares)
FIELD_U64(res, RES, share_bytes)
FIELD_U64(res, RES, taken)
FIELD_U64(res, RES, bytes_reserved)
FIELD_STR(res, RES, state)
FIELD_U64(res, RES, members)
FIELD_U64(res, RES, age_ms)

/* null without a job, as --json has it. */
static const char *res_job(const void *row, char *buf, size_t len)
{
	(void)buf;
	(void)len;
	return RES(row)->job[0] ? RES(row)->job : NULL;
}

const struct pinctl_field reservation_fields[] = {
	{ "id", res_id },         { "uid", res_uid },
	{ "job", res_job },       { "name", res_name },
	{ "shares", res_shares }, { "share_bytes", res_share_bytes },
	{ "taken", res_taken },   { "bytes_reserved", res_bytes_reserved },
	{ "state", res_state },   { "members", res_members },
	{ "age_ms", res_age_ms },
};
const size_t n_reservation_fields = sizeof(reservation_fields) / sizeof(reservation_fields[0]);

FIELD_STR(rule, RULE, pattern)
FIELD_U64(rule, RULE, bytes)
FIELD_STR(rule, RULE, source)
FIELD_BOOL(rule, RULE, seen)
FIELD_TABLE(rule, FIELD(rule, pattern), FIELD(rule, bytes), FIELD(rule, source), FIELD(rule, seen));

FIELD_STR(config, CONF, key)
FIELD_STR(config, CONF, value)
FIELD_STR(config, CONF, source)
FIELD_BOOL(config, CONF, reloadable)

/* file and line only where the value came from a file, as --json has them. */
static const char *config_file(const void *row, char *buf, size_t len)
{
	return CONF(row)->file && CONF(row)->file[0] ? CONF(row)->file : NULL;
}

static const char *config_line(const void *row, char *buf, size_t len)
{
	if (!CONF(row)->file || !CONF(row)->file[0])
		return NULL;
	snprintf(buf, len, "%" PRIu32, CONF(row)->line);
	return buf;
}

const struct pinctl_field config_fields[] = {
	{ "key", config_key },   { "value", config_value }, { "source", config_source },
	{ "file", config_file }, { "line", config_line },   { "reloadable", config_reloadable },
};
const size_t n_config_fields = sizeof(config_fields) / sizeof(config_fields[0]);

/* ---------------------------------------------------------------- metrics */

FIELD_STR(metric, SAMPLE, name)
FIELD_STR(metric, SAMPLE, type)
FIELD_STR(metric, SAMPLE, labels)
FIELD_STR(metric, SAMPLE, value)
FIELD_TABLE(metric, FIELD(metric, name), FIELD(metric, type), FIELD(metric, labels), FIELD(metric, value));

void metrics_free(struct metric_sample *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(s[i].name);
		free(s[i].type);
		free(s[i].labels);
		free(s[i].value);
	}
	free(s);
}

/* The end of the label set that starts after '{' at p (its '}'), or NULL: quoted values may hold '}' and escapes. */
static const char *labels_end(const char *p, const char *eol)
{
	bool quoted = false;

	for (; p < eol; p++) {
		if (quoted && *p == '\\' && p + 1 < eol)
			p++;
		else if (*p == '"')
			quoted = !quoted;
		else if (!quoted && *p == '}')
			return p;
	}
	return NULL;
}

/* One sample line [p, eol) into *s, its family's type being type. 0, -EBADMSG or -ENOMEM. */
static int parse_sample(const char *p, const char *eol, const char *type, struct metric_sample *s)
{
	size_t nl = strcspn(p, "{ \n");
	const char *q = p + nl, *lb = "", *le = lb, *v;
	size_t vl;

	if (nl == 0 || q >= eol)
		return -EBADMSG;
	if (*q == '{') {
		lb = q + 1;
		le = labels_end(lb, eol);
		if (!le)
			return -EBADMSG;
		q = le + 1;
	}
	while (q < eol && *q == ' ')
		q++;
	v = q;
	vl = strcspn(v, " \n");
	if (vl == 0 || v + vl > eol)
		return -EBADMSG;
	s->name = strndup(p, nl);
	s->type = strdup(type);
	s->labels = strndup(lb, (size_t)(le - lb));
	s->value = strndup(v, vl);
	return s->name && s->type && s->labels && s->value ? 0 : -ENOMEM;
}

/* A sample's family: a histogram's _bucket, _sum and _count belong to the name its # TYPE gives. */
static bool of_family(const char *name, size_t nl, const char *family)
{
	size_t fl = strlen(family);

	if (nl == fl)
		return strncmp(name, family, fl) == 0;
	if (nl < fl || strncmp(name, family, fl) != 0)
		return false;
	name += fl;
	nl -= fl;
	return (nl == 7 && strncmp(name, "_bucket", 7) == 0) || (nl == 4 && strncmp(name, "_sum", 4) == 0) ||
	       (nl == 6 && strncmp(name, "_count", 6) == 0);
}

int metrics_parse(const char *text, struct metric_sample **ret, size_t *n)
{
	struct metric_sample *all = NULL;
	char family[256] = "", type[32] = "untyped";
	size_t cnt = 0, cap = 0;

	for (const char *p = text; *p;) {
		const char *eol = strchr(p, '\n');
		int r;

		if (!eol)
			eol = p + strlen(p);
		if (strncmp(p, "# TYPE ", 7) == 0) {
			if (sscanf(p + 7, "%255s %31s", family, type) != 2) {
				metrics_free(all, cnt);
				return -EBADMSG;
			}
		} else if (p < eol && *p != '#') {
			if (cnt == cap) {
				struct metric_sample *v = realloc(all, (cap = cap ? 2 * cap : 64) * sizeof(*v));

				if (!v) {
					metrics_free(all, cnt);
					return -ENOMEM;
				}
				all = v;
			}
			memset(&all[cnt], 0, sizeof(all[cnt]));
			r = parse_sample(p, eol, of_family(p, strcspn(p, "{ \n"), family) ? type : "untyped",
					 &all[cnt]);
			cnt++;
			if (r < 0) {
				metrics_free(all, cnt);
				return r;
			}
		}
		p = *eol ? eol + 1 : eol;
	}
	*ret = all;
	*n = cnt;
	return 0;
}

/* k="v",k2="v2" as JSON members: the value's escapes (\\, \", \n) undone, then written as JSON strings. */
static void labels_json(FILE *f, const char *l)
{
	bool first = true;

	fputc('{', f);
	while (*l) {
		size_t kl = strcspn(l, "=");
		char *v, *w;

		if (l[kl] != '=' || l[kl + 1] != '"')
			break;
		fprintf(f, "%s\"%.*s\":", first ? "" : ",", (int)kl, l);
		first = false;
		l += kl + 2;
		v = w = malloc(strlen(l) + 1);
		if (!v)
			break;
		for (; *l && *l != '"'; l++) {
			if (*l == '\\' && l[1]) {
				l++;
				*w++ = *l == 'n' ? '\n' : *l;
			} else {
				*w++ = *l;
			}
		}
		*w = '\0';
		json_str(f, v);
		free(v);
		if (*l == '"')
			l++;
		if (*l == ',')
			l++;
	}
	fputc('}', f);
}

void metrics_json(FILE *f, const struct metric_sample *s, size_t n)
{
	fprintf(f, "{\"schema_version\":%d,\"metrics\":[", JSON_SCHEMA_VERSION);
	for (size_t i = 0; i < n; i++) {
		fputs(i ? ",\n{" : "{", f);
		json_kstr(f, "name", s[i].name, true);
		json_kstr(f, "type", s[i].type, true);
		json_key(f, "labels");
		labels_json(f, s[i].labels);
		fputc(',', f);
		json_kstr(f, "value", s[i].value, false);
		fputc('}', f);
	}
	fputs("]}\n", f);
}

int fields_parse(const struct pinctl_field *table, size_t n, const char *list, struct fields *ret, char *bad,
		 size_t badlen)
{
	const char *p = list;

	ret->n = 0;
	bad[0] = '\0';
	if (!list) {
		for (size_t i = 0; i < n && i < FIELDS_MAX; i++)
			ret->f[ret->n++] = &table[i];
		return 0;
	}
	for (;;) {
		size_t len = strcspn(p, ",");
		size_t i;

		for (i = 0; i < n; i++)
			if (strlen(table[i].name) == len && strncmp(table[i].name, p, len) == 0)
				break;
		if (i == n || ret->n == FIELDS_MAX) {
			snprintf(bad, badlen, "%.*s", (int)len, p);
			return -EINVAL;
		}
		ret->f[ret->n++] = &table[i];
		if (!p[len])
			return 0;
		p += len + 1;
	}
}

const char *fields_names(const struct pinctl_field *table, size_t n, char *buf, size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < n && used < len; i++)
		used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? "," : "", table[i].name);
	return buf;
}

/* A CSV cell: quoted when it holds a comma, a quote or a space at an end (RFC 4180), quotes doubled. */
static void csv_cell(FILE *f, const char *s)
{
	size_t n = strlen(s);

	if (!strpbrk(s, ",\"") && (n == 0 || (s[0] != ' ' && s[n - 1] != ' '))) {
		fputs(s, f);
		return;
	}
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"')
			fputc('"', f);
		fputc(*s, f);
	}
	fputc('"', f);
}

/* Row r's field i as printed: escaped, "" for null in CSV and "-" for null or empty in columns. */
static char *cell_text(const struct fields *sel, const void *row, size_t i, bool csv)
{
	char raw[ESC_BYTES], e[ESC_BYTES];
	const char *v = sel->f[i]->value(row, raw, sizeof(raw));

	if (!v || !v[0])
		return strdup(csv ? "" : "-");
	return strdup(esc(v, e));
}

int fields_print(FILE *f, const struct fields *sel, const void *rows, size_t row_bytes, size_t n, bool csv,
		 bool headers)
{
	size_t width[FIELDS_MAX] = { 0 };
	char **cells = calloc(n * sel->n + 1, sizeof(*cells));

	if (!cells)
		return -ENOMEM;
	for (size_t r = 0; r < n; r++) {
		for (size_t i = 0; i < sel->n; i++) {
			char *c = cell_text(sel, (const char *)rows + r * row_bytes, i, csv);

			if (!c) {
				for (size_t k = 0; k < r * sel->n + i; k++)
					free(cells[k]);
				free(cells);
				return -ENOMEM;
			}
			cells[r * sel->n + i] = c;
			if (strlen(c) > width[i])
				width[i] = strlen(c);
		}
	}
	for (size_t i = 0; i < sel->n; i++)
		if (strlen(sel->f[i]->name) > width[i])
			width[i] = strlen(sel->f[i]->name);
	if (headers) {
		for (size_t i = 0; i < sel->n; i++) {
			if (csv) {
				fprintf(f, "%s%s", i ? "," : "", sel->f[i]->name);
				continue;
			}
			fputs(i ? " " : "", f);
			for (const char *c = sel->f[i]->name; *c; c++)
				fputc(*c >= 'a' && *c <= 'z' ? *c - 'a' + 'A' : *c, f);
			/* The last column is not padded: no trailing blanks. */
			if (i + 1 < sel->n)
				fprintf(f, "%*s", (int)(width[i] - strlen(sel->f[i]->name)), "");
		}
		fputc('\n', f);
	}
	for (size_t r = 0; r < n; r++) {
		for (size_t i = 0; i < sel->n; i++) {
			const char *c = cells[r * sel->n + i];

			if (csv) {
				fputs(i ? "," : "", f);
				csv_cell(f, c);
			} else {
				fprintf(f, "%s%-*s", i ? " " : "", i + 1 < sel->n ? (int)width[i] : 0, c);
			}
		}
		fputc('\n', f);
	}
	for (size_t k = 0; k < n * sel->n; k++)
		free(cells[k]);
	free(cells);
	return 0;
}

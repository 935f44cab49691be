/* SPDX-License-Identifier: MIT */
/*
 * pinctl's output: sizes, durations and names for people, peer text made terminal-safe, and the JSON
 * (written by hand) and text forms of what the daemon answers. Writes to the FILE it is given or to
 * stdout; asks nothing of the daemon, so every command's output room is this one.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <math.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pinbroker.h"
#include "pinctl-output.h"
#include "text.h"
#include "util.h"

/* uid's user name, or the number when the passwd database has none. */
const char *user_name(uint32_t uid, char *buf, size_t len)
{
	struct passwd *pw = getpwuid((uid_t)uid);

	if (pw && pw->pw_name && *pw->pw_name)
		snprintf(buf, len, "%s", pw->pw_name);
	else
		snprintf(buf, len, "%" PRIu32, uid);
	return buf;
}

/*
 * Text that came from the daemon or its other clients (labels, names, event
 * texts), made safe for a terminal: C-escaped, so a newline can't forge a row
 * and an escape sequence can't drive the terminal. buf holds ESC_BYTES.
 */
const char *esc(const char *s, char *buf)
{
	return text_escape(buf, ESC_BYTES, s ? s : "");
}

/* ---------------------------------------------------------------- formatting */

/* The pool's page kind for people. */
static const char *page_kind_text(const char *kind)
{
	if (strcmp(kind, "hugetlb") == 0)
		return "hugetlb 2 MiB pages";
	if (strcmp(kind, "thp") == 0)
		return "4 KiB shmem collapsed into transparent huge pages";
	if (strcmp(kind, "4k") == 0)
		return "4 KiB pages";
	return "pages of an unknown kind (an older daemon)";
}

const char *size_str(uint64_t bytes, char *buf, size_t len)
{
	return format_size(bytes, buf, len);
}

const char *duration_str(uint64_t ms, char *buf, size_t len)
{
	uint64_t s = ms / 1000;

	if (ms < 1000)
		snprintf(buf, len, "%" PRIu64 " ms", ms);
	else if (s < 60)
		snprintf(buf, len, "%.1f s", (double)ms / 1000.0);
	else if (s < 3600)
		snprintf(buf, len, "%" PRIu64 "m %02" PRIu64 "s", s / 60, s % 60);
	else if (s < 86400)
		snprintf(buf, len, "%" PRIu64 "h %02" PRIu64 "m", s / 3600, (s / 60) % 60);
	else
		snprintf(buf, len, "%" PRIu64 "d %02" PRIu64 "h", s / 86400, (s / 3600) % 24);
	return buf;
}

const char *priority_name(enum pb_priority p)
{
	switch (p) {
	case PB_PRIORITY_CRITICAL:
		return "critical";
	case PB_PRIORITY_BEST_EFFORT:
		return "best-effort";
	case PB_PRIORITY_NORMAL:
	default:
		return "normal";
	}
}

/* A signal's figure in its unit: bytes human-readable, whole numbers as integers, the rest to 4 digits. */
static const char *figure_str(double v, const char *unit, char *buf, size_t len)
{
	if (isnan(v))
		return "-";
	if (strcmp(unit, "bytes") == 0 && v >= 0 && v < 1.8e19)
		return format_size((uint64_t)v, buf, len);
	if (isfinite(v) && v == floor(v) && fabs(v) < 1e15)
		snprintf(buf, len, "%.0f", v);
	else
		snprintf(buf, len, "%.4g", v);
	return buf;
}

/* ---------------------------------------------------------------- JSON, written by hand */

/*
 * A JSON string (RFC 8259): quote, backslash and every unprintable character
 * escaped (controls, DEL, C1, U+2028/U+2029, which end a line in JavaScript,
 * and the bidirectional controls); bytes that are not UTF-8 become U+FFFD,
 * because JSON text must be UTF-8.
 */
void json_str(FILE *f, const char *s)
{
	const char *p = s ? s : "";
	size_t len = strlen(p);

	fputc('"', f);
	for (size_t i = 0; i < len;) {
		uint32_t cp;
		size_t n = text_decode(p + i, len - i, &cp);

		if (n == 0) {
			fputs("\\ufffd", f);
			i++;
			continue;
		}
		if (cp == '"')
			fputs("\\\"", f);
		else if (cp == '\\')
			fputs("\\\\", f);
		else if (cp == '\n')
			fputs("\\n", f);
		else if (cp == '\r')
			fputs("\\r", f);
		else if (cp == '\t')
			fputs("\\t", f);
		else if (!text_cp_printable(cp))
			fprintf(f, "\\u%04" PRIx32, cp); /* every unprintable one is in the BMP */
		else
			fwrite(p + i, 1, n, f);
		i += n;
	}
	fputc('"', f);
}

/* JSON has no NaN or infinity: an absent threshold is null. */
static void json_double(FILE *f, double v)
{
	if (!isfinite(v))
		fputs("null", f);
	else
		fprintf(f, "%.15g", v);
}

void json_key(FILE *f, const char *k)
{
	json_str(f, k);
	fputc(':', f);
}

void json_u64(FILE *f, const char *k, uint64_t v, bool comma)
{
	json_key(f, k);
	fprintf(f, "%" PRIu64 "%s", v, comma ? "," : "");
}

void json_kstr(FILE *f, const char *k, const char *v, bool comma)
{
	json_key(f, k);
	json_str(f, v);
	if (comma)
		fputc(',', f);
}

static void json_kdouble(FILE *f, const char *k, double v, bool comma)
{
	json_key(f, k);
	json_double(f, v);
	if (comma)
		fputc(',', f);
}

static void json_events(FILE *f, const char *k, const struct pb_event_info *e, size_t n)
{
	json_key(f, k);
	fputc('[', f);
	for (size_t i = 0; i < n; i++) {
		fprintf(f, "%s{", i ? "," : "");
		json_u64(f, "age_ms", e[i].age_ms, true);
		json_kstr(f, "text", e[i].text, false);
		fputc('}', f);
	}
	fputc(']', f);
}

/* Labels travel comma-joined in pb_client_info; JSON gets them back as an array. */
static void json_labels(FILE *f, const char *joined)
{
	const char *p = joined ? joined : "";
	bool first = true;

	fputc('[', f);
	while (*p) {
		const char *comma = strchr(p, ',');
		size_t n = comma ? (size_t)(comma - p) : strlen(p);
		char *one = strndup(p, n);

		if (!first)
			fputc(',', f);
		json_str(f, one);
		free(one);
		first = false;
		p += n;
		if (*p == ',')
			p++;
	}
	fputc(']', f);
}

void json_leases(FILE *f, const struct pb_lease_info *rows, size_t n)
{
	json_key(f, "leases");
	fputc('[', f);
	for (size_t i = 0; i < n; i++) {
		const struct pb_lease_info *l = &rows[i];
		char user[64];

		fprintf(f, "%s{", i ? "," : "");
		json_u64(f, "id", l->id, true);
		json_key(f, "pid");
		fprintf(f, "%" PRId32 ",", l->pid);
		json_u64(f, "uid", l->uid, true);
		json_kstr(f, "user", user_name(l->uid, user, sizeof(user)), true);
		json_u64(f, "bytes", l->bytes, true);
		json_kstr(f, "label", l->label, true);
		json_u64(f, "age_ms", l->age_ms, true);
		json_kstr(f, "priority", priority_name(l->priority), true);
		json_kstr(f, "state", l->state, true);
		json_u64(f, "idle_ms", l->idle_ms, true);
		json_key(f, "deadline_left_ms");
		fprintf(f, "%" PRId64 ",", l->deadline_left_ms);
		fprintf(f, "\"shared\":%s,\"holder_detached\":%s,", l->shared ? "true" : "false",
			l->holder_detached ? "true" : "false");
		fprintf(f, "\"registration\":%s,\"no_revoke\":%s,", l->registration ? "true" : "false",
			l->no_revoke ? "true" : "false");
		json_key(f, "numa_node");
		if (l->numa_node >= 0)
			fprintf(f, "%d,", l->numa_node);
		else
			fputs("null,", f);
		fprintf(f, "\"misplaced\":%s,", l->misplaced ? "true" : "false");
		json_key(f, "job");
		if (l->job && l->job[0]) {
			json_str(f, l->job);
			fputc(',', f);
		} else {
			fputs("null,", f);
		}
		json_u64(f, "attachers", l->attachers, true);
		json_key(f, "attacher_pids");
		fputc('[', f);
		for (size_t k = 0; k < l->n_attacher_pids; k++)
			fprintf(f, "%s%" PRId32, k ? "," : "", l->attacher_pids[k]);
		fputs("],", f);
		/* Registrations of one shared file: charged once, to the oldest registration of each page. */
		json_u64(f, "charged_bytes", l->charged_bytes, true);
		json_u64(f, "registrants", l->registrants, true);
		json_key(f, "registrant_pids");
		fputc('[', f);
		for (size_t k = 0; k < l->n_registrant_pids; k++)
			fprintf(f, "%s%" PRId32, k ? "," : "", l->registrant_pids[k]);
		fputs("],", f);
		fprintf(f, "\"staging_ring\":%s}", l->staging_ring ? "true" : "false");
	}
	fputc(']', f);
}

/* A client row's "staging" object: null when it never reported staged copies and holds no ring. */
static void json_client_staging(FILE *f, const struct pb_status *s, size_t i)
{
	struct pb_client_staging cs;

	json_key(f, "staging");
	if (pb_status_client_staging(s, i, &cs) <= 0) {
		fputs("null", f);
		return;
	}
	fputc('{', f);
	json_u64(f, "h2d_bytes", cs.h2d_bytes, true);
	json_u64(f, "d2h_bytes", cs.d2h_bytes, true);
	json_u64(f, "h2d_copies", cs.h2d_copies, true);
	json_u64(f, "d2h_copies", cs.d2h_copies, true);
	json_u64(f, "driver_copies", cs.driver_copies, true);
	json_u64(f, "h2d_bytes_per_s", cs.h2d_bytes_per_s, true);
	json_u64(f, "d2h_bytes_per_s", cs.d2h_bytes_per_s, true);
	json_u64(f, "ring_bytes", cs.ring_bytes, true);
	json_u64(f, "rings", cs.rings, true);
	json_u64(f, "ring_revoked", cs.ring_revoked, true);
	json_u64(f, "ring_refused", cs.ring_refused, true);
	json_u64(f, "busy_ns", cs.busy_ns, false);
	fputc('}', f);
}

void status_json(FILE *f, const struct pb_status *s)
{
	fputc('{', f);
	json_u64(f, "schema_version", JSON_SCHEMA_VERSION, true);
	json_kstr(f, "version", s->server_version, true);
	json_u64(f, "budget_bytes", s->budget_bytes, true);
	json_u64(f, "uid_quota_bytes", s->uid_quota_bytes, true);
	json_u64(f, "leased_bytes", s->leased_bytes, true);
	json_u64(f, "pool_bytes", s->pool_bytes, true);
	json_u64(f, "pool_idle_bytes", s->pool_idle_bytes, true);
	json_u64(f, "free_bytes", s->budget_bytes > s->leased_bytes ? s->budget_bytes - s->leased_bytes : 0, true);
	json_u64(f, "page_size_bytes", s->page_size_bytes, true);
	json_u64(f, "chunk_size_bytes", s->chunk_size_bytes, true);
	json_u64(f, "chunk_max_bytes", s->chunk_max_bytes, true);
	json_u64(f, "chunk_capacity", s->chunk_capacity, true);
	json_key(f, "pool_warming");
	fputs(s->pool_warming ? "true," : "false,", f);
	json_key(f, "hugetlb");
	fputs(s->hugetlb ? "true," : "false,", f);
	json_kstr(f, "page_kind", s->page_kind, true);
	json_u64(f, "thp_bytes", s->thp_bytes, true);
	json_u64(f, "thp_failures", s->thp_failures, true);
	json_u64(f, "hugetlb_bytes", s->hugetlb_bytes, true);
	json_u64(f, "huge_pages_free_bytes", s->huge_pages_free_bytes, true);
	json_key(f, "nodes");
	fputc('[', f);
	for (size_t i = 0; i < s->n_nodes; i++) {
		const struct pb_node_info *nd = &s->nodes[i];

		fprintf(f, "%s{\"node\":%d,", i ? "," : "", nd->node);
		json_u64(f, "idle_bytes", nd->idle_bytes, true);
		json_u64(f, "lent_bytes", nd->lent_bytes, true);
		json_u64(f, "misplaced_bytes", nd->misplaced_bytes, true);
		json_u64(f, "gpus", nd->gpus, true);
		json_u64(f, "mem_free_bytes", nd->mem_free_bytes, false);
		fputc('}', f);
	}
	fputs("],", f);
	json_u64(f, "overdue_bytes", s->overdue_bytes, true);
	json_u64(f, "cached_idle_bytes", s->cached_idle_bytes, true);
	json_u64(f, "registered_bytes", s->registered_bytes, true);
	json_u64(f, "no_revoke_bytes", s->no_revoke_bytes, true);
	json_u64(f, "unbrokered_bytes", s->unbrokered_bytes, true);
	/* The unbrokered figures are clients' word: the JSON says so, as the text does. */
	json_kstr(f, "unbrokered_source", "reported by clients, not verified", true);
	json_u64(f, "unbrokered_reported_bytes", s->unbrokered_reported_bytes, true);
	json_u64(f, "unbrokered_cap_bytes", s->unbrokered_cap_bytes, true);
	json_key(f, "unbrokered_uids");
	fputc('[', f);
	for (size_t i = 0; i < s->n_unbrokered_uids; i++) {
		const struct pb_unbrokered_uid *u = &s->unbrokered_uids[i];
		char user[64];

		fprintf(f, "%s{", i ? "," : "");
		json_u64(f, "uid", u->uid, true);
		json_kstr(f, "user", user_name(u->uid, user, sizeof(user)), true);
		json_u64(f, "connections", u->connections, true);
		json_u64(f, "reported_bytes", u->reported_bytes, true);
		json_u64(f, "counted_bytes", u->counted_bytes, false);
		fputc('}', f);
	}
	fputs("],", f);
	json_u64(f, "orphaned_bytes", s->orphaned_bytes, true);
	json_u64(f, "prewarm_bytes", s->prewarm_bytes, true);
	json_u64(f, "waiting_acquires", s->waiting_acquires, true);
	json_kstr(f, "pressure_state", s->pressure_state, true);
	json_kstr(f, "monitor_mode", s->monitor_mode, true);
	json_u64(f, "uptime_ms", s->uptime_ms, true);
	{
		const char *root, *ns = pb_status_cgroup_namespace(s, &root);

		/* null from an older daemon; the root only where the namespace is "private". */
		json_key(f, "cgroup_namespace");
		ns ? json_str(f, ns) : (void)fputs("null", f);
		fputc(',', f);
		json_key(f, "cgroup_ns_root");
		root ? json_str(f, root) : (void)fputs("null", f);
		fputc(',', f);
	}
	{
		uint64_t acquires;
		uint32_t clients = pb_status_job_unknown(s, &acquires);

		json_u64(f, "job_unknown_clients", clients, true);
		json_u64(f, "job_unknown_total", acquires, true);
		struct pb_status_staging st;

		pb_status_staging(s, &st);
		json_u64(f, "staging_rings", st.rings, true);
		json_u64(f, "staging_ring_bytes", st.ring_bytes, true);
		json_u64(f, "staged_h2d_bytes", st.h2d_bytes, true);
		json_u64(f, "staged_d2h_bytes", st.d2h_bytes, true);
		const char *books, *w = pb_status_restart_warning(s, &books);

		/* null from an older daemon; the warning only where the daemon cannot see what was lent. */
		json_key(f, "restart_books");
		books ? json_str(f, books) : (void)fputs("null", f);
		fputc(',', f);
		json_key(f, "restart_warning");
		w ? json_str(f, w) : (void)fputs("null", f);
		fputc(',', f);
	}

	json_key(f, "signals");
	fputc('[', f);
	for (size_t i = 0; i < s->n_signals; i++) {
		const struct pb_signal_info *g = &s->signals[i];

		fprintf(f, "%s{", i ? "," : "");
		json_kstr(f, "name", g->name, true);
		json_kdouble(f, "value", g->value, true);
		json_kdouble(f, "tight", g->tight, true);
		json_kdouble(f, "critical", g->critical, true);
		json_kstr(f, "unit", g->unit, true);
		json_key(f, "available");
		fputs(g->available ? "true}" : "false}", f);
	}
	fputs("],", f);
	json_events(f, "transitions", s->transitions, s->n_transitions);
	fputc(',', f);
	json_events(f, "revocations", s->revocations, s->n_revocations);
	fputc(',', f);

	json_key(f, "clients");
	fputc('[', f);
	for (size_t i = 0; i < s->n_clients; i++) {
		const struct pb_client_info *ci = &s->clients[i];
		char user[64];

		fprintf(f, "%s{", i ? "," : "");
		json_key(f, "pid");
		fprintf(f, "%" PRId32 ",", ci->pid);
		json_u64(f, "uid", ci->uid, true);
		json_kstr(f, "user", user_name(ci->uid, user, sizeof(user)), true);
		json_kstr(f, "name", ci->name, true);
		json_u64(f, "leases", ci->leases, true);
		json_u64(f, "attached", ci->attached, true); /* of leases: mapped through a share token */
		json_u64(f, "bytes", ci->bytes, true);
		json_u64(f, "unbrokered_bytes", ci->unbrokered_bytes, true);
		json_key(f, "cgroup");
		if (s->client_cgroups && s->client_cgroups[i] && s->client_cgroups[i][0]) {
			json_str(f, s->client_cgroups[i]);
			fputc(',', f);
		} else {
			fputs("null,", f);
		}
		json_key(f, "labels");
		json_labels(f, ci->labels);
		fputc(',', f);
		json_client_staging(f, s, i);
		fputc('}', f);
	}
	fputs("],", f);
	json_jobs(f, s->jobs, s->n_jobs);
	fputc(',', f);
	json_leases(f, s->leases, s->n_leases);
	fputs("}\n", f);
}

/* ---------------------------------------------------------------- human output */

static void print_events(const char *title, const struct pb_event_info *e, size_t n)
{
	char age[32], t[ESC_BYTES];

	printf("%s:%s\n", title, n ? "" : " none");
	for (size_t i = 0; i < n; i++)
		printf("  %10s ago  %s\n", duration_str(e[i].age_ms, age, sizeof(age)), esc(e[i].text, t));
}

/* The leases table's JOB column: wide enough for a Slurm job's last levels or a pod's slice. */
#define JOB_COLUMN 28

/*
 * A job's cgroup path (already escaped) cut to JOB_COLUMN characters: its last components, which
 * name the job, after ".../" ("/slurm_node1/uid_1000/job_42" stays whole; a long kubepods path
 * keeps its pod). A last component too long alone keeps its tail after "...". "-" for no job.
 */
static const char *job_column(const char *job, char *buf, size_t len)
{
	size_t n = strlen(job);
	const char *p;

	if (n == 0)
		return "-";
	if (n <= JOB_COLUMN)
		return job;
	/* The first '/' at or after the point where what follows fits beside ".../" (4 characters). */
	p = strchr(job + n - (JOB_COLUMN - 4), '/');
	if (p && p[1])
		snprintf(buf, len, "...%s", p);
	else
		snprintf(buf, len, "...%s", job + n - (JOB_COLUMN - 3));
	return buf;
}

/*
 * A registration of shared memory: the region's charge is on one row (the oldest registration of its
 * pages), so the figure that adds up is charged, not BYTES; the pids are those the caller may see.
 */
static void print_shared_registration(const struct pb_lease_info *l)
{
	char sz[32];

	printf("%-8s shared registration: %" PRIu32 " registrant%s", "", l->registrants,
	       l->registrants == 1 ? "" : "s");
	for (size_t k = 0; k < l->n_registrant_pids; k++)
		printf("%s%" PRId32, k ? ", " : " (pid ", l->registrant_pids[k]);
	if (l->n_registrant_pids > 0 && l->n_registrant_pids < l->registrants)
		printf(", ...");
	printf("%s; charged here %s; never revoked\n", l->n_registrant_pids ? ")" : "",
	       size_str(l->charged_bytes, sz, sizeof(sz)));
}

void print_leases_table(const struct pb_lease_info *rows, size_t n, bool headers)
{
	char sz[32], age[32], node[16], st[ESC_BYTES], lb[ESC_BYTES], jb[ESC_BYTES], jc[JOB_COLUMN + 1], user[64];

	if (headers)
		printf("%-8s %-8s %-10s %-10s %-11s %-9s %-10s %-4s %-*s %s\n", "ID", "PID", "USER", "BYTES",
		       "PRIORITY", "STATE", "AGE", "NODE", JOB_COLUMN, "JOB", "LABEL");
	for (size_t i = 0; i < n; i++) {
		const struct pb_lease_info *l = &rows[i];

		if (l->numa_node >= 0)
			snprintf(node, sizeof(node), "%d%s", l->numa_node, l->misplaced ? "!" : "");
		else
			snprintf(node, sizeof(node), "-");
		printf("%-8" PRIu64 " %-8" PRId32 " %-10s %-10s %-11s %-9s %-10s %-4s %-*s %s\n", l->id, l->pid,
		       user_name(l->uid, user, sizeof(user)), size_str(l->bytes, sz, sizeof(sz)),
		       priority_name(l->priority), esc(l->state, st), duration_str(l->age_ms, age, sizeof(age)), node,
		       JOB_COLUMN, job_column(esc(l->job ? l->job : "", jb), jc, sizeof(jc)), esc(l->label, lb));
		if (l->registration && l->registrants > 0)
			print_shared_registration(l);
		else if (l->registration || l->no_revoke)
			printf("%-8s %s\n", "",
			       l->registration ? "registration: the program's own memory, charged; never revoked"
					       : "never revoked: its program cannot give memory back");
		/* The ring is named apart from its label, which is the program's to choose. */
		if (l->staging_ring)
			printf("%-8s STAGING RING: the program's pageable copies to and from GPUs go through it; revocable "
			       "(its copies then go to the driver)\n",
			       "");
		if (l->misplaced)
			printf("%-8s misplaced: placed for a NUMA node that was full; some pages are on node %d and others\n",
			       "", l->numa_node);
		/* Shared leases get a second line: who else maps them (counted once, on this row). */
		if (l->shared) {
			printf("%-8s shared: %" PRIu32 " attached", "", l->attachers);
			for (size_t k = 0; k < l->n_attacher_pids; k++)
				printf("%s%" PRId32, k ? ", " : " (pid ", l->attacher_pids[k]);
			if (l->n_attacher_pids < l->attachers)
				printf(", ...");
			printf("%s%s\n", l->n_attacher_pids ? ")" : "", l->holder_detached ? "; holder let go" : "");
		}
	}
}

/* Clients that staged copies or hold a ring: one row each, after the client table. */
static void print_staging_clients(const struct pb_status *s)
{
	bool header = false;

	for (size_t i = 0; i < s->n_clients; i++) {
		struct pb_client_staging cs;
		char h[32], d[32], hr[32], dr[32], ring[32];

		if (pb_status_client_staging(s, i, &cs) <= 0)
			continue;
		if (!header) {
			printf("\nstaged copies (reported by clients; rates over the last 5 s):\n");
			printf("%-8s %-10s %-10s %-12s %-12s %-10s %-10s %-7s %s\n", "PID", "H2D", "D2H", "H2D/S",
			       "D2H/S", "COPIES", "DRIVER", "RINGS", "RING");
			header = true;
		}
		size_str(cs.h2d_bytes_per_s, hr, sizeof(hr));
		size_str(cs.d2h_bytes_per_s, dr, sizeof(dr));
		printf("%-8" PRId32 " %-10s %-10s %-12s %-12s %-10" PRIu64 " %-10" PRIu64 " %-7" PRIu32 " %s\n",
		       s->clients[i].pid, size_str(cs.h2d_bytes, h, sizeof(h)), size_str(cs.d2h_bytes, d, sizeof(d)),
		       strcat(hr, "/s"), strcat(dr, "/s"), cs.h2d_copies + cs.d2h_copies, cs.driver_copies, cs.rings,
		       size_str(cs.ring_bytes, ring, sizeof(ring)));
	}
}

void status_human(const struct pb_status *s)
{
	char a[32], b[32], c[32], d[32], e1[ESC_BYTES], e2[ESC_BYTES];

	printf("pinbrokerd %s, up %s\n", s->server_version[0] ? esc(s->server_version, e1) : "(unknown version)",
	       duration_str(s->uptime_ms, a, sizeof(a)));
	printf("state:        %s (monitor: %s)\n", esc(s->pressure_state, e1), esc(s->monitor_mode, e2));
	printf("budget:       %s (uid quota %s)\n", size_str(s->budget_bytes, a, sizeof(a)),
	       size_str(s->uid_quota_bytes, b, sizeof(b)));
	printf("leased:       %s, free %s, overdue %s, cached idle %s\n", size_str(s->leased_bytes, a, sizeof(a)),
	       size_str(s->budget_bytes > s->leased_bytes ? s->budget_bytes - s->leased_bytes : 0, b, sizeof(b)),
	       size_str(s->overdue_bytes, c, sizeof(c)), size_str(s->cached_idle_bytes, d, sizeof(d)));
	if (s->registered_bytes || s->no_revoke_bytes)
		printf("of leased:    %s registered (programs' own memory), %s never revoked\n",
		       size_str(s->registered_bytes, a, sizeof(a)), size_str(s->no_revoke_bytes, b, sizeof(b)));
	if (s->orphaned_bytes)
		printf("of leased:    %s orphaned: lent by the daemon before a restart, still mapped by live processes\n",
		       size_str(s->orphaned_bytes, a, sizeof(a)));
	if (pb_status_restart_warning(s, NULL)) {
		char ebuf[ESC_BYTES];

		printf("warning:      %s (pinctl doctor)\n", esc(pb_status_restart_warning(s, NULL), ebuf));
	}
	printf("unbrokered:   %s pinned outside the budget, reported by clients, not verified (pinned in all: %s)\n",
	       size_str(s->unbrokered_bytes, a, sizeof(a)),
	       size_str(s->pool_bytes + s->registered_bytes + s->unbrokered_bytes + s->orphaned_bytes, b, sizeof(b)));
	/* Reports past what the host can hold are a bug or a lie: say so, and whose they are. */
	if (s->unbrokered_reported_bytes > s->unbrokered_bytes)
		printf("%-14sclients reported %s in all; counted up to %s (MemTotal less the pool and registrations)\n",
		       "", size_str(s->unbrokered_reported_bytes, a, sizeof(a)),
		       size_str(s->unbrokered_cap_bytes, b, sizeof(b)));
	for (size_t i = 0; i < s->n_unbrokered_uids; i++) {
		const struct pb_unbrokered_uid *u = &s->unbrokered_uids[i];
		char user[64];

		printf("%-14suid %s: %s reported on %" PRIu32 " connection%s, %s counted\n", "",
		       user_name(u->uid, user, sizeof(user)), size_str(u->reported_bytes, a, sizeof(a)), u->connections,
		       u->connections == 1 ? "" : "s", size_str(u->counted_bytes, b, sizeof(b)));
	}
	printf("pool:         %s resident, %s idle (prewarm %s%s)\n", size_str(s->pool_bytes, a, sizeof(a)),
	       size_str(s->pool_idle_bytes, b, sizeof(b)), size_str(s->prewarm_bytes, c, sizeof(c)),
	       s->pool_warming ? ", warming" : "");
	printf("pages:        page %s, chunk %s, pool on %s\n", size_str(s->page_size_bytes, a, sizeof(a)),
	       size_str(s->chunk_size_bytes, b, sizeof(b)), page_kind_text(s->page_kind));
	if (s->chunk_max_bytes > s->chunk_size_bytes)
		printf("chunks:       classes %s to %s, each twice the one before; up to %" PRIu64
		       " chunks (fds and mappings)\n",
		       size_str(s->chunk_size_bytes, a, sizeof(a)), size_str(s->chunk_max_bytes, b, sizeof(b)),
		       s->chunk_capacity);
	if (strcmp(s->page_kind, "thp") == 0 || s->thp_bytes || s->thp_failures)
		printf("huge pages:   %s of the pool collapsed into transparent huge pages%s%s\n",
		       size_str(s->thp_bytes, a, sizeof(a)), s->thp_failures ? ", chunks whose collapse failed: " : "",
		       s->thp_failures ? (snprintf(b, sizeof(b), "%" PRIu64, s->thp_failures), b) : "");
	if (s->hugetlb || s->huge_pages_free_bytes)
		printf("hugetlb:      the pool holds %s of huge pages (it could use up to the budget); %s more free "
		       "on the host\n",
		       size_str(s->hugetlb_bytes, a, sizeof(a)), size_str(s->huge_pages_free_bytes, b, sizeof(b)));
	for (size_t i = 0; i < s->n_nodes; i++) {
		const struct pb_node_info *nd = &s->nodes[i];
		char m[32], fr[32];

		printf("%-14snode %d: %s idle, %s lent, %s misplaced; %" PRIu32 " GPU%s, %s free at start\n",
		       i == 0 ? "numa:" : "", nd->node, size_str(nd->idle_bytes, a, sizeof(a)),
		       size_str(nd->lent_bytes, b, sizeof(b)), size_str(nd->misplaced_bytes, m, sizeof(m)), nd->gpus,
		       nd->gpus == 1 ? "" : "s", size_str(nd->mem_free_bytes, fr, sizeof(fr)));
	}
	{
		struct pb_status_staging st;

		pb_status_staging(s, &st);
		if (st.rings || st.h2d_bytes || st.d2h_bytes)
			printf("staging:      %" PRIu32
			       " ring%s holding %s; staged since start %s host to GPU, %s GPU to "
			       "host\n",
			       st.rings, st.rings == 1 ? "" : "s", size_str(st.ring_bytes, a, sizeof(a)),
			       size_str(st.h2d_bytes, b, sizeof(b)), size_str(st.d2h_bytes, c, sizeof(c)));
	}
	printf("waiting:      %" PRIu32 " acquire%s\n", s->waiting_acquires, s->waiting_acquires == 1 ? "" : "s");
	{
		const char *root, *ns = pb_status_cgroup_namespace(s, &root);

		/* Only where it is not the host's: then clients' cgroups are resolved, or cannot be. */
		if (ns && strcmp(ns, "private") == 0)
			printf("cgroups:      the daemon's cgroup namespace is its own, rooted at %s in the host's tree; "
			       "clients' cgroups are the host's paths\n",
			       esc(root ? root : "?", e1));
		else if (ns && strcmp(ns, "host") != 0)
			printf("cgroups:      the daemon's cgroup namespace is its own and %s: clients outside it have no "
			       "cgroup and quotas on theirs do not bind (pinctl doctor)\n",
			       esc(ns, e1));
	}
	{
		uint64_t acquires;
		uint32_t clients = pb_status_job_unknown(s, &acquires);

		/* A job the daemon cannot tell is refused (or unlimited) while quota rules exist: never silent. */
		if (clients || acquires)
			printf("jobs:         %" PRIu32
			       " client%s whose job is unknown (their /proc/PID/cgroup unreadable); "
			       "%" PRIu64 " acquire%s of such clients under quota rules (pinctl doctor)\n",
			       clients, clients == 1 ? "" : "s", acquires, acquires == 1 ? "" : "s");
	}

	printf("signals:%s\n", s->n_signals ? "" : " none");
	if (s->n_signals)
		printf("  %-24s %12s %12s %12s  %s\n", "NAME", "VALUE", "TIGHT", "CRITICAL", "UNIT");
	for (size_t i = 0; i < s->n_signals; i++) {
		const struct pb_signal_info *g = &s->signals[i];

		if (g->available)
			figure_str(g->value, g->unit, a, sizeof(a));
		else
			snprintf(a, sizeof(a), "n/a");
		printf("  %-24s %12s %12s %12s  %s\n", esc(g->name, e1), a, figure_str(g->tight, g->unit, b, sizeof(b)),
		       figure_str(g->critical, g->unit, c, sizeof(c)),
		       strcmp(g->unit, "bytes") == 0 ? "" : esc(g->unit, e2));
	}
	print_events("transitions", s->transitions, s->n_transitions);
	print_events("revocations", s->revocations, s->n_revocations);

	printf("\n%-8s %-10s %-6s %-10s %-16s %s\n", "PID", "USER", "LEASES", "BYTES", "NAME", "LABELS");
	for (size_t i = 0; i < s->n_clients; i++) {
		const struct pb_client_info *ci = &s->clients[i];
		char user[64];

		/* pinctl's own connection is not news. */
		if (ci->pid == getpid() && ci->leases == 0)
			continue;
		printf("%-8" PRId32 " %-10s %-6" PRIu32 " %-10s %-16s %s\n", ci->pid,
		       user_name(ci->uid, user, sizeof(user)), ci->leases, size_str(ci->bytes, a, sizeof(a)),
		       ci->name[0] ? esc(ci->name, e1) : "-", ci->labels[0] ? esc(ci->labels, e2) : "-");
	}
	print_staging_clients(s);
}

void json_jobs(FILE *f, const struct pb_job *jobs, size_t n)
{
	fputs("\"jobs\":[", f);
	for (size_t i = 0; i < n; i++) {
		const struct pb_job *j = &jobs[i];

		fprintf(f, "%s{\"job\":", i ? "," : "");
		json_str(f, j->job);
		fprintf(f, ",\"bytes\":%" PRIu64 ",\"leases\":%u", j->bytes, j->leases);
		if (j->has_quota) {
			fprintf(f, ",\"quota_bytes\":%" PRIu64 ",\"rule\":", j->quota_bytes);
			json_str(f, j->rule);
			fputs(",\"source\":", f);
			json_str(f, j->source);
		} else {
			fputs(",\"quota_bytes\":null", f);
		}
		fputc('}', f);
	}
	fputc(']', f);
}

void json_reservations(FILE *f, const struct pb_reservation_info *rows, size_t n)
{
	fputs("\"reservations\":[", f);
	for (size_t i = 0; i < n; i++) {
		const struct pb_reservation_info *r = &rows[i];

		fprintf(f, "%s{\"id\":%" PRIu64 ",\"uid\":%u,\"job\":", i ? "," : "", r->id, r->uid);
		if (r->job[0])
			json_str(f, r->job);
		else
			fputs("null", f);
		fputs(",\"name\":", f);
		json_str(f, r->name);
		fprintf(f,
			",\"shares\":%u,\"share_bytes\":%" PRIu64 ",\"taken\":%u,\"bytes_reserved\":%" PRIu64
			",\"state\":",
			r->shares, r->share_bytes, r->taken, r->bytes_reserved);
		json_str(f, r->state);
		fprintf(f, ",\"members\":%u,\"age_ms\":%" PRIu64 "}", r->members, r->age_ms);
	}
	fputc(']', f);
}

void print_reservations(const struct pb_reservation_info *rows, size_t n, uint64_t reserved, bool headers)
{
	char e1[ESC_BYTES], e2[ESC_BYTES], b[32], h[32], user[32];

	if (n == 0) {
		if (headers)
			printf("no reservations\n");
		return;
	}
	if (headers)
		printf("%6s %-10s %-20s %7s %10s %10s %7s  %s\n", "ID", "USER", "NAME", "TAKEN", "SHARE", "RESERVED",
		       "RANKS", "JOB");
	for (size_t i = 0; i < n; i++) {
		const struct pb_reservation_info *r = &rows[i];
		char taken[24];

		snprintf(taken, sizeof(taken), "%u/%u", r->taken, r->shares);
		printf("%6" PRIu64 " %-10s %-20s %7s %10s %10s %7u  %s\n", r->id, user_name(r->uid, user, sizeof(user)),
		       esc(r->name, e1), taken, format_size(r->share_bytes, b, sizeof(b)),
		       format_size(r->bytes_reserved, h, sizeof(h)), r->members, r->job[0] ? esc(r->job, e2) : "-");
	}
	if (headers)
		printf("reserved, not taken: %s\n", format_size(reserved, b, sizeof(b)));
}

void print_jobs(const struct pb_job *jobs, size_t n, bool headers)
{
	char e[ESC_BYTES], b[32], q[32];

	if (n == 0) {
		if (headers)
			printf("no jobs hold leases\n");
		return;
	}
	if (headers)
		printf("%-48s %10s %7s %10s %6s  %s\n", "JOB", "LEASED", "LEASES", "QUOTA", "USED", "RULE");
	for (size_t i = 0; i < n; i++) {
		const struct pb_job *j = &jobs[i];
		char used[16] = "-";

		if (j->has_quota && j->quota_bytes)
			snprintf(used, sizeof(used), "%.0f%%", 100.0 * (double)j->bytes / (double)j->quota_bytes);
		printf("%-48s %10s %7u %10s %6s  %s\n", esc(j->job, e), format_size(j->bytes, b, sizeof(b)), j->leases,
		       j->has_quota ? format_size(j->quota_bytes, q, sizeof(q)) : "-", used,
		       j->has_quota ? j->rule : "-");
	}
}

void json_headroom(FILE *f, const struct pb_headroom *h)
{
	fputs("{\"schema_version\":1,", f);
	json_u64(f, "available_bytes", h->available_bytes, true);
	json_u64(f, "page_bytes", h->page_bytes, true);
	json_kstr(f, "state", h->state, true);
	json_kstr(f, "binding", h->n_bounds ? pb_bound_name(h->bounds[h->binding].kind) : "", true);
	fputs("\"bounds\":[", f);
	for (size_t i = 0; i < h->n_bounds; i++) {
		const struct pb_headroom_bound *b = &h->bounds[i];

		fprintf(f, "%s{", i ? "," : "");
		json_kstr(f, "bound", pb_bound_name(b->kind), true);
		json_u64(f, "limit", b->limit, true);
		json_u64(f, "used", b->used, true);
		if (b->left_bytes == PB_HEADROOM_UNBOUNDED)
			fputs("\"left_bytes\":null,", f);
		else
			json_u64(f, "left_bytes", b->left_bytes, true);
		fprintf(f, "\"binding\":%s,", i == h->binding ? "true" : "false");
		json_kstr(f, "reason", b->reason, false);
		fputc('}', f);
	}
	fputs("]}\n", f);
}

/* A bound's limit or used: a size, or a count for the count caps. */
static const char *bound_figure(const struct pb_headroom_bound *b, uint64_t v, char *buf, size_t len)
{
	if (b->kind >= PB_BOUND_UID_LEASES && b->kind <= PB_BOUND_CONN_LEASES)
		snprintf(buf, len, "%" PRIu64, v);
	else
		format_size(v, buf, len);
	return buf;
}

void print_headroom(const struct pb_headroom *h, bool headers)
{
	char a[32], p[32], l[32], u[32], f[32], e[ESC_BYTES];

	if (headers) {
		printf("available: %s (%s pages, host memory %s), bound by %s\n",
		       format_size(h->available_bytes, a, sizeof(a)), format_size(h->page_bytes, p, sizeof(p)),
		       h->state, h->n_bounds ? pb_bound_name(h->bounds[h->binding].kind) : "-");
		printf("  %-18s %10s %10s %10s  %s\n", "BOUND", "LIMIT", "USED", "LEFT", "REASON");
	}
	for (size_t i = 0; i < h->n_bounds; i++) {
		const struct pb_headroom_bound *b = &h->bounds[i];

		printf("%c %-18s %10s %10s %10s  %s\n", i == h->binding ? '*' : ' ', pb_bound_name(b->kind),
		       bound_figure(b, b->limit, l, sizeof(l)), bound_figure(b, b->used, u, sizeof(u)),
		       b->left_bytes == PB_HEADROOM_UNBOUNDED ? "-" : format_size(b->left_bytes, f, sizeof(f)),
		       esc(b->reason, e));
	}
}

void config_entry_json(FILE *f, const struct pb_config_entry *e)
{
	fputc('{', f);
	json_kstr(f, "key", e->key, true);
	json_kstr(f, "value", e->value, true);
	json_kstr(f, "source", e->source, true);
	if (e->file[0]) {
		json_kstr(f, "file", e->file, true);
		json_u64(f, "line", e->line, true);
	}
	fprintf(f, "\"reloadable\":%s}", e->reloadable ? "true" : "false");
}

/* "key = value  # source": config-file syntax, so a line can be pasted back into the file. */
void config_entry_human(const struct pb_config_entry *e)
{
	char k[ESC_BYTES], v[ESC_BYTES], src[ESC_BYTES], file[ESC_BYTES];
	char where[2 * ESC_BYTES + 32];

	esc(e->key, k);
	esc(e->value, v);
	if (e->file[0])
		snprintf(where, sizeof(where), "%s %s:%" PRIu32, esc(e->source, src), esc(e->file, file), e->line);
	else
		snprintf(where, sizeof(where), "%s", esc(e->source, src));
	printf("%s = %-*s # %s%s\n", k, (int)(k[0] ? (strlen(k) < 32 ? 32 - strlen(k) : 1) : 1), v, where,
	       e->reloadable ? "" : " (restart to change)");
}

/* SPDX-License-Identifier: MIT */
/*
 * Prometheus metrics in the text exposition format, for node_exporter's
 * textfile collector (metrics-path, written atomically every
 * metrics-interval-ms), `pinctl metrics` and the HTTP endpoint
 * (client/metrics-http/metrics-http.c asks for the same text). Names follow the
 * Prometheus conventions (https://prometheus.io/docs/practices/naming/) as
 * node_exporter and dcgm-exporter use them: a pinbroker_ prefix, base units
 * (_bytes, _seconds, _ratio from 0 to 1), _total for counters, labels for
 * dimensions, and no label Prometheus sets itself (job, instance).
 */
#define _GNU_SOURCE
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker.h"
#include "daemon.h"
#include "budget.h"
#include "config.h"
#include "jobs.h"
#include "lease.h"
#include "monitor.h"
#include "pool.h"
#include "reservation.h"
#include "waitq.h"

static const char *const refusal_names[REFUSED_N] = {
	[REFUSED_INVALID] = "invalid_size",    [REFUSED_TOO_LARGE] = "too_large",
	[REFUSED_OVER_QUOTA] = "over_quota",   [REFUSED_JOB_QUOTA] = "job_quota",
	[REFUSED_OVER_BUDGET] = "over_budget", [REFUSED_PRESSURE] = "pressure",
	[REFUSED_CRITICAL] = "critical",       [REFUSED_LIMIT] = "limit",
	[REFUSED_TIMEOUT] = "timeout",         [REFUSED_OTHER] = "other",
};

static const char *const grant_names[GRANTED_N] = {
	[GRANTED_POOL] = "pool",
	[GRANTED_REGISTRATION] = "registration",
};

static const char *const revocation_names[REVOKED_N] = {
	[REVOKED_PRESSURE] = "pressure", [REVOKED_IDLE_RECLAIM] = "idle_reclaim", [REVOKED_ADMIN] = "admin",
	[REVOKED_SELF] = "self",         [REVOKED_JOB_QUOTA] = "job_quota",
};

static const char *const cancel_names[CANCELLED_N] = {
	[CANCELLED_REUSED] = "reused",
	[CANCELLED_NOT_GIVEN_BACK] = "not_given_back",
};

static const char *const enforcement_names[ENFORCED_N] = {
	[ENFORCED_DISCONNECT] = "disconnect",
	[ENFORCED_SIGTERM] = "sigterm",
	[ENFORCED_SIGKILL] = "sigkill",
};

static void head(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void gauge(FILE *f, const char *name, const char *help, double v)
{
	head(f, name, "gauge", help);
	fprintf(f, "%s %.17g\n", name, v);
}

/* A counter with one label, a row for every value even at 0, so rate() sees each series from the start. */
static void counter_by(FILE *f, const char *name, const char *help, const char *label, const char *const *values,
		       const uint64_t *v, size_t n)
{
	head(f, name, "counter", help);
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%s{%s=\"%s\"} %llu\n", name, label, values[i], (unsigned long long)v[i]);
}

/* A label value as the format wants it: backslash, quote and newline escaped. */
static void label_value(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fputc('\\', f);
		if (*s == '\n') {
			fputs("\\n", f);
			continue;
		}
		fputc(*s, f);
	}
}

/*
 * The pressure signals, one metric each in base units: shares as ratios 0..1, not percent. The rates the
 * policy compares (swap pages per second) are served as the counters they come from, so Prometheus takes
 * the rate over its own window. A signal this host lacks (no swap, no PSI, no cgroup limit) has no row.
 */
static const struct {
	const char *signal; /* monitor_signals()'s name */
	const char *name, *help;
	double scale;
} signal_metrics[] = {
	{ "mem_available_pct", "pinbroker_mem_available_ratio",
	  "MemAvailable as a share (0 to 1) of MemTotal, or of the daemon's cgroup limit when that is lower, as last "
	  "sampled.",
	  0.01 },
	{ "mem_available_bytes", "pinbroker_mem_available_bytes",
	  "MemAvailable, or what the daemon's cgroup limit leaves when that is lower, as last sampled.", 1 },
	{ "swap_free_pct", "pinbroker_swap_free_ratio", "SwapFree as a share (0 to 1) of SwapTotal, as last sampled.",
	  0.01 },
	{ "psi_some_avg10", "pinbroker_psi_some_avg10_ratio",
	  "Memory pressure (PSI) some avg10: the share (0 to 1) of the last 10 s some task stalled on memory, host or "
	  "the daemon's cgroup, whichever is worse.",
	  0.01 },
	{ "psi_full_avg10", "pinbroker_psi_full_avg10_ratio",
	  "Memory pressure (PSI) full avg10: the share (0 to 1) of the last 10 s all non-idle tasks stalled on memory, "
	  "host or the daemon's cgroup, whichever is worse.",
	  0.01 },
	{ "cgroup_usage_pct", "pinbroker_cgroup_usage_ratio",
	  "The daemon's memory cgroup usage as a share (0 to 1) of its limit, where it has a limit.", 0.01 },
};

static void render_signals(FILE *f, const struct monitor *m)
{
	struct monitor_signal sig[MONITOR_SIGNALS_MAX];
	size_t n = m ? monitor_signals(m, sig, MONITOR_SIGNALS_MAX) : 0;
	uint64_t in_pages, out_pages;
	long page = sysconf(_SC_PAGESIZE);

	for (size_t k = 0; k < sizeof(signal_metrics) / sizeof(signal_metrics[0]); k++)
		for (size_t i = 0; i < n; i++) {
			if (strcmp(sig[i].name, signal_metrics[k].signal) != 0 || !sig[i].available ||
			    !isfinite(sig[i].value))
				continue;
			gauge(f, signal_metrics[k].name, signal_metrics[k].help,
			      sig[i].value * signal_metrics[k].scale);
		}
	/* pswpin/pswpout count pages of the kernel's page size. */
	if (m && page > 0 && monitor_swap_pages(m, &in_pages, &out_pages)) {
		head(f, "pinbroker_swap_in_bytes_total", "counter",
		     "The host's swap-ins (/proc/vmstat pswpin) in bytes, as last sampled.");
		fprintf(f, "pinbroker_swap_in_bytes_total %llu\n",
			(unsigned long long)in_pages * (unsigned long long)page);
		head(f, "pinbroker_swap_out_bytes_total", "counter",
		     "The host's swap-outs (/proc/vmstat pswpout) in bytes, as last sampled.");
		fprintf(f, "pinbroker_swap_out_bytes_total %llu\n",
			(unsigned long long)out_pages * (unsigned long long)page);
	}
}

/*
 * Per job: its bytes, leases and quota (jobs without a quota have no quota row). The label is cgroup, not job:
 * Prometheus sets job on every scraped series (the scrape config's name) and renames a target's own job label
 * to exported_job, so `sum by (job)` would sum a whole node.
 */
static void render_jobs(FILE *f, const struct jobs *j)
{
	static const struct {
		const char *name, *help;
	} series[] = {
		{ "pinbroker_job_leased_bytes",
		  "Pinned memory each job (cgroup, or the part a quota rule names) holds now." },
		{ "pinbroker_job_leases", "Leases each job holds now." },
		{ "pinbroker_job_quota_bytes", "Each job's quota, for jobs a quota rule covers." },
	};

	for (size_t s = 0; s < sizeof(series) / sizeof(series[0]); s++) {
		head(f, series[s].name, "gauge", series[s].help);
		for (const struct job *jb = jobs_first(j); jb; jb = jb->next) {
			unsigned long long v = s == 0     ? jb->bytes
					       : s == 1   ? jb->leases
					       : jb->rule ? jb->rule->bytes
							  : 0;

			if ((s == 2 && !jb->rule) || (!jb->leases && !jb->rule))
				continue;
			fprintf(f, "%s{cgroup=\"", series[s].name);
			label_value(f, jb->key);
			fprintf(f, "\"} %llu\n", v);
		}
	}
}

/* Staged copies: what clients reported (live and closed connections alike), and the rings held now. */
static void render_staging(FILE *f, const struct broker *b)
{
	static const char *const directions[] = { "h2d", "d2h" };
	const struct staged_counters *s = &b->staged.sum;
	const uint64_t bytes[] = { s->h2d_bytes, s->d2h_bytes }, copies[] = { s->h2d_copies, s->d2h_copies };

	counter_by(f, "pinbroker_staged_bytes_total",
		   "Bytes clients copied through their staging rings since start, by direction (host to device, device "
		   "to host), as their reports said: reported by clients, not verified.",
		   "direction", directions, bytes, 2);
	counter_by(f, "pinbroker_staged_copies_total",
		   "Copies clients staged through their rings since start, by direction.", "direction", directions,
		   copies, 2);
	head(f, "pinbroker_staging_driver_copies_total", "counter",
	     "Pageable copies over the staging threshold that clients left to the CUDA driver since start (no ring, "
	     "ring busy or revoked).");
	fprintf(f, "pinbroker_staging_driver_copies_total %llu\n", (unsigned long long)s->driver_copies);
	gauge(f, "pinbroker_staging_rings", "Staging-ring leases held now.", (double)b->staging_rings);
	gauge(f, "pinbroker_staging_ring_bytes", "Of the leased bytes, staging rings.", (double)b->staging_ring_bytes);
}

static void render(FILE *f, const struct broker *b, bool per_uid, double now_s)
{
	static const enum broker_state states[] = { BROKER_NORMAL, BROKER_TIGHT, BROKER_CRITICAL };
	const int *nodes;
	size_t n;
	uid_t uid;

	head(f, "pinbroker_info", "gauge", "The daemon's version and pool page kind (value 1).");
	fprintf(f, "pinbroker_info{version=\"%s\",page_kind=\"%s\"} 1\n", PINBROKER_VERSION,
		pool_page_kind(daemon_of(b)->pool));
	gauge(f, "pinbroker_budget_bytes", "Most pinned memory the daemon lends at once.",
	      (double)budget_limit(b->budget));
	gauge(f, "pinbroker_uid_quota_bytes", "Most pinned memory one uid may hold.",
	      (double)budget_uid_quota(b->budget));
	gauge(f, "pinbroker_leased_bytes", "Pinned memory lent now (registrations included).",
	      (double)budget_leased(b->budget));
	gauge(f, "pinbroker_pool_bytes", "Locked pool memory, idle and lent.",
	      (double)pool_resident_bytes(daemon_of(b)->pool));
	gauge(f, "pinbroker_pool_idle_bytes", "Locked pool memory kept warm and not lent.",
	      (double)pool_idle_bytes(daemon_of(b)->pool));
	gauge(f, "pinbroker_overdue_bytes", "Leases past their revoke deadline, still held.",
	      (double)lease_state_bytes(b->leases, LEASE_OVERDUE));
	gauge(f, "pinbroker_cached_idle_bytes", "Leases a client keeps cached and idle.",
	      (double)lease_state_bytes(b->leases, LEASE_IDLE));
	gauge(f, "pinbroker_registered_bytes", "Of the leased bytes, registration charges (memory programs own).",
	      (double)b->registered_bytes);
	gauge(f, "pinbroker_no_revoke_bytes", "Of the leased bytes, memory that is never revoked.",
	      (double)budget_no_revoke(b->budget));
	gauge(f, "pinbroker_reserved_bytes",
	      "Of the leased bytes, reserved for groups of ranks and not taken yet (no pool memory behind them).",
	      (double)broker_reserved_bytes(b));
	gauge(f, "pinbroker_unbrokered_bytes",
	      "Pinned outside the budget, reported by clients, not verified: each uid's sum and the total capped at "
	      "MemTotal less the pool and registrations.",
	      (double)unbrokered_counted(&b->unbrokered, daemon_unbrokered_cap(b)));
	gauge(f, "pinbroker_unbrokered_reported_bytes",
	      "Pinned outside the budget, the sum of clients' reports before any cap (reported by clients, not "
	      "verified).",
	      (double)b->unbrokered_bytes);
	gauge(f, "pinbroker_orphaned_bytes",
	      "Of the leased bytes, memory an earlier daemon lent that live processes still map (counted until they "
	      "let go).",
	      (double)b->orphaned_bytes);
	gauge(f, "pinbroker_thp_bytes", "Pool memory collapsed into transparent huge pages.",
	      (double)pool_thp_bytes(daemon_of(b)->pool));
	gauge(f, "pinbroker_hugetlb_bytes", "Pool memory on hugetlb pages.",
	      (double)pool_hugetlb_bytes(daemon_of(b)->pool));
	gauge(f, "pinbroker_leases", "Leases held now.", (double)lease_count(b->leases));
	gauge(f, "pinbroker_waiting_acquires", "Acquires waiting for memory.", (double)waitq_count(b));

	head(f, "pinbroker_pressure_state", "gauge", "1 for the pressure state the daemon is in, 0 for the others.");
	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
		fprintf(f, "pinbroker_pressure_state{state=\"%s\"} %d\n", monitor_state_name(states[i]),
			b->state == states[i]);
	render_signals(f, daemon_of(b)->monitor);

	counter_by(f, "pinbroker_acquires_granted_total",
		   "Leases granted since start, by kind: pool memory, or a registration charge.", "kind", grant_names,
		   b->counters.granted, GRANTED_N);
	counter_by(f, "pinbroker_granted_bytes_total", "Bytes granted since start, by kind.", "kind", grant_names,
		   b->counters.granted_bytes, GRANTED_N);
	counter_by(f, "pinbroker_acquires_refused_total", "Acquires refused since start, by reason.", "reason",
		   refusal_names, b->counters.refused, REFUSED_N);
	counter_by(f, "pinbroker_revocations_total", "Leases revoked (REVOKEs sent) since start, by reason.", "reason",
		   revocation_names, b->counters.revocations, REVOKED_N);
	counter_by(f, "pinbroker_revokes_cancelled_total",
		   "Revokes of never-revoked leases (sent while they were cached) cancelled since start, by reason: "
		   "taken back into use from the library's cache, or not given back by the deadline (kept as in use).",
		   "reason", cancel_names, b->counters.revokes_cancelled, CANCELLED_N);
	counter_by(f, "pinbroker_enforcements_total", "Overdue leases enforced since start, by revoke-enforce action.",
		   "action", enforcement_names, b->counters.enforcements, ENFORCED_N);
	head(f, "pinbroker_holder_scans_total", "counter",
	     "Passes over /proc for processes still mapping overdue leases: one per deadline round, however many "
	     "leases fell overdue in it.");
	fprintf(f, "pinbroker_holder_scans_total %llu\n", (unsigned long long)b->counters.holder_scans);
	head(f, "pinbroker_job_unknown_total", "counter",
	     "Acquires of clients whose job (cgroup) the daemon could not read, while job quota rules existed: "
	     "refused under job-unknown = refuse, charged to no job under allow.");
	fprintf(f, "pinbroker_job_unknown_total %llu\n", (unsigned long long)b->counters.job_unknown);
	gauge(f, "pinbroker_job_unknown_clients",
	      "Connected clients whose job (cgroup) the daemon could not read when they connected.",
	      (double)b->job_unknown_clients);
	{
		static const uint64_t bound_us[BROKER_TURN_BUCKETS] = BROKER_TURN_BUCKET_US;
		uint64_t cum = 0;

		head(f, "pinbroker_loop_turn_seconds", "histogram",
		     "Event loop turns (every callback of one iteration) by length: while one runs, no client is "
		     "answered.");
		for (size_t i = 0; i < BROKER_TURN_BUCKETS; i++) {
			cum += b->counters.loop_turns[i];
			fprintf(f, "pinbroker_loop_turn_seconds_bucket{le=\"%g\"} %llu\n", bound_us[i] / 1e6,
				(unsigned long long)cum);
		}
		cum += b->counters.loop_turns[BROKER_TURN_BUCKETS];
		fprintf(f, "pinbroker_loop_turn_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
		fprintf(f, "pinbroker_loop_turn_seconds_sum %.6f\n", b->counters.loop_turn_sum_us / 1e6);
		fprintf(f, "pinbroker_loop_turn_seconds_count %llu\n", (unsigned long long)cum);
	}
	gauge(f, "pinbroker_loop_turn_longest_seconds",
	      "The longest event loop turn (every callback of one iteration) since start: while it runs, no client is "
	      "answered.",
	      (double)b->counters.loop_turn_max_us / 1e6);
	render_staging(f, b);

	n = pool_nodes(daemon_of(b)->pool, &nodes);
	if (n) {
		head(f, "pinbroker_numa_bytes", "gauge", "Pool memory per NUMA node: idle, lent, misplaced.");
		for (size_t i = 0; i < n; i++) {
			struct pool_node_bytes nb;

			pool_node_bytes(daemon_of(b)->pool, nodes[i], &nb);
			fprintf(f, "pinbroker_numa_bytes{node=\"%d\",state=\"idle\"} %llu\n", nodes[i],
				(unsigned long long)nb.idle);
			fprintf(f, "pinbroker_numa_bytes{node=\"%d\",state=\"lent\"} %llu\n", nodes[i],
				(unsigned long long)nb.lent);
			fprintf(f, "pinbroker_numa_bytes{node=\"%d\",state=\"misplaced\"} %llu\n", nodes[i],
				(unsigned long long)nb.misplaced);
		}
	}

	if (per_uid && budget_uid_at(b->budget, 0, &uid)) {
		head(f, "pinbroker_uid_leased_bytes", "gauge", "Pinned memory each uid holds now.");
		for (size_t i = 0; budget_uid_at(b->budget, i, &uid); i++) {
			char buf[1024];
			struct passwd pw, *pp = NULL;

			fprintf(f, "pinbroker_uid_leased_bytes{uid=\"%u\",user=\"", (unsigned)uid);
			if (getpwuid_r(uid, &pw, buf, sizeof(buf), &pp) == 0 && pp)
				label_value(f, pp->pw_name);
			fprintf(f, "\"} %llu\n", (unsigned long long)budget_uid_leased(b->budget, uid));
		}
	}
	if (per_uid && b->jobs)
		render_jobs(f, b->jobs);
	{
		static const char *const why[] = { "other_tenant", "not_released" };
		struct pool_tenant_bytes tb;
		uint64_t v[2];

		pool_tenant_bytes(daemon_of(b)->pool, &tb);
		v[0] = tb.replaced;
		v[1] = tb.retired;
		counter_by(f, "pinbroker_pool_fresh_bytes_total",
			   "Pool memory destroyed and made again fresh so no tenant reads another's pages: idle memory "
			   "another tenant (uid, pid namespace, cgroup) had (other_tenant), or a lease's memory "
			   "that ended without a release (not_released).",
			   "reason", why, v, 2);
	}
	gauge(f, "pinbroker_metrics_timestamp_seconds", "When these figures were taken (Unix time).", now_s);
}

int metrics_render(const struct broker *b, bool per_uid, double now_s, char **out, size_t *len)
{
	FILE *f = open_memstream(out, len);

	if (!f)
		return -errno;
	render(f, b, per_uid, now_s);
	if (fclose(f) != 0)
		return -errno;
	return 0;
}

int metrics_write_file(const struct broker *b, const char *path, double now_s)
{
	char *text = NULL, *tmp = NULL;
	size_t len = 0;
	int fd, r;

	r = metrics_render(b, daemon_of(b)->cfg->metrics_detail != METRICS_DETAIL_NONE, now_s, &text, &len);
	if (r < 0)
		return r;
	/*
	 * Beside the target, so the rename is atomic: the collector never reads half a file. A fresh name
	 * made here (mkostemp's O_EXCL), never a fixed one, so nothing another user left in that folder is
	 * written to or renamed into place.
	 */
	if (asprintf(&tmp, "%s.XXXXXX", path) < 0) {
		free(text);
		return -ENOMEM;
	}
	fd = mkostemp(tmp, O_CLOEXEC);
	r = fd < 0 ? -errno : 0;
	if (r == 0 && fchmod(fd, 0644) < 0)
		r = -errno;
	if (r == 0 && write(fd, text, len) != (ssize_t)len)
		r = errno ? -errno : -EIO;
	if (fd >= 0 && close(fd) < 0 && r == 0)
		r = -errno;
	if (r == 0 && rename(tmp, path) < 0)
		r = -errno;
	if (r < 0 && fd >= 0)
		unlink(tmp);
	free(tmp);
	free(text);
	return r;
}

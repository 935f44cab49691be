/* SPDX-License-Identifier: MIT */
/* Job quotas' I/O: clients' cgroups at connect, and releasing rules whose cgroup went away (jobs-watch.h). */
#define _GNU_SOURCE
#include "jobs-watch.h"

#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "cgns-probe.h"
#include "config.h"
#include "daemon.h"
#include "jobs.h"
#include "log.h"
#include "quota-store.h"
#include "reload.h"
#include "util.h"

/* At most one warning per this long about acquires of clients whose job is unknown; the rest are counted. */
#define JOBS_UNKNOWN_WARN_MS 60000

struct jobs_watch {
	struct broker *broker;
	ev_timer sweep;
	char root[256];             /* proc-root without its trailing '/' ("" for /) */
	struct cgns_probe cgns;     /* the daemon's cgroup namespace: clients' paths are turned into the host's */
	bool warned_unnamed;        /* a client outside an unresolved namespace was logged once at warning */
	uint64_t unknown_warned_ms; /* when an acquire of a client with an unknown job was last logged at warning */
	uint64_t unknown_quiet;     /* such acquires not logged since */
};

/* The mounts a cgroup may be under: v1's memory controller, cgroup2 alone, cgroup2 on a hybrid host. */
static const char *const cgroup_mounts[] = { "sys/fs/cgroup/memory", "sys/fs/cgroup", "sys/fs/cgroup/unified" };

static bool cgroup_exists(void *ctx, const char *path)
{
	struct jobs_watch *w = ctx;

	return cgns_probe_exists(&w->cgns, w->root, cgroup_mounts, sizeof(cgroup_mounts) / sizeof(cgroup_mounts[0]),
				 path);
}

static void rule_gone(void *ctx, const struct job_rule *r)
{
	char q[32];

	(void)ctx;
	log_info("job quota %s (%s) released: its cgroup is gone", r->pattern, format_size(r->bytes, q, sizeof(q)));
}

void jobs_watch_sweep(struct broker *b)
{
	if (b->jobs && daemon_of(b)->jobs_watch &&
	    jobs_sweep(b->jobs, cgroup_exists, rule_gone, daemon_of(b)->jobs_watch) > 0)
		b->generation++;
	/* The file follows released rules, and rules newly seen (or retries a write that failed). */
	quota_store_sweep(b);
}

static void sweep_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct jobs_watch *w = t->data;

	(void)loop;
	(void)revents;
	jobs_watch_sweep(w->broker);
}

int jobs_watch_start(struct broker *b)
{
	struct jobs_watch *w;
	char *err = NULL;
	int r;

	r = jobs_new(&b->jobs);
	if (r < 0)
		return r;
	r = jobs_set_config(b->jobs, daemon_of(b)->cfg->job_quota, b->budget_bytes, &err);
	if (r < 0) {
		log_warnx("%s", err ? err : "job-quota: out of memory");
		free(err);
		jobs_free(b->jobs);
		b->jobs = NULL;
		return r;
	}
	reload_warn_job_quotas(b);
	w = calloc(1, sizeof(*w));
	if (!w) {
		jobs_free(b->jobs);
		b->jobs = NULL;
		return -ENOMEM;
	}
	w->broker = b;
	snprintf(w->root, sizeof(w->root), "%s", daemon_of(b)->cfg->proc_root);
	for (size_t n = strlen(w->root); n > 0 && w->root[n - 1] == '/';)
		w->root[--n] = '\0';
	cgns_probe(w->root, &w->cgns);
	ev_timer_init(&w->sweep, sweep_cb, JOBS_SWEEP_MS / 1000.0, JOBS_SWEEP_MS / 1000.0);
	w->sweep.data = w;
	if (daemon_of(b)->loop)
		ev_timer_start(daemon_of(b)->loop, &w->sweep);
	daemon_of(b)->jobs_watch = w;
	return 0;
}

void jobs_watch_stop(struct broker *b)
{
	if (daemon_of(b)->jobs_watch && daemon_of(b)->loop)
		ev_timer_stop(daemon_of(b)->loop, &daemon_of(b)->jobs_watch->sweep);
	free(daemon_of(b)->jobs_watch);
	daemon_of(b)->jobs_watch = NULL;
	jobs_free(b->jobs);
	b->jobs = NULL;
}

struct job_cgroup *jobs_watch_cgroup_of(struct broker *b, pid_t pid)
{
	struct jobs_watch *w = daemon_of(b)->jobs_watch;
	char path[320], text[4096], cg[JOBS_PATH_MAX];
	struct job_cgroup *ret = NULL;
	ssize_t n;
	int fd, r;

	if (!w || !b->jobs || pid <= 0)
		return NULL;
	snprintf(path, sizeof(path), "%s/proc/%d/cgroup", w->root, (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		log_debug("job quotas: cannot read %s: %s; pid %d is charged to no job", path, strerror(errno),
			  (int)pid);
		return NULL;
	}
	n = read(fd, text, sizeof(text) - 1);
	close(fd);
	if (n < 0) {
		log_debug("job quotas: cannot read %s: %s; pid %d is charged to no job", path, strerror(errno),
			  (int)pid);
		return NULL;
	}
	text[n] = '\0';
	r = cgns_client_cgroup(&w->cgns.ns, text, cg, sizeof(cg), NULL);
	if (r == -ENXIO && !w->warned_unnamed) {
		w->warned_unnamed = true;
		log_warnx(
			"job quotas: pid %d's cgroup lies outside my cgroup namespace, whose place in the host's tree "
			"is unknown; it is charged to no job, as every such client will be (pinctl doctor)",
			(int)pid);
		return NULL;
	}
	if (r < 0) {
		log_debug("job quotas: %s names no usable cgroup (%s); pid %d is charged to no job", path,
			  r == -ENOENT   ? "no memory or unified line"
			  : r == -ENXIO  ? "outside my cgroup namespace"
			  : r == -ERANGE ? "above the host's root"
					 : "an odd path",
			  (int)pid);
		return NULL;
	}
	if (jobs_cgroup_get(b->jobs, cg, &ret) < 0)
		return NULL;
	return ret;
}

const struct cgns_probe *jobs_watch_cgns(const struct broker *b)
{
	return daemon_of(b)->jobs_watch ? &daemon_of(b)->jobs_watch->cgns : NULL;
}

void jobs_watch_unknown_acquire(struct broker *b, pid_t pid, uid_t uid)
{
	struct jobs_watch *w = daemon_of(b)->jobs_watch;
	uint64_t now = now_ms();
	size_t nrules = b->jobs ? jobs_rule_count(b->jobs) : 0;

	if (!w || nrules == 0)
		return;
	b->counters.job_unknown++;
	if (w->unknown_warned_ms && now - w->unknown_warned_ms < JOBS_UNKNOWN_WARN_MS) {
		w->unknown_quiet++;
		return;
	}
	log_warnx(
		"job quotas: pid %d uid %u asks for pinned memory, but its job is unknown (its %s/proc/%d/cgroup "
		"could not be read, or named a cgroup outside my cgroup namespace, when it connected) while %zu quota "
		"rules exist: %s%s; let the daemon read every client's /proc/PID/cgroup (the shipped unit's "
		"ProtectProc=default, or root; for a namespace, pinctl doctor's cgroup-namespace), see pinctl doctor",
		(int)pid, uid, w->root, (int)pid, nrules,
		daemon_of(b)->cfg->job_unknown == JOB_UNKNOWN_REFUSE
			? "refused (job-unknown = refuse)"
			: "granted, charged to no job (job-unknown = allow)",
		w->unknown_quiet ? " (more such acquires since the last warning: pinbroker_job_unknown_total)" : "");
	w->unknown_warned_ms = now ? now : 1;
	w->unknown_quiet = 0;
}

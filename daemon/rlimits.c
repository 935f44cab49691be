/* SPDX-License-Identifier: MIT */
/* The daemon's own limits: the memory it may lend against, and the fds, mappings and locked pages it may hold. */
#define _GNU_SOURCE
#include "rlimits.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "broker.h"
#include "budget.h"
#include "config.h"
#include "daemon.h"
#include "log.h"
#include "monitor.h"
#include "pool.h"
#include "util.h"

uint64_t rlimits_memory_base(const char *proc_root, uint64_t *host_total)
{
	struct monitor_host h;

	*host_total = 0;
	if (monitor_read_host(proc_root, &h) < 0 || h.mem_total_bytes == 0)
		return 0;
	*host_total = h.mem_total_bytes;
	if (h.cgroup_limit_bytes > 0 && h.cgroup_limit_bytes < h.mem_total_bytes)
		return h.cgroup_limit_bytes;
	return h.mem_total_bytes;
}

/* Fds and mappings the daemon itself may open beyond those counted at start: the loop, the monitor's
 * /proc and PSI files, the journal, the fd store's state memfd, prewarm thread stacks, malloc arenas. */
#define DAEMON_OWN_FDS 64
#define DAEMON_OWN_MAPS 512

static uint64_t fds_at_start, maps_at_start; /* counted by rlimits_count_start */

/* Entries of the directory path (dir), or lines of the file path; 0 when unreadable. */
static uint64_t count_lines_or_entries(const char *path, bool dir)
{
	uint64_t n = 0;

	if (dir) {
		DIR *d = opendir(path);
		struct dirent *e;

		if (!d)
			return 0;
		while ((e = readdir(d)))
			n += e->d_name[0] != '.';
		closedir(d);
	} else {
		FILE *f = fopen(path, "re");
		int ch;

		if (!f)
			return 0;
		while ((ch = fgetc(f)) != EOF)
			n += ch == '\n';
		fclose(f);
	}
	return n;
}

/*
 * Plan the chunk classes for the larger of the budget and the host's memory (a reload may raise the budget up
 * to it; the classes are fixed at start but for being raised): the largest class goes up until that much,
 * lent as one lease, takes at most a quarter of the chunks the fds and mappings allow. Logged at start,
 * and again whenever it changes.
 */
static void plan_classes(struct broker *b, uint64_t nofile, uint64_t map_max)
{
	struct classes_plan plan, old = b->chunk_plan;
	uint64_t plan_bytes = budget_limit(b->budget);
	char s1[32], s2[32], s3[32];

	if (b->host_mem_total_bytes > plan_bytes)
		plan_bytes = b->host_mem_total_bytes;
	/* An operator's chunk-max is kept (and warned about when it does not fit); only the default is raised. */
	if (classes_plan(pool_chunk_size(daemon_of(b)->pool), pool_chunk_max(daemon_of(b)->pool), plan_bytes,
			 b->chunk_capacity, !config_is_user_set(daemon_of(b)->cfg, "chunk-max"), &plan) < 0)
		return;
	if (plan.raised && pool_raise_chunk_max(daemon_of(b)->pool, plan.max_bytes) < 0)
		return;
	b->chunk_plan = plan;
	b->limit_nofile = nofile;
	b->limit_max_map_count = map_max;
	if (old.max_bytes == plan.max_bytes && old.capacity == plan.capacity && old.plan_bytes == plan.plan_bytes)
		return;
	format_size(pool_chunk_size(daemon_of(b)->pool), s1, sizeof(s1));
	format_size(plan.max_bytes, s2, sizeof(s2));
	format_size(plan.plan_bytes, s3, sizeof(s3));
	if (!plan.fits)
		log_warnx("chunk classes %s to %s: %s lent as one lease is %llu chunks, more than a quarter of the "
			  "%llu the daemon's file descriptors (RLIMIT_NOFILE %llu) and vm.max_map_count (%llu) allow; "
			  "raise LimitNOFILE or vm.max_map_count",
			  s1, s2, s3, (unsigned long long)plan.worst_chunks, (unsigned long long)plan.capacity,
			  (unsigned long long)nofile, (unsigned long long)map_max);
	else
		log_info("chunk classes %s to %s (%u)%s: %s lent as one lease is %llu chunks of the %llu the file "
			 "descriptors (RLIMIT_NOFILE %llu) and mappings (vm.max_map_count %llu) allow",
			 s1, s2, plan.n_classes, plan.raised ? ", chunk-max raised to fit" : "", s3,
			 (unsigned long long)plan.worst_chunks, (unsigned long long)plan.capacity,
			 (unsigned long long)nofile, (unsigned long long)map_max);
}

void rlimits_resolve(struct broker *b)
{
	struct rlimit rl = { 0 };
	uint64_t nofile, map_max = 0;
	char path[PATH_MAX], buf[32];
	FILE *f;

	nofile = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? rl.rlim_cur : 1u << 20;
	/* hugetlb chunks are never mapped in the daemon; 4 KiB chunks are, one mapping each. */
	if (!pool_hugetlb(daemon_of(b)->pool)) {
		snprintf(path, sizeof(path), "%s/proc/sys/vm/max_map_count", daemon_of(b)->cfg->proc_root);
		f = fopen(path, "re");
		if (!f)
			f = fopen("/proc/sys/vm/max_map_count", "re");
		if (f && fgets(buf, sizeof(buf), f))
			map_max = strtoull(buf, NULL, 10);
		if (f)
			fclose(f);
		if (map_max == 0)
			map_max = 65530; /* the kernel's default (DEFAULT_MAX_MAP_COUNT) */
	}
	if (broker_resolve_limits(b, nofile, map_max, fds_at_start + DAEMON_OWN_FDS, maps_at_start + DAEMON_OWN_MAPS))
		log_warnx("RLIMIT_NOFILE (%llu) and vm.max_map_count (%llu) leave almost no room for pool chunks "
			  "after reserve-fds and max-connections; lending at most %llu chunks: raise LimitNOFILE",
			  (unsigned long long)nofile, (unsigned long long)map_max,
			  (unsigned long long)b->chunk_capacity);
	plan_classes(b, nofile, map_max);
	log_debug(
		"limits: %llu chunks in all (RLIMIT_NOFILE %llu, max_map_count %llu), %llu chunks and %llu leases per "
		"uid",
		(unsigned long long)b->chunk_capacity, (unsigned long long)nofile, (unsigned long long)map_max,
		(unsigned long long)b->max_chunks_per_uid, (unsigned long long)b->max_leases_per_uid);
}

void rlimits_count_start(void)
{
	fds_at_start = count_lines_or_entries("/proc/self/fd", true);
	maps_at_start = count_lines_or_entries("/proc/self/maps", false);
}

void rlimits_raise_nofile(void)
{
	struct rlimit rl;

	/* One fd per pool chunk: 16 GiB of 2 MiB chunks is 8192 fds. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

void rlimits_lock_self(const struct config *c)
{
#if defined(__SANITIZE_ADDRESS__)
	(void)c;
#else
	/* Keep the daemon's own pages resident under the pressure it manages.
	 * MCL_ONFAULT: lock what is touched, without faulting in reservations. */
	if (c->lock_memory && mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) < 0)
		log_warn("mlockall failed; the daemon itself may be swapped under pressure, ignoring");
#endif
}

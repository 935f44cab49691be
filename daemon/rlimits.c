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
#include "log.h"
#include "monitor.h"
#include "pool.h"
#include "util.h"

uint64_t rlimits_memory_base(const char *proc_root, uint64_t *host_total)
{
	struct pressure_host h;

	*host_total = 0;
	if (pressure_read_host(proc_root, &h) < 0 || h.mem_total_bytes == 0)
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

void rlimits_resolve(struct broker *b)
{
	struct rlimit rl = { 0 };
	uint64_t nofile, map_max = 0;
	char path[PATH_MAX], buf[32];
	FILE *f;

	nofile = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? rl.rlim_cur : 1u << 20;
	/* hugetlb chunks are never mapped in the daemon; 4 KiB chunks are, one mapping each. */
	if (!pool_hugetlb(b->pool)) {
		snprintf(path, sizeof(path), "%s/proc/sys/vm/max_map_count", b->cfg->proc_root);
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
	if (b->chunk_capacity && budget_limit(b->budget) / pool_chunk_size(b->pool) > b->chunk_capacity) {
		char s1[32], s2[32], s3[32];

		log_warnx("budget %s is more chunks of %s than the daemon's file descriptors allow (%llu): at most %s "
			  "can be lent; raise LimitNOFILE, or chunk-size",
			  format_size(budget_limit(b->budget), s1, sizeof(s1)),
			  format_size(pool_chunk_size(b->pool), s2, sizeof(s2)), (unsigned long long)b->chunk_capacity,
			  format_size(b->chunk_capacity * pool_chunk_size(b->pool), s3, sizeof(s3)));
	}
	log_debug(
		"limits: %llu chunks in all (RLIMIT_NOFILE %llu, max_map_count %llu), %llu chunks and %llu leases per uid",
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

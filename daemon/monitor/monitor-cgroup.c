/* SPDX-License-Identifier: MIT */
/* The pressure monitor's memory cgroup: where it is, and the walk up its ancestors for the binding limit. */
#define _GNU_SOURCE
#include "monitor-int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "pressure.h"
#include "util.h"

/*
 * Limits are set by an administrator and rarely change, while usage moves
 * every poll: on cgroupfs the limits are read this often (and on every
 * explicit sample), the usage on every poll.
 */
#define CG_LIMIT_REFRESH_MS 5000
#define SELF_CGROUP_REL "proc/self/cgroup"

static int cg_join(char *dst, size_t cap, const char *mount, const char *path)
{
	int n;

	/* path is absolute ("/" for the namespace root): mount + path. */
	n = snprintf(dst, cap, "%s%s", mount, strcmp(path, "/") == 0 ? "" : path);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

/*
 * Find the daemon's memory cgroup. v1 wins when the memory controller is
 * mounted there (hybrid hosts such as the capture host keep memory on v1 and
 * only the name=systemd hierarchy on v2). Containers often mount their own
 * cgroup at the mount point while /proc/self/cgroup still names the host
 * path, so a leaf that does not exist falls back to the mount point.
 */
void mon_cg_resolve(int root_fd, struct cg_loc *loc, char *buf)
{
	struct cgroup_paths paths;
	char probe[REL_PATH_MAX + 32];
	size_t len;
	int r;

	memset(loc, 0, sizeof(*loc));
	r = mon_read_rel(root_fd, SELF_CGROUP_REL, buf, READ_BUF_BYTES, &len);
	if (r < 0) {
		log_debug("cannot read %s (%s): host figures only", SELF_CGROUP_REL, strerror(-r));
		return;
	}
	r = pressure_parse_self_cgroup(buf, len, &paths);
	if (r < 0) {
		log_warnx("%s is not a cgroup list (%s); host figures only", SELF_CGROUP_REL, strerror(-r));
		return;
	}
	if (paths.has_v1_memory) {
		loc->kind = CG_V1;
		snprintf(loc->mount, sizeof(loc->mount), "sys/fs/cgroup/memory");
		r = cg_join(loc->dir, sizeof(loc->dir), loc->mount, paths.v1_memory);
		snprintf(probe, sizeof(probe), "%s/memory.limit_in_bytes", loc->dir);
	} else {
		loc->kind = CG_V2;
		snprintf(loc->mount, sizeof(loc->mount), "sys/fs/cgroup");
		r = cg_join(loc->dir, sizeof(loc->dir), loc->mount, paths.v2);
		snprintf(probe, sizeof(probe), "%s/memory.current", loc->dir);
	}
	if (r < 0 || !mon_exists_rel(root_fd, probe)) {
		snprintf(loc->dir, sizeof(loc->dir), "%s", loc->mount);
		snprintf(probe, sizeof(probe), "%s/%s", loc->dir,
			 loc->kind == CG_V1 ? "memory.limit_in_bytes" : "memory.current");
		/* The v2 root has no memory.current: no limit applies there. */
		if (!mon_exists_rel(root_fd, probe))
			loc->kind = CG_NONE;
	}
	log_debug("memory cgroup: %s", loc->kind == CG_NONE ? "none" : loc->dir);
}

/* Walk from the leaf up to the mount point once; the files open on first read. */
void mon_cg_levels_init(struct cg_src *cg)
{
	const struct cg_loc *loc = &cg->loc;
	size_t mount_len = strlen(loc->mount), len = strlen(loc->dir);

	cg->nlevels = 0;
	cg->limits_valid = false;
	if (loc->kind == CG_NONE)
		return;
	while (cg->nlevels < CGROUP_DEPTH_MAX) {
		struct cg_level *l = &cg->level[cg->nlevels++];
		const char *slash;

		*l = (struct cg_level){ .dir_len = len, .limit_bytes = PRESSURE_UNLIMITED };
		mon_src_init(&l->limit, true);
		mon_src_init(&l->usage, true);
		mon_src_init(&l->stat, true);
		if (len <= mount_len)
			break;
		slash = memrchr(loc->dir, '/', len);
		if (!slash || (size_t)(slash - loc->dir) < mount_len)
			break;
		len = (size_t)(slash - loc->dir);
	}
}

void mon_cg_close(struct cg_src *cg)
{
	for (size_t i = 0; i < cg->nlevels; i++) {
		mon_src_close(&cg->level[i].limit);
		mon_src_close(&cg->level[i].usage);
		mon_src_close(&cg->level[i].stat);
	}
}

static int cg_level_read(int root_fd, const struct cg_src *cg, struct cg_level *l, struct src_file *f, const char *name,
			 char *buf, size_t *len)
{
	char rel[REL_PATH_MAX + 32];

	snprintf(rel, sizeof(rel), "%.*s/%s", (int)l->dir_len, cg->loc.dir, name);
	return mon_src_read(root_fd, f, rel, buf, READ_BUF_BYTES, len);
}

/* Read every level's limit. Returns 0, or the leaf's errno when its own limit is unreadable. */
static int cg_read_limits(int root_fd, struct cg_src *cg, uint64_t now, char *buf)
{
	bool v1 = cg->loc.kind == CG_V1;
	size_t len;
	int r;

	cg->limits_pseudo = true;
	for (size_t i = 0; i < cg->nlevels; i++) {
		struct cg_level *l = &cg->level[i];

		r = cg_level_read(root_fd, cg, l, &l->limit, v1 ? "memory.limit_in_bytes" : "memory.max", buf, &len);
		if (r == 0)
			r = v1 ? pressure_parse_cgroup_v1_limit(buf, len, &l->limit_bytes)
			       : pressure_parse_cgroup_v2_max(buf, len, &l->limit_bytes);
		l->limit_err = r;
		if (l->limit.fd >= 0 && !l->limit.pseudo)
			cg->limits_pseudo = false;
		if (r < 0 || l->limit_bytes == PRESSURE_UNLIMITED) {
			/* Only a limited level's usage is read: hold no fds for the others. */
			mon_src_close(&l->usage);
			mon_src_close(&l->stat);
		}
		/* The v2 root (a namespace's included) may have no memory.max: no limit there. */
		if (r < 0 && i == 0 && !(cg->loc.kind == CG_V2 && l->dir_len == strlen(cg->loc.mount))) {
			cg->limits_valid = false;
			return r;
		}
	}
	cg->limits_valid = true;
	cg->limits_ms = now;
	return 0;
}

static int cg_read_usage(int root_fd, struct cg_src *cg, struct cg_level *l, uint64_t *usage, uint64_t *reclaimable,
			 char *buf)
{
	bool v1 = cg->loc.kind == CG_V1;
	size_t len;
	int r;

	r = cg_level_read(root_fd, cg, l, &l->usage, v1 ? "memory.usage_in_bytes" : "memory.current", buf, &len);
	if (r < 0)
		return r;
	r = pressure_parse_u64_file(buf, len, usage);
	if (r < 0)
		return r;
	/* v1's total_ counters are hierarchical like usage_in_bytes; v2's memory.stat always is. */
	*reclaimable = 0;
	if (cg_level_read(root_fd, cg, l, &l->stat, "memory.stat", buf, &len) == 0)
		(void)pressure_parse_keyed_u64(buf, len, v1 ? "total_inactive_file" : "inactive_file", reclaimable);
	return 0;
}

/*
 * The limit that binds: every ancestor's limit caps us too, so take the one
 * with the least room (limit - usage) from the leaf up to the mount point.
 * The limits are re-read every CG_LIMIT_REFRESH_MS, when refresh_limits, and
 * on every poll for plain files; usage on every call. Returns 0, or the
 * leaf's errno when its own files are unreadable.
 */
int mon_cg_read(int root_fd, struct cg_src *cg, uint64_t now, bool refresh_limits, struct cg_reading *ret, char *buf)
{
	bool best_set = false;
	uint64_t best_room = 0;
	int r;

	memset(ret, 0, sizeof(*ret));
	if (cg->loc.kind == CG_NONE)
		return 0;
	if (refresh_limits || !cg->limits_valid || !cg->limits_pseudo || now - cg->limits_ms >= CG_LIMIT_REFRESH_MS) {
		r = cg_read_limits(root_fd, cg, now, buf);
		if (r < 0)
			return r;
	}
	for (size_t i = 0; i < cg->nlevels; i++) {
		struct cg_level *l = &cg->level[i];
		uint64_t usage, reclaimable, used, room;

		if (l->limit_err < 0 || l->limit_bytes == PRESSURE_UNLIMITED)
			continue;
		r = cg_read_usage(root_fd, cg, l, &usage, &reclaimable, buf);
		if (r < 0) {
			/* The cgroup may be gone: read the limits again next time too. */
			cg->limits_valid = false;
			if (i == 0)
				return r;
			continue;
		}
		used = usage > reclaimable ? usage - reclaimable : 0;
		room = l->limit_bytes > used ? l->limit_bytes - used : 0;
		if (!best_set || room < best_room) {
			best_set = true;
			best_room = room;
			ret->have_limit = true;
			ret->limit_bytes = l->limit_bytes;
			ret->usage_bytes = usage;
			ret->reclaimable_bytes = reclaimable;
		}
	}
	return 0;
}

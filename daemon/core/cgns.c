/* SPDX-License-Identifier: MIT */
/* Cgroup paths read in the daemon's cgroup namespace turned into the host's (cgns.h). */
#define _GNU_SOURCE
#include "cgns.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *cgns_mode_name(enum cgns_mode mode)
{
	switch (mode) {
	case CGNS_HOST:
		return "host";
	case CGNS_PRIVATE:
		return "private";
	case CGNS_UNRESOLVED:
		return "unresolved";
	}
	return "unknown";
}

int cgns_ups(const char *path, unsigned *ups, const char **rest)
{
	unsigned n = 0;
	const char *p;

	if (path[0] != '/')
		return -EINVAL;
	p = path + 1;
	/* kernfs_path_from_node writes every ".." first, then the names down from the common ancestor. */
	while (p[0] == '.' && p[1] == '.' && (p[2] == '/' || !p[2])) {
		n++;
		p += p[2] ? 3 : 2;
	}
	for (const char *q = p; *q; q++)
		if ((q == p || q[-1] == '/') && q[0] == '.' && q[1] == '.' && (q[2] == '/' || !q[2]))
			return -EINVAL;
	*ups = n;
	*rest = p;
	return 0;
}

int cgns_detect(const char *pid1_cgroup, enum cgns_mode *ret)
{
	char path[JOBS_PATH_MAX];
	const char *rest;
	unsigned ups;
	int r;

	r = jobs_proc_cgroup_raw(pid1_cgroup, path, sizeof(path), NULL);
	if (r < 0)
		return r;
	r = cgns_ups(path, &ups, &rest);
	if (r < 0)
		return r;
	*ret = ups ? CGNS_UNRESOLVED : CGNS_HOST;
	return 0;
}

int cgns_host_depth(const char *pid1_cgroup, unsigned *depth)
{
	char path[JOBS_PATH_MAX];
	const char *rest;
	int r;

	/* The same line cgns_detect and clients' paths are read from: memory's on a hybrid host. */
	r = jobs_proc_cgroup_raw(pid1_cgroup, path, sizeof(path), NULL);
	return r < 0 ? r : cgns_ups(path, depth, &rest);
}

unsigned cgns_depth(const char *path)
{
	unsigned n = 0;

	for (const char *p = path; *p; p++)
		if (*p == '/' && p[1])
			n++;
	return n;
}

int cgns_root_from_self(const char *host_self, const char *ns_self, char *root, size_t len)
{
	size_t hl = strlen(host_self), nl = strlen(ns_self);
	const char *why, *rest;
	unsigned ups;

	if (cgns_ups(host_self, &ups, &rest) < 0 || ups || cgns_ups(ns_self, &ups, &rest) < 0 || ups)
		return -EINVAL;
	if (strcmp(ns_self, "/") == 0)
		nl = 0;
	/* ns_self must be host_self's last components, whole ones: "/b" ends "/a/b", not "/ab". */
	if (nl > hl || memcmp(host_self + hl - nl, ns_self, nl) != 0)
		return -EINVAL;
	hl -= nl;
	if (hl == 0)
		hl = 1; /* the root is the host's "/" */
	if (hl >= len)
		return -EINVAL;
	memcpy(root, host_self, hl);
	root[hl] = '\0';
	return strcmp(root, "/") == 0 ? 0 : jobs_path_check(root, false, &why);
}

/* Undo mountinfo's octal escapes (\040 for a blank, \011, \012, \134) of a field of n bytes into out. */
static int unescape(const char *f, size_t n, char *out, size_t len)
{
	size_t o = 0;

	for (size_t i = 0; i < n; i++) {
		char c = f[i];

		if (c == '\\' && i + 3 < n && f[i + 1] >= '0' && f[i + 1] <= '3' && f[i + 2] >= '0' &&
		    f[i + 2] <= '7' && f[i + 3] >= '0' && f[i + 3] <= '7') {
			c = (char)((f[i + 1] - '0') * 64 + (f[i + 2] - '0') * 8 + (f[i + 3] - '0'));
			i += 3;
		}
		if (o + 1 >= len)
			return -ENAMETOOLONG;
		out[o++] = c;
	}
	out[o] = '\0';
	return 0;
}

/* Whether the comma-separated list s (n bytes) holds word. */
static bool has_word(const char *s, size_t n, const char *word)
{
	size_t wl = strlen(word);

	for (const char *t = s; t < s + n;) {
		const char *comma = memchr(t, ',', (size_t)(s + n - t));
		size_t tl = comma ? (size_t)(comma - t) : (size_t)(s + n - t);

		if (tl == wl && memcmp(t, word, wl) == 0)
			return true;
		t += tl + 1;
	}
	return false;
}

int cgns_find_host_mount(const char *mountinfo, bool v1_memory, unsigned depth, char *mnt, size_t len, unsigned *ups)
{
	unsigned best = 0;
	int ret = -ENOENT;

	/* "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS" (proc(5)). */
	for (const char *line = mountinfo; *line;) {
		const char *end = strchr(line, '\n');
		size_t llen = end ? (size_t)(end - line) : strlen(line);
		const char *f[6], *dash = NULL, *fs[3] = { NULL };
		size_t fl[6], fsl[3];
		unsigned nf = 0, nfs = 0;
		const char *p = line, *e = line + llen;

		while (p < e) {
			const char *s;

			while (p < e && *p == ' ')
				p++;
			if (p >= e)
				break;
			s = p;
			while (p < e && *p != ' ')
				p++;
			if (dash) {
				if (nfs < 3) {
					fs[nfs] = s;
					fsl[nfs++] = (size_t)(p - s);
				}
			} else if (p - s == 1 && *s == '-' && nf >= 6) {
				dash = s;
			} else if (nf < 6) {
				f[nf] = s;
				fl[nf++] = (size_t)(p - s);
			}
		}
		line += llen + (end ? 1 : 0);
		if (!dash || nfs < 3 || nf < 6)
			continue;
		if (v1_memory ? !(fsl[0] == 6 && memcmp(fs[0], "cgroup", 6) == 0 && has_word(fs[2], fsl[2], "memory"))
			      : !(fsl[0] == 7 && memcmp(fs[0], "cgroup2", 7) == 0))
			continue;

		char root[JOBS_PATH_MAX];
		const char *rest;
		unsigned n;

		if (unescape(f[3], fl[3], root, sizeof(root)) < 0 || cgns_ups(root, &n, &rest) < 0 || !n || *rest ||
		    n <= best)
			continue;
		if (unescape(f[4], fl[4], mnt, len) < 0) {
			if (n >= depth)
				ret = -ENAMETOOLONG;
			continue;
		}
		best = n;
		*ups = n;
		/*
		 * No mount climbs above the host's root, so with hostPID (depth exact) ">=" is "==". Without it, pid
		 * 1's
		 * climb is only a floor, and a mount climbing further still holds every name pid 1's view needs.
		 */
		ret = n >= depth ? 0 : -ERANGE;
	}
	return ret;
}

bool cgns_procs_has(const char *procs, long pid)
{
	for (const char *p = procs; *p;) {
		char *end;
		long v = strtol(p, &end, 10);

		if (end != p && v == pid && (*end == '\n' || !*end))
			return true;
		p = strchr(p, '\n');
		if (!p)
			break;
		p++;
	}
	return false;
}

int cgns_resolve(const struct cgns *ns, const char *raw, char *out, size_t len)
{
	char buf[JOBS_PATH_MAX];
	const char *rest, *why;
	unsigned ups, depth;
	size_t n;
	int r;

	r = cgns_ups(raw, &ups, &rest);
	if (r < 0)
		return r;
	if (ns->mode != CGNS_PRIVATE) {
		if (ups)
			return -ENXIO;
		if (strlen(raw) >= len)
			return -EINVAL;
		strcpy(out, raw);
		return jobs_path_check(out, false, &why);
	}
	/* root, less ups components, then the rest. */
	depth = cgns_depth(ns->root);
	if (ups > depth)
		return -ERANGE;
	snprintf(buf, sizeof(buf), "%s", ns->root);
	for (unsigned i = 0; i < ups; i++) {
		char *slash = strrchr(buf, '/');

		slash[slash == buf ? 1 : 0] = '\0';
	}
	n = strlen(buf);
	if (*rest) {
		size_t rl = strlen(rest), sep = n > 1 ? 1 : 0;

		if (n + sep + rl >= sizeof(buf))
			return -EINVAL;
		buf[n] = '/';
		memcpy(buf + n + sep, rest, rl + 1);
	}
	if (strlen(buf) >= len)
		return -EINVAL;
	strcpy(out, buf);
	return jobs_path_check(out, false, &why);
}

int cgns_mount_root(const struct cgns *ns, unsigned ups, char *out, size_t len)
{
	size_t n;

	if (ns->mode != CGNS_PRIVATE)
		return -EINVAL;
	if (ups > cgns_depth(ns->root))
		return -ERANGE;
	n = strlen(ns->root);
	if (n >= len)
		return -EINVAL;
	memcpy(out, ns->root, n + 1);
	for (unsigned i = 0; i < ups; i++) {
		char *slash = strrchr(out, '/');

		slash[slash == out ? 1 : 0] = '\0';
	}
	return 0;
}

int cgns_to_ns(const struct cgns *ns, const char *host, char *out, size_t len)
{
	size_t rl;

	if (ns->mode != CGNS_PRIVATE || strcmp(ns->root, "/") == 0) {
		if (strlen(host) >= len)
			return -EINVAL;
		strcpy(out, host);
		return 0;
	}
	rl = strlen(ns->root);
	if (strncmp(host, ns->root, rl) != 0 || (host[rl] != '/' && host[rl] != '\0'))
		return -ENXIO;
	if (strlen(host + rl) + 2 > len)
		return -EINVAL;
	snprintf(out, len, "%s", host[rl] ? host + rl : "/");
	return 0;
}

int cgns_client_cgroup(const struct cgns *ns, const char *text, char *out, size_t len, bool *v1)
{
	char raw[JOBS_PATH_MAX];
	int r;

	r = jobs_proc_cgroup_raw(text, raw, sizeof(raw), v1);
	if (r < 0)
		return r;
	return cgns_resolve(ns, raw, out, len);
}

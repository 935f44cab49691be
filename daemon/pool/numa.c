/* SPDX-License-Identifier: MIT */
/* NUMA topology from sysfs and the pool's placement decisions: prewarm split and fallback order. */
#define _GNU_SOURCE
#include "numa.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util.h"

#define NVIDIA_VENDOR 0x10de
#define PCI_CLASS_DISPLAY 0x03

/* The first line of path into buf; false when it cannot be read. */
static bool read_line(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "re");
	bool ok;

	if (!f)
		return false;
	ok = fgets(buf, (int)len, f) != NULL;
	fclose(f);
	if (ok)
		buf[strcspn(buf, "\n")] = 0;
	return ok;
}

int numa_parse_list(const char *s, int *ids, size_t max)
{
	size_t n = 0;

	while (*s) {
		char *end;
		long lo = strtol(s, &end, 10), hi;

		if (end == s || lo < 0)
			return -EINVAL;
		hi = lo;
		s = end;
		if (*s == '-') {
			hi = strtol(s + 1, &end, 10);
			if (end == s + 1 || hi < lo)
				return -EINVAL;
			s = end;
		}
		for (long i = lo; i <= hi; i++) {
			if (n == max)
				return -EINVAL;
			ids[n++] = (int)i;
		}
		if (*s == ',')
			s++;
		else if (*s && !isspace((unsigned char)*s))
			return -EINVAL;
		else
			break;
	}
	return (int)n;
}

int numa_index(const struct numa_topology *t, int id)
{
	for (size_t i = 0; i < t->n; i++)
		if (t->node[i].id == id)
			return (int)i;
	return -1;
}

/* "Node 0 MemTotal:   8349432 kB" lines of nodeN/meminfo. */
static void read_node_meminfo(const char *path, struct numa_node *nd)
{
	FILE *f = fopen(path, "re");
	char line[256];

	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long kb;
		int id;
		char key[64];

		if (sscanf(line, "Node %d %63[^:]: %llu", &id, key, &kb) != 3)
			continue;
		if (strcmp(key, "MemTotal") == 0)
			nd->mem_total_bytes = kb * 1024;
		else if (strcmp(key, "MemFree") == 0)
			nd->mem_free_bytes = kb * 1024;
	}
	fclose(f);
}

int numa_node_free(const char *root, int id, uint64_t *free_bytes)
{
	char path[4096 + 64];
	struct numa_node nd = { .id = id };

	if (id < 0)
		return -EINVAL;
	snprintf(path, sizeof(path), "%s/sys/devices/system/node/node%d/meminfo", root ? root : "", id);
	nd.mem_free_bytes = UINT64_MAX;
	read_node_meminfo(path, &nd);
	if (nd.mem_free_bytes == UINT64_MAX)
		return -ENOENT;
	*free_bytes = nd.mem_free_bytes;
	return 0;
}

static void read_gpus(const char *root, struct numa_topology *t)
{
	char dir[4096], path[4096 + 256 + 32], buf[64];
	struct dirent *e;
	DIR *d;

	snprintf(dir, sizeof(dir), "%s/sys/bus/pci/devices", root);
	d = opendir(dir);
	if (!d)
		return;
	while ((e = readdir(d)) && t->n_gpus < NUMA_MAX_GPUS) {
		unsigned long vendor, cls;
		struct numa_gpu *g;
		int idx;

		/* PCI addresses ("0000:3b:00.0") are 12 characters; anything else here is not a device. */
		if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof(g->bus_id))
			continue;
		snprintf(path, sizeof(path), "%s/%s/vendor", dir, e->d_name);
		if (!read_line(path, buf, sizeof(buf)) || (vendor = strtoul(buf, NULL, 16)) != NVIDIA_VENDOR)
			continue;
		snprintf(path, sizeof(path), "%s/%s/class", dir, e->d_name);
		if (!read_line(path, buf, sizeof(buf)) || ((cls = strtoul(buf, NULL, 16)) >> 16) != PCI_CLASS_DISPLAY)
			continue;
		g = &t->gpu[t->n_gpus++];
		memcpy(g->bus_id, e->d_name, strlen(e->d_name) + 1);
		snprintf(path, sizeof(path), "%s/%s/numa_node", dir, e->d_name);
		g->node = read_line(path, buf, sizeof(buf)) ? atoi(buf) : -1;
		idx = g->node >= 0 ? numa_index(t, g->node) : -1;
		if (idx < 0)
			g->node = -1;
		else
			t->node[idx].gpus++;
	}
	closedir(d);
}

int numa_read(const char *root, uint64_t mem_total_fallback, struct numa_topology *t)
{
	char path[4096], buf[1024];
	int ids[NUMA_MAX_NODES];
	int n;

	memset(t, 0, sizeof(*t));
	root = root ? root : "";
	snprintf(path, sizeof(path), "%s/sys/devices/system/node/online", root);
	n = read_line(path, buf, sizeof(buf)) ? numa_parse_list(buf, ids, NUMA_MAX_NODES) : -1;
	/* Node masks here hold ids below NUMA_MAX_NODES: a node numbered past them is not placed on. */
	if (n > 0) {
		int kept = 0;

		for (int i = 0; i < n; i++)
			if (ids[i] < NUMA_MAX_NODES)
				ids[kept++] = ids[i];
		n = kept;
	}
	if (n <= 0) {
		/* No NUMA in this kernel: one node, all the memory. */
		t->n = 1;
		t->node[0].mem_total_bytes = mem_total_fallback;
		t->node[0].distance[0] = 10;
		read_gpus(root, t);
		return 0;
	}
	t->n = (size_t)n;
	for (int i = 0; i < n; i++) {
		t->node[i].id = ids[i];
		snprintf(path, sizeof(path), "%s/sys/devices/system/node/node%d/meminfo", root, ids[i]);
		read_node_meminfo(path, &t->node[i]);
	}
	for (int i = 0; i < n; i++) {
		char *s = buf, *end;

		snprintf(path, sizeof(path), "%s/sys/devices/system/node/node%d/distance", root, ids[i]);
		/* The row lists every possible node, in id order: keep the online ones. */
		if (!read_line(path, buf, sizeof(buf)))
			buf[0] = 0;
		for (int id = 0; id < NUMA_MAX_NODES; id++) {
			long v = strtol(s, &end, 10);
			int j;

			if (end == s)
				break;
			s = end;
			j = numa_index(t, id);
			if (j >= 0)
				t->node[i].distance[j] = (unsigned)v;
		}
		for (int j = 0; j < n; j++)
			if (t->node[i].distance[j] == 0)
				t->node[i].distance[j] = i == j ? 10 : 20; /* what the kernel assumes without a SLIT */
	}
	read_gpus(root, t);
	return 0;
}

/* Bus ids compare without the domain when one side lacks it ("3b:00.0" is "0000:3b:00.0"). */
static const char *without_domain(const char *s)
{
	const char *c = strchr(s, ':');

	return c && strchr(c + 1, ':') ? c + 1 : s;
}

int numa_gpu_node(const struct numa_topology *t, const char *bus_id)
{
	for (size_t i = 0; i < t->n_gpus; i++)
		if (strcasecmp(without_domain(t->gpu[i].bus_id), without_domain(bus_id)) == 0)
			return t->gpu[i].node;
	return -1;
}

void numa_split_prewarm(const struct numa_topology *t, enum numa_prewarm how, uint64_t bytes, uint64_t chunk_bytes,
			const uint64_t *list_bytes, uint64_t *out)
{
	uint64_t chunks = chunk_bytes ? bytes / chunk_bytes : 0, given = 0;
	unsigned weight_sum = 0, weights[NUMA_MAX_NODES];
	size_t best = 0;

	if (how == NUMA_PREWARM_LIST) {
		for (size_t i = 0; i < t->n; i++)
			out[i] = list_bytes[i];
		return;
	}
	for (size_t i = 0; i < t->n; i++) {
		weights[i] = how == NUMA_PREWARM_GPUS ? t->node[i].gpus : 1;
		weight_sum += weights[i];
	}
	if (weight_sum == 0) /* no GPU says its node: even */
		for (size_t i = 0; i < t->n; i++)
			weight_sum += (weights[i] = 1);
	for (size_t i = 0; i < t->n; i++) {
		uint64_t c = chunks * weights[i] / weight_sum;

		out[i] = c * chunk_bytes;
		given += c;
		if (weights[i] > weights[best])
			best = i;
	}
	out[best] += (chunks - given) * chunk_bytes;
}

int numa_parse_prewarm(const struct numa_topology *t, const char *spec, enum numa_prewarm *how, uint64_t *list_bytes,
		       const char **err)
{
	char *copy, *save = NULL;

	if (strcmp(spec, "gpus") == 0 || strcmp(spec, "") == 0) {
		*how = NUMA_PREWARM_GPUS;
		return 0;
	}
	if (strcmp(spec, "even") == 0) {
		*how = NUMA_PREWARM_EVEN;
		return 0;
	}
	*how = NUMA_PREWARM_LIST;
	memset(list_bytes, 0, t->n * sizeof(*list_bytes));
	copy = strdup(spec);
	if (!copy) {
		*err = "out of memory";
		return -ENOMEM;
	}
	for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
		char *colon = strchr(item, ':'), *end;
		long id;
		int idx;
		uint64_t v;

		if (!colon) {
			*err = "expected gpus, even, or NODE:SIZE[,NODE:SIZE...]";
			goto bad;
		}
		*colon = 0;
		id = strtol(item, &end, 10);
		if (end == item || *end || id < 0) {
			*err = "a node must be a number (see /sys/devices/system/node/online)";
			goto bad;
		}
		idx = numa_index(t, (int)id);
		if (idx < 0) {
			*err = "no such NUMA node on this host (see /sys/devices/system/node/online)";
			goto bad;
		}
		if (parse_size(colon + 1, &v) < 0) {
			*err = "not a size (examples: 4G, 512M)";
			goto bad;
		}
		list_bytes[idx] = v;
	}
	free(copy);
	return 0;
bad:
	free(copy);
	return -EINVAL;
}

size_t numa_fallback_order(const struct numa_topology *t, int id, int *order)
{
	int self = numa_index(t, id);
	size_t n = 0;

	if (self < 0)
		return 0;
	for (size_t i = 0; i < t->n; i++)
		order[n++] = (int)i;
	/* Insertion sort by (distance from self, id); self has the smallest distance. */
	for (size_t i = 1; i < n; i++)
		for (size_t j = i; j > 0; j--) {
			int a = order[j - 1], b = order[j];
			unsigned da = a == self ? 0 : t->node[self].distance[a],
				 db = b == self ? 0 : t->node[self].distance[b];

			if (da < db || (da == db && t->node[a].id < t->node[b].id))
				break;
			order[j - 1] = b;
			order[j] = a;
		}
	return n;
}

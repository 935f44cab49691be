/* SPDX-License-Identifier: MIT */
/* Tenants (tenant.h): (uid, pid namespace, cgroup) interned into ids the pool compares, and the NSpid parser. */
#include "tenant.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct tenant_entry {
	uint64_t id;
	uid_t uid;
	char *pidns;
	char *cgroup;
	bool kept; /* may stay, idle, after its last reference */
	uint32_t refs;
	uint64_t idle_since; /* t->seq when its last reference went: the oldest idle one is dropped first */
	struct tenant_entry *next;
};

struct tenants {
	struct tenant_entry *head;
	struct tenant_entry **byid; /* the n entries in id order (new ones have the largest id): a lookup is a search */
	size_t n, nidle, cap;
	uint64_t next_id; /* ids only grow: one dropped is never given to a later tenant */
	uint64_t seq;
};

int tenants_new(struct tenants **ret)
{
	struct tenants *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	t->next_id = TENANT_NONE + 1;
	*ret = t;
	return 0;
}

void tenants_free(struct tenants *t)
{
	if (!t)
		return;
	while (t->head) {
		struct tenant_entry *e = t->head;

		t->head = e->next;
		free(e->pidns);
		free(e->cgroup);
		free(e);
	}
	free(t->byid);
	free(t);
}

/* The index in byid of the entry with id, or of where it would be. */
static size_t byid_index(const struct tenants *t, uint64_t id)
{
	size_t lo = 0, hi = t->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (t->byid[mid]->id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Room in byid for one more entry. */
static bool byid_reserve(struct tenants *t)
{
	struct tenant_entry **v;
	size_t cap = t->cap ? 2 * t->cap : 16;

	if (t->n < t->cap)
		return true;
	v = realloc(t->byid, cap * sizeof(*v));
	if (!v)
		return false;
	t->byid = v;
	t->cap = cap;
	return true;
}

uint64_t tenants_get(struct tenants *t, uid_t uid, const char *pidns, const char *cgroup, bool kept)
{
	struct tenant_entry *e;

	/* Unknown: a tenant of its own, kept in no entry (nobody else can be told to be it). */
	if (!pidns || !cgroup)
		return t->next_id++;
	for (e = t->head; e; e = e->next)
		if (e->uid == uid && e->kept == kept && strcmp(e->pidns, pidns) == 0 &&
		    strcmp(e->cgroup, cgroup) == 0) {
			if (e->refs++ == 0)
				t->nidle--;
			return e->id;
		}
	e = calloc(1, sizeof(*e));
	if (e) {
		e->pidns = strdup(pidns);
		e->cgroup = strdup(cgroup);
	}
	if (!e || !e->pidns || !e->cgroup || !byid_reserve(t)) {
		if (e) {
			free(e->pidns);
			free(e->cgroup);
		}
		free(e);
		return t->next_id++;
	}
	e->id = t->next_id++;
	e->uid = uid;
	e->kept = kept;
	e->refs = 1;
	e->next = t->head;
	t->head = e;
	t->byid[t->n++] = e;
	return e->id;
}

/* Unlink and free the entry *pp (idle: it was counted idle). */
static void drop(struct tenants *t, struct tenant_entry **pp, bool idle)
{
	struct tenant_entry *e = *pp;

	size_t i = byid_index(t, e->id);

	*pp = e->next;
	memmove(&t->byid[i], &t->byid[i + 1], (t->n - i - 1) * sizeof(*t->byid));
	free(e->pidns);
	free(e->cgroup);
	free(e);
	t->n--;
	if (idle)
		t->nidle--;
}

/* Drop the idle entry that has been idle longest. */
static void drop_oldest_idle(struct tenants *t)
{
	struct tenant_entry **oldest = NULL;

	for (struct tenant_entry **pp = &t->head; *pp; pp = &(*pp)->next)
		if ((*pp)->refs == 0 && (!oldest || (*pp)->idle_since < (*oldest)->idle_since))
			oldest = pp;
	if (oldest)
		drop(t, oldest, true);
}

void tenants_put(struct tenants *t, uint64_t id)
{
	for (struct tenant_entry **pp = &t->head; *pp; pp = &(*pp)->next) {
		struct tenant_entry *e = *pp;

		if (e->id != id || e->refs == 0)
			continue;
		if (--e->refs > 0)
			return;
		/* Its names may go to a later namespace or cgroup: it must not be there to be found then. */
		if (!e->kept) {
			drop(t, pp, false);
			return;
		}
		e->idle_since = ++t->seq;
		t->nidle++;
		if (t->nidle > TENANTS_IDLE_KEPT)
			drop_oldest_idle(t);
		return;
	}
}

static const struct tenant_entry *find(const struct tenants *t, uint64_t id)
{
	size_t i = byid_index(t, id);

	return i < t->n && t->byid[i]->id == id ? t->byid[i] : NULL;
}

bool tenants_same_pidns(const struct tenants *t, uint64_t a, uint64_t b)
{
	const struct tenant_entry *ea, *eb;

	if (a == b)
		return a != TENANT_NONE;
	if (!t)
		return false;
	ea = find(t, a);
	eb = find(t, b);
	return ea && eb && strcmp(ea->pidns, eb->pidns) == 0;
}

size_t tenants_count(const struct tenants *t)
{
	return t->n;
}

size_t tenants_idle(const struct tenants *t)
{
	return t->nidle;
}

unsigned tenant_parse_nspid(const char *buf, size_t len)
{
	static const char key[] = "NSpid:";
	const char *p = buf, *end = buf + len;

	while (p < end) {
		const char *eol = memchr(p, '\n', (size_t)(end - p));
		const char *q;
		unsigned n = 0;

		if (!eol)
			eol = end;
		if ((size_t)(eol - p) >= sizeof(key) - 1 && memcmp(p, key, sizeof(key) - 1) == 0) {
			q = p + sizeof(key) - 1;
			while (q < eol) {
				bool digits = false;

				while (q < eol && (*q == ' ' || *q == '\t'))
					q++;
				if (q == eol)
					break;
				while (q < eol && *q >= '0' && *q <= '9') {
					q++;
					digits = true;
				}
				if (!digits || (q < eol && *q != ' ' && *q != '\t'))
					return 0;
				n++;
			}
			return n;
		}
		p = eol + 1;
	}
	return 0;
}

/* SPDX-License-Identifier: MIT */
/* Clients' unbrokered reports per uid, and the caps that keep one uid's word from inflating the host's figure. */
#include "unbrokered.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Index of uid, or of where it would go; *found says which. Few uids report at once: a sorted array serves. */
static size_t uid_search(const struct unbrokered *u, uid_t uid, bool *found)
{
	size_t lo = 0, hi = u->nuids;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (u->uids[mid].uid < uid)
			lo = mid + 1;
		else
			hi = mid;
	}
	*found = lo < u->nuids && u->uids[lo].uid == uid;
	return lo;
}

static int uid_insert(struct unbrokered *u, size_t at, uid_t uid)
{
	if (u->nuids == u->cap_uids) {
		size_t cap = u->cap_uids ? 2 * u->cap_uids : 8;
		struct unbrokered_uid *p = realloc(u->uids, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		u->uids = p;
		u->cap_uids = cap;
	}
	memmove(&u->uids[at + 1], &u->uids[at], (u->nuids - at) * sizeof(*u->uids));
	memset(&u->uids[at], 0, sizeof(*u->uids));
	u->uids[at].uid = uid;
	u->nuids++;
	return 0;
}

static void uid_remove(struct unbrokered *u, size_t at)
{
	memmove(&u->uids[at], &u->uids[at + 1], (u->nuids - at - 1) * sizeof(*u->uids));
	if (--u->nuids == 0)
		unbrokered_clear(u);
}

int unbrokered_set(struct unbrokered *u, uid_t uid, uint64_t old_bytes, uint64_t new_bytes)
{
	struct unbrokered_uid *e;
	bool found;
	size_t at;
	int r;

	if (old_bytes == new_bytes)
		return 0;
	at = uid_search(u, uid, &found);
	if (!found) {
		/* A connection reporting for the first time (old_bytes is then 0). */
		if (old_bytes != 0 || new_bytes == 0)
			return 0;
		r = uid_insert(u, at, uid);
		if (r < 0)
			return r;
	}
	e = &u->uids[at];
	e->reported_bytes = e->reported_bytes - old_bytes + new_bytes;
	u->reported_bytes = u->reported_bytes - old_bytes + new_bytes;
	if (old_bytes == 0)
		e->connections++;
	else if (new_bytes == 0)
		e->connections--;
	if (e->connections == 0)
		uid_remove(u, at);
	return 0;
}

void unbrokered_clear(struct unbrokered *u)
{
	free(u->uids);
	memset(u, 0, sizeof(*u));
}

uint64_t unbrokered_cap(uint64_t mem_total_bytes, uint64_t pinned_bytes)
{
	if (mem_total_bytes == 0)
		return UINT64_MAX;
	return pinned_bytes < mem_total_bytes ? mem_total_bytes - pinned_bytes : 0;
}

bool unbrokered_report_ok(uint64_t bytes, uint64_t mem_total_bytes, uint64_t max_bytes)
{
	return bytes <= max_bytes && (mem_total_bytes == 0 || bytes <= mem_total_bytes);
}

uint64_t unbrokered_uid_reported(const struct unbrokered *u, uid_t uid)
{
	bool found;
	size_t at = uid_search(u, uid, &found);

	return found ? u->uids[at].reported_bytes : 0;
}

uint64_t unbrokered_uid_counted(const struct unbrokered *u, uid_t uid, uint64_t cap)
{
	uint64_t v = unbrokered_uid_reported(u, uid);

	return v < cap ? v : cap;
}

uint64_t unbrokered_counted(const struct unbrokered *u, uint64_t cap)
{
	uint64_t sum = 0;

	/* Each term is at most cap and the sum stops at cap, so nothing wraps. */
	for (size_t i = 0; i < u->nuids && sum < cap; i++) {
		uint64_t v = u->uids[i].reported_bytes < cap ? u->uids[i].reported_bytes : cap;

		sum = v > cap - sum ? cap : sum + v;
	}
	return sum;
}

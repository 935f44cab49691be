/* SPDX-License-Identifier: MIT */
/* Exact accounting of leased bytes against the host budget and per-uid quotas. */
#include "budget.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A host has few uids holding leases at once, so a sorted array beats a hash here. */
struct uid_usage {
	uid_t uid;
	uint64_t leased_bytes;
	uint64_t leases;          /* counted by budget_count_add/sub, for the per-uid caps */
	uint64_t chunks;          /* pool chunks those leases hold: fds (and mappings) in the daemon */
	uint64_t no_revoke_bytes; /* of leased_bytes, in leases that are never revoked */
	uint64_t held_fds; /* other fds the daemon keeps for uid (an exiting process's pidfd), for the same caps */
};

/*
 * The books must balance even in release builds (where NDEBUG drops assert()):
 * a wrapped counter would silently hand out memory the host does not have.
 */
#define BUDGET_INVARIANT(cond)   \
	do {                     \
		assert(cond);    \
		if (!(cond))     \
			abort(); \
	} while (0)

struct budget {
	uint64_t limit_bytes;
	uint64_t uid_quota_bytes; /* 0: no per-uid quota beyond the budget itself */
	uint64_t leased_bytes;
	uint64_t leases, chunks;
	uint64_t held_fds;
	uint64_t no_revoke_bytes;
	struct uid_usage *uids; /* sorted by uid; entries at 0 bytes, 0 leases and 0 chunks are dropped */
	size_t nuids;
	size_t cap_uids;
};

int budget_new(uint64_t limit_bytes, uint64_t uid_quota_bytes, struct budget **ret)
{
	struct budget *b;

	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->limit_bytes = limit_bytes;
	b->uid_quota_bytes = uid_quota_bytes;
	*ret = b;
	return 0;
}

bool budget_uid_at(const struct budget *b, size_t i, uid_t *uid)
{
	if (i >= b->nuids)
		return false;
	*uid = b->uids[i].uid;
	return true;
}

void budget_free(struct budget *b)
{
	if (!b)
		return;
	free(b->uids);
	free(b);
}

void budget_set_limits(struct budget *b, uint64_t limit_bytes, uint64_t uid_quota_bytes)
{
	b->limit_bytes = limit_bytes;
	b->uid_quota_bytes = uid_quota_bytes;
}

/* Index of uid, or of where it would be inserted; *found says which. */
static size_t uid_search(const struct budget *b, uid_t uid, int *found)
{
	size_t lo = 0, hi = b->nuids;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (b->uids[mid].uid < uid)
			lo = mid + 1;
		else
			hi = mid;
	}
	*found = lo < b->nuids && b->uids[lo].uid == uid;
	return lo;
}

/* uid's entry, or NULL when it holds nothing. */
static const struct uid_usage *uid_find(const struct budget *b, uid_t uid)
{
	int found;
	size_t i = uid_search(b, uid, &found);

	return found ? &b->uids[i] : NULL;
}

static uint64_t effective_quota(const struct budget *b)
{
	return b->uid_quota_bytes ? b->uid_quota_bytes : b->limit_bytes;
}

uint64_t budget_left(const struct budget *b, uint64_t *limit, uint64_t *used)
{
	*limit = b->limit_bytes;
	*used = b->leased_bytes;
	return b->leased_bytes < b->limit_bytes ? b->limit_bytes - b->leased_bytes : 0;
}

bool budget_uid_left(const struct budget *b, uid_t uid, uint64_t *limit, uint64_t *used, uint64_t *left)
{
	*limit = effective_quota(b);
	*used = budget_uid_leased(b, uid);
	/* Held may exceed a lowered quota; subtractions so huge values cannot wrap. */
	*left = *used < *limit ? *limit - *used : 0;
	/* A quota at or above the budget never binds first: "over budget" is then the true reason. */
	return b->uid_quota_bytes && *limit < b->limit_bytes;
}

enum broker_refusal budget_check(const struct budget *b, uid_t uid, uint64_t bytes)
{
	uint64_t limit, used, left;

	if (bytes == 0)
		return REFUSAL_INVALID_SIZE;
	if (bytes > b->limit_bytes || bytes > effective_quota(b))
		return REFUSAL_TOO_LARGE;
	if (budget_uid_left(b, uid, &limit, &used, &left) && bytes > left)
		return REFUSAL_UID_QUOTA;
	if (bytes > budget_left(b, &limit, &used))
		return REFUSAL_BUDGET;
	return REFUSAL_NONE;
}

/* The entry of uid, created at zero if missing. NULL on -ENOMEM. */
static struct uid_usage *uid_entry(struct budget *b, uid_t uid)
{
	size_t i;
	int found;

	i = uid_search(b, uid, &found);
	if (!found) {
		if (b->nuids == b->cap_uids) {
			size_t cap = b->cap_uids ? b->cap_uids * 2 : 8;
			struct uid_usage *u = realloc(b->uids, cap * sizeof(*u));

			if (!u)
				return NULL;
			b->uids = u;
			b->cap_uids = cap;
		}
		memmove(&b->uids[i + 1], &b->uids[i], (b->nuids - i) * sizeof(b->uids[0]));
		b->uids[i] = (struct uid_usage){ .uid = uid };
		b->nuids++;
	}
	return &b->uids[i];
}

static void uid_drop_if_empty(struct budget *b, size_t i)
{
	if (b->uids[i].leased_bytes == 0 && b->uids[i].leases == 0 && b->uids[i].chunks == 0 &&
	    b->uids[i].held_fds == 0) {
		memmove(&b->uids[i], &b->uids[i + 1], (b->nuids - i - 1) * sizeof(b->uids[0]));
		b->nuids--;
	}
}

int budget_charge(struct budget *b, uid_t uid, uint64_t bytes)
{
	struct uid_usage *u = uid_entry(b, uid);

	if (!u)
		return -ENOMEM;
	BUDGET_INVARIANT(u->leased_bytes <= UINT64_MAX - bytes);
	BUDGET_INVARIANT(b->leased_bytes <= UINT64_MAX - bytes);
	u->leased_bytes += bytes;
	b->leased_bytes += bytes;
	return 0;
}

void budget_uncharge(struct budget *b, uid_t uid, uint64_t bytes)
{
	size_t i;
	int found;

	i = uid_search(b, uid, &found);
	/* Uncharging what was never charged means the daemon's own books are wrong. */
	BUDGET_INVARIANT(found || bytes == 0);
	if (!found)
		return;
	BUDGET_INVARIANT(b->uids[i].leased_bytes - b->uids[i].no_revoke_bytes >= bytes);
	BUDGET_INVARIANT(b->leased_bytes >= bytes);
	b->uids[i].leased_bytes -= bytes;
	b->leased_bytes -= bytes;
	uid_drop_if_empty(b, i);
}

int budget_count_add(struct budget *b, uid_t uid, size_t nchunks)
{
	struct uid_usage *u = uid_entry(b, uid);

	if (!u)
		return -ENOMEM;
	u->leases++;
	u->chunks += nchunks;
	b->leases++;
	b->chunks += nchunks;
	return 0;
}

void budget_count_sub(struct budget *b, uid_t uid, size_t nchunks)
{
	size_t i;
	int found;

	i = uid_search(b, uid, &found);
	BUDGET_INVARIANT(found && b->uids[i].leases >= 1 && b->uids[i].chunks >= nchunks);
	b->uids[i].leases--;
	b->uids[i].chunks -= nchunks;
	b->leases--;
	b->chunks -= nchunks;
	uid_drop_if_empty(b, i);
}

void budget_no_revoke_add(struct budget *b, uid_t uid, uint64_t bytes)
{
	size_t i;
	int found;

	/* Only charged bytes can be never-revoked ones: the uid's entry exists. */
	i = uid_search(b, uid, &found);
	BUDGET_INVARIANT(found && b->uids[i].leased_bytes - b->uids[i].no_revoke_bytes >= bytes);
	b->uids[i].no_revoke_bytes += bytes;
	b->no_revoke_bytes += bytes;
}

void budget_no_revoke_sub(struct budget *b, uid_t uid, uint64_t bytes)
{
	size_t i;
	int found;

	i = uid_search(b, uid, &found);
	BUDGET_INVARIANT(found && b->uids[i].no_revoke_bytes >= bytes && b->no_revoke_bytes >= bytes);
	b->uids[i].no_revoke_bytes -= bytes;
	b->no_revoke_bytes -= bytes;
}

uint64_t budget_uid_no_revoke(const struct budget *b, uid_t uid)
{
	const struct uid_usage *u = uid_find(b, uid);

	return u ? u->no_revoke_bytes : 0;
}

uint64_t budget_no_revoke(const struct budget *b)
{
	return b->no_revoke_bytes;
}

uint64_t budget_limit(const struct budget *b)
{
	return b->limit_bytes;
}

uint64_t budget_uid_quota(const struct budget *b)
{
	return b->uid_quota_bytes;
}

uint64_t budget_leased(const struct budget *b)
{
	return b->leased_bytes;
}

uint64_t budget_uid_leased(const struct budget *b, uid_t uid)
{
	const struct uid_usage *u = uid_find(b, uid);

	return u ? u->leased_bytes : 0;
}

uint64_t budget_pool_allowance(const struct budget *b)
{
	return b->leased_bytes >= b->limit_bytes ? 0 : b->limit_bytes - b->leased_bytes;
}

uint64_t budget_uid_leases(const struct budget *b, uid_t uid)
{
	const struct uid_usage *u = uid_find(b, uid);

	return u ? u->leases : 0;
}

uint64_t budget_uid_chunks(const struct budget *b, uid_t uid)
{
	const struct uid_usage *u = uid_find(b, uid);

	return u ? u->chunks : 0;
}

int budget_fd_add(struct budget *b, uid_t uid)
{
	struct uid_usage *u = uid_entry(b, uid);

	if (!u)
		return -ENOMEM;
	u->held_fds++;
	b->held_fds++;
	return 0;
}

void budget_fd_sub(struct budget *b, uid_t uid)
{
	size_t i;
	int found;

	i = uid_search(b, uid, &found);
	BUDGET_INVARIANT(found && b->uids[i].held_fds > 0 && b->held_fds > 0);
	b->uids[i].held_fds--;
	b->held_fds--;
	uid_drop_if_empty(b, i);
}

uint64_t budget_uid_fds(const struct budget *b, uid_t uid)
{
	const struct uid_usage *u = uid_find(b, uid);

	return u ? u->chunks + u->held_fds : 0;
}

uint64_t budget_fds(const struct budget *b)
{
	return b->chunks + b->held_fds;
}

uint64_t budget_leases(const struct budget *b)
{
	return b->leases;
}

uint64_t budget_chunks(const struct budget *b)
{
	return b->chunks;
}

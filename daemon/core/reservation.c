/* SPDX-License-Identifier: MIT */
/* All-or-nothing reservations: N shares charged at once, taken one share per acquire. */
#include "reservation.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "jobs.h"
#include "util.h"

/* Who may join: the same job (the cgroup's job where it has one, else the cgroup itself). */
static const void *job_of(const struct job_cgroup *cg)
{
	if (!cg)
		return NULL;
	return cg->job ? (const void *)cg->job : (const void *)cg;
}

static struct reservations *table(struct broker *b)
{
	if (!b->reservations)
		b->reservations = calloc(1, sizeof(*b->reservations));
	return b->reservations;
}

static int add_member(struct reservation *r, const void *owner)
{
	const void **m;

	if (reservation_is_member(r, owner))
		return 0;
	if (r->nmembers >= RESERVATION_MEMBERS_MAX)
		return -E2BIG;
	m = realloc(r->members, (r->nmembers + 1) * sizeof(*m));
	if (!m)
		return -ENOMEM;
	m[r->nmembers++] = owner;
	r->members = m;
	return 0;
}

bool reservation_is_member(const struct reservation *r, const void *owner)
{
	for (size_t i = 0; i < r->nmembers; i++)
		if (r->members[i] == owner)
			return true;
	return false;
}

static struct reservation *find_named(const struct broker *b, uid_t uid, const void *job, const char *name)
{
	if (!b->reservations)
		return NULL;
	for (struct reservation *r = b->reservations->head; r; r = r->next)
		if (r->uid == uid && r->job == job && strcmp(r->name, name) == 0)
			return r;
	return NULL;
}

enum broker_refusal broker_reserve(struct broker *b, const struct reserve_args *a, struct reservation **ret,
				   bool *joined, enum reservation_error *rerr, int *err)
{
	const void *job = job_of(a->cgroup);
	struct reservations *t;
	struct reservation *r;
	uint64_t share_bytes, total;
	size_t len = a->name ? strlen(a->name) : 0;
	enum broker_refusal verdict;
	int rc;

	*joined = false;
	*rerr = RESERVATION_OK;
	*err = 0;
	share_bytes = a->share_bytes ? round_up(a->share_bytes, a->page_bytes) : 0;
	if (len == 0 || len >= RESERVATION_NAME_MAX || a->shares == 0 || a->shares > RESERVATION_SHARES_MAX ||
	    share_bytes == 0 || share_bytes > UINT64_MAX / a->shares) {
		*rerr = RESERVATION_INVALID;
		return REFUSAL_INVALID_SIZE;
	}
	total = share_bytes * a->shares;
	r = find_named(b, a->uid, job, a->name);
	if (r) {
		if (r->shares != a->shares || r->share_bytes != share_bytes) {
			*rerr = RESERVATION_MISMATCH;
			*ret = r;
			return REFUSAL_INVALID_SIZE;
		}
		rc = add_member(r, a->owner);
		if (rc < 0) {
			*rerr = rc == -E2BIG ? RESERVATION_TOO_MANY : RESERVATION_OK;
			*err = rc;
			return rc == -E2BIG ? REFUSAL_INVALID_SIZE : REFUSAL_FAILED;
		}
		*joined = true;
		*ret = r;
		return REFUSAL_NONE;
	}

	/* One uid may not fill the host's table and starve every other job's reserve. */
	if (broker_reservations_of_uid(b, a->uid) >= b->settings.max_reservations_per_uid) {
		*rerr = RESERVATION_UID_CAP;
		return REFUSAL_INVALID_SIZE;
	}
	/* All or nothing: the whole group's bytes against every bound at once, as one acquire of total would be. */
	verdict = budget_check(b->budget, a->uid, total);
	if (verdict == REFUSAL_NONE)
		verdict = jobs_check(a->cgroup, total);
	if (verdict != REFUSAL_NONE)
		return verdict;
	if (a->job_unknown && b->jobs && jobs_rule_count(b->jobs) > 0 && b->settings.job_unknown == JOB_UNKNOWN_REFUSE)
		return REFUSAL_JOB_UNKNOWN;
	/* It pins nothing yet, but its shares will: not while the host is critical. */
	if (b->state == BROKER_CRITICAL)
		return REFUSAL_CRITICAL;

	t = table(b);
	if (!t) {
		*err = -ENOMEM;
		return REFUSAL_FAILED;
	}
	if (t->n >= RESERVATIONS_MAX) {
		*rerr = RESERVATION_TOO_MANY;
		return REFUSAL_INVALID_SIZE;
	}
	r = calloc(1, sizeof(*r));
	if (!r || add_member(r, a->owner) < 0 || budget_charge(b->budget, a->uid, total) < 0) {
		if (r)
			free(r->members);
		free(r);
		*err = -ENOMEM;
		return REFUSAL_FAILED;
	}
	if (b->jobs && a->cgroup) {
		r->cgroup = a->cgroup;
		jobs_charge(b->jobs, r->cgroup, total);
	}
	r->id = ++t->next_id;
	r->uid = a->uid;
	r->job = job;
	memcpy(r->name, a->name, len + 1);
	r->shares = a->shares;
	r->share_bytes = share_bytes;
	r->held_bytes = total;
	r->created_ms = a->now_ms;
	r->next = t->head;
	t->head = r;
	t->n++;
	t->held_bytes += total;
	b->generation++;
	*ret = r;
	return REFUSAL_NONE;
}

bool reservation_of_job(const struct reservation *r, const struct job_cgroup *cg)
{
	return r->job == job_of(cg);
}

struct reservation *broker_reservation_find(const struct broker *b, uint64_t id)
{
	if (!b->reservations)
		return NULL;
	for (struct reservation *r = b->reservations->head; r; r = r->next)
		if (r->id == id)
			return r;
	return NULL;
}

enum broker_refusal broker_reservation_check(const struct broker *b, const struct reservation *r, uint64_t bytes)
{
	(void)b;
	if (r->taken >= r->shares)
		return REFUSAL_SHARES_TAKEN;
	if (bytes > r->share_bytes)
		return REFUSAL_OVER_SHARE;
	return REFUSAL_NONE;
}

void broker_reservation_take(struct broker *b, struct reservation *r)
{
	/* The lease was charged just before, in the same call: the share's bytes go from the one to the other. */
	r->taken++;
	r->held_bytes -= r->share_bytes;
	b->reservations->held_bytes -= r->share_bytes;
	budget_uncharge(b->budget, r->uid, r->share_bytes);
	if (b->jobs && r->cgroup)
		jobs_move(b->jobs, r->cgroup, NULL, r->share_bytes);
	b->generation++;
}

uint64_t broker_reservation_end(struct broker *b, struct reservation *r)
{
	struct reservations *t = b->reservations;
	struct reservation **pp;
	uint64_t held = r->held_bytes;

	for (pp = &t->head; *pp && *pp != r; pp = &(*pp)->next)
		;
	if (!*pp)
		abort(); /* only live reservations are ended */
	*pp = r->next;
	t->n--;
	t->held_bytes -= held;
	budget_uncharge(b->budget, r->uid, held);
	if (b->jobs && r->cgroup)
		jobs_uncharge(b->jobs, r->cgroup, held);
	free(r->members);
	free(r);
	b->generation++;
	return held;
}

uint64_t broker_reservations_drop_owner(struct broker *b, const void *owner, size_t *ended)
{
	struct reservation *r, *next;
	uint64_t freed = 0;

	*ended = 0;
	if (!b->reservations || !owner)
		return 0;
	for (r = b->reservations->head; r; r = next) {
		next = r->next;
		for (size_t i = 0; i < r->nmembers; i++)
			if (r->members[i] == owner) {
				r->members[i] = r->members[--r->nmembers];
				break;
			}
		/* Its ranks exited: nobody is left to take the rest. */
		if (r->nmembers == 0) {
			freed += broker_reservation_end(b, r);
			(*ended)++;
		}
	}
	return freed;
}

size_t broker_reservations_of_uid(const struct broker *b, uid_t uid)
{
	size_t n = 0;

	if (!b->reservations)
		return 0;
	for (const struct reservation *r = b->reservations->head; r; r = r->next)
		n += r->uid == uid;
	return n;
}

uint64_t broker_reserved_bytes(const struct broker *b)
{
	return b->reservations ? b->reservations->held_bytes : 0;
}

const struct reservation *reservation_first(const struct broker *b)
{
	return b->reservations ? b->reservations->head : NULL;
}

void reservations_free(struct reservations *t)
{
	struct reservation *r, *next;

	if (!t)
		return;
	for (r = t->head; r; r = next) {
		next = r->next;
		free(r->members);
		free(r);
	}
	free(t);
}

/* SPDX-License-Identifier: MIT */
/* The broker suites' fixture (brokerfix.h): a broker over the pool model, and its books checked. */
#include "brokerfix.h"
#include "reservation.h"

#include <check.h>
#include <stdlib.h>

#include "budget.h"
#include "lease.h"
#include "poolmodel.h"

int conn_a, conn_b, conn_c;

int last_err;

uint64_t idle_bytes(void)
{
	struct pool_model_stats st;

	pool_model_stats(&st);
	return st.idle_bytes;
}

uint64_t resident_bytes(void)
{
	struct pool_model_stats st;

	pool_model_stats(&st);
	return st.resident_bytes;
}

uint64_t tainted_destroyed(void)
{
	struct pool_model_stats st;

	pool_model_stats(&st);
	return st.tainted_destroyed;
}

size_t chunk_count(void)
{
	struct pool_model_stats st;

	pool_model_stats(&st);
	return st.chunks;
}

struct broker *new_broker(uint64_t limit_bytes, uint64_t quota_bytes, uint64_t prewarm_bytes)
{
	struct broker *b = calloc(1, sizeof(*b));

	ck_assert_ptr_nonnull(b);
	ck_assert_int_eq(budget_new(limit_bytes, quota_bytes, &b->budget), 0);
	ck_assert_int_eq(lease_table_new(&b->leases), 0);
	pool_model_reset(2 * MIB, 0);
	pool_model_grow(prewarm_bytes);
	b->budget_bytes = limit_bytes;
	b->uid_quota_bytes = quota_bytes;
	b->max_no_revoke_per_uid_bytes = (quota_bytes ? quota_bytes : limit_bytes) / 2; /* the 50% default */
	b->max_registrants_per_file = 256;                                              /* the default */
	b->settings.max_reservations_per_uid = 16;                                      /* the default */
	(void)broker_set_pressure(b, BROKER_NORMAL);
	return b;
}

void free_broker(struct broker *b)
{
	struct lease *l, *next;

	for (l = lease_first(b->leases); l; l = next) {
		next = lease_next(b->leases, l);
		pool_model_free(b, l);
	}
	while (reservation_first(b))
		broker_reservation_end(b, (struct reservation *)reservation_first(b));
	ck_assert_uint_eq(budget_leased(b->budget), 0);
	reservations_free(b->reservations);
	lease_table_free(b->leases);
	budget_free(b->budget);
	free(b);
}

/* The books balance: per-uid and total charges equal the leases, and locked memory fits the budget. */
void check_books(const struct broker *b)
{
	static const uid_t uids[] = { UID_A, UID_B, UID_C };
	uint64_t per_uid[3] = { 0 }, total = 0, registered = 0;
	const struct lease *l;

	for (l = lease_first(b->leases); l; l = lease_next(b->leases, l)) {
		uint64_t chunk_sum = 0;

		for (size_t i = 0; i < l->nchunks; i++)
			chunk_sum += l->chunks[i].bytes;
		/* A registration is the program's own memory: charged, no chunks. */
		ck_assert_uint_eq(chunk_sum, l->registration ? 0 : l->bytes);
		/* Only a registration of shared memory may carry less than its bytes (backing.h). */
		ck_assert(l->charged_bytes == l->bytes || (l->backed && l->charged_bytes < l->bytes));
		registered += l->registration ? l->charged_bytes : 0;
		total += l->charged_bytes;
		for (int k = 0; k < 3; k++)
			if (l->uid == uids[k])
				per_uid[k] += l->charged_bytes;
	}
	/* A reservation's untaken shares are charged as leased bytes (reservation.h). */
	for (const struct reservation *r = reservation_first(b); r; r = r->next) {
		ck_assert_uint_eq(r->held_bytes, (uint64_t)(r->shares - r->taken) * r->share_bytes);
		total += r->held_bytes;
		for (int k = 0; k < 3; k++)
			if (r->uid == uids[k])
				per_uid[k] += r->held_bytes;
	}
	ck_assert_uint_eq(budget_leased(b->budget), total);
	for (int k = 0; k < 3; k++)
		ck_assert_uint_eq(budget_uid_leased(b->budget, uids[k]), per_uid[k]);
	ck_assert_uint_eq(b->registered_bytes, registered);
	ck_assert_uint_eq(resident_bytes(), total - registered - broker_reserved_bytes(b) + idle_bytes());
	ck_assert_uint_le(budget_leased(b->budget) + idle_bytes(), budget_limit(b->budget));
}

struct acquire_args acquire_args_of(uid_t uid, void *owner, uint64_t size, enum ask kind)
{
	return (struct acquire_args){
		.uid = uid,
		.gid = uid,
		.pid = 1234,
		.owner = owner,
		.size = size,
		.priority = LEASE_PRIO_NORMAL,
		.label = "test",
		.no_revoke = kind == ASK_NO_REVOKE,
		.registration = kind == ASK_REGISTRATION,
		.now_ms = 1000,
	};
}

enum broker_refusal acquire_with(struct broker *b, const struct acquire_args *a, struct lease **ret)
{
	struct lease *l = NULL;
	enum broker_refusal r;

	r = pool_model_acquire(b, a, &l, &last_err);
	if (ret)
		*ret = l;
	return r;
}

enum broker_refusal acquire_kind(struct broker *b, uid_t uid, void *owner, uint64_t size, enum ask kind,
				 struct lease **ret)
{
	struct acquire_args a = acquire_args_of(uid, owner, size, kind);

	return acquire_with(b, &a, ret);
}

void expect_verdicts(struct broker *b, const struct asked *rows, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const struct asked *a = &rows[i];
		enum broker_refusal r = acquire_kind(b, a->uid, a->owner, a->size, a->kind, NULL);

		ck_assert_msg(r == a->want, "acquire %zu (uid %u, %llu bytes, kind %d): verdict %d, wanted %d", i,
			      (unsigned)a->uid, (unsigned long long)a->size, (int)a->kind, (int)r, (int)a->want);
	}
}

/* Release as the holder's RELEASE does, freeing the lease when the broker says so. */
int release(struct broker *b, uint64_t id, uid_t uid, void *owner, bool admin)
{
	struct lease *l;
	int r = broker_release(b, id, uid, owner, admin, &l);

	if (r == 0)
		pool_model_free(b, l);
	return r;
}

/* A connection closes: what nobody maps any more is freed. Returns how many. */
size_t drop_owner(struct broker *b, void *owner)
{
	struct lease *l[64];
	size_t n = broker_drop_owner(b, owner, l, 64);

	ck_assert_uint_le(n, 64);
	for (size_t i = 0; i < n; i++)
		pool_model_free(b, l[i]);
	return n;
}

enum broker_refusal acquire(struct broker *b, uid_t uid, void *owner, uint64_t size, struct lease **ret)
{
	return acquire_kind(b, uid, owner, size, ASK_POOL, ret);
}

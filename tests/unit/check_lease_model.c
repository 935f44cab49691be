/* SPDX-License-Identifier: MIT */
/* Unit tests for the lease table: a model test of long random runs against a plain reference, and shared leases (tokens, uids, mappers). The table's cases one by one: check_lease.c. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lease.h"
#include "check_main.h"

#include "lease_fixture.h"

/*
 * The model test: a long random run of add, adopt (out of order, duplicate,
 * id 0), remove, find (present and absent), next_after and set_state,
 * checked op by op against a plain reference (an array indexed by id plus
 * an unordered list of live ids), with full walks both ways, the cursor
 * chain and the per-state counters compared at checkpoints. LEASE_MODEL_SEED
 * and LEASE_MODEL_OPS override the defaults; every failure prints the seed.
 */
#define MODEL_OPS_DEFAULT 1200000
#define MODEL_LIVE_MAX 100000
#define MODEL_CHECKPOINT_OPS 25000

struct ref_entry {
	struct lease *l; /* NULL: not live */
	uint32_t pos;    /* index in model.live */
	uint32_t pages;
	enum lease_state state;
};

static struct model {
	uint64_t seed, rng, op;
	struct lease_table *t;
	struct ref_entry *ref; /* indexed by id */
	size_t cap;            /* ids < cap are in ref */
	uint64_t *live;        /* live ids, unordered */
	size_t nlive;
	uint64_t last_id; /* the table's: ids from lease_add are last_id + 1 */
	uint64_t max_id;  /* the largest id ever live */
} m;

/* ck_assert_* marks a point on every pass, which is far too slow for millions of checks. */
#define MODEL_CHECK(cond, fmt, ...)                                                              \
	do {                                                                                     \
		if (!(cond))                                                                     \
			ck_abort_msg("seed %llu, op %llu: %s: " fmt, (unsigned long long)m.seed, \
				     (unsigned long long)m.op, #cond, __VA_ARGS__);              \
	} while (0)

/* xorshift64*: deterministic and independent of libc's rand(). */
static uint64_t rnd(void)
{
	m.rng ^= m.rng >> 12;
	m.rng ^= m.rng << 25;
	m.rng ^= m.rng >> 27;
	return m.rng * UINT64_C(2685821657736338717);
}

static uint64_t rnd_below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
	const char *v = getenv(name);

	return v && *v ? strtoull(v, NULL, 0) : dflt;
}

static struct ref_entry *ref_at(uint64_t id)
{
	if (id >= m.cap) {
		size_t ncap = m.cap ? m.cap : 1 << 16;

		while (ncap <= id)
			ncap *= 2;
		m.ref = realloc(m.ref, ncap * sizeof(*m.ref));
		ck_assert_ptr_nonnull(m.ref);
		memset(m.ref + m.cap, 0, (ncap - m.cap) * sizeof(*m.ref));
		m.cap = ncap;
	}
	return &m.ref[id];
}

static bool ref_live(uint64_t id)
{
	return id < m.cap && m.ref[id].l;
}

static void ref_insert(uint64_t id, struct lease *l, uint32_t pages, enum lease_state st)
{
	struct ref_entry *e = ref_at(id);

	*e = (struct ref_entry){ .l = l, .pos = (uint32_t)m.nlive, .pages = pages, .state = st };
	m.live[m.nlive++] = id;
	if (id > m.max_id)
		m.max_id = id;
	if (id > m.last_id)
		m.last_id = id;
}

static void ref_erase(uint64_t id)
{
	struct ref_entry *e = &m.ref[id];
	uint64_t moved = m.live[--m.nlive];

	m.live[e->pos] = moved;
	m.ref[moved].pos = e->pos;
	e->l = NULL;
}

static uint64_t random_live_id(void)
{
	return m.live[rnd_below(m.nlive)];
}

/* An id that is not live: below the last id (a gap, out of order for adopt) or above it. */
static uint64_t random_absent_id(void)
{
	for (;;) {
		uint64_t id = rnd_below(m.last_id + 64) + 1;

		if (!ref_live(id))
			return id;
	}
}

/* The reference's answer to lease_next_after: a scan of the id array. */
static uint64_t ref_next_after(uint64_t id)
{
	for (uint64_t i = id + 1; i <= m.max_id; i++)
		if (ref_live(i))
			return i;
	return 0;
}

static void model_check_lease(uint64_t id, const struct lease *l)
{
	const struct ref_entry *e = &m.ref[id];

	MODEL_CHECK(l == e->l, "id %llu: %p, reference %p", (unsigned long long)id, (const void *)l, (void *)e->l);
	MODEL_CHECK(l->id == id, "id %llu: lease says %llu", (unsigned long long)id, (unsigned long long)l->id);
	MODEL_CHECK(l->state == e->state && l->bytes == (uint64_t)e->pages * 4096, "id %llu: state %d bytes %llu",
		    (unsigned long long)id, l->state, (unsigned long long)l->bytes);
}

static void model_checkpoint(void)
{
	size_t count[LEASE__STATE_MAX] = { 0 }, n = 0;
	uint64_t bytes[LEASE__STATE_MAX] = { 0 }, id;
	const struct lease *l = lease_first(m.t), *c = lease_next_after(m.t, 0), *r;

	/* Forward walk and the cursor chain, both against the ascending reference. */
	for (id = 1; id <= m.max_id; id++) {
		if (!ref_live(id))
			continue;
		MODEL_CHECK(l != NULL, "forward walk ended before id %llu", (unsigned long long)id);
		model_check_lease(id, l);
		MODEL_CHECK(c == l, "cursor chain at id %llu", (unsigned long long)id);
		count[m.ref[id].state]++;
		bytes[m.ref[id].state] += (uint64_t)m.ref[id].pages * 4096;
		n++;
		l = lease_next(m.t, l);
		c = lease_next_after(m.t, id);
	}
	MODEL_CHECK(l == NULL && c == NULL, "walk goes past the last id %llu", (unsigned long long)m.max_id);
	MODEL_CHECK(n == m.nlive && lease_count(m.t) == n, "%zu walked, %zu live, lease_count %zu", n, m.nlive,
		    lease_count(m.t));
	/* Reverse walk against the descending reference. */
	r = lease_last(m.t);
	for (id = m.max_id; id >= 1; id--) {
		if (!ref_live(id))
			continue;
		MODEL_CHECK(r != NULL, "reverse walk ended before id %llu", (unsigned long long)id);
		model_check_lease(id, r);
		r = lease_prev(m.t, r);
	}
	MODEL_CHECK(r == NULL, "reverse walk goes past id 1%s", "");
	for (int s = 0; s < LEASE__STATE_MAX; s++)
		MODEL_CHECK(lease_state_count(m.t, s) == count[s] && lease_state_bytes(m.t, s) == bytes[s],
			    "state %s: %zu leases %llu bytes, reference %zu and %llu", lease_state_name(s),
			    lease_state_count(m.t, s), (unsigned long long)lease_state_bytes(m.t, s), count[s],
			    (unsigned long long)bytes[s]);
	for (size_t i = 0; i < m.nlive; i++)
		MODEL_CHECK(lease_find(m.t, m.live[i]) == m.ref[m.live[i]].l, "find %llu",
			    (unsigned long long)m.live[i]);
}

static void model_add(void)
{
	uint32_t pages = (uint32_t)rnd_below(64) + 1;
	struct lease *l = NULL;
	int r = lease_add(m.t, 1000, 1000, 1, NULL, (uint64_t)pages * 4096, LEASE_PRIO_NORMAL, "model", fake_chunks(1),
			  1, m.op, &l);

	MODEL_CHECK(r == 0, "lease_add: %d", r);
	MODEL_CHECK(l->id == m.last_id + 1, "fresh id %llu, expected %llu", (unsigned long long)l->id,
		    (unsigned long long)m.last_id + 1);
	MODEL_CHECK(l->state == LEASE_ACTIVE, "fresh lease in state %d", l->state);
	ref_insert(l->id, l, pages, LEASE_ACTIVE);
}

static void model_adopt(void)
{
	uint64_t pick = rnd_below(16), id;
	uint32_t pages = (uint32_t)rnd_below(64) + 1;
	struct lease_chunk *chunks = fake_chunks(1);
	struct lease *l = NULL;
	size_t before = lease_count(m.t);
	int r, want = 0;

	if (pick == 0)
		id = 0, want = -EINVAL;
	else if (pick < 5 && m.nlive)
		id = random_live_id(), want = -EEXIST;
	else if (pick < 8)
		id = m.last_id + 1 + rnd_below(32); /* a new highest id */
	else
		id = random_absent_id();
	r = lease_adopt(m.t, id, 1000, (uint64_t)pages * 4096, LEASE_PRIO_NORMAL, NULL, chunks, 1, m.op, &l);
	MODEL_CHECK(r == want, "lease_adopt(%llu): %d, expected %d", (unsigned long long)id, r, want);
	if (r < 0) {
		/* A refused adopt leaves the chunks with the caller and the table as it was. */
		free(chunks);
		MODEL_CHECK(lease_count(m.t) == before, "refused adopt changed the count to %zu", lease_count(m.t));
		if (want == -EEXIST)
			model_check_lease(id, lease_find(m.t, id));
		return;
	}
	MODEL_CHECK(l->id == id && l->state == LEASE_ORPHANED, "adopted %llu in state %d", (unsigned long long)l->id,
		    l->state);
	ref_insert(id, l, pages, LEASE_ORPHANED);
}

static void model_remove(void)
{
	uint64_t id = random_live_id();

	lease_remove(m.t, m.ref[id].l);
	ref_erase(id);
	MODEL_CHECK(lease_find(m.t, id) == NULL, "removed id %llu still found", (unsigned long long)id);
}

static void model_find(void)
{
	uint64_t id, want;
	struct lease *l;

	if (m.nlive && rnd() & 1) {
		id = random_live_id();
		l = lease_find(m.t, id);
		MODEL_CHECK(l != NULL, "live id %llu not found", (unsigned long long)id);
		model_check_lease(id, l);
	} else {
		id = random_absent_id();
		MODEL_CHECK(lease_find(m.t, id) == NULL, "absent id %llu found", (unsigned long long)id);
	}
	/*
	 * A cursor just below a live id, or past the end: the reference scan
	 * stays short, so it can run every time.
	 */
	if (m.nlive && rnd() % 4) {
		uint64_t below = rnd_below(3);

		id = random_live_id();
		id = id > below ? id - below : 0;
	} else {
		id = m.max_id + rnd_below(3);
	}
	l = lease_next_after(m.t, id);
	want = ref_next_after(id);
	MODEL_CHECK(want ? l == m.ref[want].l : l == NULL, "next_after(%llu): %llu, expected %llu",
		    (unsigned long long)id, l ? (unsigned long long)l->id : 0ull, (unsigned long long)want);
}

/* Drawn independently of the implementation: expected_legal is the spec. */
static void model_set_state(void)
{
	uint64_t id = random_live_id();
	struct ref_entry *e = &m.ref[id];
	enum lease_state to = (enum lease_state)rnd_below(LEASE__STATE_MAX);
	bool legal = expected_legal(e->state, to);
	int r = lease_set_state(e->l, to, m.op);

	MODEL_CHECK(r == (legal ? 0 : -EINVAL), "%s -> %s: %d", lease_state_name(e->state), lease_state_name(to), r);
	if (legal)
		e->state = to;
	model_check_lease(id, e->l);
}

START_TEST(test_model_random_ops_match_reference)
{
	uint64_t ops;
	bool growing = true;
	size_t peak = 0;

	memset(&m, 0, sizeof(m));
	m.seed = env_u64("LEASE_MODEL_SEED", 0x1ea5e5eedull);
	m.rng = m.seed ? m.seed : 1;
	ops = env_u64("LEASE_MODEL_OPS", MODEL_OPS_DEFAULT);
	m.t = new_table();
	m.live = malloc(MODEL_LIVE_MAX * sizeof(*m.live));
	ck_assert_ptr_nonnull(m.live);
	for (m.op = 0; m.op < ops; m.op++) {
		/* Grow to the cap, shrink to near empty, and again: the hash grows, chains shorten and lengthen. */
		uint64_t roll = rnd_below(100);

		if (growing && m.nlive >= MODEL_LIVE_MAX - 1)
			growing = false;
		else if (!growing && m.nlive <= rnd_below(100))
			growing = true;
		if (m.nlive > peak)
			peak = m.nlive;
		if (m.nlive == 0 || (m.nlive < MODEL_LIVE_MAX - 1 && roll < (growing ? 45u : 8u)))
			model_add();
		else if (m.nlive < MODEL_LIVE_MAX - 1 && roll < (growing ? 55u : 18u))
			model_adopt();
		else if (roll < (growing ? 65u : 70u))
			model_remove();
		else if (roll < 85)
			model_find();
		else
			model_set_state();
		if (m.op % MODEL_CHECKPOINT_OPS == 0)
			model_checkpoint();
	}
	model_checkpoint();
	/* The run must have reached the sizes the issue asks for, or it proves less than it claims. */
	MODEL_CHECK(ops < MODEL_OPS_DEFAULT || peak >= MODEL_LIVE_MAX - 1, "peak %zu live leases", peak);
	lease_table_free(m.t);
	free(m.live);
	free(m.ref);
}
END_TEST

/* ------------------------------------------------------------------ sharing */

static void token_of(uint8_t tok[LEASE_TOKEN_BYTES], uint8_t seed)
{
	for (size_t i = 0; i < LEASE_TOKEN_BYTES; i++)
		tok[i] = (uint8_t)(seed * 31 + i * 7 + 1);
}

START_TEST(test_share_links_token_and_keeps_first_token_adding_uids)
{
	struct lease_table *t = new_table();
	struct lease *l = add(t, 1000, MIB, LEASE_PRIO_NORMAL, 1), *other = add(t, 1000, MIB, LEASE_PRIO_NORMAL, 1);
	uint8_t tok[LEASE_TOKEN_BYTES], tok2[LEASE_TOKEN_BYTES], off[LEASE_TOKEN_BYTES];
	uid_t u1[] = { 2000, 1000, 2000 }, u2[] = { 3000 };

	token_of(tok, 1);
	token_of(tok2, 2);
	ck_assert_ptr_null(lease_find_token(t, tok));
	ck_assert(!lease_share_allows(l, 1000)); /* not shared: nobody attaches, not even its uid */
	ck_assert_int_eq(lease_share(t, l, tok, u1, 3), 0);
	ck_assert_ptr_eq(lease_find_token(t, tok), l);
	/* The holder's uid and duplicates are not stored. */
	ck_assert_uint_eq(l->share->nuids, 1);
	ck_assert(lease_share_allows(l, 1000));
	ck_assert(lease_share_allows(l, 2000));
	ck_assert(!lease_share_allows(l, 3000));
	/* Again: the first token stays, uids are added. */
	ck_assert_int_eq(lease_share(t, l, tok2, u2, 1), 0);
	ck_assert_ptr_eq(lease_find_token(t, tok), l);
	ck_assert_ptr_null(lease_find_token(t, tok2));
	ck_assert(lease_share_allows(l, 3000));
	/* One bit off is another token. */
	memcpy(off, tok, sizeof(off));
	off[LEASE_TOKEN_BYTES - 1] ^= 1;
	ck_assert_ptr_null(lease_find_token(t, off));
	/* Another lease cannot take a live token. */
	ck_assert_int_eq(lease_share(t, other, tok, NULL, 0), -EEXIST);
	ck_assert_ptr_null(other->share);
	/* Removal unlinks the token: it names nothing after. */
	lease_remove(t, l);
	ck_assert_ptr_null(lease_find_token(t, tok));
	ck_assert_int_eq(lease_share(t, other, tok, NULL, 0), 0);
	ck_assert_ptr_eq(lease_find_token(t, tok), other);
	lease_table_free(t);
}
END_TEST

START_TEST(test_share_past_uid_limit_fails_and_leaves_grant_unchanged)
{
	struct lease_table *t = new_table();
	struct lease *l = add(t, 1, MIB, LEASE_PRIO_NORMAL, 1);
	uid_t uids[LEASE_SHARE_UIDS_MAX + 1];
	uint8_t tok[LEASE_TOKEN_BYTES];

	for (size_t i = 0; i < LEASE_SHARE_UIDS_MAX + 1; i++)
		uids[i] = (uid_t)(100 + i);
	token_of(tok, 3);
	ck_assert_int_eq(lease_share(t, l, tok, uids, LEASE_SHARE_UIDS_MAX + 1), -E2BIG);
	ck_assert_ptr_null(l->share);
	ck_assert_int_eq(lease_share(t, l, tok, uids, LEASE_SHARE_UIDS_MAX - 1), 0);
	ck_assert_int_eq(lease_share(t, l, tok, uids + LEASE_SHARE_UIDS_MAX - 1, 2), -E2BIG);
	ck_assert_uint_eq(l->share->nuids, LEASE_SHARE_UIDS_MAX - 1);
	ck_assert(!lease_share_allows(l, uids[LEASE_SHARE_UIDS_MAX - 1]));
	lease_table_free(t);
}
END_TEST

START_TEST(test_many_tokens_found_across_hash_growth)
{
	struct lease_table *t = new_table();
	struct lease *v[300];
	uint8_t tok[LEASE_TOKEN_BYTES];

	for (int i = 0; i < 300; i++) {
		v[i] = add(t, 1, MIB, LEASE_PRIO_NORMAL, 1);
		memset(tok, 0, sizeof(tok));
		memcpy(tok, &i, sizeof(i));
		tok[8] = 0xee;
		ck_assert_int_eq(lease_share(t, v[i], tok, NULL, 0), 0);
	}
	for (int i = 0; i < 300; i += 2)
		lease_remove(t, v[i]);
	for (int i = 0; i < 300; i++) {
		memset(tok, 0, sizeof(tok));
		memcpy(tok, &i, sizeof(i));
		tok[8] = 0xee;
		ck_assert_ptr_eq(lease_find_token(t, tok), i % 2 ? v[i] : NULL);
	}
	lease_table_free(t);
}
END_TEST

START_TEST(test_attach_detach_and_unmapped_follow_every_mapper)
{
	struct lease_table *t = new_table();
	struct lease *l = add(t, 1, MIB, LEASE_PRIO_NORMAL, 1);
	int a, b;

	/* add() makes the table pointer the holder. */
	ck_assert_int_eq(lease_attach(l, t, 5, 1), -EEXIST);
	ck_assert_int_eq(lease_attach(l, &a, 10, 1), 0);
	ck_assert_int_eq(lease_attach(l, &a, 10, 1), -EEXIST);
	ck_assert_int_eq(lease_attach(l, &b, 11, 2), 0);
	ck_assert_uint_eq(l->nattachers, 2);
	ck_assert_int_eq(lease_attacher_find(l, &b)->pid, 11);
	ck_assert(!lease_unmapped(l));
	/* The holder goes first: the lease lives on for its attachers. */
	ck_assert_int_eq(lease_detach(l, t), 0);
	ck_assert_ptr_null(l->owner);
	ck_assert(l->holder_detached);
	ck_assert(!lease_unmapped(l));
	ck_assert_int_eq(lease_detach(l, t), -ENOENT);
	ck_assert_int_eq(lease_detach(l, &a), 0);
	ck_assert_ptr_null(lease_attacher_find(l, &a));
	ck_assert_int_eq(lease_attacher_find(l, &b)->pid, 11);
	ck_assert(!lease_unmapped(l));
	/* An exit hold (a mapper whose connection closed while it runs) keeps it too. */
	l->exit_holds = 1;
	ck_assert_int_eq(lease_detach(l, &b), 0);
	ck_assert(!lease_unmapped(l));
	l->exit_holds = 0;
	ck_assert(lease_unmapped(l));
	lease_table_free(t);
}
END_TEST

static Suite *lease_model_suite(void)
{
	Suite *s = suite_create("lease_model");

	/* 1.7 s in a release build, 6 s under ASan: the timeout leaves room for a loaded 2-core box. */
	CHECK_CASE(s, "model", NULL, NULL, 120, test_model_random_ops_match_reference);
	CHECK_CASE(s, "sharing", NULL, NULL, 30, test_share_links_token_and_keeps_first_token_adding_uids,
		   test_share_past_uid_limit_fails_and_leaves_grant_unchanged,
		   test_many_tokens_found_across_hash_growth, test_attach_detach_and_unmapped_follow_every_mapper);
	return s;
}

CHECK_MAIN(lease_model_suite)

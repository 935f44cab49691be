/* SPDX-License-Identifier: MIT */
/* Unit tests for the wait queue's order (waitq-order): priority classes, FIFO within one, who may overtake on a grant walk, and the timeout's quota verdict. */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "lease.h"
#include "waitq-order.h"
#include "check_main.h"

/* A waiting acquire in a simulated host: its size and uid. */
struct wait {
	struct waitq_entry e; /* first, as in waitq.c's pending */
	int id;
	uint64_t size;
	int uid;
	bool granted;
};

/* The host: free bytes, and each uid's quota left. */
struct host {
	struct waitq_entry **head;
	uint64_t free;
	uint64_t quota_left[4];
	int order[16]; /* ids granted, in order */
	int ngranted;
	int tried;
};

static void queue(struct waitq_entry **head, struct wait *w, int id, enum lease_priority p, uint64_t size, int uid)
{
	*w = (struct wait){ .e.priority = p, .id = id, .size = size, .uid = uid };
	waitq_order_insert(head, &w->e);
}

static void assert_order(struct waitq_entry *head, const int *ids, int n)
{
	int i = 0;

	for (struct waitq_entry *e = head; e; e = e->next, i++) {
		ck_assert_int_lt(i, n);
		ck_assert_int_eq(((struct wait *)e)->id, ids[i]);
	}
	ck_assert_int_eq(i, n);
}

/* broker_acquire as the walk meets it: the uid's quota first, then the host's room. */
static enum waitq_verdict try_acquire(struct waitq_entry *e, void *ud)
{
	struct host *h = ud;
	struct wait *w = (struct wait *)e;
	enum broker_refusal r = REFUSAL_NONE;

	h->tried++;
	if (w->size > h->quota_left[w->uid])
		r = REFUSAL_UID_QUOTA;
	else if (w->size > h->free)
		r = REFUSAL_BUDGET;
	if (waitq_order_verdict(r) != WAITQ_ANSWERED)
		return waitq_order_verdict(r);
	h->free -= w->size;
	h->quota_left[w->uid] -= w->size;
	w->granted = true;
	h->order[h->ngranted++] = w->id;
	ck_assert(waitq_order_remove(h->head, e));
	return WAITQ_ANSWERED;
}

START_TEST(test_priority_classes_in_order_fifo_within_one)
{
	struct waitq_entry *head = NULL;
	struct wait w[6];
	static const int want[] = { 2, 5, 1, 4, 6, 3 };

	queue(&head, &w[0], 1, LEASE_PRIO_NORMAL, 1, 0);
	queue(&head, &w[1], 2, LEASE_PRIO_CRITICAL, 1, 0);
	queue(&head, &w[2], 3, LEASE_PRIO_BEST_EFFORT, 1, 0);
	queue(&head, &w[3], 4, LEASE_PRIO_NORMAL, 1, 0);
	queue(&head, &w[4], 5, LEASE_PRIO_CRITICAL, 1, 0);
	queue(&head, &w[5], 6, LEASE_PRIO_NORMAL, 1, 0);
	assert_order(head, want, 6);
	ck_assert_int_lt(waitq_order_rank(LEASE_PRIO_CRITICAL), waitq_order_rank(LEASE_PRIO_NORMAL));
	ck_assert_int_lt(waitq_order_rank(LEASE_PRIO_NORMAL), waitq_order_rank(LEASE_PRIO_BEST_EFFORT));
}
END_TEST

START_TEST(test_remove_head_middle_tail_and_stranger)
{
	struct waitq_entry *head = NULL;
	struct wait w[4], stranger;
	static const int after_middle[] = { 1, 3, 4 }, after_ends[] = { 3 };

	for (int i = 0; i < 4; i++)
		queue(&head, &w[i], i + 1, LEASE_PRIO_NORMAL, 1, 0);
	stranger = (struct wait){ .id = 99 };
	ck_assert(waitq_order_remove(&head, &w[1].e));
	assert_order(head, after_middle, 3);
	ck_assert(waitq_order_remove(&head, &w[0].e));
	ck_assert(waitq_order_remove(&head, &w[3].e));
	assert_order(head, after_ends, 1);
	ck_assert(!waitq_order_remove(&head, &stranger.e));
	ck_assert(!waitq_order_remove(&head, &w[1].e));
	assert_order(head, after_ends, 1);
}
END_TEST

START_TEST(test_verdicts_of_broker_acquire_results)
{
	ck_assert_int_eq(waitq_order_verdict(REFUSAL_NONE), WAITQ_ANSWERED);
	/* The uid's or the job's own limits: only its own releases help, others go ahead. */
	ck_assert_int_eq(waitq_order_verdict(REFUSAL_UID_QUOTA), WAITQ_SKIP);
	ck_assert_int_eq(waitq_order_verdict(REFUSAL_JOB_QUOTA), WAITQ_SKIP);
	/* The host's limits: nobody behind may overtake. */
	ck_assert_int_eq(waitq_order_verdict(REFUSAL_BUDGET), WAITQ_STOP);
	ck_assert_int_eq(waitq_order_verdict(REFUSAL_TIGHT), WAITQ_STOP);
	ck_assert_int_eq(waitq_order_verdict(REFUSAL_TIGHT_NO_REVOKE), WAITQ_STOP);
	/* Anything else is answered (refused) rather than kept waiting forever: a kernel failure too (huge pages
	 * that ran out with hugetlb = yes are no budget the walk could wait for). */
	ck_assert_int_eq(waitq_order_verdict(REFUSAL_FAILED), WAITQ_ANSWERED);
	ck_assert_int_eq(waitq_order_verdict(REFUSAL_INVALID_SIZE), WAITQ_ANSWERED);
	ck_assert_int_eq(waitq_order_verdict(REFUSAL_JOB_UNKNOWN), WAITQ_ANSWERED);
	ck_assert_int_eq(waitq_order_verdict(REFUSAL_CRITICAL), WAITQ_ANSWERED);
}
END_TEST

START_TEST(test_a_small_acquire_never_overtakes_a_big_one_the_host_cannot_fit)
{
	struct waitq_entry *head = NULL;
	struct wait big, small, crit;
	struct host h = { .head = &head, .free = 5, .quota_left = { 100, 100 } };
	static const int rest[] = { 1, 2 };

	queue(&head, &big, 1, LEASE_PRIO_NORMAL, 10, 0);
	queue(&head, &small, 2, LEASE_PRIO_NORMAL, 1, 1);
	waitq_order_walk(&head, try_acquire, &h);
	ck_assert_int_eq(h.ngranted, 0);
	ck_assert_int_eq(h.tried, 1);
	assert_order(head, rest, 2);
	/* A critical one queued later goes first, and fits. */
	queue(&head, &crit, 3, LEASE_PRIO_CRITICAL, 4, 1);
	waitq_order_walk(&head, try_acquire, &h);
	ck_assert_int_eq(h.ngranted, 1);
	ck_assert_int_eq(h.order[0], 3);
	/* Memory came back: the big one first, then the small one. */
	h.free = 11;
	waitq_order_walk(&head, try_acquire, &h);
	ck_assert_int_eq(h.ngranted, 3);
	ck_assert_int_eq(h.order[1], 1);
	ck_assert_int_eq(h.order[2], 2);
	ck_assert_ptr_null(head);
}
END_TEST

START_TEST(test_an_acquire_over_its_own_quota_lets_others_pass)
{
	struct waitq_entry *head = NULL;
	struct wait over, a, b;
	struct host h = { .head = &head, .free = 100, .quota_left = { 2, 100 } };
	static const int rest[] = { 1 };

	queue(&head, &over, 1, LEASE_PRIO_CRITICAL, 8, 0);
	queue(&head, &a, 2, LEASE_PRIO_NORMAL, 8, 1);
	queue(&head, &b, 3, LEASE_PRIO_BEST_EFFORT, 8, 1);
	waitq_order_walk(&head, try_acquire, &h);
	ck_assert_int_eq(h.ngranted, 2);
	ck_assert_int_eq(h.order[0], 2);
	ck_assert_int_eq(h.order[1], 3);
	/* It keeps its place at the head until its own uid frees memory. */
	assert_order(head, rest, 1);
	h.quota_left[0] = 8;
	waitq_order_walk(&head, try_acquire, &h);
	ck_assert_int_eq(h.order[2], 1);
	ck_assert_ptr_null(head);
}
END_TEST

START_TEST(test_fifo_within_a_class_when_only_one_fits)
{
	struct waitq_entry *head = NULL;
	struct wait w[3];
	struct host h = { .head = &head, .free = 4, .quota_left = { 100, 100 } };

	for (int i = 0; i < 3; i++)
		queue(&head, &w[i], i + 1, LEASE_PRIO_NORMAL, 4, i % 2);
	waitq_order_walk(&head, try_acquire, &h);
	ck_assert_int_eq(h.ngranted, 1);
	ck_assert_int_eq(h.order[0], 1);
	h.free = 4;
	waitq_order_walk(&head, try_acquire, &h);
	ck_assert_int_eq(h.order[1], 2);
}
END_TEST

/* waitq_order_over_quota(size, held, quota) and its verdict, a row a case. */
static const struct {
	uint64_t size, held, quota;
	bool over;
} over_quota_rows[] = {
	/* Nothing held, asking the whole quota: not over. */
	{ 10, 0, 10, false },
	{ 4, 6, 10, false },
	/* One byte past: over. */
	{ 5, 6, 10, true },
	{ 11, 0, 10, true },
	/* Asking more than the quota must not wrap quota - size round. */
	{ UINT64_MAX, 0, 10, true },
};

START_TEST(test_timeout_verdict_over_quota)
{
	for (size_t i = 0; i < sizeof(over_quota_rows) / sizeof(over_quota_rows[0]); i++)
		ck_assert_msg(waitq_order_over_quota(over_quota_rows[i].size, over_quota_rows[i].held,
						     over_quota_rows[i].quota) == over_quota_rows[i].over,
			      "row %zu", i);
}
END_TEST

CHECK_SUITE(waitq_suite, "waitq", "order", NULL, NULL, 30, test_priority_classes_in_order_fifo_within_one,
	    test_remove_head_middle_tail_and_stranger, test_verdicts_of_broker_acquire_results,
	    test_a_small_acquire_never_overtakes_a_big_one_the_host_cannot_fit,
	    test_an_acquire_over_its_own_quota_lets_others_pass, test_fifo_within_a_class_when_only_one_fits,
	    test_timeout_verdict_over_quota)

CHECK_MAIN(waitq_suite)

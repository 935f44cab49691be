/* SPDX-License-Identifier: MIT */
/* The lease-table suites' helpers (check_lease.c, check_lease_model.c): a table, and leases added to it. */
#pragma once

#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lease.h"
#include "check_main.h"

#define MIB (1024ull * 1024)

static inline struct lease_table *new_table(void)
{
	struct lease_table *t = NULL;

	ck_assert_int_eq(lease_table_new(&t), 0);
	ck_assert_ptr_nonnull(t);
	return t;
}

/* A chunks array as the pool would hand over; the table frees it. */
static inline struct lease_chunk *fake_chunks(size_t n)
{
	struct lease_chunk *v = calloc(n ? n : 1, sizeof(*v));

	ck_assert_ptr_nonnull(v);
	return v;
}

static inline struct lease *add(struct lease_table *t, uid_t uid, uint64_t bytes, enum lease_priority prio,
				uint64_t now_ms)
{
	struct lease *l = NULL;

	ck_assert_int_eq(lease_add(t, uid, uid, 100, (void *)t, bytes, prio, "test", fake_chunks(1), 1, now_ms, &l), 0);
	ck_assert_ptr_nonnull(l);
	return l;
}

/* The spec's edges, written independently of the implementation's table. */
static inline bool expected_legal(enum lease_state from, enum lease_state to)
{
	if (from == to)
		return false;
	if (to == LEASE_FREED)
		return from != LEASE_FREED;
	switch (from) {
	case LEASE_ACTIVE:
		return to == LEASE_IDLE || to == LEASE_REVOKING;
	case LEASE_IDLE:
		return to == LEASE_ACTIVE || to == LEASE_REVOKING;
	case LEASE_REVOKING:
		return to == LEASE_OVERDUE;
	case LEASE_ORPHANED:
		return to == LEASE_ACTIVE || to == LEASE_IDLE;
	default:
		return false;
	}
}

/* SPDX-License-Identifier: MIT */
/* The broker's verbs that reach memory, carried out: the core decides (core/broker.h), the pool acts. */
#pragma once

#include <stdint.h>

#include "broker.h"

/*
 * An acquire, decided by broker_acquire and carried out on the pool: returns REFUSAL_NONE and *ret, a refusal
 * (nothing changed), or REFUSAL_FAILED with *err the negative errno of what failed (memfd_create, ftruncate,
 * fallocate, mmap, mlock, or an allocation; huge pages that ran out with hugetlb = yes are -ENOSPC here).
 */
enum broker_refusal daemon_acquire(struct broker *b, const struct acquire_args *a, struct lease **ret, int *err);

/* End lease l, whatever its state: its chunks back to the pool (retired unless broker_lease_reusable), uncharged. */
void daemon_free_lease(struct broker *b, struct lease *l);

/* Bring the idle pool toward target_idle_bytes, bounded by the budget (broker_trim_pool decides). */
void daemon_trim_pool(struct broker *b, uint64_t target_idle_bytes);

/* broker_unbrokered_cap with the pool's resident bytes now. */
uint64_t daemon_unbrokered_cap(const struct broker *b);

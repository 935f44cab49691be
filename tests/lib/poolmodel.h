/* SPDX-License-Identifier: MIT */
/* A pool without memory for the core's suites: carries out the broker's plans on chunk records, as the pool's rules say. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "broker.h"

/*
 * What daemon/pool/pool.c does with chunks, on records: a take reuses idle chunks of the tenant's own (then
 * never-lent ones) and makes fresh ones that replace an idle chunk of another tenant; a put destroys tails,
 * tainted and retired chunks; a shrink destroys chunks last lent to someone before never-lent ones. No fd,
 * no mapping, no thread: the broker's decisions are checked against it, the pool's own suite checks the pool.
 */
struct pool_model_stats {
	uint64_t idle_bytes, resident_bytes;
	size_t chunks;
	uint64_t tainted_destroyed; /* chunks */
	uint64_t replaced_bytes;    /* idle chunks of another tenant of the same uid, replaced by fresh ones */
	uint64_t retired_bytes;     /* chunks destroyed on return: their lease ended without a release */
};

/* Start over: no chunk, classes chunk_bytes * 2^k up to max_bytes (0: one class). */
void pool_model_reset(uint64_t chunk_bytes, uint64_t max_bytes);
/* Add never-lent idle chunks of the smallest class until bytes are idle. */
void pool_model_grow(uint64_t bytes);
/* The next take fails with err (a negative errno), nothing taken, as a failed memfd_create would. */
void pool_model_fail_next(int err);
void pool_model_stats(struct pool_model_stats *ret);
/* What the core reads of the model (pool_view), as the shell fills it before a decision. */
void pool_model_view(struct pool_view *v);

/* daemon_acquire on the model: broker_acquire, the plan carried out, broker_acquire_done. */
enum broker_refusal pool_model_acquire(struct broker *b, const struct acquire_args *a, struct lease **ret, int *err);
/* daemon_free_lease on the model. */
void pool_model_free(struct broker *b, struct lease *l);
/* daemon_trim_pool on the model. */
void pool_model_trim(struct broker *b, uint64_t target_idle_bytes);

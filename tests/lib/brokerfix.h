/* SPDX-License-Identifier: MIT */
/* The broker suites' fixture: a broker over the pool model (poolmodel.h), acquires and frees as the shell makes them. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "broker.h"

#define KIB 1024ull
#define MIB (1024ull * KIB)
#define UID_A 1000
#define UID_B 1001
#define UID_C 1002

/* Stand-ins for connections: only their addresses matter. */
extern int conn_a, conn_b, conn_c;
/* The errno beside the last REFUSAL_FAILED. */
extern int last_err;

/* The pool model's figures. */
uint64_t idle_bytes(void);
uint64_t resident_bytes(void);
uint64_t tainted_destroyed(void);
size_t chunk_count(void);

/* A broker of limit_bytes (uid quota quota_bytes, 0: the budget) over a pool model warmed to prewarm_bytes. */
struct broker *new_broker(uint64_t limit_bytes, uint64_t quota_bytes, uint64_t prewarm_bytes);
/* Free every lease left (the books must come back to 0), then the broker. */
void free_broker(struct broker *b);
/* The books balance: per-uid and total charges equal the leases, and locked memory fits the budget. */
void check_books(const struct broker *b);

/* What kind of lease acquire_kind asks for. */
enum ask { ASK_POOL, ASK_NO_REVOKE, ASK_REGISTRATION };
/* The arguments acquire_kind asks with (label "test", pid 1234, at 1000 ms), for a test to change some of. */
struct acquire_args acquire_args_of(uid_t uid, void *owner, uint64_t size, enum ask kind);
/* An acquire of a, carried out on the pool model; *ret (if set) gets the lease or NULL. */
enum broker_refusal acquire_with(struct broker *b, const struct acquire_args *a, struct lease **ret);
/* An acquire of size bytes, carried out on the pool model; *ret (if set) gets the lease or NULL. */
enum broker_refusal acquire_kind(struct broker *b, uid_t uid, void *owner, uint64_t size, enum ask kind,
				 struct lease **ret);
enum broker_refusal acquire(struct broker *b, uid_t uid, void *owner, uint64_t size, struct lease **ret);
/* One acquire and the verdict it must get: who asks (uid, connection), how many bytes, of what kind. */
struct asked {
	uid_t uid;
	void *owner;
	uint64_t size;
	enum ask kind;
	enum broker_refusal want;
};
/* Makes the n acquires of rows in order, each of which must get its verdict (the message names its row). */
void expect_verdicts(struct broker *b, const struct asked *rows, size_t n);
#define EXPECT_VERDICTS(b, ...)                                   \
	expect_verdicts(b, (const struct asked[]){ __VA_ARGS__ }, \
			sizeof((const struct asked[]){ __VA_ARGS__ }) / sizeof(struct asked))
/* Release as the holder's RELEASE does, freeing the lease when the broker says so. */
int release(struct broker *b, uint64_t id, uid_t uid, void *owner, bool admin);
/* A connection closes: what nobody maps any more is freed. Returns how many. */
size_t drop_owner(struct broker *b, void *owner);

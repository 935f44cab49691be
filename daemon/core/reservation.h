/* SPDX-License-Identifier: MIT */
/*
 * All-or-nothing reservations for a group of ranks: N shares of B bytes charged at once to the budget, the uid and
 * the job, then taken one share per acquire as ordinary leases. Pure: no I/O.
 *
 * Books: a reservation's untaken shares (held_bytes) are charged like leased bytes (budget_charge, and one job
 * charge holding a reference to the creator's cgroup); taking a share charges the lease as any acquire does and
 * uncharges one share from the reservation in the same call, so the budget never counts a byte twice nor lets one
 * go in between. A share taken smaller than B gives the rest back to the budget.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "broker.h"

/* Names are what ranks agree on (a job's model or pool name): short, printable. */
#define RESERVATION_NAME_MAX 64
/* Ranks of one host: a few per GPU at most. */
#define RESERVATION_SHARES_MAX 1024
/* Connections joined to one reservation: a rank may reconnect, a few times each. */
#define RESERVATION_MEMBERS_MAX 4096
/* Reservations alive at once, host-wide: each is a few hundred bytes and a status row. */
#define RESERVATIONS_MAX 1024

struct job_cgroup;

struct reservation {
	uint64_t id;
	uid_t uid;
	struct job_cgroup *cgroup; /* the creator's: charged with held_bytes (a reference); NULL: no job */
	const void *job;           /* the job it belongs to (cgroup's job, else cgroup): who may join */
	char name[RESERVATION_NAME_MAX];
	uint32_t shares;      /* N */
	uint64_t share_bytes; /* B, rounded up to the pool's page size */
	uint32_t taken;       /* shares acquired so far (at most shares) */
	uint64_t held_bytes;  /* (shares - taken) * share_bytes: still charged to the reservation */
	uint64_t created_ms;  /* monotonic */
	const void **members; /* the connections that reserved or joined it */
	size_t nmembers;
	struct reservation *next;
};

struct reservations {
	struct reservation *head; /* newest first */
	size_t n;
	uint64_t next_id;
	uint64_t held_bytes; /* every reservation's held_bytes */
};

/* What a reserve asks. */
struct reserve_args {
	uid_t uid;
	const void *owner;         /* the connection */
	struct job_cgroup *cgroup; /* its cgroup; NULL: none */
	bool job_unknown;          /* as acquire_args' */
	const char *name;          /* checked printable by the caller */
	uint32_t shares;
	uint64_t share_bytes; /* as asked; rounded up to page_bytes here */
	uint64_t page_bytes;
	uint64_t now_ms;
};

/* Why a reserve or a take from a reservation fails, besides the acquire refusals of broker.h. */
enum reservation_error {
	RESERVATION_OK,
	RESERVATION_MISMATCH, /* a reservation of that name exists with other shares or share bytes */
	RESERVATION_INVALID,  /* shares 0 or over RESERVATION_SHARES_MAX, bytes 0, name empty or too long */
	RESERVATION_TOO_MANY, /* RESERVATIONS_MAX alive, or RESERVATION_MEMBERS_MAX joined */
	RESERVATION_UID_CAP,  /* the uid holds max-reservations-per-uid alive (settings) */
};

/*
 * Reserve or join: the first call for (uid, job, name) charges shares x share_bytes to the budget, the uid's quota
 * and the job's at once or refuses (the acquire refusals: REFUSAL_INVALID_SIZE, REFUSAL_TOO_LARGE,
 * REFUSAL_UID_QUOTA, REFUSAL_JOB_QUOTA, REFUSAL_JOB_UNKNOWN, REFUSAL_BUDGET, REFUSAL_CRITICAL, or REFUSAL_FAILED
 * with *err -ENOMEM), nothing charged then; later calls with the same shares and bytes join it (*joined), with
 * others get *rerr RESERVATION_MISMATCH. A new one is refused with *rerr RESERVATION_UID_CAP while the uid (admins
 * too) holds settings.max_reservations_per_uid, before any memory bound is looked at: waiting would not help.
 * Returns REFUSAL_NONE and *ret, or the refusal; *rerr says RESERVATION_OK unless the refusal is one of enum
 * reservation_error (returned as REFUSAL_INVALID_SIZE then).
 */
enum broker_refusal broker_reserve(struct broker *b, const struct reserve_args *a, struct reservation **ret,
				   bool *joined, enum reservation_error *rerr, int *err);

/* Does cg (a client's cgroup; NULL: none) belong to r's job? The uid alone is no tenant: pods share uids. */
bool reservation_of_job(const struct reservation *r, const struct job_cgroup *cg);
/* The reservation of id, or NULL. */
struct reservation *broker_reservation_find(const struct broker *b, uint64_t id);
/* Whether owner reserved or joined r. */
bool reservation_is_member(const struct reservation *r, const void *owner);

/*
 * End r: its held bytes go back to the budget, the uid and the job; leases taken from it live on as ordinary ones.
 * Returns the bytes given back.
 */
uint64_t broker_reservation_end(struct broker *b, struct reservation *r);

/*
 * A connection closed: it leaves every reservation it joined; those it was the last member of end. Returns the
 * bytes given back (the caller raises the freed-memory event when more than 0).
 */
uint64_t broker_reservations_drop_owner(struct broker *b, const void *owner, size_t *ended);

/* Reservations uid holds alive (joins of another uid's not counted). */
size_t broker_reservations_of_uid(const struct broker *b, uid_t uid);

/* Bytes reserved and not taken, host-wide. */
uint64_t broker_reserved_bytes(const struct broker *b);

/* Free the table and every reservation in it, uncharging nothing (the daemon stops). */
void reservations_free(struct reservations *t);

/* The first reservation (newest first) and the next; NULL past the last. */
const struct reservation *reservation_first(const struct broker *b);

/*
 * May a lease of bytes (rounded) be taken from r? REFUSAL_NONE, REFUSAL_SHARES_TAKEN (every share is taken) or
 * REFUSAL_OVER_SHARE (bytes is more than a share).
 */
enum broker_refusal broker_reservation_check(const struct broker *b, const struct reservation *r, uint64_t bytes);

/* A lease was just charged for one share of r (broker_acquire_done): uncharge that share from r. */
void broker_reservation_take(struct broker *b, struct reservation *r);

/* SPDX-License-Identifier: MIT */
/* The core's one verdict type: why an acquire is not granted. */
#pragma once

/*
 * Why an acquire is not granted: the core's verdict, carried as this one type to the wire, where reply.c maps it
 * to a status (reply_refusal) and renders its message. REFUSAL_FAILED is no verdict: the daemon failed to make
 * the memory, and the errno that goes beside it (memfd_create, ftruncate, fallocate, mmap, mlock, or an
 * allocation of the daemon's own) says why.
 */
enum broker_refusal {
	REFUSAL_NONE,            /* granted */
	REFUSAL_INVALID_SIZE,    /* size 0, or it rounds past 2^64 */
	REFUSAL_TOO_LARGE,       /* more than the budget or the uid quota can ever lend */
	REFUSAL_UID_QUOTA,       /* the uid is at its quota */
	REFUSAL_JOB_QUOTA,       /* the client's job is at its quota (jobs.h) */
	REFUSAL_JOB_UNKNOWN,     /* its job could not be read while quota rules exist, and job-unknown is refuse */
	REFUSAL_BUDGET,          /* the budget is spent now */
	REFUSAL_TIGHT,           /* tight: beyond the free warm pool */
	REFUSAL_TIGHT_NO_REVOKE, /* tight: a never-revoked lease or a registration, whatever its size */
	REFUSAL_CRITICAL,        /* critical: nothing new is pinned */
	REFUSAL_UID_LEASES,      /* the uid is at max-leases-per-uid */
	REFUSAL_UID_CHUNKS,      /* the uid is at max-chunks-per-uid */
	REFUSAL_CAPACITY,        /* the daemon is at its chunk capacity: fds or mappings */
	REFUSAL_UID_NO_REVOKE,   /* a never-revoked lease past the uid's max-no-revoke-per-uid */
	REFUSAL_SHARES_TAKEN,    /* every share of the reservation it names is taken (reservation.h) */
	REFUSAL_OVER_SHARE,      /* more than one share of the reservation it names */
	REFUSAL_TIMEOUT,         /* a waiting acquire's timeout passed (the wait queue's verdict) */
	REFUSAL_FAILED,          /* no verdict: making the memory failed, with an errno beside it */
	REFUSAL_N,
};

/* SPDX-License-Identifier: MIT */
/*
 * What recovery's files share: the recovery state struct, and the writer's verbs that adopt/quarantine (recovery.c)
 * calls.
 */
#pragma once

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "recovery-format.h"

struct broker;
struct chunk;

/*
 * The pids that hold lease id until they exit, at most max in out; returns how many. The writer
 * asks through this hook (recovery_init sets it to the revoker's), so the writer, which reply.c
 * calls for every lease sent, never calls into the revoker, which calls reply.c.
 */
typedef size_t recovery_hold_pids_fn(const struct broker *b, uint64_t id, pid_t *out, size_t max);

struct recovery {
	struct broker *b;
	uint64_t instance_id;
	int state_fd;   /* -1 without an fd store */
	bool committed; /* a readable snapshot is in state_fd */
	int slot;       /* its descriptor slot */
	uint64_t seq;
	uint64_t body_off; /* [body_off, journal_end) is in use */
	uint64_t body_len;
	uint64_t journal_end;
	uint64_t journal_bytes;
	uint64_t max_lent_id;
	uint64_t written_generation;
	uint64_t snapshot_us;          /* when the last snapshot was committed */
	uint64_t snapshot_cost_us;     /* how long it took */
	struct recovery_buf body, rec; /* formatting buffers, reused */
	recovery_hold_pids_fn *hold_pids;
	struct chunk **quarantine; /* adopted chunks nobody may be lent: counted as lent, held here */
	size_t nquarantine;
	ev_prepare prepare;
	ev_timer snapshot_timer;
	ev_timer grace;
	uint64_t grace_from_ms; /* now_ms() when the grace began, at the loop's first turn; 0 before */
	bool adopted_state;     /* recovery_init read a committed state from the fd store */
	bool lost_lease;        /* a lease line of it could not be re-adopted: its chunks may be outside the store */
};

/* The name a chunk's fd is stored under in the fd store ("c<id>"). */
void recovery_chunk_name(uint64_t id, char *buf, size_t len);

/*
 * Write a full snapshot of the lease table and the idle pool and commit it (the other descriptor
 * slot). Returns 0, -ENOMEM or the write's -errno; the last committed snapshot stays valid.
 */
int recovery_commit_snapshot(struct recovery *rc);
/* Make the state unreadable: recovery then quarantines every chunk rather than trust stale lines. */
void recovery_poison(struct recovery *rc);
/* Store every chunk the pool makes in the fd store, and drop it from there when destroyed. */
void recovery_store_chunks(struct recovery *rc);
/* Rewrite the snapshot from the loop (prepare watcher), spaced to a tenth of the loop's time. */
void recovery_writer_start(struct recovery *rc);
void recovery_writer_stop(struct recovery *rc);

/* SPDX-License-Identifier: MIT */
/*
 * The recovery state's format: encoding, decoding and validating its descriptors, lease and idle lines and journal
 * records; no I/O.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lease.h"

/*
 * The state memfd (stored as "state"):
 *
 *   [0, 128)    descriptor slot 0      [128, 256)  descriptor slot 1
 *   [256, ...)  snapshot bodies, each followed by its journal
 *
 * A snapshot is the text of every lease and idle chunk. It is written into a
 * region that does not overlap the committed one, then committed by writing a
 * descriptor (sequence number, where the body is, its checksum) into the other
 * slot, so a crash at any point leaves the last committed snapshot readable.
 * Between snapshots every lease whose fds are about to leave is appended as a
 * checksummed journal record (recovery_lent). Recovery reads the descriptor
 * with the highest sequence number, its body and its valid records.
 *
 * The one property everything rests on: whatever chunk fd has left the daemon
 * is recorded as lent in the committed snapshot or a record after it. Later
 * changes (releases) may be missing after a crash; that only makes recovery
 * treat idle memory as held, never the other way round.
 */
/* Other mappers' pids kept per lease line: past this many, the rest are not waited for. */
#define RECOVERY_MAPPERS_MAX 64
#define RECOVERY_STATE_MAGIC "pinbroker-st 2"
#define RECOVERY_DESC_BYTES 128u
#define RECOVERY_BODY_START_BYTES (2u * RECOVERY_DESC_BYTES)
#define RECOVERY_RECORD_TAG 0x524a4250u /* "PBJR" */
/* Sanity bound when reading: 64 MiB of text is some 400k leases. */
#define RECOVERY_STATE_MAX_BYTES (64ull << 20)
/* A lease line's per-chunk flags ("id:flags"). */
#define RECOVERY_CHUNK_FLAG_TAIL 1u
#define RECOVERY_CHUNK_FLAG_TAINTED 2u

struct recovery_desc {
	char magic[16];
	uint64_t seq;
	uint64_t instance_id;
	uint64_t max_lent_id; /* every lease id that ever left is <= this or in a record */
	uint64_t body_off;
	uint64_t body_len;
	uint64_t body_sum;
	uint64_t desc_sum; /* over everything above */
};
_Static_assert(sizeof(struct recovery_desc) <= RECOVERY_DESC_BYTES, "a descriptor fits its slot");

struct recovery_record_hdr {
	uint32_t len; /* bytes of text after the header */
	uint32_t tag;
	uint64_t seq; /* the snapshot it follows */
	uint64_t sum; /* over len, seq and the text */
};

/* A growing text buffer; oom sticks until recovery_buf_reset, so a caller checks once at the end. */
struct recovery_buf {
	char *p;
	size_t len, cap;
	bool oom;
};

/* Empty b for reuse (its memory kept). */
void recovery_buf_reset(struct recovery_buf *b);
/* Free b's memory. */
void recovery_buf_free(struct recovery_buf *b);

/*
 * Append lease l's line ("lease id uid gid pid bytes prio nchunks id:flags... Lhex [N] [Apid,...]\n").
 * The other mappers named are l's attachers, then holds (the pids holding it until they exit), at most
 * RECOVERY_MAPPERS_MAX in all. b->oom is set when memory runs out.
 */
void recovery_format_lease(struct recovery_buf *b, const struct lease *l, const pid_t *holds, size_t nholds);
/* Append an idle chunk's line ("idle id owner\n"). */
void recovery_format_idle(struct recovery_buf *b, uint64_t chunk_id, uid_t owner);
/*
 * Make b a journal record of snapshot seq for lease l: the header, then l's line (as
 * recovery_format_lease). Returns 0, or -ENOMEM (b->oom set).
 */
int recovery_format_record(struct recovery_buf *b, uint64_t seq, const struct lease *l, const pid_t *holds,
			   size_t nholds);
/* Fill d as the descriptor of snapshot seq whose body (body_len bytes) is at body_off, checksums included. */
void recovery_format_desc(struct recovery_desc *d, uint64_t seq, uint64_t instance_id, uint64_t max_lent_id,
			  uint64_t body_off, const void *body, size_t body_len);
/* The checksum the descriptors and records use: torn and stale bytes, not an adversary. */
uint64_t recovery_format_sum(uint64_t h, const void *p, size_t n);
/* x rounded up to 8: records and bodies start 8-aligned. */
uint64_t recovery_format_align8(uint64_t x);

struct recovery_stored_lease {
	uint64_t id;
	uid_t uid;
	gid_t gid;
	pid_t pid;
	uint64_t bytes;
	int prio;
	size_t nchunks;
	uint64_t *chunk_ids;
	bool *tails;
	bool *tainted; /* another uid mapped it: it must stay out of the pool after the restart */
	char label[LEASE_LABEL_MAX];
	pid_t mappers[RECOVERY_MAPPERS_MAX]; /* attachers and exited-connection holders, when it was shared */
	size_t nmappers;
	bool no_revoke;
};

struct recovery_parsed {
	struct recovery_stored_lease *leases; /* snapshot lines, then journal records, in the order written */
	size_t nleases;
	uint64_t *idle_ids;
	uid_t *idle_owner;
	size_t nidle;
	struct recovery_desc desc; /* the committed descriptor */
	int slot;
	uint64_t journal_end;
	uint64_t journal_bytes;
	uint64_t max_id; /* the highest lease id named anywhere */
};

/* Free what p holds and zero it (safe on a zeroed or half-filled p). */
void recovery_parsed_free(struct recovery_parsed *p);

/*
 * Parse one lease line (NUL-terminated, without its newline; cut by strtok_r). Returns 0,
 * -EBADMSG (not a lease line this daemon or an older one wrote) or -ENOMEM. sl's arrays are
 * allocated even on failure: free them with recovery_parsed_free through a parsed, or by hand.
 */
int recovery_parse_lease(char *line, struct recovery_stored_lease *sl);

/* Reads n bytes at off of the state, as pread does: the count read, or < 0. */
typedef ssize_t recovery_read_fn(void *ud, void *buf, size_t n, uint64_t off);

/*
 * Decode the state of size bytes, read through read: the newest valid descriptor, its body and the
 * valid journal records after it. Returns 0 with *out filled, -ENODATA for an empty state (a clean
 * stop, or a fresh one), -EBADMSG when no committed snapshot can be read (out zeroed), or -ENOMEM.
 */
int recovery_decode(uint64_t size, recovery_read_fn *read, void *ud, struct recovery_parsed *out);

/* SPDX-License-Identifier: MIT */
/*
 * Memory a previous daemon lent that live processes still map: the restart state file's text, parsed and written. Pure:
 * no I/O.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* One chunk memfd, as fstat() shows it, and its size. */
struct orphan_key {
	dev_t dev;
	ino_t ino;
	uint64_t bytes;
};

/*
 * One lease of a previous daemon (or, without a state file, one memfd found
 * by its name), counted against the budget and its uid until nothing holds it.
 */
struct orphan {
	uint64_t lease_id; /* its id under the daemon that lent it; 0 when found by name alone */
	uid_t uid;
	uint64_t bytes; /* charged to the budget and to uid */
	bool verified;  /* named by the state file; else found by the memfd's name only */
	size_t nkeys;   /* 0 for a registration: the program's own memory, held while a pid lives */
	struct orphan_key *keys;
	size_t npids;
	pid_t *pids; /* the processes that held it at the stop: each holds it while it lives */
	int *pidfds; /* the restart module's, one per pid (-1: gone); orphans_parse sets -1 */
};

/* Past these a state file is damaged (or not ours): a lease's mappers are capped like recovery.c's. */
#define ORPHANS_MAX 1048576u
#define ORPHAN_PIDS_MAX 64u
#define ORPHAN_KEYS_MAX 1048576u
/* 64 MiB of text is some 100k leases of a few chunks each. */
#define ORPHANS_STATE_MAX_BYTES (64ull << 20)

/*
 * Parse a state file's text:
 *   pinbroker-restart 2                  (or 1: then nothing follows "end")
 *   boot <boot id>
 *   o <lease id> <uid> <bytes> p<pid>,... k<dev>:<ino>:<bytes>,...   (one line per lease)
 *   end
 *   o ...                                (version 2: lines journaled since)
 * A lease's key bytes must add up to its bytes (a registration has no keys),
 * and "end" must close the file (a torn write is not a short list). When
 * boot_id is not empty and the file names another boot, -ESTALE: every
 * process it names is gone. Returns 0 with a malloc'd *ret of *n orphans
 * (verified, pidfds -1), -EBADMSG, -ESTALE or -ENOMEM.
 */
int orphans_parse(const char *buf, size_t len, const char *boot_id, struct orphan **ret, size_t *n);
/*
 * orphans_parse, for both versions: version 1 ends at "end"; version 2
 * (what orphans_format writes) goes on after "end" with "o" lines journaled
 * while the daemon ran, each a lease lent after the snapshot above it (one
 * already named: its pids are added to the first line's; a line whose memfd a
 * later line names is dropped, as that chunk was lent again). A last line without
 * its newline is ignored (cut by a crash before that lease's fds left).
 * *version (optional) is 1 or 2.
 */
int orphans_parse_version(const char *buf, size_t len, const char *boot_id, struct orphan **ret, size_t *n,
			  unsigned *version);
/* One "o" line of o, with its newline, malloc'd into *ret (*len bytes). Returns 0 or -ENOMEM. */
int orphans_format_line(const struct orphan *o, char **ret, size_t *len);

/* The text orphans_parse reads, malloc'd into *ret (*len bytes, NUL-terminated). Returns 0 or -ENOMEM. */
int orphans_format(const struct orphan *v, size_t n, const char *boot_id, char **ret, size_t *len);

/* Free one orphan's arrays (not its pidfds: the caller closes them). */
void orphan_clear(struct orphan *o);
/* orphan_clear each, then the array. NULL is fine. */
void orphans_free(struct orphan *v, size_t n);

/* SPDX-License-Identifier: MIT */
/*
 * Registrations of shared memory charged once: per backing object (a file's device and inode) the page
 * ranges its registrants hold, and who carries the charge of each page. Pure: no I/O.
 *
 * The rule is one line: a page is charged to the live registrant with the smallest key that covers it
 * (the daemon's keys are lease ids, which only grow, so that is the oldest registration of the page). A
 * new registrant is thus charged only the pages no live one covers; when one leaves, each page it carried
 * goes to the oldest registrant still covering it (a move), or, covered by none, stops being charged.
 * A registrant is never charged for a page outside its own range.
 *
 * The backing is the client's word (its /proc/self/maps), as a registration's size already is: a client
 * that names another's file only lowers its own charge, which it could do by not registering at all, and
 * it can never raise another registrant's, since nobody carries a page outside its own range.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct backing_table;

/* A charge for bytes moves from registrant from_key to to_key (both live in the same backing object). */
typedef void backing_move_fn(void *ctx, uint64_t from_key, uint64_t to_key, uint64_t bytes);

/* Returns 0 and *ret, or -ENOMEM. */
int backing_table_new(struct backing_table **ret);
/* Frees the table and every registrant left in it. NULL: nothing. */
void backing_table_free(struct backing_table *t);

/*
 * Bytes of [start, end) of object (dev, ino) that no live registrant covers: what a new registrant with a
 * key above every live one would be charged. 0 for an empty range.
 */
uint64_t backing_uncovered(const struct backing_table *t, uint64_t dev, uint64_t ino, uint64_t start, uint64_t end);

/*
 * Record registrant key over [start, end) of (dev, ino). *added: bytes nobody covered before, now charged
 * to key. A key below a live one that covers part of the range takes those pages' charge over: move runs
 * for each such piece (NULL move: not told). Returns 0, -EINVAL (start >= end), -EEXIST (key is already a
 * registrant of this object; nothing changed) or -ENOMEM (nothing changed).
 */
int backing_add(struct backing_table *t, uint64_t dev, uint64_t ino, uint64_t key, uint64_t start, uint64_t end,
		uint64_t *added, backing_move_fn *move, void *ctx);

/*
 * Registrant key of (dev, ino) leaves. *uncovered: bytes no other registrant covers, no longer charged to
 * anybody (they were key's). Pages key carried that others still cover move to the oldest of those: move
 * runs for each piece (NULL: not told). Never allocates, so it cannot fail on the free path. Returns 0 or
 * -ENOENT (no such registrant; nothing changed, *uncovered 0).
 */
int backing_remove(struct backing_table *t, uint64_t dev, uint64_t ino, uint64_t key, uint64_t *uncovered,
		   backing_move_fn *move, void *ctx);

/* Bytes charged to registrant key of (dev, ino) now (0: none, or no such registrant). O(n^2) in its registrants. */
uint64_t backing_charged(const struct backing_table *t, uint64_t dev, uint64_t ino, uint64_t key);

/* Live registrants of (dev, ino), and the bytes their ranges cover together (each page once). */
size_t backing_registrants(const struct backing_table *t, uint64_t dev, uint64_t ino);
uint64_t backing_covered(const struct backing_table *t, uint64_t dev, uint64_t ino);

/* The key of the i-th registrant of (dev, ino), in the order they came; false past the last. */
bool backing_registrant_at(const struct backing_table *t, uint64_t dev, uint64_t ino, size_t i, uint64_t *key);

/* Backing objects with at least one registrant. */
size_t backing_objects(const struct backing_table *t);

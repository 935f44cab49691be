/* SPDX-License-Identifier: MIT */
/* Staged copies' decisions, apart from their I/O (lib-staging.c): no CUDA, no broker, no threads. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pinbroker.h"

/* Settings' defaults and bounds (docs/staging.md's table; the defaults chosen by bench_staging --sweep on an H200). */
#define PBST_RING_DEFAULT_BYTES ((size_t)64 << 20)
#define PBST_RING_MAX_BYTES ((size_t)1 << 30)
#define PBST_SLOT_DEFAULT_BYTES ((size_t)16 << 20)
#define PBST_SLOT_MIN_BYTES ((size_t)64 << 10) /* below it the per-slot driver calls cost more than they hide */
#define PBST_SLOTS_MIN 2u                      /* one slot filling while the GPU copies the other */
#define PBST_THREADS_DEFAULT 8u                /* and at most half the online CPUs: pbst_threads_for_cpus */
#define PBST_THREADS_MAX 64u
#define PBST_THRESHOLD_DEFAULT_BYTES ((size_t)1 << 20)
/* Host threads split a piece at multiples of a cache line, so no two threads write one line of a slot. */
#define PBST_SPLIT_ALIGN_BYTES 64u
/* Below this much per thread, waking another thread costs more than its share of the memcpy saves. */
#define PBST_SPLIT_MIN_BYTES ((size_t)256 << 10)

struct pbst_settings {
	bool enabled;           /* PINBROKER_STAGING (0: every copy goes to the driver) */
	size_t ring_bytes;      /* PINBROKER_STAGING_RING: the lease is nslots * slot_bytes of it */
	size_t slot_bytes;      /* PINBROKER_STAGING_SLOT */
	unsigned threads;       /* PINBROKER_STAGING_THREADS: the calling thread and threads - 1 workers */
	size_t threshold_bytes; /* PINBROKER_STAGING_THRESHOLD: smaller copies go to the driver */
	/*
	 * PINBROKER_STAGING_STREAM_STORES: the threads write that direction's destination with streaming stores, in
	 * copies of a slot or more (a smaller one may be read from the cache next, which streaming stores bypass)
	 */
	bool stream_h2d; /* into the ring (default off) */
	bool stream_d2h; /* into the program's memory (default on) */
};

/* The defaults: on, 64 MiB ring of 16 MiB slots, 8 threads, 1 MiB threshold, streaming stores device to host only. */
void pbst_settings_default(struct pbst_settings *s);

/*
 * The default thread count on a host of cpus online CPUs: PBST_THREADS_DEFAULT, but at most half of them (the
 * program's own threads need the rest), at least 1. Used where PINBROKER_STAGING_THREADS is not set.
 */
unsigned pbst_threads_for_cpus(long cpus);

/* The environment as pbst_settings_from_env reads it: getenv, or a table in tests. */
typedef const char *(*pbst_getenv_fn)(const char *name, void *arg);

/*
 * s from the defaults and PINBROKER_STAGING, _RING, _SLOT, _THREADS, _THRESHOLD and _STREAM_STORES as get returns them (sizes as
 * the config file writes them: "64M", "1GiB", "1048576"). A bad value, or a ring and slot that together leave
 * fewer than two slots, is replaced by its default. Returns 0 when every value was good, else -EINVAL with why
 * naming each bad variable, its value and the default used instead ("; " between them).
 */
int pbst_settings_from_env(struct pbst_settings *s, pbst_getenv_fn get, void *arg, char *why, size_t why_len);

/*
 * Apply pb_staging_configure's opts to s (a field of 0 keeps s's value). Returns 0, or -EINVAL with why naming the
 * field and its bound, s unchanged.
 */
int pbst_settings_apply(struct pbst_settings *s, const struct pb_staging_opts *opts, char *why, size_t why_len);

/* Slots in the ring: ring_bytes / slot_bytes (valid settings give at least PBST_SLOTS_MIN). */
unsigned pbst_settings_slots(const struct pbst_settings *s);

/* CUDA's CU_POINTER_ATTRIBUTE_MEMORY_TYPE values; 0 is memory the driver does not know (pageable host memory). */
#define PBST_MEMTYPE_UNKNOWN 0u
#define PBST_MEMTYPE_HOST 1u
#define PBST_MEMTYPE_DEVICE 2u
#define PBST_MEMTYPE_ARRAY 3u
#define PBST_MEMTYPE_UNIFIED 4u

/* What the driver says of one pointer (cuPointerGetAttributes: MEMORY_TYPE and IS_MANAGED). */
struct pbst_ptr_facts {
	unsigned memory_type;
	bool managed;
};

/* One copy as the caller describes it, with what the driver says of its pointers and stream. */
struct pbst_copy_facts {
	unsigned flags; /* pinbroker-internal.h's PBST_H2D, PBST_D2H (neither: unified addressing decides) */
	size_t bytes;
	struct pbst_ptr_facts dst, src;
	bool capturing; /* the stream is being captured into a graph (or the driver could not say) */
};

/* The verdict on one copy: stage it one way, or leave it to the driver, and why. */
enum pbst_verdict {
	PBST_STAGE_H2D,         /* pageable host src, device dst */
	PBST_STAGE_D2H,         /* device src, pageable host dst */
	PBST_PASS_DISABLED,     /* PINBROKER_STAGING=0 */
	PBST_PASS_SMALL,        /* under the threshold (0 bytes too) */
	PBST_PASS_CAPTURING,    /* the stream is being captured: the graph records the driver's own copy */
	PBST_PASS_MANAGED,      /* managed memory on either side: the driver migrates it */
	PBST_PASS_NOT_PAGEABLE, /* the host side is pinned or registered: the driver copies it at full speed */
	PBST_PASS_NOT_DEVICE,   /* no side is device memory (host to host, arrays, unknown types) */
	PBST_PASS_DEVICE_BOTH,  /* device to device */
	PBST_PASS_MISMATCH,     /* the direction the caller named is not what the pointers are (the driver says so) */
};

/* Is a copy of bytes worth asking the driver about (staging on, at or over the threshold)? No driver call. */
bool pbst_size_qualifies(const struct pbst_settings *s, size_t bytes);

/* The verdict for f under s. */
enum pbst_verdict pbst_decide(const struct pbst_settings *s, const struct pbst_copy_facts *f);

/* A short name for a verdict, for logs and tests. */
const char *pbst_verdict_name(enum pbst_verdict v);

/* One piece of a staged copy: bytes at off of the copy, carried through slot. */
struct pbst_piece {
	size_t off;
	size_t bytes;
	unsigned slot;
};

/*
 * A copy's first pieces ramp up to a whole slot (slot/8, slot/4, slot/2, none under PBST_RAMP_MIN_BYTES), so the GPU
 * starts on the first piece (or, from the device, the threads on the first piece out) after an eighth of a slot's
 * fill, not a whole one: mid-sized copies are not paid for a slot's worth of unhidden memcpy.
 */
#define PBST_RAMP_STEPS 3u
#define PBST_RAMP_MIN_BYTES ((size_t)512 << 10)

/* How many pieces a copy of bytes takes through slots of slot_bytes (0 for 0 bytes). */
size_t pbst_piece_count(size_t bytes, size_t slot_bytes);

/*
 * Piece k of a copy of bytes, through a ring of nslots slots of slot_bytes, its first piece in first_slot and each
 * next one in the next slot (round the ring): the ramp's pieces, then whole slots, the last one what is left.
 */
struct pbst_piece pbst_piece_at(size_t bytes, size_t slot_bytes, unsigned nslots, unsigned first_slot, size_t k);

/* How many of threads share a piece of bytes: at least PBST_SPLIT_MIN_BYTES each, at least 1, at most threads. */
unsigned pbst_split_threads(size_t bytes, unsigned threads);

/*
 * Part i of n of a piece of bytes: *off and *len, parts back to back from 0, every cut a multiple of
 * PBST_SPLIT_ALIGN_BYTES; a trailing part may be empty (*len 0) when bytes is small.
 */
void pbst_split_part(size_t bytes, unsigned n, unsigned i, size_t *off, size_t *len);

/* SPDX-License-Identifier: MIT */
/*
 * The interposer's decisions, apart from its hooks: which pinned ranges are
 * its own (a table sorted by address), what a refused allocation falls back
 * to, and what cudaHostGetFlags says about each kind of memory. No CUDA, no
 * broker, no locks: preload.c holds the lock and does the I/O.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "preload-policy.h"

/* cudaHostAlloc / cuMemHostAlloc flags (the runtime's and the driver's are the same bits). */
#define PBP_HOST_PORTABLE 0x1u
#define PBP_HOST_MAPPED 0x2u
#define PBP_HOST_WRITECOMBINED 0x4u
/* cudaHostRegister / cuMemHostRegister flags beyond PORTABLE and MAPPED (DEVICEMAP). */
#define PBP_REGISTER_IOMEMORY 0x4u
#define PBP_REGISTER_READONLY 0x8u

/* What a tracked range is. "Unbrokered" kinds are pinned outside the broker and reported to it. */
enum pbp_kind {
	PBP_LEASE,          /* an allocation served by a broker lease */
	PBP_REGISTRATION,   /* the program's own memory, registered by the driver, charged as a registration */
	PBP_CHARGED_DRIVER, /* allocated by the driver (write-combined), charged as a registration */
	PBP_DRIVER_ALLOC,   /* allocated by the driver after a refusal: unbrokered */
	PBP_DRIVER_REG,     /* registered by the driver after a refusal: unbrokered */
	PBP_PAGEABLE_ALLOC, /* ordinary memory given instead of pinned (fallback=pageable) */
	PBP_PAGEABLE_REG,   /* a registration answered without pinning (fallback=pageable) */
};

struct pbp_entry {
	uintptr_t base; /* the address the program was given or registered */
	size_t bytes;   /* the span counted for it: whole pages */
	unsigned flags; /* the flags the program asked for */
	enum pbp_kind kind;
	void *lease;  /* the pb_lease of PBP_LEASE, PBP_REGISTRATION and PBP_CHARGED_DRIVER */
	unsigned gen; /* the process generation that made it: a forked child inherits, not owns */
};

/* Ranges sorted by base; they never overlap (the driver refuses overlapping registrations). */
struct pbp_table {
	struct pbp_entry *v;
	size_t n, cap;
};

void pbp_table_free(struct pbp_table *t);
/* Insert; -EEXIST when base is already tracked, -ENOMEM. */
int pbp_table_put(struct pbp_table *t, const struct pbp_entry *e);
/* Remove the entry at exactly base whose kind is an allocation (alloc true) or a registration. */
bool pbp_table_take(struct pbp_table *t, uintptr_t base, bool alloc, struct pbp_entry *out);
/* The entry whose [base, base + bytes) holds p, or NULL. */
const struct pbp_entry *pbp_table_find(const struct pbp_table *t, uintptr_t p);

bool pbp_kind_is_alloc(enum pbp_kind k);
bool pbp_kind_unbrokered(enum pbp_kind k);

enum pbp_action { PBP_DO_DRIVER, PBP_DO_ERROR, PBP_DO_PAGEABLE };

/*
 * The fallback for one refused request. pageable is refused to requests that
 * need the driver's mapping (MAPPED, and IOMEMORY registrations): those go to
 * the driver, so the program still works.
 */
enum pbp_action pbp_fallback(enum pbp_policy p, unsigned flags, bool registration);

/*
 * What cudaHostGetFlags / cuMemHostGetFlags answers for a tracked allocation:
 * >= 0 the flags, -1 "not pinned" (the driver's invalid-value error), -2 ask
 * the driver (it made or registered the memory itself).
 */
int pbp_reported_flags(const struct pbp_entry *e);

/* bytes rounded out to whole pages of page_size around p (the span the kernel locks). */
size_t pbp_page_span(uintptr_t p, size_t bytes, size_t page_size);

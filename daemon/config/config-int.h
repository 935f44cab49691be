/* SPDX-License-Identifier: MIT */
/*
 * The config room's private parts, shared by its four files. Calls run one way only:
 *   config.c, config-doc.c -> config-value.c -> config-keys.c
 * config-keys.c  the key table (names, types, bounds, defaults, help, reloadable) and key lookup
 * config-value.c one key's value: text to the struct's field (the setters) and back (formatting)
 * config.c       a config's life: new, dup, free, the file (file:line errors), origins, validation, reload copies
 * config-doc.c   the writers of the sample config, the markdown table and the man page, from the table
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "config.h"

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)
/* Pool memfds are mapped in pages; 4 KiB is the smallest page on every Linux GPU host. */
#define PAGE_BYTES (4 * KIB)
/* MFD_HUGETLB chunks must be whole 2 MiB huge pages (see DESIGN.md, "Backing"). */
#define HUGE_PAGE_BYTES (2 * MIB)

/* The key table (config-keys.c), in the order the sample config lists it: config_key_count rows. */
extern const struct config_key config_key_table[];
extern const size_t config_key_count;

/* Where k's value lives in c. */
static inline void *config_field(struct config *c, const struct config_key *k)
{
	return (char *)c + k->offset;
}

static inline const void *config_cfield(const struct config *c, const struct config_key *k)
{
	return (const char *)c + k->offset;
}

/* Sets *err (when err is not NULL) to a malloc'd message and returns r, so error paths stay one line. */
int config_fail(char **err, int r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A size as the shortest exact text parse_size takes back ("2M", "1536K", "17"); buf of len bytes. */
void config_size_text(uint64_t v, char *buf, size_t len);
/* k's choices (CT_ENUM) as "a, b, c"; buf of len bytes. */
void config_choices_text(const struct config_key *k, char *buf, size_t len);
/*
 * Set k's field in c from text, checked against k's type and bounds; the origin is the caller's.
 * Returns 0, or -EINVAL/-ERANGE/-ENOMEM with *err (see config_set).
 */
int config_value_set(struct config *c, const struct config_key *k, const char *value, char **err);

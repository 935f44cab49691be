/* SPDX-License-Identifier: MIT */
/*
 * The script forms of pinctl leases and status (pinctl-fields.c): rows of fields named by their --json keys,
 * as aligned columns (-o FIELD,...) or CSV (--format csv), with or without the header line.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* One field: its name (the --json key) and its value in a row, as text into buf; NULL where the JSON has null. */
struct pinctl_field {
	const char *name;
	const char *(*value)(const void *row, char *buf, size_t len);
};

/* The fields of a lease row (struct pb_lease_info) and of the status (struct pb_status: its scalar keys). */
extern const struct pinctl_field lease_fields[];
extern const size_t n_lease_fields;
extern const struct pinctl_field status_fields[];
extern const size_t n_status_fields;

#define FIELDS_MAX 64

/* A selection of fields, in the order given. */
struct fields {
	const struct pinctl_field *f[FIELDS_MAX];
	size_t n;
};

/*
 * list ("id,bytes,label"; NULL for every field of table) into *ret. Returns 0, or -EINVAL with the first
 * unknown name copied into bad (badlen bytes; "" for an empty name or too many fields).
 */
int fields_parse(const struct pinctl_field *table, size_t n, const char *list, struct fields *ret, char *bad,
		 size_t badlen);
/* Every field name of table, comma-separated, into buf, which it returns. */
const char *fields_names(const struct pinctl_field *table, size_t n, char *buf, size_t len);
/*
 * n rows of row_bytes each from rows, as sel selects, on f: CSV (RFC 4180; a header of the names unless
 * !headers) or aligned columns (a header of the names in capitals unless !headers; "-" for null or empty).
 * Peer text is C-escaped in both, so no value spans lines. Returns 0, or -ENOMEM.
 */
int fields_print(FILE *f, const struct fields *sel, const void *rows, size_t row_bytes, size_t n, bool csv,
		 bool headers);

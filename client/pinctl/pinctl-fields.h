/* SPDX-License-Identifier: MIT */
/*
 * The script forms of pinctl's table commands (pinctl-fields.c): rows of fields named by their --json keys,
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
/* pinctl jobs (struct pb_job), quota list's rules (struct pb_quota_rule), config and get (struct pb_config_entry):
 * the keys of their --json rows. */
extern const struct pinctl_field job_fields[];
extern const size_t n_job_fields;
/* pinctl reservations (struct pb_reservation_info). */
extern const struct pinctl_field reservation_fields[];
extern const size_t n_reservation_fields;
extern const struct pinctl_field rule_fields[];
extern const size_t n_rule_fields;
extern const struct pinctl_field config_fields[];
extern const size_t n_config_fields;

/* pinctl headroom's rows: bound i of h, with the answer's own figures beside it. */
struct pb_headroom;
struct headroom_row {
	const struct pb_headroom *h;
	size_t i;
};
extern const struct pinctl_field headroom_fields[];
extern const size_t n_headroom_fields;

/* One sample of the daemon's Prometheus text: pinctl metrics' rows. */
struct metric_sample {
	char *name;
	char *type;   /* of its family (# TYPE): counter, gauge, histogram, ...; "untyped" without one */
	char *labels; /* as the text writes them, without the braces: k="v",k2="v2" ("" for none) */
	char *value;  /* as written: a number, NaN, +Inf */
};
extern const struct pinctl_field metric_fields[];
extern const size_t n_metric_fields;
/* The text format's samples into *ret (free with metrics_free). 0, -EBADMSG for a line that is no sample, -ENOMEM. */
int metrics_parse(const char *text, struct metric_sample **ret, size_t *n);
void metrics_free(struct metric_sample *s, size_t n);
/* {schema_version, metrics: [{name, type, labels: {k: v}, value}]} and its newline; values as strings, as
 * Prometheus' own API gives them (NaN and +Inf are no JSON numbers). */
void metrics_json(FILE *f, const struct metric_sample *s, size_t n);

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

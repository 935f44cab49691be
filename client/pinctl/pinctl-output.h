/* SPDX-License-Identifier: MIT */
/* pinctl's output room (pinctl-output.c): formatting for people, peer text made safe, JSON and text forms. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "pinbroker.h"

/* The version of every --json schema pinctl writes. */
#define JSON_SCHEMA_VERSION 1
/* Room for any peer string C-escaped: every byte may become \xNN (labels: 4 of 63 bytes, comma-joined). */
#define ESC_BYTES 2200

/* Text from the daemon or other clients made terminal-safe (C-escaped) into buf of ESC_BYTES. */
const char *esc(const char *s, char *buf);
/* uid's user name, or the number when the passwd database has none; into buf, which it returns. */
const char *user_name(uint32_t uid, char *buf, size_t len);
/* bytes as a size people read (64 MiB), into buf, which it returns. */
const char *size_str(uint64_t bytes, char *buf, size_t len);
/* ms as "12 ms", "1.5 s", "3m 05s", "2h 07m" or "4d 03h", into buf, which it returns. */
const char *duration_str(uint64_t ms, char *buf, size_t len);
/* A lease priority's name: normal, critical or best-effort. */
const char *priority_name(enum pb_priority p);

/* A JSON string (RFC 8259) with every unprintable character escaped and non-UTF-8 bytes as U+FFFD. */
void json_str(FILE *f, const char *s);
/* "k": */
void json_key(FILE *f, const char *k);
/* "k":v, with a comma after when comma. */
void json_u64(FILE *f, const char *k, uint64_t v, bool comma);
/* "k":"v", with a comma after when comma. */
void json_kstr(FILE *f, const char *k, const char *v, bool comma);
/* "leases":[...], one object per row, as pinctl leases --json and status --json have it. */
void json_leases(FILE *f, const struct pb_lease_info *rows, size_t n);
/* "jobs":[{job, bytes, leases, quota_bytes (null without a quota), rule, source}], as pinctl jobs --json has it. */
void json_jobs(FILE *f, const struct pb_job *jobs, size_t n);
/* pinctl status --json: the whole object and its newline. */
void status_json(FILE *f, const struct pb_status *s);
/* One setting as {key, value, source, file, line, reloadable} (file and line only when it came from a file). */
void config_entry_json(FILE *f, const struct pb_config_entry *e);

/* pinctl status's text, on stdout. */
void status_human(const struct pb_status *s);
/* pinctl leases's table, on stdout; its header line unless !headers. */
void print_leases_table(const struct pb_lease_info *rows, size_t n, bool headers);
/* The jobs table of pinctl jobs and quota list, on stdout: a header line unless !headers, then a row per job
 * ("no jobs hold leases" for none, and nothing without headers). */
void print_jobs(const struct pb_job *jobs, size_t n, bool headers);
/* pinctl headroom: {schema_version, available_bytes, page_bytes, state, binding, bounds[]} and its newline. */
struct pb_headroom;
void json_headroom(FILE *f, const struct pb_headroom *h);
/* pinctl headroom's text: the answer, then a row per bound (the binding one marked). */
void print_headroom(const struct pb_headroom *h, bool headers);
/* "reservations":[{id, uid, job (null without one), name, shares, share_bytes, taken, bytes_reserved, state,
 * members, age_ms}], as pinctl reservations --json has it. */
void json_reservations(FILE *f, const struct pb_reservation_info *rows, size_t n);
/* The reservations table on stdout: a header line unless !headers, a row each ("no reservations" for none), then
 * the host's reserved-not-taken bytes. */
void print_reservations(const struct pb_reservation_info *rows, size_t n, uint64_t reserved, bool headers);
/* One setting as "key = value  # source", on stdout. */
void config_entry_human(const struct pb_config_entry *e);

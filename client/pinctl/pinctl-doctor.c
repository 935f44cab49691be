/* SPDX-License-Identifier: MIT */
/*
 * pinctl doctor: the command and its output. It checks a host's set-up for pinbrokerd (privileges, huge pages,
 * CUDA, socket, cgroup, PSI, service, budget), each finding with its fix.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "pinbroker.h"
#include "pinctl-doctor.h"
#include "pinctl-fields.h"
#include "pinctl-output.h"
#include "pinctl.h"

/*
 * Exit statuses: 0 nothing to do (every check ok or skipped), 1 a warning (advice worth taking), 2 usage,
 * 3 no daemon answers and nothing else failed (every pinctl command's 3), 4 a failure (a real problem).
 */
#define DOCTOR_EXIT_WARN 1
#define DOCTOR_EXIT_NO_DAEMON EXIT_NO_DAEMON
#define DOCTOR_EXIT_FAIL 4

static const char *const status_names[] = { "ok", "warn", "fail", "skip" };

/* ---------------------------------------------------------------- output */

/* {schema_version, checks[], warnings, failures, exit_status}: an object, so keys can be added later. */
static void print_json(const struct doctor *d, unsigned warns, unsigned fails, int exit_status)
{
	fputc('{', stdout);
	json_u64(stdout, "schema_version", JSON_SCHEMA_VERSION, true);
	json_key(stdout, "checks");
	fputc('[', stdout);
	for (size_t i = 0; i < d->n; i++) {
		const struct finding *f = &d->findings[i];

		fputs(i ? ",\n{\"check\":" : "{\"check\":", stdout);
		json_str(stdout, f->name);
		fputs(",\"status\":", stdout);
		json_str(stdout, status_names[f->status]);
		fputs(",\"message\":", stdout);
		json_str(stdout, f->message);
		fputs(",\"fix\":", stdout);
		json_str(stdout, f->fix);
		fputc('}', stdout);
	}
	fputs("],\n", stdout);
	json_u64(stdout, "warnings", warns, true);
	json_u64(stdout, "failures", fails, true);
	json_u64(stdout, "exit_status", (uint64_t)exit_status, false);
	fputs("}\n", stdout);
}

/* The findings' fields for -o and --format csv: the keys of --json's checks. */
#define FINDING(row) ((const struct finding *)(row))

static const char *finding_check(const void *row, char *buf, size_t len)
{
	return FINDING(row)->name;
}

static const char *finding_status(const void *row, char *buf, size_t len)
{
	return status_names[FINDING(row)->status];
}

static const char *finding_message(const void *row, char *buf, size_t len)
{
	return FINDING(row)->message;
}

static const char *finding_fix(const void *row, char *buf, size_t len)
{
	return FINDING(row)->fix;
}

static const struct pinctl_field finding_fields[] = {
	{ "check", finding_check },
	{ "status", finding_status },
	{ "message", finding_message },
	{ "fix", finding_fix },
};

static void print_human(const struct doctor *d, unsigned warns, unsigned fails)
{
	for (size_t i = 0; i < d->n; i++) {
		const struct finding *f = &d->findings[i];

		printf("%-5s %-15s %s\n", status_names[f->status], f->name, f->message);
		if (f->fix[0])
			printf("%-5s %-15s fix: %s\n", "", "", f->fix);
	}
	printf("\n%u warning%s, %u failure%s%s\n", warns, warns == 1 ? "" : "s", fails, fails == 1 ? "" : "s",
	       warns || fails ? "" : ": nothing to do");
}

int cmd_doctor(int argc, char **argv)
{
	struct doctor *d;
	struct list_opts lo;
	struct fields sel;
	unsigned warns = 0, fails = 0, no_daemon = 0;
	/* The text form is no table: --no-headers alone asks for the findings' rows, as status does. */
	bool rows;
	int r, ret;

	r = parse_list_opts(argc, argv, &lo, 0);
	if (r != PINCTL_OPT_NEXT)
		return r;
	rows = lo.fields || lo.csv || lo.no_headers;
	if (rows &&
	    select_fields(finding_fields, sizeof(finding_fields) / sizeof(finding_fields[0]), lo.fields, &sel) != 0)
		return EXIT_USAGE;
	d = calloc(1, sizeof(*d));
	if (!d)
		return pinctl_error(EXIT_FAILURE, "failed", "out of memory");
	doctor_gather(d);
	doctor_checks_run(d);
	for (size_t i = 0; i < d->n; i++) {
		warns += d->findings[i].status == DOCTOR_WARN;
		fails += d->findings[i].status == DOCTOR_FAIL;
	}
	/* The socket check's failure when nothing listens there: the daemon is not running, as for every command. */
	no_daemon = doctor_no_daemon(d) ? 1 : 0;
	ret = fails > no_daemon ? DOCTOR_EXIT_FAIL
	      : fails           ? DOCTOR_EXIT_NO_DAEMON
	      : warns           ? DOCTOR_EXIT_WARN
				: EXIT_SUCCESS;
	r = 0;
	if (lo.json)
		print_json(d, warns, fails, ret);
	else if (rows)
		r = fields_print(stdout, &sel, d->findings, sizeof(d->findings[0]), d->n, lo.csv, !lo.no_headers);
	else
		print_human(d, warns, fails);
	free(d);
	if (r < 0)
		return pinctl_error(EXIT_FAILURE, "failed", "out of memory");
	if (fflush(stdout) != 0)
		return EXIT_FAILURE;
	return ret;
}

/* SPDX-License-Identifier: MIT */
/* pinctl quota (set, clear, list) and pinctl jobs: per-job quotas over cgroup paths. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pinbroker.h"
#include "pinctl-fields.h"
#include "pinctl-help.h"
#include "pinctl-output.h"
#include "pinctl.h"
#include "util.h"

/* The Usage lines of help (up to its first blank line) on stderr, after a usage error; returns r. */
static int with_usage(int r, const char *help)
{
	const char *end = strstr(help, "\n\n");

	if (r == EXIT_USAGE)
		fprintf(stderr, "%.*s\n", end ? (int)(end - help) : (int)strlen(help), help);
	return r;
}

#define quota_usage(...) with_usage(usage_error(__VA_ARGS__), quota_help)

static int quota_list(const struct list_opts *lo)
{
	struct pb_quota_rule *rules = NULL;
	struct pb_job *jobs = NULL;
	size_t nrules = 0, njobs = 0;
	struct fields sel;
	pb_client *c;
	char e[ESC_BYTES], q[32];
	/* The text form is two tables; the script forms are the rules' rows (pinctl jobs has the jobs'). */
	bool rows = lo->fields || lo->csv || lo->no_headers;
	int r;

	if (rows && select_fields(rule_fields, n_rule_fields, lo->fields, &sel) != 0)
		return with_usage(EXIT_USAGE, quota_help);
	r = connect_or_explain(&c);
	if (r)
		return r;
	r = pb_quota_list(c, &rules, &nrules, &jobs, &njobs);
	pb_disconnect(c);
	if (r < 0)
		return report_failure("quota list", r);
	if (lo->json) {
		printf("{\"schema_version\":1,\"rules\":[");
		for (size_t i = 0; i < nrules; i++) {
			printf("%s{\"pattern\":", i ? "," : "");
			json_str(stdout, rules[i].pattern);
			printf(",\"bytes\":%" PRIu64 ",\"source\":", rules[i].bytes);
			json_str(stdout, rules[i].source);
			printf(",\"seen\":%s}", rules[i].seen ? "true" : "false");
		}
		printf("],");
		json_jobs(stdout, jobs, njobs);
		printf("}\n");
	} else if (rows) {
		r = fields_print(stdout, &sel, rules, sizeof(*rules), nrules, lo->csv, !lo->no_headers);
	} else {
		if (nrules == 0) {
			printf("no quota rules (pinctl quota set CGROUP SIZE, or job-quota in the config)\n");
		} else {
			printf("%-48s %10s  %s\n", "RULE", "QUOTA", "SOURCE");
			for (size_t i = 0; i < nrules; i++)
				printf("%-48s %10s  %s%s\n", esc(rules[i].pattern, e),
				       format_size(rules[i].bytes, q, sizeof(q)), rules[i].source,
				       strcmp(rules[i].source, "set") == 0 && !strpbrk(rules[i].pattern, "*?[\\")
					       ? (rules[i].seen ? " (released when its cgroup goes)"
								: " (its cgroup not seen yet)")
					       : "");
		}
		printf("\n");
		print_jobs(jobs, njobs, true);
	}
	free(rules);
	free(jobs);
	if (r < 0)
		return pinctl_error(EXIT_FAILURE, "failed", "out of memory");
	return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

int cmd_quota(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "revoke", no_argument, NULL, 'r' },
		{ "deadline", required_argument, NULL, 'd' },
		PINCTL_LIST_OPTIONS,
		PINCTL_COMMON_OPTIONS,
		{ NULL, 0, NULL, 0 },
	};
	struct list_opts lo = { 0 };
	bool revoke = false, deadline_given = false;
	uint64_t deadline_ms = 0, bytes = 0, *ids = NULL;
	const char *verb, *cgroup;
	unsigned flags = 0;
	size_t n = 0;
	pb_client *c;
	int o, r, nargs;

	while ((o = getopt_long(argc, argv, PINCTL_LIST_SHORTOPTS, opts, NULL)) != -1) {
		switch (o) {
		case 'r':
			revoke = true;
			break;
		case 'd':
			if (parse_u64(optarg, UINT32_MAX, &deadline_ms) < 0)
				return quota_usage("--deadline: not a number of milliseconds: %s", optarg);
			deadline_given = true;
			break;
		default:
			r = list_option(o, &lo);
			if (r == 1 && (r = command_option("quota", o, argv)) != PINCTL_OPT_NEXT)
				return with_usage(r, quota_help);
			if (r != 0 && r != PINCTL_OPT_NEXT)
				return with_usage(r, quota_help);
			break;
		}
	}
	nargs = argc - optind;
	if (nargs < 1)
		return quota_usage("give set, clear or list");
	verb = argv[optind];
	if (strcmp(verb, "list") == 0) {
		if (nargs != 1 || revoke || deadline_given)
			return quota_usage("list takes only --json, --format, -o and --no-headers");
		if (list_opts_check(&lo))
			return with_usage(EXIT_USAGE, quota_help);
		return quota_list(&lo);
	}
	if (lo.json || lo.csv || lo.fields || lo.no_headers)
		return quota_usage("--json, --format, -o and --no-headers are for quota list");
	if (deadline_given && !revoke)
		return quota_usage("--deadline goes with --revoke");
	if (strcmp(verb, "set") == 0) {
		if (nargs != 3)
			return quota_usage("set: give CGROUP SIZE, not %d argument%s", nargs - 1,
					   nargs == 2 ? "" : "s");
		if (parse_size(argv[optind + 2], &bytes) < 0)
			return quota_usage("set: not a size: %s (write 8G, 512M, ...)", argv[optind + 2]);
	} else if (strcmp(verb, "clear") == 0) {
		if (nargs != 2)
			return quota_usage("clear: give one CGROUP, not %d arguments", nargs - 1);
		flags |= PB_QUOTA_CLEAR;
	} else {
		return quota_usage("unknown verb %s (set, clear or list)", verb);
	}
	cgroup = argv[optind + 1];
	if (cgroup[0] != '/')
		return quota_usage("%s: '%s' is not a cgroup path; write it as /proc/PID/cgroup does, from /", verb,
				   cgroup);
	if (revoke)
		flags |= PB_QUOTA_REVOKE;

	r = connect_or_explain(&c);
	if (r)
		return r;
	r = pb_quota_set(c, cgroup, bytes, flags, (uint32_t)deadline_ms, &ids, &n);
	if (r == 0 && strcmp(pb_last_error(), "no error") != 0) {
		char e[ESC_BYTES];

		fprintf(stderr, "pinctl: warning: %s\n", esc(pb_last_error(), e));
	}
	pb_disconnect(c);
	if (r < 0)
		return report_failure(flags & PB_QUOTA_CLEAR ? "quota clear" : "quota set", r);
	if (flags & PB_QUOTA_CLEAR) {
		printf("quota of %s cleared\n", cgroup);
	} else {
		char q[32];

		printf("quota of %s: %s\n", cgroup, format_size(bytes, q, sizeof(q)));
	}
	if (revoke) {
		printf("revoking %zu lease%s", n, n == 1 ? "" : "s");
		for (size_t i = 0; i < n; i++)
			printf("%s%" PRIu64, i ? " " : ": ", ids[i]);
		printf("\n");
	}
	free(ids);
	return EXIT_SUCCESS;
}

int cmd_jobs(int argc, char **argv)
{
	struct pb_job *jobs = NULL;
	struct list_opts lo;
	struct fields sel;
	size_t njobs = 0;
	pb_client *c;
	int r;

	r = parse_list_opts(argc, argv, &lo, 0);
	if (r != PINCTL_OPT_NEXT)
		return with_usage(r, jobs_help);
	if ((lo.fields || lo.csv) && select_fields(job_fields, n_job_fields, lo.fields, &sel) != 0)
		return with_usage(EXIT_USAGE, jobs_help);
	r = connect_or_explain(&c);
	if (r)
		return r;
	r = pb_quota_list(c, NULL, NULL, &jobs, &njobs);
	pb_disconnect(c);
	if (r < 0)
		return report_failure("jobs", r);
	if (lo.json) {
		printf("{\"schema_version\":1,");
		json_jobs(stdout, jobs, njobs);
		printf("}\n");
	} else if (lo.fields || lo.csv) {
		r = fields_print(stdout, &sel, jobs, sizeof(*jobs), njobs, lo.csv, !lo.no_headers);
	} else {
		print_jobs(jobs, njobs, !lo.no_headers);
	}
	free(jobs);
	if (r < 0)
		return pinctl_error(EXIT_FAILURE, "failed", "out of memory");
	return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

int cmd_reservations(int argc, char **argv)
{
	struct pb_reservation_info *rows = NULL;
	uint64_t reserved = 0;
	struct list_opts lo;
	struct fields sel;
	size_t n = 0;
	pb_client *c;
	int r;

	r = parse_list_opts(argc, argv, &lo, 0);
	if (r != PINCTL_OPT_NEXT)
		return with_usage(r, reservations_help);
	if ((lo.fields || lo.csv) && select_fields(reservation_fields, n_reservation_fields, lo.fields, &sel) != 0)
		return with_usage(EXIT_USAGE, reservations_help);
	r = connect_or_explain(&c);
	if (r)
		return r;
	r = pb_reservations(c, &rows, &n, &reserved);
	pb_disconnect(c);
	if (r < 0)
		return report_failure("reservations", r);
	if (lo.json) {
		printf("{\"schema_version\":1,\"reserved_bytes\":%" PRIu64 ",", reserved);
		json_reservations(stdout, rows, n);
		printf("}\n");
	} else if (lo.fields || lo.csv) {
		r = fields_print(stdout, &sel, rows, sizeof(*rows), n, lo.csv, !lo.no_headers);
	} else {
		print_reservations(rows, n, reserved, !lo.no_headers);
	}
	free(rows);
	if (r < 0)
		return pinctl_error(EXIT_FAILURE, "failed", "out of memory");
	return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

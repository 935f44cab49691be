/* SPDX-License-Identifier: MIT */
/* pinctl doctor: the command and its output. It checks a host's set-up for pinbrokerd (privileges, huge pages, CUDA, socket, cgroup, PSI, service, budget), each finding with its fix. */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "pinbroker.h"
#include "pinctl-doctor.h"
#include "pinctl-output.h"
#include "pinctl.h"

#define DOCTOR_EXIT_WARN 1
#define DOCTOR_EXIT_FAIL 3

static const char *const status_names[] = { "ok", "warn", "fail", "skip" };

/* ---------------------------------------------------------------- output */

static void print_json(const struct doctor *d)
{
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
	fputs("]\n", stdout);
}

static void print_human(const struct doctor *d, unsigned warns, unsigned fails)
{
	for (size_t i = 0; i < d->n; i++) {
		const struct finding *f = &d->findings[i];

		printf("%-5s %-15s %s\n", status_names[f->status], f->name, f->message);
		if (f->fix[0])
			printf("%-5s %-15s fix: %s\n", "", "", f->fix);
	}
	printf("\n%u warning%s, %u failure%s\n", warns, warns == 1 ? "" : "s", fails, fails == 1 ? "" : "s");
}

int cmd_doctor(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, 'j' },
		PINCTL_COMMON_OPTIONS,
		{ NULL, 0, NULL, 0 },
	};
	struct doctor *d;
	unsigned warns = 0, fails = 0;
	bool json = false;
	int o, ret;

	while ((o = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		if (o == 'j')
			json = true;
		else if ((ret = command_option("doctor", o, argv)) != PINCTL_OPT_NEXT)
			return ret;
	}
	if (optind != argc)
		return usage_error("takes no arguments (got '%s')", argv[optind]);
	d = calloc(1, sizeof(*d));
	if (!d) {
		fprintf(stderr, "pinctl doctor: out of memory\n");
		return EXIT_FAILURE;
	}
	doctor_gather(d);
	doctor_checks_run(d);
	for (size_t i = 0; i < d->n; i++) {
		warns += d->findings[i].status == DOCTOR_WARN;
		fails += d->findings[i].status == DOCTOR_FAIL;
	}
	if (json)
		print_json(d);
	else
		print_human(d, warns, fails);
	ret = fails ? DOCTOR_EXIT_FAIL : warns ? DOCTOR_EXIT_WARN : EXIT_SUCCESS;
	free(d);
	if (fflush(stdout) != 0)
		return EXIT_FAILURE;
	return ret;
}

/* SPDX-License-Identifier: MIT */
/* pinctl headroom: how much this client may still get now, and each bound's reason (pb_headroom). */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "pinbroker.h"
#include "pinctl-fields.h"
#include "pinctl-output.h"
#include "pinctl.h"

int cmd_headroom(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "no-revoke", no_argument, NULL, 'n' },
		PINCTL_LIST_OPTIONS,
		PINCTL_COMMON_OPTIONS,
		{ NULL, 0, NULL, 0 },
	};
	struct headroom_row rows[PB_HEADROOM_BOUNDS_MAX];
	struct list_opts lo = { 0 };
	struct pb_headroom h;
	struct fields sel;
	unsigned flags = 0;
	pb_client *c;
	int o, r;

	while ((o = getopt_long(argc, argv, PINCTL_LIST_SHORTOPTS, opts, NULL)) != -1) {
		if (o == 'n') {
			flags |= PB_ACQUIRE_NO_REVOKE;
			continue;
		}
		r = list_option(o, &lo);
		if (r == 1 && (r = command_option(argv[0], o, argv)) != PINCTL_OPT_NEXT)
			return r;
		if (r != 0 && r != PINCTL_OPT_NEXT)
			return r;
	}
	if (optind < argc)
		return usage_error("takes no arguments (got '%s')", argv[optind]);
	if (list_opts_check(&lo))
		return EXIT_USAGE;
	if ((lo.fields || lo.csv) && select_fields(headroom_fields, n_headroom_fields, lo.fields, &sel) != 0)
		return EXIT_USAGE;
	r = connect_or_explain(&c);
	if (r)
		return r;
	r = pb_headroom(c, flags, &h);
	pb_disconnect(c);
	if (r < 0)
		return report_failure("headroom", r);
	for (size_t i = 0; i < h.n_bounds; i++)
		rows[i] = (struct headroom_row){ &h, i };
	if (lo.json)
		json_headroom(stdout, &h);
	else if (lo.fields || lo.csv)
		r = fields_print(stdout, &sel, rows, sizeof(rows[0]), h.n_bounds, lo.csv, !lo.no_headers);
	else
		print_headroom(&h, !lo.no_headers);
	if (r < 0)
		return pinctl_error(EXIT_FAILURE, "failed", "out of memory");
	return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

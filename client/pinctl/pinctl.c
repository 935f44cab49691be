/* SPDX-License-Identifier: MIT */
/*
 * pinctl: inspect and administer pinbrokerd (status, leases, acquire, revoke, set) through libpinbroker,
 * and run programs under the interposer. This file is the top room: main's options, and the table that
 * dispatches to each command (pinctl.h lists the rooms below).
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pinbroker.h"
#include "pinctl-help.h"
#include "pinctl.h"

static int cmd_help(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "--help") == 0)
		return command_help("help", stdout);
	if (argc > 2)
		return usage_error("give at most one COMMAND");
	if (argc == 2)
		return command_help(argv[1], stdout);
	pinctl_usage(stdout);
	return EXIT_SUCCESS;
}

static const struct command {
	const char *name;
	int (*run)(int argc, char **argv);
} commands
	[] = {
		{ "status", cmd_status },   { "leases", cmd_leases },
		{ "acquire", cmd_acquire }, { "revoke", cmd_revoke },
		{ "set", cmd_set },         { "run", cmd_run },
		{ "metrics", cmd_metrics }, { "doctor", cmd_doctor },
		{ "quota", cmd_quota },     { "jobs", cmd_jobs },
		{ "help", cmd_help },       { "get", cmd_get },
		{ "config", cmd_config },   { "top", cmd_top },
		{ "watch", cmd_top }, /* top's other name, as procps has watch(1) */
	};

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "version", no_argument, NULL, 'V' },
		{ "wait", optional_argument, NULL, 'w' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int o;

	opterr = 0; /* every bad option gets one message, ours */
	/* "+": stop at the command, whose own options are parsed by the command. */
	while ((o = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			if (!*optarg)
				return usage_error("--socket: empty path; give the daemon's socket, or leave --socket "
						   "out for the default");
			pinctl_socket_set(optarg);
			break;
		case 'w': {
			uint64_t secs = PINCTL_WAIT_DEFAULT_S;

			if (optarg && parse_u64(optarg, 3600, &secs) < 0)
				return usage_error("--wait: not a number of seconds from 0 to 3600: %s", optarg);
			pinctl_wait_set(secs * 1000);
			break;
		}
		case 'V':
			printf("pinctl %s\n", PINBROKER_VERSION);
			return EXIT_SUCCESS;
		case 'h':
			pinctl_usage(stdout);
			return EXIT_SUCCESS;
		default:
			return option_error(NULL, o, argv);
		}
	}
	if (optind >= argc)
		return usage_error(
			"no command given (status, leases, top, acquire, revoke, get, set, config, run, doctor)");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		if (strcmp(argv[optind], commands[i].name) == 0) {
			char **sub = argv + optind;
			int n = argc - optind;

			/* -h too, which no command has as a short option (run's -h would be CMD's, after --). */
			if (n >= 2 && strcmp(sub[1], "-h") == 0)
				return command_help(sub[0], stdout);
			pinctl_command_set(sub[0]); /* its usage errors point to its help */
			optind = 0;                 /* full getopt re-initialisation for the command's own options */
			return commands[i].run(n, sub);
		}
	}
	return usage_error("unknown command: %s", argv[optind]);
}

/* SPDX-License-Identifier: MIT */
/*
 * pinctl: inspect and administer pinbrokerd (status, leases, acquire, revoke, set) through libpinbroker,
 * and run programs under the interposer. This file is the top room: main's options, and the table that
 * dispatches to each command (pinctl.h lists the rooms below).
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pinbroker.h"
#include "pinctl-help.h"
#include "pinctl.h"

/* What a command takes, for pinctl help --commands (and the tests and completions that read it). */
#define CMD_JSON 1u        /* --json and --format json; its errors then JSON on stdout too */
#define CMD_TABLE 2u       /* -o FIELDS, --format text|csv|json, --no-headers */
#define CMD_EXIT_RESULT 4u /* its exit status is a finding, its JSON printed either way (doctor) */

static int cmd_help(int argc, char **argv);

static const struct command {
	const char *name;
	int (*run)(int argc, char **argv);
	unsigned takes;
	const char *table_args; /* the arguments of its table form ("" none), KEY standing for a config key */
} commands[] = {
	{ "status", cmd_status, CMD_JSON | CMD_TABLE, "" },
	{ "leases", cmd_leases, CMD_JSON | CMD_TABLE, "" },
	{ "acquire", cmd_acquire, 0, NULL },
	{ "revoke", cmd_revoke, 0, NULL },
	{ "set", cmd_set, 0, NULL },
	{ "run", cmd_run, 0, NULL },
	{ "metrics", cmd_metrics, CMD_JSON | CMD_TABLE, "" },
	{ "doctor", cmd_doctor, CMD_JSON | CMD_TABLE | CMD_EXIT_RESULT, "" },
	{ "quota", cmd_quota, CMD_JSON | CMD_TABLE, "list" },
	{ "jobs", cmd_jobs, CMD_JSON | CMD_TABLE, "" },
	{ "headroom", cmd_headroom, CMD_JSON | CMD_TABLE, "" },
	{ "reservations", cmd_reservations, CMD_JSON | CMD_TABLE, "" },
	{ "help", cmd_help, 0, NULL },
	{ "get", cmd_get, CMD_JSON | CMD_TABLE, "KEY" },
	{ "config", cmd_config, CMD_JSON | CMD_TABLE, "" },
	{ "top", cmd_top, 0, NULL },
	{ "watch", cmd_top, 0, NULL }, /* top's other name, as procps has watch(1) */
};
#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

/* pinctl help --commands: "NAME TAKES [TABLE ARGS]" a line, TAKES being json,table,... or -. */
static void list_commands(void)
{
	for (size_t i = 0; i < NCOMMANDS; i++) {
		const struct command *c = &commands[i];

		printf("%s\t%s%s%s%s\t%s\n", c->name, c->takes & CMD_JSON ? "json" : "",
		       (c->takes & CMD_JSON) && (c->takes & CMD_TABLE) ? "," : "", c->takes & CMD_TABLE ? "table" : "",
		       c->takes ? "" : "-", c->table_args ? c->table_args : "");
	}
}

static int cmd_help(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "--help") == 0)
		return command_help("help", stdout);
	if (argc == 2 && strcmp(argv[1], "--commands") == 0) {
		list_commands();
		return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
	}
	if (argc > 2)
		return usage_error("give at most one COMMAND");
	if (argc == 2)
		return command_help(argv[1], stdout);
	pinctl_usage(stdout);
	return EXIT_SUCCESS;
}

/* Whether argv (up to a "--") asks for JSON: --json, or --format json / --format=json. */
static bool wants_json(int argc, char **argv)
{
	for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
		if (strcmp(argv[i], "--json") == 0 || strcmp(argv[i], "--format=json") == 0 ||
		    (strcmp(argv[i], "--format") == 0 && i + 1 < argc && strcmp(argv[i + 1], "json") == 0))
			return true;
	return false;
}

/* A command that takes --json and failed without saying so in JSON (an error only on stderr): say it on stdout. */
static int json_catch_all(const struct command *c, bool json, int rc)
{
	if (json && rc != EXIT_SUCCESS && (c->takes & CMD_JSON) && !(c->takes & CMD_EXIT_RESULT) &&
	    !pinctl_json_error_written())
		return pinctl_error(rc, "failed", "%s failed (exit status %d); stderr says why", c->name, rc);
	return rc;
}

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

	/* An error before the command is JSON too when the line asks for JSON. */
	pinctl_json_errors_set(wants_json(argc, argv));
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
	for (size_t i = 0; i < NCOMMANDS; i++) {
		if (strcmp(argv[optind], commands[i].name) == 0) {
			char **sub = argv + optind;
			int n = argc - optind;

			/* Only a command that takes --json answers in JSON; the others call --json unknown. */
			bool json = (commands[i].takes & CMD_JSON) && wants_json(n, sub);

			pinctl_json_errors_set(json);
			/* -h too, which no command has as a short option (run's -h would be CMD's, after --). */
			if (n >= 2 && strcmp(sub[1], "-h") == 0)
				return command_help(sub[0], stdout);
			pinctl_command_set(sub[0]); /* its usage errors point to its help */
			optind = 0;                 /* full getopt re-initialisation for the command's own options */
			return json_catch_all(&commands[i], json, commands[i].run(n, sub));
		}
	}
	return usage_error("unknown command: %s", argv[optind]);
}

/* SPDX-License-Identifier: MIT */
/*
 * pinctl's private header: what every command shares (pinctl-cli.c), and the commands main dispatches to.
 * The rooms, each calling only those below it: pinctl.c (main) -> the commands (pinctl-cmd.c, -top.c,
 * -run.c, -quota.c, -headroom.c, -doctor.c) -> pinctl-cli.c -> pinctl-fields.c (the script forms) -> pinctl-output.c,
 * and pinctl-help.c.
 */
#pragma once

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* pinctl's exit statuses besides EXIT_SUCCESS and EXIT_FAILURE (1, any other error), as systemctl's:
 * 2 a usage error, 3 no daemon answers (nothing listens on the socket, or HELLO timed out). */
#define EXIT_USAGE 2
#define EXIT_NO_DAEMON 3

/* The socket pinctl talks to: --socket, else $PINBROKER_SOCKET, else the default path. Never NULL. */
const char *pinctl_socket(void);
/* --socket as given (before or after the command), or NULL: pb_connect's NULL is the library's default. */
const char *pinctl_socket_option(void);
/* --socket PATH (path not empty), for the commands that follow. */
void pinctl_socket_set(const char *path);
/*
 * pinctl --wait[=SECONDS]: how long connect_or_explain waits for a daemon that is not there yet (no socket
 * file, or nobody listening on it), as right after `pinbrokerd ... &`; 0 (the default) waits not at all.
 */
#define PINCTL_WAIT_DEFAULT_S 10
void pinctl_wait_set(uint64_t ms);
/* The command being run (main sets it before dispatch), which usage errors name and point to. */
void pinctl_command_set(const char *name);
/*
 * A usage error: one line on stderr, "pinctl CMD: MESSAGE; see 'pinctl CMD --help'" inside a command,
 * "pinctl: MESSAGE; see 'pinctl --help' for usage" before one. Returns EXIT_USAGE.
 */
__attribute__((format(printf, 1, 2))) int usage_error(const char *fmt, ...);
/* getopt's '?' or ':' for command cmd (NULL before the command) as one usage error. Returns EXIT_USAGE. */
int option_error(const char *cmd, int o, char **argv);
/* Command name's --help on f: EXIT_SUCCESS, or a usage error (EXIT_USAGE) for a name pinctl does not have. */
int command_help(const char *name, FILE *f);

/* The options every command takes after its name too; their getopt vals are 'S' and 'H'. */
#define PINCTL_COMMON_OPTIONS                       \
	{ "socket", required_argument, NULL, 'S' }, \
	{                                           \
		"help", no_argument, NULL, 'H'      \
	}
/* command_option's answer when the command's option loop goes on. */
#define PINCTL_OPT_NEXT (-1)
/*
 * An option cmd's own table does not handle: --socket PATH (PINCTL_OPT_NEXT), --help (prints the
 * command's help; returns 0), else getopt's error as option_error (EXIT_USAGE).
 */
int command_option(const char *cmd, int o, char **argv);

struct pb_client;
/*
 * Connect to pinctl_socket(): 0 and *ret, or say why not and what to do on stderr and return the exit
 * status: EXIT_NO_DAEMON when no daemon answers (no socket, nobody listening, no HELLO in time, the
 * connection closed during HELLO), else EXIT_FAILURE.
 */
int connect_or_explain(struct pb_client **ret);
/* pb_connect(path), tried again every 50 ms for up to --wait's seconds while no daemon is there yet (no socket
 * file, or nobody listening on it): 0 and *ret, or pb_connect's last -errno. connect_or_explain's, and doctor's. */
int pinctl_connect_waiting(const char *path, struct pb_client **ret);
/* A failed request: the daemon's words and what to do, on stderr. Returns EXIT_FAILURE. */
int report_failure(const char *what, int r);

/*
 * --json errors. While on (main turns it on when a command that takes --json is given --json or --format json),
 * every error is also one JSON object on stdout, {"error": {"code", "message", "exit_status"}}, besides its
 * words on stderr; the exit status is the same. Codes: usage, no_daemon, permission_denied, not_found,
 * invalid_argument, daemon_gone, connect_failed, failed.
 */
void pinctl_json_errors_set(bool on);
/* Whether an error has been written as JSON on stdout already. */
bool pinctl_json_error_written(void);
/* An error with no words of its own elsewhere, as JSON on stdout (when on) and on stderr. Returns exit_status. */
__attribute__((format(printf, 3, 4))) int pinctl_error(int exit_status, const char *code, const char *fmt, ...);

/*
 * The options of a command that prints a table (status, leases, jobs, quota list, doctor, config, get,
 * metrics): --json, --format text|csv|json, -o/--output FIELD,..., --no-headers.
 */
struct list_opts {
	bool json, csv, no_headers;
	const char *fields; /* -o FIELD,...; NULL for every field */
};
/* The getopt entries of those options (vals 'j', 'f', 'o', 'N'), for a command's own table. */
#define PINCTL_LIST_OPTIONS                                                             \
	{ "json", no_argument, NULL, 'j' }, { "format", required_argument, NULL, 'f' }, \
		{ "output", required_argument, NULL, 'o' },                             \
	{                                                                               \
		"no-headers", no_argument, NULL, 'N'                                    \
	}
/* The short options string for them: -o FIELDS. */
#define PINCTL_LIST_SHORTOPTS ":o:"
/*
 * o, a getopt val of PINCTL_LIST_OPTIONS, into lo: 0 when o was one of them, 1 when it was not (the command's
 * own), or a usage error (EXIT_USAGE).
 */
int list_option(int o, struct list_opts *lo);
/* Whether lo holds together: -o and --no-headers are for the text and csv forms. 0, or a usage error. */
int list_opts_check(const struct list_opts *lo);
/*
 * A whole table command's options (only those, and no argument beyond nargs_max): PINCTL_OPT_NEXT to go on (the
 * arguments at optind), or the exit status (--help, a usage error).
 */
int parse_list_opts(int argc, char **argv, struct list_opts *lo, int nargs_max);
struct pinctl_field;
struct fields;
/* -o's list against table: 0, or a usage error (EXIT_USAGE) naming the fields there are. */
int select_fields(const struct pinctl_field *table, size_t n, const char *list, struct fields *sel);

/* A whole decimal number in [0, max]: 0, or -EINVAL. */
int parse_u64(const char *s, uint64_t max, uint64_t *ret);

/* The commands, each given its own argv (argv[0] is its name) and returning pinctl's exit status. */
/* pinctl-cmd.c: they ask the daemon and print its answer. */
int cmd_status(int argc, char **argv);
int cmd_leases(int argc, char **argv);
int cmd_acquire(int argc, char **argv);
int cmd_revoke(int argc, char **argv);
int cmd_set(int argc, char **argv);
int cmd_metrics(int argc, char **argv);
int cmd_get(int argc, char **argv);
int cmd_config(int argc, char **argv);
/* pinctl top and pinctl watch (pinctl-top.c). */
int cmd_top(int argc, char **argv);
/* pinctl run [OPTIONS] -- CMD: execs CMD under the interposer; returns only when it cannot (pinctl-run.c). */
int cmd_run(int argc, char **argv);
/* pinctl quota and pinctl jobs (pinctl-quota.c). */
int cmd_quota(int argc, char **argv);
int cmd_jobs(int argc, char **argv);
/* pinctl headroom: what this client may still acquire, each bound with its reason (pinctl-headroom.c). */
int cmd_headroom(int argc, char **argv);
/* pinctl reservations: the groups' reservations alive (pinctl-quota.c). */
int cmd_reservations(int argc, char **argv);
/* pinctl doctor [--json]: check the host's set-up, each finding with its fix (pinctl-doctor.c). */
int cmd_doctor(int argc, char **argv);

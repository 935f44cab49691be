/* SPDX-License-Identifier: MIT */
/* What pinctl.c shares with the commands kept in their own files (pinctl-doctor.c). */
#pragma once

#include <getopt.h>
#include <stdio.h>

#define EXIT_USAGE 2

/* The socket pinctl talks to: --socket, else $PINBROKER_SOCKET, else the default path. Never NULL. */
const char *pinctl_socket(void);
/* A JSON string (RFC 8259) with every unprintable character escaped and non-UTF-8 bytes as U+FFFD. */
void json_str(FILE *f, const char *s);
/* A usage error: one line on stderr ending in "see 'pinctl --help'". Returns EXIT_USAGE. */
__attribute__((format(printf, 1, 2))) int usage_error(const char *fmt, ...);
/* getopt's '?' or ':' for command cmd (NULL before the command) as one usage error. Returns EXIT_USAGE. */
int option_error(const char *cmd, int o, char **argv);

/* The options every command takes after its name too; their getopt vals are 'S' and 'H'. */
#define PINCTL_COMMON_OPTIONS { "socket", required_argument, NULL, 'S' }, { "help", no_argument, NULL, 'H' }
/* command_option's answer when the command's option loop goes on. */
#define PINCTL_OPT_NEXT (-1)
/*
 * An option cmd's own table does not handle: --socket PATH (PINCTL_OPT_NEXT), --help (prints the
 * command's help; returns 0), else getopt's error as option_error (EXIT_USAGE).
 */
int command_option(const char *cmd, int o, char **argv);

/* pinctl doctor's --help text (pinctl-doctor.c). */
extern const char doctor_help[];
/* pinctl doctor [--json]: check the host's set-up, each finding with its fix (pinctl-doctor.c). */
int cmd_doctor(int argc, char **argv);

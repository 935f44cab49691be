/* SPDX-License-Identifier: MIT */
/* What pinctl.c shares with the commands kept in their own files (pinctl-doctor.c). */
#pragma once

#include <getopt.h>
#include <stdint.h>
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

/* Room for any peer string C-escaped: every byte may become \xNN (labels: 4 of 63 bytes, comma-joined). */
#define ESC_BYTES 2200

struct pb_client;
/* Connect to pinctl_socket(), or say why not and what to do on stderr (NULL). */
struct pb_client *connect_or_explain(void);
/* A failed request: the daemon's words and what to do, on stderr. Returns EXIT_FAILURE. */
int report_failure(const char *what, int r);
/* Text from the daemon or other clients made terminal-safe (C-escaped) into buf of ESC_BYTES. */
const char *esc(const char *s, char *buf);

/* A whole decimal number in [0, max]: 0, or -EINVAL. */
int parse_u64(const char *s, uint64_t max, uint64_t *ret);

/* pinctl quota and pinctl jobs, and their --help texts (pinctl-quota.c). */
extern const char quota_help[];
extern const char jobs_help[];
int cmd_quota(int argc, char **argv);
int cmd_jobs(int argc, char **argv);
struct pb_job;
/* "jobs":[{job, bytes, leases, quota_bytes (null without a quota), rule, source}], as pinctl jobs --json has it. */
void json_jobs(FILE *f, const struct pb_job *jobs, size_t n);

/* pinctl doctor's --help text (pinctl-doctor.c). */
extern const char doctor_help[];
/* pinctl doctor [--json]: check the host's set-up, each finding with its fix (pinctl-doctor.c). */
int cmd_doctor(int argc, char **argv);

/* SPDX-License-Identifier: MIT */
/* pinctl's help texts (pinctl-help.c); the texts only, so every room may use them. */
#pragma once

#include <stdio.h>

/* pinctl --help: the usage and every command on one line. */
void pinctl_usage(FILE *f);
/* Command name's --help and the options every command takes, on f: 0, or -ENOENT for no such command. */
int pinctl_help_text(const char *name, FILE *f);

/* The --help texts of quota, jobs and doctor, whose usage errors also show their Usage lines. */
extern const char quota_help[];
extern const char jobs_help[];
extern const char reservations_help[];
extern const char doctor_help[];

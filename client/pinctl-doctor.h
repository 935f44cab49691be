/* SPDX-License-Identifier: MIT */
/* What pinctl doctor shares with its --help text (pinctl-help.c). */
#pragma once

/* The host's /proc and /sys files are read under this folder when set (tests' fixture roots). */
#define DOCTOR_ROOT_ENV "PINBROKER_DOCTOR_ROOT"

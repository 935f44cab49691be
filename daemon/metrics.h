/* SPDX-License-Identifier: MIT */
/* Prometheus metrics (text exposition format) of the daemon's figures and counters. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

struct broker;

/* The metrics as text into *out (malloc'd, *len bytes); per_uid adds the per-uid rows. 0 or a negative errno. */
int metrics_render(const struct broker *b, bool per_uid, double now_s, char **out, size_t *len);

/* Write them to path atomically (a fresh path.XXXXXX, then rename), mode 0644. 0 or a negative errno. */
int metrics_write_file(const struct broker *b, const char *path, double now_s);

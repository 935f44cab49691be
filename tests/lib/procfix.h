/* SPDX-License-Identifier: MIT */
/* A fixture proc root's memory, set by the suites that drive the daemon's pressure through it (FIXTURES_DIR). */
#pragma once

#include <check.h>
#include <stdio.h>
#include <string.h>

#define PROCFIX_MEMTOTAL_KB 24683548ull /* the idle fixture's MemTotal */

/* Write root's meminfo as the idle fixture's with MemAvailable at pct of MemTotal (rename: the sampler sees one or
 * the other). */
static inline void procfix_set_mem_available_pct(const char *root, double pct)
{
	char path[512], tmp[520], line[256];
	FILE *in = fopen(FIXTURES_DIR "/proc/idle/proc/meminfo", "r"), *out;

	ck_assert_ptr_nonnull(in);
	snprintf(path, sizeof(path), "%s/proc/meminfo", root);
	snprintf(tmp, sizeof(tmp), "%s.new", path);
	out = fopen(tmp, "w");
	ck_assert_ptr_nonnull(out);
	while (fgets(line, sizeof(line), in)) {
		if (strncmp(line, "MemAvailable:", 13) == 0)
			fprintf(out, "MemAvailable:   %llu kB\n",
				(unsigned long long)(PROCFIX_MEMTOTAL_KB * pct / 100.0));
		else
			fputs(line, out);
	}
	fclose(in);
	fclose(out);
	ck_assert_int_eq(rename(tmp, path), 0);
}

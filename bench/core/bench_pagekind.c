/* SPDX-License-Identifier: MIT */
/*
 * The client's map time by pool page kind: a warm acquire (map only, PB_ACQUIRE_NO_CUDA, so no GPU is
 * needed) and its release, from a pool of 4 KiB pages (thp = no) against one whose chunks are collapsed
 * into transparent huge pages (thp = yes), each daemon started here with the same pool. The ratio is
 * 4 KiB time / THP time, measured in the same run.
 *
 *   bench_pagekind [--daemon PATH] [--reps N] [--quick]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_common.h"
#include "pinbroker.h"

#define MIB (1024ull * 1024)

struct kind {
	const char *name;
	const char *thp;
	char sock[128];
	pid_t pid;
	pb_client *c;
};

/* Median acquire (map, touch nothing) and release times in µs of reps leases of bytes. */
static void measure(pb_client *c, size_t bytes, int reps, double *acq_us, double *rel_us)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE, .label = "bench-pagekind" };
	double *a = calloc((size_t)reps, sizeof(*a)), *r = calloc((size_t)reps, sizeof(*r));

	if (!a || !r)
		bench_die(-ENOMEM, "allocating samples");
	for (int i = 0; i < reps; i++) {
		uint64_t t0 = bench_now_ns();
		pb_lease *l;
		int e = pb_acquire(c, bytes, &o, &l);

		if (e < 0)
			bench_die(e, "pb_acquire(%zu): %s", bytes, pb_last_error());
		a[i] = (double)(bench_now_ns() - t0) / 1e3;
		t0 = bench_now_ns();
		pb_release(c, l);
		r[i] = (double)(bench_now_ns() - t0) / 1e3;
	}
	*acq_us = bench_percentile(a, (size_t)reps, 50);
	*rel_us = bench_percentile(r, (size_t)reps, 50);
	free(a);
	free(r);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = { { "daemon", required_argument, NULL, 'd' },
					    { "reps", required_argument, NULL, 'r' },
					    { "quick", no_argument, NULL, 'q' },
					    { "help", no_argument, NULL, 'h' },
					    { NULL, 0, NULL, 0 } };
	static const size_t sizes[] = { 2 * MIB, 64 * MIB, 256 * MIB };
	struct kind kinds[2] = { { .name = "4 KiB pages (thp = no)", .thp = "no" },
				 { .name = "THP-collapsed (thp = yes)", .thp = "yes" } };
	const char *daemon = PB_BENCH_DAEMON;
	double res[2][3][2];
	char dir[] = "/tmp/pb-bench-pagekind.XXXXXX", logpath[160];
	int reps = 21, o;

	while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (o) {
		case 'd':
			daemon = optarg;
			break;
		case 'r':
			reps = atoi(optarg) > 0 ? atoi(optarg) : reps;
			break;
		case 'q':
			reps = 5;
			break;
		case 'h':
			printf("usage: bench_pagekind [--daemon PATH] [--reps N] [--quick]\n");
			return 0;
		default:
			fprintf(stderr, "usage: bench_pagekind [--daemon PATH] [--reps N] [--quick]\n");
			return 2;
		}
	}
	if (!mkdtemp(dir))
		bench_die(-errno, "mkdtemp");
	bench_print_host();
	for (int k = 0; k < 2; k++) {
		/* Locked where we may (root), as in production; the page kind does not depend on it. */
		const char *extra[] = { "--prewarm",
					"512M",
					"--budget",
					"1G",
					"--hugetlb",
					"no",
					"--thp",
					kinds[k].thp,
					"--lock-memory",
					geteuid() == 0 ? "yes" : "no",
					"--pool-shrink-delay-ms",
					"3600000",
					NULL };

		snprintf(kinds[k].sock, sizeof(kinds[k].sock), "%s/%s.sock", dir, kinds[k].thp);
		snprintf(logpath, sizeof(logpath), "%s/%s.log", dir, kinds[k].thp);
		kinds[k].pid = bench_daemon_start(daemon, kinds[k].sock, logpath, extra);
		if (pb_connect(kinds[k].sock, &kinds[k].c) < 0)
			bench_die(-ECONNREFUSED, "pb_connect %s: %s", kinds[k].sock, pb_last_error());
	}
	/* Interleaved by size, so the machine's noise falls on both alike. */
	for (size_t s = 0; s < 3; s++)
		for (int k = 0; k < 2; k++)
			measure(kinds[k].c, sizes[s], reps, &res[k][s][0], &res[k][s][1]);

	printf("# client warm acquire (map only, no CUDA) and release, median of %d; pool 512 MiB, 2 MiB chunks\n",
	       reps);
	printf("| pool | 2 MiB acquire | 64 MiB acquire | 256 MiB acquire | 2 MiB release | 64 MiB release | 256 MiB release |\n");
	printf("|---|---:|---:|---:|---:|---:|---:|\n");
	for (int k = 0; k < 2; k++)
		printf("| %s | %.0f µs | %.0f µs | %.0f µs | %.0f µs | %.0f µs | %.0f µs |\n", kinds[k].name,
		       res[k][0][0], res[k][1][0], res[k][2][0], res[k][0][1], res[k][1][1], res[k][2][1]);
	printf("| 4 KiB ÷ THP | %.1f× | %.1f× | %.1f× | %.1f× | %.1f× | %.1f× |\n", res[0][0][0] / res[1][0][0],
	       res[0][1][0] / res[1][1][0], res[0][2][0] / res[1][2][0], res[0][0][1] / res[1][0][1],
	       res[0][1][1] / res[1][1][1], res[0][2][1] / res[1][2][1]);
	for (int k = 0; k < 2; k++) {
		struct pb_status *st;

		if (pb_status_get(kinds[k].c, &st) == 0) {
			printf("# %s: daemon reports page kind %s, %llu MiB THP-collapsed\n", kinds[k].name,
			       st->page_kind, (unsigned long long)(st->thp_bytes / MIB));
			pb_status_free(st);
		}
		pb_disconnect(kinds[k].c);
		bench_daemon_stop(kinds[k].pid);
	}
	snprintf(logpath, sizeof(logpath), "rm -rf '%s'", dir);
	if (system(logpath) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return 0;
}

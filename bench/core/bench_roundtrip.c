/* SPDX-License-Identifier: MIT */
/*
 * Lease round trip: pb_acquire (map only, no CUDA, no client cache) and pb_release of 4 KiB, 2 MiB and 64 MiB
 * (the pool on its default page kind: THP where the kernel collapses shmem) against a daemon of its own, in µs.
 * Nothing judged: bench/compare-lease.sh --roundtrip runs it against two builds' daemons and libraries in turn
 * and compares their medians, the only comparison this figure means.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bench_common.h"
#include "pinbroker.h"

#define KIB ((size_t)1024)
#define MIB (1024 * KIB)
/* Round trips before timing: the pool's chunks made and the code paths warm. */
#define WARMUP 200
/* Timed round trips at most: 10 million take minutes and 80 MB of samples. */
#define MAX_ITERS 10000000

static void usage(FILE *f)
{
	fprintf(f,
		"usage: bench_roundtrip [--daemon PATH] [--iters N]\n"
		"Times pb_acquire + pb_release (no CUDA, no cache) of 4 KiB, 2 MiB and 64 MiB leases; prints p50, p99 and mean.\n");
}

/* p50, p99 and mean µs of iters round trips of bytes (v: scratch of iters). */
static void measure(pb_client *c, size_t bytes, unsigned iters, double *v, double out[3])
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
	double sum = 0;

	for (int i = -WARMUP; i < (int)iters; i++) {
		uint64_t t0 = bench_now_ns();
		pb_lease *l;
		int r = pb_acquire(c, bytes, &o, &l);

		if (r < 0)
			bench_die(r, "pb_acquire %zu: %s", bytes, pb_last_error());
		*(volatile char *)pb_lease_data(l) = 1; /* the mapping is there, and usable */
		r = pb_release(c, l);
		if (r < 0)
			bench_die(r, "pb_release: %s", pb_last_error());
		if (i >= 0) {
			v[i] = (double)(bench_now_ns() - t0) / 1e3;
			sum += v[i];
		}
	}
	out[2] = sum / iters;
	out[1] = bench_percentile(v, iters, 99);
	out[0] = bench_percentile(v, iters, 50);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = { { "daemon", required_argument, NULL, 'd' },
					    { "iters", required_argument, NULL, 'i' },
					    { "help", no_argument, NULL, 'h' },
					    { NULL, 0, NULL, 0 } };
	static const size_t sizes[] = { 4 * KIB, 2 * MIB, 64 * MIB };
	const char *daemon = PB_BENCH_DAEMON;
	char dir[] = "/tmp/pb-bench-roundtrip.XXXXXX", sock[160], logpath[160];
	unsigned iters = 3000;
	double *v, res[3];
	pb_client *c;
	pid_t pid;
	int o;

	while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (o) {
		case 'd':
			daemon = optarg;
			break;
		case 'i': {
			char *end;
			unsigned long n;

			errno = 0;
			n = strtoul(optarg, &end, 10);
			if (errno || end == optarg || *end || n == 0 || n > MAX_ITERS) {
				fprintf(stderr, "bench_roundtrip: --iters takes 1 to %d, not '%s'\n", MAX_ITERS,
					optarg);
				usage(stderr);
				return 2;
			}
			iters = (unsigned)n;
			break;
		}
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}
	if (!mkdtemp(dir))
		bench_die(-errno, "mkdtemp");
	snprintf(sock, sizeof(sock), "%s/pb.sock", dir);
	snprintf(logpath, sizeof(logpath), "%s/pinbrokerd.log", dir);
	{
		const char *extra[] = {
			"--budget", "2G", "--prewarm", "512M", "--lock-memory", geteuid() == 0 ? "yes" : "no", NULL
		};

		pid = bench_daemon_start(daemon, sock, logpath, extra);
	}
	if (pb_connect(sock, &c) < 0)
		bench_die(-ECONNREFUSED, "pb_connect %s: %s", sock, pb_last_error());
	pb_set_cache_limit(c, 0);
	v = malloc(iters * sizeof(*v));
	if (!v)
		bench_die(-ENOMEM, "malloc");
	printf("| size | p50 µs | p99 µs | mean µs |\n|---|---:|---:|---:|\n");
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		measure(c, sizes[s], iters, v, res);
		printf("| %zu %s | %.1f | %.1f | %.1f |\n", sizes[s] < MIB ? sizes[s] / KIB : sizes[s] / MIB,
		       sizes[s] < MIB ? "KiB" : "MiB", res[0], res[1], res[2]);
	}
	free(v);
	pb_disconnect(c);
	bench_daemon_stop(pid);
	unlink(logpath);
	unlink(sock);
	rmdir(dir);
	return 0;
}

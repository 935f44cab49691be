/* SPDX-License-Identifier: MIT */
/*
 * What the tenant rule costs (issue 38, finding 3): pb_acquire latency when the warm pool hands a tenant its own
 * released chunks (the baseline) against a hand-over between two tenants of one uid (two pid namespaces), which
 * gets fresh memory in place of the other's idle chunks, at 8 MiB, 256 MiB and 1 GiB, on a daemon of its own. Then,
 * in this process and without a daemon, what the ways of clearing 1 GiB of shmem cost: zeroing through a mapping,
 * punching it out and faulting it back, or a fresh memfd; the pool takes the last (a scrub leaves a view the last
 * tenant kept looking at the next one's pages). Run as root (mlock, unshare).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <sched.h>
#include <stdbool.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"
#include "pinbroker.h"

#define MIB (1024ull * 1024)
#define GIB (1024 * MIB)
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

struct cmd {
	char op; /* 'a' acquire (timed), 'r' release, 'q' quit */
	uint64_t bytes;
};

/* A client's loop: commands on in, answers (acquire ns, or 0) on out. */
static void client_loop(const char *sock, int in, int out)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
	pb_lease *l = NULL;
	pb_client *c;
	struct cmd cmd;
	int r;

	r = pb_connect(sock, &c);
	if (r < 0)
		bench_die(r, "pb_connect: %s", pb_last_error());
	pb_set_cache_limit(c, 0);
	while (read(in, &cmd, sizeof(cmd)) == (ssize_t)sizeof(cmd)) {
		uint64_t ns = 0;

		if (cmd.op == 'q')
			break;
		if (cmd.op == 'a') {
			uint64_t t0 = bench_now_ns();

			r = pb_acquire(c, cmd.bytes, &o, &l);
			ns = bench_now_ns() - t0;
			if (r < 0)
				bench_die(r, "pb_acquire %llu: %s", (unsigned long long)cmd.bytes, pb_last_error());
			*(volatile char *)pb_lease_data(l) = 1;
		} else if (cmd.op == 'r' && l) {
			r = pb_release(c, l);
			if (r < 0)
				bench_die(r, "pb_release: %s", pb_last_error());
			l = NULL;
		}
		if (write(out, &ns, sizeof(ns)) != (ssize_t)sizeof(ns))
			break;
	}
	pb_disconnect(c);
	_exit(0);
}

struct client {
	pid_t pid;
	int to, from;
};

/* A client beside this process, or (new_pidns) pid 1 of a pid namespace of its own: another tenant of the same uid. */
static struct client client_start(const char *sock, bool new_pidns)
{
	int a[2], b[2];
	struct client cl;

	if (pipe(a) < 0 || pipe(b) < 0)
		bench_die(-errno, "pipe");
	cl.pid = fork();
	if (cl.pid < 0)
		bench_die(-errno, "fork");
	if (cl.pid == 0) {
		close(a[1]);
		close(b[0]);
		if (new_pidns) {
			pid_t in;
			int st;

			if (unshare(CLONE_NEWPID) < 0)
				bench_die(-errno, "unshare(CLONE_NEWPID) (run as root)");
			in = fork();
			if (in == 0)
				client_loop(sock, a[0], b[1]);
			waitpid(in, &st, 0);
			_exit(0);
		}
		client_loop(sock, a[0], b[1]);
	}
	close(a[0]);
	close(b[1]);
	cl.to = a[1];
	cl.from = b[0];
	return cl;
}

static uint64_t client_do(struct client *cl, char op, uint64_t bytes)
{
	struct cmd cmd = { .op = op, .bytes = bytes };
	uint64_t ns;

	if (write(cl->to, &cmd, sizeof(cmd)) != (ssize_t)sizeof(cmd) || read(cl->from, &ns, sizeof(ns)) != sizeof(ns))
		bench_die(-EPIPE, "a client went away");
	return ns;
}

static void client_stop(struct client *cl)
{
	struct cmd cmd = { .op = 'q' };
	int st;

	if (write(cl->to, &cmd, sizeof(cmd)) < 0)
		perror("write");
	close(cl->to);
	close(cl->from);
	waitpid(cl->pid, &st, 0);
}

/* p50 ms of the same tenant acquiring its own released chunks, and of two tenants handing chunks over in turn. */
static void measure(const char *sock, uint64_t bytes, unsigned iters, double *same_ms, double *cross_ms)
{
	struct client x = client_start(sock, true), y = client_start(sock, false);
	double *same = calloc(iters, sizeof(double)), *cross = calloc(iters, sizeof(double));

	if (!same || !cross)
		bench_die(-ENOMEM, "calloc");
	/* Same tenant: y's chunks come back to y. The first acquire makes them. */
	client_do(&y, 'a', bytes);
	client_do(&y, 'r', 0);
	for (unsigned i = 0; i < iters; i++) {
		same[i] = (double)client_do(&y, 'a', bytes) / 1e6;
		client_do(&y, 'r', 0);
	}
	/* Across tenants: each acquire finds only the other tenant's idle chunks and gets fresh ones in their place. */
	for (unsigned i = 0; i < iters; i++) {
		struct client *t = i % 2 ? &y : &x;

		cross[i] = (double)client_do(t, 'a', bytes) / 1e6;
		client_do(t, 'r', 0);
	}
	*same_ms = bench_percentile(same, iters, 50);
	*cross_ms = bench_percentile(cross, iters, 50);
	client_stop(&x);
	client_stop(&y);
	free(same);
	free(cross);
}

/* ms to clear bytes of a populated, locked shmem chunk each way (the daemon's side of a scrub), p50 of iters. */
static void clear_costs(uint64_t bytes, unsigned iters, double out[3])
{
	double v[3][16];

	for (unsigned i = 0; i < iters && i < 16; i++) {
		int fd = memfd_create("bench-tenant", MFD_CLOEXEC);
		uint8_t *p;
		uint64_t t0;

		if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0)
			bench_die(-errno, "memfd");
		p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
		if (p == MAP_FAILED || mlock(p, bytes) < 0)
			bench_die(-errno, "mmap/mlock %llu", (unsigned long long)bytes);
		memset(p, 0x5A, bytes);
		/* Zero through the daemon's own mapping: what a scrub on the loop (or a warm-up thread) costs. */
		t0 = bench_now_ns();
		memset(p, 0, bytes);
		v[0][i] = (double)(bench_now_ns() - t0) / 1e6;
		/* Punch every page out and fault fresh zero pages back in, locked. */
		t0 = bench_now_ns();
		if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)bytes) < 0 ||
		    madvise(p, bytes, MADV_POPULATE_WRITE) < 0 || mlock(p, bytes) < 0)
			bench_die(-errno, "punch and refault");
		v[1][i] = (double)(bench_now_ns() - t0) / 1e6;
		munmap(p, bytes);
		close(fd);
		/* A fresh memfd of the size, populated and locked (the pool's fresh chunk, before any THP collapse). */
		t0 = bench_now_ns();
		fd = memfd_create("bench-tenant", MFD_CLOEXEC);
		if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0)
			bench_die(-errno, "memfd");
		p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
		if (p == MAP_FAILED || mlock(p, bytes) < 0)
			bench_die(-errno, "fresh memfd");
		v[2][i] = (double)(bench_now_ns() - t0) / 1e6;
		munmap(p, bytes);
		close(fd);
	}
	for (int k = 0; k < 3; k++)
		out[k] = bench_percentile(v[k], iters < 16 ? iters : 16, 50);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = { { "daemon", required_argument, NULL, 'd' },
					    { "quick", no_argument, NULL, 'q' },
					    { "help", no_argument, NULL, 'h' },
					    { NULL, 0, NULL, 0 } };
	static const uint64_t sizes[] = { 8 * MIB, 256 * MIB, GIB };
	static const char *const names[] = { "8 MiB", "256 MiB", "1 GiB" };
	const char *daemon = PB_BENCH_DAEMON;
	char dir[] = "/tmp/pb-bench-tenant.XXXXXX", sock[64], logp[80];
	unsigned iters = 9;
	double clear[3];
	pid_t pid;
	int opt;

	while ((opt = getopt_long(argc, argv, "d:qh", lo, NULL)) != -1) {
		if (opt == 'd') {
			daemon = optarg;
		} else if (opt == 'q') {
			iters = 3;
		} else {
			fprintf(opt == 'h' ? stdout : stderr,
				"usage: bench_tenant [--daemon PATH] [--quick]\n"
				"pb_acquire p50 within one tenant (warm) and across two tenants of one uid (fresh memory), "
				"and the cost of clearing 1 GiB of shmem three ways. As root.\n");
			return opt == 'h' ? 0 : 2;
		}
	}
	if (!mkdtemp(dir))
		bench_die(-errno, "mkdtemp");
	snprintf(sock, sizeof(sock), "%s/pb.sock", dir);
	snprintf(logp, sizeof(logp), "%s/daemon.log", dir);
	pid = bench_daemon_start(daemon, sock, logp,
				 (const char *const[]){ "--budget", "4G", "--prewarm", "0", "--hugetlb", "no", NULL });
	bench_print_host();
	printf("# pinbrokerd %s, budget 4G, prewarm 0, hugetlb no (thp auto); p50 of %u acquires (map, populate, "
	       "one touch), no CUDA, no client cache\n",
	       daemon, iters);
	printf("%-8s %14s %16s %8s\n", "size", "same tenant ms", "other tenant ms", "ratio");
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		double same, cross;

		measure(sock, sizes[i], iters, &same, &cross);
		printf("%-8s %14.2f %16.2f %7.1fx\n", names[i], same, cross, same > 0 ? cross / same : 0);
		fflush(stdout);
	}
	bench_daemon_stop(pid);
	clear_costs(GIB, iters < 5 ? iters : 5, clear);
	printf("# clearing 1 GiB of populated, locked 4 KiB shmem in this process, p50 of %u\n", iters < 5 ? iters : 5);
	printf("%-34s %10s %8s\n", "way", "ms per GiB", "ratio");
	printf("%-34s %10.1f %7.1fx\n", "memset 0 through a mapping", clear[0], 1.0);
	printf("%-34s %10.1f %7.1fx\n", "punch hole + populate + mlock", clear[1],
	       clear[0] > 0 ? clear[1] / clear[0] : 0);
	printf("%-34s %10.1f %7.1fx\n", "fresh memfd + populate + mlock", clear[2],
	       clear[0] > 0 ? clear[2] / clear[0] : 0);
	bench_print_load();
	unlink(sock);
	unlink(logp);
	rmdir(dir);
	return 0;
}

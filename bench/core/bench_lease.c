/* SPDX-License-Identifier: MIT */
/* Lease benchmark (issue 2 §7): pinbrokerd's acquire/map/touch/release against a raw SCM_RIGHTS floor, plus RSS and idle CPU. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"
#include "pinbroker.h"

#define CHUNK_BYTES (2u << 20) /* the daemon's default chunk-size */
#define POOL_CHUNKS 128u       /* 256 MiB: the daemon's default prewarm */
#define MAX_LEASE_CHUNKS 32u   /* 64 MiB, the largest size measured */
#define ONE_PAGE 0u            /* a cycle's chunk count for a 4 KiB lease: one page, the smallest there is */
#define FLOOR_MAX_CONNS 256
#define PAGE_BYTES 4096u /* no hugetlb on this machine kind; the daemon reports 4 KiB pages */
#define CHILD_RESULT_TIMEOUT_MS 60000
#define MAX_PROCS 64

static const char *daemon_path = PB_BENCH_DAEMON;
static unsigned duration_s = 3;
static unsigned idle_s = 10;
static unsigned iters_small = 2000, iters_large = 200;
static char floor_sock[108], broker_sock[108], broker_log[128];

/* ---------------------------------------------------------------- the floor server */

/*
 * The floor: what any fd-lending server must do and nothing more. A pool of
 * pre-faulted, mlocked 2 MiB memfd chunks; one epoll loop, single-threaded
 * like pinbrokerd; a request byte n (1..32) is answered by one byte and n
 * chunk fds via SCM_RIGHTS; a release byte 0 returns every chunk that
 * connection holds and is acked with one byte (libpinbroker's pb_release
 * waits for the daemon's answer too, so both sides do two round trips).
 */
struct floor_conn {
	int fd;
	unsigned nheld;
	unsigned held[MAX_LEASE_CHUNKS];
};

static int floor_free[POOL_CHUNKS], floor_nfree;
static int floor_fds[POOL_CHUNKS];

static void floor_pool_init(void)
{
	for (unsigned i = 0; i < POOL_CHUNKS; i++) {
		int fd = memfd_create("floor-chunk", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		void *p;

		if (fd < 0)
			bench_die(-errno, "floor: memfd_create");
		if (ftruncate(fd, CHUNK_BYTES) < 0)
			bench_die(-errno, "floor: ftruncate");
		if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
			bench_die(-errno, "floor: F_ADD_SEALS");
		p = mmap(NULL, CHUNK_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED)
			bench_die(-errno, "floor: mmap");
		if (madvise(p, CHUNK_BYTES, MADV_POPULATE_WRITE) < 0)
			bench_die(-errno, "floor: MADV_POPULATE_WRITE");
		if (mlock(p, CHUNK_BYTES) < 0)
			bench_die(-errno, "floor: mlock");
		/* The mapping stays, as the daemon's does: it keeps the pages locked. */
		floor_fds[i] = fd;
		floor_free[floor_nfree++] = (int)i;
	}
}

static void floor_return(struct floor_conn *fc)
{
	for (unsigned i = 0; i < fc->nheld; i++)
		floor_free[floor_nfree++] = (int)fc->held[i];
	fc->nheld = 0;
}

static int floor_send(int fd, uint8_t byte, const int *fds, unsigned nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * MAX_LEASE_CHUNKS)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (nfds) {
		struct cmsghdr *cm;

		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
	}
	return sendmsg(fd, &mh, MSG_NOSIGNAL) == 1 ? 0 : -errno;
}

/* One request from fc; returns false when the connection must close. */
static bool floor_serve(struct floor_conn *fc)
{
	int fds[MAX_LEASE_CHUNKS];
	uint8_t req;
	ssize_t n = recv(fc->fd, &req, 1, MSG_DONTWAIT);

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return true;
	if (n <= 0)
		return false;
	if (req == 0) {
		floor_return(fc);
		return floor_send(fc->fd, 0, NULL, 0) == 0;
	}
	if (req > MAX_LEASE_CHUNKS || fc->nheld + req > MAX_LEASE_CHUNKS || (int)req > floor_nfree)
		return floor_send(fc->fd, 0, NULL, 0) == 0;
	for (unsigned i = 0; i < req; i++) {
		int idx = floor_free[--floor_nfree];

		fc->held[fc->nheld++] = (unsigned)idx;
		fds[i] = floor_fds[idx];
	}
	return floor_send(fc->fd, req, fds, req) == 0;
}

static void floor_server_main(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	static struct floor_conn conns[FLOOR_MAX_CONNS];
	struct epoll_event ev;
	int lfd, ep;

	floor_pool_init();
	lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (lfd < 0)
		bench_die(-errno, "floor: socket");
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 128) < 0)
		bench_die(-errno, "floor: bind/listen %s", path);
	ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0)
		bench_die(-errno, "floor: epoll_create1");
	ev = (struct epoll_event){ .events = EPOLLIN, .data.ptr = NULL };
	if (epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) < 0)
		bench_die(-errno, "floor: epoll_ctl");
	for (int i = 0; i < FLOOR_MAX_CONNS; i++)
		conns[i].fd = -1;

	for (;;) {
		struct epoll_event evs[64];
		int n = epoll_wait(ep, evs, 64, -1);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			bench_die(-errno, "floor: epoll_wait");
		for (int i = 0; i < n; i++) {
			struct floor_conn *fc = evs[i].data.ptr;

			if (!fc) {
				int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
				int slot = -1;

				if (cfd < 0)
					continue;
				for (int k = 0; k < FLOOR_MAX_CONNS && slot < 0; k++)
					if (conns[k].fd < 0)
						slot = k;
				if (slot < 0) {
					close(cfd);
					continue;
				}
				conns[slot].fd = cfd;
				conns[slot].nheld = 0;
				ev = (struct epoll_event){ .events = EPOLLIN, .data.ptr = &conns[slot] };
				if (epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &ev) < 0)
					bench_die(-errno, "floor: epoll_ctl");
				continue;
			}
			if (!floor_serve(fc)) {
				floor_return(fc);
				epoll_ctl(ep, EPOLL_CTL_DEL, fc->fd, NULL);
				close(fc->fd);
				fc->fd = -1;
			}
		}
	}
}

static pid_t floor_start(void)
{
	uint64_t deadline = bench_now_ns() + 30000000000ull;
	pid_t pid;

	if (unlink(floor_sock) < 0 && errno != ENOENT)
		bench_die(-errno, "unlink %s", floor_sock);
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		bench_die(-errno, "fork");
	if (pid == 0) {
		floor_server_main(floor_sock);
		_exit(0);
	}
	while (bench_now_ns() < deadline) {
		if (access(floor_sock, F_OK) == 0)
			return pid;
		bench_sleep_ms(5);
	}
	bench_die(0, "floor server did not start");
}

/* ---------------------------------------------------------------- the two clients */

enum cycle {
	CYCLE_LAZY,      /* floor only: map without populating, no touch (the "bare round trip") */
	CYCLE_POPULATED, /* map with MAP_POPULATE as libpinbroker does, no touch */
	CYCLE_TOUCHED,   /* map with MAP_POPULATE as libpinbroker does, then write one byte per page */
	CYCLE_FAULTED,   /* floor only: map without populating, then touch: every page a fault */
};

struct client {
	bool floor;
	int fd;        /* floor */
	pb_client *pb; /* broker */
};

static void client_open(struct client *c, bool is_floor)
{
	c->floor = is_floor;
	c->fd = -1;
	c->pb = NULL;
	if (is_floor) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };

		c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		if (c->fd < 0)
			bench_die(-errno, "socket");
		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", floor_sock);
		if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
			bench_die(-errno, "connect %s", floor_sock);
	} else {
		int r = pb_connect(broker_sock, &c->pb);

		if (r < 0)
			bench_die(r, "pb_connect %s: %s", broker_sock, pb_last_error());
		pb_set_cache_limit(c->pb, 0);
	}
}

static void client_close(struct client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	pb_disconnect(c->pb);
}

static void touch(volatile uint8_t *p, size_t bytes)
{
	for (size_t off = 0; off < bytes; off += PAGE_BYTES)
		p[off] = 1;
}

/* Receive the one-byte answer and its fds. Returns the byte, or -errno. */
static int floor_recv(int fd, int *fds, unsigned max_fds, unsigned *nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * MAX_LEASE_CHUNKS)];
		struct cmsghdr align;
	} u;
	uint8_t byte;
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *cm;
	ssize_t n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);

	*nfds = 0;
	if (n < 0)
		return -errno;
	if (n == 0)
		return -ECONNRESET;
	for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
			unsigned k = (unsigned)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));

			if (k > max_fds)
				return -EBADMSG;
			memcpy(fds, CMSG_DATA(cm), k * sizeof(int));
			*nfds = k;
		}
	if (mh.msg_flags & MSG_CTRUNC)
		return -EBADMSG;
	return byte;
}

/* One floor cycle: request, map back to back into one reserved range, maybe touch, unmap, release. */
static int floor_cycle(struct client *c, unsigned nchunks, enum cycle cy)
{
	int fds[MAX_LEASE_CHUNKS];
	/* ONE_PAGE: one chunk lent, one page of it mapped (the broker makes a 4 KiB memfd, a tail, instead). */
	unsigned nreq = nchunks == ONE_PAGE ? 1 : nchunks;
	size_t each = nchunks == ONE_PAGE ? PAGE_BYTES : CHUNK_BYTES, total = (size_t)nreq * each;
	int populate = cy == CYCLE_POPULATED || cy == CYCLE_TOUCHED ? MAP_POPULATE : 0;
	uint8_t req = (uint8_t)nreq, rel = 0;
	unsigned nfds;
	uint8_t *base;
	int r;

	if (send(c->fd, &req, 1, MSG_NOSIGNAL) != 1)
		return -errno;
	r = floor_recv(c->fd, fds, MAX_LEASE_CHUNKS, &nfds);
	if (r < 0)
		return r;
	if ((unsigned)r != nreq || nfds != nreq) {
		for (unsigned i = 0; i < nfds; i++)
			close(fds[i]);
		return -ENOSPC;
	}
	base = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (base == MAP_FAILED)
		return -errno;
	for (unsigned i = 0; i < nreq; i++) {
		if (mmap(base + (size_t)i * each, each, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | populate,
			 fds[i], 0) == MAP_FAILED)
			bench_die(-errno, "floor: mmap chunk");
		close(fds[i]);
	}
	if (cy == CYCLE_TOUCHED || cy == CYCLE_FAULTED)
		touch(base, total);
	if (munmap(base, total) < 0)
		return -errno;
	if (send(c->fd, &rel, 1, MSG_NOSIGNAL) != 1)
		return -errno;
	r = floor_recv(c->fd, fds, MAX_LEASE_CHUNKS, &nfds);
	return r < 0 ? r : 0;
}

static int broker_cycle(struct client *c, unsigned nchunks, enum cycle cy)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
	size_t total = nchunks == ONE_PAGE ? PAGE_BYTES : (size_t)nchunks * CHUNK_BYTES;
	pb_lease *l;
	int r = pb_acquire(c->pb, total, &o, &l);

	if (r < 0)
		return r;
	if (cy == CYCLE_TOUCHED)
		touch(pb_lease_data(l), total);
	return pb_release(c->pb, l);
}

static int cycle(struct client *c, unsigned nchunks, enum cycle cy)
{
	return c->floor ? floor_cycle(c, nchunks, cy) : broker_cycle(c, nchunks, cy);
}

/* ---------------------------------------------------------------- latency */

struct lat {
	double p50_us, p99_us;
};

/*
 * Floor and broker alternate in ROUNDS blocks so drift (other tenants, CPU
 * frequency) hits both alike. One warm-up block each first.
 */
#define ROUNDS 10
#define WARMUP 20

static void latency(unsigned nchunks, enum cycle cy, unsigned iters, bool with_broker, struct lat *fl, struct lat *br)
{
	double *v[2];
	size_t n[2] = { 0, 0 };
	struct client cl[2];

	for (int s = 0; s < 2; s++) {
		v[s] = calloc(iters + ROUNDS, sizeof(double));
		if (!v[s])
			bench_die(-ENOMEM, "calloc");
		if (s == 0 || with_broker)
			client_open(&cl[s], s == 0);
	}
	for (int s = 0; s < (with_broker ? 2 : 1); s++)
		for (unsigned i = 0; i < WARMUP; i++) {
			int r = cycle(&cl[s], nchunks, cy);

			if (r < 0)
				bench_die(r, "%s warm-up cycle: %s", s ? "broker" : "floor", s ? pb_last_error() : "");
		}
	for (unsigned round = 0; round < ROUNDS; round++)
		for (int s = 0; s < (with_broker ? 2 : 1); s++)
			for (unsigned i = 0; i < iters / ROUNDS; i++) {
				uint64_t t0 = bench_now_ns();
				int r = cycle(&cl[s], nchunks, cy);

				if (r < 0)
					bench_die(r, "%s cycle: %s", s ? "broker" : "floor", s ? pb_last_error() : "");
				v[s][n[s]++] = (double)(bench_now_ns() - t0) / 1000.0;
			}
	fl->p50_us = bench_percentile(v[0], n[0], 50);
	fl->p99_us = bench_percentile(v[0], n[0], 99);
	if (with_broker) {
		br->p50_us = bench_percentile(v[1], n[1], 50);
		br->p99_us = bench_percentile(v[1], n[1], 99);
	}
	for (int s = 0; s < 2; s++) {
		free(v[s]);
		if (s == 0 || with_broker)
			client_close(&cl[s]);
	}
}

/* ---------------------------------------------------------------- throughput */

struct child_result {
	uint64_t ops;
	uint64_t errors;
};

static void child_loop(bool is_floor, enum cycle cy, int start_rd, int result_wr)
{
	struct child_result res = { 0, 0 };
	struct client c;
	uint64_t start_ns, end_ns;

	client_open(&c, is_floor);
	if (read(start_rd, &start_ns, sizeof(start_ns)) != sizeof(start_ns))
		_exit(2);
	end_ns = start_ns + (uint64_t)duration_s * 1000000000ull;
	while (bench_now_ns() < start_ns)
		bench_sleep_ms(1);
	while (bench_now_ns() < end_ns) {
		if (cycle(&c, 1, cy) == 0)
			res.ops++;
		else
			res.errors++;
	}
	if (write(result_wr, &res, sizeof(res)) != sizeof(res))
		_exit(3);
	client_close(&c);
	_exit(0);
}

/* Aggregate ops/s of nprocs processes looping 2 MiB cycles for duration_s. */
static double throughput(bool is_floor, enum cycle cy, unsigned nprocs, uint64_t *errors)
{
	int sp[2], rp[2];
	pid_t pids[MAX_PROCS];
	uint64_t start_ns, ops = 0;
	int r;

	*errors = 0;
	if (pipe2(sp, O_CLOEXEC) < 0 || pipe2(rp, O_CLOEXEC) < 0)
		bench_die(-errno, "pipe2");
	fflush(NULL);
	for (unsigned i = 0; i < nprocs; i++) {
		pids[i] = fork();
		if (pids[i] < 0)
			bench_die(-errno, "fork");
		if (pids[i] == 0) {
			close(sp[1]);
			close(rp[0]);
			child_loop(is_floor, cy, sp[0], rp[1]);
		}
	}
	close(sp[0]);
	close(rp[1]);
	/* Everyone starts together, 300 ms from now: time to connect first. */
	start_ns = bench_now_ns() + 300000000ull;
	for (unsigned i = 0; i < nprocs; i++)
		if (write(sp[1], &start_ns, sizeof(start_ns)) != sizeof(start_ns))
			bench_die(-errno, "write start");
	close(sp[1]);
	for (unsigned i = 0; i < nprocs; i++) {
		struct pollfd pfd = { .fd = rp[0], .events = POLLIN };
		struct child_result res;

		r = poll(&pfd, 1, CHILD_RESULT_TIMEOUT_MS);
		if (r <= 0)
			bench_die(r < 0 ? -errno : -ETIMEDOUT, "waiting for benchmark children");
		if (read(rp[0], &res, sizeof(res)) != sizeof(res))
			bench_die(-errno, "a benchmark child died without a result");
		ops += res.ops;
		*errors += res.errors;
	}
	close(rp[0]);
	for (unsigned i = 0; i < nprocs; i++) {
		int st;

		if (waitpid(pids[i], &st, 0) < 0)
			bench_die(-errno, "waitpid");
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			bench_die(0, "benchmark child %d failed (status %d)", (int)pids[i], st);
	}
	return (double)ops / (double)duration_s;
}

/* ---------------------------------------------------------------- main */

static void usage(int code)
{
	printf("Usage: bench_lease [--daemon PATH] [--duration-s N] [--idle-s N] [--iters N] [--quick] [--cache-only]\n"
	       "Runs a raw SCM_RIGHTS floor server and pinbrokerd side by side and prints ratios.\n"
	       "Exits 1 when a target is missed (the no-touch rows, where both sides do the same work).\n"
	       "--cache-only: only the client cache's tables (pinbrokerd alone, nothing judged).\n");
	exit(code);
}

static const char *mark(bool ok)
{
	return ok ? "met" : "MISSED";
}

/* The targets (issue 2 §7, judged like for like since issue 24). */
#define P50_RATIO_MAX 1.5 /* broker p50 over the floor's, no-touch rows */
#define OPS_RATIO_MIN 0.7 /* broker ops/s over the floor's, no-touch rows, at each concurrency */
#define RSS_OUTSIDE_MAX_MIB 8.0

/* Every judged figure, printed again together at the end against its bound. */
static struct judged {
	char what[96];
	double value, limit;
	bool at_most; /* value ≤ limit, else value ≥ limit */
	const char *unit;
	bool ok;
} judged[16];
static size_t njudged;

/* Records one judged figure (and extra, a condition besides the bound: no errors); returns whether it is met. */
static bool judge(const char *what, double value, double limit, bool at_most, const char *unit, bool extra)
{
	bool ok = (at_most ? value <= limit : value >= limit) && extra;

	if (njudged < sizeof(judged) / sizeof(judged[0])) {
		struct judged *j = &judged[njudged++];

		snprintf(j->what, sizeof(j->what), "%s", what);
		j->value = value;
		j->limit = limit;
		j->at_most = at_most;
		j->unit = unit;
		j->ok = ok;
	}
	return ok;
}

static void print_judged(void)
{
	printf("### Targets\n\n| target | measured | bound | |\n|---|---:|---:|---|\n");
	for (size_t i = 0; i < njudged; i++)
		printf("| %s | %.2f%s | %s %.2f%s | %s |\n", judged[i].what, judged[i].value, judged[i].unit,
		       judged[i].at_most ? "≤" : "≥", judged[i].limit, judged[i].unit, mark(judged[i].ok));
	printf("\nRatios are the broker's figure over the floor's measured in the same run.\n");
}

/* ---------------------------------------------------------------- the client cache */

/* Median µs of one pb_acquire + pb_release pair of bytes with flags, on c, over iters pairs in ROUNDS blocks. */
static double cache_pair_us(pb_client *c, size_t bytes, uint32_t flags, unsigned iters)
{
	struct pb_acquire_opts o = { .flags = flags };
	double *v = calloc(ROUNDS, sizeof(double));
	unsigned per = iters / ROUNDS;
	double med;

	if (!v)
		bench_die(-ENOMEM, "calloc");
	for (unsigned round = 0; round <= ROUNDS; round++) {
		uint64_t t0 = bench_now_ns();

		for (unsigned i = 0; i < per; i++) {
			pb_lease *l;
			int r = pb_acquire(c, bytes, &o, &l);

			if (r < 0)
				bench_die(r, "cache pair: pb_acquire: %s", pb_last_error());
			pb_release(c, l);
		}
		/* Round 0 warms up (the first lease is a real acquire). */
		if (round > 0)
			v[round - 1] = (double)(bench_now_ns() - t0) / 1000.0 / per;
	}
	med = bench_percentile(v, ROUNDS, 50);
	free(v);
	return med;
}

/*
 * The torch allocator's steady state: a never-revoked, DEVICEMAP lease freed and taken again at the same size.
 * With the client cache (slack 0) the pair is two locked list operations; without it, two round trips.
 */
static void cache_table(void)
{
	static const size_t sizes[] = { 64u << 10, 1u << 20, 16u << 20 };
	const uint32_t flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_REVOKE | PB_ACQUIRE_MAPPED;
	pb_client *c;
	int r = pb_connect(broker_sock, &c);

	if (r < 0)
		bench_die(r, "pb_connect: %s", pb_last_error());
	printf("### The client cache: a never-revoked lease released and acquired again at the same size "
	       "(the torch allocator's steady state)\n\n");
	printf("| size | pair, no cache (µs) | pair, cached (µs) | speed-up |\n|---|---:|---:|---:|\n");
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		double uncached, cached;

		pb_set_cache_limit(c, 0);
		uncached = cache_pair_us(c, sizes[i], flags | PB_ACQUIRE_NO_CACHE, 200);
		pb_set_cache_slack(c, 0);
		pb_set_cache_limit(c, 64u << 20);
		cached = cache_pair_us(c, sizes[i], flags, 20000);
		pb_set_cache_limit(c, 0);
		printf("| %zu KiB | %.1f | %.2f | %.0f× |\n", sizes[i] >> 10, uncached, cached, uncached / cached);
		fflush(stdout);
	}
	printf("\nReported, not judged: the GPU host's torch benchmark (python/bench/torch_alloc_bench.py) holds the "
	       "target (≤ 2× torch's own cache per pair).\n\n");
	pb_disconnect(c);
}

/* The cache at scale: how many leases sit cached while the pair runs, and their sizes in pages (one 32 KiB chunk). */
#define SCALE_CACHED 10000u
#define SCALE_CHUNK "32K"
static const unsigned scale_pages[] = { 1, 2, 3, 4, 6 };

/* Poll c until the daemon was told every cached lease is idle (the receiver's tick), so it stays out of the timing. */
static void scale_wait_told(pb_client *c, size_t want)
{
	uint64_t t0 = bench_now_ns();
	struct pb_cache_stats st;

	do {
		if (pb_cache_stats(c, &st) < 0)
			bench_die(0, "pb_cache_stats: %s", pb_last_error());
		if (st.told_idle >= want)
			return;
		usleep(10000);
	} while (bench_now_ns() - t0 < 30000000000ull);
	bench_die(0, "cache scale: %llu of %zu cached leases told idle after 30 s", (unsigned long long)st.told_idle,
		  want);
}

/*
 * The pair's cost with one lease cached against SCALE_CACHED of mixed sizes, on a daemon of its own (small
 * chunks, room for that many leases): a take is a search of the size index and a put an append to the cache
 * list, so the ratio should stay near 1×. The 7-page lease is the only one of its size (a cache that walked
 * its leases would look at all of them first); with slack the 5-page request is served by a 6-page lease, the
 * smallest that fits, past the sizes below it.
 */
static void cache_scale_table(void)
{
	/* Room for that many leases: one 32 KiB chunk each, and per-uid bounds above the count. */
	static const char *const args[] = {
		"--prewarm",
		"0",
		"--hugetlb",
		"no",
		"--thp",
		"no",
		"--chunk-size",
		SCALE_CHUNK,
		"--budget",
		"1G",
		"--max-leases-per-client",
		"20000",
		"--max-leases-per-uid",
		"20000",
		"--max-chunks-per-uid",
		"20000",
		NULL,
	};
	static const struct {
		unsigned pages;
		unsigned slack_pct;
		const char *what;
	} rows[] = {
		{ 2, 0, "8 KiB, slack 0 (its own size)" },
		{ 7, 0, "28 KiB, slack 0 (the one lease of its size)" },
		{ 5, 100, "20 KiB, slack 100 (a 24 KiB lease, the smallest that fits)" },
	};
	const uint32_t flags = PB_ACQUIRE_NO_CUDA;
	struct pb_acquire_opts o = { .flags = flags };
	char sock[108], log[128];
	pb_lease **held;
	pb_client *c;
	pid_t pid;
	int r;

	snprintf(sock, sizeof(sock), "/tmp/pb-bench-scale.%d.sock", (int)getpid());
	snprintf(log, sizeof(log), "/tmp/pb-bench-scale.%d.log", (int)getpid());
	pid = bench_daemon_start(daemon_path, sock, log, args);
	held = calloc(SCALE_CACHED, sizeof(*held));
	if (!held)
		bench_die(-ENOMEM, "calloc");
	printf("### The client cache at scale: the same pair with 1 lease cached and with %u cached of mixed sizes "
	       "(1, 2, 3, 4, 6 pages; PB_ACQUIRE_NO_CUDA, chunk-size %s)\n\n",
	       SCALE_CACHED, SCALE_CHUNK);
	printf("| pair | 1 cached (µs) | %u cached (µs) | ratio |\n|---|---:|---:|---:|\n", SCALE_CACHED);
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct pb_cache_stats st;
		double one, many;

		r = pb_connect(sock, &c);
		if (r < 0)
			bench_die(r, "pb_connect: %s", pb_last_error());
		pb_set_cache_limit(c, 1u << 30);
		pb_set_cache_slack(c, rows[i].slack_pct);
		/* The baseline: one lease of the size that will serve the pair, alone in the cache. */
		r = pb_acquire(c, (size_t)(rows[i].slack_pct ? 6 : rows[i].pages) * PAGE_BYTES, &o, &held[0]);
		if (r < 0)
			bench_die(r, "cache scale: pb_acquire: %s", pb_last_error());
		pb_release(c, held[0]);
		scale_wait_told(c, 1);
		one = cache_pair_us(c, (size_t)rows[i].pages * PAGE_BYTES, flags, 20000);
		if (pb_cache_stats(c, &st) < 0)
			bench_die(0, "pb_cache_stats: %s", pb_last_error());
		/* Then SCALE_CACHED more, held at once so each is a lease of its own, then all cached. */
		for (unsigned k = 0; k < SCALE_CACHED; k++) {
			size_t pages = scale_pages[k % (sizeof(scale_pages) / sizeof(scale_pages[0]))];

			r = pb_acquire(c, pages * PAGE_BYTES,
				       &(struct pb_acquire_opts){ .flags = flags | PB_ACQUIRE_NO_CACHE }, &held[k]);
			if (r < 0)
				bench_die(r, "cache scale: pb_acquire %u: %s", k, pb_last_error());
		}
		for (unsigned k = 0; k < SCALE_CACHED; k++)
			pb_release(c, held[k]);
		scale_wait_told(c, st.told_idle + SCALE_CACHED);
		many = cache_pair_us(c, (size_t)rows[i].pages * PAGE_BYTES, flags, 20000);
		printf("| %s | %.2f | %.2f | %.2f× |\n", rows[i].what, one, many, many / one);
		fflush(stdout);
		pb_disconnect(c);
	}
	printf("\nReported, not judged: a cache that walked every lease would grow with the count (ratio ≫ 1).\n\n");
	free(held);
	bench_daemon_stop(pid);
	unlink(sock);
	unlink(log);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "daemon", required_argument, NULL, 'd' }, { "duration-s", required_argument, NULL, 't' },
		{ "idle-s", required_argument, NULL, 'i' }, { "iters", required_argument, NULL, 'n' },
		{ "quick", no_argument, NULL, 'q' },        { "cache-only", no_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },         { NULL, 0, NULL, 0 },
	};
	/* The floor's chunks are plain 4 KiB-page memfds: the broker's pool must be too (thp = auto collapses its
	 * chunks into huge pages, which makes mapping and touching them cheaper than the floor's). */
	static const char *const daemon_args[] = { "--prewarm", "256M", "--hugetlb", "no", "--thp", "no", NULL };
	static const unsigned sizes_chunks[] = { 1, MAX_LEASE_CHUNKS };
	static const unsigned procs[] = { 1, 8, 32 };
	struct bench_idle idle[2];
	struct pb_status *st;
	pb_client *pc;
	pid_t fpid, dpid, idle_pids[2];
	long rss_kb, shmem_kb, anon_kb, file_kb, f_rss_kb, f_shmem_kb;
	bool p50_ok = true, ops_ok = true, rss_ok, cache_only = false;
	int opt, r;

	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'd':
			daemon_path = optarg;
			break;
		case 't':
			duration_s = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'i':
			idle_s = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'n':
			iters_small = (unsigned)strtoul(optarg, NULL, 10);
			iters_large = iters_small / 10;
			break;
		case 'q':
			duration_s = 1;
			idle_s = 2;
			iters_small = 200;
			iters_large = 40;
			break;
		case 'c':
			cache_only = true;
			break;
		case 'h':
			usage(0);
			break;
		default:
			usage(2);
		}
	}
	if (duration_s == 0 || duration_s > 60 || idle_s == 0 || idle_s > 120 || iters_small < ROUNDS ||
	    iters_small > 1000000 || iters_large < ROUNDS)
		usage(2);
	/* The client cache would turn re-acquires into no-ops: measure the real round trip. */
	unsetenv("PINBROKER_CACHE_BYTES");
	signal(SIGPIPE, SIG_IGN);
	snprintf(floor_sock, sizeof(floor_sock), "/tmp/pb-bench-floor.%d.sock", (int)getpid());
	snprintf(broker_sock, sizeof(broker_sock), "/tmp/pb-bench-broker.%d.sock", (int)getpid());
	snprintf(broker_log, sizeof(broker_log), "/tmp/pb-bench-broker.%d.log", (int)getpid());

	if (cache_only) {
		/* The client cache's tables alone: no floor, and no target to judge. */
		dpid = bench_daemon_start(daemon_path, broker_sock, broker_log, daemon_args);
		printf("## bench_lease --cache-only: the client cache\n");
		bench_print_host();
		cache_table();
		cache_scale_table();
		bench_daemon_stop(dpid);
		unlink(broker_sock);
		unlink(broker_log);
		return 0;
	}
	fpid = floor_start();
	dpid = bench_daemon_start(daemon_path, broker_sock, broker_log, daemon_args);

	printf("## bench_lease: pinbrokerd lease cycle vs a raw SCM_RIGHTS floor (issue 2 §7)\n");
	bench_print_host();
	printf("# floor: one-thread epoll server, %u pre-faulted mlocked 2 MiB memfd chunks; 1-byte request -> "
	       "1 byte + chunk fds; 1-byte release, acked\n",
	       POOL_CHUNKS);
	printf("# broker: %s --config /dev/null --prewarm 256M --hugetlb no --thp no (4 KiB pages, 2 MiB chunks, log "
	       "level info); pb_acquire(PB_ACQUIRE_NO_CUDA|NO_CACHE) -> pb_release\n",
	       daemon_path);
	printf("# both map the chunks back to back into one reserved range (MAP_FIXED); touched = one write per "
	       "4 KiB page\n\n");

	printf("### Round trip latency (µs; %u samples at 2 MiB, %u at 64 MiB, floor and broker interleaved)\n\n",
	       iters_small, iters_large);
	printf("| size | cycle | floor p50 | floor p99 | broker p50 | broker p99 | ratio p50 | ratio p99 |\n");
	printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
	{
		struct lat fl, br;

		/* The smallest lease: a fresh 4 KiB memfd (a tail) each time on the broker's side. Not judged. */
		latency(ONE_PAGE, CYCLE_POPULATED, iters_small, true, &fl, &br);
		printf("| 4 KiB | acquire → map one page, no touch → release ⁵ | %.0f | %.0f | %.0f | %.0f | %.2f× | "
		       "%.2f× |\n",
		       fl.p50_us, fl.p99_us, br.p50_us, br.p99_us, br.p50_us / fl.p50_us, br.p99_us / fl.p99_us);
		fflush(stdout);
	}
	for (size_t s = 0; s < 2; s++) {
		unsigned nch = sizes_chunks[s], iters = s ? iters_large : iters_small;
		const char *sz = s ? "64 MiB" : "2 MiB";
		struct lat fl, br;

		latency(nch, CYCLE_LAZY, iters, false, &fl, &br);
		printf("| %s | floor only: lazy map, no touch ¹ | %.0f | %.0f | – | – | – | – |\n", sz, fl.p50_us,
		       fl.p99_us);
		latency(nch, CYCLE_POPULATED, iters, true, &fl, &br);
		printf("| %s | **acquire → map (MAP_POPULATE), no touch → release** ² | %.0f | %.0f | %.0f | %.0f | **%.2f×** | "
		       "%.2f× |\n",
		       sz, fl.p50_us, fl.p99_us, br.p50_us, br.p99_us, br.p50_us / fl.p50_us, br.p99_us / fl.p99_us);
		/* The target row: both sides do the same steps, so the ratio is what the protocol, the daemon and the
		 * library add; the touched row below is mostly the hypervisor's first-touch cost (⁴). */
		{
			char what[96];

			snprintf(what, sizeof(what), "%s no-touch p50, broker / floor", sz);
			p50_ok &= judge(what, br.p50_us / fl.p50_us, P50_RATIO_MAX, true, "×", true);
		}
		fflush(stdout);
		latency(nch, CYCLE_TOUCHED, iters, true, &fl, &br);
		printf("| %s | acquire → map + touch → release ⁴ | %.0f | %.0f | %.0f | %.0f | %.2f× | %.2f× |\n", sz,
		       fl.p50_us, fl.p99_us, br.p50_us, br.p99_us, br.p50_us / fl.p50_us, br.p99_us / fl.p99_us);
		fflush(stdout);
		latency(nch, CYCLE_FAULTED, iters, false, &fl, &br);
		printf("| %s | floor only: lazy map, then touch (page faults) ³ | %.0f | %.0f | – | – | – | – |\n", sz,
		       fl.p50_us, fl.p99_us);
		fflush(stdout);
	}
	printf("\n¹ the issue's \"bare round trip with a lazy map\" (~60 µs reference). libpinbroker cannot do this: it "
	       "always maps with MAP_POPULATE (client/client.c map_chunks).\n");
	printf("² the same steps on both sides without the touch: isolates protocol, daemon and library cost.\n");
	printf("³ populating by faults instead of MAP_POPULATE (the issue's \"~190 µs more for 2 MiB\").\n");
	printf("⁴ touching a page the first time after a fresh mapping is dominated by the hypervisor on this VM "
	       "(perf: ~7 µs/page spent in user code with no guest fault; the guest kernel is PVM), so the touched "
	       "rows vary with host load: reported, not judged.\n");
	printf("⁵ the floor lends one of its 2 MiB chunks and maps one page of it; the broker makes a 4 KiB memfd (a "
	       "lease's tail) and destroys it on release: reported, not judged.\n");
	printf("Target p50 ≤ %.1f× floor (no-touch rows, like for like): %s\n\n", P50_RATIO_MAX, mark(p50_ok));
	fflush(stdout);

	printf("### Aggregate throughput, 2 MiB cycles (ops/s over %u s, processes forked, one connection each)\n\n",
	       duration_s);
	printf("| cycle | procs | floor ops/s | broker ops/s | ratio | errors (floor/broker) |\n");
	printf("|---|---:|---:|---:|---:|---|\n");
	for (int touched = 1; touched >= 0; touched--)
		for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
			enum cycle cy = touched ? CYCLE_TOUCHED : CYCLE_POPULATED;
			uint64_t fe, be;
			double f = throughput(true, cy, procs[i], &fe);
			double b = throughput(false, cy, procs[i], &be);

			printf("| %s | %u | %.0f | %.0f | %s%.2f×%s | %llu/%llu |\n",
			       touched ? "map + touch" : "map, no touch", procs[i], f, b, touched ? "" : "**", b / f,
			       touched ? "" : "**", (unsigned long long)fe, (unsigned long long)be);
			/* Judged on the no-touch rows, like the latency target; errors on either side fail it too. */
			if (!touched) {
				char what[96];

				snprintf(what, sizeof(what),
					 "no-touch ops/s at %u process%s, broker / floor (errors %llu/%llu)", procs[i],
					 procs[i] == 1 ? "" : "es", (unsigned long long)fe, (unsigned long long)be);
				ops_ok &= judge(what, b / f, OPS_RATIO_MIN, false, "×", fe == 0 && be == 0);
			}
			fflush(stdout);
		}
	printf("\nTarget ≥ %.1f× floor at each concurrency, no errors (no-touch rows): %s\n\n", OPS_RATIO_MIN,
	       mark(ops_ok));

	cache_table();
	cache_scale_table();

	r = pb_connect(broker_sock, &pc);
	if (r < 0)
		bench_die(r, "pb_connect: %s", pb_last_error());
	r = pb_status_get(pc, &st);
	if (r < 0)
		bench_die(r, "pb_status_get: %s", pb_last_error());
	pb_disconnect(pc);
	rss_kb = bench_status_kb(dpid, "VmRSS");
	shmem_kb = bench_status_kb(dpid, "RssShmem");
	anon_kb = bench_status_kb(dpid, "RssAnon");
	file_kb = bench_status_kb(dpid, "RssFile");
	f_rss_kb = bench_status_kb(fpid, "VmRSS");
	f_shmem_kb = bench_status_kb(fpid, "RssShmem");
	if (rss_kb < 0 || shmem_kb < 0 || anon_kb < 0 || file_kb < 0 || f_rss_kb < 0 || f_shmem_kb < 0)
		bench_die(0, "cannot read /proc/PID/status");
	printf("### Daemon memory after the load above\n\n");
	printf("| process | VmRSS | RssShmem (pool) | pool_bytes (status) | RssAnon | RssFile | **RSS outside the pool** |\n");
	printf("|---|---:|---:|---:|---:|---:|---:|\n");
	printf("| pinbrokerd | %.1f MiB | %.1f MiB | %.1f MiB | %.2f MiB | %.2f MiB | **%.2f MiB** |\n",
	       rss_kb / 1024.0, shmem_kb / 1024.0, (double)st->pool_bytes / 1048576.0, anon_kb / 1024.0,
	       file_kb / 1024.0, (rss_kb - shmem_kb) / 1024.0);
	printf("| floor | %.1f MiB | %.1f MiB | – | %.2f MiB | %.2f MiB | %.2f MiB |\n", f_rss_kb / 1024.0,
	       f_shmem_kb / 1024.0, bench_status_kb(fpid, "RssAnon") / 1024.0,
	       bench_status_kb(fpid, "RssFile") / 1024.0, (f_rss_kb - f_shmem_kb) / 1024.0);
	rss_ok = judge("daemon RSS outside the pool (MiB)", (rss_kb - shmem_kb) / 1024.0, RSS_OUTSIDE_MAX_MIB, true, "",
		       true);
	printf("\nTarget ≤ %.0f MiB outside the pool: %s (RssFile is mostly shared libraries)\n\n", RSS_OUTSIDE_MAX_MIB,
	       mark(rss_ok));
	pb_status_free(st);
	fflush(stdout);

	idle_pids[0] = dpid;
	idle_pids[1] = fpid;
	bench_idle_measure(idle_pids, 2, idle_s, idle);
	printf("### Idle CPU over %u s, no clients (real /proc, default poll-interval-ms 100)\n\n", idle_s);
	printf("| process | CPU (schedstat) | CPU (utime+stime) | wake-ups/s |\n|---|---:|---:|---:|\n");
	printf("| pinbrokerd | %.4f%% | %.2f%% | %.1f |\n", idle[0].cpu_pct_schedstat, idle[0].cpu_pct_ticks,
	       idle[0].wakeups_per_s);
	printf("| floor | %.4f%% | %.2f%% | %.1f |\n", idle[1].cpu_pct_schedstat, idle[1].cpu_pct_ticks,
	       idle[1].wakeups_per_s);
	/*
	 * Reported, not a target: the floor has no monitor to poll, so it is no baseline for the daemon's 10
	 * samples a second, and bench_pressure already measures the monitor's idle cost on its own.
	 */
	printf("\nNo target (no like-for-like baseline: the floor does not poll /proc); bench_pressure measures the "
	       "monitor's idle cost.\n");

	bench_daemon_stop(dpid);
	kill(fpid, SIGTERM);
	waitpid(fpid, NULL, 0);
	unlink(floor_sock);
	unlink(broker_sock);
	unlink(broker_log);
	printf("\n");
	print_judged();
	if (!p50_ok || !ops_ok || !rss_ok) {
		printf("\nbench_lease: a target was MISSED (above)\n");
		return 1;
	}
	return 0;
}

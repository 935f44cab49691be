/* SPDX-License-Identifier: MIT */
/* Soak benchmark: many clients acquire, release and crash against pinbrokerd for minutes; prints throughput, p99 and the daemon's RSS and fds over time. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pinbroker.pb-c.h"
#include "wire.h"

#define HIST_BUCKETS 64 /* bucket b holds latencies in [2^(b/2), 2^((b+1)/2)) us: ~41% wide */
#define MAX_HELD 8
#define ROW_EVERY_S 30

typedef Pinbroker__V1__Request Request;
typedef Pinbroker__V1__Reply Reply;

/* Shared with every client through a MAP_SHARED page; updated with atomics. */
struct shared {
	uint64_t ops, acquires, refused, releases, crashes, errors;
	uint64_t hist[HIST_BUCKETS];
};

static struct shared *sh;
static const char *sock_path;
static volatile sig_atomic_t stop_flag;

static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static int bucket_of(uint64_t us)
{
	int b = us > 1 ? (int)(2.0 * log2((double)us)) : 0;

	return b < HIST_BUCKETS ? b : HIST_BUCKETS - 1;
}

static double bucket_upper_us(int b)
{
	return pow(2.0, (b + 1) / 2.0);
}

static int conn_open(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Send req, wait for the reply to it (skipping unsolicited REVOKEs), close any fds. */
static Reply *call(int fd, Request *req, int *fds, size_t max_fds, size_t *nfds)
{
	static uint8_t buf[PB_MAX_MSG_BYTES];
	size_t len = pinbroker__v1__request__get_packed_size(req), n;
	uint8_t out[4096];
	int junk[PB_MAX_FDS_PER_MSG];

	if (len > sizeof(out))
		return NULL;
	pinbroker__v1__request__pack(req, out);
	if (wire_send(fd, out, len, NULL, 0) < 0)
		return NULL;
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t r;
		Reply *rep;

		if (poll(&p, 1, 10000) <= 0)
			return NULL;
		r = wire_recv(fd, buf, sizeof(buf), fds ? fds : junk, fds ? max_fds : PB_MAX_FDS_PER_MSG, &n);
		if (r <= 0)
			return NULL;
		rep = pinbroker__v1__reply__unpack(NULL, (size_t)r, buf);
		if (!rep)
			return NULL;
		if (rep->has_seq && rep->seq == req->seq) {
			if (nfds)
				*nfds = n;
			else
				wire_close_fds(fds ? fds : junk, n);
			return rep;
		}
		wire_close_fds(fds ? fds : junk, n);
		pinbroker__v1__reply__free_unpacked(rep, NULL);
	}
}

static bool hello(int fd)
{
	Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Hello h = PINBROKER__V1__HELLO__INIT;
	Reply *rep;
	bool ok;

	h.version = 1;
	h.client_name = (char *)"soak";
	req.has_seq = true;
	req.seq = 1;
	req.body_case = PINBROKER__V1__REQUEST__BODY_HELLO;
	req.hello = &h;
	rep = call(fd, &req, NULL, 0, NULL);
	ok = rep && rep->status == 0;
	if (rep)
		pinbroker__v1__reply__free_unpacked(rep, NULL);
	return ok;
}

static void record(uint64_t t0)
{
	__atomic_fetch_add(&sh->hist[bucket_of(now_us() - t0)], 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&sh->ops, 1, __ATOMIC_RELAXED);
}

/* One client life: connect, then random acquire/release until it decides to crash (SIGKILL itself). */
static void worker(unsigned seed, double ops_per_s, uint64_t max_lease_bytes)
{
	struct {
		uint64_t id;
		int fds[64];
		size_t nfds;
	} held[MAX_HELD];
	size_t nheld = 0;
	uint64_t seq = 10, period_us = (uint64_t)(1e6 / ops_per_s), next = now_us();
	int fd;

	srand(seed);
	fd = conn_open();
	if (fd < 0 || !hello(fd)) {
		__atomic_fetch_add(&sh->errors, 1, __ATOMIC_RELAXED);
		_exit(1);
	}
	for (;;) {
		int dice = rand() % 100;
		Request req = PINBROKER__V1__REQUEST__INIT;
		Reply *rep;
		uint64_t t0;

		next += period_us;
		if (next > now_us())
			usleep((useconds_t)(next - now_us()));
		if (stop_flag || getppid() == 1)
			_exit(0);
		req.has_seq = true;
		req.seq = ++seq;
		if (dice < 2) {
			/* Crash holding whatever it holds: the daemon must take it all back. */
			__atomic_fetch_add(&sh->crashes, 1, __ATOMIC_RELAXED);
			raise(SIGKILL);
		} else if (dice < 50 && nheld < MAX_HELD) {
			Pinbroker__V1__Acquire a = PINBROKER__V1__ACQUIRE__INIT;

			a.size = 4096 + (uint64_t)rand() % max_lease_bytes;
			req.body_case = PINBROKER__V1__REQUEST__BODY_ACQUIRE;
			req.acquire = &a;
			t0 = now_us();
			rep = call(fd, &req, held[nheld].fds, 64, &held[nheld].nfds);
			if (!rep) {
				__atomic_fetch_add(&sh->errors, 1, __ATOMIC_RELAXED);
				_exit(1);
			}
			record(t0);
			if (rep->status == 0 && rep->body_case == PINBROKER__V1__REPLY__BODY_LEASE &&
			    rep->lease->n_chunk_bytes == held[nheld].nfds) {
				held[nheld].id = rep->lease->lease_id;
				nheld++;
				__atomic_fetch_add(&sh->acquires, 1, __ATOMIC_RELAXED);
			} else {
				wire_close_fds(held[nheld].fds, held[nheld].nfds);
				__atomic_fetch_add(rep->status ? &sh->refused : &sh->errors, 1, __ATOMIC_RELAXED);
			}
			pinbroker__v1__reply__free_unpacked(rep, NULL);
		} else if (nheld > 0) {
			Pinbroker__V1__Release m = PINBROKER__V1__RELEASE__INIT;
			size_t k = (size_t)rand() % nheld;

			m.lease_id = held[k].id;
			req.body_case = PINBROKER__V1__REQUEST__BODY_RELEASE;
			req.release = &m;
			t0 = now_us();
			rep = call(fd, &req, NULL, 0, NULL);
			if (!rep) {
				__atomic_fetch_add(&sh->errors, 1, __ATOMIC_RELAXED);
				_exit(1);
			}
			record(t0);
			__atomic_fetch_add(rep->status ? &sh->errors : &sh->releases, 1, __ATOMIC_RELAXED);
			pinbroker__v1__reply__free_unpacked(rep, NULL);
			wire_close_fds(held[k].fds, held[k].nfds);
			held[k] = held[--nheld];
		}
	}
}

/* Keeps one worker alive per slot: a crashed one is replaced at once. */
static void client_slot(unsigned slot, double ops_per_s, uint64_t max_lease_bytes)
{
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	for (unsigned gen = 0; !stop_flag; gen++) {
		pid_t w = fork();

		if (w == 0)
			worker(slot * 100003u + gen, ops_per_s, max_lease_bytes);
		if (w < 0)
			_exit(1);
		while (waitpid(w, NULL, 0) < 0 && errno == EINTR)
			if (stop_flag)
				kill(w, SIGKILL);
		if (stop_flag)
			break;
	}
	_exit(0);
}

static int64_t proc_kb(pid_t pid, const char *key)
{
	char path[64], line[256];
	int64_t v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f))
		if (strncmp(line, key, strlen(key)) == 0)
			v = strtoll(line + strlen(key), NULL, 10);
	if (f)
		fclose(f);
	return v;
}

static int daemon_fds(pid_t pid, uint64_t *memfd_bytes)
{
	char dir[64], path[384], link[256];
	struct dirent *e;
	int n = 0;
	DIR *dp;

	*memfd_bytes = 0;
	snprintf(dir, sizeof(dir), "/proc/%d/fd", pid);
	dp = opendir(dir);
	while (dp && (e = readdir(dp))) {
		struct stat st;
		ssize_t len;

		if (e->d_name[0] == '.')
			continue;
		n++;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		len = readlink(path, link, sizeof(link) - 1);
		if (len > 0) {
			link[len] = '\0';
			if (strncmp(link, "/memfd:pinbroker", 16) == 0 && stat(path, &st) == 0)
				*memfd_bytes += (uint64_t)st.st_size;
		}
	}
	if (dp)
		closedir(dp);
	return n;
}

/*
 * The daemon's books and the kernel's view. Returns 0, 1 when leased_bytes
 * differs from the sum of the leases in the same status reply (a real
 * accounting error), or 2 when pool_bytes never matched the daemon's memfd
 * sizes over 50 tries (they are read at different instants, so churn alone
 * can make one try differ).
 */
static int check(int fd, pid_t dpid, uint64_t *leased, uint64_t *pool)
{
	for (int attempt = 0; attempt < 50; attempt++) {
		Request req = PINBROKER__V1__REQUEST__INIT;
		Pinbroker__V1__StatusRequest sr = PINBROKER__V1__STATUS_REQUEST__INIT;
		uint64_t sum = 0, memfd_bytes;
		Reply *rep;

		req.has_seq = true;
		req.seq = 1000 + (uint64_t)attempt;
		req.body_case = PINBROKER__V1__REQUEST__BODY_STATUS;
		req.status = &sr;
		rep = call(fd, &req, NULL, 0, NULL);
		if (!rep || rep->body_case != PINBROKER__V1__REPLY__BODY_STATUS_REPLY)
			return 1;
		for (size_t i = 0; i < rep->status_reply->n_leases; i++)
			sum += rep->status_reply->leases[i]->bytes;
		daemon_fds(dpid, &memfd_bytes);
		*leased = rep->status_reply->leased_bytes;
		*pool = rep->status_reply->pool_bytes;
		pinbroker__v1__reply__free_unpacked(rep, NULL);
		if (sum != *leased)
			return 1;
		if (memfd_bytes == *pool)
			return 0;
		usleep(5000);
	}
	return 2;
}

static void on_signal(int sig)
{
	stop_flag = 1;
}

static pid_t start_daemon(const char *bin, char *dir, size_t dlen)
{
	static char sock[300], log[300];
	pid_t pid;

	snprintf(dir, dlen, "/tmp/pbsoak.XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(sock, sizeof(sock), "%s/pb.sock", dir);
	snprintf(log, sizeof(log), "%s/daemon.log", dir);
	sock_path = sock;
	pid = fork();
	if (pid == 0) {
		FILE *f = freopen(log, "w", stderr);

		(void)f;
		execl(bin, bin, "--config", "/dev/null", "--socket", sock, "--budget", "1G", "--prewarm", "64M",
		      "--pool-shrink-delay-ms", "2000", "--log-level", "warning", "--max-connections-per-uid", "1024",
		      (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 500; i++) {
		int fd = conn_open();

		if (fd >= 0) {
			bool ok = hello(fd);

			close(fd);
			if (ok)
				return pid;
		}
		usleep(20000);
	}
	return -1;
}

static void usage(void)
{
	fprintf(stderr, "usage: pb_soak [--duration S] [--clients N] [--rate OPS_PER_S] [--max-lease BYTES]\n"
			"               [--socket PATH | --daemon PINBROKERD]\n"
			"Without --socket it starts its own pinbrokerd (budget 1G, prewarm 64M).\n");
	exit(2);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "duration", required_argument, NULL, 'd' },
		{ "clients", required_argument, NULL, 'c' },
		{ "rate", required_argument, NULL, 'r' },
		{ "socket", required_argument, NULL, 's' },
		{ "daemon", required_argument, NULL, 'D' },
		{ "max-lease", required_argument, NULL, 'm' },
		{ NULL, 0, NULL, 0 },
	};
	unsigned duration_s = 600, clients = 64;
	double rate = 2000;
	uint64_t max_lease = 2ull << 20, prev_ops = 0, prev_hist[HIST_BUCKETS] = { 0 }, mismatches = 0, kdiff = 0;
	const char *daemon_bin = PINBROKERD_PATH;
	char dir[64] = "";
	pid_t dpid = -1, own = -1, *slots;
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	uint64_t t_start, t_prev;
	int ch, cfd;
	int64_t rss0 = -1;
	int fds0 = -1;

	while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (ch) {
		case 'd':
			duration_s = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'c':
			clients = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'r':
			rate = strtod(optarg, NULL);
			break;
		case 's':
			sock_path = optarg;
			break;
		case 'D':
			daemon_bin = optarg;
			break;
		case 'm':
			max_lease = strtoull(optarg, NULL, 10);
			break;
		default:
			usage();
		}
	}
	if (clients == 0 || rate <= 0 || max_lease == 0)
		usage();
	signal(SIGPIPE, SIG_IGN);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	if (!sock_path) {
		own = start_daemon(daemon_bin, dir, sizeof(dir));
		if (own < 0) {
			fprintf(stderr, "cannot start %s\n", daemon_bin);
			return 1;
		}
	}
	cfd = conn_open();
	if (cfd < 0 || !hello(cfd) || getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
		fprintf(stderr, "cannot talk to pinbrokerd on %s\n", sock_path);
		return 1;
	}
	dpid = cred.pid;
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		return 1;
	memset(sh, 0, sizeof(*sh));
	slots = calloc(clients, sizeof(*slots));
	printf("soak: %u clients, target %.0f ops/s, leases up to %llu bytes, %u s, daemon pid %d on %s\n", clients,
	       rate, (unsigned long long)max_lease, duration_s, dpid, sock_path);
	printf("%6s %9s %9s %10s %10s %6s %10s %10s %9s %9s %9s\n", "t_s", "ops/s", "p99_us", "rss_kb", "rss-shm_kb",
	       "fds", "leased_mb", "pool_mb", "crashes", "mismatch", "pool!=fd");
	for (unsigned i = 0; i < clients; i++) {
		slots[i] = fork();
		if (slots[i] == 0)
			client_slot(i, rate / clients, max_lease);
	}
	t_start = t_prev = now_us();
	for (unsigned row = 1; !stop_flag; row++) {
		uint64_t target = t_start + (uint64_t)row * ROW_EVERY_S * 1000000u, now, ops, n = 0, cnt = 0;
		uint64_t hist[HIST_BUCKETS], leased = 0, pool = 0, memfd_bytes;
		double p99 = 0;
		int64_t rss, shm;
		int nfd;
		bool last;

		if (target > t_start + (uint64_t)duration_s * 1000000u)
			target = t_start + (uint64_t)duration_s * 1000000u;
		last = target == t_start + (uint64_t)duration_s * 1000000u;
		while (!stop_flag && (now = now_us()) < target)
			usleep((useconds_t)(target - now > 200000 ? 200000 : target - now));
		now = now_us();
		ops = __atomic_load_n(&sh->ops, __ATOMIC_RELAXED);
		for (int b = 0; b < HIST_BUCKETS; b++) {
			hist[b] = __atomic_load_n(&sh->hist[b], __ATOMIC_RELAXED);
			n += hist[b] - prev_hist[b];
		}
		for (int b = 0; b < HIST_BUCKETS && n; b++) {
			cnt += hist[b] - prev_hist[b];
			if (cnt * 100 >= n * 99) {
				p99 = bucket_upper_us(b);
				break;
			}
		}
		switch (check(cfd, dpid, &leased, &pool)) {
		case 1:
			mismatches++;
			break;
		case 2:
			kdiff++;
			break;
		}
		rss = proc_kb(dpid, "VmRSS:");
		shm = proc_kb(dpid, "RssShmem:");
		nfd = daemon_fds(dpid, &memfd_bytes);
		if (rss0 < 0) {
			rss0 = rss - shm;
			fds0 = nfd;
		}
		printf("%6.0f %9.0f %9.0f %10lld %10lld %6d %10.1f %10.1f %9llu %9llu %9llu\n", (now - t_start) / 1e6,
		       (double)(ops - prev_ops) * 1e6 / (double)(now - t_prev), p99, (long long)rss,
		       (long long)(rss - shm), nfd, leased / 1048576.0, pool / 1048576.0,
		       (unsigned long long)sh->crashes, (unsigned long long)mismatches, (unsigned long long)kdiff);
		fflush(stdout);
		prev_ops = ops;
		memcpy(prev_hist, hist, sizeof(hist));
		t_prev = now;
		if (last)
			break;
	}
	stop_flag = 1;
	for (unsigned i = 0; i < clients; i++)
		kill(slots[i], SIGTERM);
	for (unsigned i = 0; i < clients; i++)
		waitpid(slots[i], NULL, 0);
	/* Everyone is gone: every byte must be back. */
	{
		uint64_t leased = 0, pool = 0, memfd_bytes;
		int64_t rss = -1, shm = 0;
		int nfd = 0;

		for (int i = 0; i < 100; i++) {
			int r = check(cfd, dpid, &leased, &pool);

			mismatches += r == 1;
			if (leased == 0)
				break;
			usleep(50000);
		}
		sleep(3); /* pool-shrink-delay-ms */
		if (check(cfd, dpid, &leased, &pool) != 0)
			mismatches++; /* at rest the books and the kernel must agree exactly */
		rss = proc_kb(dpid, "VmRSS:");
		shm = proc_kb(dpid, "RssShmem:");
		nfd = daemon_fds(dpid, &memfd_bytes);
		printf("end: ops %llu (acquired %llu, refused %llu, released %llu, crashed %llu, client errors %llu)\n",
		       (unsigned long long)sh->ops, (unsigned long long)sh->acquires, (unsigned long long)sh->refused,
		       (unsigned long long)sh->releases, (unsigned long long)sh->crashes,
		       (unsigned long long)sh->errors);
		printf("end: leased %llu bytes, pool %.1f MiB; daemon private RSS %lld KiB (first row %lld), fds %d "
		       "(first row %d); accounting mismatches %llu; in-flight pool/memfd differences %llu\n",
		       (unsigned long long)leased, pool / 1048576.0, (long long)(rss - shm), (long long)rss0, nfd, fds0,
		       (unsigned long long)mismatches, (unsigned long long)kdiff);
		if (leased != 0)
			mismatches++;
	}
	close(cfd);
	if (own > 0) {
		char cmd[128];

		kill(own, SIGTERM);
		waitpid(own, NULL, 0);
		snprintf(cmd, sizeof(cmd), getenv("PB_SOAK_KEEP") ? "true %s" : "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			fprintf(stderr, "cannot remove %s\n", dir);
	}
	return mismatches ? 1 : 0;
}

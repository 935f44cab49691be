/* SPDX-License-Identifier: MIT */
/* Load and fault tests: crash storms, connection floods, hostile packets and limits, with accounting checked against the kernel. */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "itest.h"
#include "wire.h"

#define MIB (1024ull * 1024)
#define STORM_CLIENTS 1000
#define STORM_WAVE 50
#define FLOOD_CONNS 1000
/* Baselines allow this much drift: malloc arenas and libev's fd tables grow once and stay. */
#define RSS_SLACK_KB (4 * 1024)
#define FD_SLACK 4
/* status and /proc are read at different instants: each check gets this many tries, 50 ms apart,
 * and fails only when every one disagrees. */
#define ACCOUNTING_ATTEMPTS 20

static struct daemon d;

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* One "Key:   N kB" line of /proc/PID/status, in KiB; 0 when absent. */
static uint64_t daemon_status_kb(pid_t pid, const char *key)
{
	char path[64], line[256];
	uint64_t v = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f))
		if (strncmp(line, key, strlen(key)) == 0)
			v = strtoull(line + strlen(key), NULL, 10);
	if (f)
		fclose(f);
	return v;
}

/*
 * The resident bytes of the daemon's locked mappings: the Rss of every VMA in
 * /proc/PID/smaps whose VmFlags carry "lo". VmLck counts the locked VMAs'
 * sizes; this counts the pages the kernel holds in them, per process, so other
 * processes' mlock and munlock cannot move it (Mlocked in /proc/meminfo can).
 */
static uint64_t daemon_locked_resident_bytes(pid_t pid)
{
	char path[64], line[512];
	uint64_t total_kb = 0, vma_rss_kb = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/smaps", pid);
	f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f)) {
		if (strncmp(line, "Rss:", 4) == 0)
			vma_rss_kb = strtoull(line + 4, NULL, 10);
		else if (strncmp(line, "VmFlags:", 8) == 0 && strstr(line + 8, " lo"))
			total_kb += vma_rss_kb;
	}
	if (f)
		fclose(f);
	return total_kb * 1024;
}

/* VmRSS minus RssShmem: the daemon's own memory, not the pool's memfd pages. */
static int64_t daemon_private_rss_kb(pid_t pid)
{
	char path[64], line[256];
	int64_t rss = -1, shmem = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f)) {
		if (strncmp(line, "VmRSS:", 6) == 0)
			rss = strtoll(line + 6, NULL, 10);
		else if (strncmp(line, "RssShmem:", 9) == 0)
			shmem = strtoll(line + 9, NULL, 10);
	}
	if (f)
		fclose(f);
	return rss < 0 ? -1 : rss - shmem;
}

/* The daemon's open fds; *memfd_bytes gets the summed size of its pool memfds. */
static int daemon_fds(pid_t pid, uint64_t *memfd_bytes, int *memfds)
{
	char dir[64], path[384], link[256];
	struct dirent *e;
	int n = 0, m = 0;
	uint64_t sum = 0;
	DIR *dp;

	snprintf(dir, sizeof(dir), "/proc/%d/fd", pid);
	dp = opendir(dir);
	ck_assert_ptr_nonnull(dp);
	while ((e = readdir(dp))) {
		struct stat st;
		ssize_t len;

		if (e->d_name[0] == '.')
			continue;
		n++;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		len = readlink(path, link, sizeof(link) - 1);
		if (len <= 0)
			continue;
		link[len] = '\0';
		if (strncmp(link, "/memfd:pinbroker", 16) == 0 && stat(path, &st) == 0) {
			sum += (uint64_t)st.st_size;
			m++;
		}
	}
	closedir(dp);
	if (memfd_bytes)
		*memfd_bytes = sum;
	if (memfds)
		*memfds = m;
	return n;
}

static Pinbroker__V1__Reply *raw_status_reply(int fd)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__StatusRequest sr = PINBROKER__V1__STATUS_REQUEST__INIT;
	int err;

	req.has_seq = true;
	req.seq = 42;
	req.body_case = PINBROKER__V1__REQUEST__BODY_STATUS;
	req.status = &sr;
	if (raw_send(fd, &req, NULL, 0) < 0)
		return NULL;
	for (;;) {
		size_t nfds;
		Pinbroker__V1__Reply *rep = raw_recv(fd, NULL, 0, &nfds, 5000, &err);

		if (!rep || rep->body_case == PINBROKER__V1__REPLY__BODY_STATUS_REPLY)
			return rep;
		pinbroker__v1__reply__free_unpacked(rep, NULL); /* an unsolicited REVOKE */
	}
}

/* Poll, over the HELLO'd connection fd, until the daemon lists want connections: true, or false at the bound. */
static bool wait_clients_via(int fd, size_t want, int timeout_ms)
{
	for (uint64_t t0 = itest_now_ms();; usleep(10000)) {
		Pinbroker__V1__Reply *rep = raw_status_reply(fd);
		size_t n = rep && rep->status_reply ? rep->status_reply->n_clients : (size_t)-1;

		if (rep)
			pinbroker__v1__reply__free_unpacked(rep, NULL);
		if (n == want)
			return true;
		if (itest_now_ms() - t0 > (uint64_t)timeout_ms)
			return false;
	}
}

/* Poll, over the HELLO'd connection fd, until the daemon has want acquires waiting: true, or false at the bound. */
static bool wait_waiting_via(int fd, uint32_t want, int timeout_ms)
{
	for (uint64_t t0 = itest_now_ms();; usleep(10000)) {
		Pinbroker__V1__Reply *rep = raw_status_reply(fd);
		bool ok = rep && rep->status_reply && rep->status_reply->waiting_acquires == want;

		if (rep)
			pinbroker__v1__reply__free_unpacked(rep, NULL);
		if (ok)
			return true;
		if (itest_now_ms() - t0 > (uint64_t)timeout_ms)
			return false;
	}
}

/*
 * The checker: the daemon's books against the sum of its live leases and
 * against the kernel (its pool memfds, its locked mappings and their resident pages). Retries a few
 * times, because status and /proc are read at different instants.
 */
static void check_accounting(const char *where)
{
	char msg[512] = "";

	for (int attempt = 0; attempt < ACCOUNTING_ATTEMPTS; attempt++) {
		int fd = raw_connect(d.socket);
		Pinbroker__V1__Reply *rep;
		uint64_t sum = 0, memfd_bytes, mlocked_bytes, resident_locked_bytes;
		int memfds;

		ck_assert_msg(fd >= 0 && raw_hello(fd) == 0, "%s: cannot talk to the daemon", where);
		rep = raw_status_reply(fd);
		close(fd);
		ck_assert_msg(rep != NULL, "%s: no status reply", where);
		for (size_t i = 0; i < rep->status_reply->n_leases; i++)
			sum += rep->status_reply->leases[i]->bytes;
		daemon_fds(d.pid, &memfd_bytes, &memfds);
		mlocked_bytes = daemon_status_kb(d.pid, "VmLck:") * 1024;
		resident_locked_bytes = daemon_locked_resident_bytes(d.pid);
#if defined(__SANITIZE_ADDRESS__)
		/* ASan makes mlock a no-op (it would lock the shadow too): nothing to compare. */
		mlocked_bytes = UINT64_MAX;
		resident_locked_bytes = UINT64_MAX;
#endif
		if (rep->status_reply->leased_bytes != sum)
			snprintf(msg, sizeof(msg), "%s: leased_bytes %llu != sum of leases %llu", where,
				 (unsigned long long)rep->status_reply->leased_bytes, (unsigned long long)sum);
		else if (rep->status_reply->pool_bytes != memfd_bytes)
			snprintf(msg, sizeof(msg), "%s: pool_bytes %llu != %d memfds holding %llu", where,
				 (unsigned long long)rep->status_reply->pool_bytes, memfds,
				 (unsigned long long)memfd_bytes);
		else if (mlocked_bytes < rep->status_reply->pool_bytes)
			snprintf(msg, sizeof(msg),
				 "%s: the kernel counts %llu bytes locked by the daemon, pool holds %llu", where,
				 (unsigned long long)mlocked_bytes, (unsigned long long)rep->status_reply->pool_bytes);
		else if (resident_locked_bytes < rep->status_reply->pool_bytes)
			snprintf(msg, sizeof(msg),
				 "%s: the daemon's locked mappings hold %llu resident bytes, the pool %llu: the pool's "
				 "pages are not all locked in memory",
				 where, (unsigned long long)resident_locked_bytes,
				 (unsigned long long)rep->status_reply->pool_bytes);
		else
			msg[0] = '\0';
		pinbroker__v1__reply__free_unpacked(rep, NULL);
		if (!msg[0])
			return;
		usleep(50000);
	}
	ck_abort_msg("%s", msg);
}

static void raise_nofile(rlim_t want)
{
	struct rlimit rl;

	ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_max < want && geteuid() == 0)
		rl.rlim_max = want;
	rl.rlim_cur = rl.rlim_max < want ? rl.rlim_max : want;
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
}

static void start_with(const char *const *more)
{
	const char *args[32] = { "--max-connections",
				 "4096",
				 "--max-connections-per-uid",
				 "4096",
				 "--pool-shrink-delay-ms",
				 "0",
				 "--log-level",
				 "info",
				 NULL };
	size_t n = 8;

	for (size_t i = 0; more && more[i] && n < 30; i++)
		args[n++] = more[i];
	args[n] = NULL;
	daemon_start(&d, args);
}

static void start(void)
{
	start_with(NULL);
}

ITEST_FIXTURE_STOP(stop, d)

/* Connect, HELLO, acquire a random size, then hold it until killed. */
static void storm_child(unsigned seed)
{
	int fd = raw_connect(d.socket);
	int fds[PB_MAX_FDS_PER_MSG * 4];
	size_t nfds;
	uint64_t id;

	srand(seed);
	if (fd < 0 || raw_hello(fd) != 0)
		_exit(1);
	for (int i = 0; i < 1 + rand() % 3; i++)
		raw_acquire(fd, 4096 + (uint64_t)(rand() % (4 * 1024)) * 1024, &id, fds, sizeof(fds) / sizeof(fds[0]),
			    &nfds);
	pause();
	_exit(0);
}

START_TEST(test_crash_storm_returns_every_byte_fd_and_page)
{
	int base_fds, fds_after;
	int64_t base_rss, rss_after;
	uint64_t t0 = mono_ms();

	srand(12345);
	/* One warm-up wave first: malloc arenas and libev tables grow once and stay. */
	for (int done = 0, wave = 0; done < STORM_CLIENTS; wave++) {
		pid_t kids[STORM_WAVE];
		int n = STORM_CLIENTS - done < STORM_WAVE ? STORM_CLIENTS - done : STORM_WAVE;

		for (int i = 0; i < n; i++) {
			kids[i] = itest_fork();
			ck_assert_int_ge(kids[i], 0);
			if (kids[i] == 0)
				storm_child((unsigned)(done + i));
		}
		/* SIGKILL each at a random point: before HELLO, mid-acquire, or while holding. */
		for (int i = 0; i < n; i++) {
			usleep((useconds_t)(rand() % 4000));
			kill(kids[i], SIGKILL);
		}
		for (int i = 0; i < n; i++)
			waitpid(kids[i], NULL, 0);
		done += n;
		if (wave == 0) {
			ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
			check_accounting("after the warm-up wave");
			base_fds = daemon_fds(d.pid, NULL, NULL);
			base_rss = daemon_private_rss_kb(d.pid);
		} else if (wave % 5 == 0) {
			check_accounting("during the storm");
		}
	}
	ck_assert_int_eq(wait_leased(d.socket, 0, 10000), 0);
	check_accounting("after the storm");
	/* Give the daemon a moment to see the last hang-ups and shrink the pool. */
	for (int i = 0; i < 50; i++) {
		fds_after = daemon_fds(d.pid, NULL, NULL);
		rss_after = daemon_private_rss_kb(d.pid);
		if (fds_after <= base_fds + FD_SLACK && rss_after <= base_rss + RSS_SLACK_KB)
			break;
		usleep(100000);
	}
	ck_assert_msg(fds_after <= base_fds + FD_SLACK, "daemon fds %d after the storm, %d at baseline", fds_after,
		      base_fds);
#if defined(__SANITIZE_ADDRESS__)
	/* ASan's quarantine keeps freed memory resident: RSS says nothing there. */
	base_rss = rss_after;
#endif
	ck_assert_msg(rss_after <= base_rss + RSS_SLACK_KB, "daemon RSS %lld KiB after the storm, %lld KiB at baseline",
		      (long long)rss_after, (long long)base_rss);
	ck_assert(daemon_alive(&d));
	fprintf(stderr, "crash storm: %d clients in %llu ms; fds %d -> %d, private RSS %lld -> %lld KiB\n",
		STORM_CLIENTS, (unsigned long long)(mono_ms() - t0), base_fds, fds_after, (long long)base_rss,
		(long long)rss_after);
}
END_TEST

static double pinctl_status_ms(void)
{
	uint64_t t0 = mono_ms();
	char *out = NULL;
	int rc = pinctl(&d, &out, "status");

	ck_assert_msg(rc == 0, "pinctl status failed during the flood (%d): %s", rc, out ? out : "");
	free(out);
	return (double)(mono_ms() - t0);
}

START_TEST(test_flood_of_half_open_connections_never_starves_status)
{
	int *fds = calloc(FLOOD_CONNS, sizeof(*fds));
	int base_fds = daemon_fds(d.pid, NULL, NULL), peak_fds, n_open = 0;
	double worst_ms = 0;

	ck_assert_ptr_nonnull(fds);
	raise_nofile(FLOOD_CONNS * 2 + 256);
	for (int i = 0; i < FLOOD_CONNS; i++) {
		fds[i] = raw_connect(d.socket);
		ck_assert_msg(fds[i] >= 0, "connection %d refused", i);
		/* Every other one says HELLO; the rest stay half-open. */
		if (i % 2 == 0)
			ck_assert_int_eq(raw_hello(fds[i]), 0);
		if (i % 100 == 0) {
			double ms = pinctl_status_ms();

			worst_ms = ms > worst_ms ? ms : worst_ms;
		}
	}
	peak_fds = daemon_fds(d.pid, NULL, NULL);
	ck_assert_msg(peak_fds >= base_fds + FLOOD_CONNS, "daemon holds %d fds, expected at least %d", peak_fds,
		      base_fds + FLOOD_CONNS);
	for (int i = 0; i < 5; i++) {
		double ms = pinctl_status_ms();

		worst_ms = ms > worst_ms ? ms : worst_ms;
	}
	ck_assert_msg(worst_ms < 1000, "pinctl status took %.0f ms during the flood", worst_ms);
	check_accounting("during the flood");
	/* The handshake timeout (1 s here) drops the silent half. */
	for (int i = 1; i < FLOOD_CONNS; i += 2)
		ck_assert_msg(raw_closed_by_peer(fds[i], 5000),
			      "half-open connection %d outlived the handshake timeout", i);
	for (int i = 0; i < FLOOD_CONNS; i += 2)
		n_open += raw_status(fds[i]) == 0;
	ck_assert_int_eq(n_open, FLOOD_CONNS / 2);
	for (int i = 0; i < FLOOD_CONNS; i++)
		close(fds[i]);
	free(fds);
	for (int i = 0; i < 50 && daemon_fds(d.pid, NULL, NULL) > base_fds + FD_SLACK; i++)
		usleep(100000);
	ck_assert_int_le(daemon_fds(d.pid, NULL, NULL), base_fds + FD_SLACK);
	fprintf(stderr, "flood: %d connections, worst pinctl status %.0f ms, daemon fds %d -> %d -> %d\n", FLOOD_CONNS,
		worst_ms, base_fds, peak_fds, daemon_fds(d.pid, NULL, NULL));
}
END_TEST

static void start_flood(void)
{
	static const char *const more[] = { "--handshake-timeout-ms", "1000", NULL };

	start_with(more);
}

static int send_bytes(int fd, const void *buf, size_t len)
{
	return wire_send(fd, buf, len, NULL, 0);
}

/* A packet of len bytes (at most 2048) over max-message-bytes, after HELLO: the daemon closes that connection within 2 s. */
static void assert_oversized_closes(size_t len)
{
	static uint8_t big[2048];
	int fd = raw_connect(d.socket);

	ck_assert_uint_le(len, sizeof(big));
	memset(big, 0x0a, len);
	ck_assert_int_eq(raw_hello(fd), 0);
	send_bytes(fd, big, len);
	ck_assert_msg(raw_closed_by_peer(fd, 2000), "a %zu-byte packet left its connection open", len);
	close(fd);
}

static int acquire_size(int fd, uint64_t size)
{
	int fds[64];
	size_t nfds = 0;
	uint64_t id;
	int st = raw_acquire(fd, size, &id, fds, 64, &nfds);

	for (size_t i = 0; i < nfds; i++)
		close(fds[i]);
	return st;
}

START_TEST(test_hostile_packets_close_only_their_connection_and_keep_the_books)
{
	int holder = raw_connect(d.socket), other = raw_connect(d.socket), fd;
	int fds[64];
	size_t nfds = 0;
	uint64_t mine, id;
	uint8_t junk[512], packed[256];
	int st;
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Acquire a = PINBROKER__V1__ACQUIRE__INIT;
	size_t len;

	ck_assert_int_eq(raw_hello(holder), 0);
	ck_assert_int_eq(raw_hello(other), 0);
	ck_assert_int_eq(raw_acquire(holder, 3 * MIB, &mine, fds, 64, &nfds), 0);
	check_accounting("one lease held");

	srand(7);
	for (int round = 0; round < 200; round++) {
		size_t n = 1 + (size_t)(rand() % (int)sizeof(junk));

		for (size_t i = 0; i < n; i++)
			junk[i] = (uint8_t)rand();
		fd = raw_connect(d.socket);
		ck_assert_int_ge(fd, 0);
		if (round % 2)
			ck_assert_int_eq(raw_hello(fd), 0);
		send_bytes(fd, junk, n);
		/* Garbage either fails to decode (closed) or decodes to some request (answered): never a crash. */
		close(fd);
	}
	ck_assert(daemon_alive(&d));

	/* A valid ACQUIRE cut short at every length. */
	a.size = 1 * MIB;
	req.has_seq = true;
	req.seq = 3;
	req.body_case = PINBROKER__V1__REQUEST__BODY_ACQUIRE;
	req.acquire = &a;
	len = pinbroker__v1__request__pack(&req, packed);
	for (size_t cut = 1; cut < len; cut++) {
		fd = raw_connect(d.socket);
		ck_assert_int_eq(raw_hello(fd), 0);
		send_bytes(fd, packed, cut);
		raw_closed_by_peer(fd, 200);
		close(fd);
	}
	/* Over max-message-bytes (1024 here): closed. */
	assert_oversized_closes(2048);

	/* Valid packets, invalid values: a status each, and the connection stays. */
	ck_assert_int_eq(acquire_size(other, 0), 4 /* STATUS_INVALID_SIZE */);
	/* 2^63 is a size no budget can lend: STATUS_TOO_LARGE, or INVALID_SIZE where it is rejected as absurd. */
	st = acquire_size(other, 1ull << 63);
	ck_assert_msg(st == 7 || st == 4, "size 2^63 got status %d", st);
	ck_assert_int_eq(acquire_size(other, UINT64_MAX), 4 /* STATUS_INVALID_SIZE */);
	ck_assert_int_eq(acquire_size(other, 1ull << 40), 7 /* STATUS_TOO_LARGE */);
	ck_assert_int_eq(raw_release(other, 987654321), 8 /* STATUS_UNKNOWN_LEASE */);
	ck_assert_int_eq(raw_release(other, mine), 9 /* STATUS_NOT_YOUR_LEASE */);
	ck_assert_int_eq(raw_release(other, 0), 8 /* STATUS_UNKNOWN_LEASE */);
	/* REVOKE acks for leases it never held change nothing. */
	ck_assert_int_eq(raw_revoke_ack(other, mine), 9 /* STATUS_NOT_YOUR_LEASE */);
	ck_assert_int_eq(raw_revoke_ack(other, 424242), 8 /* STATUS_UNKNOWN_LEASE */);
	ck_assert_int_eq(raw_status(other), 0);
	ck_assert_int_eq(status_leased(d.socket), 3 * MIB);
	check_accounting("after hostile packets");

	/* The holder's lease is untouched and still its to release. */
	ck_assert_int_eq(raw_acquire(other, 1 * MIB, &id, fds + nfds, 64 - nfds, &nfds), 0);
	ck_assert_int_eq(raw_release(holder, mine), 0);
	ck_assert_int_eq(raw_release(other, id), 0);
	ck_assert_int_eq(status_leased(d.socket), 0);
	check_accounting("after releases");
	close(holder);
	close(other);
}
END_TEST

static void start_hostile(void)
{
	static const char *const more[] = { "--max-message-bytes", "1024", NULL };

	start_with(more);
}

START_TEST(test_every_limit_is_refused_with_a_status_or_a_close)
{
	int a = raw_connect(d.socket), fds[16], conns[8], extra, st;
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Acquire acq = PINBROKER__V1__ACQUIRE__INIT;
	size_t n;

	/* max-leases-per-client = 3 */
	ck_assert_int_eq(raw_hello(a), 0);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(acquire_size(a, 64 * 1024), 0);
	ck_assert_int_eq(acquire_size(a, 64 * 1024), 15 /* STATUS_LIMIT */);
	ck_assert_int_eq(raw_status(a), 0);

	/* max-pending-acquires = 1: fill the budget, then wait twice. In a child: a live
	 * holder's leases stay counted after its connection closes, until it exits. */
	{
		pid_t kid = itest_fork();
		int wst;

		ck_assert_int_ge(kid, 0);
		if (kid == 0) {
			int b = raw_connect(d.socket), c = raw_connect(d.socket), err;
			Pinbroker__V1__Reply *rep;

			if (raw_hello(b) != 0 || raw_hello(c) != 0 || acquire_size(b, 60 * MIB) != 0)
				_exit(10);
			acq.size = 8 * MIB;
			acq.has_flags = true;
			acq.flags = PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_WAIT;
			acq.has_timeout_ms = true;
			acq.timeout_ms = 3000;
			req.has_seq = true;
			req.seq = 1;
			req.body_case = PINBROKER__V1__REQUEST__BODY_ACQUIRE;
			req.acquire = &acq;
			if (raw_send(c, &req, NULL, 0) < 0) /* waits */
				_exit(11);
			if (!wait_waiting_via(b, 1, 3000)) /* the daemon has c's acquire waiting */
				_exit(14);
			if (raw_send(b, &req, NULL, 0) < 0)
				_exit(12);
			rep = raw_recv(b, fds, 16, &n, 2000, &err);
			if (!rep || rep->status != 15 /* STATUS_LIMIT */ ||
			    !strstr(rep->message, "max-pending-acquires"))
				_exit(13);
			_exit(0);
		}
		ck_assert_int_eq(waitpid(kid, &wst, 0), kid);
		ck_assert_msg(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "pending-limit child failed (%d)", wst);
	}
	ck_assert_int_eq(wait_leased(d.socket, 3 * 64 * 1024, 3000), 3 * 64 * 1024);

	/* max-connections-per-uid = 6 (a holds one): the seventh is closed at once. */
	for (int i = 0; i < 5; i++) {
		conns[i] = raw_connect(d.socket);
		ck_assert_int_eq(raw_hello(conns[i]), 0);
	}
	extra = raw_connect(d.socket);
	ck_assert_int_ge(extra, 0);
	st = raw_hello(extra);
	ck_assert_msg(st < 0, "connection over max-connections-per-uid got HELLO status %d", st);
	close(extra);
	for (int i = 0; i < 5; i++)
		close(conns[i]);

	/*
	 * Silent connections filling the uid's slots give way, oldest first: pinctl still gets in. First the five
	 * closes must have reached the daemon: asked over a, its status lists a alone.
	 */
	ck_assert_msg(wait_clients_via(a, 1, 3000), "the daemon still counts the closed connections");
	for (int i = 0; i < 5; i++)
		conns[i] = raw_connect(d.socket);
	{
		char *out = NULL;

		ck_assert_int_eq(pinctl(&d, &out, "status"), 0);
		free(out);
	}
	ck_assert(raw_closed_by_peer(conns[0], 2000));
	for (int i = 0; i < 5; i++)
		close(conns[i]);

	/* handshake-timeout-ms = 300 */
	extra = raw_connect(d.socket);
	ck_assert(raw_closed_by_peer(extra, 3000));
	close(extra);

	/* max-message-bytes = 256 */
	assert_oversized_closes(300);
	ck_assert_int_eq(raw_status(a), 0);
	check_accounting("after the limits");
	close(a);
}
END_TEST

static void start_limits(void)
{
	static const char *const args[] = {
		"--budget",
		"64M",
		"--max-leases-per-client",
		"3",
		"--max-pending-acquires",
		"1",
		"--max-connections",
		"16",
		"--max-connections-per-uid",
		"6",
		"--handshake-timeout-ms",
		"300",
		"--max-message-bytes",
		"256",
		"--pool-shrink-delay-ms",
		"0",
		NULL,
	};

	daemon_start(&d, args);
}

START_TEST(test_total_connection_limit_closes_the_extra_one)
{
	int conns[16], extra;

	for (int i = 0; i < 16; i++) {
		conns[i] = raw_connect(d.socket);
		ck_assert_int_eq(raw_hello(conns[i]), 0);
	}
	extra = raw_connect(d.socket);
	ck_assert_int_lt(raw_hello(extra), 0);
	close(extra);
	close(conns[0]);
	/* The close must have reached the daemon before a new connection can take its slot. */
	ck_assert_msg(wait_clients_via(conns[1], 15, 3000), "the daemon still counts the closed connection");
	extra = raw_connect(d.socket);
	ck_assert_int_eq(raw_hello(extra), 0);
	close(extra);
	for (int i = 1; i < 16; i++)
		close(conns[i]);
}
END_TEST

ITEST_FIXTURE_START(start_total_limit, d, ITEST_ARGS("--max-connections", "16", "--max-connections-per-uid", "16"))

/* The child's RLIMIT_NOFILE, soft and hard, just before exec: the daemon raises soft to hard and no further. */
static void child_nofile(void *ud)
{
	struct rlimit rl = { *(const rlim_t *)ud, *(const rlim_t *)ud };

	if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
		_exit(125);
}

/*
 * A prewarm of more chunks than RLIMIT_NOFILE leaves room for (4 GiB of 2 MiB chunks at 1,400 fds, with 16
 * connections' share, reserve-fds and the queued-fd cap kept free): the daemon warms what fits, says what to raise,
 * and keeps the descriptors that accept and the pressure monitor need. Before, warm-up ran to EMFILE and took them:
 * the monitor could not start and accept failed (seen on the H200 host with a 64 GiB prewarm at 20,000 fds).
 */
START_TEST(test_prewarm_past_the_fd_limit_warms_what_fits_and_keeps_serving)
{
	static const rlim_t nofile = 1400;
	static const char *const args[] = { "--max-connections",
					    "16",
					    "--max-connections-per-uid",
					    "16",
					    "--budget",
					    "4G",
					    "--prewarm",
					    "4G",
					    "--chunk-size",
					    "2M",
					    "--chunk-max",
					    "2M",
					    "--hugetlb",
					    "no",
					    NULL };
	int conns[3], fds[64];
	size_t nfds;
	uint64_t id;
	int64_t pool;
	char *log;

	daemon_prepare(&d);
	daemon_restart_with(&d, args, child_nofile, (void *)&nofile);
	pool = status_pool(d.socket);
	ck_assert_int_gt(pool, 0);
	/* 1,400 fds less the connections' share, reserve-fds and the queued-fd cap leave ~250 chunks: 0.5 GiB. */
	ck_assert_int_le(pool, 1024ll * 1024 * 1024);
	for (int i = 0; i < 3; i++) {
		conns[i] = raw_connect(d.socket);
		ck_assert_int_ge(conns[i], 0);
		ck_assert_int_eq(raw_hello(conns[i]), 0);
		ck_assert_int_eq(raw_acquire(conns[i], 4u << 20, &id, fds, 64, &nfds), 0);
		for (size_t k = 0; k < nfds; k++)
			close(fds[k]);
	}
	log = daemon_log(&d);
	ck_assert_msg(strstr(log, "than the daemon's file descriptors allow") && strstr(log, "raise LimitNOFILE"),
		      "no notice of the clamped prewarm:\n%s", itest_tail(log));
	ck_assert_msg(!strstr(log, "monitor unavailable") && !strstr(log, "accept failed") &&
			      !strstr(log, "Too many open files"),
		      "the warm-up took descriptors the daemon needs:\n%s", itest_tail(log));
	free(log);
	for (int i = 0; i < 3; i++)
		close(conns[i]);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-hardening");

	CHECK_CASE(s, "crash-storm", start, stop, 120, test_crash_storm_returns_every_byte_fd_and_page);

	CHECK_CASE(s, "flood", start_flood, stop, 60, test_flood_of_half_open_connections_never_starves_status);

	CHECK_CASE(s, "hostile", start_hostile, stop, 60,
		   test_hostile_packets_close_only_their_connection_and_keep_the_books);

	CHECK_CASE(s, "limits", start_limits, stop, 30, test_every_limit_is_refused_with_a_status_or_a_close);

	CHECK_CASE(s, "total-limit", start_total_limit, stop, 30, test_total_connection_limit_closes_the_extra_one);

	CHECK_CASE(s, "prewarm-nofile", NULL, stop, 60,
		   test_prewarm_past_the_fd_limit_warms_what_fits_and_keeps_serving);
	return s;
}

CHECK_MAIN(suite)

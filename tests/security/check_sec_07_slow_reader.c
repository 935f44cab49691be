/* SPDX-License-Identifier: MIT */
/* Finding 7: clients that never read their replies must not pin daemon memory; they are cut off at a byte cap. */
#include <check.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pinbroker.h"
#include "sec.h"
#include "pinbroker.pb-c.h"

#define NSLOW 8
#define NLEASES 400

static struct daemon d;

static void start_with(const char *per_conn, const char *total)
{
	const char *args[] = { "--max-queued-bytes-per-connection", per_conn, "--max-queued-bytes", total, NULL };

	daemon_start(&d, args);
}

SEC_STOP(stop, d)

/*
 * ASan's quarantine keeps freed memory resident, so under it the heap figure says nothing and
 * only the disconnects and their log lines are checked.
 */
#if defined(__SANITIZE_ADDRESS__)
#define HEAP_BOUND_KIB(kib) LONG_MAX
#else
#define HEAP_BOUND_KIB(kib) (kib)
#endif

/* RssAnon of the daemon in KiB: its heap, where queued replies live (the pool is shmem). */
static long daemon_rss_anon_kib(void)
{
	return sec_proc_status(d.pid, "RssAnon");
}

/* Hold NLEASES leases with long labels (so STATUS replies are large) in a child until told to stop. */
static pid_t holder(int *to)
{
	int p[2], q[2];
	pid_t pid;
	char c;

	pid = itest_fork_piped(p, q);
	if (pid == 0) {
		pb_client *cl;

		sec_drop_to(SEC_UID_A);
		if (pb_connect(d.socket, &cl) < 0)
			_exit(81);
		for (int i = 0; i < NLEASES; i++) {
			struct pb_acquire_opts o = {
				.label = "a-long-label-that-makes-every-status-row-big-0123456789"
			};
			pb_lease *l;

			if (pb_acquire(cl, 4096, &o, &l) < 0)
				_exit(82);
		}
		if (write(q[1], "r", 1) != 1 || read(p[0], &c, 1) != 1)
			_exit(83);
		_exit(0);
	}
	ck_assert_int_eq(read(q[0], &c, 1), 1);
	*to = p[1];
	return pid;
}

/* Send STATUS requests and never read; returns how many went out before the daemon cut us off (-1: it never did). */
static long flood_until_closed(int fd, int seconds)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__StatusRequest sr = PINBROKER__V1__STATUS_REQUEST__INIT;
	uint64_t t0 = (uint64_t)time(NULL);
	long sent = 0;

	req.has_seq = true;
	req.body_case = PINBROKER__V1__REQUEST__BODY_STATUS;
	req.status = &sr;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	while ((uint64_t)time(NULL) - t0 < (uint64_t)seconds) {
		int r;

		req.seq = (uint64_t)sent + 10;
		r = raw_send(fd, &req, NULL, 0);
		if (r == -EAGAIN) {
			usleep(1000);
			continue;
		}
		if (r < 0)
			return sent; /* EPIPE / ECONNRESET: the daemon closed us */
		sent++;
	}
	return -1;
}

static int slow_client(void)
{
	int fd;

	ck_assert_int_ge(fd = raw_connect(d.socket), 0);
	ck_assert_int_eq(raw_hello(fd), 0);
	/* A small receive buffer, so the daemon's queue starts at once. */
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &(int){ 4096 }, sizeof(int));
	return fd;
}

START_TEST(test_client_that_never_reads_is_cut_off_at_the_byte_cap)
{
	long before, after, sent;
	int to, fd, st;
	pid_t h;
	char *log;

	start_with("1M", "64M");
	h = holder(&to);
	before = daemon_rss_anon_kib();
	fd = slow_client();
	sent = flood_until_closed(fd, 30);
	ck_assert_msg(sent >= 0, "the daemon never closed a client that reads nothing");
	after = daemon_rss_anon_kib();
	ck_assert_msg(after - before < HEAP_BOUND_KIB(8 * 1024),
		      "daemon heap grew by %ld KiB for one non-reading client", after - before);
	log = daemon_log(&d);
	ck_assert_msg(strstr(log, "max-queued-bytes-per-connection"), "no log line names the cap");
	free(log);
	close(fd);
	ck_assert_int_eq(write(to, "x", 1), 1);
	ck_assert_int_eq(waitpid(h, &st, 0), h);
	stop();
}
END_TEST

START_TEST(test_many_slow_clients_are_bounded_in_total)
{
	int fds[NSLOW], to, st, closed = 0;
	long before, peak = 0;
	pid_t h;
	char *log;

	/* Per connection 2M, 8 of them could queue 16M: the total cap of 4M must bite first. */
	start_with("2M", "4M");
	h = holder(&to);
	before = daemon_rss_anon_kib();
	for (int i = 0; i < NSLOW; i++)
		fds[i] = slow_client();
	/* Round robin, so every queue grows together and only the total cap can bite. */
	{
		Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
		Pinbroker__V1__StatusRequest sr = PINBROKER__V1__STATUS_REQUEST__INIT;
		bool dead[NSLOW] = { false };
		time_t t0 = time(NULL);

		req.has_seq = true;
		req.body_case = PINBROKER__V1__REQUEST__BODY_STATUS;
		req.status = &sr;
		for (int i = 0; i < NSLOW; i++)
			fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
		while (closed < NSLOW && time(NULL) - t0 < 20) {
			long rss;

			for (int i = 0; i < NSLOW; i++) {
				int r;

				if (dead[i])
					continue;
				req.seq = (uint64_t)i + 100;
				r = raw_send(fds[i], &req, NULL, 0);
				if (r < 0 && r != -EAGAIN) {
					dead[i] = true;
					closed++;
				}
			}
			usleep(2000);
			rss = daemon_rss_anon_kib();
			if (rss > peak)
				peak = rss;
		}
	}
	ck_assert_msg(closed > 0, "no slow client was closed");
	ck_assert_msg(peak - before < HEAP_BOUND_KIB(16 * 1024),
		      "daemon heap grew by %ld KiB for %d non-reading clients", peak - before, NSLOW);
	log = daemon_log(&d);
	ck_assert_msg(strstr(log, "(max-queued-bytes = "), "no log line names the total cap");
	free(log);
	for (int i = 0; i < NSLOW; i++)
		close(fds[i]);
	ck_assert(daemon_alive(&d));
	ck_assert_int_eq(write(to, "x", 1), 1);
	ck_assert_int_eq(waitpid(h, &st, 0), h);
	stop();
}
END_TEST

CHECK_SUITE(suite, "sec_07_slow_reader", "core", NULL, NULL, 180,
	    test_client_that_never_reads_is_cut_off_at_the_byte_cap, test_many_slow_clients_are_bounded_in_total)

SEC_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/* Status benchmark (issue 16 §8): the daemon's time per STATUS summary, per lease page and per full listing at 100, 1,000 and 20,000 live leases. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"
#include "pinbroker.pb-c.h"
#include "wire.h"

#define LEASE_BYTES 4096
/* Acquires in flight while filling the table: one round trip per window. */
#define WINDOW 64
#define REPLY_TIMEOUT_MS 30000
/* fds the daemon needs beside one per chunk: socket, PSI, /proc files, clients, reserve-fds. */
#define FD_HEADROOM 600
#define MAX_REPS 100000
/* The daemon's page size (req-status.c), for a cursor that leaves a full page behind it. */
#define PAGE_ROWS 1024
/* Let the monitor's first samples and the holder's last replies pass before timing. */
#define SETTLE_MS 300

typedef Pinbroker__V1__Request Request;
typedef Pinbroker__V1__Reply Reply;

static const char *daemon_path = PB_BENCH_DAEMON;
static unsigned reps = 1000, list_reps = 20;
static char sock_path[108], log_path[128];
static char *config_doc;

/* --------------------------------------------------------------- raw protocol */

static int raw_connect(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	if (fd < 0)
		bench_die(-errno, "socket");
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		bench_die(-errno, "connect %s", sock_path);
	return fd;
}

static void send_req(int fd, Request *req)
{
	size_t len = pinbroker__v1__request__get_packed_size(req);
	uint8_t buf[256];
	int r;

	if (len > sizeof(buf))
		bench_die(-EMSGSIZE, "request");
	pinbroker__v1__request__pack(req, buf);
	r = wire_send(fd, buf, len, NULL, 0);
	if (r < 0)
		bench_die(r, "send");
}

/* One reply (fds closed), or NULL when the daemon closed the connection. */
static Reply *recv_reply(int fd)
{
	static uint8_t buf[PB_MAX_MSG_BYTES];
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int fds[PB_MAX_FDS_PER_MSG];
	size_t nfds = 0;
	ssize_t n;

	if (poll(&p, 1, REPLY_TIMEOUT_MS) <= 0)
		bench_die(-ETIMEDOUT, "no reply within %d ms", REPLY_TIMEOUT_MS);
	n = wire_recv(fd, buf, sizeof(buf), fds, PB_MAX_FDS_PER_MSG, &nfds);
	wire_close_fds(fds, nfds);
	if (n == 0 || n == -ECONNRESET)
		return NULL;
	if (n < 0)
		bench_die((int)n, "recv");
	return pinbroker__v1__reply__unpack(NULL, (size_t)n, buf);
}

static void hello(int fd)
{
	Pinbroker__V1__Hello h = PINBROKER__V1__HELLO__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	Reply *rep;

	h.version = PB_PROTOCOL_VERSION;
	h.client_name = (char *)"bench_status";
	req.body_case = PINBROKER__V1__REQUEST__BODY_HELLO;
	req.hello = &h;
	send_req(fd, &req);
	rep = recv_reply(fd);
	if (!rep || rep->status != 0)
		bench_die(0, "HELLO refused");
	pinbroker__v1__reply__free_unpacked(rep, NULL);
}

/*
 * In a child: hold up to n leases of 4 KiB on one connection (fewer where the
 * daemon's fd limit says STATUS_LIMIT first), write how many and the last id
 * to out, wait to be killed.
 */
static void hold(size_t n, int out)
{
	int fd = raw_connect();
	uint64_t last = 0, held = 0;
	bool full = false;

	hello(fd);
	for (size_t done = 0; done < n && !full;) {
		size_t w = n - done < WINDOW ? n - done : WINDOW;

		for (size_t i = 0; i < w; i++) {
			Pinbroker__V1__Acquire a = PINBROKER__V1__ACQUIRE__INIT;
			Request req = PINBROKER__V1__REQUEST__INIT;

			a.size = LEASE_BYTES;
			req.body_case = PINBROKER__V1__REQUEST__BODY_ACQUIRE;
			req.acquire = &a;
			send_req(fd, &req);
		}
		for (size_t i = 0; i < w; i++) {
			Reply *rep = recv_reply(fd);

			if (rep && rep->status == PINBROKER__V1__STATUS_CODE__STATUS_LIMIT && held > 0) {
				full = true;
			} else if (!rep || rep->status != 0 || rep->body_case != PINBROKER__V1__REPLY__BODY_LEASE) {
				bench_die(0, "lease %zu of %zu refused: %s", done + i + 1, n,
					  rep && rep->message ? rep->message : "connection closed");
			} else {
				last = rep->lease->lease_id;
				held++;
			}
			pinbroker__v1__reply__free_unpacked(rep, NULL);
		}
		done += w;
	}
	if (write(out, &held, sizeof(held)) != sizeof(held) || write(out, &last, sizeof(last)) != sizeof(last))
		_exit(1);
	close(out);
	for (;;)
		pause();
}

/* ------------------------------------------------------------------ measuring */

enum kind { SUMMARY, PAGE, LISTING };

struct row {
	size_t leases;
	enum kind kind;
	size_t rows;  /* lease rows per reply (pages per listing) */
	bool dropped; /* the daemon closed the connection instead of answering */
	double p50_us, p99_us;
	double cpu_us; /* daemon CPU per request, from schedstat */
};

static void status_request(Request *req, Pinbroker__V1__StatusRequest *sr, enum kind k, uint64_t cursor)
{
	pinbroker__v1__request__init(req);
	pinbroker__v1__status_request__init(sr);
	sr->has_include_leases = true;
	sr->include_leases = k != SUMMARY;
	if (k != SUMMARY) {
		/* What pinctl leases asks: rows only. A daemon without paging ignores all of this. */
		sr->has_lease_cursor = cursor != 0;
		sr->lease_cursor = cursor;
		sr->has_include_clients = true;
		sr->include_clients = false;
		sr->has_include_events = true;
		sr->include_events = false;
	}
	req->body_case = PINBROKER__V1__REQUEST__BODY_STATUS;
	req->status = sr;
}

/* One STATUS (a listing: every page). Returns false if the connection was dropped. */
static bool one(int fd, enum kind k, uint64_t cursor, size_t *rows)
{
	do {
		Pinbroker__V1__StatusRequest sr;
		Request req;
		Reply *rep;

		status_request(&req, &sr, k, cursor);
		send_req(fd, &req);
		rep = recv_reply(fd);
		if (!rep)
			return false;
		if (rep->status != 0 || !rep->status_reply)
			bench_die(0, "STATUS failed: %s", rep->message ? rep->message : "no status");
		*rows = k == LISTING ? *rows + 1 : rep->status_reply->n_leases;
		cursor = rep->status_reply->has_next_lease_cursor ? rep->status_reply->next_lease_cursor : 0;
		pinbroker__v1__reply__free_unpacked(rep, NULL);
	} while (k == LISTING && cursor);
	return true;
}

static void measure(pid_t daemon, int *fd, size_t leases, enum kind k, uint64_t mid, struct row *out)
{
	unsigned n = k == LISTING ? list_reps : reps;
	double *t = calloc(n, sizeof(*t));
	int64_t cpu0;

	if (!t)
		bench_die(-ENOMEM, "calloc");
	*out = (struct row){ .leases = leases, .kind = k };
	/* Warm-up, also the check that the daemon answers at all. */
	if (!one(*fd, k, k == PAGE ? mid : 0, &out->rows)) {
		out->dropped = true;
		close(*fd);
		*fd = raw_connect();
		hello(*fd);
		free(t);
		return;
	}
	cpu0 = bench_cpu_ns(daemon);
	for (unsigned i = 0; i < n; i++) {
		uint64_t t0 = bench_now_ns();
		size_t rows = 0;

		if (!one(*fd, k, k == PAGE ? mid : 0, &rows))
			bench_die(0, "connection dropped after a first answer");
		t[i] = (double)(bench_now_ns() - t0) / 1000.0;
		out->rows = rows;
	}
	out->cpu_us = (double)(bench_cpu_ns(daemon) - cpu0) / 1000.0 / n;
	out->p50_us = bench_percentile(t, n, 50);
	out->p99_us = bench_percentile(t, n, 99);
	free(t);
}

static bool daemon_knows(const char *key)
{
	char want[96];

	snprintf(want, sizeof(want), "| `%s` |", key);
	return config_doc && strstr(config_doc, want);
}

static void read_config_doc(void)
{
	char cmd[600];
	size_t cap = 1 << 16, len = 0, n;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "'%s' --config-doc 2>/dev/null", daemon_path);
	p = popen(cmd, "r");
	config_doc = calloc(1, cap);
	if (!p || !config_doc)
		bench_die(-errno, "%s --config-doc", daemon_path);
	while ((n = fread(config_doc + len, 1, cap - len - 1, p)) > 0) {
		len += n;
		if (len + 1 >= cap) {
			config_doc = realloc(config_doc, cap *= 2);
			if (!config_doc)
				bench_die(-ENOMEM, "realloc");
		}
	}
	config_doc[len] = '\0';
	pclose(p);
}

static void run_one(size_t leases, struct row rows[3])
{
	static const char *const limits[][2] = {
		{ "max-leases-per-client", "1000000" },
		{ "max-leases-per-uid", "1000000" },
		{ "max-chunks-per-uid", "1000000" },
	};
	const char *extra[32] = { "--chunk-size", "4K",        "--prewarm", "0",           "--budget",
				  "1G",           "--hugetlb", "no",        "--uid-quota", "100%" };
	char flags[3][64];
	size_t n = 10;
	uint64_t last = 0, held = 0, page;
	pid_t daemon, holder;
	int pfd[2], fd;

	for (size_t i = 0; i < 3; i++) {
		if (!daemon_knows(limits[i][0]))
			continue;
		snprintf(flags[i], sizeof(flags[i]), "--%s", limits[i][0]);
		extra[n++] = flags[i];
		extra[n++] = limits[i][1];
	}
	extra[n] = NULL;
	daemon = bench_daemon_start(daemon_path, sock_path, log_path, extra);
	if (pipe(pfd) < 0)
		bench_die(-errno, "pipe");
	fflush(NULL);
	holder = fork();
	if (holder < 0)
		bench_die(-errno, "fork");
	if (holder == 0) {
		close(pfd[0]);
		hold(leases, pfd[1]);
	}
	close(pfd[1]);
	if (read(pfd[0], &held, sizeof(held)) != sizeof(held) || read(pfd[0], &last, sizeof(last)) != sizeof(last))
		bench_die(0, "the holder did not get %zu leases; see %s", leases, log_path);
	close(pfd[0]);
	if (held < leases)
		printf("# %zu leases asked, %llu granted: the daemon's chunk capacity (fds, mappings) stops there\n",
		       leases, (unsigned long long)held);
	leases = held;

	fd = raw_connect();
	hello(fd);
	/* Ids are consecutive here. A full page (1024 rows, or every lease) from the middle of the table: the
	 * cursor's lookup is part of the cost. */
	page = leases < PAGE_ROWS ? leases : PAGE_ROWS;
	bench_sleep_ms(SETTLE_MS);
	measure(daemon, &fd, leases, SUMMARY, 0, &rows[0]);
	measure(daemon, &fd, leases, PAGE, last - leases + (leases - page) / 2, &rows[1]);
	measure(daemon, &fd, leases, LISTING, 0, &rows[2]);
	close(fd);
	kill(holder, SIGKILL);
	waitpid(holder, NULL, 0);
	bench_daemon_stop(daemon);
}

/* The daemon keeps one fd per 4 KiB chunk: the largest count the fd limit allows. */
static size_t fd_capped(size_t want)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		bench_die(-errno, "getrlimit");
	if (rl.rlim_max < want + FD_HEADROOM) {
		struct rlimit up = { .rlim_cur = want + FD_HEADROOM, .rlim_max = want + FD_HEADROOM };

		if (setrlimit(RLIMIT_NOFILE, &up) == 0)
			return want;
		return rl.rlim_max > FD_HEADROOM ? (size_t)(rl.rlim_max - FD_HEADROOM) / 100 * 100 : 0;
	}
	if (rl.rlim_cur < want + FD_HEADROOM) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	return want;
}

static void usage(int code)
{
	printf("Usage: bench_status [--daemon PATH] [--reps N] [--counts N,N,N] [--quick]\n");
	exit(code);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "daemon", required_argument, NULL, 'd' }, { "reps", required_argument, NULL, 'n' },
		{ "counts", required_argument, NULL, 'c' }, { "quick", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },         { NULL, 0, NULL, 0 },
	};
	static const char *const names[] = { "STATUS summary (no lease rows)", "lease page from the middle",
					     "every lease, page by page" };
	size_t counts[] = { 100, 1000, 20000 }, asked;
	struct row rows[3][3];
	int opt;

	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'd':
			daemon_path = optarg;
			break;
		case 'n':
			reps = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'q':
			reps = 200;
			list_reps = 5;
			break;
		case 'c':
			if (sscanf(optarg, "%zu,%zu,%zu", &counts[0], &counts[1], &counts[2]) != 3 || !counts[0] ||
			    !counts[1] || !counts[2])
				usage(2);
			break;
		case 'h':
			usage(0);
			break;
		default:
			usage(2);
		}
	}
	if (reps == 0 || reps > MAX_REPS)
		usage(2);
	signal(SIGPIPE, SIG_IGN);
	snprintf(sock_path, sizeof(sock_path), "/tmp/pb-bench-status.%d.sock", (int)getpid());
	snprintf(log_path, sizeof(log_path), "/tmp/pb-bench-status.%d.log", (int)getpid());
	read_config_doc();
	asked = counts[2];
	counts[2] = fd_capped(counts[2]);

	printf("## bench_status: the daemon's cost per STATUS as the lease table grows (issue 16 §8)\n");
	bench_print_host();
	printf("# %s --chunk-size 4K --prewarm 0 --budget 1G; one holder connection keeps N leases of 4 KiB, "
	       "the daemon is otherwise idle; %u requests per row (%u listings), one at a time\n",
	       daemon_path, reps, list_reps);
	if (counts[2] < asked)
		printf("# the hard RLIMIT_NOFILE here allows %zu leases of one fd each, not %zu (no CAP_SYS_RESOURCE "
		       "to raise it)\n",
		       counts[2], asked);
	printf("# round trip = send → reply parsed by this client; daemon CPU = its schedstat time over the row "
	       "divided by the requests: the loop time one request costs\n\n");
	for (size_t i = 0; i < 3; i++) {
		run_one(counts[i], rows[i]);
		fflush(stdout);
	}
	printf("| live leases | request | lease rows | round trip p50 | p99 | daemon CPU per request |\n");
	printf("|---:|---|---:|---:|---:|---:|\n");
	for (size_t i = 0; i < 3; i++)
		for (size_t k = 0; k < 3; k++) {
			const struct row *r = &rows[i][k];

			if (r->dropped) {
				printf("| %zu | %s | - | connection dropped (reply over the send buffer) | - | - |\n",
				       r->leases, names[k]);
				continue;
			}
			printf("| %zu | %s | %zu%s | %.0f µs | %.0f µs | %.0f µs |\n", r->leases, names[k], r->rows,
			       k == LISTING ? " pages" : "", r->p50_us, r->p99_us, r->cpu_us);
		}
	bench_print_load();
	unlink(log_path);
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * pinbroker-metrics-http: answers one HTTP request on stdin/stdout with the daemon's Prometheus metrics,
 * for hosts without node_exporter. systemd's pinbroker-metrics.socket (Accept=yes) accepts the
 * connection and starts one pinbroker-metrics@.service per connection with it as stdin and stdout,
 * inetd-style; the figures come from the daemon through libpinbroker's pb_metrics, the same request
 * `pinctl metrics` makes, so daemon/metrics.c stays the one place that renders them.
 *
 * GET or HEAD /metrics: 200 with the text format (Content-Type: text/plain; version=0.0.4); 503 when
 * no daemon answers (so the scrape fails and `up` drops to 0). Another path: 404. Another method: 405.
 * Anything that is not an HTTP/1.x request line: 400. A request head not complete within --timeout-ms:
 * 408. A request head over --max-head-bytes (8 KiB by default): 431. Headers are read and ignored; the
 * connection is closed after one answer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "pinbroker.h"

/* Request line and headers (--max-head-bytes); Prometheus sends about 300 bytes. */
#define HEAD_MAX_BYTES_DEFAULT 8192
#define HEAD_MAX_BYTES_MIN 1024      /* room for a request line with a target of TARGET_MAX_BYTES */
#define HEAD_MAX_BYTES_MAX (1 << 20) /* what one short-lived process may buffer for a stranger */
#define DEFAULT_TIMEOUT_MS 5000      /* for the whole request head: Prometheus sends it at once */
#define TARGET_MAX_BYTES 1024        /* longer targets are answered 404 like any other unknown path */
#define LINGER_MS 1000               /* how long unread input is drained after the answer */
#define LINGER_MAX_BYTES (1 << 20)   /* and how much of it */
#define METRICS_CTYPE "text/plain; version=0.0.4; charset=utf-8"

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The end of the request head in buf[0..len): after the blank line (CRLF or bare LF), or 0 while incomplete. */
static size_t head_end(const char *buf, size_t len)
{
	for (size_t i = 0; i + 1 < len; i++) {
		if (buf[i] != '\n')
			continue;
		if (buf[i + 1] == '\n')
			return i + 2;
		if (buf[i + 1] == '\r' && i + 2 < len && buf[i + 2] == '\n')
			return i + 3;
	}
	return 0;
}

/*
 * Read the request head from fd until its blank line, or until EOF after at least one whole line (a client
 * that sends only a request line and shuts down its side is answered too). Returns 0 and *len, -ETIMEDOUT when
 * the head is not in by timeout_ms, -EMSGSIZE when it overflows cap, -ENODATA on EOF before a whole line, or
 * another negative errno from read.
 */
static int read_head(int fd, char *buf, size_t cap, int timeout_ms, size_t *len)
{
	int64_t deadline = mono_ms() + timeout_ms;
	size_t n = 0;

	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int64_t left = deadline - mono_ms();
		ssize_t k;
		int r;

		if (left <= 0)
			return -ETIMEDOUT;
		r = poll(&p, 1, (int)left);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return -ETIMEDOUT;
		if (n == cap)
			return -EMSGSIZE;
		k = read(fd, buf + n, cap - n);
		if (k < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			break;
		n += (size_t)k;
		if (head_end(buf, n))
			break;
	}
	if (!memchr(buf, '\n', n))
		return n ? -EBADMSG : -ENODATA;
	*len = n;
	return 0;
}

/*
 * Parse "METHOD SP TARGET SP HTTP/1.x" (the first line of buf, CRLF or LF) into method and the target's path (no
 * query). Returns 0, or -EINVAL for anything else: a method that is not a token of capitals, a target that is not
 * an absolute path, another protocol, control bytes.
 */
static int parse_request_line(const char *buf, size_t len, char *method, size_t method_cap, char *path, size_t path_cap)
{
	const char *eol = memchr(buf, '\n', len), *sp1, *sp2, *end;
	size_t ml, pl;

	if (!eol)
		return -EINVAL;
	end = eol > buf && eol[-1] == '\r' ? eol - 1 : eol;
	sp1 = memchr(buf, ' ', (size_t)(end - buf));
	if (!sp1)
		return -EINVAL;
	sp2 = memchr(sp1 + 1, ' ', (size_t)(end - sp1 - 1));
	if (!sp2)
		return -EINVAL;
	ml = (size_t)(sp1 - buf);
	if (ml == 0 || ml >= method_cap)
		return -EINVAL;
	for (size_t i = 0; i < ml; i++)
		if (buf[i] < 'A' || buf[i] > 'Z')
			return -EINVAL;
	if (end - sp2 - 1 != 8 || memcmp(sp2 + 1, "HTTP/1.", 7) != 0 || (sp2[8] != '0' && sp2[8] != '1'))
		return -EINVAL;
	if (sp1[1] != '/')
		return -EINVAL;
	for (const char *p = sp1 + 1; p < sp2; p++)
		if ((unsigned char)*p <= ' ' || *p == 0x7f)
			return -EINVAL;
	pl = strcspn(sp1 + 1, "? ");
	if (pl > (size_t)(sp2 - sp1 - 1))
		pl = (size_t)(sp2 - sp1 - 1);
	memcpy(method, buf, ml);
	method[ml] = '\0';
	/* A target too long for path is no path this server knows: keep its start, which then fails to match. */
	if (pl >= path_cap)
		pl = path_cap - 1;
	memcpy(path, sp1 + 1, pl);
	path[pl] = '\0';
	return 0;
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t k = write(fd, p, n);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

/* One whole answer; extra is more header lines (each ending in CRLF) or "". */
static int respond(int fd, int code, const char *reason, const char *ctype, const char *extra, const char *body,
		   size_t body_len, bool head_only)
{
	char *h = NULL;
	int n, r;

	n = asprintf(&h,
		     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n"
		     "Cache-Control: no-store\r\n\r\n",
		     code, reason, ctype, body_len, extra);
	if (n < 0)
		return -ENOMEM;
	r = write_all(fd, h, (size_t)n);
	free(h);
	if (r == 0 && !head_only)
		r = write_all(fd, body, body_len);
	return r;
}

static int respond_text(int fd, int code, const char *reason, const char *extra, const char *text, bool head_only)
{
	return respond(fd, code, reason, "text/plain; charset=utf-8", extra, text, strlen(text), head_only);
}

/* The metrics from the daemon at socket (NULL: $PINBROKER_SOCKET or the default), or 503 saying why not. */
static int serve_metrics(int out, const char *socket_path, bool head_only)
{
	pb_client *c = NULL;
	char *text = NULL, *msg = NULL;
	int r;

	r = pb_connect(socket_path, &c);
	if (r == 0) {
		r = pb_metrics(c, &text);
		pb_disconnect(c);
	}
	if (r < 0) {
		if (asprintf(&msg, "pinbroker: no metrics from the daemon: %s\n", pb_strerror(r)) < 0)
			return -ENOMEM;
		fputs(msg, stderr);
		r = respond_text(out, 503, "Service Unavailable", "Retry-After: 15\r\n", msg, head_only);
		free(msg);
		return r;
	}
	r = respond(out, 200, "OK", METRICS_CTYPE, "", text, strlen(text), head_only);
	free(text);
	return r;
}

/*
 * End the answer (FIN where out is a socket), then read and drop what the client still sends, for a bounded time:
 * closing with unread input makes the kernel reset the connection, and the client may then lose the answer (a
 * request head too large, or garbage, is exactly such a case). This is the lingering close HTTP servers do.
 */
static void linger_close(int in, int out)
{
	int64_t deadline = mono_ms() + LINGER_MS;
	size_t total = 0;
	char buf[4096];

	(void)shutdown(out, SHUT_WR);
	while (total < LINGER_MAX_BYTES) {
		struct pollfd p = { .fd = in, .events = POLLIN };
		int64_t left = deadline - mono_ms();
		ssize_t k;

		if (left <= 0 || poll(&p, 1, (int)left) <= 0)
			break;
		k = read(in, buf, sizeof(buf));
		if (k <= 0)
			break;
		total += (size_t)k;
	}
}

static void usage(FILE *f)
{
	fputs("Usage: pinbroker-metrics-http [--socket PATH] [--timeout-ms MS] [--max-head-bytes N]\n"
	      "Answer one HTTP request on stdin/stdout (inetd-style, as pinbroker-metrics@.service runs it):\n"
	      "GET /metrics gives the daemon's Prometheus metrics, as `pinctl metrics` prints them.\n"
	      "  --socket PATH     the daemon's socket (default $PINBROKER_SOCKET, else /run/pinbroker/pinbroker.sock)\n"
	      "  --timeout-ms MS   how long the request head may take to arrive (default 5000)\n"
	      "  --max-head-bytes N  largest request head (request line and headers) answered; a larger one gets\n"
	      "                    431 (1024 to 1048576, default 8192)\n",
	      f);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = { { "socket", required_argument, NULL, 's' },
					      { "timeout-ms", required_argument, NULL, 't' },
					      { "max-head-bytes", required_argument, NULL, 'm' },
					      { "help", no_argument, NULL, 'h' },
					      { NULL, 0, NULL, 0 } };
	char method[16], path[TARGET_MAX_BYTES], *buf;
	const char *socket_path = NULL;
	long timeout_ms = DEFAULT_TIMEOUT_MS, head_max_bytes = HEAD_MAX_BYTES_DEFAULT;
	struct timeval tv;
	bool head_only;
	size_t len = 0;
	char *end;
	int o, r;

	while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			socket_path = optarg;
			break;
		case 't':
			errno = 0;
			timeout_ms = strtol(optarg, &end, 10);
			if (errno || *end || timeout_ms < 1 || timeout_ms > 600000) {
				fprintf(stderr, "pinbroker-metrics-http: --timeout-ms wants 1 to 600000, not '%s'\n",
					optarg);
				return 2;
			}
			break;
		case 'm':
			errno = 0;
			head_max_bytes = strtol(optarg, &end, 10);
			if (errno || *end || head_max_bytes < HEAD_MAX_BYTES_MIN ||
			    head_max_bytes > HEAD_MAX_BYTES_MAX) {
				fprintf(stderr, "pinbroker-metrics-http: --max-head-bytes wants %d to %d, not '%s'\n",
					HEAD_MAX_BYTES_MIN, HEAD_MAX_BYTES_MAX, optarg);
				return 2;
			}
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		usage(stderr);
		return 2;
	}
	/* A client gone mid-answer is its problem, not a crash; a client that stops reading is cut off. */
	signal(SIGPIPE, SIG_IGN);
	tv = (struct timeval){ .tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000 };
	(void)setsockopt(STDOUT_FILENO, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)); /* fails harmlessly on a pipe */

	buf = malloc((size_t)head_max_bytes);
	if (!buf) {
		fprintf(stderr, "pinbroker-metrics-http: out of memory\n");
		return 1;
	}
	r = read_head(STDIN_FILENO, buf, (size_t)head_max_bytes, (int)timeout_ms, &len);
	if (r == -ENODATA) {
		free(buf);
		return 0; /* connected and closed without a word: nothing to answer */
	}
	if (r == -ETIMEDOUT)
		r = respond_text(STDOUT_FILENO, 408, "Request Timeout", "", "request not received in time\n", false);
	else if (r == -EMSGSIZE)
		r = respond_text(STDOUT_FILENO, 431, "Request Header Fields Too Large", "", "request head too large\n",
				 false);
	else if (r < 0 || parse_request_line(buf, len, method, sizeof(method), path, sizeof(path)) < 0)
		r = respond_text(STDOUT_FILENO, 400, "Bad Request", "", "not an HTTP/1.x request\n", false);
	else {
		head_only = strcmp(method, "HEAD") == 0;
		if (!head_only && strcmp(method, "GET") != 0)
			r = respond_text(STDOUT_FILENO, 405, "Method Not Allowed", "Allow: GET, HEAD\r\n",
					 "only GET and HEAD\n", false);
		else if (strcmp(path, "/metrics") != 0)
			r = respond_text(STDOUT_FILENO, 404, "Not Found", "", "pinbroker serves /metrics only\n",
					 head_only);
		else
			r = serve_metrics(STDOUT_FILENO, socket_path, head_only);
	}
	free(buf);
	if (r == 0)
		linger_close(STDIN_FILENO, STDOUT_FILENO);
	return r < 0 ? 1 : 0;
}

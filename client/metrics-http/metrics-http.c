/* SPDX-License-Identifier: MIT */
/*
 * pinbroker-metrics-http: the daemon's Prometheus metrics over HTTP, for hosts without node_exporter. The
 * figures come from the daemon through libpinbroker's pb_metrics, the same request `pinctl metrics` makes, so
 * daemon/metrics.c stays the one place that renders them.
 *
 * Two ways to run. Given a listening socket by systemd (pinbroker-metrics.socket, Accept=no: $LISTEN_FDS), it is
 * one long-running server with its own accept loop: up to CONNS_MAX connections at once, each with its own
 * deadlines, and a newcomer past that bound closes the oldest connection that has been silent for SILENT_MS (then
 * one answered, then one not reading its answer; conn_slot). So idle connections, however many and however often
 * re-opened, never keep a scraper out: a scraper sends its request as soon as it connects, and the silent ones go
 * first. (With one process per connection and
 * MaxConnections=16, sixteen one-byte connections re-opened as each was cut left a scraper 0 of 20 scrapes.)
 * Otherwise it answers one request on stdin/stdout, inetd-style.
 *
 * With --daemon-marker PATH (as pinbroker-metrics.service runs it) the daemon is asked only while PATH exists:
 * pinbrokerd.service makes it once the daemon is ready and removes it before the daemon stops. The broker's
 * socket is pinbrokerd.socket's, held by PID 1, so a connection to a stopped daemon would start it again (socket
 * activation); a scrape must only watch. Without the marker the answer is 503 saying the daemon is not running.
 *
 * GET or HEAD /metrics: 200 with the text format (Content-Type: text/plain; version=0.0.4); 503 when
 * no daemon answers (so the scrape fails and `up` drops to 0). Another path: 404. Another method: 405.
 * Anything that is not an HTTP/1.x request line: 400. A request head not complete within --timeout-ms:
 * 408. A request head over --max-head-bytes (8 KiB by default): 431. Headers are read and ignored; the
 * connection is closed after one answer. One answer of the daemon serves every request for METRICS_REUSE_MS, so
 * requests, however many, cost the daemon at most one metrics request a second.
 */
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
/* How long one answer of the daemon serves requests (fetch_metrics): far under any scrape interval. */
#define METRICS_REUSE_MS 1000
/* Server mode: connections at once (a scrape is one short connection per interval and target), and accepts per
 * loop turn, taken after the connections already open are served, so a burst of newcomers cannot evict a
 * scraper's connection before its request, already sent, is read. */
#define CONNS_MAX 64
#define ACCEPTS_PER_TURN 8
/* A connection silent (or writing) this long since its accept is no scraper, whose request and read are quick. */
#define SILENT_MS 250
#define SD_LISTEN_FDS_START 3
#define LISTEN_FDS_MAX 16 /* ListenStream= lines of the socket unit served (loopback, a management address) */

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
 * Where reading a request head stands after n bytes of buf (cap at most), eof when the client shut its side:
 * 1 when it is whole (its blank line; or EOF after at least one whole line: a client that sends only a request
 * line and shuts down its side is answered too), 0 while more may come, -EMSGSIZE when it fills cap unfinished,
 * -ENODATA on EOF before any byte, -EBADMSG on EOF before a whole line.
 */
static int head_check(const char *buf, size_t n, size_t cap, bool eof)
{
	if (head_end(buf, n))
		return 1;
	if (eof)
		return memchr(buf, '\n', n) ? 1 : n ? -EBADMSG : -ENODATA;
	return n == cap ? -EMSGSIZE : 0;
}

/*
 * Read the request head from fd until head_check says it is whole. Returns 0 and *len, -ETIMEDOUT when the head
 * is not in by timeout_ms, or head_check's error, or another negative errno from read.
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
		k = read(fd, buf + n, cap - n);
		if (k < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (k < 0)
			return -errno;
		n += (size_t)k;
		r = head_check(buf, n, cap, k == 0);
		if (r < 0)
			return r;
		if (r == 1)
			break;
	}
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

/*
 * One whole answer, built into *out (malloc'd, *out_len bytes); extra is more header lines (each ending in CRLF)
 * or "".
 */
static int respond(char **out, size_t *out_len, int code, const char *reason, const char *ctype, const char *extra,
		   const char *body, size_t body_len, bool head_only)
{
	char *h = NULL;
	int n;

	n = asprintf(&h,
		     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n"
		     "Cache-Control: no-store\r\n\r\n",
		     code, reason, ctype, body_len, extra);
	if (n < 0)
		return -ENOMEM;
	if (!head_only && body_len) {
		char *all = realloc(h, (size_t)n + body_len);

		if (!all) {
			free(h);
			return -ENOMEM;
		}
		memcpy(all + n, body, body_len);
		h = all;
		n += (int)body_len;
	}
	*out = h;
	*out_len = (size_t)n;
	return 0;
}

static int respond_text(char **out, size_t *out_len, int code, const char *reason, const char *extra, const char *text,
			bool head_only)
{
	return respond(out, out_len, code, reason, "text/plain; charset=utf-8", extra, text, strlen(text), head_only);
}

/* The daemon's last answer (its metrics, or why there were none), and when it came. */
static struct {
	char *text; /* the metrics; NULL when the daemon gave none: then msg says why */
	char *msg;
	int64_t at_ms;
} fetched;

/* --daemon-marker: the file whose absence says the daemon is not running (NULL: always ask it). */
static const char *daemon_marker;

/*
 * The daemon's metrics at most METRICS_REUSE_MS old: a newer request reuses the last answer instead of asking
 * again, so requests sent faster than that cost the daemon nothing and are answered without a round trip (a
 * flood of whole requests once made one each, and the backlog kept scrapers out). Returns 0 (fetched.text, or
 * fetched.msg when the daemon gave none), or -ENOMEM.
 */
static int fetch_metrics(const char *socket_path)
{
	pb_client *c = NULL;
	int64_t now = mono_ms();
	/* Checked first: a daemon stopped since the last answer gets no more of its metrics served from it. */
	bool down = daemon_marker && access(daemon_marker, F_OK) < 0;
	int r;

	if ((fetched.text || fetched.msg) && now - fetched.at_ms < METRICS_REUSE_MS && !(down && fetched.text))
		return 0;
	free(fetched.text);
	free(fetched.msg);
	fetched.text = fetched.msg = NULL;
	if (down) {
		/* Not even a connect: to the socket unit's socket it would start the daemon the admin stopped. */
		if (asprintf(
			    &fetched.msg,
			    "pinbroker: pinbrokerd is not running (no %s: it is stopped, or not started yet); a scrape "
			    "does not start it: systemctl start pinbrokerd.service, or wait for its first client\n",
			    daemon_marker) < 0) {
			fetched.msg = NULL;
			return -ENOMEM;
		}
		fetched.at_ms = mono_ms();
		return 0;
	}
	r = pb_connect(socket_path, &c);
	if (r == 0) {
		r = pb_metrics(c, &fetched.text);
		pb_disconnect(c);
	}
	if (r < 0) {
		if (asprintf(&fetched.msg, "pinbroker: no metrics from the daemon: %s\n", pb_strerror(r)) < 0) {
			fetched.msg = NULL;
			return -ENOMEM;
		}
		fputs(fetched.msg, stderr);
	}
	fetched.at_ms = mono_ms();
	return 0;
}

/* The metrics from the daemon at socket (NULL: $PINBROKER_SOCKET or the default), or 503 saying why not. */
static int serve_metrics(char **out, size_t *out_len, const char *socket_path, bool head_only)
{
	int r = fetch_metrics(socket_path);

	if (r < 0)
		return r;
	if (!fetched.text)
		return respond_text(out, out_len, 503, "Service Unavailable", "Retry-After: 15\r\n", fetched.msg,
				    head_only);
	return respond(out, out_len, 200, "OK", METRICS_CTYPE, "", fetched.text, strlen(fetched.text), head_only);
}

/*
 * The answer to a request head: rr is how reading it ended (0: buf[0, len) holds it; -ETIMEDOUT, -EMSGSIZE, or
 * another error). Returns 0 with *out set, 1 when there is nothing to answer (closed without a word), or -ENOMEM.
 */
static int answer(int rr, const char *buf, size_t len, const char *socket_path, char **out, size_t *out_len)
{
	char method[16], path[TARGET_MAX_BYTES];
	bool head_only;

	if (rr == -ENODATA)
		return 1;
	if (rr == -ETIMEDOUT)
		return respond_text(out, out_len, 408, "Request Timeout", "", "request not received in time\n", false);
	if (rr == -EMSGSIZE)
		return respond_text(out, out_len, 431, "Request Header Fields Too Large", "",
				    "request head too large\n", false);
	if (rr < 0 || parse_request_line(buf, len, method, sizeof(method), path, sizeof(path)) < 0)
		return respond_text(out, out_len, 400, "Bad Request", "", "not an HTTP/1.x request\n", false);
	head_only = strcmp(method, "HEAD") == 0;
	if (!head_only && strcmp(method, "GET") != 0)
		return respond_text(out, out_len, 405, "Method Not Allowed", "Allow: GET, HEAD\r\n",
				    "only GET and HEAD\n", false);
	if (strcmp(path, "/metrics") != 0)
		return respond_text(out, out_len, 404, "Not Found", "", "pinbroker serves /metrics only\n", head_only);
	return serve_metrics(out, out_len, socket_path, head_only);
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

/* Server mode: one connection's life. */
enum conn_state {
	CONN_FREE,
	CONN_READING,   /* its request head is coming: the first to go when the table is full */
	CONN_WRITING,   /* the answer is going out, as fast as the client reads it */
	CONN_LINGERING, /* answered: what it still sends is drained, for LINGER_MS (linger_close's reason) */
};

struct conn {
	enum conn_state state;
	int fd;
	int64_t accepted_ms;
	uint64_t accepted_turn; /* the server's turn it was accepted in */
	int64_t deadline_ms;    /* of the state it is in */
	size_t in_len;
	char *out;
	size_t out_len, out_off;
	size_t drained;
	char *in; /* max_head_bytes */
};

struct server {
	int listen_fds[LISTEN_FDS_MAX];
	size_t nlisten;
	const char *socket_path;
	int timeout_ms;
	size_t head_max_bytes;
	uint64_t turn; /* loop turns so far */
	struct conn conns[CONNS_MAX];
};

static void conn_close(struct conn *c)
{
	close(c->fd);
	free(c->out);
	c->out = NULL;
	c->fd = -1;
	c->state = CONN_FREE;
}

/* How reading c's head ended (rr as answer() takes it): its answer goes out, or it is closed. */
static void conn_answer(struct server *s, struct conn *c, int rr, int64_t now)
{
	if (answer(rr, c->in, c->in_len, s->socket_path, &c->out, &c->out_len) != 0) {
		conn_close(c); /* nothing to answer, or no memory for it */
		return;
	}
	c->out_off = 0;
	c->state = CONN_WRITING;
	c->deadline_ms = now + s->timeout_ms;
}

static void conn_read(struct server *s, struct conn *c, int64_t now)
{
	ssize_t k = read(c->fd, c->in + c->in_len, s->head_max_bytes - c->in_len);
	int r;

	if (k < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (k < 0) {
		conn_close(c);
		return;
	}
	c->in_len += (size_t)k;
	r = head_check(c->in, c->in_len, s->head_max_bytes, k == 0);
	if (r != 0)
		conn_answer(s, c, r == 1 ? 0 : r, now);
}

static void conn_write(struct conn *c, int64_t now)
{
	ssize_t k = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);

	if (k < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (k < 0) {
		conn_close(c);
		return;
	}
	c->out_off += (size_t)k;
	if (c->out_off < c->out_len)
		return;
	(void)shutdown(c->fd, SHUT_WR);
	c->state = CONN_LINGERING;
	c->deadline_ms = now + LINGER_MS;
	c->drained = 0;
}

static void conn_drain(struct conn *c)
{
	char buf[4096];
	ssize_t k = read(c->fd, buf, sizeof(buf));

	if (k < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (k <= 0 || (c->drained += (size_t)k) >= LINGER_MAX_BYTES)
		conn_close(c);
}

static void conn_expire(struct server *s, struct conn *c, int64_t now)
{
	if (c->state == CONN_FREE || now < c->deadline_ms)
		return;
	if (c->state == CONN_READING)
		conn_answer(s, c, -ETIMEDOUT, now);
	else
		conn_close(c); /* a client that stops reading its answer, or the end of the drain */
}

/*
 * A slot for a newcomer: a free one, else the connection to close for it (not closed yet), else NULL (the newcomer
 * waits in the backlog for the next turn). In order, the oldest: still silent SILENT_MS after its accept (idle);
 * lingering (answered); still writing SILENT_MS after its accept (a client that does not read its answer); silent
 * but younger, never one accepted in this turn; writing but younger. A scraper sends its request as it connects
 * and reads its answer at once, so a young connection is one: it must get its read and its write before anyone
 * takes its place. (Closing the oldest silent one first, however young, closed the scraper's when the others
 * were all clients that never read their answers: 28 to 31 of 40 scrapes got through.)
 */
static struct conn *conn_slot(struct server *s, int64_t now)
{
	struct conn *victim = NULL;

	for (size_t i = 0; i < CONNS_MAX; i++)
		if (s->conns[i].state == CONN_FREE)
			return &s->conns[i];
	for (int pass = 0; pass < 5 && !victim; pass++)
		for (size_t i = 0; i < CONNS_MAX; i++) {
			struct conn *c = &s->conns[i];
			bool old = now - c->accepted_ms >= SILENT_MS;
			bool fits = pass == 0   ? c->state == CONN_READING && old
				    : pass == 1 ? c->state == CONN_LINGERING
				    : pass == 2 ? c->state == CONN_WRITING && old
				    : pass == 3 ? c->state == CONN_READING && c->accepted_turn != s->turn
						: c->state == CONN_WRITING;

			if (fits && (!victim || c->accepted_ms < victim->accepted_ms))
				victim = c;
		}
	return victim;
}

static void accept_some(struct server *s, int listen_fd, int64_t now)
{
	for (int i = 0; i < ACCEPTS_PER_TURN; i++) {
		struct conn *c = conn_slot(s, now);
		int fd;

		if (!c)
			return; /* every connection is needed: the newcomers wait in the backlog */
		fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE)
				fprintf(stderr, "pinbroker-metrics-http: accept: %s\n", strerror(errno));
			return;
		}
		if (c->state != CONN_FREE)
			conn_close(c);
		c->fd = fd;
		c->state = CONN_READING;
		c->accepted_ms = now;
		c->accepted_turn = s->turn;
		c->deadline_ms = now + s->timeout_ms;
		c->in_len = 0;
	}
}

/* The next deadline's distance from now, for poll (-1: none). */
static int poll_timeout(const struct server *s, int64_t now)
{
	int64_t next = -1;

	for (size_t i = 0; i < CONNS_MAX; i++)
		if (s->conns[i].state != CONN_FREE && (next < 0 || s->conns[i].deadline_ms < next))
			next = s->conns[i].deadline_ms;
	if (next < 0)
		return -1;
	return next <= now ? 0 : (int)(next - now);
}

/* Serve the nlisten listening sockets from fd 3 on until killed: returns only when it cannot go on (1). */
static int server_run(size_t nlisten, const char *socket_path, int timeout_ms, size_t head_max_bytes)
{
	static struct server s;
	struct pollfd pfd[LISTEN_FDS_MAX + CONNS_MAX];
	size_t idx[LISTEN_FDS_MAX + CONNS_MAX];

	s.nlisten = nlisten;
	s.socket_path = socket_path;
	s.timeout_ms = timeout_ms;
	s.head_max_bytes = head_max_bytes;
	for (size_t i = 0; i < CONNS_MAX; i++) {
		s.conns[i].fd = -1;
		s.conns[i].in = malloc(head_max_bytes);
		if (!s.conns[i].in) {
			fprintf(stderr, "pinbroker-metrics-http: out of memory\n");
			return 1;
		}
	}
	for (size_t l = 0; l < nlisten; l++) {
		int fd = SD_LISTEN_FDS_START + (int)l;

		s.listen_fds[l] = fd;
		if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) {
			fprintf(stderr, "pinbroker-metrics-http: listening socket %d: %s\n", fd, strerror(errno));
			return 1;
		}
	}
	for (;;) {
		size_t n = nlisten;
		int64_t now;
		int r;

		for (size_t l = 0; l < nlisten; l++)
			pfd[l] = (struct pollfd){ .fd = s.listen_fds[l], .events = POLLIN };
		for (size_t i = 0; i < CONNS_MAX; i++) {
			const struct conn *c = &s.conns[i];

			if (c->state == CONN_FREE)
				continue;
			pfd[n] = (struct pollfd){ .fd = c->fd, .events = c->state == CONN_WRITING ? POLLOUT : POLLIN };
			idx[n++] = i;
		}
		r = poll(pfd, n, poll_timeout(&s, mono_ms()));
		if (r < 0 && errno != EINTR) {
			fprintf(stderr, "pinbroker-metrics-http: poll: %s\n", strerror(errno));
			return 1;
		}
		now = mono_ms();
		s.turn++;
		for (size_t j = nlisten; r > 0 && j < n; j++) {
			struct conn *c = &s.conns[idx[j]];

			if (!pfd[j].revents)
				continue;
			if (c->state == CONN_READING)
				conn_read(&s, c, now);
			else if (c->state == CONN_WRITING)
				conn_write(c, now);
			else if (c->state == CONN_LINGERING)
				conn_drain(c);
		}
		for (size_t i = 0; i < CONNS_MAX; i++)
			conn_expire(&s, &s.conns[i], now);
		for (size_t l = 0; r > 0 && l < nlisten; l++)
			if (pfd[l].revents)
				accept_some(&s, s.listen_fds[l], now);
	}
}

/*
 * How many listening sockets systemd passed from fd 3 on (Accept=no: $LISTEN_PID is us, $LISTEN_FDS how many;
 * sd_listen_fds(3)), each a listening stream socket; 0 when there are none (inetd-style), -1 when what was
 * passed is no such thing or too many.
 */
static int listen_fds_passed(void)
{
	const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
	long n;

	if (!pid || !fds || strtol(pid, NULL, 10) != (long)getpid())
		return 0;
	n = strtol(fds, NULL, 10);
	if (n < 1 || n > LISTEN_FDS_MAX)
		return n == 0 ? 0 : -1;
	for (int fd = SD_LISTEN_FDS_START; fd < SD_LISTEN_FDS_START + n; fd++) {
		int listening = 0;
		socklen_t len = sizeof(listening);

		if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) < 0 || !listening)
			return -1;
	}
	return (int)n;
}

static void usage(FILE *f)
{
	fputs("Usage: pinbroker-metrics-http [--socket PATH] [--daemon-marker PATH] [--timeout-ms MS]\n"
	      "                             [--max-head-bytes N]\n"
	      "Serve HTTP on the listening socket systemd passes ($LISTEN_FDS, as pinbroker-metrics.service runs it),\n"
	      "or answer one request on stdin/stdout (inetd-style): GET /metrics gives the daemon's Prometheus\n"
	      "metrics, as `pinctl metrics` prints them.\n"
	      "  --socket PATH     the daemon's socket (default $PINBROKER_SOCKET, else /run/pinbroker/pinbroker.sock)\n"
	      "  --daemon-marker PATH  ask the daemon only while PATH exists (pinbrokerd.service makes it when\n"
	      "                    the daemon is ready and removes it as it stops), else answer 503: a scrape\n"
	      "                    never connects to a stopped daemon's socket, which would start it again\n"
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
					      { "daemon-marker", required_argument, NULL, 'd' },
					      { "help", no_argument, NULL, 'h' },
					      { NULL, 0, NULL, 0 } };
	char *buf, *out = NULL;
	const char *socket_path = NULL;
	long timeout_ms = DEFAULT_TIMEOUT_MS, head_max_bytes = HEAD_MAX_BYTES_DEFAULT;
	struct timeval tv;
	size_t len = 0, out_len = 0;
	char *end;
	int o, r, nlisten;

	while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			socket_path = optarg;
			break;
		case 'd':
			if (!*optarg) {
				fprintf(stderr, "pinbroker-metrics-http: --daemon-marker wants a path\n");
				return 2;
			}
			daemon_marker = optarg;
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
	nlisten = listen_fds_passed();
	if (nlisten < 0) {
		fprintf(stderr,
			"pinbroker-metrics-http: $LISTEN_FDS names no listening stream sockets (1 to %d): check "
			"the socket unit's ListenStream= lines\n",
			LISTEN_FDS_MAX);
		return 1;
	}
	if (nlisten > 0)
		return server_run((size_t)nlisten, socket_path, (int)timeout_ms, (size_t)head_max_bytes);
	tv = (struct timeval){ .tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000 };
	(void)setsockopt(STDOUT_FILENO, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)); /* fails harmlessly on a pipe */

	buf = malloc((size_t)head_max_bytes);
	if (!buf) {
		fprintf(stderr, "pinbroker-metrics-http: out of memory\n");
		return 1;
	}
	r = read_head(STDIN_FILENO, buf, (size_t)head_max_bytes, (int)timeout_ms, &len);
	r = answer(r, buf, len, socket_path, &out, &out_len);
	free(buf);
	if (r == 1)
		return 0; /* connected and closed without a word: nothing to answer */
	if (r == 0) {
		r = write_all(STDOUT_FILENO, out, out_len);
		free(out);
	}
	if (r == 0)
		linger_close(STDIN_FILENO, STDOUT_FILENO);
	return r < 0 ? 1 : 0;
}

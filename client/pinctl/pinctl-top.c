/* SPDX-License-Identifier: MIT */
/* pinctl top (and watch): a live view of the budget, the clients and the largest leases, refreshed in place. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "pinbroker.h"
#include "pinctl-output.h"
#include "pinctl.h"
#include "util.h"

#define TOP_MAX_INTERVAL_S 3600.0
#define TOP_DEFAULT_ROWS 24
#define TOP_DEFAULT_COLS 80
#define TOP_MIN_COLS 20
#define TOP_LINE_BYTES 1024

#define ANSI_RESET "\033[0m"
#define ANSI_BOLD "\033[1m"
#define ANSI_RED "\033[31m"
#define ANSI_GREEN "\033[32m"
#define ANSI_YELLOW "\033[33m"

static volatile sig_atomic_t top_quit, top_resized;

static void top_on_signal(int sig)
{
	if (sig == SIGWINCH)
		top_resized = 1;
	else
		top_quit = 1;
}

struct top_view {
	int rows, cols;   /* what a frame may fill */
	bool interactive; /* refreshing in place: clear to the end of each line */
	bool colour;
	int used; /* lines written in this frame */
};

/* One line of a frame, cut to the width, in colour (NULL for none); nothing once the height is full. */
__attribute__((format(printf, 3, 4))) static void top_line(struct top_view *v, const char *colour, const char *fmt, ...)
{
	char buf[TOP_LINE_BYTES];
	va_list ap;

	if (v->used >= v->rows)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if ((int)strlen(buf) > v->cols)
		buf[v->cols] = '\0';
	if (colour && v->colour)
		printf("%s%s%s", colour, buf, ANSI_RESET);
	else
		fputs(buf, stdout);
	fputs(v->interactive ? "\033[K\n" : "\n", stdout);
	v->used++;
}

static const char *state_colour(const char *state)
{
	if (strcmp(state, "critical") == 0)
		return ANSI_RED ANSI_BOLD;
	if (strcmp(state, "tight") == 0)
		return ANSI_YELLOW ANSI_BOLD;
	return ANSI_GREEN;
}

static int by_client_bytes(const void *a, const void *b)
{
	const struct pb_client_info *x = *(const struct pb_client_info *const *)a;
	const struct pb_client_info *y = *(const struct pb_client_info *const *)b;

	return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : (x->pid > y->pid) - (x->pid < y->pid);
}

static int by_lease_bytes(const void *a, const void *b)
{
	const struct pb_lease_info *x = *(const struct pb_lease_info *const *)a;
	const struct pb_lease_info *y = *(const struct pb_lease_info *const *)b;

	return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : (x->id > y->id) - (x->id < y->id);
}

static void top_frame(struct top_view *v, const struct pb_status *s, double interval_s)
{
	const struct pb_client_info **cl = calloc(s->n_clients ? s->n_clients : 1, sizeof(*cl));
	const struct pb_lease_info **ls = calloc(s->n_leases ? s->n_leases : 1, sizeof(*ls));
	char a[32], b[32], c[32], d[32], e1[ESC_BYTES], e2[ESC_BYTES], user[64], bar[TOP_LINE_BYTES];
	size_t ncl = 0, room, client_rows, lease_rows, fill, width;
	unsigned pct = s->budget_bytes ? (unsigned)((s->leased_bytes * 100.0) / (double)s->budget_bytes) : 0;

	v->used = 0;
	if (!cl || !ls) {
		top_line(v, NULL, "pinctl top: out of memory");
		free(cl);
		free(ls);
		return;
	}
	for (size_t i = 0; i < s->n_clients; i++)
		if (!(s->clients[i].pid == getpid() && s->clients[i].leases == 0)) /* pinctl itself */
			cl[ncl++] = &s->clients[i];
	for (size_t i = 0; i < s->n_leases; i++)
		ls[i] = &s->leases[i];
	qsort(cl, ncl, sizeof(*cl), by_client_bytes);
	qsort(ls, s->n_leases, sizeof(*ls), by_lease_bytes);

	top_line(v, ANSI_BOLD, "pinbrokerd %s, up %s; every %.1f s%s",
		 s->server_version[0] ? esc(s->server_version, e1) : "(unknown version)",
		 duration_str(s->uptime_ms, a, sizeof(a)), interval_s, v->interactive ? "; q quits" : "");
	top_line(v, state_colour(s->pressure_state), "pressure: %s (monitor: %s)", esc(s->pressure_state, e1),
		 esc(s->monitor_mode, e2));
	top_line(v, NULL, "budget %s  leased %s (%u%%)  free %s  overdue %s", size_str(s->budget_bytes, a, sizeof(a)),
		 size_str(s->leased_bytes, b, sizeof(b)), pct,
		 size_str(s->budget_bytes > s->leased_bytes ? s->budget_bytes - s->leased_bytes : 0, c, sizeof(c)),
		 size_str(s->overdue_bytes, d, sizeof(d)));
	top_line(v, NULL, "pool %s (idle %s, prewarm %s)  waiting %" PRIu32, size_str(s->pool_bytes, a, sizeof(a)),
		 size_str(s->pool_idle_bytes, b, sizeof(b)), size_str(s->prewarm_bytes, c, sizeof(c)),
		 s->waiting_acquires);
	/* The leased share of the budget as a bar across the width: [#####.....] */
	width = v->cols > 2 ? (size_t)v->cols - 2 : 0;
	if (width >= sizeof(bar) - 3)
		width = sizeof(bar) - 3;
	fill = width * (pct > 100 ? 100 : pct) / 100;
	bar[0] = '[';
	memset(bar + 1, '#', fill);
	memset(bar + 1 + fill, '.', width - fill);
	bar[1 + width] = ']';
	bar[2 + width] = '\0';
	top_line(v, state_colour(s->pressure_state), "%s", bar);

	/* What is left of the height, shared: clients first, up to half, the leases the rest. */
	room = v->rows > v->used + 5 ? (size_t)(v->rows - v->used - 5) : 0;
	client_rows = ncl < (room + 1) / 2 ? ncl : (room + 1) / 2;
	lease_rows = room - client_rows;
	if (lease_rows > s->n_leases) {
		lease_rows = s->n_leases;
		client_rows = ncl < room - lease_rows ? ncl : room - lease_rows;
	}

	top_line(v, NULL, "%s", "");
	top_line(v, ANSI_BOLD, "clients by bytes (%zu of %zu)", client_rows, ncl);
	top_line(v, ANSI_BOLD, "%-8s %-10s %-6s %-10s %-16s %s", "PID", "USER", "LEASES", "BYTES", "NAME", "LABELS");
	for (size_t i = 0; i < client_rows; i++)
		top_line(v, NULL, "%-8" PRId32 " %-10s %-6" PRIu32 " %-10s %-16s %s", cl[i]->pid,
			 user_name(cl[i]->uid, user, sizeof(user)), cl[i]->leases, size_str(cl[i]->bytes, a, sizeof(a)),
			 cl[i]->name[0] ? esc(cl[i]->name, e1) : "-", cl[i]->labels[0] ? esc(cl[i]->labels, e2) : "-");
	top_line(v, ANSI_BOLD, "leases by bytes (%zu of %zu)", lease_rows, s->n_leases);
	top_line(v, ANSI_BOLD, "%-8s %-8s %-10s %-10s %-11s %-9s %s", "ID", "PID", "USER", "BYTES", "PRIORITY", "STATE",
		 "LABEL");
	for (size_t i = 0; i < lease_rows; i++)
		top_line(v, NULL, "%-8" PRIu64 " %-8" PRId32 " %-10s %-10s %-11s %-9s %s", ls[i]->id, ls[i]->pid,
			 user_name(ls[i]->uid, user, sizeof(user)), size_str(ls[i]->bytes, a, sizeof(a)),
			 priority_name(ls[i]->priority), esc(ls[i]->state, e1), esc(ls[i]->label, e2));
	free(cl);
	free(ls);
}

/* The frame's size: the terminal's (TIOCGWINSZ) when stdout is one, else $LINES and $COLUMNS, else 24x80. */
static void top_size(struct top_view *v, bool tty)
{
	struct winsize ws;
	const char *e;

	v->rows = TOP_DEFAULT_ROWS;
	v->cols = TOP_DEFAULT_COLS;
	if (tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row && ws.ws_col) {
		v->rows = ws.ws_row;
		v->cols = ws.ws_col;
		return;
	}
	if ((e = getenv("LINES")) && atoi(e) > 0)
		v->rows = atoi(e);
	if ((e = getenv("COLUMNS")) && atoi(e) > 0)
		v->cols = atoi(e);
	if (v->cols < TOP_MIN_COLS)
		v->cols = TOP_MIN_COLS;
	if (v->cols >= TOP_LINE_BYTES)
		v->cols = TOP_LINE_BYTES - 1;
}

int cmd_top(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "interval", required_argument, NULL, 'i' },
		{ "once", no_argument, NULL, '1' },
		PINCTL_COMMON_OPTIONS,
		{ NULL, 0, NULL, 0 },
	};
	const char *nc = getenv("NO_COLOR");
	bool once = false, tty = isatty(STDOUT_FILENO), raw = false;
	struct top_view v = { 0 };
	struct termios saved, t;
	struct sigaction sa = { 0 };
	double interval_s = 1.0;
	int o, r, ret = EXIT_SUCCESS;
	pb_client *c;

	while ((o = getopt_long(argc, argv, ":n:", opts, NULL)) != -1) {
		char *end;

		switch (o) {
		case 'i':
		case 'n':
			errno = 0;
			interval_s = strtod(optarg, &end);
			if (errno || *end || end == optarg || !(interval_s >= 0.1 && interval_s <= TOP_MAX_INTERVAL_S))
				return usage_error("--interval: not a number of seconds from 0.1 to 3600: %s", optarg);
			break;
		case '1':
			once = true;
			break;
		default:
			if ((r = command_option(argv[0], o, argv)) != PINCTL_OPT_NEXT)
				return r;
			break;
		}
	}
	if (optind != argc)
		return usage_error("takes no arguments (got '%s')", argv[optind]);
	/* https://no-color.org: NO_COLOR present and not empty turns colour off. */
	v.colour = tty && !(nc && *nc);
	v.interactive = tty && !once;
	top_size(&v, tty);

	r = connect_or_explain(&c);
	if (r)
		return r;
	if (v.interactive) {
		sa.sa_handler = top_on_signal; /* no SA_RESTART: poll() returns on each */
		sigemptyset(&sa.sa_mask);
		sigaction(SIGINT, &sa, NULL);
		sigaction(SIGTERM, &sa, NULL);
		sigaction(SIGHUP, &sa, NULL);
		sigaction(SIGWINCH, &sa, NULL);
		/* Keys one at a time without echo, so q quits at once; ISIG stays, so Ctrl-C is SIGINT. */
		if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved) == 0) {
			t = saved;
			t.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
			t.c_cc[VMIN] = 0;
			t.c_cc[VTIME] = 0;
			raw = tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0;
		}
		fputs("\033[?1049h\033[?25l", stdout); /* the alternate screen, no cursor */
	}
	while (!top_quit) {
		struct pb_status *s;
		struct pollfd pfd = { .fd = STDIN_FILENO, .events = POLLIN };
		uint64_t until;

		r = pb_status_query(c, PB_STATUS_LEASES, &s);
		if (r < 0) {
			if (v.interactive)
				fputs("\033[?25h\033[?1049l", stdout);
			v.interactive = false;
			ret = report_failure(argv[0], r);
			break;
		}
		if (v.interactive)
			fputs("\033[H", stdout);
		top_frame(&v, s, interval_s);
		pb_status_free(s);
		if (v.interactive)
			fputs("\033[J", stdout);
		fflush(stdout);
		if (!v.interactive)
			break;
		until = now_us() + (uint64_t)(interval_s * 1e6);
		while (!top_quit && !top_resized) {
			uint64_t now = now_us();
			char key;

			if (now >= until)
				break;
			if (poll(&pfd, raw ? 1 : 0, (int)((until - now + 999) / 1000)) > 0 && (pfd.revents & POLLIN)) {
				if (read(STDIN_FILENO, &key, 1) == 1 && (key == 'q' || key == 'Q'))
					top_quit = 1;
				else if (pfd.revents & (POLLHUP | POLLERR))
					top_quit = 1;
			}
		}
		if (top_resized) {
			top_resized = 0;
			top_size(&v, tty);
		}
	}
	if (v.interactive)
		fputs("\033[?25h\033[?1049l", stdout);
	fflush(stdout);
	if (raw)
		tcsetattr(STDIN_FILENO, TCSANOW, &saved);
	pb_disconnect(c);
	return ret;
}

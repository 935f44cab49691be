/* SPDX-License-Identifier: MIT */
/*
 * What every pinctl command shares: usage and option errors, --help, the socket it talks to, connecting
 * to the daemon or saying why not, and a failed request's report.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "pinbroker.h"
#include "pinctl-help.h"
#include "pinctl-output.h"
#include "pinctl.h"
#include "wire.h"

#define ADMIN_HINT                                                                                     \
	"Run pinctl as root, or ask the host's admin to add you to the group named by admin-group in " \
	"/etc/pinbroker/pinbrokerd.conf (then log in again)."

static const char *socket_path; /* as given; NULL means libpinbroker's default */
static uint64_t wait_ms;        /* --wait: how long to wait for a daemon to appear; 0 none */
static const char *command;     /* the command being run, NULL before main found it */

void pinctl_command_set(const char *name)
{
	command = name;
}

/* Inside a command the error points to that command's help, which has the options it lacked. */
int usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "pinctl%s%s: ", command ? " " : "", command ? command : "");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (command)
		fprintf(stderr, "; see 'pinctl %s --help'\n", command);
	else
		fprintf(stderr, "; see 'pinctl --help' for usage\n");
	return EXIT_USAGE;
}

/*
 * getopt's '?' or ':' (opterr is 0, so getopt printed nothing): one message
 * naming the option. optopt is the short option, or 0 for a long one, which is
 * then argv[optind - 1].
 */
int option_error(const char *cmd, int o, char **argv)
{
	char shortopt[3] = { '-', (char)optopt, '\0' };
	/* A long option missing its value leaves its val in optopt, so ':' always reads argv. */
	const char *name = optopt && o != ':' ? shortopt : argv[optind - 1];

	if (cmd)
		pinctl_command_set(cmd);
	if (o == ':')
		return usage_error("%s needs a value", name);
	return usage_error("unknown option %s", name);
}

/* name's --help, or a usage error for a command pinctl does not have. */
int command_help(const char *name, FILE *f)
{
	if (pinctl_help_text(name, f) < 0) {
		pinctl_command_set(NULL); /* the pointer goes to the list of commands */
		return usage_error("help: unknown command: %s", name);
	}
	return EXIT_SUCCESS;
}

int command_option(const char *cmd, int o, char **argv)
{
	switch (o) {
	case 'S':
		if (!*optarg)
			return usage_error("--socket: empty path; give the daemon's socket, or leave --socket out for "
					   "the default");
		socket_path = optarg;
		return PINCTL_OPT_NEXT;
	case 'H':
		return command_help(cmd, stdout);
	default:
		return option_error(cmd, o, argv);
	}
}

static const char *effective_socket(void)
{
	const char *p = socket_path;

	if (!p || !*p)
		p = getenv(PB_SOCKET_ENV);
	return p && *p ? p : PB_DEFAULT_SOCKET;
}

const char *pinctl_socket(void)
{
	return effective_socket();
}

const char *pinctl_socket_option(void)
{
	return socket_path;
}

void pinctl_socket_set(const char *path)
{
	socket_path = path;
}

void pinctl_wait_set(uint64_t ms)
{
	wait_ms = ms;
}

static const char *group_name(gid_t gid, char *buf, size_t len)
{
	struct group *g = getgrgid(gid);

	if (g)
		snprintf(buf, len, "%s", g->gr_name);
	else
		snprintf(buf, len, "%u", (unsigned)gid);
	return buf;
}

/*
 * connect() needs search (x) on every folder above the socket and write on the
 * socket itself. Walk the chain from the root and name the first path that
 * denies, so the hint points at the real cause.
 */
static void explain_eacces(const char *path)
{
	char buf[PATH_MAX], grp[64];
	const char *deny = NULL;
	struct stat st;
	size_t len = strlen(path);

	if (len >= sizeof(buf)) {
		fprintf(stderr, "pinctl: cannot connect to %s: %s\n", path, strerror(EACCES));
		return;
	}
	memcpy(buf, path, len + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (access(buf, X_OK) < 0 && errno == EACCES) {
			deny = buf;
			break;
		}
		*p = '/';
	}
	if (deny && stat(deny, &st) == 0) {
		fprintf(stderr,
			"pinctl: cannot connect to %s: %s: the folder %s (mode %04o, group %s) does not let you in; "
			"run as root, or ask the admin to open that folder to your group\n",
			path, strerror(EACCES), deny, (unsigned)(st.st_mode & 07777),
			group_name(st.st_gid, grp, sizeof(grp)));
	} else if (!deny && stat(path, &st) == 0) {
		fprintf(stderr,
			"pinctl: cannot connect to %s: %s: the socket (mode %04o, group %s) does not let you write; "
			"run as root, or add yourself to group %s (then log in again)\n",
			path, strerror(EACCES), (unsigned)(st.st_mode & 07777), group_name(st.st_gid, grp, sizeof(grp)),
			grp);
	} else {
		fprintf(stderr,
			"pinctl: cannot connect to %s: %s; check the permissions of the socket and its folders\n", path,
			strerror(EACCES));
	}
}

/*
 * How to start the daemon where the socket is path, both ways: under systemd (its socket unit, which listens
 * on the default path) and by hand (the daemon in the background on path). The one the path suggests comes
 * first: the default path is the unit's, another one most likely a daemon started by hand. sudo only where
 * pinctl does not already run as root. A daemon started by hand a moment ago may not have made its socket
 * yet (tens of ms): --wait waits for it.
 */
static void explain_no_daemon(const char *path, int r)
{
	bool dflt = strcmp(path, PB_DEFAULT_SOCKET) == 0;
	const char *sudo = geteuid() == 0 ? "" : "sudo ";

	fprintf(stderr, "pinctl: no pinbrokerd answers on %s: %s%s", path, strerror(-r),
		r == -ETIMEDOUT || r == -ECONNRESET ? " (something listens there but did not answer HELLO)" : "");
	if (wait_ms > 0)
		fprintf(stderr, " (waited %" PRIu64 " s for it)", wait_ms / 1000);
	fputc('\n', stderr);
	if (wait_ms == 0 && (r == -ENOENT || r == -ECONNREFUSED))
		fprintf(stderr, "Just started it? pinctl --wait %s waits up to %d s for its socket.\n",
			command ? command : "status", PINCTL_WAIT_DEFAULT_S);
	if (!dflt)
		fprintf(stderr,
			"Start it by hand: pinbrokerd --socket %s &  (as root, or as yourself with --lock-memory no; "
			"it logs to stderr)\n",
			path);
	fprintf(stderr,
		"%s systemd: %ssystemctl start pinbrokerd.socket%s  (journalctl -u pinbrokerd says why one stopped)\n",
		dflt ? "Start it under" : "or under", sudo, dflt ? "" : " (it listens on " PB_DEFAULT_SOCKET ")");
	if (dflt)
		fprintf(stderr,
			"or by hand: %spinbrokerd --socket %s &  (it logs to stderr; another folder needs no root: "
			"see pinbrokerd --help)\n",
			sudo, path);
}

/* Whether r says no daemon is there yet (no socket file, or nobody listening on it): what --wait waits out. */
static bool not_there_yet(int r)
{
	return r == -ENOENT || r == -ECONNREFUSED;
}

int pinctl_connect_waiting(const char *path, pb_client **ret)
{
	const struct timespec step = { .tv_nsec = 50 * 1000 * 1000 };
	struct timespec t0, t;
	int r;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		r = pb_connect(path, ret);
		if (r == 0 || !not_there_yet(r) || wait_ms == 0)
			return r;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((int64_t)(t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= (int64_t)wait_ms)
			return r;
		nanosleep(&step, NULL);
	}
}

int connect_or_explain(pb_client **ret)
{
	const char *path = effective_socket();
	int r;

	r = pinctl_connect_waiting(path, ret);
	if (r == 0)
		return 0;
	switch (r) {
	case -ENOENT:
	case -ECONNREFUSED:
	case -ETIMEDOUT:
	case -ECONNRESET:
		/* Nothing listens, or what listens never answered HELLO: no daemon, as systemctl's 3 for a stopped unit. */
		explain_no_daemon(path, r);
		return EXIT_NO_DAEMON;
	case -EACCES:
		explain_eacces(path);
		break;
	case -EPROTONOSUPPORT:
		fprintf(stderr, "pinctl: %s\nUse the pinctl that came with this pinbrokerd.\n", pb_last_error());
		break;
	default:
		fprintf(stderr, "pinctl: cannot connect to %s: %s\n", path, pb_last_error());
		break;
	}
	return EXIT_FAILURE;
}

/* A failed request: the daemon's words, plus what to do where there is something to do. */
int report_failure(const char *what, int r)
{
	char e[ESC_BYTES];

	fprintf(stderr, "pinctl: %s: %s\n", what, esc(pb_last_error(), e));
	if (r == -EACCES)
		fprintf(stderr, ADMIN_HINT "\n");
	else if (r == -ECONNRESET)
		fprintf(stderr, "pinbrokerd went away; check: journalctl -u pinbrokerd\n");
	return EXIT_FAILURE;
}

int parse_u64(const char *s, uint64_t max, uint64_t *ret)
{
	unsigned long long v;
	char *end;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v > max)
		return -EINVAL;
	*ret = v;
	return 0;
}

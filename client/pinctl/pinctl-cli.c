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
#include "pinctl-fields.h"
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
static bool json_errors;        /* --json: errors as JSON on stdout too */
static bool json_error_done;    /* and one was written */

void pinctl_json_errors_set(bool on)
{
	json_errors = on;
}

bool pinctl_json_error_written(void)
{
	return json_error_done;
}

/* The error object on stdout, once: the first error is the one a script acts on. */
static void json_error(int exit_status, const char *code, const char *message)
{
	if (!json_errors || json_error_done)
		return;
	json_error_done = true;
	fputs("{\"error\":{", stdout);
	json_kstr(stdout, "code", code, true);
	json_kstr(stdout, "message", message, true);
	json_u64(stdout, "exit_status", (uint64_t)exit_status, false);
	fputs("}}\n", stdout);
	fflush(stdout);
}

int pinctl_error(int exit_status, const char *code, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "pinctl%s%s: %s\n", command ? " " : "", command ? command : "", msg);
	json_error(exit_status, code, msg);
	return exit_status;
}

void pinctl_command_set(const char *name)
{
	command = name;
}

/* Inside a command the error points to that command's help, which has the options it lacked. */
int usage_error(const char *fmt, ...)
{
	char msg[1024], hint[96];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (command)
		snprintf(hint, sizeof(hint), "see 'pinctl %s --help'", command);
	else
		snprintf(hint, sizeof(hint), "see 'pinctl --help' for usage");
	fprintf(stderr, "pinctl%s%s: %s; %s\n", command ? " " : "", command ? command : "", msg, hint);
	if (json_errors) {
		char both[1200];

		snprintf(both, sizeof(both), "%s; %s", msg, hint);
		json_error(EXIT_USAGE, "usage", both);
	}
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

/* connect_or_explain's failure as JSON: "WHAT PATH: WHY". */
static void connect_json_error(int exit_status, const char *code, const char *what, const char *path, const char *why)
{
	char msg[PATH_MAX + 512];

	snprintf(msg, sizeof(msg), "%s %s: %s", what, path, why);
	json_error(exit_status, code, msg);
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
		connect_json_error(EXIT_NO_DAEMON, "no_daemon", "no pinbrokerd answers on", path, strerror(-r));
		return EXIT_NO_DAEMON;
	case -EACCES:
		explain_eacces(path);
		connect_json_error(EXIT_FAILURE, "permission_denied", "cannot connect to", path, strerror(-r));
		break;
	case -EPROTONOSUPPORT:
		fprintf(stderr, "pinctl: %s\nUse the pinctl that came with this pinbrokerd.\n", pb_last_error());
		connect_json_error(EXIT_FAILURE, "connect_failed", "cannot talk to the daemon on", path,
				   pb_last_error());
		break;
	default:
		fprintf(stderr, "pinctl: cannot connect to %s: %s\n", path, pb_last_error());
		connect_json_error(EXIT_FAILURE, "connect_failed", "cannot connect to", path, pb_last_error());
		break;
	}
	return EXIT_FAILURE;
}

/* A failed request: the daemon's words, plus what to do where there is something to do. */
int report_failure(const char *what, int r)
{
	char e[ESC_BYTES];

	fprintf(stderr, "pinctl: %s: %s\n", what, esc(pb_last_error(), e));
	if (json_errors) {
		char msg[ESC_BYTES + 64];

		snprintf(msg, sizeof(msg), "%s: %s", what, pb_last_error());
		json_error(EXIT_FAILURE,
			   r == -EACCES || r == -EPERM ? "permission_denied"
			   : r == -ENOENT              ? "not_found"
			   : r == -EINVAL              ? "invalid_argument"
			   : r == -ECONNRESET          ? "daemon_gone"
						       : "failed",
			   msg);
	}
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

int list_option(int o, struct list_opts *lo)
{
	switch (o) {
	case 'j':
		lo->json = true;
		return 0;
	case 'f':
		lo->json = strcmp(optarg, "json") == 0;
		lo->csv = strcmp(optarg, "csv") == 0;
		if (!lo->json && !lo->csv && strcmp(optarg, "text") != 0)
			return usage_error("--format: expected text, csv or json, not %s", optarg);
		return 0;
	case 'o':
		lo->fields = optarg;
		return 0;
	case 'N':
		lo->no_headers = true;
		return 0;
	default:
		return 1;
	}
}

int list_opts_check(const struct list_opts *lo)
{
	/* JSON has every key, named; fields and headers are the other forms' choices. */
	if (lo->json && (lo->fields || lo->no_headers))
		return usage_error("%s is for the text and csv forms, not JSON", lo->fields ? "-o" : "--no-headers");
	return 0;
}

int parse_list_opts(int argc, char **argv, struct list_opts *lo, int nargs_max)
{
	static const struct option opts[] = { PINCTL_LIST_OPTIONS, PINCTL_COMMON_OPTIONS, { NULL, 0, NULL, 0 } };
	int o, r;

	memset(lo, 0, sizeof(*lo));
	while ((o = getopt_long(argc, argv, PINCTL_LIST_SHORTOPTS, opts, NULL)) != -1) {
		r = list_option(o, lo);
		if (r == 1 && (r = command_option(argv[0], o, argv)) != PINCTL_OPT_NEXT)
			return r;
		if (r != 0 && r != PINCTL_OPT_NEXT)
			return r;
	}
	if (nargs_max == 0 && optind != argc)
		return usage_error("takes no arguments (got '%s')", argv[optind]);
	if (argc - optind > nargs_max)
		return usage_error("give at most %d argument%s, not %d", nargs_max, nargs_max == 1 ? "" : "s",
				   argc - optind);
	return list_opts_check(lo) ? EXIT_USAGE : PINCTL_OPT_NEXT;
}

int select_fields(const struct pinctl_field *table, size_t n, const char *list, struct fields *sel)
{
	char bad[64], names[1024];

	if (fields_parse(table, n, list, sel, bad, sizeof(bad)) == 0)
		return 0;
	return usage_error("-o: unknown field '%s'; the fields: %s", bad, fields_names(table, n, names, sizeof(names)));
}

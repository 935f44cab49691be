/* SPDX-License-Identifier: MIT */
/* pinctl: inspect and administer pinbrokerd (status, leases, acquire, revoke, set) through libpinbroker, and run programs under the interposer. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <grp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "pinbroker.h"
#include "pinctl.h"
#include "preload-table.h"
#include "text.h"
#include "util.h"
#include "wire.h"

#define JSON_SCHEMA_VERSION 1
/* Room for any peer string C-escaped: every byte may become \xNN (labels: 4 of 63 bytes, comma-joined). */
/* The daemon lends less than 2^63 bytes (daemon/reply.c, STATUS_INVALID_SIZE). */
#define MAX_LEASE_BYTES (UINT64_C(1) << 63)
#define ADMIN_HINT                                                                                                  \
	"Run pinctl as root, or ask the host's admin to add you to the group named by admin-group in "             \
	"/etc/pinbroker/pinbrokerd.conf (then log in again)."

static const char *socket_path; /* as given; NULL means libpinbroker's default */

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: pinctl [--socket PATH] COMMAND [ARGS]\n"
		"\n"
		"Commands:\n"
		"  status [--json]                   budget, pool, pressure signals and clients\n"
		"  leases [--json]                   every lease on the host (fetched page by page)\n"
		"  acquire SIZE [--hold SECONDS] [--label L] [--priority normal|critical|best-effort]\n"
		"          [--wait MS]               borrow SIZE (e.g. 64M, 1G), touch it, hold, release\n"
		"  revoke LEASE | --uid USER | --all [--deadline MS]\n"
		"                                    ask clients to give leases back (admin)\n"
		"  top [--interval SECONDS] [--once] a live view of the budget, clients and leases (also: watch)\n"
		"  get KEY [--json]                  one running setting and where it came from\n"
		"  config [--json]                   every running setting, each with its source (default,\n"
		"                                    file:line, environment, command line, set)\n"
		"  set KEY VALUE                     change a reloadable daemon setting (admin)\n"
		"  metrics                           the daemon's Prometheus metrics (text format)\n"
		"  run [--fallback cuda|error|pageable] [--label L] [--no-torch] [--] CMD [ARGS]\n"
		"                                    run an unmodified program with its pinned memory\n"
		"                                    under the budget (LD_PRELOAD=libpinbroker-preload.so)\n"
		"  doctor [--json]                   check this host's set-up, each finding with its fix\n"
		"                                    (exit 0 ok, 1 a warning, 3 a failure)\n"
		"  quota set CGROUP SIZE | clear CGROUP [--revoke] | list [--json]\n"
		"                                    per-job quotas over cgroup paths (admin to change)\n"
		"  jobs [--json]                     pinned bytes per job (cgroup), with quotas\n"
		"  help [COMMAND]                    this text, or COMMAND's (also: pinctl COMMAND --help)\n"
		"\n"
		"Options:\n"
		"  --socket PATH   daemon socket (default $%s, else %s); also after the command\n"
		"  --version       print the version\n"
		"\n"
		"Exit status: 0 success, 1 error, 2 usage; run exits with its program's status\n"
		"(126/127 when it cannot be run).\n",
		PB_SOCKET_ENV, PB_DEFAULT_SOCKET);
}

int usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "pinctl: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
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

	if (o == ':')
		return usage_error("%s%s%s needs a value", cmd ? cmd : "", cmd ? ": " : "", name);
	return usage_error("%s%sunknown option %s", cmd ? cmd : "", cmd ? ": " : "", name);
}

/* One command's --help (pinctl CMD --help, pinctl help CMD): its usage, what it does, its options. */
static const struct command_help {
	const char *name;
	const char *text;
} helps[] = {
	{ "status", "Usage: pinctl status [--json]\n"
		    "\n"
		    "The budget, leased, pool and free memory, the page kind, the pressure state and its signals,\n"
		    "recent transitions and revocations, and one row per client connection.\n"
		    "\n"
		    "  --json          the stable JSON schema (schema_version 1), every lease row included,\n"
		    "                  each client's cgroup and the jobs (jobs[])\n" },
	{ "leases", "Usage: pinctl leases [--json]\n"
		    "\n"
		    "Every lease on the host you may see (all of them as an admin), fetched page by page: its NUMA\n"
		    "node (NODE, '!' when misplaced, '-' when not placed) and the job it is charged to (JOB).\n"
		    "\n"
		    "  --json          {schema_version, leases[]}\n" },
	{ "acquire", "Usage: pinctl acquire SIZE [--hold SECONDS] [--label L] [--priority P] [--wait MS]\n"
		     "\n"
		     "Borrow SIZE (4096, 64M, 1G) from the daemon, map it, touch every page, report the timings,\n"
		     "hold it, then release it. A revoke, SIGINT or SIGTERM releases it early.\n"
		     "\n"
		     "  --hold SECONDS  keep the lease this long (fractions allowed; default 0)\n"
		     "  --label L       the label status and leases show\n"
		     "  --priority P    normal, critical (revoked last) or best-effort (revoked first)\n"
		     "  --wait MS       wait up to MS for memory instead of being refused at once\n" },
	{ "revoke", "Usage: pinctl revoke LEASE | --uid USER | --all [--deadline MS]\n"
		    "\n"
		    "Ask the holders to give leases back (admin): one lease by id, every lease of a uid, or all.\n"
		    "\n"
		    "  --uid USER      every lease of USER, a user name or a uid\n"
		    "  --all           every lease on the host\n"
		    "  --deadline MS   time the holders have before revoke-enforce applies (default: the daemon's\n"
		    "                  revoke-deadline-ms)\n" },
	{ "top", "Usage: pinctl top [--interval SECONDS] [--once]   (also: pinctl watch)\n"
		 "\n"
		 "A live view, refreshed in place: the budget, leased, pool and pressure, then the clients and the\n"
		 "leases holding the most bytes, as many as the terminal has room for. q or Ctrl-C quits.\n"
		 "Colour only on a terminal, and not with NO_COLOR set (https://no-color.org). When stdout is not\n"
		 "a terminal it prints one frame ($LINES x $COLUMNS, else 24x80) and exits.\n"
		 "\n"
		 "  --interval S    seconds between refreshes, 0.1 to 3600 (default 1; also -n S)\n"
		 "  --once          print one frame and exit\n" },
	{ "watch", "Usage: pinctl watch [--interval SECONDS] [--once]\n"
		   "\n"
		   "Another name for pinctl top.\n" },
	{ "get", "Usage: pinctl get KEY [--json]\n"
		 "\n"
		 "The running value of one daemon setting, as the config file spells it (8G, 25%, 30000), and\n"
		 "where it came from: default, file PATH:LINE, environment, command line, or set (pinctl set).\n"
		 "Any user may read the config. An unknown key is an error naming the closest key.\n"
		 "\n"
		 "  --json          {schema_version, config: {key, value, source, file, line, reloadable}}\n" },
	{ "config", "Usage: pinctl config [--json]\n"
		    "\n"
		    "Every running daemon setting as 'key = value  # source' lines (config-file syntax), the source\n"
		    "being default, file PATH:LINE, environment, command line, or set (pinctl set). A SIGHUP reload\n"
		    "re-reads the file but keeps the set values until the daemon restarts.\n"
		    "\n"
		    "  --json          {schema_version, config: [{key, value, source, file, line, reloadable}]}\n" },
	{ "set", "Usage: pinctl set KEY VALUE\n"
		 "\n"
		 "Change a reloadable daemon setting at run time (admin), e.g. pinctl set budget 8G. The value\n"
		 "wins over the file and the command line, also on reload, until the daemon restarts;\n"
		 "pinctl get KEY then shows its source as set. The keys: pinctl config, pinbrokerd --config-doc.\n" },
	{ "run", "Usage: pinctl run [--fallback cuda|error|pageable] [--label L] [--no-torch] [--] CMD [ARGS]\n"
		 "\n"
		 "Run an unmodified program with its pinned memory (cudaHostAlloc, cudaMallocHost,\n"
		 "cudaHostRegister and the driver API's) taken from the budget: LD_PRELOAD=libpinbroker-preload.so.\n"
		 "Options end at CMD; its own options are its own.\n"
		 "\n"
		 "  --fallback P    when the daemon refuses: cuda (the driver's own pinned memory, the default),\n"
		 "                  error (the call fails) or pageable (ordinary memory)\n"
		 "  --label L       the label its leases carry\n"
		 "  --no-torch      do not install pinbroker's torch host allocator in Python programs\n"
		 "\n"
		 "Exit status: the program's, or 126/127 when it cannot be run.\n" },
	{ "metrics", "Usage: pinctl metrics\n"
		     "\n"
		     "The daemon's Prometheus metrics in the text format: what metrics-path holds. Per-uid rows\n"
		     "only for admins, or with status-visibility = all.\n" },
	{ "doctor", doctor_help },
	{ "quota", quota_help },
	{ "jobs", jobs_help },
	{ "help", "Usage: pinctl help [COMMAND]\n"
		  "\n"
		  "pinctl's usage, or one command's help (as pinctl COMMAND --help).\n" },
};

static int command_help(const char *name, FILE *f)
{
	for (size_t i = 0; i < sizeof(helps) / sizeof(helps[0]); i++) {
		if (strcmp(helps[i].name, name) != 0)
			continue;
		fputs(helps[i].text, f);
		fprintf(f, "\n"
			   "Options every command takes (before or after its name):\n"
			   "  --socket PATH   daemon socket (default $%s, else %s)\n"
			   "  --help          this text\n",
			PB_SOCKET_ENV, PB_DEFAULT_SOCKET);
		return EXIT_SUCCESS;
	}
	return usage_error("help: unknown command: %s", name);
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

static const char *group_name(gid_t gid, char *buf, size_t len)
{
	struct group *g = getgrgid(gid);

	if (g)
		snprintf(buf, len, "%s", g->gr_name);
	else
		snprintf(buf, len, "%u", (unsigned)gid);
	return buf;
}

/* uid's user name, or the number when the passwd database has none. */
static const char *user_name(uint32_t uid, char *buf, size_t len)
{
	struct passwd *pw = getpwuid((uid_t)uid);

	if (pw && pw->pw_name && *pw->pw_name)
		snprintf(buf, len, "%s", pw->pw_name);
	else
		snprintf(buf, len, "%" PRIu32, uid);
	return buf;
}

/* A user as a name (getpwnam) or a number. Returns 0, or -EINVAL for neither, -ENOENT for an unknown name. */
static int parse_user(const char *s, uint32_t *ret)
{
	struct passwd *pw;
	unsigned long v;
	char *end;

	if (!s || !*s)
		return -EINVAL;
	if (*s >= '0' && *s <= '9') {
		errno = 0;
		v = strtoul(s, &end, 10);
		if (errno || *end || v >= UINT32_MAX) /* (uid_t)-1 is "no uid" to the kernel */
			return -EINVAL;
		*ret = (uint32_t)v;
		return 0;
	}
	pw = getpwnam(s);
	if (!pw)
		return -ENOENT;
	*ret = (uint32_t)pw->pw_uid;
	return 0;
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
			path, strerror(EACCES), deny, (unsigned)(st.st_mode & 07777), group_name(st.st_gid, grp, sizeof(grp)));
	} else if (!deny && stat(path, &st) == 0) {
		fprintf(stderr,
			"pinctl: cannot connect to %s: %s: the socket (mode %04o, group %s) does not let you write; "
			"run as root, or add yourself to group %s (then log in again)\n",
			path, strerror(EACCES), (unsigned)(st.st_mode & 07777), group_name(st.st_gid, grp, sizeof(grp)), grp);
	} else {
		fprintf(stderr, "pinctl: cannot connect to %s: %s; check the permissions of the socket and its folders\n",
			path, strerror(EACCES));
	}
}

pb_client *connect_or_explain(void)
{
	const char *path = effective_socket();
	pb_client *c;
	int r;

	r = pb_connect(path, &c);
	if (r == 0)
		return c;
	switch (r) {
	case -ENOENT:
	case -ECONNREFUSED:
		fprintf(stderr,
			"pinctl: cannot connect to %s: %s\n"
			"Is pinbrokerd running? Try: systemctl start pinbrokerd.socket\n",
			path, strerror(-r));
		break;
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
	return NULL;
}

/*
 * Text that came from the daemon or its other clients (labels, names, event
 * texts), made safe for a terminal: C-escaped, so a newline can't forge a row
 * and an escape sequence can't drive the terminal. buf holds ESC_BYTES.
 */
const char *esc(const char *s, char *buf)
{
	return text_escape(buf, ESC_BYTES, s ? s : "");
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

/* ---------------------------------------------------------------- formatting */

/* The pool's page kind for people. */
static const char *page_kind_text(const char *kind)
{
	if (strcmp(kind, "hugetlb") == 0)
		return "hugetlb 2 MiB pages";
	if (strcmp(kind, "thp") == 0)
		return "4 KiB shmem collapsed into transparent huge pages";
	if (strcmp(kind, "4k") == 0)
		return "4 KiB pages";
	return "pages of an unknown kind (an older daemon)";
}

static const char *size_str(uint64_t bytes, char *buf, size_t len)
{
	return format_size(bytes, buf, len);
}

static const char *duration_str(uint64_t ms, char *buf, size_t len)
{
	uint64_t s = ms / 1000;

	if (ms < 1000)
		snprintf(buf, len, "%" PRIu64 " ms", ms);
	else if (s < 60)
		snprintf(buf, len, "%.1f s", (double)ms / 1000.0);
	else if (s < 3600)
		snprintf(buf, len, "%" PRIu64 "m %02" PRIu64 "s", s / 60, s % 60);
	else if (s < 86400)
		snprintf(buf, len, "%" PRIu64 "h %02" PRIu64 "m", s / 3600, (s / 60) % 60);
	else
		snprintf(buf, len, "%" PRIu64 "d %02" PRIu64 "h", s / 86400, (s / 3600) % 24);
	return buf;
}

static const char *priority_name(enum pb_priority p)
{
	switch (p) {
	case PB_PRIORITY_CRITICAL:
		return "critical";
	case PB_PRIORITY_BEST_EFFORT:
		return "best-effort";
	case PB_PRIORITY_NORMAL:
	default:
		return "normal";
	}
}

static int parse_priority(const char *s, enum pb_priority *ret)
{
	if (strcmp(s, "normal") == 0)
		*ret = PB_PRIORITY_NORMAL;
	else if (strcmp(s, "critical") == 0)
		*ret = PB_PRIORITY_CRITICAL;
	else if (strcmp(s, "best-effort") == 0 || strcmp(s, "best_effort") == 0)
		*ret = PB_PRIORITY_BEST_EFFORT;
	else
		return -EINVAL;
	return 0;
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

/* A signal's figure in its unit: bytes human-readable, whole numbers as integers, the rest to 4 digits. */
static const char *figure_str(double v, const char *unit, char *buf, size_t len)
{
	if (isnan(v))
		return "-";
	if (strcmp(unit, "bytes") == 0 && v >= 0 && v < 1.8e19)
		return format_size((uint64_t)v, buf, len);
	if (isfinite(v) && v == floor(v) && fabs(v) < 1e15)
		snprintf(buf, len, "%.0f", v);
	else
		snprintf(buf, len, "%.4g", v);
	return buf;
}

/* ---------------------------------------------------------------- JSON, written by hand */

/*
 * A JSON string (RFC 8259): quote, backslash and every unprintable character
 * escaped (controls, DEL, C1, U+2028/U+2029, which end a line in JavaScript,
 * and the bidirectional controls); bytes that are not UTF-8 become U+FFFD,
 * because JSON text must be UTF-8.
 */
void json_str(FILE *f, const char *s)
{
	const char *p = s ? s : "";
	size_t len = strlen(p);

	fputc('"', f);
	for (size_t i = 0; i < len;) {
		uint32_t cp;
		size_t n = text_decode(p + i, len - i, &cp);

		if (n == 0) {
			fputs("\\ufffd", f);
			i++;
			continue;
		}
		if (cp == '"')
			fputs("\\\"", f);
		else if (cp == '\\')
			fputs("\\\\", f);
		else if (cp == '\n')
			fputs("\\n", f);
		else if (cp == '\r')
			fputs("\\r", f);
		else if (cp == '\t')
			fputs("\\t", f);
		else if (!text_cp_printable(cp))
			fprintf(f, "\\u%04" PRIx32, cp); /* every unprintable one is in the BMP */
		else
			fwrite(p + i, 1, n, f);
		i += n;
	}
	fputc('"', f);
}

/* JSON has no NaN or infinity: an absent threshold is null. */
static void json_double(FILE *f, double v)
{
	if (!isfinite(v))
		fputs("null", f);
	else
		fprintf(f, "%.15g", v);
}

static void json_key(FILE *f, const char *k)
{
	json_str(f, k);
	fputc(':', f);
}

static void json_u64(FILE *f, const char *k, uint64_t v, bool comma)
{
	json_key(f, k);
	fprintf(f, "%" PRIu64 "%s", v, comma ? "," : "");
}

static void json_kstr(FILE *f, const char *k, const char *v, bool comma)
{
	json_key(f, k);
	json_str(f, v);
	if (comma)
		fputc(',', f);
}

static void json_kdouble(FILE *f, const char *k, double v, bool comma)
{
	json_key(f, k);
	json_double(f, v);
	if (comma)
		fputc(',', f);
}

static void json_events(FILE *f, const char *k, const struct pb_event_info *e, size_t n)
{
	json_key(f, k);
	fputc('[', f);
	for (size_t i = 0; i < n; i++) {
		fprintf(f, "%s{", i ? "," : "");
		json_u64(f, "age_ms", e[i].age_ms, true);
		json_kstr(f, "text", e[i].text, false);
		fputc('}', f);
	}
	fputc(']', f);
}

/* Labels travel comma-joined in pb_client_info; JSON gets them back as an array. */
static void json_labels(FILE *f, const char *joined)
{
	const char *p = joined ? joined : "";
	bool first = true;

	fputc('[', f);
	while (*p) {
		const char *comma = strchr(p, ',');
		size_t n = comma ? (size_t)(comma - p) : strlen(p);
		char *one = strndup(p, n);

		if (!first)
			fputc(',', f);
		json_str(f, one);
		free(one);
		first = false;
		p += n;
		if (*p == ',')
			p++;
	}
	fputc(']', f);
}

static void json_leases(FILE *f, const struct pb_lease_info *rows, size_t n)
{
	json_key(f, "leases");
	fputc('[', f);
	for (size_t i = 0; i < n; i++) {
		const struct pb_lease_info *l = &rows[i];
		char user[64];

		fprintf(f, "%s{", i ? "," : "");
		json_u64(f, "id", l->id, true);
		json_key(f, "pid");
		fprintf(f, "%" PRId32 ",", l->pid);
		json_u64(f, "uid", l->uid, true);
		json_kstr(f, "user", user_name(l->uid, user, sizeof(user)), true);
		json_u64(f, "bytes", l->bytes, true);
		json_kstr(f, "label", l->label, true);
		json_u64(f, "age_ms", l->age_ms, true);
		json_kstr(f, "priority", priority_name(l->priority), true);
		json_kstr(f, "state", l->state, true);
		json_u64(f, "idle_ms", l->idle_ms, true);
		json_key(f, "deadline_left_ms");
		fprintf(f, "%" PRId64 ",", l->deadline_left_ms);
		fprintf(f, "\"shared\":%s,\"holder_detached\":%s,", l->shared ? "true" : "false",
			l->holder_detached ? "true" : "false");
		fprintf(f, "\"registration\":%s,\"no_revoke\":%s,", l->registration ? "true" : "false",
			l->no_revoke ? "true" : "false");
		json_key(f, "numa_node");
		if (l->numa_node >= 0)
			fprintf(f, "%d,", l->numa_node);
		else
			fputs("null,", f);
		fprintf(f, "\"misplaced\":%s,", l->misplaced ? "true" : "false");
		json_key(f, "job");
		if (l->job && l->job[0]) {
			json_str(f, l->job);
			fputc(',', f);
		} else {
			fputs("null,", f);
		}
		json_u64(f, "attachers", l->attachers, true);
		json_key(f, "attacher_pids");
		fputc('[', f);
		for (size_t k = 0; k < l->n_attacher_pids; k++)
			fprintf(f, "%s%" PRId32, k ? "," : "", l->attacher_pids[k]);
		fputs("]}", f);
	}
	fputc(']', f);
}

static void status_json(FILE *f, const struct pb_status *s)
{
	fputc('{', f);
	json_u64(f, "schema_version", JSON_SCHEMA_VERSION, true);
	json_kstr(f, "version", s->server_version, true);
	json_u64(f, "budget_bytes", s->budget_bytes, true);
	json_u64(f, "uid_quota_bytes", s->uid_quota_bytes, true);
	json_u64(f, "leased_bytes", s->leased_bytes, true);
	json_u64(f, "pool_bytes", s->pool_bytes, true);
	json_u64(f, "pool_idle_bytes", s->pool_idle_bytes, true);
	json_u64(f, "free_bytes", s->budget_bytes > s->leased_bytes ? s->budget_bytes - s->leased_bytes : 0, true);
	json_u64(f, "page_size_bytes", s->page_size_bytes, true);
	json_u64(f, "chunk_size_bytes", s->chunk_size_bytes, true);
	json_key(f, "hugetlb");
	fputs(s->hugetlb ? "true," : "false,", f);
	json_kstr(f, "page_kind", s->page_kind, true);
	json_u64(f, "thp_bytes", s->thp_bytes, true);
	json_u64(f, "thp_failures", s->thp_failures, true);
	json_u64(f, "hugetlb_bytes", s->hugetlb_bytes, true);
	json_u64(f, "huge_pages_free_bytes", s->huge_pages_free_bytes, true);
	json_key(f, "nodes");
	fputc('[', f);
	for (size_t i = 0; i < s->n_nodes; i++) {
		const struct pb_node_info *nd = &s->nodes[i];

		fprintf(f, "%s{\"node\":%d,", i ? "," : "", nd->node);
		json_u64(f, "idle_bytes", nd->idle_bytes, true);
		json_u64(f, "lent_bytes", nd->lent_bytes, true);
		json_u64(f, "misplaced_bytes", nd->misplaced_bytes, true);
		json_u64(f, "gpus", nd->gpus, true);
		json_u64(f, "mem_free_bytes", nd->mem_free_bytes, false);
		fputc('}', f);
	}
	fputs("],", f);
	json_u64(f, "overdue_bytes", s->overdue_bytes, true);
	json_u64(f, "cached_idle_bytes", s->cached_idle_bytes, true);
	json_u64(f, "registered_bytes", s->registered_bytes, true);
	json_u64(f, "no_revoke_bytes", s->no_revoke_bytes, true);
	json_u64(f, "unbrokered_bytes", s->unbrokered_bytes, true);
	/* The unbrokered figures are clients' word: the JSON says so, as the text does. */
	json_kstr(f, "unbrokered_source", "reported by clients, not verified", true);
	json_u64(f, "unbrokered_reported_bytes", s->unbrokered_reported_bytes, true);
	json_u64(f, "unbrokered_cap_bytes", s->unbrokered_cap_bytes, true);
	json_key(f, "unbrokered_uids");
	fputc('[', f);
	for (size_t i = 0; i < s->n_unbrokered_uids; i++) {
		const struct pb_unbrokered_uid *u = &s->unbrokered_uids[i];
		char user[64];

		fprintf(f, "%s{", i ? "," : "");
		json_u64(f, "uid", u->uid, true);
		json_kstr(f, "user", user_name(u->uid, user, sizeof(user)), true);
		json_u64(f, "connections", u->connections, true);
		json_u64(f, "reported_bytes", u->reported_bytes, true);
		json_u64(f, "counted_bytes", u->counted_bytes, false);
		fputc('}', f);
	}
	fputs("],", f);
	json_u64(f, "orphaned_bytes", s->orphaned_bytes, true);
	json_u64(f, "prewarm_bytes", s->prewarm_bytes, true);
	json_u64(f, "waiting_acquires", s->waiting_acquires, true);
	json_kstr(f, "pressure_state", s->pressure_state, true);
	json_kstr(f, "monitor_mode", s->monitor_mode, true);
	json_u64(f, "uptime_ms", s->uptime_ms, true);

	json_key(f, "signals");
	fputc('[', f);
	for (size_t i = 0; i < s->n_signals; i++) {
		const struct pb_signal_info *g = &s->signals[i];

		fprintf(f, "%s{", i ? "," : "");
		json_kstr(f, "name", g->name, true);
		json_kdouble(f, "value", g->value, true);
		json_kdouble(f, "tight", g->tight, true);
		json_kdouble(f, "critical", g->critical, true);
		json_kstr(f, "unit", g->unit, true);
		json_key(f, "available");
		fputs(g->available ? "true}" : "false}", f);
	}
	fputs("],", f);
	json_events(f, "transitions", s->transitions, s->n_transitions);
	fputc(',', f);
	json_events(f, "revocations", s->revocations, s->n_revocations);
	fputc(',', f);

	json_key(f, "clients");
	fputc('[', f);
	for (size_t i = 0; i < s->n_clients; i++) {
		const struct pb_client_info *ci = &s->clients[i];
		char user[64];

		fprintf(f, "%s{", i ? "," : "");
		json_key(f, "pid");
		fprintf(f, "%" PRId32 ",", ci->pid);
		json_u64(f, "uid", ci->uid, true);
		json_kstr(f, "user", user_name(ci->uid, user, sizeof(user)), true);
		json_kstr(f, "name", ci->name, true);
		json_u64(f, "leases", ci->leases, true);
		json_u64(f, "attached", ci->attached, true); /* of leases: mapped through a share token */
		json_u64(f, "bytes", ci->bytes, true);
		json_u64(f, "unbrokered_bytes", ci->unbrokered_bytes, true);
		json_key(f, "cgroup");
		if (s->client_cgroups && s->client_cgroups[i] && s->client_cgroups[i][0]) {
			json_str(f, s->client_cgroups[i]);
			fputc(',', f);
		} else {
			fputs("null,", f);
		}
		json_key(f, "labels");
		json_labels(f, ci->labels);
		fputc('}', f);
	}
	fputs("],", f);
	json_jobs(f, s->jobs, s->n_jobs);
	fputc(',', f);
	json_leases(f, s->leases, s->n_leases);
	fputs("}\n", f);
}

/* ---------------------------------------------------------------- human output */

static void print_events(const char *title, const struct pb_event_info *e, size_t n)
{
	char age[32], t[ESC_BYTES];

	printf("%s:%s\n", title, n ? "" : " none");
	for (size_t i = 0; i < n; i++)
		printf("  %10s ago  %s\n", duration_str(e[i].age_ms, age, sizeof(age)), esc(e[i].text, t));
}

/* The leases table's JOB column: wide enough for a Slurm job's last levels or a pod's slice. */
#define JOB_COLUMN 28

/*
 * A job's cgroup path (already escaped) cut to JOB_COLUMN characters: its last components, which
 * name the job, after ".../" ("/slurm_node1/uid_1000/job_42" stays whole; a long kubepods path
 * keeps its pod). A last component too long alone keeps its tail after "...". "-" for no job.
 */
static const char *job_column(const char *job, char *buf, size_t len)
{
	size_t n = strlen(job);
	const char *p;

	if (n == 0)
		return "-";
	if (n <= JOB_COLUMN)
		return job;
	/* The first '/' at or after the point where what follows fits beside ".../" (4 characters). */
	p = strchr(job + n - (JOB_COLUMN - 4), '/');
	if (p && p[1])
		snprintf(buf, len, "...%s", p);
	else
		snprintf(buf, len, "...%s", job + n - (JOB_COLUMN - 3));
	return buf;
}

static void print_leases_table(const struct pb_lease_info *rows, size_t n)
{
	char sz[32], age[32], node[16], st[ESC_BYTES], lb[ESC_BYTES], jb[ESC_BYTES], jc[JOB_COLUMN + 1], user[64];

	printf("%-8s %-8s %-10s %-10s %-11s %-9s %-10s %-4s %-*s %s\n", "ID", "PID", "USER", "BYTES", "PRIORITY",
	       "STATE", "AGE", "NODE", JOB_COLUMN, "JOB", "LABEL");
	for (size_t i = 0; i < n; i++) {
		const struct pb_lease_info *l = &rows[i];

		if (l->numa_node >= 0)
			snprintf(node, sizeof(node), "%d%s", l->numa_node, l->misplaced ? "!" : "");
		else
			snprintf(node, sizeof(node), "-");
		printf("%-8" PRIu64 " %-8" PRId32 " %-10s %-10s %-11s %-9s %-10s %-4s %-*s %s\n", l->id, l->pid,
		       user_name(l->uid, user, sizeof(user)), size_str(l->bytes, sz, sizeof(sz)),
		       priority_name(l->priority), esc(l->state, st), duration_str(l->age_ms, age, sizeof(age)), node,
		       JOB_COLUMN, job_column(esc(l->job ? l->job : "", jb), jc, sizeof(jc)), esc(l->label, lb));
		if (l->registration || l->no_revoke)
			printf("%-8s %s\n", "", l->registration ? "registration: the program's own memory, charged; never revoked"
								: "never revoked: its program cannot give memory back");
		if (l->misplaced)
			printf("%-8s misplaced: placed for a NUMA node that was full; some pages are on node %d and others\n",
			       "", l->numa_node);
		/* Shared leases get a second line: who else maps them (counted once, on this row). */
		if (l->shared) {
			printf("%-8s shared: %" PRIu32 " attached", "", l->attachers);
			for (size_t k = 0; k < l->n_attacher_pids; k++)
				printf("%s%" PRId32, k ? ", " : " (pid ", l->attacher_pids[k]);
			if (l->n_attacher_pids < l->attachers)
				printf(", ...");
			printf("%s%s\n", l->n_attacher_pids ? ")" : "", l->holder_detached ? "; holder let go" : "");
		}
	}
}

static void status_human(const struct pb_status *s)
{
	char a[32], b[32], c[32], d[32], e1[ESC_BYTES], e2[ESC_BYTES];

	printf("pinbrokerd %s, up %s\n", s->server_version[0] ? esc(s->server_version, e1) : "(unknown version)",
	       duration_str(s->uptime_ms, a, sizeof(a)));
	printf("state:        %s (monitor: %s)\n", esc(s->pressure_state, e1), esc(s->monitor_mode, e2));
	printf("budget:       %s (uid quota %s)\n", size_str(s->budget_bytes, a, sizeof(a)),
	       size_str(s->uid_quota_bytes, b, sizeof(b)));
	printf("leased:       %s, free %s, overdue %s, cached idle %s\n", size_str(s->leased_bytes, a, sizeof(a)),
	       size_str(s->budget_bytes > s->leased_bytes ? s->budget_bytes - s->leased_bytes : 0, b, sizeof(b)),
	       size_str(s->overdue_bytes, c, sizeof(c)), size_str(s->cached_idle_bytes, d, sizeof(d)));
	if (s->registered_bytes || s->no_revoke_bytes)
		printf("of leased:    %s registered (programs' own memory), %s never revoked\n",
		       size_str(s->registered_bytes, a, sizeof(a)), size_str(s->no_revoke_bytes, b, sizeof(b)));
	if (s->orphaned_bytes)
		printf("of leased:    %s orphaned: lent by the daemon before a restart, still mapped by live processes\n",
		       size_str(s->orphaned_bytes, a, sizeof(a)));
	printf("unbrokered:   %s pinned outside the budget, reported by clients, not verified (pinned in all: %s)\n",
	       size_str(s->unbrokered_bytes, a, sizeof(a)),
	       size_str(s->pool_bytes + s->registered_bytes + s->unbrokered_bytes + s->orphaned_bytes, b, sizeof(b)));
	/* Reports past what the host can hold are a bug or a lie: say so, and whose they are. */
	if (s->unbrokered_reported_bytes > s->unbrokered_bytes)
		printf("%-14sclients reported %s in all; counted up to %s (MemTotal less the pool and registrations)\n",
		       "", size_str(s->unbrokered_reported_bytes, a, sizeof(a)),
		       size_str(s->unbrokered_cap_bytes, b, sizeof(b)));
	for (size_t i = 0; i < s->n_unbrokered_uids; i++) {
		const struct pb_unbrokered_uid *u = &s->unbrokered_uids[i];
		char user[64];

		printf("%-14suid %s: %s reported on %" PRIu32 " connection%s, %s counted\n", "",
		       user_name(u->uid, user, sizeof(user)), size_str(u->reported_bytes, a, sizeof(a)), u->connections,
		       u->connections == 1 ? "" : "s", size_str(u->counted_bytes, b, sizeof(b)));
	}
	printf("pool:         %s resident, %s idle (prewarm %s)\n", size_str(s->pool_bytes, a, sizeof(a)),
	       size_str(s->pool_idle_bytes, b, sizeof(b)), size_str(s->prewarm_bytes, c, sizeof(c)));
	printf("pages:        page %s, chunk %s, pool on %s\n", size_str(s->page_size_bytes, a, sizeof(a)),
	       size_str(s->chunk_size_bytes, b, sizeof(b)), page_kind_text(s->page_kind));
	if (strcmp(s->page_kind, "thp") == 0 || s->thp_bytes || s->thp_failures)
		printf("huge pages:   %s of the pool collapsed into transparent huge pages%s%s\n",
		       size_str(s->thp_bytes, a, sizeof(a)), s->thp_failures ? ", chunks whose collapse failed: " : "",
		       s->thp_failures ? (snprintf(b, sizeof(b), "%" PRIu64, s->thp_failures), b) : "");
	if (s->hugetlb || s->huge_pages_free_bytes)
		printf("hugetlb:      the pool holds %s of huge pages (it could use up to the budget); %s more free "
		       "on the host\n",
		       size_str(s->hugetlb_bytes, a, sizeof(a)), size_str(s->huge_pages_free_bytes, b, sizeof(b)));
	for (size_t i = 0; i < s->n_nodes; i++) {
		const struct pb_node_info *nd = &s->nodes[i];
		char m[32], fr[32];

		printf("%-14snode %d: %s idle, %s lent, %s misplaced; %" PRIu32 " GPU%s, %s free at start\n",
		       i == 0 ? "numa:" : "", nd->node, size_str(nd->idle_bytes, a, sizeof(a)),
		       size_str(nd->lent_bytes, b, sizeof(b)), size_str(nd->misplaced_bytes, m, sizeof(m)), nd->gpus,
		       nd->gpus == 1 ? "" : "s", size_str(nd->mem_free_bytes, fr, sizeof(fr)));
	}
	printf("waiting:      %" PRIu32 " acquire%s\n", s->waiting_acquires, s->waiting_acquires == 1 ? "" : "s");

	printf("signals:%s\n", s->n_signals ? "" : " none");
	if (s->n_signals)
		printf("  %-24s %12s %12s %12s  %s\n", "NAME", "VALUE", "TIGHT", "CRITICAL", "UNIT");
	for (size_t i = 0; i < s->n_signals; i++) {
		const struct pb_signal_info *g = &s->signals[i];

		if (g->available)
			figure_str(g->value, g->unit, a, sizeof(a));
		else
			snprintf(a, sizeof(a), "n/a");
		printf("  %-24s %12s %12s %12s  %s\n", esc(g->name, e1), a, figure_str(g->tight, g->unit, b, sizeof(b)),
		       figure_str(g->critical, g->unit, c, sizeof(c)),
		       strcmp(g->unit, "bytes") == 0 ? "" : esc(g->unit, e2));
	}
	print_events("transitions", s->transitions, s->n_transitions);
	print_events("revocations", s->revocations, s->n_revocations);

	printf("\n%-8s %-10s %-6s %-10s %-16s %s\n", "PID", "USER", "LEASES", "BYTES", "NAME", "LABELS");
	for (size_t i = 0; i < s->n_clients; i++) {
		const struct pb_client_info *ci = &s->clients[i];
		char user[64];

		/* pinctl's own connection is not news. */
		if (ci->pid == getpid() && ci->leases == 0)
			continue;
		printf("%-8" PRId32 " %-10s %-6" PRIu32 " %-10s %-16s %s\n", ci->pid, user_name(ci->uid, user, sizeof(user)),
		       ci->leases,
		       size_str(ci->bytes, a, sizeof(a)), ci->name[0] ? esc(ci->name, e1) : "-",
		       ci->labels[0] ? esc(ci->labels, e2) : "-");
	}
}

/* ---------------------------------------------------------------- commands */

/*
 * --json, the one option of status, leases, get and config, and nargs arguments after it.
 * Returns PINCTL_OPT_NEXT to go on (the arguments start at optind), or the exit code (--help, usage).
 */
static int parse_json_flag_args(int argc, char **argv, bool *json, int nargs)
{
	static const struct option opts[] = { { "json", no_argument, NULL, 'j' }, PINCTL_COMMON_OPTIONS,
					      { NULL, 0, NULL, 0 } };
	int o, r;

	*json = false;
	while ((o = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		if (o == 'j')
			*json = true;
		else if ((r = command_option(argv[0], o, argv)) != PINCTL_OPT_NEXT)
			return r;
	}
	if (nargs == 0 && optind != argc)
		return usage_error("%s takes no arguments", argv[0]);
	if (nargs == 1 && optind == argc)
		return usage_error("%s: give a KEY (pinctl config lists them)", argv[0]);
	if (argc - optind > nargs)
		return usage_error("%s: give one KEY, not %d arguments", argv[0], argc - optind);
	return PINCTL_OPT_NEXT;
}

static int parse_json_flag(int argc, char **argv, bool *json)
{
	return parse_json_flag_args(argc, argv, json, 0);
}

static int cmd_status(int argc, char **argv)
{
	struct pb_status *s;
	bool json;
	pb_client *c;
	int r;

	r = parse_json_flag(argc, argv, &json);
	if (r != PINCTL_OPT_NEXT)
		return r;
	c = connect_or_explain();
	if (!c)
		return EXIT_FAILURE;
	/* The text form shows no lease rows, so it does not fetch their pages. */
	r = pb_status_query(c, json ? PB_STATUS_LEASES : 0, &s);
	pb_disconnect(c);
	if (r < 0)
		return report_failure("status", r);
	if (json)
		status_json(stdout, s);
	else
		status_human(s);
	pb_status_free(s);
	return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* Every lease, page after page; all of it is in hand before anything is printed, so a failure prints no half list. */
static int fetch_leases(pb_client *c, struct pb_lease_info **ret, size_t *nret)
{
	struct pb_lease_info *all = NULL;
	uint64_t cursor = 0;
	size_t n = 0;
	int r;

	do {
		struct pb_lease_info *rows, *v;
		size_t k;

		r = pb_leases_page(c, cursor, 0, &rows, &k, &cursor);
		if (r < 0)
			break;
		v = k ? realloc(all, (n + k) * sizeof(*v)) : all;
		if (k && !v) {
			pb_lease_info_free(rows, k);
			fprintf(stderr, "pinctl: leases: out of memory after %zu rows\n", n);
			r = -ENOMEM;
			break;
		}
		all = v;
		/* The strings move over to all; only the page's array is freed. */
		if (k)
			memcpy(all + n, rows, k * sizeof(*rows));
		n += k;
		free(rows);
	} while (cursor);
	if (r < 0) {
		pb_lease_info_free(all, n);
		return r;
	}
	*ret = all;
	*nret = n;
	return 0;
}

static int cmd_leases(int argc, char **argv)
{
	struct pb_lease_info *rows = NULL;
	size_t n = 0;
	bool json;
	pb_client *c;
	int r;

	r = parse_json_flag(argc, argv, &json);
	if (r != PINCTL_OPT_NEXT)
		return r;
	c = connect_or_explain();
	if (!c)
		return EXIT_FAILURE;
	r = fetch_leases(c, &rows, &n);
	pb_disconnect(c);
	if (r == -ENOMEM)
		return EXIT_FAILURE;
	if (r < 0)
		return report_failure("leases", r);
	if (json) {
		fputc('{', stdout);
		json_u64(stdout, "schema_version", JSON_SCHEMA_VERSION, true);
		json_leases(stdout, rows, n);
		fputs("}\n", stdout);
	} else {
		print_leases_table(rows, n);
	}
	pb_lease_info_free(rows, n);
	return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

static pthread_t main_thread;

/* On the library's receiver thread: wake the main thread, which releases. */
static int on_revoke(pb_client *c, pb_lease *l, uint32_t deadline_ms, void *userdata)
{
	fprintf(stderr, "pinctl: pinbrokerd revoked lease %" PRIu64 " (deadline %" PRIu32 " ms): releasing\n",
		pb_lease_id(l), deadline_ms);
	pthread_kill(main_thread, SIGUSR1);
	return 0;
}

static void touch_pages(void *data, size_t size, size_t page_bytes)
{
	volatile uint8_t *p = data;

	for (size_t off = 0; off < size; off += page_bytes)
		p[off] = 1;
}

static void describe_memory(const pb_lease *l, char *buf, size_t len)
{
	const char *reason = NULL;

	switch (pb_lease_kind(l)) {
	case PB_MEM_PINNED:
		snprintf(buf, len, "locked, CUDA-registered");
		break;
	case PB_MEM_LOCKED:
		if (!pb_cuda_available(&reason))
			snprintf(buf, len, "locked, not CUDA-registered (%s)", reason ? reason : "no CUDA");
		else
			snprintf(buf, len, "locked, not CUDA-registered (%s)", pb_last_error());
		break;
	case PB_MEM_REVOKED:
		snprintf(buf, len, "revoked: given back to the broker");
		break;
	case PB_MEM_FALLBACK:
	default:
		snprintf(buf, len, "ordinary memory (%s)", pb_lease_fallback_reason(l));
		break;
	}
}

/* Hold until the time is up, SIGINT/SIGTERM, or a revoke. Returns the signal, or 0 at timeout. */
static int hold(double seconds, const sigset_t *set)
{
	struct timespec ts;
	int sig;

	if (seconds <= 0)
		return 0;
	if (isinf(seconds)) {
		do
			sig = sigwaitinfo(set, NULL);
		while (sig < 0 && errno == EINTR);
		return sig < 0 ? 0 : sig;
	}
	ts.tv_sec = (time_t)seconds;
	ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
	do
		sig = sigtimedwait(set, NULL, &ts);
	while (sig < 0 && errno == EINTR);
	return sig < 0 ? 0 : sig;
}

static int cmd_acquire(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "hold", required_argument, NULL, 'h' },     { "label", required_argument, NULL, 'l' },
		{ "priority", required_argument, NULL, 'p' }, { "wait", required_argument, NULL, 'w' },
		PINCTL_COMMON_OPTIONS,                          { NULL, 0, NULL, 0 },
	};
	struct pb_acquire_opts ao = { .priority = PB_PRIORITY_NORMAL };
	char sz[32], pg[32], mem[400], e[ESC_BYTES];
	double hold_s = 0;
	uint64_t size, t0, t1, t2, wait_ms;
	sigset_t set;
	pb_client *c;
	pb_lease *l;
	int o, r, sig, ret = EXIT_SUCCESS;

	while ((o = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		char *end;

		switch (o) {
		case 'h':
			errno = 0;
			hold_s = strtod(optarg, &end);
			if (errno || *end || isnan(hold_s) || hold_s < 0)
				return usage_error("--hold: not a number of seconds: %s", optarg);
			break;
		case 'l':
			ao.label = optarg;
			break;
		case 'p':
			if (parse_priority(optarg, &ao.priority) < 0)
				return usage_error("--priority: expected normal, critical or best-effort, not %s",
						   optarg);
			break;
		case 'w':
			if (parse_u64(optarg, UINT32_MAX, &wait_ms) < 0)
				return usage_error("--wait: not a number of milliseconds: %s", optarg);
			ao.flags |= PB_ACQUIRE_WAIT;
			ao.timeout_ms = (uint32_t)wait_ms;
			break;
		default:
			/* "-5" reaches getopt as an option; it is a size, and sizes are positive. */
			if (o == '?' && optopt >= '0' && optopt <= '9')
				return usage_error("acquire: %s: a size must be positive (examples: 4096, 64M, 1G)",
						   argv[optind - 1]);
			if ((r = command_option("acquire", o, argv)) != PINCTL_OPT_NEXT)
				return r;
			break;
		}
	}
	if (optind == argc)
		return usage_error("acquire: give a SIZE (examples: 4096, 64M, 1G)");
	if (optind + 1 != argc)
		return usage_error("acquire: give one SIZE, not %d arguments", argc - optind);
	r = parse_size(argv[optind], &size);
	if (r == -ERANGE || (r == 0 && (size >= MAX_LEASE_BYTES || size > SIZE_MAX)))
		return usage_error("acquire: %s: too large; a lease is less than 8 EiB", argv[optind]);
	if (r < 0)
		return usage_error("acquire: not a size: %s (examples: 4096, 64M, 1G)", argv[optind]);
	if (size == 0)
		return usage_error("acquire: %s: a size must be at least 1 byte", argv[optind]);

	/* Signals are taken synchronously by hold(); block them before any thread exists. */
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	main_thread = pthread_self();

	c = connect_or_explain();
	if (!c)
		return EXIT_FAILURE;
	pb_set_revoke_callback(c, on_revoke, NULL);
	t0 = now_us();
	r = pb_acquire(c, (size_t)size, &ao, &l);
	t1 = now_us();
	if (r < 0) {
		fprintf(stderr, "pinctl: acquire %s: refused: %s\n", size_str(size, sz, sizeof(sz)), esc(pb_last_error(), e));
		if (r == -EDQUOT || r == -ENOSPC || r == -EBUSY || r == -EAGAIN)
			fprintf(stderr, "See what holds the memory: pinctl status\n");
		else if (r == -EFBIG)
			fprintf(stderr, "The budget or uid quota is smaller than that: pinctl status\n");
		pb_disconnect(c);
		return EXIT_FAILURE;
	}
	describe_memory(l, mem, sizeof(mem));
	touch_pages(pb_lease_data(l), pb_lease_size(l), pb_lease_page_size(l));
	t2 = now_us();
	printf("lease %" PRIu64 ": %s (%zu bytes) in %zu chunk%s, page %s, %s; acquired+mapped in %.2f ms, "
	       "touched in %.2f ms\n",
	       pb_lease_id(l), size_str(pb_lease_size(l), sz, sizeof(sz)), pb_lease_size(l), pb_lease_chunks(l),
	       pb_lease_chunks(l) == 1 ? "" : "s", size_str(pb_lease_page_size(l), pg, sizeof(pg)), mem,
	       (double)(t1 - t0) / 1000.0, (double)(t2 - t1) / 1000.0);
	fflush(stdout);

	sig = hold(hold_s, &set);
	if (sig == SIGINT || sig == SIGTERM)
		printf("%s: releasing\n", strsignal(sig));
	r = pb_release(c, l);
	if (r < 0) {
		fprintf(stderr, "pinctl: release: %s\n", pb_last_error());
		ret = EXIT_FAILURE;
	} else {
		printf("released\n");
	}
	pb_disconnect(c);
	return ret;
}

static int cmd_revoke(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "uid", required_argument, NULL, 'u' },
		{ "all", no_argument, NULL, 'a' },
		{ "deadline", required_argument, NULL, 'd' },
		PINCTL_COMMON_OPTIONS,
		{ NULL, 0, NULL, 0 },
	};
	uint64_t lease_id = 0, uid = 0, deadline_ms = 0, *ids = NULL;
	uint32_t uid32 = 0;
	int what = -1, o, r, targets = 0;
	size_t n = 0;
	pb_client *c;

	while ((o = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (o) {
		case 'u':
			r = parse_user(optarg, &uid32);
			if (r == -ENOENT)
				return usage_error("revoke: --uid: no such user: %s (give a user name or a uid)", optarg);
			if (r < 0)
				return usage_error("revoke: --uid: not a user name or uid: %s", optarg);
			uid = uid32;
			what = PB_REVOKE_UID;
			targets++;
			break;
		case 'a':
			what = PB_REVOKE_ALL;
			targets++;
			break;
		case 'd':
			if (parse_u64(optarg, UINT32_MAX, &deadline_ms) < 0)
				return usage_error("--deadline: not a number of milliseconds: %s", optarg);
			break;
		default:
			if ((r = command_option("revoke", o, argv)) != PINCTL_OPT_NEXT)
				return r;
			break;
		}
	}
	if (optind < argc) {
		if (optind + 1 != argc)
			return usage_error("revoke: give one LEASE id, not %d arguments", argc - optind);
		if (parse_u64(argv[optind], UINT64_MAX, &lease_id) < 0 || lease_id == 0)
			return usage_error("revoke: not a lease id: %s (ids are in 'pinctl leases')", argv[optind]);
		what = PB_REVOKE_LEASE;
		targets++;
	}
	if (targets != 1)
		return usage_error("%s: give exactly one of LEASE, --uid USER or --all", "revoke");

	c = connect_or_explain();
	if (!c)
		return EXIT_FAILURE;
	r = pb_admin_revoke(c, what, lease_id, (uint32_t)uid, (uint32_t)deadline_ms, &ids, &n);
	pb_disconnect(c);
	if (r < 0)
		return report_failure("revoke", r);
	if (n == 0) {
		printf("no lease matched\n");
	} else {
		printf("revoking %zu lease%s:", n, n == 1 ? "" : "s");
		for (size_t i = 0; i < n; i++)
			printf(" %" PRIu64, ids[i]);
		printf("\n");
	}
	free(ids);
	return EXIT_SUCCESS;
}

static int cmd_set(int argc, char **argv)
{
	static const struct option opts[] = { PINCTL_COMMON_OPTIONS, { NULL, 0, NULL, 0 } };
	const char *key, *value;
	pb_client *c;
	int o, r, n;

	while ((o = getopt_long(argc, argv, ":", opts, NULL)) != -1)
		if ((r = command_option("set", o, argv)) != PINCTL_OPT_NEXT)
			return r;
	n = argc - optind;
	if (n != 2)
		return usage_error("set: give KEY VALUE, not %d argument%s", n, n == 1 ? "" : "s");
	key = argv[optind];
	value = argv[optind + 1];
	c = connect_or_explain();
	if (!c)
		return EXIT_FAILURE;
	r = pb_admin_set(c, key, value);
	pb_disconnect(c);
	if (r < 0)
		return report_failure("set", r);
	printf("%s = %s\n", key, value);
	return EXIT_SUCCESS;
}

/* The interposer: $PINBROKER_PRELOAD_LIB, else next to the libpinbroker.so this pinctl runs with. */
static int find_preload(char *out, size_t len)
{
	const char *env = getenv("PINBROKER_PRELOAD_LIB");
	Dl_info info;
	char *slash;

	if (env && *env) {
		snprintf(out, len, "%s", env);
		return access(out, R_OK) == 0 ? 0 : -errno;
	}
	if (!dladdr((void *)(uintptr_t)pb_connect, &info) || !info.dli_fname)
		return -ENOENT;
	snprintf(out, len, "%s", info.dli_fname);
	slash = strrchr(out, '/');
	snprintf(slash ? slash + 1 : out, len - (size_t)(slash ? slash + 1 - out : 0), "libpinbroker-preload.so");
	return access(out, R_OK) == 0 ? 0 : -errno;
}

/*
 * The folder whose sitecustomize.py installs pinbroker's torch allocator in a
 * Python program (PINBROKER_TORCH=1): the installed one, else the source
 * tree's. Empty when neither is there.
 */
static void find_autotorch(char *out, size_t len)
{
	const char *dirs[] = { getenv("PINBROKER_AUTOTORCH_DIR"), PB_AUTOTORCH_INSTALL_DIR, PB_AUTOTORCH_SOURCE_DIR };
	char path[PATH_MAX];

	out[0] = 0;
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		if (!dirs[i] || !*dirs[i])
			continue;
		snprintf(path, sizeof(path), "%s/sitecustomize.py", dirs[i]);
		if (access(path, R_OK) == 0) {
			snprintf(out, len, "%s", dirs[i]);
			return;
		}
	}
}

/* name=first, or name=first:old / first old when name is set already. */
static int prepend_env(const char *name, const char *first, char sep)
{
	const char *old = getenv(name);
	char *v;
	int r;

	if (!old || !*old)
		return setenv(name, first, 1);
	if (asprintf(&v, "%s%c%s", first, sep, old) < 0)
		return -1;
	r = setenv(name, v, 1);
	free(v);
	return r;
}

static int cmd_run(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "fallback", required_argument, NULL, 'f' },
		{ "label", required_argument, NULL, 'l' },
		{ "no-torch", no_argument, NULL, 'T' },
		PINCTL_COMMON_OPTIONS,
		{ NULL, 0, NULL, 0 },
	};
	const char *fallback = NULL, *label = NULL;
	char lib[PATH_MAX], autotorch[PATH_MAX];
	enum pbp_policy policy;
	bool torch = true;
	pb_client *c;
	int o, r;

	/* "+": options end at the command, whose own options are its own. */
	while ((o = getopt_long(argc, argv, "+:", opts, NULL)) != -1) {
		switch (o) {
		case 'f':
			if (pbp_policy_parse(optarg, &policy) < 0 || !*optarg)
				return usage_error("run: --fallback: expected cuda, error or pageable, not %s", optarg);
			fallback = optarg;
			break;
		case 'l':
			if (!*optarg)
				return usage_error("run: --label: empty label");
			label = optarg;
			break;
		case 'T':
			torch = false;
			break;
		default:
			if ((r = command_option("run", o, argv)) != PINCTL_OPT_NEXT)
				return r;
			break;
		}
	}
	if (optind >= argc)
		return usage_error("run: give the program to run (pinctl run [OPTIONS] -- CMD [ARGS])");
	r = find_preload(lib, sizeof(lib));
	if (r < 0) {
		fprintf(stderr,
			"pinctl run: cannot find the interposer (%s: %s): install libpinbroker-preload.so next to "
			"libpinbroker.so, or set PINBROKER_PRELOAD_LIB to its path\n",
			lib[0] ? lib : "libpinbroker-preload.so", strerror(-r));
		return EXIT_FAILURE;
	}
	/* Not fatal: the program runs on its fallback until a daemon answers. Say so now, once. */
	if (pb_connect(socket_path, &c) < 0)
		fprintf(stderr, "pinctl run: warning: %s; %s runs with its pinned memory on the fallback (%s)\n",
			pb_last_error(), argv[optind], fallback ? fallback : "cuda");
	else
		pb_disconnect(c);
	if (prepend_env("LD_PRELOAD", lib, ' ') < 0 ||
	    (fallback && setenv("PINBROKER_PRELOAD_FALLBACK", fallback, 1) < 0) ||
	    (label && setenv("PINBROKER_LABEL", label, 1) < 0) ||
	    (socket_path && setenv(PB_SOCKET_ENV, socket_path, 1) < 0)) {
		fprintf(stderr, "pinctl run: setting the environment: %s\n", strerror(errno));
		return EXIT_FAILURE;
	}
	if (torch) {
		find_autotorch(autotorch, sizeof(autotorch));
		if (autotorch[0] && (setenv("PINBROKER_TORCH", "1", 1) < 0 || prepend_env("PYTHONPATH", autotorch, ':') < 0)) {
			fprintf(stderr, "pinctl run: setting the environment: %s\n", strerror(errno));
			return EXIT_FAILURE;
		}
	}
	execvp(argv[optind], argv + optind);
	r = errno;
	fprintf(stderr, "pinctl run: cannot run %s: %s\n", argv[optind], strerror(r));
	return r == ENOENT ? 127 : 126; /* as env(1) and the shells answer */
}

static int cmd_metrics(int argc, char **argv)
{
	static const struct option opts[] = { PINCTL_COMMON_OPTIONS, { NULL, 0, NULL, 0 } };
	pb_client *c;
	char *text = NULL;
	int o, r;

	while ((o = getopt_long(argc, argv, ":", opts, NULL)) != -1)
		if ((r = command_option("metrics", o, argv)) != PINCTL_OPT_NEXT)
			return r;
	if (optind < argc)
		return usage_error("metrics takes no arguments");
	c = connect_or_explain();
	if (!c)
		return EXIT_FAILURE;
	r = pb_metrics(c, &text);
	pb_disconnect(c);
	if (r < 0)
		return report_failure("metrics", r);
	fputs(text, stdout);
	free(text);
	return EXIT_SUCCESS;
}

/* ---------------------------------------------------------------- get, config */

static void config_entry_json(FILE *f, const struct pb_config_entry *e)
{
	fputc('{', f);
	json_kstr(f, "key", e->key, true);
	json_kstr(f, "value", e->value, true);
	json_kstr(f, "source", e->source, true);
	if (e->file[0]) {
		json_kstr(f, "file", e->file, true);
		json_u64(f, "line", e->line, true);
	}
	fprintf(f, "\"reloadable\":%s}", e->reloadable ? "true" : "false");
}

/* "key = value  # source": config-file syntax, so a line can be pasted back into the file. */
static void config_entry_human(const struct pb_config_entry *e)
{
	char k[ESC_BYTES], v[ESC_BYTES], src[ESC_BYTES], file[ESC_BYTES];
	char where[2 * ESC_BYTES + 32];

	esc(e->key, k);
	esc(e->value, v);
	if (e->file[0])
		snprintf(where, sizeof(where), "%s %s:%" PRIu32, esc(e->source, src), esc(e->file, file), e->line);
	else
		snprintf(where, sizeof(where), "%s", esc(e->source, src));
	printf("%s = %-*s # %s%s\n", k, (int)(k[0] ? (strlen(k) < 32 ? 32 - strlen(k) : 1) : 1), v, where,
	       e->reloadable ? "" : " (restart to change)");
}

/* get KEY and config share it: key NULL asks for every key. */
static int show_config(const char *what, const char *key, bool json)
{
	struct pb_config_entry *e = NULL;
	size_t n = 0;
	pb_client *c;
	int r;

	c = connect_or_explain();
	if (!c)
		return EXIT_FAILURE;
	r = pb_config_get(c, key, &e, &n);
	pb_disconnect(c);
	if (r < 0)
		return report_failure(what, r);
	if (json && key && n == 1) {
		fputc('{', stdout);
		json_u64(stdout, "schema_version", JSON_SCHEMA_VERSION, true);
		json_key(stdout, "config");
		config_entry_json(stdout, &e[0]);
		fputs("}\n", stdout);
	} else if (json) {
		fputc('{', stdout);
		json_u64(stdout, "schema_version", JSON_SCHEMA_VERSION, true);
		json_key(stdout, "config");
		fputc('[', stdout);
		for (size_t i = 0; i < n; i++) {
			if (i)
				fputc(',', stdout);
			config_entry_json(stdout, &e[i]);
		}
		fputs("]}\n", stdout);
	} else {
		for (size_t i = 0; i < n; i++)
			config_entry_human(&e[i]);
	}
	pb_config_free(e, n);
	return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

static int cmd_get(int argc, char **argv)
{
	bool json;
	int r;

	r = parse_json_flag_args(argc, argv, &json, 1);
	if (r != PINCTL_OPT_NEXT)
		return r;
	return show_config("get", argv[optind], json);
}

static int cmd_config(int argc, char **argv)
{
	bool json;
	int r;

	r = parse_json_flag(argc, argv, &json);
	if (r != PINCTL_OPT_NEXT)
		return r;
	return show_config("config", NULL, json);
}

/* ---------------------------------------------------------------- top */

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

static int cmd_top(int argc, char **argv)
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
				return usage_error("%s: --interval: not a number of seconds from 0.1 to 3600: %s",
						   argv[0], optarg);
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
		return usage_error("%s takes no arguments", argv[0]);
	/* https://no-color.org: NO_COLOR present and not empty turns colour off. */
	v.colour = tty && !(nc && *nc);
	v.interactive = tty && !once;
	top_size(&v, tty);

	c = connect_or_explain();
	if (!c)
		return EXIT_FAILURE;
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

static int cmd_help(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "--help") == 0)
		return command_help("help", stdout);
	if (argc > 2)
		return usage_error("help: give at most one COMMAND");
	if (argc == 2)
		return command_help(argv[1], stdout);
	usage(stdout);
	return EXIT_SUCCESS;
}

static const struct command {
	const char *name;
	int (*run)(int argc, char **argv);
} commands[] = {
	{ "status", cmd_status }, { "leases", cmd_leases }, { "acquire", cmd_acquire },
	{ "revoke", cmd_revoke }, { "set", cmd_set },       { "run", cmd_run },
	{ "metrics", cmd_metrics }, { "doctor", cmd_doctor }, { "quota", cmd_quota },
	{ "jobs", cmd_jobs },       { "help", cmd_help },     { "get", cmd_get },
	{ "config", cmd_config },   { "top", cmd_top },
	{ "watch", cmd_top }, /* top's other name, as procps has watch(1) */
};

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int o;

	opterr = 0; /* every bad option gets one message, ours */
	/* "+": stop at the command, whose own options are parsed by the command. */
	while ((o = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			if (!*optarg)
				return usage_error("--socket: empty path; give the daemon's socket, or leave --socket "
						   "out for the default");
			socket_path = optarg;
			break;
		case 'V':
			printf("pinctl %s\n", PINBROKER_VERSION);
			return EXIT_SUCCESS;
		case 'h':
			usage(stdout);
			return EXIT_SUCCESS;
		default:
			return option_error(NULL, o, argv);
		}
	}
	if (optind >= argc)
		return usage_error("no command given (status, leases, top, acquire, revoke, get, set, config, run, doctor)");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		if (strcmp(argv[optind], commands[i].name) == 0) {
			char **sub = argv + optind;
			int n = argc - optind;

			/* -h too, which no command has as a short option (run's -h would be CMD's, after --). */
			if (n >= 2 && strcmp(sub[1], "-h") == 0)
				return command_help(sub[0], stdout);
			optind = 0; /* full getopt re-initialisation for the command's own options */
			return commands[i].run(n, sub);
		}
	}
	return usage_error("unknown command: %s", argv[optind]);
}

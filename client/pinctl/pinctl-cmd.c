/* SPDX-License-Identifier: MIT */
/*
 * pinctl's commands that ask the daemon and print its answer: status, leases, acquire, revoke, set, metrics, get,
 * config.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pinbroker.h"
#include "pinctl-fields.h"
#include "pinctl-output.h"
#include "pinctl.h"
#include "util.h"

/* The daemon lends less than 2^63 bytes (daemon/reply.c, STATUS_INVALID_SIZE). */
#define MAX_LEASE_BYTES (UINT64_C(1) << 63)

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

/*
 * The start of status and metrics, whose text forms have no header line to leave out (--no-headers asks for the
 * fields' rows, as -o and --csv do): the options, -o against table, a connection. PINCTL_OPT_NEXT with *c, or
 * the exit status.
 */
static int start_rows_command(int argc, char **argv, const struct pinctl_field *table, size_t n, struct list_opts *lo,
			      struct fields *sel, bool *rows, pb_client **c)
{
	int r = parse_list_opts(argc, argv, lo, 0);

	if (r != PINCTL_OPT_NEXT)
		return r;
	*rows = lo->fields || lo->csv || lo->no_headers;
	if (*rows && select_fields(table, n, lo->fields, sel) != 0)
		return EXIT_USAGE;
	r = connect_or_explain(c);
	return r ? r : PINCTL_OPT_NEXT;
}

int cmd_status(int argc, char **argv)
{
	struct list_opts lo;
	struct fields sel;
	struct pb_status *s;
	pb_client *c;
	bool rows;
	int r;

	r = start_rows_command(argc, argv, status_fields, n_status_fields, &lo, &sel, &rows, &c);
	if (r != PINCTL_OPT_NEXT)
		return r;
	/* The text form shows no lease rows, so it does not fetch their pages. */
	r = pb_status_query(c, lo.json ? PB_STATUS_LEASES : 0, &s);
	pb_disconnect(c);
	if (r < 0)
		return report_failure("status", r);
	if (lo.json)
		status_json(stdout, s);
	else if (rows)
		r = fields_print(stdout, &sel, s, sizeof(*s), 1, lo.csv, !lo.no_headers);
	else
		status_human(s);
	pb_status_free(s);
	if (r < 0)
		return pinctl_error(EXIT_FAILURE, "failed", "out of memory");
	return r == 0 && fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
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

int cmd_leases(int argc, char **argv)
{
	struct pb_lease_info *rows = NULL;
	struct list_opts lo;
	struct fields sel;
	size_t n = 0;
	pb_client *c;
	int r;

	r = parse_list_opts(argc, argv, &lo, 0);
	if (r != PINCTL_OPT_NEXT)
		return r;
	if ((lo.fields || lo.csv) && select_fields(lease_fields, n_lease_fields, lo.fields, &sel) != 0)
		return EXIT_USAGE;
	r = connect_or_explain(&c);
	if (r)
		return r;
	r = fetch_leases(c, &rows, &n);
	pb_disconnect(c);
	if (r == -ENOMEM)
		return pinctl_error(EXIT_FAILURE, "failed", "out of memory");
	if (r < 0)
		return report_failure("leases", r);
	if (lo.json) {
		fputc('{', stdout);
		json_u64(stdout, "schema_version", JSON_SCHEMA_VERSION, true);
		json_leases(stdout, rows, n);
		fputs("}\n", stdout);
	} else if (lo.fields || lo.csv) {
		r = fields_print(stdout, &sel, rows, sizeof(*rows), n, lo.csv, !lo.no_headers);
	} else {
		print_leases_table(rows, n, !lo.no_headers);
	}
	pb_lease_info_free(rows, n);
	if (r < 0)
		return pinctl_error(EXIT_FAILURE, "failed", "out of memory");
	return r == 0 && fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
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

/*
 * Say on stderr, before a call that would otherwise be silent for seconds, when the daemon must first grow
 * its pool for this lease (locking 1 GiB took 2.4 s in a VM), or when --wait may wait for memory. The status
 * is read first, on the same connection; when it cannot be read, the acquire says what is wrong.
 */
static void acquire_notice(pb_client *c, uint64_t size, const struct pb_acquire_opts *ao)
{
	struct pb_status *s;
	uint64_t free_bytes, want = size;
	char a[32], b[32];

	if (pb_status_query(c, 0, &s) < 0)
		return;
	if (s->page_size_bytes)
		want = (size + s->page_size_bytes - 1) / s->page_size_bytes * s->page_size_bytes;
	free_bytes = s->budget_bytes > s->leased_bytes ? s->budget_bytes - s->leased_bytes : 0;
	if (want > s->pool_idle_bytes && want <= free_bytes && want <= s->uid_quota_bytes)
		fprintf(stderr,
			"pinctl: the pool has %s idle: pinbrokerd grows it by %s for this lease first (locking memory "
			"can take seconds a GiB)\n",
			size_str(s->pool_idle_bytes, a, sizeof(a)), size_str(want - s->pool_idle_bytes, b, sizeof(b)));
	else if (want > free_bytes && want <= s->budget_bytes && want <= s->uid_quota_bytes &&
		 (ao->flags & PB_ACQUIRE_WAIT))
		fprintf(stderr,
			"pinctl: the budget has %s free: waiting up to %" PRIu32 " ms for leases to be given back\n",
			size_str(free_bytes, a, sizeof(a)), ao->timeout_ms);
	pb_status_free(s);
}

int cmd_acquire(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "hold", required_argument, NULL, 'h' },
		{ "label", required_argument, NULL, 'l' },
		{ "priority", required_argument, NULL, 'p' },
		{ "wait", required_argument, NULL, 'w' },
		PINCTL_COMMON_OPTIONS,
		{ NULL, 0, NULL, 0 },
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
				return usage_error("%s: a size must be positive (examples: 4096, 64M, 1G)",
						   argv[optind - 1]);
			if ((r = command_option("acquire", o, argv)) != PINCTL_OPT_NEXT)
				return r;
			break;
		}
	}
	if (optind == argc)
		return usage_error("give a SIZE (examples: 4096, 64M, 1G)");
	if (optind + 1 != argc)
		return usage_error("give one SIZE, not %d arguments", argc - optind);
	r = parse_size(argv[optind], &size);
	if (r == -ERANGE || (r == 0 && (size >= MAX_LEASE_BYTES || size > SIZE_MAX)))
		return usage_error("%s: too large; a lease is less than 8 EiB", argv[optind]);
	if (r < 0)
		return usage_error("not a size: %s (examples: 4096, 64M, 1G)", argv[optind]);
	if (size == 0)
		return usage_error("%s: a size must be at least 1 byte", argv[optind]);

	/* Signals are taken synchronously by hold(); block them before any thread exists. */
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	main_thread = pthread_self();

	r = connect_or_explain(&c);
	if (r)
		return r;
	pb_set_revoke_callback(c, on_revoke, NULL);
	acquire_notice(c, size, &ao);
	t0 = now_us();
	r = pb_acquire(c, (size_t)size, &ao, &l);
	t1 = now_us();
	if (r < 0) {
		fprintf(stderr, "pinctl: acquire %s: refused: %s\n", size_str(size, sz, sizeof(sz)),
			esc(pb_last_error(), e));
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

int cmd_revoke(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "uid", required_argument, NULL, 'u' },
		{ "all", no_argument, NULL, 'a' },
		{ "deadline", required_argument, NULL, 'd' },
		{ "orphans", no_argument, NULL, 'O' },
		{ "reservation", required_argument, NULL, 'R' },
		PINCTL_COMMON_OPTIONS,
		{ NULL, 0, NULL, 0 },
	};
	uint64_t lease_id = 0, uid = 0, deadline_ms = 0, *ids = NULL;
	uint32_t uid32 = 0;
	int what = -1, o, r, targets = 0;
	bool orphans = false;
	size_t n = 0;
	pb_client *c;

	while ((o = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (o) {
		case 'O':
			orphans = true;
			break;
		case 'u':
			r = parse_user(optarg, &uid32);
			if (r == -ENOENT)
				return usage_error("--uid: no such user: %s (give a user name or a uid)", optarg);
			if (r < 0)
				return usage_error("--uid: not a user name or uid: %s", optarg);
			uid = uid32;
			what = PB_REVOKE_UID;
			targets++;
			break;
		case 'a':
			what = PB_REVOKE_ALL;
			targets++;
			break;
		case 'R':
			if (parse_u64(optarg, UINT64_MAX, &lease_id) < 0 || lease_id == 0)
				return usage_error("--reservation: not a reservation id: %s (ids are in 'pinctl "
						   "reservations')",
						   optarg);
			what = PB_REVOKE_RESERVATION;
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
			return usage_error("give one LEASE id, not %d arguments", argc - optind);
		if (parse_u64(argv[optind], UINT64_MAX, &lease_id) < 0 || lease_id == 0)
			return usage_error("not a lease id: %s (ids are in 'pinctl leases')", argv[optind]);
		what = PB_REVOKE_LEASE;
		targets++;
	}
	if (targets != 1)
		return usage_error("give exactly one of LEASE, --uid USER, --all or --reservation ID");
	if (orphans) {
		if (what == PB_REVOKE_LEASE || what == PB_REVOKE_RESERVATION)
			return usage_error("--orphans takes --uid USER or --all, not a lease or reservation id");
		what = what == PB_REVOKE_UID ? PB_REVOKE_ORPHANS_UID : PB_REVOKE_ORPHANS;
	}

	r = connect_or_explain(&c);
	if (r)
		return r;
	r = pb_admin_revoke(c, what, lease_id, (uint32_t)uid, (uint32_t)deadline_ms, &ids, &n);
	pb_disconnect(c);
	if (r < 0)
		return report_failure("revoke", r);
	if (orphans) {
		printf("dropped %zu orphan%s: no longer counted (processes that map them keep them)\n", n,
		       n == 1 ? "" : "s");
	} else if (what == PB_REVOKE_RESERVATION) {
		printf("reservation %" PRIu64 " ended: its untaken bytes are back; revoking %zu lease%s taken from it",
		       lease_id, n, n == 1 ? "" : "s");
		for (size_t i = 0; i < n; i++)
			printf("%s%" PRIu64, i ? " " : ": ", ids[i]);
		printf("\n");
	} else if (n == 0) {
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

int cmd_set(int argc, char **argv)
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
		return usage_error("give KEY VALUE, not %d argument%s", n, n == 1 ? "" : "s");
	key = argv[optind];
	value = argv[optind + 1];
	r = connect_or_explain(&c);
	if (r)
		return r;
	r = pb_admin_set(c, key, value);
	pb_disconnect(c);
	if (r < 0)
		return report_failure("set", r);
	printf("%s = %s\n", key, value);
	return EXIT_SUCCESS;
}

int cmd_metrics(int argc, char **argv)
{
	struct metric_sample *samples = NULL;
	struct list_opts lo;
	struct fields sel;
	size_t n = 0;
	pb_client *c;
	char *text = NULL;
	bool rows; /* else the text form: the exposition format */
	int r;

	r = start_rows_command(argc, argv, metric_fields, n_metric_fields, &lo, &sel, &rows, &c);
	if (r != PINCTL_OPT_NEXT)
		return r;
	r = pb_metrics(c, &text);
	pb_disconnect(c);
	if (r < 0)
		return report_failure("metrics", r);
	if (!lo.json && !rows) {
		fputs(text, stdout);
		free(text);
		return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
	}
	r = metrics_parse(text, &samples, &n);
	free(text);
	if (r < 0)
		return pinctl_error(EXIT_FAILURE, "failed", "the daemon's metrics: %s", strerror(-r));
	if (lo.json)
		metrics_json(stdout, samples, n);
	else
		r = fields_print(stdout, &sel, samples, sizeof(*samples), n, lo.csv, !lo.no_headers);
	metrics_free(samples, n);
	if (r < 0)
		return pinctl_error(EXIT_FAILURE, "failed", "out of memory");
	return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* ---------------------------------------------------------------- get, config */

/* get KEY and config share it: key NULL asks for every key. */
static int show_config(const char *what, const char *key, const struct list_opts *lo)
{
	struct pb_config_entry *e = NULL;
	struct fields sel;
	size_t n = 0;
	pb_client *c;
	/* Config lines have no header to leave out: --no-headers asks for the fields' rows, as status does. */
	bool rows = lo->fields || lo->csv || lo->no_headers;
	int r;

	if (rows && select_fields(config_fields, n_config_fields, lo->fields, &sel) != 0)
		return EXIT_USAGE;
	r = connect_or_explain(&c);
	if (r)
		return r;
	r = pb_config_get(c, key, &e, &n);
	pb_disconnect(c);
	if (r < 0)
		return report_failure(what, r);
	if (lo->json && key && n == 1) {
		fputc('{', stdout);
		json_u64(stdout, "schema_version", JSON_SCHEMA_VERSION, true);
		json_key(stdout, "config");
		config_entry_json(stdout, &e[0]);
		fputs("}\n", stdout);
	} else if (lo->json) {
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
	} else if (rows) {
		r = fields_print(stdout, &sel, e, sizeof(*e), n, lo->csv, !lo->no_headers);
	} else {
		for (size_t i = 0; i < n; i++)
			config_entry_human(&e[i]);
	}
	pb_config_free(e, n);
	if (r < 0)
		return pinctl_error(EXIT_FAILURE, "failed", "out of memory");
	return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

int cmd_get(int argc, char **argv)
{
	struct list_opts lo;
	int r;

	r = parse_list_opts(argc, argv, &lo, INT_MAX);
	if (r != PINCTL_OPT_NEXT)
		return r;
	if (optind == argc)
		return usage_error("give a KEY (pinctl config lists them)");
	if (argc - optind > 1)
		return usage_error("give one KEY, not %d arguments", argc - optind);
	return show_config("get", argv[optind], &lo);
}

int cmd_config(int argc, char **argv)
{
	struct list_opts lo;
	int r;

	r = parse_list_opts(argc, argv, &lo, 0);
	if (r != PINCTL_OPT_NEXT)
		return r;
	return show_config("config", NULL, &lo);
}

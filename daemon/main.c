/* SPDX-License-Identifier: MIT */
/* pinbrokerd: configuration, start-up order, the event loop, reload (reload.c applies it) and shutdown. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "audit.h"
#include "broker.h"
#include "reservation.h"
#include "backing.h"
#include "budget.h"
#include "config.h"
#include "daemon.h"
#include "jobs-watch.h"
#include "lease.h"
#include "log.h"
#include "monitor.h"
#include "metrics.h"
#include "notify.h"
#include "pool.h"
#include "prewarm.h"
#include "pressure.h"
#include "quota-store.h"
#include "recovery.h"
#include "reload.h"
#include "restart.h"
#include "rlimits.h"
#include "react.h"
#include "request.h"
#include "reserve.h"
#include "waitq.h"
#include "server.h"
#include "util.h"
#include "wire.h"

/* Command-line overrides, re-applied over the file on every reload. */
struct override {
	const char *key;
	const char *value;
};

struct options {
	const char *config_path;
	bool config_explicit;
	struct override *ov;
	size_t nov;
};

static ev_timer status_timer;
static ev_timer metrics_timer;
static int metrics_last_error; /* the last write's errno, so a failure is logged once, not every interval */

/* The config read without --config: this daemon's install prefix's (config_default_path_for). */
static char default_config[PATH_MAX] = CONFIG_DEFAULT_PATH;

static void default_config_init(void)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	if (n <= 0)
		return; /* no /proc: the system path */
	exe[n] = '\0';
	if (config_default_path_for(exe, default_config, sizeof(default_config)) < 0)
		snprintf(default_config, sizeof(default_config), "%s", CONFIG_DEFAULT_PATH);
}

static void usage(FILE *f)
{
	size_t n;
	const struct config_key *k = config_keys(&n);

	fprintf(f,
		"Usage: pinbrokerd [OPTIONS]\n"
		"Lend pinned, locked host memory to GPU jobs over a Unix socket.\n\n"
		"  -c, --config FILE   read FILE (default %s; absent is fine)\n"
		"      --check-config  validate the config and the command line, then exit\n"
		"      --sample-config print a commented config with every key and exit\n"
		"      --config-doc    print the keys as a markdown table and exit\n"
		"      --config-man    print the pinbrokerd.conf(5) man page and exit\n"
		"      --reserve-hugepages  raise vm.nr_hugepages so the budget fits in free 2 MiB huge pages\n"
		"                      (as root, before the daemon starts: pinbroker-hugepages.service), then exit\n"
		"  -d, --debug         same as --log-level debug\n"
		"  -h, --help          show this help\n"
		"  -V, --version       show the version\n\n"
		"Every config key is also an option, --KEY VALUE:\n",
		default_config);
	for (size_t i = 0; i < n; i++)
		fprintf(f, "      --%-28s %s (default %s)\n", k[i].name, k[i].help,
			k[i].def && *k[i].def ? k[i].def : "\"\"");
	fprintf(f, "\nThe socket is also taken from $PINBROKER_SOCKET.\n");
}

enum { OPT_CHECK = 1000, OPT_SAMPLE, OPT_DOC, OPT_RESERVE, OPT_MAN, OPT_KEY_BASE = 2000 };

/* A bad value on the command line is a usage error (exit 2), found before any file is read. */
static int check_overrides(const struct options *o)
{
	struct config *scratch = NULL;
	int r;

	r = config_new(&scratch);
	if (r < 0)
		return r;
	for (size_t i = 0; i < o->nov; i++) {
		char *e = NULL;

		r = config_set(scratch, o->ov[i].key, o->ov[i].value, &e);
		if (r < 0) {
			fprintf(stderr, "pinbrokerd: --%s: %s\n", o->ov[i].key, e ? e : strerror(-r));
			free(e);
			break;
		}
	}
	config_free(scratch);
	return r < 0 ? -EINVAL : 0;
}

static int parse_args(int argc, char **argv, struct options *o, int *action)
{
	size_t nkeys, nbase = 9;
	const struct config_key *keys = config_keys(&nkeys);
	struct option *lo = calloc(nkeys + nbase + 1, sizeof(*lo));
	int ch;

	if (!lo)
		return -ENOMEM;
	lo[0] = (struct option){ "config", required_argument, NULL, 'c' };
	lo[1] = (struct option){ "check-config", no_argument, NULL, OPT_CHECK };
	lo[2] = (struct option){ "sample-config", no_argument, NULL, OPT_SAMPLE };
	lo[3] = (struct option){ "config-doc", no_argument, NULL, OPT_DOC };
	lo[4] = (struct option){ "debug", no_argument, NULL, 'd' };
	lo[5] = (struct option){ "help", no_argument, NULL, 'h' };
	lo[6] = (struct option){ "version", no_argument, NULL, 'V' };
	lo[7] = (struct option){ "reserve-hugepages", no_argument, NULL, OPT_RESERVE };
	lo[8] = (struct option){ "config-man", no_argument, NULL, OPT_MAN };
	for (size_t i = 0; i < nkeys; i++)
		lo[nbase + i] = (struct option){ keys[i].name, required_argument, NULL, OPT_KEY_BASE + (int)i };

	o->ov = calloc((size_t)argc + 1, sizeof(*o->ov));
	if (!o->ov) {
		free(lo);
		return -ENOMEM;
	}
	while ((ch = getopt_long(argc, argv, "c:dhV", lo, NULL)) != -1) {
		switch (ch) {
		case 'c':
			o->config_path = optarg;
			o->config_explicit = true;
			break;
		case 'd':
			o->ov[o->nov++] = (struct override){ "log-level", "debug" };
			break;
		case 'h':
			*action = 'h';
			break;
		case 'V':
			*action = 'V';
			break;
		case OPT_CHECK:
		case OPT_SAMPLE:
		case OPT_DOC:
		case OPT_MAN:
		case OPT_RESERVE:
			*action = ch;
			break;
		default:
			if (ch >= OPT_KEY_BASE && ch < OPT_KEY_BASE + (int)nkeys) {
				o->ov[o->nov++] = (struct override){ keys[ch - OPT_KEY_BASE].name, optarg };
				break;
			}
			free(lo);
			return -EINVAL;
		}
	}
	free(lo);
	if (optind < argc) {
		fprintf(stderr, "pinbrokerd: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	return check_overrides(o);
}

/* Once per start, reload and --check-config: a config file others can change is a warning, not a refusal. */
static void warn_config_mode(const char *path)
{
	char *warn = NULL;

	if (config_check_file_mode(path, &warn) < 0 || !warn)
		return;
	for (char *save = NULL, *line = strtok_r(warn, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
		log_warnx("%s", line);
	free(warn);
}

/* Appends msg (and a newline if it lacks one) to *all. Returns 0 or -ENOMEM. */
static int add_errors(char **all, const char *msg)
{
	size_t len = strlen(msg);
	char *joined;

	if (asprintf(&joined, "%s%s%s", *all ? *all : "", msg, len && msg[len - 1] == '\n' ? "" : "\n") < 0)
		return -ENOMEM;
	free(*all);
	*all = joined;
	return 0;
}

static void note_runtime(const char *key, const char *value, void *ud)
{
	log_info("keeping %s = %s from pinctl set over the config file and command line until restart", key, value);
}

/* Warnings about a config that loads but may not do what was meant: at start, reload and --check-config. */
static void warn_config(const struct config *c, const struct config *running)
{
	char a[32], b[32];

	if (c->admin_group && c->admin_group[0] && !getgrnam(c->admin_group))
		log_warnx("admin-group '%s' does not exist, so only root may run admin requests; create it "
			  "(groupadd %s) or set admin-group to an existing group",
			  c->admin_group, c->admin_group);
	/* Once: a reload that changes neither says nothing new. */
	if (config_prewarm_yields(c) && !(running && config_prewarm_yields(running)))
		log_info("prewarm: the default (%s) is above budget (%s); warming %s, the whole budget (set prewarm "
			 "to choose)",
			 format_size(c->prewarm.bytes, a, sizeof(a)), format_size(c->budget.bytes, b, sizeof(b)),
			 format_size(c->budget.bytes, b, sizeof(b)));
}

/*
 * Embedded defaults, then the file, then $PINBROKER_SOCKET, then the command
 * line, then (on reload) what pinctl set changed in the running config. Every
 * error, the file's and the cross-key ones, is collected into *err, one
 * "file:line: ..." line each.
 */
static int load_config(const struct options *o, const struct config *running, struct config **ret, char **err)
{
	struct config *c = NULL;
	const char *env;
	char *e = NULL;
	int r;

	*err = NULL;
	r = config_new(&c);
	if (r < 0)
		return r;
	if (o->config_path) {
		r = config_load_file(c, o->config_path, &e);
		if (r == -ENOENT && !o->config_explicit)
			r = 0;
		else if (r == -EINVAL && e)
			r = add_errors(err, e);
		else if (r < 0) {
			*err = e;
			e = NULL;
			goto fail;
		}
		free(e);
		e = NULL;
		if (r < 0)
			goto fail;
		warn_config_mode(o->config_path);
	}
	env = getenv("PINBROKER_SOCKET");
	if (env && *env && config_set(c, "socket", env, &e) == 0) {
		config_mark_env(c, "socket");
	} else if (env && *env) {
		char *line = NULL;

		r = asprintf(&line, "$PINBROKER_SOCKET: %s", e ? e : "bad value") < 0 ? -ENOMEM : add_errors(err, line);
		free(line);
		free(e);
		e = NULL;
		if (r < 0)
			goto fail;
	}
	for (size_t i = 0; i < o->nov; i++) {
		r = config_set(c, o->ov[i].key, o->ov[i].value, &e);
		if (r < 0) {
			char *line = NULL;

			r = asprintf(&line, "command line: --%s: %s", o->ov[i].key, e ? e : strerror(-r)) < 0
				    ? -ENOMEM
				    : add_errors(err, line);
			free(line);
			if (r < 0)
				goto fail;
		}
		free(e);
		e = NULL;
	}
	if (running) {
		r = config_keep_runtime(c, running, note_runtime, NULL);
		if (r < 0)
			goto fail;
	}
	r = config_validate_file(c, o->config_path, &e);
	if (r == -EINVAL && e)
		r = add_errors(err, e);
	free(e);
	e = NULL;
	if (r < 0)
		goto fail;
	if (*err) {
		r = -EINVAL;
		goto fail;
	}
	warn_config(c, running);
	*ret = c;
	return 0;
fail:
	free(e);
	config_free(c);
	return r;
}

static void update_status(struct broker *b)
{
	char bud[32], leased[32], idle[32];

	notify_status("%s; leased %s of %s budget, %s warm and free, %zu clients", monitor_state_name(b->state),
		      format_size(budget_leased(b->budget), leased, sizeof(leased)),
		      format_size(budget_limit(b->budget), bud, sizeof(bud)),
		      format_size(pool_idle_bytes(daemon_of(b)->pool), idle, sizeof(idle)),
		      server_conn_count(daemon_of(b)->server));
}

/* Rewrite metrics-path (when set); the interval follows metrics-interval-ms across reloads. */
static void metrics_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct broker *b = w->data;
	const char *path = daemon_of(b)->cfg->metrics_path;
	struct timespec ts;
	int r = 0;

	(void)revents;
	if (path && *path) {
		clock_gettime(CLOCK_REALTIME, &ts);
		r = metrics_write_file(b, path, (double)ts.tv_sec + ts.tv_nsec / 1e9);
		if (r < 0 && r != metrics_last_error)
			log_warnx(
				"cannot write the metrics to %s: %s; check that its folder exists and that the daemon's "
				"user may write there (it writes a new file beside it and renames it over): "
				"ReadWritePaths= in the unit, and for node_exporter's folder an ACL entry, which "
				"systemd-tmpfiles --create pinbroker.conf applies (docs/operations.md, Metrics)",
				path, strerror(-r));
		else if (r == 0 && metrics_last_error)
			log_info("metrics written to %s again", path);
	}
	metrics_last_error = r;
	w->repeat = daemon_of(b)->cfg->metrics_interval_ms / 1000.0;
	ev_timer_again(loop, w);
}

static void status_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	update_status(w->data);
}

static int reconfigure_monitor(struct broker *b, const struct config *cfg)
{
	return daemon_of(b)->monitor ? monitor_reconfigure(daemon_of(b)->monitor, cfg) : 0;
}

static void config_applied(struct broker *b)
{
	prewarm_kick(b);
	waitq_grant(b);
	update_status(b);
}

static const struct prewarm_hooks daemon_prewarm_hooks = {
	.status = update_status,
	.applied = config_applied,
};

static const struct reload_hooks daemon_reload_hooks = {
	.resolve_limits = rlimits_resolve,
	.reconfigure = reconfigure_monitor,
	.applied = config_applied,
};

/* ------------------------------------------------------------- signals */

struct sigctx {
	struct broker *b;
	struct options *o;
};

static void reload(struct broker *b, const struct options *o)
{
	struct config *n = NULL;
	char *err = NULL;
	char bud[32];
	int r;

	notify_reloading();
	log_info("reloading %s", o->config_path ? o->config_path : "(no config file)");
	r = load_config(o, daemon_of(b)->cfg, &n, &err);
	if (r == 0)
		r = reload_apply(b, n, &err);
	if (r < 0) {
		/* Each line of err is already "file:line: message". */
		log_warnx("reload rejected, keeping the running config:\n%s", err ? err : strerror(-r));
		config_free(n);
	} else {
		log_event(EV_CONFIG_RELOADED, LOG_NOTICE, 0, (uid_t)-1, 0, "config reloaded: budget %s",
			  format_size(b->budget_bytes, bud, sizeof(bud)));
	}
	free(err);
	notify_ready();
	update_status(b);
}

/* --version names a build with the debug hooks, so a test needing one can tell (tests/system/systemd/in-guest.sh). */
#ifdef PINBROKER_DEBUG_HOOKS
#define DEBUG_HOOKS_NOTE " [debug hooks: SIGUSR2 stalls the loop]"
#else
#define DEBUG_HOOKS_NOTE ""
#endif

/* SIGUSR2 is caught in every build so that, without the debug hooks, it is ignored rather than fatal. */
static void signal_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
	struct sigctx *sc = w->data;

	switch (w->signum) {
	case SIGTERM:
	case SIGINT:
		log_info("%s: stopping", strsignal(w->signum));
		ev_break(loop, EVBREAK_ALL);
		break;
	case SIGHUP:
		reload(sc->b, sc->o);
		break;
	case SIGUSR1:
		/* Sample /proc now instead of at the next poll (tests, and an operator who just freed memory). */
		log_debug("SIGUSR1: sampling memory pressure now");
		if (daemon_of(sc->b)->monitor)
			monitor_sample_now(daemon_of(sc->b)->monitor);
		break;
#ifdef PINBROKER_DEBUG_HOOKS
	case SIGUSR2:
		/* Debug hook for the watchdog test: wedge the loop so pings stop. */
		log_warnx("SIGUSR2: stalling the event loop (debug hook)");
		for (;;)
			pause();
#endif
	default:
		break;
	}
}

static void progress_cb(uint64_t done, uint64_t total, void *ud)
{
	char d[32], t[32];

	notify_status("Warming pool: %s of %s pre-faulted and locked", format_size(done, d, sizeof(d)),
		      format_size(total, t, sizeof(t)));
}

/*
 * Every callback of one loop iteration runs in here, so the longest turn (no
 * client is answered while one runs) is a metric: the goal is no turn over
 * 20 ms under a revoke storm. Two clock reads per iteration.
 */
static void timed_invoke(struct ev_loop *loop)
{
	struct broker *b = ev_userdata(loop);
	uint64_t t0 = now_us(), dt;

	static const uint64_t bound_us[BROKER_TURN_BUCKETS] = BROKER_TURN_BUCKET_US;
	size_t i = 0;

	ev_invoke_pending(loop);
	dt = now_us() - t0;
	if (dt > b->counters.loop_turn_max_us)
		b->counters.loop_turn_max_us = dt;
	while (i < BROKER_TURN_BUCKETS && dt > bound_us[i])
		i++;
	b->counters.loop_turns[i]++;
	b->counters.loop_turn_sum_us += dt;
}

int main(int argc, char **argv)
{
	struct options o = { .config_path = default_config };
	struct daemon d = { 0 };
	struct broker *b = &d.broker;
	struct pool_opts po = { 0 };
	struct config *cfg = NULL;
	struct sigctx sc = { b, &o };
	struct audit *audit = NULL;
	ev_signal sigs[5];
	static const int signums[] = { SIGTERM, SIGINT, SIGHUP, SIGUSR2, SIGUSR1 };
	char *err = NULL;
	char s1[32], s2[32], s3[32], memfd_name[POOL_MEMFD_NAME_MAX];
	uint64_t warm;
	int action = 0, listen_fd, r, rc = 1;

	log_init(LOG_INFO, -1);
	default_config_init();
	r = parse_args(argc, argv, &o, &action);
	if (r < 0) {
		usage(stderr);
		free(o.ov);
		return r == -ENOMEM ? 1 : 2;
	}
	if (action == 'h' || action == 'V' || action == OPT_SAMPLE || action == OPT_DOC || action == OPT_MAN) {
		if (action == 'h')
			usage(stdout);
		else if (action == 'V')
			printf("pinbrokerd %s (protocol %d)%s\n", PINBROKER_VERSION, PB_PROTOCOL_VERSION,
			       DEBUG_HOOKS_NOTE);
		else if (action == OPT_SAMPLE)
			config_write_sample(stdout);
		else if (action == OPT_MAN)
			config_write_man(stdout);
		else
			config_write_markdown(stdout);
		free(o.ov);
		return 0;
	}

	r = load_config(&o, NULL, &cfg, &err);
	if (r < 0 || action == OPT_CHECK) {
		if (r < 0)
			fprintf(stderr, "%s%s", err ? err : strerror(-r),
				err && err[strlen(err) - 1] == '\n' ? "" : "\n");
		else
			printf("configuration OK\n");
		free(err);
		config_free(cfg);
		free(o.ov);
		return r < 0 ? 1 : 0;
	}
	log_init(cfg->log_level, -1);
	signal(SIGPIPE, SIG_IGN);
	rlimits_raise_nofile();
	rlimits_count_start();

	d.cfg = cfg;
	d.config_path = o.config_path;
	d.reload_hooks = &daemon_reload_hooks;
	d.loop = ev_default_loop(EVFLAG_AUTO);
	b->started_ms = now_ms();
	(void)broker_set_pressure(b, BROKER_NORMAL); /* nothing lent or waiting yet: no action to take */
	if (!d.loop)
		fatalx("cannot create the event loop");
	prewarm_init(&daemon_prewarm_hooks);
	ev_set_userdata(d.loop, b);
	ev_set_invoke_pending_cb(d.loop, timed_invoke);

	b->mem_total_bytes = rlimits_memory_base(cfg->proc_root, &b->host_mem_total_bytes);
	if (b->mem_total_bytes == 0)
		fatalx("cannot read MemTotal from %s/proc/meminfo; check --proc-root", cfg->proc_root);
	reload_resolve_sizes(b, cfg);
	if (b->budget_bytes == 0)
		fatalx("the budget resolves to 0 bytes; set budget to a size or a percentage above 0");
	if (action == OPT_RESERVE) {
		r = reserve_hugepages(cfg->proc_root, b->budget_bytes);
		config_free(cfg);
		free(o.ov);
		return r;
	}

	r = budget_new(b->budget_bytes, b->uid_quota_bytes, &b->budget);
	if (r < 0)
		fatalx("cannot set up the budget: %s", strerror(-r));
	r = lease_table_new(&b->leases);
	if (r < 0)
		fatalx("cannot set up the lease table: %s", strerror(-r));
	po.chunk_bytes = cfg->chunk_bytes;
	po.chunk_max_bytes = cfg->chunk_max_bytes;
	/* Test only (tests/integration): a terabyte pool on a small host, nothing faulted or locked. */
	po.simulate = getenv(PB_SIMULATE_ENV) && strcmp(getenv(PB_SIMULATE_ENV), "1") == 0;
	if (po.simulate)
		log_info("%s=1: pool chunks are left unpopulated and unlocked (a test mode, not for use)",
			 PB_SIMULATE_ENV);
	po.hugetlb = cfg->hugetlb == CONFIG_HUGETLB_YES  ? POOL_HUGETLB_YES
		     : cfg->hugetlb == CONFIG_HUGETLB_NO ? POOL_HUGETLB_NO
							 : POOL_HUGETLB_AUTO;
	{
		const char *nerr = NULL;

		if (prewarm_numa_read(b, cfg, &po, &nerr) < 0)
			fatalx("numa-prewarm = %s: %s", cfg->numa_prewarm, nerr);
	}
	po.thp = cfg->thp == CONFIG_THP_YES ? POOL_THP_YES : cfg->thp == CONFIG_THP_NO ? POOL_THP_NO : POOL_THP_AUTO;
	po.threads = cfg->prewarm_threads;
	po.proc_root = cfg->proc_root;
	po.lock = cfg->lock_memory;
	restart_memfd_name(cfg, memfd_name, sizeof(memfd_name));
	po.memfd_name = memfd_name;
	r = pool_new(&po, &d.pool);
	if (r == -ENOTSUP)
		fatalx("hugetlb = yes but the host has no free huge pages; reserve some "
		       "(echo N > /proc/sys/vm/nr_hugepages) or set hugetlb = auto");
	if (r == -EOPNOTSUPP)
		fatalx("thp = yes but this kernel cannot collapse shmem into huge pages (MADV_COLLAPSE needs Linux "
		       "6.1 or later); set thp = auto or no");
	if (r < 0)
		fatalx("cannot set up the pool: %s", strerror(-r));
	prewarm_numa_hooks(b, cfg);
	rlimits_resolve(b);
	r = request_init(b);
	if (r < 0)
		fatalx("cannot set up the request layer: %s", strerror(-r));
	r = audit_new(b, &audit);
	if (r < 0)
		fatalx("cannot set up the pool audit: %s", strerror(-r));

	rlimits_lock_self(cfg);

	r = jobs_watch_start(b);
	if (r < 0)
		fatalx("cannot set up job quotas: %s",
		       r == -EINVAL ? "job-quota does not parse (logged above)" : strerror(-r));
	/* The rules pinctl quota set made before this start, before any client is served. */
	r = quota_store_start(b);
	if (r < 0)
		fatalx("cannot set up the quota rules file: %s", strerror(-r));

	/* Listen first, so clients queue in the backlog while the pool warms. */
	listen_fd = notify_listen_fd();
	if (listen_fd < 0 && listen_fd != -ENOENT)
		log_warnx("socket activation failed (%s); creating the socket myself", strerror(-listen_fd));
	r = server_new(b, listen_fd >= 0 ? listen_fd : -1, &d.server);
	if (r < 0)
		fatalx("cannot listen on %s: %s", cfg->socket_path, strerror(-r));

	/* Adopt pool memory and leases kept in systemd's fd store by our previous life. */
	recovery_init(b);
	/* Then count what live processes still map of a daemon that stopped without the fd store: before
	 * prewarming, so the pool warms only what the budget has left. */
	restart_init(b);

	/*
	 * A start warm-up above prewarm-before-ready runs beside the event loop (warmup.c): the daemon serves as soon
	 * as it listens, from a pool that grows. At or below it the pool is warm before the daemon says it is ready.
	 */
	warm = prewarm_clamp_fds(b, b->prewarm_bytes);
	if (warm > pool_idle_bytes(d.pool) && warm - pool_idle_bytes(d.pool) > cfg->prewarm_before_ready_bytes) {
		r = prewarm_grow_bg(b, warm);
		if (r < 0)
			fatalx("cannot start the pool warm-up: %s", strerror(-r));
		log_info("warming the pool to %s beside the loop (%u threads); serving meanwhile",
			 format_size(warm, s1, sizeof(s1)), pool_threads(d.pool));
	} else if (warm > pool_idle_bytes(d.pool)) {
		uint64_t t0 = now_us();

		r = prewarm_grow(b, warm, progress_cb);
		if (r < 0)
			prewarm_warn_failed(b, warm, r);
		else
			log_info("pool warmed: %s in %.1f ms (%.1f GiB/s, %u threads)",
				 format_size(pool_idle_bytes(d.pool), s1, sizeof(s1)), (double)(now_us() - t0) / 1000.0,
				 (double)pool_idle_bytes(d.pool) / 1073741824.0 / ((double)(now_us() - t0 + 1) / 1e6),
				 pool_threads(d.pool));
	}

	r = monitor_new(d.loop, cfg, react_pressure, b, &d.monitor);
	if (r < 0)
		log_warnx("memory-pressure monitor unavailable (%s): leases will not be refused or revoked under "
			  "pressure",
			  strerror(-r));
	else
		(void)broker_set_pressure(b, monitor_state(d.monitor)); /* its first evaluation reports any change */

	for (size_t i = 0; i < sizeof(signums) / sizeof(signums[0]); i++) {
		ev_signal_init(&sigs[i], signal_cb, signums[i]);
		sigs[i].data = &sc;
		ev_signal_start(d.loop, &sigs[i]);
	}
	/* First written right away, then every metrics-interval-ms (a reload can set the path later). */
	ev_init(&metrics_timer, metrics_cb);
	metrics_timer.data = b;
	metrics_timer.repeat = 0.001;
	ev_timer_again(d.loop, &metrics_timer);

	notify_init(d.loop);
	if (notify_enabled()) {
		ev_timer_init(&status_timer, status_cb, 5., 5.);
		status_timer.data = b;
		ev_timer_start(d.loop, &status_timer);
	}

	log_info("version %s ready on %s: budget %s (uid quota %s), %s warm, %s pages%s, monitor %s", PINBROKER_VERSION,
		 cfg->socket_path, format_size(b->budget_bytes, s1, sizeof(s1)),
		 format_size(b->uid_quota_bytes, s2, sizeof(s2)), format_size(pool_idle_bytes(d.pool), s3, sizeof(s3)),
		 pool_hugetlb(d.pool) ? "2 MiB hugetlb"
		 : pool_thp(d.pool)   ? "THP-collapsed 4 KiB"
				      : "4 KiB",
		 cfg->lock_memory ? "" : " (NOT locked: lock-memory = no)",
		 d.monitor ? monitor_mode(d.monitor) : "off");
	notify_ready();
	update_status(b);

	ev_run(d.loop, 0);

	/* Shutdown, in reverse order of start-up. */
	b->shutting_down = true;
	/* A warm-up still running stops after its batch; the chunks it made and did not hand over go. */
	prewarm_stop_warmup(b);
	notify_stopping();
	{
		Pinbroker__V1__Reply bye = PINBROKER__V1__REPLY__INIT;

		bye.has_seq = true;
		bye.seq = 0;
		bye.status = PINBROKER__V1__STATUS_CODE__STATUS_SHUTTING_DOWN;
		bye.message =
			(char *)"pinbrokerd is stopping; your mappings stay valid and the next daemon counts them "
				"until you unmap them";
		server_broadcast(d.server, &bye);
	}
	/* While the leases still exist: closing the connections below lets them go. */
	restart_save(b);
	notify_fini(d.loop);
	prewarm_fini(b);
	if (notify_enabled())
		ev_timer_stop(d.loop, &status_timer);
	for (size_t i = 0; i < sizeof(signums) / sizeof(signums[0]); i++)
		ev_signal_stop(d.loop, &sigs[i]);
	monitor_free(d.monitor);
	server_free(d.server);
	recovery_fini(b);
	request_fini(b);
	audit_free(audit);
	pool_free(d.pool);
	lease_table_free(b->leases);
	reservations_free(b->reservations);
	b->reservations = NULL;
	backing_table_free(b->backings); /* NULL once the last shared registration went */
	restart_fini(b);
	quota_store_stop(b);
	jobs_watch_stop(b);
	budget_free(b->budget);
	unbrokered_clear(&b->unbrokered);
	config_free(d.cfg);
	free(o.ov);
	log_info("stopped");
	rc = 0;
	return rc;
}

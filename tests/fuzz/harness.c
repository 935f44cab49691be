/* SPDX-License-Identifier: MIT */
/*
 * The fuzz harnesses' core: one broker built in memory with real modules for the whole process, reset between
 * inputs, connections over socketpairs, and the ops both harnesses share. The checks are harness-check.c's.
 */
#define _GNU_SOURCE
#include "harness-int.h"

#include <dirent.h>
#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backing.h"
#include "connfix.h"
#include "budget.h"
#include "config.h"
#include "daemon.h"
#include "jobs.h"
#include "lease.h"
#include "log.h"
#include "pool.h"
#include "react.h"
#include "reload.h"
#include "request.h"
#include "util.h"
#include "waitq.h"
#include "wire.h"

#define FZ_MEM_TOTAL_BYTES (64ull << 20) /* a pretend host: percentages in SET budget resolve against it */
/*
 * The many-leases profiles hold up to budget / 4 KiB leases, each at least
 * one chunk memfd in this process: 16384 of them need that many fds and more.
 */
#define FZ_MANY_LEASES_MAX 16384u
#define FZ_FD_HEADROOM 1024u

/* Drain replies this often in bulk ops: the socket buffer holds a few hundred small packets. */
#define FZ_BULK_DRAIN_EVERY 32u

/* Connections carry this child's pid, so revoke-enforce signals and pidfd ghosts hit it, never us. */
static pid_t victim_pid = -1;

static struct fz the_fz;
static const char *const *harness_overrides;
static char many_budget[64];

/* ------------------------------------------------------------------ basics */

void fz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s:%d: invariant failed: %s: ", file, line, cond);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	abort();
}

static void victim_ensure(void)
{
	pid_t parent = getpid();
	int st;

	if (victim_pid > 0 && waitpid(victim_pid, &st, WNOHANG) == 0)
		return;
	victim_pid = fork();
	if (victim_pid < 0) {
		perror("fork");
		abort();
	}
	if (victim_pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		/* The harness may have died (an abort at start-up) before the line above: then nothing would kill us. */
		if (getppid() != parent)
			_exit(0);
		for (;;)
			pause();
	}
}

int fz_count_fds(void)
{
	struct stat st;
	struct dirent *e;
	int n = 0;
	DIR *d;

	/*
	 * Since Linux 6.2 the directory's size is its number of entries: one
	 * stat instead of a readdir that builds a dentry per fd (15% of a run
	 * that holds a few hundred pool chunks).
	 */
	if (stat("/proc/self/fd", &st) == 0 && st.st_size > 0)
		return (int)st.st_size;
	d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the directory's own fd */
}

void fz_dump_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;

	while (d && (e = readdir(d))) {
		char path[300], link[300];
		ssize_t n;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		link[n > 0 ? n : 0] = '\0';
		fprintf(stderr, "  fd %s -> %s\n", e->d_name, link);
	}
	if (d)
		closedir(d);
}

/* ------------------------------------------------------------------ config */

/*
 * The most budget this process can back: the daemon and its clients share
 * one fd table here, and every 4 KiB lease is a memfd on the daemon's side
 * plus, while its reply waits in a queue, a dup. An admin SET may ask for
 * more (a real daemon would meet EMFILE); here it is clamped, so that the
 * harness itself never runs out of fds. Per profile, set at start-up.
 */
static uint64_t budget_cap_bytes[2];

static void apply_kv(struct config *cfg, const char *const *kv)
{
	char *err = NULL;

	for (size_t i = 0; kv && kv[i]; i++) {
		char key[64];
		const char *eq = strchr(kv[i], '=');
		int r;

		FZ_ASSERT(eq != NULL, "override %s has no '='", kv[i]);
		snprintf(key, sizeof(key), "%.*s", (int)(eq - kv[i]), kv[i]);
		r = config_set(cfg, key, eq + 1, &err);
		FZ_ASSERT(r == 0, "config_set %s: %s", kv[i], err ? err : "?");
	}
}

/*
 * The config of a profile. Each profile has its own pool (chunk sizes differ)
 * and keeps it canonical at its own prewarm: 512 KiB (32 chunks) for the
 * default profile, 1 MiB (256 chunks, a typical burst) for the others. The default
 * profile's sizes are small on purpose: every fresh chunk costs syscalls, and
 * chunks are what an input costs, not the daemon's logic.
 */
static struct config *profile_config(enum fz_profile profile)
{
	static const char *const base[] = {
		CONNFIX_CONFIG,
		"socket=/nonexistent/fuzz.sock",
		NULL,
	};
	const char *const many[] = {
		many_budget, "uid-quota=100%", "chunk-size=4K", "prewarm=1M", "max-leases-per-client=320", NULL,
	};
	static const char *const huge[] = { "max-leases-per-client=16384", NULL };
	struct config *cfg = NULL;
	char *err = NULL;

	FZ_ASSERT(config_new(&cfg) == 0, "config_new");
	apply_kv(cfg, base);
	apply_kv(cfg, harness_overrides);
	if (profile != FZ_PROFILE_DEFAULT)
		apply_kv(cfg, many);
	if (profile == FZ_PROFILE_HUGE)
		apply_kv(cfg, huge);
	FZ_ASSERT(config_validate(cfg, &err) == 0, "config_validate: %s", err ? err : "?");
	return cfg;
}

/* Switch profiles between inputs (no leases exist): its config, and the pool of its chunk size. */
static void use_config(struct fz *f, enum fz_profile profile)
{
	struct broker *b = &f->d.broker;

	f->profile = profile;
	config_free(daemon_of(b)->cfg);
	daemon_of(b)->cfg = profile_config(profile);
	b->budget_cap_bytes = budget_cap_bytes[profile != FZ_PROFILE_DEFAULT];
	reload_resolve_sizes(b, daemon_of(b)->cfg);
	budget_set_limits(b->budget, b->budget_bytes, b->uid_quota_bytes);
	daemon_of(b)->pool = f->pools[profile != FZ_PROFILE_DEFAULT];
	f->cfg_dirty = false;
	log_level = getenv("FUZZ_LOG") ? LOG_DEBUG : LOG_EMERG;
}

/* reload_apply's hooks here: no monitor, no fd limits to re-derive (the harness's fd table is its own). */
static void config_applied(struct broker *b)
{
	waitq_grant(b);
	/* A SET of log-level must not make the fuzzer log. */
	log_level = getenv("FUZZ_LOG") ? LOG_DEBUG : LOG_EMERG;
	the_fz.cfg_dirty = true;
}

static const struct reload_hooks fz_reload_hooks = { .applied = config_applied };

/* ------------------------------------------------------------------ connection I/O */

/*
 * The harness's own conn_io (conn.h): the real server's, with every packet the request
 * modules send counted (struct fz's packets_sent), so a test can tell "answered" from "silent".
 */
static struct conn_io fz_conn_io;

static int fz_send(struct conn *c, const Pinbroker__V1__Reply *reply, const int *fds, size_t nfds)
{
	the_fz.packets_sent++;
	return server_conn_io.send(c, reply, fds, nfds);
}

/* ------------------------------------------------------------------ set-up and reset */

/* The pool every input starts with: exactly prewarm bytes idle, as a daemon has after start-up. */
static void pool_canonical(struct fz *f)
{
	struct broker *b = &f->d.broker;

	pool_shrink(daemon_of(b)->pool, b->prewarm_bytes);
	if (pool_idle_bytes(daemon_of(b)->pool) < b->prewarm_bytes)
		FZ_ASSERT(pool_grow(daemon_of(b)->pool, b->prewarm_bytes, NULL, NULL) == 0, "pool_grow to %llu",
			  (unsigned long long)b->prewarm_bytes);
	FZ_ASSERT(pool_idle_bytes(daemon_of(b)->pool) == b->prewarm_bytes, "pool holds %llu idle, not %llu",
		  (unsigned long long)pool_idle_bytes(daemon_of(b)->pool), (unsigned long long)b->prewarm_bytes);
}

/* The per-input parts: a lease table (ids from 1 again), the revoker and a server with no connections. */
static void parts_new(struct fz *f)
{
	struct broker *b = &f->d.broker;
	int lfd;

	FZ_ASSERT(lease_table_new(&b->leases) == 0, "lease_table_new");
	FZ_ASSERT(request_init(b) == 0, "request_init");
	/*
	 * A listening socket nobody connects to: the harness attaches connections
	 * itself. Bound (to an autobound abstract name) and listening, so that
	 * epoll does not report it ready and every loop run does not fail an accept.
	 */
	lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	FZ_ASSERT(lfd >= 0, "socket");
	FZ_ASSERT(bind(lfd, (struct sockaddr *)&(struct sockaddr_un){ .sun_family = AF_UNIX }, sizeof(sa_family_t)) ==
				  0 &&
			  listen(lfd, 1) == 0,
		  "listen: %s", strerror(errno));
	FZ_ASSERT(server_new(b, lfd, &daemon_of(b)->server) == 0, "server_new");
	/* The server's own conn_io with only send wrapped (counted), in place of the one server_new installed. */
	fz_conn_io = server_conn_io;
	fz_conn_io.send = fz_send;
	daemon_of(b)->conn_io = &fz_conn_io;
}

void fz_global_init(const char *const *overrides)
{
	struct fz *f = &the_fz;
	struct broker *b = &f->d.broker;
	struct rlimit rl;
	uint64_t fds = FZ_MANY_LEASES_MAX;

	signal(SIGPIPE, SIG_IGN);
	log_init(getenv("FUZZ_LOG") ? LOG_DEBUG : LOG_EMERG, 0);
	harness_overrides = overrides;
	/* Every live 4 KiB lease is a memfd here; take all the fds the hard limit allows. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		fds = rl.rlim_cur > 2 * FZ_FD_HEADROOM ? rl.rlim_cur - 2 * FZ_FD_HEADROOM : FZ_FD_HEADROOM;
	/*
	 * The many-leases profile drains after every op (fz_after_op), so one fd
	 * per lease; the default profile may leave every reply queued, so two.
	 */
	budget_cap_bytes[1] = (fds < FZ_MANY_LEASES_MAX ? fds : FZ_MANY_LEASES_MAX) * (uint64_t)FZ_PAGE_BYTES;
	budget_cap_bytes[0] = (fds / 2 < FZ_MANY_LEASES_MAX ? fds / 2 : FZ_MANY_LEASES_MAX) * (uint64_t)FZ_PAGE_BYTES;
	snprintf(many_budget, sizeof(many_budget), "budget=%lluK", (unsigned long long)(budget_cap_bytes[1] / 1024));
	victim_ensure();

	memset(f, 0, sizeof(*f));
	/* The default loop lives for the whole process (epoll fd, wake-up eventfd). */
	daemon_of(b)->loop = ev_default_loop(EVFLAG_AUTO);
	fz_check_seams(daemon_of(b)->loop);
	daemon_of(b)->reload_hooks = &fz_reload_hooks;
	b->started_ms = now_ms();
	(void)broker_set_pressure(b, BROKER_NORMAL); /* nothing lent or waiting yet */
	b->mem_total_bytes = FZ_MEM_TOTAL_BYTES;
	FZ_ASSERT(budget_new(0, 0, &b->budget) == 0, "budget_new");
	/* Job quotas on, so QUOTA_SET and QUOTA_LIST reach their handlers (rules start empty each input). */
	FZ_ASSERT(jobs_new(&b->jobs) == 0, "jobs_new");
	/* Each pool made canonical under its own profile; the default profile last, as inputs expect none. */
	for (int k = 1; k >= 0; k--) {
		struct config *cfg = profile_config(k ? FZ_PROFILE_MANY : FZ_PROFILE_DEFAULT);
		struct pool_opts po = {
			.chunk_bytes = cfg->chunk_bytes,
			.hugetlb = POOL_HUGETLB_NO,
			.threads = 1,
			.lock = false,
		};

		FZ_ASSERT(pool_new(&po, &f->pools[k]) == 0, "pool_new");
		config_free(cfg);
		use_config(f, k ? FZ_PROFILE_MANY : FZ_PROFILE_DEFAULT);
		pool_canonical(f);
	}
	for (int i = 0; i < FZ_CONNS; i++) {
		f->peer[i] = -1;
		f->ids[i] = malloc(FZ_IDS_MAX * sizeof(*f->ids[i]));
		FZ_ASSERT(f->ids[i] != NULL, "ids");
	}
	parts_new(f);
}

struct fz *fz_begin(unsigned flags)
{
	struct fz *f = &the_fz;
	enum fz_profile profile = FZ_PROFILE_DEFAULT;

	if (flags & FZ_FLAG_MANY)
		profile = (flags & 0xf8) == FZ_FLAGS_HUGE_MAGIC ? FZ_PROFILE_HUGE : FZ_PROFILE_MANY;

	victim_ensure();
	if (profile != f->profile)
		use_config(f, profile);
	for (int i = 0; i < FZ_CONNS; i++) {
		f->uid[i] = (flags >> i) & 1 ? 0 : 1000 + (uid_t)i;
		f->nids[i] = 0;
	}
	f->seq = 0;
	f->peak_leases = 0;
	f->prev_waiting = 0;
	/* Tokens and the taint model are per input: every lease is freed, and with it every tainted chunk, at its end. */
	f->ntaint = 0;
	memset(f->has_token, 0, sizeof(f->has_token));
	/* Counted per input: libFuzzer's symbolizer opens pipes between inputs. */
	f->baseline_fds = fz_count_fds();
	return f;
}

/* ------------------------------------------------------------------ connections */

/*
 * The cgroup each connection is charged to (no /proc here: the harness has no jobs_watch). Two
 * share a job under the "/fz/job_1" rule the quota tests set, so cross-job visibility and a job's
 * sum are both fuzzed.
 */
static const char *const fz_cgroups[FZ_CONNS] = { "/fz/job_1/step_0", "/fz/job_2/step_0" };

bool fz_conn_alive(struct fz *f, int i)
{
	return connfix_alive(&f->d, &f->conn[i], f->conn_id[i]);
}

struct conn *fz_conn(struct fz *f, int i)
{
	struct ucred cred = { .pid = victim_pid, .uid = f->uid[i], .gid = f->uid[i] };
	const char *failed;

	if (fz_conn_alive(f, i) && f->peer[i] >= 0)
		return f->conn[i];
	f->nids[i] = 0;
	failed = connfix_open(&f->d, &cred, fz_cgroups[i % FZ_CONNS], "fuzz: replaced", &f->conn[i], &f->peer[i]);
	FZ_ASSERT(failed == NULL, "%s: %s", failed, strerror(errno));
	f->conn_id[i] = f->conn[i]->id;
	return f->conn[i];
}

void fz_close_peer(struct fz *f, int i)
{
	if (f->peer[i] >= 0)
		close(f->peer[i]);
	f->peer[i] = -1;
}

void fz_run_loop(struct fz *f)
{
	ev_now_update(f->d.loop);
	ev_run(f->d.loop, EVRUN_NOWAIT);
}

void fz_reap(struct fz *f)
{
	server_reap(f->d.server);
}

static void remember_id(struct fz *f, int i, uint64_t id)
{
	/* A lease's later fd batches repeat its id. */
	if (f->nids[i] > 0 && f->ids[i][f->nids[i] - 1] == id)
		return;
	if (f->nids[i] < FZ_IDS_MAX)
		f->ids[i][f->nids[i]++] = id;
}

void fz_drain_one(struct fz *f, int i)
{
	static uint8_t buf[PB_MAX_MSG_BYTES + 1];

	for (int k = 0; f->peer[i] >= 0 && k < 4096; k++) {
		int fds[PB_MAX_FDS_PER_MSG];
		size_t nfds = 0;
		ssize_t n = wire_recv(f->peer[i], buf, sizeof(buf), fds, PB_MAX_FDS_PER_MSG, &nfds);
		Pinbroker__V1__Reply *rep;

		if (n == -EAGAIN || n == 0 || n == -ECONNRESET)
			break;
		FZ_ASSERT(n > 0, "daemon sent a packet the client cannot receive: %s (%d fds open)", strerror((int)-n),
			  fz_count_fds());
		rep = pinbroker__v1__reply__unpack(NULL, (size_t)n, buf);
		FZ_ASSERT(rep != NULL, "daemon sent a reply that does not decode (%zd bytes)", n);
		/* A client hands the token on: the share ops attach with it (no input could guess 128 bits). */
		if (rep->body_case == PINBROKER__V1__REPLY__BODY_SHARE &&
		    rep->status == PINBROKER__V1__STATUS_CODE__STATUS_OK) {
			FZ_ASSERT(rep->share->token && strlen(rep->share->token) == 32, "share token %s",
				  rep->share->token ? rep->share->token : "(none)");
			memcpy(f->token[i], rep->share->token, 33);
			f->has_token[i] = true;
			f->token_lease[i] = f->share_asked[i];
		}
		if (rep->body_case == PINBROKER__V1__REPLY__BODY_LEASE) {
			FZ_ASSERT(rep->lease->fds_in_reply == nfds, "lease reply says %u fds, %zu came",
				  rep->lease->fds_in_reply, nfds);
			if (rep->status == PINBROKER__V1__STATUS_CODE__STATUS_OK)
				remember_id(f, i, rep->lease->lease_id);
		}
		for (size_t j = 0; j < nfds; j++) {
			/* What a client would do: the chunk must be a sealed memfd of the stated size. */
			FZ_ASSERT(fcntl(fds[j], F_GET_SEALS) >= 0, "reply fd %d is not a memfd", fds[j]);
		}
		wire_close_fds(fds, nfds);
		pinbroker__v1__reply__free_unpacked(rep, NULL);
	}
}

void fz_drain(struct fz *f)
{
	for (int i = 0; i < FZ_CONNS; i++)
		fz_drain_one(f, i);
}

void fz_after_op(struct fz *f)
{
	/*
	 * In the many-leases profile the peers read after every op: a reply
	 * nobody reads keeps a dup of each of its chunk fds queued, and with
	 * 16384 leases those dups would run this process (daemon and clients
	 * both) out of fds. Slow readers are the default profile's business.
	 */
	if (f->profile != FZ_PROFILE_DEFAULT)
		fz_drain(f);
	if (lease_count(f->d.broker.leases) > f->peak_leases)
		f->peak_leases = lease_count(f->d.broker.leases);
	fz_check(f);
}

void fz_set_state(struct fz *f, enum broker_state to)
{
	enum broker_state from = f->d.broker.state;

	if (from != to)
		react_pressure(&f->d.broker, from, to, "fuzz");
}

/* Back to the canonical state: nothing held, nothing connected, accounting at zero. */
static void fz_reset(struct fz *f)
{
	struct broker *b = &f->d.broker;
	struct lease *l, *next;

	fz_check(f);
	fz_check_order(f);
	for (int i = 0; i < FZ_CONNS; i++) {
		fz_close_peer(f, i);
		f->conn[i] = NULL;
	}
	b->shutting_down = true;
	server_free(daemon_of(b)->server);
	daemon_of(b)->server = NULL;
	/* Overdue leases of closed connections wait for their (victim) process; drop them as shutdown would. */
	for (l = lease_first(b->leases); l; l = next) {
		next = lease_next(b->leases, l);
		FZ_ASSERT(l->owner == NULL, "lease %llu still owned after every connection closed",
			  (unsigned long long)l->id);
		daemon_free_lease(b, l);
	}
	request_fini(b);
	FZ_ASSERT(lease_count(b->leases) == 0, "%zu leases left after reset", lease_count(b->leases));
	for (int s = 0; s < LEASE__STATE_MAX; s++)
		FZ_ASSERT(lease_state_count(b->leases, s) == 0 && lease_state_bytes(b->leases, s) == 0,
			  "state %s still counts leases after reset", lease_state_name(s));
	FZ_ASSERT(budget_leased(b->budget) == 0, "%llu bytes still leased after reset",
		  (unsigned long long)budget_leased(b->budget));
	FZ_ASSERT(pool_resident_bytes(daemon_of(b)->pool) == pool_idle_bytes(daemon_of(b)->pool),
		  "pool lent chunks nobody holds");
	FZ_ASSERT(b->backings == NULL, "shared registrations' file ranges outlive their leases");
	lease_table_free(b->leases);
	b->leases = NULL;
	/* Every connection and lease put its cgroup back: only rule-made jobs may be left, with nothing charged. */
	for (const struct job *jb = jobs_first(b->jobs); jb; jb = jb->next)
		FZ_ASSERT(jb->ncgroups == 0 && jb->bytes == 0 && jb->leases == 0 && jb->rule,
			  "job %s still holds %u cgroups, %llu bytes after reset", jb->key, jb->ncgroups,
			  (unsigned long long)jb->bytes);
	jobs_free(b->jobs);
	FZ_ASSERT(jobs_new(&b->jobs) == 0, "jobs_new");
	b->shutting_down = false;
	(void)broker_set_pressure(b, BROKER_NORMAL); /* the revoker and wait queue are gone: nothing to react */
	if (f->cfg_dirty)
		use_config(f, f->profile);
	pool_canonical(f);
	parts_new(f);
}

void fz_end(struct fz *f)
{
	int nfds;

	fz_run_loop(f);
	fz_drain(f);
	fz_reap(f);
	/* FUZZ_PEAK=1: how many leases this input held at once (run-ci.sh shows the slow seeds' numbers). */
	if (getenv("FUZZ_PEAK"))
		fprintf(stderr, "fuzz: input held at most %zu live leases\n", f->peak_leases);
	fz_reset(f);
	nfds = fz_count_fds();
	if (nfds != f->baseline_fds)
		fz_dump_fds();
	FZ_ASSERT(nfds == f->baseline_fds, "fd leak: %d open, %d at start", nfds, f->baseline_fds);
}

/* ------------------------------------------------------------------ ops */

bool fz_common_op(struct fz *f, uint8_t op, int i)
{
	switch (op & 7) {
	case 4:
		fz_drain(f);
		return true;
	case 5:
		fz_set_state(f, (enum broker_state)((op >> 3) % 3));
		return true;
	case 6:
		/* 3 ms: past acquire-timeout-ms and revoke-deadline-ms (2 ms). */
		if (op & 8)
			fz_advance_clock(3);
		fz_run_loop(f);
		return true;
	case 7:
		fz_close_peer(f, i);
		return true;
	default:
		return false;
	}
}

static uint8_t take_byte(const uint8_t **p, const uint8_t *end)
{
	return *p < end ? *(*p)++ : 0;
}

static void inject_request(struct fz *f, int i, Pinbroker__V1__Request *req, fz_inject_fn inject)
{
	uint8_t buf[256];
	size_t len;

	req->has_seq = true;
	req->seq = ++f->seq;
	len = pinbroker__v1__request__get_packed_size(req);
	FZ_ASSERT(len <= sizeof(buf), "bulk request of %zu bytes", len);
	pinbroker__v1__request__pack(req, buf);
	inject(f, i, buf, len);
}

static void bulk_acquire(struct fz *f, int i, const uint8_t **p, const uint8_t *end, fz_inject_fn inject)
{
	uint8_t cb = take_byte(p, end), sb = take_byte(p, end);
	/* Thousands only by a rare escape: each lease costs a memfd, and a slow input costs throughput. */
	size_t n = cb == 0xff ? ((size_t)(take_byte(p, end) & 15) + 1) * 1024 : (size_t)cb + 1;
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Acquire a = PINBROKER__V1__ACQUIRE__INIT;

	/*
	 * One page, so that in the many-leases pool (4 KiB chunks) a burst lease
	 * is one warm chunk: fresh chunks are what bursts cost. Other sizes are
	 * what ACQUIRE packets are for.
	 */
	a.size = (uint64_t)((sb >> 4) == 0xf ? 4 : 1) * FZ_PAGE_BYTES;
	a.has_priority = (sb & 3) != 3;
	a.priority = a.has_priority ? (Pinbroker__V1__Priority)(sb & 3) : 0;
	a.label = (char *)"burst";
	req.body_case = PINBROKER__V1__REQUEST__BODY_ACQUIRE;
	req.acquire = &a;
	for (size_t k = 0; k < n; k++) {
		uint32_t before = fz_conn(f, i)->nleases;

		inject_request(f, i, &req, inject);
		/*
		 * Refused (a limit, the budget, pressure, no HELLO) or closed: the
		 * rest of the burst would be the same refusal thousands of times.
		 */
		if (!fz_conn_alive(f, i) || f->conn[i]->nleases == before)
			break;
		if (k % FZ_BULK_DRAIN_EVERY == FZ_BULK_DRAIN_EVERY - 1)
			fz_drain_one(f, i);
	}
	fz_drain_one(f, i);
}

/* One request naming lease id: kind 0 RELEASE, 1 SET_IDLE, 2 REVOKE_ACK, 3 admin REVOKE. */
static void id_request(struct fz *f, int i, unsigned kind, uint64_t id, fz_inject_fn inject)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Release rel = PINBROKER__V1__RELEASE__INIT;
	Pinbroker__V1__SetIdle si = PINBROKER__V1__SET_IDLE__INIT;
	Pinbroker__V1__RevokeAck ra = PINBROKER__V1__REVOKE_ACK__INIT;
	Pinbroker__V1__AdminRevoke ar = PINBROKER__V1__ADMIN_REVOKE__INIT;

	switch (kind & 3) {
	case 0:
		rel.lease_id = id;
		req.body_case = PINBROKER__V1__REQUEST__BODY_RELEASE;
		req.release = &rel;
		break;
	case 1:
		si.lease_id = id;
		si.idle = true;
		req.body_case = PINBROKER__V1__REQUEST__BODY_SET_IDLE;
		req.set_idle = &si;
		break;
	case 2:
		ra.lease_id = id;
		req.body_case = PINBROKER__V1__REQUEST__BODY_REVOKE_ACK;
		req.revoke_ack = &ra;
		break;
	default:
		ar.has_lease_id = true;
		ar.lease_id = id;
		req.body_case = PINBROKER__V1__REQUEST__BODY_ADMIN_REVOKE;
		req.admin_revoke = &ar;
		break;
	}
	inject_request(f, i, &req, inject);
}

static void bulk_sweep(struct fz *f, uint8_t op, int i, const uint8_t **p, const uint8_t *end, fz_inject_fn inject)
{
	uint64_t base = take_byte(p, end);
	size_t n;

	base |= (uint64_t)take_byte(p, end) << 8;
	n = (size_t)take_byte(p, end) + 1;
	for (size_t k = 0; k < n; k++) {
		id_request(f, i, op >> 6, base + k, inject);
		/* Closed (no HELLO, a failed send): a client stops there too. */
		if (!fz_conn_alive(f, i))
			break;
		if (k % FZ_BULK_DRAIN_EVERY == FZ_BULK_DRAIN_EVERY - 1)
			fz_drain_one(f, i);
	}
	fz_drain_one(f, i);
}

static void bulk_release_seen(struct fz *f, uint8_t op, int i, fz_inject_fn inject)
{
	unsigned how = op >> 6;
	size_t n = f->nids[i], sent = 0;
	/* Copied: replies drained meanwhile append to the list, and a replaced connection empties it. */
	uint64_t *ids = malloc((n ? n : 1) * sizeof(*ids));

	FZ_ASSERT(ids != NULL, "ids");
	memcpy(ids, f->ids[i], n * sizeof(*ids));
	for (size_t k = 0; k < n; k++) {
		uint64_t id = how == 1 ? ids[n - 1 - k] : ids[k];

		if (how == 2 && k % 2)
			continue;
		id_request(f, i, how == 3 ? 1 : 0, id, inject);
		if (!fz_conn_alive(f, i))
			break;
		if (++sent % FZ_BULK_DRAIN_EVERY == 0)
			fz_drain_one(f, i);
	}
	free(ids);
	fz_drain_one(f, i);
}

/* SHARE the (k % n)-th lease connection i saw, with the other connection's uid (none with k & 0x80). */
static void share_lease(struct fz *f, int i, uint8_t k, fz_inject_fn inject)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Share sh = PINBROKER__V1__SHARE__INIT;
	uint32_t other = f->uid[1 - i];

	if (f->nids[i] == 0)
		return;
	sh.lease_id = f->ids[i][k % f->nids[i]];
	if (!(k & 0x80)) {
		sh.n_uids = 1;
		sh.uids = &other;
	}
	req.body_case = PINBROKER__V1__REQUEST__BODY_SHARE;
	req.share = &sh;
	f->share_asked[i] = sh.lease_id;
	inject_request(f, i, &req, inject);
	fz_run_loop(f);
	fz_drain_one(f, i);
}

/* ATTACH on connection i with a token connection src got (a forged one with k & 2). */
static void attach_lease(struct fz *f, int i, uint8_t k, fz_inject_fn inject)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Attach at = PINBROKER__V1__ATTACH__INIT;
	int src = k & 1 ? i : 1 - i;
	bool forged = k & 2, was;
	struct lease *l;
	char tok[33];

	if (!f->has_token[src])
		return;
	memcpy(tok, f->token[src], sizeof(tok));
	if (forged) {
		size_t at_ = (size_t)(k >> 2) % 32;

		tok[at_] = tok[at_] == '0' ? '1' : '0';
	}
	l = lease_find(f->d.broker.leases, f->token_lease[src]);
	was = l && fz_conn_alive(f, i) && lease_attacher_find(l, f->conn[i]);
	at.token = tok;
	req.body_case = PINBROKER__V1__REQUEST__BODY_ATTACH;
	req.attach = &at;
	inject_request(f, i, &req, inject);
	l = lease_find(f->d.broker.leases, f->token_lease[src]);
	if (!was && l && fz_conn_alive(f, i) && lease_attacher_find(l, f->conn[i])) {
		FZ_ASSERT(!forged, "a forged token attached connection %d to lease %llu", i, (unsigned long long)l->id);
		/* Its fds went to this uid: the model, not the daemon's word, says which chunks may never come back. */
		if (f->uid[i] != l->uid)
			fz_taint_model_add(f, l);
	}
	fz_run_loop(f);
	fz_drain_one(f, i);
}

static void release_id(struct fz *f, int i, uint64_t id, fz_inject_fn inject)
{
	id_request(f, i, 0, id, inject);
}

/*
 * Issue 22's sequence: the attacher lets go, then (k & 0x80) the holder, then (k & 0x40) the holder
 * asks for the same size again, which the checks see getting no chunk the attacher's uid mapped.
 */
static void let_go(struct fz *f, int i, uint8_t k, fz_inject_fn inject)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Acquire a = PINBROKER__V1__ACQUIRE__INIT;
	struct lease *l = NULL;
	size_t n = 0, pick;
	int holder = -1;
	uint64_t id = 0;

	if (!fz_conn_alive(f, i))
		return;
	for (size_t j = 0; j < f->nids[i]; j++) {
		struct lease *c = lease_find(f->d.broker.leases, f->ids[i][j]);

		n += c && lease_attacher_find(c, f->conn[i]) ? 1 : 0;
	}
	if (n == 0)
		return;
	pick = k % n;
	for (size_t j = 0; j < f->nids[i] && !l; j++) {
		struct lease *c = lease_find(f->d.broker.leases, f->ids[i][j]);

		if (c && lease_attacher_find(c, f->conn[i]) && pick-- == 0)
			l = c;
	}
	id = l->id;
	a.size = l->bytes;
	for (int j = 0; j < FZ_CONNS; j++)
		if (fz_conn_alive(f, j) && l->owner == f->conn[j])
			holder = j;
	release_id(f, i, id, inject);
	if ((k & 0x80) && holder >= 0)
		release_id(f, holder, id, inject);
	if ((k & 0x40) && holder >= 0) {
		a.label = (char *)"again";
		req.body_case = PINBROKER__V1__REQUEST__BODY_ACQUIRE;
		req.acquire = &a;
		inject_request(f, holder, &req, inject);
	}
	fz_run_loop(f);
	fz_drain(f);
}

void fz_bulk_op(struct fz *f, uint8_t op, int i, const uint8_t **p, const uint8_t *end, fz_inject_fn inject)
{
	switch ((op >> 4) & 3) {
	case 0:
		bulk_acquire(f, i, p, end, inject);
		break;
	case 1:
		bulk_sweep(f, op, i, p, end, inject);
		break;
	case 2:
		bulk_release_seen(f, op, i, inject);
		break;
	default:
		switch (op >> 6) {
		case 0:
			fz_advance_clock((uint64_t)take_byte(p, end) * 10);
			fz_run_loop(f);
			break;
		case 1:
			share_lease(f, i, take_byte(p, end), inject);
			break;
		case 2:
			attach_lease(f, i, take_byte(p, end), inject);
			break;
		default:
			let_go(f, i, take_byte(p, end), inject);
			break;
		}
		break;
	}
}

int fz_run_input(const uint8_t *data, size_t size, fz_own_op_fn own, fz_inject_fn inject)
{
	const uint8_t *p = data, *end = data + size;
	struct fz *f;

	if (size < 1)
		return 0;
	f = fz_begin(data[0]);
	p++;
	while (p < end) {
		uint8_t op = *p++;
		int i = (op >> 3) & 1;

		if ((op & 7) < 3)
			own(f, op, i, &p, end);
		else if ((op & 7) == 3)
			fz_bulk_op(f, op, i, &p, end, inject);
		else
			fz_common_op(f, op, i);
		fz_after_op(f);
	}
	fz_end(f);
	return 0;
}

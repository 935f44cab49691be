/* SPDX-License-Identifier: MIT */
/* Shared fuzz harness core: one broker built in memory with real modules for the whole process, reset between inputs, connections over socketpairs, and accounting checks. */
#define _GNU_SOURCE
#include "harness.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backing.h"
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
#define FZ_PAGE_BYTES 4096u
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

/* ------------------------------------------------------------------ clock */

/*
 * The daemon's timers (libev) and deadlines (now_ms) read CLOCK_MONOTONIC.
 * This process sees a monotonic clock that stands still except when an input
 * moves it on: timers fire exactly where the input says, whatever the speed
 * of the machine, and no input sleeps. Other clocks (libFuzzer's timing) are
 * real. Symbol interposition: libev calls clock_gettime through the PLT.
 */
static int (*real_clock_gettime)(clockid_t, struct timespec *);
static uint64_t virtual_mono_ns = 1000000000ull; /* 1 s: well clear of 0, which some code reads as "never" */

int clock_gettime(clockid_t id, struct timespec *ts)
{
	if (id == CLOCK_MONOTONIC) {
		ts->tv_sec = (time_t)(virtual_mono_ns / 1000000000ull);
		ts->tv_nsec = (long)(virtual_mono_ns % 1000000000ull);
		return 0;
	}
	if (!real_clock_gettime)
		real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
	if (real_clock_gettime)
		return real_clock_gettime(id, ts);
	return (int)syscall(SYS_clock_gettime, id, ts);
}

void fz_advance_clock(uint64_t ms)
{
	virtual_mono_ns += ms * 1000000ull;
}

/* ------------------------------------------------------------------ memory */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/*
 * The pool pre-faults every chunk it makes (MADV_POPULATE_WRITE): on a real
 * host that is the point, here it is what an input costs most (zeroing and
 * later freeing pages nobody reads: a third of the run before this). The fuzz
 * target is the daemon's logic, not the kernel's page cache, so pre-faulting
 * succeeds without touching a page, as lock-memory=no already skips mlock.
 * Other advice goes to the kernel.
 */
int madvise(void *addr, size_t len, int advice)
{
	/* MADV_HUGEPAGE only asks for huge pages of pages that will never be touched here. */
	if (advice == MADV_POPULATE_WRITE || advice == MADV_HUGEPAGE)
		return 0;
	return (int)syscall(SYS_madvise, addr, len, advice);
}

/*
 * The other half of that model: a chunk whose pre-fault was skipped has no blocks, which the pool's
 * punch check (st_blocks below the size, pool.h) would read as a holder's hole and destroy the chunk
 * on its return. Every returned chunk was then destroyed and no input ever had a chunk lent twice,
 * the path where one uid's pages could reach another. So a sealed memfd reads as whole, as it does
 * in a daemon that pre-faulted it (no peer here punches holes in a chunk).
 */
#define FZ_CHUNK_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
static int (*real_fstat)(int, struct stat *);

int fstat(int fd, struct stat *st)
{
	int seals, r;

	if (!real_fstat)
		real_fstat = (int (*)(int, struct stat *))dlsym(RTLD_NEXT, "fstat");
	r = real_fstat ? real_fstat(fd, st) : (int)syscall(SYS_fstat, fd, st);
	if (r == 0 && S_ISREG(st->st_mode) && (uint64_t)st->st_blocks * 512u < (uint64_t)st->st_size &&
	    (seals = fcntl(fd, F_GET_SEALS)) >= 0 && (seals & FZ_CHUNK_SEALS) == FZ_CHUNK_SEALS)
		st->st_blocks = (blkcnt_t)((st->st_size + 511) / 512);
	return r;
}

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
		"budget=2M",
		"uid-quota=1536K",
		"prewarm=512K",
		"chunk-size=16K",
		"hugetlb=no",
		"lock-memory=no",
		"pool-shrink-delay-ms=0",
		"acquire-timeout-ms=2",
		"revoke-deadline-ms=2",
		"revoke-enforce=disconnect",
		"max-leases-per-client=16",
		"max-pending-acquires=4",
		"log-level=err",
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
	struct conn *c;

	if (!f->conn[i])
		return false;
	/* Found by id first: a conn that is gone may already be freed. */
	c = server_find_conn(f->d.server, f->conn_id[i]);
	if (!c || c->closing)
		f->conn[i] = NULL;
	return f->conn[i] != NULL;
}

struct conn *fz_conn(struct fz *f, int i)
{
	struct ucred cred = { .pid = victim_pid, .uid = f->uid[i], .gid = f->uid[i] };
	int sv[2];

	if (fz_conn_alive(f, i) && f->peer[i] >= 0)
		return f->conn[i];
	if (f->conn[i])
		server_close(f->conn[i], "fuzz: replaced");
	f->conn[i] = NULL;
	if (f->peer[i] >= 0)
		close(f->peer[i]);
	f->peer[i] = -1;
	f->nids[i] = 0;
	FZ_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0, "socketpair: %s",
		  strerror(errno));
	f->peer[i] = sv[0];
	FZ_ASSERT(server_adopt(f->d.server, sv[1], &cred, &f->conn[i]) == 0, "server_adopt");
	if (!f->conn[i]->cgroup && f->d.broker.jobs) {
		FZ_ASSERT(jobs_cgroup_get(f->d.broker.jobs, fz_cgroups[i % FZ_CONNS], &f->conn[i]->cgroup) == 0,
			  "jobs_cgroup_get");
		/* Its job is known now: job-unknown must not refuse it. */
		f->d.broker.job_unknown_clients -= f->conn[i]->job_unknown;
		f->conn[i]->job_unknown = false;
	}
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

/* Free the connections closed so far, as the daemon's ev_check watcher does after each callback. */
static void fz_reap(struct fz *f)
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

/* ------------------------------------------------------------------ checks */

/* Index of the listed, open connection c, or -1; a short list (a few per input). */
static int conn_index(struct conn *const *conns, size_t n, const void *c)
{
	for (size_t k = 0; k < n; k++)
		if (conns[k] == c)
			return (int)k;
	return -1;
}

#define FZ_CHECK_CONNS 64
/* Uids the per-uid books are checked for: the two connections' (both may be 0). */
#define FZ_CHECK_UIDS FZ_CONNS

static int taint_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct fz_taint *)a)->chunk_id, y = ((const struct fz_taint *)b)->chunk_id;

	return x < y ? -1 : x > y;
}

/* The model's entry for chunk id, or NULL. */
static const struct fz_taint *taint_find(const struct fz *f, uint64_t chunk_id)
{
	struct fz_taint key = { .chunk_id = chunk_id };

	return f->ntaint ? bsearch(&key, f->taint, f->ntaint, sizeof(key), taint_cmp) : NULL;
}

/* Lease l's chunk fds went to another uid: none of its chunks may be pooled or lent elsewhere again. */
static void taint_model_add(struct fz *f, const struct lease *l)
{
	for (size_t k = 0; k < l->nchunks; k++) {
		if (taint_find(f, l->chunks[k].id))
			continue;
		if (f->ntaint == f->taint_cap) {
			size_t cap = f->taint_cap ? 2 * f->taint_cap : 256;
			struct fz_taint *v = realloc(f->taint, cap * sizeof(*v));

			FZ_ASSERT(v != NULL, "taint model of %zu chunks", cap);
			f->taint = v;
			f->taint_cap = cap;
		}
		f->taint[f->ntaint++] = (struct fz_taint){ l->chunks[k].id, l->id };
		qsort(f->taint, f->ntaint, sizeof(*f->taint), taint_cmp);
	}
}

struct idle_walk {
	const struct fz *f;
	uint64_t bytes;
	size_t n;
};

static void check_idle_chunk(const struct chunk *c, void *ud)
{
	struct idle_walk *w = ud;
	const struct fz_taint *t = taint_find(w->f, c->id);

	FZ_ASSERT(!c->tainted, "idle chunk %llu is tainted: another uid mapped it", (unsigned long long)c->id);
	FZ_ASSERT(t == NULL, "chunk %llu went to another uid in lease %llu and is back in the pool",
		  (unsigned long long)c->id, (unsigned long long)(t ? t->lease_id : 0));
	w->bytes += c->bytes;
	w->n++;
}

void fz_check(struct fz *f)
{
	struct broker *b = &f->d.broker;
	struct conn *conns[FZ_CHECK_CONNS];
	uint32_t held[FZ_CHECK_CONNS] = { 0 };
	size_t nconns = 0, nleases = 0, state_count[LEASE__STATE_MAX] = { 0 };
	uint64_t sum = 0, pending_conn = 0, state_bytes[LEASE__STATE_MAX] = { 0 }, prev_id = 0;
	uint64_t registered = 0, no_revoke = 0, unbrokered = 0, job_sum = 0;
	uint64_t rings = 0, ring_bytes = 0, staged_h2d = 0, staged_d2h = 0, conn_ring_bytes = 0;
	uint64_t uid_bytes[FZ_CHECK_UIDS] = { 0 }, uid_leases[FZ_CHECK_UIDS] = { 0 }, uid_chunks[FZ_CHECK_UIDS] = { 0 };
	uint64_t lent_chunks = 0;
	struct idle_walk idle = { .f = f };

	/* The books are checked where the daemon's loop would: after the reaper ran. */
	fz_reap(f);
	for (struct conn *c = server_conns(daemon_of(b)->server); c; c = c->next) {
		FZ_ASSERT(!c->closing, "closed connection %llu is still on the live list", (unsigned long long)c->id);
		FZ_ASSERT(nconns < FZ_CHECK_CONNS, "more than %d open connections", FZ_CHECK_CONNS);
		conns[nconns++] = c;
		pending_conn += c->npending;
		unbrokered += c->unbrokered_bytes;
		staged_h2d += c->staged.last.h2d_bytes;
		staged_d2h += c->staged.last.d2h_bytes;
		conn_ring_bytes += c->ring_bytes;
	}
	for (struct lease *l = lease_first(b->leases); l; l = lease_next(b->leases, l)) {
		uint64_t chunk_sum = 0;
		int k = l->owner ? conn_index(conns, nconns, l->owner) : -1;

		FZ_ASSERT(l->state != LEASE_FREED, "freed lease %llu still in the table", (unsigned long long)l->id);
		FZ_ASSERT(l->id > prev_id, "lease %llu walked after %llu", (unsigned long long)l->id,
			  (unsigned long long)prev_id);
		/* Every lease the walk sees must be what a lookup of its id finds: a broken chain hangs or misses here. */
		FZ_ASSERT(lease_find(b->leases, l->id) == l, "lease %llu not found by id", (unsigned long long)l->id);
		prev_id = l->id;
		for (size_t i = 0; i < l->nchunks; i++) {
			const struct fz_taint *t = taint_find(f, l->chunks[i].id);

			chunk_sum += l->chunks[i].mem->bytes;
			/* Sent to another uid: the daemon knows it, and the chunk never moved to another lease. */
			FZ_ASSERT(t == NULL || (t->lease_id == l->id && l->chunks[i].tainted),
				  "chunk %llu went to another uid in lease %llu; now in lease %llu, %s",
				  (unsigned long long)l->chunks[i].id, (unsigned long long)(t ? t->lease_id : 0),
				  (unsigned long long)l->id, l->chunks[i].tainted ? "tainted" : "not tainted");
		}
		for (size_t j = 0; j < l->nattachers; j++)
			for (size_t i = 0; l->attachers[j].uid != l->uid && i < l->nchunks; i++)
				FZ_ASSERT(l->chunks[i].tainted,
					  "lease %llu of uid %u has an attacher of uid %u but chunk "
					  "%llu is not tainted",
					  (unsigned long long)l->id, (unsigned)l->uid, (unsigned)l->attachers[j].uid,
					  (unsigned long long)l->chunks[i].id);
		lent_chunks += l->nchunks;
		for (int u = 0; u < FZ_CHECK_UIDS; u++)
			if (l->uid == f->uid[u]) {
				uid_bytes[u] += l->charged_bytes;
				uid_leases[u]++;
				uid_chunks[u] += l->nchunks;
				break;
			}
		/* A registration is a charge for the program's own memory: no chunks at all. */
		FZ_ASSERT(chunk_sum == (l->registration ? 0 : l->bytes),
			  "lease %llu%s: %llu bytes but chunks hold %llu", (unsigned long long)l->id,
			  l->registration ? " (registration)" : "", (unsigned long long)l->bytes,
			  (unsigned long long)chunk_sum);
		FZ_ASSERT(!l->registration || (l->no_revoke && !l->share), "registration %llu is revocable or shared",
			  (unsigned long long)l->id);
		FZ_ASSERT(!l->no_revoke || l->state == LEASE_ACTIVE || l->state == LEASE_IDLE,
			  "never-revoked lease %llu is %s", (unsigned long long)l->id, lease_state_name(l->state));
		/* A shared registration carries only the pages no older one of its file covers (backing.h). */
		FZ_ASSERT(l->charged_bytes == l->bytes || (l->backed && l->registration && l->charged_bytes < l->bytes),
			  "lease %llu is charged %llu of its %llu bytes", (unsigned long long)l->id,
			  (unsigned long long)l->charged_bytes, (unsigned long long)l->bytes);
		FZ_ASSERT(!l->backed || (b->backings && backing_charged(b->backings, l->backing_dev, l->backing_ino,
									l->id) == l->charged_bytes),
			  "shared registration %llu carries %llu, its file's ranges say otherwise",
			  (unsigned long long)l->id, (unsigned long long)l->charged_bytes);
		registered += l->registration ? l->charged_bytes : 0;
		no_revoke += l->no_revoke ? l->charged_bytes : 0;
		rings += l->staging_ring;
		ring_bytes += l->staging_ring ? l->bytes : 0;
		FZ_ASSERT(l->owner == NULL || k >= 0, "lease %llu is owned by a connection that is gone",
			  (unsigned long long)l->id);
		if (k >= 0)
			held[k]++;
		/* An attachment counts on its connection too (shared leases, lease.h). */
		for (size_t j = 0; j < l->nattachers; j++) {
			int ka = conn_index(conns, nconns, l->attachers[j].owner);

			FZ_ASSERT(ka >= 0, "lease %llu has an attacher whose connection is gone",
				  (unsigned long long)l->id);
			held[ka]++;
		}
		state_count[l->state]++;
		state_bytes[l->state] += l->bytes;
		sum += l->charged_bytes;
		job_sum += l->cgroup ? l->charged_bytes : 0;
		nleases++;
	}
	/* Every charged lease is in exactly one job, whatever the rules did to the grouping. */
	if (b->jobs) {
		uint64_t jobs_bytes = 0;

		for (const struct job *jb = jobs_first(b->jobs); jb; jb = jb->next)
			jobs_bytes += jb->bytes;
		FZ_ASSERT(jobs_bytes == job_sum, "jobs are charged %llu bytes, leases charged to cgroups hold %llu",
			  (unsigned long long)jobs_bytes, (unsigned long long)job_sum);
	}
	FZ_ASSERT(nleases == lease_count(b->leases), "lease_count %zu, walked %zu", lease_count(b->leases), nleases);
	for (int s = 0; s < LEASE__STATE_MAX; s++)
		FZ_ASSERT(lease_state_count(b->leases, s) == state_count[s] &&
				  lease_state_bytes(b->leases, s) == state_bytes[s],
			  "state %s: table counts %zu leases of %llu bytes, walk %zu of %llu", lease_state_name(s),
			  lease_state_count(b->leases, s), (unsigned long long)lease_state_bytes(b->leases, s),
			  state_count[s], (unsigned long long)state_bytes[s]);
	FZ_ASSERT(budget_leased(b->budget) == sum, "budget says %llu leased, leases hold %llu",
		  (unsigned long long)budget_leased(b->budget), (unsigned long long)sum);
	/* Per uid, each counted once (the connections' uids may be the same one). */
	for (int u = 0; u < FZ_CHECK_UIDS; u++) {
		if (u > 0 && f->uid[u] == f->uid[0])
			continue;
		FZ_ASSERT(
			budget_uid_leased(b->budget, f->uid[u]) == uid_bytes[u] &&
				budget_uid_leases(b->budget, f->uid[u]) == uid_leases[u] &&
				budget_uid_chunks(b->budget, f->uid[u]) == uid_chunks[u],
			"uid %u: budget counts %llu bytes, %llu leases, %llu chunks; its leases hold %llu, %llu, %llu",
			(unsigned)f->uid[u], (unsigned long long)budget_uid_leased(b->budget, f->uid[u]),
			(unsigned long long)budget_uid_leases(b->budget, f->uid[u]),
			(unsigned long long)budget_uid_chunks(b->budget, f->uid[u]), (unsigned long long)uid_bytes[u],
			(unsigned long long)uid_leases[u], (unsigned long long)uid_chunks[u]);
	}
	FZ_ASSERT(budget_chunks(b->budget) == lent_chunks, "budget counts %llu chunks lent, leases hold %llu",
		  (unsigned long long)budget_chunks(b->budget), (unsigned long long)lent_chunks);
	/* Every chunk the pool holds is idle or in exactly one lease; no tainted one is idle. */
	pool_foreach_idle(daemon_of(b)->pool, check_idle_chunk, &idle);
	FZ_ASSERT(idle.bytes == pool_idle_bytes(daemon_of(b)->pool) &&
			  idle.n + lent_chunks == pool_chunk_count(daemon_of(b)->pool),
		  "pool: %zu chunks (%llu bytes idle); idle list %zu chunks of %llu bytes, leases %llu chunks",
		  pool_chunk_count(daemon_of(b)->pool), (unsigned long long)pool_idle_bytes(daemon_of(b)->pool), idle.n,
		  (unsigned long long)idle.bytes, (unsigned long long)lent_chunks);
	FZ_ASSERT(pool_resident_bytes(daemon_of(b)->pool) == pool_idle_bytes(daemon_of(b)->pool) + sum - registered,
		  "pool resident %llu != idle %llu + leased %llu - registered %llu",
		  (unsigned long long)pool_resident_bytes(daemon_of(b)->pool),
		  (unsigned long long)pool_idle_bytes(daemon_of(b)->pool), (unsigned long long)sum,
		  (unsigned long long)registered);
	FZ_ASSERT(b->registered_bytes == registered && budget_no_revoke(b->budget) == no_revoke,
		  "broker counts %llu registered, %llu never-revoked; leases hold %llu, %llu",
		  (unsigned long long)b->registered_bytes, (unsigned long long)budget_no_revoke(b->budget),
		  (unsigned long long)registered, (unsigned long long)no_revoke);
	FZ_ASSERT(b->staging_rings == rings && b->staging_ring_bytes == ring_bytes,
		  "broker counts %u staging rings of %llu bytes; leases hold %llu of %llu", b->staging_rings,
		  (unsigned long long)b->staging_ring_bytes, (unsigned long long)rings, (unsigned long long)ring_bytes);
	/* A connection's rings are among them (a holder that let go while attachers map it no longer counts its). */
	FZ_ASSERT(conn_ring_bytes <= ring_bytes, "connections count %llu ring bytes, leases hold %llu",
		  (unsigned long long)conn_ring_bytes, (unsigned long long)ring_bytes);
	/* The totals hold every live connection's last report, and closed ones' too. */
	FZ_ASSERT(b->staged.sum.h2d_bytes >= staged_h2d && b->staged.sum.d2h_bytes >= staged_d2h,
		  "staged totals %llu/%llu below the live connections' reports %llu/%llu",
		  (unsigned long long)b->staged.sum.h2d_bytes, (unsigned long long)b->staged.sum.d2h_bytes,
		  (unsigned long long)staged_h2d, (unsigned long long)staged_d2h);
	FZ_ASSERT(b->unbrokered_bytes == unbrokered, "broker counts %llu unbrokered, connections report %llu",
		  (unsigned long long)b->unbrokered_bytes, (unsigned long long)unbrokered);
	/* The per-uid table sums to the same, and what status shows never passes the cap. */
	FZ_ASSERT(b->unbrokered.reported_bytes == unbrokered,
		  "per-uid unbrokered sums to %llu, connections report %llu",
		  (unsigned long long)b->unbrokered.reported_bytes, (unsigned long long)unbrokered);
	FZ_ASSERT(unbrokered_counted(&b->unbrokered, daemon_unbrokered_cap(b)) <= daemon_unbrokered_cap(b),
		  "counted unbrokered over its cap");
	for (size_t k = 0; k < nconns; k++)
		FZ_ASSERT(conns[k]->nleases == held[k], "connection %llu counts %u leases, holds %u",
			  (unsigned long long)conns[k]->id, conns[k]->nleases, held[k]);
	FZ_ASSERT(pending_conn == waitq_count(b), "connections count %llu waiting acquires, queue has %u",
		  (unsigned long long)pending_conn, waitq_count(b));
	/*
	 * A SET that lowers max-pending-acquires keeps the acquires already waiting (they time out or are
	 * granted as usual): the bound is that the queue never grows while it is over the limit.
	 */
	FZ_ASSERT(waitq_count(b) <= daemon_of(b)->cfg->max_pending_acquires || waitq_count(b) <= f->prev_waiting,
		  "%u waiting acquires over max-pending-acquires %u (%u before this op)", waitq_count(b),
		  daemon_of(b)->cfg->max_pending_acquires, f->prev_waiting);
	f->prev_waiting = waitq_count(b);
}

/* Once per input: the reverse walk and the cursor chain agree with the forward walk. */
static void check_order(struct fz *f)
{
	struct lease_table *t = f->d.broker.leases;
	struct lease *l, *r = lease_last(t), *c = lease_next_after(t, 0);
	size_t n = 0;

	for (l = lease_first(t); l; l = lease_next(t, l), n++) {
		FZ_ASSERT(c == l, "cursor after the lease before %llu is wrong", (unsigned long long)l->id);
		c = lease_next_after(t, l->id);
	}
	FZ_ASSERT(c == NULL, "cursor goes past the last lease%s", "");
	for (; r; r = lease_prev(t, r))
		n--;
	FZ_ASSERT(n == 0, "reverse walk and forward walk differ by %zu leases", n);
}

/* Back to the canonical state: nothing held, nothing connected, accounting at zero. */
static void fz_reset(struct fz *f)
{
	struct broker *b = &f->d.broker;
	struct lease *l, *next;

	fz_check(f);
	check_order(f);
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
			taint_model_add(f, l);
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

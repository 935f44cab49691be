/* SPDX-License-Identifier: MIT */
/* Shared fuzz harness core: a broker built in memory with real modules, connections over socketpairs, and accounting checks. */
#define _GNU_SOURCE
#include "harness.h"

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
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "budget.h"
#include "config.h"
#include "lease.h"
#include "log.h"
#include "pool.h"
#include "request.h"
#include "util.h"
#include "wire.h"

#define FZ_MEM_TOTAL_BYTES (64ull << 20) /* a pretend host: percentages in SET budget resolve against it */

/* Connections carry this child's pid, so revoke-enforce signals and pidfd ghosts hit it, never us. */
static pid_t victim_pid = -1;

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

void fz_global_init(void)
{
	signal(SIGPIPE, SIG_IGN);
	log_init(getenv("FUZZ_LOG") ? LOG_DEBUG : LOG_EMERG, 0);
	victim_ensure();
	/* The default loop lives for the whole process (epoll fd, wake-up eventfd): open it before fds are counted. */
	ev_default_loop(EVFLAG_AUTO);
}

int fz_count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

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

static void resolve_sizes(struct broker *b, const struct config *c)
{
	b->budget_bytes = config_resolve(&c->budget, b->mem_total_bytes);
	b->uid_quota_bytes = config_resolve(&c->uid_quota, b->budget_bytes);
	b->prewarm_bytes = config_resolve(&c->prewarm, b->budget_bytes);
	if (b->prewarm_bytes > b->budget_bytes)
		b->prewarm_bytes = b->budget_bytes;
	if (b->uid_quota_bytes > b->budget_bytes)
		b->uid_quota_bytes = b->budget_bytes;
}

/* main.c's version, less the monitor and sd_notify: the harness links request.c without main.c. */
int daemon_apply_config(struct broker *b, struct config *n, char **err)
{
	struct config *old = b->cfg;

	free(n->socket_path);
	n->socket_path = strdup(old->socket_path);
	free(n->proc_root);
	n->proc_root = strdup(old->proc_root);
	n->chunk_bytes = old->chunk_bytes;
	n->hugetlb = old->hugetlb;
	n->prewarm_threads = old->prewarm_threads;
	n->lock_memory = old->lock_memory;
	n->max_message_bytes = old->max_message_bytes;
	if (!n->socket_path || !n->proc_root)
		return -ENOMEM;
	b->cfg = n;
	resolve_sizes(b, n);
	budget_set_limits(b->budget, b->budget_bytes, b->uid_quota_bytes);
	config_free(old);
	broker_trim_pool(b, b->state == BROKER_NORMAL ? b->prewarm_bytes : 0);
	request_grant_waiting(b);
	return 0;
}

void fz_setup(struct fz *f, unsigned flags, const char *const *overrides)
{
	static const char *const base[] = {
		"budget=8M", "uid-quota=6M", "prewarm=256K", "chunk-size=64K", "hugetlb=no", "lock-memory=no",
		"pool-shrink-delay-ms=0", "acquire-timeout-ms=2", "revoke-deadline-ms=2", "revoke-enforce=disconnect",
		"max-leases-per-client=16", "max-pending-acquires=4", "log-level=err", "socket=/nonexistent/fuzz.sock",
		NULL,
	};
	struct pool_opts po = { 0 };
	struct config *cfg = NULL;
	char *err = NULL;
	int lfd, r;

	victim_ensure();
	memset(f, 0, sizeof(*f));
	FZ_ASSERT(config_new(&cfg) == 0, "config_new");
	for (int pass = 0; pass < 2; pass++) {
		const char *const *kv = pass == 0 ? base : overrides;

		for (size_t i = 0; kv && kv[i]; i++) {
			char key[64];
			const char *eq = strchr(kv[i], '=');

			snprintf(key, sizeof(key), "%.*s", (int)(eq - kv[i]), kv[i]);
			r = config_set(cfg, key, eq + 1, &err);
			FZ_ASSERT(r == 0, "config_set %s: %s", kv[i], err ? err : "?");
		}
	}
	FZ_ASSERT(config_validate(cfg, &err) == 0, "config_validate: %s", err ? err : "?");
	log_level = getenv("FUZZ_LOG") ? LOG_DEBUG : LOG_EMERG;

	f->b.cfg = cfg;
	f->b.loop = ev_default_loop(EVFLAG_AUTO);
	f->b.started_ms = now_ms();
	f->b.state = BROKER_NORMAL;
	f->b.mem_total_bytes = FZ_MEM_TOTAL_BYTES;
	resolve_sizes(&f->b, cfg);
	FZ_ASSERT(budget_new(f->b.budget_bytes, f->b.uid_quota_bytes, &f->b.budget) == 0, "budget_new");
	FZ_ASSERT(lease_table_new(&f->b.leases) == 0, "lease_table_new");
	po.chunk_bytes = cfg->chunk_bytes;
	po.hugetlb = POOL_HUGETLB_NO;
	po.threads = 1;
	po.lock = false;
	FZ_ASSERT(pool_new(&po, &f->b.pool) == 0, "pool_new");
	FZ_ASSERT(request_init(&f->b) == 0, "request_init");
	/* A listening socket nobody connects to: the harness attaches connections itself. */
	lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	FZ_ASSERT(lfd >= 0, "socket");
	FZ_ASSERT(server_new(&f->b, lfd, &f->b.server) == 0, "server_new");
	for (int i = 0; i < FZ_CONNS; i++) {
		f->peer[i] = -1;
		f->uid[i] = (flags >> i) & 1 ? 0 : 1000 + (uid_t)i;
	}
}

bool fz_conn_alive(struct fz *f, int i)
{
	if (f->conn[i] && !server_find_conn(f->b.server, f->conn_id[i]))
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
	FZ_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
	f->peer[i] = sv[0];
	FZ_ASSERT(server_adopt(f->b.server, sv[1], &cred, &f->conn[i]) == 0, "server_adopt");
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
	ev_now_update(f->b.loop);
	ev_run(f->b.loop, EVRUN_NOWAIT);
}

void fz_drain(struct fz *f)
{
	static uint8_t buf[PB_MAX_MSG_BYTES + 1];

	for (int i = 0; i < FZ_CONNS; i++) {
		for (int k = 0; f->peer[i] >= 0 && k < 4096; k++) {
			int fds[PB_MAX_FDS_PER_MSG];
			size_t nfds = 0;
			ssize_t n = wire_recv(f->peer[i], buf, sizeof(buf), fds, PB_MAX_FDS_PER_MSG, &nfds);
			Pinbroker__V1__Reply *rep;

			if (n == -EAGAIN || n == 0 || n == -ECONNRESET)
				break;
			FZ_ASSERT(n > 0, "daemon sent a packet the client cannot receive: %s", strerror((int)-n));
			rep = pinbroker__v1__reply__unpack(NULL, (size_t)n, buf);
			FZ_ASSERT(rep != NULL, "daemon sent a reply that does not decode (%zd bytes)", n);
			if (rep->body_case == PINBROKER__V1__REPLY__BODY_LEASE)
				FZ_ASSERT(rep->lease->fds_in_reply == nfds, "lease reply says %u fds, %zu came",
					  rep->lease->fds_in_reply, nfds);
			if (rep->body_case == PINBROKER__V1__REPLY__BODY_SHARE) {
				FZ_ASSERT(rep->share->token && strlen(rep->share->token) == 32,
					  "share reply without a 32-character token");
				snprintf(f->token, sizeof(f->token), "%s", rep->share->token);
			}
			for (size_t j = 0; j < nfds; j++) {
				/* What a client would do: the chunk must be a sealed memfd of the stated size. */
				FZ_ASSERT(fcntl(fds[j], F_GET_SEALS) >= 0, "reply fd %d is not a memfd", fds[j]);
			}
			wire_close_fds(fds, nfds);
			pinbroker__v1__reply__free_unpacked(rep, NULL);
		}
	}
}

void fz_set_state(struct fz *f, enum broker_state to)
{
	enum broker_state from = f->b.state;

	if (from != to)
		request_on_pressure(&f->b, from, to, "fuzz");
}

void fz_check(struct fz *f)
{
	struct broker *b = &f->b;
	uint64_t sum = 0, pending_conn = 0;
	size_t nleases = 0;

	for (struct lease *l = lease_first(b->leases); l; l = lease_next(b->leases, l)) {
		uint64_t chunk_sum = 0;
		bool owner_found = l->owner == NULL;

		FZ_ASSERT(l->state != LEASE_FREED, "freed lease %llu still in the table", (unsigned long long)l->id);
		for (size_t i = 0; i < l->nchunks; i++)
			chunk_sum += l->chunks[i]->bytes;
		FZ_ASSERT(chunk_sum == l->bytes, "lease %llu: %llu bytes but chunks hold %llu", (unsigned long long)l->id,
			  (unsigned long long)l->bytes, (unsigned long long)chunk_sum);
		for (struct conn *c = server_conns(b->server); c && !owner_found; c = c->next)
			owner_found = l->owner == c;
		FZ_ASSERT(owner_found, "lease %llu is owned by a connection that is gone", (unsigned long long)l->id);
		for (size_t k = 0; k < l->nattachers; k++) {
			bool live = false;

			for (struct conn *c = server_conns(b->server); c && !live; c = c->next)
				live = l->attachers[k].owner == c;
			FZ_ASSERT(live, "lease %llu has an attacher whose connection is gone", (unsigned long long)l->id);
			FZ_ASSERT(l->attachers[k].owner != l->owner, "lease %llu: its holder is also an attacher",
				  (unsigned long long)l->id);
		}
		FZ_ASSERT(l->nattachers == 0 || l->share, "lease %llu has attachers but no share",
			  (unsigned long long)l->id);
		FZ_ASSERT(l->state != LEASE_ORPHANED || l->nattachers == 0, "orphan %llu has attachers",
			  (unsigned long long)l->id);
		FZ_ASSERT(!l->share || lease_find_token(b->leases, l->share->token) == l,
			  "lease %llu: its token does not find it", (unsigned long long)l->id);
		sum += l->bytes;
		nleases++;
	}
	FZ_ASSERT(nleases == lease_count(b->leases), "lease_count %zu, walked %zu", lease_count(b->leases), nleases);
	FZ_ASSERT(budget_leased(b->budget) == sum, "budget says %llu leased, leases hold %llu",
		  (unsigned long long)budget_leased(b->budget), (unsigned long long)sum);
	FZ_ASSERT(pool_resident_bytes(b->pool) == pool_idle_bytes(b->pool) + sum,
		  "pool resident %llu != idle %llu + leased %llu", (unsigned long long)pool_resident_bytes(b->pool),
		  (unsigned long long)pool_idle_bytes(b->pool), (unsigned long long)sum);
	for (struct conn *c = server_conns(b->server); c; c = c->next) {
		uint32_t n = 0, na = 0;

		for (struct lease *l = lease_first(b->leases); l; l = lease_next(b->leases, l)) {
			n += l->owner == c || lease_attacher_find(l, c) != NULL; /* attachments count too */
			na += lease_attacher_find(l, c) != NULL;
		}
		FZ_ASSERT(c->nattached == na, "connection %llu counts %u attachments, has %u", (unsigned long long)c->id,
			  c->nattached, na);
		FZ_ASSERT(c->nleases == n, "connection %llu counts %u leases, holds %u", (unsigned long long)c->id,
			  c->nleases, n);
		FZ_ASSERT(!c->closing, "closed connection %llu still listed", (unsigned long long)c->id);
		pending_conn += c->npending;
	}
	FZ_ASSERT(pending_conn == request_waiting_count(b), "connections count %llu waiting acquires, queue has %u",
		  (unsigned long long)pending_conn, request_waiting_count(b));
	FZ_ASSERT(request_waiting_count(b) <= b->cfg->max_pending_acquires || request_waiting_count(b) == 0,
		  "%u waiting acquires over max-pending-acquires %u", request_waiting_count(b),
		  b->cfg->max_pending_acquires);
}

void fz_teardown(struct fz *f)
{
	struct broker *b = &f->b;
	struct lease *l, *next;

	fz_check(f);
	for (int i = 0; i < FZ_CONNS; i++)
		fz_close_peer(f, i);
	b->shutting_down = true;
	server_free(b->server);
	b->server = NULL;
	/* Overdue leases of closed connections wait for their (victim) process; drop them as shutdown would. */
	for (l = lease_first(b->leases); l; l = next) {
		next = lease_next(b->leases, l);
		FZ_ASSERT(l->owner == NULL, "lease %llu still owned after every connection closed",
			  (unsigned long long)l->id);
		broker_free_lease(b, l);
	}
	request_fini(b);
	FZ_ASSERT(budget_leased(b->budget) == 0, "%llu bytes still leased after teardown",
		  (unsigned long long)budget_leased(b->budget));
	FZ_ASSERT(pool_resident_bytes(b->pool) == pool_idle_bytes(b->pool), "pool lent chunks nobody holds");
	pool_free(b->pool);
	lease_table_free(b->leases);
	budget_free(b->budget);
	config_free(b->cfg);
	memset(f, 0, sizeof(*f));
}

/* ATTACH with the last token seen, on connection i, through the real decoder and gate. */
static void fz_attach_last(struct fz *f, int i)
{
	Pinbroker__V1__Attach at = PINBROKER__V1__ATTACH__INIT;
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	uint8_t buf[128];
	size_t len;

	at.token = f->token;
	req.has_seq = 1;
	req.seq = 7777;
	req.body_case = PINBROKER__V1__REQUEST__BODY_ATTACH;
	req.attach = &at;
	len = pinbroker__v1__request__pack(&req, buf);
	request_dispatch(fz_conn(f, i), buf, len);
}

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
		if (op & 8)
			usleep(3000);
		fz_run_loop(f);
		return true;
	case 7:
		if (op & 16)
			fz_attach_last(f, i);
		else
			fz_close_peer(f, i);
		return true;
	default:
		return false;
	}
}

void fz_finish(struct fz *f, int baseline_fds)
{
	int nfds;

	fz_run_loop(f);
	fz_drain(f);
	fz_teardown(f);
	nfds = fz_count_fds();
	if (nfds != baseline_fds)
		fz_dump_fds();
	FZ_ASSERT(nfds == baseline_fds, "fd leak: %d open, %d at start", nfds, baseline_fds);
}

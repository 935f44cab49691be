/* SPDX-License-Identifier: MIT */
/* A broker built in memory from the real daemon library, with two client connections over socketpairs, for the request modules' unit suite. */
#define _GNU_SOURCE
#include "reqfix.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <ev.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "connfix.h"
#include "budget.h"
#include "config.h"
#include "daemon.h"
#include "conn.h"
#include "jobs.h"
#include "lease.h"
#include "log.h"
#include "pool.h"
#include "reservation.h"
#include "react.h"
#include "reload.h"
#include "request.h"
#include "util.h"
#include "waitq.h"
#include "fdlimit.h"

#define RF_MEM_TOTAL_BYTES (64ull << 20) /* a pretend host: percentages in SET budget resolve against it */

static struct rf the_rf;

static const char *const rf_config[] = {
	CONNFIX_CONFIG,
	"socket=/nonexistent/reqfix.sock",
	NULL,
};

/* The cgroups the connections are charged to: the quota tests set rules on /fz/job_1 and /fz/job_2. */
static const char *const rf_cgroups[RF_CONNS] = { "/fz/job_1/step_0", "/fz/job_2/step_0" };

static struct config *make_config(void)
{
	struct config *cfg = NULL;
	char *err = NULL;

	ck_assert_int_eq(config_new(&cfg), 0);
	for (size_t i = 0; rf_config[i]; i++) {
		const char *eq = strchr(rf_config[i], '=');
		char key[64];

		snprintf(key, sizeof(key), "%.*s", (int)(eq - rf_config[i]), rf_config[i]);
		ck_assert_msg(config_set(cfg, key, eq + 1, &err) == 0, "config_set %s: %s", rf_config[i],
			      err ? err : "?");
	}
	ck_assert_msg(config_validate(cfg, &err) == 0, "config_validate: %s", err ? err : "?");
	return cfg;
}

/* reload_apply's hooks: no monitor, no fd limits to re-derive; a new config may let waiting acquires in. */
static void config_applied(struct broker *b)
{
	waitq_grant(b);
}

static const struct reload_hooks rf_reload_hooks = { .applied = config_applied };

/* The server's conn_io, with each packet the request modules send counted: "answered" apart from "silent". */
static struct conn_io rf_conn_io;

static int rf_send(struct conn *c, const Pinbroker__V1__Reply *reply, const int *fds, size_t nfds)
{
	the_rf.packets_sent++;
	return server_conn_io.send(c, reply, fds, nfds);
}

struct rf *rf_begin(unsigned flags)
{
	struct rf *f = &the_rf;
	struct broker *b = &f->d.broker;
	struct pool_opts po = { .hugetlb = POOL_HUGETLB_NO, .threads = 1, .lock = false };
	int lfd;

	signal(SIGPIPE, SIG_IGN);
	log_init(getenv("REQFIX_LOG") ? LOG_DEBUG : LOG_EMERG, 0);
	memset(f, 0, sizeof(*f));
	/* Connections carry this child's pid: a pidfd to it is real, and nothing the daemon does reaches the test. */
	f->holder_pid = fork();
	ck_assert_int_ge(f->holder_pid, 0);
	if (f->holder_pid == 0) {
		pause();
		_exit(0);
	}
	for (int i = 0; i < RF_CONNS; i++) {
		f->peer[i] = -1;
		f->uid[i] = (flags >> i) & 1 ? 0 : 1000 + (uid_t)i;
	}

	daemon_of(b)->loop = ev_default_loop(EVFLAG_AUTO);
	ck_assert_ptr_nonnull(daemon_of(b)->loop);
	f->baseline_fds = fdlimit_open_count(); /* the loop's own fds stay for the process */
	daemon_of(b)->reload_hooks = &rf_reload_hooks;
	b->started_ms = now_ms();
	(void)broker_set_pressure(b, BROKER_NORMAL); /* nothing lent or waiting yet */
	b->mem_total_bytes = RF_MEM_TOTAL_BYTES;
	daemon_of(b)->cfg = make_config();
	reload_resolve_sizes(b, daemon_of(b)->cfg);
	ck_assert_uint_eq(b->budget_bytes, RF_BUDGET_BYTES);
	ck_assert_int_eq(budget_new(b->budget_bytes, b->uid_quota_bytes, &b->budget), 0);
	ck_assert_int_eq(jobs_new(&b->jobs), 0);
	po.chunk_bytes = daemon_of(b)->cfg->chunk_bytes;
	ck_assert_int_eq(pool_new(&po, &daemon_of(b)->pool), 0);
	ck_assert_int_eq(pool_grow(daemon_of(b)->pool, b->prewarm_bytes, NULL, NULL), 0);
	ck_assert_int_eq(lease_table_new(&b->leases), 0);
	ck_assert_int_eq(request_init(b), 0);
	/* A bound, listening socket nobody connects to: the fixture attaches connections itself. */
	lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(lfd, 0);
	ck_assert_int_eq(
		bind(lfd, (struct sockaddr *)&(struct sockaddr_un){ .sun_family = AF_UNIX }, sizeof(sa_family_t)), 0);
	ck_assert_int_eq(listen(lfd, 1), 0);
	ck_assert_int_eq(server_new(b, lfd, &daemon_of(b)->server), 0);
	/* The server's own conn_io with only send wrapped (counted), in place of the one server_new installed. */
	rf_conn_io = server_conn_io;
	rf_conn_io.send = rf_send;
	daemon_of(b)->conn_io = &rf_conn_io;
	return f;
}

bool rf_conn_alive(struct rf *f, int i)
{
	return connfix_alive(&f->d, &f->conn[i], f->conn_id[i]);
}

struct conn *rf_conn(struct rf *f, int i)
{
	struct ucred cred = { .pid = f->holder_pid, .uid = f->uid[i], .gid = f->uid[i] };
	const char *failed;

	if (rf_conn_alive(f, i) && f->peer[i] >= 0)
		return f->conn[i];
	ck_assert_ptr_nonnull(f->d.broker.jobs);
	failed = connfix_open(&f->d, &cred, rf_cgroups[i], "reqfix: replaced", &f->conn[i], &f->peer[i]);
	ck_assert_msg(failed == NULL, "%s failed", failed);
	f->conn_id[i] = f->conn[i]->id;
	return f->conn[i];
}

void rf_run_loop(struct rf *f)
{
	ev_now_update(f->d.loop);
	ev_run(f->d.loop, EVRUN_NOWAIT);
}

void rf_set_state(struct rf *f, enum broker_state to)
{
	enum broker_state from = f->d.broker.state;

	if (from != to)
		react_pressure(&f->d.broker, from, to, "reqfix");
}

/* Index of open connection c in conns, or -1. */
static int conn_index(struct conn *const *conns, size_t n, const void *c)
{
	for (size_t k = 0; k < n; k++)
		if (conns[k] == c)
			return (int)k;
	return -1;
}

void rf_check(struct rf *f)
{
	struct broker *b = &f->d.broker;
	struct conn *conns[8];
	uint32_t held[8] = { 0 };
	size_t nconns = 0, nleases = 0;
	uint64_t sum = 0, registered = 0, no_revoke = 0, lent_chunks = 0, pending = 0, unbrokered = 0, job_sum = 0;
	uint64_t uid_bytes[RF_CONNS] = { 0 }, uid_leases[RF_CONNS] = { 0 }, uid_chunks[RF_CONNS] = { 0 };
	uint64_t jobs_bytes = 0;

	/* Checked where the daemon's loop would: after the reaper ran. */
	server_reap(daemon_of(b)->server);
	for (struct conn *c = server_conns(daemon_of(b)->server); c; c = c->next) {
		ck_assert(!c->closing);
		ck_assert_uint_lt(nconns, 8);
		conns[nconns++] = c;
		pending += c->npending;
		unbrokered += c->unbrokered_bytes;
	}
	for (struct lease *l = lease_first(b->leases); l; l = lease_next(b->leases, l)) {
		uint64_t chunk_sum = 0;
		int k = l->owner ? conn_index(conns, nconns, l->owner) : -1;

		ck_assert_int_ne(l->state, LEASE_FREED);
		ck_assert_ptr_eq(lease_find(b->leases, l->id), l);
		for (size_t i = 0; i < l->nchunks; i++)
			chunk_sum += l->chunks[i].mem->bytes;
		/* A registration is a charge for the program's own memory: no chunks at all. */
		ck_assert_uint_eq(chunk_sum, l->registration ? 0 : l->bytes);
		ck_assert(l->owner == NULL || k >= 0); /* no lease of a connection that is gone */
		if (k >= 0)
			held[k]++;
		for (size_t j = 0; j < l->nattachers; j++) {
			int ka = conn_index(conns, nconns, l->attachers[j].owner);

			ck_assert_int_ge(ka, 0);
			held[ka]++;
		}
		for (int u = 0; u < RF_CONNS; u++)
			if (l->uid == f->uid[u]) {
				uid_bytes[u] += l->charged_bytes;
				uid_leases[u]++;
				uid_chunks[u] += l->nchunks;
				break;
			}
		lent_chunks += l->nchunks;
		/* Only a registration of shared memory may carry less than its bytes (backing.h). */
		ck_assert(l->charged_bytes == l->bytes ||
			  (l->backed && l->registration && l->charged_bytes < l->bytes));
		registered += l->registration ? l->charged_bytes : 0;
		no_revoke += l->no_revoke ? l->charged_bytes : 0;
		job_sum += l->cgroup ? l->charged_bytes : 0;
		sum += l->charged_bytes;
		nleases++;
	}
	ck_assert_uint_eq(nleases, lease_count(b->leases));
	/* Reservations' untaken shares are charged as leased bytes, to their uid and job (reservation.h). */
	for (const struct reservation *r = reservation_first(b); r; r = r->next) {
		sum += r->held_bytes;
		job_sum += r->cgroup ? r->held_bytes : 0;
		for (int u = 0; u < RF_CONNS; u++)
			if (r->uid == f->uid[u]) {
				uid_bytes[u] += r->held_bytes;
				break;
			}
	}
	ck_assert_uint_eq(budget_leased(b->budget), sum);
	ck_assert_uint_eq(budget_chunks(b->budget), lent_chunks);
	for (int u = 0; u < RF_CONNS; u++) {
		if (u > 0 && f->uid[u] == f->uid[0])
			continue; /* the same uid twice: counted once */
		ck_assert_uint_eq(budget_uid_leased(b->budget, f->uid[u]), uid_bytes[u]);
		ck_assert_uint_eq(budget_uid_leases(b->budget, f->uid[u]), uid_leases[u]);
		ck_assert_uint_eq(budget_uid_chunks(b->budget, f->uid[u]), uid_chunks[u]);
	}
	for (const struct job *jb = jobs_first(b->jobs); jb; jb = jb->next)
		jobs_bytes += jb->bytes;
	ck_assert_uint_eq(jobs_bytes, job_sum);
	ck_assert_uint_eq(pool_resident_bytes(daemon_of(b)->pool),
			  pool_idle_bytes(daemon_of(b)->pool) + sum - registered - broker_reserved_bytes(b));
	ck_assert_uint_eq(b->registered_bytes, registered);
	ck_assert_uint_eq(budget_no_revoke(b->budget), no_revoke);
	ck_assert_uint_eq(b->unbrokered_bytes, unbrokered);
	for (size_t k = 0; k < nconns; k++)
		ck_assert_uint_eq(conns[k]->nleases, held[k]);
	ck_assert_uint_eq(pending, waitq_count(b));
}

void rf_end(struct rf *f)
{
	struct broker *b = &f->d.broker;
	struct lease *l, *next;

	rf_run_loop(f);
	rf_check(f);
	for (int i = 0; i < RF_CONNS; i++) {
		if (f->peer[i] >= 0)
			close(f->peer[i]);
		f->peer[i] = -1;
	}
	b->shutting_down = true;
	server_free(daemon_of(b)->server);
	daemon_of(b)->server = NULL;
	/* Leases of closed connections wait for their holder process; drop them as shutdown would. */
	for (l = lease_first(b->leases); l; l = next) {
		next = lease_next(b->leases, l);
		ck_assert_ptr_null(l->owner);
		daemon_free_lease(b, l);
	}
	request_fini(b);
	ck_assert_uint_eq(lease_count(b->leases), 0);
	ck_assert_uint_eq(budget_leased(b->budget), 0);
	ck_assert_uint_eq(pool_resident_bytes(daemon_of(b)->pool), pool_idle_bytes(daemon_of(b)->pool));
	lease_table_free(b->leases);
	pool_free(daemon_of(b)->pool);
	jobs_free(b->jobs);
	budget_free(b->budget);
	unbrokered_clear(&b->unbrokered);
	config_free(daemon_of(b)->cfg);
	kill(f->holder_pid, SIGKILL);
	waitpid(f->holder_pid, NULL, 0);
	ck_assert_int_eq(fdlimit_open_count(), f->baseline_fds); /* no fd leaked */
}

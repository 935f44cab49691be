/* SPDX-License-Identifier: MIT */
/*
 * Crash and restart recovery through systemd's fd store, at start: adopting the stored chunks and leases, quarantining
 * what the state cannot prove idle; the instance id.
 */
#define _GNU_SOURCE
#include "recovery.h"

#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "broker.h"
#include "daemon.h"
#include "budget.h"
#include "config.h"
#include "jobs-watch.h"
#include "jobs.h"
#include "lease.h"
#include "log.h"
#include "notify.h"
#include "pool.h"
#include "recovery-format.h"
#include "recovery-int.h"
#include "revoker.h"
#include "timer-clock.h"
#include "util.h"

#define STATE_FDNAME "state"
/* A quarantined chunk's owner: matches no uid that could ask (and such chunks are never idle anyway). */
#define OWNER_UNKNOWN ((uid_t)-2)

/* ------------------------------------------------------------ reading */

static ssize_t read_fd(void *ud, void *buf, size_t n, uint64_t off)
{
	return pread(*(const int *)ud, buf, n, (off_t)off);
}

/*
 * Returns 0 with *out filled, -ENODATA for an empty state (a clean stop, or a
 * fresh one), -EBADMSG when no committed snapshot can be read, or -ENOMEM.
 */
static int parse_state(int fd, struct recovery_parsed *out)
{
	struct stat st;

	memset(out, 0, sizeof(*out));
	if (fstat(fd, &st) < 0)
		return -EBADMSG;
	return recovery_decode((uint64_t)st.st_size, read_fd, &fd, out);
}

/* ------------------------------------------------------------ adoption */

/* Strict "c<digits>": the chunk id a stored fd was named with. */
static bool chunk_name_id(const char *name, uint64_t *id)
{
	char *end;

	if (name[0] != 'c' || name[1] < '0' || name[1] > '9')
		return false;
	errno = 0;
	*id = strtoull(name + 1, &end, 10);
	return errno == 0 && *end == '\0' && *id != 0;
}

/* The stored fds, and their chunk ids sorted for lookup: the store holds up to 16k chunks. */
struct store {
	struct notify_stored *st;
	int n;
	struct store_key {
		uint64_t id;
		int index;
	} * keys;
	size_t nkeys;
};

static int key_cmp(const void *a, const void *b)
{
	const struct store_key *x = a, *y = b;

	if (x->id != y->id)
		return x->id < y->id ? -1 : 1;
	return x->index - y->index;
}

static int store_index(struct store *s)
{
	s->keys = calloc((size_t)s->n + 1, sizeof(*s->keys));
	if (!s->keys)
		return -ENOMEM;
	for (int i = 0; i < s->n; i++) {
		uint64_t id;

		if (s->st[i].fd >= 0 && chunk_name_id(s->st[i].name, &id))
			s->keys[s->nkeys++] = (struct store_key){ id, i };
	}
	qsort(s->keys, s->nkeys, sizeof(*s->keys), key_cmp);
	return 0;
}

/* Find the stored fd of chunk id; -1 if none. Takes it out of the list. */
static int take_chunk_fd(struct store *s, uint64_t id)
{
	size_t lo = 0, hi = s->nkeys;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (s->keys[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < s->nkeys && s->keys[lo].id == id; lo++) {
		struct notify_stored *e = &s->st[s->keys[lo].index];

		if (e->fd >= 0) {
			int fd = e->fd;

			e->fd = -1;
			return fd;
		}
	}
	return -1;
}

static void quarantine_add(struct recovery *rc, struct chunk *c)
{
	struct chunk **nq = realloc(rc->quarantine, (rc->nquarantine + 1) * sizeof(*nq));

	c->owner_uid = OWNER_UNKNOWN;
	if (!nq) {
		/* Cannot hold it: destroying it now is as safe (the holder keeps its own mapping). */
		c->tail = true;
		pool_put(daemon_of(rc->b)->pool, &c, 1);
		return;
	}
	rc->quarantine = nq;
	rc->quarantine[rc->nquarantine++] = c;
}

/*
 * Give every quarantined chunk up: tails are destroyed on return (pool_put), so
 * marking them tails replaces them with fresh memfds for whoever asks next. A
 * holder that still maps one keeps those pages to itself.
 */
static void quarantine_release(struct recovery *rc)
{
	for (size_t i = 0; i < rc->nquarantine; i++)
		rc->quarantine[i]->tail = true;
	if (rc->nquarantine)
		pool_put(daemon_of(rc->b)->pool, rc->quarantine, rc->nquarantine);
	free(rc->quarantine);
	rc->quarantine = NULL;
	rc->nquarantine = 0;
	rc->b->generation++;
}

/* Adopt a stored fd as a lent chunk and quarantine it; a stored fd that is no chunk of ours is dropped. */
static void quarantine_fd(struct recovery *rc, int fd, uint64_t id, const char *name)
{
	struct chunk *c = NULL;

	if (pool_adopt(daemon_of(rc->b)->pool, fd, id, OWNER_UNKNOWN, false, false, &c) == 0) {
		quarantine_add(rc, c);
		return;
	}
	close(fd);
	notify_fdstore_remove(name);
}

/* ------------------------------------------------------------ exit holds */

/* Whether watch_exit put the process on an exit hold through a pidfd, on a polled one, or found it gone. */
enum watch { WATCH_HELD, WATCH_POLLED, WATCH_GONE };

/*
 * Keep lease l counted until process pid exits, since it may still map l's pages (holder: l's holder at the grace's
 * end; else a former attacher): an exit hold through its pidfd, or, while it is alive but no pidfd can be had
 * (pidfd_open failed: ENOSYS under valgrind 3.19, an old kernel or a seccomp sandbox, EMFILE/ENFILE/ENOMEM), a
 * polled one, which the revoker ends when it finds the process gone (revoker-int.h's struct exit_hold). The revoker's
 * exit holds are the one mechanism: revoker_unhold, revoker_hold_pids and the fd-store state cover both kinds.
 * WATCH_GONE: pid is gone; l gained no hold.
 */
static enum watch watch_exit(struct recovery *rc, struct lease *l, pid_t pid, bool holder)
{
	int pidfd = revoker_open_pidfd(rc->b, pid);
	int r = pidfd;

	if (pidfd >= 0) {
		r = revoker_hold_until_exit(rc->b, pidfd, pid, holder, l->id);
		if (r == 0)
			return WATCH_HELD;
	}
	if (revoker_pid_gone(pid, r))
		return WATCH_GONE;
	if (revoker_hold_until_exit(rc->b, -1, pid, holder, l->id) < 0) {
		/*
		 * Nothing to look again with: counted until the daemon stops, rather than freed under a live process.
		 */
		l->exit_holds++;
		log_event(EV_LEASE_OVERDUE, LOG_WARNING, l->id, l->uid, pid,
			  "lease %llu: pid %d may still map it but cannot be watched for its exit (%s), and is out of "
			  "memory to look again: it stays counted until the daemon stops",
			  (unsigned long long)l->id, pid, strerror(-r));
		return WATCH_POLLED;
	}
	if (holder)
		log_event(
			EV_LEASE_OVERDUE, LOG_WARNING, l->id, l->uid, pid,
			"lease %llu was not re-declared within redeclare-grace-ms but pid %d still runs and cannot be "
			"watched for its exit (%s): it stays counted, looked at again every %u ms until that process "
			"is gone",
			(unsigned long long)l->id, pid, strerror(-r), (unsigned)REVOKER_POLL_MS);
	else
		log_event(EV_LEASE_OVERDUE, LOG_WARNING, l->id, l->uid, pid,
			  "lease %llu: former attacher pid %d still runs and cannot be watched for its exit (%s): the "
			  "lease stays counted, looked at again every %u ms until that process is gone",
			  (unsigned long long)l->id, pid, strerror(-r), (unsigned)REVOKER_POLL_MS);
	return WATCH_POLLED;
}

static void grace_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct recovery *rc = w->data;
	struct broker *b = rc->b;
	struct lease *l, *next;
	size_t n = 0;

	/*
	 * The grace counts from the loop's first turn, when clients can be answered again (this timer's first
	 * firing; recovery_init started it at 0 s). Counted from recovery_init, it lost the start-up work that
	 * follows (the restart scan, the pool's warm-up before ready) and libev's clock cached before it: a slow
	 * start forgot leases before their holders could re-declare them. The clock decides (timer-clock.h).
	 */
	if (!rc->grace_from_ms)
		rc->grace_from_ms = now_ms();
	if (timer_clock_early(loop, w, rc->grace_from_ms, daemon_of(b)->cfg->redeclare_grace_ms))
		return;
	b->redeclare_grace = false;
	if (rc->nquarantine) {
		log_info("redeclare-grace-ms is over: %zu pool chunks of unknown holder are replaced by fresh memory",
			 rc->nquarantine);
		quarantine_release(rc);
	}
	for (l = lease_first(b->leases); l; l = next) {
		next = lease_next(b->leases, l);
		if (l->state != LEASE_ORPHANED || l->owner)
			continue;
		/*
		 * A holder still alive may still map the pages: they must not reach anyone else yet (whether or not
		 * former attachers still run, as they may exit first). One that cannot be watched through a pidfd is
		 * not taken for gone: the revoker's poll looks at it again (watch_exit), as freeing the lease under it
		 * would count its pinned bytes as free.
		 */
		if (l->pid > 0 && watch_exit(rc, l, l->pid, true) == WATCH_HELD)
			log_event(EV_LEASE_OVERDUE, LOG_WARNING, l->id, l->uid, l->pid,
				  "lease %llu was not re-declared within redeclare-grace-ms but pid %d still runs: "
				  "it stays counted until that process exits",
				  (unsigned long long)l->id, l->pid);
		/* Former attachers (or the holder) still run: the last one's exit frees it (revoker-hold.c's exit
		 * holds, watched or polled). */
		if (l->exit_holds > 0)
			continue;
		revoker_reclaim_orphan(b, l);
		n++;
	}
	if (n) {
		daemon_trim_pool(b, b->prewarm_bytes);
		broker_memory_freed(b); /* the wait queue listens */
	}
}

/* One stored lease: all its chunks, adding up to its bytes, within the budget; else its chunks are quarantined. */
static bool adopt_lease(struct recovery *rc, struct store *s, const struct recovery_stored_lease *sl)
{
	struct broker *b = rc->b;
	struct chunk **chunks = calloc(sl->nchunks, sizeof(*chunks));
	struct lease_chunk *lc = calloc(sl->nchunks ? sl->nchunks : 1, sizeof(*lc));
	const char *why = NULL;
	uint64_t sum_bytes = 0;
	struct lease *l;

	if (!chunks || !lc)
		why = "out of memory";
	if (!why && lease_find(b->leases, sl->id))
		why = "its id is named twice";
	for (size_t k = 0; !why && k < sl->nchunks; k++) {
		int fd = take_chunk_fd(s, sl->chunk_ids[k]);

		if (fd < 0) {
			why = "a chunk is missing from the fd store or named by a later lease";
		} else if (pool_adopt(daemon_of(b)->pool, fd, sl->chunk_ids[k], sl->uid, sl->tails[k], false,
				      &chunks[k]) < 0) {
			close(fd);
			why = "a stored chunk is not a sealed memfd";
		} else {
			sum_bytes += chunks[k]->bytes;
			pool_lease_chunk(chunks[k], &lc[k]);
			/* A former attacher of another uid may still map it: destroyed when the lease ends. */
			lc[k].tainted = sl->tainted[k];
		}
	}
	/* pool_take cuts a lease into chunks that add up to exactly its bytes. */
	if (!why && sum_bytes != sl->bytes)
		why = "its chunks do not add up to its size";
	if (!why && budget_check(b->budget, sl->uid, sl->bytes) != REFUSAL_NONE)
		why = "it does not fit the budget";
	if (!why && lease_adopt(b->leases, sl->id, sl->uid, sl->bytes, (enum lease_priority)sl->prio, sl->label, lc,
				sl->nchunks, now_ms(), &l) < 0)
		why = "out of memory";
	if (!why) {
		l->gid = sl->gid;
		l->pid = sl->pid;
		l->no_revoke = sl->no_revoke;
		/* Charged to its holder's job now, as the rules are back: not only at a re-declare, which a stopped
		 * holder (or one that gave up reconnecting) never sends, while the job's others got its quota again. */
		if (b->jobs && l->pid > 0) {
			struct job_cgroup *cg = jobs_watch_cgroup_of(b, l->pid);

			if (cg) {
				l->cgroup = cg;
				jobs_charge(b->jobs, cg, l->charged_bytes);
				jobs_cgroup_put(b->jobs, cg); /* the lease's own reference stays */
			}
		}
		budget_charge(b->budget, sl->uid, sl->bytes);
		if (l->no_revoke)
			budget_no_revoke_add(b->budget, sl->uid, sl->bytes);
		budget_count_add(b->budget, sl->uid, sl->nchunks);
		for (size_t k = 0; k < sl->nchunks; k++) {
			chunks[k]->lease_id = l->id; /* so a punch found by the audit names its lease */
			chunks[k]->tainted = sl->tainted[k];
		}
		free(chunks); /* the lease keeps lc */
		/* Its attachers do not re-declare: each still running holds it until it exits, watched through
		 * a pidfd or else polled (watch_exit). A reused pid only keeps it counted longer, never lets its
		 * pages go early. */
		for (size_t k = 0; k < sl->nmappers; k++)
			(void)watch_exit(rc, l, sl->mappers[k], false);
		return true;
	}
	/* Its holder may still map these pages: nobody else gets them before the grace ends. */
	for (size_t k = 0; chunks && k < sl->nchunks; k++)
		if (chunks[k])
			quarantine_add(rc, chunks[k]);
	free(chunks);
	free(lc);
	log_warnx("lease %llu (uid %u) cannot be re-adopted after the restart (%s): its memory is quarantined until "
		  "redeclare-grace-ms ends, then replaced",
		  (unsigned long long)sl->id, (unsigned)sl->uid, why);
	return false;
}

/* Returns 0 when the state was readable (the instance goes on), else a negative errno. */
static int adopt(struct recovery *rc, struct notify_stored *st, int nst, int state_fd, size_t *nadopted)
{
	struct broker *b = rc->b;
	struct store s = { st, nst, NULL, 0 };
	struct recovery_parsed ps;
	size_t adopted = 0, idle = 0;
	int r;

	r = state_fd >= 0 ? parse_state(state_fd, &ps) : -ENODATA;
	if (r < 0 && r != -ENODATA)
		log_warnx("the stored recovery state is unreadable (%s): no lease is re-adopted and every stored pool "
			  "chunk is quarantined until redeclare-grace-ms ends",
			  strerror(-r));
	if (r < 0)
		memset(&ps, 0, sizeof(ps));
	if (store_index(&s) < 0) {
		/* Without the index no fd can be matched to a line: every chunk is quarantined below. */
		recovery_parsed_free(&ps);
		r = -ENOMEM;
	}
	/* Newest claim first: a chunk named by two lines belongs to the later one. */
	for (size_t i = ps.nleases; i-- > 0;)
		if (adopt_lease(rc, &s, &ps.leases[i]))
			adopted++;
		else
			rc->lost_lease = true;
	for (size_t i = 0; i < ps.nidle; i++) {
		int fd = take_chunk_fd(&s, ps.idle_ids[i]);
		char name[32];
		struct stat sb;

		if (fd < 0)
			continue;
		recovery_chunk_name(ps.idle_ids[i], name, sizeof(name));
		/* The pool lends idle chunks as chunks of its classes: another size is not one it made. */
		if (fstat(fd, &sb) < 0 || !pool_is_class(daemon_of(b)->pool, (uint64_t)sb.st_size)) {
			quarantine_fd(rc, fd, ps.idle_ids[i], name);
			continue;
		}
		if (pool_adopt(daemon_of(b)->pool, fd, ps.idle_ids[i], ps.idle_owner[i], false, true, NULL) == 0) {
			idle++;
		} else {
			close(fd);
			notify_fdstore_remove(name);
		}
	}
	/* Stored chunks no line names (made after the last write, or the state is gone): quarantined. */
	for (int i = 0; i < nst; i++) {
		uint64_t id;

		if (st[i].fd < 0)
			continue;
		if (chunk_name_id(st[i].name, &id)) {
			quarantine_fd(rc, st[i].fd, id, st[i].name);
		} else {
			close(st[i].fd);
			notify_fdstore_remove(st[i].name);
		}
		st[i].fd = -1;
	}
	if (r == 0) {
		/* The instance goes on: its ids never repeat, including those of leases already gone. */
		rc->instance_id = ps.desc.instance_id;
		rc->max_lent_id = ps.desc.max_lent_id > ps.max_id ? ps.desc.max_lent_id : ps.max_id;
		lease_table_set_next_id(b->leases, rc->max_lent_id);
		rc->committed = true;
		rc->slot = ps.slot;
		rc->seq = ps.desc.seq;
		rc->body_off = ps.desc.body_off;
		rc->body_len = ps.desc.body_len;
		rc->journal_end = ps.journal_end;
		rc->journal_bytes = ps.journal_bytes;
	}
	recovery_parsed_free(&ps);
	free(s.keys);
	if (adopted || idle || rc->nquarantine)
		log_info(
			"recovered from the fd store: %zu leases (awaiting re-declaration for %u ms), %zu idle chunks, "
			"%zu chunks quarantined until then",
			adopted, daemon_of(b)->cfg->redeclare_grace_ms, idle, rc->nquarantine);
	*nadopted = adopted;
	return r;
}

/* ------------------------------------------------------------ life cycle */

static uint64_t new_instance_id(void)
{
	uint64_t id = 0;

	while (id == 0) {
		if (getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id)) {
			struct timespec ts;

			/* No getrandom (pre-3.17 kernel or seccomp): unique enough across restarts of one host. */
			clock_gettime(CLOCK_REALTIME, &ts);
			id = recovery_format_sum((uint64_t)getpid(), &ts, sizeof(ts));
		}
	}
	return id;
}

void recovery_init(struct broker *b)
{
	struct notify_stored *st = NULL;
	struct recovery *rc;
	int nst = 0, state_fd = -1, r = -ENODATA;
	size_t adopted = 0;

	rc = calloc(1, sizeof(*rc));
	if (!rc)
		fatalx("cannot set up crash recovery: out of memory");
	rc->b = b;
	/*
	 * The writer names exit holds through this hook, so it never calls the revoker (which calls reply.c, which
	 * calls it).
	 */
	rc->hold_pids = revoker_hold_pids;
	rc->state_fd = -1;
	rc->instance_id = new_instance_id();
	daemon_of(b)->recovery = rc;
	if (!notify_enabled())
		return;
	/* Hooks first: chunks dropped while adopting must leave the store too. */
	recovery_store_chunks(rc);
	if (notify_stored_fds(&st, &nst) == 0) {
		for (int i = 0; i < nst; i++)
			if (st[i].fd >= 0 && strcmp(st[i].name, STATE_FDNAME) == 0) {
				if (state_fd < 0)
					state_fd = st[i].fd;
				else
					close(st[i].fd);
				st[i].fd = -1;
			}
		if (state_fd >= 0 || nst > 0)
			r = adopt(rc, st, nst, state_fd, &adopted);
		free(st);
	}
	if (r != 0)
		rc->instance_id = new_instance_id();
	rc->adopted_state = r == 0 && !rc->lost_lease;
	if (state_fd < 0) {
		state_fd = memfd_create("pinbroker-state", MFD_CLOEXEC);
		if (state_fd < 0 || notify_fdstore(state_fd, STATE_FDNAME) < 0) {
			log_warnx("systemd's fd store is not available (set FileDescriptorStoreMax=): leases will not "
				  "survive a daemon restart");
			if (state_fd >= 0)
				close(state_fd);
			pool_set_hooks(daemon_of(b)->pool, NULL);
			quarantine_release(rc);
			return;
		}
	}
	rc->state_fd = state_fd;
	/* Record the adopted world at once: the next crash must not see the previous instance's lines. */
	if (recovery_commit_snapshot(rc) < 0)
		recovery_poison(rc);
	/* Prewarming adds idle chunks next without a broker verb: record them at the first iteration. */
	rc->written_generation = b->generation - 1;
	recovery_writer_start(rc);
	ev_timer_init(&rc->grace, grace_cb, 0., 0.); /* the loop's first turn starts the grace */
	rc->grace.data = rc;
	if (adopted || rc->nquarantine) {
		b->redeclare_grace = true;
		ev_timer_start(daemon_of(b)->loop, &rc->grace);
		/* Test only: a slow start-up after this (RECOVERY_STALL_ENV). */
		timer_clock_stall(timer_clock_stall_ms(RECOVERY_STALL_ENV));
	}
}

void recovery_fini(struct broker *b)
{
	struct recovery *rc = daemon_of(b)->recovery;

	if (!rc)
		return;
	if (rc->state_fd >= 0) {
		recovery_writer_stop(rc);
		ev_timer_stop(daemon_of(b)->loop, &rc->grace);
	}
	quarantine_release(rc);
	/* A clean stop: the state says nothing is lent any more. */
	if (rc->state_fd >= 0) {
		if (ftruncate(rc->state_fd, 0) < 0)
			log_warn("cannot clear the recovery state, ignoring");
		close(rc->state_fd);
	}
	recovery_buf_free(&rc->body);
	recovery_buf_free(&rc->rec);
	free(rc);
	daemon_of(b)->recovery = NULL;
}

bool recovery_adopted_state(const struct broker *b)
{
	return daemon_of(b)->recovery && daemon_of(b)->recovery->adopted_state;
}

uint64_t recovery_instance_id(const struct broker *b)
{
	return daemon_of(b)->recovery ? daemon_of(b)->recovery->instance_id : 0;
}

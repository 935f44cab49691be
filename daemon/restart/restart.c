/* SPDX-License-Identifier: MIT */
/*
 * Restarts that keep the books: the state file a clean stop leaves, and the memory live processes still map after it.
 */
#define _GNU_SOURCE
#include "restart.h"

#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker.h"
#include "budget.h"
#include "config.h"
#include "daemon.h"
#include "holders.h"
#include "lease.h"
#include "log.h"
#include "orphans.h"
#include "pool.h"
#include "recovery.h"
#include "restart-int.h"
#include "revoker.h"
#include "util.h"

/*
 * Why a file, and not only systemd's fd store: systemd 252 empties the store
 * at every stop, `systemctl restart` and a package upgrade's restart included
 * (FileDescriptorStorePreserve= came in 254), and without systemd there is no
 * store at all. The chunks themselves cannot be kept; what a new daemon needs
 * is to know which memfds are still mapped, by whom, so it never lends that
 * memory's budget again. The file names them by (dev, inode); /proc says who
 * still maps them, as fuser does; a pidfd says when a process we may not read
 * has gone.
 */
#define STATE_NAME "restart-state"
/*
 * A lease's pids, as the recovery state keeps them (RECOVERY_MAPPERS_MAX): past this many, the rest are not waited for.
 */
#define SAVE_PIDS_MAX ORPHAN_PIDS_MAX
/*
 * At most this share (1/n) of RLIMIT_NOFILE goes to pidfds of the processes a
 * state file names; the rest are watched by kill(pid, 0), which a reused pid
 * fools only the safe way (held longer).
 */
#define PIDFD_SHARE 4

/* ------------------------------------------------------------ names and paths */

void restart_memfd_name(const struct config *cfg, char *buf, size_t len)
{
	uint32_t h = 2166136261u; /* FNV-1a: a stable tag, not a secret */

	for (const unsigned char *p = (const unsigned char *)cfg->socket_path; p && *p; p++)
		h = (h ^ *p) * 16777619u;
	snprintf(buf, len, "%s.%08x", POOL_MEMFD_NAME, h);
}

int restart_state_path(const struct config *cfg, char *buf, size_t len)
{
	const char *rt = getenv("RUNTIME_DIRECTORY");
	int n;

	if (cfg->restart_state && cfg->restart_state[0])
		n = snprintf(buf, len, "%s", cfg->restart_state);
	else if (rt && rt[0] == '/')
		/* systemd sets it for RuntimeDirectory= (the unit's, kept across stops): its first entry. */
		n = snprintf(buf, len, "%.*s/%s", (int)strcspn(rt, ":"), rt, STATE_NAME);
	else
		n = snprintf(buf, len, "%s.state", cfg->socket_path);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* ------------------------------------------------------------ start */

/* The pool's own memfds (adopted from the fd store, lent, idle or quarantined): never orphans. */
struct ownset {
	struct holders_memfd *k;
	size_t n, cap;
	bool oom;
};

static void own_add(struct ownset *o, int fd)
{
	struct holders_memfd *nk;
	struct stat st;

	if (fd < 0 || fstat(fd, &st) < 0)
		return;
	nk = grow_array(o->k, &o->cap, o->n, sizeof(*nk), 64);
	if (!nk) {
		o->oom = true;
		return;
	}
	o->k = nk;
	o->k[o->n++] = (struct holders_memfd){ .dev = st.st_dev, .ino = st.st_ino };
}

static void own_chunk(const struct chunk *c, void *ud)
{
	own_add(ud, c->fd);
}

static bool own_has(const struct ownset *o, dev_t dev, ino_t ino)
{
	struct holders_memfd k = { .dev = dev, .ino = ino };

	return o->n && bsearch(&k, o->k, o->n, sizeof(*o->k), restart_memfd_cmp);
}

static int push(struct restart *rs, size_t *cap, const struct orphan *o)
{
	struct orphan *nv = grow_array(rs->v, cap, rs->n, sizeof(*nv), 16);

	if (!nv)
		return -ENOMEM;
	rs->v = nv;
	rs->v[rs->n++] = *o;
	return 0;
}

/*
 * Memfds of our name that no state line names: leases of a daemon that died
 * without writing the file (kill -9 without the fd store). Each is counted
 * once, at the largest size seen, against the uid of the first process found
 * with it; a uid's such memory is capped at its quota, so a process that makes
 * memfds of our name can cost the budget no more than its own quota could.
 */
static void add_unnamed(struct restart *rs, size_t *cap, const struct scan *s, const struct ownset *own)
{
	const uint64_t page = 4096;
	struct ownset named = { 0 };
	size_t nv = rs->n;

	/* The memfds the state file named (counted already), sorted for lookup: there may be thousands. */
	for (size_t i = 0; i < nv; i++)
		for (size_t k = 0; k < rs->v[i].nkeys; k++) {
			struct holders_memfd *nk = grow_array(named.k, &named.cap, named.n, sizeof(*nk), 64);

			if (!nk) {
				free(named.k);
				log_warnx("restart: out of memory counting orphaned memory, ignoring");
				return;
			}
			named.k = nk;
			named.k[named.n++] = (struct holders_memfd){ .dev = rs->v[i].keys[k].dev,
								     .ino = rs->v[i].keys[k].ino };
		}
	if (named.n > 1)
		qsort(named.k, named.n, sizeof(*named.k), restart_memfd_cmp);

	for (size_t i = 0; i < s->n;) {
		const struct holders_memfd *m = &s->m[i];
		uint64_t bytes = 0, quota = budget_uid_quota(rs->b->budget);
		struct orphan o = { 0 };
		size_t j = i;

		/*
		 * Sizes are the file's (fstat through fd/N or map_files/), never past a mapping's end,
		 * and no more than the pages it has (st_blocks: shmem and hugetlbfs count them): a
		 * memfd of our name ftruncated far past what it holds costs the budget nothing.
		 */
		uint64_t alloc = UINT64_MAX;

		for (; j < s->n && s->m[j].dev == m->dev && s->m[j].ino == m->ino; j++) {
			if (s->m[j].bytes > bytes)
				bytes = s->m[j].bytes;
			if (s->m[j].allocated < alloc)
				alloc = s->m[j].allocated;
		}
		bool foreign = false, proven = false;

		for (size_t k = i; k < j; k++) {
			foreign |= s->m[k].owner_known && s->m[k].owner != geteuid();
			proven |= s->m[k].owner_known && s->m[k].owner == geteuid();
		}
		if (alloc < bytes)
			bytes = alloc;
		i = j;
		if (bytes == 0 || own_has(own, m->dev, m->ino) || own_has(&named, m->dev, m->ino))
			continue;
		/*
		 * Every chunk is a memfd this daemon's uid made, so its inode is that uid's: one of our
		 * name another uid made (st_uid, which no unprivileged process can change) is not ours,
		 * whatever it is called, and costs nobody any budget.
		 */
		if (foreign) {
			rs->foreign++;
			log_debug("restart: pid %d (uid %u) maps or holds memfd %llu named %s that another uid made: "
				  "not ours, not counted",
				  (int)m->pid, (unsigned)m->uid, (unsigned long long)m->ino, rs->memfd_name);
			continue;
		}
		/* Checked before rounding up, and every sum below stays under MemTotal: nothing wraps. */
		if (bytes > rs->b->mem_total_bytes ||
		    (bytes = (bytes + page - 1) / page * page) > rs->b->mem_total_bytes ||
		    rs->b->orphaned_bytes > rs->b->mem_total_bytes - bytes ||
		    (quota && budget_uid_leased(rs->b->budget, m->uid) > (quota > bytes ? quota - bytes : 0)) ||
		    (quota && bytes > quota)) {
			log_warnx("restart: pid %d (uid %u) maps %llu more bytes of memfds named %s than uid-quota "
				  "allows: "
				  "not counted",
				  (int)m->pid, (unsigned)m->uid, (unsigned long long)bytes, rs->memfd_name);
			continue;
		}
		o.uid = m->uid;
		o.bytes = bytes;
		o.keys = malloc(sizeof(*o.keys));
		o.pidfds = malloc(sizeof(*o.pidfds));
		if (!o.keys || !o.pidfds || push(rs, cap, &o) < 0) {
			orphan_clear(&o);
			log_warnx("restart: out of memory counting orphaned memory, ignoring");
			break;
		}
		if (proven)
			log_debug(
				"restart: pid %d (uid %u) maps or holds memfd %llu (%llu bytes) this daemon's uid made "
				"that no state line names: counted as orphaned",
				(int)m->pid, (unsigned)m->uid, (unsigned long long)m->ino, (unsigned long long)bytes);
		else
			log_warnx(
				"restart: pid %d (uid %u) maps or holds memfd %llu (%llu bytes) named %s that no state "
				"line "
				"names and whose maker cannot be read: counted as orphaned to uid %u until it is "
				"unmapped; if it "
				"is not the earlier daemon's, drop it with `pinctl revoke --orphans --uid %u`",
				(int)m->pid, (unsigned)m->uid, (unsigned long long)m->ino, (unsigned long long)bytes,
				rs->memfd_name, (unsigned)m->uid, (unsigned)m->uid);
		if (budget_charge(rs->b->budget, o.uid, o.bytes) < 0) {
			rs->n--;
			orphan_clear(&o);
			log_warnx("restart: out of memory counting orphaned memory, ignoring");
			break;
		}
		o.keys[0] = (struct orphan_key){ m->dev, m->ino, bytes };
		rs->v[rs->n - 1].nkeys = 1;
		rs->b->orphaned_bytes += o.bytes;
	}
	free(named.k);
}

void restart_init(struct broker *b)
{
	struct restart *rs = calloc(1, sizeof(*rs));
	struct orphan *v = NULL;
	struct ownset own = { 0 };
	struct scan s = { 0 };
	size_t nv = 0, cap = 0, verified = 0;
	const char *why = NULL;
	char *text = NULL, sz[32];
	size_t len = 0;
	bool by_name;
	int r;

	if (!rs)
		fatalx("cannot set up restart accounting: out of memory");
	rs->b = b;
	rs->jfd = -1;
	daemon_of(b)->restart = rs;
	restart_slices_init(rs);
	rs->blind = !holders_can_inspect_all();
	restart_memfd_name(daemon_of(b)->cfg, rs->memfd_name, sizeof(rs->memfd_name));
	read_boot_id(daemon_of(b)->cfg->proc_root, rs->boot_id, sizeof(rs->boot_id));
	ev_timer_init(&rs->rescan, restart_rescan_cb, daemon_of(b)->cfg->orphan_rescan_ms / 1000.0,
		      daemon_of(b)->cfg->orphan_rescan_ms / 1000.0);
	rs->rescan.data = rs;
	if (restart_state_path(daemon_of(b)->cfg, rs->path, sizeof(rs->path)) < 0) {
		log_warnx("the restart state path is too long: a restart will forget what live processes map");
		rs->path[0] = '\0';
	}

	/*
	 * Only this daemon's uid writes it, as one name: one that others may write or link could make it lend what is
	 * mapped.
	 */
	r = rs->path[0] ? read_private_file(rs->path, ORPHANS_STATE_MAX_BYTES, &text, &len, &why) : -ENOENT;
	rs->books = r == -ENOENT ? RESTART_BOOKS_NONE : RESTART_BOOKS_UNKNOWN;
	if (r == -EPERM)
		log_warnx("ignoring the restart state %s: %s", rs->path, why);
	else if (r < 0 && r != -ENOENT)
		log_warnx("cannot read the restart state %s (%s), ignoring", rs->path, strerror(-r));
	if (r == 0) {
		unsigned version = 0;

		r = orphans_parse_version(text, len, rs->boot_id, &v, &nv, &version);
		if (r == -ESTALE)
			log_info("the restart state %s is from another boot: nothing it names still runs", rs->path);
		else if (r < 0)
			log_warnx("the restart state %s is damaged (%s), ignoring it: only memfds named %s that live "
				  "processes map are counted",
				  rs->path, strerror(-r), rs->memfd_name);
		rs->books = r == 0 && version >= 2   ? RESTART_BOOKS_COMPLETE
			    : r == 0 || r == -ESTALE ? RESTART_BOOKS_PARTIAL
						     : RESTART_BOOKS_UNKNOWN;
	}
	free(text);
	/*
	 * One pidfd per distinct named pid (a pid named by many lines gets one; the others are
	 * watched by kill), up to a share of the fd limit: past it (or when pidfd_open fails with
	 * anything but ESRCH, EMFILE say) the pid is still held, watched by kill(pid, 0). Only
	 * ESRCH means the process is gone.
	 */
	{
		struct rlimit rl;
		uint64_t left = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
					? (uint64_t)rl.rlim_cur / PIDFD_SHARE
					: 65536;
		size_t np = 0, nd = 0;
		pid_t *d;
		bool *done;

		for (size_t i = 0; i < nv; i++)
			np += v[i].npids;
		d = malloc((np ? np : 1) * sizeof(*d));
		done = calloc(np ? np : 1, sizeof(*done));
		if (d && done) {
			for (size_t i = 0; i < nv; i++)
				for (size_t k = 0; k < v[i].npids; k++)
					d[nd++] = v[i].pids[k];
			if (nd > 1)
				qsort(d, nd, sizeof(*d), restart_pid_cmp);
		}
		for (size_t i = 0; i < nv; i++)
			for (size_t k = 0; k < v[i].npids; k++) {
				pid_t *at = nd ? bsearch(&v[i].pids[k], d, nd, sizeof(*d), restart_pid_cmp) : NULL;
				int fd;

				/* bsearch lands on any of the equal entries: the first marks the pid. */
				while (at && at > d && at[-1] == *at)
					at--;
				if (at && done[at - d]) {
					v[i].pidfds[k] = PIDFD_NONE;
					continue;
				}
				if (at)
					done[at - d] = true;
				fd = left > 0 ? sys_pidfd_open(v[i].pids[k], 0) : -1;
				if (fd >= 0)
					left--;
				else if (left == 0 || errno != ESRCH)
					fd = PIDFD_NONE;
				v[i].pidfds[k] = fd;
			}
		free(d);
		free(done);
	}

	/*
	 * After a crash under systemd the fd store gave every lent chunk back to the pool: nothing to
	 * look for by name, and a restart loop need not pay a pass over /proc each time (about 1 ms per
	 * process on a busy 2-CPU VM). Otherwise (a clean stop, no fd store, or its state unreadable)
	 * memfds of our name that live processes hold are this daemon's predecessors'.
	 */
	/*
	 * A version 2 file names every lease whose fds ever left (each appended before they did), so
	 * a memfd of our name it does not name was never lent: it is not looked for. Only without
	 * such a file (an older daemon's, none, or damaged) are memfds found by name counted.
	 */
	by_name = !recovery_adopted_state(b) && rs->books != RESTART_BOOKS_COMPLETE;
	restart_journal_start(rs);
	if (!by_name && nv == 0) {
		restart_journal_rewrite(b);
		return;
	}
	pool_foreach_chunk(daemon_of(b)->pool, own_chunk, &own);
	if (own.n > 1)
		qsort(own.k, own.n, sizeof(*own.k), restart_memfd_cmp);
	/*
	 * With the file's names alone, nothing is lent on a scan's word before the loop runs: every
	 * named lease is counted now, and the first rescan (sliced, from the loop's first turn) lets go
	 * of what nothing holds. By name, the scan must end before anything is lent.
	 */
	r = by_name ? restart_scan_proc(rs, &s, false) : 0;
	if (r < 0)
		log_warnx("restart: cannot scan %s/proc (%s): memory the previous daemon lent is counted only while "
			  "the processes it names run",
			  daemon_of(b)->cfg->proc_root, strerror(-r));
	for (size_t i = 0; i < nv; i++) {
		struct orphan *o = &v[i];
		bool adopted = false;

		for (size_t k = 0; k < o->nkeys && !adopted; k++)
			adopted = own_has(&own, o->keys[k].dev, o->keys[k].ino);
		if (adopted || (by_name && !restart_orphan_held(o, &s))) {
			restart_orphan_close(o);
			continue;
		}
		/*
		 * The sizes are the file's, never what /proc shows: the file is this daemon's own (root's,
		 * 0600), while a mapping's end is the holder's to choose (mremap can stretch it past the
		 * memfd's end, PROT_NONE), which would let a holder inflate its lease past MemTotal (the
		 * line dropped, the real lease forgotten) or wrap the count.
		 * No lease was ever larger than the host's memory: a line that says so was not written by us.
		 */
		if (o->bytes > b->mem_total_bytes || b->orphaned_bytes > UINT64_MAX - o->bytes) {
			log_warnx("restart: ignoring the state line of lease %llu: %llu bytes is more than MemTotal",
				  (unsigned long long)o->lease_id, (unsigned long long)o->bytes);
			restart_orphan_close(o);
			continue;
		}
		if (budget_charge(b->budget, o->uid, o->bytes) < 0) {
			restart_orphan_close(o);
			continue;
		}
		if (push(rs, &cap, o) < 0) {
			budget_uncharge(b->budget, o->uid, o->bytes);
			restart_orphan_close(o);
			continue;
		}
		b->orphaned_bytes += o->bytes;
		verified++;
	}
	free(v);
	if (r == 0 && by_name)
		add_unnamed(rs, &cap, &s, &own);
	restart_scan_free(&s);
	/*
	 * No usable state file: the daemon this one replaces may be of the release before the tag.
	 * Only as the packaged unit (RuntimeDirectory= sets RUNTIME_DIRECTORY), the one a package
	 * upgrade restarts: elsewhere the untagged name is anyone's (a test's pool, a second
	 * instance), and counting it would charge another daemon's or program's memory here.
	 */
	if (r == 0 && by_name && nv == 0 && getenv("RUNTIME_DIRECTORY")) {
		if (restart_scan_legacy(rs, &s) == 0) {
			size_t before = rs->n;

			add_unnamed(rs, &cap, &s, &own);
			restart_scan_free(&s);
			/* Rescans look for the legacy name too only while something of that name is counted. */
			rs->legacy = rs->n > before;
		}
	}
	restart_filter_build(rs);
	rs->backoff = 1;
	free(own.k);
	if (rs->foreign)
		log_info("restart: %zu memfd%s named %s that other uids made (not this daemon's chunks): not counted",
			 rs->foreign, rs->foreign == 1 ? "" : "s", rs->memfd_name);
	if (rs->n) {
		log_warnx("restart: %zu lease%s of the previous daemon (%s) %s (%zu named by %s, %zu found by memfd "
			  "name): counted as orphaned until they let go",
			  rs->n, rs->n == 1 ? "" : "s", format_size(b->orphaned_bytes, sz, sizeof(sz)),
			  by_name ? "are still mapped by live processes" : "may still be mapped", verified,
			  rs->path[0] ? rs->path : "(no state file)", rs->n - verified);
		ev_timer_start(daemon_of(b)->loop, &rs->rescan);
		/* The file's names alone: the first rescan starts at the loop's first turn, in slices. */
		if (!by_name)
			restart_rescan_begin(rs);
	}
	if (rs->blind && by_name && rs->books != RESTART_BOOKS_NONE) {
		snprintf(rs->warning, sizeof(rs->warning),
			 "the restart state %s is %s and other uids' /proc cannot be read (no CAP_SYS_PTRACE): memory "
			 "the previous daemon lent to other uids cannot be seen and is not counted",
			 rs->path,
			 rs->books == RESTART_BOOKS_UNKNOWN ? "unusable"
							    : "incomplete (an older daemon's, or another boot's)");
		log_warnx("restart: %s; memory may be pinned past the budget until those processes exit", rs->warning);
	} else if (rs->books == RESTART_BOOKS_UNKNOWN) {
		snprintf(rs->warning, sizeof(rs->warning),
			 "the restart state %s was unusable: only memfds named %s found in /proc were counted",
			 rs->path, rs->memfd_name);
	}
	/* The file now says what this daemon counts: a crash before the next clean stop reads that. */
	restart_journal_rewrite(b);
}

const char *restart_books_name(const struct broker *b)
{
	static const char *const names[] = { "none", "complete", "partial", "unknown" };
	const struct restart *rs = daemon_of(b)->restart;

	return rs ? names[rs->books] : "none";
}

const char *restart_warning(const struct broker *b)
{
	return daemon_of(b)->restart && daemon_of(b)->restart->warning[0] ? daemon_of(b)->restart->warning : NULL;
}

void restart_scan_counts(const struct broker *b, uint64_t *scans, uint64_t *slices, uint64_t *stats)
{
	const struct restart *rs = daemon_of(b)->restart;

	*scans = rs ? rs->stats.scans : 0;
	*slices = rs ? rs->stats.slices : 0;
	*stats = rs ? rs->stats.stats : 0;
}

int restart_drop_orphans(struct broker *b, bool all, uid_t uid, size_t *count, uint64_t *bytes)
{
	struct restart *rs = daemon_of(b)->restart;
	size_t kept = 0;

	*count = 0;
	*bytes = 0;
	if (!rs)
		return 0;
	for (size_t i = 0; i < rs->n; i++) {
		struct orphan *o = &rs->v[i];

		if (!all && o->uid != uid) {
			rs->v[kept++] = *o;
			continue;
		}
		log_event(
			EV_LEASE_RELEASED, LOG_WARNING, o->lease_id, o->uid, o->npids ? o->pids[0] : 0,
			"orphaned memory (lease %llu of the previous daemon, %llu bytes, uid %u) dropped by an admin: "
			"no longer counted, though a process may still map it",
			(unsigned long long)o->lease_id, (unsigned long long)o->bytes, (unsigned)o->uid);
		(*count)++;
		*bytes += o->bytes;
		restart_uncharge(rs, o);
		restart_orphan_close(o);
	}
	rs->n = kept;
	if (*count) {
		restart_journal_rewrite(b);
		restart_filter_build(rs);
		if (rs->n == 0)
			ev_timer_stop(daemon_of(b)->loop, &rs->rescan);
		broker_memory_freed(b);
	}
	return 0;
}

/* ------------------------------------------------------------ stop */

/* Every exit hold, sorted by lease id: one walk over the revoker's processes, then a bsearch per lease. */
struct holds {
	struct hold {
		uint64_t id;
		pid_t pid;
	} * v;
	size_t n, cap;
	bool oom;
};

static void hold_add(uint64_t id, pid_t pid, void *ud)
{
	struct holds *h = ud;
	struct hold *nv;

	if (h->oom)
		return;
	nv = grow_array(h->v, &h->cap, h->n, sizeof(*nv), 64);
	if (!nv) {
		h->oom = true;
		return;
	}
	h->v = nv;
	h->v[h->n++] = (struct hold){ id, pid };
}

static int hold_cmp(const void *a, const void *b)
{
	const struct hold *x = a, *y = b;

	return x->id < y->id ? -1 : x->id > y->id;
}

/* The pids holding lease id until they exit, at most max: as revoker_hold_pids, without a walk per lease. */
static size_t holds_pids(const struct holds *h, uint64_t id, pid_t *out, size_t max)
{
	size_t lo = 0, hi = h->n, n = 0;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (h->v[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < h->n && h->v[lo].id == id && n < max; lo++)
		out[n++] = h->v[lo].pid;
	return n;
}

void restart_save(struct broker *b)
{
	struct restart *rs = daemon_of(b)->restart;
	struct holds holds = { 0 };
	struct orphan *v;
	size_t n = 0, cap;

	if (!rs || !rs->path[0])
		return;
	/* From here the file is the clean stop's: closing connections must not rewrite it. */
	restart_journal_stop(rs);
	rs->saved = true;
	/*
	 * revoker_hold_pids per lease walks every hold: 100k held ids made that 10^10 steps at a
	 * stop, long past systemd's stop timeout. Index them once instead (qsort is stable enough:
	 * the pids of one id come in any order, as revoker_hold_pids gives them).
	 */
	revoker_foreach_hold(b, hold_add, &holds);
	if (holds.oom) {
		log_warnx("cannot write the restart state: out of memory");
		free(holds.v);
		return;
	}
	if (holds.n > 1)
		qsort(holds.v, holds.n, sizeof(*holds.v), hold_cmp);
	cap = rs->n + lease_count(b->leases);
	v = calloc(cap ? cap : 1, sizeof(*v));
	if (!v) {
		log_warnx("cannot write the restart state: out of memory");
		free(holds.v);
		return;
	}
	for (size_t i = 0; i < rs->n; i++)
		v[n++] = rs->v[i]; /* shallow: written, not freed here */
	for (const struct lease *l = lease_first(b->leases); l && n < cap; l = lease_next(b->leases, l)) {
		struct orphan *o = &v[n];
		pid_t pids[SAVE_PIDS_MAX];
		size_t np = 0;

		if (!l->holder_detached && l->pid > 0)
			pids[np++] = l->pid;
		for (size_t i = 0; i < l->nattachers && np < SAVE_PIDS_MAX; i++)
			if (l->attachers[i].pid > 0)
				pids[np++] = l->attachers[i].pid;
		if (l->exit_holds > 0 && np < SAVE_PIDS_MAX)
			np += holds_pids(&holds, l->id, pids + np, SAVE_PIDS_MAX - np);
		o->lease_id = l->id;
		o->uid = l->uid;
		o->bytes = l->bytes;
		o->keys = calloc(l->nchunks ? l->nchunks : 1, sizeof(*o->keys));
		o->pids = malloc((np ? np : 1) * sizeof(*o->pids));
		if (!o->keys || !o->pids) {
			free(o->keys);
			free(o->pids);
			continue;
		}
		for (size_t k = 0; k < l->nchunks; k++) {
			struct stat st;

			if (fstat(l->chunks[k].mem->fd, &st) == 0)
				o->keys[o->nkeys++] = (struct orphan_key){ st.st_dev, st.st_ino,
									   l->chunks[k].mem->bytes };
		}
		memcpy(o->pids, pids, np * sizeof(*pids));
		o->npids = np;
		/* Chunks that cannot be named: held by the pids alone, as a registration is. */
		if (o->nkeys != l->nchunks)
			o->nkeys = 0;
		if (o->nkeys == 0 && o->npids == 0) {
			free(o->keys);
			free(o->pids);
			continue;
		}
		n++;
	}
	restart_write_state(rs, v, n);
	restart_journal_stop(rs);
	if (n > rs->n)
		log_info("restart state: %zu lease%s still mapped written to %s for the next daemon", n - rs->n,
			 n - rs->n == 1 ? "" : "s", rs->path);
	for (size_t i = rs->n; i < n; i++) {
		free(v[i].keys);
		free(v[i].pids);
	}
	free(v);
	free(holds.v);
}

void restart_fini(struct broker *b)
{
	struct restart *rs = daemon_of(b)->restart;

	if (!rs)
		return;
	ev_timer_stop(daemon_of(b)->loop, &rs->rescan);
	restart_slices_stop(rs);
	restart_journal_stop(rs);
	for (size_t i = 0; i < rs->n; i++) {
		restart_uncharge(rs, &rs->v[i]);
		restart_orphan_close(&rs->v[i]);
	}
	free(rs->uids);
	free(rs->named);
	free(rs->v);
	free(rs);
	daemon_of(b)->restart = NULL;
}

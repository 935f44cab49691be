/* SPDX-License-Identifier: MIT */
/* Restarts that keep the books: the state file a clean stop leaves, and the memory live processes still map after it. */
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
#include "holders.h"
#include "lease.h"
#include "log.h"
#include "orphans.h"
#include "pool.h"
#include "recovery.h"
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
#define BOOT_ID_BYTES 64
/* A lease's pids, as recovery.c keeps them: past this many, the rest are not waited for. */
#define SAVE_PIDS_MAX ORPHAN_PIDS_MAX
/* While no orphan is let go, the rescan interval doubles up to this many times orphan-rescan-ms (2 s: 2 min). */
#define RESCAN_BACKOFF_MAX 60u
/*
 * At most this share (1/n) of RLIMIT_NOFILE goes to pidfds of the processes a
 * state file names; the rest are watched by kill(pid, 0), which a reused pid
 * fools only the safe way (held longer).
 */
#define PIDFD_SHARE 4
/* A pid the state file names but no pidfd watches (none opened: over the bound, or EMFILE and the like). */
#define PIDFD_NONE (-2)
/*
 * The name every chunk had before chunks carried their socket's tag
 * (pinbroker-chunk.<hash>). Matched too when no state file is usable, so the
 * upgrade that brings the tag keeps the books of the daemon it replaces. One
 * release of compatibility: remove with the release after.
 */
#define LEGACY_MEMFD_NAME POOL_MEMFD_NAME

struct restart {
	struct broker *b;
	char path[PATH_MAX];
	char boot_id[BOOT_ID_BYTES];
	char memfd_name[POOL_MEMFD_NAME_MAX];
	struct orphan *v;
	size_t n;
	bool legacy;       /* some orphans were found by the legacy name: rescans look for it too */
	unsigned backoff;  /* the scan interval now, in orphan-rescan-ms ticks: 1, doubled while nothing goes */
	unsigned ticks;    /* ticks since the last scan */
	uid_t *uids;       /* sorted: the uids that own an orphan, and 0 (a process not dumpable shows as root) */
	size_t nuids;
	pid_t *named;      /* sorted: every pid the orphans name */
	size_t nnamed;
	ev_timer rescan;
};

/* One scan of /proc: every mapping or fd of our memfd name, and the processes read to the end. */
struct scan {
	struct holders_memfd *m;
	size_t n, cap;
	pid_t *read;
	size_t nread, capread;
	bool oom;
};

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

static void read_boot_id(const char *proc_root, char *buf, size_t len)
{
	char path[PATH_MAX];
	FILE *f;

	buf[0] = '\0';
	snprintf(path, sizeof(path), "%s/proc/sys/kernel/random/boot_id", proc_root ? proc_root : "");
	f = fopen(path, "re");
	if (!f)
		return;
	if (!fgets(buf, (int)len, f))
		buf[0] = '\0';
	fclose(f);
	buf[strcspn(buf, "\n")] = '\0';
	/* Only the kernel's uuid text goes into the file's "boot" line. */
	for (char *p = buf; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') || *p == '-')) {
			buf[0] = '\0';
			return;
		}
}

/* ------------------------------------------------------------ the file */

/* The file's text, or -ENOENT when there is none; -EPERM (with *why) when it is not one this daemon wrote. */
static int read_state(const char *path, char **ret, size_t *len, const char **why)
{
	struct stat st;
	char *buf;
	size_t have = 0;
	int fd, r;

	*ret = NULL;
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		*why = errno == ELOOP ? "it is a symbolic link" : strerror(errno);
		return errno == ENOENT ? -ENOENT : -EPERM;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		*why = "it is not a regular file";
		r = -EPERM;
		goto out;
	}
	/* Only this daemon's uid writes it; one others may write could make it lend what is mapped. */
	if (st.st_uid != geteuid()) {
		*why = "another user owns it";
		r = -EPERM;
		goto out;
	}
	if (st.st_mode & (S_IWGRP | S_IWOTH)) {
		*why = "its group or others may write it";
		r = -EPERM;
		goto out;
	}
	if ((uint64_t)st.st_size > ORPHANS_STATE_MAX_BYTES) {
		*why = "it is larger than any this daemon writes";
		r = -EPERM;
		goto out;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		r = -ENOMEM;
		goto out;
	}
	while (have < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + have, (size_t)st.st_size - have);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		have += (size_t)n;
	}
	buf[have] = '\0';
	*ret = buf;
	*len = have;
	r = 0;
out:
	close(fd);
	return r;
}

/* Replace the file atomically with v (or remove it when v is empty). */
static void write_state(const struct restart *rs, const struct orphan *v, size_t n)
{
	char tmp[PATH_MAX + 8], *text = NULL;
	size_t len = 0, done = 0;
	int fd, r;

	if (n == 0) {
		if (unlink(rs->path) < 0 && errno != ENOENT)
			log_warn("cannot remove the restart state %s, ignoring", rs->path);
		return;
	}
	r = orphans_format(v, n, rs->boot_id, &text, &len);
	if (r < 0) {
		log_warnx("cannot write the restart state %s: %s; a restart now forgets what live processes map",
			  rs->path, strerror(-r));
		return;
	}
	snprintf(tmp, sizeof(tmp), "%s.XXXXXX", rs->path);
	/* mkostemp: a new file of mode 0600, never one planted at a guessable name. */
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		log_warn("cannot write the restart state %s; a restart now forgets what live processes map", rs->path);
		free(text);
		return;
	}
	while (done < len) {
		ssize_t w = write(fd, text + done, len - done);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		done += (size_t)w;
	}
	r = done == len && fdatasync(fd) == 0 ? 0 : -1;
	if (close(fd) < 0)
		r = -1;
	if (r == 0 && rename(tmp, rs->path) == 0) {
		free(text);
		return;
	}
	log_warn("cannot write the restart state %s; a restart now forgets what live processes map", rs->path);
	unlink(tmp);
	free(text);
}

/* ------------------------------------------------------------ scanning */

static void on_memfd(const struct holders_memfd *m, void *ud)
{
	struct scan *s = ud;

	struct holders_memfd *nm = grow_array(s->m, &s->cap, s->n, sizeof(*nm), 64);

	if (!nm) {
		s->oom = true;
		return;
	}
	s->m = nm;
	s->m[s->n++] = *m;
}

static void on_read(pid_t pid, void *ud)
{
	struct scan *s = ud;

	pid_t *np = grow_array(s->read, &s->capread, s->nread, sizeof(*np), 256);

	if (!np) {
		s->oom = true;
		return;
	}
	s->read = np;
	s->read[s->nread++] = pid;
}

static int memfd_cmp(const void *a, const void *b)
{
	const struct holders_memfd *x = a, *y = b;

	if (x->ino != y->ino)
		return x->ino < y->ino ? -1 : 1;
	if (x->dev != y->dev)
		return x->dev < y->dev ? -1 : 1;
	return 0;
}

static int pid_cmp(const void *a, const void *b)
{
	pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;

	return x < y ? -1 : x > y;
}

static void scan_free(struct scan *s)
{
	free(s->m);
	free(s->read);
	memset(s, 0, sizeof(*s));
}

static int uid_cmp(const void *a, const void *b)
{
	uid_t x = *(const uid_t *)a, y = *(const uid_t *)b;

	return x < y ? -1 : x > y;
}

struct scan_filter {
	const struct restart *rs;
	struct scan *s;
};

/* A rescan reads only processes of a uid that owns an orphan, or that the state file names. */
static bool want_pid(pid_t pid, uid_t dir_uid, void *ud)
{
	const struct restart *rs = ((struct scan_filter *)ud)->rs;

	return (rs->nuids && bsearch(&dir_uid, rs->uids, rs->nuids, sizeof(uid_t), uid_cmp)) ||
	       (rs->nnamed && bsearch(&pid, rs->named, rs->nnamed, sizeof(pid_t), pid_cmp));
}

static void on_memfd_f(const struct holders_memfd *m, void *ud)
{
	on_memfd(m, ((struct scan_filter *)ud)->s);
}

static void on_read_f(pid_t pid, void *ud)
{
	on_read(pid, ((struct scan_filter *)ud)->s);
}

/*
 * One pass over /proc (two while orphans of the legacy name are counted); a
 * rescan (filtered) reads only the processes want_pid picks. Returns 0, or
 * -errno (then nothing may be let go on its word).
 */
static int scan_proc(const struct restart *rs, struct scan *s, bool filtered)
{
	struct scan_filter f = { rs, s };
	size_t unreadable = 0;
	uint64_t t0_us = now_us();
	int r;

	memset(s, 0, sizeof(*s));
	r = holders_scan_memfds_of(rs->b->cfg->proc_root, rs->memfd_name, filtered ? want_pid : NULL, on_memfd_f,
				   on_read_f, &f, &unreadable);
	if (r == 0 && rs->legacy) {
		/* A process read to the end in both passes is reported twice: harmless for bsearch. */
		r = holders_scan_memfds_of(rs->b->cfg->proc_root, LEGACY_MEMFD_NAME, filtered ? want_pid : NULL,
					   on_memfd_f, NULL, &f, NULL);
	}
	log_debug("restart: /proc scan for memfds named %s%s: %zu found, %zu processes read, %zu unreadable, %.1f ms",
		  rs->memfd_name, rs->legacy ? " and " LEGACY_MEMFD_NAME : "", s->n, s->nread, unreadable,
		  (double)(now_us() - t0_us) / 1000.0);
	if (r == 0 && s->oom)
		r = -ENOMEM;
	if (r < 0) {
		scan_free(s);
		return r;
	}
	if (s->n > 1)
		qsort(s->m, s->n, sizeof(*s->m), memfd_cmp);
	if (s->nread > 1)
		qsort(s->read, s->nread, sizeof(*s->read), pid_cmp);
	return 0;
}

static const struct holders_memfd *scan_find(const struct scan *s, dev_t dev, ino_t ino)
{
	struct holders_memfd k = { .dev = dev, .ino = ino };

	return s->n ? bsearch(&k, s->m, s->n, sizeof(*s->m), memfd_cmp) : NULL;
}

static bool scan_read(const struct scan *s, pid_t pid)
{
	return s->nread && bsearch(&pid, s->read, s->nread, sizeof(pid), pid_cmp);
}

/* Whether pid still runs, for a pid no pidfd watches: only ESRCH says it is gone (EPERM: it runs). */
static bool pid_runs(pid_t pid)
{
	return kill(pid, 0) == 0 || errno != ESRCH;
}

static bool pidfd_exited(int pidfd)
{
	struct pollfd p = { .fd = pidfd, .events = POLLIN };

	/* A pidfd polls readable once its process has exited. */
	return poll(&p, 1, 0) > 0;
}

/*
 * Does anything still hold o? A mapping or fd of one of its memfds seen in
 * this scan does; so does a process it names that still runs and whose /proc
 * this daemon could not read (it may map them unseen). Pidfds of processes
 * gone are closed on the way.
 */
static bool orphan_held(struct orphan *o, const struct scan *s)
{
	bool held = false;

	for (size_t k = 0; k < o->nkeys && !held; k++)
		held = scan_find(s, o->keys[k].dev, o->keys[k].ino) != NULL;
	for (size_t i = 0; i < o->npids; i++) {
		if (o->pidfds[i] == -1)
			continue;
		if (o->pidfds[i] == PIDFD_NONE ? !pid_runs(o->pids[i]) : pidfd_exited(o->pidfds[i])) {
			if (o->pidfds[i] >= 0)
				close(o->pidfds[i]);
			o->pidfds[i] = -1;
			continue;
		}
		/* Read to the end and none of its memfds seen: that process let go. A registration
		 * (no memfds) is its program's own memory: held while the program runs. */
		if (o->nkeys == 0 || !scan_read(s, o->pids[i]))
			held = true;
	}
	return held;
}

static void orphan_close(struct orphan *o)
{
	for (size_t i = 0; o->pidfds && i < o->npids; i++)
		if (o->pidfds[i] >= 0)
			close(o->pidfds[i]);
	orphan_clear(o);
}

/* The uids and pids a rescan reads (want_pid), from the orphans counted now. */
static void filter_build(struct restart *rs)
{
	size_t np = 0, nu = 0;
	uid_t *u;
	pid_t *p;

	for (size_t i = 0; i < rs->n; i++)
		np += rs->v[i].npids;
	u = malloc((rs->n + 1) * sizeof(*u));
	p = malloc((np ? np : 1) * sizeof(*p));
	if (!u || !p) {
		/* Without the tables every process is read: slower, never wrong. */
		free(u);
		free(p);
		u = NULL;
		p = NULL;
	}
	free(rs->uids);
	free(rs->named);
	rs->uids = u;
	rs->named = p;
	rs->nuids = rs->nnamed = 0;
	if (!u)
		return;
	u[nu++] = 0;
	np = 0;
	for (size_t i = 0; i < rs->n; i++) {
		u[nu++] = rs->v[i].uid;
		for (size_t k = 0; k < rs->v[i].npids; k++)
			p[np++] = rs->v[i].pids[k];
	}
	qsort(u, nu, sizeof(*u), uid_cmp);
	if (np > 1)
		qsort(p, np, sizeof(*p), pid_cmp);
	rs->nuids = nu;
	rs->nnamed = np;
}

static void uncharge(struct restart *rs, struct orphan *o)
{
	struct broker *b = rs->b;

	budget_uncharge(b->budget, o->uid, o->bytes);
	b->orphaned_bytes -= o->bytes;
}

/* Drop what nothing holds any more. Returns how many went. */
static size_t let_go(struct restart *rs, const struct scan *s)
{
	size_t kept = 0, gone = 0;

	for (size_t i = 0; i < rs->n; i++) {
		struct orphan *o = &rs->v[i];

		if (orphan_held(o, s)) {
			rs->v[kept++] = *o;
			continue;
		}
		log_event(EV_LEASE_RELEASED, LOG_NOTICE, o->lease_id, o->uid, o->npids ? o->pids[0] : 0,
			  "orphaned memory of the previous daemon (lease %llu, %llu bytes, uid %u) is no longer mapped "
			  "by any live process: no longer counted",
			  (unsigned long long)o->lease_id, (unsigned long long)o->bytes, (unsigned)o->uid);
		uncharge(rs, o);
		orphan_close(o);
		gone++;
	}
	rs->n = kept;
	return gone;
}

/*
 * Has a process the state file names exited since the last look? One poll per
 * pidfd (no /proc read), so no more than the pidfds opened (a share of the fd
 * limit); pids without one are looked at by the scans alone.
 */
static bool named_pid_exited(const struct restart *rs)
{
	for (size_t i = 0; i < rs->n; i++)
		for (size_t k = 0; k < rs->v[i].npids; k++)
			if (rs->v[i].pidfds[k] >= 0 && pidfd_exited(rs->v[i].pidfds[k]))
				return true;
	return false;
}

static void rescan_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct restart *rs = w->data;
	struct scan s;
	int r;

	/* orphan-rescan-ms may have changed at a reload: libev re-arms with repeat after this call. */
	w->repeat = rs->b->cfg->orphan_rescan_ms / 1000.0;
	/*
	 * A holder that keeps its lease for hours would otherwise cost a pass over /proc every
	 * orphan-rescan-ms: while nothing goes, a pass comes every backoff ticks (doubling up to
	 * RESCAN_BACKOFF_MAX). A process the file names exiting is seen at the next tick (its
	 * pidfd, no /proc read) and brings the pass forward.
	 */
	if (++rs->ticks < rs->backoff && !named_pid_exited(rs))
		return;
	rs->ticks = 0;

	/* Filtered: a uid with nothing orphaned can make processes, never make this scan read them. */
	r = scan_proc(rs, &s, rs->uids != NULL);
	if (r < 0) {
		log_debug("restart: cannot scan /proc for orphaned memory (%s); trying again", strerror(-r));
		rs->backoff = 1;
	} else if (let_go(rs, &s) > 0) {
		write_state(rs, rs->v, rs->n);
		filter_build(rs);
		broker_memory_freed(rs->b);
		rs->backoff = 1;
	} else {
		rs->backoff = rs->backoff * 2 > RESCAN_BACKOFF_MAX ? RESCAN_BACKOFF_MAX : rs->backoff * 2;
	}
	if (r < 0)
		return;
	scan_free(&s);
	if (rs->n == 0)
		ev_timer_stop(loop, w);
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

	return o->n && bsearch(&k, o->k, o->n, sizeof(*o->k), memfd_cmp);
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
		qsort(named.k, named.n, sizeof(*named.k), memfd_cmp);

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
		if (alloc < bytes)
			bytes = alloc;
		i = j;
		if (bytes == 0 || own_has(own, m->dev, m->ino) || own_has(&named, m->dev, m->ino))
			continue;
		/* Checked before rounding up, and every sum below stays under MemTotal: nothing wraps. */
		if (bytes > rs->b->mem_total_bytes ||
		    (bytes = (bytes + page - 1) / page * page) > rs->b->mem_total_bytes ||
		    rs->b->orphaned_bytes > rs->b->mem_total_bytes - bytes ||
		    (quota && budget_uid_leased(rs->b->budget, m->uid) > (quota > bytes ? quota - bytes : 0)) ||
		    (quota && bytes > quota)) {
			log_warnx(
				"restart: pid %d (uid %u) maps %llu more bytes of memfds named %s than uid-quota allows: "
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
		log_debug("restart: pid %d (uid %u) maps or holds memfd %llu (%llu bytes) that no state line names: "
			  "counted as orphaned",
			  (int)m->pid, (unsigned)m->uid, (unsigned long long)m->ino, (unsigned long long)bytes);
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

/* One unfiltered pass for the legacy name alone. */
static int scan_legacy(const struct restart *rs, struct scan *s)
{
	struct scan_filter f = { rs, s };
	int r;

	memset(s, 0, sizeof(*s));
	r = holders_scan_memfds_of(rs->b->cfg->proc_root, LEGACY_MEMFD_NAME, NULL, on_memfd_f, NULL, &f, NULL);
	if (r == 0 && s->oom)
		r = -ENOMEM;
	if (r < 0) {
		scan_free(s);
		return r;
	}
	if (s->n > 1)
		qsort(s->m, s->n, sizeof(*s->m), memfd_cmp);
	return 0;
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
	b->restart = rs;
	restart_memfd_name(b->cfg, rs->memfd_name, sizeof(rs->memfd_name));
	read_boot_id(b->cfg->proc_root, rs->boot_id, sizeof(rs->boot_id));
	ev_timer_init(&rs->rescan, rescan_cb, b->cfg->orphan_rescan_ms / 1000.0, b->cfg->orphan_rescan_ms / 1000.0);
	rs->rescan.data = rs;
	if (restart_state_path(b->cfg, rs->path, sizeof(rs->path)) < 0) {
		log_warnx("the restart state path is too long: a restart will forget what live processes map");
		rs->path[0] = '\0';
	}

	r = rs->path[0] ? read_state(rs->path, &text, &len, &why) : -ENOENT;
	if (r == -EPERM)
		log_warnx("ignoring the restart state %s: %s", rs->path, why);
	else if (r < 0 && r != -ENOENT)
		log_warnx("cannot read the restart state %s (%s), ignoring", rs->path, strerror(-r));
	if (r == 0) {
		r = orphans_parse(text, len, rs->boot_id, &v, &nv);
		if (r == -ESTALE)
			log_info("the restart state %s is from another boot: nothing it names still runs", rs->path);
		else if (r < 0)
			log_warnx("the restart state %s is damaged (%s), ignoring it: only memfds named %s that live "
				  "processes map are counted",
				  rs->path, strerror(-r), rs->memfd_name);
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
		uint64_t left = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ?
					(uint64_t)rl.rlim_cur / PIDFD_SHARE :
					65536;
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
				qsort(d, nd, sizeof(*d), pid_cmp);
		}
		for (size_t i = 0; i < nv; i++)
			for (size_t k = 0; k < v[i].npids; k++) {
				pid_t *at = nd ? bsearch(&v[i].pids[k], d, nd, sizeof(*d), pid_cmp) : NULL;
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
	by_name = !recovery_adopted_state(b);
	if (!by_name && nv == 0) {
		if (rs->path[0])
			write_state(rs, NULL, 0);
		return;
	}
	pool_foreach_chunk(b->pool, own_chunk, &own);
	if (own.n > 1)
		qsort(own.k, own.n, sizeof(*own.k), memfd_cmp);
	r = scan_proc(rs, &s, false);
	if (r < 0)
		log_warnx("restart: cannot scan %s/proc (%s): memory the previous daemon lent is counted only while "
			  "the processes it names run",
			  b->cfg->proc_root, strerror(-r));
	for (size_t i = 0; i < nv; i++) {
		struct orphan *o = &v[i];
		bool adopted = false;

		for (size_t k = 0; k < o->nkeys && !adopted; k++)
			adopted = own_has(&own, o->keys[k].dev, o->keys[k].ino);
		if (adopted || !orphan_held(o, &s)) {
			orphan_close(o);
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
			orphan_close(o);
			continue;
		}
		if (budget_charge(b->budget, o->uid, o->bytes) < 0) {
			orphan_close(o);
			continue;
		}
		if (push(rs, &cap, o) < 0) {
			budget_uncharge(b->budget, o->uid, o->bytes);
			orphan_close(o);
			continue;
		}
		b->orphaned_bytes += o->bytes;
		verified++;
	}
	free(v);
	if (r == 0 && by_name)
		add_unnamed(rs, &cap, &s, &own);
	scan_free(&s);
	/*
	 * No usable state file: the daemon this one replaces may be of the release before the tag.
	 * Only as the packaged unit (RuntimeDirectory= sets RUNTIME_DIRECTORY), the one a package
	 * upgrade restarts: elsewhere the untagged name is anyone's (a test's pool, a second
	 * instance), and counting it would charge another daemon's or program's memory here.
	 */
	if (r == 0 && by_name && nv == 0 && getenv("RUNTIME_DIRECTORY")) {
		if (scan_legacy(rs, &s) == 0) {
			size_t before = rs->n;

			add_unnamed(rs, &cap, &s, &own);
			scan_free(&s);
			/* Rescans look for the legacy name too only while something of that name is counted. */
			rs->legacy = rs->n > before;
		}
	}
	filter_build(rs);
	rs->backoff = 1;
	free(own.k);
	if (rs->n) {
		log_warnx("restart: %zu lease%s of the previous daemon (%s) are still mapped by live processes "
			  "(%zu named by %s, %zu found by memfd name): counted as orphaned until they let go",
			  rs->n, rs->n == 1 ? "" : "s", format_size(b->orphaned_bytes, sz, sizeof(sz)), verified,
			  rs->path[0] ? rs->path : "(no state file)", rs->n - verified);
		ev_timer_start(b->loop, &rs->rescan);
	}
	/* The file now says what this daemon counts: a crash before the next clean stop reads that. */
	if (rs->path[0])
		write_state(rs, rs->v, rs->n);
}

/* ------------------------------------------------------------ stop */

/* Every exit hold, sorted by lease id: one walk over the revoker's processes, then a bsearch per lease. */
struct holds {
	struct hold {
		uint64_t id;
		pid_t pid;
	} *v;
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
	struct restart *rs = b->restart;
	struct holds holds = { 0 };
	struct orphan *v;
	size_t n = 0, cap;

	if (!rs || !rs->path[0])
		return;
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

			if (fstat(l->chunks[k]->fd, &st) == 0)
				o->keys[o->nkeys++] = (struct orphan_key){ st.st_dev, st.st_ino, l->chunks[k]->bytes };
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
	write_state(rs, v, n);
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
	struct restart *rs = b->restart;

	if (!rs)
		return;
	ev_timer_stop(b->loop, &rs->rescan);
	for (size_t i = 0; i < rs->n; i++) {
		uncharge(rs, &rs->v[i]);
		orphan_close(&rs->v[i]);
	}
	free(rs->uids);
	free(rs->named);
	free(rs->v);
	free(rs);
	b->restart = NULL;
}

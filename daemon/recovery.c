/* SPDX-License-Identifier: MIT */
/* Crash and restart recovery through systemd's fd store: pool memfds plus a small state memfd. */
#define _GNU_SOURCE
#include "recovery.h"

#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "broker.h"
#include "budget.h"
#include "config.h"
#include "lease.h"
#include "log.h"
#include "notify.h"
#include "pool.h"
#include "request.h"
#include "util.h"

#define STATE_FDNAME "state"
#define STATE_MAGIC "pinbroker-state 1"
/* A chunk whose last owner is not known (torn state): never handed to anyone unreplaced. */
#define OWNER_UNKNOWN ((uid_t)-2)

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

struct recovery {
	struct broker *b;
	int state_fd;
	uint64_t written_generation;
	bool have_written;
	ev_prepare prepare;
	ev_timer grace;
};

/* ------------------------------------------------------------ writing */

struct buf {
	char *p;
	size_t len, cap;
	bool oom;
};

static void bprintf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bprintf(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->oom)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->oom = true;
			return;
		}
		if (b->p && b->len + (size_t)n < b->cap) {
			b->len += (size_t)n;
			return;
		}
		{
			size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)n;
			char *np = realloc(b->p, cap);

			if (!np) {
				b->oom = true;
				return;
			}
			b->p = np;
			b->cap = cap;
		}
	}
}

static void idle_line(const struct chunk *c, void *ud)
{
	bprintf(ud, "idle %llu %u\n", (unsigned long long)c->id, (unsigned)c->owner_uid);
}

static void write_state(struct recovery *rc)
{
	struct broker *b = rc->b;
	struct buf body = { 0 };
	char header[96];
	int hl;

	for (const struct lease *l = lease_first(b->leases); l; l = lease_next(b->leases, l)) {
		bprintf(&body, "lease %llu %u %u %d %llu %d %zu ", (unsigned long long)l->id, (unsigned)l->uid,
			(unsigned)l->gid, (int)l->pid, (unsigned long long)l->bytes, (int)l->priority, l->nchunks);
		for (size_t i = 0; i < l->nchunks; i++)
			bprintf(&body, "%llu:%d ", (unsigned long long)l->chunks[i]->id, l->chunks[i]->tail ? 1 : 0);
		/* The label goes last, hex-encoded, so any bytes survive. */
		bprintf(&body, "L");
		for (const char *c = l->label; *c; c++)
			bprintf(&body, "%02x", (unsigned char)*c);
		bprintf(&body, "\n");
	}
	pool_foreach_idle(b->pool, idle_line, &body);
	if (body.oom) {
		free(body.p);
		return; /* try again next iteration */
	}
	/* The header carries the body length: a torn write is recognised and ignored at adoption. */
	hl = snprintf(header, sizeof(header), "%s %zu\n", STATE_MAGIC, body.len);
	if (pwrite(rc->state_fd, body.p ? body.p : "", body.len, hl) != (ssize_t)body.len ||
	    pwrite(rc->state_fd, header, (size_t)hl, 0) != hl || ftruncate(rc->state_fd, hl + (off_t)body.len) < 0)
		log_warn("cannot write the recovery state, ignoring");
	free(body.p);
}

static void prepare_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
	struct recovery *rc = w->data;

	/* Once per loop iteration, and only when a broker verb changed something. */
	if (rc->have_written && rc->b->generation == rc->written_generation)
		return;
	write_state(rc);
	rc->written_generation = rc->b->generation;
	rc->have_written = true;
}

/* ------------------------------------------------------------ hooks */

static void chunk_created(struct chunk *c, void *ud)
{
	char name[32];
	int r;

	snprintf(name, sizeof(name), "c%llu", (unsigned long long)c->id);
	r = notify_fdstore(c->fd, name);
	if (r < 0)
		log_debug("cannot store chunk %s in the fd store: %s", name, strerror(-r));
}

static void chunk_destroyed(struct chunk *c, void *ud)
{
	char name[32];

	/* The store holds a reference: without removal the memory would outlive the chunk. */
	snprintf(name, sizeof(name), "c%llu", (unsigned long long)c->id);
	notify_fdstore_remove(name);
}

/* ------------------------------------------------------------ adoption */

struct stored_lease {
	uint64_t id;
	uid_t uid;
	gid_t gid;
	pid_t pid;
	uint64_t bytes;
	int prio;
	size_t nchunks;
	uint64_t *chunk_ids;
	bool *tails;
	char label[LEASE_LABEL_MAX];
};

struct parsed {
	struct stored_lease *leases;
	size_t nleases;
	uint64_t *idle_ids;
	uid_t *idle_owner;
	size_t nidle;
};

static void parsed_free(struct parsed *p)
{
	for (size_t i = 0; i < p->nleases; i++) {
		free(p->leases[i].chunk_ids);
		free(p->leases[i].tails);
	}
	free(p->leases);
	free(p->idle_ids);
	free(p->idle_owner);
	memset(p, 0, sizeof(*p));
}

static int parse_lease(char *line, struct stored_lease *sl)
{
	char *save = NULL, *tok;
	unsigned long long id, bytes;
	unsigned uid, gid;
	int pid, prio, used;
	size_t n;

	memset(sl, 0, sizeof(*sl));
	if (sscanf(line, "lease %llu %u %u %d %llu %d %zu %n", &id, &uid, &gid, &pid, &bytes, &prio, &n, &used) != 7)
		return -EBADMSG;
	if (n == 0 || n > (1u << 24))
		return -EBADMSG;
	sl->id = id;
	sl->uid = uid;
	sl->gid = gid;
	sl->pid = pid;
	sl->bytes = bytes;
	sl->prio = prio;
	sl->nchunks = n;
	sl->chunk_ids = calloc(n, sizeof(*sl->chunk_ids));
	sl->tails = calloc(n, sizeof(*sl->tails));
	if (!sl->chunk_ids || !sl->tails)
		return -ENOMEM;
	tok = strtok_r(line + used, " \n", &save);
	for (size_t i = 0; i < n; i++, tok = strtok_r(NULL, " \n", &save)) {
		unsigned long long cid;
		int tail;

		if (!tok || sscanf(tok, "%llu:%d", &cid, &tail) != 2)
			return -EBADMSG;
		sl->chunk_ids[i] = cid;
		sl->tails[i] = tail != 0;
	}
	if (tok && tok[0] == 'L') {
		size_t k = 0;

		for (const char *h = tok + 1; h[0] && h[1] && k + 1 < sizeof(sl->label); h += 2) {
			unsigned v;

			if (sscanf(h, "%2x", &v) != 1)
				break;
			sl->label[k++] = (char)v;
		}
		sl->label[k] = '\0';
	}
	return 0;
}

static int parse_state(int fd, struct parsed *out)
{
	char header[96];
	char *body = NULL, *line, *save = NULL;
	size_t body_len;
	ssize_t n;
	int hl, r = 0;

	memset(out, 0, sizeof(*out));
	n = pread(fd, header, sizeof(header) - 1, 0);
	if (n == 0)
		return -ENODATA; /* cleared at a clean stop */
	if (n < 0)
		return -EBADMSG;
	header[n] = '\0';
	if (sscanf(header, STATE_MAGIC " %zu\n%n", &body_len, &hl) != 1 || body_len > (64u << 20))
		return -EBADMSG;
	hl = (int)(strchr(header, '\n') - header) + 1;
	body = malloc(body_len + 1);
	if (!body)
		return -ENOMEM;
	if (pread(fd, body, body_len, hl) != (ssize_t)body_len) {
		free(body);
		return -EBADMSG;
	}
	body[body_len] = '\0';
	for (line = strtok_r(body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (strncmp(line, "lease ", 6) == 0) {
			struct stored_lease *nl = realloc(out->leases, (out->nleases + 1) * sizeof(*nl));

			if (!nl) {
				r = -ENOMEM;
				break;
			}
			out->leases = nl;
			r = parse_lease(line, &out->leases[out->nleases]);
			out->nleases++;
			if (r < 0)
				break;
		} else if (strncmp(line, "idle ", 5) == 0) {
			unsigned long long id;
			unsigned owner;
			uint64_t *ni = realloc(out->idle_ids, (out->nidle + 1) * sizeof(*ni));
			uid_t *no = realloc(out->idle_owner, (out->nidle + 1) * sizeof(*no));

			if (ni)
				out->idle_ids = ni;
			if (no)
				out->idle_owner = no;
			if (!ni || !no) {
				r = -ENOMEM;
				break;
			}
			if (sscanf(line, "idle %llu %u", &id, &owner) != 2) {
				r = -EBADMSG;
				break;
			}
			out->idle_ids[out->nidle] = id;
			out->idle_owner[out->nidle] = owner;
			out->nidle++;
		} else {
			r = -EBADMSG;
			break;
		}
	}
	free(body);
	if (r < 0)
		parsed_free(out);
	return r;
}

/* Find the stored fd of chunk id; -1 if none. Takes it out of the list. */
static int take_chunk_fd(struct notify_stored *st, int n, uint64_t id)
{
	char name[32];

	snprintf(name, sizeof(name), "c%llu", (unsigned long long)id);
	for (int i = 0; i < n; i++)
		if (st[i].fd >= 0 && strcmp(st[i].name, name) == 0) {
			int fd = st[i].fd;

			st[i].fd = -1;
			return fd;
		}
	return -1;
}

static void grace_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct recovery *rc = w->data;
	struct broker *b = rc->b;
	struct lease *l, *next;
	size_t n = 0;

	for (l = lease_first(b->leases); l; l = next) {
		int pidfd;

		next = lease_next(b->leases, l);
		if (l->state != LEASE_ORPHANED || l->owner)
			continue;
		/* A holder still alive may still map the pages: they must not reach anyone else yet. */
		pidfd = l->pid > 0 ? (int)syscall(SYS_pidfd_open, l->pid, 0) : -1;
		if (pidfd >= 0) {
			uint64_t id = l->id;

			log_event(EV_LEASE_OVERDUE, LOG_WARNING, l->id, l->uid, l->pid,
				  "lease %llu was not re-declared within redeclare-grace-ms but pid %d still runs: "
				  "it stays counted until that process exits",
				  (unsigned long long)l->id, l->pid);
			if (request_hold_until_exit(b, pidfd, l->pid, &id, 1) == 0)
				continue;
		}
		log_event(EV_LEASE_RELEASED, LOG_NOTICE, l->id, l->uid, l->pid,
			  "lease %llu (%llu bytes, pid %d) was not re-declared within redeclare-grace-ms and its holder "
			  "is gone: reclaimed",
			  (unsigned long long)l->id, (unsigned long long)l->bytes, l->pid);
		broker_free_lease(b, l);
		n++;
	}
	if (n)
		broker_trim_pool(b, b->prewarm_bytes);
}

static size_t adopt(struct recovery *rc, struct notify_stored *st, int nst, int state_fd)
{
	struct broker *b = rc->b;
	struct parsed ps;
	size_t adopted = 0, idle = 0, unknown = 0;
	uint64_t max_id = 0;
	int r;

	r = state_fd >= 0 ? parse_state(state_fd, &ps) : -ENODATA;
	if (r == -ENODATA) {
		memset(&ps, 0, sizeof(ps));
	} else if (r < 0) {
		log_warnx("the stored recovery state is unreadable (%s): adopting pool memory without its leases",
			  strerror(-r));
		memset(&ps, 0, sizeof(ps));
	}
	for (size_t i = 0; i < ps.nleases; i++) {
		struct stored_lease *sl = &ps.leases[i];
		struct chunk **chunks = calloc(sl->nchunks, sizeof(*chunks));
		struct lease *l;
		bool ok = chunks != NULL;

		for (size_t k = 0; ok && k < sl->nchunks; k++) {
			int fd = take_chunk_fd(st, nst, sl->chunk_ids[k]);

			ok = fd >= 0 && pool_adopt(b->pool, fd, sl->chunk_ids[k], sl->uid, sl->tails[k], false, &chunks[k]) == 0;
			if (!ok && fd >= 0)
				close(fd);
		}
		if (ok && budget_check(b->budget, sl->uid, sl->bytes) == 0 &&
		    lease_adopt(b->leases, sl->id, sl->uid, sl->bytes, (enum lease_priority)sl->prio, sl->label, chunks,
				sl->nchunks, now_ms(), &l) == 0) {
			l->gid = sl->gid;
			l->pid = sl->pid;
			budget_charge(b->budget, sl->uid, sl->bytes);
			budget_count_add(b->budget, sl->uid, sl->nchunks);
			adopted++;
		} else {
			/* Incomplete or over budget: its chunks become idle, still marked with the uid. */
			for (size_t k = 0; chunks && k < sl->nchunks; k++)
				if (chunks[k])
					pool_put(b->pool, &chunks[k], 1);
			free(chunks);
			log_warnx("lease %llu could not be re-adopted after restart; its memory went back to the pool",
				  (unsigned long long)sl->id);
		}
		if (sl->id > max_id)
			max_id = sl->id;
	}
	for (size_t i = 0; i < ps.nidle; i++) {
		int fd = take_chunk_fd(st, nst, ps.idle_ids[i]);

		if (fd >= 0 && pool_adopt(b->pool, fd, ps.idle_ids[i], ps.idle_owner[i], false, true, NULL) == 0)
			idle++;
		else if (fd >= 0)
			close(fd);
	}
	/* Chunks the state does not mention (made after its last write): keep them, owner unknown. */
	for (int i = 0; i < nst; i++) {
		unsigned long long id;

		if (st[i].fd < 0 || sscanf(st[i].name, "c%llu", &id) != 1)
			continue;
		if (pool_adopt(b->pool, st[i].fd, id, OWNER_UNKNOWN, false, true, NULL) == 0)
			unknown++;
		else
			close(st[i].fd);
		st[i].fd = -1;
	}
	lease_table_set_next_id(b->leases, max_id);
	parsed_free(&ps);
	if (adopted || idle || unknown)
		log_info("recovered from the fd store: %zu leases (awaiting re-declaration for %u ms), %zu idle chunks, "
			 "%zu chunks of unknown owner",
			 adopted, b->cfg->redeclare_grace_ms, idle, unknown);
	return adopted;
}

void recovery_init(struct broker *b)
{
	static const struct pool_hooks hooks = { chunk_created, chunk_destroyed, NULL };
	struct notify_stored *st = NULL;
	struct recovery *rc;
	int nst = 0, state_fd = -1;
	size_t adopted = 0;

	if (!notify_enabled())
		return;
	rc = calloc(1, sizeof(*rc));
	if (!rc)
		return;
	rc->b = b;
	rc->state_fd = -1;
	if (notify_stored_fds(&st, &nst) == 0) {
		for (int i = 0; i < nst; i++)
			if (st[i].fd >= 0 && strcmp(st[i].name, STATE_FDNAME) == 0) {
				state_fd = st[i].fd;
				st[i].fd = -1;
			}
		if (state_fd >= 0 || nst > 0)
			adopted = adopt(rc, st, nst, state_fd >= 0 ? state_fd : -1);
		for (int i = 0; i < nst; i++)
			if (st[i].fd >= 0)
				close(st[i].fd);
		free(st);
	}
	if (state_fd < 0) {
		state_fd = memfd_create("pinbroker-state", MFD_CLOEXEC);
		if (state_fd < 0 || notify_fdstore(state_fd, STATE_FDNAME) < 0) {
			log_warnx("systemd's fd store is not available (set FileDescriptorStoreMax=): leases will not "
				  "survive a daemon restart");
			if (state_fd >= 0)
				close(state_fd);
			free(rc);
			return;
		}
	}
	rc->state_fd = state_fd;
	b->recovery = rc;
	pool_set_hooks(b->pool, &(struct pool_hooks){ hooks.created, hooks.destroyed, rc });
	ev_prepare_init(&rc->prepare, prepare_cb);
	rc->prepare.data = rc;
	ev_prepare_start(b->loop, &rc->prepare);
	if (adopted) {
		ev_timer_init(&rc->grace, grace_cb, b->cfg->redeclare_grace_ms / 1000.0, 0.);
		rc->grace.data = rc;
		ev_timer_start(b->loop, &rc->grace);
	}
}

void recovery_fini(struct broker *b)
{
	struct recovery *rc = b->recovery;

	if (!rc)
		return;
	ev_prepare_stop(b->loop, &rc->prepare);
	ev_timer_stop(b->loop, &rc->grace);
	/* A clean stop: the state says nothing is lent any more. */
	if (rc->state_fd >= 0) {
		if (ftruncate(rc->state_fd, 0) < 0)
			log_warn("cannot clear the recovery state, ignoring");
		close(rc->state_fd);
	}
	free(rc);
	b->recovery = NULL;
}

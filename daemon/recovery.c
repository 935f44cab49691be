/* SPDX-License-Identifier: MIT */
/* Crash and restart recovery through systemd's fd store: pool memfds plus a small state memfd; the instance id. */
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
#include "budget.h"
#include "config.h"
#include "lease.h"
#include "log.h"
#include "notify.h"
#include "pool.h"
#include "revoker.h"
#include "util.h"

/*
 * The state memfd (stored as "state"):
 *
 *   [0, 128)    descriptor slot 0      [128, 256)  descriptor slot 1
 *   [256, ...)  snapshot bodies, each followed by its journal
 *
 * A snapshot is the text of every lease and idle chunk. It is written into a
 * region that does not overlap the committed one, then committed by writing a
 * descriptor (sequence number, where the body is, its checksum) into the other
 * slot, so a crash at any point leaves the last committed snapshot readable.
 * Between snapshots every lease whose fds are about to leave is appended as a
 * checksummed journal record (recovery_lent). Recovery reads the descriptor
 * with the highest sequence number, its body and its valid records.
 *
 * The one property everything rests on: whatever chunk fd has left the daemon
 * is recorded as lent in the committed snapshot or a record after it. Later
 * changes (releases) may be missing after a crash; that only makes recovery
 * treat idle memory as held, never the other way round.
 */
/* Other mappers' pids kept per lease line: past this many, the rest are not waited for. */
#define RECOVERY_MAPPERS_MAX 64
#define STATE_FDNAME "state"
#define STATE_MAGIC "pinbroker-st 2"
#define DESC_BYTES 128u
#define BODY_START_BYTES (2u * DESC_BYTES)
#define RECORD_TAG 0x524a4250u /* "PBJR" */
/* Sanity bound when reading: 64 MiB of text is some 400k leases. */
#define STATE_MAX_BYTES (64ull << 20)
/*
 * The full snapshot is O(leases), so the loop spends at most a tenth of its
 * time on it: after a snapshot that took t, the next waits 9 t (a few µs with
 * few leases, so then it is written every iteration that changed something).
 * Appends cover what happens in between; what a crash forgets is only release
 * history, which makes recovery hold that memory longer, never lend it.
 */
#define SNAPSHOT_SPACING_FACTOR 9u
#define SNAPSHOT_SPACING_MAX_US 1000000u
#define JOURNAL_MIN_BYTES (64u * 1024)
/* A lease line's per-chunk flags ("id:flags"). */
#define CHUNK_FLAG_TAIL 1u
#define CHUNK_FLAG_TAINTED 2u
/* A quarantined chunk's owner: matches no uid that could ask (and such chunks are never idle anyway). */
#define OWNER_UNKNOWN ((uid_t)-2)


struct state_desc {
	char magic[16];
	uint64_t seq;
	uint64_t instance_id;
	uint64_t max_lent_id;   /* every lease id that ever left is <= this or in a record */
	uint64_t body_off;
	uint64_t body_len;
	uint64_t body_sum;
	uint64_t desc_sum;      /* over everything above */
};
_Static_assert(sizeof(struct state_desc) <= DESC_BYTES, "a descriptor fits its slot");

struct record_hdr {
	uint32_t len;           /* bytes of text after the header */
	uint32_t tag;
	uint64_t seq;           /* the snapshot it follows */
	uint64_t sum;           /* over len, seq and the text */
};

struct buf {
	char *p;
	size_t len, cap;
	bool oom;
};

struct recovery {
	struct broker *b;
	uint64_t instance_id;
	int state_fd;             /* -1 without an fd store */
	bool committed;           /* a readable snapshot is in state_fd */
	int slot;                 /* its descriptor slot */
	uint64_t seq;
	uint64_t body_off;        /* [body_off, journal_end) is in use */
	uint64_t body_len;
	uint64_t journal_end;
	uint64_t journal_bytes;
	uint64_t max_lent_id;
	uint64_t written_generation;
	uint64_t snapshot_us;     /* when the last snapshot was committed */
	uint64_t snapshot_cost_us; /* how long it took */
	struct buf body, rec;     /* formatting buffers, reused */
	struct chunk **quarantine; /* adopted chunks nobody may be lent: counted as lent, held here */
	size_t nquarantine;
	ev_prepare prepare;
	ev_timer snapshot_timer;
	ev_timer grace;
	bool adopted_state;       /* recovery_init read a committed state from the fd store */
	bool lost_lease;          /* a lease line of it could not be re-adopted: its chunks may be outside the store */
};

/* ------------------------------------------------------------ formatting */

static bool reserve(struct buf *b, size_t n)
{
	if (b->oom)
		return false;
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		char *np;

		while (cap < b->len + n)
			cap *= 2;
		np = realloc(b->p, cap);
		if (!np) {
			b->oom = true;
			return false;
		}
		b->p = np;
		b->cap = cap;
	}
	return true;
}

static void put_mem(struct buf *b, const void *p, size_t n)
{
	if (reserve(b, n)) {
		memcpy(b->p + b->len, p, n);
		b->len += n;
	}
}

static void put_str(struct buf *b, const char *s)
{
	put_mem(b, s, strlen(s));
}

/* Hand-rolled: vsnprintf per field made the snapshot ten times slower at 20k leases. */
static void put_u64(struct buf *b, uint64_t v, char sep)
{
	char tmp[24];
	size_t n = sizeof(tmp);

	tmp[--n] = sep;
	do {
		tmp[--n] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	put_mem(b, tmp + n, sizeof(tmp) - n);
}

static void put_i64(struct buf *b, int64_t v, char sep)
{
	if (v < 0) {
		put_mem(b, "-", 1);
		put_u64(b, (uint64_t)0 - (uint64_t)v, sep);
	} else {
		put_u64(b, (uint64_t)v, sep);
	}
}

static void put_lease_line(struct buf *b, const struct broker *br, const struct lease *l)
{
	static const char hex[] = "0123456789abcdef";

	pid_t held[RECOVERY_MAPPERS_MAX];
	size_t nheld = 0;

	put_str(b, "lease ");
	put_u64(b, l->id, ' ');
	put_u64(b, l->uid, ' ');
	put_u64(b, l->gid, ' ');
	/* A holder that let go of a shared lease maps it no more: no reason to wait for it. */
	put_i64(b, l->holder_detached ? 0 : l->pid, ' ');
	put_u64(b, l->bytes, ' ');
	put_i64(b, (int64_t)l->priority, ' ');
	put_u64(b, l->nchunks, ' ');
	/*
	 * Each chunk as "id:flags": bit 0 a tail, bit 1 tainted (another uid mapped it: destroyed
	 * when the lease ends). Daemons before the taint wrote 0 or 1 and read any non-zero value as
	 * a tail, which is destroyed on return as well: a downgrade pools no tainted chunk either.
	 */
	for (size_t i = 0; i < l->nchunks; i++) {
		put_u64(b, l->chunks[i]->id, ':');
		put_u64(b,
			(l->chunks[i]->tail ? CHUNK_FLAG_TAIL : 0) | (l->chunks[i]->tainted ? CHUNK_FLAG_TAINTED : 0),
			' ');
	}
	/* The label goes last, hex-encoded, so any bytes survive. */
	put_mem(b, "L", 1);
	for (const unsigned char *c = (const unsigned char *)l->label; *c; c++) {
		char h[2] = { hex[*c >> 4], hex[*c & 15] };

		put_mem(b, h, 2);
	}
	/* Its holder cannot give it back: it must stay unrevokable after the restart. Older daemons skip it. */
	if (l->no_revoke)
		put_mem(b, " N", 2);
	/*
	 * Then the other processes that map it, if any: attachers, and processes whose
	 * connection closed while they ran. Attachments are not re-declared after a restart;
	 * these pids keep the lease counted until each exits, so its pages reach nobody else
	 * while a stale attacher still maps them. Daemons before sharing stop at the label.
	 */
	for (size_t i = 0; i < l->nattachers && nheld < RECOVERY_MAPPERS_MAX; i++)
		held[nheld++] = l->attachers[i].pid;
	if (l->exit_holds > 0)
		nheld += revoker_hold_pids(br, l->id, held + nheld, RECOVERY_MAPPERS_MAX - nheld);
	if (nheld > 0)
		put_mem(b, " A", 2);
	for (size_t i = 0; i < nheld; i++)
		put_i64(b, held[i], ',');
	put_mem(b, "\n", 1);
}

static void idle_line(const struct chunk *c, void *ud)
{
	struct buf *b = ud;

	put_str(b, "idle ");
	put_u64(b, c->id, ' ');
	put_u64(b, c->owner_uid, '\n');
}

/* Detects torn and stale bytes, not an adversary: only the daemon and systemd hold the memfd. */
static uint64_t sum64(uint64_t h, const void *p, size_t n)
{
	const unsigned char *c = p;

	h ^= 0x9e3779b97f4a7c15ull + n;
	for (; n >= 8; n -= 8, c += 8) {
		uint64_t w;

		memcpy(&w, c, 8);
		h = (h ^ w) * 0xff51afd7ed558ccdull;
		h ^= h >> 32;
	}
	for (; n > 0; n--, c++)
		h = (h ^ *c) * 0x100000001b3ull;
	h ^= h >> 29;
	return h * 0xc4ceb9fe1a85ec53ull;
}

static uint64_t desc_sum(const struct state_desc *d)
{
	return sum64(1, d, offsetof(struct state_desc, desc_sum));
}

static uint64_t record_sum(const struct record_hdr *h, const void *text)
{
	uint64_t k[2] = { h->len, h->seq };

	return sum64(sum64(2, k, sizeof(k)), text, h->len);
}

static uint64_t align8(uint64_t x)
{
	return (x + 7) & ~(uint64_t)7;
}

static int pwrite_all(int fd, const void *p, size_t n, uint64_t off)
{
	const char *c = p;

	while (n > 0) {
		ssize_t w = pwrite(fd, c, n, (off_t)off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		c += w;
		n -= (size_t)w;
		off += (uint64_t)w;
	}
	return 0;
}

/* ------------------------------------------------------------ writing */

/* Make the state unreadable: recovery then quarantines every chunk rather than trust stale lines. */
static void poison(struct recovery *rc)
{
	/* Shrinking never needs memory. One byte, not zero: an empty state means "clean stop". */
	if (ftruncate(rc->state_fd, 1) < 0)
		log_warn("cannot invalidate the recovery state either; a crash now may mis-assign memory");
	rc->committed = false;
}

static int commit_snapshot(struct recovery *rc)
{
	struct broker *b = rc->b;
	struct buf *body = &rc->body;
	struct state_desc d;
	uint64_t off, t0_us = now_us();
	int slot, r;

	body->len = 0;
	body->oom = false;
	/* A registration has no memfd to keep: after a restart its program's re-declare is refused. */
	for (const struct lease *l = lease_first(b->leases); l; l = lease_next(b->leases, l))
		if (!l->registration)
			put_lease_line(body, b, l);
	pool_foreach_idle(b->pool, idle_line, body);
	if (body->oom)
		return -ENOMEM;
	if (!rc->committed) {
		/* Nothing readable to keep: start over. Empty until the descriptor lands, which still
		 * quarantines every stored chunk (no line names them). */
		if (ftruncate(rc->state_fd, 0) < 0)
			return -errno;
		off = BODY_START_BYTES;
	} else if (BODY_START_BYTES + body->len <= rc->body_off) {
		off = BODY_START_BYTES;
	} else {
		off = align8(rc->journal_end);
	}
	r = pwrite_all(rc->state_fd, body->p, body->len, off);
	if (r < 0)
		return r;
	memset(&d, 0, sizeof(d));
	memcpy(d.magic, STATE_MAGIC, sizeof(STATE_MAGIC));
	d.seq = rc->seq + 1;
	d.instance_id = rc->instance_id;
	d.max_lent_id = rc->max_lent_id;
	d.body_off = off;
	d.body_len = body->len;
	d.body_sum = sum64(0, body->p, body->len);
	d.desc_sum = desc_sum(&d);
	slot = rc->committed ? 1 - rc->slot : 0;
	r = pwrite_all(rc->state_fd, &d, sizeof(d), (uint64_t)slot * DESC_BYTES);
	if (r < 0)
		return r;
	rc->committed = true;
	rc->slot = slot;
	rc->seq = d.seq;
	rc->body_off = off;
	rc->body_len = body->len;
	rc->journal_end = align8(off + body->len);
	rc->journal_bytes = 0;
	rc->written_generation = b->generation;
	rc->snapshot_us = now_us();
	rc->snapshot_cost_us = rc->snapshot_us - t0_us;
	/* Back at the front: what lies beyond (older snapshots) is dead weight. */
	if (off == BODY_START_BYTES && ftruncate(rc->state_fd, (off_t)rc->journal_end) < 0)
		log_debug("cannot shrink the recovery state: %s", strerror(errno));
	return 0;
}

void recovery_lent(struct broker *b, const struct lease *l)
{
	struct recovery *rc = b->recovery;
	struct record_hdr h;
	struct buf *rec;
	int r;

	if (!rc || rc->state_fd < 0)
		return;
	if (l->id > rc->max_lent_id)
		rc->max_lent_id = l->id;
	if (l->registration)
		return; /* no memfd to keep; its id reaches the next descriptor */
	if (!rc->committed) {
		/* The snapshot holds l already: it is in the lease table. */
		r = commit_snapshot(rc);
		goto out;
	}
	rec = &rc->rec;
	rec->len = 0;
	rec->oom = false;
	put_mem(rec, &(struct record_hdr){ 0 }, sizeof(h));
	put_lease_line(rec, rc->b, l);
	if (rec->oom) {
		r = -ENOMEM;
		goto out;
	}
	h.len = (uint32_t)(rec->len - sizeof(h));
	h.tag = RECORD_TAG;
	h.seq = rc->seq;
	h.sum = record_sum(&h, rec->p + sizeof(h));
	memcpy(rec->p, &h, sizeof(h));
	r = pwrite_all(rc->state_fd, rec->p, rec->len, rc->journal_end);
	if (r == 0) {
		rc->journal_end = align8(rc->journal_end + rec->len);
		rc->journal_bytes += rec->len;
	}
out:
	if (r < 0) {
		log_warnx("cannot record lease %llu in the recovery state (%s): after a crash every pool chunk "
			  "will be quarantined for redeclare-grace-ms instead of re-adopted",
			  (unsigned long long)l->id, strerror(-r));
		poison(rc);
	}
}

static void snapshot_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	/* Nothing to do here: waking the loop runs prepare_cb, which writes the snapshot. */
}

static void prepare_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
	struct recovery *rc = w->data;
	uint64_t since_us, spacing_us, limit_bytes;
	int r;

	/* Only when a broker verb changed something, and no more often than the spacing allows. */
	if (rc->committed && rc->b->generation == rc->written_generation)
		return;
	since_us = now_us() - rc->snapshot_us;
	spacing_us = rc->snapshot_cost_us * SNAPSHOT_SPACING_FACTOR;
	if (spacing_us > SNAPSHOT_SPACING_MAX_US)
		spacing_us = SNAPSHOT_SPACING_MAX_US;
	limit_bytes = rc->body_len > JOURNAL_MIN_BYTES ? rc->body_len : JOURNAL_MIN_BYTES;
	if (rc->committed && since_us < spacing_us && rc->journal_bytes < limit_bytes) {
		if (!ev_is_active(&rc->snapshot_timer)) {
			ev_timer_set(&rc->snapshot_timer, (double)(spacing_us - since_us) / 1e6, 0.);
			ev_timer_start(loop, &rc->snapshot_timer);
		}
		return;
	}
	ev_timer_stop(loop, &rc->snapshot_timer);
	r = commit_snapshot(rc);
	if (r < 0)
		log_debug("cannot write the recovery state snapshot (%s); the last one stays valid, retrying",
			  strerror(-r));
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

/* ------------------------------------------------------------ reading */

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
	bool *tainted; /* another uid mapped it: it must stay out of the pool after the restart */
	char label[LEASE_LABEL_MAX];
	pid_t mappers[RECOVERY_MAPPERS_MAX]; /* attachers and exited-connection holders, when it was shared */
	size_t nmappers;
	bool no_revoke;
};

struct parsed {
	struct stored_lease *leases; /* snapshot lines, then journal records, in the order written */
	size_t nleases;
	uint64_t *idle_ids;
	uid_t *idle_owner;
	size_t nidle;
	struct state_desc desc;     /* the committed descriptor */
	int slot;
	uint64_t journal_end;
	uint64_t journal_bytes;
	uint64_t max_id;            /* the highest lease id named anywhere */
};

static void parsed_free(struct parsed *p)
{
	for (size_t i = 0; i < p->nleases; i++) {
		free(p->leases[i].chunk_ids);
		free(p->leases[i].tails);
		free(p->leases[i].tainted);
	}
	free(p->leases);
	free(p->idle_ids);
	free(p->idle_owner);
	memset(p, 0, sizeof(*p));
}

/* One "lease ..." line, NUL-terminated, without its newline. */
static int parse_lease(char *line, struct stored_lease *sl)
{
	char *save = NULL, *tok;
	unsigned long long id, bytes;
	unsigned uid, gid;
	int pid, prio, used = 0;
	size_t n;

	memset(sl, 0, sizeof(*sl));
	if (sscanf(line, "lease %llu %u %u %d %llu %d %zu %n", &id, &uid, &gid, &pid, &bytes, &prio, &n, &used) != 7 ||
	    used == 0)
		return -EBADMSG;
	/* Each chunk takes at least "1:0 " on the line: a count beyond that is a lie, not an allocation. */
	if (id == 0 || n == 0 || n > strlen(line) / 4 || prio < LEASE_PRIO_NORMAL || prio > LEASE_PRIO_BEST_EFFORT)
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
	sl->tainted = calloc(n, sizeof(*sl->tainted));
	if (!sl->chunk_ids || !sl->tails || !sl->tainted)
		return -ENOMEM;
	tok = strtok_r(line + used, " ", &save);
	for (size_t i = 0; i < n; i++, tok = strtok_r(NULL, " ", &save)) {
		unsigned long long cid;
		unsigned flags;

		if (!tok || sscanf(tok, "%llu:%u", &cid, &flags) != 2)
			return -EBADMSG;
		sl->chunk_ids[i] = cid;
		sl->tails[i] = (flags & CHUNK_FLAG_TAIL) != 0;
		/* A flag this daemon does not know is read as tainted: pooling too little is the safe side. */
		sl->tainted[i] = (flags & ~CHUNK_FLAG_TAIL) != 0;
	}
	if (!tok || tok[0] != 'L')
		return -EBADMSG;
	{
		size_t k = 0;

		for (const char *h = tok + 1; h[0] && h[1] && k + 1 < sizeof(sl->label); h += 2) {
			unsigned v;

			if (sscanf(h, "%2x", &v) != 1)
				break;
			sl->label[k++] = (char)v;
		}
		sl->label[k] = '\0';
	}
	/* Optional: " N" (never revoked), then " A" and the pids of its other mappers, each followed by a comma. */
	tok = strtok_r(NULL, " ", &save);
	if (tok && strcmp(tok, "N") == 0) {
		sl->no_revoke = true;
		tok = strtok_r(NULL, " ", &save);
	}
	if (tok && tok[0] == 'A') {
		char *p = tok + 1, *end;

		while (*p && sl->nmappers < RECOVERY_MAPPERS_MAX) {
			long v = strtol(p, &end, 10);

			if (end == p || *end != ',' || v <= 0 || v > INT32_MAX)
				return -EBADMSG;
			sl->mappers[sl->nmappers++] = (pid_t)v;
			p = end + 1;
		}
	}
	return 0;
}

static int add_lease_line(struct parsed *out, char *line)
{
	struct stored_lease *nl = realloc(out->leases, (out->nleases + 1) * sizeof(*nl));
	int r;

	if (!nl)
		return -ENOMEM;
	out->leases = nl;
	r = parse_lease(line, &out->leases[out->nleases]);
	out->nleases++; /* parsed_free frees whatever it allocated, even on failure */
	if (r == 0 && out->leases[out->nleases - 1].id > out->max_id)
		out->max_id = out->leases[out->nleases - 1].id;
	return r;
}

/* The body: "lease ..." and "idle ..." lines. text has len bytes and a NUL after them. */
static int parse_body(char *text, size_t len, struct parsed *out)
{
	char *end = text + len;

	if (memchr(text, '\0', len))
		return -EBADMSG;
	for (char *line = text; line < end;) {
		char *nl = memchr(line, '\n', (size_t)(end - line));
		int r = 0;

		if (!nl)
			return -EBADMSG; /* every line ends in a newline */
		*nl = '\0';
		if (strncmp(line, "lease ", 6) == 0) {
			r = add_lease_line(out, line);
		} else if (strncmp(line, "idle ", 5) == 0) {
			unsigned long long id;
			unsigned owner;
			int used = 0;
			uint64_t *ni = realloc(out->idle_ids, (out->nidle + 1) * sizeof(*ni));
			uid_t *no = ni ? realloc(out->idle_owner, (out->nidle + 1) * sizeof(*no)) : NULL;

			if (ni)
				out->idle_ids = ni;
			if (no)
				out->idle_owner = no;
			if (!ni || !no)
				return -ENOMEM;
			if (sscanf(line, "idle %llu %u%n", &id, &owner, &used) != 2 || line[used] != '\0')
				return -EBADMSG;
			out->idle_ids[out->nidle] = id;
			out->idle_owner[out->nidle] = owner;
			out->nidle++;
		} else {
			r = -EBADMSG;
		}
		if (r < 0)
			return r;
		line = nl + 1;
	}
	return 0;
}

/* The journal after the body: valid records of this snapshot, up to the first that is not. */
static int parse_journal(int fd, uint64_t file_bytes, struct parsed *out)
{
	uint64_t pos = align8(out->desc.body_off + out->desc.body_len);
	uint64_t avail = file_bytes > pos ? file_bytes - pos : 0;
	char *j;
	size_t at = 0;
	int r = 0;

	out->journal_end = pos;
	if (avail == 0)
		return 0;
	if (avail > STATE_MAX_BYTES)
		return -EBADMSG;
	j = malloc((size_t)avail + 1);
	if (!j)
		return -ENOMEM;
	if (pread(fd, j, (size_t)avail, (off_t)pos) != (ssize_t)avail) {
		free(j);
		return -EBADMSG;
	}
	while (at + sizeof(struct record_hdr) <= avail) {
		struct record_hdr h;
		char *text;

		memcpy(&h, j + at, sizeof(h));
		/* A torn or stale record ends the journal: whatever it described never left the daemon. */
		if (h.tag != RECORD_TAG || h.seq != out->desc.seq || h.len == 0 ||
		    h.len > avail - at - sizeof(h) || record_sum(&h, j + at + sizeof(h)) != h.sum)
			break;
		text = j + at + sizeof(h);
		/* Checksummed but not one newline-terminated lease line: not ours, trust nothing. */
		if (text[h.len - 1] != '\n' || memchr(text, '\0', h.len) || memchr(text, '\n', h.len) != text + h.len - 1 ||
		    strncmp(text, "lease ", 6) != 0) {
			r = -EBADMSG;
			break;
		}
		text[h.len - 1] = '\0';
		r = add_lease_line(out, text);
		if (r < 0)
			break;
		at = (size_t)align8(at + sizeof(h) + h.len);
		out->journal_bytes += sizeof(h) + h.len;
	}
	out->journal_end = pos + at;
	free(j);
	return r;
}

/*
 * Returns 0 with *out filled, -ENODATA for an empty state (a clean stop, or a
 * fresh one), -EBADMSG when no committed snapshot can be read, or -ENOMEM.
 */
static int parse_state(int fd, struct parsed *out)
{
	unsigned char raw[2 * DESC_BYTES];
	const struct state_desc *best = NULL;
	struct stat st;
	char *body;
	ssize_t n;
	int r;

	memset(out, 0, sizeof(*out));
	if (fstat(fd, &st) < 0)
		return -EBADMSG;
	if (st.st_size == 0)
		return -ENODATA;
	n = pread(fd, raw, sizeof(raw), 0);
	if (n < 0)
		return -EBADMSG;
	for (int slot = 0; slot < 2; slot++) {
		struct state_desc d;

		if (n < (ssize_t)((slot + 1) * DESC_BYTES))
			break;
		memcpy(&d, raw + slot * DESC_BYTES, sizeof(d));
		if (memcmp(d.magic, STATE_MAGIC, sizeof(STATE_MAGIC)) != 0 || d.desc_sum != desc_sum(&d))
			continue;
		if (!best || d.seq > best->seq) {
			out->desc = d;
			out->slot = slot;
			best = &out->desc;
		}
	}
	/*
	 * Only the newest committed snapshot is the truth: an older one may call
	 * idle what was lent since. If its body is damaged, nothing is trusted.
	 */
	if (!best || out->desc.body_off < BODY_START_BYTES || out->desc.body_len > STATE_MAX_BYTES ||
	    out->desc.body_off + out->desc.body_len > (uint64_t)st.st_size) {
		memset(out, 0, sizeof(*out));
		return -EBADMSG;
	}
	body = malloc((size_t)out->desc.body_len + 1);
	if (!body)
		return -ENOMEM;
	if (pread(fd, body, (size_t)out->desc.body_len, (off_t)out->desc.body_off) != (ssize_t)out->desc.body_len ||
	    sum64(0, body, (size_t)out->desc.body_len) != out->desc.body_sum) {
		free(body);
		memset(out, 0, sizeof(*out));
		return -EBADMSG;
	}
	body[out->desc.body_len] = '\0';
	r = parse_body(body, (size_t)out->desc.body_len, out);
	free(body);
	if (r == 0)
		r = parse_journal(fd, (uint64_t)st.st_size, out);
	if (r < 0)
		parsed_free(out);
	return r;
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
	} *keys;
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
		pool_put(rc->b->pool, &c, 1);
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
		pool_put(rc->b->pool, rc->quarantine, rc->nquarantine);
	free(rc->quarantine);
	rc->quarantine = NULL;
	rc->nquarantine = 0;
	rc->b->generation++;
}

/* Adopt a stored fd as a lent chunk and quarantine it; a stored fd that is no chunk of ours is dropped. */
static void quarantine_fd(struct recovery *rc, int fd, uint64_t id, const char *name)
{
	struct chunk *c = NULL;

	if (pool_adopt(rc->b->pool, fd, id, OWNER_UNKNOWN, false, false, &c) == 0) {
		quarantine_add(rc, c);
		return;
	}
	close(fd);
	notify_fdstore_remove(name);
}

static void grace_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct recovery *rc = w->data;
	struct broker *b = rc->b;
	struct lease *l, *next;
	size_t n = 0;

	if (rc->nquarantine) {
		log_info("redeclare-grace-ms is over: %zu pool chunks of unknown holder are replaced by fresh memory",
			 rc->nquarantine);
		quarantine_release(rc);
	}
	for (l = lease_first(b->leases); l; l = next) {
		int pidfd;

		next = lease_next(b->leases, l);
		if (l->state != LEASE_ORPHANED || l->owner)
			continue;
		/* Former attachers still run: the last one's exit frees it (revoker.c's exit holds). */
		if (l->exit_holds > 0)
			continue;
		/* A holder still alive may still map the pages: they must not reach anyone else yet. */
		pidfd = l->pid > 0 ? sys_pidfd_open(l->pid, 0) : -1;
		if (pidfd >= 0) {
			uint64_t id = l->id;

			log_event(EV_LEASE_OVERDUE, LOG_WARNING, l->id, l->uid, l->pid,
				  "lease %llu was not re-declared within redeclare-grace-ms but pid %d still runs: "
				  "it stays counted until that process exits",
				  (unsigned long long)l->id, l->pid);
			if (revoker_hold_until_exit(b, pidfd, l->pid, &id, 1) == 0)
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

/* One stored lease: all its chunks, adding up to its bytes, within the budget; else its chunks are quarantined. */
static bool adopt_lease(struct recovery *rc, struct store *s, const struct stored_lease *sl)
{
	struct broker *b = rc->b;
	struct chunk **chunks = calloc(sl->nchunks, sizeof(*chunks));
	const char *why = NULL;
	uint64_t sum_bytes = 0;
	struct lease *l;

	if (!chunks)
		why = "out of memory";
	if (!why && lease_find(b->leases, sl->id))
		why = "its id is named twice";
	for (size_t k = 0; !why && k < sl->nchunks; k++) {
		int fd = take_chunk_fd(s, sl->chunk_ids[k]);

		if (fd < 0) {
			why = "a chunk is missing from the fd store or named by a later lease";
		} else if (pool_adopt(b->pool, fd, sl->chunk_ids[k], sl->uid, sl->tails[k], false, &chunks[k]) < 0) {
			close(fd);
			why = "a stored chunk is not a sealed memfd";
		} else {
			sum_bytes += chunks[k]->bytes;
		}
	}
	/* pool_take cuts a lease into chunks that add up to exactly its bytes. */
	if (!why && sum_bytes != sl->bytes)
		why = "its chunks do not add up to its size";
	if (!why && budget_check(b->budget, sl->uid, sl->bytes) < 0)
		why = "it does not fit the budget";
	if (!why && lease_adopt(b->leases, sl->id, sl->uid, sl->bytes, (enum lease_priority)sl->prio, sl->label, chunks,
				sl->nchunks, now_ms(), &l) < 0)
		why = "out of memory";
	if (!why) {
		l->gid = sl->gid;
		l->pid = sl->pid;
		l->no_revoke = sl->no_revoke;
		budget_charge(b->budget, sl->uid, sl->bytes);
		if (l->no_revoke)
			budget_no_revoke_add(b->budget, sl->uid, sl->bytes);
		budget_count_add(b->budget, sl->uid, sl->nchunks);
		for (size_t k = 0; k < sl->nchunks; k++) {
			chunks[k]->lease_id = l->id; /* so a punch found by the audit names its lease */
			/* A former attacher of another uid may still map it: destroyed when the lease ends. */
			chunks[k]->tainted = sl->tainted[k];
		}
		/* Its attachers do not re-declare: each still running holds it until it exits. A
		 * reused pid only keeps it counted longer, never lets its pages go early. */
		for (size_t k = 0; k < sl->nmappers; k++) {
			int pidfd = sys_pidfd_open(sl->mappers[k], 0);
			uint64_t id = l->id;

			if (pidfd >= 0)
				revoker_hold_until_exit(b, pidfd, sl->mappers[k], &id, 1);
		}
		return true;
	}
	/* Its holder may still map these pages: nobody else gets them before the grace ends. */
	for (size_t k = 0; chunks && k < sl->nchunks; k++)
		if (chunks[k])
			quarantine_add(rc, chunks[k]);
	free(chunks);
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
	struct parsed ps;
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
		parsed_free(&ps);
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
		snprintf(name, sizeof(name), "c%llu", (unsigned long long)ps.idle_ids[i]);
		/* The pool lends idle chunks as full chunks: another size is not one it made. */
		if (fstat(fd, &sb) < 0 || (uint64_t)sb.st_size != pool_chunk_size(b->pool)) {
			quarantine_fd(rc, fd, ps.idle_ids[i], name);
			continue;
		}
		if (pool_adopt(b->pool, fd, ps.idle_ids[i], ps.idle_owner[i], false, true, NULL) == 0) {
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
	parsed_free(&ps);
	free(s.keys);
	if (adopted || idle || rc->nquarantine)
		log_info("recovered from the fd store: %zu leases (awaiting re-declaration for %u ms), %zu idle chunks, "
			 "%zu chunks quarantined until then",
			 adopted, b->cfg->redeclare_grace_ms, idle, rc->nquarantine);
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
			id = sum64((uint64_t)getpid(), &ts, sizeof(ts));
		}
	}
	return id;
}

void recovery_init(struct broker *b)
{
	static const struct pool_hooks hooks = { chunk_created, chunk_destroyed, NULL };
	struct notify_stored *st = NULL;
	struct recovery *rc;
	int nst = 0, state_fd = -1, r = -ENODATA;
	size_t adopted = 0;

	rc = calloc(1, sizeof(*rc));
	if (!rc)
		fatalx("cannot set up crash recovery: out of memory");
	rc->b = b;
	rc->state_fd = -1;
	rc->instance_id = new_instance_id();
	b->recovery = rc;
	if (!notify_enabled())
		return;
	/* Hooks first: chunks dropped while adopting must leave the store too. */
	pool_set_hooks(b->pool, &(struct pool_hooks){ hooks.created, hooks.destroyed, rc });
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
			pool_set_hooks(b->pool, NULL);
			quarantine_release(rc);
			return;
		}
	}
	rc->state_fd = state_fd;
	/* Record the adopted world at once: the next crash must not see the previous instance's lines. */
	if (commit_snapshot(rc) < 0)
		poison(rc);
	/* Prewarming adds idle chunks next without a broker verb: record them at the first iteration. */
	rc->written_generation = b->generation - 1;
	ev_prepare_init(&rc->prepare, prepare_cb);
	rc->prepare.data = rc;
	ev_prepare_start(b->loop, &rc->prepare);
	ev_timer_init(&rc->snapshot_timer, snapshot_timer_cb, 0., 0.);
	rc->snapshot_timer.data = rc;
	ev_timer_init(&rc->grace, grace_cb, b->cfg->redeclare_grace_ms / 1000.0, 0.);
	rc->grace.data = rc;
	if (adopted || rc->nquarantine)
		ev_timer_start(b->loop, &rc->grace);
}

void recovery_fini(struct broker *b)
{
	struct recovery *rc = b->recovery;

	if (!rc)
		return;
	if (rc->state_fd >= 0) {
		ev_prepare_stop(b->loop, &rc->prepare);
		ev_timer_stop(b->loop, &rc->snapshot_timer);
		ev_timer_stop(b->loop, &rc->grace);
	}
	quarantine_release(rc);
	/* A clean stop: the state says nothing is lent any more. */
	if (rc->state_fd >= 0) {
		if (ftruncate(rc->state_fd, 0) < 0)
			log_warn("cannot clear the recovery state, ignoring");
		close(rc->state_fd);
	}
	free(rc->body.p);
	free(rc->rec.p);
	free(rc);
	b->recovery = NULL;
}

bool recovery_adopted_state(const struct broker *b)
{
	return b->recovery && b->recovery->adopted_state;
}

uint64_t recovery_instance_id(const struct broker *b)
{
	return b->recovery ? b->recovery->instance_id : 0;
}

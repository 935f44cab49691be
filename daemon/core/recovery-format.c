/* SPDX-License-Identifier: MIT */
/*
 * The recovery state's format: encoding, decoding and validating its descriptors, lease and idle lines and journal
 * records; no I/O.
 */
#define _GNU_SOURCE
#include "recovery-format.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lease.h"

/* ------------------------------------------------------------ formatting */

static bool reserve(struct recovery_buf *b, size_t n)
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

static void put_mem(struct recovery_buf *b, const void *p, size_t n)
{
	if (reserve(b, n)) {
		memcpy(b->p + b->len, p, n);
		b->len += n;
	}
}

static void put_str(struct recovery_buf *b, const char *s)
{
	put_mem(b, s, strlen(s));
}

/* Hand-rolled: vsnprintf per field made the snapshot ten times slower at 20k leases. */
static void put_u64(struct recovery_buf *b, uint64_t v, char sep)
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

static void put_i64(struct recovery_buf *b, int64_t v, char sep)
{
	if (v < 0) {
		put_mem(b, "-", 1);
		put_u64(b, (uint64_t)0 - (uint64_t)v, sep);
	} else {
		put_u64(b, (uint64_t)v, sep);
	}
}

void recovery_buf_reset(struct recovery_buf *b)
{
	b->len = 0;
	b->oom = false;
}

void recovery_buf_free(struct recovery_buf *b)
{
	free(b->p);
	*b = (struct recovery_buf){ 0 };
}

void recovery_format_lease(struct recovery_buf *b, const struct lease *l, const pid_t *holds, size_t nholds)
{
	static const char hex[] = "0123456789abcdef";

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
		put_u64(b, l->chunks[i].id, ':');
		put_u64(b,
			(l->chunks[i].tail ? RECOVERY_CHUNK_FLAG_TAIL : 0) |
				(l->chunks[i].tainted ? RECOVERY_CHUNK_FLAG_TAINTED : 0),
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
	if (l->nattachers > 0 || nholds > 0)
		put_mem(b, " A", 2);
	for (size_t i = 0; i < l->nattachers && nheld < RECOVERY_MAPPERS_MAX; i++, nheld++)
		put_i64(b, l->attachers[i].pid, ',');
	for (size_t i = 0; i < nholds && nheld < RECOVERY_MAPPERS_MAX; i++, nheld++)
		put_i64(b, holds[i], ',');
	put_mem(b, "\n", 1);
}

void recovery_format_idle(struct recovery_buf *b, uint64_t chunk_id, uid_t owner)
{
	put_str(b, "idle ");
	put_u64(b, chunk_id, ' ');
	put_u64(b, owner, '\n');
}

/* Detects torn and stale bytes, not an adversary: only the daemon and systemd hold the memfd. */
uint64_t recovery_format_sum(uint64_t h, const void *p, size_t n)
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

static uint64_t desc_sum(const struct recovery_desc *d)
{
	return recovery_format_sum(1, d, offsetof(struct recovery_desc, desc_sum));
}

static uint64_t record_sum(const struct recovery_record_hdr *h, const void *text)
{
	uint64_t k[2] = { h->len, h->seq };

	return recovery_format_sum(recovery_format_sum(2, k, sizeof(k)), text, h->len);
}

uint64_t recovery_format_align8(uint64_t x)
{
	return (x + 7) & ~(uint64_t)7;
}

int recovery_format_record(struct recovery_buf *b, uint64_t seq, const struct lease *l, const pid_t *holds,
			   size_t nholds)
{
	struct recovery_record_hdr h;

	recovery_buf_reset(b);
	put_mem(b, &(struct recovery_record_hdr){ 0 }, sizeof(h));
	recovery_format_lease(b, l, holds, nholds);
	if (b->oom)
		return -ENOMEM;
	h.len = (uint32_t)(b->len - sizeof(h));
	h.tag = RECOVERY_RECORD_TAG;
	h.seq = seq;
	h.sum = record_sum(&h, b->p + sizeof(h));
	memcpy(b->p, &h, sizeof(h));
	return 0;
}

void recovery_format_desc(struct recovery_desc *d, uint64_t seq, uint64_t instance_id, uint64_t max_lent_id,
			  uint64_t body_off, const void *body, size_t body_len)
{
	memset(d, 0, sizeof(*d));
	memcpy(d->magic, RECOVERY_STATE_MAGIC, sizeof(RECOVERY_STATE_MAGIC));
	d->seq = seq;
	d->instance_id = instance_id;
	d->max_lent_id = max_lent_id;
	d->body_off = body_off;
	d->body_len = body_len;
	d->body_sum = recovery_format_sum(0, body, body_len);
	d->desc_sum = desc_sum(d);
}

/* ------------------------------------------------------------ reading */

void recovery_parsed_free(struct recovery_parsed *p)
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

int recovery_parse_lease(char *line, struct recovery_stored_lease *sl)
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
		sl->tails[i] = (flags & RECOVERY_CHUNK_FLAG_TAIL) != 0;
		/* A flag this daemon does not know is read as tainted: pooling too little is the safe side. */
		sl->tainted[i] = (flags & ~RECOVERY_CHUNK_FLAG_TAIL) != 0;
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

static int add_lease_line(struct recovery_parsed *out, char *line)
{
	struct recovery_stored_lease *nl = realloc(out->leases, (out->nleases + 1) * sizeof(*nl));
	int r;

	if (!nl)
		return -ENOMEM;
	out->leases = nl;
	r = recovery_parse_lease(line, &out->leases[out->nleases]);
	out->nleases++; /* recovery_parsed_free frees whatever it allocated, even on failure */
	if (r == 0 && out->leases[out->nleases - 1].id > out->max_id)
		out->max_id = out->leases[out->nleases - 1].id;
	return r;
}

/* The body: "lease ..." and "idle ..." lines. text has len bytes and a NUL after them. */
static int parse_body(char *text, size_t len, struct recovery_parsed *out)
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
static int parse_journal(recovery_read_fn *read, void *ud, uint64_t file_bytes, struct recovery_parsed *out)
{
	uint64_t pos = recovery_format_align8(out->desc.body_off + out->desc.body_len);
	uint64_t avail = file_bytes > pos ? file_bytes - pos : 0;
	char *j;
	size_t at = 0;
	int r = 0;

	out->journal_end = pos;
	if (avail == 0)
		return 0;
	if (avail > RECOVERY_STATE_MAX_BYTES)
		return -EBADMSG;
	j = malloc((size_t)avail + 1);
	if (!j)
		return -ENOMEM;
	if (read(ud, j, (size_t)avail, pos) != (ssize_t)avail) {
		free(j);
		return -EBADMSG;
	}
	while (at + sizeof(struct recovery_record_hdr) <= avail) {
		struct recovery_record_hdr h;
		char *text;

		memcpy(&h, j + at, sizeof(h));
		/* A torn or stale record ends the journal: whatever it described never left the daemon. */
		if (h.tag != RECOVERY_RECORD_TAG || h.seq != out->desc.seq || h.len == 0 ||
		    h.len > avail - at - sizeof(h) || record_sum(&h, j + at + sizeof(h)) != h.sum)
			break;
		text = j + at + sizeof(h);
		/* Checksummed but not one newline-terminated lease line: not ours, trust nothing. */
		if (text[h.len - 1] != '\n' || memchr(text, '\0', h.len) ||
		    memchr(text, '\n', h.len) != text + h.len - 1 || strncmp(text, "lease ", 6) != 0) {
			r = -EBADMSG;
			break;
		}
		text[h.len - 1] = '\0';
		r = add_lease_line(out, text);
		if (r < 0)
			break;
		at = (size_t)recovery_format_align8(at + sizeof(h) + h.len);
		out->journal_bytes += sizeof(h) + h.len;
	}
	out->journal_end = pos + at;
	free(j);
	return r;
}

int recovery_decode(uint64_t size, recovery_read_fn *read, void *ud, struct recovery_parsed *out)
{
	unsigned char raw[2 * RECOVERY_DESC_BYTES];
	const struct recovery_desc *best = NULL;
	char *body;
	ssize_t n;
	int r;

	memset(out, 0, sizeof(*out));
	if (size == 0)
		return -ENODATA;
	n = read(ud, raw, sizeof(raw), 0);
	if (n < 0)
		return -EBADMSG;
	for (int slot = 0; slot < 2; slot++) {
		struct recovery_desc d;

		if (n < (ssize_t)((slot + 1) * RECOVERY_DESC_BYTES))
			break;
		memcpy(&d, raw + slot * RECOVERY_DESC_BYTES, sizeof(d));
		if (memcmp(d.magic, RECOVERY_STATE_MAGIC, sizeof(RECOVERY_STATE_MAGIC)) != 0 ||
		    d.desc_sum != desc_sum(&d))
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
	if (!best || out->desc.body_off < RECOVERY_BODY_START_BYTES || out->desc.body_len > RECOVERY_STATE_MAX_BYTES ||
	    out->desc.body_off + out->desc.body_len > size) {
		memset(out, 0, sizeof(*out));
		return -EBADMSG;
	}
	body = malloc((size_t)out->desc.body_len + 1);
	if (!body)
		return -ENOMEM;
	if (read(ud, body, (size_t)out->desc.body_len, out->desc.body_off) != (ssize_t)out->desc.body_len ||
	    recovery_format_sum(0, body, (size_t)out->desc.body_len) != out->desc.body_sum) {
		free(body);
		memset(out, 0, sizeof(*out));
		return -EBADMSG;
	}
	body[out->desc.body_len] = '\0';
	r = parse_body(body, (size_t)out->desc.body_len, out);
	free(body);
	if (r == 0)
		r = parse_journal(read, ud, size, out);
	if (r < 0)
		recovery_parsed_free(out);
	return r;
}

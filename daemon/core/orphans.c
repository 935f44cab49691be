/* SPDX-License-Identifier: MIT */
/*
 * Memory a previous daemon lent that live processes still map: the restart state file's text, parsed and written. Pure:
 * no I/O.
 */
#define _GNU_SOURCE
#include "orphans.h"

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>

#define STATE_HEADER_V1 "pinbroker-restart 1"
#define STATE_HEADER "pinbroker-restart 2"

void orphan_clear(struct orphan *o)
{
	free(o->keys);
	free(o->pids);
	free(o->pidfds);
	o->keys = NULL;
	o->pids = NULL;
	o->pidfds = NULL;
	o->nkeys = o->npids = 0;
}

void orphans_free(struct orphan *v, size_t n)
{
	for (size_t i = 0; v && i < n; i++)
		orphan_clear(&v[i]);
	free(v);
}

/* A decimal number ending at one of stops (or the line's end); advances *p past it. */
static int num(const char **p, const char *end, const char *stops, uint64_t *ret)
{
	const char *s = *p;
	uint64_t v = 0;

	for (; *p < end && !strchr(stops, **p); (*p)++) {
		if (**p < '0' || **p > '9' || v > (UINT64_MAX - 9) / 10)
			return -EBADMSG;
		v = v * 10 + (uint64_t)(**p - '0');
	}
	if (*p == s)
		return -EBADMSG;
	*ret = v;
	return 0;
}

/* Expect character c at *p and step over it. */
static bool expect(const char **p, const char *end, char c)
{
	if (*p >= end || **p != c)
		return false;
	(*p)++;
	return true;
}

/* "o <id> <uid> <bytes> p<pid>,... k<dev>:<ino>:<bytes>,..." without its newline. */
static int parse_line(const char *p, const char *end, struct orphan *o)
{
	uint64_t id, uid, bytes, sum = 0, v;
	size_t cap;

	memset(o, 0, sizeof(*o));
	o->verified = true;
	if (!expect(&p, end, 'o') || !expect(&p, end, ' ') || num(&p, end, " ", &id) < 0 || !expect(&p, end, ' ') ||
	    num(&p, end, " ", &uid) < 0 || !expect(&p, end, ' ') || num(&p, end, " ", &bytes) < 0 ||
	    !expect(&p, end, ' ') || !expect(&p, end, 'p') || uid >= (uid_t)-1)
		return -EBADMSG;
	o->lease_id = id;
	o->uid = (uid_t)uid;
	o->bytes = bytes;
	cap = 0;
	while (p < end && *p != ' ') {
		if (o->npids == ORPHAN_PIDS_MAX || num(&p, end, ", ", &v) < 0 || v == 0 || v > INT32_MAX)
			return -EBADMSG;
		if (o->npids == cap) {
			pid_t *np = realloc(o->pids, (cap = cap ? 2 * cap : 4) * sizeof(*np));

			if (!np)
				return -ENOMEM;
			o->pids = np;
		}
		o->pids[o->npids++] = (pid_t)v;
		if (p < end && *p == ',' && (p + 1 >= end || p[1] == ' '))
			return -EBADMSG;
		expect(&p, end, ',');
	}
	if (!expect(&p, end, ' ') || !expect(&p, end, 'k'))
		return -EBADMSG;
	cap = 0;
	while (p < end) {
		uint64_t maj, min, ino, kb;

		if (o->nkeys == ORPHAN_KEYS_MAX || num(&p, end, ":", &maj) < 0 || !expect(&p, end, ':') ||
		    num(&p, end, ":", &min) < 0 || !expect(&p, end, ':') || num(&p, end, ":", &ino) < 0 ||
		    !expect(&p, end, ':') || num(&p, end, ",", &kb) < 0)
			return -EBADMSG;
		if (maj > UINT32_MAX || min > UINT32_MAX || ino == 0 || kb == 0 || sum > UINT64_MAX - kb)
			return -EBADMSG;
		if (p < end && (!expect(&p, end, ',') || p >= end))
			return -EBADMSG; /* a comma, then another key */
		if (o->nkeys == cap) {
			struct orphan_key *nk = realloc(o->keys, (cap = cap ? 2 * cap : 4) * sizeof(*nk));

			if (!nk)
				return -ENOMEM;
			o->keys = nk;
		}
		o->keys[o->nkeys++] = (struct orphan_key){ makedev((unsigned)maj, (unsigned)min), (ino_t)ino, kb };
		sum += kb;
	}
	/* A lease is exactly its chunks; a registration (no chunks) is held by its pids alone. */
	if ((o->nkeys > 0 && sum != bytes) || bytes == 0 || (o->nkeys == 0 && o->npids == 0))
		return -EBADMSG;
	o->pidfds = malloc((o->npids ? o->npids : 1) * sizeof(*o->pidfds));
	if (!o->pidfds)
		return -ENOMEM;
	for (size_t i = 0; i < o->npids; i++)
		o->pidfds[i] = -1;
	return 0;
}

/* Whether a and b are one lease's lines: the same id and the same first chunk. */
static int same_lease_cmp(const void *x, const void *y)
{
	const struct orphan *a = *(const struct orphan *const *)x, *b = *(const struct orphan *const *)y;

	if (a->keys[0].ino != b->keys[0].ino)
		return a->keys[0].ino < b->keys[0].ino ? -1 : 1;
	if (a->keys[0].dev != b->keys[0].dev)
		return a->keys[0].dev < b->keys[0].dev ? -1 : 1;
	if (a->lease_id != b->lease_id)
		return a->lease_id < b->lease_id ? -1 : 1;
	return a < b ? -1 : a > b; /* the earlier line first */
}

/* Fold into the first line of a lease the pids of its later ones (an attach journaled again); drop those. */
static int merge_journal(struct orphan *v, size_t *n)
{
	struct orphan **idx = malloc((*n ? *n : 1) * sizeof(*idx));
	bool *drop = calloc(*n ? *n : 1, sizeof(*drop));
	size_t ni = 0, kept = 0;

	if (!idx || !drop) {
		free(idx);
		free(drop);
		return -ENOMEM;
	}
	for (size_t i = 0; i < *n; i++)
		if (v[i].nkeys > 0)
			idx[ni++] = &v[i];
	qsort(idx, ni, sizeof(*idx), same_lease_cmp);
	for (size_t i = 0, j; i < ni; i = j) {
		struct orphan *first = idx[i];

		for (j = i + 1; j < ni && idx[j]->lease_id == first->lease_id &&
				idx[j]->keys[0].ino == first->keys[0].ino && idx[j]->keys[0].dev == first->keys[0].dev;
		     j++) {
			struct orphan *o = idx[j];

			for (size_t k = 0; k < o->npids; k++) {
				bool have = false;

				for (size_t m = 0; m < first->npids && !have; m++)
					have = first->pids[m] == o->pids[k];
				if (have || first->npids == ORPHAN_PIDS_MAX)
					continue;
				{
					pid_t *np = realloc(first->pids, (first->npids + 1) * sizeof(*np));
					int *nf = realloc(first->pidfds, (first->npids + 1) * sizeof(*nf));

					if (np)
						first->pids = np;
					if (nf)
						first->pidfds = nf;
					if (!np || !nf) {
						free(idx);
						free(drop);
						return -ENOMEM;
					}
				}
				first->pidfds[first->npids] = -1;
				first->pids[first->npids++] = o->pids[k];
			}
			drop[o - v] = true;
		}
	}
	for (size_t i = 0; i < *n; i++) {
		if (drop[i])
			orphan_clear(&v[i]);
		else
			v[kept++] = v[i];
	}
	*n = kept;
	free(idx);
	free(drop);
	return 0;
}

struct key_at {
	dev_t dev;
	ino_t ino;
	size_t line;
};

static int key_at_cmp(const void *x, const void *y)
{
	const struct key_at *a = x, *b = y;

	if (a->ino != b->ino)
		return a->ino < b->ino ? -1 : 1;
	if (a->dev != b->dev)
		return a->dev < b->dev ? -1 : 1;
	return a->line < b->line ? -1 : a->line > b->line;
}

/*
 * A chunk is lent to one lease at a time: one a later line names went back to the pool and out again, so the
 * earlier line's lease had ended (its release was not yet written when the daemon died). Drop that line.
 */
static int drop_reused(struct orphan *v, size_t *n)
{
	struct key_at *k;
	bool *drop;
	size_t nk = 0, kept = 0;

	for (size_t i = 0; i < *n; i++)
		nk += v[i].nkeys;
	k = malloc((nk ? nk : 1) * sizeof(*k));
	drop = calloc(*n ? *n : 1, sizeof(*drop));
	if (!k || !drop) {
		free(k);
		free(drop);
		return -ENOMEM;
	}
	nk = 0;
	for (size_t i = 0; i < *n; i++)
		for (size_t j = 0; j < v[i].nkeys; j++)
			k[nk++] = (struct key_at){ v[i].keys[j].dev, v[i].keys[j].ino, i };
	qsort(k, nk, sizeof(*k), key_at_cmp);
	for (size_t i = 0; i + 1 < nk; i++)
		if (k[i].dev == k[i + 1].dev && k[i].ino == k[i + 1].ino && k[i].line != k[i + 1].line)
			drop[k[i].line] = true;
	for (size_t i = 0; i < *n; i++) {
		if (drop[i])
			orphan_clear(&v[i]);
		else
			v[kept++] = v[i];
	}
	*n = kept;
	free(k);
	free(drop);
	return 0;
}

int orphans_parse(const char *buf, size_t len, const char *boot_id, struct orphan **ret, size_t *n)
{
	return orphans_parse_version(buf, len, boot_id, ret, n, NULL);
}

int orphans_parse_version(const char *buf, size_t len, const char *boot_id, struct orphan **ret, size_t *n,
			  unsigned *version)
{
	const char *p = buf, *end = buf + len, *nl;
	struct orphan *v = NULL;
	size_t nv = 0, cap = 0, line = 0, journal = 0;
	unsigned ver = 0;
	bool ended = false;
	int r = 0;

	*ret = NULL;
	*n = 0;
	if (len > ORPHANS_STATE_MAX_BYTES)
		return -EBADMSG;
	while (r == 0 && p < end && (nl = memchr(p, '\n', (size_t)(end - p)))) {
		size_t ll = (size_t)(nl - p);

		if (ended && ver < 2) {
			r = -EBADMSG; /* nothing after "end" */
		} else if (line == 0) {
			if (ll == strlen(STATE_HEADER) && memcmp(p, STATE_HEADER, ll) == 0)
				ver = 2;
			else if (ll == strlen(STATE_HEADER_V1) && memcmp(p, STATE_HEADER_V1, ll) == 0)
				ver = 1;
			else
				r = -EBADMSG;
		} else if (line == 1) {
			if (ll < 5 || memcmp(p, "boot ", 5) != 0)
				r = -EBADMSG;
			else if (boot_id && *boot_id &&
				 (ll - 5 != strlen(boot_id) || memcmp(p + 5, boot_id, ll - 5) != 0))
				r = -ESTALE;
		} else if (!ended && ll == 3 && memcmp(p, "end", 3) == 0) {
			ended = true;
		} else {
			if (nv == ORPHANS_MAX) {
				r = -EBADMSG;
				break;
			}
			if (nv == cap) {
				struct orphan *nvv = realloc(v, (cap = cap ? 2 * cap : 16) * sizeof(*nvv));

				if (!nvv) {
					r = -ENOMEM;
					break;
				}
				v = nvv;
			}
			r = parse_line(p, nl, &v[nv]);
			nv++; /* freed below if r < 0, whatever it got */
			journal += ended;
		}
		p = nl + 1;
		line++;
	}
	/*
	 * Version 2 goes on after "end" with the lines journaled since (each appended whole before
	 * its lease's fds left): a last line without its newline was cut by a crash mid-write, before
	 * those fds left, and is not trusted.
	 */
	if (r == 0 && (!ended || (p != end && ver < 2)))
		r = -EBADMSG;
	if (r == 0 && journal)
		r = merge_journal(v, &nv);
	if (r == 0 && journal)
		r = drop_reused(v, &nv);
	if (r < 0) {
		orphans_free(v, nv);
		return r;
	}
	*ret = v;
	*n = nv;
	if (version)
		*version = ver;
	return 0;
}

struct text {
	char *p;
	size_t len, cap;
	bool oom;
};

static void add(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct text *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (t->oom)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			t->oom = true;
			return;
		}
		if (t->p && t->len + (size_t)n < t->cap) {
			t->len += (size_t)n;
			return;
		}
		{
			size_t cap = t->cap ? t->cap : 4096;
			char *np;

			while (cap <= t->len + (size_t)n)
				cap *= 2;
			np = realloc(t->p, cap);
			if (!np) {
				t->oom = true;
				return;
			}
			t->p = np;
			t->cap = cap;
		}
	}
}

static void add_line(struct text *t, const struct orphan *o)
{
	add(t, "o %" PRIu64 " %u %" PRIu64 " p", o->lease_id, (unsigned)o->uid, o->bytes);
	for (size_t k = 0; k < o->npids; k++)
		add(t, "%s%d", k ? "," : "", (int)o->pids[k]);
	add(t, " k");
	for (size_t k = 0; k < o->nkeys; k++)
		add(t, "%s%u:%u:%" PRIu64 ":%" PRIu64, k ? "," : "", major(o->keys[k].dev), minor(o->keys[k].dev),
		    (uint64_t)o->keys[k].ino, o->keys[k].bytes);
	add(t, "\n");
}

int orphans_format_line(const struct orphan *o, char **ret, size_t *len)
{
	struct text t = { 0 };

	add_line(&t, o);
	if (t.oom) {
		free(t.p);
		return -ENOMEM;
	}
	*ret = t.p;
	*len = t.len;
	return 0;
}

int orphans_format(const struct orphan *v, size_t n, const char *boot_id, char **ret, size_t *len)
{
	struct text t = { 0 };

	add(&t, "%s\nboot %s\n", STATE_HEADER, boot_id && *boot_id ? boot_id : "unknown");
	for (size_t i = 0; i < n; i++)
		add_line(&t, &v[i]);
	add(&t, "end\n");
	if (t.oom) {
		free(t.p);
		return -ENOMEM;
	}
	*ret = t.p;
	*len = t.len;
	return 0;
}

/* SPDX-License-Identifier: MIT */
/* Memory a previous daemon lent that live processes still map: the restart state file's text, parsed and written. Pure: no I/O. */
#define _GNU_SOURCE
#include "orphans.h"

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>

#define STATE_HEADER "pinbroker-restart 1"

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

int orphans_parse(const char *buf, size_t len, const char *boot_id, struct orphan **ret, size_t *n)
{
	const char *p = buf, *end = buf + len, *nl;
	struct orphan *v = NULL;
	size_t nv = 0, cap = 0, line = 0;
	bool ended = false;
	int r = 0;

	*ret = NULL;
	*n = 0;
	if (len > ORPHANS_STATE_MAX_BYTES)
		return -EBADMSG;
	while (r == 0 && p < end && (nl = memchr(p, '\n', (size_t)(end - p)))) {
		size_t ll = (size_t)(nl - p);

		if (ended) {
			r = -EBADMSG; /* nothing after "end" */
		} else if (line == 0) {
			if (ll != strlen(STATE_HEADER) || memcmp(p, STATE_HEADER, ll) != 0)
				r = -EBADMSG;
		} else if (line == 1) {
			if (ll < 5 || memcmp(p, "boot ", 5) != 0)
				r = -EBADMSG;
			else if (boot_id && *boot_id &&
				 (ll - 5 != strlen(boot_id) || memcmp(p + 5, boot_id, ll - 5) != 0))
				r = -ESTALE;
		} else if (ll == 3 && memcmp(p, "end", 3) == 0) {
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
		}
		p = nl + 1;
		line++;
	}
	if (r == 0 && (!ended || p != end))
		r = -EBADMSG;
	if (r < 0) {
		orphans_free(v, nv);
		return r;
	}
	*ret = v;
	*n = nv;
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

int orphans_format(const struct orphan *v, size_t n, const char *boot_id, char **ret, size_t *len)
{
	struct text t = { 0 };

	add(&t, "%s\nboot %s\n", STATE_HEADER, boot_id && *boot_id ? boot_id : "unknown");
	for (size_t i = 0; i < n; i++) {
		const struct orphan *o = &v[i];

		add(&t, "o %" PRIu64 " %u %" PRIu64 " p", o->lease_id, (unsigned)o->uid, o->bytes);
		for (size_t k = 0; k < o->npids; k++)
			add(&t, "%s%d", k ? "," : "", (int)o->pids[k]);
		add(&t, " k");
		for (size_t k = 0; k < o->nkeys; k++)
			add(&t, "%s%u:%u:%" PRIu64 ":%" PRIu64, k ? "," : "", major(o->keys[k].dev),
			    minor(o->keys[k].dev), (uint64_t)o->keys[k].ino, o->keys[k].bytes);
		add(&t, "\n");
	}
	add(&t, "end\n");
	if (t.oom) {
		free(t.p);
		return -ENOMEM;
	}
	*ret = t.p;
	*len = t.len;
	return 0;
}

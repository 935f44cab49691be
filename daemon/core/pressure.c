/* SPDX-License-Identifier: MIT */
/* Memory-pressure parsing (/proc and cgroup files, given as buffers) and the normal/tight/critical policy. */
#include "pressure.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/*
 * Every parser works on [buf, buf + len) and never assumes a NUL. The
 * line-oriented ones (meminfo, vmstat, PSI, /proc/self/cgroup) use complete
 * lines only: the kernel ends every line with '\n', so an unterminated tail
 * is a truncated read and its number cannot be trusted.
 */

/* The next complete line starting at *pp: sets [*ls, *le) without the '\n' and advances *pp. */
static bool next_line(const char **pp, const char *end, const char **ls, const char **le)
{
	const char *p = *pp;
	const char *nl;

	if (p >= end)
		return false;
	nl = memchr(p, '\n', (size_t)(end - p));
	if (!nl)
		return false;
	*ls = p;
	*le = nl;
	*pp = nl + 1;
	return true;
}

static const char *skip_blanks(const char *p, const char *end)
{
	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	return p;
}

/* Unsigned decimal; at least one digit. Returns 0, -EBADMSG (no digits) or -ERANGE. */
static int parse_u64_at(const char **pp, const char *end, uint64_t *ret)
{
	const char *p = *pp;
	uint64_t v = 0;

	if (p >= end || *p < '0' || *p > '9')
		return -EBADMSG;
	for (; p < end && *p >= '0' && *p <= '9'; p++) {
		unsigned d = (unsigned)(*p - '0');

		if (v > (UINT64_MAX - d) / 10)
			return -ERANGE;
		v = v * 10 + d;
	}
	*pp = p;
	*ret = v;
	return 0;
}

/* "123" or "12.34" (PSI percentages); no sign, no exponent, so no strtod on an unterminated buffer. */
static int parse_decimal_at(const char **pp, const char *end, double *ret)
{
	const char *p = *pp;
	uint64_t ip;
	double frac = 0, scale = 1;
	int r;

	r = parse_u64_at(&p, end, &ip);
	if (r < 0)
		return r;
	if (p < end && *p == '.') {
		p++;
		if (p >= end || *p < '0' || *p > '9')
			return -EBADMSG;
		for (; p < end && *p >= '0' && *p <= '9'; p++) {
			/* Digits past 1e-15 do not change a double; keep consuming them. */
			if (scale < 1e15) {
				frac = frac * 10 + (*p - '0');
				scale *= 10;
			}
		}
	}
	*pp = p;
	*ret = (double)ip + frac / scale;
	return 0;
}

static bool span_eq(const char *s, const char *e, const char *lit)
{
	size_t n = strlen(lit);

	return (size_t)(e - s) == n && memcmp(s, lit, n) == 0;
}

/* --- /proc/meminfo --- */

struct meminfo_key {
	const char *name;
	unsigned bit;
	bool kb; /* value carries " kB"; the others are page counts */
};

static const struct meminfo_key meminfo_keys[] = {
	{ "MemTotal", MEMINFO_MEM_TOTAL, true },
	{ "MemAvailable", MEMINFO_MEM_AVAILABLE, true },
	{ "SwapTotal", MEMINFO_SWAP_TOTAL, true },
	{ "SwapFree", MEMINFO_SWAP_FREE, true },
	{ "Shmem", MEMINFO_SHMEM, true },
	{ "Mlocked", MEMINFO_MLOCKED, true },
	{ "Unevictable", MEMINFO_UNEVICTABLE, true },
	{ "HugePages_Total", MEMINFO_HUGEPAGES_TOTAL, false },
	{ "HugePages_Free", MEMINFO_HUGEPAGES_FREE, false },
	{ "Hugepagesize", MEMINFO_HUGEPAGE_SIZE, true },
};

/* "   1234 kB" (kb) or "   1234" up to le. Returns 0 and the value in bytes (or pages), or -EBADMSG. */
static int meminfo_value(const char *p, const char *le, bool kb, uint64_t *ret)
{
	uint64_t v;
	int r;

	p = skip_blanks(p, le);
	r = parse_u64_at(&p, le, &v);
	if (r < 0)
		return -EBADMSG;
	p = skip_blanks(p, le);
	if (kb) {
		if (le - p < 2 || p[0] != 'k' || p[1] != 'B')
			return -EBADMSG;
		p += 2;
		if (v > UINT64_MAX / 1024)
			return -EBADMSG;
		v *= 1024;
	}
	p = skip_blanks(p, le);
	if (p != le)
		return -EBADMSG;
	*ret = v;
	return 0;
}

int pressure_parse_meminfo(const char *buf, size_t len, struct meminfo *ret)
{
	const char *p = buf, *end = buf + len, *ls, *le;
	uint64_t vals[sizeof(meminfo_keys) / sizeof(meminfo_keys[0])] = { 0 };
	unsigned have = 0;
	struct meminfo m = { 0 };

	if (!buf)
		return -EBADMSG;
	while (next_line(&p, end, &ls, &le)) {
		const char *colon = memchr(ls, ':', (size_t)(le - ls));

		if (!colon)
			continue;
		for (size_t i = 0; i < sizeof(meminfo_keys) / sizeof(meminfo_keys[0]); i++) {
			const struct meminfo_key *k = &meminfo_keys[i];

			if (!span_eq(ls, colon, k->name))
				continue;
			/* A malformed optional field is dropped; the caller sees its bit clear. */
			if (meminfo_value(colon + 1, le, k->kb, &vals[i]) < 0)
				have &= ~k->bit;
			else
				have |= k->bit;
			break;
		}
	}
	if (!(have & MEMINFO_MEM_TOTAL) || !(have & MEMINFO_MEM_AVAILABLE) || vals[0] == 0)
		return -EBADMSG;

	for (size_t i = 0; i < sizeof(meminfo_keys) / sizeof(meminfo_keys[0]); i++) {
		uint64_t v = (have & meminfo_keys[i].bit) ? vals[i] : 0;

		switch (meminfo_keys[i].bit) {
		case MEMINFO_MEM_TOTAL:
			m.mem_total_bytes = v;
			break;
		case MEMINFO_MEM_AVAILABLE:
			m.mem_available_bytes = v;
			break;
		case MEMINFO_SWAP_TOTAL:
			m.swap_total_bytes = v;
			break;
		case MEMINFO_SWAP_FREE:
			m.swap_free_bytes = v;
			break;
		case MEMINFO_SHMEM:
			m.shmem_bytes = v;
			break;
		case MEMINFO_MLOCKED:
			m.mlocked_bytes = v;
			break;
		case MEMINFO_UNEVICTABLE:
			m.unevictable_bytes = v;
			break;
		case MEMINFO_HUGEPAGES_TOTAL:
			m.hugepages_total_bytes = v;
			break; /* pages until scaled below */
		case MEMINFO_HUGEPAGES_FREE:
			m.hugepages_free_bytes = v;
			break;
		case MEMINFO_HUGEPAGE_SIZE:
			m.hugepage_size_bytes = v;
			break;
		}
	}
	/* Page counts become bytes only with a page size; an absurd product is dropped, not wrapped. */
	if ((have & MEMINFO_HUGEPAGE_SIZE) && m.hugepage_size_bytes > 0) {
		if (m.hugepages_total_bytes > UINT64_MAX / m.hugepage_size_bytes) {
			m.hugepages_total_bytes = 0;
			have &= ~(unsigned)MEMINFO_HUGEPAGES_TOTAL;
		} else {
			m.hugepages_total_bytes *= m.hugepage_size_bytes;
		}
		if (m.hugepages_free_bytes > UINT64_MAX / m.hugepage_size_bytes) {
			m.hugepages_free_bytes = 0;
			have &= ~(unsigned)MEMINFO_HUGEPAGES_FREE;
		} else {
			m.hugepages_free_bytes *= m.hugepage_size_bytes;
		}
	} else {
		m.hugepages_total_bytes = m.hugepages_free_bytes = 0;
	}
	m.have = have;
	*ret = m;
	return 0;
}

/* --- flat "key value" files --- */

int pressure_parse_keyed_u64(const char *buf, size_t len, const char *key, uint64_t *ret)
{
	const char *p = buf, *end = buf + len, *ls, *le;

	if (!buf || !key)
		return -ENOENT;
	while (next_line(&p, end, &ls, &le)) {
		const char *sp = ls;
		const char *q;
		uint64_t v;

		while (sp < le && *sp != ' ')
			sp++;
		if (sp == le || !span_eq(ls, sp, key))
			continue;
		q = skip_blanks(sp, le);
		if (parse_u64_at(&q, le, &v) < 0)
			return -EBADMSG;
		if (skip_blanks(q, le) != le)
			return -EBADMSG;
		*ret = v;
		return 0;
	}
	return -ENOENT;
}

int pressure_parse_vmstat(const char *buf, size_t len, struct vmstat *ret)
{
	struct vmstat v;

	if (pressure_parse_keyed_u64(buf, len, "pswpin", &v.pswpin) < 0 ||
	    pressure_parse_keyed_u64(buf, len, "pswpout", &v.pswpout) < 0)
		return -EBADMSG;
	*ret = v;
	return 0;
}

/* --- PSI --- */

/* After "some"/"full": " avg10=0.00 avg60=0.00 avg300=0.00 total=0" (Documentation/accounting/psi.rst). */
static int psi_fields(const char *p, const char *le, struct psi_line *ret)
{
	struct psi_line l = { 0 };
	unsigned seen = 0;

	for (;;) {
		const char *k, *eq;
		int r;

		p = skip_blanks(p, le);
		if (p == le)
			break;
		k = p;
		while (p < le && *p != '=' && *p != ' ')
			p++;
		if (p == le || *p != '=')
			return -EBADMSG;
		eq = p++;
		if (span_eq(k, eq, "avg10")) {
			r = parse_decimal_at(&p, le, &l.avg10);
			seen |= 1;
		} else if (span_eq(k, eq, "avg60")) {
			r = parse_decimal_at(&p, le, &l.avg60);
			seen |= 2;
		} else if (span_eq(k, eq, "avg300")) {
			r = parse_decimal_at(&p, le, &l.avg300);
			seen |= 4;
		} else if (span_eq(k, eq, "total")) {
			r = parse_u64_at(&p, le, &l.total_us);
			seen |= 8;
		} else {
			/* A future field: skip its value. */
			while (p < le && *p != ' ')
				p++;
			r = 0;
		}
		if (r < 0)
			return -EBADMSG;
		if (p < le && *p != ' ' && *p != '\t')
			return -EBADMSG;
	}
	if (seen != 15)
		return -EBADMSG;
	l.present = true;
	*ret = l;
	return 0;
}

int pressure_parse_psi(const char *buf, size_t len, struct psi *ret)
{
	const char *p = buf, *end = buf + len, *ls, *le;
	struct psi out = { 0 };

	if (!buf)
		return -EBADMSG;
	while (next_line(&p, end, &ls, &le)) {
		struct psi_line *dst;

		if (le - ls >= 4 && memcmp(ls, "some", 4) == 0)
			dst = &out.some;
		else if (le - ls >= 4 && memcmp(ls, "full", 4) == 0)
			dst = &out.full;
		else
			continue;
		if (le - ls > 4 && ls[4] != ' ')
			continue;
		if (psi_fields(ls + 4, le, dst) < 0)
			return -EBADMSG;
	}
	if (!out.some.present)
		return -EBADMSG;
	*ret = out;
	return 0;
}

/* --- cgroup files --- */

int pressure_parse_u64_file(const char *buf, size_t len, uint64_t *ret)
{
	const char *p, *end;
	uint64_t v;

	if (!buf)
		return -EBADMSG;
	p = buf;
	end = buf + len;
	if (parse_u64_at(&p, end, &v) < 0)
		return -EBADMSG;
	if (p < end && *p == '\n')
		p++;
	if (p != end)
		return -EBADMSG;
	*ret = v;
	return 0;
}

int pressure_parse_cgroup_v2_max(const char *buf, size_t len, uint64_t *ret)
{
	if (buf && (span_eq(buf, buf + len, "max\n") || span_eq(buf, buf + len, "max"))) {
		*ret = PRESSURE_UNLIMITED;
		return 0;
	}
	return pressure_parse_u64_file(buf, len, ret);
}

int pressure_parse_cgroup_v1_limit(const char *buf, size_t len, uint64_t *ret)
{
	uint64_t v;
	int r;

	r = pressure_parse_u64_file(buf, len, &v);
	if (r < 0)
		return r;
	*ret = v >= PRESSURE_V1_UNLIMITED_BYTES ? PRESSURE_UNLIMITED : v;
	return 0;
}

/* A path we will join below the proc root: absolute, no NUL, no ".." component. */
static int cgroup_path_copy(const char *s, const char *e, char *dst)
{
	size_t n = (size_t)(e - s);

	if (n == 0 || *s != '/' || memchr(s, '\0', n))
		return -EBADMSG;
	if (n >= PRESSURE_CGROUP_PATH_MAX)
		return -ENAMETOOLONG;
	for (const char *c = s; c < e;) {
		const char *slash = memchr(c, '/', (size_t)(e - c));
		const char *ce = slash ? slash : e;

		if (span_eq(c, ce, ".."))
			return -EBADMSG;
		c = slash ? slash + 1 : e;
	}
	memcpy(dst, s, n);
	dst[n] = '\0';
	return 0;
}

static bool controllers_have_memory(const char *s, const char *e)
{
	while (s < e) {
		const char *comma = memchr(s, ',', (size_t)(e - s));
		const char *ce = comma ? comma : e;

		if (span_eq(s, ce, "memory"))
			return true;
		s = comma ? comma + 1 : e;
	}
	return false;
}

int pressure_parse_self_cgroup(const char *buf, size_t len, struct cgroup_paths *ret)
{
	const char *p = buf, *end = buf + len, *ls, *le;
	int r;

	if (!buf)
		return -EBADMSG;
	ret->v1_memory[0] = ret->v2[0] = '\0';
	ret->has_v1_memory = ret->has_v2 = false;
	while (next_line(&p, end, &ls, &le)) {
		const char *c1 = memchr(ls, ':', (size_t)(le - ls));
		const char *c2;
		uint64_t id;
		const char *q = ls;

		if (!c1)
			continue;
		c2 = memchr(c1 + 1, ':', (size_t)(le - c1 - 1));
		if (!c2)
			continue;
		if (parse_u64_at(&q, c1, &id) < 0 || q != c1)
			continue;
		if (id == 0 && c2 == c1 + 1) {
			if (ret->has_v2)
				continue;
			r = cgroup_path_copy(c2 + 1, le, ret->v2);
			if (r < 0)
				return r;
			ret->has_v2 = true;
		} else if (controllers_have_memory(c1 + 1, c2)) {
			if (ret->has_v1_memory)
				continue;
			r = cgroup_path_copy(c2 + 1, le, ret->v1_memory);
			if (r < 0)
				return r;
			ret->has_v1_memory = true;
		}
	}
	if (!ret->has_v1_memory && !ret->has_v2)
		return -EBADMSG;
	return 0;
}

double pressure_rate_per_s(uint64_t prev, uint64_t cur, uint64_t dt_ms)
{
	if (dt_ms == 0 || cur < prev)
		return 0;
	return (double)(cur - prev) * 1000.0 / (double)dt_ms;
}

/* --- policy --- */

struct pressure {
	struct pressure_thresholds t;
	enum broker_state state;
	/* Start of the current unbroken run of samples whose level was below critical / at normal. */
	bool below_critical;
	uint64_t below_critical_since_ms;
	bool below_tight;
	uint64_t below_tight_since_ms;
};

void pressure_figures(const struct pressure_sample *s, struct pressure_figures *ret)
{
	const struct meminfo *m = &s->mem;
	uint64_t base = m->mem_total_bytes;
	uint64_t avail = m->mem_available_bytes < base ? m->mem_available_bytes : base;
	struct pressure_figures f = { 0 };

	f.cgroup_usage_pct = NAN;
	if (s->have_cgroup_limit && s->cgroup_limit_bytes != PRESSURE_UNLIMITED && s->cgroup_limit_bytes > 0) {
		/*
		 * Inactive file pages are charged to the cgroup yet reclaimable, as
		 * MemAvailable counts them host-wide (docker stats does the same).
		 */
		uint64_t used = s->cgroup_usage_bytes > s->cgroup_reclaimable_bytes
					? s->cgroup_usage_bytes - s->cgroup_reclaimable_bytes
					: 0;

		f.cgroup_usage_pct = (double)s->cgroup_usage_bytes * 100.0 / (double)s->cgroup_limit_bytes;
		if (s->cgroup_limit_bytes < base) {
			uint64_t cg_avail = s->cgroup_limit_bytes > used ? s->cgroup_limit_bytes - used : 0;

			base = s->cgroup_limit_bytes;
			if (cg_avail < avail)
				avail = cg_avail;
			if (avail > base)
				avail = base;
			f.cgroup_dominates = true;
		}
	}
	f.mem_base_bytes = base;
	f.mem_available_bytes = avail;
	f.mem_available_pct = base ? (double)avail * 100.0 / (double)base : NAN;

	if (m->swap_total_bytes > 0) {
		uint64_t sf = m->swap_free_bytes < m->swap_total_bytes ? m->swap_free_bytes : m->swap_total_bytes;

		f.swap_free_pct = (double)sf * 100.0 / (double)m->swap_total_bytes;
	} else {
		f.swap_free_pct = NAN;
	}
	f.swapout_pages_s = s->have_swapout ? s->swapout_pages_s : NAN;
	f.swapin_pages_s = s->have_swapout ? s->swapin_pages_s : NAN;
	f.psi_some_avg10 = s->have_psi && s->psi.some.present ? s->psi.some.avg10 : NAN;
	f.psi_full_avg10 = s->have_psi && s->psi.full.present ? s->psi.full.avg10 : NAN;
	*ret = f;
}

/* Appends to a fixed buffer, truncating silently; why strings are for humans. */
struct sbuf {
	char *buf;
	size_t len;
	size_t used;
};

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!b->buf || b->len == 0 || b->used >= b->len - 1)
		return;
	va_start(ap, fmt);
	n = vsnprintf(b->buf + b->used, b->len - b->used, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	b->used += (size_t)n;
	if (b->used >= b->len)
		b->used = b->len - 1;
}

static void sb_sep(struct sbuf *b)
{
	if (b->used > 0)
		sb_printf(b, "; ");
}

/* Also the order figures appear in a why. */
enum signal_id { SIG_MEM, SIG_PSI_SOME, SIG_PSI_FULL, SIG_SWAPOUT, SIG_SWAP_FREE, SIG__MAX };

static void sb_mem(struct sbuf *b, const struct pressure_figures *f)
{
	if (f->cgroup_dominates) {
		char sz[32];

		sb_printf(b, "MemAvailable %.1f%% of cgroup limit %s", f->mem_available_pct,
			  format_size(f->mem_base_bytes, sz, sizeof(sz)));
	} else {
		sb_printf(b, "MemAvailable %.1f%%", f->mem_available_pct);
	}
}

static void sb_signal(struct sbuf *b, const struct pressure_figures *f, enum signal_id id)
{
	switch (id) {
	case SIG_MEM:
		sb_mem(b, f);
		break;
	case SIG_SWAP_FREE:
		sb_printf(b, "SwapFree %.1f%%", f->swap_free_pct);
		break;
	case SIG_SWAPOUT:
		sb_printf(b, "swap-out %.0f pages/s", f->swapout_pages_s);
		break;
	case SIG_PSI_SOME:
		sb_printf(b, "PSI some avg10 %.2f", f->psi_some_avg10);
		break;
	case SIG_PSI_FULL:
		sb_printf(b, "PSI full avg10 %.2f", f->psi_full_avg10);
		break;
	case SIG__MAX:
		break;
	}
}

struct condition {
	enum signal_id sig;
	enum broker_state level;
	bool below; /* crosses when the figure is below the threshold */
};

/* Critical first, so the reasons a why leads with are the ones that decided. */
static const struct condition conditions[] = {
	{ SIG_MEM, BROKER_CRITICAL, true },      { SIG_PSI_FULL, BROKER_CRITICAL, false },
	{ SIG_SWAPOUT, BROKER_CRITICAL, false }, { SIG_MEM, BROKER_TIGHT, true },
	{ SIG_PSI_SOME, BROKER_TIGHT, false },   { SIG_SWAPOUT, BROKER_TIGHT, false },
	{ SIG_SWAP_FREE, BROKER_TIGHT, true },
};

static double figure_of(const struct pressure_figures *f, enum signal_id id)
{
	switch (id) {
	case SIG_MEM:
		return f->mem_available_pct;
	case SIG_SWAP_FREE:
		return f->swap_free_pct;
	case SIG_SWAPOUT:
		return f->swapout_pages_s;
	case SIG_PSI_SOME:
		return f->psi_some_avg10;
	case SIG_PSI_FULL:
		return f->psi_full_avg10;
	case SIG__MAX:
		break;
	}
	return NAN;
}

static double threshold_of(const struct pressure_thresholds *t, const struct condition *c)
{
	bool crit = c->level == BROKER_CRITICAL;

	switch (c->sig) {
	case SIG_MEM:
		return crit ? t->critical_mem_available_pct : t->tight_mem_available_pct;
	case SIG_SWAP_FREE:
		return crit ? NAN : t->tight_swap_free_pct;
	case SIG_SWAPOUT:
		return crit ? t->critical_swapout_pages_s : t->tight_swapout_pages_s;
	case SIG_PSI_SOME:
		return crit ? NAN : t->tight_psi_some_avg10;
	case SIG_PSI_FULL:
		return crit ? t->critical_psi_full_avg10 : NAN;
	case SIG__MAX:
		break;
	}
	return NAN;
}

/* NAN on either side compares false, so a missing signal or a disabled threshold never crosses. */
static bool crosses(const struct pressure_thresholds *t, const struct pressure_figures *f, const struct condition *c)
{
	double v = figure_of(f, c->sig), th = threshold_of(t, c);

	return c->below ? v < th : v > th;
}

enum broker_state pressure_level(const struct pressure_thresholds *t, const struct pressure_figures *f)
{
	enum broker_state level = BROKER_NORMAL;

	for (size_t i = 0; i < sizeof(conditions) / sizeof(conditions[0]); i++)
		if (conditions[i].level > level && crosses(t, f, &conditions[i]))
			level = conditions[i].level;
	return level;
}

/* The crossing conditions at level, then every other figure that exists. */
static void describe(struct sbuf *b, const struct pressure_thresholds *t, const struct pressure_figures *f,
		     enum broker_state level)
{
	bool shown[SIG__MAX] = { false };

	for (size_t i = 0; i < sizeof(conditions) / sizeof(conditions[0]); i++) {
		const struct condition *c = &conditions[i];

		if (c->level != level || shown[c->sig] || !crosses(t, f, c))
			continue;
		sb_sep(b);
		sb_signal(b, f, c->sig);
		sb_printf(b, " %c %g%s %s threshold", c->below ? '<' : '>', threshold_of(t, c),
			  c->sig == SIG_MEM || c->sig == SIG_SWAP_FREE ? "%"
			  : c->sig == SIG_SWAPOUT                      ? "/s"
								       : "",
			  pressure_state_name(c->level));
		shown[c->sig] = true;
	}
	for (int id = 0; id < SIG__MAX; id++) {
		if (shown[id] || isnan(figure_of(f, (enum signal_id)id)))
			continue;
		sb_sep(b);
		sb_signal(b, f, (enum signal_id)id);
	}
}

int pressure_new(const struct pressure_thresholds *t, struct pressure **ret)
{
	struct pressure *p;

	if (!t)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->t = *t;
	p->state = BROKER_NORMAL;
	*ret = p;
	return 0;
}

void pressure_free(struct pressure *p)
{
	free(p);
}

void pressure_set_thresholds(struct pressure *p, const struct pressure_thresholds *t)
{
	p->t = *t;
}

const struct pressure_thresholds *pressure_get_thresholds(const struct pressure *p)
{
	return &p->t;
}

enum broker_state pressure_state(const struct pressure *p)
{
	return p->state;
}

const char *pressure_state_name(enum broker_state s)
{
	switch (s) {
	case BROKER_NORMAL:
		return "normal";
	case BROKER_TIGHT:
		return "tight";
	case BROKER_CRITICAL:
		return "critical";
	}
	return "unknown";
}

static uint64_t elapsed_ms(uint64_t since, uint64_t now)
{
	return now > since ? now - since : 0;
}

enum broker_state pressure_evaluate(struct pressure *p, const struct pressure_sample *s, uint64_t now_ms, char *why,
				    size_t why_len)
{
	struct sbuf b = { why, why_len, 0 };
	struct pressure_figures f;
	enum broker_state level, old = p->state;

	if (why && why_len)
		why[0] = '\0';
	pressure_figures(s, &f);
	level = pressure_level(&p->t, &f);

	/* One high sample breaks the calm run: hysteresis counts continuous time below. */
	if (level == BROKER_CRITICAL) {
		p->below_critical = p->below_tight = false;
	} else {
		if (!p->below_critical) {
			p->below_critical = true;
			p->below_critical_since_ms = now_ms;
		}
		if (level == BROKER_TIGHT) {
			p->below_tight = false;
		} else if (!p->below_tight) {
			p->below_tight = true;
			p->below_tight_since_ms = now_ms;
		}
	}

	if (level > p->state) {
		p->state = level;
	} else if (level < p->state) {
		if (p->below_tight && elapsed_ms(p->below_tight_since_ms, now_ms) >= p->t.hysteresis_ms)
			p->state = BROKER_NORMAL;
		else if (p->state == BROKER_CRITICAL && p->below_critical &&
			 elapsed_ms(p->below_critical_since_ms, now_ms) >= p->t.hysteresis_ms)
			p->state = BROKER_TIGHT;
	}

	if (p->state < old) {
		sb_printf(&b, "below %s thresholds for %" PRIu64 " ms", pressure_state_name(p->state + 1),
			  elapsed_ms(p->state == BROKER_NORMAL ? p->below_tight_since_ms : p->below_critical_since_ms,
				     now_ms));
	} else if (level < p->state) {
		uint64_t since = p->state == BROKER_TIGHT ? p->below_tight_since_ms : p->below_critical_since_ms;

		sb_printf(&b, "below %s thresholds for %" PRIu64 " of %" PRIu32 " ms", pressure_state_name(p->state),
			  elapsed_ms(since, now_ms), p->t.hysteresis_ms);
	}
	describe(&b, &p->t, &f, level);
	return p->state;
}

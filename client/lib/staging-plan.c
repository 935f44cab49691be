/* SPDX-License-Identifier: MIT */
/* Staged copies' decisions (staging-plan.h): settings, whether to stage a copy, and how it is cut. */
#include "staging-plan.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pinbroker-internal.h"
#include "util.h"

void pbst_settings_default(struct pbst_settings *s)
{
	s->enabled = true;
	s->ring_bytes = PBST_RING_DEFAULT_BYTES;
	s->slot_bytes = PBST_SLOT_DEFAULT_BYTES;
	s->threads = PBST_THREADS_DEFAULT;
	s->threshold_bytes = PBST_THRESHOLD_DEFAULT_BYTES;
	/* Measured on an H100 (docs/staging.md): a win into the program's memory, mixed into the ring. */
	s->stream_h2d = false;
	s->stream_d2h = true;
}

unsigned pbst_threads_for_cpus(long cpus)
{
	if (cpus < 2)
		return 1;
	return cpus / 2 < (long)PBST_THREADS_DEFAULT ? (unsigned)(cpus / 2) : PBST_THREADS_DEFAULT;
}

/* Appends "; " and the formatted text to why (what fits). */
__attribute__((format(printf, 3, 4))) static void why_add(char *why, size_t len, const char *fmt, ...)
{
	size_t used;
	va_list ap;

	if (!why || len == 0)
		return;
	used = strnlen(why, len);
	if (used > 0 && used + 2 < len) {
		memcpy(why + used, "; ", 3);
		used += 2;
	}
	if (used + 1 >= len)
		return;
	va_start(ap, fmt);
	vsnprintf(why + used, len - used, fmt, ap);
	va_end(ap);
}

/* Bound checks shared by the environment and pb_staging_configure: NULL when good, else why not. */
static const char *ring_problem(size_t ring_bytes)
{
	if (ring_bytes > PBST_RING_MAX_BYTES)
		return "more than the most a ring may be (1 GiB)";
	return NULL;
}

static const char *slot_problem(size_t slot_bytes)
{
	if (slot_bytes < PBST_SLOT_MIN_BYTES)
		return "less than the smallest slot (64 KiB)";
	return NULL;
}

static const char *threads_problem(unsigned long threads)
{
	if (threads < 1 || threads > PBST_THREADS_MAX)
		return "not between 1 and 64";
	return NULL;
}

static bool parse_on_off(const char *v, bool *on)
{
	static const char *const yes[] = { "1", "yes", "on", "true" }, *const no[] = { "0", "no", "off", "false" };

	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (strcasecmp(v, yes[i]) == 0) {
			*on = true;
			return true;
		}
		if (strcasecmp(v, no[i]) == 0) {
			*on = false;
			return true;
		}
	}
	return false;
}

/* "d2h", "h2d", "both" or on ("1", ...), "none" or off ("0", ...): which directions stream; false (s kept) otherwise. */
static bool parse_stream_stores(const char *v, struct pbst_settings *s)
{
	bool on;

	if (strcasecmp(v, "d2h") == 0 || strcasecmp(v, "h2d") == 0) {
		s->stream_d2h = strcasecmp(v, "d2h") == 0;
		s->stream_h2d = !s->stream_d2h;
		return true;
	}
	if (strcasecmp(v, "both") == 0 || strcasecmp(v, "none") == 0)
		on = strcasecmp(v, "both") == 0;
	else if (!parse_on_off(v, &on))
		return false;
	s->stream_h2d = s->stream_d2h = on;
	return true;
}

/* One size variable: *out stays the default (with a message) unless v is a good size that problem accepts. */
static bool env_size(const char *name, const char *v, const char *(*problem)(size_t), size_t *out, char *why,
		     size_t len)
{
	char def[32];
	const char *bad;
	uint64_t x;

	if (!v || !*v)
		return true;
	format_size(*out, def, sizeof(def));
	if (parse_size(v, &x) < 0 || x > SIZE_MAX) {
		why_add(why, len, "%s=%s is not a size (such as 64M or 1G); using the default %s", name, v, def);
		return false;
	}
	bad = problem ? problem((size_t)x) : NULL;
	if (bad) {
		why_add(why, len, "%s=%s is %s; using the default %s", name, v, bad, def);
		return false;
	}
	*out = (size_t)x;
	return true;
}

int pbst_settings_from_env(struct pbst_settings *s, pbst_getenv_fn get, void *arg, char *why, size_t why_len)
{
	const char *v;
	bool good = true;

	if (why && why_len)
		why[0] = '\0';
	pbst_settings_default(s);
	v = get("PINBROKER_STAGING", arg);
	if (v && *v && !parse_on_off(v, &s->enabled)) {
		why_add(why, why_len, "PINBROKER_STAGING=%s is not 0 or 1; staging stays on", v);
		good = false;
	}
	v = get("PINBROKER_STAGING_STREAM_STORES", arg);
	if (v && *v && !parse_stream_stores(v, s)) {
		why_add(why, why_len,
			"PINBROKER_STAGING_STREAM_STORES=%s is not d2h, h2d, both (1) or none (0); using the default d2h",
			v);
		good = false;
	}
	good &= env_size("PINBROKER_STAGING_RING", get("PINBROKER_STAGING_RING", arg), ring_problem, &s->ring_bytes,
			 why, why_len);
	good &= env_size("PINBROKER_STAGING_SLOT", get("PINBROKER_STAGING_SLOT", arg), slot_problem, &s->slot_bytes,
			 why, why_len);
	good &= env_size("PINBROKER_STAGING_THRESHOLD", get("PINBROKER_STAGING_THRESHOLD", arg), NULL,
			 &s->threshold_bytes, why, why_len);
	v = get("PINBROKER_STAGING_THREADS", arg);
	if (v && *v) {
		char *end;
		unsigned long n;

		errno = 0;
		n = strtoul(v, &end, 10);
		if (errno || end == v || *end || v[0] == '-' || threads_problem(n)) {
			why_add(why, why_len,
				"PINBROKER_STAGING_THREADS=%s is not a whole number from 1 to 64; using the default %u",
				v, PBST_THREADS_DEFAULT);
			good = false;
		} else {
			s->threads = (unsigned)n;
		}
	}
	if (s->ring_bytes / s->slot_bytes < PBST_SLOTS_MIN) {
		char ring[32], slot[32];

		why_add(why, why_len,
			"PINBROKER_STAGING_RING (%s) holds fewer than 2 slots of PINBROKER_STAGING_SLOT (%s); "
			"using the default ring and slot",
			format_size(s->ring_bytes, ring, sizeof(ring)), format_size(s->slot_bytes, slot, sizeof(slot)));
		s->ring_bytes = PBST_RING_DEFAULT_BYTES;
		s->slot_bytes = PBST_SLOT_DEFAULT_BYTES;
		good = false;
	}
	return good ? 0 : -EINVAL;
}

int pbst_settings_apply(struct pbst_settings *s, const struct pb_staging_opts *o, char *why, size_t why_len)
{
	struct pbst_settings n = *s;
	const char *bad;

	if (why && why_len)
		why[0] = '\0';
	if (o->ring_bytes)
		n.ring_bytes = o->ring_bytes;
	if (o->slot_bytes)
		n.slot_bytes = o->slot_bytes;
	if (o->threads)
		n.threads = o->threads;
	if (o->threshold_bytes)
		n.threshold_bytes = o->threshold_bytes;
	if ((bad = ring_problem(n.ring_bytes))) {
		why_add(why, why_len, "ring_bytes %zu is %s", n.ring_bytes, bad);
		return -EINVAL;
	}
	if ((bad = slot_problem(n.slot_bytes))) {
		why_add(why, why_len, "slot_bytes %zu is %s", n.slot_bytes, bad);
		return -EINVAL;
	}
	if ((bad = threads_problem(n.threads))) {
		why_add(why, why_len, "threads %u is %s", n.threads, bad);
		return -EINVAL;
	}
	if (n.ring_bytes / n.slot_bytes < PBST_SLOTS_MIN) {
		why_add(why, why_len, "ring_bytes %zu holds fewer than 2 slots of slot_bytes %zu", n.ring_bytes,
			n.slot_bytes);
		return -EINVAL;
	}
	*s = n;
	return 0;
}

unsigned pbst_settings_slots(const struct pbst_settings *s)
{
	size_t n = s->slot_bytes ? s->ring_bytes / s->slot_bytes : 0;

	return n > UINT32_MAX ? UINT32_MAX : (unsigned)n;
}

bool pbst_size_qualifies(const struct pbst_settings *s, size_t bytes)
{
	return s->enabled && bytes > 0 && bytes >= s->threshold_bytes;
}

static bool pageable(const struct pbst_ptr_facts *p)
{
	return p->memory_type == PBST_MEMTYPE_UNKNOWN && !p->managed;
}

static bool device(const struct pbst_ptr_facts *p)
{
	return p->memory_type == PBST_MEMTYPE_DEVICE && !p->managed;
}

/* Host memory the driver knows (pinned, registered): it copies that at full speed itself. */
static bool pinned(const struct pbst_ptr_facts *p)
{
	return p->memory_type == PBST_MEMTYPE_HOST && !p->managed;
}

/* The verdict on host side h and device side d, for a copy in the direction stage names. */
static enum pbst_verdict sides(const struct pbst_ptr_facts *h, const struct pbst_ptr_facts *d, enum pbst_verdict stage)
{
	if (pageable(h) && device(d))
		return stage;
	if (device(h) && device(d))
		return PBST_PASS_DEVICE_BOTH;
	if (pinned(h) && device(d))
		return PBST_PASS_NOT_PAGEABLE;
	if (device(h) && (pageable(d) || pinned(d)))
		return PBST_PASS_MISMATCH;
	return PBST_PASS_NOT_DEVICE;
}

enum pbst_verdict pbst_decide(const struct pbst_settings *s, const struct pbst_copy_facts *f)
{
	enum pbst_verdict v;

	if (!s->enabled)
		return PBST_PASS_DISABLED;
	if (!pbst_size_qualifies(s, f->bytes))
		return PBST_PASS_SMALL;
	if (f->dst.managed || f->src.managed)
		return PBST_PASS_MANAGED;
	if (f->capturing)
		return PBST_PASS_CAPTURING;
	switch (f->flags & (PBST_H2D | PBST_D2H)) {
	case PBST_H2D:
		return sides(&f->src, &f->dst, PBST_STAGE_H2D);
	case PBST_D2H:
		return sides(&f->dst, &f->src, PBST_STAGE_D2H);
	case 0:
		/* Unified addressing: whichever side is pageable host memory is the host side. */
		v = sides(&f->src, &f->dst, PBST_STAGE_H2D);
		if (v == PBST_STAGE_H2D || v == PBST_PASS_DEVICE_BOTH || v == PBST_PASS_NOT_PAGEABLE)
			return v;
		v = sides(&f->dst, &f->src, PBST_STAGE_D2H);
		return v == PBST_PASS_MISMATCH ? PBST_PASS_NOT_PAGEABLE : v;
	default:
		return PBST_PASS_MISMATCH;
	}
}

const char *pbst_verdict_name(enum pbst_verdict v)
{
	switch (v) {
	case PBST_STAGE_H2D:
		return "stage host to device";
	case PBST_STAGE_D2H:
		return "stage device to host";
	case PBST_PASS_DISABLED:
		return "staging off";
	case PBST_PASS_SMALL:
		return "under the threshold";
	case PBST_PASS_CAPTURING:
		return "stream being captured";
	case PBST_PASS_MANAGED:
		return "managed memory";
	case PBST_PASS_NOT_PAGEABLE:
		return "host memory pinned or registered";
	case PBST_PASS_NOT_DEVICE:
		return "no device memory";
	case PBST_PASS_DEVICE_BOTH:
		return "device to device";
	case PBST_PASS_MISMATCH:
		return "direction does not match the pointers";
	}
	return "?";
}

/*
 * The ramp: how many pieces of a copy come before its first whole slot, and the first one's size. Each doubles
 * the one before (slot/8, slot/4, slot/2), none under PBST_RAMP_MIN_BYTES.
 */
static unsigned ramp_steps(size_t slot_bytes, size_t *first)
{
	unsigned steps = PBST_RAMP_STEPS;

	while (steps > 0 && (slot_bytes >> steps) < PBST_RAMP_MIN_BYTES)
		steps--;
	*first = slot_bytes >> steps;
	return steps;
}

size_t pbst_piece_count(size_t bytes, size_t slot_bytes)
{
	size_t first, ramp_bytes, n = 0, off = 0;
	unsigned steps;

	if (slot_bytes == 0)
		return 0;
	steps = ramp_steps(slot_bytes, &first);
	ramp_bytes = first * (((size_t)1 << steps) - 1);
	if (bytes > ramp_bytes) {
		bytes -= ramp_bytes;
		return steps + bytes / slot_bytes + (bytes % slot_bytes != 0);
	}
	while (off < bytes)
		off += first << n++;
	return n;
}

struct pbst_piece pbst_piece_at(size_t bytes, size_t slot_bytes, unsigned nslots, unsigned first_slot, size_t k)
{
	struct pbst_piece p = { 0 };
	size_t first, size;
	unsigned steps;

	if (slot_bytes == 0 || nslots == 0)
		return p;
	steps = ramp_steps(slot_bytes, &first);
	if (k < steps) {
		p.off = first * (((size_t)1 << k) - 1);
		size = first << k;
	} else {
		p.off = first * (((size_t)1 << steps) - 1) + (k - steps) * slot_bytes;
		size = slot_bytes;
	}
	p.bytes = p.off >= bytes ? 0 : bytes - p.off < size ? bytes - p.off : size;
	p.slot = (unsigned)(((size_t)first_slot % nslots + k % nslots) % nslots);
	return p;
}

unsigned pbst_split_threads(size_t bytes, unsigned threads)
{
	size_t n = bytes / PBST_SPLIT_MIN_BYTES;

	if (threads == 0)
		threads = 1;
	if (n < 1)
		n = 1;
	return n < threads ? (unsigned)n : threads;
}

void pbst_split_part(size_t bytes, unsigned n, unsigned i, size_t *off, size_t *len)
{
	size_t part, start, end;

	if (n == 0)
		n = 1;
	part = bytes / n + (bytes % n != 0);
	part = (part + PBST_SPLIT_ALIGN_BYTES - 1) / PBST_SPLIT_ALIGN_BYTES * PBST_SPLIT_ALIGN_BYTES;
	start = (size_t)i * part;
	end = start + part;
	if (start > bytes)
		start = bytes;
	if (end > bytes || i + 1 == n)
		end = bytes;
	*off = start;
	*len = end - start;
}

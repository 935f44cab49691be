/* SPDX-License-Identifier: MIT */
/* Clients' staged-copy reports: checked, turned into rates and summed. Pure: no I/O. */
#include "staged.h"

#include <string.h>

/* The counters by name, in the order of struct staged_counters, for the checks that walk them all. */
#define STAGED_NCOUNTERS (sizeof(struct staged_counters) / sizeof(uint64_t))
static const char *const counter_names[STAGED_NCOUNTERS] = {
	"h2d_bytes",     "d2h_bytes",    "h2d_copies",   "d2h_copies",
	"driver_copies", "ring_revoked", "ring_refused", "busy_ns",
};

static uint64_t counter_at(const struct staged_counters *c, size_t i)
{
	uint64_t v[STAGED_NCOUNTERS];

	memcpy(v, c, sizeof(v));
	return v[i];
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

void staged_client_init(struct staged_client *sc, uint64_t since_ms)
{
	memset(sc, 0, sizeof(*sc));
	sc->since_ms = since_ms;
	sc->last_ms = since_ms;
}

enum staged_verdict staged_check(const struct staged_client *sc, const struct staged_counters *next, uint64_t now_ms,
				 const char **field)
{
	uint64_t elapsed_ms = now_ms > sc->last_ms ? now_ms - sc->last_ms : 0;
	uint64_t moved, allowed;

	if (field)
		*field = NULL;
	for (size_t i = 0; i < STAGED_NCOUNTERS; i++) {
		if (counter_at(next, i) < counter_at(&sc->last, i)) {
			if (field)
				*field = counter_names[i];
			return STAGED_BACKWARDS;
		}
		if (counter_at(next, i) > STAGED_COUNTER_MAX) {
			if (field)
				*field = counter_names[i];
			return STAGED_TOO_LARGE;
		}
	}
	if (next->h2d_copies > next->h2d_bytes || next->d2h_copies > next->d2h_bytes) {
		if (field)
			*field = next->h2d_copies > next->h2d_bytes ? "h2d_copies" : "d2h_copies";
		return STAGED_COPIES_OVER_BYTES;
	}
	/* Both ways at once share the host's memory: their sum is what the bound limits. Counters are below 2^56,
	 * elapsed_ms times 2^42 / 1000 wraps only after 2^32 s of silence, where the bound no longer matters. */
	moved = (next->h2d_bytes - sc->last.h2d_bytes) + (next->d2h_bytes - sc->last.d2h_bytes);
	allowed = elapsed_ms > (UINT64_MAX - STAGED_SLACK_BYTES) / (STAGED_MAX_BYTES_PER_S / 1000)
			  ? UINT64_MAX
			  : elapsed_ms * (STAGED_MAX_BYTES_PER_S / 1000) + STAGED_SLACK_BYTES;
	if (moved > allowed) {
		if (field)
			*field = "h2d_bytes + d2h_bytes";
		return STAGED_TOO_FAST;
	}
	return STAGED_OK;
}

void staged_apply(struct staged_client *sc, struct staged_totals *t, const struct staged_counters *next,
		  uint64_t now_ms)
{
	uint64_t sum[STAGED_NCOUNTERS];

	memcpy(sum, &t->sum, sizeof(sum));
	for (size_t i = 0; i < STAGED_NCOUNTERS; i++)
		sum[i] = add_sat(sum[i], counter_at(next, i) - counter_at(&sc->last, i));
	memcpy(&t->sum, sum, sizeof(sum));
	t->reports++;
	sc->last = *next;
	sc->last_ms = now_ms > sc->last_ms ? now_ms : sc->last_ms;
	sc->reports++;
	if (sc->nsamples == 0 ||
	    sc->samples[(sc->head + sc->nsamples - 1) % STAGED_SAMPLES].at_ms + STAGED_SAMPLE_MIN_MS <= sc->last_ms) {
		struct staged_sample *s;

		if (sc->nsamples == STAGED_SAMPLES) {
			sc->head = (sc->head + 1) % STAGED_SAMPLES;
			sc->nsamples--;
		}
		s = &sc->samples[(sc->head + sc->nsamples++) % STAGED_SAMPLES];
		s->at_ms = sc->last_ms;
		s->h2d_bytes = next->h2d_bytes;
		s->d2h_bytes = next->d2h_bytes;
	}
}

void staged_rate(const struct staged_client *sc, uint64_t now_ms, uint64_t *h2d_bytes_per_s, uint64_t *d2h_bytes_per_s)
{
	uint64_t start = now_ms > STAGED_RATE_WINDOW_MS ? now_ms - STAGED_RATE_WINDOW_MS : 0;
	struct staged_sample base = { .at_ms = sc->since_ms };
	uint64_t span_ms;

	*h2d_bytes_per_s = *d2h_bytes_per_s = 0;
	if (sc->reports == 0 || sc->last_ms < start || sc->last_ms > now_ms)
		return;
	/* The counters at the window's start: the newest sample at or before it, or the connection's zeros. */
	for (size_t i = 0; i < sc->nsamples; i++) {
		const struct staged_sample *s = &sc->samples[(sc->head + i) % STAGED_SAMPLES];

		if (s->at_ms > start)
			break;
		base = *s;
	}
	/*
	 * Reports come every STAGED_SAMPLE_MIN_MS or so while copying: a base that old or younger is where the
	 * counters stood, and the span runs from it. An older one means a silence before the window: the bytes since
	 * were copied within the window, so they are spread over the window's part up to the last report.
	 */
	span_ms = sc->last_ms - base.at_ms;
	if (base.at_ms + 2 * STAGED_SAMPLE_MIN_MS < start)
		span_ms = sc->last_ms - start;
	if (span_ms == 0)
		return;
	*h2d_bytes_per_s = (sc->last.h2d_bytes - base.h2d_bytes) / span_ms * 1000 +
			   (sc->last.h2d_bytes - base.h2d_bytes) % span_ms * 1000 / span_ms;
	*d2h_bytes_per_s = (sc->last.d2h_bytes - base.d2h_bytes) / span_ms * 1000 +
			   (sc->last.d2h_bytes - base.d2h_bytes) % span_ms * 1000 / span_ms;
}

const char *staged_verdict_text(enum staged_verdict v)
{
	switch (v) {
	case STAGED_OK:
		return "accepted";
	case STAGED_BACKWARDS:
		return "a counter went back below the connection's last report (the counters are cumulative)";
	case STAGED_TOO_LARGE:
		return "a counter is past 2^56";
	case STAGED_TOO_FAST:
		return "more bytes than a host can copy in the time since the last report";
	case STAGED_COPIES_OVER_BYTES:
		return "more staged copies than staged bytes";
	}
	return "unknown";
}

/* SPDX-License-Identifier: MIT */
/*
 * Clients' staged-copy reports (ReportStaging): the checks on each, the rate from their deltas, the totals. Pure: no
 * I/O.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a client's library counted of its staged copies, cumulative since it connected (pb_staging_stats). */
struct staged_counters {
	uint64_t h2d_bytes, d2h_bytes;
	uint64_t h2d_copies, d2h_copies;
	uint64_t driver_copies; /* pageable copies over the threshold that went to the driver instead */
	uint64_t ring_revoked, ring_refused;
	uint64_t busy_ns;
};

/*
 * The rate is taken over this window of reports. The library reports at most every 250 ms while it copies
 * (and once when it lets its ring go), so a window of 5 s holds about 20 reports.
 */
#define STAGED_RATE_WINDOW_MS 5000
/* A sample is kept at most this often, so a client reporting fast cannot push the window out of the ring. */
#define STAGED_SAMPLE_MIN_MS 250
/* Samples kept: 32 of at least 250 ms each cover more than the window. */
#define STAGED_SAMPLES 32
/*
 * No host copies between memory and a GPU faster than this (an H200's HBM reads at 4.8 TB/s; PCIe 5 x16 and
 * host memory are far slower): a report that moved more bytes than this in the time since the last is refused.
 */
#define STAGED_MAX_BYTES_PER_S (1ull << 42)
/* Slack for the clocks of client and daemon: a report may hold this many bytes over the rate bound. */
#define STAGED_SLACK_BYTES (1ull << 36)
/* No counter of one connection goes past this (64 PiB of copies): the host-wide sums cannot wrap. */
#define STAGED_COUNTER_MAX (1ull << 56)

/* One connection's reports. All zero, with since_ms set to its connect time, is a connection that has not reported. */
struct staged_client {
	struct staged_counters last; /* the last accepted report */
	uint64_t last_ms;            /* when it came (monotonic); since_ms before the first */
	uint64_t since_ms;           /* the connection's start: the counters were 0 then */
	uint64_t reports;            /* accepted reports */
	bool warned;                 /* a refused report of its was logged: once per connection */
	struct staged_sample {
		uint64_t at_ms;
		uint64_t h2d_bytes, d2h_bytes;
	} samples[STAGED_SAMPLES]; /* a ring, oldest at head */
	size_t head, nsamples;
};

/* The daemon's totals since start: the sum of every accepted report's step, of live connections and closed ones. */
struct staged_totals {
	struct staged_counters sum;
	uint64_t reports;
};

/* Why a report is refused. */
enum staged_verdict {
	STAGED_OK,
	STAGED_BACKWARDS,         /* a counter is below the connection's last report: the counters only grow */
	STAGED_TOO_LARGE,         /* a counter past STAGED_COUNTER_MAX */
	STAGED_TOO_FAST,          /* more bytes than the host could copy in the time since the last report */
	STAGED_COPIES_OVER_BYTES, /* more staged copies than bytes: each staged copy moves at least a byte */
};

/* A connection's record from its connect time (monotonic ms). */
void staged_client_init(struct staged_client *sc, uint64_t since_ms);

/* May sc take report next at now_ms? STAGED_OK or why not; *field (optional) names the counter at fault. */
enum staged_verdict staged_check(const struct staged_client *sc, const struct staged_counters *next, uint64_t now_ms,
				 const char **field);

/*
 * Take an accepted report (staged_check said STAGED_OK): its step from the last is added to *t, it becomes the
 * last, and a rate sample is kept if the last one is STAGED_SAMPLE_MIN_MS old.
 */
void staged_apply(struct staged_client *sc, struct staged_totals *t, const struct staged_counters *next,
		  uint64_t now_ms);

/*
 * Bytes per second each way over the last STAGED_RATE_WINDOW_MS of reports, at now_ms: the step from the counters
 * as they stood at the window's start (the last sample at or before it, or 0 at connect) to the last report, over
 * the time between them, at most the window. 0 when nothing was reported within the window.
 */
void staged_rate(const struct staged_client *sc, uint64_t now_ms, uint64_t *h2d_bytes_per_s, uint64_t *d2h_bytes_per_s);

/* A sentence for a verdict ("the counters went back", ...), for the refusal's message. */
const char *staged_verdict_text(enum staged_verdict v);

/* SPDX-License-Identifier: MIT */
/* The pressure monitor's I/O: samples /proc and the cgroup, arms PSI triggers, feeds the policy. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pressure.h"

struct ev_loop;
struct config;
struct monitor;

/* The signals monitor_signals reports. */
#define MONITOR_SIGNALS_MAX 8
/* The transitions kept for monitor_transitions. */
#define MONITOR_EVENTS_MAX 16

/* Called from the loop on every state change, after it is logged. why names the figures. */
typedef void (*monitor_state_fn)(void *ud, enum broker_state from, enum broker_state to, const char *why);

struct monitor_signal {
	const char *name; /* "mem_available_pct", "psi_some_avg10", ... static storage */
	double value;
	double tight; /* NAN when the signal has no threshold for that state */
	double critical;
	const char *unit; /* "%", "pages/s", "bytes" */
	bool available;   /* false when this kernel/cgroup has no such file */
};

struct monitor_event {
	uint64_t when_ms; /* monotonic */
	char text[160];
};

/* What the daemon may lend against, read once at start before the monitor runs. */
struct monitor_host {
	uint64_t mem_total_bytes;
	uint64_t mem_available_bytes;
	uint64_t cgroup_limit_bytes; /* the tightest limit of the memory cgroup and its ancestors; 0 = none */
	uint64_t cgroup_usage_bytes; /* usage of the cgroup that set that limit */
};

/*
 * Read <proc_root>/proc/meminfo and the daemon's memory cgroup (v1 or v2;
 * NULL or "" means "/") once, with the monitor's readers; pressure.c parses.
 * Returns 0, or a negative errno (-EBADMSG for a malformed meminfo). A
 * missing or unreadable cgroup is not an error: the limit is then 0.
 */
int monitor_read_host(const char *proc_root, struct monitor_host *ret);

/*
 * Start sampling under cfg (proc-root, thresholds, poll-interval-ms, psi-*).
 * Arms PSI triggers when the kernel has them (sub-2 s windows need
 * CAP_SYS_RESOURCE; falls back to 2 s multiples, then to polling, saying so).
 * Returns 0 and *ret, or a negative errno when even /proc/meminfo is unreadable
 * or malformed (logged). The first evaluation runs from the loop at once, so
 * fn also hears of a host that is already tight or critical at start.
 */
int monitor_new(struct ev_loop *loop, const struct config *cfg, monitor_state_fn fn, void *ud, struct monitor **ret);
void monitor_free(struct monitor *m);

/* Apply reloaded thresholds and intervals. Returns 0 or a negative errno. */
int monitor_reconfigure(struct monitor *m, const struct config *cfg);

/* Sample now, re-reading the cgroup limits too, and run the policy (main.c calls it on SIGUSR1). */
void monitor_sample_now(struct monitor *m);

/* The policy's state (pressure.c holds it; the monitor keeps no copy). */
enum broker_state monitor_state(const struct monitor *m);
/* MemAvailable as a share of MemTotal (or of a lower cgroup limit) at the last sample; NAN before the first. */
double monitor_mem_available_pct(const struct monitor *m);
/* The host's free hugetlb memory (HugePages_Free x Hugepagesize) at the last sample; 0 before one. */
uint64_t monitor_huge_pages_free_bytes(const struct monitor *m);
const char *monitor_state_name(enum broker_state s);
/* "psi-trigger", "psi-trigger-2s", "poll (no PSI)", ... */
const char *monitor_mode(const struct monitor *m);

/* Copy up to max current signals into out. Returns how many there are. */
size_t monitor_signals(const struct monitor *m, struct monitor_signal *out, size_t max);
/*
 * The host's pswpin and pswpout counters (/proc/vmstat, pages) at the last reading: false before one, or
 * while the host never had swap (vmstat is not read then).
 */
bool monitor_swap_pages(const struct monitor *m, uint64_t *in_pages, uint64_t *out_pages);
/* The last transitions, newest first. Returns how many were copied. */
size_t monitor_transitions(const struct monitor *m, struct monitor_event *out, size_t max);

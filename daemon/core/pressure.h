/* SPDX-License-Identifier: MIT */
/* Memory-pressure parsing and policy: pure functions over buffers and plain values, no I/O. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Pressure states, ordered by severity: pressure.c's policy holds the state, struct broker what it acts on. */
enum broker_state {
	BROKER_NORMAL,
	BROKER_TIGHT,    /* refuse beyond the free warm pool; shrink the idle pool */
	BROKER_CRITICAL, /* revoke until out */
};

/* A cgroup limit of "max" (v2) or a v1 limit at or above PRESSURE_V1_UNLIMITED_BYTES. */
#define PRESSURE_UNLIMITED UINT64_MAX
/*
 * cgroup v1 reports "no limit" as PAGE_COUNTER_MAX pages in bytes, which is
 * 2^63 rounded down to the page size (9223372036854771712 with 4 KiB pages)
 * and differs per page size; anything this large is no limit in practice.
 */
#define PRESSURE_V1_UNLIMITED_BYTES (UINT64_C(1) << 62)

/* Longest cgroup path kept from /proc/self/cgroup. */
#define PRESSURE_CGROUP_PATH_MAX 1024

/* Bits of struct meminfo.have, one per field found. */
enum {
	MEMINFO_MEM_TOTAL = 1u << 0,
	MEMINFO_MEM_AVAILABLE = 1u << 1,
	MEMINFO_SWAP_TOTAL = 1u << 2,
	MEMINFO_SWAP_FREE = 1u << 3,
	MEMINFO_SHMEM = 1u << 4,
	MEMINFO_MLOCKED = 1u << 5,
	MEMINFO_UNEVICTABLE = 1u << 6,
	MEMINFO_HUGEPAGES_TOTAL = 1u << 7,
	MEMINFO_HUGEPAGES_FREE = 1u << 8,
	MEMINFO_HUGEPAGE_SIZE = 1u << 9,
};

/* /proc/meminfo in bytes; fields the file lacks stay 0 with their bit clear in have. */
struct meminfo {
	uint64_t mem_total_bytes;
	uint64_t mem_available_bytes;
	uint64_t swap_total_bytes;
	uint64_t swap_free_bytes;
	uint64_t shmem_bytes;
	uint64_t mlocked_bytes;
	uint64_t unevictable_bytes;
	uint64_t hugepage_size_bytes;   /* Hugepagesize */
	uint64_t hugepages_total_bytes; /* HugePages_Total x Hugepagesize (0 if either is missing) */
	uint64_t hugepages_free_bytes;  /* HugePages_Free x Hugepagesize */
	unsigned have;                  /* MEMINFO_* */
};

/* Cumulative counters from /proc/vmstat (pages since boot). */
struct vmstat {
	uint64_t pswpin;
	uint64_t pswpout;
};

/* One line of a PSI file: percentages of wall time stalled, and the total stall time. */
struct psi_line {
	double avg10;
	double avg60;
	double avg300;
	uint64_t total_us;
	bool present;
};

struct psi {
	struct psi_line some;
	struct psi_line full; /* present = false for files with only "some" (cpu, older kernels) */
};

/* The memory cgroup as /proc/self/cgroup names it. */
struct cgroup_paths {
	char v1_memory[PRESSURE_CGROUP_PATH_MAX]; /* "N:...memory...:/path"; "" if none */
	char v2[PRESSURE_CGROUP_PATH_MAX];        /* "0::/path"; "" if none */
	bool has_v1_memory;
	bool has_v2;
};

/*
 * Parse /proc/meminfo from exactly len bytes of buf (no NUL needed). Values
 * with a "kB" suffix are scaled to bytes; HugePages_Total/Free are scaled by
 * Hugepagesize. A final line without its newline is ignored: a short read can
 * cut a number, and "MemAvailable: 12" read from "MemAvailable: 1234567" would
 * fake a critical state. Returns 0, or -EBADMSG when MemTotal or MemAvailable
 * is missing, malformed, 0 (MemTotal) or overflows in bytes. Never reads past len.
 */
int pressure_parse_meminfo(const char *buf, size_t len, struct meminfo *ret);

/*
 * Parse /proc/vmstat ("name value" lines). Returns 0, or -EBADMSG when
 * pswpin or pswpout is missing or malformed (kernels built without swap).
 */
int pressure_parse_vmstat(const char *buf, size_t len, struct vmstat *ret);

/*
 * Find one "key value" line in a flat-keyed file (vmstat, cgroup memory.stat).
 * Returns 0 and *ret, -ENOENT when absent, -EBADMSG when the value is malformed.
 */
int pressure_parse_keyed_u64(const char *buf, size_t len, const char *key, uint64_t *ret);

/*
 * Parse a PSI file (/proc/pressure/memory, cgroup v2 memory.pressure):
 * "some avg10=0.00 avg60=0.00 avg300=0.00 total=0" and optionally "full ...".
 * Returns 0, or -EBADMSG when "some" is missing or any present line is malformed.
 */
int pressure_parse_psi(const char *buf, size_t len, struct psi *ret);

/*
 * cgroup v2 memory.max: "max\n" or a byte count. Sets *ret to the limit or
 * PRESSURE_UNLIMITED. Returns 0 or -EBADMSG.
 */
int pressure_parse_cgroup_v2_max(const char *buf, size_t len, uint64_t *ret);

/*
 * cgroup v1 memory.limit_in_bytes. Values >= PRESSURE_V1_UNLIMITED_BYTES become
 * PRESSURE_UNLIMITED. Returns 0 or -EBADMSG.
 */
int pressure_parse_cgroup_v1_limit(const char *buf, size_t len, uint64_t *ret);

/*
 * A file holding one unsigned decimal (v2 memory.current, v1
 * memory.usage_in_bytes), optionally newline-terminated. Returns 0 or -EBADMSG.
 */
int pressure_parse_u64_file(const char *buf, size_t len, uint64_t *ret);

/*
 * Parse /proc/self/cgroup: v1 lines "N:controllers:/path" (the one whose
 * comma-separated controllers include "memory") and the v2 line "0::/path".
 * Paths must be absolute and have no ".." component (they are joined below
 * the proc root). Returns 0 when at least one was found, -EBADMSG when none
 * was or a path is malformed, -ENAMETOOLONG for a path over
 * PRESSURE_CGROUP_PATH_MAX - 1 bytes.
 */
int pressure_parse_self_cgroup(const char *buf, size_t len, struct cgroup_paths *ret);

/*
 * Counter rate in units per second from two samples dt_ms apart. A counter
 * that went backwards (wrapped or reset) or dt_ms == 0 gives 0.
 */
double pressure_rate_per_s(uint64_t prev, uint64_t cur, uint64_t dt_ms);

/* One round of signals, as the monitor read them. */
struct pressure_sample {
	struct meminfo mem; /* required */

	bool have_swapout;      /* false on the first sample and without vmstat */
	double swapout_pages_s; /* pswpout rate */
	double swapin_pages_s;  /* pswpin rate (shown, not a threshold) */

	bool have_psi;  /* false on kernels without PSI */
	struct psi psi; /* memory PSI; the monitor takes the worse of host and cgroup */

	bool have_cgroup_limit; /* a finite cgroup limit was found */
	uint64_t cgroup_limit_bytes;
	uint64_t cgroup_usage_bytes;
	uint64_t cgroup_reclaimable_bytes; /* inactive file pages in the cgroup (0 if unknown) */
};

/* The figures the policy compares; NAN where a signal is not applicable. */
struct pressure_figures {
	double mem_available_pct; /* of MemTotal, or of the cgroup limit when that is lower */
	uint64_t mem_available_bytes;
	uint64_t mem_base_bytes; /* MemTotal, or the cgroup limit when lower */
	bool cgroup_dominates;   /* mem_base_bytes is the cgroup limit */
	double cgroup_usage_pct; /* usage / limit; NAN without a cgroup limit */
	double swap_free_pct;    /* NAN when SwapTotal is 0 */
	double swapout_pages_s;  /* NAN before the second vmstat sample */
	double swapin_pages_s;
	double psi_some_avg10; /* NAN without PSI */
	double psi_full_avg10; /* NAN without PSI or without a "full" line */
};

/*
 * Thresholds: a state is entered when any of its conditions holds. A NAN
 * threshold never matches, which disables that condition.
 */
struct pressure_thresholds {
	double tight_mem_available_pct;    /* tight when below */
	double critical_mem_available_pct; /* critical when below */
	double tight_psi_some_avg10;       /* tight when above */
	double critical_psi_full_avg10;    /* critical when above */
	double tight_swapout_pages_s;      /* tight when above */
	double critical_swapout_pages_s;   /* critical when above */
	double tight_swap_free_pct;        /* tight when below; ignored when SwapTotal is 0 */
	uint32_t hysteresis_ms;            /* continuous calm needed before stepping down */
};

struct pressure;

/* Reduce a sample to the figures the policy compares. */
void pressure_figures(const struct pressure_sample *s, struct pressure_figures *ret);

/* The level the figures call for right now, before hysteresis. */
enum broker_state pressure_level(const struct pressure_thresholds *t, const struct pressure_figures *f);

/* A policy starting in BROKER_NORMAL. Returns 0 and *ret, or -ENOMEM / -EINVAL (t NULL). */
int pressure_new(const struct pressure_thresholds *t, struct pressure **ret);
void pressure_free(struct pressure *p);

/* Replace the thresholds; the state and the hysteresis clocks are kept. */
void pressure_set_thresholds(struct pressure *p, const struct pressure_thresholds *t);
const struct pressure_thresholds *pressure_get_thresholds(const struct pressure *p);

/*
 * Feed one sample taken at now_ms (monotonic) and return the state it leaves
 * the policy in. Going up is immediate. Going down needs the level to stay
 * below the current state for hysteresis_ms without a break: critical steps
 * to tight after hysteresis_ms below the critical thresholds, or straight to
 * normal after hysteresis_ms below the tight ones. why (may be NULL) always
 * gets the figures, led by the ones that cross a threshold, e.g.
 * "MemAvailable 4.1% < 5% critical threshold; PSI full avg10 0.00".
 */
enum broker_state pressure_evaluate(struct pressure *p, const struct pressure_sample *s, uint64_t now_ms, char *why,
				    size_t why_len);

enum broker_state pressure_state(const struct pressure *p);

/* "normal", "tight", "critical" (or "unknown"). */
const char *pressure_state_name(enum broker_state s);

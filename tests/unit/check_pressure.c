/* SPDX-License-Identifier: MIT */
/* Unit tests for pressure: the /proc and cgroup parsers on every fixture and on hostile buffers, and the policy's transitions and hysteresis. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pressure.h"
#include "check_main.h"
#include "fixture.h"

#define KIB 1024ull
#define MIB (1024ull * KIB)
#define GIB (1024ull * MIB)

/* Read a fixture into a buffer of exactly its size, with no NUL after it, so ASan catches over-reads. */
/*
 * Fixed thresholds these tests were written against: the config table's
 * defaults (config.c, where the daemon takes its thresholds from), except a
 * hysteresis of 10 s where the table has 5 s.
 */
static void reference_thresholds(struct pressure_thresholds *ret)
{
	*ret = (struct pressure_thresholds){
		.tight_mem_available_pct = 10,
		.critical_mem_available_pct = 5,
		.tight_psi_some_avg10 = 10,
		.critical_psi_full_avg10 = 5,
		.tight_swapout_pages_s = 1000,
		.critical_swapout_pages_s = 10000,
		.tight_swap_free_pct = 20,
		.hysteresis_ms = 10000,
	};
}

/* A fixture of tests/fixtures/proc/, exactly its size (fixture.h). */
static char *slurp(const char *rel, size_t *len)
{
	return fixture_read("proc", rel, len);
}

/* A copy of a string without its NUL. */
static char *exact(const char *s, size_t *len)
{
	size_t n = strlen(s);
	char *b = malloc(n ? n : 1);

	ck_assert_ptr_nonnull(b);
	memcpy(b, s, n);
	*len = n;
	return b;
}

static int meminfo_str(const char *s, struct meminfo *m)
{
	size_t len;
	char *b = exact(s, &len);
	int r = pressure_parse_meminfo(b, len, m);

	free(b);
	return r;
}

static int psi_str(const char *s, struct psi *p)
{
	size_t len;
	char *b = exact(s, &len);
	int r = pressure_parse_psi(b, len, p);

	free(b);
	return r;
}

static int cgroup_str(const char *s, struct cgroup_paths *c)
{
	size_t len;
	char *b = exact(s, &len);
	int r = pressure_parse_self_cgroup(b, len, c);

	free(b);
	return r;
}

static int u64_str(int (*fn)(const char *, size_t, uint64_t *), const char *s, uint64_t *v)
{
	size_t len;
	char *b = exact(s, &len);
	int r = fn(b, len, v);

	free(b);
	return r;
}

static int fixture_meminfo(const char *scenario, struct meminfo *m)
{
	char rel[512];
	size_t len;
	char *b;
	int r;

	snprintf(rel, sizeof(rel), "%s/proc/meminfo", scenario);
	b = slurp(rel, &len);
	r = pressure_parse_meminfo(b, len, m);
	free(b);
	return r;
}

static int fixture_psi(const char *scenario, const char *file, struct psi *p)
{
	char rel[512];
	size_t len;
	char *b;
	int r;

	snprintf(rel, sizeof(rel), "%s/%s", scenario, file);
	b = slurp(rel, &len);
	r = pressure_parse_psi(b, len, p);
	free(b);
	return r;
}

static int fixture_u64(const char *scenario, const char *file, int (*fn)(const char *, size_t, uint64_t *), uint64_t *v)
{
	char rel[512];
	size_t len;
	char *b;
	int r;

	snprintf(rel, sizeof(rel), "%s/%s", scenario, file);
	b = slurp(rel, &len);
	r = fn(b, len, v);
	free(b);
	return r;
}

static int fixture_keyed(const char *scenario, const char *file, const char *key, uint64_t *v)
{
	char rel[512];
	size_t len;
	char *b;
	int r;

	snprintf(rel, sizeof(rel), "%s/%s", scenario, file);
	b = slurp(rel, &len);
	r = pressure_parse_keyed_u64(b, len, key, v);
	free(b);
	return r;
}

static int fixture_vmstat(const char *scenario, const char *file, struct vmstat *v)
{
	char rel[512];
	size_t len;
	char *b;
	int r;

	snprintf(rel, sizeof(rel), "%s/%s", scenario, file);
	b = slurp(rel, &len);
	r = pressure_parse_vmstat(b, len, v);
	free(b);
	return r;
}

static int fixture_cgroup(const char *scenario, struct cgroup_paths *c)
{
	char rel[512];
	size_t len;
	char *b;
	int r;

	snprintf(rel, sizeof(rel), "%s/proc/self/cgroup", scenario);
	b = slurp(rel, &len);
	r = pressure_parse_self_cgroup(b, len, c);
	free(b);
	return r;
}

static bool fixture_exists(const char *rel)
{
	char path[1024];

	snprintf(path, sizeof(path), "%s/proc/%s", FIXTURES_DIR, rel);
	return access(path, F_OK) == 0;
}

/* A sample built from a fixture the way the monitor builds one (no vmstat rate). */
static void fixture_sample(const char *scenario, struct pressure_sample *s)
{
	char rel[512];

	memset(s, 0, sizeof(*s));
	ck_assert_int_eq(fixture_meminfo(scenario, &s->mem), 0);
	snprintf(rel, sizeof(rel), "%s/proc/pressure/memory", scenario);
	if (fixture_exists(rel))
		s->have_psi = fixture_psi(scenario, "proc/pressure/memory", &s->psi) == 0;
}

/* --- parsers on fixtures --- */

START_TEST(test_idle_meminfo_gives_bytes)
{
	struct meminfo m;

	ck_assert_int_eq(fixture_meminfo("idle", &m), 0);
	ck_assert_uint_eq(m.mem_total_bytes, 24683548 * KIB);
	ck_assert_uint_eq(m.mem_available_bytes, 24349520 * KIB);
	ck_assert_uint_eq(m.swap_total_bytes, 0);
	ck_assert_uint_eq(m.swap_free_bytes, 0);
	ck_assert_uint_eq(m.shmem_bytes, 9356 * KIB);
	ck_assert_uint_eq(m.mlocked_bytes, 12436 * KIB);
	ck_assert_uint_eq(m.unevictable_bytes, 13648 * KIB);
	ck_assert_uint_eq(m.hugepage_size_bytes, 2 * MIB);
	ck_assert_uint_eq(m.hugepages_total_bytes, 0);
	ck_assert(m.have & MEMINFO_HUGEPAGES_TOTAL);
	ck_assert(m.have & MEMINFO_HUGEPAGES_FREE);
	ck_assert(m.have & MEMINFO_SWAP_TOTAL);
}
END_TEST

START_TEST(test_idle_vmstat_psi_and_cgroup_parse)
{
	struct vmstat v;
	struct psi p;
	struct cgroup_paths c;
	uint64_t limit, usage, inactive;

	ck_assert_int_eq(fixture_vmstat("idle", "proc/vmstat", &v), 0);
	ck_assert_uint_eq(v.pswpin, 0);
	ck_assert_uint_eq(v.pswpout, 0);
	ck_assert_int_eq(fixture_psi("idle", "proc/pressure/memory", &p), 0);
	ck_assert(p.some.present && p.full.present);
	ck_assert_double_eq(p.some.avg10, 0.0);
	ck_assert_int_eq(fixture_cgroup("idle", &c), 0);
	ck_assert(c.has_v1_memory);
	ck_assert_str_eq(c.v1_memory, "/process_api/5aa2235a371b0280ae36cb7247ebc871");
	ck_assert(c.has_v2);
	ck_assert_str_eq(c.v2, "/");
	/* The capture host's v1 "no limit" is PAGE_COUNTER_MAX in bytes. */
	ck_assert_int_eq(
		fixture_u64("idle",
			    "sys/fs/cgroup/memory/process_api/5aa2235a371b0280ae36cb7247ebc871/memory.limit_in_bytes",
			    pressure_parse_cgroup_v1_limit, &limit),
		0);
	ck_assert_uint_eq(limit, PRESSURE_UNLIMITED);
	ck_assert_int_eq(
		fixture_u64("idle",
			    "sys/fs/cgroup/memory/process_api/5aa2235a371b0280ae36cb7247ebc871/memory.usage_in_bytes",
			    pressure_parse_u64_file, &usage),
		0);
	ck_assert_uint_gt(usage, 0);
	ck_assert_int_eq(fixture_keyed("idle",
				       "sys/fs/cgroup/memory/process_api/5aa2235a371b0280ae36cb7247ebc871/memory.stat",
				       "total_inactive_file", &inactive),
			 0);
}
END_TEST

START_TEST(test_idle_fixture_is_normal)
{
	struct pressure_thresholds t;
	struct pressure *p;
	struct pressure_sample s;
	char why[256];

	reference_thresholds(&t);
	ck_assert_int_eq(pressure_new(&t, &p), 0);
	fixture_sample("idle", &s);
	ck_assert_int_eq(pressure_evaluate(p, &s, 1000, why, sizeof(why)), BROKER_NORMAL);
	ck_assert_ptr_nonnull(strstr(why, "MemAvailable 98.6%"));
	pressure_free(p);
}
END_TEST

START_TEST(test_swapping_fixture_is_tight_with_swapout_rate)
{
	struct pressure_thresholds t;
	struct pressure *p;
	struct pressure_sample s;
	struct pressure_figures f;
	struct vmstat a, b;
	char why[512];

	fixture_sample("swapping", &s);
	ck_assert_int_eq(fixture_vmstat("swapping", "proc/vmstat", &a), 0);
	ck_assert_int_eq(fixture_vmstat("swapping", "vmstat.after-1s", &b), 0);
	s.have_swapout = true;
	s.swapout_pages_s = pressure_rate_per_s(a.pswpout, b.pswpout, 1000);
	s.swapin_pages_s = pressure_rate_per_s(a.pswpin, b.pswpin, 1000);
	ck_assert_double_eq_tol(s.swapout_pages_s, 1800, 1e-9);
	ck_assert_double_eq_tol(s.swapin_pages_s, 400, 1e-9);

	pressure_figures(&s, &f);
	ck_assert_double_eq_tol(f.swap_free_pct, 12.0, 0.01);
	ck_assert_double_eq_tol(f.mem_available_pct, 12.0, 0.01);

	reference_thresholds(&t);
	ck_assert_int_eq(pressure_new(&t, &p), 0);
	ck_assert_int_eq(pressure_evaluate(p, &s, 1000, why, sizeof(why)), BROKER_TIGHT);
	ck_assert_ptr_nonnull(strstr(why, "swap-out 1800 pages/s > 1000/s tight threshold"));
	ck_assert_ptr_nonnull(strstr(why, "SwapFree 12.0% < 20% tight threshold"));
	ck_assert_ptr_nonnull(strstr(why, "PSI some avg10 18.50 > 10 tight threshold"));
	pressure_free(p);
}
END_TEST

START_TEST(test_near_oom_fixture_is_critical)
{
	struct pressure_thresholds t;
	struct pressure *p;
	struct pressure_sample s;
	char why[512];

	fixture_sample("near-oom", &s);
	ck_assert(s.have_psi);
	ck_assert_double_eq_tol(s.psi.full.avg10, 35.7, 1e-9);
	reference_thresholds(&t);
	ck_assert_int_eq(pressure_new(&t, &p), 0);
	ck_assert_int_eq(pressure_evaluate(p, &s, 1000, why, sizeof(why)), BROKER_CRITICAL);
	ck_assert_ptr_nonnull(strstr(why, "MemAvailable 3.0% < 5% critical threshold"));
	ck_assert_ptr_nonnull(strstr(why, "PSI full avg10 35.70 > 5 critical threshold"));
	pressure_free(p);
}
END_TEST

START_TEST(test_no_psi_fixture_polls_meminfo_only)
{
	struct pressure_thresholds t;
	struct pressure *p;
	struct pressure_sample s;
	struct pressure_figures f;
	struct cgroup_paths c;

	ck_assert(!fixture_exists("no-psi/proc/pressure/memory"));
	fixture_sample("no-psi", &s);
	ck_assert(!s.have_psi);
	pressure_figures(&s, &f);
	ck_assert(isnan(f.psi_some_avg10));
	ck_assert(isnan(f.psi_full_avg10));
	ck_assert_int_eq(fixture_cgroup("no-psi", &c), 0);
	ck_assert(!c.has_v1_memory);
	ck_assert_str_eq(c.v2, "/");
	reference_thresholds(&t);
	ck_assert_int_eq(pressure_new(&t, &p), 0);
	ck_assert_int_eq(pressure_evaluate(p, &s, 1, NULL, 0), BROKER_NORMAL);
	/* MemAvailable alone still drives it. */
	s.mem.mem_available_bytes = s.mem.mem_total_bytes / 25;
	ck_assert_int_eq(pressure_evaluate(p, &s, 2, NULL, 0), BROKER_CRITICAL);
	pressure_free(p);
}
END_TEST

START_TEST(test_cgroup_v1_fixture_limit_makes_it_critical)
{
	const char *dir = "sys/fs/cgroup/memory/pinbroker/job";
	struct pressure_thresholds t;
	struct pressure *p;
	struct pressure_sample s;
	struct pressure_figures f;
	struct cgroup_paths c;
	char file[200], why[512];
	uint64_t parent;

	fixture_sample("cgroup-v1", &s);
	ck_assert_int_eq(fixture_cgroup("cgroup-v1", &c), 0);
	ck_assert(c.has_v1_memory);
	ck_assert_str_eq(c.v1_memory, "/pinbroker/job");
	snprintf(file, sizeof(file), "%s/memory.limit_in_bytes", dir);
	ck_assert_int_eq(fixture_u64("cgroup-v1", file, pressure_parse_cgroup_v1_limit, &s.cgroup_limit_bytes), 0);
	ck_assert_uint_eq(s.cgroup_limit_bytes, 8 * GIB);
	snprintf(file, sizeof(file), "%s/memory.usage_in_bytes", dir);
	ck_assert_int_eq(fixture_u64("cgroup-v1", file, pressure_parse_u64_file, &s.cgroup_usage_bytes), 0);
	snprintf(file, sizeof(file), "%s/memory.stat", dir);
	ck_assert_int_eq(fixture_keyed("cgroup-v1", file, "total_inactive_file", &s.cgroup_reclaimable_bytes), 0);
	ck_assert_int_eq(fixture_u64("cgroup-v1", "sys/fs/cgroup/memory/pinbroker/memory.limit_in_bytes",
				     pressure_parse_cgroup_v1_limit, &parent),
			 0);
	ck_assert_uint_eq(parent, PRESSURE_UNLIMITED);
	s.have_cgroup_limit = true;

	pressure_figures(&s, &f);
	ck_assert(f.cgroup_dominates);
	ck_assert_uint_eq(f.mem_base_bytes, 8 * GIB);
	ck_assert_double_eq_tol(f.mem_available_pct, 3.75, 0.01);
	ck_assert_double_eq_tol(f.cgroup_usage_pct, 96.875, 0.001);

	reference_thresholds(&t);
	ck_assert_int_eq(pressure_new(&t, &p), 0);
	ck_assert_int_eq(pressure_evaluate(p, &s, 1, why, sizeof(why)), BROKER_CRITICAL);
	ck_assert_ptr_nonnull(strstr(why, "of cgroup limit 8"));
	pressure_free(p);
}
END_TEST

START_TEST(test_cgroup_v2_fixture_limit_makes_it_tight)
{
	const char *dir = "sys/fs/cgroup/system.slice/pinbrokerd.service";
	struct pressure_thresholds t;
	struct pressure *p;
	struct pressure_sample s;
	struct pressure_figures f;
	struct cgroup_paths c;
	struct psi cg_psi;
	char file[200];
	uint64_t slice;

	fixture_sample("cgroup-v2", &s);
	ck_assert_int_eq(fixture_cgroup("cgroup-v2", &c), 0);
	ck_assert(!c.has_v1_memory);
	ck_assert_str_eq(c.v2, "/system.slice/pinbrokerd.service");
	snprintf(file, sizeof(file), "%s/memory.max", dir);
	ck_assert_int_eq(fixture_u64("cgroup-v2", file, pressure_parse_cgroup_v2_max, &s.cgroup_limit_bytes), 0);
	ck_assert_uint_eq(s.cgroup_limit_bytes, 4 * GIB);
	snprintf(file, sizeof(file), "%s/memory.current", dir);
	ck_assert_int_eq(fixture_u64("cgroup-v2", file, pressure_parse_u64_file, &s.cgroup_usage_bytes), 0);
	snprintf(file, sizeof(file), "%s/memory.stat", dir);
	ck_assert_int_eq(fixture_keyed("cgroup-v2", file, "inactive_file", &s.cgroup_reclaimable_bytes), 0);
	snprintf(file, sizeof(file), "%s/memory.pressure", dir);
	ck_assert_int_eq(fixture_psi("cgroup-v2", file, &cg_psi), 0);
	ck_assert_double_eq_tol(cg_psi.some.avg10, 2.0, 1e-9);
	ck_assert_double_eq_tol(cg_psi.full.avg300, 0.05, 1e-9);
	ck_assert_uint_eq(cg_psi.full.total_us, 345678);
	ck_assert_int_eq(
		fixture_u64("cgroup-v2", "sys/fs/cgroup/system.slice/memory.max", pressure_parse_cgroup_v2_max, &slice),
		0);
	ck_assert_uint_eq(slice, PRESSURE_UNLIMITED);
	s.have_cgroup_limit = true;

	pressure_figures(&s, &f);
	ck_assert(f.cgroup_dominates);
	ck_assert_double_eq_tol(f.mem_available_pct, 7.5, 0.01);
	reference_thresholds(&t);
	ck_assert_int_eq(pressure_new(&t, &p), 0);
	ck_assert_int_eq(pressure_evaluate(p, &s, 1, NULL, 0), BROKER_TIGHT);
	pressure_free(p);
}
END_TEST

START_TEST(test_garbage_fixture_is_rejected)
{
	struct meminfo m;
	struct psi p;
	struct vmstat v;
	struct cgroup_paths c;

	ck_assert_int_eq(fixture_meminfo("garbage", &m), -EBADMSG);
	ck_assert_int_eq(fixture_psi("garbage", "proc/pressure/memory", &p), -EBADMSG);
	ck_assert_int_eq(fixture_vmstat("garbage", "proc/vmstat", &v), -EBADMSG);
	ck_assert_int_eq(fixture_cgroup("garbage", &c), -EBADMSG);
}
END_TEST

START_TEST(test_truncated_fixture_is_rejected_not_misread)
{
	struct meminfo m;
	struct psi p;
	struct vmstat v;

	/* MemAvailable was cut to "2444": a parser trusting it would report 0.0% and go critical. */
	ck_assert_int_eq(fixture_meminfo("truncated", &m), -EBADMSG);
	ck_assert_int_eq(fixture_psi("truncated", "proc/pressure/memory", &p), -EBADMSG);
	ck_assert_int_eq(fixture_vmstat("truncated", "proc/vmstat", &v), -EBADMSG);
}
END_TEST

START_TEST(test_missing_fixture_has_no_meminfo)
{
	struct meminfo m;

	ck_assert(!fixture_exists("missing/proc/meminfo"));
	ck_assert(fixture_exists("missing/proc/vmstat"));
	/* What the monitor hands the parser when the read gives nothing. */
	ck_assert_int_eq(pressure_parse_meminfo("", 0, &m), -EBADMSG);
}
END_TEST

/* --- parsers on hostile buffers --- */

START_TEST(test_meminfo_empty_and_null_are_bad)
{
	struct meminfo m;

	ck_assert_int_eq(pressure_parse_meminfo(NULL, 0, &m), -EBADMSG);
	ck_assert_int_eq(meminfo_str("", &m), -EBADMSG);
	ck_assert_int_eq(meminfo_str("\n\n\n", &m), -EBADMSG);
}
END_TEST

START_TEST(test_meminfo_without_final_newline_ignores_last_line)
{
	struct meminfo m;

	ck_assert_int_eq(meminfo_str("MemTotal: 100 kB", &m), -EBADMSG);
	ck_assert_int_eq(meminfo_str("MemTotal: 100 kB\nMemAvailable: 50 kB", &m), -EBADMSG);
	ck_assert_int_eq(meminfo_str("MemTotal: 100 kB\nMemAvailable: 50 kB\n", &m), 0);
	ck_assert_uint_eq(m.mem_total_bytes, 100 * KIB);
	ck_assert_uint_eq(m.mem_available_bytes, 50 * KIB);
	ck_assert_uint_eq(m.have, MEMINFO_MEM_TOTAL | MEMINFO_MEM_AVAILABLE);
}
END_TEST

START_TEST(test_meminfo_reads_exactly_len_bytes)
{
	const char *full = "MemTotal: 100 kB\nMemAvailable: 50 kB\nSwapTotal: 7 kB\n";
	struct meminfo m;
	char *b;
	size_t n = strlen(full);

	/* Exactly-sized heap copies: ASan flags any byte read past len. */
	for (size_t len = 0; len <= n; len++) {
		b = malloc(len ? len : 1);
		memcpy(b, full, len);
		int r = pressure_parse_meminfo(b, len, &m);
		size_t need = strlen("MemTotal: 100 kB\nMemAvailable: 50 kB\n");

		ck_assert_int_eq(r, len >= need ? 0 : -EBADMSG);
		if (r == 0)
			ck_assert_uint_eq(m.swap_total_bytes, len == n ? 7 * KIB : 0);
		free(b);
	}
}
END_TEST

START_TEST(test_meminfo_huge_and_negative_numbers_are_bad)
{
	struct meminfo m;

	ck_assert_int_eq(meminfo_str("MemTotal: 99999999999999999999999 kB\nMemAvailable: 1 kB\n", &m), -EBADMSG);
	/* 2^54 kB is 2^64 bytes: one past what fits. */
	ck_assert_int_eq(meminfo_str("MemTotal: 18014398509481984 kB\nMemAvailable: 1 kB\n", &m), -EBADMSG);
	ck_assert_int_eq(meminfo_str("MemTotal: 18014398509481983 kB\nMemAvailable: 1 kB\n", &m), 0);
	ck_assert_uint_eq(m.mem_total_bytes, 18014398509481983ull * 1024);
	ck_assert_int_eq(meminfo_str("MemTotal: -5 kB\nMemAvailable: 1 kB\n", &m), -EBADMSG);
	ck_assert_int_eq(meminfo_str("MemTotal: 5 kB\nMemAvailable: -1 kB\n", &m), -EBADMSG);
	ck_assert_int_eq(meminfo_str("MemTotal: 0 kB\nMemAvailable: 0 kB\n", &m), -EBADMSG);
	ck_assert_int_eq(meminfo_str("MemTotal: 5 MB\nMemAvailable: 1 kB\n", &m), -EBADMSG);
	ck_assert_int_eq(meminfo_str("MemTotal: 5 kB trailing\nMemAvailable: 1 kB\n", &m), -EBADMSG);
	ck_assert_int_eq(meminfo_str("MemTotal: kB\nMemAvailable: 1 kB\n", &m), -EBADMSG);
}
END_TEST

START_TEST(test_meminfo_bad_optional_field_is_dropped)
{
	struct meminfo m;

	ck_assert_int_eq(meminfo_str("MemTotal: 100 kB\nMemAvailable: 50 kB\nSwapTotal: lots\n"
				     "HugePages_Total: 99999999999999999\nHugepagesize: 2048 kB\n",
				     &m),
			 0);
	ck_assert(!(m.have & MEMINFO_SWAP_TOTAL));
	ck_assert_uint_eq(m.swap_total_bytes, 0);
	/* 10^17 pages x 2 MiB overflows: dropped, not wrapped. */
	ck_assert(!(m.have & MEMINFO_HUGEPAGES_TOTAL));
	ck_assert_uint_eq(m.hugepages_total_bytes, 0);
}
END_TEST

START_TEST(test_meminfo_hugepages_scale_by_page_size)
{
	struct meminfo m;

	ck_assert_int_eq(meminfo_str("MemTotal: 100 kB\nMemAvailable: 50 kB\nHugePages_Total:     512\n"
				     "HugePages_Free:      100\nHugepagesize:    2048 kB\n",
				     &m),
			 0);
	ck_assert_uint_eq(m.hugepages_total_bytes, 512 * 2 * MIB);
	ck_assert_uint_eq(m.hugepages_free_bytes, 100 * 2 * MIB);
	/* Without a page size the counts mean nothing in bytes. */
	ck_assert_int_eq(meminfo_str("MemTotal: 100 kB\nMemAvailable: 50 kB\nHugePages_Total: 512\n", &m), 0);
	ck_assert_uint_eq(m.hugepages_total_bytes, 0);
}
END_TEST

START_TEST(test_meminfo_key_must_match_whole_name)
{
	struct meminfo m;

	ck_assert_int_eq(meminfo_str("MemTotalX: 100 kB\nXMemAvailable: 50 kB\n", &m), -EBADMSG);
}
END_TEST

START_TEST(test_vmstat_needs_both_counters)
{
	struct vmstat v;
	size_t len;
	char *b;

	b = exact("nr_free_pages 5\npswpin 7\npswpout 9\n", &len);
	ck_assert_int_eq(pressure_parse_vmstat(b, len, &v), 0);
	ck_assert_uint_eq(v.pswpin, 7);
	ck_assert_uint_eq(v.pswpout, 9);
	free(b);
	b = exact("pswpin 7\n", &len);
	ck_assert_int_eq(pressure_parse_vmstat(b, len, &v), -EBADMSG);
	free(b);
	b = exact("pswpin 7\npswpout x\n", &len);
	ck_assert_int_eq(pressure_parse_vmstat(b, len, &v), -EBADMSG);
	free(b);
	b = exact("pswpin 7\npswpout 99999999999999999999999\n", &len);
	ck_assert_int_eq(pressure_parse_vmstat(b, len, &v), -EBADMSG);
	free(b);
	/* A prefix is not the key. */
	b = exact("pswpinx 7\npswpout 1\n", &len);
	ck_assert_int_eq(pressure_parse_vmstat(b, len, &v), -EBADMSG);
	free(b);
	ck_assert_int_eq(pressure_parse_vmstat(NULL, 0, &v), -EBADMSG);
}
END_TEST

START_TEST(test_psi_with_only_some_is_fine)
{
	struct psi p;

	ck_assert_int_eq(psi_str("some avg10=1.50 avg60=2.25 avg300=0.01 total=123456\n", &p), 0);
	ck_assert(p.some.present);
	ck_assert(!p.full.present);
	ck_assert_double_eq_tol(p.some.avg10, 1.5, 1e-12);
	ck_assert_double_eq_tol(p.some.avg60, 2.25, 1e-12);
	ck_assert_double_eq_tol(p.some.avg300, 0.01, 1e-12);
	ck_assert_uint_eq(p.some.total_us, 123456);
}
END_TEST

START_TEST(test_psi_malformed_lines_are_bad)
{
	struct psi p;

	ck_assert_int_eq(psi_str("", &p), -EBADMSG);
	ck_assert_int_eq(psi_str("full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", &p), -EBADMSG);
	ck_assert_int_eq(psi_str("some\n", &p), -EBADMSG);
	ck_assert_int_eq(psi_str("some avg10=abc avg60=0.00 avg300=0.00 total=0\n", &p), -EBADMSG);
	ck_assert_int_eq(psi_str("some avg10=-1.00 avg60=0.00 avg300=0.00 total=0\n", &p), -EBADMSG);
	ck_assert_int_eq(psi_str("some avg10=1. avg60=0.00 avg300=0.00 total=0\n", &p), -EBADMSG);
	ck_assert_int_eq(psi_str("some avg10=1.00 avg60=0.00 avg300=0.00\n", &p), -EBADMSG);
	ck_assert_int_eq(psi_str("some avg10=1.00x avg60=0.00 avg300=0.00 total=0\n", &p), -EBADMSG);
	ck_assert_int_eq(psi_str("some avg10=0.00 avg60=0.00 avg300=0.00 total=99999999999999999999999\n", &p),
			 -EBADMSG);
	/* Unterminated: the line may have been cut. */
	ck_assert_int_eq(psi_str("some avg10=0.00 avg60=0.00 avg300=0.00 total=0", &p), -EBADMSG);
	ck_assert_int_eq(psi_str("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=oops\n", &p), -EBADMSG);
}
END_TEST

START_TEST(test_psi_tolerates_unknown_fields_and_long_fractions)
{
	struct psi p;

	ck_assert_int_eq(psi_str("some avg10=12.3456789012345678901234 avg60=0 avg300=0 total=1 future=7\n"
				 "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
				 &p),
			 0);
	ck_assert_double_eq_tol(p.some.avg10, 12.3456789012, 1e-9);
	ck_assert(p.full.present);
}
END_TEST

START_TEST(test_u64_files_accept_optional_newline_only)
{
	uint64_t v;

	ck_assert_int_eq(u64_str(pressure_parse_u64_file, "123", &v), 0);
	ck_assert_uint_eq(v, 123);
	ck_assert_int_eq(u64_str(pressure_parse_u64_file, "123\n", &v), 0);
	ck_assert_int_eq(u64_str(pressure_parse_u64_file, "18446744073709551615\n", &v), 0);
	ck_assert_uint_eq(v, UINT64_MAX);
	ck_assert_int_eq(u64_str(pressure_parse_u64_file, "18446744073709551616\n", &v), -EBADMSG);
	ck_assert_int_eq(u64_str(pressure_parse_u64_file, "", &v), -EBADMSG);
	ck_assert_int_eq(u64_str(pressure_parse_u64_file, "\n", &v), -EBADMSG);
	ck_assert_int_eq(u64_str(pressure_parse_u64_file, "-1\n", &v), -EBADMSG);
	ck_assert_int_eq(u64_str(pressure_parse_u64_file, "12a\n", &v), -EBADMSG);
	ck_assert_int_eq(u64_str(pressure_parse_u64_file, "12\n\n", &v), -EBADMSG);
	ck_assert_int_eq(pressure_parse_u64_file(NULL, 0, &v), -EBADMSG);
}
END_TEST

START_TEST(test_v2_max_means_unlimited)
{
	uint64_t v;

	ck_assert_int_eq(u64_str(pressure_parse_cgroup_v2_max, "max\n", &v), 0);
	ck_assert_uint_eq(v, PRESSURE_UNLIMITED);
	ck_assert_int_eq(u64_str(pressure_parse_cgroup_v2_max, "max", &v), 0);
	ck_assert_int_eq(u64_str(pressure_parse_cgroup_v2_max, "4294967296\n", &v), 0);
	ck_assert_uint_eq(v, 4 * GIB);
	ck_assert_int_eq(u64_str(pressure_parse_cgroup_v2_max, "maximum\n", &v), -EBADMSG);
	ck_assert_int_eq(u64_str(pressure_parse_cgroup_v2_max, "ma", &v), -EBADMSG);
}
END_TEST

START_TEST(test_v1_limit_from_2_pow_62_is_unlimited)
{
	uint64_t v;

	ck_assert_int_eq(u64_str(pressure_parse_cgroup_v1_limit, "9223372036854771712\n", &v), 0);
	ck_assert_uint_eq(v, PRESSURE_UNLIMITED);
	ck_assert_int_eq(u64_str(pressure_parse_cgroup_v1_limit, "4611686018427387904\n", &v), 0);
	ck_assert_uint_eq(v, PRESSURE_UNLIMITED);
	ck_assert_int_eq(u64_str(pressure_parse_cgroup_v1_limit, "4611686018427387903\n", &v), 0);
	ck_assert_uint_eq(v, 4611686018427387903ull);
	ck_assert_int_eq(u64_str(pressure_parse_cgroup_v1_limit, "max\n", &v), -EBADMSG);
}
END_TEST

START_TEST(test_self_cgroup_finds_v1_memory_and_v2)
{
	struct cgroup_paths c;

	ck_assert_int_eq(cgroup_str("12:cpu,cpuacct:/a\n3:name=memory:/fake\n4:blkio,memory:/job:with:colons\n"
				    "0::/user.slice\n",
				    &c),
			 0);
	ck_assert(c.has_v1_memory);
	ck_assert_str_eq(c.v1_memory, "/job:with:colons");
	ck_assert(c.has_v2);
	ck_assert_str_eq(c.v2, "/user.slice");

	ck_assert_int_eq(cgroup_str("0::/\n", &c), 0);
	ck_assert(!c.has_v1_memory);
	ck_assert_str_eq(c.v2, "/");
}
END_TEST

START_TEST(test_self_cgroup_rejects_unsafe_or_missing_paths)
{
	struct cgroup_paths c;
	char *big;
	size_t n = PRESSURE_CGROUP_PATH_MAX + 16;

	ck_assert_int_eq(cgroup_str("", &c), -EBADMSG);
	ck_assert_int_eq(cgroup_str("1:cpu:/a\n", &c), -EBADMSG);
	ck_assert_int_eq(cgroup_str("0::/a/../../etc\n", &c), -EBADMSG);
	ck_assert_int_eq(cgroup_str("0::/..\n", &c), -EBADMSG);
	ck_assert_int_eq(cgroup_str("4:memory:relative\n", &c), -EBADMSG);
	ck_assert_int_eq(cgroup_str("4:memory:\n", &c), -EBADMSG);
	/* "..." and "..x" are ordinary names. */
	ck_assert_int_eq(cgroup_str("0::/.../..x\n", &c), 0);
	/* Unterminated: ignored. */
	ck_assert_int_eq(cgroup_str("0::/a", &c), -EBADMSG);

	big = malloc(n + 8);
	memcpy(big, "0::/", 4);
	memset(big + 4, 'a', n);
	big[n + 4] = '\n';
	ck_assert_int_eq(pressure_parse_self_cgroup(big, n + 5, &c), -ENAMETOOLONG);
	free(big);
}
END_TEST

/* Bias the alphabet toward the bytes the parsers look for, so runs reach deep branches. */
static const char fuzz_alphabet[] = "MemTotal:Available kB0123456789 .=\n:/-somefullavg10total,memory\xff";

/* Parsers that accepted a buffer in check_parsers_on(), counted so a test can show it reached them. */
struct parse_counts {
	unsigned meminfo, psi, cgroup;
};

/* A ".." path component, which pressure_parse_self_cgroup promises never to return. */
static bool has_dotdot_component(const char *path)
{
	size_t n = strlen(path);

	return strstr(path, "/../") || (n >= 3 && strcmp(path + n - 3, "/..") == 0);
}

/* Every parser on one buffer: each fails with its documented errno or leaves what it promises. */
static void check_parsers_on(const char *b, size_t len, const struct pressure_thresholds *t, struct parse_counts *n)
{
	struct meminfo m;
	struct vmstat v;
	struct psi p;
	struct cgroup_paths c;
	struct pressure_sample smp = { 0 };
	struct pressure_figures f;
	enum broker_state st;
	uint64_t u;
	int r;

	r = pressure_parse_meminfo(b, len, &m);
	ck_assert_msg(r == 0 || r == -EBADMSG, "meminfo: %d", r);
	ck_assert(len > 0 || r == -EBADMSG);
	if (r == 0) {
		n->meminfo++;
		ck_assert(m.mem_total_bytes > 0);
		ck_assert_uint_eq(m.have & (MEMINFO_MEM_TOTAL | MEMINFO_MEM_AVAILABLE),
				  MEMINFO_MEM_TOTAL | MEMINFO_MEM_AVAILABLE);
		/* A parsed meminfo alone gives finite figures, no PSI or swap-out signal, and a state in range. */
		smp.mem = m;
		pressure_figures(&smp, &f);
		ck_assert(isfinite(f.mem_available_pct) && f.mem_available_pct >= 0 && f.mem_available_pct <= 100);
		ck_assert(f.mem_available_bytes <= f.mem_base_bytes);
		ck_assert(isnan(f.swap_free_pct) || (f.swap_free_pct >= 0 && f.swap_free_pct <= 100));
		ck_assert(isnan(f.psi_some_avg10) && isnan(f.psi_full_avg10) && isnan(f.swapout_pages_s));
		st = pressure_level(t, &f);
		ck_assert(st == BROKER_NORMAL || st == BROKER_TIGHT || st == BROKER_CRITICAL);
	}
	r = pressure_parse_vmstat(b, len, &v);
	ck_assert_msg(r == 0 || r == -EBADMSG, "vmstat: %d", r);
	ck_assert(len > 0 || r == -EBADMSG);
	r = pressure_parse_psi(b, len, &p);
	ck_assert_msg(r == 0 || r == -EBADMSG, "psi: %d", r);
	ck_assert(len > 0 || r == -EBADMSG);
	if (r == 0) {
		n->psi++;
		ck_assert(p.some.present);
		ck_assert(isfinite(p.some.avg10) && isfinite(p.some.avg60) && isfinite(p.some.avg300));
		ck_assert(!p.full.present ||
			  (isfinite(p.full.avg10) && isfinite(p.full.avg60) && isfinite(p.full.avg300)));
	}
	r = pressure_parse_self_cgroup(b, len, &c);
	ck_assert_msg(r == 0 || r == -EBADMSG || r == -ENAMETOOLONG, "self_cgroup: %d", r);
	ck_assert(len > 0 || r == -EBADMSG);
	if (r == 0) {
		n->cgroup++;
		ck_assert(c.has_v1_memory || c.has_v2);
		ck_assert(!c.has_v1_memory || (c.v1_memory[0] == '/' && !has_dotdot_component(c.v1_memory)));
		ck_assert(!c.has_v2 || (c.v2[0] == '/' && !has_dotdot_component(c.v2)));
	}
	r = pressure_parse_cgroup_v2_max(b, len, &u);
	ck_assert_msg(r == 0 || r == -EBADMSG, "v2_max: %d", r);
	ck_assert(len > 0 || r == -EBADMSG);
	r = pressure_parse_cgroup_v1_limit(b, len, &u);
	ck_assert_msg(r == 0 || r == -EBADMSG, "v1_limit: %d", r);
	ck_assert(len > 0 || r == -EBADMSG);
	r = pressure_parse_keyed_u64(b, len, "pswpout", &u);
	ck_assert_msg(r == 0 || r == -ENOENT || r == -EBADMSG, "keyed_u64: %d", r);
	ck_assert(len > 0 || r == -ENOENT);
}

START_TEST(test_random_buffers_never_crash_a_parser)
{
	unsigned seed = 12345;
	struct pressure_thresholds t;
	struct parse_counts n = { 0 };

	reference_thresholds(&t);
	for (int i = 0; i < 20000; i++) {
		size_t len = (size_t)(rand_r(&seed) % 300);
		char *b = malloc(len ? len : 1);

		for (size_t j = 0; j < len; j++)
			b[j] = (i & 1) ? (char)rand_r(&seed)
				       : fuzz_alphabet[(unsigned)rand_r(&seed) % (sizeof(fuzz_alphabet) - 1)];
		check_parsers_on(b, len, &t, &n);
		free(b);
	}
}
END_TEST

/* Real files with a few bytes changed or cut short: these reach the parsers' success paths. */
START_TEST(test_mutated_fixtures_parse_to_sane_values_or_fail_cleanly)
{
	static const char *const files[] = { "idle/proc/meminfo", "idle/proc/pressure/memory",
					     "cgroup-v2/proc/self/cgroup", "idle/proc/vmstat" };
	unsigned seed = 54321;
	struct pressure_thresholds t;
	struct parse_counts n = { 0 };

	reference_thresholds(&t);
	for (size_t k = 0; k < sizeof(files) / sizeof(files[0]); k++) {
		size_t orig_len;
		char *orig = slurp(files[k], &orig_len);

		for (int i = 0; i < 2000; i++) {
			size_t len = (i % 4 == 0) ? (size_t)rand_r(&seed) % (orig_len + 1) : orig_len;
			char *b = malloc(len ? len : 1);
			int flips = rand_r(&seed) % 4;

			memcpy(b, orig, len);
			for (int j = 0; j < flips && len > 0; j++)
				b[(size_t)rand_r(&seed) % len] =
					fuzz_alphabet[(unsigned)rand_r(&seed) % (sizeof(fuzz_alphabet) - 1)];
			check_parsers_on(b, len, &t, &n);
			free(b);
		}
		free(orig);
	}
	/* The postconditions above ran on accepted input, not only on rejections. */
	ck_assert_uint_gt(n.meminfo, 100);
	ck_assert_uint_gt(n.psi, 100);
	ck_assert_uint_gt(n.cgroup, 100);
}
END_TEST

START_TEST(test_rate_of_counter_going_back_is_zero)
{
	ck_assert_double_eq(pressure_rate_per_s(100, 50, 1000), 0);
	ck_assert_double_eq(pressure_rate_per_s(100, 200, 0), 0);
	ck_assert_double_eq_tol(pressure_rate_per_s(100, 200, 500), 200, 1e-9);
}
END_TEST

/* --- policy --- */

/* 100 GiB host, no swap, no PSI, no cgroup; avail_pct of it available. */
static struct pressure_sample sample_pct(double avail_pct)
{
	struct pressure_sample s = { 0 };

	s.mem.mem_total_bytes = 100 * GIB;
	s.mem.mem_available_bytes = (uint64_t)(avail_pct / 100.0 * (double)(100 * GIB));
	s.mem.have = MEMINFO_MEM_TOTAL | MEMINFO_MEM_AVAILABLE;
	s.have_psi = true;
	s.psi.some.present = s.psi.full.present = true;
	s.have_swapout = true;
	return s;
}

static struct pressure *policy(uint32_t hysteresis_ms)
{
	struct pressure_thresholds t;
	struct pressure *p = NULL;

	reference_thresholds(&t);
	t.hysteresis_ms = hysteresis_ms;
	ck_assert_int_eq(pressure_new(&t, &p), 0);
	return p;
}

START_TEST(test_new_policy_rejects_null_thresholds)
{
	struct pressure *p = NULL;

	ck_assert_int_eq(pressure_new(NULL, &p), -EINVAL);
	ck_assert_ptr_null(p);
}
END_TEST

START_TEST(test_each_tight_signal_raises_normal_to_tight)
{
	struct pressure_sample s;
	struct pressure *p;
	char why[256];

	/* MemAvailable just under 10% */
	p = policy(1000);
	s = sample_pct(9.9);
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, why, sizeof(why)), BROKER_TIGHT);
	ck_assert_ptr_nonnull(strstr(why, "MemAvailable 9.9% < 10% tight threshold"));
	pressure_free(p);

	/* exactly 10% is not below */
	p = policy(1000);
	s = sample_pct(50);
	s.mem.mem_available_bytes = 10 * GIB;
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, NULL, 0), BROKER_NORMAL);
	pressure_free(p);

	p = policy(1000);
	s = sample_pct(50);
	s.psi.some.avg10 = 10.01;
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, why, sizeof(why)), BROKER_TIGHT);
	ck_assert_ptr_nonnull(strstr(why, "PSI some avg10 10.01 > 10 tight threshold"));
	pressure_free(p);

	p = policy(1000);
	s = sample_pct(50);
	s.swapout_pages_s = 1001;
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, why, sizeof(why)), BROKER_TIGHT);
	ck_assert_ptr_nonnull(strstr(why, "swap-out 1001 pages/s > 1000/s tight threshold"));
	pressure_free(p);

	p = policy(1000);
	s = sample_pct(50);
	s.mem.swap_total_bytes = 10 * GIB;
	s.mem.swap_free_bytes = GIB;
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, why, sizeof(why)), BROKER_TIGHT);
	ck_assert_ptr_nonnull(strstr(why, "SwapFree 10.0% < 20% tight threshold"));
	pressure_free(p);
}
END_TEST

START_TEST(test_each_critical_signal_raises_normal_to_critical)
{
	struct pressure_sample s;
	struct pressure *p;
	char why[256];

	p = policy(1000);
	s = sample_pct(4.1);
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, why, sizeof(why)), BROKER_CRITICAL);
	ck_assert_str_eq(why, "MemAvailable 4.1% < 5% critical threshold; PSI some avg10 0.00; PSI full avg10 0.00; "
			      "swap-out 0 pages/s");
	pressure_free(p);

	p = policy(1000);
	s = sample_pct(50);
	s.psi.full.avg10 = 5.5;
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, why, sizeof(why)), BROKER_CRITICAL);
	ck_assert_ptr_nonnull(strstr(why, "PSI full avg10 5.50 > 5 critical threshold"));
	pressure_free(p);

	p = policy(1000);
	s = sample_pct(50);
	s.swapout_pages_s = 20000;
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, why, sizeof(why)), BROKER_CRITICAL);
	ck_assert_ptr_nonnull(strstr(why, "swap-out 20000 pages/s > 10000/s critical threshold"));
	pressure_free(p);
}
END_TEST

START_TEST(test_tight_rises_to_critical_at_once)
{
	struct pressure *p = policy(60000);
	struct pressure_sample s = sample_pct(8);

	ck_assert_int_eq(pressure_evaluate(p, &s, 0, NULL, 0), BROKER_TIGHT);
	s = sample_pct(4);
	ck_assert_int_eq(pressure_evaluate(p, &s, 1, NULL, 0), BROKER_CRITICAL);
	ck_assert_int_eq(pressure_state(p), BROKER_CRITICAL);
	pressure_free(p);
}
END_TEST

START_TEST(test_critical_drops_to_normal_only_after_hysteresis)
{
	struct pressure *p = policy(10000);
	struct pressure_sample hot = sample_pct(3), calm = sample_pct(50);
	char why[256];

	ck_assert_int_eq(pressure_evaluate(p, &hot, 1000, NULL, 0), BROKER_CRITICAL);
	ck_assert_int_eq(pressure_evaluate(p, &calm, 2000, why, sizeof(why)), BROKER_CRITICAL);
	ck_assert_ptr_nonnull(strstr(why, "below critical thresholds for 0 of 10000 ms"));
	ck_assert_int_eq(pressure_evaluate(p, &calm, 11999, NULL, 0), BROKER_CRITICAL);
	/* Below the tight thresholds the whole time: straight to normal. */
	ck_assert_int_eq(pressure_evaluate(p, &calm, 12000, why, sizeof(why)), BROKER_NORMAL);
	ck_assert_ptr_nonnull(strstr(why, "below tight thresholds for 10000 ms"));
	pressure_free(p);
}
END_TEST

START_TEST(test_critical_steps_to_tight_then_normal)
{
	struct pressure *p = policy(10000);
	struct pressure_sample hot = sample_pct(3), warm = sample_pct(7), calm = sample_pct(50);

	ck_assert_int_eq(pressure_evaluate(p, &hot, 0, NULL, 0), BROKER_CRITICAL);
	ck_assert_int_eq(pressure_evaluate(p, &warm, 1000, NULL, 0), BROKER_CRITICAL);
	ck_assert_int_eq(pressure_evaluate(p, &warm, 10999, NULL, 0), BROKER_CRITICAL);
	ck_assert_int_eq(pressure_evaluate(p, &warm, 11000, NULL, 0), BROKER_TIGHT);
	/* Tight needs its own calm run, which starts only now. */
	ck_assert_int_eq(pressure_evaluate(p, &calm, 12000, NULL, 0), BROKER_TIGHT);
	ck_assert_int_eq(pressure_evaluate(p, &calm, 21999, NULL, 0), BROKER_TIGHT);
	ck_assert_int_eq(pressure_evaluate(p, &calm, 22000, NULL, 0), BROKER_NORMAL);
	pressure_free(p);
}
END_TEST

START_TEST(test_spike_restarts_the_hysteresis_clock)
{
	struct pressure *p = policy(10000);
	struct pressure_sample tight = sample_pct(8), calm = sample_pct(50);

	ck_assert_int_eq(pressure_evaluate(p, &tight, 0, NULL, 0), BROKER_TIGHT);
	ck_assert_int_eq(pressure_evaluate(p, &calm, 1000, NULL, 0), BROKER_TIGHT);
	ck_assert_int_eq(pressure_evaluate(p, &tight, 5000, NULL, 0), BROKER_TIGHT);
	ck_assert_int_eq(pressure_evaluate(p, &calm, 6000, NULL, 0), BROKER_TIGHT);
	ck_assert_int_eq(pressure_evaluate(p, &calm, 11000, NULL, 0), BROKER_TIGHT);
	ck_assert_int_eq(pressure_evaluate(p, &calm, 15999, NULL, 0), BROKER_TIGHT);
	ck_assert_int_eq(pressure_evaluate(p, &calm, 16000, NULL, 0), BROKER_NORMAL);
	pressure_free(p);
}
END_TEST

START_TEST(test_zero_hysteresis_drops_on_first_calm_sample)
{
	struct pressure *p = policy(0);
	struct pressure_sample hot = sample_pct(3), calm = sample_pct(50);

	ck_assert_int_eq(pressure_evaluate(p, &hot, 5, NULL, 0), BROKER_CRITICAL);
	ck_assert_int_eq(pressure_evaluate(p, &calm, 5, NULL, 0), BROKER_NORMAL);
	pressure_free(p);
}
END_TEST

START_TEST(test_clock_going_back_does_not_release_early)
{
	struct pressure *p = policy(10000);
	struct pressure_sample hot = sample_pct(3), calm = sample_pct(50);

	ck_assert_int_eq(pressure_evaluate(p, &hot, 50000, NULL, 0), BROKER_CRITICAL);
	ck_assert_int_eq(pressure_evaluate(p, &calm, 50000, NULL, 0), BROKER_CRITICAL);
	ck_assert_int_eq(pressure_evaluate(p, &calm, 100, NULL, 0), BROKER_CRITICAL);
	pressure_free(p);
}
END_TEST

START_TEST(test_cgroup_limit_dominates_mem_total)
{
	struct pressure *p = policy(1000);
	struct pressure_sample s = sample_pct(90);
	struct pressure_figures f;
	char why[256];

	s.have_cgroup_limit = true;
	s.cgroup_limit_bytes = 10 * GIB;
	s.cgroup_usage_bytes = 10 * GIB - 400 * MIB; /* 3.9% left */
	pressure_figures(&s, &f);
	ck_assert(f.cgroup_dominates);
	ck_assert_uint_eq(f.mem_base_bytes, 10 * GIB);
	ck_assert_uint_eq(f.mem_available_bytes, 400 * MIB);
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, why, sizeof(why)), BROKER_CRITICAL);
	ck_assert_ptr_nonnull(strstr(why, "MemAvailable 3.9% of cgroup limit 10"));

	/* Reclaimable page cache in the cgroup is not pressure. */
	s.cgroup_reclaimable_bytes = 2 * GIB;
	pressure_figures(&s, &f);
	ck_assert_uint_eq(f.mem_available_bytes, 2 * GIB + 400 * MIB);

	/* The host running out still counts when the cgroup has room. */
	s.cgroup_usage_bytes = GIB;
	s.cgroup_reclaimable_bytes = 0;
	s.mem.mem_available_bytes = 300 * MIB;
	pressure_figures(&s, &f);
	ck_assert_uint_eq(f.mem_available_bytes, 300 * MIB);

	/* Usage over the limit (v1 can overshoot briefly) reads as 0 available, not a wrap. */
	s.mem.mem_available_bytes = 90 * GIB;
	s.cgroup_usage_bytes = 11 * GIB;
	pressure_figures(&s, &f);
	ck_assert_uint_eq(f.mem_available_bytes, 0);
	ck_assert_double_eq(f.mem_available_pct, 0);
	pressure_free(p);
}
END_TEST

START_TEST(test_cgroup_limit_above_mem_total_or_unlimited_is_ignored)
{
	struct pressure_sample s = sample_pct(50);
	struct pressure_figures f;

	s.have_cgroup_limit = true;
	s.cgroup_limit_bytes = 200 * GIB;
	s.cgroup_usage_bytes = 199 * GIB;
	pressure_figures(&s, &f);
	ck_assert(!f.cgroup_dominates);
	ck_assert_uint_eq(f.mem_base_bytes, 100 * GIB);
	ck_assert_double_eq_tol(f.mem_available_pct, 50, 0.01);
	ck_assert_double_eq_tol(f.cgroup_usage_pct, 99.5, 0.01);

	s.cgroup_limit_bytes = PRESSURE_UNLIMITED;
	pressure_figures(&s, &f);
	ck_assert(!f.cgroup_dominates);
	ck_assert(isnan(f.cgroup_usage_pct));
}
END_TEST

START_TEST(test_swap_thresholds_ignored_without_swap)
{
	struct pressure *p = policy(1000);
	struct pressure_sample s = sample_pct(50);
	struct pressure_figures f;
	char why[256];

	s.mem.swap_total_bytes = 0;
	s.mem.swap_free_bytes = 0;
	pressure_figures(&s, &f);
	ck_assert(isnan(f.swap_free_pct));
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, why, sizeof(why)), BROKER_NORMAL);
	ck_assert_ptr_null(strstr(why, "SwapFree"));
	pressure_free(p);
}
END_TEST

START_TEST(test_missing_signals_never_cross)
{
	struct pressure *p = policy(1000);
	struct pressure_sample s = sample_pct(50);
	struct pressure_figures f;

	s.have_psi = false;
	s.psi.some.avg10 = s.psi.full.avg10 = 99; /* stale values behind have_psi = false */
	s.have_swapout = false;
	s.swapout_pages_s = 1e9;
	pressure_figures(&s, &f);
	ck_assert(isnan(f.psi_some_avg10) && isnan(f.psi_full_avg10) && isnan(f.swapout_pages_s));
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, NULL, 0), BROKER_NORMAL);
	pressure_free(p);
}
END_TEST

START_TEST(test_nan_threshold_disables_condition)
{
	struct pressure_thresholds t;
	struct pressure *p;
	struct pressure_sample s = sample_pct(50);

	reference_thresholds(&t);
	t.tight_psi_some_avg10 = NAN;
	ck_assert_int_eq(pressure_new(&t, &p), 0);
	s.psi.some.avg10 = 90;
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, NULL, 0), BROKER_NORMAL);
	pressure_free(p);
}
END_TEST

START_TEST(test_set_thresholds_keeps_state_and_applies_next_sample)
{
	struct pressure *p = policy(0);
	struct pressure_thresholds t;
	struct pressure_sample s = sample_pct(8);

	ck_assert_int_eq(pressure_evaluate(p, &s, 0, NULL, 0), BROKER_TIGHT);
	t = *pressure_get_thresholds(p);
	t.tight_mem_available_pct = 6;
	t.critical_mem_available_pct = 3;
	pressure_set_thresholds(p, &t);
	ck_assert_int_eq(pressure_state(p), BROKER_TIGHT);
	ck_assert_int_eq(pressure_evaluate(p, &s, 1, NULL, 0), BROKER_NORMAL);
	t.tight_mem_available_pct = 20;
	t.critical_mem_available_pct = 9;
	pressure_set_thresholds(p, &t);
	ck_assert_int_eq(pressure_evaluate(p, &s, 2, NULL, 0), BROKER_CRITICAL);
	pressure_free(p);
}
END_TEST

START_TEST(test_why_is_truncated_safely)
{
	struct pressure *p = policy(0);
	struct pressure_sample s = sample_pct(3);
	char why[9];

	memset(why, 'x', sizeof(why));
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, why, sizeof(why)), BROKER_CRITICAL);
	ck_assert_uint_eq(strlen(why), 8);
	ck_assert_str_eq(why, "MemAvail");
	/* A 1-byte buffer gets just the NUL. */
	ck_assert_int_eq(pressure_evaluate(p, &s, 0, why, 1), BROKER_CRITICAL);
	ck_assert_str_eq(why, "");
	pressure_free(p);
}
END_TEST

START_TEST(test_state_names)
{
	static const struct {
		enum broker_state state;
		const char *want;
	} rows[] = {
		{ BROKER_NORMAL, "normal" },
		{ BROKER_TIGHT, "tight" },
		{ BROKER_CRITICAL, "critical" },
		{ (enum broker_state)42, "unknown" },
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		ck_assert_str_eq(pressure_state_name(rows[i].state), rows[i].want);
}
END_TEST

static Suite *pressure_suite(void)
{
	Suite *s = suite_create("pressure");

	CHECK_CASE(s, "fixtures", NULL, NULL, 10, test_idle_meminfo_gives_bytes, test_idle_vmstat_psi_and_cgroup_parse,
		   test_idle_fixture_is_normal, test_swapping_fixture_is_tight_with_swapout_rate,
		   test_near_oom_fixture_is_critical, test_no_psi_fixture_polls_meminfo_only,
		   test_cgroup_v1_fixture_limit_makes_it_critical, test_cgroup_v2_fixture_limit_makes_it_tight,
		   test_garbage_fixture_is_rejected, test_truncated_fixture_is_rejected_not_misread,
		   test_missing_fixture_has_no_meminfo);

	/* The random run takes about a second under ASan. */
	CHECK_CASE(s, "hostile-input", NULL, NULL, 60, test_meminfo_empty_and_null_are_bad,
		   test_meminfo_without_final_newline_ignores_last_line, test_meminfo_reads_exactly_len_bytes,
		   test_meminfo_huge_and_negative_numbers_are_bad, test_meminfo_bad_optional_field_is_dropped,
		   test_meminfo_hugepages_scale_by_page_size, test_meminfo_key_must_match_whole_name,
		   test_vmstat_needs_both_counters, test_psi_with_only_some_is_fine, test_psi_malformed_lines_are_bad,
		   test_psi_tolerates_unknown_fields_and_long_fractions, test_u64_files_accept_optional_newline_only,
		   test_v2_max_means_unlimited, test_v1_limit_from_2_pow_62_is_unlimited,
		   test_self_cgroup_finds_v1_memory_and_v2, test_self_cgroup_rejects_unsafe_or_missing_paths,
		   test_random_buffers_never_crash_a_parser, test_mutated_fixtures_parse_to_sane_values_or_fail_cleanly,
		   test_rate_of_counter_going_back_is_zero);

	CHECK_CASE(s, "policy", NULL, NULL, 10, test_new_policy_rejects_null_thresholds,
		   test_each_tight_signal_raises_normal_to_tight, test_each_critical_signal_raises_normal_to_critical,
		   test_tight_rises_to_critical_at_once, test_critical_drops_to_normal_only_after_hysteresis,
		   test_critical_steps_to_tight_then_normal, test_spike_restarts_the_hysteresis_clock,
		   test_zero_hysteresis_drops_on_first_calm_sample, test_clock_going_back_does_not_release_early,
		   test_cgroup_limit_dominates_mem_total, test_cgroup_limit_above_mem_total_or_unlimited_is_ignored,
		   test_swap_thresholds_ignored_without_swap, test_missing_signals_never_cross,
		   test_nan_threshold_disables_condition, test_set_thresholds_keeps_state_and_applies_next_sample,
		   test_why_is_truncated_safely, test_state_names);
	return s;
}

CHECK_MAIN(pressure_suite)

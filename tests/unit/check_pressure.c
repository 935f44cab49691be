/* SPDX-License-Identifier: MIT */
/* Unit tests for pressure's parsers: the /proc and cgroup readers on every fixture and on hostile buffers (the policy: check_pressure_policy.c). */
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
#include "pressure_ref.h"

/* The parsers, by name, so that one helper and one table serve them all. */
enum parser { P_MEMINFO, P_VMSTAT, P_PSI, P_CGROUP, P_U64, P_V2MAX, P_V1LIMIT, P_KEYED };

static const char *const parser_names[] = { "meminfo",       "vmstat",          "psi",      "self_cgroup", "u64_file",
					    "cgroup_v2_max", "cgroup_v1_limit", "keyed_u64" };

/* Parser k on b[0..len); out is the parser's own result type; key only for P_KEYED. */
static int parse_buf(enum parser k, const char *b, size_t len, const char *key, void *out)
{
	switch (k) {
	case P_MEMINFO:
		return pressure_parse_meminfo(b, len, out);
	case P_VMSTAT:
		return pressure_parse_vmstat(b, len, out);
	case P_PSI:
		return pressure_parse_psi(b, len, out);
	case P_CGROUP:
		return pressure_parse_self_cgroup(b, len, out);
	case P_U64:
		return pressure_parse_u64_file(b, len, out);
	case P_V2MAX:
		return pressure_parse_cgroup_v2_max(b, len, out);
	case P_V1LIMIT:
		return pressure_parse_cgroup_v1_limit(b, len, out);
	case P_KEYED:
		return pressure_parse_keyed_u64(b, len, key, out);
	}
	ck_abort_msg("no parser %d", (int)k);
	return -EINVAL;
}

/* Parser k on a heap copy of s without its NUL, so ASan catches a read past the end. */
static int parse_str(enum parser k, const char *s, void *out)
{
	size_t n;
	char *b = fixture_exact(s, &n);
	int r = parse_buf(k, b, n, NULL, out);

	free(b);
	return r;
}

/* Parser k on the fixture tests/fixtures/proc/scenario/file, read at exactly its size (fixture.h). */
static int parse_fixture(enum parser k, const char *scenario, const char *file, const char *key, void *out)
{
	char rel[512];
	size_t len;
	char *b;
	int r;

	snprintf(rel, sizeof(rel), "%s/%s", scenario, file);
	b = fixture_read("proc", rel, &len);
	r = parse_buf(k, b, len, key, out);
	free(b);
	return r;
}

static int fixture_meminfo(const char *scenario, struct meminfo *m)
{
	return parse_fixture(P_MEMINFO, scenario, "proc/meminfo", NULL, m);
}

static int fixture_cgroup(const char *scenario, struct cgroup_paths *c)
{
	return parse_fixture(P_CGROUP, scenario, "proc/self/cgroup", NULL, c);
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
		s->have_psi = parse_fixture(P_PSI, scenario, "proc/pressure/memory", NULL, &s->psi) == 0;
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

	ck_assert_int_eq(parse_fixture(P_VMSTAT, "idle", "proc/vmstat", NULL, &v), 0);
	ck_assert_uint_eq(v.pswpin, 0);
	ck_assert_uint_eq(v.pswpout, 0);
	ck_assert_int_eq(parse_fixture(P_PSI, "idle", "proc/pressure/memory", NULL, &p), 0);
	ck_assert(p.some.present && p.full.present);
	ck_assert_double_eq(p.some.avg10, 0.0);
	ck_assert_int_eq(fixture_cgroup("idle", &c), 0);
	ck_assert(c.has_v1_memory);
	ck_assert_str_eq(c.v1_memory, "/process_api/5aa2235a371b0280ae36cb7247ebc871");
	ck_assert(c.has_v2);
	ck_assert_str_eq(c.v2, "/");
	/* The capture host's v1 "no limit" is PAGE_COUNTER_MAX in bytes. */
	ck_assert_int_eq(
		parse_fixture(P_V1LIMIT, "idle",
			      "sys/fs/cgroup/memory/process_api/5aa2235a371b0280ae36cb7247ebc871/memory.limit_in_bytes",
			      NULL, &limit),
		0);
	ck_assert_uint_eq(limit, PRESSURE_UNLIMITED);
	ck_assert_int_eq(
		parse_fixture(P_U64, "idle",
			      "sys/fs/cgroup/memory/process_api/5aa2235a371b0280ae36cb7247ebc871/memory.usage_in_bytes",
			      NULL, &usage),
		0);
	ck_assert_uint_gt(usage, 0);
	ck_assert_int_eq(parse_fixture(P_KEYED, "idle",
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
	ck_assert_int_eq(parse_fixture(P_VMSTAT, "swapping", "proc/vmstat", NULL, &a), 0);
	ck_assert_int_eq(parse_fixture(P_VMSTAT, "swapping", "vmstat.after-1s", NULL, &b), 0);
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
	ck_assert_int_eq(parse_fixture(P_V1LIMIT, "cgroup-v1", file, NULL, &s.cgroup_limit_bytes), 0);
	ck_assert_uint_eq(s.cgroup_limit_bytes, 8 * GIB);
	snprintf(file, sizeof(file), "%s/memory.usage_in_bytes", dir);
	ck_assert_int_eq(parse_fixture(P_U64, "cgroup-v1", file, NULL, &s.cgroup_usage_bytes), 0);
	snprintf(file, sizeof(file), "%s/memory.stat", dir);
	ck_assert_int_eq(parse_fixture(P_KEYED, "cgroup-v1", file, "total_inactive_file", &s.cgroup_reclaimable_bytes),
			 0);
	ck_assert_int_eq(parse_fixture(P_V1LIMIT, "cgroup-v1", "sys/fs/cgroup/memory/pinbroker/memory.limit_in_bytes",
				       NULL, &parent),
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
	ck_assert_int_eq(parse_fixture(P_V2MAX, "cgroup-v2", file, NULL, &s.cgroup_limit_bytes), 0);
	ck_assert_uint_eq(s.cgroup_limit_bytes, 4 * GIB);
	snprintf(file, sizeof(file), "%s/memory.current", dir);
	ck_assert_int_eq(parse_fixture(P_U64, "cgroup-v2", file, NULL, &s.cgroup_usage_bytes), 0);
	snprintf(file, sizeof(file), "%s/memory.stat", dir);
	ck_assert_int_eq(parse_fixture(P_KEYED, "cgroup-v2", file, "inactive_file", &s.cgroup_reclaimable_bytes), 0);
	snprintf(file, sizeof(file), "%s/memory.pressure", dir);
	ck_assert_int_eq(parse_fixture(P_PSI, "cgroup-v2", file, NULL, &cg_psi), 0);
	ck_assert_double_eq_tol(cg_psi.some.avg10, 2.0, 1e-9);
	ck_assert_double_eq_tol(cg_psi.full.avg300, 0.05, 1e-9);
	ck_assert_uint_eq(cg_psi.full.total_us, 345678);
	ck_assert_int_eq(parse_fixture(P_V2MAX, "cgroup-v2", "sys/fs/cgroup/system.slice/memory.max", NULL, &slice), 0);
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
	ck_assert_int_eq(parse_fixture(P_PSI, "garbage", "proc/pressure/memory", NULL, &p), -EBADMSG);
	ck_assert_int_eq(parse_fixture(P_VMSTAT, "garbage", "proc/vmstat", NULL, &v), -EBADMSG);
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
	ck_assert_int_eq(parse_fixture(P_PSI, "truncated", "proc/pressure/memory", NULL, &p), -EBADMSG);
	ck_assert_int_eq(parse_fixture(P_VMSTAT, "truncated", "proc/vmstat", NULL, &v), -EBADMSG);
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

/* One buffer through one parser (in NULL: a NULL buffer of length 0), the result it must give, and for
 * the u64 parsers' successes the value. */
struct parse_row {
	enum parser k;
	const char *in;
	int rc;
	uint64_t value;
};

static const struct parse_row parse_rows[] = {
	/* Empty, NULL and blank input. */
	{ P_MEMINFO, NULL, -EBADMSG, 0 },
	{ P_MEMINFO, "", -EBADMSG, 0 },
	{ P_MEMINFO, "\n\n\n", -EBADMSG, 0 },
	/* Without a final newline the last line may have been cut: it is ignored. */
	{ P_MEMINFO, "MemTotal: 100 kB", -EBADMSG, 0 },
	{ P_MEMINFO, "MemTotal: 100 kB\nMemAvailable: 50 kB", -EBADMSG, 0 },
	/* Huge, negative, zero, wrongly-unit and trailing numbers. */
	{ P_MEMINFO, "MemTotal: 99999999999999999999999 kB\nMemAvailable: 1 kB\n", -EBADMSG, 0 },
	/* 2^54 kB is 2^64 bytes: one past what fits. */
	{ P_MEMINFO, "MemTotal: 18014398509481984 kB\nMemAvailable: 1 kB\n", -EBADMSG, 0 },
	{ P_MEMINFO, "MemTotal: -5 kB\nMemAvailable: 1 kB\n", -EBADMSG, 0 },
	{ P_MEMINFO, "MemTotal: 5 kB\nMemAvailable: -1 kB\n", -EBADMSG, 0 },
	{ P_MEMINFO, "MemTotal: 0 kB\nMemAvailable: 0 kB\n", -EBADMSG, 0 },
	{ P_MEMINFO, "MemTotal: 5 MB\nMemAvailable: 1 kB\n", -EBADMSG, 0 },
	{ P_MEMINFO, "MemTotal: 5 kB trailing\nMemAvailable: 1 kB\n", -EBADMSG, 0 },
	{ P_MEMINFO, "MemTotal: kB\nMemAvailable: 1 kB\n", -EBADMSG, 0 },
	/* A key must match the whole name. */
	{ P_MEMINFO, "MemTotalX: 100 kB\nXMemAvailable: 50 kB\n", -EBADMSG, 0 },
	/* vmstat needs both counters, as numbers that fit; a prefix is not the key. */
	{ P_VMSTAT, NULL, -EBADMSG, 0 },
	{ P_VMSTAT, "pswpin 7\n", -EBADMSG, 0 },
	{ P_VMSTAT, "pswpin 7\npswpout x\n", -EBADMSG, 0 },
	{ P_VMSTAT, "pswpin 7\npswpout 99999999999999999999999\n", -EBADMSG, 0 },
	{ P_VMSTAT, "pswpinx 7\npswpout 1\n", -EBADMSG, 0 },
	/* PSI: a "some" line first, every field well-formed, every line terminated. */
	{ P_PSI, "", -EBADMSG, 0 },
	{ P_PSI, "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", -EBADMSG, 0 },
	{ P_PSI, "some\n", -EBADMSG, 0 },
	{ P_PSI, "some avg10=abc avg60=0.00 avg300=0.00 total=0\n", -EBADMSG, 0 },
	{ P_PSI, "some avg10=-1.00 avg60=0.00 avg300=0.00 total=0\n", -EBADMSG, 0 },
	{ P_PSI, "some avg10=1. avg60=0.00 avg300=0.00 total=0\n", -EBADMSG, 0 },
	{ P_PSI, "some avg10=1.00 avg60=0.00 avg300=0.00\n", -EBADMSG, 0 },
	{ P_PSI, "some avg10=1.00x avg60=0.00 avg300=0.00 total=0\n", -EBADMSG, 0 },
	{ P_PSI, "some avg10=0.00 avg60=0.00 avg300=0.00 total=99999999999999999999999\n", -EBADMSG, 0 },
	{ P_PSI, "some avg10=0.00 avg60=0.00 avg300=0.00 total=0", -EBADMSG, 0 },
	{ P_PSI, "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=oops\n", -EBADMSG, 0 },
	/* A u64 file: digits that fit, then at most one newline. */
	{ P_U64, "123", 0, 123 },
	{ P_U64, "123\n", 0, 123 },
	{ P_U64, "18446744073709551615\n", 0, UINT64_MAX },
	{ P_U64, "18446744073709551616\n", -EBADMSG, 0 },
	{ P_U64, "", -EBADMSG, 0 },
	{ P_U64, "\n", -EBADMSG, 0 },
	{ P_U64, "-1\n", -EBADMSG, 0 },
	{ P_U64, "12a\n", -EBADMSG, 0 },
	{ P_U64, "12\n\n", -EBADMSG, 0 },
	{ P_U64, NULL, -EBADMSG, 0 },
	/* cgroup v2's memory.max: "max" is unlimited. */
	{ P_V2MAX, "max\n", 0, PRESSURE_UNLIMITED },
	{ P_V2MAX, "max", 0, PRESSURE_UNLIMITED },
	{ P_V2MAX, "4294967296\n", 0, 4 * GIB },
	{ P_V2MAX, "maximum\n", -EBADMSG, 0 },
	{ P_V2MAX, "ma", -EBADMSG, 0 },
	/* cgroup v1's limit_in_bytes: 2^62 and above is its "no limit". */
	{ P_V1LIMIT, "9223372036854771712\n", 0, PRESSURE_UNLIMITED },
	{ P_V1LIMIT, "4611686018427387904\n", 0, PRESSURE_UNLIMITED },
	{ P_V1LIMIT, "4611686018427387903\n", 0, 4611686018427387903ull },
	{ P_V1LIMIT, "max\n", -EBADMSG, 0 },
	/* /proc/self/cgroup: absolute paths without "..", terminated lines. */
	{ P_CGROUP, "", -EBADMSG, 0 },
	{ P_CGROUP, "1:cpu:/a\n", -EBADMSG, 0 },
	{ P_CGROUP, "0::/a/../../etc\n", -EBADMSG, 0 },
	{ P_CGROUP, "0::/..\n", -EBADMSG, 0 },
	{ P_CGROUP, "4:memory:relative\n", -EBADMSG, 0 },
	{ P_CGROUP, "4:memory:\n", -EBADMSG, 0 },
	{ P_CGROUP, "0::/.../..x\n", 0, 0 }, /* "..." and "..x" are ordinary names */
	{ P_CGROUP, "0::/a", -EBADMSG, 0 },
};

START_TEST(test_parse_rows)
{
	const struct parse_row *r = &parse_rows[_i];
	union {
		struct meminfo m;
		struct vmstat v;
		struct psi p;
		struct cgroup_paths c;
		uint64_t u;
	} out;
	int got = r->in ? parse_str(r->k, r->in, &out) : parse_buf(r->k, NULL, 0, NULL, &out);
	bool u64 = r->k == P_U64 || r->k == P_V2MAX || r->k == P_V1LIMIT;

	ck_assert_msg(got == r->rc, "row %d: %s on \"%s\" gave %d, want %d", _i, parser_names[r->k],
		      r->in ? r->in : "(NULL)", got, r->rc);
	if (u64 && got == 0)
		ck_assert_msg(out.u == r->value, "row %d: %s on \"%s\" read %llu, want %llu", _i, parser_names[r->k],
			      r->in, (unsigned long long)out.u, (unsigned long long)r->value);
}
END_TEST

START_TEST(test_meminfo_without_final_newline_ignores_last_line)
{
	struct meminfo m;

	ck_assert_int_eq(parse_str(P_MEMINFO, "MemTotal: 100 kB\nMemAvailable: 50 kB\n", &m), 0);
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

START_TEST(test_meminfo_largest_total_fits)
{
	struct meminfo m;

	ck_assert_int_eq(parse_str(P_MEMINFO, "MemTotal: 18014398509481983 kB\nMemAvailable: 1 kB\n", &m), 0);
	ck_assert_uint_eq(m.mem_total_bytes, 18014398509481983ull * 1024);
}
END_TEST

START_TEST(test_meminfo_bad_optional_field_is_dropped)
{
	struct meminfo m;

	ck_assert_int_eq(parse_str(P_MEMINFO,
				   "MemTotal: 100 kB\nMemAvailable: 50 kB\nSwapTotal: lots\n"
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

	ck_assert_int_eq(parse_str(P_MEMINFO,
				   "MemTotal: 100 kB\nMemAvailable: 50 kB\nHugePages_Total:     512\n"
				   "HugePages_Free:      100\nHugepagesize:    2048 kB\n",
				   &m),
			 0);
	ck_assert_uint_eq(m.hugepages_total_bytes, 512 * 2 * MIB);
	ck_assert_uint_eq(m.hugepages_free_bytes, 100 * 2 * MIB);
	/* Without a page size the counts mean nothing in bytes. */
	ck_assert_int_eq(parse_str(P_MEMINFO, "MemTotal: 100 kB\nMemAvailable: 50 kB\nHugePages_Total: 512\n", &m), 0);
	ck_assert_uint_eq(m.hugepages_total_bytes, 0);
}
END_TEST

START_TEST(test_vmstat_reads_both_counters)
{
	struct vmstat v;

	ck_assert_int_eq(parse_str(P_VMSTAT, "nr_free_pages 5\npswpin 7\npswpout 9\n", &v), 0);
	ck_assert_uint_eq(v.pswpin, 7);
	ck_assert_uint_eq(v.pswpout, 9);
}
END_TEST

START_TEST(test_psi_with_only_some_is_fine)
{
	struct psi p;

	ck_assert_int_eq(parse_str(P_PSI, "some avg10=1.50 avg60=2.25 avg300=0.01 total=123456\n", &p), 0);
	ck_assert(p.some.present);
	ck_assert(!p.full.present);
	ck_assert_double_eq_tol(p.some.avg10, 1.5, 1e-12);
	ck_assert_double_eq_tol(p.some.avg60, 2.25, 1e-12);
	ck_assert_double_eq_tol(p.some.avg300, 0.01, 1e-12);
	ck_assert_uint_eq(p.some.total_us, 123456);
}
END_TEST

START_TEST(test_psi_tolerates_unknown_fields_and_long_fractions)
{
	struct psi p;

	ck_assert_int_eq(parse_str(P_PSI,
				   "some avg10=12.3456789012345678901234 avg60=0 avg300=0 total=1 future=7\n"
				   "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
				   &p),
			 0);
	ck_assert_double_eq_tol(p.some.avg10, 12.3456789012, 1e-9);
	ck_assert(p.full.present);
}
END_TEST

START_TEST(test_self_cgroup_finds_v1_memory_and_v2)
{
	struct cgroup_paths c;

	ck_assert_int_eq(parse_str(P_CGROUP,
				   "12:cpu,cpuacct:/a\n3:name=memory:/fake\n4:blkio,memory:/job:with:colons\n"
				   "0::/user.slice\n",
				   &c),
			 0);
	ck_assert(c.has_v1_memory);
	ck_assert_str_eq(c.v1_memory, "/job:with:colons");
	ck_assert(c.has_v2);
	ck_assert_str_eq(c.v2, "/user.slice");

	ck_assert_int_eq(parse_str(P_CGROUP, "0::/\n", &c), 0);
	ck_assert(!c.has_v1_memory);
	ck_assert_str_eq(c.v2, "/");
}
END_TEST

START_TEST(test_self_cgroup_rejects_a_path_too_long)
{
	struct cgroup_paths c;
	char *big;
	size_t n = PRESSURE_CGROUP_PATH_MAX + 16;

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
		char *orig = fixture_read("proc", files[k], &orig_len);

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

static Suite *pressure_suite(void)
{
	Suite *s = suite_create("pressure");
	TCase *tc;

	CHECK_CASE(s, "fixtures", NULL, NULL, 10, test_idle_meminfo_gives_bytes, test_idle_vmstat_psi_and_cgroup_parse,
		   test_idle_fixture_is_normal, test_swapping_fixture_is_tight_with_swapout_rate,
		   test_near_oom_fixture_is_critical, test_no_psi_fixture_polls_meminfo_only,
		   test_cgroup_v1_fixture_limit_makes_it_critical, test_cgroup_v2_fixture_limit_makes_it_tight,
		   test_garbage_fixture_is_rejected, test_truncated_fixture_is_rejected_not_misread,
		   test_missing_fixture_has_no_meminfo);

	/* The random run takes about a second under ASan. */
	tc = CHECK_CASE(s, "hostile-input", NULL, NULL, 60, test_meminfo_without_final_newline_ignores_last_line,
			test_meminfo_reads_exactly_len_bytes, test_meminfo_largest_total_fits,
			test_meminfo_bad_optional_field_is_dropped, test_meminfo_hugepages_scale_by_page_size,
			test_vmstat_reads_both_counters, test_psi_with_only_some_is_fine,
			test_psi_tolerates_unknown_fields_and_long_fractions, test_self_cgroup_finds_v1_memory_and_v2,
			test_self_cgroup_rejects_a_path_too_long, test_random_buffers_never_crash_a_parser,
			test_mutated_fixtures_parse_to_sane_values_or_fail_cleanly,
			test_rate_of_counter_going_back_is_zero);
	tcase_add_loop_test(tc, test_parse_rows, 0, (int)(sizeof(parse_rows) / sizeof(parse_rows[0])));
	return s;
}

CHECK_MAIN(pressure_suite)

/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the monitor's readers (monitor-proc.c, monitor-cgroup.c): files below a proc root
 * kept open between polls, meminfo, the memory cgroup's walk and its binding limit. The expected
 * figures are the ones tests/fixtures/proc/README.md states for each fixture, written out here.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "monitor-int.h"
#include "check_main.h"

#define GiB (1024ull * 1024 * 1024)
/* The idle capture's MemTotal and MemAvailable (kB in the file). */
#define IDLE_TOTAL (24683548ull * 1024)
#define IDLE_AVAILABLE (24349520ull * 1024)

static char buf[READ_BUF_BYTES];

static int open_root(const char *fixture)
{
	char path[1024];
	int fd;

	snprintf(path, sizeof(path), "%s/proc/%s", FIXTURES_DIR, fixture);
	fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	ck_assert_msg(fd >= 0, "cannot open fixture %s: %s", path, strerror(errno));
	return fd;
}

/* A scratch proc root with one file, proc/meminfo, holding text. */
static int scratch_root(char *dir, size_t cap, const char *text)
{
	char path[1100];
	FILE *f;
	int fd;

	snprintf(dir, cap, "/tmp/pb-check-monitor.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/proc", dir);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	snprintf(path, sizeof(path), "%s/proc/meminfo", dir);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
	fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	return fd;
}

static void scratch_write(const char *dir, const char *name, const char *text)
{
	char path[1100];
	FILE *f;

	snprintf(path, sizeof(path), "%s/proc/%s", dir, name);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
}

static void scratch_remove(const char *dir)
{
	char cmd[1200];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
}

START_TEST(read_rel_reads_and_reports_missing)
{
	int root = open_root("idle");
	size_t len = 0;

	ck_assert_int_eq(mon_read_rel(root, MEMINFO_REL, buf, sizeof(buf), &len), 0);
	ck_assert_uint_gt(len, 0);
	ck_assert_msg(strncmp(buf, "MemTotal:", 9) == 0, "meminfo starts with MemTotal");
	ck_assert(mon_exists_rel(root, MEMINFO_REL));
	ck_assert(!mon_exists_rel(root, "proc/no-such-file"));
	ck_assert_int_eq(mon_read_rel(root, "proc/no-such-file", buf, sizeof(buf), &len), -ENOENT);
	close(root);
}
END_TEST

/* A kept-open file that a fixture replaces by rename(2) is read anew, not from the old inode. */
START_TEST(src_read_follows_a_replaced_file)
{
	char dir[64], from[1100], to[1100];
	struct src_file f;
	size_t len = 0;
	int root = scratch_root(dir, sizeof(dir), "first\n");

	mon_src_init(&f, false);
	ck_assert_int_eq(mon_src_read(root, &f, MEMINFO_REL, buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, 6);
	ck_assert_int_eq(memcmp(buf, "first\n", 6), 0);
	ck_assert_int_ge(f.fd, 0);

	scratch_write(dir, "meminfo.new", "second, longer\n");
	snprintf(from, sizeof(from), "%s/proc/meminfo.new", dir);
	snprintf(to, sizeof(to), "%s/proc/meminfo", dir);
	ck_assert_int_eq(rename(from, to), 0);
	ck_assert_int_eq(mon_src_read(root, &f, MEMINFO_REL, buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, 15);
	ck_assert_int_eq(memcmp(buf, "second, longer\n", 15), 0);

	/* Gone: an error, the file closed, and the next read after it comes back opens it again. */
	ck_assert_int_eq(unlink(to), 0);
	ck_assert_int_eq(mon_src_read(root, &f, MEMINFO_REL, buf, sizeof(buf), &len), -ENOENT);
	ck_assert_int_eq(f.fd, -1);
	scratch_write(dir, "meminfo", "third\n");
	ck_assert_int_eq(mon_src_read(root, &f, MEMINFO_REL, buf, sizeof(buf), &len), 0);
	ck_assert_int_eq(memcmp(buf, "third\n", 6), 0);

	mon_src_close(&f);
	ck_assert_int_eq(f.fd, -1);
	close(root);
	scratch_remove(dir);
}
END_TEST

/*
 * A meminfo longer than the buffer is read up to the buffer's end, and a field whose number the end
 * cuts is refused (a cut "MemAvailable: 5000000" would read as 50 kB), never taken in part.
 */
START_TEST(meminfo_cut_by_the_buffer_is_refused)
{
	static const char tail[] = "MemAvailable: 5000000 kB\n";
	size_t cap = READ_BUF_BYTES + sizeof(tail), head, pad;
	char dir[64], *big = malloc(cap);
	struct src_file f;
	struct meminfo m;
	size_t len = 0;
	int root;

	ck_assert_ptr_nonnull(big);
	head = (size_t)snprintf(big, cap, "MemTotal: 8000000 kB\nPad: ");
	/* The buffer ends two digits into MemAvailable's number: "MemAvailable: 50". */
	pad = READ_BUF_BYTES - head - strlen("\nMemAvailable: 50");
	memset(big + head, '7', pad);
	snprintf(big + head + pad, cap - head - pad, "\n%s", tail);
	root = scratch_root(dir, sizeof(dir), big);
	mon_src_init(&f, false);
	ck_assert_int_eq(mon_src_read(root, &f, MEMINFO_REL, buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, sizeof(buf));
	ck_assert_int_eq(memcmp(buf + sizeof(buf) - 16, "MemAvailable: 50", 16), 0);
	ck_assert_int_eq(mon_read_meminfo(root, &f, &m, buf), -EBADMSG);
	mon_src_close(&f);
	close(root);
	scratch_remove(dir);
	free(big);
}
END_TEST

static const struct {
	const char *fixture;
	int err;
	uint64_t total, available;
} meminfo_cases[] = {
	{ "idle", 0, IDLE_TOTAL, IDLE_AVAILABLE },
	{ "near-oom", 0, IDLE_TOTAL, 740506ull * 1024 },
	{ "garbage", -EBADMSG, 0, 0 },
	{ "truncated", -EBADMSG, 0, 0 },
	{ "missing", -ENOENT, 0, 0 },
};

START_TEST(meminfo_per_fixture)
{
	struct meminfo m;
	struct src_file f;
	int root = open_root(meminfo_cases[_i].fixture);

	memset(&m, 0, sizeof(m));
	mon_src_init(&f, false);
	ck_assert_int_eq(mon_read_meminfo(root, &f, &m, buf), meminfo_cases[_i].err);
	if (meminfo_cases[_i].err == 0) {
		ck_assert_uint_eq(m.mem_total_bytes, meminfo_cases[_i].total);
		ck_assert_uint_eq(m.mem_available_bytes, meminfo_cases[_i].available);
		ck_assert(m.have & MEMINFO_MEM_TOTAL);
		ck_assert(m.have & MEMINFO_MEM_AVAILABLE);
	}
	mon_src_close(&f);
	close(root);
}
END_TEST

START_TEST(cgroup_resolve_v1_v2_none)
{
	/* A fixture, the kind of its memory cgroup, and (when there is one) its mount and the process's folder. */
	static const struct {
		const char *fixture;
		int kind;
		const char *mount, *dir;
	} rows[] = {
		{ "cgroup-v1", CG_V1, "sys/fs/cgroup/memory", "sys/fs/cgroup/memory/pinbroker/job" },
		{ "cgroup-v2", CG_V2, "sys/fs/cgroup", "sys/fs/cgroup/system.slice/pinbrokerd.service" },
		{ "no-psi", CG_NONE, NULL, NULL },
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct cg_loc loc;
		int root = open_root(rows[i].fixture);

		mon_cg_resolve(root, &loc, buf);
		ck_assert_int_eq(loc.kind, rows[i].kind);
		if (rows[i].mount) {
			ck_assert_str_eq(loc.mount, rows[i].mount);
			ck_assert_str_eq(loc.dir, rows[i].dir);
		}
		close(root);
	}
}
END_TEST

/* The binding limit is the leaf's (8 GiB on v1 under an unlimited parent; 4 GiB on v2 under "max"). */
static const struct {
	const char *fixture;
	uint64_t limit, usage, reclaimable;
} cgroup_cases[] = {
	{ "cgroup-v1", 8 * GiB, 8321499136ull, 53687091ull },
	{ "cgroup-v2", 4 * GiB, 4026531840ull, 53687091ull },
};

START_TEST(cgroup_read_binding_limit)
{
	struct cg_src *cg = calloc(1, sizeof(*cg));
	struct cg_reading r;
	int root = open_root(cgroup_cases[_i].fixture);

	ck_assert_ptr_nonnull(cg);
	mon_cg_resolve(root, &cg->loc, buf);
	mon_cg_levels_init(cg);
	ck_assert_uint_ge(cg->nlevels, 2);
	memset(&r, 0, sizeof(r));
	ck_assert_int_eq(mon_cg_read(root, cg, 1000, true, &r, buf), 0);
	ck_assert(r.have_limit);
	ck_assert_uint_eq(r.limit_bytes, cgroup_cases[_i].limit);
	ck_assert_uint_eq(r.usage_bytes, cgroup_cases[_i].usage);
	ck_assert_uint_eq(r.reclaimable_bytes, cgroup_cases[_i].reclaimable);
	/* Read again without refreshing the limits: the same figures from the kept-open files. */
	memset(&r, 0, sizeof(r));
	ck_assert_int_eq(mon_cg_read(root, cg, 2000, false, &r, buf), 0);
	ck_assert_uint_eq(r.limit_bytes, cgroup_cases[_i].limit);
	ck_assert_uint_eq(r.usage_bytes, cgroup_cases[_i].usage);
	mon_cg_close(cg);
	close(root);
	free(cg);
}
END_TEST

START_TEST(read_host_per_fixture)
{
	char root[1024];
	struct monitor_host h;

	snprintf(root, sizeof(root), "%s/proc/idle", FIXTURES_DIR);
	memset(&h, 0xff, sizeof(h));
	ck_assert_int_eq(monitor_read_host(root, &h), 0);
	ck_assert_uint_eq(h.mem_total_bytes, IDLE_TOTAL);
	ck_assert_uint_eq(h.mem_available_bytes, IDLE_AVAILABLE);
	/* The idle capture's v1 limit is PAGE_COUNTER_MAX: no limit. */
	ck_assert_uint_eq(h.cgroup_limit_bytes, 0);

	snprintf(root, sizeof(root), "%s/proc/cgroup-v2", FIXTURES_DIR);
	ck_assert_int_eq(monitor_read_host(root, &h), 0);
	ck_assert_uint_eq(h.cgroup_limit_bytes, 4 * GiB);
	ck_assert_uint_eq(h.cgroup_usage_bytes, 4026531840ull);

	snprintf(root, sizeof(root), "%s/proc/garbage", FIXTURES_DIR);
	ck_assert_int_eq(monitor_read_host(root, &h), -EBADMSG);
	snprintf(root, sizeof(root), "%s/proc/missing", FIXTURES_DIR);
	ck_assert_int_eq(monitor_read_host(root, &h), -ENOENT);
}
END_TEST

static Suite *monitor_readers_suite(void)
{
	Suite *s = suite_create("monitor_readers");
	TCase *tc = tcase_create("readers");

	tcase_add_test(tc, read_rel_reads_and_reports_missing);
	tcase_add_test(tc, src_read_follows_a_replaced_file);
	tcase_add_test(tc, meminfo_cut_by_the_buffer_is_refused);
	tcase_add_loop_test(tc, meminfo_per_fixture, 0, sizeof(meminfo_cases) / sizeof(meminfo_cases[0]));
	tcase_add_test(tc, cgroup_resolve_v1_v2_none);
	tcase_add_loop_test(tc, cgroup_read_binding_limit, 0, sizeof(cgroup_cases) / sizeof(cgroup_cases[0]));
	tcase_add_test(tc, read_host_per_fixture);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(monitor_readers_suite)

/* SPDX-License-Identifier: MIT */
/*
 * Integration: chunk size classes on the real daemon (issue 27). A lease is made of the fewest chunks of
 * classes 2 MiB to 1 GiB, so its fds and mappings grow with the log of its size, and a terabyte budget fits a
 * default host (vm.max_map_count 65,530, LimitNOFILE 65,536). Shown in simulation (PB_SIMULATE_ENV): the daemon
 * leaves its chunks unpopulated and unlocked and the library maps them without populating, so a 1 TiB pool
 * and a 700 GiB lease fit a small test host. The expected counts come from the issue: 700 GiB of 1 GiB
 * chunks is 700 of them, against 358,400 chunks of 2 MiB before.
 */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "itest.h"
#include "pinbroker.h"
#include "wire.h"

#define KiB 1024ull
#define MiB (1024ull * KiB)
#define GiB (1024ull * MiB)
#define TiB (1024ull * GiB)
/* Classes 2M, 4M, ..., 1G: ten of them. */
#define NCLASSES 10
/* The default host's fd limit (systemd's LimitNOFILE of the shipped unit is higher; containers' often this). */
#define DEFAULT_NOFILE 65536
/* What a process has open or mapped besides chunks: the loop, /proc files, libraries, stacks, arenas. */
#define OWN_FDS 128
#define OWN_MAPS 512

static struct daemon d;

/* /proc/PID/fd entries. */
static size_t count_fds(pid_t pid)
{
	char path[64];
	struct dirent *e;
	size_t n = 0;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	dir = opendir(path);
	ck_assert_ptr_nonnull(dir);
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	return n;
}

/* /proc/PID/maps lines: one per mapping (VMA). */
static size_t count_maps(pid_t pid)
{
	char path[64];
	size_t n = 0;
	FILE *f;
	int ch;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "re");
	ck_assert_ptr_nonnull(f);
	while ((ch = fgetc(f)) != EOF)
		n += ch == '\n';
	fclose(f);
	return n;
}

/* /proc/PID/maps lines of chunk memfds: a lease's mappings, and no allocator's (ASan maps its own as it goes). */
static size_t count_chunk_maps(pid_t pid)
{
	char path[64], line[512];
	size_t n = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "re");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, "pinbroker-chunk") != NULL;
	fclose(f);
	return n;
}

/* The default host's fd limit in the daemon, where this test may set it (root may raise the hard limit). */
static void child_default_host(void *ud)
{
	struct rlimit rl = { DEFAULT_NOFILE, DEFAULT_NOFILE };

	(void)ud;
	(void)setrlimit(RLIMIT_NOFILE, &rl);
	setenv(PB_SIMULATE_ENV, "1", 1);
}

static void start_simulated(void)
{
	static const char *const args[] = {
		"--budget", "1T", "--uid-quota", "100%", "--prewarm", "1T", "--max-no-revoke-per-uid", "100%", NULL
	};

	daemon_prepare(&d);
	daemon_restart_with(&d, args, child_default_host, NULL);
	setenv(PB_SIMULATE_ENV, "1", 1);
}

static void stop_daemon(void)
{
	unsetenv(PB_SIMULATE_ENV);
	ck_assert_int_eq(daemon_stop(&d), 0);
}

START_TEST(test_terabyte_budget_and_700g_lease_cost_hundreds_of_fds_and_mappings)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA, .label = "kv-offload" };
	struct pb_status *s;
	const struct pb_lease_info *row;
	size_t maps_before, maps_after, lease_chunks;
	pb_client *c = NULL;
	pb_lease *l = NULL;
	char *log;

	/* Warm before anything is asked: 1 TiB of unpopulated chunks, carved like the default prewarm would be. */
	ck_assert_msg(daemon_wait_log(&d, "pool warmed", 60000), "the 1 TiB pool did not warm:\n%s",
		      daemon_log_excerpt(&d));
	/* The whole log of this start: a slow (sanitizer) build logs enough while it warms to push the plan out of
	 * an excerpt. */
	log = daemon_log(&d);
	ck_assert_ptr_nonnull(log);
	ck_assert_int_ge((long)strlen(log), d.log_from);
	ck_assert_msg(!strstr(log + d.log_from, "warning: "),
		      "a 1 TiB budget on a default host started with a warning:\n%s", itest_tail(log + d.log_from));
	ck_assert_msg(strstr(log + d.log_from, "chunk classes 2 MiB to 1 GiB (10)"), "no chunk plan at start:\n%s",
		      itest_tail(log + d.log_from));
	free(log);
	s = itest_status(d.socket);
	ck_assert_uint_eq(s->budget_bytes, TiB);
	ck_assert_uint_eq(s->chunk_size_bytes, 2 * MiB);
	ck_assert_uint_eq(s->chunk_max_bytes, GiB);
	ck_assert_uint_ge(s->pool_idle_bytes, TiB);
	pb_status_free(s);
	/* The pool: about 1,024 chunks of 1 GiB and 64 of 2 MiB, where 2 MiB chunks alone would be 524,288. */
	ck_assert_uint_le(count_fds(d.pid), TiB / GiB + 64 + NCLASSES + OWN_FDS);
	ck_assert_uint_le(count_maps(d.pid), TiB / GiB + 64 + NCLASSES + OWN_MAPS);

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	maps_before = count_chunk_maps(getpid());
	ck_assert_int_eq(pb_acquire(c, 700 * GiB, &o, &l), 0);
	maps_after = count_chunk_maps(getpid());
	/* Exact: the request, page-rounded (it is), never rounded to a chunk or a power of two. */
	ck_assert_uint_eq(pb_lease_size(l), 700 * GiB);
	s = itest_status(d.socket);
	ck_assert_uint_eq(s->leased_bytes, 700 * GiB);
	ck_assert_uint_eq(s->pool_bytes - s->pool_idle_bytes, 700 * GiB);
	row = itest_lease_row(s, pb_lease_id(l));
	ck_assert_ptr_nonnull(row);
	ck_assert_uint_eq(row->bytes, 700 * GiB);
	pb_status_free(s);
	/*
	 * The client maps one range per chunk: 700 chunks of 1 GiB, within the logarithmic bound of whole largest
	 * chunks, one per smaller class and one tail (358,400 mappings of 2 MiB chunks before classes).
	 */
	lease_chunks = maps_after - maps_before;
	fprintf(stderr,
		"itest_classes: 700 GiB lease: %zu client mappings; daemon %zu fds, %zu mappings (1 TiB pool)\n",
		lease_chunks, count_fds(d.pid), count_maps(d.pid));
	ck_assert_uint_le(lease_chunks, 700 + NCLASSES + 1);
	ck_assert_uint_ge(lease_chunks, 700);
	/* The daemon: its pool, less nothing (the lease's chunks were idle ones), within the same bound. */
	ck_assert_uint_le(count_fds(d.pid), TiB / GiB + 64 + NCLASSES + OWN_FDS);
	ck_assert_uint_le(count_maps(d.pid), TiB / GiB + 64 + NCLASSES + OWN_MAPS);

	ck_assert_int_eq(pb_release(c, l), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
	pb_disconnect(c);
}
END_TEST

/* A lease of three sizes of chunk (raw, so the fds can be looked at): each is sealed at its class's size. */
START_TEST(test_lease_of_several_classes_is_exact_in_its_fds)
{
	/* 96 GiB + 6 MiB + 12 KiB: 96 x 1G, 4M, 2M and a 12K tail. */
	uint64_t want = 96 * GiB + 6 * MiB + 12 * KiB, sum = 0, id;
	int fd, fds[128];
	size_t nfds;

	fd = raw_connect(d.socket);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(raw_hello(fd), 0);
	ck_assert_int_eq(raw_acquire(fd, want, &id, fds, 128, &nfds), 0);
	ck_assert_uint_eq(nfds, 96 + 3);
	for (size_t i = 0; i < nfds; i++) {
		struct stat st;

		ck_assert_int_eq(fstat(fds[i], &st), 0);
		/* Largest first, the tail last; nothing faulted (simulation). */
		ck_assert_uint_eq((uint64_t)st.st_size, i < 96    ? GiB
							: i == 96 ? 4 * MiB
							: i == 97 ? 2 * MiB
								  : 12 * KiB);
		ck_assert_int_eq(st.st_blocks, 0);
		sum += (uint64_t)st.st_size;
		close(fds[i]);
	}
	ck_assert_uint_eq(sum, want);
	ck_assert_int_eq(raw_release(fd, id), 0);
	close(fd);
}
END_TEST

ITEST_FIXTURE_START(start_real, d, ITEST_ARGS("--budget", "64M", "--prewarm", "0", "--thp", "no"))

/*
 * Real memory, default classes: the library maps chunks of 4 MiB, 2 MiB and a 8 KiB tail back to back into one
 * range, each a mapping of its own memfd, and every byte of the range is the lease's (writes read back).
 */
START_TEST(test_library_maps_chunks_of_several_sizes_back_to_back)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA, .label = "mixed" };
	uint64_t want = 6 * MiB + 8 * KiB, sizes[] = { 4 * MiB, 2 * MiB, 8 * KiB };
	uintptr_t at, end;
	unsigned char *p;
	pb_client *c = NULL;
	pb_lease *l = NULL;
	char line[512];
	size_t k = 0;
	FILE *f;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_acquire(c, want, &o, &l), 0);
	ck_assert_uint_eq(pb_lease_size(l), want);
	p = pb_lease_data(l);
	for (uint64_t i = 0; i < want; i += 4 * KiB)
		p[i] = (unsigned char)(i / (4 * KiB));
	for (uint64_t i = 0; i < want; i += 4 * KiB)
		ck_assert_uint_eq(p[i], (unsigned char)(i / (4 * KiB)));
	/* The range's mappings, in address order: one per chunk, each as long as its chunk. */
	f = fopen("/proc/self/maps", "re");
	ck_assert_ptr_nonnull(f);
	at = (uintptr_t)p;
	while (fgets(line, sizeof(line), f) && k < 3) {
		uintptr_t lo, hi;

		if (sscanf(line, "%lx-%lx", &lo, &hi) != 2 || lo != at)
			continue;
		ck_assert_msg(strstr(line, "pinbroker-chunk"), "not a chunk memfd: %s", line);
		ck_assert_uint_eq(hi - lo, sizes[k]);
		at = hi;
		k++;
	}
	fclose(f);
	end = (uintptr_t)p + want;
	ck_assert_uint_eq(k, 3);
	ck_assert_uint_eq(at, end);
	ck_assert_int_eq(pb_release(c, l), 0);
	pb_disconnect(c);
}
END_TEST

/* nr_hugepages before the hugetlb case (read by the parent), given back after it by the parent, also when
 * the test failed (a checked teardown does not run then). */
static long hugepages_before = -1;

static long read_long(const char *path, const char *key)
{
	char line[256];
	long v = -1;
	FILE *f = fopen(path, "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (key ? strncmp(line, key, strlen(key)) == 0 && sscanf(line + strlen(key), " %ld", &v) == 1
			: sscanf(line, "%ld", &v) == 1)
			break;
	fclose(f);
	return v;
}

static int write_long(const char *path, long v)
{
	FILE *f = fopen(path, "we");
	int r;

	if (!f)
		return -errno;
	r = fprintf(f, "%ld\n", v) > 0 ? 0 : -EIO;
	return fclose(f) == 0 ? r : -errno;
}

#define NR_HUGEPAGES "/proc/sys/vm/nr_hugepages"

/* Exactly the 64 MiB the pool warms (32 huge pages of 2 MiB): the daemon holds every huge page there is. */
static void start_hugetlb_full(void)
{
	ck_assert_int_eq(write_long(NR_HUGEPAGES, 32), 0);
	ck_assert_int_eq(read_long("/proc/meminfo", "HugePages_Free:"), 32);
	daemon_start(&d, ITEST_ARGS("--budget", "64M", "--prewarm", "64M", "--hugetlb", "yes"));
}

static void restore_hugepages(void)
{
	if (hugepages_before >= 0)
		write_long(NR_HUGEPAGES, hugepages_before);
}

/*
 * A class the warm pool lacks, with every huge page held by idle chunks of other classes: the pool gives back
 * idle chunks the lease does not use and makes the missing one. The lease the budget allows is granted
 * (before, the fresh 4 MiB chunk found no huge page and the acquire was refused as "budget exhausted"; the
 * pinned DataLoader's second ring on the H200 was), its bytes exact, and nothing is counted twice.
 */
START_TEST(test_missing_class_on_a_full_hugetlb_pool_is_made_from_idle_memory)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA, .label = "ring" };
	struct pb_status *s = NULL;
	pb_client *c = NULL;
	pb_lease *l = NULL;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_status_query(c, 0, &s), 0);
	ck_assert_uint_eq(s->pool_idle_bytes, 64 * MiB);
	ck_assert_uint_eq(s->hugetlb_bytes, 64 * MiB);
	pb_status_free(s);
	ck_assert_int_eq(read_long("/proc/meminfo", "HugePages_Free:"), 0);
	/* The warm carving (an eighth in 2 MiB chunks, the rest 32M + 16M + 8M) has no 4 MiB chunk. */
	ck_assert_msg(pb_acquire(c, 4 * MiB + 2 * MiB, &o, &l) == 0, "refused: %s", pb_last_error());
	ck_assert_uint_eq(pb_lease_size(l), 6 * MiB);
	memset(pb_lease_data(l), 0x5a, 6 * MiB);
	ck_assert_int_eq(pb_status_query(c, 0, &s), 0);
	ck_assert_uint_eq(s->leased_bytes, 6 * MiB);
	ck_assert_uint_le(s->pool_bytes, 64 * MiB); /* idle memory went, as much as the new chunk took */
	ck_assert_uint_eq(s->pool_bytes - s->pool_idle_bytes, 6 * MiB);
	pb_status_free(s);
	ck_assert_int_eq(pb_release(c, l), 0);
	pb_disconnect(c);
}
END_TEST

/*
 * Another uid's idle chunks of the very classes a lease needs (not reused across uids, for privacy) hold every
 * huge page: the chunks the lease's fresh ones replace go first, so its memory comes out of them. Before, only
 * classes the lease did not use were given back, and uid 61001 was refused 56 MiB of a 64 MiB pool that root
 * had used and given back.
 */
START_TEST(test_other_uids_idle_chunks_of_the_lease_classes_make_room_on_a_full_hugetlb_pool)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE, .label = "ring" };
	pb_client *c = NULL;
	pb_lease *l = NULL;
	int status = 0;
	pid_t pid;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_msg(pb_acquire(c, 56 * MiB, &o, &l) == 0, "root refused: %s", pb_last_error());
	ck_assert_int_eq(pb_release(c, l), 0);
	pb_disconnect(c);
	ck_assert_int_eq(read_long("/proc/meminfo", "HugePages_Free:"), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		itest_drop_to(61001);
		if (pb_connect(d.socket, &c) < 0)
			_exit(2);
		if (pb_acquire(c, 56 * MiB, &o, &l) < 0) {
			fprintf(stderr, "uid 61001 refused: %s\n", pb_last_error());
			_exit(1);
		}
		_exit(pb_lease_size(l) == 56 * MiB ? 0 : 3);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "uid 61001's 56 MiB: exit status %d", status);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("itest_classes");
	int hp_err;

	CHECK_CASE(s, "simulated-terabyte", start_simulated, stop_daemon, 240,
		   test_terabyte_budget_and_700g_lease_cost_hundreds_of_fds_and_mappings,
		   test_lease_of_several_classes_is_exact_in_its_fds);
	CHECK_CASE(s, "real", start_real, stop_daemon, 60, test_library_maps_chunks_of_several_sizes_back_to_back);
	hugepages_before = read_long(NR_HUGEPAGES, NULL);
	/* Writing the value it has changes nothing, and tells whether this root may write it at all. */
	hp_err = geteuid() != 0 ? 0 : hugepages_before < 0 ? -EIO : write_long(NR_HUGEPAGES, hugepages_before);
	if (geteuid() != 0)
		check_skip("the full-hugetlb case needs root to set %s", NR_HUGEPAGES);
	else if (hp_err == -EROFS)
		check_skip(
			"the full-hugetlb case sets %s, which is read-only here although this runs as root "
			"(/proc/sys mounted read-only, as in a container; a privileged one, or a host, can write it)",
			NR_HUGEPAGES);
	else if (hp_err < 0)
		check_skip("the full-hugetlb case sets %s, which root cannot write here: %s", NR_HUGEPAGES,
			   strerror(-hp_err));
	else {
		TCase *tc = CHECK_CASE(
			s, "hugetlb-full", start_hugetlb_full, stop_daemon, 60,
			test_missing_class_on_a_full_hugetlb_pool_is_made_from_idle_memory,
			test_other_uids_idle_chunks_of_the_lease_classes_make_room_on_a_full_hugetlb_pool);

		tcase_add_unchecked_fixture(tc, NULL, restore_hugepages);
	}
	return s;
}

CHECK_MAIN(suite)

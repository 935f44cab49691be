/* SPDX-License-Identifier: MIT */
/* Unit tests for holders: the maps and status parsers on captured and crafted /proc text, and the scan on real child processes and on fake proc roots. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "holders.h"
#include "holders-fdinfo.h"
#include "check_main.h"
#include "fixture.h"

/* A fixture of tests/fixtures/holders/, exactly its size (fixture.h). */
static char *slurp(const char *rel, size_t *len)
{
	return fixture_read("holders", rel, len);
}

/* The key capture.py recorded under label ("memfd", "spaces", ...). */
static struct holder_key captured_key(const char *label)
{
	char path[1024], name[64];
	unsigned maj, min;
	unsigned long long ino;
	FILE *f;

	snprintf(path, sizeof(path), "%s/holders/keys-captured", FIXTURES_DIR);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	while (fscanf(f, "%63s %u:%u %llu", name, &maj, &min, &ino) == 4)
		if (strcmp(name, label) == 0) {
			fclose(f);
			return (struct holder_key){ .dev = makedev(maj, min), .ino = (ino_t)ino };
		}
	fclose(f);
	ck_abort_msg("no key %s in keys-captured", label);
	return (struct holder_key){ 0 };
}

static int maps_str(const char *s, const struct holder_key *keys, size_t nkeys, size_t *consumed)
{
	size_t n;
	char *b = fixture_exact(s, &n);
	int r = holders_parse_maps(b, n, keys, nkeys, consumed);

	free(b);
	return r;
}

START_TEST(test_maps_captured_finds_memfd_by_dev_and_inode)
{
	struct holder_key k[1] = { captured_key("memfd") };
	size_t len, used;
	char *buf = slurp("maps-captured", &len);

	ck_assert_int_eq(holders_parse_maps(buf, len, k, 1, &used), 0);
	free(buf);
}
END_TEST

START_TEST(test_maps_captured_lookalike_names_never_match_the_memfd)
{
	struct holder_key m = captured_key("memfd"), other = captured_key("other-memfd"),
			  fake = captured_key("deleted-lookalike");
	/* The memfd's inode on the disk's dev, and the look-alike's inode on the memfd's dev. */
	struct holder_key k[2] = { { .dev = fake.dev, .ino = m.ino }, { .dev = m.dev, .ino = fake.ino } };
	size_t len;
	char *buf = slurp("maps-captured", &len);

	holders_sort_keys(k, 2);
	ck_assert_int_eq(holders_parse_maps(buf, len, k, 2, NULL), -ENOENT);
	/* Same name, same dev, other inode: another lease's chunk. */
	ck_assert_int_eq(holders_parse_maps(buf, len, &other, 1, NULL), 0);
	ck_assert(other.ino != m.ino);
	free(buf);
}
END_TEST

START_TEST(test_maps_captured_odd_names_parse_by_their_columns)
{
	static const char *const labels[] = { "deleted-lookalike", "spaces", "fake-deleted", "newline", "memfd" };
	struct holder_key k[5];
	size_t len, used;
	char *buf = slurp("maps-captured", &len);

	/* Each file is found by its own (dev, inode), whatever its name does to the path column. */
	for (size_t i = 0; i < 5; i++) {
		k[0] = captured_key(labels[i]);
		ck_assert_msg(holders_parse_maps(buf, len, k, 1, &used) == 0, "%s not found", labels[i]);
	}
	/* Several keys: the index is into the sorted array. */
	for (size_t i = 0; i < 5; i++)
		k[i] = captured_key(labels[i]);
	holders_sort_keys(k, 5);
	ck_assert_int_ge(holders_parse_maps(buf, len, k, 5, NULL), 0);
	free(buf);
}
END_TEST

START_TEST(test_maps_truncated_last_line_is_not_trusted)
{
	struct holder_key m = captured_key("memfd");
	struct holder_key cut = { .dev = m.dev, .ino = m.ino / 10 }; /* what the cut line reads as */
	size_t len, used;
	char *buf = slurp("maps-truncated", &len), *more;

	ck_assert_int_eq(holders_parse_maps(buf, len, &m, 1, &used), -ENOENT);
	ck_assert_int_eq(holders_parse_maps(buf, len, &cut, 1, &used), -ENOENT);
	/* Everything up to the last newline is consumed; the fragment stays for the next read. */
	ck_assert_uint_lt(used, len);
	ck_assert_int_eq(buf[used - 1], '\n');
	ck_assert_ptr_null(memchr(buf + used, '\n', len - used));
	/* The next read completes the line: now it is the memfd. */
	more = malloc(len - used + 2);
	ck_assert_ptr_nonnull(more);
	memcpy(more, buf + used, len - used);
	more[len - used] = (char)('0' + (int)(m.ino % 10));
	more[len - used + 1] = '\n';
	ck_assert_int_eq(holders_parse_maps(more, len - used + 2, &m, 1, &used), 0);
	free(more);
	free(buf);
}
END_TEST

START_TEST(test_maps_streamed_in_small_pieces_finds_the_memfd)
{
	struct holder_key m = captured_key("memfd");
	size_t len, have = 0, used, off = 0, step = 1;
	char *buf = slurp("maps-captured", &len), *win = malloc(len);
	int r = -ENOENT;

	/* As holders_find reads: append a piece, parse complete lines, keep the rest. */
	ck_assert_ptr_nonnull(win);
	while (off < len && r < 0) {
		size_t take = step < len - off ? step : len - off;

		memcpy(win + have, buf + off, take);
		have += take;
		off += take;
		step = step * 3 % 97 + 1;
		r = holders_parse_maps(win, have, &m, 1, &used);
		memmove(win, win + used, have - used);
		have -= used;
	}
	ck_assert_int_eq(r, 0);
	free(win);
	free(buf);
}
END_TEST

START_TEST(test_maps_garbage_lines_are_skipped)
{
	struct holder_key k = { .dev = makedev(0, 1), .ino = 1607 }, zero = { .dev = makedev(0, 0), .ino = 0 };
	static const char *const bad[] = {
		"\n",
		"garbage\n",
		"7f00-7f01 rw-s 00000000 zz:01 1607 /memfd:x (deleted)\n",          /* dev not hex */
		"7f00-7f01 rw-s 00000000 00:01\n",                                  /* no inode */
		"7f00-7f01 rw-s 00000000 00:01 1607x /memfd:x\n",                   /* inode not a number */
		"7f00-7f01 rw-s 00000000 00:01 99999999999999999999999 /memfd:x\n", /* overflows */
		"7f00-7f01 rw-s 00000000 0001 1607 /memfd:x\n",                     /* no colon */
		"7f00-7f01 rw-s 00:01 1607\n",                                      /* a column missing */
		"7f00-7f01 rw-s 00000000 00:01 -1607 /memfd:x\n",
		"\0\0\0\0\0\0\n",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(maps_str(bad[i], &k, 1, NULL) == -ENOENT, "matched: %s", bad[i]);
	/* Anonymous memory (inode 0) never matches, even a zero key. */
	ck_assert_int_eq(maps_str("7f00-7f01 rw-p 00000000 00:00 0 \n", &zero, 1, NULL), -ENOENT);
	ck_assert_int_eq(maps_str("7f00-7f01 rw-p 00000000 00:00 0\n", &zero, 1, NULL), -ENOENT);
	/* After the garbage, a good line still counts; so does a private mapping, and a line with no path. */
	ck_assert_int_eq(maps_str("garbage\n7f00-7f01 rw-s 00000000 00:01 1607  /memfd:x (deleted)\n", &k, 1, NULL), 0);
	ck_assert_int_eq(maps_str("7f00-7f01 r--p 00001000 00:01 1607\n", &k, 1, NULL), 0);
	ck_assert_int_eq(maps_str("", &k, 1, NULL), -ENOENT);
	ck_assert_int_eq(maps_str("7f00-7f01 rw-s 00000000 00:01 1607 /memfd:x\n", &k, 0, NULL), -ENOENT);
}
END_TEST

static int fdinfo_str(const char *text, int *mnt, uint64_t *ino)
{
	return holders_parse_fdinfo(text, strlen(text), mnt, ino);
}

/* fdinfo as Linux 6.1 writes it for a memfd (fs/proc/fd.c seq_show), and as kernels before 5.14 did (no ino:). */
START_TEST(test_fdinfo_mount_and_inode_parse_and_old_kernels_fail)
{
	static const char v61[] = "pos:\t0\nflags:\t02100002\nmnt_id:\t15\nino:\t1025\n";
	static const char v54[] = "pos:\t0\nflags:\t02100002\nmnt_id:\t15\n";
	static const char sock[] = "pos:\t0\nflags:\t02000002\nmnt_id:\t10\nino:\t34383\nscm_fds: 0\n";
	uint64_t ino = 0;
	int mnt = -1;

	ck_assert_int_eq(holders_parse_fdinfo(v61, strlen(v61), &mnt, &ino), 0);
	ck_assert_int_eq(mnt, 15);
	ck_assert_uint_eq(ino, 1025);
	ck_assert_int_eq(holders_parse_fdinfo(sock, strlen(sock), &mnt, &ino), 0);
	ck_assert_int_eq(mnt, 10);
	ck_assert_uint_eq(ino, 34383);
	ck_assert_int_eq(holders_parse_fdinfo(v54, strlen(v54), &mnt, &ino), -EBADMSG);
	ck_assert_int_eq(fdinfo_str("mnt_id:\tx\nino:\t1\n", &mnt, &ino), -EBADMSG);
	ck_assert_int_eq(fdinfo_str("mnt_id:\t99999999999\nino:\t1\n", &mnt, &ino), -EBADMSG);
	/* An unterminated last line is not read. */
	ck_assert_int_eq(fdinfo_str("mnt_id:\t1\nino:\t1", &mnt, &ino), -EBADMSG);
	ck_assert_int_eq(holders_parse_fdinfo("", 0, &mnt, &ino), -EBADMSG);
}
END_TEST

/*
 * The probe covers the mount of a memfd made as the pool makes a hugetlb chunk (MFD_HUGE_2MB, pool-chunk.c):
 * each page size has a hugetlbfs mount of its own, and a host booted with default_hugepagesz=1G puts a plain
 * MFD_HUGETLB probe on the 1 GiB one, so an fd held on a 2 MiB chunk went unseen. No mount is listed twice.
 */
START_TEST(test_fdinfo_probe_covers_the_pools_hugetlb_chunks)
{
	struct memfd_mounts m;
	struct stat st;
	bool found = false;
	int fd = memfd_create("pinbroker-probe-test", MFD_CLOEXEC | MFD_HUGETLB | (21U << 26));

	if (fd < 0) {
		printf("SKIP test_fdinfo_probe_covers_the_pools_hugetlb_chunks: no 2 MiB hugetlbfs (%s)\n",
		       strerror(errno));
		return;
	}
	ck_assert_int_eq(fstat(fd, &st), 0);
	close(fd);
	holders_memfd_mounts(&m);
	for (size_t i = 0; i < m.n; i++) {
		found = found || m.mount[i].dev == st.st_dev;
		for (size_t j = 0; j < i; j++)
			ck_assert_int_ne(m.mount[i].mnt_id, m.mount[j].mnt_id);
	}
	ck_assert_msg(found, "the 2 MiB hugetlbfs mount (dev %u:%u) is not among the %zu probed", major(st.st_dev),
		      minor(st.st_dev), m.n);
}
END_TEST

/* The uids of the status text b (n bytes, malloc'd: freed here). */
static int status_of(char *b, size_t n, uid_t ids[4])
{
	int r = holders_parse_status_uid(b, n, ids);

	free(b);
	return r;
}

static int status_file(const char *rel, uid_t ids[4])
{
	size_t len;
	char *buf = slurp(rel, &len);

	return status_of(buf, len, ids);
}

static int status_str(const char *s, uid_t ids[4])
{
	size_t n;
	char *b = fixture_exact(s, &n);

	return status_of(b, n, ids);
}

START_TEST(test_status_uid_line_captured_and_crafted)
{
	uid_t ids[4];

	ck_assert_int_eq(status_file("status-captured", ids), 0);
	ck_assert(ids[0] == 0 && ids[1] == 0 && ids[2] == 0 && ids[3] == 0);
	ck_assert_int_eq(status_file("status-uid-61001", ids), 0);
	ck_assert(ids[0] == 61001 && ids[1] == 61001 && ids[2] == 61001 && ids[3] == 61001);
	ck_assert_int_eq(status_file("status-setuid-61001", ids), 0);
	ck_assert(ids[0] == 61001 && ids[1] == 0 && ids[2] == 0 && ids[3] == 0);
	ck_assert_int_eq(status_file("status-truncated", ids), -EBADMSG);
}
END_TEST

START_TEST(test_status_uid_malformed_is_ebadmsg)
{
	static const char *const bad[] = {
		"",
		"Name:\tx\n",
		"Uid:\t1\t2\t3\n",       /* three ids */
		"Uid:\t1\t2\t3\t4\t5\n", /* five */
		"Uid:\t1\t2\t3\t4",      /* no newline */
		"Uid:\t-1\t2\t3\t4\n",
		"Uid:\t4294967295\t0\t0\t0\n", /* (uid_t)-1 is no uid */
		"Uid:\t99999999999999999999\t0\t0\t0\n",
		"Uid:\n",
		"Uid:\tx\t0\t0\t0\n",
	};
	uid_t ids[4];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(status_str(bad[i], ids) == -EBADMSG, "accepted: %s", bad[i]);
	/* A look-alike key earlier in the file is not the Uid line. */
	ck_assert_int_eq(status_str("XUid:\t9\t9\t9\t9\nUid:\t1\t2\t3\t4\n", ids), 0);
	ck_assert(ids[0] == 1 && ids[3] == 4);
}
END_TEST

/* ------------------------------------------------------------- the scan */

enum role { ROLE_MAPPER, ROLE_FD_HOLDER, ROLE_BYSTANDER };

/* A child that maps the memfd (and closes the fd), keeps only the fd, or drops both; then waits to be killed. */
static pid_t spawn(int memfd, enum role role)
{
	int p[2];
	char ok;
	pid_t pid;

	ck_assert_int_eq(pipe(p), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(p[0]);
		if (role == ROLE_MAPPER && mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0) == MAP_FAILED)
			_exit(1);
		/* Only what the role says: no other test fd leaks into it. */
		for (int i = 3; i < 1024; i++)
			if (i != p[1] && (i != memfd || role != ROLE_FD_HOLDER))
				close(i);
		if (write(p[1], "k", 1) != 1)
			_exit(1);
		for (;;)
			pause();
	}
	close(p[1]);
	ck_assert_int_eq(read(p[0], &ok, 1), 1);
	close(p[0]);
	return pid;
}

static void reap(pid_t pid)
{
	kill(pid, SIGKILL); /* our own unreaped child: the pid cannot have been reused */
	waitpid(pid, NULL, 0);
}

static int make_memfd(struct holder_key *k)
{
	struct stat st;
	int fd = memfd_create("pinbroker-chunk", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, 4096), 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	*k = (struct holder_key){ .dev = st.st_dev, .ino = st.st_ino };
	return fd;
}

static bool found(const struct holder *h, size_t n, pid_t pid)
{
	for (size_t i = 0; i < n; i++)
		if (h[i].pid == pid)
			return true;
	return false;
}

/* The pid a pidfd names, from /proc/self/fdinfo ("Pid:"). */
static pid_t pidfd_pid(int pidfd)
{
	char path[64], line[256];
	pid_t pid = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", pidfd);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Pid: %d", &pid) == 1)
			break;
	fclose(f);
	return pid;
}

START_TEST(test_find_on_real_proc_returns_mapper_and_fd_holder_only)
{
	struct holder_key k, other;
	int fd = make_memfd(&k), ofd = make_memfd(&other);
	pid_t mapper = spawn(fd, ROLE_MAPPER), holder = spawn(fd, ROLE_FD_HOLDER),
	      bystander = spawn(fd, ROLE_BYSTANDER);
	pid_t other_mapper = spawn(ofd, ROLE_MAPPER);
	struct holder *h;
	size_t n, unread;

	/* This process holds the fd too, but the scan never returns its caller. */
	ck_assert_int_eq(holders_find("/", getuid(), &k, 1, 0, &h, &n, &unread), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert(found(h, n, mapper));
	ck_assert(found(h, n, holder));
	for (size_t i = 0; i < n; i++) {
		ck_assert_int_eq(pidfd_pid(h[i].pidfd), h[i].pid);
		ck_assert_uint_eq(h[i].key, 0);
	}
	holders_free(h, n);

	/* exclude_pid: the connection's process, already signalled through its own pidfd. */
	ck_assert_int_eq(holders_find("/", getuid(), &k, 1, mapper, &h, &n, NULL), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(h[0].pid, holder);
	holders_free(h, n);

	/* Two keys: each holder says which one it holds, as an index into the caller's array. */
	{
		struct holder_key two[2] = { other, k };

		ck_assert_int_eq(holders_find("/", getuid(), two, 2, 0, &h, &n, NULL), 0);
		ck_assert_uint_eq(n, 3);
		for (size_t i = 0; i < n; i++)
			ck_assert_uint_eq(h[i].key, h[i].pid == other_mapper ? 0 : 1);
		holders_free(h, n);
	}

	/* Another uid: nobody. */
	ck_assert_int_eq(holders_find("/", getuid() + 4242, &k, 1, 0, &h, &n, NULL), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_ptr_null(h);

	/* Once it has exited (and been reaped), the mapper is not found. */
	reap(mapper);
	ck_assert_int_eq(holders_find("/", getuid(), &k, 1, 0, &h, &n, NULL), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(h[0].pid, holder);
	holders_free(h, n);

	reap(holder);
	reap(bystander);
	reap(other_mapper);
	close(fd);
	close(ofd);
}
END_TEST

/* A fake proc root: <root>/proc/<pid>/{status,maps,fd/} built from strings. */
static char fake_root[64];

static void fake_setup(void)
{
	char path[128];

	snprintf(fake_root, sizeof(fake_root), "/tmp/pbholders.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(fake_root));
	snprintf(path, sizeof(path), "%s/proc", fake_root);
	ck_assert_int_eq(mkdir(path, 0755), 0);
}

static void fake_teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", fake_root);
	ck_assert_int_eq(system(cmd), 0);
}

static void fake_file(pid_t pid, const char *name, const char *text)
{
	char path[256];
	FILE *f;

	snprintf(path, sizeof(path), "%s/proc/%d", fake_root, (int)pid);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/proc/%d/%s", fake_root, (int)pid, name);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

static void fake_process(pid_t pid, const char *uid_line, const struct holder_key *mapped)
{
	char maps[256];

	fake_file(pid, "status", uid_line);
	snprintf(maps, sizeof(maps),
		 "55d0c0a00000-55d0c0a01000 r--p 00000000 fe:00 1234 /usr/bin/cat\n"
		 "7f00c0a00000-7f00c0a01000 rw-s 00000000 %02x:%02x %llu /memfd:pinbroker-chunk (deleted)\n",
		 major(mapped->dev), minor(mapped->dev), (unsigned long long)mapped->ino);
	fake_file(pid, "maps", maps);
}

START_TEST(test_find_keeps_to_the_leases_uid_and_never_pid_1)
{
	static const char uid_a[] = "Name:\tx\nUid:\t61001\t61001\t61001\t61001\n";
	static const char setuid_a[] = "Name:\tx\nUid:\t61001\t0\t0\t0\n";
	struct holder_key k = { .dev = makedev(0, 1), .ino = 987654 };
	pid_t a = spawn(-1, ROLE_BYSTANDER), s = spawn(-1, ROLE_BYSTANDER);
	struct holder *h;
	size_t n;

	fake_process(a, uid_a, &k);
	fake_process(s, setuid_a, &k);
	fake_process(1, uid_a, &k);
	/* A pid with no process behind it: no pidfd, so never returned (never signalled by number). */
	fake_process(2147483646, uid_a, &k);

	ck_assert_int_eq(holders_find(fake_root, 61001, &k, 1, 0, &h, &n, NULL), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(h[0].pid, a);
	ck_assert_int_eq(pidfd_pid(h[0].pidfd), a);
	holders_free(h, n);
	ck_assert_int_eq(holders_find(fake_root, 61002, &k, 1, 0, &h, &n, NULL), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_int_eq(holders_find(fake_root, 0, &k, 1, 0, &h, &n, NULL), 0);
	ck_assert_uint_eq(n, 0);
	reap(a);
	reap(s);
}
END_TEST

START_TEST(test_find_through_fd_links_and_bad_roots)
{
	static const char uid_a[] = "Uid:\t61001\t61001\t61001\t61001\n";
	char target[128], link[256];
	struct holder_key k, none = { .dev = makedev(0, 1), .ino = 1 };
	struct stat st;
	pid_t a = spawn(-1, ROLE_BYSTANDER);
	struct holder *h;
	size_t n;
	int fd;

	/* No mapping, but fd/7 leads to the key's file. */
	fake_process(a, uid_a, &none);
	snprintf(target, sizeof(target), "%s/chunk", fake_root);
	fd = open(target, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	close(fd);
	k = (struct holder_key){ .dev = st.st_dev, .ino = st.st_ino };
	snprintf(link, sizeof(link), "%s/proc/%d/fd", fake_root, (int)a);
	ck_assert_int_eq(mkdir(link, 0755), 0);
	snprintf(link, sizeof(link), "%s/proc/%d/fd/7", fake_root, (int)a);
	ck_assert_int_eq(symlink(target, link), 0);
	snprintf(link, sizeof(link), "%s/proc/%d/fd/8", fake_root, (int)a);
	ck_assert_int_eq(symlink("/nonexistent", link), 0);

	ck_assert_int_eq(holders_find(fake_root, 61001, &k, 1, 0, &h, &n, NULL), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(h[0].pid, a);
	holders_free(h, n);

	/* A truncated status or maps, and garbage pid names, are skipped, not trusted. */
	fake_file(a, "status", "Uid:\t61001\t61001\t61");
	ck_assert_int_eq(holders_find(fake_root, 61001, &k, 1, 0, &h, &n, NULL), 0);
	ck_assert_uint_eq(n, 0);
	fake_file(a, "status", uid_a);
	snprintf(link, sizeof(link), "%s/proc/%d/fd/7", fake_root, (int)a);
	ck_assert_int_eq(unlink(link), 0);
	fake_file(a, "maps", "");
	{
		char d1[256];

		snprintf(d1, sizeof(d1), "%s/proc/0%d", fake_root, (int)a);
		ck_assert_int_eq(mkdir(d1, 0755), 0);
		snprintf(d1, sizeof(d1), "%s/proc/self", fake_root);
		ck_assert_int_eq(mkdir(d1, 0755), 0);
	}
	ck_assert_int_eq(holders_find(fake_root, 61001, &k, 1, 0, &h, &n, NULL), 0);
	ck_assert_uint_eq(n, 0);

	ck_assert_int_eq(holders_find("/nonexistent-proc-root", 61001, &k, 1, 0, &h, &n, NULL), -ENOENT);
	ck_assert_uint_eq(n, 0);
	/* No keys: nothing to look for, no scan. */
	ck_assert_int_eq(holders_find("/nonexistent-proc-root", 61001, &k, 0, 0, &h, &n, NULL), 0);
	reap(a);
}
END_TEST

/* The restart scan's maps parser: the exact memfd name, its dev, inode and where the mapping ends in the file. */
START_TEST(test_memfd_map_line_matches_only_the_exact_name)
{
	static const char *const no[] = {
		"7f00c0a00000-7f00c0c00000 rw-s 00000000 00:01 1607 /memfd:pinbroker-chunk.1a2b3c4d",
		"7f00c0a00000-7f00c0c00000 rw-s 00000000 00:01 1607 /memfd:pinbroker-chunk (deleted)",
		"7f00c0a00000-7f00c0c00000 rw-s 00000000 00:01 1607 /memfd:pinbroker-chunk.1a2b3c4dx (deleted)",
		"7f00c0a00000-7f00c0c00000 rw-s 00000000 00:01 1607 /tmp/memfd:pinbroker-chunk.1a2b3c4d (deleted)",
		"7f00c0a00000-7f00c0c00000 rw-s 00000000 00:01 0 /memfd:pinbroker-chunk.1a2b3c4d (deleted)",
		"7f00c0c00000-7f00c0a00000 rw-s 00000000 00:01 1607 /memfd:pinbroker-chunk.1a2b3c4d (deleted)",
		"garbage",
	};
	const char *yes =
		"7f00c0a00000-7f00c0c00000 rw-s 00100000 00:1a 1607    /memfd:pinbroker-chunk.1a2b3c4d (deleted)";
	uint64_t end = 0;
	dev_t dev = 0;
	ino_t ino = 0;

	ck_assert_int_eq(holders_parse_memfd_map(yes, strlen(yes), "pinbroker-chunk.1a2b3c4d", &dev, &ino, &end), 0);
	ck_assert(dev == makedev(0, 0x1a));
	ck_assert_uint_eq(ino, 1607);
	ck_assert_uint_eq(end, 0x100000 + 0x200000);
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
		ck_assert_msg(holders_parse_memfd_map(no[i], strlen(no[i]), "pinbroker-chunk.1a2b3c4d", &dev, &ino,
						      &end) == -ENOENT,
			      "matched: %s", no[i]);
}
END_TEST

struct seen_memfds {
	ino_t want;
	pid_t mapper, holder;
	bool mapped, held, mapper_read;
	uint64_t bytes;
};

static void seen_memfd(const struct holders_memfd *m, void *ud)
{
	struct seen_memfds *s = ud;

	if (m->ino != s->want)
		return;
	if (m->pid == s->mapper)
		s->mapped = true;
	if (m->pid == s->holder)
		s->held = true;
	s->bytes = m->bytes;
}

static void seen_read(pid_t pid, void *ud)
{
	struct seen_memfds *s = ud;

	s->mapper_read |= pid == s->mapper;
}

/*
 * A 64 KiB memfd named pinbroker-chunk.<tag><pid> (a name the scan takes for a chunk), the name in name[64]; its
 * inode in *ino, and the two pipes the case and its children talk over.
 */
static int test_memfd(const char *tag, char name[64], ino_t *ino, int ready[2], int go[2])
{
	struct stat st;
	int fd;

	snprintf(name, 64, "pinbroker-chunk.%s%d", tag, (int)getpid());
	fd = memfd_create(name, MFD_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, 65536), 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert_int_eq(pipe(ready), 0);
	ck_assert_int_eq(pipe(go), 0);
	*ino = st.st_ino;
	return fd;
}

/* Real children: one maps a memfd of a unique name (its fd closed), one only holds the fd; both are found. */
START_TEST(test_scan_memfds_finds_mappers_and_fd_holders_of_any_uid)
{
	char name[64];
	struct seen_memfds s = { 0 };
	int ready[2], go[2], fd;
	char c;

	fd = test_memfd("test", name, &s.want, ready, go);
	s.mapper = fork();
	ck_assert_int_ge(s.mapper, 0);
	if (s.mapper == 0) {
		void *p = mmap(NULL, 65536, PROT_READ, MAP_SHARED, fd, 0);

		close(fd);
		if (p == MAP_FAILED || write(ready[1], "m", 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(1);
		_exit(0);
	}
	s.holder = fork();
	ck_assert_int_ge(s.holder, 0);
	if (s.holder == 0) {
		if (write(ready[1], "h", 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(1);
		_exit(0);
	}
	close(fd);
	ck_assert_int_eq(read(ready[0], &c, 1), 1);
	ck_assert_int_eq(read(ready[0], &c, 1), 1);
	ck_assert_int_eq(holders_scan_memfds(NULL, name, seen_memfd, seen_read, &s, NULL), 0);
	ck_assert(s.mapped);
	ck_assert(s.held);
	ck_assert(s.mapper_read);
	ck_assert_uint_eq(s.bytes, 65536);
	/* Another name finds nothing of ours. */
	s.mapped = s.held = false;
	ck_assert_int_eq(holders_scan_memfds(NULL, "pinbroker-chunk.other", seen_memfd, NULL, &s, NULL), 0);
	ck_assert(!s.mapped && !s.held);
	ck_assert_int_eq(write(go[1], "gg", 2), 2);
	ck_assert_int_eq(waitpid(s.mapper, NULL, 0), s.mapper);
	ck_assert_int_eq(waitpid(s.holder, NULL, 0), s.holder);
}
END_TEST

/* The uids of the next case: a tenant's processes, and the daemon's own as the unit runs it. */
#define TENANT_UID 61001
#define UNIT_UID 61003

/* In a child: become uid with no groups; with ptrace, keep CAP_SYS_PTRACE alone (the unit's /proc right). */
static void become(uid_t uid, bool ptrace)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = { { 0 } };

	if (prctl(PR_SET_KEEPCAPS, ptrace ? 1 : 0, 0, 0, 0) < 0 || setgroups(0, NULL) < 0 ||
	    setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0)
		_exit(90);
	data[CAP_SYS_PTRACE / 32].effective = data[CAP_SYS_PTRACE / 32].permitted = 1u << (CAP_SYS_PTRACE % 32);
	if (ptrace && syscall(SYS_capset, &h, data) < 0)
		_exit(91);
}

struct unit_scan {
	pid_t both, extra;                       /* the two tenant processes */
	bool both_mapped, both_read, extra_read; /* what the scan reported of them */
	size_t unreadable;
	ino_t want;
};

static void unit_memfd(const struct holders_memfd *m, void *ud)
{
	struct unit_scan *u = ud;

	u->both_mapped |= m->pid == u->both && m->ino == u->want;
}

static void unit_read(pid_t pid, void *ud)
{
	struct unit_scan *u = ud;

	u->both_read |= pid == u->both;
	u->extra_read |= pid == u->extra;
}

/*
 * The restart scan as the unit's user (CAP_SYS_PTRACE, no CAP_DAC_READ_SEARCH) over another uid's processes,
 * whose fd/ it cannot list: one maps a chunk and keeps its fd (fdinfo shows that fd is the chunk it maps: read
 * whole), one maps it and holds another memfd's fd (which may be a chunk under a name it cannot read: unread,
 * the safe side).
 */
START_TEST(test_scan_memfds_of_another_uid_with_cap_sys_ptrace_alone)
{
	struct unit_scan u = { 0 };
	int ready[2], go[2], rep[2], fd, other;
	char name[64], c;
	pid_t scanner;

	if (geteuid() != 0) {
		printf("SKIP %s: needs root to run processes as other uids\n", __func__);
		return;
	}
	fd = test_memfd("unit", name, &u.want, ready, go);
	other = memfd_create("not-a-chunk", MFD_CLOEXEC);
	ck_assert_int_ge(other, 0);
	for (int i = 0; i < 2; i++) {
		pid_t pid = fork();

		ck_assert_int_ge(pid, 0);
		if (pid == 0) {
			become(TENANT_UID, false);
			if (mmap(NULL, 65536, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED)
				_exit(1);
			close(i == 0 ? other : fd); /* both keeps the chunk's fd, extra the other memfd's */
			if (write(ready[1], "r", 1) != 1 || read(go[0], &c, 1) != 1)
				_exit(1);
			_exit(0);
		}
		*(i == 0 ? &u.both : &u.extra) = pid;
	}
	close(fd);
	close(other);
	ck_assert_int_eq(read(ready[0], &c, 1), 1);
	ck_assert_int_eq(read(ready[0], &c, 1), 1);
	ck_assert_int_eq(pipe(rep), 0);
	scanner = fork();
	ck_assert_int_ge(scanner, 0);
	if (scanner == 0) {
		become(UNIT_UID, true);
		if (holders_scan_memfds(NULL, name, unit_memfd, unit_read, &u, &u.unreadable) < 0 ||
		    write(rep[1], &u, sizeof(u)) != (ssize_t)sizeof(u))
			_exit(1);
		_exit(0);
	}
	ck_assert_int_eq(read(rep[0], &u, sizeof(u)), (ssize_t)sizeof(u));
	ck_assert_int_eq(waitpid(scanner, NULL, 0), scanner);
	ck_assert_int_eq(write(go[1], "gg", 2), 2);
	ck_assert_int_eq(waitpid(u.both, NULL, 0), u.both);
	ck_assert_int_eq(waitpid(u.extra, NULL, 0), u.extra);
	ck_assert_msg(u.both_mapped, "the chunk's mapper of another uid was not found through its maps");
	ck_assert_msg(u.both_read, "a process holding only the chunk it maps was not read whole (fdinfo)");
	ck_assert_msg(!u.extra_read, "a process holding an fd of a memfd of unknown name was taken as read whole");
	ck_assert_uint_ge(u.unreadable, 1);
}
END_TEST

static bool want_none(pid_t pid, uid_t dir_uid, void *ud)
{
	(void)pid;
	(void)dir_uid;
	(void)ud;
	return false;
}

static bool want_mapper(pid_t pid, uid_t dir_uid, void *ud)
{
	(void)dir_uid;
	return pid == ((struct seen_memfds *)ud)->mapper;
}

/*
 * A mapping its holder stretched far past the memfd's end (mremap with old
 * size 0, PROT_NONE) reports the memfd's size, not where the mapping ends: a
 * holder chooses the one, not the other (issue 22 finding 7, review 1). And a
 * process the caller does not want is not read at all.
 */
START_TEST(test_scan_memfds_reports_the_file_size_of_a_stretched_mapping)
{
	const size_t stretched = 1ul << 40;
	char name[64];
	struct seen_memfds s = { 0 };
	int ready[2], go[2], fd;
	char c;

	fd = test_memfd("stretch", name, &s.want, ready, go);
	s.holder = -1;
	s.mapper = fork();
	ck_assert_int_ge(s.mapper, 0);
	if (s.mapper == 0) {
		void *p = mmap(NULL, 65536, PROT_READ, MAP_SHARED, fd, 0), *q;

		close(fd);
		if (p == MAP_FAILED)
			_exit(1);
		q = mremap(p, 65536, stretched, MREMAP_MAYMOVE);
		if (q == MAP_FAILED || mprotect(q, stretched, PROT_NONE) < 0 || write(ready[1], "m", 1) != 1 ||
		    read(go[0], &c, 1) != 1)
			_exit(1);
		_exit(0);
	}
	close(fd);
	ck_assert_int_eq(read(ready[0], &c, 1), 1);
	ck_assert_int_eq(holders_scan_memfds(NULL, name, seen_memfd, seen_read, &s, NULL), 0);
	ck_assert(s.mapped);
	ck_assert(s.mapper_read);
	ck_assert_uint_eq(s.bytes, 65536);
	/* Filtered: wanted, it is read as before; not wanted, it is not read. */
	s.mapped = s.mapper_read = false;
	s.bytes = 0;
	ck_assert_int_eq(holders_scan_memfds_of(NULL, name, want_mapper, seen_memfd, seen_read, &s, NULL), 0);
	ck_assert(s.mapped && s.mapper_read);
	ck_assert_uint_eq(s.bytes, 65536);
	s.mapped = s.mapper_read = false;
	ck_assert_int_eq(holders_scan_memfds_of(NULL, name, want_none, seen_memfd, seen_read, &s, NULL), 0);
	ck_assert(!s.mapped && !s.mapper_read);
	ck_assert_int_eq(write(go[1], "g", 1), 1);
	ck_assert_int_eq(waitpid(s.mapper, NULL, 0), s.mapper);
}
END_TEST

/* What a sliced scan saw of the one process the case cares about. */
struct sliced_seen {
	pid_t mapper;
	ino_t want;
	size_t reports;
	bool read, owner_known;
	uid_t owner;
	uid_t ids_seen[4];
	bool asked;
};

static bool want_mapper_ids(pid_t pid, const uid_t ids[4], void *ud)
{
	struct sliced_seen *s = ud;

	if (pid != s->mapper)
		return false;
	memcpy(s->ids_seen, ids, sizeof(s->ids_seen));
	s->asked = true;
	return true;
}

static void sliced_memfd(const struct holders_memfd *m, void *ud)
{
	struct sliced_seen *s = ud;

	if (m->ino != s->want)
		return;
	s->reports++;
	s->owner_known |= m->owner_known;
	if (m->owner_known)
		s->owner = m->owner;
}

static void sliced_read(pid_t pid, void *ud)
{
	struct sliced_seen *s = ud;

	s->read |= pid == s->mapper;
}

/*
 * The sliced scan (issue 38 finding 6): a process mapping one memfd 3,000 times and holding 100 fds of it is read
 * over many 1 us steps, to the end; each mapping is reported, but the file is stat'ed once for every mapping
 * (map_files) and once per fd (a stat names an fd's file); want is asked with the status uids, and the file's
 * owner (who made the memfd) comes with each report.
 */
START_TEST(test_sliced_scan_reads_a_big_process_over_many_steps_and_stats_once)
{
	const int maps = 3000, fds = 100;
	struct holders_memfd_stats st;
	struct holders_memfd_scan *sc;
	struct sliced_seen s = { 0 };
	char name[64];
	int ready[2], go[2], fd, r, steps = 0;
	char c;

	fd = test_memfd("sliced", name, &s.want, ready, go);
	s.mapper = fork();
	ck_assert_int_ge(s.mapper, 0);
	if (s.mapper == 0) {
		for (int i = 0; i < maps; i++)
			if (mmap(NULL, 65536, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED)
				_exit(1);
		for (int i = 1; i < fds; i++)
			if (dup(fd) < 0)
				_exit(2);
		if (write(ready[1], "m", 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(3);
		_exit(0);
	}
	close(fd);
	ck_assert_int_eq(read(ready[0], &c, 1), 1);
	ck_assert_int_eq(holders_memfd_scan_new(NULL, name, want_mapper_ids, sliced_memfd, sliced_read, &s, &sc), 0);
	while ((r = holders_memfd_scan_step(sc, 1)) == 0)
		steps++;
	ck_assert_int_eq(r, 1);
	holders_memfd_scan_stats(sc, &st);
	holders_memfd_scan_free(sc);
	ck_assert(s.asked);
	ck_assert_uint_eq(s.ids_seen[0], getuid());
	ck_assert(s.read);
	ck_assert_uint_eq(st.processes, 1);
	ck_assert_uint_eq(s.reports, (size_t)maps + (size_t)fds);
	ck_assert_uint_ge(st.lines, (size_t)maps);
	/* One stat for every mapping and one per fd: not one per mapping. */
	ck_assert_uint_le(st.stats, (size_t)fds + 1);
	/* A 3,000-line maps file and 100 fds take many steps of one unit each. */
	ck_assert_int_ge(steps, 20);
	ck_assert_uint_ge(st.slices, 20);
	ck_assert(s.owner_known);
	ck_assert_uint_eq(s.owner, geteuid());
	ck_assert_int_eq(write(go[1], "g", 1), 1);
	ck_assert_int_eq(waitpid(s.mapper, NULL, 0), s.mapper);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("holders");
	TCase *f;

	CHECK_CASE(s, "parse", NULL, NULL, 10, test_maps_captured_finds_memfd_by_dev_and_inode,
		   test_maps_captured_lookalike_names_never_match_the_memfd,
		   test_maps_captured_odd_names_parse_by_their_columns, test_maps_truncated_last_line_is_not_trusted,
		   test_maps_streamed_in_small_pieces_finds_the_memfd, test_maps_garbage_lines_are_skipped,
		   test_status_uid_line_captured_and_crafted, test_status_uid_malformed_is_ebadmsg,
		   test_memfd_map_line_matches_only_the_exact_name,
		   test_fdinfo_mount_and_inode_parse_and_old_kernels_fail,
		   test_fdinfo_probe_covers_the_pools_hugetlb_chunks);

	/* pidfd_open: valgrind 3.19 lacks it, so its run excludes the tag "enforce". */
	f = CHECK_CASE(s, "find", fake_setup, fake_teardown, 20,
		       test_find_on_real_proc_returns_mapper_and_fd_holder_only,
		       test_find_keeps_to_the_leases_uid_and_never_pid_1, test_find_through_fd_links_and_bad_roots,
		       test_scan_memfds_finds_mappers_and_fd_holders_of_any_uid,
		       test_scan_memfds_reports_the_file_size_of_a_stretched_mapping,
		       test_scan_memfds_of_another_uid_with_cap_sys_ptrace_alone,
		       test_sliced_scan_reads_a_big_process_over_many_steps_and_stats_once);
	tcase_set_tags(f, "enforce");
	return s;
}

CHECK_MAIN(suite)

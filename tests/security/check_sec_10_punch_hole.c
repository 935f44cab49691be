/* SPDX-License-Identifier: MIT */
/* Finding 10: a holder's fallocate(PUNCH_HOLE) is found, counted and repaired, so pool and ledger match the daemon's locked memory. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/falloc.h>

#include "sec.h"

#define KIB 1024ull
#define MIB (1024ull * KIB)
#define PUNCH (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)

static struct daemon d;

/* Locked 4 KiB-page chunks of 2 MiB (the pool's defaults; hugetlb pinned off by daemon_start). */
SEC_START(start, d, "--lock-memory", "yes", "--chunk-size", "2M", "--chunk-max", "2M", "--log-level", "info")

SEC_STOP(stop, d)

/*
 * What the kernel says the daemon holds locked for its pool: the resident pages
 * of its locked mappings of pool memfds (VmLck counts mapped ranges, not pages,
 * so it does not move when pages are punched out underneath).
 */
static uint64_t daemon_pool_locked_bytes(pid_t pid)
{
	char line[512];
	uint64_t sum_kb = 0, rss_kb = 0;
	bool pool_vma = false;
#if defined(__SANITIZE_ADDRESS__)
	/* ASan makes mlock a no-op (it would lock the shadow too): resident pages are all there is to compare. */
	const bool asan = true;
#else
	const bool asan = false;
#endif
	FILE *f;

	f = sec_proc_open(pid, "smaps");
	while (fgets(line, sizeof(line), f)) {
		unsigned long long kb, lo, hi;

		/* A mapping's header line ("lo-hi perms offset dev inode name"), then its fields, VmFlags last. */
		if (sscanf(line, "%llx-%llx ", &lo, &hi) == 2) {
			pool_vma = strstr(line, "/memfd:pinbroker-chunk") != NULL;
			rss_kb = 0;
		} else if (sscanf(line, "Rss: %llu kB", &kb) == 1) {
			rss_kb = kb;
		} else if (strncmp(line, "VmFlags:", 8) == 0 && pool_vma && (strstr(line, " lo") || asan)) {
			sum_kb += rss_kb;
		}
	}
	fclose(f);
	return sum_kb * KIB;
}

/* The pool's books (pinctl status --json) against the kernel's; retried because they are read at different instants. */
static void check_books(const char *where, int64_t want_leased)
{
	char msg[512] = "";

	for (int attempt = 0; attempt < 40; attempt++) {
		char *out = NULL;
		int64_t leased = -1, pool = -1;
		uint64_t locked = daemon_pool_locked_bytes(d.pid);
		const char *p;

		ck_assert_int_eq(pinctl(&d, &out, "status --json"), 0);
		if ((p = strstr(out, "\"leased_bytes\":")))
			leased = strtoll(p + 15, NULL, 10);
		if ((p = strstr(out, "\"pool_bytes\":")))
			pool = strtoll(p + 13, NULL, 10);
		free(out);
		if (leased != want_leased)
			snprintf(msg, sizeof(msg), "%s: leased %lld, want %lld", where, (long long)leased,
				 (long long)want_leased);
		else if (pool < 0 || (uint64_t)pool != locked)
			snprintf(msg, sizeof(msg),
				 "%s: the pool holds %lld bytes, the kernel has %llu of them locked "
				 "in the daemon's mappings",
				 where, (long long)pool, (unsigned long long)locked);
		else
			return;
		usleep(50000);
	}
	ck_abort_msg("%s", msg);
}

struct held {
	int conn;
	uint64_t id;
	int fds[8];
	size_t nfds;
	char *map[8];
	uint64_t len[8];
};

/* In a child as uid A: acquire size bytes and map every chunk, writing a pattern; _exit on failure. */
static void child_acquire(struct held *h, uint64_t size)
{
	sec_drop_to(SEC_UID_A);
	h->conn = raw_connect(d.socket);
	if (h->conn < 0 || raw_hello(h->conn) != 0)
		_exit(91);
	if (raw_acquire(h->conn, size, &h->id, h->fds, 8, &h->nfds) != 0 || h->nfds == 0)
		_exit(92);
	for (size_t i = 0; i < h->nfds; i++) {
		h->len[i] = (uint64_t)lseek(h->fds[i], 0, SEEK_END);
		h->map[i] = mmap(NULL, h->len[i], PROT_READ | PROT_WRITE, MAP_SHARED, h->fds[i], 0);
		if (h->map[i] == MAP_FAILED)
			_exit(93);
		memset(h->map[i], 'A', h->len[i]);
	}
}

static bool log_has(const char *what)
{
	char *log = daemon_log(&d);
	bool found = log && strstr(log, what);

	free(log);
	return found;
}

START_TEST(test_punched_chunks_are_repaired_and_counted_on_release)
{
	int st, p2c[2];
	uint64_t id;
	pid_t pid;
	char want[160];

	ck_assert_int_eq(pipe(p2c), 0);
	check_books("before", 0);
	pid = itest_fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct held h;

		/* Four full chunks and a 64 KiB tail. */
		child_acquire(&h, 8 * MIB + 64 * KIB);
		if (h.nfds != 5)
			_exit(94);
		/* Whole chunk, half a chunk touched again through our own mapping, one page, the tail. */
		if (fallocate(h.fds[0], PUNCH, 0, (off_t)h.len[0]) < 0 ||
		    fallocate(h.fds[1], PUNCH, 0, (off_t)h.len[1] / 2) < 0 ||
		    fallocate(h.fds[2], PUNCH, 4096, 4096) < 0 || fallocate(h.fds[4], PUNCH, 0, (off_t)h.len[4]) < 0)
			_exit(95);
		memset(h.map[1], 'B', h.len[1]);
		if (write(p2c[1], &h.id, sizeof(h.id)) != sizeof(h.id))
			_exit(96);
		if (raw_release(h.conn, h.id) != 0)
			_exit(97);
		_exit(0);
	}
	close(p2c[1]);
	ck_assert_int_eq(read(p2c[0], &id, sizeof(id)), (ssize_t)sizeof(id));
	close(p2c[0]);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "uid A child failed with status %d", st);

	/* Every chunk that went back to the pool is whole and locked, and the books say so. */
	check_books("after the punches and the release", 0);
	snprintf(want, sizeof(want), "lease %llu of uid %d (pid %d)", (unsigned long long)id, SEC_UID_A, (int)pid);
	ck_assert_msg(log_has(want), "no memory-punched report naming '%s'", want);
	snprintf(want, sizeof(want), "(4 punched chunks by uid %d so far)", SEC_UID_A);
	ck_assert_msg(log_has(want), "the punches should be counted against uid %d: no '%s'", SEC_UID_A, want);

	/* The same uid gets those chunks back: still whole, still counted right. */
	pid = itest_fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct held h;

		child_acquire(&h, 8 * MIB);
		_exit(raw_release(h.conn, h.id) == 0 ? 0 : 98);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "second uid A child failed with status %d", st);
	check_books("after the chunks were lent again", 0);
}
END_TEST

START_TEST(test_punch_in_held_lease_is_found_by_the_audit)
{
	int st, c2p[2], p2c[2];
	uint64_t id;
	pid_t pid;
	char want[160], c;

	pid = itest_fork_piped(c2p, p2c);
	if (pid == 0) {
		struct held h;
		char x;

		child_acquire(&h, 4 * MIB);
		if (h.nfds != 2)
			_exit(94);
		/* Punch both chunks and keep holding the lease: no release tells the daemon. */
		if (fallocate(h.fds[0], PUNCH, 0, (off_t)h.len[0]) < 0 || fallocate(h.fds[1], PUNCH, 0, 64 * KIB) < 0)
			_exit(95);
		memset(h.map[1], 'C', 64 * KIB);
		if (write(c2p[1], &h.id, sizeof(h.id)) != sizeof(h.id) || read(p2c[0], &x, 1) != 1)
			_exit(96);
		_exit(0); /* the connection closes and takes the lease back */
	}
	ck_assert_int_eq(read(c2p[0], &id, sizeof(id)), (ssize_t)sizeof(id));

	/* The periodic audit repairs it while it is held: the books match again within a few ticks. */
	check_books("lease held after the punches", (int64_t)(4 * MIB));
	snprintf(want, sizeof(want), "lease %llu of uid %d (pid %d)", (unsigned long long)id, SEC_UID_A, (int)pid);
	for (int i = 0; i < 100 && !log_has(want); i++)
		usleep(50000);
	ck_assert_msg(log_has(want), "the audit should report '%s'", want);
	snprintf(want, sizeof(want), "(2 punched chunks by uid %d so far)", SEC_UID_A);
	ck_assert_msg(log_has(want), "both punched chunks should be counted: no '%s'", want);

	c = 'x';
	ck_assert_int_eq(write(p2c[1], &c, 1), 1);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "uid A child failed with status %d", st);
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
	check_books("after the holder exited", 0);
}
END_TEST

CHECK_SUITE(suite, "sec_10_punch_hole", "punch_hole", start, stop, 60,
	    test_punched_chunks_are_repaired_and_counted_on_release, test_punch_in_held_lease_is_found_by_the_audit)

SEC_MAIN(suite)

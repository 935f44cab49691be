/* SPDX-License-Identifier: MIT */
/* Shared by the security suites: two real uids, dropping to them in children, and a main that skips without root. */
#pragma once

#define _GNU_SOURCE
#include <check.h>
#include <grp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "fdstore.h"
#include "itest.h"

/* The two unprivileged uids (and same-numbered gids) every security suite plays. */
#define SEC_UID_A 61001
#define SEC_UID_B 61002

/* In a child: become uid (and gid) with no supplementary groups, or _exit(90). */
static inline void sec_drop_to(uid_t uid)
{
	itest_drop_to(uid);
}

/* Lease id as this uid sees it through a connection of its own on socket_path: listed and active, not revoking. */
static inline bool sec_lease_active(const char *socket_path, uint64_t id)
{
	struct pb_lease_info *rows;
	pb_client *c;
	uint64_t cur = 0;
	bool ok = false;
	size_t n;

	ck_assert_int_eq(pb_connect(socket_path, &c), 0);
	do {
		ck_assert_int_eq(pb_leases_page(c, cur, 0, &rows, &n, &cur), 0);
		for (size_t i = 0; i < n; i++)
			if (rows[i].id == id)
				ok = strcmp(rows[i].state, "active") == 0;
		pb_lease_info_free(rows, n);
	} while (cur);
	pb_disconnect(c);
	return ok;
}

/* How many times needle occurs in hay, without overlaps (log lines, warnings). */
static inline size_t sec_count(const char *hay, const char *needle)
{
	size_t n = 0, len = strlen(needle);
	const char *p = hay;

	while ((p = strstr(p, needle)) != NULL) {
		p += len;
		n++;
	}
	return n;
}

/* In a child: become uid, connect to sock and say HELLO; the connection, or _exit(fail_code). */
static inline int sec_session_as(uid_t uid, const char *sock, int fail_code)
{
	int fd;

	sec_drop_to(uid);
	fd = raw_connect(sock);
	if (fd < 0 || raw_hello(fd) != 0)
		_exit(fail_code);
	return fd;
}

/* In a child of itest_fork_piped(in, out): stdin from in, stdout to out, the other ends closed, then uid. */
static inline void sec_child_stdio_as(int in[2], int out[2], uid_t uid)
{
	dup2(in[0], 0);
	dup2(out[1], 1);
	close(in[1]);
	close(out[0]);
	sec_drop_to(uid);
}

/* Under ASan the interposer precedes the sanitizer's runtime in the load order; that is fine: say so to ASan. */
static inline void sec_asan_allow_preload(void)
{
	const char *was = getenv("ASAN_OPTIONS");
	char asan[512];

	snprintf(asan, sizeof(asan), "%s%sverify_asan_link_order=0", was ?: "", was ? ":" : "");
	setenv("ASAN_OPTIONS", asan, 1);
}

/* In the parent: the child's report of len bytes from pipe p, which must come whole; both ends closed. */
static inline void sec_read_report(int p[2], void *rep, size_t len)
{
	close(p[1]);
	ck_assert_int_eq(read(p[0], rep, len), (ssize_t)len);
	close(p[0]);
}

/* /proc/pid/what (smaps, status), open for reading; fails the test when it cannot be read. */
static inline FILE *sec_proc_open(pid_t pid, const char *what)
{
	char path[64];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, what);
	f = fopen(path, "re");
	ck_assert_msg(f != NULL, "cannot read %s", path);
	return f;
}

/* The number on the "name:" line of /proc/pid/status (kB for the Vm and Rss sizes); -1 when it has none. */
static inline long sec_proc_status(pid_t pid, const char *name)
{
	FILE *f = sec_proc_open(pid, "status");
	size_t len = strlen(name);
	char line[256];
	long v = -1;

	while (v < 0 && fgets(line, sizeof(line), f))
		if (strncmp(line, name, len) == 0 && line[len] == ':')
			v = strtol(line + len + 1, NULL, 10);
	fclose(f);
	return v;
}

/* Resident bytes of pid's mappings of the pool's chunk memfds (pinbroker-chunk*): the pages it holds of them. */
static inline uint64_t sec_chunk_rss(pid_t pid)
{
	FILE *f = sec_proc_open(pid, "smaps");
	unsigned long long kb, lo, hi;
	uint64_t sum_kb = 0;
	bool chunk = false;
	char line[512];

	while (fgets(line, sizeof(line), f)) {
		/* A mapping's header line ("lo-hi perms offset dev inode name"), then its fields. */
		if (sscanf(line, "%llx-%llx ", &lo, &hi) == 2)
			chunk = strstr(line, "/memfd:pinbroker-chunk") != NULL;
		else if (chunk && sscanf(line, "Rss: %llu kB", &kb) == 1)
			sum_kb += kb;
	}
	fclose(f);
	return sum_kb * 1024;
}

/* The end of a case with an fd store: the daemon d stops cleanly (0), then its store fs goes. */
static inline void sec_stop_with_store(struct daemon *d, struct fdstore *fs)
{
	ck_assert_int_eq(daemon_stop(d), 0);
	fdstore_free(fs);
}

/* Removes a suite's scratch tree; a failure is only reported. */
static inline void sec_rm_rf(const char *path)
{
	char cmd[4200];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", path);
}

/*
 * A checked fixture's setup: fn() starts the daemon dmn with the given arguments (NULL for none) after
 * daemon_start's small test defaults. SEC_START(start, d, "--revoke-enforce", "none")
 */
#define SEC_START(fn, dmn, ...)                                               \
	static void fn(void)                                                  \
	{                                                                     \
		static const char *const fn##_args[] = { __VA_ARGS__, NULL }; \
                                                                              \
		daemon_start(&(dmn), fn##_args);                              \
	}

/* A checked fixture's teardown: fn() stops the daemon dmn, which must exit cleanly (0). */
#define SEC_STOP(fn, dmn)                                 \
	static void fn(void)                              \
	{                                                 \
		ck_assert_int_eq(daemon_stop(&(dmn)), 0); \
	}

/*
 * main() for a security suite: fork mode, and exit 77 (ctest's SKIP_RETURN_CODE)
 * with a message where the test cannot switch uids.
 */
#define SEC_MAIN(suite_fn)                                                                         \
	int main(void)                                                                             \
	{                                                                                          \
		SRunner *sr;                                                                       \
		int failed;                                                                        \
                                                                                                   \
		if (geteuid() != 0) {                                                              \
			printf("SKIP: %s needs root to run clients as two real uids\n", __FILE__); \
			return 77;                                                                 \
		}                                                                                  \
		sr = srunner_create(suite_fn());                                                   \
		srunner_set_fork_status(sr, CK_FORK);                                              \
		srunner_run_all(sr, CK_NORMAL);                                                    \
		failed = srunner_ntests_failed(sr);                                                \
		srunner_free(sr);                                                                  \
		return failed ? EXIT_FAILURE : EXIT_SUCCESS;                                       \
	}

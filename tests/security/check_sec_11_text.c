/* SPDX-License-Identifier: MIT */
/* Finding 11: labels and names can't forge rows or reach a terminal raw, other uids' rows are hidden, one lease counts once. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pinbroker.h"
#include "sec.h"
#include "wire.h"

#define FORGED_LABEL "evil\nID 999 fake"
/* ESC [2J clears a terminal; the newline would start a row of its own. */
#define FORGED_NAME "job\x1b[2J\nFAKE 1 0"

static struct daemon d;
static pid_t holder;

static void start(void)
{
	daemon_start(&d, NULL); /* status-visibility at its default */
}

static void stop(void)
{
	itest_kill_child(&holder);
	daemon_stop(&d);
}

/* ACQUIRE 1 MiB with a label; returns the reply status (or -errno), the message in msg. */
static int acquire_labelled(int fd, const char *label, char *msg, size_t msglen)
{
	return raw_acquire_msg(fd, 1024 * 1024, label, 2, msg, msglen, 5000);
}

/*
 * A child of uid that says HELLO as name on nconn connections and acquires
 * one lease labelled label on the first, then reports its acquire status
 * and message through a pipe and holds everything until killed.
 */
static int start_holder(uid_t uid, const char *name, int nconn, const char *label, char *msg, size_t msglen)
{
	int pfd[2], st = -1;

	holder = itest_fork_piped(pfd, NULL);
	if (holder == 0) {
		char m[512] = "";
		int fds[2], r = -1;

		close(pfd[0]);
		sec_drop_to(uid);
		for (int i = 0; i < nconn; i++) {
			fds[i] = raw_connect(d.socket);
			if (fds[i] < 0 || raw_hello_as(fds[i], name) != 0)
				_exit(2);
		}
		r = acquire_labelled(fds[0], label, m, sizeof(m));
		if (write(pfd[1], &r, sizeof(r)) != sizeof(r) || write(pfd[1], m, sizeof(m)) != sizeof(m))
			_exit(3);
		close(pfd[1]);
		for (;;)
			pause();
	}
	close(pfd[1]);
	ck_assert_int_eq(read(pfd[0], &st, sizeof(st)), sizeof(st));
	{
		/* Read it all even when unwanted: closing early would SIGPIPE the holder. */
		char m[512];

		ck_assert_int_eq(read(pfd[0], m, sizeof(m)), sizeof(m));
		if (msg)
			snprintf(msg, msglen, "%s", m);
	}
	close(pfd[0]);
	return st;
}

static bool has_line_starting(const char *text, const char *prefix)
{
	size_t n = strlen(prefix);

	for (const char *p = text; p; p = strchr(p, '\n')) {
		if (*p == '\n')
			p++;
		if (strncmp(p, prefix, n) == 0)
			return true;
	}
	return false;
}

static bool has_raw_control(const char *text)
{
	for (const unsigned char *p = (const unsigned char *)text; *p; p++)
		if ((*p < 0x20 && *p != '\n') || *p == 0x7f)
			return true;
	return false;
}

START_TEST(test_forged_label_is_refused_and_forges_no_row)
{
	char msg[512], *out = NULL, *log;
	int st;

	st = start_holder(SEC_UID_A, "forger", 1, FORGED_LABEL, msg, sizeof(msg));
	ck_assert_msg(st == PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT,
		      "ACQUIRE with a newline in its label got status %d, want INVALID_ARGUMENT", st);
	ck_assert_msg(strstr(msg, "control characters"), "the refusal should say what is allowed: '%s'", msg);

	ck_assert_int_eq(pinctl(&d, &out, "leases"), 0);
	ck_assert_msg(!has_line_starting(out, "ID 999"), "a forged row in pinctl leases:\n%s", out);
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "status"), 0);
	ck_assert_msg(!has_line_starting(out, "ID 999"), "a forged row in pinctl status:\n%s", out);
	free(out);
	/* Nor a forged line in the daemon's log. */
	log = daemon_log(&d);
	ck_assert_ptr_nonnull(log);
	ck_assert_msg(!has_line_starting(log, "ID 999"), "a forged log line:\n%s", itest_tail(log));
	free(log);
}
END_TEST

START_TEST(test_control_characters_in_a_client_name_never_reach_the_terminal)
{
	char *out = NULL;

	ck_assert_int_eq(start_holder(SEC_UID_A, FORGED_NAME, 1, "named", NULL, 0), 0);
	ck_assert_int_eq(pinctl(&d, &out, "status"), 0);
	ck_assert_msg(!has_raw_control(out), "a raw control character in pinctl status:\n%s", out);
	ck_assert_msg(!has_line_starting(out, "FAKE"), "a forged row in pinctl status:\n%s", out);
	/* The name is still shown, its control characters replaced. */
	ck_assert_msg(strstr(out, "job?[2J?FAKE 1 0"), "the client name is missing from:\n%s", out);
	free(out);
	/* JSON carries it without a control character too (not even an escaped one). */
	ck_assert_int_eq(pinctl(&d, &out, "status --json"), 0);
	ck_assert_msg(strstr(out, "\"name\":\"job?[2J?FAKE 1 0\""), "want the sanitised name in:\n%s", out);
	ck_assert_ptr_null(strstr(out, "\\u001b"));
	free(out);
}
END_TEST

START_TEST(test_visibility_own_hides_other_uids_rows_but_not_from_root)
{
	char *out = NULL, pid[32];

	ck_assert_int_eq(start_holder(SEC_UID_A, "holder-a", 1, "secret-a", NULL, 0), 0);
	snprintf(pid, sizeof(pid), "%d", (int)holder);

	/* uid B, not an admin: the totals, but none of A's rows. */
	ck_assert_int_eq(pinctl_as(&d, SEC_UID_B, &out, "status"), 0);
	ck_assert_ptr_nonnull(strstr(out, "leased:       1 MiB"));
	ck_assert_msg(!strstr(out, "secret-a") && !strstr(out, "holder-a") && !strstr(out, pid),
		      "uid %u sees uid %u's row:\n%s", SEC_UID_B, SEC_UID_A, out);
	free(out);
	ck_assert_int_eq(pinctl_as(&d, SEC_UID_B, &out, "leases"), 0);
	ck_assert_msg(!strstr(out, "secret-a") && !strstr(out, pid), "uid %u sees uid %u's lease:\n%s", SEC_UID_B,
		      SEC_UID_A, out);
	free(out);
	ck_assert_int_eq(pinctl_as(&d, SEC_UID_B, &out, "status --json"), 0);
	ck_assert_msg(!strstr(out, "secret-a") && strstr(out, "\"leased_bytes\":1048576"), "uid B's JSON:\n%s", out);
	free(out);

	/* A sees its own. */
	ck_assert_int_eq(pinctl_as(&d, SEC_UID_A, &out, "leases"), 0);
	ck_assert_msg(strstr(out, "secret-a"), "uid A does not see its own lease:\n%s", out);
	free(out);

	/* root sees everything. */
	ck_assert_int_eq(pinctl(&d, &out, "status"), 0);
	ck_assert_msg(strstr(out, "secret-a") && strstr(out, pid), "root does not see uid A's row:\n%s", out);
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "leases"), 0);
	ck_assert_ptr_nonnull(strstr(out, "secret-a"));
	free(out);

	/* The setting is reloadable: all shows B every row again. */
	ck_assert_int_eq(pinctl(&d, &out, "set status-visibility all"), 0);
	free(out);
	ck_assert_int_eq(pinctl_as(&d, SEC_UID_B, &out, "leases"), 0);
	ck_assert_msg(strstr(out, "secret-a"), "status-visibility = all, yet uid B sees no row:\n%s", out);
	free(out);
}
END_TEST

START_TEST(test_one_process_with_two_connections_counts_its_lease_once)
{
	struct pb_status *s = NULL;
	pb_client *c = NULL;
	uint32_t rows = 0, leases = 0;
	uint64_t bytes = 0;

	ck_assert_int_eq(start_holder(SEC_UID_A, "two-conns", 2, "once", NULL, 0), 0);
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_status_get(c, &s), 0);
	for (size_t i = 0; i < s->n_clients; i++) {
		if (s->clients[i].pid != holder)
			continue;
		rows++;
		leases += s->clients[i].leases;
		bytes += s->clients[i].bytes;
	}
	ck_assert_uint_eq(rows, 2); /* one row per connection */
	ck_assert_msg(leases == 1 && bytes == 1024 * 1024,
		      "one lease of 1 MiB shows as %u leases, %llu bytes over the process's two rows", leases,
		      (unsigned long long)bytes);
	ck_assert_uint_eq(s->n_leases, 1);
	pb_status_free(s);
	pb_disconnect(c);
}
END_TEST

CHECK_SUITE(suite, "sec-11-text", "text", start, stop, 60, test_forged_label_is_refused_and_forges_no_row,
	    test_control_characters_in_a_client_name_never_reach_the_terminal,
	    test_visibility_own_hides_other_uids_rows_but_not_from_root,
	    test_one_process_with_two_connections_counts_its_lease_once)

SEC_MAIN(suite)

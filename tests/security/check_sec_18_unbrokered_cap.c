/* SPDX-License-Identifier: MIT */
/*
 * Issue 22, finding 5: one uid on many connections must not inflate the host's "unbrokered" figure past what
 * the host has (MemTotal), each uid's sum is capped, another uid's honest report still shows, and the figures
 * say they are clients' word.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pinbroker.h"
#include "sec.h"
#include "wire.h"

#define MiB (1024ull * 1024)
#define TiB (1024ull * 1024 * 1024 * 1024)
/* The attack: 200 connections, each reporting 16 TiB. Half report 16 TiB, half exactly MemTotal. */
#define A_CONNECTIONS 200
#define B_REPORT_BYTES (64 * MiB)

static struct daemon d;
static pid_t child_a, child_b;

SEC_START(start, d, NULL)

static void reap(pid_t *p)
{
	if (*p > 0) {
		kill(*p, SIGKILL);
		waitpid(*p, NULL, 0);
		*p = 0;
	}
}

static void stop(void)
{
	reap(&child_a);
	reap(&child_b);
	daemon_stop(&d);
}

/* The host's MemTotal in bytes, read as the issue says: from /proc/meminfo. */
static uint64_t mem_total(void)
{
	char line[256];
	unsigned long long kib = 0;
	FILE *f = fopen("/proc/meminfo", "re");

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemTotal: %llu kB", &kib) == 1)
			break;
	fclose(f);
	ck_assert_uint_gt(kib, 0);
	return (uint64_t)kib * 1024;
}

/* REPORT_UNBROKERED bytes on fd: the reply's status, or -errno. */
static int report(int fd, uint64_t bytes, uint64_t seq)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__ReportUnbrokered ru = PINBROKER__V1__REPORT_UNBROKERED__INIT;

	ru.bytes = bytes;
	req.body_case = PINBROKER__V1__REQUEST__BODY_REPORT_UNBROKERED;
	req.report_unbrokered = &ru;
	return raw_call(fd, &req, seq, NULL, 0, 5000);
}

/* What a reporting child saw: replies OK and replies INVALID_ARGUMENT. */
struct outcome {
	int ok, invalid, other;
};

/*
 * A child of uid that opens nconn connections and reports on each: bytes_even on even ones, bytes_odd on odd
 * ones (connection 0 reports three times). It sends its outcome through a pipe and holds everything until
 * killed. Returns the child's pid and its outcome.
 */
static pid_t start_reporter(uid_t uid, int nconn, uint64_t bytes_even, uint64_t bytes_odd, struct outcome *o)
{
	int pfd[2];
	pid_t pid;

	pid = itest_fork_piped(pfd, NULL);
	if (pid == 0) {
		struct outcome m = { 0 };

		close(pfd[0]);
		sec_drop_to(uid);
		for (int i = 0; i < nconn; i++) {
			int fd = raw_connect(d.socket);

			if (fd < 0 || raw_hello_as(fd, "reporter") != 0)
				_exit(2);
			for (int k = 0; k < (i == 0 ? 3 : 1); k++) {
				int r = report(fd, i % 2 ? bytes_odd : bytes_even, 20 + (uint64_t)k);

				if (r == PINBROKER__V1__STATUS_CODE__STATUS_OK)
					m.ok++;
				else if (r == PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT)
					m.invalid++;
				else
					m.other++;
			}
		}
		if (write(pfd[1], &m, sizeof(m)) != sizeof(m))
			_exit(3);
		close(pfd[1]);
		for (;;)
			pause();
	}
	sec_read_report(pfd, o, sizeof(*o));
	return pid;
}

static const struct pb_unbrokered_uid *uid_row(const struct pb_status *s, uint32_t uid)
{
	for (size_t i = 0; i < s->n_unbrokered_uids; i++)
		if (s->unbrokered_uids[i].uid == uid)
			return &s->unbrokered_uids[i];
	return NULL;
}

/* The number after `"key":` in a JSON text, or UINT64_MAX when absent. */
static uint64_t json_number(const char *json, const char *key)
{
	char pat[96];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(json, pat);
	return p ? strtoull(p + strlen(pat), NULL, 10) : UINT64_MAX;
}

/* The value of a metric line `name VALUE` in the Prometheus text, or -1 when absent. */
static double metric(const char *text, const char *name)
{
	char pat[128];
	const char *p = text;

	snprintf(pat, sizeof(pat), "\n%s ", name);
	p = strstr(p, pat);
	return p ? strtod(p + strlen(pat), NULL) : -1;
}

START_TEST(test_one_uid_cannot_inflate_the_host_unbrokered_figure)
{
	uint64_t total = mem_total();
	struct outcome oa, ob;
	struct pb_status *s;
	const struct pb_unbrokered_uid *ra, *rb;
	const struct pb_client_info *cb = NULL;
	char *out = NULL, *log;
	double v;
	int i;

	if (total >= 16 * TiB) {
		printf("SKIP: this host has 16 TiB or more; the absurd report must be above MemTotal\n");
		return;
	}
	/* Uid A: 100 connections report 16 TiB each, 100 report the whole host's MemTotal each. */
	child_a = start_reporter(SEC_UID_A, A_CONNECTIONS, 16 * TiB, total, &oa);
	/* Uid B: one honest report of 64 MiB. */
	child_b = start_reporter(SEC_UID_B, 1, B_REPORT_BYTES, B_REPORT_BYTES, &ob);
	ck_assert_int_eq(ob.ok, 3);
	ck_assert_int_eq(ob.invalid + ob.other, 0);

	s = itest_status(d.socket);
	ck_assert_ptr_nonnull(s);
	/* The host total shown never exceeds MemTotal, nor does all that is pinned (pool, registrations, reports). */
	ck_assert_msg(s->unbrokered_bytes <= total, "unbrokered %" PRIu64 " bytes on a host of %" PRIu64,
		      s->unbrokered_bytes, total);
	ck_assert_uint_le(s->pool_bytes + s->registered_bytes + s->unbrokered_bytes, total);
	/* A report above MemTotal is refused, each time (connection 0 reports three times), and nothing else fails. */
	ck_assert_int_eq(oa.other, 0);
	ck_assert_int_eq(oa.invalid, A_CONNECTIONS / 2 + 2);
	ck_assert_int_eq(oa.ok, A_CONNECTIONS / 2);
	ck_assert_uint_le(s->unbrokered_cap_bytes, total);
	ck_assert_uint_eq(s->unbrokered_bytes, s->unbrokered_cap_bytes);
	/* What was reported, before the caps, is still there to see: 100 x MemTotal from A, 64 MiB from B. */
	ck_assert_uint_eq(s->unbrokered_reported_bytes, (A_CONNECTIONS / 2) * total + B_REPORT_BYTES);
	/* Uid A's sum is capped; uid B's honest report still shows, whole. */
	ra = uid_row(s, SEC_UID_A);
	rb = uid_row(s, SEC_UID_B);
	ck_assert_ptr_nonnull(ra);
	ck_assert_ptr_nonnull(rb);
	ck_assert_uint_eq(ra->connections, A_CONNECTIONS / 2);
	ck_assert_uint_eq(ra->reported_bytes, (A_CONNECTIONS / 2) * total);
	ck_assert_uint_le(ra->counted_bytes, total);
	ck_assert_uint_eq(rb->connections, 1);
	ck_assert_uint_eq(rb->reported_bytes, B_REPORT_BYTES);
	ck_assert_uint_eq(rb->counted_bytes, B_REPORT_BYTES);
	/* The largest report first: A names itself. */
	ck_assert_uint_eq(s->unbrokered_uids[0].uid, SEC_UID_A);
	for (size_t k = 0; k < s->n_clients; k++)
		if (s->clients[k].uid == SEC_UID_B)
			cb = &s->clients[k];
	ck_assert_ptr_nonnull(cb);
	ck_assert_uint_eq(cb->unbrokered_bytes, B_REPORT_BYTES);
	pb_status_free(s);

	/* pinctl status, text and JSON: capped, and said to be the clients' word. */
	ck_assert_int_eq(pinctl(&d, &out, "status"), 0);
	ck_assert_msg(strstr(out, "pinned outside the budget, reported by clients, not verified"), "status: %s", out);
	ck_assert_msg(!strstr(out, "PiB"), "status shows PiB: %s", out);
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "status --json"), 0);
	ck_assert_msg(strstr(out, "\"unbrokered_source\":\"reported by clients, not verified\""), "json: %s", out);
	ck_assert_uint_le(json_number(out, "unbrokered_bytes"), total);
	free(out);
	/* The metrics: the figure capped, its help says it is reported and not verified. */
	ck_assert_int_eq(pinctl(&d, &out, "metrics"), 0);
	v = metric(out, "pinbroker_unbrokered_bytes");
	ck_assert_msg(v >= 0 && v <= (double)total, "pinbroker_unbrokered_bytes %g on a host of %" PRIu64, v, total);
	ck_assert_msg(strstr(out, "# HELP pinbroker_unbrokered_bytes Pinned outside the budget, reported by clients, "
				  "not verified"),
		      "metrics: %s", out);
	free(out);

	/* Refusals are logged once per connection (connection 0's three count once) and rate-limited. */
	log = daemon_log(&d);
	ck_assert_ptr_nonnull(log);
	ck_assert_uint_ge(sec_count(log, "more than the host's MemTotal"), 1);
	ck_assert_uint_le(sec_count(log, "more than the host's MemTotal"), A_CONNECTIONS / 2);
	free(log);

	/* A's connections go: B's honest 64 MiB is the whole figure again (bounded poll). */
	reap(&child_a);
	for (i = 0; i < 500; i++) {
		s = itest_status(d.socket);
		ck_assert_ptr_nonnull(s);
		if (s->unbrokered_bytes == B_REPORT_BYTES && s->unbrokered_reported_bytes == B_REPORT_BYTES) {
			ck_assert_ptr_null(uid_row(s, SEC_UID_A));
			pb_status_free(s);
			break;
		}
		pb_status_free(s);
		nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 }, NULL);
	}
	ck_assert_int_lt(i, 500);
}
END_TEST

CHECK_SUITE(suite, "sec_18_unbrokered_cap", "cap", start, stop, 60,
	    test_one_uid_cannot_inflate_the_host_unbrokered_figure)

SEC_MAIN(suite)

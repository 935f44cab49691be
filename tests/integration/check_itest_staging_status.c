/* SPDX-License-Identifier: MIT */
/*
 * Integration: staged copies made visible (issue 39, item 3), against the real pinbrokerd and pinctl. A client
 * takes a staging ring (PB_ACQUIRE_STAGING_RING) and reports its counters (staging_report_send, the library's own
 * call, linked from its objects); status, `pinctl status`, `pinctl leases` and the metrics must show exactly
 * that. A report that goes back is refused and harms nothing; a closed connection's row goes, its totals stay.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "itest.h"
#include "lib-int.h"
#include "pinbroker.h"
#include "wire.h"
#include "wirefix.h"

#define MiB (1024ull * 1024ull)
#define GiB (1024ull * MiB)

static struct daemon d;

ITEST_FIXTURE_START(start, d, NULL)

ITEST_FIXTURE_STOP(stop, d)

static const struct pb_acquire_opts ring_opts = { .flags = PB_ACQUIRE_STAGING_RING, .label = "staging ring" };

/* The client row of pid that carries staged copies into *out; false when there is none. */
static bool client_staging_of(const struct pb_status *s, pid_t pid, struct pb_client_staging *out)
{
	for (size_t i = 0; i < s->n_clients; i++)
		if (s->clients[i].pid == pid && pb_status_client_staging(s, i, out) == 1)
			return true;
	return false;
}

/* Wait (5 s at most) for pid's row to show h2d_bytes (a report is sent without waiting); fail with what it shows. */
static void wait_reported(pid_t pid, uint64_t h2d_bytes, struct pb_client_staging *out)
{
	uint64_t until = itest_now_ms() + 5000, seen = 0;

	for (;;) {
		struct pb_status *s = itest_status(d.socket);
		bool have = client_staging_of(s, pid, out);

		pb_status_free(s);
		seen = have ? out->h2d_bytes : 0;
		if (have && seen == h2d_bytes)
			return;
		ck_assert_msg(itest_now_ms() < until,
			      "pid %d's status row shows %" PRIu64 " staged H2D bytes, wanted %" PRIu64, (int)pid, seen,
			      h2d_bytes);
		usleep(10000);
	}
}

static double metric(const char *name)
{
	char *out = NULL;
	double v;

	ck_assert_int_eq(pinctl(&d, &out, "metrics"), 0);
	v = itest_metrics_sample(out, name);
	ck_assert_msg(v >= 0, "pinctl metrics has no %s:\n%s", name, itest_tail(out));
	free(out);
	return v;
}

/* Wait (5 s at most) for a metric to read want (a RELEASE is sent without waiting). */
static void wait_metric(const char *name, double want)
{
	uint64_t until = itest_now_ms() + 5000;
	double v;

	while ((v = metric(name)) != want) {
		ck_assert_msg(itest_now_ms() < until, "%s reads %g, wanted %g", name, v, want);
		usleep(10000);
	}
}

static void expect_out(const char *args, const char *needle)
{
	char *out = NULL;

	ck_assert_int_eq(pinctl(&d, &out, "%s", args), 0);
	ck_assert_msg(strstr(out, needle), "pinctl %s does not say %s:\n%s", args, needle, itest_tail(out));
	free(out);
}

START_TEST(test_ring_and_reports_show_in_status_leases_and_metrics)
{
	struct pb_staging_stats st = { .h2d_bytes = 3 * GiB,
				       .d2h_bytes = 1 * GiB,
				       .h2d_copies = 24,
				       .d2h_copies = 8,
				       .driver_copies = 5,
				       .ring_revoked = 1,
				       .ring_refused = 2,
				       .busy_ns = 123456789 };
	struct pb_client_staging cs;
	struct pb_status_staging sum;
	const struct pb_lease_info *row;
	struct pb_status *s;
	pb_lease *ring, *plain;
	pb_client *c;
	char needle[256];

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &ring_opts, &ring), 0);
	ck_assert_int_eq(pb_acquire(c, 2 * MiB, &(struct pb_acquire_opts){ .label = "plain" }, &plain), 0);
	ck_assert_int_eq(staging_report_send(c, &st), 0);
	wait_reported(getpid(), 3 * GiB, &cs);

	/* The row says exactly what was reported, and the ring the daemon's books hold. */
	ck_assert_uint_eq(cs.d2h_bytes, 1 * GiB);
	ck_assert_uint_eq(cs.h2d_copies, 24);
	ck_assert_uint_eq(cs.d2h_copies, 8);
	ck_assert_uint_eq(cs.driver_copies, 5);
	ck_assert_uint_eq(cs.ring_revoked, 1);
	ck_assert_uint_eq(cs.ring_refused, 2);
	ck_assert_uint_eq(cs.busy_ns, 123456789);
	ck_assert_uint_eq(cs.rings, 1);
	ck_assert_uint_eq(cs.ring_bytes, 4 * MiB);
	/* One report within the window: the rate is its bytes over the time since the connection began, > 0. */
	ck_assert_uint_gt(cs.h2d_bytes_per_s, 0);
	ck_assert_uint_gt(cs.d2h_bytes_per_s, 0);

	s = itest_status(d.socket);
	ck_assert_int_eq(pb_status_staging(s, &sum), 0);
	ck_assert_uint_eq(sum.rings, 1);
	ck_assert_uint_eq(sum.ring_bytes, 4 * MiB);
	ck_assert_uint_eq(sum.h2d_bytes, 3 * GiB);
	ck_assert_uint_eq(sum.d2h_bytes, 1 * GiB);
	row = itest_lease_row(s, pb_lease_id(ring));
	ck_assert_ptr_nonnull(row);
	ck_assert_int_eq(row->staging_ring, 1);
	ck_assert_int_eq(row->no_revoke, 0); /* a ring is a normal, revocable lease */
	row = itest_lease_row(s, pb_lease_id(plain));
	ck_assert_ptr_nonnull(row);
	ck_assert_int_eq(row->staging_ring, 0);
	pb_status_free(s);

	/* pinctl status, both forms. */
	expect_out("status",
		   "staging:      1 ring holding 4 MiB; staged since start 3 GiB host to GPU, 1 GiB GPU to host");
	expect_out("status", "staged copies (reported by clients");
	snprintf(needle, sizeof(needle), "%-8d %-10s %-10s", (int)getpid(), "3 GiB", "1 GiB");
	expect_out("status", needle);
	expect_out("status --json", "\"staging_rings\":1,\"staging_ring_bytes\":4194304,");
	snprintf(needle, sizeof(needle),
		 "\"staging\":{\"h2d_bytes\":%llu,\"d2h_bytes\":%llu,\"h2d_copies\":24,\"d2h_copies\":8,"
		 "\"driver_copies\":5,",
		 3 * GiB, 1 * GiB);
	expect_out("status --json", needle);
	expect_out("status --json", "\"rings\":1,\"ring_revoked\":1,\"ring_refused\":2,\"busy_ns\":123456789}");
	expect_out("status -o staging_rings,staging_ring_bytes --no-headers", "4194304");

	/* pinctl leases names the ring, and only the ring. */
	expect_out("leases", "STAGING RING");
	expect_out("leases --json", "\"staging_ring\":true");
	expect_out("leases --json", "\"staging_ring\":false");
	{
		char *out = NULL, *first;

		ck_assert_int_eq(pinctl(&d, &out, "leases"), 0);
		first = strstr(out, "STAGING RING");
		ck_assert_ptr_nonnull(first);
		ck_assert_msg(!strstr(first + 1, "STAGING RING"), "two leases named rings:\n%s", out);
		free(out);
	}

	/* The metrics. */
	ck_assert_double_eq(metric("pinbroker_staged_bytes_total{direction=\"h2d\"}"), (double)(3 * GiB));
	ck_assert_double_eq(metric("pinbroker_staged_bytes_total{direction=\"d2h\"}"), (double)(1 * GiB));
	ck_assert_double_eq(metric("pinbroker_staged_copies_total{direction=\"h2d\"}"), 24);
	ck_assert_double_eq(metric("pinbroker_staged_copies_total{direction=\"d2h\"}"), 8);
	ck_assert_double_eq(metric("pinbroker_staging_driver_copies_total"), 5);
	ck_assert_double_eq(metric("pinbroker_staging_rings"), 1);
	ck_assert_double_eq(metric("pinbroker_staging_ring_bytes"), (double)(4 * MiB));

	/* A second report adds only its step to the totals; the ring given back leaves the books. */
	st.h2d_bytes += 1 * GiB;
	st.h2d_copies += 8;
	ck_assert_int_eq(staging_report_send(c, &st), 0);
	wait_reported(getpid(), 4 * GiB, &cs);
	ck_assert_double_eq(metric("pinbroker_staged_bytes_total{direction=\"h2d\"}"), (double)(4 * GiB));
	ck_assert_double_eq(metric("pinbroker_staged_copies_total{direction=\"h2d\"}"), 32);
	ck_assert_int_eq(pb_release(c, ring), 0);
	ck_assert_int_eq(pb_release(c, plain), 0);
	wait_metric("pinbroker_staging_rings", 0);
	ck_assert_double_eq(metric("pinbroker_staging_ring_bytes"), 0);
	pb_disconnect(c);
}
END_TEST

/* One ReportStaging on a raw connection; the reply's status, its message in msg. */
static int raw_report(int fd, uint64_t seq, uint64_t h2d_bytes, uint64_t h2d_copies, char *msg, size_t len)
{
	Pinbroker__V1__Request req;
	Pinbroker__V1__ReportStaging rs;

	wirefix_report_staging(&req, &rs, h2d_bytes, h2d_copies);
	return raw_call(fd, &req, seq, msg, len, 5000);
}

START_TEST(test_backwards_or_absurd_report_is_refused_and_the_last_stands)
{
	struct pb_client_staging cs;
	char msg[512];
	int fd = raw_connect(d.socket);
	pb_client *c;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(raw_hello(fd), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_int_eq(raw_report(fd, 2, 100 * MiB, 10, msg, sizeof(msg)), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	/* Backwards: refused, saying which counter and what to send. */
	ck_assert_int_eq(raw_report(fd, 3, 50 * MiB, 10, msg, sizeof(msg)),
			 PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT);
	ck_assert_msg(strstr(msg, "h2d_bytes") && strstr(msg, "went back") && strstr(msg, "cumulative"), "%s", msg);
	/* Absurd: past any counter a connection could reach, and more copies than bytes. */
	ck_assert_int_eq(raw_report(fd, 4, 1ull << 60, 10, msg, sizeof(msg)),
			 PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT);
	ck_assert_int_eq(raw_report(fd, 5, 200 * MiB, 300 * MiB, msg, sizeof(msg)),
			 PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT);
	ck_assert_msg(strstr(msg, "copies"), "%s", msg);
	/* More than a host copies in the time since the last report (2^42 B/s, 64 GiB slack): 16 TiB at once. */
	ck_assert_int_eq(raw_report(fd, 6, 16384 * GiB, 10, msg, sizeof(msg)),
			 PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT);
	/* The connection and the daemon go on; the last accepted report stands. */
	ck_assert_int_eq(raw_status(fd), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	wait_reported(getpid(), 100 * MiB, &cs);
	ck_assert_uint_eq(cs.h2d_copies, 10);
	ck_assert_double_eq(metric("pinbroker_staged_bytes_total{direction=\"h2d\"}"), (double)(100 * MiB));
	/* Forward again is taken. */
	ck_assert_int_eq(raw_report(fd, 7, 150 * MiB, 11, msg, sizeof(msg)), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	close(fd);

	/* The library's connection drops a refusal's answer: the report was sent, the connection stays. */
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(staging_report_send(c, &(struct pb_staging_stats){ .h2d_bytes = 8 * MiB, .h2d_copies = 1 }),
			 0);
	ck_assert_int_eq(staging_report_send(c, &(struct pb_staging_stats){ .h2d_bytes = 1 * MiB, .h2d_copies = 1 }),
			 0);
	{
		struct pb_status *s;

		ck_assert_int_eq(pb_status_get(c, &s), 0);
		ck_assert_msg(client_staging_of(s, getpid(), &cs) && cs.h2d_bytes == 8 * MiB,
			      "the library's connection shows %" PRIu64 " staged bytes after a refused report",
			      cs.h2d_bytes);
		pb_status_free(s);
	}
	ck_assert(daemon_alive(&d));
	pb_disconnect(c);
}
END_TEST

START_TEST(test_closed_connection_keeps_totals_and_drops_its_row)
{
	struct pb_client_staging cs;
	struct pb_status_staging sum;
	struct pb_status *s;
	int p[2];
	pid_t child;

	ck_assert_int_eq(pipe(p), 0);
	child = itest_fork();
	if (child == 0) {
		pb_client *c;
		pb_lease *ring;

		close(p[0]);
		if (pb_connect(d.socket, &c) < 0 || pb_acquire(c, 4 * MiB, &ring_opts, &ring) < 0 ||
		    staging_report_send(c, &(struct pb_staging_stats){ .h2d_bytes = 64 * MiB,
								       .d2h_bytes = 32 * MiB,
								       .h2d_copies = 4,
								       .d2h_copies = 2 }) < 0)
			_exit(1);
		itest_say(p[1], 'r');
		/* Until the parent has looked, then gone without a word: the connection closes with the process. */
		pause();
		_exit(0);
	}
	close(p[1]);
	ck_assert_int_eq(itest_hear(p[0], 10), 'r');
	wait_reported(child, 64 * MiB, &cs);
	ck_assert_uint_eq(cs.rings, 1);
	ck_assert_int_eq(itest_kill_and_reap(child), SIGKILL);
	close(p[0]);

	/* Its ring goes with it (no exit hold: the process is gone), its row too; the totals stay. */
	for (uint64_t until = itest_now_ms() + 5000;; usleep(10000)) {
		s = itest_status(d.socket);
		ck_assert_int_eq(pb_status_staging(s, &sum), 0);
		if (sum.rings == 0 && !client_staging_of(s, child, &cs))
			break;
		pb_status_free(s);
		ck_assert_msg(itest_now_ms() < until, "a closed connection's ring or row stays: %u rings", sum.rings);
	}
	ck_assert_uint_eq(sum.ring_bytes, 0);
	ck_assert_uint_eq(sum.h2d_bytes, 64 * MiB);
	ck_assert_uint_eq(sum.d2h_bytes, 32 * MiB);
	pb_status_free(s);
	ck_assert_double_eq(metric("pinbroker_staged_bytes_total{direction=\"h2d\"}"), (double)(64 * MiB));
	ck_assert_double_eq(metric("pinbroker_staged_bytes_total{direction=\"d2h\"}"), (double)(32 * MiB));
	ck_assert_double_eq(metric("pinbroker_staged_copies_total{direction=\"d2h\"}"), 2);
	ck_assert_double_eq(metric("pinbroker_staging_rings"), 0);
}
END_TEST

/* Another uid sees the host's staging figures (as it sees leased_bytes) but not root's client row or its ring. */
START_TEST(test_another_uid_sees_no_other_uids_staging_rows)
{
	struct pb_client_staging cs;
	pb_client *c;
	pb_lease *ring;
	char *out = NULL;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &ring_opts, &ring), 0);
	ck_assert_int_eq(staging_report_send(c, &(struct pb_staging_stats){ .h2d_bytes = 5 * MiB, .h2d_copies = 1 }),
			 0);
	wait_reported(getpid(), 5 * MiB, &cs);
	ck_assert_int_eq(pinctl_as(&d, 61001, &out, "status --json"), 0);
	ck_assert_msg(strstr(out, "\"staging_rings\":1,") && strstr(out, "\"staged_h2d_bytes\":5242880,"),
		      "uid 61001 misses the host's figures: %s", itest_tail(out));
	ck_assert_msg(!strstr(out, "\"staging\":{"), "uid 61001 sees root's staging row: %s", itest_tail(out));
	free(out);
	ck_assert_int_eq(pinctl_as(&d, 61001, &out, "leases --json"), 0);
	ck_assert_msg(!strstr(out, "\"staging_ring\":true"), "uid 61001 sees root's ring: %s", itest_tail(out));
	free(out);
	ck_assert_int_eq(pinctl_as(&d, 61001, &out, "status"), 0);
	ck_assert_msg(!strstr(out, "staged copies ("), "uid 61001 sees root's staging row: %s", itest_tail(out));
	free(out);
	ck_assert_int_eq(pb_release(c, ring), 0);
	pb_disconnect(c);
}
END_TEST

/* What a client that knows nothing of staging sees and shows: no ring, no staging part, null in the JSON. */
START_TEST(test_client_without_staging_shows_none)
{
	struct pb_client_staging cs;
	struct pb_status_staging sum;
	struct pb_status *s;
	pb_client *c;
	pb_lease *l;
	char *out = NULL;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_acquire(c, 2 * MiB, &(struct pb_acquire_opts){ .label = "old" }, &l), 0);
	ck_assert_int_eq(pb_status_get(c, &s), 0);
	for (size_t i = 0; i < s->n_clients; i++)
		ck_assert_int_eq(pb_status_client_staging(s, i, &cs), 0);
	ck_assert_int_eq(pb_status_client_staging(s, s->n_clients, &cs), -EINVAL);
	ck_assert_int_eq(pb_status_staging(s, &sum), 0);
	ck_assert_uint_eq(sum.rings, 0);
	ck_assert_int_eq(itest_lease_row(s, pb_lease_id(l))->staging_ring, 0);
	pb_status_free(s);
	ck_assert_int_eq(pinctl(&d, &out, "status --json"), 0);
	ck_assert_msg(strstr(out, "\"staging\":null") && !strstr(out, "\"staging\":{"), "%s", itest_tail(out));
	free(out);
	ck_assert_int_eq(pinctl(&d, &out, "status"), 0);
	ck_assert_msg(!strstr(out, "staging:") && !strstr(out, "staged copies"), "%s", itest_tail(out));
	free(out);
	ck_assert_int_eq(pb_release(c, l), 0);
	pb_disconnect(c);
}
END_TEST

/* The daemon counts each connection from 0: after a reconnect the library sends only what came since. */
START_TEST(test_reconnected_client_reports_from_its_new_connection)
{
	struct pb_staging_stats st = { .h2d_bytes = 64 * MiB, .h2d_copies = 4 };
	struct pb_client_staging cs;
	struct pb_status *s;
	pb_client *c;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(staging_report_send(c, &st), 0);
	wait_reported(getpid(), 64 * MiB, &cs);
	ck_assert_int_eq(daemon_stop(&d), 0);
	daemon_restart(&d, NULL);
	/* A call that waits reconnects (a report never waits for that). */
	ck_assert_int_eq(pb_status_get(c, &s), 0);
	pb_status_free(s);
	st.h2d_bytes = 96 * MiB;
	st.h2d_copies = 6;
	ck_assert_int_eq(staging_report_send(c, &st), 0);
	wait_reported(getpid(), 32 * MiB, &cs);
	ck_assert_uint_eq(cs.h2d_copies, 2);
	ck_assert_double_eq(metric("pinbroker_staged_bytes_total{direction=\"h2d\"}"), (double)(32 * MiB));
	pb_disconnect(c);
}
END_TEST

/*
 * A daemon from before ReportStaging (its HELLO does not say staging, as one built before it): exits 0 when the
 * client sent it nothing after HELLO before closing, 1 when it sent something (such a daemon closes the connection
 * on a kind it does not know), 2 when its own part failed.
 */
static int old_daemon(int listener)
{
	static uint8_t buf[65536];
	Pinbroker__V1__HelloReply hr = PINBROKER__V1__HELLO_REPLY__INIT;
	Pinbroker__V1__Reply rep = PINBROKER__V1__REPLY__INIT;
	Pinbroker__V1__Request *req;
	size_t nfds = 0, len;
	int fds[4], fd = accept(listener, NULL, NULL);
	ssize_t n;

	if (fd < 0 || (n = wire_recv(fd, buf, sizeof(buf), fds, 4, &nfds)) <= 0)
		return 2;
	req = pinbroker__v1__request__unpack(NULL, (size_t)n, buf);
	if (!req || req->body_case != PINBROKER__V1__REQUEST__BODY_HELLO)
		return 2;
	hr.version = PB_PROTOCOL_VERSION;
	hr.has_registrations = hr.registrations = true;
	rep.has_seq = true;
	rep.seq = req->seq;
	rep.status = PINBROKER__V1__STATUS_CODE__STATUS_OK;
	rep.body_case = PINBROKER__V1__REPLY__BODY_HELLO;
	rep.hello = &hr;
	pinbroker__v1__request__free_unpacked(req, NULL);
	len = pinbroker__v1__reply__pack(&rep, buf);
	if (wire_send(fd, buf, len, NULL, 0) < 0)
		return 2;
	n = wire_recv(fd, buf, sizeof(buf), fds, 4, &nfds);
	return n == 0 ? 0 : 1;
}

START_TEST(test_old_daemon_is_sent_no_report)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int listener = socket(AF_UNIX, SOCK_SEQPACKET, 0), status;
	pb_client *c;
	pid_t child;

	ck_assert_int_ge(listener, 0);
	ck_assert_int_lt(strlen(d.dir) + strlen("/old.sock"), sizeof(sa.sun_path));
	memcpy(sa.sun_path, d.dir, strlen(d.dir));
	memcpy(sa.sun_path + strlen(d.dir), "/old.sock", sizeof("/old.sock"));
	ck_assert_int_eq(bind(listener, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(listener, 1), 0);
	child = itest_fork();
	if (child == 0)
		_exit(old_daemon(listener));
	close(listener);
	ck_assert_int_eq(pb_connect(sa.sun_path, &c), 0);
	ck_assert_int_eq(staging_report_send(c, &(struct pb_staging_stats){ .h2d_bytes = MiB, .h2d_copies = 1 }),
			 -EOPNOTSUPP);
	pb_disconnect(c);
	ck_assert_int_eq(waitpid(child, &status, 0), child);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the old daemon %s (status %#x)",
		      WIFEXITED(status) && WEXITSTATUS(status) == 1 ? "was sent a request after HELLO" : "failed",
		      status);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-staging-status");

	CHECK_CASE(s, "staging-status", start, stop, 60, test_ring_and_reports_show_in_status_leases_and_metrics,
		   test_backwards_or_absurd_report_is_refused_and_the_last_stands,
		   test_closed_connection_keeps_totals_and_drops_its_row, test_client_without_staging_shows_none,
		   test_old_daemon_is_sent_no_report, test_reconnected_client_reports_from_its_new_connection);
	if (geteuid() == 0)
		CHECK_CASE(s, "tenancy", start, stop, 60, test_another_uid_sees_no_other_uids_staging_rows);
	else
		check_skip("SKIP tenancy: running pinctl as another uid needs root");
	return s;
}

CHECK_MAIN(suite)

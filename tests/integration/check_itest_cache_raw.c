/* SPDX-License-Identifier: MIT */
/*
 * Integration: the daemon's side of the client cache's races (issue 25), over the raw protocol with no library
 * in between. A never-revoked lease taken back into use (SET_IDLE 0) while its REVOKE is on the way, or left
 * alone past the deadline, is the holder's again: never overdue, its process never signalled; a registration is
 * still refused SET_IDLE; many such revokes cancelled at once are counted and their log lines rate-limited. The
 * library's side: check_itest_cache.c.
 */
#define _GNU_SOURCE
#include "cache_fixture.h"

/*
 * A connection to the daemon made by a child, then handed to this process (SCM_RIGHTS): the daemon takes the
 * child's pid for the lease's holder, so any signal enforcement sends goes to the child, and the child's death
 * tells which. The child waits to be killed. Returns the connection; *pid is the child.
 */
static int raw_connect_by_child(pid_t *pid)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	int sp[2], fd = -1;
	char byte = 'f';
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	struct pollfd p;
	struct cmsghdr *cm;

	memset(&u, 0, sizeof(u));
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sp), 0);
	*pid = itest_fork();
	ck_assert_int_ge(*pid, 0);
	if (*pid == 0) {
		close(sp[0]);
		fd = raw_connect(d.socket);
		if (fd < 0)
			_exit(1);
		cm = CMSG_FIRSTHDR(&m);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(fd));
		if (sendmsg(sp[1], &m, 0) != 1)
			_exit(2);
		close(fd);
		for (;;)
			pause();
	}
	close(sp[1]);
	p = (struct pollfd){ .fd = sp[0], .events = POLLIN };
	ck_assert_msg(poll(&p, 1, WAIT_MS) == 1, "the child did not hand over its connection");
	ck_assert_int_eq(recvmsg(sp[0], &m, 0), 1);
	cm = CMSG_FIRSTHDR(&m);
	ck_assert_ptr_nonnull(cm);
	ck_assert_int_eq(cm->cmsg_type, SCM_RIGHTS);
	memcpy(&fd, CMSG_DATA(cm), sizeof(fd));
	close(sp[0]);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(raw_hello(fd), 0);
	return fd;
}

/* ACQUIRE size with flags (Acquire.flags); the fds are closed at once. Returns the reply status, or -errno. */
static int raw_acquire_closed(int fd, uint64_t size, uint32_t flags, uint64_t *id)
{
	int fds[64];
	size_t n = 0;
	int r = raw_acquire_flags(fd, size, flags, id, fds, 64, &n);

	for (size_t i = 0; i < n; i++)
		close(fds[i]);
	return r;
}

/* The next message on fd must be a REVOKE for id. */
static void expect_revoke(int fd, uint64_t id)
{
	int fds[4], err = 0;
	size_t n = 0;
	Pinbroker__V1__Reply *rep = raw_recv(fd, fds, 4, &n, WAIT_MS, &err);

	ck_assert_msg(rep, "no REVOKE came (%s)", strerror(-err));
	ck_assert_int_eq(rep->body_case, PINBROKER__V1__REPLY__BODY_REVOKE);
	ck_assert_uint_eq(rep->revoke->lease_id, id);
	pinbroker__v1__reply__free_unpacked(rep, NULL);
}

/* A never-revoked lease acquired over fd (held by the child *pid), told idle: the daemon shows it idle. */
static uint64_t raw_idle_no_revoke_lease(int fd, pid_t holder)
{
	const struct pb_lease_info *row;
	struct pb_status *s;
	uint64_t id = 0;

	ck_assert_int_eq(raw_acquire_closed(fd, 4 * MiB, PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_NO_REVOKE, &id), 0);
	s = itest_status(d.socket);
	row = itest_lease_row(s, id);
	ck_assert_ptr_nonnull(row);
	ck_assert_int_eq(row->no_revoke, 1);
	ck_assert_int_eq(row->pid, holder);
	ck_assert_str_eq(row->state, "active");
	pb_status_free(s);
	/* Before issue 25 the daemon refused this (-EBUSY): a never-revoked lease could not be idle. */
	ck_assert_int_eq(raw_set_idle(fd, id, true), 0);
	assert_state_now(id, "idle");
	return id;
}

/* The holder was never signalled: only our SIGKILL ends it, and the daemon logged no signal for it. */
static void assert_holder_not_signalled(pid_t holder)
{
	char needle[64];
	char *log;

	snprintf(needle, sizeof(needle), " to pid %d for overdue lease", (int)holder);
	log = daemon_log(&d);
	ck_assert_msg(!strstr(log + d.log_from, needle), "the daemon signalled the holder: %s", itest_tail(log));
	free(log);
	ck_assert_int_eq(itest_wait_end(holder, 0), -1);
	ck_assert_int_eq(itest_kill_and_reap(holder), SIGKILL);
}

START_TEST(test_raw_set_idle_0_takes_a_revoked_cached_lease_back_and_it_stays_active)
{
	pid_t holder, sentinel;
	int fd = raw_connect_by_child(&holder);
	uint64_t id = raw_idle_no_revoke_lease(fd, holder), sid = 0, *ids = NULL;
	struct pb_status *s;
	pb_client *admin;
	size_t n = 0;
	bool seen_id = false, seen_sid = false;

	/* A plain lease revoked with it, at the same deadline: its going overdue shows the round ran. */
	sentinel = itest_hold_lease(d.socket, 2 * MiB, "sentinel");
	s = itest_status(d.socket);
	for (size_t i = 0; i < s->n_leases; i++)
		if (strcmp(s->leases[i].label, "sentinel") == 0)
			sid = s->leases[i].id;
	pb_status_free(s);
	ck_assert_uint_ne(sid, 0);
	ck_assert_uint_gt(sid, id); /* revoked after it, so its deadline is no earlier */

	ck_assert_int_eq(pb_connect(d.socket, &admin), 0);
	ck_assert_int_eq(pb_admin_revoke(admin, PB_REVOKE_UID, 0, getuid(), TAKE_BACK_DEADLINE_MS, &ids, &n), 0);
	for (size_t i = 0; i < n; i++) {
		seen_id |= ids[i] == id;
		seen_sid |= ids[i] == sid;
	}
	free(ids);
	ck_assert_msg(n == 2 && seen_id && seen_sid, "revoked %zu leases", n);
	expect_revoke(fd, id);
	assert_state_now(id, "revoking");

	/* The holder's library took it back from its cache before the REVOKE reached it: it is in use again. */
	ck_assert_int_eq(raw_set_idle(fd, id, false), 0);
	assert_state_now(id, "active");
	ck_assert(log_says_of_lease(id, "taken back into use"));

	/* The deadline passes and the round runs (the sentinel is overdue, or gone with its SIGTERM). */
	for (uint64_t t0 = itest_now_ms();; usleep(10000)) {
		char *st = lease_state(sid);
		bool done = !st || strcmp(st, "overdue") == 0;

		free(st);
		if (done)
			break;
		ck_assert_msg(itest_now_ms() - t0 < WAIT_MS, "the sentinel lease never went overdue");
	}
	assert_state_now(id, "active");
	ck_assert(!log_says_of_lease(id, "overdue"));
	ck_assert(!log_says_of_lease(id, "not given back"));

	ck_assert_int_eq(raw_release(fd, id), 0);
	close(fd);
	assert_holder_not_signalled(holder);
	itest_kill_child(&sentinel);
	pb_disconnect(admin);
	end_clean(NULL);
}
END_TEST

START_TEST(test_raw_revoked_cached_lease_left_alone_is_kept_as_in_use_never_overdue)
{
	pid_t holder;
	int fd = raw_connect_by_child(&holder);
	uint64_t id = raw_idle_no_revoke_lease(fd, holder), *ids = NULL;
	char needle[96];
	pb_client *admin;
	size_t n = 0;

	ck_assert_int_eq(pb_connect(d.socket, &admin), 0);
	ck_assert_int_eq(pb_admin_revoke(admin, PB_REVOKE_LEASE, id, 0, 0, &ids, &n), 0);
	ck_assert_uint_eq(n, 1);
	free(ids);
	expect_revoke(fd, id);
	assert_state_now(id, "revoking");

	/* It neither gives it back nor takes it back: past the deadline, the daemon keeps it as in use. */
	snprintf(needle, sizeof(needle), "lease %llu (pid %d): a never-revoked lease revoked while cached",
		 (unsigned long long)id, (int)holder);
	ck_assert_msg(daemon_wait_log(&d, needle, WAIT_MS), "no warning for lease %llu: %s", (unsigned long long)id,
		      daemon_log_excerpt(&d));
	ck_assert(log_says_of_lease(id, "kept as in use"));
	assert_state_now(id, "active");
	ck_assert(!log_says_of_lease(id, "is overdue"));

	/* The holder's again: in use, an admin revoke is refused; told idle again, it is revocable again. */
	ck_assert_int_lt(pb_admin_revoke(admin, PB_REVOKE_LEASE, id, 0, 0, NULL, NULL), 0);
	ck_assert_int_eq(raw_set_idle(fd, id, true), 0);
	assert_state_now(id, "idle");
	ck_assert_int_eq(raw_set_idle(fd, id, false), 0);
	assert_state_now(id, "active");

	ck_assert_int_eq(raw_release(fd, id), 0);
	close(fd);
	assert_holder_not_signalled(holder);
	pb_disconnect(admin);
	end_clean(NULL);
}
END_TEST

START_TEST(test_raw_registration_is_still_refused_set_idle)
{
	int fd = raw_connect(d.socket);
	uint64_t id = 0;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(raw_hello(fd), 0);
	ck_assert_int_eq(raw_acquire_closed(fd, 64 * KiB, PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_REGISTER_ONLY, &id),
			 0);
	ck_assert_int_ne(raw_set_idle(fd, id, true), 0);
	assert_state_now(id, "active");
	ck_assert_int_eq(raw_release(fd, id), 0);
	close(fd);
	end_clean(NULL);
}
END_TEST

/* More than the daemon's LOG_RATELIMIT_BURST (20 lines of one event kind in 5 s). */
#define STORM_LEASES 30

/* A budget and a never-revoked share that fit STORM_LEASES small leases, each one 64 KiB chunk. */
static void start_storm(void)
{
	atexit(kill_daemon_at_exit);
	daemon_start(&d, ITEST_ARGS("--budget", "64M", "--max-no-revoke-per-uid", "100%", "--prewarm", "0",
				    "--chunk-size", "64K", "--pool-shrink-delay-ms", "600000"));
}

/* How many lines of the daemon's log since its start say what. */
static size_t log_count(const char *what)
{
	char *log = daemon_log(&d);
	size_t n = 0;

	for (char *p = log ? log + d.log_from : NULL; p && (p = strstr(p, what)); p += strlen(what))
		n++;
	free(log);
	return n;
}

/*
 * A revoke of many cached never-revoked leases, all taken back into use at once: every one is kept and counted
 * in pinbroker_revokes_cancelled_total, and the log says so at most a burst's worth of times.
 */
START_TEST(test_cancelled_revokes_are_counted_and_their_log_lines_rate_limited)
{
	pid_t holder;
	int fd = raw_connect_by_child(&holder);
	uint64_t ids[STORM_LEASES], *revoked = NULL;
	size_t n = 0, got = 0;
	pb_client *admin;
	char *text = NULL;

	for (size_t i = 0; i < STORM_LEASES; i++) {
		ck_assert_int_eq(
			raw_acquire_closed(fd, 64 * KiB, PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_NO_REVOKE, &ids[i]),
			0);
		ck_assert_int_eq(raw_set_idle(fd, ids[i], true), 0);
	}
	ck_assert_int_eq(pb_connect(d.socket, &admin), 0);
	ck_assert_int_eq(pb_metrics(admin, &text), 0);
	ck_assert(itest_metrics_sample(text, "pinbroker_revokes_cancelled_total{reason=\"reused\"}") == 0);
	ck_assert(itest_metrics_sample(text, "pinbroker_revokes_cancelled_total{reason=\"not_given_back\"}") == 0);
	free(text);
	ck_assert_int_eq(pb_admin_revoke(admin, PB_REVOKE_UID, 0, getuid(), TAKE_BACK_DEADLINE_MS, &revoked, &n), 0);
	free(revoked);
	ck_assert_uint_eq(n, STORM_LEASES);
	/* Every REVOKE, then every lease taken back into use: each kept. */
	while (got < STORM_LEASES) {
		int fds[4], err = 0;
		size_t nfds = 0;
		Pinbroker__V1__Reply *rep = raw_recv(fd, fds, 4, &nfds, WAIT_MS, &err);

		ck_assert_msg(rep, "REVOKE %zu of %d did not come (%s)", got + 1, STORM_LEASES, strerror(-err));
		ck_assert_int_eq(rep->body_case, PINBROKER__V1__REPLY__BODY_REVOKE);
		pinbroker__v1__reply__free_unpacked(rep, NULL);
		got++;
	}
	for (size_t i = 0; i < STORM_LEASES; i++)
		ck_assert_int_eq(raw_set_idle(fd, ids[i], false), 0);
	for (size_t i = 0; i < STORM_LEASES; i++)
		assert_state_now(ids[i], "active");
	ck_assert_int_eq(pb_metrics(admin, &text), 0);
	ck_assert_msg(itest_metrics_sample(text, "pinbroker_revokes_cancelled_total{reason=\"reused\"}") ==
			      STORM_LEASES,
		      "%s", text);
	free(text);
	/* A burst's worth of lines at most (before the limit, one per lease). */
	ck_assert_uint_ge(log_count("taken back into use"), 1);
	ck_assert_uint_le(log_count("taken back into use"), 20);
	for (size_t i = 0; i < STORM_LEASES; i++)
		ck_assert_int_eq(raw_release(fd, ids[i]), 0);
	close(fd);
	assert_holder_not_signalled(holder);
	pb_disconnect(admin);
	end_clean(NULL);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-cache-raw");

	CHECK_CASE(s, "raw", start, stop, 60, test_raw_set_idle_0_takes_a_revoked_cached_lease_back_and_it_stays_active,
		   test_raw_revoked_cached_lease_left_alone_is_kept_as_in_use_never_overdue,
		   test_raw_registration_is_still_refused_set_idle);
	CHECK_CASE(s, "storm", start_storm, stop, 60,
		   test_cancelled_revokes_are_counted_and_their_log_lines_rate_limited);
	return s;
}

CHECK_MAIN(suite)

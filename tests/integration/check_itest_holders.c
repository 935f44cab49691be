/* SPDX-License-Identifier: MIT */
/*
 * Integration: a holder's lease across daemon restarts and process exits, against the real pinbrokerd under the fd
 * store stand-in (tests/lib/fdstore.h): the re-declare grace counted from the loop, late and self-attached
 * re-declares, orphans kept counted while a live process maps them, and exits freeing leases at once, with pidfds
 * and with every pidfd made to fail (as under valgrind 3.19). The rest of the core: check_itest_core.c.
 */
#define _GNU_SOURCE
#include "core_fixture.h"

/* pinbrokerd with extra args under the fd store stand-in (tests/lib/fdstore.h), for the restart cases. */
static struct fdstore *start_under_store(const char *const *args)
{
	struct fdstore *fs;

	daemon_prepare(&d);
	fs = fdstore_new(&d);
	fdstore_daemon_start(fs, args);
	return fs;
}

/*
 * A restart under the fd store whose start-up runs long (a 1500 ms stall after the re-declare grace is set, the
 * test hook; on a host, the restart scan and the pool's warm-up before ready) still gives the lease's holder its
 * whole 1000 ms grace from when the daemon answers. Counted from recovery_init by libev's cached time, it ran
 * out in the loop's first turn, before the holder could re-declare: the lease was taken for abandoned by a live
 * process (a false overdue warning) and, re-declared and then released, stayed counted until that process exits.
 */
START_TEST(test_restart_grace_counts_from_the_loop_not_from_a_slow_start)
{
	static const char *const args[] = { "--redeclare-grace-ms", "1000", NULL };
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
	struct fdstore *fs;
	pb_client *c;
	pb_lease *l;
	char *log, *hit;

	fs = start_under_store(args);
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &o, &l), 0);
	memset(pb_lease_data(l), 'g', 4096);

	fdstore_daemon_kill(fs);
	ck_assert_int_eq(setenv("PINBROKER_TEST_RECOVERY_STALL_MS", "1500", 1), 0);
	fdstore_daemon_start(fs, args);
	ck_assert_int_eq(unsetenv("PINBROKER_TEST_RECOVERY_STALL_MS"), 0);
	/* One call: the library reconnects and re-declares the lease. */
	ck_assert(itest_wait_answered(c, 2000));
	ck_assert_int_eq(pb_lease_stale(l), 0);
	ck_assert_uint_eq(((const unsigned char *)pb_lease_data(l))[0], 'g');
	/* Past the grace now, by the daemon's clock: it ended on a lease re-declared in time, given back in full. */
	ck_assert(wait_daemon_uptime(d.socket, 1500 + 1000 + 500, 10000));
	ck_assert_int_eq(pb_release(c, l), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 3000), 0);
	log = daemon_log(&d);
	hit = strstr(log + d.log_from, "was not re-declared within redeclare-grace-ms");
	ck_assert_msg(!hit, "the grace ran out during the start-up: %.300s", hit);
	free(log);
	itest_end_clean(&d, c, 3000);
	fdstore_free(fs);
}
END_TEST

/*
 * A child that holds a 4 MiB lease (and, self_attach, maps it attached too, through a second client of its own,
 * as pinbroker.h allows) and says 'a' on from; told 'r' on to, it releases the lease (its holder's view) and says
 * 'f', or 'x' when the release failed; it exits when to closes, its attached view still mapped till then.
 */
static pid_t fork_holder(int to[2], int from[2], bool self_attach)
{
	pid_t pid = itest_fork_piped(to, from);

	if (pid == 0) {
		struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
		char t[PB_SHARE_TOKEN_LEN];
		pb_client *c, *c2;
		pb_lease *l, *al = NULL;

		itest_child_ends(to, from);
		setenv("PINBROKER_NO_CUDA", "1", 1);
		if (pb_connect(d.socket, &c) < 0 || pb_acquire(c, 4 * MiB, &o, &l) < 0)
			_exit(1);
		memset(pb_lease_data(l), 'h', 4096);
		if (self_attach && (pb_lease_share(c, l, NULL, 0, t) < 0 || pb_connect(d.socket, &c2) < 0 ||
				    pb_attach(c2, t, &al) < 0))
			_exit(1);
		itest_say(from[1], 'a');
		if (itest_hear(to[0], 30) != 'r')
			_exit(82);
		itest_say(from[1], pb_release(c, l) == 0 ? 'f' : 'x');
		/* Until the test closes to (or ends). */
		while (read(to[0], t, 1) > 0)
			;
		_exit(al ? ((volatile char *)pb_lease_data(al))[0] != 'h' : 0);
	}
	itest_parent_ends(to, from);
	ck_assert_int_eq(itest_hear(from[0], 10), 'a');
	return pid;
}

/*
 * The end of a fork_holder case: the child told to end (to closed) and reaped, with status 0 (a view of its own
 * still read the holder's bytes), nothing leased once it is gone, and the daemon stopped cleanly.
 */
static void end_holder(struct fdstore *fs, pid_t pid, int to[2], int from[2])
{
	int st = 0;

	close(to[1]);
	close(from[0]);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the holder ended with status %#x", st);
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
	itest_end_clean(&d, NULL, 3000);
	fdstore_free(fs);
}

/* SIGKILLs a fork_holder (stopped or not), reaps it (a zombie still runs for kill(pid, 0)) and closes our ends. */
static void kill_holder(pid_t pid, int to[2], int from[2])
{
	ck_assert_int_eq(kill(pid, SIGKILL), 0);
	ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
	close(to[1]);
	close(from[0]);
}

/* In a child: maps each of a lease's fds, touches its first page and closes the fd (the mapping stays); exits 2
 * or 3 on failure. */
static void map_and_touch(const int *fds, size_t nfds)
{
	for (size_t i = 0; i < nfds; i++) {
		struct stat st;
		char *p;

		if (fstat(fds[i], &st) < 0)
			_exit(2);
		p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
		if (p == MAP_FAILED)
			_exit(3);
		memset(p, 'h', 4096);
		close(fds[i]);
	}
}

/* Every pidfd the daemon would take fails (PINBROKER_TEST_NO_PIDFD=all, daemon/revoker.h): SO_PEERPIDFD, pidfd_open. */
static void start_without_pidfds(void)
{
	ck_assert_int_eq(setenv("PINBROKER_TEST_NO_PIDFD", "all", 1), 0);
	daemon_start(&d, NULL);
	ck_assert_int_eq(unsetenv("PINBROKER_TEST_NO_PIDFD"), 0);
}

/*
 * A holder whose connection closes while its process lives on, its lease still mapped, and that the daemon cannot
 * watch (no pidfd at all, as under valgrind 3.19 or a seccomp sandbox): the lease stays counted while the process
 * runs, and is freed soon after it is killed and reaped (the poll looks every second). The close used to free it
 * at once, its pages still mapped and pinned by the live process, which the budget then counted as free.
 */
START_TEST(test_lease_of_a_live_holder_that_closed_without_pidfd_stays_counted_until_it_exits)
{
	int to[2], from[2];
	char *log;
	pid_t pid;

	pid = itest_fork_piped(to, from);
	if (pid == 0) {
		int raw, fds[16];
		size_t nfds = 0;
		uint64_t id;
		char c;

		itest_child_ends(to, from);
		raw = raw_connect(d.socket);
		if (raw < 0 || raw_hello(raw) != 0 || raw_acquire(raw, 4 * MiB, &id, fds, 16, &nfds) != 0 || nfds == 0)
			_exit(1);
		/* Mapped and touched, then the connection goes: the mapping (and the pin it stands for) stays. */
		map_and_touch(fds, nfds);
		close(raw);
		itest_say(from[1], 'a');
		while (read(to[0], &c, 1) > 0)
			;
		_exit(0);
	}
	itest_parent_ends(to, from);
	ck_assert_int_eq(itest_hear(from[0], 10), 'a');

	/* Several of the poll's looks (1 s apart), the process alive and mapping the lease. */
	ck_assert_msg(wait_leased(d.socket, 0, 2500) == (int64_t)(4 * MiB),
		      "the lease of a live process was freed when its connection closed (no pidfd to watch it)");
	ck_assert(daemon_wait_log(&d, "cannot be watched for its exit (no pidfd)", 5000));
	log = daemon_log(&d);
	ck_assert_msg(!strstr(log + d.log_from, "released (connection closed"), "the close freed the lease");
	free(log);

	/* Gone (and reaped: a zombie still runs for kill), its lease is freed within a poll or two. */
	kill_holder(pid, to, from);
	ck_assert_msg(wait_leased(d.socket, 0, 3000) == 0, "the lease stayed counted after its process was gone");
	ck_assert(daemon_alive(&d));
}
END_TEST

static void *wait_then_exit(void *arg)
{
	char c;

	while (read(*(int *)arg, &c, 1) > 0)
		;
	_exit(0);
}

/*
 * A holder whose main thread calls pthread_exit after closing its connection, while another thread runs on with
 * the lease mapped: the leader reads as a zombie with no mm, but the process still maps (and pins) the pages, so
 * without a pidfd the lease stays counted until the last thread exits. A test of the leader alone would free it.
 */
START_TEST(test_lease_of_a_process_whose_leader_exited_stays_counted_until_its_last_thread_exits)
{
	int to[2], from[2];
	pid_t pid;

	pid = itest_fork_piped(to, from);
	if (pid == 0) {
		int raw, fds[16];
		size_t nfds = 0;
		pthread_t t;
		uint64_t id;

		itest_child_ends(to, from);
		raw = raw_connect(d.socket);
		if (raw < 0 || raw_hello(raw) != 0 || raw_acquire(raw, 4 * MiB, &id, fds, 16, &nfds) != 0 || nfds == 0)
			_exit(1);
		map_and_touch(fds, nfds);
		if (pthread_create(&t, NULL, wait_then_exit, &to[0]) != 0)
			_exit(4);
		close(raw);
		itest_say(from[1], 'a');
		pthread_exit(NULL);
	}
	itest_parent_ends(to, from);
	ck_assert_int_eq(itest_hear(from[0], 10), 'a');

	/* Several of the poll's looks, the leader a zombie and its other thread mapping the lease. */
	ck_assert_msg(wait_leased(d.socket, 0, 2500) == (int64_t)(4 * MiB),
		      "the lease was freed while a thread of its process (its leader exited) still maps it");

	/* The last thread exits: the process is gone (reaped), its lease freed within a poll or two. */
	close(to[1]);
	ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
	close(from[0]);
	ck_assert_msg(wait_leased(d.socket, 0, 3000) == 0, "the lease stayed counted after its process was gone");
	ck_assert(daemon_alive(&d));
}
END_TEST

/* A child that takes a 4 MiB lease on a raw connection and exits once it has said so; returns its pid, unreaped. */
static pid_t fork_exiting_client(int to[2], int from[2])
{
	pid_t pid = itest_fork_piped(to, from);

	if (pid == 0) {
		int raw, fds[16];
		size_t nfds = 0;
		uint64_t id;

		itest_child_ends(to, from);
		raw = raw_connect(d.socket);
		if (raw < 0 || raw_hello(raw) != 0 || raw_acquire(raw, 4 * MiB, &id, fds, 16, &nfds) != 0 || nfds == 0)
			_exit(1);
		itest_say(from[1], 'a');
		_exit(0);
	}
	itest_parent_ends(to, from);
	ck_assert_int_eq(itest_hear(from[0], 10), 'a');
	return pid;
}

/*
 * A client that exits (its mappings gone with it) but is not reaped yet by its parent: its lease is freed while it
 * is a zombie. Without a pidfd, kill(pid, 0) still succeeds on a zombie; the daemon looks whether its leader has an
 * mm or other threads (a zombie has neither), so the lease does not stay counted until the parent reaps it. With a
 * pidfd (the control), the pidfd is readable at the exit.
 */
START_TEST(test_lease_of_an_exited_unreaped_client_is_freed)
{
	int to[2], from[2];
	int64_t left;
	pid_t pid;

	pid = fork_exiting_client(to, from); /* the parent does not reap it for a while */
	/* Several polls (1 s apart) after its exit: it is a zombie, its mappings long gone. */
	left = wait_leased(d.socket, 0, 4000);
	ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
	close(to[1]);
	close(from[0]);
	ck_assert_msg(left == 0, "the lease of an exited (unreaped) client stayed counted: %lld bytes",
		      (long long)left);
}
END_TEST

/*
 * A client that exits and is reaped at once: its lease is freed within 300 ms, well before the poll of holds
 * without a pidfd (REVOKER_POLL_MS) could see it. Without a pidfd, the close of its connection finds it past
 * exit_mm (or gone), as with a pidfd (the control), rather than holding the lease until the next poll.
 */
START_TEST(test_lease_of_an_exited_reaped_client_is_freed_at_once)
{
	int to[2], from[2];
	int64_t left;
	pid_t pid;

	pid = fork_exiting_client(to, from);
	ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
	close(to[1]);
	close(from[0]);
	left = wait_leased(d.socket, 0, 300);
	ck_assert_msg(left == 0, "the lease of an exited, reaped client was still counted 300 ms later: %lld bytes",
		      (long long)left);
}
END_TEST

/*
 * A holder that re-declares its lease only after the grace (its process was stopped through the restart): the
 * grace left the lease counted until that process exits, since it still ran. Re-declared, its connection holds it
 * again, so its release frees it while the process lives on. It used to stay counted until the process exited.
 */
START_TEST(test_lease_re_declared_after_the_grace_is_freed_by_its_release)
{
	static const char *const args[] = { "--redeclare-grace-ms", "300", NULL };
	int to[2], from[2];
	struct fdstore *fs;
	pid_t pid;

	fs = start_under_store(args);
	pid = fork_holder(to, from, false);

	/* Stopped through the restart and past the grace: the daemon keeps the lease for the live process. */
	ck_assert_int_eq(kill(pid, SIGSTOP), 0);
	fdstore_daemon_kill(fs);
	fdstore_daemon_start(fs, args);
	ck_assert(daemon_wait_log(&d, "was not re-declared within redeclare-grace-ms but pid", 10000));
	ck_assert_int_eq(status_leased(d.socket), (int64_t)(4 * MiB));

	/* Going on, its library reconnects and re-declares the lease, late. */
	ck_assert_int_eq(kill(pid, SIGCONT), 0);
	ck_assert(daemon_wait_log(&d, "re-adopted by pid", 10000));
	itest_say(to[1], 'r');
	ck_assert_int_eq(itest_hear(from[0], 10), 'f');
	ck_assert_msg(wait_leased(d.socket, 0, 3000) == 0,
		      "a lease re-declared after the grace and released stayed counted while its process runs");

	end_holder(fs, pid, to, from);
}
END_TEST

/* Restarts the daemon under fs with recovery's pidfd_open failing (ENOSYS, as under valgrind 3.19: daemon/recovery.h). */
static void restart_without_pidfd(struct fdstore *fs, const char *const *args)
{
	fdstore_daemon_kill(fs);
	ck_assert_int_eq(setenv("PINBROKER_TEST_NO_PIDFD", "1", 1), 0);
	fdstore_daemon_start(fs, args);
	ck_assert_int_eq(unsetenv("PINBROKER_TEST_NO_PIDFD"), 0);
}

/* A fork_holder stopped (so it does not re-declare) through a restart without pidfds; returns its pid. */
static pid_t stopped_holder_without_pidfd(struct fdstore **fs, const char *const *args, int to[2], int from[2])
{
	pid_t pid;

	*fs = start_under_store(args);
	pid = fork_holder(to, from, false);
	ck_assert_int_eq(kill(pid, SIGSTOP), 0);
	restart_without_pidfd(*fs, args);
	return pid;
}

/*
 * A holder that does not re-declare (stopped through the restart) and that the daemon cannot watch for its exit (no
 * pidfd): past the grace its lease stays counted while the process runs, and is freed once it is gone. The grace
 * used to free it at once, its pages still mapped and pinned by the live process, which the budget then counted
 * as free.
 */
START_TEST(test_orphan_of_a_live_holder_without_pidfd_stays_counted_until_it_exits)
{
	static const char *const args[] = { "--redeclare-grace-ms", "300", NULL };
	int to[2], from[2];
	struct fdstore *fs;
	char *log;
	pid_t pid;

	pid = stopped_holder_without_pidfd(&fs, args, to, from);
	/* Past the grace, by the daemon's clock; then several of the poll's looks (1 s apart), the process alive. */
	ck_assert(wait_daemon_uptime(d.socket, 300 + 1000, 10000));
	ck_assert_msg(wait_leased(d.socket, 0, 2500) == (int64_t)(4 * MiB),
		      "the grace freed the lease of a live holder it could not watch for its exit");
	log = daemon_log(&d);
	ck_assert_msg(strstr(log + d.log_from, "cannot be watched for its exit (Function not implemented)"),
		      "no warning names the pidfd's error");
	free(log);

	/* Gone (and reaped: a zombie still runs for kill), its lease is freed within a poll or two. */
	kill_holder(pid, to, from);
	ck_assert_msg(wait_leased(d.socket, 0, 5000) == 0, "the lease stayed counted after its holder was gone");
	ck_assert(daemon_wait_log(&d, "its holder is gone: reclaimed", 3000));
	itest_end_clean(&d, NULL, 3000);
	fdstore_free(fs);
}
END_TEST

/*
 * The same holder re-declares late, while the poll still holds its lease: its connection holds the lease again, so
 * its release frees it while the process lives on (the poll's hold must end with the re-declare, as an exit hold's
 * does, or the lease stays counted until the process exits).
 */
START_TEST(test_lease_re_declared_while_polled_is_freed_by_its_release)
{
	static const char *const args[] = { "--redeclare-grace-ms", "300", NULL };
	int to[2], from[2];
	struct fdstore *fs;
	pid_t pid;

	pid = stopped_holder_without_pidfd(&fs, args, to, from);
	ck_assert(wait_daemon_uptime(d.socket, 300 + 1000, 10000));
	ck_assert_msg(status_leased(d.socket) == (int64_t)(4 * MiB),
		      "the grace freed the lease of a live holder it could not watch for its exit");
	ck_assert(daemon_wait_log(&d, "cannot be watched for its exit", 10000));

	ck_assert_int_eq(kill(pid, SIGCONT), 0);
	ck_assert(daemon_wait_log(&d, "re-adopted by pid", 10000));
	itest_say(to[1], 'r');
	ck_assert_int_eq(itest_hear(from[0], 10), 'f');
	ck_assert_msg(wait_leased(d.socket, 0, 3000) == 0,
		      "a lease re-declared while polled and released stayed counted while its process runs");

	end_holder(fs, pid, to, from);
}
END_TEST

/*
 * A holder that takes a 4 MiB lease and shares it, and an attacher (of the same uid) that maps it; both wait on their
 * pipes (pto, ato: a byte or EOF ends them). Returns once the attacher has mapped the lease.
 */
static void fork_share_pair(int pto[2], int pfrom[2], int ato[2], int afrom[2], pid_t *holder, pid_t *attacher)
{
	char token[PB_SHARE_TOKEN_LEN];

	*holder = itest_fork_piped(pto, pfrom);
	if (*holder == 0) {
		struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
		char t[PB_SHARE_TOKEN_LEN];
		pb_client *c;
		pb_lease *l;

		itest_child_ends(pto, pfrom);
		if (pb_connect(d.socket, &c) < 0 || pb_acquire(c, 4 * MiB, &o, &l) < 0 ||
		    pb_lease_share(c, l, NULL, 0, t) < 0 || write(pfrom[1], t, sizeof(t)) != (ssize_t)sizeof(t))
			_exit(1);
		itest_hear(pto[0], 60);
		_exit(0);
	}
	itest_parent_ends(pto, pfrom);
	ck_assert_int_eq(read(pfrom[0], token, sizeof(token)), (ssize_t)sizeof(token));
	*attacher = itest_fork_piped(ato, afrom);
	if (*attacher == 0) {
		pb_client *c;
		pb_lease *l;

		itest_child_ends(ato, afrom);
		if (pb_connect(d.socket, &c) < 0 || pb_attach(c, token, &l) < 0)
			_exit(1);
		itest_say(afrom[1], 'a');
		itest_hear(ato[0], 60);
		_exit(0);
	}
	itest_parent_ends(ato, afrom);
	ck_assert_int_eq(itest_hear(afrom[0], 10), 'a');
}

/*
 * A shared lease whose holder died with the daemon while its attacher still runs, and the daemon cannot watch that
 * attacher for its exit (no pidfd): past the grace the lease stays counted while the attacher maps it, and is freed
 * once the attacher is gone. The attacher used to be skipped, and the grace freed the lease under its mapping.
 */
START_TEST(test_orphan_mapped_by_an_attacher_without_pidfd_stays_counted_until_it_exits)
{
	static const char *const args[] = { "--redeclare-grace-ms", "300", NULL };
	int pto[2], pfrom[2], ato[2], afrom[2];
	struct fdstore *fs;
	pid_t holder, attacher;
	char *log;

	fs = start_under_store(args);
	fork_share_pair(pto, pfrom, ato, afrom, &holder, &attacher);

	/* The holder dies with the daemon: only the attacher, which does not re-declare, still maps the lease. */
	fdstore_daemon_kill(fs);
	ck_assert_int_eq(kill(holder, SIGKILL), 0);
	ck_assert_int_eq(waitpid(holder, NULL, 0), holder);
	close(pto[1]);
	close(pfrom[0]);
	ck_assert_int_eq(setenv("PINBROKER_TEST_NO_PIDFD", "1", 1), 0);
	fdstore_daemon_start(fs, args);
	ck_assert_int_eq(unsetenv("PINBROKER_TEST_NO_PIDFD"), 0);
	ck_assert(wait_daemon_uptime(d.socket, 300 + 1000, 10000));
	ck_assert_msg(wait_leased(d.socket, 0, 2500) == (int64_t)(4 * MiB),
		      "the grace freed a lease that an attacher it could not watch still maps");
	log = daemon_log(&d);
	ck_assert_msg(strstr(log + d.log_from, "former attacher pid"), "no warning names the attacher");
	free(log);

	close(ato[1]);
	ck_assert_int_eq(waitpid(attacher, NULL, 0), attacher);
	close(afrom[0]);
	ck_assert_msg(wait_leased(d.socket, 0, 5000) == 0, "the lease stayed counted after its attacher was gone");
	itest_end_clean(&d, NULL, 3000);
	fdstore_free(fs);
}
END_TEST

/* A daemon stopped while it still polls a holder it cannot watch stops cleanly (under valgrind: nothing leaked). */
START_TEST(test_daemon_stops_cleanly_while_it_polls_a_holder)
{
	static const char *const args[] = { "--redeclare-grace-ms", "300", NULL };
	int to[2], from[2];
	struct fdstore *fs;
	pid_t pid;

	pid = stopped_holder_without_pidfd(&fs, args, to, from);
	ck_assert(daemon_wait_log(&d, "cannot be watched for its exit", 10000));
	ck_assert_int_eq(status_leased(d.socket), (int64_t)(4 * MiB));
	ck_assert_int_eq(daemon_stop(&d), 0);

	kill_holder(pid, to, from);
	fdstore_free(fs);
}
END_TEST

/*
 * A shared lease across a restart: its holder (stopped, so it has not re-declared yet) and an attacher of its uid
 * both still run. The attacher's exit must not free the lease while the grace still waits for its holder, which
 * maps it too (the attacher's exit hold was the lease's only one, and its end used to free it).
 */
START_TEST(test_orphan_outlives_its_attachers_exit_while_its_holder_runs)
{
	static const char *const args[] = { "--redeclare-grace-ms", "20000", NULL };
	int pto[2], pfrom[2], ato[2], afrom[2];
	struct fdstore *fs;
	pid_t holder, attacher;

	fs = start_under_store(args);
	fork_share_pair(pto, pfrom, ato, afrom, &holder, &attacher);

	/* The holder cannot re-declare yet; the attacher's stale mapping keeps the lease held until it exits. */
	ck_assert_int_eq(kill(holder, SIGSTOP), 0);
	fdstore_daemon_kill(fs);
	fdstore_daemon_start(fs, args);
	ck_assert_int_eq(wait_leased(d.socket, (int64_t)(4 * MiB), 5000), (int64_t)(4 * MiB));
	close(ato[1]);
	ck_assert_int_eq(waitpid(attacher, NULL, 0), attacher);
	/* Within the grace, the holder alive: still counted (its pages must reach nobody else). */
	ck_assert_msg(wait_leased(d.socket, 0, 1000) == (int64_t)(4 * MiB),
		      "the attacher's exit freed an orphan whose holder still runs, within the grace");

	/* Going on, its library re-declares it; its exit then frees it. */
	ck_assert_int_eq(kill(holder, SIGCONT), 0);
	ck_assert(daemon_wait_log(&d, "re-adopted by pid", 10000));
	close(pto[1]);
	close(afrom[0]);
	close(pfrom[0]);
	ck_assert_int_eq(waitpid(holder, NULL, 0), holder);
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
	itest_end_clean(&d, NULL, 3000);
	fdstore_free(fs);
}
END_TEST

/*
 * A process that holds a lease and also maps it attached, through a second client (pinbroker.h allows it), across
 * a restart: its holder re-declares, its attachment goes stale and stays mapped. The holder's release must not
 * free the lease while the stale attachment still maps it: it stays counted until the process lets that go or
 * exits (the re-declare used to drop the exit hold the attachment's pid had).
 */
START_TEST(test_redeclare_keeps_the_exit_hold_of_its_own_stale_attachment)
{
	static const char *const args[] = { "--redeclare-grace-ms", "20000", NULL };
	int to[2], from[2];
	struct fdstore *fs;
	pid_t pid;

	fs = start_under_store(args);
	pid = fork_holder(to, from, true);

	fdstore_daemon_kill(fs);
	fdstore_daemon_start(fs, args);
	ck_assert(daemon_wait_log(&d, "re-adopted by pid", 10000));
	itest_say(to[1], 'r');
	ck_assert_int_eq(itest_hear(from[0], 10), 'f');
	/* The process still maps it (its stale attachment): counted until it exits. */
	ck_assert_msg(wait_leased(d.socket, 0, 1000) == (int64_t)(4 * MiB),
		      "the holder's release freed a lease its own stale attachment still maps");

	end_holder(fs, pid, to, from);
}
END_TEST

/*
 * An orphan nobody re-declares (its holder died with the old daemon) holds the budget until the grace ends; an
 * acquire that waits for memory meanwhile must be granted when the grace gives the orphan back, not time out
 * (grace_cb freed orphans without raising broker_memory_freed, which the wait queue listens to; an orphan whose
 * last attacher exits inside the grace is freed there too, no longer by the exit hold's end, which does raise it).
 */
START_TEST(test_waiting_acquire_is_granted_when_the_grace_frees_an_orphan)
{
	static const char *const args[] = { "--redeclare-grace-ms", "1500", NULL };
	struct pb_acquire_opts w = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE | PB_ACQUIRE_WAIT,
				     .timeout_ms = 8000 };
	int to[2], from[2];
	struct fdstore *fs;
	uint64_t t0, took;
	pb_client *c;
	pb_lease *l;
	pid_t pid;
	int r;

	fs = start_under_store(args);
	pid = itest_fork_piped(to, from);
	if (pid == 0) {
		struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
		pb_client *hc;
		pb_lease *hl;

		itest_child_ends(to, from);
		if (pb_connect(d.socket, &hc) < 0 || pb_acquire(hc, 200 * MiB, &o, &hl) < 0)
			_exit(1);
		itest_say(from[1], 'a');
		itest_hear(to[0], 60);
		_exit(0);
	}
	itest_parent_ends(to, from);
	ck_assert_int_eq(itest_hear(from[0], 10), 'a');

	/* The holder dies with the daemon: nobody re-declares its lease, which waits out the grace. */
	fdstore_daemon_kill(fs);
	kill_holder(pid, to, from);
	fdstore_daemon_start(fs, args);
	ck_assert_int_eq(status_leased(d.socket), (int64_t)(200 * MiB));

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	t0 = itest_now_ms();
	r = pb_acquire(c, 100 * MiB, &w, &l);
	took = itest_now_ms() - t0;
	ck_assert_msg(r == 0, "a waiting acquire was not granted when the grace freed the orphan (%d after %llu ms)", r,
		      (unsigned long long)took);
	ck_assert_msg(took < 5000, "granted only %llu ms after it asked (grace 1500 ms)", (unsigned long long)took);
	ck_assert_int_eq(pb_release(c, l), 0);
	itest_end_clean(&d, c, 3000);
	fdstore_free(fs);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-holders");

	/* Started and stopped by the test, under the fd store stand-in (tests/lib/fdstore.h). */
	CHECK_CASE(s, "stalled-start", NULL, NULL, 60, test_restart_grace_counts_from_the_loop_not_from_a_slow_start);
	/* Exit holds watch processes through pidfds: valgrind 3.19 lacks pidfd_open, so its run excludes "pidfd". */
	tcase_set_tags(CHECK_CASE(s, "late-redeclare", NULL, NULL, 60,
				  test_lease_re_declared_after_the_grace_is_freed_by_its_release),
		       "pidfd");
	tcase_set_tags(CHECK_CASE(s, "orphan-attacher-exit", NULL, NULL, 60,
				  test_orphan_outlives_its_attachers_exit_while_its_holder_runs),
		       "pidfd");
	tcase_set_tags(CHECK_CASE(s, "self-attach-redeclare", NULL, NULL, 60,
				  test_redeclare_keeps_the_exit_hold_of_its_own_stale_attachment),
		       "pidfd");
	/* No pidfd anywhere (the daemon's are made to fail, its holder has no connection when it exits): valgrind too. */
	CHECK_CASE(s, "no-pidfd-orphan", NULL, NULL, 60,
		   test_orphan_of_a_live_holder_without_pidfd_stays_counted_until_it_exits,
		   test_lease_re_declared_while_polled_is_freed_by_its_release,
		   test_daemon_stops_cleanly_while_it_polls_a_holder,
		   test_orphan_mapped_by_an_attacher_without_pidfd_stays_counted_until_it_exits);
	/* No pidfd anywhere either (every one the daemon would take fails): valgrind too. */
	CHECK_CASE(s, "no-pidfd-close", start_without_pidfds, stop_daemon, 60,
		   test_lease_of_a_live_holder_that_closed_without_pidfd_stays_counted_until_it_exits);
	CHECK_CASE(s, "no-pidfd-leader-exit", start_without_pidfds, stop_daemon, 60,
		   test_lease_of_a_process_whose_leader_exited_stays_counted_until_its_last_thread_exits);
	CHECK_CASE(s, "no-pidfd-zombie", start_without_pidfds, stop_daemon, 60,
		   test_lease_of_an_exited_unreaped_client_is_freed);
	CHECK_CASE(s, "no-pidfd-exit-frees-at-once", start_without_pidfds, stop_daemon, 60,
		   test_lease_of_an_exited_reaped_client_is_freed_at_once);
	/* The same with pidfds: the pidfd is readable at the exit, zombie or not. */
	CHECK_CASE(s, "exit-frees-at-once-pidfd", start_default, stop_daemon, 60,
		   test_lease_of_an_exited_reaped_client_is_freed_at_once);
	CHECK_CASE(s, "zombie-pidfd", start_default, stop_daemon, 60, test_lease_of_an_exited_unreaped_client_is_freed);
	CHECK_CASE(s, "grace-frees-waiter", NULL, NULL, 60,
		   test_waiting_acquire_is_granted_when_the_grace_frees_an_orphan);
	return s;
}

CHECK_MAIN(suite)

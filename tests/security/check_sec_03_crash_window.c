/* SPDX-License-Identifier: MIT */
/* Finding 3: kill -9 during a storm of acquires never lets live memory of one process reach another, under an fd store. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fdstore.h"
#include "pinbroker.h"
#include "sec.h"

#define MiB (1024ull * 1024ull)
#define KILLS 200
#define STORMERS 3
#define CHUNK "64K"
#define STORM_BYTES (64 * 1024) /* one whole pool chunk: leases reuse the idle pool, and cycle fast */
#define TAKE_BYTES MiB          /* what a taker asks for at a time, until refused */
#define STORM_HELD 3            /* leases each stormer holds at a time */
#define STORM_LIFE 400          /* acquires, then it gives everything back and a fresh stormer takes over */
#define KILL_AFTER_MAX_US 8000
#define GRACE_MS 300
#define GRACE_EVERY 10 /* kills; then the grace is let run out once */
#define LIVE 'P'       /* what a stormer writes into a lease it holds */
#define GIVEN_BACK 'R' /* what it writes over it just before releasing */

static const char *const args[] = {
	"--budget",    "24M", "--uid-quota",          "24M", "--prewarm", "8M", "--chunk-size", CHUNK,
	"--chunk-max", CHUNK, "--redeclare-grace-ms", "300", NULL,
};

/* Shared with the stormers (MAP_SHARED): the test pauses them while it looks, and counts their grants. */
struct storm_ctl {
	int pause;
	unsigned long acquires;
};

/*
 * uid A: acquire and fill with LIVE; once it holds more than STORM_HELD,
 * overwrite the oldest with GIVEN_BACK and release it. It lets go only after
 * a successful acquire, so whatever it holds when the daemon dies stays LIVE
 * while the test looks. Across kills the library reconnects by itself.
 */
static void stormer(const char *sock, struct storm_ctl *ctl)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
	pb_lease *held[STORM_HELD + 1];
	size_t n = 0, done = 0;
	pb_client *c = NULL;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	sec_drop_to(SEC_UID_A);
	for (int tries = 0; pb_connect(sock, &c) < 0; tries++) {
		if (tries > 2000)
			_exit(30);
		usleep(5000);
	}
	while (done < STORM_LIFE) {
		if (__atomic_load_n(&ctl->pause, __ATOMIC_ACQUIRE)) {
			usleep(200);
			continue;
		}
		if (pb_acquire(c, STORM_BYTES, &o, &held[n]) < 0) {
			usleep(300);
			continue;
		}
		memset(pb_lease_data(held[n]), LIVE, STORM_BYTES);
		n++;
		done++;
		__atomic_add_fetch(&ctl->acquires, 1, __ATOMIC_RELEASE);
		if (n > STORM_HELD) {
			memset(pb_lease_data(held[0]), GIVEN_BACK, STORM_BYTES);
			pb_release(c, held[0]);
			memmove(held, held + 1, --n * sizeof(*held));
		}
	}
	for (size_t k = 0; k < n; k++) {
		memset(pb_lease_data(held[k]), GIVEN_BACK, STORM_BYTES);
		pb_release(c, held[k]);
	}
	pb_disconnect(c);
	_exit(0);
}

/*
 * After a restart: take every lease uid can get and look for what a stormer
 * writes. Another uid must see none of it (memory crossing uids is fresh);
 * uid A itself may see GIVEN_BACK (its own released memory) but never LIVE,
 * which only a lease some stormer still holds contains. Exit 0, 1 with the
 * finding on stderr, or 3 when it got nothing at all.
 */
static void taker(const char *sock, uid_t uid)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
	pb_client *c = NULL;
	pb_lease *got[256];
	size_t n = 0;
	int bad = 0;

	sec_drop_to(uid);
	if (pb_connect(sock, &c) < 0)
		_exit(50);
	while (n < 256 && pb_acquire(c, TAKE_BYTES, &o, &got[n]) == 0) {
		const uint8_t *p = pb_lease_data(got[n]);

		if (memchr(p, LIVE, TAKE_BYTES) || (uid != SEC_UID_A && memchr(p, GIVEN_BACK, TAKE_BYTES))) {
			fprintf(stderr, "uid %u: lease %llu shows uid %u's %s memory\n", (unsigned)uid,
				(unsigned long long)pb_lease_id(got[n]), (unsigned)SEC_UID_A,
				memchr(p, LIVE, TAKE_BYTES) ? "live" : "released");
			bad = 1;
		}
		n++;
	}
	pb_disconnect(c);
	_exit(bad ? 1 : n == 0 ? 3 : 0);
}

/*
 * In a child: drop the fds inherited from this process, the fd-store stand-in's among them. systemd's
 * store is PID 1's alone; a child holding a copy would hold those chunks' memory, which a restarted daemon
 * rightly counts as still held (issue 22, finding 7), and the storm would fill its budget with them.
 */
static void drop_inherited_fds(void)
{
	if (close_range(3, ~0u, 0) < 0)
		for (int fd = 3; fd < 65536; fd++)
			close(fd);
}

static pid_t spawn_stormer(const char *sock, struct storm_ctl *ctl)
{
	pid_t pid = itest_fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		drop_inherited_fds();
		stormer(sock, ctl);
	}
	return pid;
}

static int run_taker(const char *sock, uid_t uid)
{
	pid_t pid = itest_fork();
	int st = 0;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		drop_inherited_fds();
		taker(sock, uid);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Wait until the stormers have been granted n more leases: the next kill lands in a running storm. */
static bool storm_running(struct storm_ctl *ctl, unsigned long n)
{
	unsigned long from = __atomic_load_n(&ctl->acquires, __ATOMIC_ACQUIRE);

	for (int i = 0; i < 3000; i++) {
		if (__atomic_load_n(&ctl->acquires, __ATOMIC_ACQUIRE) >= from + n)
			return true;
		usleep(1000);
	}
	return false;
}

START_TEST(test_kill_during_acquire_storm_never_hands_live_memory_on)
{
	struct storm_ctl *ctl = mmap(NULL, sizeof(*ctl), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct daemon d;
	struct fdstore *fs;
	pid_t storm[STORMERS];
	unsigned seed = (unsigned)time(NULL);
	int seen_b = 0, seen_a = 0, stalled = 0, recovered = 0, empty_b = 0, r;
	/* More for a soak run; never fewer than the 200. */
	int kills = getenv("SEC03_KILLS") && atoi(getenv("SEC03_KILLS")) > KILLS ? atoi(getenv("SEC03_KILLS")) : KILLS;
	char *log;

	ck_assert_ptr_ne(ctl, MAP_FAILED);
	fprintf(stderr, "seed %u\n", seed);
	srand(seed);
	daemon_prepare(&d);
	fs = fdstore_new(&d);
	fdstore_daemon_start(fs, args);
	/* The stand-in reads the daemon's READY=1 and FDSTORE messages on its own thread: wait for them, bounded. */
	for (int i = 0; i < 1000 && (!fdstore_ready(fs) || fdstore_count(fs, "state") < 1); i++)
		usleep(10000);
	ck_assert(fdstore_ready(fs));
	ck_assert_uint_ge(fdstore_count(fs, "state"), 1);
	for (int i = 0; i < STORMERS; i++)
		storm[i] = spawn_stormer(d.socket, ctl);

	for (int kill_no = 0; kill_no < kills; kill_no++) {
		int st;

		/* Keep the storm going: a stormer that has lived its life is replaced. */
		for (int i = 0; i < STORMERS; i++)
			if (waitpid(storm[i], &st, WNOHANG) == storm[i]) {
				ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "stormer exited with status %d",
					      st);
				storm[i] = spawn_stormer(d.socket, ctl);
			}
		__atomic_store_n(&ctl->pause, 0, __ATOMIC_RELEASE);
		if (!storm_running(ctl, 3))
			stalled++;
		usleep((useconds_t)(rand() % KILL_AFTER_MAX_US));
		fdstore_daemon_kill(fs);
		/* Stormers hold still while the takers look: what they hold stays LIVE. */
		__atomic_store_n(&ctl->pause, 1, __ATOMIC_RELEASE);
		fdstore_daemon_start(fs, args);
		/* Holders that are gone lose their orphans, quarantine ends: the grace is over by the daemon's clock. */
		if (kill_no % GRACE_EVERY == GRACE_EVERY - 1)
			ck_assert(wait_daemon_uptime(d.socket, GRACE_MS + 200, 10000));
		r = run_taker(d.socket, SEC_UID_B);
		ck_assert_msg(r == 0 || r == 1 || r == 3, "taker B failed: exit %d", r);
		seen_b += r == 1;
		empty_b += r == 3;
		r = run_taker(d.socket, SEC_UID_A);
		ck_assert_msg(r == 0 || r == 1 || r == 3, "taker A failed: exit %d", r);
		seen_a += r == 1;
		if (kill_no % 20 == 19)
			fprintf(stderr, "kill %d: %lu granted, stalled %d, B empty %d, seen B %d A %d\n", kill_no + 1,
				ctl->acquires, stalled, empty_b, seen_b, seen_a);
	}
	for (int i = 0; i < STORMERS; i++) {
		kill(storm[i], SIGKILL);
		waitpid(storm[i], NULL, 0);
	}
	log = daemon_log(&d);
	for (const char *p = log; p && (p = strstr(p, "recovered from the fd store: ")); p++)
		recovered += strncmp(p + strlen("recovered from the fd store: "), "0 leases", 8) != 0;
	free(log);
	fprintf(stderr,
		"%d kills, %lu leases granted to the storm, %d restarts recovered leases, %d waits for the storm "
		"timed out, uid B got nothing %d times\n",
		kills, ctl->acquires, recovered, stalled, empty_b);
	ck_assert_msg(
		seen_b == 0 && seen_a == 0,
		"after %d kills: uid B saw uid A's memory after %d restarts, another uid-A process saw live memory "
		"after %d",
		kills, seen_b, seen_a);
	/* Not vacuous: the kills did land in a running storm, and restarts had leases to recover. */
	ck_assert_int_lt(stalled, kills / 10);
	ck_assert_int_lt(empty_b, kills / 10);
	ck_assert_int_gt(recovered, kills / 2);
	sec_stop_with_store(&d, fs);
	munmap(ctl, sizeof(*ctl));
}
END_TEST

/*
 * A lease let go while the daemon is down, in a process that lives on: the restarted daemon (same instance, from
 * the fd store) recovers it as held by that pid, and the library's reconnect must give it back. Before, it stayed
 * counted until the process exited: the storm above, slowed down, filled its 24 MiB budget so (384 leases of dead
 * releases across ~70 kills) and the stormers stalled.
 */
START_TEST(test_release_while_the_daemon_is_down_is_given_back_after_the_restart)
{
	static const char *const small[] = {
		"--budget", "16M", "--prewarm", "4M", "--redeclare-grace-ms", "300", NULL
	};
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
	struct daemon d;
	struct fdstore *fs;
	pb_lease *keep, *gone, *mid;
	pb_client *c;

	daemon_prepare(&d);
	fs = fdstore_new(&d);
	fdstore_daemon_start(fs, small);
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_acquire(c, MiB, &o, &keep), 0);
	ck_assert_int_eq(pb_acquire(c, 2 * MiB, &o, &gone), 0);
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &o, &mid), 0);
	ck_assert_int_eq(status_leased(d.socket), (int64_t)(7 * MiB));

	/* Released in the window: the daemon is dead, then while it starts again. */
	fdstore_daemon_kill(fs);
	ck_assert_int_eq(pb_release(c, gone), 0);
	fdstore_daemon_start(fs, small);
	ck_assert_int_eq(pb_release(c, mid), 0);
	/* One call: the library reconnects, re-declares what it holds, and gives back what it let go. */
	ck_assert(itest_wait_answered(c, 2000));
	ck_assert_int_eq(pb_lease_stale(keep), 0);
	/* Past the grace (300 ms from the start, by the daemon's clock), only the held lease counts, while this
	 * process runs on. */
	ck_assert(wait_daemon_uptime(d.socket, 300 + 300, 10000));
	ck_assert_int_eq(wait_leased(d.socket, (int64_t)MiB, 3000), (int64_t)MiB);
	ck_assert_int_eq(pb_release(c, keep), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 3000), 0);
	pb_disconnect(c);
	sec_stop_with_store(&d, fs);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("sec-03-crash-window");

	/* 200 kills take 220-240 s on the 2-core development VM under load (one run timed out at 240): room, within
	 * ctest's 600. */
	CHECK_CASE(s, "kill -9 under an fd store", NULL, NULL, 480,
		   test_kill_during_acquire_storm_never_hands_live_memory_on);
	CHECK_CASE(s, "release while away", NULL, NULL, 60,
		   test_release_while_the_daemon_is_down_is_given_back_after_the_restart);
	return s;
}

SEC_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/* Issue 38 finding 7: a daemon with only CAP_IPC_LOCK and CAP_KILL, killed with kill -9 without the fd store, still counts what it lent. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <linux/capability.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pinbroker.h"
#include "sec.h"
#include "sec_restart.h"

#define MiB (1024ull * 1024ull)
/* The 128 MiB held of a 512 MiB budget, scaled. */
#define BUDGET_BYTES (64 * MiB)
#define HOLD_BYTES (16 * MiB)
#define FREED_WITHIN_MS 20000

static const char *const args[] = { "--budget", "64M", "--uid-quota", "64M", "--prewarm", "8M", NULL };

/*
 * In the daemon's child before exec: a bounding set of CAP_IPC_LOCK and CAP_KILL, and no inheritable or ambient
 * capability beyond them, so root execs with those alone. (Root's permitted set after exec is its inheritable set
 * plus the bounding set: in a container that hands its processes a full inheritable set, as systemd-nspawn does,
 * cutting the bounding set alone leaves the daemon everything.)
 */
static void unit_caps(void *ud)
{
	const uint32_t keep = (1u << CAP_IPC_LOCK) | (1u << CAP_KILL);
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = { { 0 } };

	(void)ud;
	for (int c = 0; c <= CAP_LAST_CAP; c++)
		if (c != CAP_IPC_LOCK && c != CAP_KILL && prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL)
			_exit(90);
	if (syscall(SYS_capget, &h, data) < 0)
		_exit(91);
	data[0].inheritable &= keep; /* both capabilities are below 32 */
	data[1].inheritable = 0;
	if (syscall(SYS_capset, &h, data) < 0 || prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
		_exit(92);
}

/* The daemon's effective capability set, from its status. */
static unsigned long long cap_eff(pid_t pid)
{
	char path[64], line[256];
	unsigned long long v = ~0ull;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return v;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "CapEff: %llx", &v) == 1)
			break;
	fclose(f);
	return v;
}

static void start_blind(struct daemon *d)
{
	daemon_restart_with(d, args, unit_caps, NULL);
	ck_assert_msg(cap_eff(d->pid) == ((1ull << CAP_IPC_LOCK) | (1ull << CAP_KILL)),
		      "the daemon runs with capabilities %llx, not CAP_IPC_LOCK and CAP_KILL alone", cap_eff(d->pid));
}

/*
 * The case: A holds a lease, the daemon (unit capabilities, no systemd) is killed with kill -9 and started
 * again the same way. It cannot read A's /proc, so only the record it journaled before the fds left can tell it;
 * A's bytes stay counted while A lives (its pidfd), B is refused what would go past the budget, and once A exits
 * the bytes come back.
 */
START_TEST(test_kill_9_under_unit_caps_keeps_the_lease_counted)
{
	int to[2], from[2];
	struct daemon d;
	pid_t a;

	daemon_prepare(&d);
	start_blind(&d);
	a = itest_fork_piped(to, from);
	if (a == 0) {
		struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
		pb_client *c;
		pb_lease *l;

		itest_child_ends(to, from);
		sec_drop_to(SEC_UID_A);
		if (pb_connect(d.socket, &c) < 0 || pb_acquire(c, HOLD_BYTES, &o, &l) < 0)
			_exit(10);
		memset(pb_lease_data(l), 'A', HOLD_BYTES);
		itest_say(from[1], 'h');
		itest_hear(to[0], 120);
		_exit(0);
	}
	itest_parent_ends(to, from);
	ck_assert_int_eq(itest_hear(from[0], 60), 'h');
	sec_stop_for_restart(&d, true);
	start_blind(&d);

	ck_assert_int_eq(sec_orphaned(d.socket), (int64_t)HOLD_BYTES);
	ck_assert_int_eq(status_leased(d.socket), (int64_t)HOLD_BYTES);
	/* The over-grant: B asked for the whole budget and got it, 640 MiB against 512. */
	ck_assert_int_eq(sec_try_acquire_as(d.socket, SEC_UID_B, BUDGET_BYTES), 1);
	ck_assert_int_eq(sec_try_acquire_as(d.socket, SEC_UID_B, BUDGET_BYTES - HOLD_BYTES), 0);
	itest_say(to[1], 'q');
	ck_assert_int_eq(itest_wait_exit(a), 0);
	close(to[1]);
	close(from[0]);
	ck_assert_int_eq(wait_leased(d.socket, 0, FREED_WITHIN_MS), 0);
	ck_assert_int_eq(sec_try_acquire_as(d.socket, SEC_UID_B, BUDGET_BYTES), 0);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* A state it cannot use and a /proc it cannot read: the daemon says, at warning, that it cannot see what was lent. */
START_TEST(test_unusable_state_under_unit_caps_is_said)
{
	char state[400], boot[64] = "";
	struct daemon d;
	pid_t a;
	FILE *f;

	daemon_prepare(&d);
	start_blind(&d);
	a = itest_hold_lease(d.socket, HOLD_BYTES, NULL);
	sec_stop_for_restart(&d, true);
	sec_boot_id(boot, sizeof(boot));
	snprintf(state, sizeof(state), "%s.state", d.socket);
	f = fopen(state, "we");
	ck_assert_ptr_nonnull(f);
	/* This boot's, and damaged: a line that is no lease. */
	fprintf(f, "pinbroker-restart 2\nboot %s\ngarbage\nend\n", boot);
	fclose(f);
	start_blind(&d);
	ck_assert_msg(daemon_wait_log(&d, "unusable and other uids' /proc cannot be read", 5000),
		      "no warning that lent memory cannot be seen:\n%s", daemon_log_excerpt(&d));
	{
		struct pb_status *s = itest_status(d.socket);
		const char *books, *w = pb_status_restart_warning(s, &books);

		ck_assert_msg(w && strstr(w, "cannot be seen"), "status has no restart warning");
		ck_assert_str_eq(books, "unknown");
		pb_status_free(s);
	}
	kill(a, SIGKILL);
	itest_wait_exit(a);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

CHECK_SUITE(suite, "sec-31-crash-blind", "kill -9 under the unit's capabilities", NULL, NULL, 120,
	    test_kill_9_under_unit_caps_keeps_the_lease_counted, test_unusable_state_under_unit_caps_is_said)

SEC_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/* Finding 4: a send that fails inside a handler must not free the connection the handler still uses. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sec.h"
#include "pinbroker.pb-c.h"

#define MiB (1024ull * 1024ull)

static struct daemon d;

SEC_START(start, d, "--budget", "8M", "--prewarm", "0", "--chunk-size", "2M", "--chunk-max", "2M",
	  "--revoke-deadline-ms", "60000", "--acquire-timeout-ms", "20000")

SEC_STOP(stop, d)

static int send_req(int fd, uint64_t seq, Pinbroker__V1__Request *req)
{
	req->has_seq = true;
	req->seq = seq;
	return raw_send(fd, req, NULL, 0);
}

static int send_acquire(int fd, uint64_t seq, uint64_t size, bool wait)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Acquire a = PINBROKER__V1__ACQUIRE__INIT;

	a.size = size;
	if (wait) {
		a.has_flags = true;
		a.flags = PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_WAIT;
	}
	req.body_case = PINBROKER__V1__REQUEST__BODY_ACQUIRE;
	req.acquire = &a;
	return send_req(fd, seq, &req);
}

/* A holder of one lease of size bytes, marked idle when idle is set. Returns the fd or aborts. */
static int holder(uint64_t size, bool idle, uint64_t *id)
{
	int fd = raw_lease_held(d.socket, size, id);

	if (idle)
		ck_assert_int_eq(raw_set_idle(fd, *id, true), 0);
	return fd;
}

/* How many connections the daemon lists now, this call's own among them. */
static int64_t status_clients(void)
{
	struct pb_status *s = itest_status(d.socket);
	int64_t n = (int64_t)s->n_clients;

	pb_status_free(s);
	return n;
}

/* Poll until the daemon lists want connections; returns the last count seen. */
static int64_t wait_clients(int64_t want, int timeout_ms)
{
	uint64_t t0 = itest_now_ms();
	int64_t n;

	while ((n = status_clients()) != want && itest_now_ms() - t0 < (uint64_t)timeout_ms)
		usleep(10000);
	return n;
}

/* Poll until lease id is in state; false after timeout_ms. */
static bool wait_lease_state(uint64_t id, const char *state, int timeout_ms)
{
	uint64_t deadline = itest_now_ms() + (uint64_t)timeout_ms;
	bool yes = false;

	do {
		struct pb_status *s = itest_status(d.socket);
		const struct pb_lease_info *row = itest_lease_row(s, id);

		yes = row && row->state && strcmp(row->state, state) == 0;
		pb_status_free(s);
	} while (!yes && itest_now_ms() <= deadline && (usleep(10000), true));
	return yes;
}

/*
 * The review's sequence. X1 and X2 hold cached-idle leases, Z the rest of
 * the budget. Y waits for 2 MiB (X1 is revoked for it), then stops reading
 * (shutdown SHUT_RD) and asks for 4 MiB more. That revokes X2, whose send
 * fails (X2 stopped reading too): X2 closes, its memory frees, which grants
 * Y's first wait, whose send to Y fails and closes Y -- all inside Y's own
 * acquire handler, which then queues Y's second wait on Y. The daemon must
 * survive it with its books right.
 */
static void scenario(void)
{
	uint64_t x1id, x2id, zid;
	int x1, x2, z, y;
	int64_t n0;

	x1 = holder(2 * MiB, true, &x1id);
	x2 = holder(2 * MiB, true, &x2id);
	z = holder(4 * MiB, false, &zid);
	ck_assert_int_eq(status_leased(d.socket), (int64_t)(8 * MiB));

	y = raw_connect(d.socket);
	ck_assert_int_ge(y, 0);
	ck_assert_int_eq(raw_hello(y), 0);
	ck_assert_int_eq(send_acquire(y, 21, 2 * MiB, true), 0);
	/* Y's first wait is queued and X1 revoked: the daemon's status shows both. */
	ck_assert_int_eq(wait_waiting_acquires(d.socket, 1, 5000), 1);
	ck_assert(wait_lease_state(x1id, "revoking", 5000));
	ck_assert_int_eq(shutdown(x2, SHUT_RD), 0);
	ck_assert_int_eq(shutdown(y, SHUT_RD), 0);
	n0 = status_clients();
	ck_assert_int_eq(send_acquire(y, 22, 4 * MiB, true), 0);
	/* The REVOKE to X2 fails to send and closes X2: the daemon says so, and lists a connection fewer. (X2's lease
	 * stays counted while this process lives, so Y's first wait is not granted here.) */
	ck_assert(daemon_wait_log(&d, "send failed", 5000));
	ck_assert_int_le(wait_clients(n0 - 1, 5000), n0 - 1);

	/* (A child: the daemon is not ours to waitpid; that it still answers is the check.)
	 * The daemon closed X2 and Y, but this process lives: their leases stay counted until it exits. */
	ck_assert_int_ge(status_leased(d.socket), (int64_t)(8 * MiB));
	close(y);
	close(x2);
	close(x1);
	close(z);
}

/* Run fn in a child (clients of a live process keep their leases until it exits), then check the books. */
static void in_child(void (*fn)(void))
{
	pid_t pid = itest_fork();
	int st;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		fn();
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "client child failed (status %d)", st);
	ck_assert_msg(daemon_alive(&d), "pinbrokerd died");
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
	{
		char *out = NULL;

		ck_assert_msg(pinctl(&d, &out, "status") == 0, "pinctl status failed: %s", out);
		free(out);
	}
}

START_TEST(test_failed_send_inside_acquire_keeps_the_daemon_alive)
{
	in_child(scenario);
}
END_TEST

/* Many clients stop reading while revokes and grants go to them: none of it may touch freed memory. */
static int storm_n;

static void storm_round(void)
{
	{
		uint64_t a, b, c;
		int x = holder(2 * MiB, true, &a), w = holder(2 * MiB, true, &b), z = holder(4 * MiB, false, &c);
		int y = raw_connect(d.socket);

		ck_assert_int_ge(y, 0);
		ck_assert_int_eq(raw_hello(y), 0);
		ck_assert_int_eq(send_acquire(y, 1, 2 * MiB, true), 0);
		shutdown(w, SHUT_RD);
		shutdown(y, SHUT_RD);
		ck_assert_int_eq(send_acquire(y, 2, 4 * MiB, true), 0);
		if (storm_n % 2)
			shutdown(x, SHUT_RDWR);
		close(z);
		close(y);
		close(w);
		close(x);
	}
}

START_TEST(test_storm_of_half_closed_clients)
{
	for (storm_n = 0; storm_n < 20; storm_n++)
		in_child(storm_round);
}
END_TEST

CHECK_SUITE(suite, "sec_04_conn_lifetime", "core", start, stop, 120,
	    test_failed_send_inside_acquire_keeps_the_daemon_alive, test_storm_of_half_closed_clients)

SEC_MAIN(suite)

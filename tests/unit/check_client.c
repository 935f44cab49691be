/* SPDX-License-Identifier: MIT */
/* Check suite for libpinbroker against a scripted stand-in daemon: leases in many fd packets, revokes, the cache, fallback, drops. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pinbroker.h"
#include "pinbroker.pb-c.h"
#include "util.h"
#include "wire.h"
#include "check_main.h"

#include "client_mock.h"

START_TEST(test_version_is_the_headers_and_needs_no_daemon)
{
	char want[32];

	snprintf(want, sizeof(want), "%d.%d.%d", PINBROKER_VERSION_MAJOR, PINBROKER_VERSION_MINOR,
		 PINBROKER_VERSION_PATCH);
	ck_assert_ptr_nonnull(pb_version());
	ck_assert_str_eq(pb_version(), want);
	ck_assert_str_eq(pb_version(), PINBROKER_VERSION);
	ck_assert_ptr_eq(pb_version(), pb_version()); /* static: the caller never frees it */
	ck_assert_int_eq(PINBROKER_VERSION_NUMBER,
			 PINBROKER_VERSION_MAJOR * 10000 + PINBROKER_VERSION_MINOR * 100 + PINBROKER_VERSION_PATCH);
}
END_TEST

START_TEST(test_lease_arrives_in_many_fd_packets_and_maps_contiguously)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA, .label = "t1" };
	pb_client *c = connect_mock(&default_cfg);
	pb_lease *l;
	uint8_t *p;

	/* 1 MiB + 1 byte in 64 KiB chunks: 17 chunks, 7 fds a packet, a last chunk of one page. */
	ck_assert_int_eq(pb_acquire(c, (1u << 20) + 1, &o, &l), 0);
	ck_assert_uint_eq(pb_lease_size(l), (1u << 20) + MOCK_PAGE_BYTES);
	ck_assert_uint_eq(pb_lease_chunks(l), 17);
	ck_assert_int_eq(pb_lease_kind(l), PB_MEM_LOCKED);
	ck_assert_int_eq(pb_lease_cuda_registered(l), 0);
	p = pb_lease_data(l);
	ck_assert_ptr_nonnull(p);
	/* Every byte of every chunk is writable, back to back. */
	memset(p, 0xab, pb_lease_size(l));
	p[0] = 42;
	ck_assert(mock_saw(c, "acquire 1 1048577 t1"));
	ck_assert_int_eq(pb_release(c, l), 0);
	/* The daemon's memfd saw the client's write: it is shared memory, not a copy. */
	ck_assert(mock_saw(c, "release 1 first=42"));
	disconnect_mock(c);
}
END_TEST

START_TEST(test_refusal_maps_status_to_errno_with_daemon_message)
{
	pb_client *c = connect_mock(&default_cfg);
	pb_lease *l = (pb_lease *)1;

	ck_assert_int_eq(pb_acquire(c, 128u << 20, NULL, &l), -EDQUOT);
	ck_assert_ptr_null(l);
	ck_assert_str_eq(pb_last_error(), "uid 1000 would exceed its quota");
	ck_assert_str_eq(pb_strerror(-EDQUOT), "over uid quota");
	ck_assert_int_eq(pb_acquire(c, 0, NULL, &l), -EINVAL);
	disconnect_mock(c);
}
END_TEST

START_TEST(test_fallback_when_refused_or_absent)
{
	pb_client *c = connect_mock(&default_cfg);
	pb_lease *l;

	l = pb_acquire_or_fallback(c, 128u << 20, NULL);
	ck_assert_ptr_nonnull(l);
	ck_assert_int_eq(pb_lease_kind(l), PB_MEM_FALLBACK);
	ck_assert_uint_eq(pb_lease_id(l), 0);
	ck_assert_uint_eq((uintptr_t)pb_lease_data(l) % (uintptr_t)sysconf(_SC_PAGESIZE), 0);
	ck_assert_ptr_nonnull(strstr(pb_lease_fallback_reason(l), "broker refused: over uid quota"));
	memset(pb_lease_data(l), 1, pb_lease_size(l));
	ck_assert_int_eq(pb_release(c, l), 0);
	disconnect_mock(c);

	ck_assert_int_eq(pb_connect("/tmp/check_client.no.such.sock", &c), -ENOENT);
	ck_assert_ptr_null(c);
	l = pb_acquire_or_fallback(NULL, 100, NULL);
	ck_assert_ptr_nonnull(l);
	ck_assert_str_eq(pb_lease_fallback_reason(l),
			 "no broker at /tmp/check_client.no.such.sock: No such file or directory");
	ck_assert_uint_eq(pb_lease_size(l), (size_t)sysconf(_SC_PAGESIZE));
	ck_assert_int_eq(pb_release(NULL, l), 0);
}
END_TEST

START_TEST(test_fallback_of_size_0_is_einval_not_a_buffer)
{
	pb_client *c = connect_mock(&default_cfg);

	ck_assert_ptr_null(pb_acquire_or_fallback(c, 0, NULL));
	ck_assert_ptr_nonnull(strstr(pb_last_error(), "size 0"));
	disconnect_mock(c);
	ck_assert_ptr_null(pb_acquire_or_fallback(NULL, 0, NULL));
	ck_assert_ptr_nonnull(strstr(pb_last_error(), "size 0"));
}
END_TEST

START_TEST(test_version_mismatch_is_eprotonosupport)
{
	struct mock_cfg cfg = default_cfg;
	pb_client *c = NULL;

	cfg.version_mismatch = true;
	mock_start(&cfg);
	ck_assert_int_eq(pb_connect(sock_path, &c), -EPROTONOSUPPORT);
	ck_assert_ptr_null(c);
	ck_assert_ptr_nonnull(strstr(pb_last_error(), "pinbrokerd 9.0 speaks protocol 9 only"));
	mock_stop();
}
END_TEST

/*
 * A cached lease is taken back without an ACQUIRE round trip: the daemon hears only that it is in use
 * again. (How fast that is, is bench_lease's business, not an assertion here.)
 */
START_TEST(test_cached_reacquire_reuses_the_lease_without_a_round_trip)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA };
	pb_client *c = connect_mock(&default_cfg);
	pb_lease *a, *b, *d;

	pb_set_cache_limit(c, 8u << 20);
	ck_assert_int_eq(pb_acquire(c, 4u << 20, &o, &a), 0);
	ck_assert_int_eq(pb_release(c, a), 0);
	ck_assert(mock_saw(c, "idle 1 1"));
	ck_assert_int_eq(pb_acquire(c, 3u << 20, &o, &b), 0);
	ck_assert_uint_eq(pb_lease_id(b), 1);
	ck_assert(mock_saw(c, "idle 1 0"));
	/* An ACQUIRE is answered before pb_acquire returns, so by now it would be logged. */
	ck_assert(!mock_saw_prefix_now(c, "acquire 2 "));
	/* More than twice the request is too wasteful to reuse. */
	ck_assert_int_eq(pb_release(c, b), 0);
	ck_assert_int_eq(pb_acquire(c, 1u << 20, &o, &d), 0);
	ck_assert_uint_eq(pb_lease_id(d), 2);
	ck_assert_int_eq(pb_release(c, d), 0); /* cached beside lease 1: 5 MiB of 8 */
	/* Shrinking the cache gives cached leases back for real. */
	pb_set_cache_limit(c, 0);
	ck_assert(mock_saw(c, "release 1 first=0"));
	ck_assert(mock_saw(c, "release 2 first=0"));
	disconnect_mock(c);
}
END_TEST

START_TEST(test_revoke_of_cached_lease_releases_it_in_the_background)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA };
	pb_client *c = connect_mock(&default_cfg);
	uint64_t *ids;
	pb_lease *a;
	size_t n;

	pb_set_cache_limit(c, 8u << 20);
	ck_assert_int_eq(pb_acquire(c, 1u << 20, &o, &a), 0);
	ck_assert_int_eq(pb_release(c, a), 0);
	ck_assert_int_eq(pb_admin_revoke(c, PB_REVOKE_ALL, 0, 0, 0, &ids, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(ids[0], 1);
	free(ids);
	ck_assert(mock_saw(c, "release 1 first=0"));
	ck_assert(mock_saw(c, "ack 1"));
	/* The cache is empty now: the next acquire is a new lease. */
	ck_assert_int_eq(pb_acquire(c, 1u << 20, &o, &a), 0);
	ck_assert_uint_eq(pb_lease_id(a), 2);
	disconnect_mock(c);
}
END_TEST

/*
 * Two leases of 1 MiB, the second (lease 2) set idle, then an admin's revoke of all: the library gives the idle one
 * back itself (released, acknowledged).
 */
static void revoke_all_beside_an_idle_lease(pb_client *c, pb_lease **busy, pb_lease **idle)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA };

	ck_assert_int_eq(pb_acquire(c, 1u << 20, &o, busy), 0);
	ck_assert_int_eq(pb_acquire(c, 1u << 20, &o, idle), 0);
	ck_assert_int_eq(pb_lease_set_idle(*idle, 1), 0);
	ck_assert(mock_saw(c, "idle 2 1"));
	ck_assert_int_eq(pb_admin_revoke(c, PB_REVOKE_ALL, 0, 0, 0, NULL, NULL), 0);
	ck_assert(mock_saw(c, "release 2 first=0"));
	ck_assert(mock_saw(c, "ack 2"));
}

START_TEST(test_revoke_of_idle_lease_releases_it_and_leaves_a_fault_not_memory)
{
	pb_client *c = connect_mock(&default_cfg);
	pb_lease *busy, *idle;

	revoke_all_beside_an_idle_lease(c, &busy, &idle);
	ck_assert_ptr_null(pb_lease_data(idle));
	/* A busy lease without a callback is left alone: no ack, the daemon counts it overdue. */
	ck_assert_ptr_nonnull(pb_lease_data(busy));
	ck_assert(!mock_saw(c, "ack 1"));
	ck_assert_int_eq(pb_release(c, idle), 0);
	ck_assert_int_eq(pb_release(c, busy), 0);
	ck_assert(mock_saw(c, "release 1 first=0"));
	disconnect_mock(c);
}
END_TEST

static int revoke_calls;

/* Releasing from inside the callback is allowed: the library must not wait on its own receiver thread. */
static int release_in_callback(pb_client *c, pb_lease *l, uint32_t deadline_ms, void *userdata)
{
	ck_assert_uint_eq(deadline_ms, 5000);
	ck_assert_ptr_eq(userdata, &revoke_calls);
	revoke_calls++;
	ck_assert_int_eq(pb_release(c, l), 0);
	return 0;
}

START_TEST(test_revoke_callback_may_release_on_the_receiver_thread)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA };
	pb_client *c = connect_mock(&default_cfg);
	pb_lease *l;

	pb_set_cache_limit(c, 8u << 20); /* a revoked lease must not go into the cache */
	pb_set_revoke_callback(c, release_in_callback, &revoke_calls);
	ck_assert_int_eq(pb_acquire(c, 1u << 20, &o, &l), 0);
	ck_assert_int_eq(pb_admin_revoke(c, PB_REVOKE_LEASE, 1, 0, 0, NULL, NULL), 0);
	ck_assert(mock_saw(c, "release 1 first=0"));
	ck_assert(mock_saw(c, "ack 1"));
	ck_assert_int_eq(revoke_calls, 1);
	disconnect_mock(c);
}
END_TEST

/* A REVOKE of the lease being granted (size bytes): pb_acquire gives it back (released, acknowledged), -EAGAIN. */
static void expect_grant_given_back(pb_client *c, size_t size)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA };
	pb_lease *l = NULL;

	ck_assert_int_eq(pb_acquire(c, size, &o, &l), -EAGAIN);
	ck_assert_ptr_null(l);
	ck_assert(mock_saw(c, "release 1 first=0"));
	ck_assert(mock_saw(c, "ack 1"));
}

START_TEST(test_revoke_racing_the_grant_gives_the_lease_back)
{
	struct mock_cfg cfg = default_cfg;
	pb_client *c;

	cfg.revoke_on_grant = true;
	c = connect_mock(&cfg);
	expect_grant_given_back(c, 1u << 20);
	disconnect_mock(c);
}
END_TEST

/*
 * The REVOKE comes behind the whole grant, when the caller has read its reply and stopped reading (and the
 * receiver keeps off the socket for a while after a call): pb_acquire must still see it and give the lease back.
 */
START_TEST(test_revoke_right_behind_the_grant_gives_the_lease_back)
{
	struct mock_cfg cfg = default_cfg;
	struct pb_status *st = NULL;
	pb_client *c;

	cfg.revoke_after_grant = true;
	c = connect_mock(&cfg);
	/* A call first: the receiver, woken from its lone recv by the reply, then leaves the socket to the calls. */
	ck_assert_int_eq(pb_status_get(c, &st), 0);
	pb_status_free(st);
	/* 256 chunks: the client maps for a millisecond or so after its last packet, with the REVOKE queued behind. */
	expect_grant_given_back(c, 16u << 20);
	disconnect_mock(c);
}
END_TEST

/* A forked child calling on its parent's client is refused at once (it would read the parent's socket). */
START_TEST(test_a_forked_child_cannot_call_on_its_parents_client)
{
	pb_client *c = connect_mock(&default_cfg);
	struct pb_status *st = NULL;
	int status;
	pid_t pid;

	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct pb_status *cs = NULL;

		_exit(pb_status_get(c, &cs) == -ECHILD && cs == NULL ? 0 : 1);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's call was not refused with -ECHILD");
	ck_assert_int_eq(pb_status_get(c, &st), 0);
	pb_status_free(st);
	disconnect_mock(c);
}
END_TEST

/* How many of the stand-in's log lines equal line (after mock_saw found one, so async requests have landed). */
static size_t mock_count(pb_client *c, const char *line)
{
	struct pb_status *s;
	size_t n = 0;

	ck_assert_int_eq(pb_status_get(c, &s), 0);
	for (size_t i = 0; i < s->n_transitions; i++)
		n += strcmp(s->transitions[i].text, line) == 0;
	pb_status_free(s);
	return n;
}

START_TEST(test_connection_drop_fails_the_call_in_flight_and_the_next_call_reconnects)
{
	struct mock_cfg cfg = default_cfg;
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA };
	pb_client *c;
	pb_lease *l, *m, *f;
	uint8_t *p, *q;

	/* Each connection is a daemon that started clean: a new instance, lease ids from 1 again. */
	cfg.instance_id = 100;
	cfg.restart_per_conn = true;
	c = connect_mock(&cfg);
	ck_assert_int_eq(pb_acquire(c, 1u << 20, &o, &l), 0);
	ck_assert_uint_eq(pb_lease_id(l), 1);
	p = pb_lease_data(l);
	p[0] = 7;
	/* In flight when the daemon goes: -ECONNRESET... */
	ck_assert_int_eq(pb_admin_set(c, "drop", "now"), -ECONNRESET);
	/* ...and the next call reconnects, whatever the background backoff is doing. */
	ck_assert_int_eq(pb_acquire(c, 1u << 20, &o, &m), 0);
	ck_assert_uint_eq(pb_lease_id(m), 1); /* the same id, in another instance */
	ck_assert_int_eq(pb_lease_stale(m), 0);
	q = pb_lease_data(m);
	q[0] = 9;
	/* The old handle is stale: still mapped and usable here, no longer brokered. */
	ck_assert_int_eq(pb_lease_stale(l), 1);
	ck_assert_int_eq(p[0], 7);
	p[(1u << 20) - 1] = 8;
	ck_assert_int_eq(pb_lease_kind(l), PB_MEM_LOCKED);
	ck_assert_int_eq(pb_lease_set_idle(l, 1), -ESTALE);
	/* Releasing it is local: it must not free lease 1 of the new instance, which is m. */
	ck_assert_int_eq(pb_release(c, l), 0);
	ck_assert_int_eq(pb_release(c, m), 0);
	ck_assert(mock_saw(c, "release 1 first=9"));
	ck_assert_uint_eq(mock_count(c, "release 1 first=9"), 1);
	ck_assert_uint_eq(mock_count(c, "release-unknown 1"), 0);
	ck_assert_uint_eq(mock_count(c, "idle 1 1"), 0);
	/* With no daemon at all, the next call's reconnect fails: -ECONNRESET, then fallback memory. */
	ck_assert_int_eq(pb_admin_set(c, "drop", "now"), -ECONNRESET);
	mock_stop();
	ck_assert_int_eq(pb_acquire(c, 1u << 20, &o, &f), -ECONNRESET);
	ck_assert_ptr_nonnull(strstr(pb_last_error(), "pinbrokerd"));
	f = pb_acquire_or_fallback(c, 4096, NULL);
	ck_assert_int_eq(pb_lease_kind(f), PB_MEM_FALLBACK);
	ck_assert_ptr_nonnull(strstr(pb_lease_fallback_reason(f), "broker failed"));
	ck_assert_int_eq(pb_lease_set_idle(f, 1), 0);
	ck_assert_int_eq(pb_release(c, f), 0);
	pb_disconnect(c);
}
END_TEST

START_TEST(test_same_instance_redeclares_and_only_rejected_leases_go_stale)
{
	struct mock_cfg cfg = default_cfg;
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA };
	pb_client *c;
	pb_lease *a, *b, *n;

	/* A restart that kept its leases (systemd's fd store): the same instance, which lost lease 2. */
	cfg.instance_id = 200;
	cfg.keep_leases = true;
	c = connect_mock(&cfg);
	ck_assert_int_eq(pb_acquire(c, 1u << 20, &o, &a), 0);
	ck_assert_int_eq(pb_acquire(c, 1u << 20, &o, &b), 0);
	ck_assert_int_eq(pb_admin_set(c, "forget", "2"), 0);
	ck_assert_int_eq(pb_admin_set(c, "drop", "now"), -ECONNRESET);
	ck_assert_int_eq(pb_acquire(c, 1u << 20, &o, &n), 0);
	ck_assert_uint_eq(pb_lease_id(n), 3); /* ids go on in the same instance */
	ck_assert(mock_saw(c, "redeclare 2! 1"));
	ck_assert_int_eq(pb_lease_stale(a), 0);
	ck_assert_int_eq(pb_lease_stale(b), 1);
	ck_assert_int_eq(pb_lease_set_idle(a, 1), 0);
	ck_assert(mock_saw(c, "idle 1 1"));
	ck_assert_int_eq(pb_release(c, b), 0);
	ck_assert_int_eq(pb_release(c, a), 0);
	ck_assert_int_eq(pb_release(c, n), 0);
	ck_assert(mock_saw(c, "release 3 first=0"));
	ck_assert_uint_eq(mock_count(c, "release 1 first=0"), 1);
	ck_assert_uint_eq(mock_count(c, "release-unknown 2"), 0);
	disconnect_mock(c);
}
END_TEST

START_TEST(test_set_idle_after_the_library_gave_a_revoked_lease_back_is_estale)
{
	pb_client *c = connect_mock(&default_cfg);
	pb_lease *busy, *idle;

	revoke_all_beside_an_idle_lease(c, &busy, &idle);
	/* The program wants it back: it learns the memory is gone instead of writing through NULL. */
	ck_assert_int_eq(pb_lease_set_idle(idle, 0), -ESTALE);
	ck_assert_ptr_nonnull(strstr(pb_last_error(), "revoked"));
	ck_assert_ptr_null(pb_lease_data(idle));
	ck_assert_int_eq(pb_lease_kind(idle), PB_MEM_REVOKED);
	ck_assert_int_eq(pb_lease_cuda_registered(idle), 0);
	ck_assert_int_eq(pb_lease_stale(idle), 0);
	/* The busy one is untouched and still answers. */
	ck_assert_int_eq(pb_lease_set_idle(busy, 1), 0);
	ck_assert_int_eq(pb_lease_kind(busy), PB_MEM_LOCKED);
	ck_assert_int_eq(pb_lease_set_idle(NULL, 1), -EINVAL);
	ck_assert_int_eq(pb_release(c, idle), 0);
	ck_assert_int_eq(pb_release(c, busy), 0);
	disconnect_mock(c);
}
END_TEST

START_TEST(test_status_and_admin_map_to_public_structs)
{
	pb_client *c = connect_mock(&default_cfg);
	struct pb_status *s;

	ck_assert_int_eq(pb_admin_set(c, "budget", "8G"), 0);
	ck_assert_int_eq(pb_admin_set(c, "deny", "x"), -EACCES);
	ck_assert_str_eq(pb_last_error(), "set needs uid 0 or group pinbroker-admin");
	ck_assert_int_eq(pb_status_get(c, &s), 0);
	ck_assert_str_eq(s->server_version, "mock");
	ck_assert_uint_eq(s->budget_bytes, 1u << 30);
	ck_assert_uint_eq(s->n_signals, 1);
	ck_assert(isnan(s->signals[0].tight));
	ck_assert(s->signals[0].critical == 5.0);
	ck_assert_int_eq(s->signals[0].available, 1);
	ck_assert_str_eq(s->pressure_state, "unknown");
	ck_assert(strncmp(s->transitions[0].text, "hello ", 6) == 0);
	ck_assert_str_eq(s->transitions[0].text + 6, program_invocation_short_name);
	ck_assert_str_eq(s->transitions[1].text, "set budget=8G");
	pb_status_free(s);
	disconnect_mock(c);
}
END_TEST

/* Many threads share one client: replies must reach the thread that asked. */
static void *acquire_loop(void *arg)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA };
	pb_client *c = arg;

	for (int i = 0; i < 50; i++) {
		pb_lease *l;
		size_t size = (size_t)(i % 5 + 1) * 65536;

		if (pb_acquire(c, size, &o, &l) != 0)
			return (void *)1;
		if (pb_lease_size(l) != size) {
			pb_release(c, l);
			return (void *)2;
		}
		memset(pb_lease_data(l), i, size);
		if (pb_release(c, l) != 0)
			return (void *)3;
	}
	return NULL;
}

START_TEST(test_threads_share_one_client)
{
	pb_client *c = connect_mock(&default_cfg);
	pthread_t t[4];

	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, acquire_loop, c), 0);
	for (int i = 0; i < 4; i++) {
		void *ret;

		pthread_join(t[i], &ret);
		ck_assert_ptr_null(ret);
	}
	disconnect_mock(c);
}
END_TEST

START_TEST(test_disconnect_returns_everything)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA };
	pb_client *c = connect_mock(&default_cfg);
	pb_client *c2;
	pb_lease *a, *b;

	pb_set_cache_limit(c, 8u << 20);
	ck_assert_int_eq(pb_acquire(c, 1u << 20, &o, &a), 0);
	ck_assert_int_eq(pb_acquire(c, 1u << 20, &o, &b), 0);
	ck_assert_int_eq(pb_release(c, b), 0); /* cached */
	pb_disconnect(c);
	/* A second connection sees the stand-in's log: both came back by RELEASE before the close. */
	ck_assert_int_eq(pb_connect(sock_path, &c2), 0);
	ck_assert(mock_saw(c2, "release 1 first=0"));
	ck_assert(mock_saw(c2, "release 2 first=0"));
	pb_disconnect(c2);
	mock_stop();
}
END_TEST

/* The mock answers HELLO as a daemon from before registrations: the library asks it for none of them. */
START_TEST(test_registrations_are_not_asked_of_a_daemon_that_predates_them)
{
	const struct pb_acquire_opts nr = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_REVOKE };
	static char buf[4096] __attribute__((aligned(4096)));
	pb_client *c = connect_mock(&default_cfg);
	pb_lease *l = NULL;

	ck_assert_int_eq(pb_register(c, buf, sizeof(buf), NULL, &l), -EOPNOTSUPP);
	ck_assert_ptr_nonnull(strstr(pb_last_error(), "upgrade"));
	ck_assert_int_eq(pb_acquire(c, 4096, &nr, &l), -EOPNOTSUPP);
	ck_assert_ptr_null(l);
	ck_assert_int_eq(pb_report_unbrokered(c, 4096), -EOPNOTSUPP);
	/* Nothing reached the daemon (its first lease is still id 1), and the connection is as good as before. */
	ck_assert_int_eq(pb_acquire(c, 4096, &(struct pb_acquire_opts){ .flags = PB_ACQUIRE_NO_CUDA }, &l), 0);
	ck_assert_uint_eq(pb_lease_id(l), 1);
	ck_assert_int_eq(pb_release(c, l), 0);
	disconnect_mock(c);
}
END_TEST

CHECK_SUITE(client_suite, "client", "mock daemon", NULL, NULL, 30, test_version_is_the_headers_and_needs_no_daemon,
	    test_lease_arrives_in_many_fd_packets_and_maps_contiguously,
	    test_registrations_are_not_asked_of_a_daemon_that_predates_them,
	    test_refusal_maps_status_to_errno_with_daemon_message, test_fallback_when_refused_or_absent,
	    test_fallback_of_size_0_is_einval_not_a_buffer, test_version_mismatch_is_eprotonosupport,
	    test_cached_reacquire_reuses_the_lease_without_a_round_trip,
	    test_revoke_of_cached_lease_releases_it_in_the_background,
	    test_revoke_of_idle_lease_releases_it_and_leaves_a_fault_not_memory,
	    test_revoke_callback_may_release_on_the_receiver_thread, test_revoke_racing_the_grant_gives_the_lease_back,
	    test_revoke_right_behind_the_grant_gives_the_lease_back,
	    test_a_forked_child_cannot_call_on_its_parents_client,
	    test_connection_drop_fails_the_call_in_flight_and_the_next_call_reconnects,
	    test_same_instance_redeclares_and_only_rejected_leases_go_stale,
	    test_set_idle_after_the_library_gave_a_revoked_lease_back_is_estale,
	    test_status_and_admin_map_to_public_structs, test_threads_share_one_client,
	    test_disconnect_returns_everything)

CHECK_MAIN(client_suite)

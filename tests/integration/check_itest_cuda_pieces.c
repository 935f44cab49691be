/* SPDX-License-Identifier: MIT */
/*
 * Integration: libpinbroker registers a lease bigger than the driver's per-call cap in pieces, against the real
 * pinbrokerd and the stand-in libcuda.so.1 (tests/preload/stub_cuda.c). r580 drivers refuse one
 * cuMemHostRegister of 512 GiB or more; here the stand-in refuses one of 6 MiB or more
 * (STUB_CUDA_REGISTER_CAP) and the library cuts at 4 MiB (PINBROKER_CUDA_REGISTER_PIECE), so a 20 MiB lease
 * stands for a terabyte one. Every test runs in its own forked process (Check's fork mode), so the library
 * reads the piece size and loads the stand-in afresh in each.
 */
#define _GNU_SOURCE
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "itest.h"
#include "pinbroker.h"
#include "stub_cuda.h"
#include "check_main.h"

#define MiB (1024ull * 1024ull)
#define PIECE_BYTES (4 * MiB)

static struct daemon d;

/* The stand-in's record, through the handle the test loaded it by. */
static void (*get_stats)(struct stub_cuda_stats *);
static size_t (*register_log)(struct stub_cuda_register_call *, size_t);
static void (*register_gate)(int);
static int (*register_gate_wait)(int, int);

ITEST_FIXTURE_START(start, d, ITEST_ARGS("--budget", "128M", "--prewarm", "32M"))

/* Each test ends with itest_end_clean, which stops the daemon; one that failed before it leaves it running. */
static void stop(void)
{
	if (daemon_alive(&d))
		ck_assert_int_eq(daemon_stop(&d), 0);
}

/*
 * Load the stand-in before the library looks for libcuda.so.1 (it finds it by its soname), set the piece size
 * (read once per process) and the cap, and connect with no cache, so a release unregisters at once.
 */
static pb_client *connect_with_stub(const char *piece)
{
	pb_client *c;
	void *h;

	setenv("PINBROKER_CUDA_REGISTER_PIECE", piece, 1);
	setenv("STUB_CUDA_REGISTER_CAP", "6M", 1);
	unsetenv("PINBROKER_NO_CUDA");
	h = dlopen(STUB_DIR "/libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	ck_assert_ptr_nonnull(h);
	*(void **)&get_stats = dlsym(h, "stub_cuda_get_stats");
	*(void **)&register_log = dlsym(h, "stub_cuda_register_log");
	*(void **)&register_gate = dlsym(h, "stub_cuda_register_gate");
	*(void **)&register_gate_wait = dlsym(h, "stub_cuda_register_gate_wait");
	ck_assert_ptr_nonnull(get_stats);
	ck_assert_ptr_nonnull(register_log);
	ck_assert_ptr_nonnull(register_gate);
	ck_assert_ptr_nonnull(register_gate_wait);
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	pb_set_cache_limit(c, 0);
	ck_assert_int_eq(pb_cuda_available(NULL), 1);
	return c;
}

static struct stub_cuda_stats stats(void)
{
	struct stub_cuda_stats s;

	get_stats(&s);
	return s;
}

/*
 * The stand-in's record since before: register and unregister calls made (refused ones not counted), and bytes
 * registered now that were not then.
 */
static void assert_stub_since(struct stub_cuda_stats before, uint64_t registers, uint64_t unregisters,
			      uint64_t live_bytes)
{
	struct stub_cuda_stats now = stats();

	ck_assert_uint_eq(now.register_calls - before.register_calls, registers);
	ck_assert_uint_eq(now.unregister_calls - before.unregister_calls, unregisters);
	ck_assert_uint_eq(now.registered_bytes - before.registered_bytes, live_bytes);
}

/* The register calls from index from on: each no bigger than a piece, back to back, exactly [p, p + bytes). */
static void assert_pieces_cover(size_t from, size_t n, const void *p, size_t bytes)
{
	struct stub_cuda_register_call calls[64];
	uintptr_t at = (uintptr_t)p;

	ck_assert_uint_eq(register_log(calls, 64), from + n);
	for (size_t i = from; i < from + n; i++) {
		ck_assert_int_eq(calls[i].result, 0);
		ck_assert_msg(calls[i].p == at, "piece %zu starts at %#lx, not %#lx", i - from,
			      (unsigned long)calls[i].p, (unsigned long)at);
		ck_assert_uint_le(calls[i].bytes, PIECE_BYTES);
		at += calls[i].bytes;
	}
	ck_assert_uint_eq(at, (uintptr_t)p + bytes);
}

START_TEST(test_a_lease_above_the_piece_size_is_registered_in_pieces_and_unregistered_whole)
{
	pb_client *c = connect_with_stub("4M");
	struct stub_cuda_stats before = stats();
	pb_lease *l;

	ck_assert_int_eq(pb_acquire(c, 20 * MiB, NULL, &l), 0);
	/* One call of 20 MiB would be refused (the cap is 6 MiB): five of 4 MiB are not. */
	ck_assert_int_eq(pb_lease_kind(l), PB_MEM_PINNED);
	ck_assert_int_eq(pb_lease_cuda_registered(l), 1);
	ck_assert_uint_eq(pb_lease_cuda_piece_bytes(l), PIECE_BYTES);
	assert_stub_since(before, 5, 0, 20 * MiB);
	assert_pieces_cover(before.register_calls, 5, pb_lease_data(l), 20 * MiB);

	ck_assert_int_eq(pb_release(c, l), 0);
	assert_stub_since(before, 5, 5, 0);
	itest_end_clean(&d, c, 3000);
}
END_TEST

START_TEST(test_a_lease_at_or_below_the_piece_size_is_registered_in_one_call)
{
	pb_client *c = connect_with_stub("4M");
	struct stub_cuda_stats before = stats();
	pb_lease *small, *exact;

	ck_assert_int_eq(pb_acquire(c, 1 * MiB, NULL, &small), 0);
	ck_assert_int_eq(pb_acquire(c, PIECE_BYTES, NULL, &exact), 0);
	assert_stub_since(before, 2, 0, 1 * MiB + PIECE_BYTES);
	ck_assert_int_eq(pb_lease_kind(small), PB_MEM_PINNED);
	ck_assert_int_eq(pb_lease_kind(exact), PB_MEM_PINNED);
	ck_assert_uint_eq(pb_lease_cuda_piece_bytes(small), 0);
	ck_assert_uint_eq(pb_lease_cuda_piece_bytes(exact), 0);
	ck_assert_int_eq(pb_release(c, small), 0);
	ck_assert_int_eq(pb_release(c, exact), 0);
	assert_stub_since(before, 2, 2, 0);
	itest_end_clean(&d, c, 3000);
}
END_TEST

/* Without pieces the driver's cap applies: the lease is locked, not pinned, as on an r580 host today. */
START_TEST(test_one_piece_above_the_cap_is_refused_and_the_lease_stays_locked)
{
	pb_client *c;
	pb_lease *l;

	c = connect_with_stub("1G");
	ck_assert_int_eq(pb_acquire(c, 20 * MiB, NULL, &l), 0);
	ck_assert_int_eq(pb_lease_kind(l), PB_MEM_LOCKED);
	ck_assert_int_eq(pb_lease_cuda_registered(l), 0);
	ck_assert_uint_eq(stats().registered_bytes, 0);
	ck_assert_int_eq(pb_release(c, l), 0);
	itest_end_clean(&d, c, 3000);
}
END_TEST

START_TEST(test_a_refused_piece_leaves_nothing_registered_and_says_which)
{
	pb_client *c = connect_with_stub("4M");
	struct stub_cuda_stats before = stats();
	char fail_at[32];
	pb_lease *l;

	/* The third piece of the next lease is refused. */
	snprintf(fail_at, sizeof(fail_at), "%llu", (unsigned long long)before.register_calls + 3);
	setenv("STUB_CUDA_REGISTER_FAIL_AT", fail_at, 1);
	ck_assert_int_eq(pb_acquire(c, 20 * MiB, NULL, &l), 0);
	unsetenv("STUB_CUDA_REGISTER_FAIL_AT");
	assert_stub_since(before, 2, 2, 0); /* two made and undone; the third was refused */
	ck_assert_int_eq(pb_lease_kind(l), PB_MEM_LOCKED);
	ck_assert_int_eq(pb_lease_cuda_registered(l), 0);
	ck_assert_uint_eq(pb_lease_cuda_piece_bytes(l), 0);
	ck_assert_msg(strstr(pb_last_error(), "piece 3 of 5") != NULL, "pb_last_error: %s", pb_last_error());
	/* Its release unregisters nothing more. */
	ck_assert_int_eq(pb_release(c, l), 0);
	assert_stub_since(before, 2, 2, 0);
	itest_end_clean(&d, c, 3000);
}
END_TEST

/*
 * pb_register of the caller's memory, starting mid-page: pieces start at the range, then every piece from its
 * first page, and the last ends where the range does.
 */
START_TEST(test_a_registration_above_the_piece_size_is_made_in_pieces)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes = 10 * MiB;
	uint8_t *buf = mmap(NULL, 12 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	pb_client *c = connect_with_stub("4M");
	struct stub_cuda_stats before = stats();
	struct stub_cuda_register_call calls[8];
	uint8_t *p = buf + 100;
	pb_lease *l;

	ck_assert_ptr_ne(buf, MAP_FAILED);
	ck_assert_int_eq(pb_register(c, p, bytes, NULL, &l), 0);
	ck_assert_int_eq(pb_lease_cuda_registered(l), 1);
	ck_assert_uint_eq(pb_lease_cuda_piece_bytes(l), PIECE_BYTES);
	/* 100 bytes into a page, 10 MiB touch 10 MiB and a page: 4 MiB, 4 MiB and the rest. */
	assert_stub_since(before, 3, 0, bytes);
	ck_assert_uint_eq(register_log(calls, 8), before.register_calls + 3);
	ck_assert_ptr_eq((void *)calls[before.register_calls].p, p);
	ck_assert_uint_eq(calls[before.register_calls].bytes, PIECE_BYTES - 100);
	ck_assert_ptr_eq((void *)calls[before.register_calls + 1].p, buf + PIECE_BYTES);
	ck_assert_ptr_eq((void *)calls[before.register_calls + 2].p, buf + 2 * PIECE_BYTES);
	ck_assert_uint_eq(calls[before.register_calls + 2].bytes, bytes + 100 - 2 * PIECE_BYTES);
	ck_assert_uint_eq(pb_lease_size(l), 10 * MiB + page);
	ck_assert_int_eq(pb_unregister(c, l), 0);
	assert_stub_since(before, 3, 3, 0);
	itest_end_clean(&d, c, 3000);
	munmap(buf, 12 * MiB);
}
END_TEST

/* A lease mapped without CUDA registers only the slice asked for; release unregisters exactly that. */
START_TEST(test_a_slice_of_a_lease_is_registered_alone_and_unregistered_on_release)
{
	pb_client *c = connect_with_stub("4M");
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA };
	struct stub_cuda_stats before = stats();
	struct stub_cuda_register_call calls[64];
	size_t off = 0, len = 0, page, slice;
	pb_lease *l;

	ck_assert_int_eq(pb_acquire(c, 16 * MiB, &o, &l), 0);
	ck_assert_int_eq(pb_lease_kind(l), PB_MEM_LOCKED);
	assert_stub_since(before, 0, 0, 0);
	page = pb_lease_page_size(l);
	slice = (3 * MiB + 1 + page - 1) / page * page;
	ck_assert_int_eq(pb_lease_cuda_slice(l, &off, &len), 0);
	/* Refusals first: nothing is registered by any of them. */
	ck_assert_int_eq(pb_lease_register_slice(l, page / 2, MiB, 0), -EINVAL);
	ck_assert_int_eq(pb_lease_register_slice(l, 4 * MiB, 0, 0), -EINVAL);
	ck_assert_int_eq(pb_lease_register_slice(l, 12 * MiB, 8 * MiB, 0), -ERANGE);
	ck_assert_int_eq(pb_lease_register_slice(l, 0, MiB, PB_ACQUIRE_WAIT), -EINVAL);
	assert_stub_since(before, 0, 0, 0);
	/* 3 MiB and a byte: rounded up to the page. */
	ck_assert_int_eq(pb_lease_register_slice(l, 4 * MiB, 3 * MiB + 1, 0), 0);
	assert_stub_since(before, 1, 0, slice);
	ck_assert_uint_eq(register_log(calls, 64), before.register_calls + 1);
	ck_assert_ptr_eq((void *)calls[before.register_calls].p, (uint8_t *)pb_lease_data(l) + 4 * MiB);
	ck_assert_uint_eq(calls[before.register_calls].bytes, slice);
	ck_assert_int_eq(pb_lease_kind(l), PB_MEM_PINNED);
	ck_assert_int_eq(pb_lease_cuda_registered(l), 1);
	ck_assert_int_eq(pb_lease_cuda_slice(l, &off, &len), 1);
	ck_assert_uint_eq(off, 4 * MiB);
	ck_assert_uint_eq(len, slice);
	/* One registration per process: a second slice, or the whole lease again, is refused. */
	ck_assert_int_eq(pb_lease_register_slice(l, 0, MiB, 0), -EALREADY);
	ck_assert_int_eq(pb_release(c, l), 0);
	assert_stub_since(before, 1, 1, 0);
	itest_end_clean(&d, c, 3000);
}
END_TEST

/* One pb_lease_register_slice call on its own thread: its result and pb_last_error (which is per thread). */
struct slice_call {
	pb_lease *l;
	size_t offset, length;
	int result;
	char error[256];
};

static void *register_slice_thread(void *arg)
{
	struct slice_call *sc = arg;

	sc->result = pb_lease_register_slice(sc->l, sc->offset, sc->length, 0);
	snprintf(sc->error, sizeof(sc->error), "%s", pb_last_error());
	return NULL;
}

/*
 * Two threads register slices of one lease at once: the first is in the driver (held at the stand-in's gate)
 * when the second asks; the second is refused with -EBUSY at once, and only the first slice is registered.
 */
START_TEST(test_a_second_concurrent_slice_registration_is_refused_busy)
{
	pb_client *c = connect_with_stub("4M");
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA };
	struct stub_cuda_stats before = stats();
	struct slice_call first = { .offset = 0, .length = MiB }, second = { .offset = 8 * MiB, .length = MiB };
	pthread_t t1, t2;
	struct timespec until;
	size_t off = 1, len = 0;
	pb_lease *l;
	int joined;

	ck_assert_int_eq(pb_acquire(c, 16 * MiB, &o, &l), 0);
	first.l = second.l = l;
	register_gate(1);
	ck_assert_int_eq(pthread_create(&t1, NULL, register_slice_thread, &first), 0);
	ck_assert_int_eq(register_gate_wait(1, 10000), 1);
	ck_assert_int_eq(pthread_create(&t2, NULL, register_slice_thread, &second), 0);
	/* The second call returns without the driver; were it let through, it would wait at the gate. */
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 10;
	joined = pthread_timedjoin_np(t2, NULL, &until);
	register_gate(0);
	ck_assert_int_eq(pthread_join(t1, NULL), 0);
	if (joined != 0)
		ck_assert_int_eq(pthread_join(t2, NULL), 0);
	ck_assert_int_eq(joined, 0);
	ck_assert_int_eq(first.result, 0);
	ck_assert_int_eq(second.result, -EBUSY);
	ck_assert_msg(strstr(second.error, "another thread is registering") != NULL, "pb_last_error: %s", second.error);
	assert_stub_since(before, 1, 0, MiB);
	ck_assert_int_eq(pb_lease_cuda_slice(l, &off, &len), 1);
	ck_assert_uint_eq(off, 0);
	ck_assert_uint_eq(len, MiB);
	/* Once the first is done, the lease is registered: a later call is refused as such. */
	ck_assert_int_eq(pb_lease_register_slice(l, 8 * MiB, MiB, 0), -EALREADY);
	ck_assert_int_eq(pb_release(c, l), 0);
	assert_stub_since(before, 1, 1, 0);
	itest_end_clean(&d, c, 3000);
}
END_TEST

/* A lease registered whole has no slice to register; ordinary memory none either. */
START_TEST(test_a_slice_of_a_registered_lease_or_of_ordinary_memory_is_refused)
{
	pb_client *c = connect_with_stub("4M");
	pb_lease *l;

	ck_assert_int_eq(pb_acquire(c, 4 * MiB, NULL, &l), 0);
	ck_assert_int_eq(pb_lease_kind(l), PB_MEM_PINNED);
	ck_assert_int_eq(pb_lease_register_slice(l, 0, MiB, 0), -EALREADY);
	ck_assert_msg(strstr(pb_last_error(), "PB_ACQUIRE_NO_CUDA") != NULL, "pb_last_error: %s", pb_last_error());
	ck_assert_int_eq(pb_lease_cuda_slice(l, NULL, NULL), 0);
	ck_assert_int_eq(pb_release(c, l), 0);
	l = pb_acquire_or_fallback(NULL, MiB, NULL);
	ck_assert_ptr_nonnull(l);
	ck_assert_int_eq(pb_lease_kind(l), PB_MEM_FALLBACK);
	ck_assert_int_eq(pb_lease_register_slice(l, 0, MiB, 0), -EINVAL);
	ck_assert_int_eq(pb_lease_register_slice(NULL, 0, MiB, 0), -EINVAL);
	ck_assert_int_eq(pb_release(NULL, l), 0);
	itest_end_clean(&d, c, 3000);
}
END_TEST

/*
 * Ranks of one shared lease, each attached without CUDA and registering its own quarter: the driver pins the
 * region once in all (four quarter registrations), where whole attaches would pin it once per rank.
 */
START_TEST(test_ranks_attached_without_cuda_register_their_slices_once_in_all)
{
	pb_client *owner = connect_with_stub("64M"), *rank[3];
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA };
	struct stub_cuda_stats before = stats();
	char token[PB_SHARE_TOKEN_LEN];
	pb_lease *l, *att[3];
	size_t quarter = 4 * MiB;

	ck_assert_int_eq(pb_acquire(owner, 4 * quarter, &o, &l), 0);
	ck_assert_int_eq(pb_lease_share(owner, l, NULL, 0, token), 0);
	ck_assert_int_eq(pb_lease_register_slice(l, 0, quarter, 0), 0);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(pb_connect(d.socket, &rank[i]), 0);
		ck_assert_int_eq(pb_attach_opts(rank[i], token, &o, &att[i]), 0);
		ck_assert_int_eq(pb_lease_attached(att[i]), 1);
		ck_assert_int_eq(pb_lease_kind(att[i]), PB_MEM_LOCKED);
		ck_assert_int_eq(pb_lease_register_slice(att[i], (size_t)(i + 1) * quarter, quarter, 0), 0);
	}
	assert_stub_since(before, 4, 0, 4 * quarter);
	/* The daemon lends the region once, whatever the ranks register. */
	{
		struct pb_status *st;

		ck_assert_int_eq(pb_status_get(owner, &st), 0);
		ck_assert_uint_ge(st->leased_bytes, 4 * quarter);
		ck_assert_uint_lt(st->leased_bytes, 8 * quarter);
		pb_status_free(st);
	}
	/* An attach with a flag other than NO_CUDA or MAPPED is refused before anything is sent. */
	{
		struct pb_acquire_opts bad = { .flags = PB_ACQUIRE_WAIT };
		pb_lease *x;

		ck_assert_int_eq(pb_attach_opts(rank[0], token, &bad, &x), -EINVAL);
	}
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(pb_release(rank[i], att[i]), 0);
		pb_disconnect(rank[i]);
	}
	ck_assert_int_eq(pb_release(owner, l), 0);
	assert_stub_since(before, 4, 4, 0);
	itest_end_clean(&d, owner, 3000);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-cuda-pieces");

	CHECK_CASE(s, "pieces", start, stop, 60,
		   test_a_lease_above_the_piece_size_is_registered_in_pieces_and_unregistered_whole,
		   test_a_lease_at_or_below_the_piece_size_is_registered_in_one_call,
		   test_one_piece_above_the_cap_is_refused_and_the_lease_stays_locked,
		   test_a_refused_piece_leaves_nothing_registered_and_says_which,
		   test_a_registration_above_the_piece_size_is_made_in_pieces,
		   test_a_slice_of_a_lease_is_registered_alone_and_unregistered_on_release,
		   test_a_second_concurrent_slice_registration_is_refused_busy,
		   test_a_slice_of_a_registered_lease_or_of_ordinary_memory_is_refused,
		   test_ranks_attached_without_cuda_register_their_slices_once_in_all);
	return s;
}

CHECK_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/*
 * Integration: pb_copy_to_device and pb_copy_from_device stage pageable copies through a ring leased from the
 * real pinbrokerd, on the stand-in libcuda.so.1 (tests/preload/stub_cuda*.c: device memory, streams that run
 * later on threads of their own, events, copies logged by the kind of their host side). Bytes exact around slot
 * boundaries and alignments, ordered after a kernel on the same stream; the ring is one lease, labelled, exact;
 * a revoke (idle or during a copy), a refusal, a busy ring, PINBROKER_STAGING=0 and no client all leave the copy
 * to the driver with the same bytes; a forked child has no ring. Each test runs in its own forked process
 * (Check's fork mode), so the library reads its settings and loads the stand-in afresh in each.
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
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"
#include "pinbroker.h"
#include "check_main.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
/* A small ring, so a few MiB make many pieces and go round the ring several times: 4 slots of 64 KiB. */
#define SLOT_BYTES (64 * KiB)
#define RING_BYTES (4 * SLOT_BYTES)
#define THRESHOLD_BYTES (64 * KiB)

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

/*
 * The leading fields of the stand-in's struct stub_cuda_copy_stats (stub_cuda.h), as stub_cuda_copy_get_stats
 * fills it: copied here, with room for the rest, so this suite builds (and skips, saying why) against a stand-in
 * without the copy log.
 */
struct copy_log {
	uint64_t calls;
	uint64_t pageable_copies;
	uint64_t pageable_bytes;
	uint64_t pageable_h2d_bytes;
	uint64_t pageable_d2h_bytes;
	uint64_t pinned_copies;
	uint64_t pinned_bytes;
	uint64_t device_copies;
	uint64_t device_bytes;
	uint64_t host_copies;
	uint64_t captured_copies;
	uint64_t rest[64];
};

static struct daemon d;

/* The stand-in's calls, through the handle the suite loaded it by; the first one missing, when one is. */
static struct {
	CUresult (*mem_alloc)(CUdeviceptr *p, size_t bytes);
	CUresult (*primary_retain)(void **ctx, int dev);
	CUresult (*ctx_set_current)(void *ctx);
	CUresult (*stream_create)(void **s, unsigned flags);
	CUresult (*stream_sync)(void *s);
	void (*copy_stats)(struct copy_log *s);
	void (*gate)(int closed);
	void (*stream_delay_us)(unsigned us);
	int (*gate_waiting)(void);
	int (*launch_add)(void *stream, unsigned long long dptr, int addend, size_t bytes);
	CUresult (*mem_alloc_managed)(CUdeviceptr *p, size_t bytes, unsigned flags);
	CUresult (*begin_capture)(void *s, int mode);
	CUresult (*end_capture)(void *s, void **graph);
	/* What the library needs of the driver for staged copies. */
	void *pointer_attributes, *is_capturing, *event_create, *event_record, *event_sync, *event_query,
		*event_destroy, *htod_async, *dtoh_async, *dtoh;
} stub;
static const char *stub_missing;

static void *need(void *h, const char *name)
{
	void *p = dlsym(h, name);

	if (!p && !stub_missing)
		stub_missing = name;
	return p;
}

/* Loaded before the library looks for libcuda.so.1 (it finds it by its soname); children inherit it. */
static void load_stub(void)
{
	void *h = dlopen(STUB_DIR "/libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);

	if (!h) {
		stub_missing = "libcuda.so.1 itself";
		return;
	}
	*(void **)&stub.mem_alloc = need(h, "cuMemAlloc_v2");
	*(void **)&stub.primary_retain = need(h, "cuDevicePrimaryCtxRetain");
	*(void **)&stub.ctx_set_current = need(h, "cuCtxSetCurrent");
	*(void **)&stub.stream_create = need(h, "cuStreamCreate");
	*(void **)&stub.stream_sync = need(h, "cuStreamSynchronize");
	*(void **)&stub.copy_stats = need(h, "stub_cuda_copy_get_stats");
	*(void **)&stub.gate = need(h, "stub_cuda_copy_gate");
	*(void **)&stub.stream_delay_us = need(h, "stub_cuda_set_stream_delay_us");
	*(void **)&stub.gate_waiting = need(h, "stub_cuda_copy_gate_waiting");
	*(void **)&stub.launch_add = need(h, "stub_cuda_launch_add");
	*(void **)&stub.mem_alloc_managed = need(h, "cuMemAllocManaged");
	*(void **)&stub.begin_capture = need(h, "cuStreamBeginCapture_v2");
	*(void **)&stub.end_capture = need(h, "cuStreamEndCapture");
	stub.pointer_attributes = need(h, "cuPointerGetAttributes");
	stub.is_capturing = need(h, "cuStreamIsCapturing");
	stub.event_create = need(h, "cuEventCreate");
	stub.event_record = need(h, "cuEventRecord");
	stub.event_sync = need(h, "cuEventSynchronize");
	stub.event_query = need(h, "cuEventQuery");
	stub.event_destroy = need(h, "cuEventDestroy_v2");
	stub.htod_async = need(h, "cuMemcpyHtoDAsync_v2");
	stub.dtoh_async = need(h, "cuMemcpyDtoHAsync_v2");
	stub.dtoh = need(h, "cuMemcpyDtoH_v2");
}

ITEST_FIXTURE_START(start, d, ITEST_ARGS("--budget", "128M", "--prewarm", "32M"))

/* Each test ends with itest_end_clean, which stops the daemon; one that failed before it leaves it running. */
static void stop(void)
{
	if (daemon_alive(&d))
		ck_assert_int_eq(daemon_stop(&d), 0);
}

/* The test's clean end: the client's disconnect gives the ring back, then nothing is leased and the daemon stops. */
static void end(pb_client *c)
{
	pb_disconnect(c);
	itest_end_clean(&d, NULL, 5000);
}

/* This thread's context: device 0's primary, as the CUDA runtime makes current. */
static void make_context_current(void)
{
	void *ctx = NULL;

	ck_assert_int_eq(stub.primary_retain(&ctx, 0), 0);
	ck_assert_int_eq(stub.ctx_set_current(ctx), 0);
}

/* A client with the small ring, no lease cache, and a context current on this thread. */
static pb_client *connect_small_ring(void)
{
	struct pb_staging_opts o = {
		.ring_bytes = RING_BYTES, .slot_bytes = SLOT_BYTES, .threads = 3, .threshold_bytes = THRESHOLD_BYTES
	};
	pb_client *c;

	unsetenv("PINBROKER_NO_CUDA");
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	pb_set_cache_limit(c, 0);
	ck_assert_int_eq(pb_cuda_available(NULL), 1);
	ck_assert_msg(pb_staging_configure(c, &o) == 0, "pb_staging_configure: %s", pb_last_error());
	make_context_current();
	return c;
}

static struct copy_log copy_stats(void)
{
	struct copy_log s;

	stub.copy_stats(&s);
	return s;
}

static struct pb_staging_stats staging_stats(pb_client *c)
{
	struct pb_staging_stats s;

	ck_assert_int_eq(pb_staging_stats(c, &s), 0);
	return s;
}

static CUdeviceptr dev_alloc(size_t bytes)
{
	CUdeviceptr p = 0;

	ck_assert_int_eq(stub.mem_alloc(&p, bytes), 0);
	return p;
}

static void *stream_new(void)
{
	void *s = NULL;

	ck_assert_int_eq(stub.stream_create(&s, 0), 0);
	return s;
}

/* A pattern that differs at every byte of a piece and from piece to piece (no period of 64 KiB). */
static void fill_pattern(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 131 + (i >> 9) * 7 + seed);
}

/*
 * One round trip of n bytes at host offset hoff and device offset doff: host to device, checked on the device
 * itself once the stream is done; then a kernel adds 1 on the same stream and the copy back must see it.
 * Guard bytes around the host destination stay untouched.
 */
static void round_trip(pb_client *c, void *stream, CUdeviceptr dbuf, size_t n, size_t hoff, size_t doff)
{
	uint8_t *src = malloc(n + 64), *dst = malloc(n + 128);
	const uint8_t *dev = (const uint8_t *)(uintptr_t)(dbuf + doff);

	ck_assert_ptr_nonnull(src);
	ck_assert_ptr_nonnull(dst);
	fill_pattern(src + hoff, n, (unsigned)(n + hoff + doff));
	ck_assert_msg(pb_copy_to_device(c, dbuf + doff, src + hoff, n, stream) == 0, "to device, %zu bytes: %s", n,
		      pb_last_error());
	/* The source may be reused at once: scribbling on it must not change what lands on the device. */
	memset(src + hoff, 0xee, n);
	ck_assert_int_eq(stub.stream_sync(stream), 0);
	fill_pattern(src + hoff, n, (unsigned)(n + hoff + doff));
	ck_assert_msg(memcmp(dev, src + hoff, n) == 0, "%zu bytes at +%zu/+%zu differ on the device", n, hoff, doff);

	ck_assert_int_eq(stub.launch_add(stream, dbuf + doff, 1, n), 0);
	memset(dst, 0x5a, n + 128);
	ck_assert_msg(pb_copy_from_device(c, dst + 64 + hoff, dbuf + doff, n, stream) == 0,
		      "from device, %zu bytes: %s", n, pb_last_error());
	for (size_t i = 0; i < n; i++)
		if (dst[64 + hoff + i] != (uint8_t)(src[hoff + i] + 1))
			ck_abort_msg("%zu bytes at +%zu/+%zu: byte %zu is %u, not %u", n, hoff, doff, i,
				     dst[64 + hoff + i], (uint8_t)(src[hoff + i] + 1));
	for (size_t i = 0; i < 64 + hoff; i++)
		ck_assert_uint_eq(dst[i], 0x5a);
	for (size_t i = 64 + hoff + n; i < n + 128; i++)
		ck_assert_uint_eq(dst[i], 0x5a);
	free(src);
	free(dst);
}

START_TEST(test_round_trips_are_exact_around_slot_boundaries_and_alignments)
{
	static const size_t sizes[] = { THRESHOLD_BYTES, SLOT_BYTES + 1, 2 * SLOT_BYTES - 1, 2 * SLOT_BYTES,
					RING_BYTES,      RING_BYTES + 1, 1 * MiB + 17,       3 * MiB + 4095 };
	static const size_t hoffs[] = { 0, 1, 63 }, doffs[] = { 0, 7 };
	pb_client *c = connect_small_ring();
	CUdeviceptr dbuf = dev_alloc(4 * MiB);
	void *stream = stream_new();
	struct copy_log before = copy_stats(), after;
	struct pb_staging_stats s;
	uint64_t bytes = 0, trips = 0;

	/* The GPU lags: a slot filled again before its copy ran, or read before it was written, shows. */
	stub.stream_delay_us(50);

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		for (size_t h = 0; h < 3; h++)
			for (size_t k = 0; k < 2; k++) {
				round_trip(c, stream, dbuf, sizes[i], hoffs[h], doffs[k]);
				bytes += sizes[i];
				trips++;
			}
	/* The legacy default stream too (NULL). */
	round_trip(c, NULL, dbuf, RING_BYTES + 3, 5, 9);
	bytes += RING_BYTES + 3;
	trips++;

	after = copy_stats();
	s = staging_stats(c);
	/* Every byte went through the ring: the driver saw pinned copies only, and staged nothing itself. */
	ck_assert_uint_eq(after.pageable_copies, before.pageable_copies);
	ck_assert_uint_gt(after.pinned_copies, before.pinned_copies);
	ck_assert_uint_eq(after.pinned_bytes - before.pinned_bytes, 2 * bytes);
	ck_assert_uint_eq(s.h2d_copies, trips);
	ck_assert_uint_eq(s.d2h_copies, trips);
	ck_assert_uint_eq(s.h2d_bytes, bytes);
	ck_assert_uint_eq(s.d2h_bytes, bytes);
	ck_assert_uint_eq(s.driver_copies, 0);
	ck_assert_uint_eq(s.ring_leases, 1);
	ck_assert_uint_eq(s.ring_bytes, RING_BYTES);
	ck_assert_uint_gt(s.busy_ns, 0);
	end(c);
}
END_TEST

START_TEST(test_a_copy_under_the_threshold_goes_to_the_driver_untouched)
{
	pb_client *c = connect_small_ring();
	CUdeviceptr dbuf = dev_alloc(THRESHOLD_BYTES);
	uint8_t *src = malloc(THRESHOLD_BYTES), *dst = malloc(THRESHOLD_BYTES);
	struct copy_log before = copy_stats(), after;
	struct pb_staging_stats s;

	fill_pattern(src, THRESHOLD_BYTES - 1, 3);
	ck_assert_int_eq(pb_copy_to_device(c, dbuf, src, THRESHOLD_BYTES - 1, NULL), 0);
	ck_assert_int_eq(pb_copy_from_device(c, dst, dbuf, THRESHOLD_BYTES - 1, NULL), 0);
	ck_assert_int_eq(memcmp(src, dst, THRESHOLD_BYTES - 1), 0);
	after = copy_stats();
	s = staging_stats(c);
	ck_assert_uint_eq(after.pageable_copies - before.pageable_copies, 2);
	ck_assert_uint_eq(after.pinned_copies, before.pinned_copies);
	ck_assert_uint_eq(s.h2d_copies + s.d2h_copies + s.driver_copies + s.ring_leases, 0);
	/* No ring was taken for it. */
	ck_assert_int_eq(wait_leased(d.socket, 0, 1000), 0);
	free(src);
	free(dst);
	end(c);
}
END_TEST

/* The ring's row in the daemon's status: the one lease labelled "staging ring"; its id, or 0. */
static uint64_t ring_lease(uint64_t *bytes)
{
	struct pb_status *st = itest_status(d.socket);
	uint64_t id = 0;
	int rings = 0;

	for (size_t i = 0; i < st->n_leases; i++)
		if (strncmp(st->leases[i].label, "staging ring", 12) == 0) {
			id = st->leases[i].id;
			*bytes = st->leases[i].bytes;
			rings++;
		}
	pb_status_free(st);
	ck_assert_int_le(rings, 1);
	return id;
}

/* One staged copy, to make the library take its ring. */
static void stage_once(pb_client *c, CUdeviceptr dbuf)
{
	uint8_t *src = malloc(RING_BYTES);

	fill_pattern(src, RING_BYTES, 1);
	ck_assert_int_eq(pb_copy_to_device(c, dbuf, src, RING_BYTES, NULL), 0);
	free(src);
}

/* Pinned (a lease: registered with the driver), managed memory and a stream being captured: the driver's copies. */
START_TEST(test_pinned_managed_and_captured_copies_go_to_the_driver_untouched)
{
	pb_client *c = connect_small_ring();
	size_t n = 1 * MiB;
	CUdeviceptr dbuf = dev_alloc(n), managed = 0;
	uint8_t *page = malloc(n);
	struct copy_log before, after;
	void *stream = stream_new(), *graph = NULL;
	pb_lease *l;

	ck_assert_int_eq(pb_acquire(c, n, NULL, &l), 0);
	ck_assert_int_eq(pb_lease_kind(l), PB_MEM_PINNED);
	fill_pattern(pb_lease_data(l), n, 6);
	fill_pattern(page, n, 8);
	ck_assert_int_eq(stub.mem_alloc_managed(&managed, n, 1), 0);
	before = copy_stats();
	ck_assert_int_eq(pb_copy_to_device(c, dbuf, pb_lease_data(l), n, NULL), 0);
	ck_assert_int_eq(pb_copy_from_device(c, pb_lease_data(l), dbuf, n, NULL), 0);
	ck_assert_int_eq(pb_copy_to_device(c, managed, page, n, NULL), 0);
	ck_assert_int_eq(stub.begin_capture(stream, 0), 0);
	ck_assert_int_eq(pb_copy_to_device(c, dbuf, page, n, stream), 0);
	ck_assert_int_eq(stub.end_capture(stream, &graph), 0);
	after = copy_stats();
	ck_assert_uint_eq(after.pinned_copies - before.pinned_copies, 2);
	ck_assert_uint_eq(after.captured_copies - before.captured_copies, 1);
	/* The managed and the captured copy, each as made (the stand-in logs a copy by its host side). */
	ck_assert_uint_eq(after.pageable_copies - before.pageable_copies, 2);
	ck_assert_uint_eq(staging_stats(c).ring_leases + staging_stats(c).h2d_copies + staging_stats(c).d2h_copies +
				  staging_stats(c).driver_copies,
			  0);
	ck_assert_int_eq(pb_release(c, l), 0);
	free(page);
	end(c);
}
END_TEST

START_TEST(test_the_ring_is_one_exact_lease_labelled_staging_ring)
{
	struct pb_staging_opts later = { .threads = 2 };
	pb_client *c = connect_small_ring();
	CUdeviceptr dbuf = dev_alloc(RING_BYTES);
	uint64_t bytes = 0;

	ck_assert_uint_eq(ring_lease(&bytes), 0);
	stage_once(c, dbuf);
	stage_once(c, dbuf);
	ck_assert_uint_ne(ring_lease(&bytes), 0);
	ck_assert_uint_eq(bytes, RING_BYTES);
	ck_assert_int_eq(status_leased(d.socket), (int64_t)RING_BYTES);
	ck_assert_uint_eq(staging_stats(c).ring_leases, 1);
	/* Settings change only while no ring is held. */
	ck_assert_int_eq(pb_staging_configure(c, &later), -EBUSY);
	/* pb_disconnect gives the ring back. */
	end(c);
}
END_TEST

START_TEST(test_bad_settings_are_refused_by_name)
{
	struct pb_staging_opts threads = { .threads = 65 }, ring = { .ring_bytes = ((size_t)1 << 30) + 4096 };
	pb_client *c;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_staging_configure(c, &threads), -EINVAL);
	ck_assert_ptr_nonnull(strstr(pb_last_error(), "threads"));
	ck_assert_int_eq(pb_staging_configure(c, &ring), -EINVAL);
	ck_assert_ptr_nonnull(strstr(pb_last_error(), "ring_bytes"));
	ck_assert_int_eq(pb_staging_configure(c, NULL), -EINVAL);
	end(c);
}
END_TEST

/* The round trip's checks on one more copy each way, after the ring went: the driver copies them, as well. */
static void driver_round_trip(pb_client *c, CUdeviceptr dbuf, size_t n)
{
	struct copy_log before = copy_stats(), after;

	round_trip(c, NULL, dbuf, n, 3, 0);
	after = copy_stats();
	ck_assert_uint_eq(after.pageable_copies - before.pageable_copies, 2);
}

START_TEST(test_a_revoked_idle_ring_is_given_back_and_copies_go_to_the_driver)
{
	pb_client *c = connect_small_ring();
	CUdeviceptr dbuf = dev_alloc(1 * MiB);
	struct pb_staging_stats s;
	uint64_t bytes, id;

	stage_once(c, dbuf);
	id = ring_lease(&bytes);
	ck_assert_uint_ne(id, 0);
	ck_assert_int_eq(pb_admin_revoke(c, PB_REVOKE_LEASE, id, 0, 5000, NULL, NULL), 0);
	/* Given back by the library on its own (no copy was running), long before the deadline. */
	ck_assert_int_eq(wait_leased(d.socket, 0, 4000), 0);
	driver_round_trip(c, dbuf, 1 * MiB);
	s = staging_stats(c);
	ck_assert_uint_eq(s.ring_revoked, 1);
	ck_assert_uint_eq(s.ring_bytes, 0);
	ck_assert_uint_eq(s.driver_copies, 2);
	/* The back-off: no new ring was asked for. */
	ck_assert_uint_eq(s.ring_leases, 1);
	ck_assert_int_eq(status_leased(d.socket), 0);
	end(c);
}
END_TEST

struct copier {
	pb_client *c;
	CUdeviceptr dbuf;
	uint8_t *dst;
	size_t n;
	int r;
};

static void *copy_back(void *arg)
{
	struct copier *k = arg;

	make_context_current();
	k->r = pb_copy_from_device(k->c, k->dst, k->dbuf, k->n, NULL);
	return NULL;
}

/* Start a staged copy from the device in another thread and hold it, mid-copy, at the stand-in's gate. */
static void start_held_copy(struct copier *k, pthread_t *t)
{
	/* Nothing earlier may wait at the gate: a copy waiting there then is the other thread's, which holds the ring. */
	ck_assert_int_eq(stub.stream_sync(NULL), 0);
	stub.gate(1);
	ck_assert_int_eq(pthread_create(t, NULL, copy_back, k), 0);
	for (int i = 0; i < 5000 && stub.gate_waiting() < 1; i++)
		usleep(1000); /* polls a condition, with a bound */
	ck_assert_int_ge(stub.gate_waiting(), 1);
}

START_TEST(test_a_revoke_during_a_copy_lets_it_finish_then_gives_the_ring_back)
{
	pb_client *c = connect_small_ring();
	size_t n = 1 * MiB;
	CUdeviceptr dbuf = dev_alloc(n);
	uint8_t *src = malloc(n);
	struct copier k = { .c = c, .dbuf = dbuf, .dst = malloc(n), .n = n };
	uint64_t bytes, id;
	pthread_t t;

	fill_pattern(src, n, 9);
	ck_assert_int_eq(pb_copy_to_device(c, dbuf, src, n, NULL), 0);
	id = ring_lease(&bytes);
	ck_assert_uint_ne(id, 0);
	start_held_copy(&k, &t);
	ck_assert_int_eq(pb_admin_revoke(c, PB_REVOKE_LEASE, id, 0, 10000, NULL, NULL), 0);
	/* The library heard of it (its revoke hook counts it)... */
	for (int i = 0; i < 5000 && staging_stats(c).ring_revoked < 1; i++)
		usleep(1000); /* polls a condition, with a bound */
	ck_assert_uint_eq(staging_stats(c).ring_revoked, 1);
	/* ...and keeps it: the copy in flight has it. */
	ck_assert_int_eq(status_leased(d.socket), (int64_t)RING_BYTES);
	stub.gate(0);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert_int_eq(k.r, 0);
	ck_assert_int_eq(memcmp(k.dst, src, n), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 5000), 0);
	ck_assert_uint_eq(staging_stats(c).ring_revoked, 1);
	ck_assert_uint_eq(staging_stats(c).d2h_copies, 1);
	/* One ring's worth was queued when the revoke came: it went through the ring, the driver copied the rest, so
	 * the ring was free to go after at most a ring of pieces, whatever the copy's size. */
	ck_assert_uint_eq(staging_stats(c).d2h_bytes, RING_BYTES);
	free(src);
	free(k.dst);
	end(c);
}
END_TEST

START_TEST(test_a_busy_ring_leaves_another_threads_copy_to_the_driver)
{
	pb_client *c = connect_small_ring();
	size_t n = 1 * MiB;
	CUdeviceptr dbuf = dev_alloc(2 * n);
	uint8_t *src = malloc(n), *other = malloc(n);
	struct copier k = { .c = c, .dbuf = dbuf, .dst = malloc(n), .n = n };
	struct copy_log before;
	pthread_t t;

	fill_pattern(src, n, 2);
	fill_pattern(other, n, 4);
	ck_assert_int_eq(pb_copy_to_device(c, dbuf, src, n, NULL), 0);
	start_held_copy(&k, &t);
	before = copy_stats();
	/* The ring is in the other thread's hands: this copy must neither wait for it nor fail. */
	ck_assert_int_eq(pb_copy_to_device(c, dbuf + n, other, n, stream_new()), 0);
	ck_assert_uint_eq(copy_stats().pageable_copies - before.pageable_copies, 1);
	stub.gate(0);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert_int_eq(k.r, 0);
	ck_assert_int_eq(memcmp(k.dst, src, n), 0);
	ck_assert_uint_eq(staging_stats(c).driver_copies, 1);
	free(src);
	free(other);
	free(k.dst);
	end(c);
}
END_TEST

START_TEST(test_a_refused_ring_leaves_copies_to_the_driver_and_backs_off)
{
	/* More than the whole budget: never satisfiable, refused at once. */
	struct pb_staging_opts big = { .ring_bytes = 512 * MiB, .slot_bytes = 8 * MiB };
	pb_client *c = connect_small_ring();
	CUdeviceptr dbuf = dev_alloc(1 * MiB);
	struct pb_staging_stats s;

	ck_assert_int_eq(pb_staging_configure(c, &big), 0);
	driver_round_trip(c, dbuf, 1 * MiB);
	driver_round_trip(c, dbuf, 1 * MiB);
	s = staging_stats(c);
	ck_assert_uint_eq(s.ring_refused, 1); /* asked once, then backed off */
	ck_assert_uint_eq(s.ring_leases, 0);
	ck_assert_uint_eq(s.driver_copies, 4);
	end(c);
}
END_TEST

START_TEST(test_a_failing_driver_call_mid_copy_returns_its_error)
{
	pb_client *c = connect_small_ring();
	size_t n = 1 * MiB; /* 16 pieces */
	CUdeviceptr dbuf = dev_alloc(n);
	uint8_t *src = malloc(n);
	char at[32];

	fill_pattern(src, n, 5);
	stage_once(c, dbuf); /* the ring is taken: what fails below is a piece's copy */
	snprintf(at, sizeof(at), "%llu", (unsigned long long)copy_stats().calls + 3);
	setenv("STUB_CUDA_COPY_FAIL_AT", at, 1);
	ck_assert_int_eq(pb_copy_to_device(c, dbuf, src, n, NULL), -EIO);
	ck_assert_msg(strstr(pb_last_error(), "700") != NULL, "%s", pb_last_error());
	unsetenv("STUB_CUDA_COPY_FAIL_AT");
	/* The ring is still good for the next copy. */
	round_trip(c, NULL, dbuf, n, 0, 0);
	free(src);
	end(c);
}
END_TEST

#ifndef __SANITIZE_ADDRESS__ /* see suite() */
START_TEST(test_a_forked_child_has_no_ring_and_no_counts)
{
	pb_client *c = connect_small_ring();
	CUdeviceptr dbuf = dev_alloc(RING_BYTES);
	pid_t pid;

	stage_once(c, dbuf);
	ck_assert_uint_eq(staging_stats(c).ring_bytes, RING_BYTES);
	pid = itest_fork();
	if (pid == 0) {
		struct pb_staging_stats s;

		if (pb_staging_stats(c, &s) != 0)
			_exit(2);
		_exit(s.ring_bytes == 0 && s.h2d_copies == 0 && s.ring_leases == 0 ? 0 : 1);
	}
	ck_assert_int_eq(itest_wait_exit(pid), 0);
	/* The parent's ring is untouched. */
	ck_assert_uint_eq(staging_stats(c).ring_bytes, RING_BYTES);
	stage_once(c, dbuf);
	ck_assert_uint_eq(staging_stats(c).h2d_copies, 2);
	end(c);
}
END_TEST
#endif

START_TEST(test_staging_0_sends_every_copy_to_the_driver)
{
	pb_client *c;
	CUdeviceptr dbuf;

	setenv("PINBROKER_STAGING", "0", 1);
	c = connect_small_ring();
	dbuf = dev_alloc(1 * MiB);
	driver_round_trip(c, dbuf, 1 * MiB);
	ck_assert_uint_eq(staging_stats(c).ring_leases, 0);
	ck_assert_uint_eq(staging_stats(c).driver_copies, 0); /* not "instead": staging is off */
	end(c);
}
END_TEST

START_TEST(test_without_a_client_the_driver_copies)
{
	CUdeviceptr dbuf;

	unsetenv("PINBROKER_NO_CUDA");
	ck_assert_int_eq(pb_cuda_available(NULL), 1);
	make_context_current();
	dbuf = dev_alloc(1 * MiB);
	driver_round_trip(NULL, dbuf, 1 * MiB);
	ck_assert_int_eq(pb_copy_to_device(NULL, dbuf, NULL, 1, NULL), -EINVAL);
	itest_end_clean(&d, NULL, 5000);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("itest_staging_api");

	load_stub();
	if (stub_missing) {
		check_skip("the stand-in libcuda.so.1 (tests/preload/stub_cuda*.c) lacks %s, which staged copies "
			   "need",
			   stub_missing);
		return s;
	}
	CHECK_CASE(s, "copies", start, stop, 120, test_round_trips_are_exact_around_slot_boundaries_and_alignments,
		   test_a_copy_under_the_threshold_goes_to_the_driver_untouched,
		   test_pinned_managed_and_captured_copies_go_to_the_driver_untouched,
		   test_the_ring_is_one_exact_lease_labelled_staging_ring, test_bad_settings_are_refused_by_name,
		   test_a_failing_driver_call_mid_copy_returns_its_error, test_staging_0_sends_every_copy_to_the_driver,
		   test_without_a_client_the_driver_copies);
	CHECK_CASE(s, "ring", start, stop, 60, test_a_revoked_idle_ring_is_given_back_and_copies_go_to_the_driver,
		   test_a_revoke_during_a_copy_lets_it_finish_then_gives_the_ring_back,
		   test_a_busy_ring_leaves_another_threads_copy_to_the_driver,
		   test_a_refused_ring_leaves_copies_to_the_driver_and_backs_off);
#ifndef __SANITIZE_ADDRESS__ /* as check_itest_staging: GCC 12's libasan can hang a child forked while threads malloc */
	CHECK_CASE(s, "fork", start, stop, 60, test_a_forked_child_has_no_ring_and_no_counts);
#endif
	return s;
}

CHECK_MAIN(suite)

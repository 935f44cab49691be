/* SPDX-License-Identifier: MIT */
/*
 * Integration: registrations of one shared memory region charged once, whoever registers it. Real
 * processes map one /dev/shm file or memfd MAP_SHARED and pb_register it, as the ranks of an LLM server
 * do with their KV offload region (issue 26); the real daemon must count the region's pages once, keep
 * them counted until the last registrant lets go or dies, and charge private memory per process as before.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"
#include "pinbroker.h"
#include "check_main.h"

#define MiB (1024ull * 1024ull)
#define REGION (64 * MiB)
#define UID_A 61001
#define UID_B 61002

static struct daemon d;
static const struct pb_acquire_opts charge_only = { .flags = PB_REGISTER_CHARGE_ONLY, .label = "kv-offload" };

ITEST_FIXTURE_START(start, d, NULL)

ITEST_FIXTURE_STOP(stop, d)

static uint64_t registered_now(void)
{
	struct pb_status *s = itest_status(d.socket);
	uint64_t v = s->registered_bytes;

	ck_assert_uint_eq(s->leased_bytes, v); /* nothing else is lent in these tests */
	pb_status_free(s);
	return v;
}

/* One rank: a child process holding a registration until told to let go. */
struct rank {
	pid_t pid;
	int cmd; /* parent -> child: 'u' unregister */
	int rep; /* child -> parent: its lease id, then 'd' when unregistered */
	uint64_t lease_id;
};

/*
 * Start a rank: as uid (0: stay root), map the region (the file at shm_path, else the inherited memfd, else
 * bytes of private anonymous memory) and pb_register [off, off + bytes) of it. Returns once it is registered;
 * the test fails if it could not.
 */
static void rank_start(struct rank *r, uid_t uid, const char *shm_path, int memfd, size_t off, size_t bytes)
{
	int cmd[2], rep[2];

	ck_assert_int_eq(pipe(cmd), 0);
	ck_assert_int_eq(pipe(rep), 0);
	r->pid = itest_fork();
	ck_assert_int_ge(r->pid, 0);
	if (r->pid == 0) {
		pb_client *c;
		pb_lease *l;
		uint64_t id;
		char *p;
		int fd = memfd;

		close(cmd[1]);
		close(rep[0]);
		if (uid)
			itest_drop_to(uid);
		if (shm_path)
			fd = shm_open(shm_path, O_RDWR, 0);
		if (fd >= 0)
			p = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		else
			p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			_exit(70);
		if (pb_connect(d.socket, &c) < 0)
			_exit(71);
		if (pb_register(c, p + off, bytes, &charge_only, &l) != 0) {
			fprintf(stderr, "rank %d: pb_register: %s\n", (int)getpid(), pb_last_error());
			_exit(72);
		}
		id = pb_lease_id(l);
		if (write(rep[1], &id, sizeof(id)) != (ssize_t)sizeof(id))
			_exit(73);
		if (itest_hear(cmd[0], 120) == 'u') {
			if (pb_unregister(c, l) != 0)
				_exit(74);
			itest_say(rep[1], 'd');
		}
		pause();
		_exit(0);
	}
	close(cmd[0]);
	close(rep[1]);
	r->cmd = cmd[1];
	r->rep = rep[0];
	ck_assert_int_eq(read(r->rep, &r->lease_id, sizeof(r->lease_id)), (ssize_t)sizeof(r->lease_id));
}

/* The rank unregisters (pb_unregister returns once the daemon took the charge back). */
static void rank_unregister(struct rank *r)
{
	itest_say(r->cmd, 'u');
	ck_assert_int_eq(itest_hear(r->rep, 30), 'd');
}

/* The status row of a rank's registration: (charged bytes, registrants); the test fails if it is missing. */
static void rank_row(const struct rank *r, uint64_t *charged, uint32_t *registrants)
{
	struct pb_status *s = itest_status(d.socket);
	const struct pb_lease_info *row = itest_lease_row(s, r->lease_id);

	ck_assert_ptr_nonnull(row);
	ck_assert_int_eq(row->registration, 1);
	*charged = row->charged_bytes;
	*registrants = row->registrants;
	pb_status_free(s);
}

static void rank_end(struct rank *r)
{
	if (r->pid > 0)
		itest_kill_and_reap(r->pid);
	r->pid = 0;
	close(r->cmd);
	close(r->rep);
}

/* A /dev/shm region of REGION bytes, like vLLM's SharedOffloadRegion: its name, unlinked at the end. */
static void make_shm(char *name, size_t len)
{
	int fd;

	snprintf(name, len, "/pb-itest-shared-%d", (int)getpid());
	fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0666);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)REGION), 0);
	close(fd);
}

static int make_memfd(void)
{
	int fd = memfd_create("kv-offload", 0);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)REGION), 0);
	return fd;
}

START_TEST(test_four_ranks_of_one_shm_region_are_charged_once_until_the_last_goes)
{
	static const int order[5] = { 2, 0, 4, 3, 1 };
	struct rank r[5];
	char name[64];

	make_shm(name, sizeof(name));
	for (int i = 0; i < 4; i++)
		rank_start(&r[i], 0, name, -1, 0, REGION);
	ck_assert_uint_eq(registered_now(), REGION);
	/* A fifth registering half of it adds no page. */
	rank_start(&r[4], 0, name, -1, REGION / 4, REGION / 2);
	ck_assert_uint_eq(registered_now(), REGION);
	/* One row carries the region (the first registrant's); each row names the five registrations. */
	for (int i = 0; i < 5; i++) {
		uint64_t charged;
		uint32_t n;

		rank_row(&r[i], &charged, &n);
		ck_assert_uint_eq(charged, i == 0 ? REGION : 0);
		ck_assert_uint_eq(n, 5);
	}
	itest_pinctl_says(&d, 0, "leases", "shared registration: 5 registrants (pid ", "charged here 64 MiB",
			  "charged here 0 B", NULL);
	/* Releases in a mixed order, the first registrant (rank 0, which carries the charge) among the first. */
	for (int i = 0; i < 5; i++) {
		rank_unregister(&r[order[i]]);
		ck_assert_uint_eq(registered_now(), i < 4 ? REGION : 0);
		/* After rank 2 and rank 0 went, rank 1 is the oldest: the whole charge is on its row. */
		if (i == 1) {
			uint64_t charged;
			uint32_t n;

			rank_row(&r[1], &charged, &n);
			ck_assert_uint_eq(charged, REGION);
			ck_assert_uint_eq(n, 3);
		}
	}
	for (int i = 0; i < 5; i++)
		rank_end(&r[i]);
	shm_unlink(name);
}
END_TEST

/* Poll (bounded) until the daemon has dropped lease id: a SIGKILLed rank's lease goes once its exit is seen. */
static void wait_row_gone(uint64_t id)
{
	bool gone = false;

	for (int i = 0; i < 300 && !gone; i++) {
		struct pb_status *s = itest_status(d.socket);

		gone = itest_lease_row(s, id) == NULL;
		pb_status_free(s);
		if (!gone)
			usleep(10000);
	}
	ck_assert_msg(gone, "lease %llu is still there", (unsigned long long)id);
}

static void kill_rank(struct rank *r)
{
	ck_assert_int_eq(itest_kill_and_reap(r->pid), SIGKILL);
	r->pid = 0;
	wait_row_gone(r->lease_id);
}

START_TEST(test_a_killed_rank_takes_only_its_own_share)
{
	struct rank r[4];
	uint64_t charged;
	uint32_t n;
	int fd = make_memfd();

	/* Rank 0 registers the first half, rank 1 the whole region, ranks 2 and 3 the first half. */
	rank_start(&r[0], 0, NULL, fd, 0, REGION / 2);
	rank_start(&r[1], 0, NULL, fd, 0, REGION);
	rank_start(&r[2], 0, NULL, fd, 0, REGION / 2);
	rank_start(&r[3], 0, NULL, fd, 0, REGION / 2);
	ck_assert_uint_eq(registered_now(), REGION);
	/* Rank 0, the oldest, killed: the others cover all it carried, so the region stays charged, whole. */
	kill_rank(&r[0]);
	ck_assert_uint_eq(registered_now(), REGION);
	rank_row(&r[1], &charged, &n);
	ck_assert_uint_eq(charged, REGION);
	ck_assert_uint_eq(n, 3);
	/* Rank 1 killed: the second half was its alone and goes with it; the first stays, on rank 2. */
	kill_rank(&r[1]);
	ck_assert_uint_eq(registered_now(), REGION / 2);
	rank_row(&r[2], &charged, &n);
	ck_assert_uint_eq(charged, REGION / 2);
	kill_rank(&r[2]);
	ck_assert_uint_eq(registered_now(), REGION / 2);
	/* The last one lets go: the charge ends with it. */
	rank_unregister(&r[3]);
	ck_assert_uint_eq(registered_now(), 0);
	for (int i = 0; i < 4; i++)
		rank_end(&r[i]);
	close(fd);
}
END_TEST

START_TEST(test_private_memory_registered_by_two_processes_is_charged_twice)
{
	struct rank r[2];

	rank_start(&r[0], 0, NULL, -1, 0, 8 * MiB);
	rank_start(&r[1], 0, NULL, -1, 0, 8 * MiB);
	ck_assert_uint_eq(registered_now(), 16 * MiB);
	/* Not shared memory: each row carries its own bytes and names no registrants. */
	for (int i = 0; i < 2; i++) {
		uint64_t charged;
		uint32_t n;

		rank_row(&r[i], &charged, &n);
		ck_assert_uint_eq(charged, 8 * MiB);
		ck_assert_uint_eq(n, 0);
	}
	rank_unregister(&r[0]);
	ck_assert_uint_eq(registered_now(), 8 * MiB);
	rank_unregister(&r[1]);
	ck_assert_uint_eq(registered_now(), 0);
	rank_end(&r[0]);
	rank_end(&r[1]);
}
END_TEST

START_TEST(test_two_uids_registering_one_file_are_charged_once)
{
	struct rank a, b;
	struct pb_status *s;
	int fd = make_memfd();
	char *out = NULL;
	char ida[64], idb[64];

	rank_start(&a, UID_A, NULL, fd, 0, REGION);
	rank_start(&b, UID_B, NULL, fd, 0, REGION);
	ck_assert_uint_eq(registered_now(), REGION);
	s = itest_status(d.socket);
	/* Root sees both uids' registrations of the file. */
	ck_assert_ptr_nonnull(itest_lease_row(s, a.lease_id));
	ck_assert_ptr_nonnull(itest_lease_row(s, b.lease_id));
	ck_assert_uint_eq(itest_lease_row(s, a.lease_id)->uid, UID_A);
	ck_assert_uint_eq(itest_lease_row(s, b.lease_id)->uid, UID_B);
	/* Charged once, to the first registrant's uid; both rows name both registrations. */
	ck_assert_uint_eq(itest_lease_row(s, a.lease_id)->charged_bytes, REGION);
	ck_assert_uint_eq(itest_lease_row(s, b.lease_id)->charged_bytes, 0);
	ck_assert_uint_eq(itest_lease_row(s, a.lease_id)->registrants, 2);
	ck_assert_uint_eq(itest_lease_row(s, a.lease_id)->n_registrant_pids, 2);
	pb_status_free(s);
	/* Each uid sees its own row, not the other's, nor the other's pid among the registrants. */
	snprintf(ida, sizeof(ida), "\"registrant_pids\":[%d]", (int)a.pid);
	snprintf(idb, sizeof(idb), "\"registrant_pids\":[%d]", (int)b.pid);
	ck_assert_int_eq(pinctl_as(&d, UID_A, &out, "leases --json"), 0);
	ck_assert_msg(strstr(out, "\"uid\":61001") && !strstr(out, "\"uid\":61002"), "uid A saw: %s", out);
	ck_assert_msg(strstr(out, ida) && strstr(out, "\"registrants\":2"), "uid A saw: %s", out);
	free(out);
	ck_assert_int_eq(pinctl_as(&d, UID_B, &out, "leases --json"), 0);
	ck_assert_msg(strstr(out, "\"uid\":61002") && !strstr(out, "\"uid\":61001"), "uid B saw: %s", out);
	ck_assert_msg(strstr(out, idb) && strstr(out, "\"charged_bytes\":0,"), "uid B saw: %s", out);
	free(out);
	/* A lets go first: its charge passes to B (its uid and job), still once. */
	rank_unregister(&a);
	ck_assert_uint_eq(registered_now(), REGION);
	s = itest_status(d.socket);
	ck_assert_uint_eq(itest_lease_row(s, b.lease_id)->charged_bytes, REGION);
	ck_assert_uint_eq(itest_lease_row(s, b.lease_id)->registrants, 1);
	pb_status_free(s);
	rank_unregister(&b);
	ck_assert_uint_eq(registered_now(), 0);
	rank_end(&a);
	rank_end(&b);
	close(fd);
}
END_TEST

/*
 * What the library names as the backing, from /proc/self/maps: a span over two VMAs of the file (split by
 * mprotect) that are contiguous in it is one range; halves mapped out of order, or a span that runs into
 * private memory, name none and are charged in full.
 */
START_TEST(test_the_backing_spans_vmas_only_when_the_file_is_contiguous)
{
	static const char *const args[] = { "--max-no-revoke-per-uid", "100%", NULL };
	int fd = make_memfd();
	char *whole, *swapped, *mixed;
	pb_lease *a, *b, *c;
	pb_client *cl;

	/* Three regions' worth of charges at once: past the default never-revoked share (50%). */
	ck_assert_int_eq(daemon_stop(&d), 0);
	daemon_restart(&d, args);
	ck_assert_int_eq(pb_connect(d.socket, &cl), 0);
	whole = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(whole, MAP_FAILED);
	ck_assert_int_eq(mprotect(whole + REGION / 2, REGION / 2, PROT_READ), 0); /* two VMAs now */
	ck_assert_int_eq(pb_register(cl, whole, REGION, &charge_only, &a), 0);
	ck_assert_int_eq(pb_lease_shared_memory(a), 1);
	ck_assert_uint_eq(registered_now(), REGION);

	/* The file's second half first, then its first: the pages are the same, but not one range of it. */
	swapped = mmap(NULL, REGION, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	ck_assert_ptr_ne(swapped, MAP_FAILED);
	ck_assert_ptr_ne(mmap(swapped, REGION / 2, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, REGION / 2),
			 MAP_FAILED);
	ck_assert_ptr_ne(mmap(swapped + REGION / 2, REGION / 2, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0),
			 MAP_FAILED);
	ck_assert_int_eq(pb_register(cl, swapped, REGION, &charge_only, &b), 0);
	ck_assert_int_eq(pb_lease_shared_memory(b), 0);
	ck_assert_uint_eq(registered_now(), 2 * REGION);

	/* The file's first half, then private memory: nothing shared backs all of it. */
	mixed = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	ck_assert_ptr_ne(mixed, MAP_FAILED);
	ck_assert_ptr_ne(mmap(mixed, REGION / 2, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0), MAP_FAILED);
	ck_assert_int_eq(pb_register(cl, mixed, REGION, &charge_only, &c), 0);
	ck_assert_int_eq(pb_lease_shared_memory(c), 0);
	ck_assert_uint_eq(registered_now(), 3 * REGION);
	/* Its shared half alone is backed, and already charged. */
	ck_assert_int_eq(pb_unregister(cl, c), 0);
	ck_assert_int_eq(pb_register(cl, mixed, REGION / 2, &charge_only, &c), 0);
	ck_assert_int_eq(pb_lease_shared_memory(c), 1);
	ck_assert_uint_eq(registered_now(), 2 * REGION);

	ck_assert_int_eq(pb_unregister(cl, a), 0);
	ck_assert_int_eq(pb_unregister(cl, b), 0);
	ck_assert_int_eq(pb_unregister(cl, c), 0);
	ck_assert_uint_eq(registered_now(), 0);
	pb_disconnect(cl);
	munmap(whole, REGION);
	munmap(swapped, REGION);
	munmap(mixed, REGION);
	close(fd);
}
END_TEST

/*
 * Wire compatibility: a client older than the backing field sends a registration without it (raw, as an old
 * library would). The daemon charges it in full beside the region's one charge, as before this change.
 */
START_TEST(test_a_registration_without_backing_is_charged_per_call)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Acquire acq = PINBROKER__V1__ACQUIRE__INIT;
	struct rank r;
	char msg[256];
	int fd = make_memfd(), raw;

	rank_start(&r, 0, NULL, fd, 0, REGION);
	raw = raw_connect(d.socket);
	ck_assert_int_ge(raw, 0);
	ck_assert_int_eq(raw_hello(raw), 0);
	acq.size = REGION;
	acq.has_flags = true;
	acq.flags = PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_REGISTER_ONLY |
		    PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_NO_REVOKE;
	req.body_case = PINBROKER__V1__REQUEST__BODY_ACQUIRE;
	req.acquire = &acq;
	ck_assert_int_eq(raw_call(raw, &req, 2, msg, sizeof(msg), 5000), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	ck_assert_uint_eq(registered_now(), 2 * REGION);
	/* Each goes on its own: the region's charge with its registrant, the unbacked one with its own. */
	rank_unregister(&r);
	ck_assert_uint_eq(registered_now(), REGION);
	rank_end(&r);
	close(raw); /* its registration is held until this process exits (a registration's exit hold) */
	close(fd);
}
END_TEST

/* The refusal, at test scale: 4 ranks of a 64 MiB region under a 100 MiB budget all register. */
START_TEST(test_four_ranks_fit_a_budget_below_four_regions)
{
	static const char *const args[] = { "--budget", "100M", "--max-no-revoke-per-uid", "100%", NULL };
	struct rank r[4];
	char name[64];

	ck_assert_int_eq(daemon_stop(&d), 0);
	daemon_restart(&d, args);
	make_shm(name, sizeof(name));
	for (int i = 0; i < 4; i++)
		rank_start(&r[i], 0, name, -1, 0, REGION);
	ck_assert_uint_eq(registered_now(), REGION);
	for (int i = 0; i < 4; i++) {
		rank_unregister(&r[i]);
		rank_end(&r[i]);
	}
	ck_assert_uint_eq(registered_now(), 0);
	shm_unlink(name);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-shared-reg");

	CHECK_CASE(s, "shared-reg", start, stop, 120,
		   test_four_ranks_of_one_shm_region_are_charged_once_until_the_last_goes,
		   test_a_killed_rank_takes_only_its_own_share,
		   test_private_memory_registered_by_two_processes_is_charged_twice,
		   test_two_uids_registering_one_file_are_charged_once,
		   test_a_registration_without_backing_is_charged_per_call,
		   test_the_backing_spans_vmas_only_when_the_file_is_contiguous,
		   test_four_ranks_fit_a_budget_below_four_regions);
	return s;
}

CHECK_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/*
 * Issue 38, finding 3: one uid is not one tenant. Pages a process wrote into a lease never reach a process of the
 * same uid in another pid namespace, nor a forked child or clone(CLONE_VM) sibling of a holder that exited; the
 * pool stays warm within one tenant.
 */
#define _GNU_SOURCE
#include <check.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "sec_tenant.h"

#define MIB (1024ull * 1024)
#define POLL_MS 10000
#define MARK_HOLDER 0x11 /* what the holder that exits wrote */
#define KID_STACK_BYTES (256 * 1024)

/* What a library before PB_ACQUIRE_INHERIT does not know, so the suite builds against it (to fail there). */
#ifndef PB_ACQUIRE_INHERIT
#define PB_ACQUIRE_INHERIT (1u << 9)
#endif

/* How the holder leaves a kid with its memory. */
enum kid_kind {
	KID_FORK,             /* fork, then exit without a release */
	KID_CLONE_VM,         /* clone(CLONE_VM): one mm, two processes; exit without a release */
	KID_INHERIT_RELEASED, /* an inheritable lease (PB_ACQUIRE_INHERIT), fork, then a RELEASE, then exit */
};

static struct daemon d;

/* No warm chunks at start: whatever a client gets was made for it, or was another's. */
SEC_START(start, d, "--prewarm", "0")
SEC_STOP(stop, d)

/* (a) The case: a uid-0 process in a new pid namespace must not read the 0x5A another one left. */
START_TEST(test_a_new_pid_namespace_of_the_same_uid_reads_no_freed_byte)
{
	struct tenant_report ra, rb;
	struct tenant_client_proc a, b;

	a = tenant_client_start(PLACE_NEW_PIDNS, NULL, d.socket, 0, TENANT_MARK_A, true, false, &ra);
	ck_assert_msg(ra.status == 0, "writer failed at step %d: %s", ra.status, strerror(ra.err));
	ck_assert_int_eq(tenant_client_end(&a), 0);
	b = tenant_client_start(PLACE_NEW_PIDNS, NULL, d.socket, TENANT_MARK_A, TENANT_MARK_B, true, false, &rb);
	ck_assert_msg(rb.status == 0, "reader failed at step %d: %s", rb.status, strerror(rb.err));
	ck_assert_int_eq(tenant_client_end(&b), 0);
	ck_assert_msg(rb.seen == 0,
		      "a process of the same uid in another pid namespace read %llu of %llu bytes of 0x5A another "
		      "process wrote into its released lease",
		      (unsigned long long)rb.seen, (unsigned long long)TENANT_LEASE_BYTES);
	/* And the other way round: from a new pid namespace to a process beside the test. */
	a = tenant_client_start(PLACE_NEW_PIDNS, NULL, d.socket, 0, TENANT_MARK_A, true, false, &ra);
	ck_assert_int_eq(tenant_client_end(&a), 0);
	b = tenant_client_start(PLACE_HERE, NULL, d.socket, TENANT_MARK_A, TENANT_MARK_B, true, false, &rb);
	ck_assert_int_eq(rb.status, 0);
	ck_assert_int_eq(tenant_client_end(&b), 0);
	ck_assert_msg(rb.seen == 0,
		      "a process of the host's pid namespace read %llu bytes of 0x5A left by one in another",
		      (unsigned long long)rb.seen);
	ck_assert(tenant_metric(d.socket, TENANT_FRESH_OTHER) >= (double)TENANT_LEASE_BYTES);
}
END_TEST

/*
 * A holder (beside the test: the next holder's tenant) that writes into its lease, starts a kid that keeps its
 * memory as kind says, and exits. Then the next holder of the uid writes MARK_B into a lease of the same size; the
 * kid must read none of it. Returns the kid's report.
 */
static struct tenant_kid_report holder_leaves_a_kid(enum kid_kind kind)
{
	int go[2], krep[2], hrep[2];
	struct tenant_report rb;
	struct tenant_client_proc b;
	struct tenant_kid_report kr;
	uint64_t addr = 0;
	pid_t h;

	ck_assert_int_eq(pipe(go), 0);
	ck_assert_int_eq(pipe(krep), 0);
	ck_assert_int_eq(pipe(hrep), 0);
	h = itest_fork();
	ck_assert_int_ge(h, 0);
	if (h == 0) {
		struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE |
						      (kind == KID_INHERIT_RELEASED ? PB_ACQUIRE_INHERIT : 0) };
		static struct tenant_kid_args k;
		pb_client *c;
		pb_lease *l;
		uint8_t *p;
		pid_t kid;

		p = tenant_mapper_lease(go, krep, hrep, d.socket, &o, MARK_HOLDER, &c, &l);
		k = (struct tenant_kid_args){ .go_r = go[0], .rep_w = krep[1], .addr = (uintptr_t)p };
		if (kind == KID_CLONE_VM) {
			char *stack = mmap(NULL, KID_STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
					   -1, 0);

			if (stack == MAP_FAILED)
				_exit(12);
			/* One mm, two processes: the holder's exit leaves the mm, and the lease's mapping, to the kid. */
			kid = clone(tenant_kid_main, stack + KID_STACK_BYTES, CLONE_VM | SIGCHLD, &k);
		} else {
			kid = fork();
			if (kid == 0)
				tenant_kid_main(&k);
		}
		if (kid < 0)
			_exit(13);
		if (kind == KID_INHERIT_RELEASED && pb_release(c, l) < 0)
			_exit(15);
		addr = (uintptr_t)p;
		if (write(hrep[1], &addr, sizeof(addr)) != (ssize_t)sizeof(addr))
			_exit(14);
		/* Gone (without a release, but KID_INHERIT_RELEASED's), as a job's process does when done or killed. */
		_exit(0);
	}
	tenant_mapper_report(go, krep, hrep, &addr, sizeof(addr));
	ck_assert_int_eq(itest_wait_exit(h), 0);
	/* Once the holder is gone and its kid dropped the socket, the daemon frees the lease. */
	ck_assert_int_eq(wait_leased(d.socket, 0, POLL_MS), 0);
	b = tenant_client_start(PLACE_HERE, NULL, d.socket, MARK_HOLDER, TENANT_MARK_B, false, true, &rb);
	ck_assert_msg(rb.status == 0, "the next holder failed at step %d: %s", rb.status, strerror(rb.err));
	itest_say(go[1], 'g');
	ck_assert_int_eq(read(krep[0], &kr, sizeof(kr)), (ssize_t)sizeof(kr));
	close(go[1]);
	close(krep[0]);
	ck_assert_int_eq(tenant_client_end(&b), 0);
	return kr;
}

/* (c) A forked child of a holder that exited: no mapping of the lease (MADV_DONTFORK), so nothing of the next one. */
START_TEST(test_a_forked_child_of_an_exited_holder_reads_nothing_of_the_next_lease)
{
	struct tenant_kid_report kr = holder_leaves_a_kid(KID_FORK);

	tenant_kid_read_nothing(kr, false, "the forked child of a holder that exited");
}
END_TEST

/*
 * (d) A clone(CLONE_VM) sibling of a holder that exited maps the lease still (one mm: no madvise can keep it out):
 * the daemon must not hand those chunks to anyone, since the holder never released them.
 */
START_TEST(test_a_clone_vm_sibling_of_an_exited_holder_reads_nothing_of_the_next_lease)
{
	struct tenant_kid_report kr = holder_leaves_a_kid(KID_CLONE_VM);

	tenant_kid_read_nothing(kr, true, "the CLONE_VM sibling (it shares the mm) of a holder that exited");
	ck_assert(tenant_metric(d.socket, TENANT_FRESH_DROPPED) >= (double)TENANT_LEASE_BYTES);
}
END_TEST

/*
 * (c) again, for a lease its holder asked forked children to inherit (as the interposer does, standing in for
 * cudaHostAlloc): the child keeps the mapping after its parent's RELEASE, so that release must keep the memory
 * from ever being lent again.
 */
START_TEST(test_an_inheritable_lease_released_after_a_fork_is_never_lent_again)
{
	struct tenant_kid_report kr = holder_leaves_a_kid(KID_INHERIT_RELEASED);

	tenant_kid_read_nothing(kr, true,
				"the forked child of an inheritable lease's holder, after its parent released,");
}
END_TEST

/*
 * (e) Within one tenant (one uid, pid namespace and cgroup) a released lease's chunks go to the next holder as they
 * are, unscrubbed and unreplaced: the pool stays warm. It then sees the first one's bytes (it may read that
 * process's memory anyway), and no memory was made fresh for a tenant change.
 */
START_TEST(test_the_same_tenant_is_handed_its_warm_chunks)
{
	struct tenant_report ra, rb;
	struct tenant_client_proc a, b;

	a = tenant_client_start(PLACE_HERE, NULL, d.socket, 0, TENANT_MARK_A, true, false, &ra);
	ck_assert_int_eq(ra.status, 0);
	ck_assert_int_eq(tenant_client_end(&a), 0);
	b = tenant_client_start(PLACE_HERE, NULL, d.socket, TENANT_MARK_A, TENANT_MARK_B, true, false, &rb);
	ck_assert_int_eq(rb.status, 0);
	ck_assert_int_eq(tenant_client_end(&b), 0);
	ck_assert_msg(rb.seen == TENANT_LEASE_BYTES, "the same tenant got %llu of %llu warm bytes back",
		      (unsigned long long)rb.seen, (unsigned long long)TENANT_LEASE_BYTES);
	ck_assert_msg(tenant_metric(d.socket, TENANT_FRESH_OTHER) == 0, "memory was made fresh within one tenant");
	ck_assert_msg(tenant_metric(d.socket, TENANT_FRESH_DROPPED) == 0, "a released lease's memory was not pooled");
}
END_TEST

/*
 * pb_disconnect (and so a Python job's exit) pipelines a RELEASE per lease, each unmapped first, and closes
 * without awaiting the answers: the daemon serves them to the end of the queue, so that memory stays warm for
 * its tenant instead of counting as ended without a release. Before, the first answer it could not send closed
 * the connection and the rest were destroyed. Raw packets make the close come before any answer is read.
 */
#define DISCONNECT_LEASES 4
#define DISCONNECT_MAX_FDS 64

START_TEST(test_releases_queued_before_a_close_keep_the_memory_warm)
{
	uint64_t dropped = tenant_metric(d.socket, TENANT_FRESH_DROPPED);
	uint64_t ids[DISCONNECT_LEASES];
	int fd = raw_connect(d.socket);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(raw_hello(fd), 0);
	for (int i = 0; i < DISCONNECT_LEASES; i++) {
		int fds[DISCONNECT_MAX_FDS];
		size_t nfds = 0;

		ck_assert_int_eq(raw_acquire(fd, TENANT_LEASE_BYTES, &ids[i], fds, DISCONNECT_MAX_FDS, &nfds), 0);
		for (size_t j = 0; j < nfds; j++)
			close(fds[j]);
	}
	for (int i = 0; i < DISCONNECT_LEASES; i++) {
		Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
		Pinbroker__V1__Release rel = PINBROKER__V1__RELEASE__INIT;

		rel.lease_id = ids[i];
		req.has_seq = true;
		req.seq = 100 + (uint64_t)i;
		req.body_case = PINBROKER__V1__REQUEST__BODY_RELEASE;
		req.release = &rel;
		ck_assert_int_eq(raw_send(fd, &req, NULL, 0), 0);
	}
	close(fd);
	/* Every lease is given back, one way or the other, once the daemon has read the whole queue. */
	ck_assert_int_eq(wait_leased(d.socket, 0, POLL_MS), 0);
	ck_assert_msg(tenant_metric(d.socket, TENANT_FRESH_DROPPED) == dropped,
		      "%llu bytes of leases released before the close were destroyed as ended without a release",
		      (unsigned long long)(tenant_metric(d.socket, TENANT_FRESH_DROPPED) - dropped));
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("sec_26_tenant_reuse");

	CHECK_CASE(s, "core", start, stop, 120, test_a_new_pid_namespace_of_the_same_uid_reads_no_freed_byte,
		   test_a_forked_child_of_an_exited_holder_reads_nothing_of_the_next_lease,
		   test_a_clone_vm_sibling_of_an_exited_holder_reads_nothing_of_the_next_lease,
		   test_an_inheritable_lease_released_after_a_fork_is_never_lent_again,
		   test_the_same_tenant_is_handed_its_warm_chunks,
		   test_releases_queued_before_a_close_keep_the_memory_warm);
	return s;
}

SEC_MAIN(suite)

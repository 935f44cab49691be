/* SPDX-License-Identifier: MIT */
/*
 * Issue 38, review of findings 3 and 4: a shared lease's memory is never lent again while a process that let go
 * of it without a release (a holder or an attacher whose connection closed) may still map it through a
 * clone(CLONE_VM) sibling, whichever mapper releases last.
 */
#define _GNU_SOURCE
#include <check.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "sec_tenant.h"

#define POLL_MS 10000
#define MARK_FIRST 0x11 /* what the first mappers wrote */
#define KID_STACK_BYTES (256 * 1024)

static struct daemon d;

SEC_START(start, d, "--prewarm", "0")
SEC_STOP(stop, d)

/* Start a clone(CLONE_VM) sibling of this process that keeps p mapped (the mm is shared) after this one exits. */
static void start_kid(uint8_t *p, int go_r, int rep_w)
{
	static struct tenant_kid_args k;
	char *stack = mmap(NULL, KID_STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (stack == MAP_FAILED)
		_exit(12);
	k = (struct tenant_kid_args){ .go_r = go_r, .rep_w = rep_w, .addr = (uintptr_t)p };
	if (clone(tenant_kid_main, stack + KID_STACK_BYTES, CLONE_VM | SIGCHLD, &k) < 0)
		_exit(13);
}

/* What a child mapper tells the test: the lease's token (holder) and where it mapped it. */
struct mapper_report {
	char token[PB_SHARE_TOKEN_LEN];
	uint64_t addr;
};

/* Poll the daemon until no connection of process pid is left (it saw the mapper's socket close). */
static void wait_conn_gone(pid_t pid)
{
	uint64_t until = itest_now_ms() + POLL_MS;

	for (;;) {
		struct pb_status *s = itest_status(d.socket);
		bool there = false;

		for (size_t i = 0; i < s->n_clients; i++)
			there |= s->clients[i].pid == pid;
		pb_status_free(s);
		if (!there)
			return;
		ck_assert_msg(itest_now_ms() < until, "the daemon did not see pid %d's connection close", (int)pid);
		usleep(10 * 1000);
	}
}

/* The next holder of the tenant writes MARK_B into a lease of the same size; the kid counts what it can read of it. */
static struct tenant_kid_report next_lease_seen_by_kid(int go_w, int krep_r)
{
	struct tenant_report rb;
	struct tenant_client_proc b;
	struct tenant_kid_report kr;

	ck_assert_int_eq(wait_leased(d.socket, 0, POLL_MS), 0);
	b = tenant_client_start(PLACE_HERE, NULL, d.socket, MARK_FIRST, TENANT_MARK_B, false, true, &rb);
	ck_assert_msg(rb.status == 0, "the next holder failed at step %d: %s", rb.status, strerror(rb.err));
	itest_say(go_w, 'g');
	ck_assert_int_eq(read(krep_r, &kr, sizeof(kr)), (ssize_t)sizeof(kr));
	ck_assert_int_eq(tenant_client_end(&b), 0);
	return kr;
}

/*
 * (a) The holder leaves a clone(CLONE_VM) sibling mapping its shared lease and exits; the attacher (one of its
 * tenant) then releases, the last mapper to go. The holder never released: its sibling must read nothing of the
 * next lease.
 */
START_TEST(test_a_holders_clone_vm_sibling_reads_nothing_after_the_attacher_releases_last)
{
	int go[2], krep[2], hrep[2], ex[2];
	struct mapper_report mr;
	struct tenant_kid_report kr;
	pb_client *c;
	pb_lease *la;
	pid_t h;

	ck_assert_int_eq(pipe(go), 0);
	ck_assert_int_eq(pipe(krep), 0);
	ck_assert_int_eq(pipe(hrep), 0);
	ck_assert_int_eq(pipe(ex), 0);
	h = itest_fork();
	ck_assert_int_ge(h, 0);
	if (h == 0) {
		struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
		struct mapper_report rep;
		pb_lease *l;
		uint8_t *p;

		memset(&rep, 0, sizeof(rep));

		close(ex[1]);
		p = tenant_mapper_lease(go, krep, hrep, d.socket, &o, MARK_FIRST, &c, &l);
		if (pb_lease_share(c, l, NULL, 0, rep.token) < 0)
			_exit(14);
		start_kid(p, go[0], krep[1]);
		rep.addr = (uintptr_t)p;
		if (write(hrep[1], &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
			_exit(15);
		/* Once the attacher maps it: gone without a release, as a job's process does when killed. */
		if (read(ex[0], &rep.token[0], 1) != 1)
			_exit(16);
		_exit(0);
	}
	close(ex[0]);
	tenant_mapper_report(go, krep, hrep, &mr, sizeof(mr));
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	pb_set_cache_limit(c, 0);
	ck_assert_int_eq(pb_attach(c, mr.token, &la), 0);
	itest_say(ex[1], 'x');
	close(ex[1]);
	ck_assert_int_eq(itest_wait_exit(h), 0);
	wait_conn_gone(h);
	ck_assert_int_eq(pb_release(c, la), 0);
	pb_disconnect(c);
	kr = next_lease_seen_by_kid(go[1], krep[0]);
	close(go[1]);
	close(krep[0]);
	tenant_kid_read_nothing(
		kr, true,
		"the CLONE_VM sibling of a holder that exited without a release, after an attacher released "
		"the shared lease last,");
}
END_TEST

/*
 * (b) The other way round: an attacher leaves a clone(CLONE_VM) sibling mapping the lease and exits; the holder
 * then releases it. The attacher never released: its sibling must read nothing of the next lease.
 */
START_TEST(test_an_attachers_clone_vm_sibling_reads_nothing_after_the_holder_releases)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
	char token[PB_SHARE_TOKEN_LEN];
	int go[2], krep[2], arep[2], tok[2];
	struct tenant_kid_report kr;
	uint64_t addr;
	pb_client *c;
	pb_lease *l;
	pid_t a;

	ck_assert_int_eq(pipe(go), 0);
	ck_assert_int_eq(pipe(krep), 0);
	ck_assert_int_eq(pipe(arep), 0);
	ck_assert_int_eq(pipe(tok), 0);
	/* The attacher is forked before this process connects: no receiver thread is running at the fork. */
	a = itest_fork();
	ck_assert_int_ge(a, 0);
	if (a == 0) {
		pb_client *ca;
		pb_lease *la;
		uint64_t at;

		close(go[1]);
		close(krep[0]);
		close(arep[0]);
		close(tok[1]);
		if (read(tok[0], token, sizeof(token)) != (ssize_t)sizeof(token))
			_exit(9);
		if (pb_connect(d.socket, &ca) < 0)
			_exit(10);
		if (pb_attach(ca, token, &la) < 0)
			_exit(11);
		start_kid(pb_lease_data(la), go[0], krep[1]);
		at = (uintptr_t)pb_lease_data(la);
		if (write(arep[1], &at, sizeof(at)) != (ssize_t)sizeof(at))
			_exit(15);
		_exit(0);
	}
	close(tok[0]);
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	pb_set_cache_limit(c, 0);
	ck_assert_int_eq(pb_acquire(c, TENANT_LEASE_BYTES, &o, &l), 0);
	memset(pb_lease_data(l), MARK_FIRST, TENANT_LEASE_BYTES);
	ck_assert_int_eq(pb_lease_share(c, l, NULL, 0, token), 0);
	ck_assert_int_eq(write(tok[1], token, sizeof(token)), (ssize_t)sizeof(token));
	close(tok[1]);
	tenant_mapper_report(go, krep, arep, &addr, sizeof(addr));
	ck_assert_int_eq(itest_wait_exit(a), 0);
	wait_conn_gone(a);
	ck_assert_int_eq(pb_release(c, l), 0);
	pb_disconnect(c);
	kr = next_lease_seen_by_kid(go[1], krep[0]);
	close(go[1]);
	close(krep[0]);
	tenant_kid_read_nothing(kr, true,
				"the CLONE_VM sibling of an attacher that exited without a release, after the holder "
				"released,");
}
END_TEST

/* What a root process in a new pid namespace (a pod) got against host root's lease. */
struct pod_report {
	int32_t step;         /* 0, or where it failed */
	int32_t revoke_id;    /* pb_admin_revoke of the host lease's id: 0 or -errno */
	int32_t revoke_uid;   /* pb_admin_revoke of every lease of uid 0: 0 or -errno */
	int32_t host_rows;    /* rows of the host lease it was shown */
	int32_t host_revoked; /* the uid revoke named the host lease */
	int32_t own_revoked;  /* the uid revoke named its own lease */
	int32_t root_conns;   /* client rows of uid 0 it was shown (its own is one) */
};

static void pod_probe(const void *arg, int rep_w)
{
	uint64_t host_id = *(const uint64_t *)arg;
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE, .label = "sec29-pod" };
	struct pod_report rep = { 0 };
	struct pb_lease_info *rows;
	struct pb_status *st = NULL;
	uint64_t cur = 0, *ids = NULL;
	size_t n, nids = 0;
	pb_client *c;
	pb_lease *l;

	if (pb_connect(d.socket, &c) < 0 || pb_acquire(c, TENANT_LEASE_BYTES, &o, &l) < 0) {
		rep.step = 1;
		goto out;
	}
	do {
		if (pb_leases_page(c, cur, 0, &rows, &n, &cur) < 0) {
			rep.step = 2;
			goto out;
		}
		for (size_t i = 0; i < n; i++)
			rep.host_rows += rows[i].id == host_id;
		pb_lease_info_free(rows, n);
	} while (cur);
	if (pb_status_get(c, &st) == 0) {
		for (size_t i = 0; i < st->n_clients; i++)
			rep.root_conns += st->clients[i].uid == 0;
		pb_status_free(st);
	}
	rep.revoke_id = pb_admin_revoke(c, PB_REVOKE_LEASE, host_id, 0, 60000, NULL, NULL);
	rep.revoke_uid = pb_admin_revoke(c, PB_REVOKE_UID, 0, 0, 60000, &ids, &nids);
	for (size_t i = 0; i < nids; i++) {
		rep.host_revoked |= ids[i] == host_id;
		rep.own_revoked |= ids[i] == pb_lease_id(l);
	}
	free(ids);
out:
	_exit(write(rep_w, &rep, sizeof(rep)) == (ssize_t)sizeof(rep) ? 0 : 90);
}

/*
 * Runs probe(arg, rep_w), which must _exit, as the first process of a new pid namespace (a pod's root) and reads the
 * len bytes it reports on rep_w into rep. false, saying so, where this kernel or sandbox refuses unshare(CLONE_NEWPID).
 */
static bool in_a_pod(void (*probe)(const void *arg, int rep_w), const void *arg, void *rep, size_t len)
{
	int p[2], stx;
	pid_t pid;

	ck_assert_int_eq(pipe(p), 0);
	pid = itest_fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		pid_t in;

		close(p[0]);
		if (unshare(CLONE_NEWPID) < 0)
			_exit(77);
		in = fork();
		if (in < 0)
			_exit(79);
		if (in == 0)
			probe(arg, p[1]);
		_exit(itest_wait_exit(in));
	}
	close(p[1]);
	stx = itest_wait_exit(pid);
	if (stx == 77) {
		printf("SKIP pod root: this kernel or sandbox refuses unshare(CLONE_NEWPID)\n");
		close(p[0]);
		return false;
	}
	ck_assert_int_eq(stx, 0);
	ck_assert_int_eq(read(p[0], rep, len), (ssize_t)len);
	close(p[0]);
	return true;
}

/*
 * A lease of host root's (this process's) on a raw connection, whose fd it returns. Raw: this process forks pods
 * after, and must have no other thread when it does (a libpinbroker client's receiver holding a lock of the
 * sanitizer's allocator at fork left the pod deadlocked under ASan).
 */
static int host_root_lease(uint64_t *id)
{
	return raw_lease_held(d.socket, TENANT_LEASE_BYTES, id);
}

/*
 * (c) Most pods run as root: a pod's root is an ordinary tenant (finding 4), and must neither see nor revoke host
 * root's leases, nor another pod's, though they are of its uid. It still revokes its own.
 */
START_TEST(test_a_pod_root_neither_sees_nor_revokes_host_root_leases)
{
	struct pod_report rep;
	uint64_t host_id;
	int fd = host_root_lease(&host_id);
	bool active;

	if (!in_a_pod(pod_probe, &host_id, &rep, sizeof(rep))) {
		close(fd);
		return;
	}
	ck_assert_msg(rep.step == 0, "the pod's client failed at step %d", rep.step);
	active = sec_lease_active(d.socket, host_id);
	close(fd);
	ck_assert_msg(rep.host_rows == 0 && rep.root_conns == 1 && rep.revoke_id < 0 && !rep.host_revoked && active,
		      "a pod's root reached host root's lease of its uid: shown its row %d times, shown %d connection "
		      "rows of uid 0 (its own is one), revoke by id %d (0: done), revoke of uid 0 named it %d, host "
		      "lease still active %d",
		      rep.host_rows, rep.root_conns, rep.revoke_id, rep.host_revoked, active);
	ck_assert_msg(rep.revoke_uid == 0 && rep.own_revoked, "a pod's root could not revoke its own lease (%d)",
		      rep.revoke_uid);
}
END_TEST

/* In a pod: RELEASE of lease *arg on a raw connection; its status, or -1000 (no connection) or -1001 (no HELLO). */
static void pod_release(const void *arg, int rep_w)
{
	int c = raw_connect(d.socket);
	int32_t r = c < 0 ? -1000 : raw_hello(c) != 0 ? -1001 : raw_release(c, *(const uint64_t *)arg);

	_exit(write(rep_w, &r, sizeof(r)) == (ssize_t)sizeof(r) ? 0 : 90);
}

/*
 * (d) A lease kept counted until its process exits (its connection closed while the process lives, so it may map
 * it still) has no connection: its uid may drop it. A pod's root must not drop host root's: that uncounts memory
 * host root's process still maps.
 */
START_TEST(test_a_pod_root_cannot_drop_host_roots_exit_held_lease)
{
	int32_t pod_status;
	uint64_t id;
	int fd = host_root_lease(&id);

	/* This process lives on: the lease stays counted until it exits. */
	close(fd);
	ck_assert_int_eq(wait_leased(d.socket, (int64_t)TENANT_LEASE_BYTES, POLL_MS), (int64_t)TENANT_LEASE_BYTES);
	if (!in_a_pod(pod_release, &id, &pod_status, sizeof(pod_status)))
		return;
	ck_assert_msg(pod_status != PINBROKER__V1__STATUS_CODE__STATUS_OK &&
			      status_leased(d.socket) == (int64_t)TENANT_LEASE_BYTES,
		      "a pod's root dropped host root's lease held until its process exits (release status %d)",
		      pod_status);
	/* Host root may: its own uid, from its own namespace. */
	fd = raw_connect(d.socket);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(raw_hello(fd), 0);
	ck_assert_int_eq(raw_release(fd, id), PINBROKER__V1__STATUS_CODE__STATUS_OK);
	close(fd);
	ck_assert_int_eq(wait_leased(d.socket, 0, POLL_MS), 0);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("sec_29_review");

	CHECK_CASE(s, "shared", start, stop, 120,
		   test_a_holders_clone_vm_sibling_reads_nothing_after_the_attacher_releases_last,
		   test_an_attachers_clone_vm_sibling_reads_nothing_after_the_holder_releases);
	CHECK_CASE(s, "admin", start, stop, 120, test_a_pod_root_neither_sees_nor_revokes_host_root_leases,
		   test_a_pod_root_cannot_drop_host_roots_exit_held_lease);
	return s;
}

SEC_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/*
 * Shared by check_sec_26_tenant_reuse and check_sec_27_tenant_cgroups (issue 38, finding 3): clients of one uid
 * placed in a pid namespace or a cgroup of their own, each writing a mark into an 8 MiB lease or counting the
 * marks another left there, reporting through a pipe.
 */
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pinbroker.h"
#include "sec.h"

#define TENANT_LEASE_BYTES (8ull * 1024 * 1024)
#define TENANT_MARK_A 0x5A /* what the first tenant writes (the byte) */
#define TENANT_MARK_B 0x77 /* what the next holder writes */

/* Where a client runs: beside the test (its pid namespace and cgroup), in a new pid namespace, in a cgroup. */
enum tenant_place { PLACE_HERE, PLACE_NEW_PIDNS, PLACE_CGROUP };

struct tenant_report {
	int32_t status; /* 0, or the step that failed */
	int32_t err;    /* its errno */
	uint64_t seen;  /* bytes of the lease that read count_mark before this client wrote */
	uint64_t addr;  /* where the lease was mapped */
	uint64_t lease; /* its id */
};

/* Bytes equal to mark in [p, p + len). */
static inline uint64_t tenant_count(const uint8_t *p, uint64_t len, uint8_t mark)
{
	uint64_t n = 0;

	for (uint64_t i = 0; i < len; i++)
		n += p[i] == mark;
	return n;
}

/*
 * Bytes equal to mark that this process can read in [addr, addr + len), through process_vm_readv of itself, so an
 * unmapped range is an answer (EFAULT: *mapped false), not a crash.
 */
static inline uint64_t tenant_count_at(uintptr_t addr, uint64_t len, uint8_t mark, bool *mapped)
{
	static uint8_t buf[1 << 20];
	uint64_t n = 0;

	*mapped = true;
	for (uint64_t off = 0; off < len; off += sizeof(buf)) {
		struct iovec local = { buf, sizeof(buf) }, remote = { (void *)(addr + off), sizeof(buf) };
		ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);

		if (got < 0) {
			*mapped = false;
			continue;
		}
		n += tenant_count(buf, (uint64_t)got, mark);
	}
	return n;
}

/* In a child: close every fd but keep (the others a long-lived child drops: the client's socket with them). */
static inline void tenant_close_all_but(int keep1, int keep2)
{
	for (int fd = 3; fd < 1024; fd++)
		if (fd != keep1 && fd != keep2)
			close(fd);
}

/* What a kid left behind by a mapper found when told to look: the next holder's bytes it could read, and whether it
 * maps the range. */
struct tenant_kid_report {
	uint64_t seen;
	int32_t mapped;
};

struct tenant_kid_args {
	int go_r, rep_w;
	uintptr_t addr;
};

/*
 * The kid (a fork, or a clone(CLONE_VM) sibling, of a holder or attacher): drops every fd (the client's socket too)
 * and waits on go_r; told to, counts TENANT_MARK_B at addr and writes its tenant_kid_report to rep_w.
 */
static inline int tenant_kid_main(void *arg)
{
	const struct tenant_kid_args *k = arg;
	struct tenant_kid_report kr = { 0 };
	bool mapped;
	char b;

	tenant_close_all_but(k->go_r, k->rep_w);
	if (read(k->go_r, &b, 1) != 1)
		_exit(1);
	kr.seen = tenant_count_at(k->addr, TENANT_LEASE_BYTES, TENANT_MARK_B, &mapped);
	kr.mapped = mapped;
	if (write(k->rep_w, &kr, sizeof(kr)) != (ssize_t)sizeof(kr))
		_exit(2);
	_exit(0);
}

/*
 * What a kid must have found: the lease still mapped or not (maps), and none of the next lease's bytes. who says
 * which kid, after what (the failure messages' subject).
 */
static inline void tenant_kid_read_nothing(struct tenant_kid_report kr, bool maps, const char *who)
{
	ck_assert_msg(!!kr.mapped == maps, "%s %s", who,
		      maps ? "should still map the lease" : "inherited the lease's mapping (no MADV_DONTFORK)");
	ck_assert_msg(kr.seen == 0, "%s read %llu of %llu bytes of the next lease of its tenant", who,
		      (unsigned long long)kr.seen, (unsigned long long)TENANT_LEASE_BYTES);
}

/*
 * The client's work: connect, acquire an 8 MiB lease (no client cache: a release is a RELEASE), count the bytes
 * that read count_mark, write fill over all of it, and release it (release) or keep it until a byte comes on hold_fd.
 */
static inline void tenant_client(const char *sock, uint8_t count_mark, uint8_t fill, bool release, int rep_fd,
				 int hold_fd)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
	struct tenant_report rep = { 0 };
	pb_client *c = NULL;
	pb_lease *l = NULL;
	uint8_t *p;
	char b;
	int r;

	r = pb_connect(sock, &c);
	if (r < 0) {
		rep.status = 1;
		rep.err = -r;
		goto out;
	}
	pb_set_cache_limit(c, 0);
	r = pb_acquire(c, TENANT_LEASE_BYTES, &o, &l);
	if (r < 0) {
		rep.status = 2;
		rep.err = -r;
		goto out;
	}
	p = pb_lease_data(l);
	rep.addr = (uintptr_t)p;
	rep.lease = pb_lease_id(l);
	rep.seen = tenant_count(p, TENANT_LEASE_BYTES, count_mark);
	memset(p, fill, TENANT_LEASE_BYTES);
	if (release) {
		r = pb_release(c, l);
		if (r < 0) {
			rep.status = 3;
			rep.err = -r;
		}
	}
out:
	if (write(rep_fd, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
		_exit(5);
	if (hold_fd >= 0 && read(hold_fd, &b, 1) < 0)
		_exit(6);
	_exit(rep.status);
}

/* In a child: move this process into cgroup v2 folder dir, or _exit(80). */
static inline void tenant_join_cgroup(const char *dir)
{
	char path[512];
	int fd;

	if (!dir)
		_exit(80);
	snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "0\n", 2) != 2)
		_exit(80);
	close(fd);
}

struct tenant_client_proc {
	pid_t pid;  /* in a new pid namespace, the child that waits for the client there */
	int hold_w; /* -1: not held */
};

/*
 * Start a client placed at place (cgroup: the folder for PLACE_CGROUP) doing tenant_client's work; its report comes
 * into *rep before this returns. hold: it keeps its lease until tenant_client_end.
 */
static inline struct tenant_client_proc tenant_client_start(enum tenant_place place, const char *cgroup,
							    const char *sock, uint8_t count_mark, uint8_t fill,
							    bool release, bool hold, struct tenant_report *rep)
{
	struct tenant_client_proc cp = { .hold_w = -1 };
	int p[2], h[2] = { -1, -1 };

	ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
	if (hold)
		ck_assert_int_eq(pipe2(h, O_CLOEXEC), 0);
	cp.pid = itest_fork();
	ck_assert_int_ge(cp.pid, 0);
	if (cp.pid == 0) {
		close(p[0]);
		if (h[1] >= 0)
			close(h[1]);
		if (place == PLACE_CGROUP)
			tenant_join_cgroup(cgroup);
		if (place == PLACE_NEW_PIDNS) {
			pid_t in;
			int st;

			/* As `unshare -pf` does: this process stays where it is; its next child is pid 1 of the new one. */
			if (unshare(CLONE_NEWPID) < 0)
				_exit(81);
			in = fork();
			if (in < 0)
				_exit(82);
			if (in == 0)
				tenant_client(sock, count_mark, fill, release, p[1], h[0]);
			close(p[1]);
			if (waitpid(in, &st, 0) != in)
				_exit(83);
			_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 84);
		}
		tenant_client(sock, count_mark, fill, release, p[1], h[0]);
	}
	if (h[0] >= 0)
		close(h[0]);
	cp.hold_w = h[1];
	sec_read_report(p, rep, sizeof(*rep));
	return cp;
}

/*
 * In a mapper child: closes the test's ends (go's write end, krep's and rep's read ends), connects to sock and takes a
 * lease of TENANT_LEASE_BYTES as o says, nothing cached, filled with mark: its memory; _exit(10) or (11) where the
 * connection or the lease fails.
 */
static inline uint8_t *tenant_mapper_lease(int go[2], int krep[2], int rep[2], const char *sock,
					   const struct pb_acquire_opts *o, uint8_t mark, pb_client **c, pb_lease **l)
{
	uint8_t *p;

	close(go[1]);
	close(krep[0]);
	close(rep[0]);
	if (pb_connect(sock, c) < 0)
		_exit(10);
	pb_set_cache_limit(*c, 0);
	if (pb_acquire(*c, TENANT_LEASE_BYTES, o, l) < 0)
		_exit(11);
	p = pb_lease_data(*l);
	memset(p, mark, TENANT_LEASE_BYTES);
	return p;
}

/*
 * The test's side once it forked a mapper (a child that maps a lease and leaves a kid, told by go and reporting on
 * krep): closes the ends the child and its kid use (go's read end, krep's and rep's write ends), then reads the len
 * bytes the child reports on rep into buf.
 */
static inline void tenant_mapper_report(int go[2], int krep[2], int rep[2], void *buf, size_t len)
{
	close(go[0]);
	close(krep[1]);
	close(rep[1]);
	ck_assert_int_eq(read(rep[0], buf, len), (ssize_t)len);
	close(rep[0]);
}

/* Let a client go (a held one releases nothing: its exit ends the lease) and reap it; its exit status. */
static inline int tenant_client_end(struct tenant_client_proc *cp)
{
	if (cp->hold_w >= 0) {
		itest_say(cp->hold_w, 'x');
		close(cp->hold_w);
		cp->hold_w = -1;
	}
	return itest_wait_exit(cp->pid);
}

/* The value of one metrics sample (NAME{labels}), read from the daemon at sock; -1 when it has no such sample. */
static inline double tenant_metric(const char *sock, const char *sample)
{
	pb_client *c = NULL;
	char *text = NULL;
	double v;

	ck_assert_int_eq(pb_connect(sock, &c), 0);
	ck_assert_int_eq(pb_metrics(c, &text), 0);
	v = itest_metrics_sample(text, sample);
	free(text);
	pb_disconnect(c);
	return v;
}

#define TENANT_FRESH_OTHER "pinbroker_pool_fresh_bytes_total{reason=\"other_tenant\"}"
#define TENANT_FRESH_DROPPED "pinbroker_pool_fresh_bytes_total{reason=\"not_released\"}"

/* SPDX-License-Identifier: MIT */
/* Issue 22, finding 1: a view uid B keeps of a lease uid A shared with it never reaches A's later leases. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fdstore.h"
#include "pinbroker.h"
#include "sec.h"
#include "wire.h"

#define KIB 1024ull
#define MIB (1024ull * KIB)
/* Four chunks per lease: the attacker's views cover each chunk (one memfd, one mapping) on its own. */
#define NCHUNKS 4
/*
 * What A writes while B may see it, what it writes into its later lease (the secret), and what
 * B writes: 32 bytes each, so a chunk (a multiple of 4 KiB) holds the pattern whole from its start.
 */
#define TAG_BYTES 32
#define SHARED_TAG "shared data of uid 61001, lease|"
#define SECRET_TAG "SECRET of uid 61001, later lease"
#define B_TAG "written by uid 61002, kept view|"
_Static_assert(sizeof(SHARED_TAG) - 1 == TAG_BYTES && sizeof(SECRET_TAG) - 1 == TAG_BYTES &&
		       sizeof(B_TAG) - 1 == TAG_BYTES,
	       "tags tile a chunk");
#define POLL_MS 5000

/*
 * The ways a process of uid B keeps a view of the pages after its RELEASE, each reported apart:
 * the second mapping (mremap), a forked child of the attacher, the fd passed on over a
 * socket to a third process, /proc/self/map_files (refused to an unprivileged uid by the kernel,
 * which the report then says), and process_vm_readv of the forked child by the same uid.
 */
enum view_kind { V_MREMAP, V_FORK, V_PASSED, V_MAPFILES, V_PVM, V_N };
static const char *const view_names[V_N] = { "mremap", "fork", "passed fd", "map_files", "process_vm_readv" };

/* The processes of uid B that hold views: the attacher itself, its forked child, the third process. */
enum { P_MAIN, P_FORK, P_THIRD, P_N };

struct report {
	int32_t views[V_N];  /* views this process holds of that kind */
	int32_t secret[V_N]; /* ... that show A's later secret */
	int32_t shared[V_N]; /* ... that still show what A shared (the view is live) */
	int32_t err[V_N];    /* errno where the kind could not be set up */
};

struct setup {
	int32_t status; /* 0, or where the attacher failed */
	pid_t fork_pid, third_pid;
	uint64_t lease_id;
};

static struct daemon d;
static struct fdstore *fs; /* the recovery case only */

/* ------------------------------------------------------------- helpers */

static void fill(void *p, size_t len, const char *tag)
{
	size_t tl = strlen(tag);

	for (size_t off = 0; off < len; off += tl)
		memcpy((char *)p + off, tag, len - off < tl ? len - off : tl);
}

static bool is_filled(const void *p, size_t len, const char *tag)
{
	size_t tl = strlen(tag);

	for (size_t off = 0; off < len; off += tl)
		if (memcmp((const char *)p + off, tag, len - off < tl ? len - off : tl) != 0)
			return false;
	return true;
}

static void look(const void *p, size_t len, struct report *r, enum view_kind k)
{
	r->views[k]++;
	if (memmem(p, len, "SECRET", 6))
		r->secret[k]++;
	if (is_filled(p, len, SHARED_TAG))
		r->shared[k]++;
}

static void put_full(int fd, const void *p, size_t n)
{
	if (write(fd, p, n) != (ssize_t)n)
		_exit(80);
}

/* In the test: read n bytes from a child, or fail saying which child went away. */
static void hear(int fd, void *p, size_t n, const char *who)
{
	ssize_t got = read(fd, p, n);

	ck_assert_msg(got == (ssize_t)n, "%s went away (read %zd of %zu bytes)", who, got, n);
}

/* ------------------------------------------------------------- uid B's views */

/*
 * A viewer: views[i] (n of them, len bytes each) of kind k, checked ('c': a struct report back) and
 * written ('w': B_TAG into every view, 'k' back) on command, until 'q' or EOF. The attacher also
 * reads its forked child's views through process_vm_readv (pvm_pid > 0, at the same addresses).
 */
static void viewer(int rd, int wr, char **views, size_t n, size_t len, enum view_kind k, char **more, size_t nmore,
		   pid_t pvm_pid, int mapfiles_err)
{
	char cmd;

	while (read(rd, &cmd, 1) == 1) {
		if (cmd == 'c') {
			struct report r;

			memset(&r, 0, sizeof(r));
			for (size_t i = 0; i < n; i++)
				look(views[i], len, &r, k);
			for (size_t i = 0; i < nmore; i++)
				look(more[i], len, &r, V_MAPFILES);
			r.err[V_MAPFILES] = mapfiles_err;
			for (size_t i = 0; pvm_pid > 0 && i < n; i++) {
				char *buf = malloc(len);
				struct iovec local = { buf, len }, remote = { views[i], len };

				/* views[] of the attacher were mapped before the fork: the child has them at the same addresses. */
				if (buf && process_vm_readv(pvm_pid, &local, 1, &remote, 1, 0) == (ssize_t)len)
					look(buf, len, &r, V_PVM);
				else
					r.err[V_PVM] = errno;
				free(buf);
			}
			put_full(wr, &r, sizeof(r));
		} else if (cmd == 'w') {
			for (size_t i = 0; i < n; i++)
				fill(views[i], len, B_TAG);
			for (size_t i = 0; i < nmore; i++)
				fill(more[i], len, B_TAG);
			put_full(wr, "k", 1);
		} else if (cmd == 'q') {
			break;
		}
	}
	_exit(0);
}

struct pipes {
	int cmd[P_N][2], res[P_N][2]; /* test -> viewer, viewer -> test */
	int ctl[2];                   /* the attacher's setup report */
};

/* Close every pipe end a process of uid B does not use; keep the viewer ends of the processes in mask. */
static void keep_only(struct pipes *pp, unsigned mask)
{
	for (int i = 0; i < P_N; i++) {
		close(pp->cmd[i][1]);
		close(pp->res[i][0]);
		if (!(mask & (1u << i))) {
			close(pp->cmd[i][0]);
			close(pp->res[i][1]);
		}
	}
}

/* The third process: gets the chunk fds over a socket, maps them, closes them, and keeps its views. */
static void third(int sock, struct pipes *pp, size_t len)
{
	int fds[NCHUNKS];
	char *views[NCHUNKS], buf[8];
	size_t nfds = 0;

	keep_only(pp, 1u << P_THIRD);
	close(pp->ctl[1]);
	if (wire_recv(sock, buf, sizeof(buf), fds, NCHUNKS, &nfds) <= 0 || nfds != NCHUNKS)
		_exit(30);
	close(sock);
	for (size_t i = 0; i < nfds; i++) {
		views[i] = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
		if (views[i] == MAP_FAILED)
			_exit(31);
		close(fds[i]);
	}
	viewer(pp->cmd[P_THIRD][0], pp->res[P_THIRD][1], views, nfds, len, V_PASSED, NULL, 0, 0, 0);
}

static int attach_raw(int conn, const char *token, uint64_t *id, int *fds, size_t *nfds)
{
	Pinbroker__V1__Request req = PINBROKER__V1__REQUEST__INIT;
	Pinbroker__V1__Attach at = PINBROKER__V1__ATTACH__INIT;
	Pinbroker__V1__Reply *rep;
	int err, st;

	at.token = (char *)token;
	req.has_seq = true;
	req.seq = 7;
	req.body_case = PINBROKER__V1__REQUEST__BODY_ATTACH;
	req.attach = &at;
	if (raw_send(conn, &req, NULL, 0) < 0)
		return -EPIPE;
	rep = raw_recv(conn, fds, NCHUNKS, nfds, POLL_MS, &err);
	if (!rep)
		return err ? err : -EPROTO;
	st = rep->status;
	if (st == 0 && (rep->body_case != PINBROKER__V1__REPLY__BODY_LEASE || !rep->lease->attached))
		st = -EPROTO;
	if (st == 0)
		*id = rep->lease->lease_id;
	pinbroker__v1__reply__free_unpacked(rep, NULL);
	return st;
}

/*
 * The attacher, uid uid (the uid B): attach with the token, map each chunk, and keep views
 * every way it can; then RELEASE, close the fds and the connection and unmap what the library would.
 * It then serves as the viewer of its mremap'ed and map_files views and of process_vm_readv.
 */
static void attacher(uid_t uid, const char *token, struct pipes *pp, size_t len)
{
	struct setup su = { 0 };
	int sv[2], fds[NCHUNKS], conn, mapfiles_err = 0;
	char *view1[NCHUNKS], *view2[NCHUNKS], *view3[NCHUNKS];
	size_t nfds = 0, n3 = 0;

	sec_drop_to(uid);
	/* After the uid change, which clears it. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	/* An attacker's own choice: a dumpable process may be read by its own uid's other processes. */
	prctl(PR_SET_DUMPABLE, 1);
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		_exit(20);
	/* Forked before the attach: it maps nothing but what it is passed. */
	su.third_pid = fork();
	if (su.third_pid < 0)
		_exit(21);
	if (su.third_pid == 0) {
		close(sv[0]);
		third(sv[1], pp, len);
	}
	close(sv[1]);
	keep_only(pp, 1u << P_MAIN | 1u << P_FORK); /* the fork child's are handed on below */
	conn = raw_connect(d.socket);
	if (conn < 0 || raw_hello(conn) != 0)
		_exit(22);
	if (attach_raw(conn, token, &su.lease_id, fds, &nfds) != 0 || nfds != NCHUNKS)
		_exit(23);
	for (size_t i = 0; i < nfds; i++) {
		char path[96];
		int mf;

		if ((uint64_t)lseek(fds[i], 0, SEEK_END) != len)
			_exit(24);
		view1[i] = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
		if (view1[i] == MAP_FAILED || !is_filled(view1[i], len, SHARED_TAG))
			_exit(25);
		/* The attack: a second view of the same pages that a RELEASE knows nothing of. */
		view2[i] = mremap(view1[i], 0, len, MREMAP_MAYMOVE);
		if (view2[i] == MAP_FAILED)
			_exit(26);
		snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx", (unsigned long)(uintptr_t)view1[i],
			 (unsigned long)(uintptr_t)(view1[i] + len));
		mf = open(path, O_RDWR | O_CLOEXEC);
		if (mf < 0) {
			mapfiles_err = errno;
		} else {
			view3[n3] = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mf, 0);
			if (view3[n3] != MAP_FAILED)
				n3++;
			close(mf);
		}
	}
	/* Passed on: the kernel dups them into the third process. */
	if (wire_send(sv[0], "fds", 3, fds, nfds) < 0)
		_exit(27);
	close(sv[0]);
	/* A child keeps view1, which the parent unmaps below. */
	su.fork_pid = fork();
	if (su.fork_pid < 0)
		_exit(28);
	if (su.fork_pid == 0) {
		int fcmd = pp->cmd[P_MAIN][0], fres = pp->res[P_MAIN][1];

		close(conn);
		wire_close_fds(fds, nfds);
		close(pp->ctl[1]);
		close(fcmd);
		close(fres);
		viewer(pp->cmd[P_FORK][0], pp->res[P_FORK][1], view1, nfds, len, V_FORK, NULL, 0, 0, 0);
	}
	close(pp->cmd[P_FORK][0]);
	close(pp->res[P_FORK][1]);
	/* Let go, as the library does on pb_release and pb_disconnect: RELEASE, unmap, close. */
	if (raw_release(conn, su.lease_id) != 0)
		_exit(29);
	close(conn);
	wire_close_fds(fds, nfds);
	for (size_t i = 0; i < nfds; i++)
		munmap(view1[i], len);
	put_full(pp->ctl[1], &su, sizeof(su));
	close(pp->ctl[1]);
	viewer(pp->cmd[P_MAIN][0], pp->res[P_MAIN][1], view2, nfds, len, V_MREMAP, view3, n3, su.fork_pid,
	       mapfiles_err);
}

/* ------------------------------------------------------------- uid A, the holder */

struct holder_io {
	int cmd, res;
};

/* Chunk inodes of pid's pool mappings (the daemon's memfds), into ino[] (at most max); returns how many. */
static size_t chunk_inodes(pid_t pid, unsigned long *ino, size_t max)
{
	char path[64], line[512];
	size_t n = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long i;

		if (!strstr(line, "/memfd:pinbroker-chunk") || sscanf(line, "%*s %*s %*s %*s %lu", &i) != 1)
			continue;
		ino[n < max ? n : max - 1] = i;
		n += n < max;
	}
	fclose(f);
	return n;
}

/*
 * uid A through the library: 'a' acquire size bytes, fill them with SHARED_TAG and share them with
 * share_uid (token back, 33 bytes); 'r' release, acquire again and fill with SECRET_TAG; 'v' whether
 * that buffer still holds only SECRET_TAG ('y'/'n'); 'q' release and exit.
 */
static void holder(int rd, int wr, size_t size, uid_t share_uid)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE, .label = "taint" };
	char token[PB_SHARE_TOKEN_LEN], cmd;
	pb_client *c = NULL;
	pb_lease *l = NULL;

	sec_drop_to(SEC_UID_A);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	while (read(rd, &cmd, 1) == 1) {
		switch (cmd) {
		case 'a':
			if (pb_connect(d.socket, &c) < 0 || pb_acquire(c, size, &o, &l) < 0 ||
			    pb_lease_chunks(l) != NCHUNKS)
				_exit(10);
			fill(pb_lease_data(l), size, SHARED_TAG);
			if (pb_lease_share(c, l, share_uid == SEC_UID_A ? NULL : &share_uid,
					   share_uid == SEC_UID_A ? 0 : 1, token) < 0)
				_exit(11);
			put_full(wr, token, sizeof(token));
			break;
		case 'r':
			if (pb_release(c, l) < 0 || pb_acquire(c, size, &o, &l) < 0)
				_exit(12);
			fill(pb_lease_data(l), size, SECRET_TAG);
			put_full(wr, "k", 1);
			break;
		case 'v':
			put_full(wr, is_filled(pb_lease_data(l), size, SECRET_TAG) ? "y" : "n", 1);
			break;
		case 'q':
			if (pb_release(c, l) < 0)
				_exit(13);
			pb_disconnect(c);
			_exit(0);
		case 's': {
			/* After a restart: one call, so the library reconnects and re-declares its lease. */
			struct pb_status *st = NULL;

			for (int i = 0; i < 250 && pb_status_get(c, &st) < 0; i++)
				usleep(20000);
			if (st)
				pb_status_free(st);
			put_full(wr, pb_lease_stale(l) ? "n" : "y", 1);
			break;
		}
		default:
			_exit(14);
		}
	}
	_exit(15);
}

/* ------------------------------------------------------------- the books */

/*
 * Nothing leased, nothing lent: the pool is all idle, and what it says it holds is what the daemon
 * has resident in its chunk mappings (no chunk counted twice, none forgotten). Retried: the two are
 * read at different instants.
 */
static void check_books(const char *where)
{
	char msg[512] = "";

	for (int attempt = 0; attempt < 50; attempt++) {
		struct pb_status *s = itest_status(d.socket);
		uint64_t resident = sec_chunk_rss(d.pid);

		ck_assert_ptr_nonnull(s);
		if (s->leased_bytes != 0)
			snprintf(msg, sizeof(msg), "%s: %llu bytes still leased", where,
				 (unsigned long long)s->leased_bytes);
		else if (s->pool_bytes != s->pool_idle_bytes)
			snprintf(msg, sizeof(msg),
				 "%s: the pool holds %llu bytes but only %llu idle with nothing leased", where,
				 (unsigned long long)s->pool_bytes, (unsigned long long)s->pool_idle_bytes);
		else if (s->pool_bytes != resident)
			snprintf(msg, sizeof(msg),
				 "%s: the pool says %llu bytes, the daemon's chunk mappings hold %llu", where,
				 (unsigned long long)s->pool_bytes, (unsigned long long)resident);
		else
			msg[0] = '\0';
		pb_status_free(s);
		if (!msg[0])
			return;
		usleep(20000);
	}
	ck_abort_msg("%s", msg);
}

/* ------------------------------------------------------------- the attack */

struct world {
	pid_t holder;
	struct holder_io a;
	pid_t b;
	struct pipes pp;
	struct setup su;
	size_t len;  /* chunk bytes */
	size_t size; /* lease bytes */
};

static void start_holder(struct world *w, uid_t share_uid)
{
	int c[2], r[2];

	ck_assert_int_eq(pipe2(c, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(r, O_CLOEXEC), 0);
	w->holder = itest_fork();
	ck_assert_int_ge(w->holder, 0);
	if (w->holder == 0) {
		close(c[1]);
		close(r[0]);
		holder(c[0], r[1], w->size, share_uid);
	}
	close(c[0]);
	close(r[1]);
	w->a.cmd = c[1];
	w->a.res = r[0];
}

static char holder_cmd(struct world *w, char cmd)
{
	char k = 0;

	ck_assert_int_eq(write(w->a.cmd, &cmd, 1), 1);
	if (cmd != 'q')
		hear(w->a.res, &k, 1, "the holder (uid A)");
	return k;
}

/* A acquires, shares with attacher_uid; B attaches, keeps its views and lets go; all report ready. */
static void attack_setup(struct world *w, uid_t attacher_uid)
{
	char token[PB_SHARE_TOKEN_LEN];

	start_holder(w, attacher_uid);
	ck_assert_int_eq(write(w->a.cmd, "a", 1), 1);
	hear(w->a.res, token, sizeof(token), "the holder (uid A)");
	ck_assert_int_eq(strlen(token), PB_SHARE_TOKEN_LEN - 1);
	for (int i = 0; i < P_N; i++) {
		ck_assert_int_eq(pipe2(w->pp.cmd[i], O_CLOEXEC), 0);
		ck_assert_int_eq(pipe2(w->pp.res[i], O_CLOEXEC), 0);
	}
	ck_assert_int_eq(pipe2(w->pp.ctl, O_CLOEXEC), 0);
	w->b = itest_fork();
	ck_assert_int_ge(w->b, 0);
	if (w->b == 0) {
		close(w->pp.ctl[0]);
		close(w->a.cmd);
		close(w->a.res);
		attacher(attacher_uid, token, &w->pp, w->len);
	}
	close(w->pp.ctl[1]);
	for (int i = 0; i < P_N; i++) {
		close(w->pp.cmd[i][0]);
		close(w->pp.res[i][1]);
	}
	if (read(w->pp.ctl[0], &w->su, sizeof(w->su)) != (ssize_t)sizeof(w->su)) {
		int st = itest_wait_exit(w->b);

		ck_abort_msg("the attacher (uid %u) failed while setting up its views: exit %d", (unsigned)attacher_uid,
			     st);
	}
	close(w->pp.ctl[0]);
	/* Its RELEASE was answered: only the holder maps the lease now, as far as the daemon knows. */
}

/* Every view of every uid-B process: none shows A's later secret, each still shows what was shared. */
static void check_views(struct world *w, uid_t attacher_uid, struct report *sum)
{
	memset(sum, 0, sizeof(*sum));
	for (int p = 0; p < P_N; p++) {
		struct report r;

		ck_assert_int_eq(write(w->pp.cmd[p][1], "c", 1), 1);
		hear(w->pp.res[p][0], &r, sizeof(r), "a process of the attacher's uid");
		for (int k = 0; k < V_N; k++) {
			sum->views[k] += r.views[k];
			sum->secret[k] += r.secret[k];
			sum->shared[k] += r.shared[k];
			if (r.err[k])
				sum->err[k] = r.err[k];
		}
	}
	{
		char msg[512] = "";
		size_t off = 0;

		for (int k = 0; k < V_N; k++)
			if (sum->secret[k] && off < sizeof(msg))
				off += (size_t)snprintf(msg + off, sizeof(msg) - off, " %d of %d %s views;",
							sum->secret[k], sum->views[k], view_names[k]);
		ck_assert_msg(!msg[0], "uid %u read uid %u's later secret through%s", (unsigned)attacher_uid, SEC_UID_A,
			      msg);
	}
	for (int k = 0; k < V_N; k++) {
		ck_assert_msg(sum->shared[k] == sum->views[k], "%d of %d %s views no longer show the shared pages",
			      sum->views[k] - sum->shared[k], sum->views[k], view_names[k]);
		if (!sum->views[k])
			printf("%s: no %s view could be made (%s)\n", __FILE__, view_names[k], strerror(sum->err[k]));
	}
	/* These three need no privilege: each must really have kept a view of every chunk. */
	ck_assert_int_eq(sum->views[V_MREMAP], NCHUNKS);
	ck_assert_int_eq(sum->views[V_FORK], NCHUNKS);
	ck_assert_int_eq(sum->views[V_PASSED], NCHUNKS);
}

/* Whether any chunk the holder maps now is one a uid-B process still maps. */
static bool holder_shares_a_chunk_with_b(struct world *w)
{
	unsigned long a[64], b[64];
	pid_t bs[P_N] = { w->b, w->su.fork_pid, w->su.third_pid };
	size_t na = chunk_inodes(w->holder, a, 64);

	ck_assert_uint_eq(na, NCHUNKS);
	for (int p = 0; p < P_N; p++) {
		size_t nb = chunk_inodes(bs[p], b, 64);

		ck_assert_uint_ge(nb, NCHUNKS);
		for (size_t i = 0; i < na; i++)
			for (size_t k = 0; k < nb; k++)
				if (a[i] == b[k])
					return true;
	}
	return false;
}

static void world_end(struct world *w)
{
	holder_cmd(w, 'q');
	ck_assert_int_eq(itest_wait_exit(w->holder), 0);
	for (int p = 0; p < P_N; p++) {
		ck_assert_int_eq(write(w->pp.cmd[p][1], "q", 1), 1);
		close(w->pp.cmd[p][1]);
		close(w->pp.res[p][0]);
	}
	ck_assert_int_eq(itest_wait_exit(w->b), 0);
	/* The attacher's own children are not the test's: they exit on 'q' (and with it, on PDEATHSIG). */
	close(w->a.cmd);
	close(w->a.res);
}

/*
 * The sequence: A shares, B attaches and keeps views (mremap, fork, a passed fd, map_files,
 * process_vm_readv), releases and disconnects; A releases, acquires again and writes a secret.
 * B must not read it, and A's buffer must not see B's writes.
 */
static void run_attack(const char *chunk_arg, size_t chunk_bytes, const char *prewarm)
{
	const char *const args[] = { "--lock-memory", "yes",   "--chunk-size", chunk_arg, "--chunk-max", chunk_arg,
				     "--prewarm",     prewarm, "--log-level",  "info",    NULL };
	struct world w = { .len = chunk_bytes, .size = NCHUNKS * chunk_bytes };
	struct report sum;

	daemon_start(&d, args);
	check_books("at start");
	attack_setup(&w, SEC_UID_B);
	ck_assert_int_eq(holder_cmd(&w, 'r'), 'k');
	check_views(&w, SEC_UID_B, &sum);
	ck_assert_msg(!holder_shares_a_chunk_with_b(&w), "uid A's new lease is made of chunks uid B still maps");
	/* And the other way: B writes through every view it kept, A's buffer does not change. */
	for (int p = 0; p < P_N; p++) {
		char k = 0;

		ck_assert_int_eq(write(w.pp.cmd[p][1], "w", 1), 1);
		hear(w.pp.res[p][0], &k, 1, "a process of the attacher's uid");
	}
	ck_assert_msg(holder_cmd(&w, 'v') == 'y', "uid A's later buffer shows uid B's writes");
	world_end(&w);
	check_books("after every lease was released");
	ck_assert_int_eq(daemon_stop(&d), 0);
}

START_TEST(test_kept_views_of_a_shared_4k_chunk_lease_never_see_the_holders_later_lease)
{
	run_attack("4K", 4 * KIB, "64K");
}
END_TEST

START_TEST(test_kept_views_of_a_shared_2m_chunk_lease_never_see_the_holders_later_lease)
{
	run_attack("2M", 2 * MIB, "16M");
}
END_TEST

/*
 * The decision for the holder's own uid: its processes may read one another's memory anyway
 * (process_vm_readv, ptrace), so an attachment of that uid taints nothing and the holder's next
 * lease gets the same warm chunks back (as before the fix).
 */
START_TEST(test_same_uid_attacher_keeps_the_warm_chunks)
{
	const char *const args[] = { "--lock-memory", "yes", "--chunk-size", "2M", "--chunk-max", "2M", NULL };
	struct world w = { .len = 2 * MIB, .size = NCHUNKS * 2 * MIB };

	daemon_start(&d, args);
	attack_setup(&w, SEC_UID_A);
	ck_assert_int_eq(holder_cmd(&w, 'r'), 'k');
	ck_assert_msg(holder_shares_a_chunk_with_b(&w), "a same-uid attachment should leave the chunks in the pool");
	world_end(&w);
	check_books("after every lease was released");
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/*
 * The taint is in the recovery state: after a crash between B's attach and A's release (the fd
 * store kept the chunks; a stand-in for systemd's), the re-adopted lease's chunks stay tainted.
 */
START_TEST(test_taint_survives_a_crash_and_recovery)
{
	static const char *const args[] = { "--lock-memory", "yes", "--chunk-size",         "2M",   "--chunk-max", "2M",
					    "--prewarm",     "16M", "--redeclare-grace-ms", "5000", NULL };
	struct world w = { .len = 2 * MIB, .size = NCHUNKS * 2 * MIB };
	struct report sum;

	daemon_prepare(&d);
	fs = fdstore_new(&d);
	fdstore_daemon_start(fs, args);
	attack_setup(&w, SEC_UID_B);
	fdstore_daemon_kill(fs);
	fdstore_daemon_start(fs, args);
	/* The holder re-declares its lease (same instance): it must not have gone stale. */
	ck_assert_msg(holder_cmd(&w, 's') == 'y', "the holder's lease was not re-adopted after the restart");
	ck_assert_int_eq(holder_cmd(&w, 'r'), 'k');
	check_views(&w, SEC_UID_B, &sum);
	ck_assert_msg(!holder_shares_a_chunk_with_b(&w),
		      "after the restart uid A's new lease reuses chunks uid B maps");
	world_end(&w);
	check_books("after every lease was released");
	sec_stop_with_store(&d, fs);
	fs = NULL;
}
END_TEST

CHECK_SUITE(suite, "sec_13_share_taint", "taint", NULL, NULL, 120,
	    test_kept_views_of_a_shared_4k_chunk_lease_never_see_the_holders_later_lease,
	    test_kept_views_of_a_shared_2m_chunk_lease_never_see_the_holders_later_lease,
	    test_same_uid_attacher_keeps_the_warm_chunks, test_taint_survives_a_crash_and_recovery)

SEC_MAIN(suite)

/* SPDX-License-Identifier: MIT */
/* Finding 12 (recovery state): a stored state or chunk that does not add up is never trusted; its memory reaches nobody. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fdstore.h"
#include "pinbroker.h"
#include "sec.h"

#define MiB (1024ull * 1024ull)
#define LEASE_BYTES (2 * MiB) /* one chunk */
#define SECRET 'S'
#define CRAFTED 'X'
#define GRACE_MS 600

/* No prewarm: the holder's lease is the only chunk in the store, named c1. */
static const char *const args[] = {
	"--budget", "16M", "--uid-quota", "16M", "--prewarm", "0", "--redeclare-grace-ms", "600", NULL,
};

struct world {
	struct daemon d;
	struct fdstore *fs;
	pid_t holder;
	int to_holder, from_holder;
};

static void say(int fd, char c)
{
	if (write(fd, &c, 1) != 1)
		_exit(80);
}

/*
 * uid A: lease 1 filled with SECRET, then on 's' one call (so the library
 * reconnects and re-declares) and back 'y' when its handle went stale, 'n'
 * when the daemon took it back. On 'q' it checks its memory and exits.
 */
static void holder(const char *sock, int rd, int wr)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
	struct pb_status *st;
	pb_client *c;
	pb_lease *l;
	char cmd;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	sec_drop_to(SEC_UID_A);
	if (pb_connect(sock, &c) < 0 || pb_acquire(c, LEASE_BYTES, &o, &l) < 0 || pb_lease_id(l) != 1)
		_exit(10);
	memset(pb_lease_data(l), SECRET, LEASE_BYTES);
	say(wr, 'a');
	while (read(rd, &cmd, 1) == 1) {
		if (cmd == 's') {
			for (int i = 0; i < 100 && pb_status_get(c, &st) < 0; i++)
				usleep(20000);
			say(wr, pb_lease_stale(l) ? 'y' : 'n');
		} else if (cmd == 'q') {
			const uint8_t *p = pb_lease_data(l);

			for (size_t i = 0; i < LEASE_BYTES; i++)
				if (p[i] != SECRET)
					_exit(11);
			_exit(0);
		}
	}
	_exit(12);
}

static char hear(struct world *w)
{
	char c = 0;
	int st;

	if (read(w->from_holder, &c, 1) != 1) {
		waitpid(w->holder, &st, 0);
		ck_abort_msg("the holder failed: exit %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	}
	return c;
}

static void world_start(struct world *w)
{
	int a[2], b[2];

	daemon_prepare(&w->d);
	w->fs = fdstore_new(&w->d);
	fdstore_daemon_start(w->fs, args);
	w->holder = itest_fork_piped(a, b);
	if (w->holder == 0) {
		close(a[1]);
		close(b[0]);
		holder(w->d.socket, a[0], b[1]);
	}
	close(a[0]);
	close(b[1]);
	w->to_holder = a[1];
	w->from_holder = b[0];
	ck_assert_int_eq(hear(w), 'a');
	/* The lease's one chunk, and the state, are in the store (the stand-in reads the daemon's
	 * FDSTORE messages on its own thread: give it a moment to catch up). */
	for (int i = 0; i < 200 && (fdstore_count(w->fs, "c") < 1 || fdstore_count(w->fs, "state") < 1); i++)
		usleep(10 * 1000);
	ck_assert_uint_eq(fdstore_count(w->fs, "c"), 1);
	ck_assert_uint_eq(fdstore_count(w->fs, "state"), 1);
	ck_assert_int_ge(fdstore_get(w->fs, "c1"), 0);
}

static void world_stop(struct world *w)
{
	int st;

	say(w->to_holder, 'q');
	ck_assert_int_eq(waitpid(w->holder, &st, 0), w->holder);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the holder's own memory changed (status %d)", st);
	ck_assert(daemon_alive(&w->d));
	ck_assert_int_eq(daemon_stop(&w->d), 0);
	fdstore_free(w->fs);
	close(w->to_holder);
	close(w->from_holder);
}

/* Every lease uid can get, and whether any shows SECRET or CRAFTED bytes: 0 clean, 1 seen, 3 got nothing. */
static int take_all(const char *sock, uid_t uid)
{
	pid_t pid = itest_fork();
	int st = 0;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
		pb_lease *l;
		pb_client *c;
		int n = 0, bad = 0;

		sec_drop_to(uid);
		if (pb_connect(sock, &c) < 0)
			_exit(50);
		while (n < 64 && pb_acquire(c, LEASE_BYTES, &o, &l) == 0) {
			const uint8_t *p = pb_lease_data(l);

			bad |= memchr(p, SECRET, LEASE_BYTES) != NULL || memchr(p, CRAFTED, LEASE_BYTES) != NULL;
			n++;
		}
		pb_disconnect(c);
		_exit(bad ? 1 : n == 0 ? 3 : 0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A sealed memfd, as the pool makes them, of bytes filled with CRAFTED. */
static int crafted_chunk(uint64_t bytes)
{
	int fd = memfd_create("crafted-chunk", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	char *p;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)bytes), 0);
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(p, MAP_FAILED);
	memset(p, CRAFTED, bytes);
	munmap(p, bytes);
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
	return fd;
}

static int memfd_with(const void *data, size_t len)
{
	int fd = memfd_create("crafted-state", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, data, len), (ssize_t)len);
	return fd;
}

/* The control: an intact store brings lease 1 back, counted, in the same instance, and its holder keeps it. */
START_TEST(test_intact_state_readopts_the_lease)
{
	struct world w;
	char *log;

	world_start(&w);
	fdstore_daemon_kill(w.fs);
	fdstore_daemon_start(w.fs, args);
	ck_assert_int_eq(status_leased(w.d.socket), (int64_t)LEASE_BYTES);
	say(w.to_holder, 's');
	ck_assert_int_eq(hear(&w), 'n');
	/* Past the grace, by the daemon's clock: it stays counted. */
	ck_assert(wait_daemon_uptime(w.d.socket, GRACE_MS + 300, 10000));
	ck_assert_int_eq(status_leased(w.d.socket), (int64_t)LEASE_BYTES);
	ck_assert_int_eq(take_all(w.d.socket, SEC_UID_B), 0);
	ck_assert_int_eq(take_all(w.d.socket, SEC_UID_A), 0);
	log = daemon_log(&w.d);
	ck_assert_ptr_nonnull(
		strstr(log, "1 leases (awaiting re-declaration for 600 ms), 0 idle chunks, 0 chunks quarantined"));
	ck_assert_ptr_nonnull(strstr(log, "lease 1 re-adopted"));
	free(log);
	world_stop(&w);
}
END_TEST

/*
 * The chunk of lease 1 swapped for one of another size: a state line whose
 * chunks do not add up to its bytes. The lease must not come back (not
 * counted, its re-declaration refused), and neither that chunk nor the real
 * one reaches anyone, uid B or another process of uid A.
 */
static void chunk_of_size(uint64_t bytes)
{
	struct pb_status *s;
	struct world w;
	char *log;
	int fd;

	world_start(&w);
	fdstore_daemon_kill(w.fs);
	fd = crafted_chunk(bytes);
	ck_assert_int_eq(fdstore_replace(w.fs, "c1", fd), 0);
	close(fd);
	fdstore_daemon_start(w.fs, args);
	/*
	 * No lease is counted. The real chunk, which the store no longer holds, is
	 * still mapped by the holder: since issue 22 (finding 7) the daemon counts
	 * it as orphaned memory, never as a lease.
	 */
	s = itest_status(w.d.socket);
	ck_assert_uint_eq(s->leased_bytes - s->orphaned_bytes, 0);
	ck_assert_uint_eq(s->orphaned_bytes, LEASE_BYTES);
	ck_assert_ptr_null(itest_lease_row(s, 1));
	pb_status_free(s);
	say(w.to_holder, 's');
	ck_assert_int_eq(hear(&w), 'y');
	ck_assert_int_eq(take_all(w.d.socket, SEC_UID_B), 0);
	ck_assert_int_eq(take_all(w.d.socket, SEC_UID_A), 0);
	log = daemon_log(&w.d);
	ck_assert_ptr_nonnull(
		strstr(log, "cannot be re-adopted after the restart (its chunks do not add up to its size)"));
	free(log);
	world_stop(&w);
}

START_TEST(test_lease_whose_chunk_is_larger_than_its_bytes_is_not_adopted)
{
	chunk_of_size(2 * LEASE_BYTES);
}
END_TEST

START_TEST(test_lease_whose_chunk_is_smaller_than_its_bytes_is_not_adopted)
{
	chunk_of_size(4096);
}
END_TEST

/* What to do to the stored state before the restart. */
enum damage { GARBAGE, TRUNCATED, FLIPPED, OLD_HEADER_NO_NEWLINE, EMPTY, MISSING };

/*
 * A damaged state: the daemon must start, adopt no lease, and quarantine the
 * live chunk it cannot account for: lent to nobody during redeclare-grace-ms,
 * and then replaced, never handed on.
 */
static void damaged_state(enum damage how)
{
	struct world w;
	struct stat st;
	char *buf;
	int fd, sfd;
	char *log;

	world_start(&w);
	fdstore_daemon_kill(w.fs);
	sfd = fdstore_get(w.fs, "state");
	ck_assert_int_ge(sfd, 0);
	ck_assert_int_eq(fstat(sfd, &st), 0);
	ck_assert_int_gt(st.st_size, 0);
	buf = malloc((size_t)st.st_size + 64);
	ck_assert_int_eq(pread(sfd, buf, (size_t)st.st_size, 0), st.st_size);
	close(sfd);
	switch (how) {
	case GARBAGE:
		for (off_t i = 0; i < st.st_size; i++)
			buf[i] = (char)(rand() & 0xff);
		fd = memfd_with(buf, (size_t)st.st_size);
		break;
	case TRUNCATED:
		fd = memfd_with(buf, (size_t)st.st_size / 2);
		break;
	case FLIPPED:
		buf[st.st_size - 3] ^= 0x10; /* inside the last line */
		fd = memfd_with(buf, (size_t)st.st_size);
		break;
	case OLD_HEADER_NO_NEWLINE: {
		/* Version 1's header, no newline in the first 96 bytes: what parse_state's strchr fell over. */
		static const char old[] =
			"pinbroker-state 1 000000000000000000000000000000000000000000000000000000000000"
			"00000000000000000000000000000000000000";
		fd = memfd_with(old, sizeof(old) - 1);
		break;
	}
	case EMPTY:
		fd = memfd_with("", 0);
		break;
	case MISSING:
	default:
		fd = -1;
		break;
	}
	free(buf);
	if (fd >= 0) {
		ck_assert_int_eq(fdstore_replace(w.fs, "state", fd), 0);
		close(fd);
	} else {
		fdstore_remove(w.fs, "state"); /* the store keeps only the chunk */
	}
	fdstore_daemon_start(w.fs, args);
	ck_assert_int_eq(status_leased(w.d.socket), 0);
	/* Quarantined while its holder might still re-declare it... */
	ck_assert_int_eq(take_all(w.d.socket, SEC_UID_B), 0);
	ck_assert_int_eq(take_all(w.d.socket, SEC_UID_A), 0);
	say(w.to_holder, 's');
	ck_assert_int_eq(hear(&w), 'y');
	/* ...and replaced, not lent, once the grace is over: the daemon says when it replaces them. */
	ck_assert(daemon_wait_log(&w.d, "redeclare-grace-ms is over", 10000));
	ck_assert_int_eq(take_all(w.d.socket, SEC_UID_B), 0);
	ck_assert_int_eq(take_all(w.d.socket, SEC_UID_A), 0);
	log = daemon_log(&w.d);
	ck_assert_ptr_nonnull(log);
	ck_assert_msg(strstr(log, "0 leases (awaiting re-declaration for 600 ms), 0 idle chunks, 1 chunks quarantined"),
		      "the live chunk was not quarantined; log:\n%.3000s", log);
	ck_assert_ptr_nonnull(strstr(log, "1 pool chunks of unknown holder are replaced by fresh memory"));
	free(log);
	/* Replaced means gone from the store too (new chunks get new ids). */
	ck_assert_int_lt(fdstore_get(w.fs, "c1"), 0);
	world_stop(&w);
}

START_TEST(test_garbage_state_quarantines_the_live_chunk)
{
	damaged_state(GARBAGE);
}
END_TEST

START_TEST(test_truncated_state_quarantines_the_live_chunk)
{
	damaged_state(TRUNCATED);
}
END_TEST

START_TEST(test_flipped_byte_in_state_quarantines_the_live_chunk)
{
	damaged_state(FLIPPED);
}
END_TEST

START_TEST(test_old_header_without_newline_is_rejected_not_misread)
{
	damaged_state(OLD_HEADER_NO_NEWLINE);
}
END_TEST

START_TEST(test_empty_state_with_a_stored_chunk_quarantines_it)
{
	damaged_state(EMPTY);
}
END_TEST

/* A chunk in the store that no state line names (the state memfd itself gone): quarantined too. */
START_TEST(test_chunk_named_by_no_state_is_quarantined)
{
	damaged_state(MISSING);
}
END_TEST

CHECK_SUITE(suite, "sec-21-recovery-state", "crafted fd store", NULL, NULL, 60, test_intact_state_readopts_the_lease,
	    test_lease_whose_chunk_is_larger_than_its_bytes_is_not_adopted,
	    test_lease_whose_chunk_is_smaller_than_its_bytes_is_not_adopted,
	    test_garbage_state_quarantines_the_live_chunk, test_truncated_state_quarantines_the_live_chunk,
	    test_flipped_byte_in_state_quarantines_the_live_chunk,
	    test_old_header_without_newline_is_rejected_not_misread,
	    test_empty_state_with_a_stored_chunk_quarantines_it, test_chunk_named_by_no_state_is_quarantined)

SEC_MAIN(suite)

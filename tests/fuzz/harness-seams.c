/* SPDX-License-Identifier: MIT */
/*
 * The host as the harness models it: a monotonic clock that moves only when an input says so, and pages that are
 * never faulted in. Link-time seams, not libc names redefined: the harnesses link with
 * -Wl,--wrap=clock_gettime,--wrap=madvise,--wrap=fstat and a static libev (tests/fuzz/CMakeLists.txt), so the
 * daemon's calls and libev's, and only those of the objects linked in, come here as __wrap_*; __real_* is libc's.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness-int.h"

int __real_clock_gettime(clockid_t id, struct timespec *ts);
int __wrap_clock_gettime(clockid_t id, struct timespec *ts);
int __real_madvise(void *addr, size_t len, int advice);
int __wrap_madvise(void *addr, size_t len, int advice);
int __real_fstat(int fd, struct stat *st);
int __wrap_fstat(int fd, struct stat *st);

/* ------------------------------------------------------------------ clock */

/*
 * The daemon's timers (libev) and deadlines (now_ms) read CLOCK_MONOTONIC. Here it stands still except when an
 * input moves it on: timers fire exactly where the input says, whatever the speed of the machine, and no input
 * sleeps. Other clocks (libFuzzer's timing) are real.
 */
static uint64_t virtual_mono_ns = 1000000000ull; /* 1 s: well clear of 0, which some code reads as "never" */

int __wrap_clock_gettime(clockid_t id, struct timespec *ts)
{
	if (id != CLOCK_MONOTONIC)
		return __real_clock_gettime(id, ts);
	ts->tv_sec = (time_t)(virtual_mono_ns / 1000000000ull);
	ts->tv_nsec = (long)(virtual_mono_ns % 1000000000ull);
	return 0;
}

void fz_advance_clock(uint64_t ms)
{
	virtual_mono_ns += ms * 1000000ull;
}

/* ------------------------------------------------------------------ memory */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/*
 * The pool pre-faults every chunk it makes (MADV_POPULATE_WRITE): on a real host that is the point, here it is
 * what an input costs most (zeroing and later freeing pages nobody reads). The target is the daemon's logic, so
 * pre-faulting succeeds without touching a page, as lock-memory=no already skips mlock; MADV_HUGEPAGE only asks
 * for huge pages of pages never touched here. Other advice goes to the kernel.
 */
int __wrap_madvise(void *addr, size_t len, int advice)
{
	if (advice == MADV_POPULATE_WRITE || advice == MADV_HUGEPAGE)
		return 0;
	return __real_madvise(addr, len, advice);
}

/*
 * The other half of that model: a chunk whose pre-fault was skipped has no blocks, which the pool's punch check
 * (st_blocks below the size) would read as a holder's hole and destroy the chunk on its return, so no chunk would
 * ever be lent twice, the path where one uid's pages could reach another. A sealed memfd reads as whole, as it
 * does in a daemon that pre-faulted it (no peer here punches holes in a chunk).
 */
#define FZ_CHUNK_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

int __wrap_fstat(int fd, struct stat *st)
{
	int seals, r = __real_fstat(fd, st);

	if (r == 0 && S_ISREG(st->st_mode) && (uint64_t)st->st_blocks * 512u < (uint64_t)st->st_size &&
	    (seals = fcntl(fd, F_GET_SEALS)) >= 0 && (seals & FZ_CHUNK_SEALS) == FZ_CHUNK_SEALS)
		st->st_blocks = (blkcnt_t)((st->st_size + 511) / 512);
	return r;
}

/* ------------------------------------------------------------------ self-check */

static void seam_timer_fired(struct ev_loop *loop, ev_timer *w, int revents)
{
	*(int *)w->data = 1;
}

void fz_check_seams(struct ev_loop *loop)
{
	int fired = 0, fd;
	struct stat st;
	ev_timer t;

	/* An hour of modelled time: only the seam can make this timer fire in a non-blocking loop turn. */
	ev_now_update(loop);
	ev_timer_init(&t, seam_timer_fired, 3600., 0.);
	t.data = &fired;
	ev_timer_start(loop, &t);
	fz_advance_clock(3600 * 1000 + 1);
	ev_now_update(loop);
	ev_run(loop, EVRUN_NOWAIT);
	ev_timer_stop(loop, &t);
	FZ_ASSERT(fired,
		  "libev's timers do not run on the modelled clock: link the harness with a static libev and "
		  "-Wl,--wrap=clock_gettime (%s)",
		  "tests/fuzz/CMakeLists.txt");
	/* A sealed memfd of 64 KiB that nothing touched: whole, as the pool's punch check must see it. */
	fd = memfd_create("fz-seam", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	FZ_ASSERT(fd >= 0 && ftruncate(fd, 64 << 10) == 0 && fcntl(fd, F_ADD_SEALS, FZ_CHUNK_SEALS) == 0,
		  "seam check's memfd: %m%s", "");
	FZ_ASSERT(fstat(fd, &st) == 0 && st.st_blocks * 512 >= st.st_size,
		  "fstat of an untouched sealed memfd shows %lld blocks: link with -Wl,--wrap=fstat (%s)",
		  (long long)st.st_blocks, "tests/fuzz/CMakeLists.txt");
	close(fd);
}

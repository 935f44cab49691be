/* SPDX-License-Identifier: MIT */
/* The pressure monitor's PSI triggers: armed on /proc/pressure/memory, watched through an inner epoll set. */
#define _GNU_SOURCE
#include "monitor-int.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

/*
 * PSI trigger windows: 500 ms to 10 s, and without CAP_SYS_RESOURCE only
 * multiples of 2 s are accepted, to bound the polling cost an unprivileged
 * user can impose (kernel Documentation/accounting/psi.rst, "Userspace
 * monitor usage").
 */
#define PSI_WINDOW_MIN_US 500000u
#define PSI_WINDOW_MAX_US 10000000u
#define PSI_WINDOW_UNPRIV_US 2000000u

void mon_triggers_close(struct monitor *m)
{
	if (m->epfd >= 0) {
		ev_io_stop(m->loop, &m->psi_io);
		close(m->epfd);
		m->epfd = -1;
	}
	for (int i = 0; i < 2; i++) {
		if (m->psi_fd[i] >= 0)
			close(m->psi_fd[i]);
		m->psi_fd[i] = -1;
	}
}

/* Open the PSI file and register one trigger on it. Returns the fd or a negative errno. */
static int trigger_open(struct monitor *m, const char *kind, uint32_t stall_us, uint32_t window_us)
{
	char cmd[64];
	struct statfs sfs;
	int fd, n;

	fd = openat(m->root_fd, PSI_REL, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return -errno;
	/*
	 * A write to a fixture's plain file "succeeds" and never fires; only a
	 * file on procfs is a real trigger.
	 */
	if (fstatfs(fd, &sfs) < 0 || sfs.f_type != PROC_SUPER_MAGIC) {
		close(fd);
		return -ENOTSUP;
	}
	n = snprintf(cmd, sizeof(cmd), "%s %u %u", kind, stall_us, window_us);
	/* The kernel overwrites the last byte written with a NUL, so the NUL is part of the write (psi.rst). */
	if (write(fd, cmd, (size_t)n + 1) < 0) {
		n = -errno;
		close(fd);
		return n;
	}
	return fd;
}

static int triggers_open_both(struct monitor *m, uint32_t stall_us, uint32_t window_us)
{
	int some, full;

	some = trigger_open(m, "some", stall_us, window_us);
	if (some < 0)
		return some;
	full = trigger_open(m, "full", stall_us, window_us);
	if (full < 0) {
		close(some);
		return full;
	}
	m->psi_fd[0] = some;
	m->psi_fd[1] = full;
	m->trigger_stall_us = stall_us;
	m->trigger_window_us = window_us;
	return 0;
}

static void psi_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct monitor *m = w->data;
	struct epoll_event evs[4];
	bool broken = false;
	int n;

	(void)loop;
	(void)revents;
	/* Reading the events resets the triggers' edge; without this the epoll fd stays readable. */
	n = epoll_wait(m->epfd, evs, 4, 0);
	for (int i = 0; i < n; i++)
		if (evs[i].events & (EPOLLERR | EPOLLHUP))
			broken = true;
	if (broken) {
		/* A trigger in error reports EPOLLERR on every wait: keep it and the loop spins. */
		mon_triggers_close(m);
		snprintf(m->mode, sizeof(m->mode), "poll (PSI trigger failed)");
		log_warnx("pressure monitor: a PSI trigger reported an error; polling every %u ms from now on",
			  m->poll_interval_ms);
	}
	/* The trigger says the stall is building over its window: watch that closely for as long. */
	if (n > 0 && !broken)
		m->fast_until_ms = now_ms() + (m->trigger_window_us > 1000000 ? m->trigger_window_us / 1000 : 1000);
	m->on_trigger(m);
}

/* Arm "some" and "full" triggers, or say why the monitor polls instead; the reason goes into mode. */
void mon_triggers_arm(struct monitor *m)
{
	uint32_t window_us, stall_us, rounded_us;
	struct epoll_event ev = { .events = EPOLLPRI };
	int r;

	mon_triggers_close(m);
	if (!mon_exists_rel(m->root_fd, PSI_REL)) {
		snprintf(m->mode, sizeof(m->mode), "poll (no PSI)");
		log_info("pressure monitor: no %s/%s (kernel without PSI); polling every %u ms", m->proc_root, PSI_REL,
			 m->poll_interval_ms);
		return;
	}
	window_us = m->psi_window_ms > PSI_WINDOW_MAX_US / 1000 ? PSI_WINDOW_MAX_US : m->psi_window_ms * 1000;
	if (window_us < PSI_WINDOW_MIN_US)
		window_us = PSI_WINDOW_MIN_US;
	stall_us = m->psi_stall_ms > window_us / 1000 ? window_us : m->psi_stall_ms * 1000;
	if (stall_us == 0)
		stall_us = 1000;

	r = triggers_open_both(m, stall_us, window_us);
	if (r == 0) {
		snprintf(m->mode, sizeof(m->mode), "psi-trigger");
	} else if ((r == -EPERM || r == -EINVAL) && window_us % PSI_WINDOW_UNPRIV_US != 0) {
		rounded_us = (uint32_t)round_up(window_us, PSI_WINDOW_UNPRIV_US);
		r = triggers_open_both(m, stall_us, rounded_us);
		if (r == 0) {
			snprintf(m->mode, sizeof(m->mode), "psi-trigger-2s");
			log_info("pressure monitor: a %u ms PSI window needs CAP_SYS_RESOURCE; using %u ms, the "
				 "shortest an unprivileged trigger may have",
				 window_us / 1000, rounded_us / 1000);
		}
	}
	if (r < 0) {
		const char *why = r == -ENOTSUP ? "not on procfs" : strerror(-r);

		snprintf(m->mode, sizeof(m->mode), "poll (PSI triggers unavailable: %s)", why);
		log_info("pressure monitor: PSI triggers unavailable (%s); polling every %u ms", why,
			 m->poll_interval_ms);
		return;
	}

	m->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (m->epfd < 0) {
		r = -errno;
		goto fail;
	}
	for (int i = 0; i < 2; i++) {
		ev.data.u32 = (uint32_t)i;
		if (epoll_ctl(m->epfd, EPOLL_CTL_ADD, m->psi_fd[i], &ev) < 0) {
			r = -errno;
			goto fail;
		}
	}
	ev_io_init(&m->psi_io, psi_cb, m->epfd, EV_READ);
	m->psi_io.data = m;
	ev_io_start(m->loop, &m->psi_io);
	log_info("pressure monitor: PSI triggers armed on %s/%s: %u ms of stall in %u ms", m->proc_root, PSI_REL,
		 m->trigger_stall_us / 1000, m->trigger_window_us / 1000);
	return;
fail:
	mon_triggers_close(m);
	snprintf(m->mode, sizeof(m->mode), "poll (PSI triggers unavailable: epoll: %s)", strerror(-r));
	log_warnx("pressure monitor: cannot watch PSI triggers (epoll: %s); polling every %u ms", strerror(-r),
		  m->poll_interval_ms);
}

/* SPDX-License-Identifier: MIT */
/* systemd integration through libsystemd: readiness, status, watchdog from the loop, socket activation, fd store. */
#define _GNU_SOURCE
#include "notify.h"

#include <errno.h>
#include <ev.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static ev_timer watchdog_timer;
static bool watchdog_on;

/* sd_listen_fds_with_names() may be called once: it unsets $LISTEN_FDS. */
static struct notify_stored *passed;
static int npassed = -1;

static void collect_passed(void)
{
	char **names = NULL;
	int n;

	if (npassed >= 0)
		return;
	npassed = 0;
	n = sd_listen_fds_with_names(1, &names);
	if (n <= 0)
		return;
	passed = calloc((size_t)n, sizeof(*passed));
	if (!passed) {
		for (int i = 0; i < n; i++)
			close(SD_LISTEN_FDS_START + i);
		return;
	}
	for (int i = 0; i < n; i++) {
		passed[i].fd = SD_LISTEN_FDS_START + i;
		snprintf(passed[i].name, sizeof(passed[i].name), "%s", names && names[i] ? names[i] : "unknown");
		free(names ? names[i] : NULL);
	}
	free(names);
	npassed = n;
}

bool notify_enabled(void)
{
	const char *s = getenv("NOTIFY_SOCKET");

	return s && *s;
}

static void watchdog_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	/* Sent from inside the loop: a stuck loop stops pinging and systemd restarts us. */
	sd_notify(0, "WATCHDOG=1");
}

int notify_init(struct ev_loop *loop)
{
	uint64_t usec = 0;
	int r;

	collect_passed();
	r = sd_watchdog_enabled(0, &usec);
	if (r < 0)
		log_warnx("cannot read the watchdog settings: %s, ignoring", strerror(-r));
	if (r > 0 && usec > 0) {
		/* Half the interval, as sd_watchdog_enabled(3) recommends. */
		double period = (double)usec / 2e6;

		ev_timer_init(&watchdog_timer, watchdog_cb, period, period);
		ev_timer_start(loop, &watchdog_timer);
		watchdog_on = true;
		log_debug("watchdog enabled: pinging every %.1f s", period);
	}
	return 0;
}

void notify_fini(struct ev_loop *loop)
{
	if (watchdog_on)
		ev_timer_stop(loop, &watchdog_timer);
	watchdog_on = false;
}

void notify_ready(void)
{
	sd_notify(0, "READY=1");
}

void notify_stopping(void)
{
	sd_notify(0, "STOPPING=1\nSTATUS=Stopping: telling clients and returning leases");
}

void notify_reloading(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu",
		   (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000ull);
}

void notify_status(const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	if (!notify_enabled())
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	sd_notifyf(0, "STATUS=%s", buf);
}

int notify_listen_fd(void)
{
	int fallback = -ENOENT;

	collect_passed();
	for (int i = 0; i < npassed; i++) {
		int fd = passed[i].fd;

		if (fd < 0 || sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0) <= 0)
			continue;
		if (strcmp(passed[i].name, "pinbroker") == 0 || fallback < 0) {
			if (strcmp(passed[i].name, "pinbroker") == 0) {
				passed[i].fd = -1;
				return fd;
			}
			fallback = i;
		}
	}
	if (fallback >= 0) {
		int fd = passed[fallback].fd;

		passed[fallback].fd = -1;
		return fd;
	}
	return -ENOENT;
}

int notify_stored_fds(struct notify_stored **ret, int *n)
{
	struct notify_stored *out;
	int k = 0;

	collect_passed();
	*ret = NULL;
	*n = 0;
	if (npassed <= 0)
		return 0;
	out = calloc((size_t)npassed, sizeof(*out));
	if (!out)
		return -ENOMEM;
	for (int i = 0; i < npassed; i++) {
		if (passed[i].fd < 0 || sd_is_socket(passed[i].fd, AF_UNIX, 0, -1) > 0)
			continue;
		out[k++] = passed[i];
		passed[i].fd = -1;
	}
	*ret = out;
	*n = k;
	return 0;
}

int notify_fdstore(int fd, const char *name)
{
	int r;

	if (!notify_enabled())
		return -EOPNOTSUPP;
	char msg[128];

	snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s", name);
	r = sd_pid_notify_with_fds(0, 0, msg, &fd, 1);
	if (r < 0)
		return r;
	return r == 0 ? -EOPNOTSUPP : 0;
}

int notify_fdstore_remove(const char *name)
{
	int r;

	if (!notify_enabled())
		return -EOPNOTSUPP;
	r = sd_notifyf(0, "FDSTOREREMOVE=1\nFDNAME=%s", name);
	return r < 0 ? r : 0;
}

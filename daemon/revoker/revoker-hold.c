/* SPDX-License-Identifier: MIT */
/*
 * Exit holds: leases kept counted until a process that may still map them exits, one pidfd watcher per process (or,
 * without a pidfd, a poll).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "daemon.h"
#include "budget.h"
#include "lease.h"
#include "log.h"
#include "revoker-int.h"
#include "util.h"

static uid_t pidfd_real_uid(int pidfd, pid_t pid);

/* g joins the poll (it has no pidfd): the poll's timer runs while there is one. */
static void exit_hold_poll(struct broker *b, struct exit_hold *g)
{
	struct revoker *rv = daemon_of(b)->revoker;

	g->polled = true;
	if (rv->npolled++ == 0)
		ev_timer_start(daemon_of(b)->loop, &rv->poll_timer);
}

/* g leaves the poll, if it was on it (it goes, or is watched through a pidfd now). */
static void exit_hold_unpoll(struct broker *b, struct exit_hold *g)
{
	struct revoker *rv = daemon_of(b)->revoker;

	if (!g->polled)
		return;
	g->polled = false;
	if (--rv->npolled == 0)
		ev_timer_stop(daemon_of(b)->loop, &rv->poll_timer);
}

void revoker_exit_hold_free(struct broker *b, struct exit_hold *g)
{
	struct revoker *rv = daemon_of(b)->revoker;

	for (struct exit_hold **gp = &rv->holds; *gp; gp = &(*gp)->next)
		if (*gp == g) {
			*gp = g->next;
			break;
		}
	if (g->pidfd >= 0) {
		ev_io_stop(daemon_of(b)->loop, &g->io);
		close(g->pidfd);
	}
	exit_hold_unpoll(b, g);
	if (g->counted && b->budget)
		budget_fd_sub(b->budget, g->uid);
	free(g->ids);
	free(g->holder);
	free(g);
}

bool revoker_hold_end(struct broker *b, struct lease *l)
{
	if (l->exit_holds > 0)
		l->exit_holds--;
	/* Not lease_unmapped: an orphan held for its process is freed here too, once the grace has passed
	 * (until then its holder may still re-declare it, and may still map it). */
	return !l->owner && l->nattachers == 0 && l->exit_holds == 0 &&
	       !(l->state == LEASE_ORPHANED && b->redeclare_grace);
}

void revoker_reclaim_orphan(struct broker *b, struct lease *l)
{
	log_event(
		EV_LEASE_RELEASED, LOG_NOTICE, l->id, l->uid, l->pid,
		"lease %llu (%llu bytes, pid %d) was not re-declared within redeclare-grace-ms and its holder is gone: "
		"reclaimed",
		(unsigned long long)l->id, (unsigned long long)l->bytes, l->pid);
	daemon_free_lease(b, l);
}

/* g's process has exited, its mappings with it: its holds end, a lease nobody maps now is freed, and g goes. */
static void exit_hold_end(struct broker *b, struct exit_hold *g)
{
	for (size_t i = 0; i < g->nids; i++) {
		struct lease *l = lease_find(b->leases, g->ids[i]);

		if (!l || !revoker_hold_end(b, l))
			continue;
		/* An orphan nobody re-declared, held past the grace for its holder or a former mapper. */
		if (l->state == LEASE_ORPHANED)
			revoker_reclaim_orphan(b, l);
		else
			revoker_free_lease(b, l, "holder exited");
	}
	/* Its pid leaves the leases' mappers too: the fd-store state is written again (recovery-writer.c). */
	b->generation++;
	revoker_exit_hold_free(b, g);
}

static void exit_hold_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct exit_hold *g = w->data;
	struct broker *b = g->broker;

	/* The pidfd is readable once the process has exited: its mappings are gone. */
	exit_hold_end(b, g);
	revoker_freed(b);
}

/* Watch g's process through pidfd (taken) from now on; a polled g leaves the poll. */
static void exit_hold_watch(struct broker *b, struct exit_hold *g, int pidfd)
{
	exit_hold_unpoll(b, g);
	g->pidfd = pidfd;
	/* Counted even past the cap: the process holds the memory either way; acquires see it. */
	g->counted = b->budget && budget_fd_add(b->budget, g->uid) == 0;
	ev_io_init(&g->io, exit_hold_cb, g->pidfd, EV_READ);
	g->io.data = g;
	ev_io_start(daemon_of(b)->loop, &g->io);
}

int revoker_open_pidfd(const struct broker *b, pid_t pid)
{
	int fd;

	if (daemon_of(b)->revoker && daemon_of(b)->revoker->no_pidfd)
		return -ENOSYS;
	fd = sys_pidfd_open(pid, 0);
	return fd >= 0 ? fd : -errno;
}

/*
 * Whether this daemon's /proc shows its own pid namespace, read once: the pids of kill() and SO_PEERCRED are this
 * namespace's, and a /proc mounted for another one (unshare -pf without --mount-proc) names other processes, often
 * kernel threads with no mm, under those numbers. Where it does not, only kill() decides.
 */
static bool proc_is_ours(void)
{
	static int ours = -1;
	char buf[32];
	ssize_t n;

	if (ours < 0) {
		n = readlink("/proc/self", buf, sizeof(buf) - 1);
		if (n > 0)
			buf[n] = '\0';
		ours = n > 0 && strtol(buf, NULL, 10) == (long)getpid();
	}
	return ours == 1;
}

uint64_t revoker_pid_starttime(pid_t pid)
{
	char path[64], buf[1024];
	uint64_t t;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (pid <= 0 || !proc_is_ours() || read_text_at(AT_FDCWD, path, buf, sizeof(buf)) < 0 ||
	    parse_proc_stat_starttime(buf, &t) < 0)
		return 0;
	return t;
}

/*
 * Whether pid's process still maps anything: 1 yes, 0 no, -1 cannot tell. It maps nothing once its leader has no mm
 * (statm's size 0: a zombie, or past exit_mm in do_exit) and is its only thread (stat's num_threads, which counts
 * an unreaped zombie leader until its reap). Not the leader's mm alone: one that called pthread_exit has none while
 * its other threads, sharing the mm, still map the pages. In this order: an exited leader never gets its mm back,
 * and a thread is made only by a thread that has one, which num_threads would count. The kernel runs exit_mm before
 * exit_files, so at its connection's EOF a single-threaded process that exits already reads as mapping nothing.
 */
static int pid_maps_anything(pid_t pid)
{
	char path[64], buf[1024];
	uint64_t size, threads;

	if (!proc_is_ours())
		return -1;
	snprintf(path, sizeof(path), "/proc/%d/statm", (int)pid);
	if (read_text_at(AT_FDCWD, path, buf, sizeof(buf)) < 0 || parse_proc_statm_size(buf, &size) < 0)
		return -1;
	if (size > 0)
		return 1;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (read_text_at(AT_FDCWD, path, buf, sizeof(buf)) < 0 || parse_proc_stat_u64(buf, 20, &threads) < 0)
		return -1;
	return threads > 1;
}

bool revoker_process_gone(pid_t pid, int err, uint64_t starttime)
{
	uint64_t now;
	int maps;

	/*
	 * No pid to look at (a peer in a pid namespace the daemon cannot see: SO_PEERCRED says 0): kill(0, 0) would
	 * ask about the daemon's own process group, which never goes. Taken for gone, as it always was.
	 */
	if (pid <= 0 || err == -ESRCH)
		return true;
	if (kill(pid, 0) < 0 && errno == ESRCH)
		return true;
	/*
	 * The pid exists (kill succeeds on a zombie too, and EPERM says it runs as another user). Gone all the same
	 * when it names another process now: its start time is not the one recorded when the hold was made (the pid
	 * was reused). 0 on either side: not known, no reuse check.
	 */
	now = revoker_pid_starttime(pid);
	if (starttime && now && now != starttime)
		return true;
	/*
	 * Gone when it maps nothing (pid_maps_anything). /proc not readable (EACCES, hidepid, which may say ENOENT for
	 * a process that runs) or another namespace's: taken for alive unless kill says it is gone, so its leases stay
	 * counted longer, never freed under it.
	 */
	maps = pid_maps_anything(pid);
	if (maps < 0)
		return kill(pid, 0) < 0 && errno == ESRCH;
	return maps == 0;
}

bool revoker_pid_gone(pid_t pid, int err)
{
	return revoker_process_gone(pid, err, 0);
}

/* Whether g's process still runs: its pidfd is not readable yet, or (polled) it still maps anything. */
static bool exit_hold_alive(const struct exit_hold *g)
{
	struct pollfd p = { .fd = g->pidfd, .events = POLLIN };

	if (g->pidfd < 0)
		return !revoker_process_gone(g->pid, 0, g->starttime);
	return poll(&p, 1, 0) == 0;
}

/*
 * Look again at each exit hold without a pidfd: gone, its holds end as at a watched exit (exit_hold_cb); watchable now,
 * it
 * moves to a pidfd watch; alive and still not watchable, it stays.
 */
static void poll_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct broker *b = w->data;
	struct exit_hold *g, *next;
	bool ended = false;

	(void)loop;
	(void)revents;
	for (g = daemon_of(b)->revoker->holds; g; g = next) {
		int fd;

		next = g->next;
		if (g->pidfd >= 0)
			continue;
		fd = revoker_open_pidfd(b, g->pid);
		/*
		 * The pidfd names whatever process has the pid now: one that started at another time took the pid over
		 * after g's process exited (reused), so g's process is gone and that pidfd is not its. The same start
		 * time: it is g's process (it ran when pidfd_open found it, and a pid is reused only once its process
		 * is
		 * gone), and the pidfd watches it from now on.
		 */
		if (fd >= 0 && g->starttime) {
			uint64_t now = revoker_pid_starttime(g->pid);

			/*
			 * 0: not readable now (EMFILE, most likely, where polled holds come from): that pidfd cannot be
			 * told apart from a later process's, so it is not kept; the next look tries again.
			 */
			if (now != g->starttime) {
				close(fd);
				fd = now ? -ESRCH : -EAGAIN;
			}
		}
		if (fd >= 0) {
			/* Recovery's holds could not tell the uid: the pidfd confirms what /proc says. */
			if (g->uid == (uid_t)-1)
				g->uid = pidfd_real_uid(fd, g->pid);
			exit_hold_watch(b, g, fd);
			log_info("pid %d is watched for its exit now: %zu leases held for it", g->pid, g->nids);
		} else if (revoker_process_gone(g->pid, fd, g->starttime)) {
			exit_hold_end(b, g);
			ended = true;
		}
	}
	/* Once, after the walk: the wait queue it wakes may close connections, which add holds. */
	if (ended)
		revoker_freed(b);
}

void revoker_hold_init(struct broker *b)
{
	struct revoker *rv = daemon_of(b)->revoker;
	const char *v = getenv(REVOKER_NO_PIDFD_ENV);

	ev_timer_init(&rv->poll_timer, poll_cb, REVOKER_POLL_MS / 1000., REVOKER_POLL_MS / 1000.);
	rv->poll_timer.data = b;
	/* Test only: read once, before recovery_init asks for pidfds and before any connection. */
	rv->no_pidfd = v && (strcmp(v, "1") == 0 || strcmp(v, "all") == 0);
	if (v && strcmp(v, "all") == 0)
		sys_pidfd_disable();
}

void revoker_hold_fini(struct broker *b)
{
	ev_timer_stop(daemon_of(b)->loop, &daemon_of(b)->revoker->poll_timer);
}

struct exit_hold *revoker_exit_hold_find(struct broker *b, pid_t pid)
{
	for (struct exit_hold *g = daemon_of(b)->revoker->holds; g; g = g->next)
		if (g->pid == pid && exit_hold_alive(g))
			return g;
	return NULL;
}

int revoker_hold_process(struct broker *b, int pidfd, bool take_pidfd, pid_t pid, uid_t uid, const uint64_t *ids,
			 const bool *holder, size_t n)
{
	struct revoker *rv = daemon_of(b)->revoker;
	struct exit_hold *g = revoker_exit_hold_find(b, pid);
	bool fresh = !g;
	int fd = -1;

	/* The pidfd to watch with: none is needed where the process is watched already. */
	if (pidfd >= 0 && (!g || g->pidfd < 0)) {
		fd = take_pidfd ? pidfd : fcntl(pidfd, F_DUPFD_CLOEXEC, 3);
		/* No copy (EMFILE, ENFILE): polled, as without a pidfd, rather than freed under the process. */
	} else if (pidfd >= 0 && take_pidfd) {
		close(pidfd);
	}
	if (!g) {
		g = calloc(1, sizeof(*g));
		if (!g) {
			if (fd >= 0)
				close(fd);
			return -ENOMEM;
		}
		g->pidfd = -1;
		g->broker = b;
		g->pid = pid;
		g->uid = uid;
	}
	if (g->nids + n > g->capids) {
		size_t cap = g->capids ? g->capids * 2 : 4;
		uint64_t *p;
		bool *h;

		while (cap < g->nids + n)
			cap *= 2;
		p = realloc(g->ids, cap * sizeof(*p));
		if (p)
			g->ids = p;
		h = p ? realloc(g->holder, cap * sizeof(*h)) : NULL;
		if (h)
			g->holder = h;
		if (!p || !h) {
			if (fd >= 0)
				close(fd);
			if (fresh) {
				free(g->ids);
				free(g->holder);
				free(g);
			}
			return -ENOMEM;
		}
		g->capids = cap;
	}
	memcpy(g->ids + g->nids, ids, n * sizeof(*ids));
	for (size_t i = 0; i < n; i++)
		g->holder[g->nids + i] = holder && holder[i];
	g->nids += n;
	for (size_t i = 0; i < n; i++) {
		struct lease *l = lease_find(b->leases, ids[i]);

		if (l)
			l->exit_holds++;
	}
	if (fresh) {
		g->next = rv->holds;
		rv->holds = g;
	}
	/*
	 * A polled exit hold that gets a pidfd (a connection of its process closed, and had one) is watched from now
	 * on.
	 * One made by recovery could not tell its uid: the caller's, or the pidfd's, before exit_hold_watch counts the
	 * fd
	 * (to no uid otherwise, and an overdue lease's enforcement would never signal it).
	 */
	if (fd >= 0) {
		if (g->uid == (uid_t)-1)
			g->uid = uid != (uid_t)-1 ? uid : pidfd_real_uid(fd, pid);
		exit_hold_watch(b, g, fd);
	} else if (fresh) {
		/* Polled: its start time tells its process from a later one given the same pid. */
		g->starttime = revoker_pid_starttime(pid);
		exit_hold_poll(b, g);
	}
	return 0;
}

/*
 * The real uid of the process pidfd names, read from /proc/PID/status and confirmed through the pidfd after
 * the read (a pid is reused only once its process is gone, and the pidfd outlives neither): (uid_t)-1 when
 * it cannot be told.
 */
static uid_t pidfd_real_uid(int pidfd, pid_t pid)
{
	char path[64], line[256];
	unsigned long uid = (unsigned long)-1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return (uid_t)-1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Uid: %lu", &uid) == 1)
			break;
	fclose(f);
	if (uid == (unsigned long)-1 || sys_pidfd_send_signal(pidfd, 0, 0) < 0)
		return (uid_t)-1;
	return (uid_t)uid;
}

int revoker_hold_until_exit(struct broker *b, int pidfd, pid_t pid, bool holder, uint64_t id)
{
	/*
	 * A holder or a mapper after a restart: its own uid, not the lease's, which an attacher of another uid
	 * does not share. The pidfd is charged to it, and a revoke the holder starts never signals it (a holder
	 * must not kill another uid's attacher). One whose uid cannot be told is charged to no real uid and never
	 * signalled by a holder.
	 */
	return revoker_hold_process(b, pidfd, true, pid, pidfd >= 0 ? pidfd_real_uid(pidfd, pid) : (uid_t)-1, &id,
				    &holder, 1);
}

bool revoker_unhold(struct broker *b, pid_t pid, uint64_t id)
{
	struct exit_hold *g = daemon_of(b)->revoker ? revoker_exit_hold_find(b, pid) : NULL;
	struct lease *l;

	/* Only its holder's hold: one it has as a mapper (an attachment of its own, stale) still maps it. */
	for (size_t i = 0; g && i < g->nids; i++) {
		if (g->ids[i] != id || !g->holder[i])
			continue;
		g->nids--;
		g->ids[i] = g->ids[g->nids];
		g->holder[i] = g->holder[g->nids];
		l = lease_find(b->leases, id);
		if (l && l->exit_holds > 0)
			l->exit_holds--;
		if (g->nids == 0)
			revoker_exit_hold_free(b, g);
		return true;
	}
	return false;
}

size_t revoker_hold_pids(const struct broker *b, uint64_t id, pid_t *out, size_t max)
{
	const struct lease *l = daemon_of(b)->revoker ? lease_find(b->leases, id) : NULL;
	size_t n = 0;

	if (!daemon_of(b)->revoker)
		return 0;
	/*
	 * Not the hold of the holder the lease line names (its pid): a restart's grace holds that one again if it
	 * still runs, and its re-declare drops it; written as a mapper, its re-declare could not tell it from a
	 * stale attachment of its own. Any other (a holder another process re-declared the lease from) is written.
	 */
	for (const struct exit_hold *g = daemon_of(b)->revoker->holds; g && n < max; g = g->next)
		for (size_t i = 0; i < g->nids && n < max; i++)
			if (g->ids[i] == id && !(g->holder[i] && l && !l->holder_detached && g->pid == l->pid))
				out[n++] = g->pid;
	return n;
}

void revoker_foreach_hold(const struct broker *b, void (*fn)(uint64_t id, pid_t pid, void *ud), void *ud)
{
	if (!daemon_of(b)->revoker)
		return;
	for (const struct exit_hold *g = daemon_of(b)->revoker->holds; g; g = g->next)
		for (size_t i = 0; i < g->nids; i++)
			fn(g->ids[i], g->pid, ud);
}

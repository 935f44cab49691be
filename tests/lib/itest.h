/* SPDX-License-Identifier: MIT */
/* Helpers for integration tests: run the real pinbrokerd on a temp socket, run pinctl, talk raw protocol. */
#pragma once

#include "pinbroker.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "pinbroker.pb-c.h"

struct daemon {
	pid_t pid;
	char dir[256]; /* temp dir holding the socket and the log */
	char socket[300];
	char log[300];
	long log_from; /* the log's size when the daemon was last started: where that start's output begins */
};

/*
 * Start PINBROKERD_PATH with --socket in a fresh temp dir plus the given
 * extra arguments (NULL-terminated), and wait until it answers. Aborts the
 * test (ck_abort), with its exit status and the end of its log, if it exits
 * first or does not answer within itest_start_timeout_ms().
 */
void daemon_start(struct daemon *d, const char *const *extra_args);
/* The NULL-ended argument list daemon_start and daemon_restart take, written inline: ITEST_ARGS("--budget", "1G"). */
#define ITEST_ARGS(...) ((const char *const[]){ __VA_ARGS__, NULL })
/* Checked fixtures: fn() starts the daemon dmn with the extra arguments args (ITEST_ARGS, or NULL), or stops it. */
#define ITEST_FIXTURE_START(fn, dmn, args)  \
	static void fn(void)                \
	{                                   \
		daemon_start(&(dmn), args); \
	}
#define ITEST_FIXTURE_STOP(fn, dmn)                       \
	static void fn(void)                              \
	{                                                 \
		ck_assert_int_eq(daemon_stop(&(dmn)), 0); \
	}
/*
 * Fixture proc roots for --proc-root: itest_proc_root_copy copies the idle capture (FIXTURES_DIR/proc/idle) into
 * root (made if missing), then runs the shell command then, unless NULL, inside root. itest_proc_root does so in a
 * fresh /tmp/<prefix>.XXXXXX, written to root (size bytes), mode 0755 so the daemon may read other uids' clients
 * under it; itest_proc_root_start then starts d with --proc-root root and extra_args (NULL-ended, or NULL).
 * itest_proc_root_remove removes root, if any, and empties it.
 */
void itest_proc_root_copy(const char *root, const char *then);
void itest_proc_root(char *root, size_t size, const char *prefix, const char *then);
void itest_proc_root_start(struct daemon *d, char *root, size_t size, const char *prefix, const char *then,
			   const char *const *extra_args);
void itest_proc_root_remove(char *root);
/* Start the daemon again in the same dir and on the same socket (after a crash or stop). */
void daemon_restart(struct daemon *d, const char *const *extra_args);
/* daemon_start's first half: a fresh temp dir and the paths in it, nothing started. */
void daemon_prepare(struct daemon *d);
/*
 * daemon_restart, with child_setup(ud) run in the child just before exec, after the
 * environment was cleaned (NOTIFY_SOCKET, LISTEN_FDS unset): a stand-in for a
 * service manager sets its own there (tests/lib/fdstore.h).
 */
void daemon_restart_with(struct daemon *d, const char *const *extra_args, void (*child_setup)(void *ud), void *ud);
/* Whether a daemon on socket_path answers a HELLO now (through a connection of its own). */
bool itest_answers(const char *socket_path);
/*
 * Fork and exec argv (argv[0] found on PATH) with stdout and stderr appended to log and NOTIFY_SOCKET,
 * JOURNAL_STREAM and LISTEN_FDS unset; raise_nofile raises the soft RLIMIT_NOFILE first (for a wrapper such as
 * valgrind), and child_setup(ud), unless NULL, runs just before exec. Returns the child's pid.
 */
pid_t itest_spawn_logged(const char *log, const char *const *argv, bool raise_nofile, void (*child_setup)(void *ud),
			 void *ud);
/*
 * For a child_setup that must not malloc (a fork while another thread is in the allocator can hang the child under
 * GCC 12's sanitizer): made before the fork, this process's environment without NOTIFY_SOCKET, JOURNAL_STREAM,
 * LISTEN_FDS and any name that set (NULL-terminated "NAME=value" strings, kept alive by the caller) gives, then
 * set's strings. The strings are not copied; free the array with free(). itest_env_apply(env), a child_setup,
 * makes it the environment.
 */
char **itest_env_make(char *const *set);
void itest_env_apply(void *env);
/* SIGTERM, wait, and check it exited 0. Returns the exit status (or 128+signal). */
int daemon_stop(struct daemon *d);
/* True while the daemon process is alive. */
bool daemon_alive(const struct daemon *d);
/* Read the daemon's log file into a malloc'd string. */
char *daemon_log(const struct daemon *d);
/*
 * At most the last ITEST_LOG_EXCERPT bytes of text, from a line start, with a note of what was cut (malloc'd;
 * "(none)" for NULL): what goes into a Check message, which Check aborts on past 4 KiB ("Message string too
 * long"), hiding the failure it was to report.
 */
#define ITEST_LOG_EXCERPT 2500
char *itest_excerpt(const char *text);
/* itest_excerpt into a buffer of its own, overwritten by the next call: for a Check message's argument. */
const char *itest_tail(const char *text);
/* itest_excerpt of the daemon's log since its last start (malloc'd). */
char *daemon_log_excerpt(const struct daemon *d);
/*
 * Bound for waiting on the daemon to answer at start, in ms: 30 s, or ITEST_START_TIMEOUT_S, times 4 under a
 * sanitizer build and 10 under a wrapper (valgrind); a loaded machine can take seconds to exec and warm up.
 */
unsigned itest_start_timeout_ms(void);
/* The whole file at path (malloc'd), or NULL. */
char *itest_read_file(const char *path);
/*
 * In a pinctl table (a header line naming col as a word, then rows): the word under col's header
 * in the first row that starts with row_prefix (malloc'd), or NULL without such a row or column.
 */
char *itest_table_cell(const char *table, const char *row_prefix, const char *col);
/* The daemon's status with every lease row, through a connection of its own (free with pb_status_free). */
struct pb_status *itest_status(const char *socket_path);
/*
 * A test's clean end: nothing leased on d within timeout_ms, c (unless NULL) disconnected, and d stopped with
 * exit status 0.
 */
void itest_end_clean(struct daemon *d, pb_client *c, int timeout_ms);
/* c's status calls, every 20 ms, until one is answered (after a restart: the library reconnects and re-declares
 * its leases on the way); whether one was within timeout_ms. Asserts nothing: child processes call it too. */
bool itest_wait_answered(pb_client *c, int timeout_ms);
/* The lease row of id in s, or NULL; it lives as long as s. */
const struct pb_lease_info *itest_lease_row(const struct pb_status *s, uint64_t id);

/*
 * fork() for test children. The child gets default SIGTERM/SIGINT handling back:
 * Check's runner handlers, inherited through its fork, would otherwise kill the
 * whole test's process group when the child is signalled.
 */
pid_t itest_fork(void);
/* pipe() each of a and b that is not NULL, then itest_fork(): the child's pid, or 0 in the child; asserts all of it. */
pid_t itest_fork_piped(int a[2], int b[2]);
/*
 * A child talking both ways, after itest_fork_piped(to, from): in the child, itest_child_ends closes the parent's
 * ends (to[1], from[0]); in the parent, itest_parent_ends closes the child's (to[0], from[1]) and makes its own
 * close-on-exec, so that a daemon the test starts later does not keep to[1] open and the child sees the end of
 * to when the test closes it.
 */
void itest_child_ends(int to[2], int from[2]);
void itest_parent_ends(int to[2], int from[2]);
/* A test program run on pipes (itest-prog.c): its pid, its stdin (closing it lets it finish) and its stdout. */
struct itest_prog {
	pid_t pid;
	int in;
	FILE *out;
};
/*
 * Run argv (argv[0] the program's path) on pipes, its stderr to /dev/null when quiet (a run expected to fail its
 * checks); in the child env(arg) sets the program's environment first. Under ASan the link order check is off.
 */
void itest_prog_start(struct itest_prog *p, const char *const *argv, bool quiet, void (*env)(const void *arg),
		      const void *arg);
/* The next line the program prints (without its newline); fails the test at EOF. */
void itest_prog_read_line(struct itest_prog *p, char *buf, size_t len);
/* Close its stdin, read what is left (the last line into last, when not NULL), and return its exit status. */
int itest_prog_finish(struct itest_prog *p, char *last, size_t len);
/* The number after key in a line the program printed ("bytes=4096": key "bytes="); fails the test without key. */
unsigned long long itest_prog_field(const char *line, const char *key);
/* In a child: tell the parent through the pipe p that it is ready (or _exit(code)), then wait to be killed. */
__attribute__((noreturn)) void itest_child_ready(int p[2], int code);
/* In the parent: wait for itest_child_ready's byte on p, and close both ends. */
void itest_wait_ready(int p[2]);
/*
 * One byte over a pipe between a test and its child: say writes c (or _exit(80)); hear reads one within
 * bound_s seconds (or _exit(81)), so a wedged peer fails the test instead of hanging it.
 */
void itest_say(int fd, char c);
char itest_hear(int fd, unsigned bound_s);
/* A child that holds one lease of size (label may be NULL; no CUDA) until killed: its pid, once the lease is held. */
pid_t itest_hold_lease(const char *socket_path, size_t size, const char *label);
/* Reap child pid (asserting it is ours): its exit status, or 128 + the signal that killed it. */
int itest_wait_exit(pid_t pid);
/* Wait up to timeout_ms for our child (or adopted orphan) pid to end: its wait status, or -1 if it still runs. */
int itest_wait_end(pid_t pid, int timeout_ms);
/*
 * SIGKILL a process we are the parent of (its pid cannot have been reused) and reap it: the signal it died of
 * first, or -1. A fatal signal sent earlier wins: the exit code is fixed when the first one arrives, so a
 * SIGTERM from the daemon shows even after this SIGKILL.
 */
int itest_kill_and_reap(pid_t pid);
/* SIGKILL and reap the child *pid when there is one (> 0), and set *pid to 0: a fixture's teardown. */
void itest_kill_child(pid_t *pid);
/*
 * In Prometheus text (the metrics file, node_exporter's page): the value of the sample line that starts with
 * name (labels included), or -1.
 */
double itest_metrics_sample(const char *text, const char *name);
/* In a child: become uid (and the same-numbered gid) with no supplementary groups, or _exit(90). */
void itest_drop_to(uid_t uid);

/*
 * A world-reachable copy of path (0755), for other uids to exec: uids 61001/61002 and nobody cannot reach a
 * build tree under a 0700 folder (a clone in /root). The first call makes one temp folder under /tmp (0755) and
 * stages libpinbroker there too under its soniname, where the build tree's pinctl finds it ($ORIGIN in its
 * build RPATH); the folder is removed when the process that made it exits. Returns a path that lives as long
 * as the process, or aborts the test.
 */
const char *itest_stage(const char *path);
/* The same, staged as relpath inside that folder (its folders made 0755): for programs whose run paths are
 * relative to $ORIGIN and need their neighbours' layout. */
const char *itest_stage_as(const char *path, const char *relpath);
/* pinctl, staged for other uids. */
#define ITEST_PINCTL_FOR_OTHERS itest_stage(PINCTL_PATH)

/*
 * Raise this process's soft RLIMIT_NOFILE to want (root may raise the hard limit too), before the daemon starts,
 * so that it, and valgrind around it, inherit the room: a root shell's soft limit is 1024. Returns 0, or -EMFILE
 * where the hard limit is below want and cannot be raised; the reason is in itest_nofile_why.
 */
int itest_need_fds(rlim_t want);
extern char itest_nofile_why[200];
/* itest_need_fds, or fail the test with itest_nofile_why: for tests inside a running TCase. */
void itest_require_fds(rlim_t want);

/* Run a shell command line, capture stdout+stderr into *out (malloc'd). Returns the exit code. */
int run_capture(const char *cmdline, char **out);
/* Run the staged pinctl --socket d->socket ARGS (a shell line) as uid, stdout+stderr into *out (malloc'd).
 * Returns its exit status (127: it could not run). */
int pinctl_as(const struct daemon *d, uid_t uid, char **out, const char *args);
/* Run pinctl --socket d->socket ARGS..., capture output. Returns the exit code. */
int pinctl(const struct daemon *d, char **out, const char *args_fmt, ...) __attribute__((format(printf, 3, 4)));
/*
 * pinctl ARGS (a plain shell line, no format) must exit want_exit with each of the NULL-ended strings after args
 * in its output; the failing one is named with the output's end.
 */
void itest_pinctl_says(const struct daemon *d, int want_exit, const char *args, ...) __attribute__((sentinel));

/* Raw protocol, for hostile-input tests. */
int raw_connect(const char *socket_path); /* SOCK_SEQPACKET fd, blocking, or -1 */
int raw_hello(int fd);                    /* HELLO v1; returns reply status or -errno */
int raw_status(int fd);                   /* STATUS; returns reply status or -errno */
/*
 * Send req (with has_seq/seq set to seq), receive one reply within timeout_ms and
 * return its status, or -errno (-EPIPE when the send fails). Any fds that come
 * with the reply are closed; its message is copied into msg when msg != NULL.
 */
int raw_call(int fd, Pinbroker__V1__Request *req, uint64_t seq, char *msg, size_t msglen, int timeout_ms);
int raw_hello_as(int fd, const char *client_name); /* HELLO v1 as client_name (seq 1, 5 s); status or -errno */
/* RELEASE lease_id; status or -errno. raw_release uses seq 9 and a 5 s timeout. */
int raw_release_seq(int fd, uint64_t lease_id, uint64_t seq, int timeout_ms);
int raw_release(int fd, uint64_t lease_id);
int raw_set_idle(int fd, uint64_t lease_id, bool idle);          /* SET_IDLE (seq 11, 5 s); status or -errno */
int raw_admin_revoke(int fd, uint64_t lease_id, int timeout_ms); /* ADMIN_REVOKE one id (seq 5); status or -errno */
int raw_revoke_ack(int fd, uint64_t lease_id);                   /* REVOKE_ACK (seq 9, 5 s); status or -errno */
/* ACQUIRE size (label may be NULL); the granted fds are closed at once. Status or -errno; the message in msg. */
int raw_acquire_msg(int fd, uint64_t size, const char *label, uint64_t seq, char *msg, size_t msglen, int timeout_ms);
int raw_send(int fd, const Pinbroker__V1__Request *req, const int *fds, size_t nfds);
/* Receive one Reply with up to max_fds fds; timeout_ms bounds the wait. NULL on EOF/error/timeout (*err says which). */
Pinbroker__V1__Reply *raw_recv(int fd, int *fds, size_t max_fds, size_t *nfds, int timeout_ms, int *err);
/* Acquire via raw protocol; fills fds (all batches). Returns status code, or -errno. */
int raw_acquire(int fd, uint64_t size, uint64_t *lease_id, int *fds, size_t max_fds, size_t *nfds);
/* A fresh raw connection (HELLO done) that holds one lease of size bytes (id in *lease_id; its fds closed, so only
 * the connection holds it); returns the connection's fd; aborts the test when any step fails. */
int raw_lease_held(const char *socket_path, uint64_t size, uint64_t *lease_id);
/* raw_acquire with Acquire.flags (PINBROKER__V1__ACQUIRE_FLAG__*). */
int raw_acquire_flags(int fd, uint64_t size, uint32_t flags, uint64_t *lease_id, int *fds, size_t max_fds,
		      size_t *nfds);
/* True if the peer closed the connection within timeout_ms. */
bool raw_closed_by_peer(int fd, int timeout_ms);

/* Status fields via libpinbroker. Returns -1 on failure. */
int64_t status_leased(const char *socket_path);
int64_t status_pool(const char *socket_path);
/* Poll until leased == want or timeout; returns the last value seen. */
int64_t wait_leased(const char *socket_path, int64_t want, int timeout_ms);

/* CLOCK_MONOTONIC in ms: for tests that bound how long something took. */
uint64_t itest_now_ms(void);
/* Poll the daemon's waiting_acquires until it equals want or timeout_ms pass; returns the last value seen
 * (UINT32_MAX when the daemon never answered). The event a queued acquire is waited on by, not a sleep. */
uint32_t wait_waiting_acquires(const char *socket_path, uint32_t want, int timeout_ms);
/* Poll the daemon's log since its last start until it contains needle: true, or false after timeout_ms. */
bool daemon_wait_log(const struct daemon *d, const char *needle, int timeout_ms);
/*
 * Poll the daemon's status until its uptime_ms reaches uptime_ms: true, or false after timeout_ms. For a timer
 * the daemon runs from its start (redeclare-grace-ms): the daemon's own clock says when it has passed.
 */
bool wait_daemon_uptime(const char *socket_path, uint64_t uptime_ms, int timeout_ms);

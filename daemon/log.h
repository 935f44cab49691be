/* SPDX-License-Identifier: MIT */
/* Logging in OpenNTPD's vocabulary: to the journal under systemd, to stderr otherwise. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <syslog.h>

/* The only globals besides signal flags: the threshold (LOG_DEBUG..LOG_ERR). */
extern int log_level;

/* use_journal: 1 forces the journal, 0 forces stderr, -1 decides from $JOURNAL_STREAM. */
void log_init(int level, int use_journal);
int log_level_from_string(const char *s); /* "debug", "info", ... or -1 */

void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* appends strerror(errno) */
void log_warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn)); /* with strerror(errno) */
void fatalx(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/*
 * Kinds of structured event. Each has a fixed MESSAGE_ID (documented in
 * systemd/pinbroker.catalog) and is rate-limited per kind.
 */
enum log_event_kind {
	EV_LEASE_GRANTED,
	EV_LEASE_REFUSED,
	EV_LEASE_RELEASED,
	EV_LEASE_REVOKED,
	EV_LEASE_OVERDUE,
	EV_PRESSURE_TRANSITION,
	EV_CLIENT_DIED,
	EV_CONFIG_RELOADED,
	EV_PROTOCOL_ERROR,
	EV_MEMORY_PUNCHED,   /* a holder freed pinned pages with fallocate(PUNCH_HOLE) */
	EV_REVOKE_CANCELLED, /* a never-revoked lease's revoke cancelled: taken back from a cache, or not given back */
	EV__MAX,
};

/*
 * Log one event with its MESSAGE_ID and the PINBROKER_LEASE=/UID=/PID= fields
 * (pass 0 / (uid_t)-1 / 0 to leave a field out). priority is a syslog level.
 */
void log_event(enum log_event_kind kind, int priority, uint64_t lease_id, uid_t uid, pid_t pid, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));

/* The MESSAGE_ID string (32 hex digits) of a kind, for tests and the catalog. */
const char *log_event_message_id(enum log_event_kind kind);
/* The kind's name, as PINBROKER_EVENT= carries it ("lease-granted"). */
const char *log_event_kind_name(enum log_event_kind kind);

/*
 * The per-kind rate limiter behind log_event, exposed so tests can drive it
 * with their own clock: at most LOG_RATELIMIT_BURST events of one kind pass in
 * each LOG_RATELIMIT_WINDOW_US window; the rest are counted as suppressed.
 * log_ratelimit_pass returns whether an event of kind at now_us may be logged;
 * when it opens a new window it sets *suppressed (may be NULL) to the count the
 * previous window suppressed and not yet flushed, else 0.
 * log_ratelimit_flush returns that count for a window that has ended by now_us
 * (and forgets it), else 0; log_event flushes every kind on each call.
 */
#define LOG_RATELIMIT_BURST 20
#define LOG_RATELIMIT_WINDOW_US 5000000
bool log_ratelimit_pass(enum log_event_kind kind, uint64_t now_us, unsigned *suppressed);
unsigned log_ratelimit_flush(enum log_event_kind kind, uint64_t now_us);

/* SPDX-License-Identifier: MIT */
/* Logging in OpenNTPD's vocabulary: to the journal under systemd, to stderr otherwise. */
#pragma once

#include <stdint.h>
#include <sys/types.h>
#include <syslog.h>

/* The only globals besides signal flags: the threshold (LOG_DEBUG..LOG_ERR). */
extern int log_level;

/* use_journal: 1 forces the journal, 0 forces stderr, -1 decides from $JOURNAL_STREAM. */
void log_init(int level, int use_journal);
int log_level_from_string(const char *s); /* "debug", "info", ... or -1 */

void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));  /* appends strerror(errno) */
void log_warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));  /* with strerror(errno) */
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
	EV__MAX,
};

/*
 * Log one event with its MESSAGE_ID and the PINBROKER_LEASE=/UID=/PID= fields
 * (pass 0 / (uid_t)-1 / 0 to leave a field out). priority is a syslog level.
 */
void log_event(enum log_event_kind kind, int priority, uint64_t lease_id, uid_t uid, pid_t pid,
	       const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* The MESSAGE_ID string (32 hex digits) of a kind, for tests and the catalog. */
const char *log_event_message_id(enum log_event_kind kind);

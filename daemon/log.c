/* SPDX-License-Identifier: MIT */
/* Logging to the journal (with structured lease fields) under systemd, or to stderr, with per-kind rate limits. */
#define _GNU_SOURCE
#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <systemd/sd-journal.h>

#include "util.h"

#define IDENT "pinbrokerd"
/* Longer messages are cut: a log line that long is a bug, and the stack buffer keeps logging allocation-free. */
#define MSG_MAX 2048

int log_level = LOG_INFO;

static bool to_journal;

/*
 * MESSAGE_IDs are fixed forever (generated once with `systemd-id128 new`):
 * journalctl -x looks them up in systemd/pinbroker.catalog, and admins filter on them.
 */
static const struct {
	const char *name;
	const char *id;
} events[EV__MAX] = {
	[EV_LEASE_GRANTED] = { "lease-granted", "a6e7a6a735a2449fa8b5dd36df35b42b" },
	[EV_LEASE_REFUSED] = { "lease-refused", "150d29248ad84739a0c2022e1f90900e" },
	[EV_LEASE_RELEASED] = { "lease-released", "ca1db0058fc048f5b95ce90ae64ecd68" },
	[EV_LEASE_REVOKED] = { "lease-revoked", "4bf3a53c5900414e99e41be18234394b" },
	[EV_LEASE_OVERDUE] = { "lease-overdue", "a7dfcf0225584286876d4c6785ec4dae" },
	[EV_PRESSURE_TRANSITION] = { "pressure-transition", "6240826df0a74aa4ab2f9a146d411f31" },
	[EV_CLIENT_DIED] = { "client-died", "df571f49930f412482485059089b49d4" },
	[EV_CONFIG_RELOADED] = { "config-reloaded", "4c3cedd37ef44a0b95a77f34ec2bced1" },
	[EV_PROTOCOL_ERROR] = { "protocol-error", "e001fcf90bf844d58fb941eb2e79d1ec" },
	[EV_MEMORY_PUNCHED] = { "memory-punched", "3e5e21b1c2f24a74b17ce73761826c27" },
	[EV_REVOKE_CANCELLED] = { "revoke-cancelled", "9b33bdd820ad4e1da7373c8e1ad69935" },
};

/* One window per kind: a storm of one kind (refusals under pressure) must not hide the others. */
static struct ratelimit {
	uint64_t start_us;
	unsigned passed;
	unsigned suppressed;
	bool open;
} limits[EV__MAX];
/* Pool prewarm threads may log; the limiter state is the only shared thing to guard. */
static pthread_mutex_t limits_lock = PTHREAD_MUTEX_INITIALIZER;

static const struct {
	const char *name;
	int level;
} level_names[] = {
	{ "debug", LOG_DEBUG },  { "info", LOG_INFO }, { "notice", LOG_NOTICE }, { "warning", LOG_WARNING },
	{ "warn", LOG_WARNING }, { "err", LOG_ERR },   { "error", LOG_ERR },
};

int log_level_from_string(const char *s)
{
	if (!s)
		return -1;
	for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++)
		if (strcasecmp(s, level_names[i].name) == 0)
			return level_names[i].level;
	return -1;
}

/* systemd sets $JOURNAL_STREAM to the dev:ino of the stream it connected to stderr (systemd.exec(5)). */
static bool stderr_is_journal(void)
{
	unsigned long long dev, ino;
	const char *e = getenv("JOURNAL_STREAM");
	struct stat st;
	int n = 0;

	if (!e || sscanf(e, "%llu:%llu%n", &dev, &ino, &n) != 2 || e[n] != '\0')
		return false;
	if (fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void log_init(int level, int use_journal)
{
	if (level < LOG_EMERG)
		level = LOG_EMERG;
	if (level > LOG_DEBUG)
		level = LOG_DEBUG;
	log_level = level;
	to_journal = use_journal == 1 || (use_journal == -1 && stderr_is_journal());
}

static const char *stderr_prefix(int priority)
{
	if (priority <= LOG_CRIT)
		return "fatal: ";
	if (priority == LOG_ERR)
		return "error: ";
	if (priority == LOG_WARNING)
		return "warning: ";
	return "";
}

/* Optional journal fields of one message; NULL/0 leaves a field out. */
struct fields {
	const char *message_id;
	const char *event;
	uint64_t lease_id;
	uid_t uid;
	pid_t pid;
	unsigned suppressed;
};

static void emit(int priority, const struct fields *fl, const char *msg)
{
	char f_msg[MSG_MAX + 16], f_prio[32], f_id[64], f_ev[64], f_lease[64], f_uid[64], f_pid[64], f_sup[64];
	struct iovec iov[9];
	size_t n = 0;

	if (to_journal) {
#define ADD(buf, ...)                                                                      \
	do {                                                                               \
		int len_ = snprintf(buf, sizeof(buf), __VA_ARGS__);                        \
		iov[n].iov_base = buf;                                                     \
		iov[n].iov_len = len_ < (int)sizeof(buf) ? (size_t)len_ : sizeof(buf) - 1; \
		n++;                                                                       \
	} while (0)
		ADD(f_msg, "MESSAGE=%s", msg);
		ADD(f_prio, "PRIORITY=%d", priority);
		iov[n].iov_base = (void *)"SYSLOG_IDENTIFIER=" IDENT;
		iov[n].iov_len = strlen("SYSLOG_IDENTIFIER=" IDENT);
		n++;
		if (fl && fl->message_id)
			ADD(f_id, "MESSAGE_ID=%s", fl->message_id);
		if (fl && fl->event)
			ADD(f_ev, "PINBROKER_EVENT=%s", fl->event);
		if (fl && fl->lease_id)
			ADD(f_lease, "PINBROKER_LEASE=%" PRIu64, fl->lease_id);
		if (fl && fl->uid != (uid_t)-1)
			ADD(f_uid, "PINBROKER_UID=%u", (unsigned)fl->uid);
		if (fl && fl->pid > 0)
			ADD(f_pid, "PINBROKER_PID=%d", (int)fl->pid);
		if (fl && fl->suppressed)
			ADD(f_sup, "PINBROKER_SUPPRESSED=%u", fl->suppressed);
#undef ADD
		/* If journald is gone (stopped, or a test forced it on), the line still goes somewhere. */
		if (sd_journal_sendv(iov, (int)n) >= 0)
			return;
	}
	fprintf(stderr, IDENT ": %s%s\n", stderr_prefix(priority), msg);
}

/* Formats fmt (plus ": strerror" when errnum), drops trailing newlines, and emits it. */
static void vlog(int priority, int errnum, const struct fields *fl, const char *fmt, va_list ap)
	__attribute__((format(printf, 4, 0)));
static void vlog(int priority, int errnum, const struct fields *fl, const char *fmt, va_list ap)
{
	char msg[MSG_MAX];
	size_t len;
	int r;

	r = vsnprintf(msg, sizeof(msg), fmt, ap);
	len = r < 0 ? 0 : (size_t)r < sizeof(msg) ? (size_t)r : sizeof(msg) - 1;
	msg[len] = '\0';
	while (len > 0 && msg[len - 1] == '\n')
		msg[--len] = '\0';
	if (errnum)
		snprintf(msg + len, sizeof(msg) - len, ": %s", strerror(errnum));
	emit(priority, fl, msg);
}

/* Each entry point checks the threshold first so a suppressed debug line costs no formatting. */
#define LOG_BODY(priority, errnum)                     \
	do {                                           \
		va_list ap;                            \
		if ((priority) > log_level)            \
			return;                        \
		va_start(ap, fmt);                     \
		vlog(priority, errnum, NULL, fmt, ap); \
		va_end(ap);                            \
	} while (0)

void log_warn(const char *fmt, ...)
{
	int saved = errno;

	LOG_BODY(LOG_WARNING, saved);
	errno = saved;
}

void log_warnx(const char *fmt, ...)
{
	LOG_BODY(LOG_WARNING, 0);
}

void log_info(const char *fmt, ...)
{
	LOG_BODY(LOG_INFO, 0);
}

void log_debug(const char *fmt, ...)
{
	LOG_BODY(LOG_DEBUG, 0);
}

void fatal(const char *fmt, ...)
{
	int saved = errno;
	va_list ap;

	va_start(ap, fmt);
	vlog(LOG_CRIT, saved, NULL, fmt, ap);
	va_end(ap);
	exit(1);
}

void fatalx(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(LOG_CRIT, 0, NULL, fmt, ap);
	va_end(ap);
	exit(1);
}

const char *log_event_message_id(enum log_event_kind kind)
{
	if ((unsigned)kind >= EV__MAX)
		return NULL;
	return events[kind].id;
}

const char *log_event_kind_name(enum log_event_kind kind)
{
	if ((unsigned)kind >= EV__MAX)
		return "unknown";
	return events[kind].name;
}

unsigned log_ratelimit_flush(enum log_event_kind kind, uint64_t now_us)
{
	struct ratelimit *rl;
	unsigned n;

	if ((unsigned)kind >= EV__MAX)
		return 0;
	rl = &limits[kind];
	if (!rl->open || rl->suppressed == 0 || now_us - rl->start_us < LOG_RATELIMIT_WINDOW_US)
		return 0;
	n = rl->suppressed;
	rl->suppressed = 0;
	return n;
}

bool log_ratelimit_pass(enum log_event_kind kind, uint64_t now_us, unsigned *suppressed)
{
	struct ratelimit *rl;

	if (suppressed)
		*suppressed = 0;
	if ((unsigned)kind >= EV__MAX)
		return true;
	rl = &limits[kind];
	if (!rl->open || now_us - rl->start_us >= LOG_RATELIMIT_WINDOW_US) {
		if (suppressed)
			*suppressed = rl->suppressed;
		rl->open = true;
		rl->start_us = now_us;
		rl->passed = 1;
		rl->suppressed = 0;
		return true;
	}
	if (rl->passed < LOG_RATELIMIT_BURST) {
		rl->passed++;
		return true;
	}
	rl->suppressed++;
	return false;
}

static void report_suppressed(enum log_event_kind kind, unsigned n)
{
	struct fields fl = { .event = events[kind].name, .uid = (uid_t)-1, .suppressed = n };
	char msg[128];

	snprintf(msg, sizeof(msg), "%u messages of kind %s suppressed", n, events[kind].name);
	emit(LOG_NOTICE, &fl, msg);
}

void log_event(enum log_event_kind kind, int priority, uint64_t lease_id, uid_t uid, pid_t pid, const char *fmt, ...)
{
	unsigned counts[EV__MAX] = { 0 }, mine = 0;
	struct fields fl;
	uint64_t now;
	va_list ap;
	bool pass;

	if (priority > log_level || (unsigned)kind >= EV__MAX)
		return;
	now = now_us();
	/* Flush every kind here, so a burst that stopped still gets its count reported. */
	pthread_mutex_lock(&limits_lock);
	for (int k = 0; k < EV__MAX; k++)
		counts[k] = log_ratelimit_flush((enum log_event_kind)k, now);
	pass = log_ratelimit_pass(kind, now, &mine);
	pthread_mutex_unlock(&limits_lock);
	counts[kind] += mine;

	for (int k = 0; k < EV__MAX; k++)
		if (counts[k])
			report_suppressed((enum log_event_kind)k, counts[k]);
	if (!pass)
		return;

	fl = (struct fields){
		.message_id = events[kind].id,
		.event = events[kind].name,
		.lease_id = lease_id,
		.uid = uid,
		.pid = pid,
	};
	va_start(ap, fmt);
	vlog(priority, 0, &fl, fmt, ap);
	va_end(ap);
}

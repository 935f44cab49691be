/* SPDX-License-Identifier: MIT */
/* The quota rules file's text: the SET rules written out and read back (quota-rules.h). */
#define _GNU_SOURCE
#include "quota-rules.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A line longer than any this daemon writes is not one of its rules. */
#define LINE_MAX_BYTES (JOBS_PATH_MAX + 32)
/* Words on a rule line: pattern, bytes, and "seen"; one more shows there are too many. */
#define WORDS_MAX 4

int quota_rules_format(const struct jobs *j, const char *boot_id, char **ret, size_t *len)
{
	size_t n = jobs_rule_count(j), nset = 0, cap, at;
	char *text;

	for (size_t i = 0; i < n; i++)
		nset += jobs_rule_at(j, i)->source == JOB_RULE_SET;
	*ret = NULL;
	*len = 0;
	cap = nset ? 256 + nset * (JOBS_PATH_MAX + 32) : 1;
	text = malloc(cap);
	if (!text)
		return -ENOMEM;
	text[0] = '\0';
	at = 0;
	if (nset) {
		at = (size_t)snprintf(text, cap, "%s %d\n", QUOTA_RULES_MAGIC, QUOTA_RULES_FORMAT);
		/* The boot it was written in: no cgroup, so no job, outlives a reboot (quota_rules_load). */
		if (boot_id && *boot_id && strlen(boot_id) < QUOTA_RULES_BOOT_ID_MAX)
			at += (size_t)snprintf(text + at, cap - at, "boot %s\n", boot_id);
		at += (size_t)snprintf(text + at, cap - at,
				       "# PATTERN BYTES [seen]: set by pinctl quota set, written by pinbrokerd; "
				       "change them with pinctl quota set and clear\n");
	}
	for (size_t i = 0; i < n; i++) {
		const struct job_rule *r = jobs_rule_at(j, i);

		if (r->source != JOB_RULE_SET)
			continue;
		/* A pattern is shorter than JOBS_PATH_MAX (jobs_path_check), so each line fits its share of cap. */
		at += (size_t)snprintf(text + at, cap - at, "%s %" PRIu64 "%s\n", r->pattern, r->bytes,
				       r->literal && r->seen ? " seen" : "");
	}
	*ret = text;
	*len = at;
	return 0;
}

/* A decimal number of bytes, digits only. Returns 0 or -EINVAL (empty, another character, or over 2^64 - 1). */
static int parse_bytes(const char *s, uint64_t *ret)
{
	uint64_t v = 0;

	if (!*s)
		return -EINVAL;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -EINVAL;
		if (v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
			return -EINVAL;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*ret = v;
	return 0;
}

/* Split line (NUL-terminated, written into) at blanks: up to max words; returns how many there were (max at most). */
static size_t split_words(char *line, char **words, size_t max)
{
	size_t n = 0;

	for (char *p = line; *p && n < max;) {
		p += strspn(p, " \t");
		if (!*p)
			break;
		words[n++] = p;
		p += strcspn(p, " \t");
		if (*p)
			*p++ = '\0';
	}
	return n;
}

static void warnf(quota_rules_warn_fn warn, void *ctx, unsigned line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void warnf(quota_rules_warn_fn warn, void *ctx, unsigned line, const char *fmt, ...)
{
	char what[LINE_MAX_BYTES + 160];
	va_list ap;

	if (!warn)
		return;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	warn(ctx, line, what);
}

/* Whether j has a SET rule of pattern already (one an earlier line set). */
static bool has_set_rule(const struct jobs *j, const char *pattern)
{
	for (size_t i = 0; i < jobs_rule_count(j); i++) {
		const struct job_rule *r = jobs_rule_at(j, i);

		if (r->source == JOB_RULE_SET && strcmp(r->pattern, pattern) == 0)
			return true;
	}
	return false;
}

/* One rule line (NUL-terminated, no newline): 1 when a rule was added, 0 when skipped (warned), or -ENOMEM. */
static int load_line(struct jobs *j, char *line, unsigned lineno, quota_rules_warn_fn warn, void *ctx)
{
	char *w[WORDS_MAX];
	const char *why = NULL;
	uint64_t bytes;
	bool seen = false, again;
	size_t n = split_words(line, w, WORDS_MAX);
	int r;

	if (n < 2) {
		warnf(warn, ctx, lineno, "'%.80s' is not PATTERN BYTES; skipped", n ? w[0] : "");
		return 0;
	}
	if (n > 3) {
		warnf(warn, ctx, lineno, "more words than PATTERN BYTES [seen] (the fourth is '%.40s'); skipped", w[3]);
		return 0;
	}
	if (jobs_path_check(w[0], true, &why) < 0) {
		warnf(warn, ctx, lineno, "'%.80s' is not a cgroup pattern (%s); skipped", w[0], why);
		return 0;
	}
	if (parse_bytes(w[1], &bytes) < 0) {
		warnf(warn, ctx, lineno, "'%.40s' is not a number of bytes; skipped", w[1]);
		return 0;
	}
	if (n == 3) {
		if (strcmp(w[2], "seen") != 0) {
			warnf(warn, ctx, lineno, "'%.40s' is not 'seen'; skipped", w[2]);
			return 0;
		}
		seen = true;
	}
	again = has_set_rule(j, w[0]);
	r = jobs_rule_restore(j, w[0], bytes, seen, &why);
	if (r == -ENOMEM)
		return r;
	if (r < 0) {
		warnf(warn, ctx, lineno, "%s: %s; skipped", w[0], why ? why : "refused");
		return 0;
	}
	if (again)
		warnf(warn, ctx, lineno, "a second rule for %s: this line's replaces the earlier one", w[0]);
	return again ? 0 : 1;
}

int quota_rules_load(struct jobs *j, const char *text, size_t len, const char *boot_id, quota_rules_warn_fn warn,
		     void *ctx)
{
	const char *p = text, *end = text + len;
	char line[LINE_MAX_BYTES + 1];
	unsigned lineno = 0;
	int added = 0;

	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		int r;

		lineno++;
		p += n + (nl ? 1 : 0);
		if (n > LINE_MAX_BYTES) {
			warnf(warn, ctx, lineno, "a line of %zu bytes, longer than any rule; skipped", n);
			continue;
		}
		memcpy(line, p - n - (nl ? 1 : 0), n);
		line[n] = '\0';
		if (strlen(line) != n) {
			warnf(warn, ctx, lineno, "the line holds a NUL byte; skipped");
			continue;
		}
		if (lineno == 1) {
			size_t m = strlen(QUOTA_RULES_MAGIC);
			int format;

			if (strncmp(line, QUOTA_RULES_MAGIC, m) == 0 && (line[m] == ' ' || line[m] == '\t')) {
				if (sscanf(line + m, "%d", &format) != 1 || format != QUOTA_RULES_FORMAT) {
					warnf(warn, ctx, lineno,
					      "'%.60s' names a format this pinbrokerd does not read (it reads %d); no "
					      "rule of this file is loaded",
					      line, QUOTA_RULES_FORMAT);
					return -EPROTONOSUPPORT;
				}
				continue;
			}
			warnf(warn, ctx, lineno, "no '%s %d' header; reading the rules anyway", QUOTA_RULES_MAGIC,
			      QUOTA_RULES_FORMAT);
		}
		if (lineno == 2 && strncmp(line, "boot ", 5) == 0) {
			/* Checked before any rule is added, so a file of another boot adds none. */
			if (boot_id && *boot_id && strcmp(line + 5, boot_id) != 0) {
				warnf(warn, ctx, lineno,
				      "written before a reboot (boot %.40s, now %.40s): its rules were for the jobs of "
				      "that boot, none is loaded (rules for every boot belong in job-quota)",
				      line + 5, boot_id);
				return -ESTALE;
			}
			continue;
		}
		if (line[strspn(line, " \t")] == '\0' || line[strspn(line, " \t")] == '#')
			continue;
		r = load_line(j, line, lineno, warn, ctx);
		if (r < 0) {
			jobs_regroup(j);
			return r;
		}
		added += r;
	}
	/* Once for all: a regroup per rule made 1024 rules take seconds. */
	jobs_regroup(j);
	return added;
}

/* SPDX-License-Identifier: MIT */
/*
 * One key's value in pinbrokerd's config: text checked against the key's type and bounds into its field of
 * struct config (the setters, with messages that say what to write), and a field back to the text the
 * config file spells. Knows keys, not the table (config-int.h says who calls whom).
 */
#define _GNU_SOURCE /* vasprintf */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>

#include "config-int.h"
#include "jobs.h"
#include "log.h"
#include "util.h"

static const struct {
	int level;
	const char *name;
} level_names[] = {
	{ LOG_ERR, "err" },   { LOG_WARNING, "warning" }, { LOG_NOTICE, "notice" },
	{ LOG_INFO, "info" }, { LOG_DEBUG, "debug" },
};

/* Sets *err (when asked for) and returns r, so error paths stay one line. */
int config_fail(char **err, int r, const char *fmt, ...)
{
	va_list ap;

	if (!err)
		return r;
	va_start(ap, fmt);
	if (vasprintf(err, fmt, ap) < 0)
		*err = NULL;
	va_end(ap);
	return r;
}

/* A size as the shortest exact text parse_size takes back ("2M", "1536K", "17"). */
void config_size_text(uint64_t v, char *buf, size_t len)
{
	static const struct {
		unsigned shift;
		char suffix;
	} units[] = { { 40, 'T' }, { 30, 'G' }, { 20, 'M' }, { 10, 'K' } };

	for (size_t i = 0; v && i < sizeof(units) / sizeof(units[0]); i++)
		if ((v & ((UINT64_C(1) << units[i].shift) - 1)) == 0) {
			snprintf(buf, len, "%" PRIu64 "%c", v >> units[i].shift, units[i].suffix);
			return;
		}
	snprintf(buf, len, "%" PRIu64, v);
}

/* The shortest decimal that reads back as the same double, so dump output round-trips. */
static void format_double(double v, char *buf, size_t len)
{
	/* %g would write 100 as "1e+02"; whole numbers read better plain. */
	if (v == floor(v) && fabs(v) < 1e15) {
		snprintf(buf, len, "%.0f", v);
		return;
	}
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, len, "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			return;
	}
}

static const char *level_name(int level)
{
	for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++)
		if (level_names[i].level == level)
			return level_names[i].name;
	return "info";
}

/* The value of k in c as config text. */
void config_format_value(const struct config *c, const struct config_key *k, char *buf, size_t len)
{
	const void *p = config_cfield(c, k);

	switch (k->type) {
	case CT_STRING: {
		const char *s = *(char *const *)p;
		/* An empty value is written as "" so it can't be mistaken for a missing one. */
		snprintf(buf, len, "%s", s && *s ? s : "\"\"");
		break;
	}
	case CT_SIZE:
		config_size_text(*(const uint64_t *)p, buf, len);
		break;
	case CT_SIZE_PCT: {
		const struct size_spec *s = p;
		if (s->is_pct) {
			format_double(s->pct, buf, len);
			strncat(buf, "%", len - strlen(buf) - 1);
		} else {
			config_size_text(s->bytes, buf, len);
		}
		break;
	}
	case CT_UINT:
		snprintf(buf, len, "%" PRIu32, *(const uint32_t *)p);
		break;
	case CT_DOUBLE:
		format_double(*(const double *)p, buf, len);
		break;
	case CT_BOOL:
		snprintf(buf, len, "%s", *(const bool *)p ? "yes" : "no");
		break;
	case CT_ENUM:
		snprintf(buf, len, "%s", k->choices[*(const int *)p]);
		break;
	case CT_LOGLEVEL:
		snprintf(buf, len, "%s", level_name(*(const int *)p));
		break;
	}
}

void config_choices_text(const struct config_key *k, char *buf, size_t len)
{
	buf[0] = '\0';
	for (size_t i = 0; k->choices[i]; i++) {
		if (i > 0)
			strncat(buf, ", ", len - strlen(buf) - 1);
		strncat(buf, k->choices[i], len - strlen(buf) - 1);
	}
}

static bool is_absolute_path(const char *s)
{
	return s[0] == '/';
}

/* Checks that belong to one string key and need no other key. */
static int check_string(const struct config_key *k, const char *value, char **err)
{
	if (k->offset == offsetof(struct config, socket_path)) {
		size_t max = sizeof(((struct sockaddr_un *)0)->sun_path);

		if (!is_absolute_path(value))
			return config_fail(err, -EINVAL, "%s: '%s' is not an absolute path; write one starting with /",
					   k->name, value);
		if (strlen(value) >= max)
			return config_fail(err, -ERANGE,
					   "%s: '%s' is too long for a Unix socket; use a path under %zu bytes",
					   k->name, value, max);
	} else if (k->offset == offsetof(struct config, job_quota)) {
		int r = jobs_parse_config(value, 0, NULL, NULL, err);

		if (r < 0)
			return r;
	} else if (k->offset == offsetof(struct config, proc_root) ||
		   (k->offset == offsetof(struct config, restart_state) && value[0])) {
		if (!is_absolute_path(value))
			return config_fail(err, -EINVAL, "%s: '%s' is not an absolute path; write one starting with /",
					   k->name, value);
	}
	for (const char *s = value; *s; s++)
		if (iscntrl((unsigned char)*s))
			return config_fail(err, -EINVAL, "%s: the value contains a control character; remove it",
					   k->name);
	return 0;
}

static int set_size(const struct config_key *k, const char *value, uint64_t *ret, char **err)
{
	char lo[32], hi[32];
	uint64_t v;
	int r;

	config_size_text((uint64_t)k->min, lo, sizeof(lo));
	config_size_text((uint64_t)k->max, hi, sizeof(hi));
	r = parse_size(value, &v);
	if (r == -EINVAL)
		return config_fail(err, r,
				   "%s: '%s' is not a size; write a number with an optional K, M, G or T suffix",
				   k->name, value);
	if (r < 0 || (double)v < k->min || (double)v > k->max)
		return config_fail(err, -ERANGE, "%s: '%s' is out of range; write a size from %s to %s", k->name, value,
				   lo, hi);
	if (v % PAGE_BYTES != 0)
		return config_fail(err, -EINVAL, "%s: '%s' is not a multiple of 4K (the page size); round it", k->name,
				   value);
	*ret = v;
	return 0;
}

static int set_spec(const struct config_key *k, const char *value, struct size_spec *ret, char **err)
{
	struct size_spec s = { 0 };
	int r;

	r = parse_size_or_pct(value, &s.bytes, &s.pct, &s.is_pct);
	if (r == -ERANGE && strchr(value, '%'))
		return config_fail(err, r, "%s: '%s' is out of range; a percentage must be from 0%% to 100%%", k->name,
				   value);
	if (r == -ERANGE)
		return config_fail(err, r, "%s: '%s' is too large for a size; write at most 16777215T", k->name, value);
	if (r < 0)
		return config_fail(err, r,
				   "%s: '%s' is not a size; write a number with an optional K, M, G or T suffix, "
				   "or a percentage like 25%%",
				   k->name, value);
	*ret = s;
	return 0;
}

/* Digits only: strtoul would take "-1" and " 5" and wrap or skip them silently. */
static int set_uint(const struct config_key *k, const char *value, uint32_t *ret, char **err)
{
	unsigned long long v;
	char *end;

	if (!isdigit((unsigned char)value[0]))
		goto bad;
	errno = 0;
	v = strtoull(value, &end, 10);
	if (*end)
		goto bad;
	if (errno == ERANGE || (double)v < k->min || (double)v > k->max)
		return config_fail(err, -ERANGE, "%s: '%s' is out of range; write a whole number from %.0f to %.0f",
				   k->name, value, k->min, k->max);
	*ret = (uint32_t)v;
	return 0;
bad:
	return config_fail(err, -EINVAL, "%s: '%s' is not a whole number; write digits only, like %s", k->name, value,
			   k->def);
}

static int set_double(const struct config_key *k, const char *value, double *ret, char **err)
{
	char *end;
	double v;

	/* strtod also takes "inf", "nan" and hex floats; a threshold is plain decimal. */
	if (!isdigit((unsigned char)value[0]) && !(value[0] == '.' && isdigit((unsigned char)value[1])))
		goto bad;
	errno = 0;
	v = strtod(value, &end);
	if (*end || !isfinite(v))
		goto bad;
	if (errno == ERANGE || v < k->min || v > k->max)
		return config_fail(err, -ERANGE, "%s: '%s' is out of range; write a number from %g to %g", k->name,
				   value, k->min, k->max);
	*ret = v;
	return 0;
bad:
	return config_fail(err, -EINVAL, "%s: '%s' is not a number; write a decimal like 10 or 2.5", k->name, value);
}

static int parse_bool(const char *s, bool *ret)
{
	static const char *const yes[] = { "yes", "true", "on", "1" };
	static const char *const no[] = { "no", "false", "off", "0" };

	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*ret = true;
			return 0;
		}
		if (strcasecmp(s, no[i]) == 0) {
			*ret = false;
			return 0;
		}
	}
	return -EINVAL;
}

int config_value_set(struct config *c, const struct config_key *k, const char *value, char **err)
{
	void *p = config_field(c, k);
	int r;

	switch (k->type) {
	case CT_STRING: {
		char *copy;

		r = check_string(k, value, err);
		if (r < 0)
			return r;
		copy = strdup(value);
		if (!copy)
			return config_fail(err, -ENOMEM, "%s: out of memory", k->name);
		free(*(char **)p);
		*(char **)p = copy;
		return 0;
	}
	case CT_SIZE:
		return set_size(k, value, p, err);
	case CT_SIZE_PCT:
		return set_spec(k, value, p, err);
	case CT_UINT:
		return set_uint(k, value, p, err);
	case CT_DOUBLE:
		return set_double(k, value, p, err);
	case CT_BOOL:
		r = parse_bool(value, p);
		if (r < 0)
			return config_fail(
				err, r, "%s: '%s' is not a boolean; write yes or no (true/false, on/off, 1/0 work too)",
				k->name, value);
		return 0;
	case CT_ENUM:
		for (int i = 0; k->choices[i]; i++)
			if (strcasecmp(value, k->choices[i]) == 0) {
				*(int *)p = i;
				return 0;
			}
		{
			char list[128];

			config_choices_text(k, list, sizeof(list));
			return config_fail(err, -EINVAL, "%s: '%s' is not a choice; write one of %s", k->name, value,
					   list);
		}
	case CT_LOGLEVEL:
		r = log_level_from_string(value);
		/* Levels above err would silence the daemon's own errors. */
		if (r < LOG_ERR || r > LOG_DEBUG)
			return config_fail(
				err, -EINVAL,
				"%s: '%s' is not a log level; write one of debug, info, notice, warning, err", k->name,
				value);
		*(int *)p = r;
		return 0;
	}
	return config_fail(err, -EINVAL, "%s: key of unknown type", k->name);
}

/* SPDX-License-Identifier: MIT */
/*
 * pinbrokerd's configuration, loaded: a config's life (new with every embedded default, dup, free), the
 * config file read with file:line errors, where each value came from, the cross-key validation, the copies
 * a reload makes, and the dump. The key table is config-keys.c, one value's text config-value.c, the
 * docs config-doc.c (config-int.h says who calls whom).
 */
#define _GNU_SOURCE /* open_memstream */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config-int.h"
#include "util.h"

int config_set(struct config *c, const char *key, const char *value, char **err)
{
	const struct config_key *k;
	int r;

	if (err)
		*err = NULL;
	if (!c || !key || !value)
		return config_fail(err, -EINVAL, "no key or value given");
	k = config_key_find(key);
	if (!k)
		return config_fail(err, -ENOENT, "unknown key '%s'", key);
	r = config_value_set(c, k, value, err);
	if (r == 0)
		c->origin[k - config_key_table] = CONFIG_ORIGIN_SET;
	return r;
}

void config_free(struct config *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < config_key_count; i++)
		if (config_key_table[i].type == CT_STRING)
			free(*(char **)config_field(c, &config_key_table[i]));
	free(c->file_path);
	free(c);
}

/* Whether s ends with "/" suffix; *head gets the length before that slash. */
static bool ends_with_dir(const char *s, size_t len, const char *suffix, size_t *head)
{
	size_t sl = strlen(suffix);

	if (sl == 0 || len < sl + 1 || strncmp(s + len - sl, suffix, sl) != 0 || s[len - sl - 1] != '/')
		return false;
	*head = len - sl - 1;
	return true;
}

int config_default_path_for(const char *exe, char *out, size_t len)
{
	const char *slash = exe ? strrchr(exe, '/') : NULL;
	size_t dir_len, prefix_len;
	int n;

	if (CONFIG_CONFDIR[0] == '/') /* PINBROKER_CONFDIR: the install put the config there, whatever the prefix */
		n = snprintf(out, len, "%s/pinbrokerd.conf", CONFIG_CONFDIR);
	else if (!slash || CONFIG_SBINDIR[0] == '/' ||
		 !ends_with_dir(exe, (size_t)(slash - exe), CONFIG_SBINDIR, &dir_len))
		n = snprintf(out, len, "%s", CONFIG_DEFAULT_PATH); /* not an installed layout: a build tree */
	else if ((prefix_len = dir_len) == 0 || (prefix_len == 4 && strncmp(exe, "/usr", 4) == 0))
		n = snprintf(out, len, "%s",
			     CONFIG_DEFAULT_PATH); /* the distribution's prefix: /etc, as GNUInstallDirs */
	else if (CONFIG_SYSCONFDIR[0] == '/')
		n = snprintf(out, len, "%s/pinbroker/pinbrokerd.conf", CONFIG_SYSCONFDIR);
	else
		n = snprintf(out, len, "%.*s/%s/pinbroker/pinbrokerd.conf", (int)prefix_len, exe, CONFIG_SYSCONFDIR);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int config_new(struct config **ret)
{
	struct config *c;
	int r;

	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	for (size_t i = 0; i < config_key_count; i++) {
		char *err = NULL;

		r = config_set(c, config_key_table[i].name, config_key_table[i].def, &err);
		free(err);
		if (r < 0) {
			/* Only -ENOMEM can get here: the tests load every default. */
			config_free(c);
			return r == -ENOMEM ? r : -EINVAL;
		}
	}
	memset(c->origin, 0, sizeof(c->origin));
	*ret = c;
	return 0;
}

int config_dup(const struct config *c, struct config **ret)
{
	struct config *d;

	d = malloc(sizeof(*d));
	if (!d)
		return -ENOMEM;
	memcpy(d, c, sizeof(*d));
	/* Clear every string first so config_free is safe whichever strdup fails. */
	for (size_t i = 0; i < config_key_count; i++)
		if (config_key_table[i].type == CT_STRING)
			*(char **)config_field(d, &config_key_table[i]) = NULL;
	d->file_path = NULL;
	if (c->file_path && !(d->file_path = strdup(c->file_path))) {
		config_free(d);
		return -ENOMEM;
	}
	for (size_t i = 0; i < config_key_count; i++) {
		const char *s;

		if (config_key_table[i].type != CT_STRING)
			continue;
		s = *(char *const *)config_cfield(c, &config_key_table[i]);
		if (!s)
			continue;
		*(char **)config_field(d, &config_key_table[i]) = strdup(s);
		if (!*(char **)config_field(d, &config_key_table[i])) {
			config_free(d);
			return -ENOMEM;
		}
	}
	*ret = d;
	return 0;
}

static char *trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		e--;
	*e = '\0';
	return s;
}

/* '#' starts a comment at the start of a line or after whitespace, so "a#b" stays a value. */
static void strip_comment(char *s)
{
	for (char *p = s; *p; p++)
		if (*p == '#' && (p == s || isspace((unsigned char)p[-1]))) {
			*p = '\0';
			return;
		}
}

int config_load_file(struct config *c, const char *path, char **err)
{
	unsigned first_line[CONFIG_MAX_KEYS] = { 0 };
	char *line = NULL, *errbuf = NULL;
	size_t line_cap = 0, errlen = 0;
	unsigned lineno = 0, nerr = 0;
	FILE *f = NULL, *e = NULL;
	int r;

	if (err)
		*err = NULL;
	f = fopen(path, "re");
	if (!f) {
		r = -errno;
		return config_fail(err, r, "%s: cannot open: %s", path, strerror(-r));
	}
	e = open_memstream(&errbuf, &errlen);
	if (!e) {
		r = -ENOMEM;
		goto out;
	}
	free(c->file_path);
	c->file_path = strdup(path);
	if (!c->file_path) {
		r = -ENOMEM;
		goto out;
	}

	while (getline(&line, &line_cap, f) >= 0) {
		char *key, *value, *eq, *msg = NULL;
		const struct config_key *k;
		size_t vlen;

		lineno++;
		strip_comment(line);
		key = trim(line);
		if (!*key)
			continue;
		eq = strchr(key, '=');
		if (!eq) {
			fprintf(e, "%s:%u: expected 'key = value', got '%s'\n", path, lineno, key);
			nerr++;
			continue;
		}
		*eq = '\0';
		key = trim(key);
		value = trim(eq + 1);
		/* Quotes let a value be empty on purpose: admin-group = "" */
		vlen = strlen(value);
		if (vlen >= 2 && value[0] == '"' && value[vlen - 1] == '"') {
			value[vlen - 1] = '\0';
			value++;
		}
		k = config_key_find(key);
		if (!k) {
			const char *hint = config_suggest_key(key);

			if (!*key)
				fprintf(e, "%s:%u: no key before '='\n", path, lineno);
			else if (hint)
				fprintf(e, "%s:%u: unknown key '%s' (did you mean '%s'?)\n", path, lineno, key, hint);
			else
				fprintf(e, "%s:%u: unknown key '%s'; 'pinbrokerd --help' lists the keys\n", path,
					lineno, key);
			nerr++;
			continue;
		}
		if (first_line[k - config_key_table]) {
			fprintf(e, "%s:%u: '%s' already set on line %u\n", path, lineno, k->name,
				first_line[k - config_key_table]);
			nerr++;
			continue;
		}
		first_line[k - config_key_table] = lineno;
		r = config_set(c, key, value, &msg);
		if (r == 0)
			c->origin[k - config_key_table] = lineno;
		if (r == -ENOMEM) {
			free(msg);
			goto out;
		}
		if (r < 0) {
			fprintf(e, "%s:%u: %s\n", path, lineno, msg ? msg : "bad value");
			nerr++;
		}
		free(msg);
	}
	if (ferror(f)) {
		fprintf(e, "%s: read error: %s\n", path, strerror(errno));
		nerr++;
	}
	r = nerr ? -EINVAL : 0;
out:
	if (e && fclose(e) != 0 && r == 0)
		r = -ENOMEM;
	if (r == -EINVAL && err) {
		*err = errbuf;
		errbuf = NULL;
	} else if (r < 0) {
		config_fail(err, r, "%s: out of memory", path);
	}
	free(errbuf);
	free(line);
	fclose(f);
	return r;
}

/* StrictModes lines for path (a folder when is_dir), in the name of the config file, into e. */
static void mode_problem(FILE *e, const char *path, const struct stat *st, bool is_dir, const char *file)
{
	uid_t euid = geteuid();
	mode_t mode = st->st_mode & 07777;
	char what[PATH_MAX + 16];

	if (is_dir)
		snprintf(what, sizeof(what), "its folder %s", path);
	else
		snprintf(what, sizeof(what), "the config file");
	if (st->st_uid != 0 && st->st_uid != euid)
		fprintf(e, "%s: %s is owned by uid %u, who could change the daemon's settings; run chown root %s\n",
			file, what, (unsigned)st->st_uid, path);
	if ((mode & (S_IWGRP | S_IWOTH)) && !(is_dir && (mode & S_ISVTX)))
		fprintf(e,
			"%s: %s is writable by %s (mode %04o), who could change the daemon's settings; run chmod go-w "
			"%s\n",
			file, what,
			(mode & S_IWGRP) && (mode & S_IWOTH) ? "group and others"
			: mode & S_IWOTH                     ? "others"
							     : "its group",
			(unsigned)mode, path);
}

int config_check_file_mode(const char *path, char **warn)
{
	char *real, *slash, *buf = NULL;
	size_t len = 0;
	struct stat st;
	FILE *e;
	int r;

	*warn = NULL;
	/* Check what is actually read: through any symlinks, the file and the folders that hold it. */
	real = realpath(path, NULL);
	if (!real)
		return -errno;
	if (stat(real, &st) < 0) {
		r = -errno;
		free(real);
		return r;
	}
	if (!S_ISREG(st.st_mode)) {
		free(real);
		return 0;
	}
	e = open_memstream(&buf, &len);
	if (!e) {
		free(real);
		return -ENOMEM;
	}
	mode_problem(e, real, &st, false, path);
	while ((slash = strrchr(real, '/'))) {
		if (slash == real)
			slash[1] = '\0';
		else
			*slash = '\0';
		if (stat(real, &st) == 0)
			mode_problem(e, real, &st, true, path);
		if (slash == real)
			break;
	}
	free(real);
	if (fclose(e) != 0) {
		free(buf);
		return -ENOMEM;
	}
	if (len > 0)
		*warn = buf;
	else
		free(buf);
	return 0;
}

/* "path:line: " for a key the file set, else "". */
static void where(const struct config *c, const char *path, const char *key, char *buf, size_t len)
{
	const struct config_key *k = config_key_find(key);
	unsigned line = 0;

	buf[0] = '\0';
	/* Only a value from the file has a line; the environment's and pinctl set's have none. */
	if (path && k && config_source_of(c, k, &line) == CONFIG_SOURCE_FILE)
		snprintf(buf, len, "%s:%u: ", path, line);
}

bool config_is_user_set(const struct config *c, const char *key)
{
	const struct config_key *k = config_key_find(key);

	return k && c->origin[k - config_key_table] != 0;
}

bool config_prewarm_yields(const struct config *c)
{
	return !config_is_user_set(c, "prewarm") && !c->budget.is_pct && !c->prewarm.is_pct &&
	       c->prewarm.bytes > c->budget.bytes;
}

int config_mark_runtime(struct config *c, const char *key)
{
	const struct config_key *k = config_key_find(key);

	if (!k)
		return -ENOENT;
	c->origin[k - config_key_table] = CONFIG_ORIGIN_RUNTIME;
	return 0;
}

int config_mark_env(struct config *c, const char *key)
{
	const struct config_key *k = config_key_find(key);

	if (!k)
		return -ENOENT;
	c->origin[k - config_key_table] = CONFIG_ORIGIN_ENV;
	return 0;
}

enum config_source config_source_of(const struct config *c, const struct config_key *k, unsigned *line)
{
	unsigned o = c->origin[k - config_key_table];

	if (line)
		*line = 0;
	switch (o) {
	case 0:
		return CONFIG_SOURCE_DEFAULT;
	case CONFIG_ORIGIN_SET:
		return CONFIG_SOURCE_COMMAND_LINE;
	case CONFIG_ORIGIN_RUNTIME:
		return CONFIG_SOURCE_SET;
	case CONFIG_ORIGIN_ENV:
		return CONFIG_SOURCE_ENVIRONMENT;
	default:
		if (line)
			*line = o;
		return CONFIG_SOURCE_FILE;
	}
}

const char *config_source_name(enum config_source s)
{
	switch (s) {
	case CONFIG_SOURCE_FILE:
		return "file";
	case CONFIG_SOURCE_ENVIRONMENT:
		return "environment";
	case CONFIG_SOURCE_COMMAND_LINE:
		return "command line";
	case CONFIG_SOURCE_SET:
		return "set";
	case CONFIG_SOURCE_DEFAULT:
	default:
		return "default";
	}
}

const char *config_file_path(const struct config *c)
{
	return c->file_path;
}

/* Copy k's value from src into dst. Returns 0 or -ENOMEM (dst unchanged). */
static int copy_value(struct config *dst, const struct config *src, const struct config_key *k)
{
	if (k->type == CT_STRING) {
		const char *s = *(char *const *)config_cfield(src, k);
		char *copy = strdup(s ? s : "");

		if (!copy)
			return -ENOMEM;
		free(*(char **)config_field(dst, k));
		*(char **)config_field(dst, k) = copy;
	} else {
		/* Every other type is stored inline: the bytes are the value. */
		size_t width = k->type == CT_SIZE_PCT ? sizeof(struct size_spec)
			       : k->type == CT_SIZE   ? sizeof(uint64_t)
			       : k->type == CT_UINT   ? sizeof(uint32_t)
			       : k->type == CT_DOUBLE ? sizeof(double)
			       : k->type == CT_BOOL   ? sizeof(bool)
						      : sizeof(int);

		memcpy(config_field(dst, k), config_cfield(src, k), width);
	}
	return 0;
}

int config_keep_runtime(struct config *dst, const struct config *src,
			void (*note)(const char *key, const char *value, void *ud), void *ud)
{
	for (size_t i = 0; i < config_key_count; i++) {
		char buf[PATH_MAX + 8];

		if (src->origin[i] != CONFIG_ORIGIN_RUNTIME)
			continue;
		if (copy_value(dst, src, &config_key_table[i]) < 0)
			return -ENOMEM;
		dst->origin[i] = CONFIG_ORIGIN_RUNTIME;
		if (note) {
			config_format_value(src, &config_key_table[i], buf, sizeof(buf));
			note(config_key_table[i].name, buf, ud);
		}
	}
	return 0;
}

bool config_key_equal(const struct config *a, const struct config *b, const struct config_key *k)
{
	char va[PATH_MAX + 8], vb[PATH_MAX + 8];

	/* As config text: a size_spec's padding, and a NULL against an empty string, compare equal. */
	config_format_value(a, k, va, sizeof(va));
	config_format_value(b, k, vb, sizeof(vb));
	return strcmp(va, vb) == 0;
}

int config_keep_fixed(struct config *dst, const struct config *src,
		      void (*note)(const char *key, const char *wanted, const char *kept, void *ud), void *ud)
{
	for (size_t i = 0; i < config_key_count; i++) {
		char wanted[PATH_MAX + 8], kept[PATH_MAX + 8];

		if (config_key_table[i].reloadable || config_key_equal(dst, src, &config_key_table[i]))
			continue;
		config_format_value(dst, &config_key_table[i], wanted, sizeof(wanted));
		config_format_value(src, &config_key_table[i], kept, sizeof(kept));
		if (copy_value(dst, src, &config_key_table[i]) < 0)
			return -ENOMEM;
		/* The value kept is the old one, and so is where it came from. */
		dst->origin[i] = src->origin[i];
		if (note)
			note(config_key_table[i].name, wanted, kept, ud);
	}
	return 0;
}

int config_validate(const struct config *c, char **err)
{
	return config_validate_file(c, NULL, err);
}

int config_validate_file(const struct config *c, const char *path, char **err)
{
	char *buf = NULL, a[32], b[32], at[PATH_MAX + 32];
	size_t len = 0;
	unsigned nerr = 0;
	FILE *e;

	if (err)
		*err = NULL;
	e = open_memstream(&buf, &len);
	if (!e)
		return -ENOMEM;
#define AT(key) (where(c, path, key, at, sizeof(at)), at)

	if (c->critical_mem_available_pct > 0 && c->critical_mem_available_pct >= c->tight_mem_available_pct) {
		fprintf(e,
			"%scritical-mem-available-pct (%g) must be below tight-mem-available-pct (%g): "
			"critical is the deeper state\n",
			AT("critical-mem-available-pct"), c->critical_mem_available_pct, c->tight_mem_available_pct);
		nerr++;
	}
	if (c->tight_swapout_pages_s > 0 && c->critical_swapout_pages_s > 0 &&
	    c->critical_swapout_pages_s < c->tight_swapout_pages_s) {
		fprintf(e, "%scritical-swapout-pages-per-s (%g) must not be below tight-swapout-pages-per-s (%g)\n",
			AT("critical-swapout-pages-per-s"), c->critical_swapout_pages_s, c->tight_swapout_pages_s);
		nerr++;
	}
	if (!c->budget.is_pct && !c->prewarm.is_pct && c->prewarm.bytes > c->budget.bytes &&
	    !config_prewarm_yields(c)) {
		fprintf(e, "%sprewarm (%s) is above budget (%s); lower prewarm or raise budget\n", AT("prewarm"),
			format_size(c->prewarm.bytes, a, sizeof(a)), format_size(c->budget.bytes, b, sizeof(b)));
		nerr++;
	}
	if (!c->budget.is_pct && !c->uid_quota.is_pct && c->uid_quota.bytes > c->budget.bytes) {
		fprintf(e, "%suid-quota (%s) is above budget (%s); lower uid-quota, or write it as a percentage\n",
			AT("uid-quota"), format_size(c->uid_quota.bytes, a, sizeof(a)),
			format_size(c->budget.bytes, b, sizeof(b)));
		nerr++;
	}
	if (!c->budget.is_pct && c->budget.bytes > 0 && c->budget.bytes < c->chunk_bytes) {
		fprintf(e, "%sbudget (%s) is smaller than chunk-size (%s), so no lease could be granted\n",
			AT("budget"), format_size(c->budget.bytes, a, sizeof(a)),
			format_size(c->chunk_bytes, b, sizeof(b)));
		nerr++;
	}
	if (c->hugetlb == CONFIG_HUGETLB_YES && c->chunk_bytes % HUGE_PAGE_BYTES != 0) {
		fprintf(e, "%schunk-size (%s) is not a multiple of 2M, which hugetlb = yes needs\n", AT("chunk-size"),
			format_size(c->chunk_bytes, a, sizeof(a)));
		nerr++;
	}
	if (c->max_connections_per_uid > c->max_connections) {
		fprintf(e, "%smax-connections-per-uid (%" PRIu32 ") is above max-connections (%" PRIu32 ")\n",
			AT("max-connections-per-uid"), c->max_connections_per_uid, c->max_connections);
		nerr++;
	}
	/* The kernel refuses a trigger whose stall exceeds its window (kernel/sched/psi.c). */
	if (c->psi_stall_ms > c->psi_window_ms) {
		fprintf(e, "%spsi-stall-ms (%" PRIu32 ") is above psi-window-ms (%" PRIu32 "); the kernel refuses it\n",
			AT("psi-stall-ms"), c->psi_stall_ms, c->psi_window_ms);
		nerr++;
	}
#undef AT

	if (fclose(e) != 0) {
		free(buf);
		return -ENOMEM;
	}
	if (nerr == 0) {
		free(buf);
		return 0;
	}
	/* One message per line, each ending in '\n', like config_load_file's. */
	if (err)
		*err = buf;
	else
		free(buf);
	return -EINVAL;
}

void config_dump(const struct config *c, FILE *f)
{
	for (size_t i = 0; i < config_key_count; i++) {
		char buf[PATH_MAX + 8];

		config_format_value(c, &config_key_table[i], buf, sizeof(buf));
		fprintf(f, "%s = %s\n", config_key_table[i].name, buf);
	}
}

uint64_t config_resolve(const struct size_spec *s, uint64_t base)
{
	long double v;

	if (!s->is_pct)
		return s->bytes;
	/* long double keeps 64 bits of mantissa, so 100% of any base is the base exactly. */
	v = (long double)base * (long double)s->pct / 100.0L;
	return v >= (long double)base ? base : (uint64_t)v;
}

void config_settings(const struct config *c, struct broker_settings *ret)
{
	*ret = (struct broker_settings){
		.max_connections = c->max_connections,
		.max_leases_per_uid = c->max_leases_per_uid,
		.max_chunks_per_uid = c->max_chunks_per_uid,
		.max_reservations_per_uid = c->max_reservations_per_uid,
		.reserve_fds = c->reserve_fds,
		.revoke_deadline_ms = c->revoke_deadline_ms,
		.revoke_min_deadline_ms = c->revoke_min_deadline_ms,
		.job_unknown = c->job_unknown,
	};
}

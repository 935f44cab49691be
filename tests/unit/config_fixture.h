/* SPDX-License-Identifier: MIT */
/* The config suites' helpers (check_config.c, check_config_files.c): fresh configs, temp files, set and compare. */
#pragma once

#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

#define TIMEOUT_S 10

static inline struct config *defaults(void)
{
	struct config *c = NULL;

	ck_assert_int_eq(config_new(&c), 0);
	ck_assert_ptr_nonnull(c);
	return c;
}

/* Writes text to a fresh temp file and returns its malloc'd path. */
static inline char *write_temp(const char *text)
{
	char *path = strdup("/tmp/check_config.XXXXXX");
	int fd = mkstemp(path);
	size_t len = strlen(text);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, len), (ssize_t)len);
	close(fd);
	return path;
}

/* Loading path into c fails with the one error "path:line: msg"; then c and the file are gone. */
static inline void expect_file_error_and_free(struct config *c, char *path, int line, const char *msg)
{
	char *err = NULL, expect[1024];

	ck_assert_int_eq(config_load_file(c, path, &err), -EINVAL);
	snprintf(expect, sizeof(expect), "%s:%d: %s\n", path, line, msg);
	ck_assert_str_eq(err, expect);
	free(err);
	config_free(c);
	unlink(path);
	free(path);
}

static inline unsigned count_lines(const char *s)
{
	unsigned n = 0;

	for (; *s; s++)
		n += *s == '\n';
	return n;
}

static inline const void *at(const struct config *c, const struct config_key *k)
{
	return (const char *)c + k->offset;
}

static inline bool key_equal(const struct config *a, const struct config *b, const struct config_key *k)
{
	const void *pa = at(a, k), *pb = at(b, k);

	switch (k->type) {
	case CT_STRING:
		return strcmp(*(char *const *)pa, *(char *const *)pb) == 0;
	case CT_SIZE:
		return *(const uint64_t *)pa == *(const uint64_t *)pb;
	case CT_SIZE_PCT: {
		const struct size_spec *x = pa, *y = pb;
		return x->is_pct == y->is_pct && (x->is_pct ? x->pct == y->pct : x->bytes == y->bytes);
	}
	case CT_UINT:
		return *(const uint32_t *)pa == *(const uint32_t *)pb;
	case CT_DOUBLE:
		return *(const double *)pa == *(const double *)pb;
	case CT_BOOL:
		return *(const bool *)pa == *(const bool *)pb;
	case CT_ENUM:
	case CT_LOGLEVEL:
		return *(const int *)pa == *(const int *)pb;
	}
	return false;
}

static inline void assert_config_equal(const struct config *a, const struct config *b)
{
	size_t n;
	const struct config_key *keys = config_keys(&n);

	for (size_t i = 0; i < n; i++)
		ck_assert_msg(key_equal(a, b, &keys[i]), "key '%s' differs", keys[i].name);
}

/* A value of k that differs from its default and passes validation with the others changed the same way. */
static inline const char *other_value(const struct config_key *k, char *buf, size_t len)
{
	switch (k->type) {
	case CT_STRING:
		return strcmp(k->name, "job-quota") == 0 ? "/alt:1M" : "/alt";
	case CT_SIZE:
		/* The smallest size of every key but those whose floor is above a page (warmup-batch-max: 2M). */
		if (k->min <= 4096)
			return "4K";
		snprintf(buf, len, "%.0f", k->min);
		return buf;
	case CT_SIZE_PCT:
		return "1%";
	case CT_UINT:
	case CT_DOUBLE:
		snprintf(buf, len, "%.0f", k->min == 0 ? 1 : k->min);
		if (strcmp(buf, k->def) == 0)
			snprintf(buf, len, "%.0f", k->min + 1);
		return buf;
	case CT_BOOL:
		return strcmp(k->def, "yes") == 0 ? "no" : "yes";
	case CT_ENUM:
		return strcmp(k->def, k->choices[0]) == 0 ? k->choices[1] : k->choices[0];
	case CT_LOGLEVEL:
		return "debug";
	}
	return NULL;
}

/* Every key set to a non-default value. */
static inline struct config *scrambled(void)
{
	struct config *c = defaults(), *d = defaults();
	size_t n;
	const struct config_key *keys = config_keys(&n);

	for (size_t i = 0; i < n; i++) {
		char buf[64], *err = NULL;
		const char *v = other_value(&keys[i], buf, sizeof(buf));

		ck_assert_msg(config_set(c, keys[i].name, v, &err) == 0, "%s = %s: %s", keys[i].name, v, err);
		ck_assert_msg(!key_equal(c, d, &keys[i]), "key '%s' still at its default", keys[i].name);
	}
	config_free(d);
	return c;
}

/* Sets key to value, expecting failure r and an error starting with "key: '...'". */
static inline char *set_fails(const char *key, const char *value, int r)
{
	struct config *c = defaults(), *d = defaults();
	char *err = NULL, prefix[256];

	ck_assert_msg(config_set(c, key, value, &err) == r, "%s = '%s' should fail with %d", key, value, r);
	ck_assert_ptr_nonnull(err);
	snprintf(prefix, sizeof(prefix), "%s: ", key);
	ck_assert_msg(strncmp(err, prefix, strlen(prefix)) == 0, "message '%s'", err);
	/* A failed set leaves the old value. */
	assert_config_equal(c, d);
	config_free(c);
	config_free(d);
	return err;
}

static inline void set_ok(struct config *c, const char *key, const char *value)
{
	char *err = NULL;

	ck_assert_msg(config_set(c, key, value, &err) == 0, "%s = '%s': %s", key, value, err);
	ck_assert_ptr_null(err);
}

/* Removes a temp file from write_temp() and frees its path. */
static inline void drop_temp(char *path)
{
	unlink(path);
	free(path);
}

/* SPDX-License-Identifier: MIT */
/* Reading the captured and crafted files under tests/fixtures/ (FIXTURES_DIR, set by pb_check) in a Check suite. */
#pragma once

#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/*
 * The fixture FIXTURES_DIR/dir/rel in a buffer of exactly its size, with no NUL after it, so ASan
 * catches a parser's over-read; its length in *len. Fails the test when it cannot be read.
 */
static inline char *fixture_read(const char *dir, const char *rel, size_t *len)
{
	char path[1024];
	struct stat st;
	char *buf;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/%s/%s", FIXTURES_DIR, dir, rel);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	ck_assert_msg(fd >= 0, "cannot open fixture %s", path);
	ck_assert_int_eq(fstat(fd, &st), 0);
	buf = malloc(st.st_size > 0 ? (size_t)st.st_size : 1);
	ck_assert_ptr_nonnull(buf);
	n = read(fd, buf, (size_t)st.st_size);
	ck_assert_int_eq(n, st.st_size);
	close(fd);
	*len = (size_t)n;
	return buf;
}

/*
 * A heap copy of the string s without its NUL, exactly strlen(s) bytes (at least one allocated), so ASan catches a
 * parser's over-read as on a fixture; its length in *len. The caller frees it.
 */
static inline char *fixture_exact(const char *s, size_t *len)
{
	size_t n = strlen(s);
	char *b = malloc(n ? n : 1);

	ck_assert_ptr_nonnull(b);
	memcpy(b, s, n);
	*len = n;
	return b;
}

/* The fixture FIXTURES_DIR/dir/name as a string in buf (its first size - 1 bytes). Fails the test when it is missing. */
static inline const char *fixture_text(const char *dir, const char *name, char *buf, size_t size)
{
	char path[1024];
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "%s/%s/%s", FIXTURES_DIR, dir, name);
	f = fopen(path, "r");
	ck_assert_msg(f, "no fixture %s", path);
	n = fread(buf, 1, size - 1, f);
	fclose(f);
	buf[n] = '\0';
	return buf;
}

/* SPDX-License-Identifier: MIT */
/* Reading the captured and crafted files under tests/fixtures/ (FIXTURES_DIR, set by pb_check) in a Check suite. */
#pragma once

#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
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

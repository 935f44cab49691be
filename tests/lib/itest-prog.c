/* SPDX-License-Identifier: MIT */
/* A test program run on pipes (itest.h, itest_prog_*): the interposer, staging and CUDA-paths suites' runner. */
#define _GNU_SOURCE
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"

void itest_prog_start(struct itest_prog *p, const char *const *argv, bool quiet, void (*env)(const void *arg),
		      const void *arg)
{
	int in[2], out[2];

	p->pid = itest_fork_piped(in, out);
	if (p->pid == 0) {
		char asan[512];

		dup2(in[0], 0);
		dup2(out[1], 1);
		close(in[1]);
		close(out[0]);
		if (quiet && freopen("/dev/null", "w", stderr) == NULL)
			_exit(126);
		env(arg);
		/* Under ASan the interposer precedes the sanitizer's runtime in the load order; that is fine. */
		snprintf(asan, sizeof(asan), "%s%sverify_asan_link_order=0", getenv("ASAN_OPTIONS") ?: "",
			 getenv("ASAN_OPTIONS") ? ":" : "");
		setenv("ASAN_OPTIONS", asan, 1);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	p->in = in[1];
	p->out = fdopen(out[0], "r");
	ck_assert_ptr_nonnull(p->out);
}

void itest_prog_read_line(struct itest_prog *p, char *buf, size_t len)
{
	ck_assert_msg(fgets(buf, (int)len, p->out) != NULL, "the program (pid %d) printed nothing more", (int)p->pid);
	buf[strcspn(buf, "\n")] = 0;
}

int itest_prog_finish(struct itest_prog *p, char *last, size_t len)
{
	char buf[256];

	close(p->in);
	if (last)
		*last = 0;
	while (fgets(buf, sizeof(buf), p->out))
		if (last)
			snprintf(last, len, "%.*s", (int)strcspn(buf, "\n"), buf);
	fclose(p->out);
	return itest_wait_exit(p->pid);
}

unsigned long long itest_prog_field(const char *line, const char *key)
{
	const char *at = strstr(line, key);

	ck_assert_msg(at != NULL, "no %s in \"%s\"", key, line);
	return strtoull(at + strlen(key), NULL, 10);
}

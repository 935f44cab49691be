/* SPDX-License-Identifier: MIT */
/* Helpers for integration tests: fixture proc roots for the daemon's --proc-root (itest.h). */
#define _GNU_SOURCE
#include "itest.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void itest_proc_root_copy(const char *root, const char *then)
{
	char cmd[2048];

	snprintf(cmd, sizeof(cmd), "mkdir -p '%s' && cp -a " FIXTURES_DIR "/proc/idle/. '%s/'%s%s%s", root, root,
		 then ? " && cd '" : "", then ? root : "", then ? "' && " : "");
	if (then)
		strncat(cmd, then, sizeof(cmd) - strlen(cmd) - 1);
	ck_assert_msg(system(cmd) == 0, "cannot make the fixture proc root: %s", cmd);
}

void itest_proc_root(char *root, size_t size, const char *prefix, const char *then)
{
	snprintf(root, size, "/tmp/%s.XXXXXX", prefix);
	ck_assert_ptr_nonnull(mkdtemp(root));
	/* The daemon (root) looks other uids' clients up under it: the folder must not stop them. */
	ck_assert_int_eq(chmod(root, 0755), 0);
	itest_proc_root_copy(root, then);
}

void itest_proc_root_start(struct daemon *d, char *root, size_t size, const char *prefix, const char *then,
			   const char *const *extra_args)
{
	const char *args[64] = { "--proc-root", root };
	size_t n = 2;

	itest_proc_root(root, size, prefix, then);
	for (size_t i = 0; extra_args && extra_args[i]; i++) {
		ck_assert_uint_lt(n, sizeof(args) / sizeof(args[0]) - 1);
		args[n++] = extra_args[i];
	}
	args[n] = NULL;
	daemon_start(d, args);
}

void itest_proc_root_remove(char *root)
{
	char cmd[600];

	if (!root[0])
		return;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	ck_assert_int_eq(system(cmd), 0);
	root[0] = '\0';
}

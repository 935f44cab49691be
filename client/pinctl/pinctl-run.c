/* SPDX-License-Identifier: MIT */
/* pinctl run: an unmodified program started under the interposer (LD_PRELOAD=libpinbroker-preload.so). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pinbroker.h"
#include "pinctl.h"
#include "wire.h"
#include "preload-policy.h"

/* The interposer: $PINBROKER_PRELOAD_LIB, else next to the libpinbroker.so this pinctl runs with. */
static int find_preload(char *out, size_t len)
{
	const char *env = getenv("PINBROKER_PRELOAD_LIB");
	Dl_info info;
	char *slash;

	if (env && *env) {
		snprintf(out, len, "%s", env);
		return access(out, R_OK) == 0 ? 0 : -errno;
	}
	if (!dladdr((void *)(uintptr_t)pb_connect, &info) || !info.dli_fname)
		return -ENOENT;
	snprintf(out, len, "%s", info.dli_fname);
	slash = strrchr(out, '/');
	snprintf(slash ? slash + 1 : out, len - (size_t)(slash ? slash + 1 - out : 0), "libpinbroker-preload.so");
	return access(out, R_OK) == 0 ? 0 : -errno;
}

/*
 * The folder whose sitecustomize.py installs pinbroker's torch allocator in a
 * Python program (PINBROKER_TORCH=1): the installed one, else the source
 * tree's. Empty when neither is there.
 */
static void find_autotorch(char *out, size_t len)
{
	const char *dirs[] = { getenv("PINBROKER_AUTOTORCH_DIR"), PB_AUTOTORCH_INSTALL_DIR, PB_AUTOTORCH_SOURCE_DIR };
	char path[PATH_MAX];

	out[0] = 0;
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		if (!dirs[i] || !*dirs[i])
			continue;
		snprintf(path, sizeof(path), "%s/sitecustomize.py", dirs[i]);
		if (access(path, R_OK) == 0) {
			snprintf(out, len, "%s", dirs[i]);
			return;
		}
	}
}

/* name=first, or name=first:old / first old when name is set already. */
static int prepend_env(const char *name, const char *first, char sep)
{
	const char *old = getenv(name);
	char *v;
	int r;

	if (!old || !*old)
		return setenv(name, first, 1);
	if (asprintf(&v, "%s%c%s", first, sep, old) < 0)
		return -1;
	r = setenv(name, v, 1);
	free(v);
	return r;
}

int cmd_run(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "fallback", required_argument, NULL, 'f' },
		{ "label", required_argument, NULL, 'l' },
		{ "no-torch", no_argument, NULL, 'T' },
		PINCTL_COMMON_OPTIONS,
		{ NULL, 0, NULL, 0 },
	};
	const char *fallback = NULL, *label = NULL;
	char lib[PATH_MAX], autotorch[PATH_MAX];
	enum pbp_policy policy;
	bool torch = true;
	pb_client *c;
	int o, r;

	/* "+": options end at the command, whose own options are its own. */
	while ((o = getopt_long(argc, argv, "+:", opts, NULL)) != -1) {
		switch (o) {
		case 'f':
			if (pbp_policy_parse(optarg, &policy) < 0 || !*optarg)
				return usage_error("--fallback: expected cuda, error or pageable, not %s", optarg);
			fallback = optarg;
			break;
		case 'l':
			if (!*optarg)
				return usage_error("--label: empty label");
			label = optarg;
			break;
		case 'T':
			torch = false;
			break;
		default:
			if ((r = command_option("run", o, argv)) != PINCTL_OPT_NEXT)
				return r;
			break;
		}
	}
	if (optind >= argc)
		return usage_error("give the program to run (pinctl run [OPTIONS] -- CMD [ARGS])");
	r = find_preload(lib, sizeof(lib));
	if (r < 0) {
		fprintf(stderr,
			"pinctl run: cannot find the interposer (%s: %s): install libpinbroker-preload.so next to "
			"libpinbroker.so, or set PINBROKER_PRELOAD_LIB to its path\n",
			lib[0] ? lib : "libpinbroker-preload.so", strerror(-r));
		return EXIT_FAILURE;
	}
	/* Not fatal: the program runs on its fallback until a daemon answers. Say so now, once. */
	if (pb_connect(pinctl_socket_option(), &c) < 0)
		fprintf(stderr, "pinctl run: warning: %s; %s runs with its pinned memory on the fallback (%s)\n",
			pb_last_error(), argv[optind], fallback ? fallback : "cuda");
	else
		pb_disconnect(c);
	if (prepend_env("LD_PRELOAD", lib, ' ') < 0 ||
	    (fallback && setenv("PINBROKER_PRELOAD_FALLBACK", fallback, 1) < 0) ||
	    (label && setenv("PINBROKER_LABEL", label, 1) < 0) ||
	    (pinctl_socket_option() && setenv(PB_SOCKET_ENV, pinctl_socket_option(), 1) < 0)) {
		fprintf(stderr, "pinctl run: setting the environment: %s\n", strerror(errno));
		return EXIT_FAILURE;
	}
	if (torch) {
		find_autotorch(autotorch, sizeof(autotorch));
		if (autotorch[0] &&
		    (setenv("PINBROKER_TORCH", "1", 1) < 0 || prepend_env("PYTHONPATH", autotorch, ':') < 0)) {
			fprintf(stderr, "pinctl run: setting the environment: %s\n", strerror(errno));
			return EXIT_FAILURE;
		}
	}
	execvp(argv[optind], argv + optind);
	r = errno;
	fprintf(stderr, "pinctl run: cannot run %s: %s\n", argv[optind], strerror(r));
	return r == ENOENT ? 127 : 126; /* as env(1) and the shells answer */
}

/* SPDX-License-Identifier: MIT */
/*
 * An unmodified program that loads a CUDA plugin with RTLD_DEEPBIND (run-preload.sh's deep-bind check):
 *   deepbind_prog PLUGIN SIZE: dlopen(PLUGIN, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND), pin SIZE bytes through
 *   the plugin's cuMemHostAlloc, print "hold", wait for stdin to close, free, print "freed". Exit 77 without a GPU.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	int (*alloc)(size_t, void **);
	int (*release)(void *);
	void *h, *p = NULL;
	char c;
	int r;

	if (argc != 3) {
		fprintf(stderr, "usage: deepbind_prog PLUGIN SIZE\n");
		return 2;
	}
	h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
	if (!h) {
		fprintf(stderr, "deepbind_prog: %s\n", dlerror());
		return 1;
	}
	alloc = (int (*)(size_t, void **))dlsym(h, "deep_gpu_alloc");
	release = (int (*)(void *))dlsym(h, "deep_gpu_free");
	if (!alloc || !release)
		return 1;
	r = alloc(strtoull(argv[2], NULL, 0), &p);
	if (r == -1) {
		fprintf(stderr, "deepbind_prog: no CUDA device\n");
		return 77;
	}
	if (r != 0) {
		fprintf(stderr, "deepbind_prog: cuMemHostAlloc failed\n");
		return 1;
	}
	memset(p, 0x5a, 4096);
	printf("hold\n");
	fflush(stdout);
	while (read(0, &c, 1) > 0)
		;
	r = release(p);
	printf("freed %d\n", r);
	return r == 0 ? 0 : 1;
}

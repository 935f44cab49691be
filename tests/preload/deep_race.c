/* SPDX-License-Identifier: MIT */
/*
 * Deep-bound dlopen()s racing each other and a plain one (issue 22, finding 6; the interposer's rewrite of a
 * deep-bound library's GOT must touch only the objects that dlopen() brought in, fully relocated).
 *   deep_race PLUGIN1 PLUGIN2 BUSY N SIZE: two threads each dlopen(PLUGINk, RTLD_NOW | RTLD_LOCAL |
 *   RTLD_DEEPBIND), pin and free 4 KiB through it with deep_alloc("call") and dlclose it, N times, while a third
 *   dlopen()s and dlclose()s BUSY (tests/preload/deep_busy.c) until they are done, and a fourth takes and drops
 *   plain references to the plugins (dlopen(RTLD_NOLOAD), dlclose()), so that a plugin's last dlclose() may come
 *   from another thread at any moment of a deep-bound dlopen() of it. Then each plugin is loaded
 *   once more and pins SIZE bytes; prints "ready calls=C" (C: allocations the stand-in driver made itself,
 *   ever: 0 when every one went through the interposer), waits for stdin to close, frees, prints "freed 0".
 */
#define _GNU_SOURCE
#include "stub_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static const char *busy;
static unsigned long rounds;
static atomic_int running = 2;

struct plugin {
	const char *lib;
	void *h, *p;
	int (*release)(void *);
	int err;
};

static int load(struct plugin *pl, size_t bytes)
{
	int (*alloc)(const char *, size_t, void **);

	pl->h = dlopen(pl->lib, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
	if (!pl->h) {
		fprintf(stderr, "deep_race: %s\n", dlerror());
		return 3;
	}
	alloc = (int (*)(const char *, size_t, void **))(uintptr_t)dlsym(pl->h, "deep_alloc");
	pl->release = (int (*)(void *))(uintptr_t)dlsym(pl->h, "deep_free");
	if (!alloc || !pl->release)
		return 4;
	return alloc("call", bytes, &pl->p) == 0 ? 0 : 5;
}

static void *deep_thread(void *arg)
{
	struct plugin *pl = arg;

	for (unsigned long i = 0; i < rounds && !pl->err; i++) {
		pl->err = load(pl, 4096);
		if (!pl->err && pl->release(pl->p) != 0)
			pl->err = 6;
		if (pl->h)
			dlclose(pl->h);
	}
	atomic_fetch_sub(&running, 1);
	return NULL;
}

static void *busy_thread(void *arg)
{
	(void)arg;
	while (atomic_load(&running) > 0) {
		void *h = dlopen(busy, RTLD_NOW | RTLD_LOCAL);
		uintptr_t (*sum)(void) = h ? (uintptr_t(*)(void))(uintptr_t)dlsym(h, "deep_busy_sum") : NULL;

		if (!sum || !sum()) {
			fprintf(stderr, "deep_race: %s: %s\n", busy, dlerror());
			exit(7);
		}
		dlclose(h);
	}
	return NULL;
}

/* Takes and drops a reference to each plugin while it is loaded, until the deep-bound threads are done. */
static void *holder_thread(void *arg)
{
	const struct plugin *pl = arg;

	while (atomic_load(&running) > 0)
		for (int k = 0; k < 2; k++) {
			void *h = dlopen(pl[k].lib, RTLD_NOW | RTLD_NOLOAD);

			if (h) {
				sched_yield();
				dlclose(h);
			}
		}
	return NULL;
}

int main(int argc, char **argv)
{
	struct plugin pl[2] = { { .lib = argv[1] }, { .lib = argv[2] } };
	void (*stats)(struct stub_cuda_stats *);
	struct stub_cuda_stats st = { 0 };
	pthread_t t[4];
	size_t size;
	void *drv;
	char c;
	int r = 0;

	if (argc != 6) {
		fprintf(stderr, "usage: deep_race PLUGIN1 PLUGIN2 BUSY N SIZE\n");
		return 2;
	}
	busy = argv[3];
	rounds = strtoul(argv[4], NULL, 0);
	size = strtoull(argv[5], NULL, 0);
	pthread_create(&t[2], NULL, busy_thread, NULL);
	pthread_create(&t[3], NULL, holder_thread, pl);
	for (int k = 0; k < 2; k++)
		pthread_create(&t[k], NULL, deep_thread, &pl[k]);
	for (int k = 0; k < 4; k++)
		pthread_join(t[k], NULL);
	for (int k = 0; k < 2; k++)
		if (pl[k].err) {
			fprintf(stderr, "deep_race: %s: error %d\n", pl[k].lib, pl[k].err);
			return pl[k].err;
		}
	for (int k = 0; k < 2 && !r; k++)
		r = load(&pl[k], size);
	if (r)
		return r;
	drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	stats = drv ? (void (*)(struct stub_cuda_stats *))(uintptr_t)dlsym(drv, "stub_cuda_get_stats") : NULL;
	if (!stats)
		return 4;
	stats(&st);
	printf("ready calls=%llu\n", (unsigned long long)st.alloc_calls);
	fflush(stdout);
	while (read(0, &c, 1) > 0)
		;
	for (int k = 0; k < 2; k++)
		r |= pl[k].release(pl[k].p);
	printf("freed %d\n", r);
	return r == 0 ? 0 : 6;
}

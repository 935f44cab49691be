/* SPDX-License-Identifier: MIT */
/*
 * An unmodified program that loads a plugin with RTLD_DEEPBIND (issue 22, finding 6).
 *   deep_target LIB WAY SIZE: dlopen(LIB, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND), deep_alloc(WAY, SIZE),
 *   print "ready driver=N scope=S" (N: bytes the stand-in driver allocated itself; S: "plugin" when the
 *   plugin's own deep_scope_probe won over this program's, as RTLD_DEEPBIND promises), wait for stdin to close,
 *   free, print "freed", exit 0. LIB may be a bare name: it is found along this program's RUNPATH.
 *   env DEEP_TARGET_SHALLOW=1: dlopen without RTLD_DEEPBIND (the plugin then binds to the global scope).
 */
#define _GNU_SOURCE
#include "stub_cuda.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Exported (ENABLE_EXPORTS): without RTLD_DEEPBIND the plugin's reference would bind here. */
__attribute__((visibility("default"))) const char *deep_scope_probe(void);
const char *deep_scope_probe(void)
{
	return "program";
}

int main(int argc, char **argv)
{
	const char *(*scope)(void);
	int (*alloc)(const char *, size_t, void **);
	int (*release)(void *);
	void (*stats)(struct stub_cuda_stats *);
	struct stub_cuda_stats st = { 0 };
	void *h, *drv, *p = NULL;
	char c;
	int r;

	if (argc != 4) {
		fprintf(stderr, "usage: deep_target LIB call|dlsym|gpa SIZE\n");
		return 2;
	}
	h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL | (getenv("DEEP_TARGET_SHALLOW") ? 0 : RTLD_DEEPBIND));
	if (!h) {
		fprintf(stderr, "deep_target: %s\n", dlerror());
		return 3;
	}
	alloc = (int (*)(const char *, size_t, void **))(uintptr_t)dlsym(h, "deep_alloc");
	release = (int (*)(void *))(uintptr_t)dlsym(h, "deep_free");
	scope = (const char *(*)(void))(uintptr_t)dlsym(h, "deep_scope");
	drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	stats = drv ? (void (*)(struct stub_cuda_stats *))(uintptr_t)dlsym(drv, "stub_cuda_get_stats") : NULL;
	if (!alloc || !release || !scope || !stats)
		return 4;
	r = alloc(argv[2], strtoull(argv[3], NULL, 0), &p);
	if (r != 0) {
		fprintf(stderr, "deep_target: deep_alloc: %d\n", r);
		return 5;
	}
	memset(p, 0x5a, strtoull(argv[3], NULL, 0));
	stats(&st);
	printf("ready driver=%llu scope=%s\n", (unsigned long long)st.alloc_bytes, scope());
	fflush(stdout);
	while (read(0, &c, 1) > 0)
		;
	r = release(p);
	printf("freed %d\n", r);
	return r == 0 ? 0 : 6;
}

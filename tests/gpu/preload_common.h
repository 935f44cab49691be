/* SPDX-License-Identifier: MIT */
/*
 * What the two unmodified CUDA programs for libpinbroker-preload.so share: preload_driver.c (driver API, C) and
 * preload_prog.cu (runtime API, nvcc's C++). The PASS/FAIL report, sizes, reproducible contents, and the hold and
 * expect-oom commands over a table of the program's own calls (struct pin_api). Nothing of pinbroker and nothing of
 * CUDA: each program keeps its own CUDA calls.
 */
#pragma once

#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gpu_common.h"

#define EXIT_SKIP 77
#define PAGE_BYTES 4096ul
#define MIB (1ul << 20)
#define THREADS 4

static int g_pass, g_fail;
static pthread_mutex_t g_out_lock = PTHREAD_MUTEX_INITIALIZER;

/* One PASS or FAIL line; returns ok so callers can chain. Thread-safe: the threads report through it too. */
__attribute__((format(printf, 2, 3))) static inline int report(int ok, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&g_out_lock);
	fputs(ok ? "PASS " : "FAIL ", stdout);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	fputc('\n', stdout);
	fflush(stdout);
	if (ok)
		g_pass++;
	else
		g_fail++;
	pthread_mutex_unlock(&g_out_lock);
	return ok;
}

static inline double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* "64M", "1G", "4097", "0x1000", "2MiB" -> bytes; 0 on garbage. */
static inline size_t parse_size(const char *s)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 0);
	const char *unit = end;

	if (end == s)
		return 0;
	return (size_t)v * gpu_size_unit(&unit, 30);
}

static inline void fill(void *p, size_t bytes, uint64_t seed)
{
	unsigned char *c = (unsigned char *)p;
	size_t i = 0;

	for (; i + 8 <= bytes; i += 8) {
		uint64_t w = mix(&seed);
		memcpy(c + i, &w, 8);
	}
	if (i < bytes) {
		uint64_t w = mix(&seed);
		memcpy(c + i, &w, bytes - i);
	}
}

/* Offset of the first byte unlike fill(seed), or -1 when all match. */
static inline long long unlike(const void *p, size_t bytes, uint64_t seed)
{
	const unsigned char *c = (const unsigned char *)p;
	size_t i = 0;

	for (; i + 8 <= bytes; i += 8) {
		uint64_t w = mix(&seed);
		if (memcmp(c + i, &w, 8))
			return (long long)i;
	}
	if (i < bytes) {
		uint64_t w = mix(&seed);
		if (memcmp(c + i, &w, bytes - i))
			return (long long)i;
	}
	return -1;
}

/* Until the file named by env exists (or, without one, stdin reaches EOF); -1 after timeout_s. */
static inline int wait_release(const char *env, double timeout_s)
{
	const char *rel = getenv(env);
	double t0 = now_ms();
	struct stat sb;

	while (now_ms() - t0 < timeout_s * 1e3) {
		if (rel && *rel) {
			if (stat(rel, &sb) == 0)
				return 0;
			usleep(10000);
		} else {
			struct pollfd pfd = { STDIN_FILENO, POLLIN, 0 };
			char buf[256];

			if (poll(&pfd, 1, 100) > 0 && read(STDIN_FILENO, buf, sizeof(buf)) <= 0)
				return 0;
		}
	}
	return -1;
}

/*
 * The calls hold and expect-oom make, in the program's own API (driver or runtime): each returns 0 or the API's
 * error, which error_text names; clear (may be NULL) runs after an allocation expected to fail.
 */
struct pin_api {
	const char *alloc_name, *alloc_host_name, *register_name, *free_name, *unregister_name, *oom_name;
	int oom;
	int (*alloc)(void **p, size_t bytes, unsigned flags);
	int (*alloc_host)(void **p, size_t bytes);
	int (*reg)(void *p, size_t bytes);
	int (*free_host)(void *p);
	int (*unreg)(void *p);
	const char *(*error_text)(int err);
	void (*clear)(void);
	unsigned flags_default, flags_wc, flags_mapped; /* the allocation flags of PB_HOLD_KIND alloc, wc, mapped */
	int timed;                                      /* a "pinned N in S s, written in S s" line for each size */
};

/*
 * hold SIZE...: pins each size (PB_HOLD_KIND register: malloc'd memory registered; else allocated with the kind's
 * flags) and writes it, prints "hold" and the addresses, waits for PB_HOLD_RELEASE, unpins, prints "released", then
 * waits for PB_HOLD_EXIT if set. before (may be NULL) runs once the arguments are checked; non-zero ends the command.
 */
static inline int hold_pinned(const struct pin_api *api, int n, char **sizes, int (*before)(double timeout_s))
{
	void *p[64];
	const char *t = getenv("PB_HOLD_TIMEOUT_S"), *kind = getenv("PB_HOLD_KIND");
	double timeout_s = t ? atof(t) : 300;
	int reg = kind && !strcmp(kind, "register"), rc = 0, k;
	int known = !kind || reg || !strcmp(kind, "alloc") || !strcmp(kind, "wc") || !strcmp(kind, "mapped");
	unsigned flags = !kind || !strcmp(kind, "alloc") ? api->flags_default
			 : !strcmp(kind, "wc")           ? api->flags_wc
			 : !strcmp(kind, "mapped")       ? api->flags_mapped
							 : 0;

	if (n < 1 || n > 64 || !known) {
		fprintf(stderr, "hold: 1 to 64 sizes; PB_HOLD_KIND alloc, register, wc or mapped\n");
		return 2;
	}
	if (before && (rc = before(timeout_s)) != 0)
		return rc;
	for (k = 0; k < n; k++) {
		size_t b = parse_size(sizes[k]);
		double t0 = now_ms(), t1;
		int e;

		if (!b) {
			fprintf(stderr, "hold: bad size %s\n", sizes[k]);
			rc = 2;
			break;
		}
		if (reg) {
			if (posix_memalign(&p[k], PAGE_BYTES, b)) {
				printf("FAIL posix_memalign(%zu)\n", b);
				rc = 1;
				break;
			}
			e = api->reg(p[k], b);
			if (e)
				free(p[k]);
		} else {
			e = api->alloc(&p[k], b, flags);
		}
		if (e) {
			printf("FAIL %s(%zu): %s (%d)\n", reg ? api->register_name : api->alloc_name, b,
			       api->error_text(e), e);
			rc = 1;
			break;
		}
		t1 = now_ms();
		memset(p[k], 0x5a, b);
		if (api->timed)
			printf("pinned %zu in %.3f s, written in %.3f s\n", b, (t1 - t0) / 1e3, (now_ms() - t1) / 1e3);
	}
	if (rc == 0) {
		printf("hold");
		for (int i = 0; i < n; i++)
			printf(" %p", p[i]);
		printf("\n");
		fflush(stdout);
		if (wait_release("PB_HOLD_RELEASE", timeout_s) < 0) {
			printf("FAIL hold: no release in time\n");
			rc = 1;
		}
	}
	for (int i = 0; i < k; i++) {
		int e = reg ? api->unreg(p[i]) : api->free_host(p[i]);

		if (e) {
			printf("FAIL %s(%p): %s (%d)\n", reg ? api->unregister_name : api->free_name, p[i],
			       api->error_text(e), e);
			rc = 1;
		}
		if (reg)
			free(p[i]);
	}
	if (rc == 0) {
		printf("released\n");
		fflush(stdout);
		if (getenv("PB_HOLD_EXIT") && wait_release("PB_HOLD_EXIT", timeout_s) < 0) {
			printf("FAIL hold: no exit file in time\n");
			rc = 1;
		}
	}
	return rc;
}

/*
 * expect-oom SIZE: both allocation calls of SIZE fail with the API's out-of-memory error, and the process stays
 * usable after a refusal (a page afterwards is granted or refused the same way, nothing else).
 */
static inline int expect_oom(const struct pin_api *api, const char *arg)
{
	size_t b = parse_size(arg);
	void *p = NULL;
	int e, ok;

	if (!b) {
		fprintf(stderr, "expect-oom: bad size %s\n", arg);
		return 2;
	}
	e = api->alloc(&p, b, api->flags_default);
	if (api->clear)
		api->clear();
	ok = report(e == api->oom, "%s(%zu) fails with %s (got %d)", api->alloc_name, b, api->oom_name, e);
	if (e == 0)
		api->free_host(p);
	p = NULL;
	e = api->alloc_host(&p, b);
	if (api->clear)
		api->clear();
	ok = report(e == api->oom, "%s(%zu) fails with %s (got %d)", api->alloc_host_name, b, api->oom_name, e) && ok;
	if (e == 0)
		api->free_host(p);
	e = api->alloc(&p, PAGE_BYTES, api->flags_default);
	ok = report(e == 0 || e == api->oom, "a small %s afterwards answers sanely (got %d)", api->alloc_name, e) && ok;
	if (e == 0)
		api->free_host(p);
	return ok ? 0 : 1;
}

/* SPDX-License-Identifier: MIT */
/*
 * What the two unmodified CUDA programs for libpinbroker-preload.so share: preload_driver.c (driver API, C) and
 * preload_prog.cu (runtime API, nvcc's C++). The PASS/FAIL report, sizes, reproducible contents and the hold
 * command's wait. Nothing of pinbroker and nothing of CUDA: each program keeps its own CUDA calls.
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

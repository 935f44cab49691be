/* SPDX-License-Identifier: MIT */
/* Helpers shared by the GPU tests and the GPU benchmark: CUDA error checks, clocks, daemon start, random fill. */
#pragma once

#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu_common.h"
#include "pinbroker.h"

/* ctest's convention for "skipped" (SKIP_RETURN_CODE 77). */
#define GPU_EXIT_SKIP 77

/* Every CUDA call goes through this: a failure prints where and what, and exits 1. */
#define CK(call)                                                                           \
	do {                                                                               \
		cudaError_t ck_err_ = (call);                                              \
		if (ck_err_ != cudaSuccess) {                                              \
			fprintf(stderr, "%s:%d: %s: %s (%d)\n", __FILE__, __LINE__, #call, \
				cudaGetErrorString(ck_err_), (int)ck_err_);                \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

/* Launches report errors only through cudaGetLastError. */
#define CK_LAUNCH() CK(cudaGetLastError())

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline double ms_since(uint64_t t0_ns)
{
	return (double)(now_ns() - t0_ns) / 1e6;
}

static inline void sleep_ms(unsigned ms)
{
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* "64M", "1G", "4096", "2MiB", "1.5T" -> bytes; 0 on garbage. */
static inline size_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	const char *unit = end;
	size_t mul;

	if (end == s || v < 0)
		return 0;
	mul = gpu_size_unit(&unit, 40);
	return mul ? (size_t)(v * (double)mul) : 0;
}

/* "2 MiB", "1 GiB", "64 MiB" for table labels. */
static inline const char *size_label(size_t b, char *buf, size_t len)
{
	if (b >= (1ull << 30) && b % (1ull << 30) == 0)
		snprintf(buf, len, "%zuGiB", b >> 30);
	else if (b >= (1ull << 20) && b % (1ull << 20) == 0)
		snprintf(buf, len, "%zuMiB", b >> 20);
	else if (b >= (1ull << 10) && b % (1ull << 10) == 0)
		snprintf(buf, len, "%zuKiB", b >> 10);
	else
		snprintf(buf, len, "%zuB", b);
	return buf;
}

/*
 * Whether this process could use a GPU, asked in a forked child so the caller
 * stays free of CUDA and can still fork workers (a CUDA context does not
 * survive fork). Returns 1 with a device name, or 0 with the reason.
 */
static inline int gpu_probe(char *what, size_t len)
{
	int pfd[2];
	pid_t pid;
	int status = 0;
	ssize_t n;

	if (pipe(pfd) < 0) {
		snprintf(what, len, "pipe: %s", strerror(errno));
		return 0;
	}
	pid = fork();
	if (pid < 0) {
		snprintf(what, len, "fork: %s", strerror(errno));
		return 0;
	}
	if (pid == 0) {
		char msg[256];
		int count = 0;
		cudaError_t e = cudaGetDeviceCount(&count);
		struct cudaDeviceProp prop;

		if (e != cudaSuccess)
			snprintf(msg, sizeof(msg), "no usable CUDA device: %s", cudaGetErrorString(e));
		else if (count == 0)
			snprintf(msg, sizeof(msg), "no CUDA device");
		else if ((e = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess)
			snprintf(msg, sizeof(msg), "cudaGetDeviceProperties: %s", cudaGetErrorString(e));
		else
			snprintf(msg, sizeof(msg), "%.200s (sm_%d%d, %d device%s)", prop.name, prop.major, prop.minor,
				 count, count == 1 ? "" : "s");
		if (write(pfd[1], msg, strlen(msg)) < 0)
			_exit(2);
		_exit(e == cudaSuccess && count > 0 ? 0 : 1);
	}
	close(pfd[1]);
	n = read(pfd[0], what, len - 1);
	what[n > 0 ? n : 0] = '\0';
	close(pfd[0]);
	if (waitpid(pid, &status, 0) < 0)
		return 0;
	if (!WIFEXITED(status)) {
		snprintf(what, len, "the CUDA probe died (signal %d)", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
		return 0;
	}
	return WEXITSTATUS(status) == 0;
}

static inline void fill_random(void *p, size_t bytes, uint64_t seed)
{
	uint64_t *w = (uint64_t *)p;
	size_t nw = bytes / 8;
	uint64_t s = seed, last;

	for (size_t i = 0; i < nw; i++)
		w[i] = mix(&s);
	last = mix(&s);
	memcpy((char *)p + nw * 8, &last, bytes % 8);
}

/* Offset of the first byte that differs from fill_random(seed), or (size_t)-1 when all match. */
static inline size_t check_random(const void *p, size_t bytes, uint64_t seed)
{
	const uint64_t *w = (const uint64_t *)p;
	size_t nw = bytes / 8;
	uint64_t s = seed, last;

	for (size_t i = 0; i < nw; i++)
		if (w[i] != mix(&s))
			return i * 8;
	last = mix(&s);
	if (memcmp((const char *)p + nw * 8, &last, bytes % 8) != 0)
		return nw * 8;
	return (size_t)-1;
}

/*
 * Connect to the broker at path, retrying while the socket is missing or the
 * daemon is still warming its pool (it accepts connections only once its loop
 * runs). Returns 0 and *ret, or the last negative errno after timeout_ms.
 */
static inline int connect_retry(const char *path, unsigned timeout_ms, pb_client **ret)
{
	uint64_t t0 = now_ns();
	int r;

	for (;;) {
		r = pb_connect(path, ret);
		if (r == 0 || ms_since(t0) > timeout_ms)
			return r;
		sleep_ms(2);
	}
}

/*
 * Start a daemon: argv[0] is its path. stdout and stderr go to log_path
 * (appended). It runs in its own session, so it outlives a caller that exits.
 * Returns its pid, or -1.
 */
static inline pid_t spawn_daemon(char *const argv[], const char *log_path)
{
	pid_t pid = fork();

	if (pid < 0)
		return -1;
	if (pid == 0) {
		int fd = open(log_path ? log_path : "/dev/null", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);

		setsid();
		if (fd >= 0) {
			dup2(fd, STDOUT_FILENO);
			dup2(fd, STDERR_FILENO);
		}
		execv(argv[0], argv);
		fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	return pid;
}

/* SIGTERM, then wait up to timeout_ms, then SIGKILL. Returns the exit status as waitpid gives it. */
static inline int stop_daemon(pid_t pid, unsigned timeout_ms)
{
	uint64_t t0 = now_ns();
	int status = 0;

	if (pid <= 0)
		return 0;
	kill(pid, SIGTERM);
	while (waitpid(pid, &status, WNOHANG) == 0) {
		if (ms_since(t0) > timeout_ms) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			break;
		}
		sleep_ms(5);
	}
	return status;
}

/*
 * A barrier for forked processes in MAP_SHARED memory, with a way out when a
 * sibling failed (pthread barriers would hang forever then).
 */
struct proc_barrier {
	volatile int arrived[8]; /* one counter per phase */
	volatile int failed;
};

/* Returns 0 when all n arrived, -1 when a sibling failed or timeout_ms passed. */
static inline int barrier_wait(struct proc_barrier *b, int phase, int n, unsigned timeout_ms)
{
	uint64_t t0 = now_ns();

	__atomic_add_fetch(&b->arrived[phase], 1, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(&b->arrived[phase], __ATOMIC_SEQ_CST) < n) {
		if (__atomic_load_n(&b->failed, __ATOMIC_SEQ_CST) || ms_since(t0) > timeout_ms)
			return -1;
		sched_yield();
	}
	return 0;
}

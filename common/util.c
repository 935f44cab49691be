/* SPDX-License-Identifier: MIT */
/* Size parsing/formatting, clocks, pidfd calls and small files read whole, shared by every pinbroker binary. */
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* The same numbers on every architecture since Linux 5.1 and 5.3 (the unified syscall table). */
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

static int suffix_shift(const char *s, unsigned *shift)
{
	static const struct {
		const char *name;
		unsigned shift;
	} suffixes[] = {
		{ "", 0 },     { "B", 0 },  { "K", 10 },  { "KB", 10 },  { "KIB", 10 }, { "M", 20 },  { "MB", 20 },
		{ "MIB", 20 }, { "G", 30 }, { "GB", 30 }, { "GIB", 30 }, { "T", 40 },   { "TB", 40 }, { "TIB", 40 },
	};

	for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++)
		if (strcasecmp(s, suffixes[i].name) == 0) {
			*shift = suffixes[i].shift;
			return 0;
		}
	return -EINVAL;
}

int parse_size(const char *s, uint64_t *ret)
{
	unsigned long long v;
	unsigned shift;
	char *end;
	int r;

	if (!s)
		return -EINVAL;
	while (isspace((unsigned char)*s))
		s++;
	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		return -ERANGE;
	while (isspace((unsigned char)*end))
		end++;
	r = suffix_shift(end, &shift);
	if (r < 0)
		return r;
	if (shift > 0 && v > (UINT64_MAX >> shift))
		return -ERANGE;
	*ret = (uint64_t)v << shift;
	return 0;
}

int parse_size_or_pct(const char *s, uint64_t *bytes, double *pct, bool *is_pct)
{
	size_t n;

	if (!s)
		return -EINVAL;
	n = strlen(s);
	if (n > 1 && s[n - 1] == '%') {
		char buf[64], *end;
		double v;

		if (n >= sizeof(buf) || !isdigit((unsigned char)s[0]))
			return -EINVAL;
		memcpy(buf, s, n - 1);
		buf[n - 1] = '\0';
		errno = 0;
		v = strtod(buf, &end);
		if (errno || *end || !isfinite(v))
			return -EINVAL;
		if (v < 0 || v > 100)
			return -ERANGE;
		*pct = v;
		*is_pct = true;
		return 0;
	}
	*is_pct = false;
	return parse_size(s, bytes);
}

char *format_size(uint64_t bytes, char *buf, size_t len)
{
	static const char *units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double v = (double)bytes;
	unsigned u = 0;

	while (v >= 1024.0 && u < 6) {
		v /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%llu B", (unsigned long long)bytes);
	else if (v == floor(v))
		snprintf(buf, len, "%.0f %s", v, units[u]);
	else
		snprintf(buf, len, "%.1f %s", v, units[u]);
	return buf;
}

uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t now_ms(void)
{
	return now_us() / 1000u;
}

void *grow_array(void *v, size_t *cap, size_t n, size_t elem_bytes, size_t first)
{
	size_t nc = *cap ? 2 * *cap : first;
	void *nv;

	if (n < *cap)
		return v;
	if (nc < *cap || nc > SIZE_MAX / elem_bytes || !(nv = realloc(v, nc * elem_bytes)))
		return NULL;
	*cap = nc;
	return nv;
}

uint64_t round_up(uint64_t x, uint64_t align)
{
	uint64_t r;

	if (align == 0)
		return x;
	r = x % align;
	if (r == 0)
		return x;
	if (x > UINT64_MAX - (align - r))
		return 0;
	return x + (align - r);
}

static bool pidfd_off;

void sys_pidfd_disable(void)
{
	pidfd_off = true;
}

bool sys_pidfd_disabled(void)
{
	return pidfd_off;
}

int sys_pidfd_open(pid_t pid, unsigned flags)
{
	if (pidfd_off) {
		errno = ENOSYS;
		return -1;
	}
	return (int)syscall(SYS_pidfd_open, pid, flags);
}

int sys_pidfd_send_signal(int pidfd, int sig, unsigned flags)
{
	return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, flags);
}

ssize_t read_text_at(int dirfd, const char *path, char *buf, size_t len)
{
	int fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC);
	size_t n = 0;

	if (fd < 0)
		return -errno;
	while (n + 1 < len) {
		ssize_t k = read(fd, buf + n, len - 1 - n);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			int err = errno;

			close(fd);
			return -err;
		}
		if (k == 0)
			break;
		n += (size_t)k;
	}
	close(fd);
	if (len > 0)
		buf[n] = '\0';
	return (ssize_t)n;
}

int read_private_file(const char *path, uint64_t max_bytes, char **ret, size_t *len, const char **why)
{
	struct stat st;
	size_t have = 0;
	char *buf;
	int fd, r;

	*ret = NULL;
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		r = -errno;
		*why = r == -ELOOP ? "it is a symbolic link" : strerror(-r);
		return r == -ENOENT ? r : -EPERM;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		*why = "it is not a regular file";
		r = -EPERM;
		goto out;
	}
	if (st.st_uid != geteuid()) {
		*why = "another user owns it";
		r = -EPERM;
		goto out;
	}
	if (st.st_mode & (S_IWGRP | S_IWOTH)) {
		*why = "its group or others may write it";
		r = -EPERM;
		goto out;
	}
	/* The writer's rename leaves one name; a second is a link someone made to another file. */
	if (st.st_nlink != 1) {
		*why = "it has other hard links, so it is not a file this daemon wrote";
		r = -EPERM;
		goto out;
	}
	if ((uint64_t)st.st_size > max_bytes) {
		*why = "it is larger than any this daemon writes";
		r = -EPERM;
		goto out;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		r = -ENOMEM;
		goto out;
	}
	while (have < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + have, (size_t)st.st_size - have);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		have += (size_t)n;
	}
	buf[have] = '\0';
	*ret = buf;
	*len = have;
	r = 0;
out:
	close(fd);
	return r;
}

void read_boot_id(const char *proc_root, char *buf, size_t len)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/proc/sys/kernel/random/boot_id", proc_root ? proc_root : "");
	if (read_text_at(AT_FDCWD, path, buf, len) < 0)
		buf[0] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
	/* Only the kernel's uuid text goes into a file's "boot" line. */
	for (char *p = buf; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') || *p == '-')) {
			buf[0] = '\0';
			return;
		}
}

/* One unsigned decimal number at *p (after blanks), *p moved past it: 0, or -EINVAL where there is none. */
static int parse_u64_field(const char **p, uint64_t *out)
{
	const char *s = *p;
	uint64_t v = 0;

	while (*s == ' ' || *s == '\t')
		s++;
	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	for (; isdigit((unsigned char)*s); s++) {
		if (v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
			return -EINVAL;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*p = s;
	*out = v;
	return 0;
}

int parse_proc_stat_u64(const char *buf, int field, uint64_t *out)
{
	const char *p = strrchr(buf, ')');

	if (!p || field < 4)
		return -EINVAL;
	p++;
	/* Fields 3 (state) to field - 1 are skipped, blank-separated words. */
	for (int f = 3; f < field; f++) {
		while (*p == ' ')
			p++;
		if (*p == '\0' || *p == '\n')
			return -EINVAL;
		while (*p && *p != ' ' && *p != '\n')
			p++;
	}
	return parse_u64_field(&p, out);
}

int parse_proc_stat_starttime(const char *buf, uint64_t *out)
{
	return parse_proc_stat_u64(buf, 22, out);
}

int parse_proc_statm_size(const char *buf, uint64_t *out)
{
	const char *p = buf;

	return parse_u64_field(&p, out);
}

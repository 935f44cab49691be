/* SPDX-License-Identifier: MIT */
/*
 * Another uid's open memfds through /proc/PID/fdinfo: mount id and inode, matched to st_dev by a probe memfd
 * (holders-fdinfo.h).
 */
#define _GNU_SOURCE
#include "holders-fdinfo.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* An fdinfo text: pos, flags, mnt_id, ino and a few lines of the file's kind; a memfd's is under 100 bytes. */
#define FDINFO_BYTES 512

/* The whole of a small file below dirfd, NUL-terminated. Returns its length or -errno. */
static ssize_t read_text(int dirfd, const char *name, char *buf, size_t cap)
{
	ssize_t n;
	int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOCTTY);

	if (fd < 0)
		return -errno;
	do
		n = read(fd, buf, cap - 1);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		n = -errno;
	else
		buf[n] = '\0';
	close(fd);
	return n;
}

int holders_parse_fdinfo(const char *buf, size_t len, int *mnt_id, uint64_t *ino)
{
	const char *p = buf, *end = buf + len, *nl;
	bool have_mnt = false, have_ino = false;

	while (p < end && (nl = memchr(p, '\n', (size_t)(end - p)))) {
		bool m = (size_t)(nl - p) > 7 && memcmp(p, "mnt_id:", 7) == 0;
		bool i = (size_t)(nl - p) > 4 && memcmp(p, "ino:", 4) == 0;

		if (m || i) {
			const char *q = p + (m ? 7 : 4);
			uint64_t v = 0;

			while (q < nl && (*q == '\t' || *q == ' '))
				q++;
			if (q == nl)
				return -EBADMSG;
			for (; q < nl; q++) {
				if (*q < '0' || *q > '9' || v > (UINT64_MAX - 9) / 10)
					return -EBADMSG;
				v = v * 10 + (uint64_t)(*q - '0');
			}
			if (m && v > INT_MAX)
				return -EBADMSG;
			if (m) {
				*mnt_id = (int)v;
				have_mnt = true;
			} else {
				*ino = v;
				have_ino = true;
			}
		}
		p = nl + 1;
	}
	return have_mnt && have_ino ? 0 : -EBADMSG;
}

/* Whether (mnt_id, dev) is one of m's already (the default hugetlb size is 2 MiB on most hosts). */
static bool memfd_mount_known(const struct memfd_mounts *m, int mnt_id, dev_t dev)
{
	for (size_t i = 0; i < m->n; i++)
		if (m->mount[i].mnt_id == mnt_id && m->mount[i].dev == dev)
			return true;
	return false;
}

#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21U << 26) /* as pool-chunk.c makes hugetlb chunks */
#endif

void holders_memfd_mounts(struct memfd_mounts *m)
{
	/*
	 * Each hugetlb page size has a mount of its own: the pool's 2 MiB chunks (pool-chunk.c) are probed by that
	 * size, as a host booted with default_hugepagesz=1G puts a plain MFD_HUGETLB memfd on the 1 GiB one.
	 */
	static const unsigned flags[] = { MFD_CLOEXEC, MFD_CLOEXEC | MFD_HUGETLB | MFD_HUGE_2MB,
					  MFD_CLOEXEC | MFD_HUGETLB };

	m->n = 0;
	for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
		char path[64], buf[FDINFO_BYTES];
		struct stat st;
		uint64_t ino;
		int fd = memfd_create("pinbroker-probe", flags[i]), mnt;
		ssize_t n;

		if (fd < 0)
			continue; /* no hugetlbfs */
		snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
		n = fstat(fd, &st) < 0 ? -1 : read_text(AT_FDCWD, path, buf, sizeof(buf));
		close(fd);
		if (n > 0 && holders_parse_fdinfo(buf, (size_t)n, &mnt, &ino) == 0 && ino == (uint64_t)st.st_ino &&
		    !memfd_mount_known(m, mnt, st.st_dev))
			m->mount[m->n++] = (struct memfd_mount){ .mnt_id = mnt, .dev = st.st_dev };
	}
}

int holders_fdinfo_memfd(int dirfd, const char *name, const struct memfd_mounts *mm, dev_t *dev, ino_t *ino)
{
	char buf[FDINFO_BYTES];
	size_t hits = 0, at = 0;
	uint64_t v;
	ssize_t n = read_text(dirfd, name, buf, sizeof(buf));
	int mnt;

	if (n == -ENOENT)
		return -ENOENT;
	if (n <= 0 || holders_parse_fdinfo(buf, (size_t)n, &mnt, &v) < 0)
		return -EACCES;
	for (size_t i = 0; i < mm->n; i++)
		if (mm->mount[i].mnt_id == mnt) {
			hits++;
			at = i;
		}
	if (hits > 1)
		return -EACCES;
	if (hits == 0)
		return 0;
	*dev = mm->mount[at].dev;
	*ino = (ino_t)v;
	return 1;
}

int holders_fdinfo_memfds(int pdir, const struct memfd_mounts *mm, int (*fn)(dev_t dev, ino_t ino, void *ud), void *ud)
{
	struct dirent *e;
	int r = 0, fd = openat(pdir, "fdinfo", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d;

	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		r = -errno;
		close(fd);
		return r;
	}
	while (r == 0 && (e = readdir(d))) {
		dev_t dev;
		ino_t ino;
		int k;

		if (e->d_name[0] == '.')
			continue;
		k = holders_fdinfo_memfd(dirfd(d), e->d_name, mm, &dev, &ino);
		if (k == -ENOENT)
			continue; /* closed meanwhile */
		if (k < 0)
			r = k;
		else if (k == 1)
			r = fn(dev, ino, ud);
	}
	closedir(d);
	return r;
}

/* SPDX-License-Identifier: MIT */
/* The pressure monitor's files under proc-root: kept open between polls, re-read from offset 0. */
#define _GNU_SOURCE
#include "monitor-int.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "log.h"
#include "pressure.h"

/* Read up to cap bytes of rel (below root_fd). Returns 0 and *len, or a negative errno. */
int mon_read_rel(int root_fd, const char *rel, char *buf, size_t cap, size_t *len)
{
	size_t got = 0;
	int fd;

	*len = 0;
	fd = openat(root_fd, rel, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return -errno;
	while (got < cap) {
		ssize_t n = read(fd, buf + got, cap - got);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			n = -errno;
			close(fd);
			return (int)n;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	*len = got;
	return 0;
}

bool mon_exists_rel(int root_fd, const char *rel)
{
	return faccessat(root_fd, rel, F_OK, 0) == 0;
}

static bool fs_regenerates(long f_type)
{
	return f_type == PROC_SUPER_MAGIC || f_type == CGROUP_SUPER_MAGIC || f_type == CGROUP2_SUPER_MAGIC ||
	       f_type == SYSFS_MAGIC;
}

void mon_src_init(struct src_file *f, bool one_record)
{
	*f = (struct src_file){ .fd = -1, .one_record = one_record };
}

void mon_src_close(struct src_file *f)
{
	if (f->fd >= 0)
		close(f->fd);
	f->fd = -1;
}

static int src_open(int root_fd, struct src_file *f, const char *rel)
{
	struct statfs sfs;
	struct stat st;
	int r;

	f->fd = openat(root_fd, rel, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (f->fd < 0)
		return -errno;
	if (fstat(f->fd, &st) < 0 || fstatfs(f->fd, &sfs) < 0) {
		r = -errno;
		mon_src_close(f);
		return r;
	}
	f->pseudo = fs_regenerates((long)sfs.f_type);
	f->dev = st.st_dev;
	f->ino = st.st_ino;
	return 0;
}

/*
 * Read from offset 0 until EOF or cap. A seq_file of many records (vmstat)
 * hands out about a page per call, so only a read of 0 means the end. A
 * one-record file is whole after a short read, which saves the read of 0:
 * single_open() files (meminfo, pressure/memory) and cgroup files produce
 * all their text in one show, growing the buffer until it fits
 * (fs/seq_file.c), and a regular file reads short only at its end.
 */
static int pread_all(int fd, bool one_record, char *buf, size_t cap, size_t *len)
{
	size_t got = 0;

	while (got < cap) {
		ssize_t n = pread(fd, buf + got, cap - got, (off_t)got);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		got += (size_t)n;
		if (one_record)
			break;
	}
	*len = got;
	return 0;
}

/*
 * Read rel (below root_fd) through f, opening it on first use. A plain file
 * (a fixture) is checked by inode first, so one renamed over it is seen. A
 * kept fd that fails (ENODEV for a removed cgroup, ESTALE) is reopened once.
 * Returns 0 and *len, or a negative errno; f is then closed and the next read
 * opens it again. The caller reports failures once per outage.
 */
int mon_src_read(int root_fd, struct src_file *f, const char *rel, char *buf, size_t cap, size_t *len)
{
	struct stat st;
	bool fresh = false;
	int r;

	*len = 0;
	if (f->fd >= 0 && !f->pseudo) {
		if (fstatat(root_fd, rel, &st, 0) < 0) {
			r = -errno;
			mon_src_close(f);
			return r;
		}
		if (st.st_ino != f->ino || st.st_dev != f->dev)
			mon_src_close(f);
	}
	if (f->fd < 0) {
		r = src_open(root_fd, f, rel);
		if (r < 0)
			return r;
		fresh = true;
	}
	r = pread_all(f->fd, f->one_record, buf, cap, len);
	if (r < 0 && !fresh) {
		log_debug("pressure monitor: %s: %s; reopening", rel, strerror(-r));
		mon_src_close(f);
		r = src_open(root_fd, f, rel);
		if (r == 0)
			r = pread_all(f->fd, f->one_record, buf, cap, len);
	}
	if (r < 0)
		mon_src_close(f);
	return r;
}

int mon_read_meminfo(int root_fd, struct src_file *f, struct meminfo *m, char *buf)
{
	size_t len;
	int r;

	r = mon_src_read(root_fd, f, MEMINFO_REL, buf, READ_BUF_BYTES, &len);
	if (r < 0)
		return r;
	return pressure_parse_meminfo(buf, len, m);
}

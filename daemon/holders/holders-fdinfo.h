/* SPDX-License-Identifier: MIT */
/*
 * Another uid's open memfds through /proc/PID/fdinfo (holders.c's fallback): its fd/ folder (mode 0500) needs
 * CAP_DAC_READ_SEARCH to list, its fdinfo/ only PTRACE_MODE_READ (CAP_SYS_PTRACE, which the unit grants).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The mounts memfds live on (the kernel's shmem mount, hugetlbfs's of 2 MiB and of the default size), each with its
 * mount id and st_dev. */
struct memfd_mounts {
	struct memfd_mount {
		int mnt_id;
		dev_t dev;
	} mount[3];
	size_t n; /* 0: none found (no fdinfo ino:, or no /proc/self): the fallback is off */
};

/* Probe memfd_mounts with a memfd of each kind: its fstat's st_dev and its own fdinfo's mount id. */
void holders_memfd_mounts(struct memfd_mounts *m);

/*
 * The mnt_id: and ino: lines of a /proc/PID/fdinfo/N text (ino: since Linux 5.14). Returns 0, or -EBADMSG
 * when either is missing or not a number.
 */
int holders_parse_fdinfo(const char *buf, size_t len, int *mnt_id, uint64_t *ino);

/*
 * One entry of a process's fdinfo/ folder (dirfd; name: the fd's number): 1 with *dev and *ino when the fd is
 * open on a memfd mount, 0 when on another file, -ENOENT when it was closed meanwhile, -EACCES when its text
 * could not be read or parsed (a kernel before 5.14 has no ino:) or its mount id is one two probed kinds share.
 */
int holders_fdinfo_memfd(int dirfd, const char *name, const struct memfd_mounts *mm, dev_t *dev, ino_t *ino);

/*
 * Each fd the process of pdir (its /proc/PID folder) holds on a memfd mount, as the (st_dev, st_ino) it
 * has, to fn, until fn returns non-zero, which is returned. 0 once every fd was seen; -EACCES where an fd's
 * fdinfo could not be read or parsed (a kernel before 5.14 has no ino:), or its mount id is one two probed
 * kinds share (no dev to tell them apart); -errno where fdinfo/ cannot be opened. An fd closed meanwhile is
 * skipped.
 */
int holders_fdinfo_memfds(int pdir, const struct memfd_mounts *mm, int (*fn)(dev_t dev, ino_t ino, void *ud), void *ud);

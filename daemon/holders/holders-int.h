/* SPDX-License-Identifier: MIT */
/* What holders.c and holders-memfd.c share: /proc reading helpers and the buffer sizes. */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * Longest maps line: about 100 bytes of columns plus a path of PATH_MAX (4096)
 * whose every byte the kernel may escape as \ooo (4 bytes). Twice that leaves
 * room for the partial line carried between reads.
 */
#define MAPS_BUF_BYTES (2 * (128 + 4 * PATH_MAX))
/* The Uid: line is the ninth of status (Name, Umask, State, Tgid, Ngid, Pid, PPid, TracerPid, Uid). */
#define STATUS_BUF_BYTES 4096
/* An fd's link text: "/memfd:" NAME " (deleted)", NAME at most POOL_MEMFD_NAME_MAX; longer links are not ours. */
#define POOL_NAME_LINK_MAX 128

/* Skip one column and the spaces after it; NULL if the line ends first. */
const char *holders_skip_column(const char *p, const char *end);
/* An unsigned number in base 10 or 16 ending at stop (or end); NULL if none or it overflows. */
const char *holders_parse_num(const char *p, const char *end, int base, char stop, uint64_t *ret);
/*
 * A maps line's dev ("MAJ:MIN", hex) and inode (decimal, after blanks) columns at p: the position just past the
 * inode, or NULL when they do not parse, a number is out of range or the inode is 0 (anonymous memory).
 */
const char *holders_parse_dev_ino(const char *p, const char *end, dev_t *dev, ino_t *ino);
/* Read a small file below dirfd in one go. Returns the length or -errno. */
ssize_t holders_read_small(int dirfd, const char *name, char *buf, size_t cap);
/* A /proc entry's name as a pid; 0 when it is not one. */
pid_t holders_parse_pid(const char *s);
/* Whether -errno r means "not allowed to read" (another uid, hidepid). */
bool holders_unreadable_errno(int r);

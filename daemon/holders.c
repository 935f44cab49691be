/* SPDX-License-Identifier: MIT */
/* Finding every process of one uid that maps or holds a lease's memfds, through /proc as fuser does, and pinning each by pidfd. */
#define _GNU_SOURCE
#include "holders.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "util.h"

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

static int key_cmp(const void *a, const void *b)
{
	const struct holder_key *x = a, *y = b;

	if (x->ino != y->ino)
		return x->ino < y->ino ? -1 : 1;
	if (x->dev != y->dev)
		return x->dev < y->dev ? -1 : 1;
	return 0;
}

void holders_sort_keys(struct holder_key *keys, size_t nkeys)
{
	if (nkeys > 1)
		qsort(keys, nkeys, sizeof(*keys), key_cmp);
}

static int key_index(const struct holder_key *keys, size_t nkeys, dev_t dev, ino_t ino)
{
	struct holder_key k = { .dev = dev, .ino = ino };
	const struct holder_key *hit = nkeys ? bsearch(&k, keys, nkeys, sizeof(*keys), key_cmp) : NULL;

	return hit ? (int)(hit - keys) : -ENOENT;
}

/* Skip one column and the spaces after it; NULL if the line ends first. */
static const char *skip_column(const char *p, const char *end)
{
	while (p < end && *p != ' ')
		p++;
	if (p >= end)
		return NULL;
	while (p < end && *p == ' ')
		p++;
	return p < end ? p : NULL;
}

/* An unsigned number in base 10 or 16 ending at stop (or end); NULL if none or it overflows. */
static const char *parse_num(const char *p, const char *end, int base, char stop, uint64_t *ret)
{
	uint64_t v = 0;
	const char *s = p;

	for (; p < end && *p != stop; p++) {
		unsigned d;

		if (*p >= '0' && *p <= '9')
			d = (unsigned)(*p - '0');
		else if (base == 16 && *p >= 'a' && *p <= 'f')
			d = (unsigned)(*p - 'a' + 10);
		else
			return NULL;
		if (v > (UINT64_MAX - d) / (unsigned)base)
			return NULL;
		v = v * (unsigned)base + d;
	}
	if (p == s)
		return NULL;
	*ret = v;
	return p;
}

/*
 * One maps line, without its newline:
 *   7fab4ad09000-7fab4ad0b000 rw-s 00000000 00:01 1607    /memfd:pinbroker-chunk (deleted)
 * (fs/proc/task_mmu.c show_map_vma: dev as %02x:%02x, inode as %lu, then the path.)
 */
static int maps_line(const char *p, const char *end, const struct holder_key *keys, size_t nkeys)
{
	uint64_t maj, min, ino;

	for (int i = 0; i < 3 && p; i++) /* range, perms, offset */
		p = skip_column(p, end);
	if (!p || !(p = parse_num(p, end, 16, ':', &maj)) || p >= end)
		return -ENOENT;
	if (!(p = parse_num(p + 1, end, 16, ' ', &min)) || p >= end)
		return -ENOENT;
	while (p < end && *p == ' ')
		p++;
	if (!parse_num(p, end, 10, ' ', &ino) || ino == 0) /* inode 0: anonymous memory */
		return -ENOENT;
	if (maj > UINT_MAX || min > UINT_MAX)
		return -ENOENT;
	return key_index(keys, nkeys, makedev((unsigned)maj, (unsigned)min), (ino_t)ino);
}

int holders_parse_maps(const char *buf, size_t len, const struct holder_key *keys, size_t nkeys, size_t *consumed)
{
	const char *p = buf, *end = buf + len, *nl;
	int r = -ENOENT;

	while (p < end && (nl = memchr(p, '\n', (size_t)(end - p)))) {
		r = maps_line(p, nl, keys, nkeys);
		p = nl + 1;
		if (r >= 0)
			break;
	}
	if (consumed)
		*consumed = (size_t)(p - buf);
	return r;
}

int holders_parse_status_uid(const char *buf, size_t len, uid_t ret[4])
{
	const char *p = buf, *end = buf + len, *nl;

	while (p < end && (nl = memchr(p, '\n', (size_t)(end - p)))) {
		if ((size_t)(nl - p) > 4 && memcmp(p, "Uid:", 4) == 0) {
			const char *q = p + 4;

			for (int i = 0; i < 4; i++) {
				uint64_t v;

				while (q < nl && (*q == '\t' || *q == ' '))
					q++;
				/* Each id ends at a tab, or the last at the newline. */
				if (!(q = parse_num(q, nl, 10, i < 3 ? '\t' : '\n', &v)) || v >= (uid_t)-1)
					return -EBADMSG;
				ret[i] = (uid_t)v;
			}
			return q == nl ? 0 : -EBADMSG;
		}
		p = nl + 1;
	}
	return -EBADMSG;
}

/* Read a small file below dirfd in one go. Returns the length or -errno. */
static ssize_t read_small(int dirfd, const char *name, char *buf, size_t cap)
{
	size_t have = 0;
	ssize_t n;
	int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOCTTY);

	if (fd < 0)
		return -errno;
	while (have < cap && (n = read(fd, buf + have, cap - have)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			n = -errno;
			close(fd);
			return n;
		}
		have += (size_t)n;
	}
	close(fd);
	return (ssize_t)have;
}

/* 1 when the process behind pdir has exactly uid as its real, effective and saved uid; 0 if not; -errno. */
static int uid_matches(int pdir, uid_t uid)
{
	char buf[STATUS_BUF_BYTES];
	ssize_t n = read_small(pdir, "status", buf, sizeof(buf));
	uid_t ids[4];

	if (n < 0)
		return (int)n;
	if (holders_parse_status_uid(buf, (size_t)n, ids) < 0)
		return -EBADMSG;
	/*
	 * All three, not just one: a set-uid program the user started (real uid
	 * theirs, effective root) is not the user's to lose, even though the
	 * kernel would let the user signal it.
	 */
	return ids[0] == uid && ids[1] == uid && ids[2] == uid;
}

/* Index of the first key mapped in pdir's maps, -ENOENT, or -errno. */
static int maps_match(int pdir, const struct holder_key *keys, size_t nkeys, char *buf)
{
	size_t have = 0, used;
	ssize_t n;
	int r = -ENOENT, fd = openat(pdir, "maps", O_RDONLY | O_CLOEXEC | O_NOCTTY);

	if (fd < 0)
		return -errno;
	for (;;) {
		n = read(fd, buf + have, MAPS_BUF_BYTES - have);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			break;
		}
		if (n == 0)
			break; /* an unterminated last line is not procfs: ignored */
		have += (size_t)n;
		r = holders_parse_maps(buf, have, keys, nkeys, &used);
		if (r >= 0)
			break;
		if (used == 0 && have == MAPS_BUF_BYTES)
			break; /* a line longer than the kernel writes: not procfs */
		memmove(buf, buf + used, have - used);
		have -= used;
	}
	close(fd);
	return r;
}

/* Index of the first key pdir's process holds an fd to, -ENOENT, or -errno. */
static int fds_match(int pdir, const struct holder_key *keys, size_t nkeys)
{
	struct dirent *e;
	struct stat st;
	int r = -ENOENT, fd = openat(pdir, "fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d;

	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		r = -errno;
		close(fd);
		return r;
	}
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		/* stat() through /proc/PID/fd/N reaches the open file itself, deleted or not. */
		if (fstatat(dirfd(d), e->d_name, &st, 0) < 0)
			continue; /* closed meanwhile */
		r = key_index(keys, nkeys, st.st_dev, st.st_ino);
		if (r >= 0)
			break;
	}
	closedir(d);
	return r;
}

/* The key index pdir's process (of uid) maps or holds, -ENOENT when it holds none or is not uid's, or -errno. */
static int process_match(int pdir, uid_t uid, const struct holder_key *keys, size_t nkeys, char *buf)
{
	int r = uid_matches(pdir, uid);

	if (r <= 0)
		return r < 0 ? r : -ENOENT;
	r = maps_match(pdir, keys, nkeys, buf);
	if (r != -ENOENT)
		return r;
	return fds_match(pdir, keys, nkeys);
}

static pid_t parse_pid(const char *s)
{
	uint64_t v = 0;

	if (*s < '1' || *s > '9')
		return 0;
	for (; *s; s++) {
		if (*s < '0' || *s > '9' || v > INT_MAX / 10)
			return 0;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	return v <= INT_MAX ? (pid_t)v : 0;
}

static bool unreadable_errno(int r)
{
	return r == -EACCES || r == -EPERM;
}

int holders_find(const char *proc_root, uid_t uid, const struct holder_key *keys, size_t nkeys, pid_t exclude_pid,
		 struct holder **ret, size_t *n, size_t *unreadable)
{
	struct holder_key *sorted = NULL;
	struct holder *out = NULL;
	size_t nout = 0, cap = 0, nunread = 0;
	pid_t self = getpid();
	struct dirent *e;
	char *buf = NULL;
	int root_fd = -1, proc_fd = -1;
	DIR *d = NULL;
	int r;

	*ret = NULL;
	*n = 0;
	if (unreadable)
		*unreadable = 0;
	if (nkeys == 0)
		return 0;
	sorted = malloc(nkeys * sizeof(*sorted));
	buf = malloc(MAPS_BUF_BYTES);
	if (!sorted || !buf) {
		r = -ENOMEM;
		goto out;
	}
	memcpy(sorted, keys, nkeys * sizeof(*sorted));
	holders_sort_keys(sorted, nkeys);
	root_fd = open(proc_root && *proc_root ? proc_root : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0 || (proc_fd = openat(root_fd, "proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		r = -errno;
		goto out;
	}
	d = fdopendir(proc_fd);
	if (!d) {
		r = -errno;
		goto out;
	}
	proc_fd = -1; /* owned by d now */
	while ((e = readdir(d))) {
		pid_t pid = parse_pid(e->d_name);
		int pdir, pidfd, k;

		if (pid <= 1 || pid == self || pid == exclude_pid)
			continue;
		/*
		 * The /proc/PID directory fd stays bound to the process it was
		 * opened on: once that process is gone, lookups below it fail,
		 * even if the pid number has been given to another process.
		 */
		pdir = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (pdir < 0)
			continue;
		k = process_match(pdir, uid, sorted, nkeys, buf);
		if (k < 0) {
			nunread += unreadable_errno(k);
			close(pdir);
			continue;
		}
		/*
		 * pidfd first, then check again through pdir: if the check still
		 * passes, pdir's process was alive after pidfd_open, so the pid
		 * could not have been reused and the pidfd names that process.
		 */
		pidfd = sys_pidfd_open(pid, 0);
		if (pidfd < 0) {
			close(pdir);
			continue; /* exited, or no pidfds: never signal by pid */
		}
		k = process_match(pdir, uid, sorted, nkeys, buf);
		close(pdir);
		if (k < 0) {
			close(pidfd);
			continue;
		}
		if (nout == cap) {
			size_t ncap = cap ? cap * 2 : 8;
			struct holder *no = realloc(out, ncap * sizeof(*out));

			if (!no) {
				close(pidfd);
				r = -ENOMEM;
				goto out;
			}
			out = no;
			cap = ncap;
		}
		/* Report the caller's index, not the sorted copy's. */
		for (size_t i = 0; i < nkeys; i++)
			if (keys[i].dev == sorted[k].dev && keys[i].ino == sorted[k].ino) {
				k = (int)i;
				break;
			}
		out[nout++] = (struct holder){ .pid = pid, .pidfd = pidfd, .key = (size_t)k };
	}
	*ret = out;
	*n = nout;
	out = NULL;
	nout = 0;
	if (unreadable)
		*unreadable = nunread;
	r = 0;
out:
	holders_free(out, nout);
	if (d)
		closedir(d);
	if (proc_fd >= 0)
		close(proc_fd);
	if (root_fd >= 0)
		close(root_fd);
	free(buf);
	free(sorted);
	return r;
}

int holders_parse_memfd_map(const char *line, size_t len, const char *name, dev_t *dev, ino_t *ino,
			    uint64_t *end_bytes)
{
	const char *p = line, *end = line + len, *dash;
	uint64_t start, stop, off, maj, min, inode;
	size_t nlen = strlen(name);

	dash = memchr(p, '-', len);
	if (!dash || !parse_num(p, dash, 16, '-', &start) || !(p = parse_num(dash + 1, end, 16, ' ', &stop)) ||
	    stop < start)
		return -ENOENT;
	p = skip_column(p, end); /* perms */
	if (!p || !(p = skip_column(p, end)))
		return -ENOENT;
	/* The offset column, then dev and inode as maps_line reads them. */
	if (!parse_num(line + (p - line), end, 16, ' ', &off))
		return -ENOENT;
	p = skip_column(p, end);
	if (!p || !(p = parse_num(p, end, 16, ':', &maj)) || p >= end)
		return -ENOENT;
	if (!(p = parse_num(p + 1, end, 16, ' ', &min)) || p >= end)
		return -ENOENT;
	while (p < end && *p == ' ')
		p++;
	if (!(p = parse_num(p, end, 10, ' ', &inode)) || inode == 0 || maj > UINT_MAX || min > UINT_MAX)
		return -ENOENT;
	while (p < end && *p == ' ')
		p++;
	/* "/memfd:" NAME " (deleted)" and nothing else: another name, or a file that only looks like one, is not ours. */
	if ((size_t)(end - p) != 7 + nlen + 10 || memcmp(p, "/memfd:", 7) != 0 || memcmp(p + 7, name, nlen) != 0 ||
	    memcmp(p + 7 + nlen, " (deleted)", 10) != 0)
		return -ENOENT;
	if (off > UINT64_MAX - (stop - start))
		return -ENOENT;
	*dev = makedev((unsigned)maj, (unsigned)min);
	*ino = (ino_t)inode;
	*end_bytes = off + (stop - start);
	return 0;
}

/* Every mapping of name in pdir's maps, to on_memfd. Returns 0 once read to the end, or -errno. */
static int scan_maps(int pdir, pid_t pid, uid_t uid, const char *name, holders_memfd_fn *on_memfd, void *ud, char *buf)
{
	size_t have = 0;
	ssize_t n;
	int r = 0, fd = openat(pdir, "maps", O_RDONLY | O_CLOEXEC | O_NOCTTY);

	if (fd < 0)
		return -errno;
	for (;;) {
		const char *p, *end, *nl;

		n = read(fd, buf + have, MAPS_BUF_BYTES - have);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			break;
		}
		if (n == 0)
			break;
		have += (size_t)n;
		p = buf;
		end = buf + have;
		while (p < end && (nl = memchr(p, '\n', (size_t)(end - p)))) {
			struct holders_memfd m = { .pid = pid, .uid = uid };

			if (holders_parse_memfd_map(p, (size_t)(nl - p), name, &m.dev, &m.ino, &m.bytes) == 0)
				on_memfd(&m, ud);
			p = nl + 1;
		}
		if (p == buf && have == MAPS_BUF_BYTES) {
			r = -EBADMSG; /* a line longer than the kernel writes: not procfs */
			break;
		}
		memmove(buf, p, (size_t)(end - p));
		have = (size_t)(end - p);
	}
	close(fd);
	return r;
}

/* Every fd of pdir's process open on a memfd called name, to on_memfd. Returns 0 once read to the end, or -errno. */
static int scan_fds(int pdir, pid_t pid, uid_t uid, const char *name, holders_memfd_fn *on_memfd, void *ud)
{
	char want[POOL_NAME_LINK_MAX], link[POOL_NAME_LINK_MAX];
	struct dirent *e;
	struct stat st;
	int fd = openat(pdir, "fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC), wlen, r = 0;
	DIR *d;

	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		r = -errno;
		close(fd);
		return r;
	}
	wlen = snprintf(want, sizeof(want), "/memfd:%s (deleted)", name);
	errno = 0;
	while ((e = readdir(d))) {
		ssize_t n;

		if (e->d_name[0] == '.')
			continue;
		n = readlinkat(dirfd(d), e->d_name, link, sizeof(link));
		if (n != wlen || memcmp(link, want, (size_t)n) != 0)
			continue;
		/* stat() through /proc/PID/fd/N reaches the open file itself. */
		if (fstatat(dirfd(d), e->d_name, &st, 0) < 0)
			continue; /* closed meanwhile */
		on_memfd(&(struct holders_memfd){ .pid = pid, .uid = uid, .dev = st.st_dev, .ino = st.st_ino,
						  .bytes = (uint64_t)st.st_size },
			 ud);
		errno = 0;
	}
	if (errno)
		r = -errno;
	closedir(d);
	return r;
}

int holders_scan_memfds(const char *proc_root, const char *name, holders_memfd_fn *on_memfd, holders_read_fn *on_read,
			void *ud, size_t *unreadable)
{
	size_t nunread = 0;
	pid_t self = getpid();
	struct dirent *e;
	char *buf = NULL;
	int root_fd = -1, proc_fd = -1;
	DIR *d = NULL;
	int r;

	if (unreadable)
		*unreadable = 0;
	if (strlen(name) + 32 > POOL_NAME_LINK_MAX)
		return -ENAMETOOLONG;
	buf = malloc(MAPS_BUF_BYTES);
	if (!buf)
		return -ENOMEM;
	root_fd = open(proc_root && *proc_root ? proc_root : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0 || (proc_fd = openat(root_fd, "proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		r = -errno;
		goto out;
	}
	d = fdopendir(proc_fd);
	if (!d) {
		r = -errno;
		goto out;
	}
	proc_fd = -1;
	while ((e = readdir(d))) {
		pid_t pid = parse_pid(e->d_name);
		char sbuf[STATUS_BUF_BYTES];
		uid_t ids[4];
		ssize_t n;
		int pdir, rm, rf;

		if (pid <= 1 || pid == self)
			continue;
		pdir = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (pdir < 0)
			continue;
		n = read_small(pdir, "status", sbuf, sizeof(sbuf));
		if (n < 0 || holders_parse_status_uid(sbuf, (size_t)n, ids) < 0) {
			nunread += n < 0 && unreadable_errno((int)n);
			close(pdir);
			continue;
		}
		rm = scan_maps(pdir, pid, ids[0], name, on_memfd, ud, buf);
		rf = scan_fds(pdir, pid, ids[0], name, on_memfd, ud);
		close(pdir);
		if (rm == 0 && rf == 0) {
			if (on_read)
				on_read(pid, ud);
		} else if (unreadable_errno(rm) || unreadable_errno(rf)) {
			nunread++;
		}
	}
	if (unreadable)
		*unreadable = nunread;
	r = 0;
out:
	if (d)
		closedir(d);
	if (proc_fd >= 0)
		close(proc_fd);
	if (root_fd >= 0)
		close(root_fd);
	free(buf);
	return r;
}

bool holders_can_inspect_all(void)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = { { 0 } };

	if (syscall(SYS_capget, &h, data) < 0)
		return geteuid() == 0;
	return data[CAP_SYS_PTRACE / 32].effective & (1u << (CAP_SYS_PTRACE % 32));
}

void holders_free(struct holder *h, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (h[i].pidfd >= 0)
			close(h[i].pidfd);
	free(h);
}

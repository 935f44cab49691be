/* SPDX-License-Identifier: MIT */
/*
 * Finding every process of one uid that maps or holds a lease's memfds, through /proc as fuser does, and pinning each
 * by pidfd.
 */
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

#include "holders-fdinfo.h"
#include "holders-int.h"
#include "util.h"

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
const char *holders_skip_column(const char *p, const char *end)
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
const char *holders_parse_num(const char *p, const char *end, int base, char stop, uint64_t *ret)
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
const char *holders_parse_dev_ino(const char *p, const char *end, dev_t *dev, ino_t *ino)
{
	uint64_t maj, min, inode;

	if (!(p = holders_parse_num(p, end, 16, ':', &maj)) || p >= end)
		return NULL;
	if (!(p = holders_parse_num(p + 1, end, 16, ' ', &min)) || p >= end)
		return NULL;
	while (p < end && *p == ' ')
		p++;
	if (!(p = holders_parse_num(p, end, 10, ' ', &inode)) || inode == 0 || maj > UINT_MAX || min > UINT_MAX)
		return NULL;
	*dev = makedev((unsigned)maj, (unsigned)min);
	*ino = (ino_t)inode;
	return p;
}

static int maps_line(const char *p, const char *end, const struct holder_key *keys, size_t nkeys)
{
	dev_t dev;
	ino_t ino;

	for (int i = 0; i < 3 && p; i++) /* range, perms, offset */
		p = holders_skip_column(p, end);
	if (!p || !holders_parse_dev_ino(p, end, &dev, &ino))
		return -ENOENT;
	return key_index(keys, nkeys, dev, ino);
}

/* As holders_parse_maps; with filter, a key counts only when its uid is uid (a process of that uid). */
static int parse_maps(const char *buf, size_t len, const struct holder_key *keys, size_t nkeys, size_t *consumed,
		      bool filter, uid_t uid)
{
	const char *p = buf, *end = buf + len, *nl;
	int r = -ENOENT;

	while (p < end && (nl = memchr(p, '\n', (size_t)(end - p)))) {
		r = maps_line(p, nl, keys, nkeys);
		p = nl + 1;
		if (r >= 0 && (!filter || keys[r].uid == uid))
			break;
		r = -ENOENT;
	}
	if (consumed)
		*consumed = (size_t)(p - buf);
	return r;
}

int holders_parse_maps(const char *buf, size_t len, const struct holder_key *keys, size_t nkeys, size_t *consumed)
{
	return parse_maps(buf, len, keys, nkeys, consumed, false, 0);
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
				if (!(q = holders_parse_num(q, nl, 10, i < 3 ? '\t' : '\n', &v)) || v >= (uid_t)-1)
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
ssize_t holders_read_small(int dirfd, const char *name, char *buf, size_t cap)
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

static int uid_cmp(const void *a, const void *b)
{
	uid_t x = *(const uid_t *)a, y = *(const uid_t *)b;

	return x < y ? -1 : x > y;
}

static int pid_cmp(const void *a, const void *b)
{
	pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * 1 and *ret when the process behind pdir has one uid as its real, effective
 * and saved uid, and that uid is in uids (sorted); 0 if not; -errno.
 */
static int uid_matches(int pdir, const uid_t *uids, size_t nuids, uid_t *ret)
{
	char buf[STATUS_BUF_BYTES];
	ssize_t n = holders_read_small(pdir, "status", buf, sizeof(buf));
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
	if (ids[0] != ids[1] || ids[0] != ids[2] || !bsearch(&ids[0], uids, nuids, sizeof(*uids), uid_cmp))
		return 0;
	*ret = ids[0];
	return 1;
}

/* Index of the first key mapped in pdir's maps, -ENOENT, or -errno. */
static int maps_match(int pdir, const struct holder_key *keys, size_t nkeys, uid_t uid, char *buf)
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
		r = parse_maps(buf, have, keys, nkeys, &used, true, uid);
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

struct key_want {
	const struct holder_key *keys;
	size_t nkeys;
	uid_t uid;
};

/* holders_fdinfo_memfds's fn for fds_match: the key's index + 1 where (dev, ino) is a key of uid, else 0. */
static int fdinfo_key(dev_t dev, ino_t ino, void *ud)
{
	const struct key_want *w = ud;
	int k = key_index(w->keys, w->nkeys, dev, ino);

	return k >= 0 && w->keys[k].uid == w->uid ? k + 1 : 0;
}

/*
 * Index of the first key pdir's process holds an fd to, -ENOENT, or -errno. Where its fd/ cannot be listed
 * (another uid), through fdinfo (holders-fdinfo.h).
 */
static int fds_match(int pdir, const struct holder_key *keys, size_t nkeys, uid_t uid, const struct memfd_mounts *mm)
{
	struct dirent *e;
	struct stat st;
	int r = -ENOENT, fd = openat(pdir, "fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d;

	if (fd < 0 && (errno == EACCES || errno == EPERM) && mm && mm->n) {
		r = holders_fdinfo_memfds(pdir, mm, fdinfo_key, &(struct key_want){ keys, nkeys, uid });
		return r > 0 ? r - 1 : r == 0 ? -ENOENT : r;
	}
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
		if (r >= 0 && keys[r].uid == uid)
			break;
		r = -ENOENT;
	}
	closedir(d);
	return r;
}

/*
 * The key index pdir's process maps or holds, of a key whose uid is the
 * process's (its real, effective and saved uid, one of uids); -ENOENT when it
 * holds none or its uid is not among them, or -errno.
 */
static int process_match(int pdir, const uid_t *uids, size_t nuids, const struct holder_key *keys, size_t nkeys,
			 char *buf, const struct memfd_mounts *mm)
{
	uid_t uid;
	int r = uid_matches(pdir, uids, nuids, &uid);

	if (r <= 0)
		return r < 0 ? r : -ENOENT;
	r = maps_match(pdir, keys, nkeys, uid, buf);
	if (r != -ENOENT)
		return r;
	return fds_match(pdir, keys, nkeys, uid, mm);
}

pid_t holders_parse_pid(const char *s)
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

bool holders_unreadable_errno(int r)
{
	return r == -EACCES || r == -EPERM;
}

struct holders_scan {
	const struct holder_key *caller_keys; /* for reporting the caller's index; the caller keeps it */
	struct holder_key *keys;              /* sorted copy */
	size_t nkeys;
	uid_t *uids; /* the keys' uids, sorted, unique */
	size_t nuids;
	pid_t *exclude; /* sorted */
	size_t nexclude;
	pid_t self;
	DIR *d;
	char *buf;
	struct holder *out;
	size_t nout, cap;
	size_t unreadable;
	size_t examined;
	struct memfd_mounts mounts; /* for fds_match through fdinfo */
	bool done;
};

void holders_scan_free(struct holders_scan *s)
{
	if (!s)
		return;
	holders_free(s->out, s->nout);
	if (s->d)
		closedir(s->d);
	free(s->keys);
	free(s->uids);
	free(s->exclude);
	free(s->buf);
	free(s);
}

int holders_scan_new(const char *proc_root, const struct holder_key *keys, size_t nkeys, const pid_t *exclude,
		     size_t nexclude, struct holders_scan **ret)
{
	struct holders_scan *s = calloc(1, sizeof(*s));
	int root_fd = -1, proc_fd = -1;
	int r;

	*ret = NULL;
	if (!s)
		return -ENOMEM;
	s->self = getpid();
	s->caller_keys = keys;
	s->nkeys = nkeys;
	if (nkeys == 0) {
		s->done = true;
		*ret = s;
		return 0;
	}
	s->keys = malloc(nkeys * sizeof(*s->keys));
	s->uids = malloc(nkeys * sizeof(*s->uids));
	s->exclude = malloc((nexclude ? nexclude : 1) * sizeof(*s->exclude));
	s->buf = malloc(MAPS_BUF_BYTES);
	if (!s->keys || !s->uids || !s->exclude || !s->buf) {
		r = -ENOMEM;
		goto fail;
	}
	memcpy(s->keys, keys, nkeys * sizeof(*keys));
	holders_sort_keys(s->keys, nkeys);
	holders_memfd_mounts(&s->mounts);
	for (size_t i = 0; i < nkeys; i++)
		s->uids[i] = keys[i].uid;
	qsort(s->uids, nkeys, sizeof(*s->uids), uid_cmp);
	for (size_t i = 0; i < nkeys; i++)
		if (s->nuids == 0 || s->uids[s->nuids - 1] != s->uids[i])
			s->uids[s->nuids++] = s->uids[i];
	if (nexclude)
		memcpy(s->exclude, exclude, nexclude * sizeof(*exclude));
	s->nexclude = nexclude;
	qsort(s->exclude, nexclude, sizeof(*s->exclude), pid_cmp);
	root_fd = open(proc_root && *proc_root ? proc_root : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0 || (proc_fd = openat(root_fd, "proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		r = -errno;
		goto fail;
	}
	s->d = fdopendir(proc_fd);
	if (!s->d) {
		r = -errno;
		goto fail;
	}
	close(root_fd);
	*ret = s;
	return 0;
fail:
	if (proc_fd >= 0 && !s->d)
		close(proc_fd);
	if (root_fd >= 0)
		close(root_fd);
	holders_scan_free(s);
	return r;
}

/* One /proc entry: a holder appended to s->out, or nothing. Returns 0 or -ENOMEM. */
static int scan_entry(struct holders_scan *s, const char *name)
{
	pid_t pid = holders_parse_pid(name);
	int pdir, pidfd, k;

	if (pid <= 1 || pid == s->self || (s->nexclude && bsearch(&pid, s->exclude, s->nexclude, sizeof(pid), pid_cmp)))
		return 0;
	s->examined++;
	/*
	 * The /proc/PID directory fd stays bound to the process it was opened on:
	 * once that process is gone, lookups below it fail, even if the pid
	 * number has been given to another process.
	 */
	pdir = openat(dirfd(s->d), name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (pdir < 0)
		return 0;
	k = process_match(pdir, s->uids, s->nuids, s->keys, s->nkeys, s->buf, &s->mounts);
	if (k < 0) {
		s->unreadable += holders_unreadable_errno(k);
		close(pdir);
		return 0;
	}
	/*
	 * pidfd first, then check again through pdir: if the check still passes,
	 * pdir's process was alive after pidfd_open, so the pid could not have
	 * been reused and the pidfd names that process.
	 */
	pidfd = sys_pidfd_open(pid, 0);
	if (pidfd < 0) {
		close(pdir);
		return 0; /* exited, or no pidfds: never signal by pid */
	}
	k = process_match(pdir, s->uids, s->nuids, s->keys, s->nkeys, s->buf, &s->mounts);
	close(pdir);
	if (k < 0) {
		close(pidfd);
		return 0;
	}
	if (s->nout == s->cap) {
		size_t ncap = s->cap ? s->cap * 2 : 8;
		struct holder *no = realloc(s->out, ncap * sizeof(*no));

		if (!no) {
			close(pidfd);
			return -ENOMEM;
		}
		s->out = no;
		s->cap = ncap;
	}
	/* Report the caller's index, not the sorted copy's. */
	for (size_t i = 0; i < s->nkeys; i++)
		if (s->caller_keys[i].dev == s->keys[k].dev && s->caller_keys[i].ino == s->keys[k].ino) {
			k = (int)i;
			break;
		}
	s->out[s->nout++] = (struct holder){ .pid = pid, .pidfd = pidfd, .key = (size_t)k };
	return 0;
}

int holders_scan_step(struct holders_scan *s, uint64_t budget_us)
{
	uint64_t t0 = now_us();
	struct dirent *e;
	int r;

	/* At least one entry per step, so a tiny budget still ends. */
	while (!s->done) {
		errno = 0;
		e = readdir(s->d);
		if (!e) {
			s->done = true;
			break;
		}
		r = scan_entry(s, e->d_name);
		if (r < 0)
			return r;
		if (now_us() - t0 >= budget_us)
			break;
	}
	return s->done ? 1 : 0;
}

void holders_scan_take(struct holders_scan *s, struct holder **ret, size_t *n, size_t *unreadable, size_t *examined)
{
	*ret = s->out;
	*n = s->nout;
	s->out = NULL;
	s->nout = s->cap = 0;
	if (unreadable)
		*unreadable = s->unreadable;
	if (examined)
		*examined = s->examined;
}

int holders_find(const char *proc_root, uid_t uid, const struct holder_key *keys, size_t nkeys, pid_t exclude_pid,
		 struct holder **ret, size_t *n, size_t *unreadable)
{
	struct holder_key *k = NULL;
	struct holders_scan *s = NULL;
	int r;

	*ret = NULL;
	*n = 0;
	if (unreadable)
		*unreadable = 0;
	if (nkeys == 0)
		return 0;
	k = malloc(nkeys * sizeof(*k));
	if (!k)
		return -ENOMEM;
	for (size_t i = 0; i < nkeys; i++) {
		k[i] = keys[i];
		k[i].uid = uid;
	}
	r = holders_scan_new(proc_root, k, nkeys, &exclude_pid, exclude_pid > 0 ? 1 : 0, &s);
	if (r == 0) {
		r = holders_scan_step(s, UINT64_MAX);
		if (r >= 0) {
			holders_scan_take(s, ret, n, unreadable, NULL);
			r = 0;
		}
	}
	holders_scan_free(s);
	free(k);
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

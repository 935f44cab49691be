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

#include "holders-fdinfo.h"
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
	pid_t pid = parse_pid(name);
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
		s->unreadable += unreadable_errno(k);
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

int holders_parse_memfd_map(const char *line, size_t len, const char *name, dev_t *dev, ino_t *ino, uint64_t *end_bytes)
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

/*
 * The size of the file a maps line maps, from fstat through map_files/START-END
 * (the line's first column): a mapping's end is the holder's to choose (mremap
 * may stretch it far past the memfd's end, PROT_NONE), the file's size is not.
 * Where map_files cannot be read (no CAP_SYS_ADMIN), the smaller of the two.
 */
static uint64_t map_file_size(int pdir, const char *line, size_t len, dev_t dev, ino_t ino, uint64_t end_bytes,
			      uint64_t *allocated)
{
	char path[64];
	size_t n = strcspn(line, " ");
	struct stat st;

	*allocated = UINT64_MAX;
	if (n > len || n + 11 >= sizeof(path))
		return end_bytes;
	memcpy(path, "map_files/", 10);
	memcpy(path + 10, line, n);
	path[10 + n] = '\0';
	if (fstatat(pdir, path, &st, 0) < 0 || st.st_dev != dev || st.st_ino != ino)
		return end_bytes;
	*allocated = (uint64_t)st.st_blocks * 512u;
	return (uint64_t)st.st_size < end_bytes ? (uint64_t)st.st_size : end_bytes;
}

/* The memfds of one process seen mapped under the name (for scan_fdinfo); past MAPPED_MAX, overflow. */
#define MAPPED_MAX 64
struct mapped {
	struct holder_key k[MAPPED_MAX];
	size_t n;
	bool overflow;
};

static void mapped_add(struct mapped *mp, dev_t dev, ino_t ino)
{
	for (size_t i = 0; i < mp->n; i++)
		if (mp->k[i].dev == dev && mp->k[i].ino == ino)
			return;
	if (mp->n == MAPPED_MAX)
		mp->overflow = true;
	else
		mp->k[mp->n++] = (struct holder_key){ .dev = dev, .ino = ino };
}

/* Every mapping of name in pdir's maps, to on_memfd (and into mp). Returns 0 once read to the end, or -errno. */
static int scan_maps(int pdir, pid_t pid, uid_t uid, const char *name, holders_memfd_fn *on_memfd, void *ud, char *buf,
		     struct mapped *mp)
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

			if (holders_parse_memfd_map(p, (size_t)(nl - p), name, &m.dev, &m.ino, &m.bytes) == 0) {
				m.bytes = map_file_size(pdir, p, (size_t)(nl - p), m.dev, m.ino, m.bytes, &m.allocated);
				mapped_add(mp, m.dev, m.ino);
				on_memfd(&m, ud);
			}
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
		on_memfd(&(struct holders_memfd){ .pid = pid,
						  .uid = uid,
						  .dev = st.st_dev,
						  .ino = st.st_ino,
						  .bytes = (uint64_t)st.st_size,
						  .allocated = (uint64_t)st.st_blocks * 512u },
			 ud);
		errno = 0;
	}
	if (errno)
		r = -errno;
	closedir(d);
	return r;
}

/* holders_fdinfo_memfds's fn for scan_fdinfo: 1 (stop) at an fd of a memfd not mapped under the name. */
static int fdinfo_mapped(dev_t dev, ino_t ino, void *ud)
{
	const struct mapped *mp = ud;

	for (size_t k = 0; k < mp->n; k++)
		if (mp->k[k].dev == dev && mp->k[k].ino == ino)
			return 0;
	return 1;
}

/*
 * Where pdir's fd/ cannot be listed (another uid without CAP_DAC_READ_SEARCH) but fdinfo/ can: 0 when every fd
 * it holds on a memfd mount is a memfd it maps under the name (scan_maps reported it: the fd adds nothing),
 * else -EACCES: an fd of a memfd whose name this cannot read may be a chunk, so the process stays unread (the
 * safe side).
 */
static int scan_fdinfo(int pdir, const struct memfd_mounts *mm, const struct mapped *mp)
{
	int r = holders_fdinfo_memfds(pdir, mm, fdinfo_mapped, (void *)mp);

	return r == 0 ? 0 : r > 0 ? -EACCES : r;
}

int holders_scan_memfds(const char *proc_root, const char *name, holders_memfd_fn *on_memfd, holders_read_fn *on_read,
			void *ud, size_t *unreadable)
{
	return holders_scan_memfds_of(proc_root, name, NULL, on_memfd, on_read, ud, unreadable);
}

int holders_scan_memfds_of(const char *proc_root, const char *name, holders_want_fn *want, holders_memfd_fn *on_memfd,
			   holders_read_fn *on_read, void *ud, size_t *unreadable)
{
	struct memfd_mounts mm;
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
	holders_memfd_mounts(&mm);
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
		struct mapped mp = { .n = 0 };
		uid_t ids[4];
		ssize_t n;
		int pdir, rm, rf;

		if (pid <= 1 || pid == self)
			continue;
		pdir = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (pdir < 0)
			continue;
		/* The directory's owner first (one fstat): a process the caller does not want costs no read. */
		if (want) {
			struct stat st;

			if (fstat(pdir, &st) < 0 || !want(pid, st.st_uid, ud)) {
				close(pdir);
				continue;
			}
		}
		n = read_small(pdir, "status", sbuf, sizeof(sbuf));
		if (n < 0 || holders_parse_status_uid(sbuf, (size_t)n, ids) < 0) {
			nunread += n < 0 && unreadable_errno((int)n);
			close(pdir);
			continue;
		}
		rm = scan_maps(pdir, pid, ids[0], name, on_memfd, ud, buf, &mp);
		rf = scan_fds(pdir, pid, ids[0], name, on_memfd, ud);
		if (rm == 0 && unreadable_errno(rf) && mm.n && !mp.overflow)
			rf = scan_fdinfo(pdir, &mm, &mp);
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

/* SPDX-License-Identifier: MIT */
/* Every process that maps or holds a memfd of a given name, through /proc, in slices: the restart's orphan scans. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "holders-fdinfo.h"
#include "holders-int.h"
#include "holders.h"
#include "util.h"

int holders_parse_memfd_map(const char *line, size_t len, const char *name, dev_t *dev, ino_t *ino, uint64_t *end_bytes)
{
	const char *p = line, *end = line + len, *dash;
	uint64_t start, stop, off;
	size_t nlen = strlen(name);
	dev_t d;
	ino_t i;

	dash = memchr(p, '-', len);
	if (!dash || !holders_parse_num(p, dash, 16, '-', &start) ||
	    !(p = holders_parse_num(dash + 1, end, 16, ' ', &stop)) || stop < start)
		return -ENOENT;
	p = holders_skip_column(p, end); /* perms */
	if (!p || !(p = holders_skip_column(p, end)))
		return -ENOENT;
	/* The offset column, then dev and inode as maps_line reads them. */
	if (!holders_parse_num(line + (p - line), end, 16, ' ', &off))
		return -ENOENT;
	p = holders_skip_column(p, end);
	if (!p || !(p = holders_parse_dev_ino(p, end, &d, &i)))
		return -ENOENT;
	while (p < end && *p == ' ')
		p++;
	/*
	 * "/memfd:" NAME " (deleted)" and nothing else: another name, or a file that only looks like one, is not ours.
	 */
	if ((size_t)(end - p) != 7 + nlen + 10 || memcmp(p, "/memfd:", 7) != 0 || memcmp(p + 7, name, nlen) != 0 ||
	    memcmp(p + 7 + nlen, " (deleted)", 10) != 0)
		return -ENOENT;
	if (off > UINT64_MAX - (stop - start))
		return -ENOENT;
	*dev = d;
	*ino = i;
	*end_bytes = off + (stop - start);
	return 0;
}

/* ------------------------------------------------------------ memfds of a name, in slices */

/* What one stat of a memfd said: its size, pages and owner. Each (dev, inode) is stat'ed once per scan. */
struct stat_entry {
	dev_t dev;
	ino_t ino;
	uint64_t size;      /* UINT64_MAX: not known (map_files unreadable) */
	uint64_t allocated; /* UINT64_MAX: not known */
	uid_t owner;
	bool owner_known;
	bool used;
};

/*
 * Fds of a process read between two looks at the clock: a readlink each, and a stat where the name is ours.
 * 64 of our name took up to 1.7 ms of CPU on the 2-core development VM (20,000 fds in the process), past a
 * 2 ms slice; 16 keep a step within a few tenths of a ms of its budget.
 */
#define FDS_PER_UNIT 16
/* The memfds of one process mapped under the name, kept for the fdinfo fallback; past this many it is not tried. */
#define MAPPED_MAX 64
/* The stat cache starts at this many slots (a power of two) and doubles at half full. */
#define STAT_CACHE_FIRST 256

enum memfd_phase {
	PHASE_NEXT,   /* open the next /proc entry */
	PHASE_MAPS,   /* reading its maps, one read() a unit */
	PHASE_FDS,    /* reading its fd directory, FDS_PER_UNIT entries a unit */
	PHASE_FDINFO, /* fd/ unreadable (another uid, no CAP_DAC_READ_SEARCH): its fdinfo directory instead */
};

struct holders_memfd_scan {
	char name[POOL_NAME_LINK_MAX];
	char link[POOL_NAME_LINK_MAX]; /* "/memfd:NAME (deleted)" */
	int link_len;
	holders_want_uids_fn *want;
	holders_memfd_fn *on_memfd;
	holders_read_fn *on_read;
	void *ud;
	pid_t self;
	DIR *d;
	char *buf;
	size_t have;
	enum memfd_phase phase;
	pid_t pid;
	uid_t uid;
	int pdir, maps_fd;
	DIR *fds;
	int rm, rf;                 /* how its maps and fd reads ended: 0, or -errno */
	struct memfd_mounts mounts; /* for the fdinfo fallback; n == 0: off */
	struct {
		dev_t dev;
		ino_t ino;
	} mapped[MAPPED_MAX]; /* the process's memfds mapped under the name */
	size_t nmapped;
	bool mapped_overflow;
	struct stat_entry *cache;
	size_t ncache, capcache;
	struct holders_memfd_stats stats;
	bool done;
};

static size_t stat_slot(const struct holders_memfd_scan *s, dev_t dev, ino_t ino)
{
	uint64_t h = ((uint64_t)ino * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)dev * 0xff51afd7ed558ccdull);
	size_t i = (size_t)(h >> 17) & (s->capcache - 1);

	while (s->cache[i].used && (s->cache[i].dev != dev || s->cache[i].ino != ino))
		i = (i + 1) & (s->capcache - 1);
	return i;
}

static const struct stat_entry *stat_find(const struct holders_memfd_scan *s, dev_t dev, ino_t ino)
{
	size_t i;

	if (!s->capcache)
		return NULL;
	i = stat_slot(s, dev, ino);
	return s->cache[i].used ? &s->cache[i] : NULL;
}

/* Remember e; without memory for it the next mapping of that file is stat'ed again, nothing worse. */
static void stat_keep(struct holders_memfd_scan *s, const struct stat_entry *e)
{
	if (s->ncache + 1 > s->capcache / 2) {
		size_t ncap = s->capcache ? s->capcache * 2 : STAT_CACHE_FIRST;
		struct stat_entry *old = s->cache, *nc = calloc(ncap, sizeof(*nc));
		size_t oldcap = s->capcache;

		if (!nc)
			return;
		s->cache = nc;
		s->capcache = ncap;
		for (size_t i = 0; i < oldcap; i++)
			if (old[i].used)
				s->cache[stat_slot(s, old[i].dev, old[i].ino)] = old[i];
		free(old);
	}
	s->cache[stat_slot(s, e->dev, e->ino)] = *e;
	s->cache[stat_slot(s, e->dev, e->ino)].used = true;
	s->ncache++;
}

static struct stat_entry stat_entry_of(const struct stat *st)
{
	return (struct stat_entry){ .dev = st->st_dev,
				    .ino = st->st_ino,
				    .size = (uint64_t)st->st_size,
				    .allocated = (uint64_t)st->st_blocks * 512u,
				    .owner = st->st_uid,
				    .owner_known = true };
}

/*
 * The file a maps line maps, from fstat through map_files/START-END (the line's
 * first column), once per (dev, inode): a mapping's end is the holder's to
 * choose (mremap may stretch it far past the memfd's end, PROT_NONE), the
 * file's size is not. Where map_files cannot be read (no CAP_SYS_ADMIN), size
 * and owner stay unknown.
 */
static struct stat_entry map_file_stat(struct holders_memfd_scan *s, const char *line, size_t len, dev_t dev, ino_t ino)
{
	const struct stat_entry *hit = stat_find(s, dev, ino);
	struct stat_entry e = { .dev = dev, .ino = ino, .size = UINT64_MAX, .allocated = UINT64_MAX };
	char path[64];
	size_t n = strcspn(line, " ");
	struct stat st;

	if (hit)
		return *hit;
	if (n <= len && n + 11 < sizeof(path)) {
		memcpy(path, "map_files/", 10);
		memcpy(path + 10, line, n);
		path[10 + n] = '\0';
		s->stats.stats++;
		if (fstatat(s->pdir, path, &st, 0) == 0 && st.st_dev == dev && st.st_ino == ino)
			e = stat_entry_of(&st);
	}
	stat_keep(s, &e);
	return e;
}

static void report(struct holders_memfd_scan *s, const struct stat_entry *e, uint64_t end_bytes)
{
	struct holders_memfd m = { .pid = s->pid,
				   .uid = s->uid,
				   .dev = e->dev,
				   .ino = e->ino,
				   .bytes = e->size < end_bytes ? e->size : end_bytes,
				   .allocated = e->allocated,
				   .owner = e->owner,
				   .owner_known = e->owner_known };

	s->on_memfd(&m, s->ud);
}

static bool mapped_has(const struct holders_memfd_scan *s, dev_t dev, ino_t ino)
{
	for (size_t i = 0; i < s->nmapped; i++)
		if (s->mapped[i].dev == dev && s->mapped[i].ino == ino)
			return true;
	return false;
}

static void mapped_add(struct holders_memfd_scan *s, dev_t dev, ino_t ino)
{
	if (mapped_has(s, dev, ino))
		return;
	if (s->nmapped == MAPPED_MAX) {
		s->mapped_overflow = true;
		return;
	}
	s->mapped[s->nmapped].dev = dev;
	s->mapped[s->nmapped].ino = ino;
	s->nmapped++;
}

/* The complete lines in s->buf: each mapping of our name reported; the rest kept for the next read. */
static void maps_lines(struct holders_memfd_scan *s)
{
	const char *p = s->buf, *end = s->buf + s->have, *nl;

	while (p < end && (nl = memchr(p, '\n', (size_t)(end - p)))) {
		dev_t dev;
		ino_t ino;
		uint64_t end_bytes;

		s->stats.lines++;
		if (holders_parse_memfd_map(p, (size_t)(nl - p), s->name, &dev, &ino, &end_bytes) == 0) {
			struct stat_entry e = map_file_stat(s, p, (size_t)(nl - p), dev, ino);

			mapped_add(s, dev, ino);
			report(s, &e, end_bytes);
		}
		p = nl + 1;
	}
	memmove(s->buf, p, (size_t)(end - p));
	s->have = (size_t)(end - p);
}

/* The process is read (or failed): say so and go on to the next /proc entry. */
static void process_end(struct holders_memfd_scan *s)
{
	if (s->fds)
		closedir(s->fds);
	if (s->maps_fd >= 0)
		close(s->maps_fd);
	if (s->pdir >= 0)
		close(s->pdir);
	s->fds = NULL;
	s->maps_fd = s->pdir = -1;
	if (s->rm == 0 && s->rf == 0) {
		if (s->on_read)
			s->on_read(s->pid, s->ud);
	} else if (holders_unreadable_errno(s->rm) || holders_unreadable_errno(s->rf)) {
		s->stats.unreadable++;
	}
	s->phase = PHASE_NEXT;
}

/* Open the directory dir of the process as s->fds; false with s->rf set when it cannot be. */
static bool dir_open(struct holders_memfd_scan *s, const char *dir)
{
	int fd = openat(s->pdir, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd >= 0 && (s->fds = fdopendir(fd)))
		return true;
	s->rf = -errno;
	if (fd >= 0)
		close(fd);
	return false;
}

/*
 * Its fd/ folder, else, where only that cannot be listed (another uid: mode 0500 needs CAP_DAC_READ_SEARCH, which
 * the unit does not grant), its fdinfo/ (PTRACE_MODE_READ, as maps): every fd it holds on a memfd mount must then
 * be one it maps under the name, which maps already reported, for the process to count as read whole.
 */
static void fds_open(struct holders_memfd_scan *s)
{
	s->phase = PHASE_FDS;
	if (dir_open(s, "fd"))
		return;
	if (s->rm == 0 && holders_unreadable_errno(s->rf) && s->mounts.n && !s->mapped_overflow) {
		s->rf = 0;
		s->phase = PHASE_FDINFO;
		if (dir_open(s, "fdinfo"))
			return;
	}
	process_end(s);
}

/* Open the next /proc entry: its status decides whether it is read (its real, effective, saved and fs uid). */
static void unit_next(struct holders_memfd_scan *s)
{
	char sbuf[STATUS_BUF_BYTES];
	struct dirent *e = readdir(s->d);
	uid_t ids[4];
	ssize_t n;
	pid_t pid;

	if (!e) {
		s->done = true;
		return;
	}
	pid = holders_parse_pid(e->d_name);
	if (pid <= 1 || pid == s->self)
		return;
	s->pdir = openat(dirfd(s->d), e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (s->pdir < 0)
		return;
	/* Not the directory's owner: a process that is not dumpable shows as root's there. */
	n = holders_read_small(s->pdir, "status", sbuf, sizeof(sbuf));
	if (n < 0 || holders_parse_status_uid(sbuf, (size_t)n, ids) < 0) {
		s->stats.unreadable += n < 0 && holders_unreadable_errno((int)n);
		close(s->pdir);
		s->pdir = -1;
		return;
	}
	if (s->want && !s->want(pid, ids, s->ud)) {
		close(s->pdir);
		s->pdir = -1;
		return;
	}
	s->stats.processes++;
	s->pid = pid;
	s->uid = ids[0];
	s->rm = s->rf = 0;
	s->have = 0;
	s->nmapped = 0;
	s->mapped_overflow = false;
	s->maps_fd = openat(s->pdir, "maps", O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (s->maps_fd < 0) {
		s->rm = -errno;
		fds_open(s);
		return;
	}
	s->phase = PHASE_MAPS;
}

/* One read() of maps: a huge maps file (65,000 mappings) spans many units, so no slice waits for it whole. */
static void unit_maps(struct holders_memfd_scan *s)
{
	ssize_t n = read(s->maps_fd, s->buf + s->have, MAPS_BUF_BYTES - s->have);

	if (n < 0 && errno == EINTR)
		return;
	if (n > 0) {
		s->have += (size_t)n;
		maps_lines(s);
		if (s->have == MAPS_BUF_BYTES)
			s->rm = -EBADMSG; /* a line longer than the kernel writes: not procfs */
		else
			return;
	} else if (n < 0) {
		s->rm = -errno;
	}
	close(s->maps_fd);
	s->maps_fd = -1;
	fds_open(s);
}

/* The process's next fd/ entry; NULL at the end of the directory (or a read error: s->rf), the process then ended. */
static struct dirent *next_fd(struct holders_memfd_scan *s)
{
	struct dirent *e;

	errno = 0;
	e = readdir(s->fds);
	if (!e) {
		if (errno)
			s->rf = -errno;
		process_end(s);
	}
	return e;
}

/* Up to FDS_PER_UNIT fds: a readlink each, and a stat only for a link of our name. */
static void unit_fds(struct holders_memfd_scan *s)
{
	char link[POOL_NAME_LINK_MAX];

	for (int i = 0; i < FDS_PER_UNIT; i++) {
		struct dirent *e;
		struct stat st;
		struct stat_entry se;
		ssize_t n;

		e = next_fd(s);
		if (!e)
			return;
		if (e->d_name[0] == '.')
			continue;
		n = readlinkat(dirfd(s->fds), e->d_name, link, sizeof(link));
		if (n != s->link_len || memcmp(link, s->link, (size_t)n) != 0)
			continue;
		/* The stat is what names the file (its dev and inode): one per fd of our name. */
		s->stats.stats++;
		if (fstatat(dirfd(s->fds), e->d_name, &st, 0) < 0)
			continue; /* closed meanwhile */
		se = stat_entry_of(&st);
		{
			const struct stat_entry *had = stat_find(s, se.dev, se.ino);

			if (!had || !had->owner_known)
				stat_keep(s, &se);
		}
		report(s, &se, UINT64_MAX);
	}
}

/*
 * Up to FDS_PER_UNIT entries of fdinfo/: an fd on a memfd that the process does not map under the name may be a
 * chunk whose name this cannot read (the safe side: the process stays unread, -EACCES); the end, read whole.
 */
static void unit_fdinfo(struct holders_memfd_scan *s)
{
	for (int i = 0; i < FDS_PER_UNIT; i++) {
		struct dirent *e;
		dev_t dev;
		ino_t ino;
		int k;

		e = next_fd(s);
		if (!e)
			return;
		if (e->d_name[0] == '.')
			continue;
		k = holders_fdinfo_memfd(dirfd(s->fds), e->d_name, &s->mounts, &dev, &ino);
		if (k == -ENOENT || k == 0)
			continue; /* closed meanwhile, or not a memfd */
		if (k < 0 || !mapped_has(s, dev, ino)) {
			s->rf = -EACCES;
			process_end(s);
			return;
		}
	}
}

int holders_memfd_scan_new(const char *proc_root, const char *name, holders_want_uids_fn *want,
			   holders_memfd_fn *on_memfd, holders_read_fn *on_read, void *ud,
			   struct holders_memfd_scan **ret)
{
	struct holders_memfd_scan *s;
	int root_fd, proc_fd = -1, r;

	*ret = NULL;
	if (strlen(name) + 32 > POOL_NAME_LINK_MAX)
		return -ENAMETOOLONG;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->pdir = s->maps_fd = -1;
	snprintf(s->name, sizeof(s->name), "%s", name);
	s->link_len = snprintf(s->link, sizeof(s->link), "/memfd:%s (deleted)", name);
	s->want = want;
	s->on_memfd = on_memfd;
	s->on_read = on_read;
	s->ud = ud;
	s->self = getpid();
	holders_memfd_mounts(&s->mounts);
	s->buf = malloc(MAPS_BUF_BYTES);
	if (!s->buf) {
		free(s);
		return -ENOMEM;
	}
	root_fd = open(proc_root && *proc_root ? proc_root : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0 || (proc_fd = openat(root_fd, "proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0 ||
	    !(s->d = fdopendir(proc_fd))) {
		r = -errno;
		if (proc_fd >= 0)
			close(proc_fd);
		if (root_fd >= 0)
			close(root_fd);
		holders_memfd_scan_free(s);
		return r;
	}
	close(root_fd);
	*ret = s;
	return 0;
}

int holders_memfd_scan_step(struct holders_memfd_scan *s, uint64_t budget_us)
{
	uint64_t t0 = now_us();

	if (!s->done)
		s->stats.slices++;
	/* At least one unit per step, so a tiny budget still ends. */
	while (!s->done) {
		switch (s->phase) {
		case PHASE_NEXT:
			unit_next(s);
			break;
		case PHASE_MAPS:
			unit_maps(s);
			break;
		case PHASE_FDS:
			unit_fds(s);
			break;
		case PHASE_FDINFO:
			unit_fdinfo(s);
			break;
		}
		if (now_us() - t0 >= budget_us)
			break;
	}
	return s->done ? 1 : 0;
}

void holders_memfd_scan_stats(const struct holders_memfd_scan *s, struct holders_memfd_stats *ret)
{
	*ret = s->stats;
}

void holders_memfd_scan_free(struct holders_memfd_scan *s)
{
	if (!s)
		return;
	if (s->fds)
		closedir(s->fds);
	if (s->maps_fd >= 0)
		close(s->maps_fd);
	if (s->pdir >= 0)
		close(s->pdir);
	if (s->d)
		closedir(s->d);
	free(s->cache);
	free(s->buf);
	free(s);
}

/* holders_scan_memfds_of's callbacks, relayed from the sliced scan's. */
struct relay {
	holders_want_fn *want;
	holders_memfd_fn *on_memfd;
	holders_read_fn *on_read;
	void *ud;
};

static bool relay_want(pid_t pid, const uid_t ids[4], void *ud)
{
	struct relay *r = ud;

	return r->want(pid, ids[0], r->ud);
}

static void relay_memfd(const struct holders_memfd *m, void *ud)
{
	struct relay *r = ud;

	r->on_memfd(m, r->ud);
}

static void relay_read(pid_t pid, void *ud)
{
	struct relay *r = ud;

	if (r->on_read)
		r->on_read(pid, r->ud);
}

int holders_scan_memfds(const char *proc_root, const char *name, holders_memfd_fn *on_memfd, holders_read_fn *on_read,
			void *ud, size_t *unreadable)
{
	return holders_scan_memfds_of(proc_root, name, NULL, on_memfd, on_read, ud, unreadable);
}

int holders_scan_memfds_of(const char *proc_root, const char *name, holders_want_fn *want, holders_memfd_fn *on_memfd,
			   holders_read_fn *on_read, void *ud, size_t *unreadable)
{
	struct relay rl = { want, on_memfd, on_read, ud };
	struct holders_memfd_scan *s;
	int r;

	if (unreadable)
		*unreadable = 0;
	r = holders_memfd_scan_new(proc_root, name, want ? relay_want : NULL, relay_memfd, relay_read, &rl, &s);
	if (r < 0)
		return r;
	holders_memfd_scan_step(s, UINT64_MAX);
	if (unreadable)
		*unreadable = s->stats.unreadable;
	holders_memfd_scan_free(s);
	return 0;
}
